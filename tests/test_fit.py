"""Approach-3 fitter: optimiser, recovery of known laws, Epoch's Chinchilla fit, result objects."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from scaling.common.errors import UserError
from scaling.fitting.fit import (
    FitResult,
    FitSet,
    Objective,
    _run_weights,
    fit_groups,
    fit_law,
    lbfgs_batch,
    multistart,
)
from scaling.fitting.laws import get_law, optimal
from scaling.fitting.tables import Columns, law_inputs, load_points

CHIN = get_law("chinchilla")
SMELT = get_law("smelt")
TRUE = {"E": 1.8, "A": 480.0, "alpha": 0.35, "B": 2100.0, "beta": 0.37}   # near Epoch's Chinchilla fit
TRUE_SMELT = {"E": 1.4439, "A": 1366.0, "a": 0.3703, "b": 0.153, "K": 1.975e6, "c": 0.6594}  # paper Baseline
A_TRUE = TRUE["beta"] / (TRUE["alpha"] + TRUE["beta"])

SHARED = Path(__file__).resolve().parents[2] / "shared"
EPOCH_CSV = SHARED / "data" / "chinchilla_epoch" / "svg_extracted_data.csv"


def frame(N, D, L, run=None, group="g", F=None, S=None):
    n = len(N)
    return pd.DataFrame({"group": group, "run": run if run is not None else [f"r{i}" for i in range(n)],
                         "N": N, "D": D, "loss": L, "flops": 6 * np.asarray(N) * np.asarray(D),
                         "flops_per_token": np.nan if F is None else F,
                         "sparsity": np.nan if S is None else S})


def grid_design():
    N, D = np.meshgrid(np.geomspace(3e7, 1e10, 7), np.geomspace(1e9, 5e11, 7))
    return N.ravel(), D.ravel()


def isoflop_design(budgets=np.geomspace(1e18, 1e21, 5), spread=8.0, per=9):
    N, D = [], []
    for C in budgets:
        n_opt = optimal(CHIN, TRUE, C)["N"]
        for r in np.geomspace(1 / spread, spread, per):
            N.append(n_opt * r)
            D.append(C / (6 * n_opt * r))
    return np.array(N), np.array(D)


def smelt_design():
    F, S, D = np.meshgrid(np.geomspace(6e8, 1e10, 5), [0.85, 0.95, 0.97], np.geomspace(1e10, 4e11, 5))
    return F.ravel(), S.ravel(), D.ravel()


def noisy(law, theta, sigma, seed, **inputs):
    L = law.predict(theta, **inputs)
    return L * np.exp(sigma * np.random.default_rng(seed).standard_normal(L.shape))


# -- optimiser ------------------------------------------------------------------------------
@pytest.mark.parametrize("law", [CHIN, SMELT])
def test_objective_gradient_matches_finite_differences(law):
    rng = np.random.default_rng(0)
    if law is CHIN:
        N, D = grid_design()
        X, y = {"N": N, "D": D}, np.log(noisy(CHIN, TRUE, 0.01, 0, N=N, D=D))
    else:
        F, S, D = smelt_design()
        X, y = {"F": F, "S": S, "D": D}, np.log(noisy(SMELT, TRUE_SMELT, 0.01, 0, F=F, S=S, D=D))
    w = rng.integers(0, 3, size=(2, y.size)).astype(float)
    obj = Objective(law, X, y, delta=1e-3, weights=w)
    z = law.to_internal(TRUE if law is CHIN else TRUE_SMELT) + 0.05 * rng.standard_normal((3, law.n_params))
    rows = np.array([0, 1, 1])
    f, g = obj(z, rows)
    h = 1e-6
    for j in range(law.n_params):
        e = np.zeros(law.n_params)
        e[j] = h
        fd = (obj(z + e, rows)[0] - obj(z - e, rows)[0]) / (2 * h)
        np.testing.assert_allclose(g[:, j], fd, rtol=1e-5, atol=1e-9)
    # weights are per row: row 0 and row 1 differ
    assert not np.isclose(obj(z[:1], np.array([0]))[0], obj(z[:1], np.array([1]))[0])


def test_objective_memory_is_bounded_in_starts():
    import tracemalloc

    rng = np.random.default_rng(0)
    N, D = np.exp(rng.uniform(17, 23, 3000)), np.exp(rng.uniform(21, 27, 3000))
    obj = Objective(CHIN, {"N": N, "D": D}, np.log(CHIN.predict(TRUE, N=N, D=D)))
    z = CHIN.starts()                                   # 2,700 starts: one unblocked temporary is 194 MB
    tracemalloc.start()
    f, g = obj(z)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 120 * 2 ** 20 and f.shape == (z.shape[0],) and np.isfinite(f).all()
    f1, g1 = obj(z[:5])
    np.testing.assert_allclose(f[:5], f1, rtol=1e-13)
    np.testing.assert_allclose(g[:5], g1, rtol=1e-12)


def test_lbfgs_batch_bounded_quadratics():
    # f = sum (x - c)^2 * scale, each row its own centre; the bound clips the second row's optimum
    centres = np.array([[0.3, -0.2], [2.0, 0.5], [-0.5, 0.9]])
    scale = np.array([1.0, 100.0])

    def fun(x, rows):
        d = x - centres[rows]
        return (scale * d * d).sum(axis=1), 2 * scale * d

    lo, hi = np.array([-1.0, -1.0]), np.array([1.0, 1.0])
    res = lbfgs_batch(fun, np.zeros((3, 2)), lo, hi, rows=np.arange(3))
    np.testing.assert_allclose(res.x, np.clip(centres, lo, hi), atol=1e-8)
    assert res.converged.all()


# -- recovery of known laws -----------------------------------------------------------------
@pytest.mark.parametrize("design", [grid_design, isoflop_design])
def test_noise_free_recovery_is_exact(design):
    N, D = design()
    fit = fit_law(frame(N, D, CHIN.predict(TRUE, N=N, D=D)), n_bootstrap=0)
    for k, v in TRUE.items():
        assert fit.params[k] == pytest.approx(v, rel=1e-5), k
    # without a bootstrap the point fit is sound but nothing shows the refits stay off the bounds
    assert fit.diagnostics["rmse_log"] < 1e-8 and fit.diagnostics["point_fit_sound"]
    assert not fit.diagnostics["identified"]
    assert any("no bootstrap (--bootstrap 0)" in w for w in fit.diagnostics["warnings"])


# Tolerances for 0.3% multiplicative noise (sigma of log L = 0.003) on 45-49 points, set from the
# spread of the estimates over seeds: E within 3%, exponents within 0.03, a* within 0.015, the weakly
# identified scales A and B within a factor 2.
@pytest.mark.parametrize("design", [grid_design, isoflop_design])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_noisy_recovery_within_tolerances(design, seed):
    N, D = design()
    df = frame(N, D, noisy(CHIN, TRUE, 0.003, seed, N=N, D=D))
    fit = fit_law(df, n_bootstrap=0)
    p = fit.params
    assert p["E"] == pytest.approx(TRUE["E"], rel=0.03)
    assert abs(p["alpha"] - TRUE["alpha"]) < 0.03 and abs(p["beta"] - TRUE["beta"]) < 0.03
    assert abs(np.log(p["A"] / TRUE["A"])) < np.log(2) and abs(np.log(p["B"] / TRUE["B"])) < np.log(2)
    assert abs(fit.derived["a"] - A_TRUE) < 0.015
    # the optimiser's optimum is at least as good as the truth on the same data
    obj = Objective(CHIN, law_inputs(df, CHIN.inputs), np.log(df["loss"].to_numpy()))
    assert fit.diagnostics["objective"] <= obj(CHIN.to_internal(TRUE)[None])[0][0] + 1e-15


def test_smelt_law_recovers_known_parameters():
    F, S, D = smelt_design()
    exact = fit_law(frame(F / 6, D, SMELT.predict(TRUE_SMELT, F=F, S=S, D=D), F=F, S=S), SMELT, n_bootstrap=0)
    for k, v in TRUE_SMELT.items():
        assert exact.params[k] == pytest.approx(v, rel=1e-5), k
    # 0.3% noise, 75 points: E within 3%, a and c within 0.04, b within 0.02, A and K within a factor 2
    L = noisy(SMELT, TRUE_SMELT, 0.003, 0, F=F, S=S, D=D)
    p = fit_law(frame(F / 6, D, L, F=F, S=S), SMELT, n_bootstrap=0).params
    assert p["E"] == pytest.approx(TRUE_SMELT["E"], rel=0.03)
    assert abs(p["a"] - TRUE_SMELT["a"]) < 0.04 and abs(p["c"] - TRUE_SMELT["c"]) < 0.04
    assert abs(p["b"] - TRUE_SMELT["b"]) < 0.02
    for k in ("A", "K"):
        assert abs(np.log(p[k] / TRUE_SMELT[k])) < np.log(2), k


def test_unidentified_fit_is_flagged():
    # one token count: B, beta and E cannot be told apart
    N = np.geomspace(1e7, 1e10, 12)
    D = np.full(12, 1e10)
    fit = fit_law(frame(N, D, noisy(CHIN, TRUE, 0.003, 0, N=N, D=D)), n_bootstrap=0)
    assert not fit.diagnostics["identified"]
    assert any("not identified" in w for w in fit.diagnostics["warnings"])


def test_bootstrap_share_on_a_bound_must_be_shown_small():
    """The verdict asks the one-sided 95% upper bound of the share of refits on a bound to be at most
    10%, not the observed share: the verdict flipped with resampling noise at a small bootstrap. A
    well-identified planted law with none on a bound is identified at K = 30 and not at K = 10 (0 of
    10 cannot show <= 10%: its bound is 21%), where the warning says to raise --bootstrap."""
    from scaling.fitting.fit import bound_share_upper

    # the closed form of the one-sided Wilson bound at 0 successes: z^2 / (K + z^2), z = 1.6449
    z2 = 1.6448536269514722 ** 2
    for K in (10, 25, 200):
        assert bound_share_upper(0, K) == pytest.approx(z2 / (K + z2), rel=1e-9)
    assert bound_share_upper(12, 200) < 0.1 < bound_share_upper(14, 200)
    N, D = grid_design()
    df = frame(N, D, noisy(CHIN, TRUE, 0.003, 5, N=N, D=D))
    big = fit_law(df, n_bootstrap=30, seed=1).diagnostics
    small = fit_law(df, n_bootstrap=10, seed=1).diagnostics
    assert big["bootstrap_on_bound_fraction"] == small["bootstrap_on_bound_fraction"] == 0
    assert big["identified"] and big["bootstrap_on_bound_upper"] < 0.1
    assert not small["identified"] and small["bootstrap_on_bound_upper"] == pytest.approx(z2 / (10 + z2))
    assert any("raise it" in w for w in small["warnings"])
    from scaling.fitting.savings import unidentified

    assert "too few bootstrap resamples" in unidentified({**small, "identified": False})
    assert unidentified(big) is None


def test_too_few_points_is_a_user_error():
    N, D = grid_design()
    with pytest.raises(UserError, match="4 points for 5 parameters"):
        fit_law(frame(N[:4], D[:4], CHIN.predict(TRUE, N=N[:4], D=D[:4])))


# -- bootstrap ------------------------------------------------------------------------------
def test_bootstrap_resamples_runs_not_points():
    runs = np.array(["a", "a", "a", "b", "c", "c"])
    W = _run_weights(runs, 50, np.random.default_rng(0))
    assert W.shape == (50, 6)
    assert np.all(W[:, 0] == W[:, 1]) and np.all(W[:, 4] == W[:, 5])
    counts = W[:, [0, 3, 4]]
    assert np.all(counts.sum(axis=1) == 3)                        # three runs drawn per resample
    assert len({tuple(r) for r in counts}) > 3


def test_bootstrap_is_seeded_and_intervals_cover_estimate():
    N, D = grid_design()
    df = frame(N, D, noisy(CHIN, TRUE, 0.003, 5, N=N, D=D))
    a = fit_law(df, n_bootstrap=30, seed=1)
    b = fit_law(df, n_bootstrap=30, seed=1)
    c = fit_law(df, n_bootstrap=30, seed=2)
    np.testing.assert_array_equal(a.bootstrap, b.bootstrap)
    assert not np.array_equal(a.bootstrap, c.bootstrap)
    assert a.bootstrap.shape == (30, 5)
    for k in (*CHIN.params, "a", "b"):
        lo, hi = a.ci[k]
        assert lo < hi
    for k in ("E", "alpha", "beta"):
        assert a.ci[k][0] <= a.params[k] <= a.ci[k][1]


# -- results and groups ---------------------------------------------------------------------
def test_fit_result_round_trip_predict_optimal(tmp_path):
    N, D = grid_design()
    fit = fit_law(frame(N, D, noisy(CHIN, TRUE, 0.003, 3, N=N, D=D)), n_bootstrap=20, seed=0)
    d = fit.to_dict()
    for key in ("law", "params", "n_points", "ci", "diagnostics", "bootstrap", "data_summary"):
        assert key in d
    assert list(d["params"]) == list(CHIN.params)
    back = FitResult.from_dict(d)
    assert back.params == fit.params and back.ci == fit.ci
    np.testing.assert_array_equal(back.bootstrap, fit.bootstrap)
    path = tmp_path / "fit.json"
    fit.save(path)
    loaded = FitResult.load(path)
    assert loaded.params == fit.params and loaded.data_summary == fit.data_summary
    assert FitSet.load(path)["g"].group == "g"
    # predict and optimal
    np.testing.assert_allclose(fit.predict(N=1e9, D=1e10), CHIN.predict(fit.params, N=1e9, D=1e10))
    assert fit.predict_bootstrap(N=np.array([1e9, 2e9]), D=1e10).shape == (20, 2)
    opt = fit.optimal(1e22)
    assert opt["N"] * opt["D"] * fit.cost.k == pytest.approx(1e22)
    assert fit.cost.k == pytest.approx(6.0)
    assert fit.data_summary["compute_min"] == pytest.approx((6 * N * D).min())
    assert fit.data_summary["compute_max"] == pytest.approx((6 * N * D).max())
    assert "alpha" in fit.summary() and "identified" in fit.summary()
    pars = fit.to_lmfit()
    assert pars["beta"].value == fit.params["beta"] and pars["E"].min == CHIN.bounds["E"][0]
    assert pars["A"].stderr == pytest.approx(fit.bootstrap[:, 1].std(ddof=1))
    assert "[[Variables]]" in fit.report() and "C(A, alpha)" in fit.report()
    # no bootstrap: empty samples, NaN intervals
    nb = fit_law(frame(N, D, CHIN.predict(TRUE, N=N, D=D)), n_bootstrap=0)
    assert nb.bootstrap.shape == (0, 5) and all(np.isnan(v[0]) for v in nb.ci.values())
    with pytest.raises(UserError, match="no bootstrap"):
        nb.predict_bootstrap(N=1e9, D=1e10)


def test_fitset_rejects_bad_files(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("{}")
    with pytest.raises(UserError, match="not a fits file"):
        FitSet.load(p)
    p.write_text('{"fits": {"g": {"law": "chinchilla", "E": 1}}}')
    with pytest.raises(UserError, match="not a fit entry"):
        FitSet.load(p)
    p.write_text('{"schema": "smelt-scale.fit/9", "fits": {"g": {"law": "chinchilla", "E": 1}}}')
    with pytest.raises(UserError, match="not one this version"):
        FitSet.load(p)


def test_fitset_reads_unversioned_files_as_version_1(tmp_path):
    """A fits file written before schemas (parameters as top-level keys) still loads; a saved file is
    version 2 (parameters under "params") and loads back equal."""
    entry = {"law": "chinchilla", "E": 1.7, "A": 400.0, "alpha": 0.34, "B": 410.0, "beta": 0.28,
             "n_points": 9}
    p = tmp_path / "old.json"
    p.write_text(json.dumps({"fits": {"g": entry}}))
    fs = FitSet.load(p)
    assert fs["g"].params == {k: entry[k] for k in ("E", "A", "alpha", "B", "beta")}
    fs.save(tmp_path / "new.json")
    doc = json.loads((tmp_path / "new.json").read_text())
    assert doc["schema"] == "smelt-scale.fit/2" and doc["fits"]["g"]["params"]["beta"] == 0.28
    assert "beta" not in doc["fits"]["g"]
    assert FitSet.load(tmp_path / "new.json")["g"].params == fs["g"].params


def test_fit_groups_and_cross_checks():
    N1, D1 = isoflop_design(budgets=np.geomspace(1e18, 1e21, 6))
    iso = frame(N1, D1, noisy(CHIN, TRUE, 0.002, 1, N=N1, D=D1), group="iso")
    # training curves: 8 runs, 12 budgets each
    N2, D2 = np.meshgrid(np.geomspace(3e7, 3e9, 8), np.geomspace(1e9, 1e12, 12), indexing="ij")
    runs = np.repeat([f"c{i}" for i in range(8)], 12)
    curves = frame(N2.ravel(), D2.ravel(), CHIN.predict(TRUE, N=N2.ravel(), D=D2.ravel()), run=runs,
                   group="curves")
    fits = fit_groups(pd.concat([iso, curves], ignore_index=True), n_bootstrap=0)
    assert list(fits) == ["curves", "iso"]
    a2 = fits["iso"].cross_checks["approach2"]
    assert a2["available"] and a2["n_buckets"] == 6 and abs(a2["a"] - A_TRUE) < 0.02
    assert abs(a2["design_bias"]) < 0.01          # a centred IsoFLOP design has almost no parabola bias
    a1 = fits["curves"].cross_checks["approach1"]
    assert a1["available"] and a1["mode"].startswith("training curves") and abs(a1["a"] - A_TRUE) < 0.02
    assert not fits["curves"].cross_checks["approach2"]["available"]
    assert "compute buckets" in fits["curves"].cross_checks["approach2"]["reason"]
    assert fits["curves"].diagnostics["n_runs"] == 8


# -- real data: Epoch AI's Chinchilla points (Besiroglu et al. 2024) -------------------------
needs_epoch = pytest.mark.skipif(not EPOCH_CSV.exists(),
                                 reason=f"Epoch's Chinchilla data not found at {EPOCH_CSV} "
                                        "(../shared absent)")
# shared/data/chinchilla_epoch/SOURCE.md: plain-Huber grid fit and the headline fit's bootstrap 95% intervals
EPOCH_GRID = {"E": 1.817236, "A": 477.8417, "alpha": 0.347313, "B": 2143.8638, "beta": 0.367183}
EPOCH_CI = {"A": (285.214, 743.626), "B": (1042.357, 5810.344), "E": (1.769, 1.871), "alpha": (0.317, 0.373),
            "beta": (0.331, 0.415)}


def epoch_points():
    df = load_points(EPOCH_CSV, Columns(n="Model Size", c="Training FLOP"))
    cut = np.sort(df["loss"].to_numpy())[-5]
    df = df[df["loss"] < cut].reset_index(drop=True)        # Epoch drops the 5 highest losses
    assert len(df) == 240
    return df


@needs_epoch
def test_reproduces_epoch_plain_huber_fit():
    fit = fit_law(epoch_points(), n_bootstrap=100, seed=0)
    p = fit.params
    for k in ("E", "alpha", "beta"):
        assert p[k] == pytest.approx(EPOCH_GRID[k], rel=0.01), k
    for k in ("A", "B"):
        assert p[k] == pytest.approx(EPOCH_GRID[k], rel=0.10), k
    for k, (lo, hi) in EPOCH_CI.items():
        assert lo <= p[k] <= hi, k
        ours_lo, ours_hi = fit.ci[k]
        assert ours_lo < hi and lo < ours_hi, k                 # our bootstrap interval overlaps theirs
    assert fit.diagnostics["objective"] <= 0.0010182740346       # Epoch's printed objective
    assert fit.diagnostics["identified"]
    # Epoch's bootstrap: a = beta/(alpha+beta) 95% (0.4807, 0.5561)
    assert fit.ci["a"][0] < 0.5561 and 0.4807 < fit.ci["a"][1]


@needs_epoch
def test_epoch_optimum_to_the_printed_digits():
    # the optimum before the memory-bounded screening, as printed: it must not move
    fit = fit_law(epoch_points(), n_bootstrap=0)
    p = fit.params
    assert (f"{p['E']:.6f}", f"{p['A']:.2f}", f"{p['alpha']:.6f}", f"{p['B']:.2f}", f"{p['beta']:.6f}") == \
        ("1.817218", "477.83", "0.347310", "2143.42", "0.367172")
    assert f"{fit.diagnostics['objective']:.10e}" == "1.0182740178e-03"
    assert fit.diagnostics["point_fit_sound"] and not fit.diagnostics["misfit"]


@needs_epoch
def test_bootstrap_from_optima_matches_full_multistart():
    df = epoch_points()
    law = CHIN
    fit = fit_law(df, n_bootstrap=2, seed=7)
    X, y = law_inputs(df, law.inputs), np.log(df["loss"].to_numpy())
    W = _run_weights(df["run"].to_numpy(), 2, np.random.default_rng(7))
    for i in range(2):
        obj = Objective(law, X, y, weights=W[i])
        full = multistart(obj, law.starts()[::4])
        ours = obj(law.to_internal(fit.bootstrap[i])[None])[0][0]
        assert ours <= full.objective * (1 + 1e-9)


@needs_epoch
@pytest.mark.slow
def test_epoch_full_bootstrap_200():
    fit = fit_law(epoch_points(), n_bootstrap=200, seed=0)
    for k, (lo, hi) in EPOCH_CI.items():
        ours_lo, ours_hi = fit.ci[k]
        assert ours_lo < hi and lo < ours_hi, k
    assert fit.diagnostics["bootstrap_unconverged"] == 0
