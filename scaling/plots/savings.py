"""Compute savings of a candidate over a reference against the training budget, and the loss gap
at equal compute (a ``scaling.fitting.savings.SavingsResult``, e.g. from
``scaling.fitting.savings_sweep.savings_over``)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from matplotlib.figure import Figure

from scaling.common.format import percent, si
from scaling.plots.style import (
    ARCH_COLOURS,
    EXTRA,
    fig_legend,
    figure,
    group_label,
    log_axis,
    shade_extrapolation,
    styled,
)

PCT_DIGITS = 1


def pct(fraction: float | None) -> str:
    """The figure's one percentage format (``scaling.common.format.percent``)."""
    return percent(fraction, PCT_DIGITS)


def _draw_rows(ax: Any, ax2: Any, rs: list, colour: Any, ls: Any, lab: str) -> list:
    """One curve of rows in both panels (the loss-gap band drawn at once); returns the savings band
    to draw once the axis range is known, so that it can be clipped there."""
    b = np.array([r.budget for r in rs])
    # markers only where a number rests on measurements (the envelope); law rows are curves
    mk = "o" if all(r.method == "envelope" for r in rs) else None
    ax.plot(b, 100 * np.array([r.savings for r in rs]), color=colour, marker=mk, ms=3, ls=ls, label=lab)
    ax2.plot(b, [r.loss_gap for r in rs], color=colour, marker=mk, ms=3, ls=ls, label=lab)
    if all(r.loss_gap_ci is not None for r in rs):
        ax2.fill_between(b, [r.loss_gap_ci[0] for r in rs], [r.loss_gap_ci[1] for r in rs], color=colour,
                         alpha=0.18, lw=0)
    if all(r.savings_ci is not None for r in rs):
        lo, hi = (np.array([100 * r.savings_ci[i] for r in rs]) for i in (0, 1))
        return [(b, lo, hi)]
    return []


def _mark(ax: Any, mark: float, rs: list, every: list, level: str) -> None:
    """The value at the ``mark`` budget in a box, or why there is none."""
    box = {"boxstyle": "round,pad=0.3", "fc": "white", "ec": "0.6", "lw": 0.5}
    hit = [r for r in rs if np.isclose(r.budget, mark, rtol=1e-6)]
    withheld = [r for r in every if np.isclose(r.budget, mark, rtol=1e-6) and r not in rs]
    if withheld and not hit:
        r = withheld[0]
        far_txt = ("" if r.extrapolation_decades is None
                   else f", {r.extrapolation_decades:.1f} decades beyond the data")
        ax.text(0.98, 0.04, f"at {si(mark)} FLOPs: withheld (laws not identified{far_txt})",
                transform=ax.transAxes, ha="right", va="bottom", fontsize=7, bbox=box)
    if hit:
        r = hit[0]
        ci = "" if r.savings_ci is None else f"\n{level} CI [{pct(r.savings_ci[0])}, {pct(r.savings_ci[1])}]"
        if r.extrapolation_decades is not None:
            ci += f"\n{r.extrapolation_decades:.1f} decades beyond the data"
        ax.plot([r.budget], [100 * r.savings], marker="o", ms=7, mfc="none", mec="k", ls="none")
        ax.text(0.98, 0.04, f"at {si(mark)} FLOPs: {pct(r.savings)}{ci}", transform=ax.transAxes,
                ha="right", va="bottom", fontsize=7, bbox=box)


