"""Fit the per-width learning-rate rule of the IsoFLOP proxy study from the lr sweep (issue 26).

    python plans/fit_lr_rule.py [runs-lr] [--budget-index 1] [--arch baseline|smelt] [--json]

For each width (d_model), the validation loss of every run at one budget of the lr sweep
(plans/lr-sweep.toml; each seed a point) against x = log10(peak lr): a least-squares parabola
L = b0 + b1 x + b2 x^2 over all of them gives the optimum lr*(d) = 10^(-b1 / 2 b2), with a 95%
interval from the delta method (gradient of the vertex in b, the OLS covariance s^2 (X'X)^-1,
Student t with n - 3 degrees of freedom). An optimum is "bracketed" when b2 > 0 and the vertex
lies inside the grid. For comparison the script also prints the older estimate: the parabola
through the best mean loss and its two neighbours (and the same per seed, whose spread shows
how well one seed resolves the optimum). Two widths give the power law
lr*(d) = lr*(d1) (d / d1)^-gamma, gamma = -log(lr*(d2) / lr*(d1)) / log(d2 / d1), with a 95%
interval from the two vertices' (independent) standard errors. muP (Yang et al. 2022, "Tensor
Programs V") has gamma = 1 for Adam on the hidden matrices.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy.stats import t as student_t

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, as its siblings

from scaling.common.errors import UserError  # noqa: E402
from scaling.fitting.tables import read_runs_dir  # noqa: E402


def load(root: Path, budget_index: int,
         arch: str = "baseline") -> dict[int, dict[float, dict[int, tuple[float, float]]]]:
    """{d_model: {lr: {seed: (tokens, loss)}}} of the finished lr-sweep runs of ``arch`` under ``root``.

    The points come from the package's one runs-folder reader (``read_runs_dir``). d_model is
    the Baseline's of the run's tier (``lr-dNN-...``), so a SMELT twin (narrower) is keyed by
    the Baseline it is matched to."""
    pts = read_runs_dir(root)
    pts = pts[(pts["arch"] == arch) & (pts["budget_index"] == budget_index)]
    out: dict[int, dict[float, dict[int, tuple[float, float]]]] = defaultdict(lambda: defaultdict(dict))
    for p in pts.sort_values("run_dir").itertuples():
        tier = re.fullmatch(r"lr-d(\d+)-.*", str(p.tier))
        if tier is None or not np.isfinite(p.lr):
            raise UserError(f"{p.run_dir} is not an lr-sweep run (tier lr-dNN-..., a peak lr)")
        out[int(tier.group(1))][float(p.lr)][int(p.seed)] = (float(p.D), float(p.loss))
    return {d: dict(sorted(v.items())) for d, v in sorted(out.items())}


def rows_of(by_lr: dict[float, dict[int, tuple[float, float]]],
            seed: int | None = None) -> list[tuple[float, float, float]]:
    """(lr, tokens, loss) per lr: the mean over seeds, or one seed's (the lrs it has)."""
    out = []
    for lr, runs in by_lr.items():
        if seed is None:
            out.append((lr, runs[min(runs)][0], sum(v[1] for v in runs.values()) / len(runs)))
        elif seed in runs:
            out.append((lr, *runs[seed]))
    return out


def ls_optimum(by_lr: dict[float, dict[int, tuple[float, float]]]) -> dict:
    """The least-squares parabola's vertex over every run of one width (module docstring)."""
    x = np.array([math.log10(lr) for lr, runs in by_lr.items() for _ in runs])
    y = np.array([v[1] for runs in by_lr.values() for v in runs.values()])
    n = len(y)
    if n < 4 or len(set(x)) < 3:
        return {"lr": None, "bracketed": False, "n": n, "note": "fewer than 4 runs on 3 lrs"}
    X = np.c_[np.ones(n), x, x ** 2]
    b, *_ = np.linalg.lstsq(X, y, rcond=None)
    r = y - X @ b
    s2 = float(r @ r) / (n - 3)
    cov = s2 * np.linalg.inv(X.T @ X)
    if b[2] <= 0:
        return {"lr": None, "bracketed": False, "n": n, "resid_sd": math.sqrt(s2),
                "note": "the parabola opens downwards: no optimum inside the grid"}
    xv = -b[1] / (2 * b[2])
    g = np.array([0.0, -1 / (2 * b[2]), b[1] / (2 * b[2] ** 2)])
    se = float(math.sqrt(g @ cov @ g))
    q = float(student_t.ppf(0.975, n - 3))
    inside = min(x) < xv < max(x)
    return {"lr": 10 ** xv, "se_log10": se, "lo": 10 ** (xv - q * se), "hi": 10 ** (xv + q * se),
            "bracketed": bool(inside), "n": n, "resid_sd": math.sqrt(s2), "curvature": float(b[2]),
            "note": "" if inside else "the vertex lies outside the grid: an extrapolation"}


