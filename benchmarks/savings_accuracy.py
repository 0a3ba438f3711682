"""Accuracy of `smelt-scale savings` (the default method) on planted savings.

    python benchmarks/savings_accuracy.py [--draws 100] [--factors 0.9,0.8,0.7] [--json]

Design (issue 26): two groups on the same Chinchilla law (Hoffmann et al. 2022: E 1.69, A 406.4,
alpha 0.34, B 410.7, beta 0.28), the candidate's A times f; 6 sizes N log-spaced over 1e8-3.16e9 x
6 tokens-per-parameter ratios D/N in {5, 10, 20, 40, 80, 160} per group (C = 6 N D from 3e17 to
9.6e21), each loss times exp(e), e ~ Normal(0, noise = 0.5%), independently per point and draw.
For this law the saving at equal loss on the frontier is the same at every budget:
savings = 1 - f^(1/alpha) (L*(C) - E is proportional to A^(beta/(alpha+beta)) C^(-alpha beta/(alpha+beta)),
so matching the losses gives C_cand / C_ref = f^(1/alpha)): 26.6%, 48.1%, 64.9% for f = 0.9, 0.8, 0.7.

Each draw writes the table to a CSV and runs `smelt-scale savings --runs TABLE --budgets ...
--bootstrap B --seed draw --json` in this process (the command a user runs, default --method).
Per (f, budget): the median and 90th percentile of |estimate - truth| in percentage points, the
fraction of draws whose interval covers the truth, the median interval width, which method
answered, and the same for the envelope cross-check (``cross_checks`` of the JSON), to compare.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scaling.cli import app  # noqa: E402

E, A, ALPHA, B, BETA = 1.69, 406.4, 0.34, 410.7, 0.28
SIZES = np.logspace(8, 9.5, 6)
RATIOS = np.array([5, 10, 20, 40, 80, 160])


def truth(f: float) -> float:
    return 1.0 - f ** (1.0 / ALPHA)


def table(f: float, noise: float, rng: np.random.Generator) -> pd.DataFrame:
    rows = []
    for arch, a in (("baseline", A), ("smelt", f * A)):
        for n in SIZES:
            for r in RATIOS:
                d = r * n
                loss = (E + a / n ** ALPHA + B / d ** BETA) * math.exp(rng.normal(0.0, noise))
                rows.append({"run": f"{arch}-{n:.3g}-{r}", "arch": arch, "N": n, "D": d, "loss": loss,
                             "flops": 6.0 * n * d})
    return pd.DataFrame(rows)


def summarise(est: list[float], lo: list[float], hi: list[float], true: float) -> dict:
    e = np.asarray(est, dtype=float)
    ok = np.isfinite(e)
    if not ok.any():
        return {"answered": 0}
    err = 100 * np.abs(e[ok] - true)
    lo_, hi_ = np.asarray(lo, dtype=float)[ok], np.asarray(hi, dtype=float)[ok]
    has = np.isfinite(lo_) & np.isfinite(hi_)
    return {
        "answered": int(ok.sum()),
        "median_abs_error_pp": float(np.median(err)),
        "p90_abs_error_pp": float(np.percentile(err, 90)),
        "median_estimate_pct": float(100 * np.median(e[ok])),
        "coverage": float(np.mean((lo_[has] <= true) & (true <= hi_[has]))) if has.any() else None,
        "with_interval": int(has.sum()),
        "median_ci_width_pp": float(100 * np.median(hi_[has] - lo_[has])) if has.any() else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draws", type=int, default=100)
    ap.add_argument("--factors", default="0.9,0.8,0.7", help="candidate A / reference A")
    ap.add_argument("--budgets", default="1e20,1e21")
    ap.add_argument("--bootstrap", type=int, default=100, help="bootstrap resamples per savings call")
    ap.add_argument("--noise", type=float, default=0.005)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    factors = [float(x) for x in a.factors.split(",")]
    budgets = [float(x) for x in a.budgets.split(",")]
    runner = CliRunner()
    t0, cpu0 = time.time(), time.process_time()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for fi, f in enumerate(factors):
            rng = np.random.default_rng([a.seed, fi])
            acc = {b: {k: ([], [], []) for k in ("default", "envelope")} for b in budgets}
            methods = {b: {} for b in budgets}
            for k in range(a.draws):
                path = Path(tmp) / f"t{fi}-{k}.csv"
                table(f, a.noise, rng).to_csv(path, index=False)
                res = runner.invoke(app, ["savings", "--runs", str(path), "--budgets", a.budgets,
                                          "--bootstrap", str(a.bootstrap), "--seed", str(k), "--json"])
                if res.exit_code != 0:
                    raise SystemExit(f"savings failed on draw {k}: {res.stderr or res.output}")
                doc = json.loads(res.stdout)
                for kind, rows in (("default", doc["rows"]), ("envelope", doc.get("cross_checks", []))):
                    if kind == "envelope":
                        rows = rows + [r for r in doc["rows"] if r.get("method") == "envelope"]
                    by = {float(r["budget"]): r for r in rows}
                    for b in budgets:
                        r = by.get(b)
                        s = None if r is None else r.get("savings")
                        ci = None if r is None else r.get("savings_ci")
                        est, lo, hi = acc[b][kind]
                        est.append(math.nan if s is None else float(s))
                        lo.append(math.nan if not ci else float(ci[0]))
                        hi.append(math.nan if not ci else float(ci[1]))
                        if kind == "default" and r is not None:
                            methods[b][r["method"]] = methods[b].get(r["method"], 0) + 1
                path.unlink()
            for b in budgets:
                results.append({"factor": f, "true_savings_pct": 100 * truth(f), "budget": b,
                                "methods": methods[b],
                                "default": summarise(*acc[b]["default"], truth(f)),
                                "envelope": summarise(*acc[b]["envelope"], truth(f))})
    out = {"design": {"law": {"E": E, "A": A, "alpha": ALPHA, "B": B, "beta": BETA},
                      "sizes": SIZES.tolist(), "tokens_per_param": RATIOS.tolist(), "noise": a.noise,
                      "draws": a.draws, "bootstrap": a.bootstrap, "seed": a.seed},
           "results": results, "wall_s": time.time() - t0, "cpu_s": time.process_time() - cpu0,
           "loadavg": os.getloadavg()[0]}
    if a.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{'f':>4} {'truth':>6} {'budget':>6} {'method':>14} {'med|err|':>8} {'p90':>6} {'cover':>6} "
          f"{'CI width':>8} | envelope {'med|err|':>8} {'cover':>6}")
    for r in results:
        d, e = r["default"], r["envelope"]
        print(f"{r['factor']:>4} {r['true_savings_pct']:>5.1f}% {r['budget']:>6.0e} "
              f"{','.join(f'{k}:{v}' for k, v in r['methods'].items()):>14} "
              f"{d.get('median_abs_error_pp', math.nan):>7.2f}pp {d.get('p90_abs_error_pp', math.nan):>5.2f} "
              f"{d.get('coverage') or math.nan:>6.2f} {d.get('median_ci_width_pp') or math.nan:>7.1f}pp | "
              f"{e.get('median_abs_error_pp', math.nan):>16.2f}pp {e.get('coverage') or math.nan:>6.2f}")
    print(f"{out['wall_s']:.0f} s wall, {out['cpu_s']:.0f} s CPU")


if __name__ == "__main__":
    main()
