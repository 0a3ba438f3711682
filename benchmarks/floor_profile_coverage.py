"""Coverage of the loss floor's profile-likelihood interval (scaling/fitting/floor_profile.py) on
planted studies.

    python benchmarks/floor_profile_coverage.py [--studies 100] [--cases ...] [--json]

The studies are those of benchmarks/interval_coverage.py (Epoch's refit of Chinchilla's law, E =
1.82; the IsoFLOP design shaped like runs/: 9 sizes x 5 budgets over one decade, every run one
trunk through its budgets; the curves design: 10 sizes x 12 token counts over three decades), with
a log-normal offset per run (a seed's luck, shared by the run's points) and independent noise per
point. Each study is fitted (``fit_law``, Huber on log loss, no bootstrap) and profiled; per case:
the share of studies whose allowed floors include the planted E (with its Wilson 95% interval),
the median width of the allowed range, how often the free fit put E on its bound, and the same
coverage without the design-effect correction (deff = 1: the reference the correction is for).

The proxy case plants a law where the shipped study sits: the design of runs/'s Baseline points
(213 points, 59 runs; N, D and FLOPs as trained), the law its profile allows at E = 2.2 (E 2.2, A
4.150, alpha 0.1065, B 511.4, beta 0.4339: `fit_law` of those points with E fixed at 2.2), and
noise of the size its residuals show (total s.d. 0.022, intraclass correlation 0.49: run and
point s.d. 0.015 each). There E is not identified: the free fit ends on its bound.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from interval_coverage import LAW, study  # noqa: E402

from scaling.common.stats import wilson_interval  # noqa: E402
from scaling.fitting import floor_profile as fp  # noqa: E402
from scaling.fitting.fit import fit_law  # noqa: E402

E_TRUE = LAW["E"]
PROXY_LAW = {"E": 2.2, "A": 4.150, "alpha": 0.1065, "B": 511.4, "beta": 0.4339}
ROOT = Path(__file__).resolve().parents[1]
# name: (design, seeds per size, run offset s.d., point noise s.d.)
CASES = {
    "proxy-runs-baseline": ("proxy", 0, 0.015, 0.015),
    "iso-s3-run1-pt0.5": ("isoflop", 3, 0.01, 0.005),
    "iso-s1-pt1": ("isoflop", 1, 0.0, 0.01),
    "curves-s2-run1-pt0.5": ("curves", 2, 0.01, 0.005),
    "curves-s1-pt1": ("curves", 1, 0.0, 0.01),
}


@functools.lru_cache(maxsize=1)
def _proxy_design() -> pd.DataFrame:
    from scaling.fitting.tables import load_points

    pts = load_points(ROOT / "runs")
    return pts[pts["group"] == "baseline"].reset_index(drop=True)


def proxy_study(rng: np.random.Generator, run: float, point: float) -> pd.DataFrame:
    """runs/'s Baseline design under ``PROXY_LAW``, one log-normal offset per run plus point noise."""
    pts = _proxy_design().copy()
    law = PROXY_LAW
    clean = law["E"] + law["A"] / pts["N"] ** law["alpha"] + law["B"] / pts["D"] ** law["beta"]
    runs, idx = np.unique(pts["run"].to_numpy(), return_inverse=True)
    offsets = rng.normal(0.0, run, runs.size)[idx]
    pts["loss"] = clean * np.exp(offsets + rng.normal(0.0, point, len(pts)))
    return pts


def covered(prof: dict, E: float) -> bool:
    """The planted floor lies inside the allowed range (its ends bisected to the grid's resolution)."""
    lo, hi = prof["E_range"]
    return bool(np.isfinite(lo) and lo <= E <= hi)


def run_case(name: str, studies: int, seed: int) -> dict:
    design, seeds, run, point = CASES[name]
    rng = np.random.default_rng([seed, list(CASES).index(name)])
    hits = hits_iid = bound = 0
    widths = []
    t0 = time.perf_counter()
    for _ in range(studies):
        pts = proxy_study(rng, run, point) if design == "proxy" else study(rng, design, seeds, run, point)
        fit = fit_law(pts, n_bootstrap=0)
        prof = fp.floor_profile(pts, fit, fit_law)
        bound += "E" in fit.diagnostics["on_bound"]
        e_true = PROXY_LAW["E"] if design == "proxy" else E_TRUE
        hits += covered(prof, e_true)
        widths.append(prof["E_range"][1] - prof["E_range"][0])
        # the same fits read with deff = 1 (to the resolution of the floors tried, which were
        # bisected for the corrected statistic)
        deff, crit = prof["design_effect"], prof["critical"]
        inside = [E for E, d in zip(prof["E"], prof["delta"]) if d * deff <= crit]
        hits_iid += bool(inside) and min(inside) <= e_true <= max(inside)
    return {"case": name, "design": design, "seeds": seeds, "run_sd": run, "point_sd": point,
            "studies": studies, "covered": hits, "coverage": hits / studies,
            "coverage_wilson95": list(wilson_interval(hits, studies)),
            "covered_without_deff": int(hits_iid), "coverage_without_deff": hits_iid / studies,
            "median_width": float(np.median(widths)), "E_on_bound": bound,
            "seconds": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--studies", type=int, default=100)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = []
    for c in args.cases.split(","):
        rows.append(run_case(c, args.studies, args.seed))
        r = rows[-1]
        print(f"{c}: {r['covered']}/{args.studies} covered, {r['seconds']:.0f} s", file=sys.stderr)
    if args.json:
        print(json.dumps({"E_true": E_TRUE, "level": 0.95, "rows": rows}, indent=1))
        return
    print(f"planted E = {E_TRUE} ({PROXY_LAW['E']} in the proxy case); 95% profile-likelihood interval of E")
    for r in rows:
        lo, hi = r["coverage_wilson95"]
        print(f"{r['case']:>22}: covered {r['covered']}/{r['studies']} ({r['coverage']:.2f} [{lo:.2f}, "
              f"{hi:.2f}]); without deff {r['covered_without_deff']}/{r['studies']}; median width "
              f"{r['median_width']:.3g}; E on its bound in {r['E_on_bound']}; {r['seconds']:.0f} s")


if __name__ == "__main__":
    main()
