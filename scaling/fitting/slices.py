"""IsoFLOP slices of training runs: the loss of every run at fixed training compute, interpolated
along its budget points (Hoffmann et al. 2022, approach 2 read off training curves). The slices
feed ``scaling.fitting.approaches`` and the IsoFLOP figure (``scaling.plots``)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from scaling.common.errors import UserError
from scaling.fitting.tables import total_flops


def isoflop_slices(points: pd.DataFrame, levels: Sequence[float] | None = None, *, n_levels: int = 4,
                   min_sizes: int = 4) -> pd.DataFrame:
    """Loss of every run at fixed training compute, interpolated along its budget points.

    Each run's points (recorded FLOPs C, loss) are interpolated linearly in (log C, log L)
    inside the run's own compute range (no extrapolation): a WSD sweep with the same token
    budgets for every size has no two sizes at the same compute, and this is how Hoffmann
    et al. (2022, approach 2) read IsoFLOP profiles off training curves. Default ``levels``:
    ``n_levels`` log-spaced computes inside the range every group covers with at least
    ``min_sizes`` distinct sizes (fewer where no range has that many). Returns columns group, run,
    N, compute, loss, D (= compute / the run's recorded FLOPs per token).
    """
    df = points.copy()
    df["C"] = total_flops(df)
    curves = {r: g.sort_values("C") for r, g in df.groupby("run") if g["C"].nunique() >= 2}
    if not curves:
        raise UserError("IsoFLOP slices need runs with at least two budgets each")
    if levels is None:
        lo_hi = []
        for _, gp in df.groupby("group"):
            runs = [(float(c["N"].iloc[0]), np.log(c["C"].min()), np.log(c["C"].max()))
                    for r, c in curves.items() if r in set(gp["run"])]
            if not runs:
                continue
            spans = np.array([(lo, hi) for _, lo, hi in runs])
            sizes = np.array([n for n, _, _ in runs])
            grid = np.linspace(spans[:, 0].min(), spans[:, 1].max(), 400)
            inside = (grid[:, None] >= spans[None, :, 0]) & (grid[:, None] <= spans[None, :, 1])
            # coverage counts sizes, not runs: two seeds of one size are one point of a profile
            cover = np.array([np.unique(sizes[row]).size for row in inside])
            need = min(min_sizes, int(cover.max()))
            ok = grid[cover >= need]
            lo_hi.append((ok.min(), ok.max()))
        lo = max(a for a, _ in lo_hi)
        hi = min(b for _, b in lo_hi)
        if hi <= lo:
            raise UserError("the groups share no compute range covered by enough runs")
        pad = 0.04 * (hi - lo)
        levels = np.exp(np.linspace(lo + pad, hi - pad, n_levels))
    rows = []
    for run, c in curves.items():
        x, y = np.log(c["C"].to_numpy()), np.log(c["loss"].to_numpy())
        F = float(c["C"].iloc[-1] / c["D"].iloc[-1])
        for C in levels:
            if x.min() <= np.log(C) <= x.max():
                rows.append({"group": c["group"].iloc[0], "run": run, "N": float(c["N"].iloc[0]),
                             "compute": float(C), "loss": float(np.exp(np.interp(np.log(C), x, y))),
                             "D": float(C) / F})
    return pd.DataFrame(rows, columns=["group", "run", "N", "compute", "loss", "D"])
