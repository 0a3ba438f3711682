"""Does the lr rule change SMELT's paired gain? Two trainings of one IsoFLOP design side by side.

    python plans/lr_rule_gap.py FOLDER_A FOLDER_B [--baseline-from-b] [--json]

Each folder is one training of the same design at its own lr rule (e.g. `runs/` at each
architecture's own rule and `runs-isoflop-oldlr-7seeds-2026-12-06/` at the old corpus's rule). In
each, the paired difference d = L_smelt - L_baseline of every (tier, seed, budget) cell (the pairs
of `smelt-scale compare`: same tier, seed and tokens). Only the cells both folders hold are kept
(same tier, seed and tokens D; the lr does not change D). Then, per cell, dd = d_A - d_B: how much
more (negative) or less SMELT gains under A's rule than under B's. Each of d_A, d_B and dd gets
its mean, a cluster-robust s.e. with the (tier, seed) run pair as the cluster (a run's budgets
share its trunk: `scaling.fitting.compare.cluster_se`) and the 95% Student t interval with
G - 1 degrees of freedom (`t_interval`). The two trainings of a cell share their seed (the same
initial weights and batches), so dd pairs them: its s.e. is smaller than the two s.e. combined
when a seed's luck carries across the lr rules.

With ``--baseline-from-b``, A retrained only the SMELT twins (its rule gives the Baseline B's lr:
`smelt-scale plan-grid --archs smelt`): A's pairs take B's Baseline, so dd = L_smelt,A - L_smelt,B
per cell. Baseline runs A holds anyway are left out of the pairs and compared with B's on the
cells both hold (``baseline_check``: how many, and the largest |difference|; 0 when the two
trainings of the Baseline are bitwise equal).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scaling.common.errors import UserError  # noqa: E402
from scaling.fitting.compare import pair_stats, paired_points, with_validation_ids  # noqa: E402
from scaling.fitting.tables import read_runs_dir  # noqa: E402

KEYS = ["tier", "seed", "tokens"]


def run_points(root: Path) -> pd.DataFrame:
    """The points of a runs folder with their validation-data ids (as `smelt-scale compare` reads them)."""
    return with_validation_ids(root, read_runs_dir(root))


def cell_differences(points: pd.DataFrame) -> pd.DataFrame:
    """The paired SMELT - Baseline differences of a runs folder's points, one row per (tier, seed, tokens)."""
    pairs = paired_points(points, "baseline", "smelt", [])
    return pairs[KEYS + ["diff"]]


def _baseline_check(pa: pd.DataFrame, pb: pd.DataFrame) -> dict:
    """A's Baseline points against B's on the cells both hold (they should be one training)."""
    key = ["tier", "seed", "D"]
    ba, bb = (p[p["arch"] == "baseline"][key + ["loss"]] for p in (pa, pb))
    m = ba.merge(bb, on=key, suffixes=("_a", "_b"))
    worst = float((m["loss_a"] - m["loss_b"]).abs().max()) if len(m) else None
    return {"cells": len(m), "max_abs_diff": worst}


def lr_rule_gap(a: Path, b: Path, *, baseline_from_b: bool = False) -> dict:
    pa, pb = run_points(a), run_points(b)
    check = None
    if baseline_from_b:
        check = _baseline_check(pa, pb)
        pa = pd.concat([pa[pa["arch"] != "baseline"], pb[pb["arch"] == "baseline"]], ignore_index=True)
    da, db = cell_differences(pa), cell_differences(pb)   # A's pairs: only where A trained a twin
    both = da.merge(db, on=KEYS, suffixes=("_a", "_b"))
    if both.empty:
        raise UserError(f"{a} and {b} share no (tier, seed, tokens) cell")
    both["dd"] = both["diff_a"] - both["diff_b"]
    out = {"a": str(a), "b": str(b), "cells": len(both), "cells_only_a": len(da) - len(both),
           "cells_only_b": len(db) - len(both), "baseline_from_b": baseline_from_b,
           "baseline_check": check}
    for col in ("diff_a", "diff_b", "dd"):
        s = pair_stats(both, col, "run", column=col)
        out[col] = {"mean": s.mean, "se": s.se, "n_clusters": s.n_clusters, "df": s.df,
                    "ci": [s.ci_lo, s.ci_hi]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--baseline-from-b", action="store_true",
                    help="A retrained only the SMELT twins: pair them with B's Baseline runs")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    try:
        res = lr_rule_gap(args.a, args.b, baseline_from_b=args.baseline_from_b)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2)
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"{res['cells']} shared (tier, seed, budget) cells ({res['cells_only_a']} only in A, "
          f"{res['cells_only_b']} only in B)")
    if res["baseline_check"] is not None:
        c = res["baseline_check"]
        same = "none held by both" if not c["cells"] else f"largest |difference| {c['max_abs_diff']:.3g} nats"
        print(f"A's SMELT twins paired with B's Baseline; A's own Baseline points on {c['cells']} shared "
              f"cells: {same}")
    for col, what in (("diff_a", f"SMELT - Baseline in A ({args.a})"),
                      ("diff_b", f"SMELT - Baseline in B ({args.b})"), ("dd", "A minus B")):
        r = res[col]
        print(f"{what}: {r['mean']:+.3f} ± {r['se']:.3f} nats, 95% t({r['df']}) [{r['ci'][0]:+.3f}, "
              f"{r['ci'][1]:+.3f}], {r['n_clusters']} run pairs")


if __name__ == "__main__":
    main()
