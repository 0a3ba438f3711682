"""The loss floor's profile (scaling/fitting/floor_profile.py) against planted laws: the floors it
allows hold the planted E, its exponent span holds the planted exponent, its statistic is the
documented formula, and the design effect is Kish's. Coverage over many planted studies is measured
by benchmarks/floor_profile_coverage.py (numbers in docs/proxy-study.md)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from scaling.cli import app
from scaling.fitting.fit import fit_law
from scaling.fitting.floor_profile import design_effect, floor_profile
from scaling.fitting.result import profile_text
from scaling.fitting.tables import load_points

runner = CliRunner()


def _study(law: dict, sizes: np.ndarray, tokens: np.ndarray, seeds: int, run_sd: float, point_sd: float,
           seed: int) -> pd.DataFrame:
    """Every (size, seed) run one training curve through ``tokens``; C = 6 N D; a log-normal offset
    per run and independent noise per point."""
    rng = np.random.default_rng(seed)
    rows = []
    for i, n in enumerate(sizes):
        for s in range(seeds):
            off = rng.normal(0, run_sd)
            for d in tokens:
                clean = law["E"] + law["A"] / n ** law["alpha"] + law["B"] / d ** law["beta"]
                loss = clean * math.exp(off + rng.normal(0, point_sd))
                rows.append((f"r{i}-s{s}", n, d, 6 * n * d, 6 * n, loss, s))
    return pd.DataFrame(rows, columns=["run", "N", "D", "flops", "flops_per_token", "loss", "seed"])


def test_design_effect_is_kish_with_the_anova_icc():
    # equal runs of 2: the one-way ANOVA by hand. Runs (1, 3), (2, 4), (10, 12): run means 2, 3, 11,
    # grand mean 16/3; MSB = 2 * sum((mean - 16/3)^2) / 2, MSW = sum of squares within / 3 = 6 / 3
    r = np.array([1.0, 3.0, 2.0, 4.0, 10.0, 12.0])
    runs = np.array(["a", "a", "b", "b", "c", "c"])
    msb = 2 * sum((m - 16 / 3) ** 2 for m in (2, 3, 11)) / 2
    msw = 2.0
    rho = (msb - msw) / (msb + msw)
    deff, got_rho, m = design_effect(r, runs)
    assert m == 2 and got_rho == pytest.approx(rho, rel=1e-12) and deff == pytest.approx(1 + rho, rel=1e-12)
    # a planted correlation: run and point s.d. equal -> rho = 0.5; runs of 4 -> deff = 2.5
    rng = np.random.default_rng(0)
    idx = np.repeat(np.arange(3000), 4)
    deff, rho, m = design_effect(rng.normal(size=3000)[idx] + rng.normal(size=idx.size), idx)
    assert abs(rho - 0.5) < 0.03 and abs(deff - 2.5) < 0.1
    # one point per run, or independent points: no inflation
    assert design_effect(rng.normal(size=50), np.arange(50))[0] == 1.0
    # rho < 0 is clipped
    assert design_effect(np.array([1.0, -1.0, 1.0, -1.0]), np.array([0, 0, 1, 1]))[0] == 1.0


def test_identified_law_profile_is_narrow_around_the_planted_floor():
    law = {"E": 1.82, "A": 482.01, "alpha": 0.3478, "B": 2085.43, "beta": 0.3658}
    pts = _study(law, np.geomspace(3e7, 3e9, 6), np.geomspace(1e9, 1e12, 6), 2, 0.005, 0.003, seed=1)
    fit = fit_law(pts, n_bootstrap=0)
    prof = floor_profile(pts, fit, fit_law)
    lo, hi = prof["E_range"]
    assert not prof["from_bound"] and not prof["up_to_lowest_loss"] and prof["contiguous"]
    assert lo <= law["E"] <= hi and hi - lo < 0.25, prof["E_range"]
    a_true = law["beta"] / (law["alpha"] + law["beta"])
    assert prof["a_range"][0] - 0.01 <= a_true <= prof["a_range"][1] + 0.01
    # the statistic is the documented one: S of independent fits with E fixed at some of the floors
    # tried, then Delta from the S of every floor (S_min, n - p = n - 5, Kish's deff, chi2_1 0.95)
    for E, s in list(zip(prof["E"], prof["S"]))[2::8]:
        refit = fit_law(pts, n_bootstrap=0, fix={"E": E})
        assert s == pytest.approx(np.sum(refit.residuals() ** 2), rel=1e-6)  # the optimiser's tolerance
    s_min = min(prof["S"])
    deff = design_effect(fit.residuals(), pts["run"].to_numpy())[0]
    want = [(s - s_min) / (s_min / (len(pts) - 5) * deff) for s in prof["S"]]
    assert prof["delta"] == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert prof["allowed"] == [d <= 3.841458820694124 for d in prof["delta"]]


def test_unidentified_law_profile_holds_the_planted_floor_and_exponent():
    """Losses far above the floor over one decade of compute (the shipped study's situation): the free
    fit ends on E's bound; the floors the profile allows reach the planted one, and the planted law's
    compute-optimal exponent (C = 6 N D: a = beta / (alpha + beta)) lies within the span the profile
    reports."""
    law = {"E": 2.2, "A": 4.15, "alpha": 0.1065, "B": 511.4, "beta": 0.4339}
    pts = _study(law, np.geomspace(5e3, 4e5, 7), np.geomspace(2e5, 1.8e6, 4), 2, 0.012, 0.012, seed=3)
    fit = fit_law(pts, n_bootstrap=0)
    assert "E" in fit.diagnostics["on_bound"] and not fit.diagnostics["identified"]
    prof = floor_profile(pts, fit, fit_law)
    assert prof["from_bound"] and prof["E_range"][0] <= law["E"] <= prof["E_range"][1]
    a_true = law["beta"] / (law["alpha"] + law["beta"])
    lo, hi = prof["a_range"]
    assert lo <= a_true <= hi and hi - lo > 0.05, (a_true, prof["a_range"], fit.derived["a"])
    assert "allow E from its bound to" in profile_text(prof)


def test_no_profile_where_the_floor_is_not_free():
    law = {"E": 1.82, "A": 482.01, "alpha": 0.3478, "B": 2085.43, "beta": 0.3658}
    pts = _study(law, np.geomspace(3e7, 3e9, 5), np.geomspace(1e9, 1e11, 4), 1, 0.0, 0.003, seed=2)
    prof = floor_profile(pts, fit_law(pts, n_bootstrap=0, fix={"E": 1.7}), fit_law)
    assert prof == {"available": False, "reason": "E is fixed"}


def test_fit_cli_reports_the_profile_of_the_shipped_laws(tmp_path):
    """runs/: neither law is identified; the fit prints the profile and marks approach 3's exponent,
    and its fits file holds the profile."""
    res = runner.invoke(app, ["fit", "runs", "--bootstrap", "0", "--out", str(tmp_path / "fits.json")])
    assert res.exit_code == 0, res.stderr
    assert res.stdout.count("loss-floor profile: the points allow E from its bound") == 2
    assert "† the law is not identified" in res.stdout
    fits = json.loads((tmp_path / "fits.json").read_text())["fits"]
    pts = load_points("runs")
    for group in ("baseline", "smelt"):
        prof = fits[group]["cross_checks"]["floor_profile"]
        assert prof["available"] and prof["from_bound"]
        lo, hi = prof["a_data_range"]
        assert lo <= fits[group]["derived"]["a_data"] <= hi
        assert max(prof["E"]) < pts[pts["group"] == group]["loss"].min()   # floors below the lowest loss


def test_agreement_reads_approach_3s_interval_with_the_floors_it_cannot_exclude():
    """For a law that is not identified, approach 1 or 2 is compared with approach 3's interval joined
    with the exponent's span over the allowed floors: an approach-1 interval inside that span but away
    from the point fit (whose E sits on the bound) is no disagreement; one beyond the span still is.
    attach_floor_profiles recomputes the warnings with the profile it attaches."""
    from dataclasses import replace

    from scaling.fitting.approaches import agreement
    from scaling.fitting.fit import attach_floor_profiles

    law = {"E": 2.2, "A": 4.15, "alpha": 0.1065, "B": 511.4, "beta": 0.4339}
    pts = _study(law, np.geomspace(5e3, 4e5, 7), np.geomspace(2e5, 1.8e6, 4), 2, 0.012, 0.012, seed=3)
    fit = fit_law(pts, n_bootstrap=0)
    assert "E" in fit.diagnostics["on_bound"] and not fit.diagnostics["identified"]
    a3 = fit.derived["a"]

    def checks(ci):
        return {"approach1": {"available": True, "a": sum(ci) / 2, "a_ci": list(ci)}, "warnings": ["stale"]}

    # the span is known only once profiled: one profile, attached with a placeholder interval
    got = attach_floor_profiles(pts, {"default": replace(fit, cross_checks=checks((a3, a3 + 1e-9)))})
    prof = got["default"].cross_checks["floor_profile"]
    lo, hi = prof["a_range"]
    assert got["default"].cross_checks["warnings"] == []          # recomputed, not the stale one
    low_side = hi - a3 < a3 - lo
    far = (lo - 0.05, lo - 0.01) if low_side else (hi + 0.01, hi + 0.05)
    inside = (lo + 0.01, lo + 0.02) if low_side else (hi - 0.02, hi - 0.01)
    assert not inside[0] <= a3 <= inside[1]
    for ci, warned in ((inside, False), (far, True)):
        c = checks(ci)
        assert len(agreement(c, fit)) == 1                        # against the point fit alone: apart
        w = agreement({**c, "floor_profile": prof}, fit)
        assert bool(w) == warned, (ci, (lo, hi), w)
        if warned:
            assert "span over the allowed loss floors" in w[0] and f"{lo:.3f}" in w[0]
