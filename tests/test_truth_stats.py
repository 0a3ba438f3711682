"""`compare`'s clustered s.e. and t(G-1) interval, and `fit`'s residual-trend F-test, against planted truths.

Compare: pair tables simulated from d_gi = mu + a_g + e_gi (a shared per run-pair effect a_g ~ N(0, tau^2),
per-pair noise e_gi ~ N(0, sigma^2), unequal cluster sizes n_g). The statistic is the plain mean over
pairs, so E[dbar] = mu for any cluster sizes, and its true variance is sum_g (n_g^2 tau^2 + n_g sigma^2)
/ n^2. The interval's coverage and the s.e.'s size are measured over many tables; a tiny table is checked
against the textbook CR1 formula by hand.

Goodness of fit: residuals with a planted quadratic trend in the law's log inputs, tested against a nested
F-test written here from its definition (intercept-only vs full quadratic in the raw, unstandardised log
inputs: the same column span), and residuals of pure noise, whose p-values must be Uniform(0, 1).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from scaling.fitting.compare import LEVEL, cluster_se, pair_stats
from scaling.fitting.goodness import MISFIT_FLOOR, MISFIT_P, MISFIT_RATIO, goodness_of_fit
from scaling.fitting.laws import get_law

# -- compare: the planted random-effects model ---------------------------------------------------------
MU, TAU, SIGMA = -0.1, 0.03, 0.02     # mean difference, run-pair effect s.d., per-pair noise s.d.
SIZES = np.resize([1, 2, 3, 4, 5], 30)  # pairs (budgets) per run pair: G = 30 clusters, n = 90 pairs
N_TABLES = 2000


def _pair_frame(d: np.ndarray, cluster_of_pair: np.ndarray) -> pd.DataFrame:
    """Pairs of run pair g as tier t{g % 5}, seed g // 5: ``cluster="run"`` keys (tier, seed) give g back."""
    return pd.DataFrame({"tier": [f"t{g % 5}" for g in cluster_of_pair], "seed": cluster_of_pair // 5,
                         "budget_index": np.concatenate([np.arange(k) for k in np.bincount(cluster_of_pair)]),
                         "diff": d})


def test_clustered_interval_covers_planted_mean_and_se_matches_spread():
    """Planted: d_gi = MU + a_g + e_gi, a_g ~ N(0, TAU^2) shared by the pairs of run pair g, e_gi ~ N(0,
    SIGMA^2), 30 run pairs of 1..5 pairs each (unequal), 2000 tables. ``pair_stats`` (what ``compare``
    reports per row) must (a) cover MU with its 95% t(29) interval in 95% of tables and (b) give an s.e.
    whose size matches the spread of its means across tables and the analytic s.d. of the mean."""
    rng = np.random.default_rng(20261207)
    G, n = SIZES.size, int(SIZES.sum())
    g = np.repeat(np.arange(G), SIZES)
    keys = _pair_frame(np.zeros(n), g)
    means, ses, covered = np.empty(N_TABLES), np.empty(N_TABLES), 0
    for k in range(N_TABLES):
        d = MU + TAU * rng.standard_normal(G)[g] + SIGMA * rng.standard_normal(n)
        s = pair_stats(keys.assign(diff=d), "overall", "run")
        assert s.n_pairs == n and s.n_clusters == G and s.df == G - 1
        means[k], ses[k] = s.mean, s.se
        covered += s.ci_lo <= MU <= s.ci_hi
    # (a) coverage: Binomial(2000, 0.95) has s.d. sqrt(0.95 * 0.05 / 2000) = 0.0049; allow 4 s.d. = 0.02
    # (CR1 with 30 unequal clusters may under-cover by a fraction of a point; 4 s.d. keeps false alarms
    # at 6e-5). Measured 0.953.
    coverage = covered / N_TABLES
    assert abs(coverage - LEVEL) < 0.02, coverage
    # the estimator is unbiased for MU: |mean of means - MU| within 4 of its s.e.
    true_sd = math.sqrt((np.sum(SIZES ** 2) * TAU ** 2 + n * SIGMA ** 2) / n ** 2)
    assert abs(means.mean() - MU) < 4 * true_sd / math.sqrt(N_TABLES)
    # (b) the empirical s.d. of the means (itself within ~1.6% of the truth at 2000 tables) agrees with the
    # analytic one to 5%; the mean reported s.e. agrees with both to 5% (E[se] sits ~1-2% below sqrt(E[se^2])
    # by Jensen and CR1's small bias under unequal sizes; its own sampling error is ~0.3%). Measured: mean
    # s.e. / empirical s.d. = 0.990, / analytic s.d. = 0.979.
    emp_sd = means.std(ddof=1)
    assert emp_sd / true_sd == pytest.approx(1.0, abs=0.05)
    assert ses.mean() / emp_sd == pytest.approx(1.0, abs=0.05), (ses.mean(), emp_sd)
    assert ses.mean() / true_sd == pytest.approx(1.0, abs=0.05)
    # E[se^2] in closed form for this design: with v_g = n_g^2 TAU^2 + n_g SIGMA^2 and V = Var(dbar),
    # E sum_g u_g^2 = sum v_g - 2 sum n_g v_g / n + sum n_g^2 V; se^2 = G/(G-1) sum u_g^2 / n^2.
    v = SIZES ** 2 * TAU ** 2 + SIZES * SIGMA ** 2
    e_se2 = G / (G - 1) * (v.sum() - 2 * np.sum(SIZES * v) / n + np.sum(SIZES ** 2) * true_sd ** 2) / n ** 2
    # sd of mean(se^2) over 2000 tables is ~ sqrt(2 / 29) / sqrt(2000) = 0.6%: 3% is 5 s.d.
    assert np.mean(ses ** 2) / e_se2 == pytest.approx(1.0, abs=0.03)     # measured 0.9998


