"""Paired comparison: candidate - reference validation loss at matched (tier, budget, seed), from a
``scaling.fitting.compare.CompareResult``."""

from __future__ import annotations

from typing import Any

import matplotlib as mpl
import numpy as np
from matplotlib.figure import Figure

from scaling.plots.style import (
    ARCH_COLOURS,
    EXTRA,
    MARKERS,
    figure,
    group_label,
    legend,
    log_axis,
    shades,
    si,
    styled,
)


@styled
def compare(result: Any) -> Figure:
    """Paired candidate - reference validation loss (nats/token) at matched (tier, budget, seed).

    Left: every pair against its budget in tokens, one shade per tier (seeds as markers), the
    cell means joined per tier. Right: mean ± 1 clustered s.e. overall, per tier and per budget;
    open markers where the s.e. comes from fewer than 5 clusters or is absent (fewer than 2), whose
    95% interval (in the table) is t(G - 1) wide. Below zero the candidate is better.
    """
    pairs = result.pairs
    c_cand = ARCH_COLOURS.get(result.candidate, EXTRA[0])
    tiers = [s.label for s in result.by_tier]
    # tiers in size order along viridis (colour-blind safe, ordered, and far apart): shades of one
    # colour were hard to tell apart beyond three tiers
    cmap = mpl.colormaps["viridis"]
    colours = {t: mpl.colors.to_hex(cmap(0.85 * i / max(1, len(tiers) - 1))) for i, t in enumerate(tiers)}
    colours = colours if len(tiers) > 1 else dict(zip(tiers, shades(c_cand, len(tiers))))
    fig, axes = figure(1, 2, 8.4, 3.2, gridspec_kw={"width_ratios": [1.3, 1.0]})
    ax, ax2 = axes[0]
    seeds = sorted(pairs["seed"].unique(), key=str)
    x_col = "tokens" if "tokens" in pairs else "budget_index"
    for t in tiers:
        sub = pairs[pairs["tier"].astype(str) == t]
        for j, s in enumerate(seeds):
            ss = sub[sub["seed"] == s]
            ax.plot(ss[x_col], ss["diff"], ls="none", marker=MARKERS[j % len(MARKERS)], ms=3.5,
                    color=colours[t], alpha=0.8)
        cell = sub.groupby("budget_index").agg(x=(x_col, "mean"), d=("diff", "mean"))
        ax.plot(cell["x"], cell["d"], color=colours[t], lw=1.2, label=t)
    ax.axhline(0, color="0.2", lw=0.8)
    if x_col == "tokens":
        log_axis(ax, "x")
        ax.set_xlabel("training tokens (budget)")
    else:
        ax.set_xlabel("budget index")
    ax.set_ylabel(f"{group_label(result.candidate)} − {group_label(result.reference)} loss (nats/token)")
    ax.set_title("Paired differences (markers: seeds; lines: cell means)")
    for j, s in enumerate(seeds):  # which marker is which seed
        ax.plot([], [], ls="none", marker=MARKERS[j % len(MARKERS)], ms=3.5, color="0.4", label=f"seed {s}")
    legend(ax, fontsize=6, ncol=2)
    rows = [result.overall, *result.by_tier, *result.by_budget]
    labels = [r.label if r.tokens is None or not r.label.startswith("budget")
              else f"{si(r.tokens)} tokens" for r in rows]
    y = np.arange(len(rows))[::-1]
    for yi, r in zip(y, rows):
        colour = "k" if r is result.overall else colours.get(r.label, "0.4")
        err = 0.0 if r.se is None else r.se
        # open markers: an s.e. from fewer than FEW_CLUSTERS clusters (or none), itself very uncertain
        shaky = r.se is None or getattr(r, "few_clusters", False)
        ax2.errorbar([r.mean], [yi], xerr=[err], fmt="o", ms=4, color=colour, capsize=2, lw=1,
                     mfc="white" if shaky else colour)
    ax2.axvline(0, color="0.2", lw=0.8)
    ax2.set_yticks(y, labels, fontsize=7)
    ax2.set_xlabel("mean difference ± 1 s.e. (nats/token)")
    ax2.set_title(f"mean ± 1 s.e. (not a 95% interval), s.e. clustered by {result.cluster}\n"
                  "open: fewer than 5 clusters (no s.e. without a bar)", fontsize=8)
    return fig
