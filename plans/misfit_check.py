"""Why the first CPU sweep's laws misfit: its points refitted under each candidate cause (issue 26).

    python plans/misfit_check.py [RUNS] [--json]      # RUNS: the first sweep's runs folder

Writes the points of RUNS (``final.json`` + the embedding count of ``config.json``) to a table with
two extra parameter columns, N_emb (active + embedding parameters) and N_total (every parameter,
all experts), then runs ``smelt-scale fit TABLE --bootstrap 0`` with each selection of
docs/proxy-study.md section 1 and prints, per group, whether the law is identified, its parameters
on a bound, and the goodness-of-fit verdict (p of the residual trend). Also the local slope
d log L / d log D between successive budgets of each seed-0 run.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import tempfile
from pathlib import Path

from typer.testing import CliRunner

from scaling.cli import app

CHECKS = [
    ("all points", []),
    ("D > 2e5 (drop 0.125M tokens)", ["--where", "D > 2e5"]),
    ("D > 4e5 (drop <= 0.25M)", ["--where", "D > 4e5"]),
    ("D > 8e5 (1M and 2M only)", ["--where", "D > 8e5"]),
    ("N with embeddings", ["--n-col", "N_emb"]),
    ("N with embeddings, D > 4e5", ["--n-col", "N_emb", "--where", "D > 4e5"]),
    ("N = all parameters, D > 4e5", ["--n-col", "N_total", "--where", "D > 4e5"]),
]


def table(runs: Path, out: Path) -> list[dict]:
    rows = []
    for final in sorted(runs.glob("*/final.json")):
        doc = json.loads(final.read_text())
        emb = json.loads((final.parent / "config.json").read_text())["accounting"]["embedding_params"]
        for p in doc["points"]:
            rows.append({"run": p["run"], "arch": p["arch"], "tier": p["tier"], "seed": p["seed"],
                         "N": p["N"], "D": p["D"], "loss": p["loss"], "flops": p["flops"],
                         "N_emb": p["N"] + emb, "N_total": p["total_params"]})
    with out.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="?", default="runs-cpu-proxy-2026-12-02")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    runner = CliRunner()
    out: dict = {"checks": [], "local_slopes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "points.csv"
        rows = table(Path(a.runs), path)
        for label, args in CHECKS:
            res = runner.invoke(app, ["fit", str(path), "--bootstrap", "0", "--json", *args])
            if res.exit_code != 0:
                raise SystemExit(f"{label}: {res.stderr}")
            fits = json.loads(res.stdout)["fits"]
            out["checks"].append({"check": label, "args": args, "groups": {
                g: {"n_points": f["n_points"], "identified": f["diagnostics"]["identified"],
                    "on_bound": f["diagnostics"]["on_bound"], "misfit": f["diagnostics"]["misfit"],
                    "p_trend": (f["diagnostics"].get("goodness_of_fit") or {}).get("p_value"),
                    "params": {k: f[k] for k in ("E", "A", "alpha", "B", "beta")}}
                for g, f in fits.items()}})
    for run in sorted({r["run"] for r in rows if r["seed"] == 0}):
        pts = sorted((r["D"], r["loss"]) for r in rows if r["run"] == run)
        out["local_slopes"][run] = [math.log(pts[i + 1][1] / pts[i][1]) / math.log(pts[i + 1][0] / pts[i][0])
                                    for i in range(len(pts) - 1)]
    if a.json:
        print(json.dumps(out, indent=2))
        return
    for c in out["checks"]:
        print(c["check"])
        for g, f in c["groups"].items():
            p = f["p_trend"]
            print(f"  {g}: {f['n_points']} points, identified {'yes' if f['identified'] else 'NO'}, "
                  f"on a bound: {', '.join(f['on_bound']) or 'none'}, "
                  f"{'MISFIT' if f['misfit'] else 'fit ok'} (p = {p:.2g})" if p is not None else "")
    print("local slope d log L / d log D between successive budgets (seed 0):")
    for run, s in out["local_slopes"].items():
        print(f"  {run:24s} " + " ".join(f"{x:+.3f}" for x in s))


if __name__ == "__main__":
    main()
