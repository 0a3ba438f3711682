"""Time the savings inverse (compute for a loss) against the bisection in compute it replaced.

    python benchmarks/savings_speed.py [--json] [--resamples 200] [--budgets 9] [--repeat 3]

``scaling.fitting.savings.compute_for_loss`` finds C with L*(C) = target by one bisection along
the frontier's optimal size (``scaling.fitting.laws.frontier_by_size``), checked by the frontier.
The reference, in the same run on the same inputs, is ``_bisect_compute``: a bisection in log C
around ``frontier`` (itself a bisection in log N when F(N) is not linear), what ``compute_for_loss``
did before and still does where the check fails.

Laws: a Chinchilla-form law near Epoch's refit (Besiroglu et al. 2024: E 1.82, A 482, alpha 0.3478,
B 2085, beta 0.3658) and ``--resamples`` bootstrap-like draws (each parameter times exp(N(0, 0.1^2)),
seed 0); F(N) = 13.4 N + 495 sqrt(N) + 1.25e6 (the FLOPs-per-token model fitted to ``runs/``), and
F(N) = 6 N. Targets: the frontier losses of the same laws at ``--budgets`` log-spaced budgets
1e11 to 1e15, so every root lies inside the bracket. Wall times are the best of ``--repeat``;
CPU times of the process and the load average are reported beside them (the machine may be
shared). ``max_dlogc``: the largest |log C (ours) - log C (reference)| over all roots.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fit_speed import _best_of  # noqa: E402  (the benchmarks' one best-of timer)

from scaling.fitting.laws import TokenCost, frontier, get_law  # noqa: E402
from scaling.fitting.savings import SPAN_DECADES, _bisect_compute, compute_for_loss  # noqa: E402

EPOCH = {"E": 1.82, "A": 482.0, "alpha": 0.3478, "B": 2085.0, "beta": 0.3658}


def case(cost: TokenCost, resamples: int, budgets: int, repeat: int) -> dict:
    law = get_law("chinchilla")
    rng = np.random.default_rng(0)
    base = law.theta_array(EPOCH)
    thetas = base * np.exp(0.1 * rng.standard_normal((resamples, base.size)))
    C = np.logspace(11, 15, budgets)
    targets = frontier(law, thetas[:, None, :], C[None, :], cost=cost).loss     # (resamples, budgets)
    around = np.broadcast_to(C, targets.shape)

    def ours():
        return compute_for_loss(law, thetas[:, None, :], targets, around, cost=cost)[0]

    def reference():
        lo = np.log(around) - SPAN_DECADES * np.log(10.0)
        th = np.broadcast_to(thetas[:, None, :], targets.shape + (base.size,))
        return np.exp(_bisect_compute(law, th, targets, lo, lo + 2 * SPAN_DECADES * np.log(10.0), cost, None))

    ours_s, ours_cpu, got = _best_of(repeat, ours)
    ref_s, ref_cpu, want = _best_of(1, reference)
    return {"flops_per_token": cost.describe(), "roots": int(targets.size),
            "ours_s": ours_s, "ours_cpu_s": ours_cpu, "reference_s": ref_s, "reference_cpu_s": ref_cpu,
            "ratio": ref_s / ours_s, "ratio_cpu": ref_cpu / ours_cpu,
            "max_dlogc": float(np.max(np.abs(np.log(got) - np.log(want))))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--resamples", type=int, default=200)
    ap.add_argument("--budgets", type=int, default=9)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    out = {"load_average": os.getloadavg()[0], "resamples": args.resamples, "budgets": args.budgets,
           "cases": [case(c, args.resamples, args.budgets, args.repeat)
                     for c in (TokenCost(k=13.4, e=495.0, c=1.25e6), TokenCost(k=6.0))]}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"load average {out['load_average']:.2f}; {args.resamples} resamples x {args.budgets} budgets")
    for c in out["cases"]:
        print(f"F(N) = {c['flops_per_token']}: ours {c['ours_s']:.3f} s ({c['ours_cpu_s']:.3f} CPU-s), "
              f"reference {c['reference_s']:.3f} s ({c['reference_cpu_s']:.3f} CPU-s): x{c['ratio']:.1f} "
              f"(CPU x{c['ratio_cpu']:.1f}); max |dlog C| {c['max_dlogc']:.2e}")


if __name__ == "__main__":
    main()
