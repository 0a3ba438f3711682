"""Behaviour check for refactors: run the fitting commands with ``--json``, diff two output folders.

    python benchmarks/behaviour_diff.py run OUT [--only NAME ...]   # write OUT/<name>.json per command
    python benchmarks/behaviour_diff.py diff BEFORE AFTER [--json] [--ignore KEY ...]  # identical, or how not

``run`` calls ``cli.py`` of the checkout this file lies in (``PYTHONPATH`` set to it, so a worktree's own
``scaling`` is used) on the shipped ``runs/`` and on a synthetic points table (two groups, a run
column, seeded noise). Every command runs with its working directory in ``OUT/.work`` holding the
table and a link ``runs`` to the shipped runs, and every absolute path of that folder or of the
checkout is replaced by ``<work>``/``<repo>`` in the output: paths that the commands print then
agree between checkouts and output folders. Each ``OUT/<name>.json`` holds the command line, its exit
code and its parsed ``--json`` output (or its stdout when that is not JSON). Add a command to
``COMMANDS`` to check it; a refactor that leaves ``diff`` silent changed no number any command prints.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]

# name -> arguments of cli.py; "runs" is the shipped runs folder, "synthetic.csv" the synthetic table
COMMANDS: dict[str, list[str]] = {
    "fit-runs": ["fit", "runs", "--json"],
    "fit-runs-smelt": ["fit", "runs", "--law", "smelt", "--bootstrap", "40", "--json"],
    "fit-synthetic": ["fit", "synthetic.csv", "--bootstrap", "60", "--seed", "3", "--json"],
    "fit-synthetic-constrained": ["fit", "synthetic.csv", "--bootstrap", "20", "--fix", "E=1.8", "--tie",
                                  "alpha=beta", "--objective", "sq-log", "--json"],
    "fit-synthetic-asym": ["fit", "synthetic.csv", "--bootstrap", "10", "--objective", "asym-abs", "--json"],
    "fit-synthetic-shared": ["fit", "synthetic.csv", "--bootstrap", "20", "--share", "E", "--json"],
    "fit-synthetic-holdout": ["fit", "synthetic.csv", "--bootstrap", "20", "--holdout", "largest",
                              "--huber-delta", "0.01", "--json"],
    "compare-runs": ["compare", "runs", "--json"],
    "savings-runs": ["savings", "runs", "--budgets", "1e12,3e12", "--json"],
    "savings-runs-smelt": ["savings", "--runs", "runs", "--law", "smelt", "--bootstrap", "30",
                           "--budgets", "1e12,1e13", "--json"],
    "savings-synthetic": ["savings", "--runs", "synthetic.csv", "--reference", "base", "--candidate", "cand",
                          "--bootstrap", "30", "--budgets", "1e19,1e20", "--json"],
    "savings-paper": ["savings", "--law-set", "paper", "--budgets", "1e20,1e21,1e22", "--json"],
    "simulate-paper": ["simulate", "--trials", "3", "--bootstrap", "10", "--json"],
    "simulate-grid": ["simulate", "--trials", "2", "--bootstrap", "0", "--starts", "grid", "--seed", "5",
                      "--noise", "0.02", "--json"],
    "plan-runs": ["plan", "runs", "--budget", "1e13", "--bootstrap", "30", "--dry-run", "--json"],
    "plan-paper": ["plan", "--law-set", "paper", "--budgets", "1e20,1e21", "--dry-run", "--json"],
}


def synthetic_table(path: Path) -> None:
    """Two groups (base, cand) of a chinchilla-form law on an IsoFLOP-like grid, 2 seeds, 1% noise."""
    rng = np.random.default_rng(20261205)
    rows = []
    for group, (E, A, B, a, b) in {"base": (1.8, 480.0, 2100.0, 0.35, 0.37),
                                   "cand": (1.75, 430.0, 2000.0, 0.34, 0.37)}.items():
        for seed in range(2):
            for i, N in enumerate(np.geomspace(2e7, 2e9, 8)):
                for D in N * np.array([5.0, 20.0, 80.0]):
                    loss = (E + A * N ** -a + B * D ** -b) * np.exp(0.01 * rng.standard_normal())
                    rows.append({"arch": group, "run": f"{group}-n{i}-s{seed}", "N": N, "D": D, "loss": loss})
    pd.DataFrame(rows).to_csv(path, index=False)


def _normalise(text: str, work: Path) -> str:
    for real, name in ((work.resolve(), "<work>"), (work, "<work>"), (REPO, "<repo>")):
        text = text.replace(str(real), name)
    return text


def run(out: Path, only: list[str] | None = None) -> dict[str, int]:
    """Run the commands (all, or those named in ``only``) into ``out``; returns name -> exit code."""
    work = out / ".work"
    work.mkdir(parents=True, exist_ok=True)
    synthetic_table(work / "synthetic.csv")
    if not (work / "runs").exists():
        (work / "runs").symlink_to(REPO / "runs")
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200", "NO_COLOR": "1"}
    codes = {}
    for name, args in COMMANDS.items():
        if only and name not in only:
            continue
        t0 = time.time()
        proc = subprocess.run([sys.executable, str(REPO / "cli.py"), *args], cwd=work, env=env,
                              capture_output=True, text=True)
        stdout = _normalise(proc.stdout, work)
        try:
            output = json.loads(stdout)
        except json.JSONDecodeError:
            output = stdout
        record = {"args": args, "exit_code": proc.returncode, "output": output,
                  "stderr": _normalise(proc.stderr, work) if proc.returncode else ""}
        (out / f"{name}.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        codes[name] = proc.returncode
        print(f"{name}: exit {proc.returncode} ({time.time() - t0:.1f} s)", file=sys.stderr)
    return codes


def _differences(a, b, path: str = "", limit: int = 5, ignore: frozenset[str] = frozenset()) -> list[str]:
    """Up to ``limit`` JSON paths at which a and b differ (exactly: floats compared bit for bit; the
    order of an object's keys counts too), object keys named in ``ignore`` left out."""
    if type(a) is not type(b):
        return [f"{path or '/'}: {a!r:.80} != {b!r:.80}"]
    if isinstance(a, dict):
        a = {k: v for k, v in a.items() if k not in ignore}
        b = {k: v for k, v in b.items() if k not in ignore}
        out = [f"{path}/{k}: only in {'before' if k in a else 'after'}" for k in sorted(set(a) ^ set(b))]
        if not out and list(a) != list(b):
            out.append(f"{path or '/'}: keys in another order")
        for k in a:
            if k in b and len(out) < limit:
                out += _differences(a[k], b[k], f"{path}/{k}", limit - len(out), ignore)
        return out[:limit]
    if isinstance(a, list):
        out = [] if len(a) == len(b) else [f"{path}: length {len(a)} != {len(b)}"]
        for i, (x, y) in enumerate(zip(a, b)):
            if len(out) >= limit:
                break
            out += _differences(x, y, f"{path}/{i}", limit - len(out), ignore)
        return out[:limit]
    return [] if a == b or (a != a and b != b) else [f"{path or '/'}: {a!r:.80} != {b!r:.80}"]


def diff(before: Path, after: Path, ignore: frozenset[str] = frozenset()) -> dict[str, object]:
    """Per command present in either folder: "identical", "missing ..." or its first differences
    (object keys named in ``ignore``, e.g. one a change adds on purpose, left out)."""
    names = sorted({p.stem for p in before.glob("*.json")} | {p.stem for p in after.glob("*.json")})
    result: dict[str, object] = {}
    for name in names:
        pa, pb = before / f"{name}.json", after / f"{name}.json"
        if not (pa.exists() and pb.exists()):
            result[name] = f"missing in {'after' if pa.exists() else 'before'}"
            continue
        d = _differences(json.loads(pa.read_text()), json.loads(pb.read_text()), ignore=ignore)
        result[name] = d or "identical"
    return {"identical": all(v == "identical" for v in result.values()), "commands": result}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the commands, write OUT/<name>.json")
    r.add_argument("out", type=Path)
    r.add_argument("--only", nargs="*", help="command names (default: all): " + ", ".join(COMMANDS))
    d = sub.add_parser("diff", help="diff two output folders")
    d.add_argument("before", type=Path)
    d.add_argument("after", type=Path)
    d.add_argument("--json", action="store_true", help="print one JSON object")
    d.add_argument("--ignore", nargs="*", default=[], metavar="KEY",
                   help="object keys to leave out wherever they occur (a key added on purpose)")
    args = ap.parse_args(argv)
    if args.cmd == "run":
        codes = run(args.out, args.only)
        return 0 if codes else 1
    res = diff(args.before, args.after, frozenset(args.ignore))
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        for name, v in res["commands"].items():
            print(f"{name}: {v if isinstance(v, str) else 'DIFFERS'}")
            if not isinstance(v, str):
                print("".join(f"  {line}\n" for line in v), end="")
    return 0 if res["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