@styled
def savings(result: Any, *, data_range: tuple[float, float] | None = None,
            reference: Any | None = None, mark: float | None = 1e21, observed: Sequence[Any] | None = None,
            laws_identified: bool = True) -> Figure:
    """Compute savings of the candidate over the reference against the budget (left, %, with the
    bootstrap interval) and the loss gap at equal compute (right, nats/token).

    ``data_range``: (min, max) total FLOPs of the fitted runs; the data range is shaded and
    everything right of its end is marked as extrapolation. ``reference``: another
    SavingsResult (e.g. the paper's laws, ``--law-set paper``) drawn in grey, one line per
    sparsity. ``mark``: annotate the value at this budget when it is one of the rows.

    The savings axis follows the point estimates; a bootstrap interval reaching past it (far from
    the data it can run to -1e5 %) is clipped at the axis and a triangle at the edge says it goes
    on. Every percentage is written by ``scaling.common.format.percent`` with ``PCT_DIGITS``.

    ``observed``: the envelope's rows (``scaling.fitting.envelope.envelope_savings``, law-free, inside
    the data), drawn as markers with their bootstrap intervals: what `smelt-scale savings` answers
    inside the data when the laws are not identified. ``laws_identified`` False draws every law row
    dashed (the laws' shape, not a result) and leaves them out of the axis range.
    """
    c_cand = ARCH_COLOURS.get(result.candidate, EXTRA[0])
    level = percent(result.ci_level, 0)
    bands: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    fig, axes = figure(1, 2, 8.4, 3.2)
    ax, ax2 = axes[0]
    sparsities = sorted({r.sparsity for r in result.rows}, key=lambda s: -1 if s is None else s)
    styles = ["-", "--", ":", "-."]
    for k, S in enumerate(sparsities):
        every = sorted([r for r in result.rows if r.sparsity == S], key=lambda r: r.budget)
        # what `smelt-scale savings` withholds (an unidentified law far beyond its data: rows marked
        # extrapolated, or refused) is never drawn as a result: at most a dashed, marker-free line
        far = [r for r in every if (r.extrapolated or not laws_identified) and r.savings is not None]
        rs = [r for r in every if not r.extrapolated and laws_identified and r.savings is not None]
        lab = f"{group_label(result.candidate)} vs {group_label(result.reference)}" + (
            "" if S is None else f", S = {S:g}")
        if far:
            # join the dashed part to the last shown point so the eye follows one curve
            link = ([rs[-1]] if rs and rs[-1].budget < far[0].budget else []) + far
            fb = [r.budget for r in link]
            what = ("unidentified laws beyond the data (withheld by `savings`)" if laws_identified
                    else "fitted laws, not identified: their shape, not a result")
            ax.plot(fb, [100 * r.savings for r in link], color=c_cand, ls=(0, (3, 3)), lw=1.0, alpha=0.7,
                    label=f"{lab}: {what}")
            ax2.plot(fb, [r.loss_gap for r in link], color=c_cand, ls=(0, (3, 3)), lw=1.0, alpha=0.7)
        if rs:
            bands += _draw_rows(ax, ax2, rs, c_cand, styles[k % 4], lab)
        if mark is not None and S == sparsities[0]:
            _mark(ax, mark, rs, every, level)
    seen = [r for r in observed or () if r.savings is not None]
    if seen:
        b = np.array([r.budget for r in seen])
        lab = "observed frontiers (envelope, no law): what `savings` answers inside the data"
        for a, val, ci, k in ((ax, [100 * r.savings for r in seen], [r.savings_ci for r in seen], 100.0),
                              (ax2, [r.loss_gap for r in seen], [r.loss_gap_ci for r in seen], 1.0)):
            v = np.array(val)
            err = None
            if all(c is not None for c in ci):
                err = np.abs(np.array([[k * c[0] for c in ci], [k * c[1] for c in ci]]) - v)
            a.errorbar(b, v, yerr=err, fmt="D", ms=4, color=c_cand, mec="0.15", mew=0.4, elinewidth=1.0,
                       capsize=2.5, ls="none", label=lab)
    if reference is not None:
        greys = ["0.35", "0.55", "0.7", "0.8"]
        ref_s = sorted({r.sparsity for r in reference.rows}, key=lambda s: -1 if s is None else s)
        for k, S in enumerate(ref_s):
            rs = sorted([r for r in reference.rows if r.sparsity == S], key=lambda r: r.budget)
            b = [r.budget for r in rs]
            lab = f"paper's laws{'' if S is None else f', S = {S:g}'}"
            ax.plot(b, [100 * r.savings for r in rs], color=greys[k % 4], lw=1.0, ls="--", label=lab)
            ax2.plot(b, [r.loss_gap for r in rs], color=greys[k % 4], lw=1.0, ls="--", label=lab)
    # The y range follows the point estimates (and the reference): far from the data a bootstrap
    # interval can run to -1e5 % (resamples clamped at the 6-decade bracket); it is cut at the axes.
    shown = [100 * r.savings for r in result.rows
             if r.savings is not None and not r.extrapolated and laws_identified] + [
        100 * r.savings for r in seen] + (
        [100 * r.savings for r in reference.rows if r.savings is not None] if reference is not None else [])
    shown = shown or [100 * r.savings for r in result.rows if r.savings is not None] or [0.0]
    lo_y, hi_y = min(min(shown), 0.0), max(max(shown), 0.0)
    pad = 0.25 * max(hi_y - lo_y, 5.0)
    y0, y1 = max(lo_y - pad, -100.0), min(hi_y + pad, 100.0)
    ax.set_ylim(y0, y1)
    for i, (b, lo, hi) in enumerate(bands):
        ax.fill_between(b, np.clip(lo, y0, y1), np.clip(hi, y0, y1), color=c_cand, alpha=0.18, lw=0,
                        label=f"{level} bootstrap interval" if i == 0 else None)
        edge = 0.015 * (y1 - y0)
        for off, y, m in ((lo < y0, y0 + edge, "v"), (hi > y1, y1 - edge, "^")):
            if off.any():
                ax.plot(b[off], np.full(off.sum(), y), ls="none", marker=m, ms=4, color=c_cand, alpha=0.6,
                        label="interval continues beyond the axis")
    budgets = np.array([r.budget for r in result.rows])
    xmax = budgets.max() * 1.5
    xmin = budgets.min() / 1.5
    for a in (ax, ax2):
        a.axhline(0, color="0.2", lw=0.8)
        log_axis(a, "x")
        whose = "candidate" if result.convention == "candidate-budget" else "reference"
        a.set_xlabel(f"training budget C (FLOPs, the {whose}'s)")
        if data_range is not None:
            shade_extrapolation(a, data_range, (xmin, xmax))
        a.set_xlim(xmin, xmax)
    ax.set_ylabel(r"compute savings $1 - C_{cand}/C_{ref}$ (%)")
    ax.set_title("Training compute saved at equal optimal loss")
    ax2.set_ylabel(r"loss gap $L^*_{ref} - L^*_{cand}$ (nats/token)")
    ax2.set_title("Loss gap at equal compute")
    fig_legend(fig, [ax, ax2], ncol=3)
    return fig
