"""Do the runs two folders share train alike? Points and metric lines compared bitwise.

    python plans/same_runs.py A B [--json]

For every run name present in both folders (each run's ``final.json`` and ``metrics.jsonl``), the
points of the budgets both reached are compared field by field, and the metric lines of the
updates and evaluations both logged (matched by iter, step and branch), leaving out what measures
the machine rather than the training: wall times, throughput, data wait and peak memory. Equal
means bitwise-equal floats. A retrained run that reaches further (more budgets) than its twin is
compared on what they share, which is how a seed retrained to a later budget is checked against
the shorter run it extends (a WSD trunk does not depend on its total length).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scaling.common.files import read_jsonl  # noqa: E402
from scaling.common.run_folder import find_run_folders  # noqa: E402

MACHINE = ("wall_s", "tokens_per_s", "data_wait_s", "peak_mem_bytes", "mfu")


def _lines(run: Path) -> dict[tuple, dict]:
    rows = read_jsonl(run / "metrics.jsonl", missing_ok=True).rows
    return {(r.get("iter"), r.get("step"), r.get("branch"), r.get("budget_index")):
            {k: v for k, v in r.items() if k not in MACHINE} for r in rows}


def compare(a: Path, b: Path) -> dict:
    runs_a = {r.name: r for r in find_run_folders(a)}
    runs_b = {r.name: r for r in find_run_folders(b)}
    out = {"runs": 0, "points_equal": 0, "points_different": 0, "lines_equal": 0, "lines_different": 0,
           "differences": []}
    for name in sorted(set(runs_a) & set(runs_b)):
        fa, fb = runs_a[name].final(), runs_b[name].final()
        if fa is None or fb is None:
            continue
        out["runs"] += 1
        pa = {p["budget_index"]: p for p in fa["points"]}
        pb = {p["budget_index"]: p for p in fb["points"]}
        for k in sorted(set(pa) & set(pb)):
            diff = sorted(f for f in set(pa[k]) | set(pb[k])
                          if f not in MACHINE and pa[k].get(f) != pb[k].get(f))
            out["points_equal" if not diff else "points_different"] += 1
            if diff:
                out["differences"].append(f"{name} budget {k}: {', '.join(diff)}")
        la, lb = _lines(runs_a[name].path), _lines(runs_b[name].path)
        for key in set(la) & set(lb):
            out["lines_equal" if la[key] == lb[key] else "lines_different"] += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    out = compare(args.a, args.b)
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{out['runs']} runs in both: {out['points_equal']} points equal, {out['points_different']} "
          f"different; {out['lines_equal']} metric lines equal, {out['lines_different']} different")
    for d in out["differences"][:20]:
        print(f"  {d}")


if __name__ == "__main__":
    main()
