"""Training curves: training and validation loss per tier, Baseline and SMELT overlaid. The curves
table comes from ``scaling.fitting.curves.read_curves``."""

from __future__ import annotations

import math

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from scaling.common.errors import UserError
from scaling.common.stats import quantiles
from scaling.fitting.curves import val_differences
from scaling.plots.style import (
    MARKERS,
    figure,
    group_colours,
    group_label,
    log_axis,
    order,
    si,
    styled,
)


def _tierorder(df: pd.DataFrame) -> list[str]:
    return list(df.groupby("tier")["N"].max().sort_values().index)


@styled
def loss_curves(curves: pd.DataFrame, *, x: str = "tokens", smooth: int = 5, reference: str = "baseline",
                candidate: str = "smelt") -> Figure:
    """Training and validation loss per tier (one panel each), Baseline and SMELT overlaid, and
    below each panel the difference L_candidate - L_reference of the validation loss at matched
    (tier, seed, tokens) (``scaling.fitting.curves.val_differences``; one marker per seed, the
    zero line drawn; negative = candidate better). The difference row is left out when no pair
    matches.

    Lines: training loss (running mean over ``smooth`` logged steps) on the WSD trunk (light) and
    on each cooldown branch (full colour). Hollow markers: validation on the trunk; filled
    markers: validation at the end of each token budget (the points the scaling fits use).
    ``x`` is "tokens" (training tokens) or "flops" (training FLOPs = F * tokens).
    """
    if x not in ("tokens", "flops"):
        raise UserError(f"x must be tokens or flops, got {x!r}")
    tiers = _tierorder(curves)
    groups = order(curves["arch"])
    colours = group_colours(groups)
    ncol = min(4, len(tiers))
    nrow = math.ceil(len(tiers) / ncol)
    diffs = val_differences(curves, reference, candidate)
    rows = 2 if len(diffs) else 1
    height = (2.6 + 1.3 * (rows - 1)) * nrow + 0.4
    fig, grid = figure(rows * nrow, ncol, 2.6 * ncol + 0.6, height, sharex=True,
                       gridspec_kw={"height_ratios": [2.0, 1.0][:rows] * nrow})
    axes, daxes = grid[0::rows], grid[1::rows] if rows == 2 else None
    for a in axes.flat[1:]:
        a.sharey(axes.flat[0])
    if daxes is not None:
        for a in daxes.flat[1:]:
            a.sharey(daxes.flat[0])
        for a in daxes.flat[len(tiers):]:
            a.set_visible(False)
    for ax in axes.flat[len(tiers):]:
        ax.set_visible(False)
    for ax, tier in zip(axes.flat, tiers):
        sub = curves[curves["tier"] == tier]
        title = []
        for g in groups:
            arch = sub[sub["arch"] == g]
            if arch.empty:
                continue
            c = colours[g]
            names = sorted(arch["run"].unique())
            running = sum(not arch.loc[arch["run"] == r, "complete"].iloc[0] for r in names)
            title.append(f"{group_label(g)} N={si(arch['N'].iloc[0])}"
                         + (f", {len(names)} seeds" if len(names) > 1 else "")
                         + (f" ({running} running)" if running and len(names) > 1 else
                            " (running)" if running else ""))
            for name in names:
                run = arch[arch["run"] == name]
                trunk = run[run["branch"].isna()].sort_values("step")
                tr = trunk["train_loss"].rolling(smooth, min_periods=1).mean()
                ax.plot(trunk[x], tr, color=c, alpha=0.35, lw=1.0)
                for _, br in run[run["branch"].notna()].groupby("branch"):
                    br = br.sort_values("step")
                    ax.plot(br[x], br["train_loss"].rolling(smooth, min_periods=1).mean(), color=c, lw=1.0,
                            alpha=0.9)
                ev = run[run["val_loss"].notna()]
                mid = ev[ev["budget_index"].isna()]
                end = ev[ev["budget_index"].notna()]
                ax.plot(mid[x], mid["val_loss"], ls="none", marker="o", mfc="white", mec=c, ms=4)
                ax.plot(end[x], end["val_loss"], ls="none", marker=MARKERS[groups.index(g) % len(MARKERS)],
                        color=c, ms=5.5)
        log_axis(ax, "x")
        ax.set_title(f"{tier}\n" + "\n".join(title), fontsize=8)
        ax.set_xlabel("training tokens" if x == "tokens" else "training compute C (FLOPs)")
    for ax in axes[:, 0]:
        ax.set_ylabel("loss (nats/token)")
    if daxes is not None:
        seeds = sorted({s for s in diffs["seed"] if not pd.isna(s)})
        for dax, tier in zip(daxes.flat, tiers):
            dax.axhline(0, color="0.2", lw=0.8)
            sub = diffs[diffs["tier"] == tier]
            for j, s in enumerate([None, *seeds]):
                ss = sub[sub["seed"].isna()] if s is None else sub[(sub["seed"] == s).fillna(False)]
                if ss.empty:
                    continue
                px = ss["tokens"] if x == "tokens" else ss["tokens"] * float(
                    curves.loc[curves["run"] == ss["reference_run"].iloc[0], "flops_per_token"].iloc[0])
                ends = ss["budget_index"].notna().to_numpy()
                mk = MARKERS[j % len(MARKERS)]
                dax.plot(px[ends], ss["diff"][ends], color="0.15", marker=mk, ms=4, lw=0.8,
                         label=f"seed {s}" if s is not None else "no seed")
                if (~ends).any():
                    dax.plot(px[~ends], ss["diff"][~ends], ls="none", marker=mk, mfc="white", mec="0.15",
                             ms=3)
            log_axis(dax, "x")
            dax.set_xlabel("training tokens" if x == "tokens" else "training compute C (FLOPs)")
        for dax in daxes[:, 0]:
            dax.set_ylabel(f"{group_label(candidate)} − {group_label(reference)}\nval. loss (nats/token)",
                           fontsize=7.5)
    # one legend explaining the encodings
    ax0 = axes.flat[0]
    handles = [mpl.lines.Line2D([], [], color=colours[g], marker=MARKERS[i % len(MARKERS)], ls="none",
                                label=f"{group_label(g)}: validation at a budget's end")
               for i, g in enumerate(groups)]
    if daxes is not None:
        seeds = sorted({s for s in diffs["seed"] if not pd.isna(s)})
        who = f"{group_label(candidate)} − {group_label(reference)}"
        handles += [mpl.lines.Line2D([], [], color="0.15", marker=MARKERS[(j + 1) % len(MARKERS)], ms=4,
                                     lw=0.8, label=f"{who}, seed {s}")
                    for j, s in enumerate(seeds)]
    handles += [mpl.lines.Line2D([], [], color="0.4", marker="o", mfc="white", ls="none",
                                 label="validation on the trunk"),
                mpl.lines.Line2D([], [], color="0.4", alpha=0.35, label="train loss, WSD trunk"),
                mpl.lines.Line2D([], [], color="0.4", label="train loss, cooldown branch")]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 5), fontsize=7)
    # shared axes hide the inner panels' tick labels: a reader of one panel needs its own numbers
    for ax in grid.flat:
        ax.tick_params(labelbottom=True, labelleft=True)
    # from half the first budget: before it the curves are warm-up (loss ~ ln V), not the comparison
    ends = curves[curves["budget_index"].notna() & curves["val_loss"].notna()][x]
    if len(ends) and np.isfinite(ends.min()) and ends.min() > 0:
        ax0.set_xlim(left=0.5 * float(ends.min()))
    shown = curves[curves[x] >= 0.5 * float(ends.min())] if len(ends) else curves
    lo = curves["val_loss"].min()
    hi = quantiles(shown["train_loss"], 0.995) if shown["train_loss"].notna().any() else None
    if np.isfinite(lo) and hi is not None and np.isfinite(hi):
        ax0.set_ylim(lo - 0.2, hi + 0.1)
    return fig

