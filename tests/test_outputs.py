"""Every --out refuses an existing path unless --force, and never an input of the same command (issue 25)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from scaling.cli import app

runner = CliRunner()


def _one_line(res, pattern):
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and pattern in lines[0], res.stderr


def _table(path):
    n = np.geomspace(2e7, 2e9, 12)
    d = n * np.linspace(5, 80, 12)
    loss = 1.8 + 480 * n ** -0.35 + 2100 * d ** -0.37
    pd.DataFrame({"N": n, "D": d, "loss": loss}).to_csv(path, index=False)
    return path


def test_fit_out_needs_force_and_never_replaces_its_input(tmp_path):
    src = _table(tmp_path / "pts.csv")
    before = src.read_bytes()
    out = tmp_path / "fits.json"
    out.write_text("keep me")
    _one_line(runner.invoke(app, ["fit", str(src), "--bootstrap", "0", "--out", str(out)]), "--force")
    assert out.read_text() == "keep me"
    res = runner.invoke(app, ["fit", str(src), "--bootstrap", "0", "--out", str(out), "--force"])
    assert res.exit_code == 0, res.output
    assert "fits" in json.loads(out.read_text())
    for args in (["--out", str(src)], ["--out", str(src), "--force"],
                 ["--out", str(tmp_path / "." / "pts.csv"), "--force"]):
        _one_line(runner.invoke(app, ["fit", str(src), "--bootstrap", "0", *args]), "input of this command")
    assert src.read_bytes() == before


def test_fit_out_never_replaces_a_file_of_its_runs_folder(tmp_path):
    run = tmp_path / "runs" / "r0"
    run.mkdir(parents=True)
    final = run / "final.json"
    final.write_text(json.dumps({"points": [{"N": 1e7, "D": 1e9, "loss": 3.0}]}))
    before = final.read_bytes()
    res = runner.invoke(app, ["fit", str(tmp_path / "runs"), "--out", str(final), "--force"])
    _one_line(res, "input of this command")
    assert final.read_bytes() == before


def test_fit_out_and_holdout_figure_are_not_one_file(tmp_path):
    src = _table(tmp_path / "pts.csv")
    fig = tmp_path / "f.png"
    res = runner.invoke(app, ["fit", str(src), "--holdout", "largest", "--holdout-figure", str(fig),
                              "--out", str(fig)])
    assert res.exit_code == 2 and not fig.exists()


def test_plan_out_needs_force_and_never_replaces_its_template(tmp_path):
    out = tmp_path / "next.toml"
    out.write_text("# mine\n")
    base = ["plan", "--law-set", "paper", "--budget", "1e20", "--runs-per-budget", "5"]
    _one_line(runner.invoke(app, [*base, "--out", str(out)]), "--force")
    assert out.read_text() == "# mine\n"
    tpl = tmp_path / "tpl.toml"
    tpl.write_text('name = "x"\n')
    _one_line(runner.invoke(app, [*base, "--out", str(tpl), "--template", str(tpl), "--force"]),
              "input of this command")
    assert tpl.read_text() == 'name = "x"\n'


def test_compare_refuses_an_existing_plot_and_one_architecture_against_itself(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    fig = tmp_path / "c.png"
    fig.write_bytes(b"png")
    _one_line(runner.invoke(app, ["compare", str(runs), "--plot", str(fig)]), "--force")
    _one_line(runner.invoke(app, ["compare", str(runs), "--reference", "smelt", "--candidate", "smelt"]),
              "both 'smelt'")
    assert fig.read_bytes() == b"png"


def test_plot_out_folder_not_empty_needs_force(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    out = tmp_path / "figs"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    _one_line(runner.invoke(app, ["plot", "loss-curves", "--runs", str(runs), "--out", str(out)]), "--force")
    _one_line(runner.invoke(app, ["plot", "loss-curves", "--runs", str(runs), "--out", str(runs), "--force"]),
              "input of this command")


@pytest.mark.parametrize("kind", ["sink", "lengths", "icl"])
def test_analyze_plot_is_checked_before_any_work(tmp_path, kind):
    fig = tmp_path / "a.png"
    fig.write_bytes(b"png")
    _one_line(runner.invoke(app, ["analyze", kind, str(tmp_path / "no-run"), "--plot", str(fig)]), "--force")
    assert fig.read_bytes() == b"png"