def test_cr1_se_and_interval_by_hand_on_three_unequal_clusters():
    """Planted: six differences in run pairs of 1, 2 and 3 pairs. Truth: the textbook CR1 s.e. of a mean,
    sqrt(G / (G - 1) * sum_g (sum_{i in g} (d_i - dbar))^2) / n, in exact fractions, and the interval
    dbar -/+ t_{0.975}(2) se with t(2)'s closed-form quantile (2p - 1) sqrt(2 / (4 p (1 - p)))."""
    d = [Fraction(-3, 10), Fraction(1, 20), Fraction(-1, 5), Fraction(7, 100), Fraction(-11, 100),
         Fraction(-1, 25)]
    g = np.array([0, 1, 1, 2, 2, 2])
    n, G = len(d), 3
    dbar = sum(d) / n
    u = [sum(di - dbar for di, gi in zip(d, g) if gi == c) for c in range(G)]
    se = math.sqrt(Fraction(G, G - 1) * sum(x * x for x in u)) / n
    p = 0.5 + LEVEL / 2
    q = (2 * p - 1) * math.sqrt(2 / (4 * p * (1 - p)))      # t_{0.975}(2) = 4.3027
    df_d = np.array([float(x) for x in d])
    assert cluster_se(df_d, g) == pytest.approx(se, rel=1e-12, abs=1e-15)
    s = pair_stats(_pair_frame(df_d, g), "x", "run")
    assert (s.n_pairs, s.n_clusters, s.df) == (6, 3, 2)
    assert s.mean == pytest.approx(float(dbar), abs=1e-15)
    assert s.se == pytest.approx(se, rel=1e-12)
    assert s.ci_lo == pytest.approx(float(dbar) - q * se, rel=1e-12)
    assert s.ci_hi == pytest.approx(float(dbar) + q * se, rel=1e-12)
    # one pair per cluster (cluster="none"): CR1 is the plain sd / sqrt(n), interval on t(n - 1)
    plain = math.sqrt(sum((x - dbar) ** 2 for x in d) / (n - 1) / n)
    s = pair_stats(_pair_frame(df_d, g), "x", "none")
    assert (s.n_clusters, s.df) == (6, 5)
    assert s.se == pytest.approx(plain, rel=1e-12) and s.se_iid == pytest.approx(plain, rel=1e-12)
    # the half-width is t_{0.975}(5) s.e.: t(5)'s closed-form CDF,
    # 1/2 + (th + sin th cos th (1 + 2/3 cos^2 th)) / pi with th = atan(t / sqrt(5)), is 0.975 there
    th = math.atan((s.ci_hi - s.mean) / plain / math.sqrt(5))
    assert 0.5 + (th + math.sin(th) * math.cos(th) * (1 + 2 / 3 * math.cos(th) ** 2)) / math.pi == \
        pytest.approx(p, abs=1e-12)
    assert s.mean - s.ci_lo == pytest.approx(s.ci_hi - s.mean, rel=1e-12)