def optimum(rows: list[tuple[float, float, float]]) -> dict:
    """Vertex of the parabola in log10(lr) through the best grid point and its neighbours."""
    lrs = [r[0] for r in rows]
    losses = [r[2] for r in rows]
    i = min(range(len(rows)), key=losses.__getitem__)
    if i in (0, len(rows) - 1):
        side = "below" if i == 0 else "above"
        return {"lr": lrs[i], "bracketed": False, "loss": losses[i],
                "note": f"best lr at the grid's edge: the optimum is at or {side} {lrs[i]:g}"}
    x = [math.log10(lrs[k]) for k in (i - 1, i, i + 1)]
    y = [losses[k] for k in (i - 1, i, i + 1)]
    # parabola through three points: vertex from the divided differences
    d1 = (y[1] - y[0]) / (x[1] - x[0])
    d2 = ((y[2] - y[1]) / (x[2] - x[1]) - d1) / (x[2] - x[0])
    xv = 0.5 * (x[0] + x[1]) - d1 / (2 * d2)
    return {"lr": 10 ** xv, "bracketed": True, "loss": losses[i], "grid_best": lrs[i], "note": ""}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="?", default="runs-lr", help="the lr sweep's runs folder")
    ap.add_argument("--budget-index", type=int, default=1,
                    help="which budget of the sweep (0: 0.1M, 1: 0.3M)")
    ap.add_argument("--arch", default="baseline", choices=["baseline", "smelt"],
                    help="which architecture's runs (smelt: the twins, keyed by their Baseline's d_model)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()
    b = a.budget_index
    try:
        data = load(Path(a.runs), b, a.arch)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)
    seeds = sorted({k for by_lr in data.values() for runs in by_lr.values() for k in runs})
    ls = {d: ls_optimum(by_lr) for d, by_lr in data.items()}
    opt = {d: optimum(rows_of(by_lr)) for d, by_lr in data.items()}
    per_seed = {d: {k: optimum(rows_of(by_lr, k)) for k in seeds if len(rows_of(by_lr, k)) >= 3}
                for d, by_lr in data.items()} if len(seeds) > 1 else {}
    widths = [d for d in sorted(ls) if ls[d]["lr"] is not None]
    rule = None
    if len(widths) >= 2:
        d1, d2 = widths[0], widths[-1]
        span = math.log(d2 / d1)
        gamma = -math.log(ls[d2]["lr"] / ls[d1]["lr"]) / span
        se = math.hypot(ls[d1]["se_log10"], ls[d2]["se_log10"]) * math.log(10) / span
        rule = {"lr_at": d1, "lr": ls[d1]["lr"], "gamma": gamma, "gamma_se": se,
                "gamma_lo": gamma - 1.96 * se, "gamma_hi": gamma + 1.96 * se,
                "both_bracketed": ls[d1]["bracketed"] and ls[d2]["bracketed"]}
    if a.json:
        print(json.dumps({"budget_index": b, "arch": a.arch, "seeds": seeds,
                          "points": {str(d): {f"{lr:g}": {str(k): v[1] for k, v in runs.items()}
                                              for lr, runs in by_lr.items()} for d, by_lr in data.items()},
                          "optimum": {str(d): o for d, o in ls.items()},
                          "optimum_three_point": {str(d): o for d, o in opt.items()},
                          "optimum_per_seed": {str(d): {str(k): o for k, o in v.items()}
                                               for d, v in per_seed.items()},
                          "rule": rule}, indent=2))
        return
    print(f"seeds {', '.join(map(str, seeds))}; loss = mean over the seeds an lr ran with"
          + (" (seed losses in brackets)" if len(seeds) > 1 else ""))
    for d, by_lr in data.items():
        rows = rows_of(by_lr)
        cells = []
        for (lr, _, loss), runs in zip(rows, by_lr.values()):
            each = "" if len(seeds) < 2 else " [" + ", ".join(f"{runs[k][1]:.3f}" for k in sorted(runs)) + "]"
            cells.append(f"lr {lr:g}: {loss:.4f}{each}")
        print(f"d_model {d} (at {rows[0][1]:,.0f} tokens):\n  " + "\n  ".join(cells))
        o = ls[d]
        if o["lr"] is None:
            print(f"  optimum: none ({o['note']})")
        else:
            note = f"; {o['note']}" if o["note"] else ""
            print(f"  optimum lr {o['lr']:.3g}, 95% [{o['lo']:.3g}, {o['hi']:.3g}] (least-squares parabola "
                  f"over {o['n']} runs, residual s.d. {o['resid_sd']:.3f} nats){note}")
        o = opt[d]
        note = f"  ({o['note']})" if o["note"] else ""
        print(f"  three-point vertex of the mean losses: {o['lr']:.3g}{note}")
        if per_seed.get(d):
            print("  per seed: " + ", ".join(f"seed {k} {v['lr']:.3g}" + ("" if v["bracketed"] else " (edge)")
                                              for k, v in per_seed[d].items()))
    if rule:
        print(f"rule: lr(d) = {rule['lr']:.3g} * (d/{rule['lr_at']})^-{rule['gamma']:.3g} "
              f"(gamma 95% [{rule['gamma_lo']:.2f}, {rule['gamma_hi']:.2f}])"
              + ("" if rule["both_bracketed"] else
                 "  (an optimum outside a grid: the exponent is an extrapolation)"))

if __name__ == "__main__":
    main()
