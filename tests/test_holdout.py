"""Held-out extrapolation check (scaling.fitting.holdout, `fit --holdout`), and the table options of
`smelt-scale fit` end to end."""

import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from cli import app
from scaling.common.errors import UserError
from scaling.fitting.holdout import holdout, holdout_mask
from scaling.fitting.laws import get_law

runner = CliRunner()
CHIN = get_law("chinchilla")
TRUE = {"E": 1.8, "A": 480.0, "alpha": 0.35, "B": 2100.0, "beta": 0.37}
SIGMA = 0.003


def law_points(seed=0, sigma=SIGMA):
    N, D = np.meshgrid(np.geomspace(3e7, 3e9, 6), np.geomspace(1e9, 3e11, 6))
    N, D = N.ravel(), D.ravel()
    L = CHIN.predict(TRUE, N=N, D=D) * np.exp(sigma * np.random.default_rng(seed).standard_normal(N.size))
    return pd.DataFrame({"group": "g", "run": [f"r{i}" for i in range(N.size)], "N": N, "D": D, "loss": L,
                         "flops": 6 * N * D, "flops_per_token": np.nan, "sparsity": np.nan})


def test_holdout_largest_predicts_within_the_noise():
    pts = law_points()
    res = holdout(pts, "chinchilla", "largest", n_bootstrap=40, seed=0)
    h = res.heldout
    assert len(h) == 6 and np.allclose(h["N"], 3e9)
    assert res.summary["g"]["n_fitted"] == 30 and res.summary["g"]["fitted_N_max"] < 3e9
    # extrapolating one size up a 1-decade ladder: within a few noise sigmas of the truth
    assert np.abs(h["error_log"]).max() < 4 * SIGMA
    truth = CHIN.predict(TRUE, N=h["N"].to_numpy(), D=h["D"].to_numpy())
    assert np.abs(np.log(h["predicted"] / truth)).max() < 3 * SIGMA
    np.testing.assert_allclose(h["error_nats"], h["observed"] - h["predicted"])
    assert (h["lo"] < h["predicted"]).all() and (h["predicted"] < h["hi"]).all()
    assert h["inside"].sum() >= 5 and res.summary["g"]["n_inside"] == h["inside"].sum()


def test_holdout_rules_and_errors():
    pts = law_points()
    assert holdout_mask(pts, "N>1e9").sum() == 12
    assert holdout_mask(pts, "N >= 3e9").sum() == 6
    C = 6 * pts["N"] * pts["D"]
    assert holdout_mask(pts, "C>1e20").sum() == int((C > 1e20).sum())
    with pytest.raises(UserError, match="unknown holdout rule"):
        holdout_mask(pts, "biggest")
    with pytest.raises(UserError, match="holds out no points"):
        holdout(pts, "chinchilla", "N>1e12", n_bootstrap=0)
    with pytest.raises(UserError, match="leaves 0 points .* 5 parameters"):
        holdout(pts, "chinchilla", "N>1e6", n_bootstrap=0)
    res = holdout(pts, "chinchilla", "largest", n_bootstrap=0)       # no bootstrap: no interval, no flag
    assert res.heldout["inside"].isna().all() and res.summary["g"]["n_inside"] is None
    assert "no interval" in res.summary_text()


def test_cli_holdout_json_and_figure(tmp_path):
    src = tmp_path / "t.csv"
    law_points().drop(columns=["group", "flops", "flops_per_token", "sparsity"]).to_csv(src, index=False)
    fig = tmp_path / "h.png"
    res = runner.invoke(app, ["fit", str(src), "--holdout", "N>1e9", "--bootstrap", "20", "--json",
                              "--holdout-figure", str(fig)])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["rule"] == "N>1e9" and len(data["points"]) == 12
    p = data["points"][0]
    for key in ("predicted", "observed", "lo", "hi", "inside", "error_nats", "error_log"):
        assert key in p
    assert isinstance(p["inside"], bool)
    assert data["summary"]["default"]["n_heldout"] == 12 and "default" in data["fits"]
    assert data["table"]["flops_per_nd"] == 6.0
    assert fig.stat().st_size > 10_000
    res = runner.invoke(app, ["fit", str(src), "--holdout", "N>1e6"])
    assert res.exit_code == 2 and res.stderr.startswith("error: holdout 'N>1e6' leaves 0 points")
    assert "--holdout" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_cli_table_options_print_mapping_and_record_settings(tmp_path):
    pts = law_points()
    src = tmp_path / "t.csv"
    # parameters in millions, compute instead of tokens, a per-row arch column and a junk flops column
    pd.DataFrame({"params": pts["N"] / 1e6, "compute": 6 * pts["N"] * pts["D"], "loss": pts["loss"],
                  "arch": ["a", "b"] * 18}).to_csv(src, index=False)
    opts = ["--n-col", "params:M", "--c-col", "compute", "--group-col", "none", "--where", "loss < 3.5",
            "--bootstrap", "0"]
    res = runner.invoke(app, ["fit", str(src), *opts])
    assert res.exit_code == 0, res.output
    assert "N <- 'params' x 1e+06" in res.stdout and "D <- derived: C / (6 N)" in res.stdout
    assert "group <- none" in res.stdout and "k = 6 FLOPs per parameter per token" in res.stdout
    assert "each row is its own run" in res.stdout
    assert res.stdout.count("columns: ") == 1                                    # said once
    # the one warning is that --bootstrap 0 cannot show the fit identified
    assert [ln for ln in res.stderr.splitlines() if ln.startswith("warning")] == [
        ln for ln in res.stderr.splitlines() if "no bootstrap (--bootstrap 0)" in ln]
    res = runner.invoke(app, ["fit", str(src), *opts, "--json"])
    fit = json.loads(res.stdout)["fits"]["default"]
    assert res.stderr.count("columns: ") == 1
    assert fit["settings"]["table"]["where"] == ["loss < 3.5"]
    assert fit["n_points"] == int((pts["loss"] < 3.5).sum())
    assert fit["cross_checks"]["approach2"]["estimator"] == "window"
    # without the unit: the plausibility warning names the fix
    res = runner.invoke(app, ["fit", str(src), "--n-col", "params", "--c-col", "compute", "--bootstrap", "0",
                              "--json"])
    assert "implausible parameter counts" in res.stderr and "params:M" in res.stderr
    for args, message in ((["--run-col", "id"], "no run column 'id'"),
                          (["--where", "nope > 1"], "the row filter"),
                          (["--isoflop-estimator", "akima"], "--isoflop-estimator must be one of")):
        res = runner.invoke(app, ["fit", str(src), "--n-col", "params:M", "--c-col", "compute", *args])
        assert res.exit_code == 2 and message in res.stderr, res.stderr
        assert args[0] in res.stderr                                        # the CLI names the flag


def test_help_says_rows_are_independent_without_run_col():
    res = runner.invoke(app, ["fit", "--help"])
    text = " ".join(res.stdout.split())
    for opt in ("--run-col", "--where", "--flops-per-nd", "--holdout", "--isoflop-estimator"):
        assert opt in text
    assert "independent run" in text