# -- fit: the residual-trend F-test ---------------------------------------------------------------------
def _design(law_name: str, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """A law's inputs at n scattered points (sizes and tokens over decades; sparsity S in [0, 0.9])."""
    size = np.exp(rng.uniform(np.log(1e6), np.log(1e9), n))
    D = np.exp(rng.uniform(np.log(1e8), np.log(1e11), n))
    if law_name == "chinchilla":
        return {"N": size, "D": D}
    return {"F": 6 * size, "S": rng.uniform(0.0, 0.9, n), "D": D}


def _nested_f(inputs: dict[str, np.ndarray], resid: np.ndarray) -> dict[str, float]:
    """Intercept-only vs full quadratic in the raw inputs (log of all but S): F, p and the two RMS values."""
    raw = [v if k == "S" else np.log(v) for k, v in inputs.items()]
    full = np.column_stack([np.ones_like(resid), *raw,
                            *[raw[i] * raw[j] for i in range(len(raw)) for j in range(i, len(raw))]])
    restricted = np.ones((resid.size, 1))
    rss = []
    for X in (restricted, full):
        beta = np.linalg.lstsq(X, resid, rcond=None)[0]
        rss.append(float(np.sum((resid - X @ beta) ** 2)))
    n, k = resid.size, full.shape[1]
    df1, df2 = k - 1, n - k
    F = ((rss[0] - rss[1]) / df1) / (rss[1] / df2)
    return {"F": F, "p": float(stats.f.sf(F, df1, df2)), "trend_rms": math.sqrt((rss[0] - rss[1]) / n),
            "scatter_rms": math.sqrt(rss[1] / df2)}


@pytest.mark.parametrize("law_name", ["chinchilla", "smelt"])
@pytest.mark.parametrize("amplitude", [0.002, 0.01])
def test_goodness_of_fit_equals_independent_nested_f_test(law_name, amplitude):
    """Planted: log residuals = amplitude x (a quadratic in the log inputs, mean-free) + N(0, 0.003^2) at 60
    points. Truth: the nested-model F-test (intercept vs intercept + linear + squares + products in the raw
    log inputs, S as is), by two least-squares fits and scipy's F survival function, to 1e-9."""
    rng = np.random.default_rng(7 + int(amplitude * 1e4))
    law = get_law(law_name)
    n = 60
    inputs = _design(law_name, rng, n)
    x = [np.log(inputs[k]) if k != "S" else inputs[k] for k in law.inputs]
    z = [(v - v.mean()) / v.std() for v in x]
    trend = z[0] ** 2 - 0.7 * z[0] * z[-1] + 0.5 * z[-1] ** 2
    resid = amplitude * (trend - trend.mean()) + 0.003 * rng.standard_normal(n)
    got = goodness_of_fit(law, inputs, resid)
    want = _nested_f({k: inputs[k] for k in law.inputs}, resid)
    assert got["tested"]
    assert got["F"] == pytest.approx(want["F"], rel=1e-9)
    assert got["p_value"] == pytest.approx(want["p"], rel=1e-9)
    assert got["trend_rms"] == pytest.approx(want["trend_rms"], rel=1e-9)
    assert got["scatter_rms"] == pytest.approx(want["scatter_rms"], rel=1e-9)
    # amplitude 0.002 leaves trend/scatter 0.8-1.0 (misfit False), 0.01 leaves 3.7-3.8 (misfit True)
    assert want["p"] < 1e-3                       # the planted trend is found (measured 6e-6 .. 4e-32)
    ratio = want["trend_rms"] / want["scatter_rms"]
    assert got["misfit"] == (want["p"] < MISFIT_P and ratio >= MISFIT_RATIO
                             and want["trend_rms"] >= MISFIT_FLOOR)


def test_goodness_of_fit_p_is_uniform_under_a_correct_law():
    """Planted: residuals of pure Gaussian noise (a correct law) at 40 fixed points of the chinchilla law's
    inputs, 1000 draws. Truth: F ~ F(5, 34) exactly, so p ~ Uniform(0, 1): KS p > 0.001 and the share of
    p < 0.05 within 4 binomial s.d. (sqrt(0.05 * 0.95 / 1000) = 0.0069, so +/- 0.028) of 0.05."""
    rng = np.random.default_rng(11)
    law = get_law("chinchilla")
    inputs = _design("chinchilla", rng, 40)
    ps = np.array([goodness_of_fit(law, inputs, 0.01 * rng.standard_normal(40))["p_value"]
                   for _ in range(1000)])
    ks = stats.kstest(ps, "uniform")
    assert ks.pvalue > 1e-3, ks                   # measured 0.21
    assert abs(np.mean(ps < 0.05) - 0.05) < 4 * math.sqrt(0.05 * 0.95 / 1000)    # measured 0.046
