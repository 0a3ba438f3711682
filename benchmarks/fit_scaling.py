"""Time and memory of the approach-3 fitter as the table grows, beside a fair scipy reference.

    python benchmarks/fit_scaling.py [--json] [--sizes 250,2500,25000,250000] [--bootstrap 200]
                                     [--startup-repeats 5]
    python benchmarks/fit_scaling.py --rows 1000000 [--json]

``--rows N`` (issue 25): only the whole command ``smelt-scale fit TABLE --json`` (default settings:
200 bootstrap resamples, cross-checks) on an N-row CSV of this synthetic data, in a fresh process:
wall seconds and the child's CPU seconds (user + system; less sensitive to a shared machine's
load), with the load average. Above 16,384 points the fitter refines on a subset first and above
20,000 it bootstraps by one Gauss-Newton step per resample (``scaling.fitting.fit``).

Start-up (issue 20): wall seconds of whole ``smelt-scale`` processes (``--help``, ``tiers --json``,
``fit`` of a 250-point table with and without the bootstrap), median of 5, measured first.

Data: synthetic tables from a known Chinchilla law (E 1.8, A 480, alpha 0.35, B 2100, beta 0.37)
with 1% multiplicative noise; runs of 10 token budgets each (N log-uniform in [3e7, 1e10], a run's
budgets log-spaced over 1.5 decades up to a log-uniform D_max in [3e10, 5e11]), seed 0.

Per size:
- ours: ``fit_law(n_bootstrap=0)`` (screen of the 2,700-start grid on <= 1,024 points, refine the
  best 32 on all points, scipy polish), then the 200-resample bootstrap stage alone
  (``scaling.fitting.fit.bootstrap`` from the full fit's distinct optima, warm starts).
- reference: scipy L-BFGS-B (default tolerances) with the *same analytic gradient*
  (``Objective``), one start at a time over the same grid, best kept; its bootstrap: scipy
  L-BFGS-B from the reference optimum on each resample. At the larger sizes the reference runs
  every k-th grid start and fewer resamples (``ref_starts``, ``ref_resamples`` in the output:
  2,700/3 starts and 50 resamples at 250 points down to 2,700/900 starts and 2 resamples at
  250,000) so that the benchmark finishes on a shared machine; its times are also given per start
  and per resample.
- wall seconds, this process's CPU seconds (``cpu_s``: less sensitive to other load) and peak
  traced memory (``tracemalloc``: every Python and numpy allocation of
  that stage; not the interpreter's baseline) and the optimum each reached (objective, params).
The machine may be shared: the load average is reported.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import tracemalloc

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from scaling.fitting.fit import Objective, _run_weights, bootstrap, distinct_optima, fit_law, multistart
from scaling.fitting.laws import get_law

TRUE = {"E": 1.8, "A": 480.0, "alpha": 0.35, "B": 2100.0, "beta": 0.37}
REF_EVERY = {250: 3, 2500: 9, 25000: 90, 250000: 900}     # reference: every k-th grid start
REF_RESAMPLES = {250: 50, 2500: 20, 25000: 5, 250000: 2}


def synthetic(n: int, seed: int = 0) -> pd.DataFrame:
    law = get_law("chinchilla")
    rng = np.random.default_rng(seed)
    runs = max(1, n // 10)
    N = np.repeat(np.exp(rng.uniform(np.log(3e7), np.log(1e10), runs)), 10)[:n]
    dmax = np.repeat(np.exp(rng.uniform(np.log(3e10), np.log(5e11), runs)), 10)[:n]
    D = dmax * np.tile(np.geomspace(10 ** -1.5, 1.0, 10), runs)[:n]
    L = law.predict(TRUE, N=N, D=D) * np.exp(0.01 * rng.standard_normal(n))
    return pd.DataFrame({"group": "g", "run": np.repeat(np.arange(runs), 10)[:n].astype(str), "N": N, "D": D,
                         "loss": L, "flops": 6 * N * D, "flops_per_token": np.nan, "sparsity": np.nan})


CPU = {}


def measured(fn, label=None):
    """(wall seconds, peak traced bytes, result); this process's CPU seconds go to CPU[label]."""
    tracemalloc.start()
    t0, c0 = time.perf_counter(), time.process_time()
    result = fn()
    wall = time.perf_counter() - t0
    CPU[label] = time.process_time() - c0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return wall, peak, result


