"""Time the approach-3 fitter against a straightforward reference on Epoch's Chinchilla points.

    python benchmarks/fit_speed.py [--json] [--data PATH] [--every K]

Data: ``../shared/data/chinchilla_epoch/svg_extracted_data.csv`` (Besiroglu et al. 2024), the
240 points left after dropping the 5 highest losses, D = C/(6N), as Epoch fitted them.

- ours_s: ``scaling.fitting.fit.fit_law`` without bootstrap (batched L-BFGS over the law's start grid,
  refinement, scipy polish).
- reference_s (the fair reference, reported first): scipy L-BFGS-B given the *same analytic
  gradient* (``Objective``), scipy's default tolerances, one start at a time over the same grid,
  best kept (``benchmarks/fit_scaling.py::scipy_fit``). ratio = reference_s / ours_s.
- numgrad_reference_s (second, for comparison with how Epoch's notebook fits): scipy L-BFGS-B
  with numerical (2-point) gradients, the objective as Epoch's notebook writes it (logsumexp of
  the three terms, here with np.logaddexp; sum of scipy.special.huber). ratio_numgrad =
  numgrad_reference_s / ours_s: most of that ratio is the numerical gradient, not our optimiser.
- bootstrap_200_s: the 200-resample bootstrap stage alone (``scaling.fitting.fit.bootstrap`` from the
  full fit's distinct optima); fit_with_bootstrap_200_s: the whole ``fit_law(n_bootstrap=200)``.

``--every K`` uses every K-th start of the grid for both (quick runs); the default is the whole
grid. Timings are wall-clock in one process; ours are the best of ``--repeat`` runs, the
reference runs once. The machine may be shared, so CPU times of this process (``*_cpu_s``,
``ratio_cpu``: less sensitive to other load) and the load average are reported beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from fit_scaling import scipy_fit  # noqa: E402  (benchmarks/ is the script's directory)
from scipy.optimize import minimize
from scipy.special import huber

from scaling.fitting.fit import DEFAULT_DELTA, Objective, bootstrap, distinct_optima, fit_law, multistart
from scaling.fitting.laws import get_law
from scaling.fitting.tables import Columns, law_inputs, load_points

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "chinchilla_epoch" / "svg_extracted_data.csv"


def chinchilla_points(path: Path):
    df = load_points(path, Columns(n="Model Size", c="Training FLOP"))
    cut = np.sort(df["loss"].to_numpy())[-5]
    return df[df["loss"] < cut].reset_index(drop=True)   # Epoch: keep loss < 5th-highest loss


def reference_fit(N, D, L, starts, lo, hi, delta=DEFAULT_DELTA):
    logN, logD, logL = np.log(N), np.log(D), np.log(L)

    def objective(z):
        e, a, alpha, b, beta = z
        pred = np.logaddexp(np.logaddexp(a - alpha * logN, b - beta * logD), e)
        return np.sum(huber(delta, logL - pred))

    best = None
    for z0 in starts:
        r = minimize(objective, z0, method="L-BFGS-B", bounds=list(zip(lo, hi)))
        if best is None or r.fun < best.fun:
            best = r
    return best


def _timed(fn):
    """(wall seconds, CPU seconds of this process, result)."""
    w0, c0 = time.perf_counter(), time.process_time()
    result = fn()
    return time.perf_counter() - w0, time.process_time() - c0, result


def _best_of(repeat, fn):
    """Smallest wall and CPU time of ``repeat`` calls (the machine is shared) and the last result."""
    runs = [_timed(fn) for _ in range(max(1, repeat))]
    return min(r[0] for r in runs), min(r[1] for r in runs), runs[-1][2]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--every", type=int, default=1, help="use every K-th start of the grid (both fitters)")
    ap.add_argument("--repeat", type=int, default=3, help="our fitter's timings: best of this many runs")
    args = ap.parse_args(argv)
    if not args.data.exists():
        print(f"error: {args.data} not found (needs ../shared/data/chinchilla_epoch/)", file=sys.stderr)
        return 2
    law = get_law("chinchilla")
    df = chinchilla_points(args.data)
    starts = law.starts()[:: args.every]
    lo, hi = law.internal_bounds().T
    X = law_inputs(df, law.inputs)
    y = np.log(df["loss"].to_numpy())

    ours_s, ours_cpu, ours = _best_of(args.repeat, lambda: fit_law(df, law, n_bootstrap=0, starts=starts))
    obj = Objective(law, X, y)
    opt = multistart(obj, starts)
    boot_starts = opt.refined_z[distinct_optima(opt.refined_z, opt.refined_f)]
    boot_s, boot_cpu, _ = _best_of(
        args.repeat, lambda: bootstrap(law, X, y, df["run"].to_numpy(), boot_starts, n_resamples=200, seed=0)
    )

    full_s, _, _ = _timed(lambda: fit_law(df, law, n_bootstrap=200, seed=0, starts=starts))
    ref_s, ref_cpu, ref = _timed(lambda: scipy_fit(obj, starts, lo, hi))
    ref_theta = law.as_dict(law.from_internal(ref.x))
    num_s, num_cpu, num = _timed(lambda: reference_fit(X["N"], X["D"], df["loss"].to_numpy(), starts, lo, hi))

    out = {
        "ours_s": ours_s,
        "reference_s": ref_s,
        "ratio": ref_s / ours_s,
        "numgrad_reference_s": num_s,
        "ratio_numgrad": num_s / ours_s,
        "bootstrap_200_s": boot_s,
        "fit_with_bootstrap_200_s": full_s,
        "ours_cpu_s": ours_cpu,
        "reference_cpu_s": ref_cpu,
        "ratio_cpu": ref_cpu / ours_cpu,
        "ratio_numgrad_cpu": num_cpu / ours_cpu,
        "bootstrap_200_cpu_s": boot_cpu,
        "n_starts": int(len(starts)),
        "n_points": int(len(df)),
        "ours_objective": ours.diagnostics["objective"],
        "reference_objective": float(ref.fun),
        "numgrad_reference_objective": float(num.fun),
        "ours_params": ours.params,
        "reference_params": ref_theta,
        "cpu_count": os.cpu_count(),
        "load_average": list(os.getloadavg()),
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print(f"{k:>26}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
