"""FitSettings (one validated, immutable settings object) and the FitResult's own data: residuals
without the table, a notebook view, a JSON round trip (issue 30, items 5 and 9)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from scaling.common.errors import UserError
from scaling.fitting.fit import FitResult, FitSet, FitSettings, fit_groups, fit_law
from scaling.fitting.holdout import holdout
from scaling.fitting.laws import get_law

CHIN = get_law("chinchilla")
TRUE = {"E": 1.8, "A": 480.0, "alpha": 0.35, "B": 2100.0, "beta": 0.37}
STARTS = CHIN.starts()[::40]


@pytest.fixture(scope="module")
def points():
    rng = np.random.default_rng(11)
    N = np.repeat(np.geomspace(2e7, 2e9, 8), 3)
    D = N * np.tile([5.0, 20.0, 80.0], 8)
    loss = CHIN.predict(TRUE, N=N, D=D) * np.exp(0.01 * rng.standard_normal(N.size))
    return pd.DataFrame({"group": "g", "run": [f"r{i // 3}" for i in range(N.size)], "N": N, "D": D,
                         "loss": loss, "flops": 6 * N * D, "flops_per_token": np.nan, "sparsity": np.nan})


@pytest.mark.parametrize("bad, msg", [
    ({"ci_level": 1.0}, "interval level"),
    ({"n_bootstrap": -1}, "bootstrap resamples"),
    ({"n_bootstrap": 2.5}, "bootstrap resamples"),
    ({"objective": "l1"}, "unknown objective"),
    ({"huber_delta": 0.0}, "Huber delta"),
    ({"seed": -3}, "seed"),
    ({"starts": [[np.nan, 1.0]]}, "starts"),
    ({"fix": {"E": "x"}}, "fixed value"),
    ({"tie": ["alpha"]}, "NAME=NAME"),
])
def test_bad_settings_are_user_errors_when_made(bad, msg):
    with pytest.raises(UserError, match=msg):
        FitSettings(**bad)
    with pytest.raises(UserError, match=msg):        # replace checks again
        FitSettings().replace(**bad)


def test_settings_are_immutable_hashable_and_normalised():
    grid = np.array([[1.0, 2.0], [3.0, 4.0]])
    s = FitSettings(starts=grid, fix={"E": 1}, tie=["alpha=beta"])
    grid[0, 0] = 99.0                                  # the caller's array is not the settings'
    assert s.starts == ((1.0, 2.0), (3.0, 4.0)) and s.start_grid.dtype == float
    assert s.fix == (("E", 1.0),) and s.tie == (("alpha", "beta"),)
    assert hash(s) == hash(FitSettings(starts=[[1, 2], [3, 4]], fix={"E": 1.0}, tie=[("alpha", "beta")]))
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.seed = 3
    with pytest.raises(TypeError, match="not a fit setting"):
        s.replace(share="E")
    assert s.constraints(shared=["E"]).describe() == {"fixed": {"E": 1.0}, "tied": ["alpha=beta"],
                                                      "shared": ["E"]}


def test_settings_object_and_keyword_changes_give_the_same_fit(points):
    settings = FitSettings(n_bootstrap=12, seed=4, starts=STARTS, ci_level=0.9)
    a = fit_law(points, "chinchilla", settings)
    b = fit_law(points, "chinchilla", n_bootstrap=12, seed=4, starts=STARTS, ci_level=0.9)
    c = fit_law(points, "chinchilla", FitSettings(n_bootstrap=3), n_bootstrap=12, seed=4, starts=STARTS,
                ci_level=0.9)
    assert a.to_json() == b.to_json() == c.to_json()
    assert a.settings["ci_level"] == 0.9 and a.settings["n_bootstrap"] == 12
    g = fit_groups(points, "chinchilla", settings, cross_checks=False)["g"]
    assert g.to_json() == a.to_json()
    h = holdout(points, "chinchilla", "largest", settings)
    assert h.level == 0.9 and h.fits["g"].settings["seed"] == 4


def test_fit_result_round_trips_through_json_and_keeps_its_residuals(points, tmp_path):
    fit = fit_law(points, "chinchilla", FitSettings(n_bootstrap=10, starts=STARTS))
    text = fit.to_json()
    again = FitResult.from_json(text)
    assert again.to_json() == text
    assert set(again.data) == {"N", "D", "loss"}
    # the residuals come from the stored points, not the table: equal to the fit's own diagnostics
    r = fit.residuals()
    np.testing.assert_array_equal(again.residuals(), r)
    np.testing.assert_allclose(r, np.log(points["loss"]) - np.log(fit.predict(N=points["N"], D=points["D"])))
    assert np.sqrt(np.mean(r ** 2)) == pytest.approx(fit.diagnostics["rmse_log"], rel=1e-9)
    # and through a fits file
    fit.save(tmp_path / "f.json")
    np.testing.assert_array_equal(FitSet.load(tmp_path / "f.json").get().residuals(), r)


def test_fit_result_without_points_and_with_tampered_points(points):
    fit = fit_law(points, "chinchilla", FitSettings(n_bootstrap=0, starts=STARTS))
    d = fit.to_dict()
    old = FitResult.from_dict({k: v for k, v in d.items() if k != "data"})   # a file from before
    with pytest.raises(UserError, match="no fitted points"):
        old.residuals()
    bad = json.loads(json.dumps(d))
    bad["data"]["loss"][0] = -1.0
    with pytest.raises(UserError, match="data.loss"):
        FitResult.from_dict(bad)
    bad["data"]["loss"] = bad["data"]["loss"][:3]
    with pytest.raises(UserError, match="n_points"):
        FitResult.from_dict(bad)
    with pytest.raises(UserError, match="invalid JSON"):
        FitResult.from_json("{")


def test_notebook_view_is_the_summary(points):
    fit = fit_law(points, "chinchilla", FitSettings(n_bootstrap=0, starts=STARTS))
    html = fit._repr_html_()
    assert html.startswith("<pre>") and html.endswith("</pre>")
    assert "group g" in html and "&lt;" not in fit.summary()