def scipy_fit(obj: Objective, starts: np.ndarray, lo, hi, row: int | None = None):
    """Best of scipy L-BFGS-B from every start, the analytic gradient of ``obj`` (weights row ``row``)."""
    rows = None if row is None else np.array([row])

    def fun(z):
        f, g = obj(z[None, :], rows)
        return float(f[0]), g[0]

    best = None
    for z0 in starts:
        r = minimize(fun, z0, jac=True, method="L-BFGS-B", bounds=list(zip(lo, hi)))
        if best is None or r.fun < best.fun:
            best = r
    return best


def one_size(n: int, n_boot: int) -> dict:
    law = get_law("chinchilla")
    df = synthetic(n)
    X = {"N": df["N"].to_numpy(), "D": df["D"].to_numpy()}
    y = np.log(df["loss"].to_numpy())
    runs = df["run"].to_numpy()
    grid = law.starts()
    lo, hi = law.internal_bounds().T

    fit_s, fit_mem, fit = measured(lambda: fit_law(df, law, n_bootstrap=0), "fit")
    obj = Objective(law, X, y)
    opt = multistart(obj, grid)
    starts = opt.refined_z[distinct_optima(opt.refined_z, opt.refined_f)]
    boot_s, boot_mem, _ = measured(lambda: bootstrap(law, X, y, runs, starts, n_resamples=n_boot, seed=0),
                                     "boot")

    every = REF_EVERY.get(n, max(1, n // 1000))
    ref_starts = grid[::every]
    ref_s, ref_mem, ref = measured(lambda: scipy_fit(obj, ref_starts, lo, hi), "ref")
    k_ref = min(n_boot, REF_RESAMPLES.get(n, 4))
    W = _run_weights(runs, k_ref, np.random.default_rng(0))
    wobj = Objective(law, X, y, weights=W)
    rboot_s, rboot_mem, _ = measured(lambda: [scipy_fit(wobj, ref.x[None], lo, hi, row=i)
                                              for i in range(k_ref)], "rboot")
    return {
        "n_points": n, "n_runs": int(np.unique(runs).size),
        "ours_fit_s": fit_s, "ours_fit_peak_mb": fit_mem / 2 ** 20,
        "ours_bootstrap_s": boot_s, "ours_bootstrap_peak_mb": boot_mem / 2 ** 20, "ours_resamples": n_boot,
        "ours_bootstrap_starts": int(starts.shape[0]),
        "ref_fit_s": ref_s, "ref_fit_peak_mb": ref_mem / 2 ** 20, "ref_starts": int(len(ref_starts)),
        "ref_fit_s_per_start": ref_s / len(ref_starts),
        "ref_bootstrap_s": rboot_s, "ref_bootstrap_peak_mb": rboot_mem / 2 ** 20, "ref_resamples": k_ref,
        "ref_bootstrap_s_per_resample": rboot_s / max(k_ref, 1),
        "cpu_s": {"ours_fit": CPU["fit"], "ours_bootstrap": CPU["boot"], "ref_fit": CPU["ref"],
                  "ref_fit_per_start": CPU["ref"] / len(ref_starts), "ref_bootstrap": CPU["rboot"],
                  "ref_bootstrap_per_resample": CPU["rboot"] / max(k_ref, 1)},
        "ours_objective": fit.diagnostics["objective"], "ref_objective": float(ref.fun),
        "ours_equal_or_better": bool(fit.diagnostics["objective"] <= ref.fun * (1 + 1e-9)),
        "ours_params": fit.params, "ref_params": law.as_dict(law.from_internal(ref.x)),
    }


def startup(repeats: int = 5) -> dict:
    """Wall seconds of whole ``smelt-scale`` processes (median of ``repeats``), as a user meets them:
    ``--help``, ``tiers --json`` and ``fit`` of a 250-point table (default settings: 200 bootstrap
    resamples; and ``--bootstrap 0``). Each is a fresh interpreter, so import time is included."""
    import shutil
    import statistics
    import subprocess
    import tempfile

    exe = shutil.which("smelt-scale") or "smelt-scale"
    with tempfile.TemporaryDirectory() as tmp:
        table = os.path.join(tmp, "points.csv")
        synthetic(250).drop(columns=["flops_per_token", "sparsity"]).to_csv(table, index=False)
        cases = {"help": [exe, "--help"], "tiers_json": [exe, "tiers", "--json"],
                 "fit_250_points": [exe, "fit", table, "--json"],
                 "fit_250_points_bootstrap_0": [exe, "fit", table, "--bootstrap", "0", "--json"]}
        out = {}
        for name, cmd in cases.items():
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                subprocess.run(cmd, check=True, capture_output=True)
                times.append(time.perf_counter() - t0)
            out[name] = {"median_s": statistics.median(times), "runs_s": times}
    return out


def whole_fit(rows: int) -> dict:
    """Wall and CPU seconds of ``smelt-scale fit`` on a ``rows``-row table (see module doc)."""
    import shutil
    import subprocess
    import tempfile

    exe = shutil.which("smelt-scale") or "smelt-scale"
    with tempfile.TemporaryDirectory() as tmp:
        table = os.path.join(tmp, "points.csv")
        synthetic(rows).drop(columns=["flops_per_token", "sparsity"]).to_csv(table, index=False)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        load = list(os.getloadavg())
        t0 = time.perf_counter()
        proc = subprocess.run([exe, "fit", table, "--json"], capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"fit failed: {proc.stderr[-2000:]}")
    fit = json.loads(proc.stdout)["fits"]
    g = next(iter(fit.values()))
    return {"rows": rows, "wall_s": wall,
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "load_average_before": load, "load_average_after": list(os.getloadavg()),
            "bootstrap_method": g["settings"].get("bootstrap_method"),
            "params": {p: g.get("params", g)[p] for p in TRUE},  # fit/2 files: under "params"
            "a_ci": g["ci"].get("a")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--sizes", default="250,2500,25000,250000", help="comma-separated numbers of points")
    ap.add_argument("--bootstrap", type=int, default=200, help="resamples of our bootstrap")
    ap.add_argument("--jsonl", default=None, help="also append each size's result to this file as it ends")
    ap.add_argument("--startup-repeats", type=int, default=5,
                    help="runs of each start-up case (median reported; 0 skips them)")
    ap.add_argument("--rows", type=int, default=None,
                    help="only time the whole `smelt-scale fit` command on a table of this many rows")
    args = ap.parse_args(argv)
    if args.rows is not None:
        r = whole_fit(args.rows)
        print(json.dumps(r, indent=2) if args.json else
              f"fit of {r['rows']:,} rows: {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} s CPU (load average "
              f"{r['load_average_before'][0]:.1f} before, {r['load_average_after'][0]:.1f} after; bootstrap "
              f"{r['bootstrap_method']})")
        return 0
    starts = startup(args.startup_repeats) if args.startup_repeats > 0 else {}
    if starts and not args.json:
        for name, s in starts.items():
            print(f"start-up {name}: median {s['median_s']:.2f} s wall over {len(s['runs_s'])} runs",
                  flush=True)
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        rows.append(one_size(n, args.bootstrap))
        if args.jsonl:
            with open(args.jsonl, "a") as fh:
                fh.write(json.dumps(rows[-1]) + "\n")
        if not args.json:
            r = rows[-1]
            print(f"{n:>7} points: ours fit {r['ours_fit_s']:.2f} s / {r['ours_fit_peak_mb']:.0f} MB, "
                  f"bootstrap {r['ours_bootstrap_s']:.2f} s / {r['ours_bootstrap_peak_mb']:.0f} MB; scipy "
                  f"{r['ref_fit_s']:.2f} s over {r['ref_starts']} starts, bootstrap "
                  f"{r['ref_bootstrap_s']:.2f} s "
                  f"over {r['ref_resamples']}; objective ours {r['ours_objective']:.10g} ref "
                  f"{r['ref_objective']:.10g}", flush=True)
    out = {"startup": starts, "sizes": rows,
           "memory": "tracemalloc peak per stage (Python + numpy allocations)",
           "process_max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "cpu_count": os.cpu_count(), "load_average": list(os.getloadavg())}
    if args.json:
        print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
