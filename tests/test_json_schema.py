"""Every --json document names its schema, smelt-scale.<command>/<n>, and keeps its top-level keys
(docs/json.md). Renaming or moving a key must bump the command's version in
scaling.cli._util.SCHEMA_VERSIONS and update docs/json.md: these tests say so."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from scaling.cli._util import SCHEMA_VERSIONS, schema_name

ROOT = Path(__file__).resolve().parents[1]
RUNS = str(ROOT / "runs")

# command -> (top-level keys in order, arguments); the slow ones fit laws or build the corpus
FAST = {
    "tiers": (["schema", "tiers"], ["tiers"]),
    "match": (["schema", "tiers"], ["match", "--tier", "proxy-xs"]),
    "compare": (["schema", "reference", "candidate", "difference", "cluster", "overall",
                 "cells_candidate_better", "n_cells", "seed_spread", "n_seeds", "seed_sd", "by_tier",
                 "by_budget", "cells", "by_source", "by_length", "notes", "dropped", "where",
                 "n_points", "n_points_kept"], ["compare", RUNS]),
    "savings": (["schema", "reference", "candidate", "convention", "rows", "savings_range", "ci_level",
                 "laws", "source", "warnings", "cross_checks", "where", "n_points", "n_points_kept"],
                ["savings", RUNS, "--budget", "1e12", "--bootstrap", "0"]),
}
SLOW = {
    "fit": (["schema", "fits"], ["fit", RUNS, "--bootstrap", "0"]),
    "plan": (["schema", "law", "shape", "width_multiple", "proxy", "spread_decades", "sizes_per_budget",
              "ci_level", "sets", "source", "warnings", "n_runs", "total_flops", "plan_file", "runs_dir",
              "template", "sweep_command"],
             ["plan", RUNS, "--budget", "1e13", "--dry-run", "--bootstrap", "0"]),
    "simulate": (["schema", "law", "reference", "candidate", "noise", "trials", "bootstrap", "seed",
                  "ci_level", "starts", "design", "rows", "failures", "failure_reasons", "identified_rate",
                  "identified_basis", "start_check", "source", "warnings", "run_share"],
                 ["simulate", "--trials", "1", "--bootstrap", "0"]),
    "sweep": (["schema", "plan", "runs_dir", "runs", "total", "data_errors", "data_warnings"],
              ["sweep", str(ROOT / "plans" / "cpu-proxy.toml"), "--dry-run", "--no-probe"]),
    "plot": (["schema", "figures", "skipped"], ["plot", "loss-curves", RUNS, "--out", "{tmp}"]),
}


def _check(name, keys, args, tmp_path):
    if not (ROOT / "runs").is_dir():
        pytest.skip("the shipped runs/ folder is absent")
    res = CliRunner().invoke(app, [a.replace("{tmp}", str(tmp_path)) for a in args] + ["--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["schema"] == f"smelt-scale.{name}/{SCHEMA_VERSIONS.get(name, 1)}"
    assert list(doc) == keys


@pytest.mark.parametrize("name", list(FAST))
def test_json_top_level_keys(name, tmp_path):
    _check(name, *FAST[name], tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SLOW))
def test_json_top_level_keys_slow(name, tmp_path):
    _check(name, *SLOW[name], tmp_path)


def test_schema_names_and_docs_agree():
    assert schema_name("analyze sink") == "smelt-scale.analyze-sink/1"
    assert schema_name("fit") == "smelt-scale.fit/2"
    docs = (ROOT / "docs" / "json.md").read_text()
    for name in [*FAST, *SLOW, "train", "prepare-data", "analyze-sink", "analyze-lengths", "analyze-icl",
                 "analyze-snapshot-data", "plan-grid", "export", "eval", "calibrate"]:
        assert f"`{schema_name(name)}`" in docs, name
