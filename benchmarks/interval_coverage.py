"""Coverage of approaches 1 and 2's intervals of the size exponent a (N* ~ C^a) on planted studies.

    python benchmarks/interval_coverage.py [--studies 200] [--resamples 100] [--cases ...] [--json]

Design: studies shaped like the shipped IsoFLOP study (runs/), under Chinchilla's law as Epoch
refitted it (Besiroglu et al. 2024: E 1.82, A 482.01, alpha 0.3478, B 2085.43, beta 0.3658), whose
planted exponent is a = beta / (alpha + beta) = 0.5126 (Hoffmann et al. 2022, eq. 4). 9 sizes log-spaced
a factor 10 either side of the optimum at the middle of 5 budgets over one decade (3.56e18 to
3.56e19 FLOPs, C = 6 N D); every run is one training curve through all 5 budgets (a WSD trunk),
and each of a size's `seeds` runs carries one log-normal offset for all its budgets (a seed's luck,
s.d. `run`) on top of independent log-normal noise per point (s.d. `point`).

The curves design (approach 1's home): 10 sizes log-spaced over 3e7-3e9, each trained through 12
token counts log-spaced over 1e9-1e12 (one training curve per run over three decades of compute),
the same noise model; approach 2 finds no IsoFLOP buckets there.

Each study is analysed by ``approach1`` and ``approach2`` (scaling/fitting/approaches.py) with the
same bootstrap seed under both seed resamplers (``_seed_resamples``): ``n`` draws k of a
configuration's k seeds (the naive bootstrap), ``n-1`` draws k - 1 (Rao and Wu's rescaling, the
default). Per case and resampler: the share of studies whose interval covers the planted a (with
its Wilson 95% interval over the studies), the median interval width, and how many studies gave an
interval; for approach 2 also the OLS interval alone and the bootstrap alone. Reference and
candidate run side by side on the same studies and resample draws.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scaling.common.stats import wilson_interval  # noqa: E402
from scaling.fitting.approaches import approach1, approach2  # noqa: E402

LAW = {"E": 1.82, "A": 482.01, "alpha": 0.3478, "B": 2085.43, "beta": 0.3658}
A_TRUE = LAW["beta"] / (LAW["alpha"] + LAW["beta"])
BUDGETS = np.geomspace(3.56e18, 3.56e19, 5)
CURVE_SIZES = np.geomspace(3e7, 3e9, 10)
CURVE_TOKENS = np.geomspace(1e9, 1e12, 12)
# name: (design, seeds per size, run offset s.d., point noise s.d.); iso-s3-run1-pt0.5 = the IsoFLOP
# design, 3 seeds, 1% run offsets, 0.5% point noise
CASES = {
    "iso-s3-run2": ("isoflop", 3, 0.02, 0.0),
    "iso-s3-run1-pt0.5": ("isoflop", 3, 0.01, 0.005),
    "iso-s3-pt1": ("isoflop", 3, 0.0, 0.01),
    "iso-s5-run1-pt0.5": ("isoflop", 5, 0.01, 0.005),
    "iso-s5-run3": ("isoflop", 5, 0.03, 0.0),
    "iso-s7-run1-pt0.5": ("isoflop", 7, 0.01, 0.005),
    "curves-s3-run2": ("curves", 3, 0.02, 0.0),
    "curves-s5-run2": ("curves", 5, 0.02, 0.0),
    "curves-s7-run2": ("curves", 7, 0.02, 0.0),
    "curves-s3-run1-pt0.5": ("curves", 3, 0.01, 0.005),
}
DRAWS = ("n", "n-1")


def loss(N: np.ndarray, D: np.ndarray) -> np.ndarray:
    return LAW["E"] + LAW["A"] / N ** LAW["alpha"] + LAW["B"] / D ** LAW["beta"]


def study(rng: np.random.Generator, design: str, seeds: int, run: float, point: float) -> pd.DataFrame:
    alpha, beta = LAW["alpha"], LAW["beta"]
    if design == "isoflop":
        g = (alpha * LAW["A"] / (beta * LAW["B"])) ** (1 / (alpha + beta))   # N* = g (C/6)^a (Hoffmann eq. 4)
        sizes = g * (np.sqrt(BUDGETS[0] * BUDGETS[-1]) / 6) ** A_TRUE * np.geomspace(0.1, 10, 9)
    else:
        sizes = CURVE_SIZES
    rows = []
    for i, n in enumerate(sizes):
        d = BUDGETS / (6 * n) if design == "isoflop" else CURVE_TOKENS
        for s in range(seeds):
            offset = rng.normal(0.0, run)
            ls = loss(np.full(d.size, n), d) * np.exp(offset + rng.normal(0.0, point, d.size))
            rows += [(f"r{i}-s{s}", n, dd, 6 * n * dd, 6 * n, ll, str(s)) for dd, ll in zip(d, ls)]
    return pd.DataFrame(rows, columns=["run", "N", "D", "flops", "flops_per_token", "loss", "seed"])


def basic(r: dict) -> tuple[float, float] | None:
    """The basic (reverse-percentile) bootstrap interval [2 a - hi, 2 a - lo] from the estimate and the
    percentile interval [lo, hi] (Davison and Hinkley 1997, eq. 5.6): it corrects a bias the resamples
    show against the estimate, where the percentile interval inherits it."""
    ci = r.get("a_ci")
    if ci is None or not np.all(np.isfinite(ci)):
        return None
    return 2 * r["a"] - ci[1], 2 * r["a"] - ci[0]


def summarise(lo: list[float], hi: list[float]) -> dict:
    lo_, hi_ = np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)
    has = np.isfinite(lo_) & np.isfinite(hi_)
    hits = int(((lo_ <= A_TRUE) & (A_TRUE <= hi_))[has].sum())
    n = int(has.sum())
    return {"with_interval": n, "covered": hits,
            "coverage": hits / n if n else None,
            "coverage_wilson95": list(wilson_interval(hits, n)) if n else None,
            "median_width": float(np.median(hi_[has] - lo_[has])) if n else None}


def run_case(name: str, studies: int, resamples: int, seed: int) -> dict:
    design, seeds, run, point = CASES[name]
    rng = np.random.default_rng([seed, list(CASES).index(name)])
    acc: dict[str, list] = {}

    def add(key: str, ci) -> None:
        lo, hi = acc.setdefault(key, ([], []))
        lo.append(float(ci[0]) if ci is not None else np.nan)
        hi.append(float(ci[1]) if ci is not None else np.nan)

    estimates = {"approach1": [], "approach2": []}
    for k in range(studies):
        pts = study(rng, design, seeds, run, point)
        for draws in DRAWS:
            r1 = approach1(pts, n_bootstrap=resamples, seed=k, seed_draws=draws)
            add(f"approach1 [{draws}]", r1.get("a_ci") if r1["available"] else None)
            add(f"approach1 basic [{draws}]", basic(r1) if r1["available"] else None)
            r2 = approach2(pts, n_bootstrap=resamples, seed=k, seed_draws=draws)
            add(f"approach2 union [{draws}]", r2.get("a_ci") if r2["available"] else None)
            add(f"approach2 bootstrap [{draws}]", r2.get("a_ci_bootstrap") if r2["available"] else None)
            add(f"approach2 basic [{draws}]",
                basic({**r2, "a_ci": r2.get("a_ci_bootstrap")}) if r2["available"] else None)
            if draws == DRAWS[0]:
                add("approach1 OLS", r1.get("a_ci_ols") if r1["available"] else None)
                add("approach2 OLS", r2.get("a_ci_ols") if r2["available"] else None)
                estimates["approach1"].append(r1["a"] if r1["available"] else np.nan)
                estimates["approach2"].append(r2["a"] if r2["available"] else np.nan)
    est = {k: {"available": int(np.isfinite(v).sum()),
               "median_error": float(np.nanmedian(np.asarray(v) - A_TRUE)) if np.isfinite(v).any() else None,
               "sd": float(np.nanstd(v, ddof=1)) if np.isfinite(v).sum() > 1 else None}
           for k, v in estimates.items()}
    return {"case": name, "design": design, "seeds": seeds, "run_sd": run, "point_sd": point,
            "estimates": est, "intervals": {k: summarise(*v) for k, v in acc.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--studies", type=int, default=200)
    ap.add_argument("--resamples", type=int, default=100, help="bootstrap resamples per study")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    names = [c.strip() for c in a.cases.split(",") if c.strip()]
    unknown = [c for c in names if c not in CASES]
    if unknown:
        raise SystemExit(f"error: unknown case {unknown[0]!r}; choose from {', '.join(CASES)}")
    t0, cpu0 = time.time(), time.process_time()
    results = [run_case(c, a.studies, a.resamples, a.seed) for c in names]
    out = {"design": {"law": LAW, "a_true": A_TRUE,
                      "isoflop": {"budgets": BUDGETS.tolist(), "sizes": 9,
                                  "size_span": "0.1-10 x the middle budget's optimum"},
                      "curves": {"sizes": CURVE_SIZES.tolist(), "tokens": CURVE_TOKENS.tolist()},
                      "studies": a.studies,
                      "resamples": a.resamples, "seed": a.seed},
           "results": results, "wall_s": time.time() - t0, "cpu_s": time.process_time() - cpu0,
           "loadavg": os.getloadavg()[0]}
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print(f"planted a = {A_TRUE:.4f}; {a.studies} studies, {a.resamples} resamples each; 95% intervals")

    def f(v: float | None, fmt: str) -> str:
        return "n/a" if v is None else format(v, fmt)

    for r in results:
        e1, e2 = r["estimates"]["approach1"], r["estimates"]["approach2"]
        print(f"\n{r['case']}: {r['design']} design, {r['seeds']} seeds, run s.d. {r['run_sd']:g}, "
              f"point s.d. {r['point_sd']:g}; a-hat: approach 1 in {e1['available']}, median error "
              f"{f(e1['median_error'], '+.3f')}, s.d. {f(e1['sd'], '.3f')}; approach 2 in {e2['available']}, "
              f"{f(e2['median_error'], '+.3f')}, s.d. {f(e2['sd'], '.3f')}")
        for k, s in r["intervals"].items():
            if s["with_interval"]:
                lo, hi = s["coverage_wilson95"]
                print(f"  {k:32s} coverage {100 * s['coverage']:5.1f}% [{100 * lo:4.1f}, {100 * hi:4.1f}]"
                      f"  of {s['with_interval']:3d}  median width {s['median_width']:.3f}")
            else:
                print(f"  {k:32s} no interval")
    print(f"\nwall {out['wall_s']:.0f} s")


if __name__ == "__main__":
    main()
