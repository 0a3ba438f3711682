"""Large tables (issue 25): the subset refinement finds the full refinement's optimum, and the one-step
bootstrap's spread matches refitting every resample. Thresholds are lowered so a 2,000-point table
takes the large-table paths; the timing of a 1,000,000-row fit is in benchmarks/fit_scaling.py --rows."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from scaling.fitting import fit as F
from scaling.fitting import optimizer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from fit_scaling import TRUE, synthetic  # noqa: E402

STARTS = F.get_law("chinchilla").starts()[::30]   # a thinned start grid keeps the test quick


@pytest.fixture(scope="module")
def points():
    return synthetic(2000, seed=3)


def test_subset_refinement_reaches_the_full_optimum(points, monkeypatch):
    full = F.fit_law(points, n_bootstrap=0, starts=STARTS)
    monkeypatch.setattr(optimizer, "REFINE_POINTS", 1000)
    large = F.fit_law(points, n_bootstrap=0, starts=STARTS)
    for p in full.params:
        assert large.params[p] == pytest.approx(full.params[p], rel=1e-5), p
    assert large.diagnostics["objective"] == pytest.approx(full.diagnostics["objective"], rel=1e-9)


def test_one_step_bootstrap_matches_refits(points, monkeypatch):
    exact = F.fit_law(points, n_bootstrap=60, seed=1, starts=STARTS)
    monkeypatch.setattr(F, "ONE_STEP_POINTS", 1000)
    step = F.fit_law(points, n_bootstrap=60, seed=1, starts=STARTS)
    assert exact.settings["bootstrap_method"] == "refit" and step.settings["bootstrap_method"] == "one-step"
    assert any("Gauss-Newton step" in w for w in step.diagnostics["warnings"])
    assert step.params == exact.params
    law = F.get_law("chinchilla")
    for i, p in enumerate(law.params):
        x, y = exact.bootstrap[:, i], step.bootstrap[:, i]
        if p in law.log_params:             # fitted as logs: compare spreads there
            x, y = np.log(x), np.log(y)
        sd_exact, sd_step = np.std(x), np.std(y)
        assert sd_step == pytest.approx(sd_exact, rel=0.2), p
        lo, hi = step.ci[p]
        assert lo <= step.params[p] <= hi
    # the planted truth of the allocation exponent lies inside the one-step interval
    a_true = TRUE["beta"] / (TRUE["alpha"] + TRUE["beta"])
    lo, hi = step.ci["a"]
    assert lo - 0.02 <= a_true <= hi + 0.02
