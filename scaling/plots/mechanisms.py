"""Mechanism analyses (the results of ``scaling.analysis``): the attention sink per layer pass, loss
by length and position with SMELT's gain, and in-context Dyck accuracy."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from matplotlib.figure import Figure

from scaling.common.errors import UserError
from scaling.plots.style import (
    ARCH_COLOURS,
    MARKERS,
    figure,
    group_label,
    legend,
    run_colours,
    styled,
)


def _pass_labels(passes: Sequence[Any]) -> list[str]:
    looped = {p.layer for p in passes if p.pass_ > 1}
    return [f"L{p.layer}" + (f"·{p.pass_}" if p.layer in looped else "") for p in passes]


@styled
def sink(results: Sequence[Any]) -> Figure:
    """Attention mass per layer pass (execution order), one panel per run: the mean mass on the
    BOS position (solid bars) and, for the Dyck probe, on the demonstration answers (hatched,
    beside it); the rest of the mass, on all other keys, is 1 minus these. Shaded: the passes of
    looped layers, labelled L<layer>·<pass>. The y axis is zoomed to the largest bar (stated in
    the label) so that small masses stay readable."""
    results = sorted(results, key=lambda r: (0 if r.arch == "baseline" else 1, r.run))
    if not results:
        raise UserError("no sink results to plot")
    colours = run_colours(results)
    dyck = any(r.probe == "dyck" for r in results)
    fig, axes = figure(1, len(results), 0.42 * sum(len(r.passes) for r in results) + 1.6 * len(results),
                        3.2, sharey=True, gridspec_kw={"width_ratios": [len(r.passes) for r in results]})
    top = max(max(p.bos_mass, p.answer_mass or 0.0) for r in results for p in r.passes)
    w = 0.38 if dyck else 0.7
    for ax, r in zip(axes[0], results):
        x = np.arange(len(r.passes))
        bos = np.array([p.bos_mass for p in r.passes])
        c = colours[r.run]
        xb = x - w / 2 if dyck else x
        ax.bar(xb, bos, color=c, label="BOS", width=w)
        for xi, v in zip(xb, bos):
            ax.text(xi, v, f"{v:.2f}", ha="center", va="bottom", fontsize=6)
        if dyck:
            ans = np.array([np.nan if p.answer_mass is None else p.answer_mass for p in r.passes])
            ax.bar(x + w / 2, ans, color=c, alpha=0.45, hatch="///", edgecolor=c, width=w,
                   label="demonstration answers")
            for xi, v in zip(x + w / 2, ans):
                if np.isfinite(v):
                    ax.text(xi, v, f"{v:.2f}", ha="center", va="bottom", fontsize=6)
        looped = [i for i, p in enumerate(r.passes) if sum(q.layer == p.layer for q in r.passes) > 1]
        if looped:
            ax.axvspan(min(looped) - 0.5, max(looped) + 0.5, color="0.5", alpha=0.1, lw=0)
        ax.set_xticks(x, _pass_labels(r.passes), rotation=45, fontsize=7)
        ax.set_xlim(-0.6, len(r.passes) - 0.4)
        ax.set_title(f"{r.run}\n({group_label(r.arch)})", fontsize=8)
        ax.set_xlabel("layer pass (execution order)")
        ax.grid(axis="x", visible=False)
    axes[0, 0].set_ylim(0, min(1.0, max(0.05, 1.25 * top)))
    axes[0, 0].set_ylabel("mean attention mass\n(rest: on other tokens)")
    legend(axes[0, -1], fontsize=6.5, loc="upper right")
    probe = ("Dyck k-shot prompts (query line)" if dyck else "validation documents (queries t ≥ 1)")
    fig.suptitle(f"Attention sink per layer pass, {probe}; shaded: looped layers", fontsize=9.5)
    return fig


@styled
def lengths(results: Sequence[Any], gain: Any | None = None) -> Figure:
    """Validation loss by document length and by token position (top, one line per run) and,
    with a Baseline/SMELT pair, SMELT's gain L_baseline - L_smelt per bucket with +-1 paired
    standard error (bottom; above 0: SMELT better)."""
    results = sorted(results, key=lambda r: (0 if r.arch == "baseline" else 1, r.run))
    if not results:
        raise UserError("no lengths results to plot")
    contexts = sorted({r.seq_len for r in results})
    if len(contexts) > 1:
        # the buckets adapt to the context: one x axis cannot hold runs of different contexts
        raise UserError(f"runs of different contexts ({', '.join(map(str, contexts))} tokens) have different "
                        "length and position buckets; plot one context at a time")
    colours = run_colours(results)
    nrow = 2 if gain is not None else 1
    fig, axes = figure(nrow, 2, 8.4, 2.6 * nrow + 0.4, sharex="col")
    for j, by in enumerate(("length", "position")):
        ax = axes[0, j]
        labels = [b.label for b in results[0].buckets if b.by == by]
        for i, r in enumerate(results):
            bs = [b for b in r.buckets if b.by == by]
            ax.plot(range(len(bs)), [np.nan if b.loss is None else b.loss for b in bs],
                    marker=MARKERS[i % len(MARKERS)], color=colours[r.run],
                    label=f"{r.run} ({group_label(r.arch)})")
        ax.set_ylabel("validation loss (nats/token)")
        ax.set_title("by document length" if by == "length" else "by token position in the window")
        legend(ax, fontsize=6.5)
        xl = "document length (tokens)" if by == "length" else "token position"
        if gain is not None:
            gx = axes[1, j]
            gs = [g for g in gain.buckets if g.by == by]
            y = np.array([np.nan if g.gain is None else g.gain for g in gs])
            err = np.array([0.0 if g.gain_se is None else g.gain_se for g in gs])
            gx.errorbar(range(len(gs)), y, yerr=err, fmt="o-", color=ARCH_COLOURS["smelt"], capsize=3, ms=4)
            gx.axhline(0, color="0.2", lw=0.8)
            gx.set_ylabel("gain $L_{base} - L_{smelt}$\n(nats/token)")
            if by == "length" and gain.long_from:
                k = next((i for i, g in enumerate(gs) if g.lo >= gain.long_from), None)
                if k is not None:
                    gx.axvspan(k - 0.5, len(gs) - 0.5, color="0.5", alpha=0.08, lw=0)
                    # no point ratio without its interval (LengthGain: None where unbounded)
                    ratio = ("" if gain.long_short_ratio is None
                             else f"; gain long/short {gain.long_short_ratio:.2f}x "
                                  f"[{gain.ratio_low:.2f}, {gain.ratio_high:.2f}]")
                    gx.set_title(f"shaded: long documents (≥ {gain.long_from} tokens){ratio}", fontsize=8)
            bottom = gx
        else:
            bottom = ax
        bottom.set_xticks(range(len(labels)), labels, rotation=30, fontsize=7)
        bottom.set_xlabel(xl)
    fig.suptitle(f"Loss by sample length and token position (context {results[0].seq_len} tokens)",
                 fontsize=9.5)
    return fig


@styled
def icl(results: Sequence[Any]) -> Figure:
    """Dyck completion accuracy against the number of in-context demonstrations k (symlog x),
    Wilson binomial intervals as error bars, one line per run (slightly dodged)."""
    results = sorted(results, key=lambda r: (0 if r.arch == "baseline" else 1, r.run))
    if not results:
        raise UserError("no icl results to plot")
    colours = run_colours(results)
    fig, axes = figure(1, 1, 4.6, 3.2)
    ax = axes[0, 0]
    for i, r in enumerate(results):
        k = np.array([s.k for s in r.shots], dtype=float)
        acc = 100 * np.array([s.accuracy for s in r.shots])
        yerr = 100 * np.array([[s.accuracy - s.ci_low for s in r.shots],
                               [s.ci_high - s.accuracy for s in r.shots]])
        dodge = 1 + 0.04 * (i - (len(results) - 1) / 2)
        ax.errorbar(np.where(k > 0, k * dodge, (dodge - 1) * 2), acc, yerr=yerr,
                    marker=MARKERS[i % len(MARKERS)], capsize=3, color=colours[r.run], ms=4,
                    label=f"{r.run} ({group_label(r.arch)})")
    ax.set_xscale("symlog", linthresh=1)
    ks = sorted({s.k for r in results for s in r.shots})
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.minorticks_off()
    ax.set_xlabel("in-context demonstrations k")
    r0 = results[0]
    ax.set_ylabel(f"exact-match accuracy (%)\n{100 * r0.confidence:.0f}% Wilson interval, "
                  f"{r0.n_trials} trials")
    top = max(100 * s.ci_high for r in results for s in r.shots)
    ax.set_ylim(0, min(100, max(10.0, 1.15 * top)))
    t = r0.task
    ax.set_title(f"Dyck completion, {t.get('n_types')} bracket types, "
                 f"{t.get('min_pairs')}-{t.get('max_pairs')} pairs", fontsize=9)
    legend(ax, fontsize=6.5, loc="upper left")
    return fig

