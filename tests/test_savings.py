"""Savings maths: closed-form cases, frontier checks, conventions, intervals, the paper's figures."""

from __future__ import annotations

import numpy as np
import pytest

from scaling.common.errors import UserError
from scaling.fitting.laws import get_law, optimal
from scaling.fitting.reference_laws import LAW_SETS, load_law_set
from scaling.fitting.savings import (
    FittedLaw,
    SavingsResult,
    compute_for_loss,
    frontier,
    frontier_numeric,
    savings,
)

CHIN = get_law("chinchilla")
SMELT = get_law("smelt")
# Epoch's refit of Chinchilla (Besiroglu et al. 2024): a realistic, non-symmetric law.
BASE = {"E": 1.82, "A": 482.0, "alpha": 0.3478, "B": 2085.0, "beta": 0.3658}


def chin(name: str, k: float = 6.0, samples=None, cmax=None, **over) -> FittedLaw:
    return FittedLaw(name=name, law=CHIN, theta=CHIN.theta_array({**BASE, **over}), samples=samples,
                     cost=k, compute_max=cmax)


@pytest.fixture(scope="module")
def paper():
    return load_law_set("paper")


# -- frontier ----------------------------------------------------------------------------
@pytest.mark.parametrize("C", [1e18, 1e21, 1e24])
@pytest.mark.parametrize("k", [6.0, 9.5])
def test_chinchilla_frontier_matches_numeric_minimiser(C, k):
    opt = frontier(CHIN, BASE, C, cost=k)
    n, d, loss = frontier_numeric(CHIN, BASE, C, cost=k)
    assert float(opt.size) == pytest.approx(n, rel=1e-5)
    assert float(opt.tokens) == pytest.approx(d, rel=1e-5)
    assert float(opt.loss) == pytest.approx(loss, rel=1e-12)
    assert float(k * opt.size * opt.tokens) == pytest.approx(C, rel=1e-12)
    assert float(opt.tokens_per_param) == pytest.approx(d / n, rel=1e-5)


@pytest.mark.parametrize("group", ["baseline", "smelt"])
@pytest.mark.parametrize("S", [0.0, 0.85, 0.97])
@pytest.mark.parametrize("C", [1e19, 1e21, 1e23])
def test_smelt_frontier_matches_numeric_minimiser(paper, group, S, C):
    theta = paper.fitted(group).theta
    opt = frontier(SMELT, theta, C, S=S)
    f, d, loss = frontier_numeric(SMELT, theta, C, S=S)
    assert float(opt.size) == pytest.approx(f, rel=1e-5)
    assert float(opt.loss) == pytest.approx(loss, rel=1e-12)
    assert float(opt.size * opt.tokens) == pytest.approx(C, rel=1e-12)
    assert float(opt.tokens_per_param) == pytest.approx(d / (f / 6.0), rel=1e-5)


def test_frontier_agrees_with_law_registry_optimal(paper):
    o = optimal(CHIN, BASE, 1e22, cost=7.0)
    f = frontier(CHIN, BASE, 1e22, cost=7.0)
    assert (float(f.size), float(f.loss)) == pytest.approx((float(o["N"]), float(o["loss"])), rel=1e-12)
    theta = paper.fitted("smelt").theta
    o = optimal(SMELT, theta, 1e21, S=0.95)
    f = frontier(SMELT, theta, 1e21, S=0.95)
    assert (float(f.size), float(f.loss)) == pytest.approx((float(o["F"]), float(o["loss"])), rel=1e-12)


def test_frontier_vectorises_over_resamples_and_budgets():
    thetas = np.stack([CHIN.theta_array({**BASE, "A": a}) for a in (300.0, 482.0, 700.0)])
    C = np.array([1e19, 1e21])
    grid = frontier(CHIN, thetas[:, None, :], C[None, :]).loss
    assert grid.shape == (3, 2)
    for i in range(3):
        for j in range(2):
            assert grid[i, j] == pytest.approx(float(frontier(CHIN, thetas[i], C[j]).loss), rel=1e-14)


def test_compute_for_loss_inverts_the_closed_form_power_law():
    # L*(C) = E + G C^-gamma, gamma = alpha beta / (alpha + beta): C = ((L - E)/G)^(-1/gamma).
    a, b = BASE["alpha"], BASE["beta"]
    gamma = a * b / (a + b)
    L1 = float(frontier(CHIN, BASE, 1e20).loss)
    G = (L1 - BASE["E"]) * 1e20 ** gamma
    target = BASE["E"] + G * 3.7e21 ** -gamma
    c, status = compute_for_loss(CHIN, CHIN.theta_array(BASE), target, 1e21)
    assert int(status) == 0
    assert float(c) == pytest.approx(3.7e21, rel=1e-10)
    # Out of the bracket: below E it is never reached; a loss this high is reached far below.
    _, never = compute_for_loss(CHIN, CHIN.theta_array(BASE), BASE["E"] - 0.01, 1e21)
    _, already = compute_for_loss(CHIN, CHIN.theta_array(BASE), 10.0, 1e21)
    assert (int(never), int(already)) == (1, -1)


def test_compute_for_loss_with_a_nonlinear_flops_model_agrees_with_a_root_of_the_frontier():
    # A CPU-proxy-like F(N) = k N + e sqrt(N) + c (the e, c terms dominate at small N) and
    # bootstrap-like laws: the one-bisection inverse must land where brentq on the frontier's own
    # L*(C) (an independent root finder around the frontier's bisection in N) does.
    from scipy.optimize import brentq

    from scaling.fitting.laws import TokenCost, frontier_by_size

    cost = TokenCost(k=6.0, e=4.0e3, c=2.0e6)
    rng = np.random.default_rng(3)
    thetas = np.stack([CHIN.theta_array({**BASE, "E": BASE["E"] * f, "alpha": BASE["alpha"] * g,
                                         "beta": BASE["beta"] * h})
                       for f, g, h in rng.uniform(0.7, 1.3, size=(6, 3))])
    around = 1e14
    targets = np.array([float(frontier(CHIN, t, c, cost=cost).loss)
                        for t, c in zip(thetas, np.logspace(11, 17, 6))])
    got, status = compute_for_loss(CHIN, thetas, targets, around, cost=cost)
    assert (status == 0).all()
    for t, target, c in zip(thetas, targets, got):
        def excess(logc: float) -> float:
            return float(frontier(CHIN, t, np.exp(logc), cost=cost).loss) - target

        ref = np.exp(brentq(excess, np.log(around) - 14.0, np.log(around) + 14.0, xtol=1e-13, rtol=1e-15))
        assert c == pytest.approx(ref, rel=1e-9)
        assert float(frontier(CHIN, t, c, cost=cost).loss) == pytest.approx(target, rel=1e-12)
    # the size-parametrised frontier is the frontier: its budget's optimum is that size, at that loss
    log_c, loss = frontier_by_size(CHIN, thetas[0], np.log(3e4), cost=cost)
    f = frontier(CHIN, thetas[0], np.exp(log_c), cost=cost)
    assert (float(f.size), float(f.loss)) == pytest.approx((3e4, float(loss)), rel=1e-10)
    # a target no law reaches, or no target, is not answered with a number
    c, status = compute_for_loss(CHIN, thetas[:2], np.array([np.nan, 0.5]), around, cost=cost)
    assert np.isnan(c[0]) and (int(status[0]), int(status[1])) == (0, 1)
    assert c[1] == pytest.approx(around * 1e6)


def test_compute_for_loss_agrees_with_bisection_in_compute_on_wild_bootstrap_laws():
    # Bootstrap resamples reach any exponent: wherever the explicit root cannot be trusted (the
    # frontier clamps its optimum below one token; overflow) the answer must still be the bisection
    # in log C around the frontier's own L*(C), which it was before the explicit form.
    from scaling.fitting.laws import TokenCost
    from scaling.fitting.savings import _bisect_compute

    cost = TokenCost(k=6.0, e=4.0e3, c=2.0e6)
    # a law whose optimum at this budget has under one token: the frontier clamps it
    clamped = np.array([2.305, 78465.0, 0.2763, 105.8, 0.4891])
    target = float(frontier(CHIN, clamped, 1.94e8, cost=cost).loss)
    c = float(compute_for_loss(CHIN, clamped, target, 1e14, cost=cost)[0])
    assert c == pytest.approx(1.94e8, rel=1e-9)
    rng = np.random.default_rng(0)
    n = 3000
    thetas = np.column_stack([rng.uniform(0.01, 4, n), 10 ** rng.uniform(-1, 6, n), rng.uniform(1e-3, 1.5, n),
                              10 ** rng.uniform(-1, 6, n), rng.uniform(1e-3, 1.5, n)])
    for k in (cost, 6.0):
        targets = frontier(CHIN, thetas, 10 ** rng.uniform(8, 22, n), cost=k).loss
        around = 10 ** rng.uniform(10, 20, n)
        got, status = compute_for_loss(CHIN, thetas, targets, around, cost=k)
        lo = np.log(around) - 6 * np.log(10.0)
        want = _bisect_compute(CHIN, thetas, targets, lo, lo + 12 * np.log(10.0), k, None)
        inside = status == 0
        assert inside.mean() > 0.5
        # where L* is distinguishable from its floor E, the compute is determined and both agree
        steep = inside & (targets - thetas[:, 0] > 1e-9 * targets)
        assert np.abs(np.log(got[steep]) - want[steep]).max() < 1e-6
        reached = frontier(CHIN, thetas[inside], got[inside], cost=k).loss
        assert np.abs(reached / targets[inside] - 1).max() < 1e-9


# -- closed-form savings -------------------------------------------------------------------
@pytest.mark.parametrize("convention", ["candidate-budget", "reference-budget"])
def test_laws_differing_only_in_A_give_the_hand_derived_savings(convention):
    # A2/N^alpha = A1/(m N)^alpha with m = (A1/A2)^(1/alpha): the candidate is the reference
    # with m times the parameters for free, i.e. with m times the compute (C = 6 N D), so
    # C_ref = m C at every budget and savings = 1 - 1/m = 1 - (A2/A1)^(1/alpha) in both conventions.
    a1, a2 = 482.0, 400.0
    expect = 1.0 - (a2 / a1) ** (1.0 / BASE["alpha"])
    res = savings(chin("ref", A=a1), chin("cand", A=a2), [1e18, 1e21, 1e24], convention=convention)
    for row in res.rows:
        assert row.savings == pytest.approx(expect, abs=1e-10)
        ratio = row.reference_compute / row.candidate_compute
        assert ratio == pytest.approx((a1 / a2) ** (1 / BASE["alpha"]), rel=1e-10)
        assert row.loss_gap > 0
    assert res.savings_range == pytest.approx((expect, expect), abs=1e-10)
    assert res.convention == convention


def test_identical_laws_save_nothing():
    res = savings(chin("a"), chin("b"), [1e19, 1e22])
    for row in res.rows:
        assert row.savings == pytest.approx(0.0, abs=1e-12)
        assert row.loss_gap == pytest.approx(0.0, abs=1e-15)
        assert row.reference_compute == pytest.approx(row.budget, rel=1e-12)
        assert row.tokens_per_param == pytest.approx(row.candidate_tokens_per_param, rel=1e-12)


def test_more_flops_per_parameter_costs_compute():
    # Same law, candidate spends 9 FLOPs per parameter-token instead of 6: at compute C its
    # N*D is C/9, which the reference gets with C_ref = 6 C / 9, so savings = 1 - 9/6 = -0.5.
    res = savings(chin("ref", k=6.0), chin("looped", k=9.0), [1e20])
    assert res.rows[0].savings == pytest.approx(-0.5, abs=1e-10)
    assert res.rows[0].loss_gap < 0


def test_conventions_relate_through_the_matching_compute(paper):
    # g(C) = reference compute matching the candidate at C. The candidate-budget savings at C
    # equal the reference-budget savings at budget g(C), and the candidate needs C there.
    ref, cand = paper.fitted("baseline"), paper.fitted("smelt")
    at_cand = savings(ref, cand, [1e19, 1e21, 1e23], sparsities=[0.9])
    g = [r.reference_compute for r in at_cand.rows]
    at_ref = savings(ref, cand, g, sparsities=[0.9], convention="reference-budget")
    for rc, rr in zip(at_cand.rows, at_ref.rows):
        assert rr.savings == pytest.approx(rc.savings, abs=1e-9)
        assert rr.candidate_compute == pytest.approx(rc.budget, rel=1e-9)
        assert rr.candidate_loss == pytest.approx(rc.candidate_loss, rel=1e-12)
    # And at the same budget the savings differ (the gain grows with C here, so the
    # reference-budget figure, read at a lower candidate compute, is smaller).
    same = savings(ref, cand, [1e21], sparsities=[0.9], convention="reference-budget")
    assert same.rows[0].savings < at_cand.rows[1].savings


def test_reference_that_never_reaches_the_loss_is_an_error():
    with pytest.raises(UserError, match="never reaches"):
        savings(chin("ref", E=2.5), chin("cand"), [1e22])
    with pytest.raises(UserError, match="never reaches"):
        savings(chin("ref"), chin("cand", E=2.5), [1e22], convention="reference-budget")


@pytest.mark.parametrize("bad", [0.0, -1e20, float("nan"), float("inf")])
def test_bad_budget_is_an_error(bad):
    with pytest.raises(UserError, match="positive"):
        savings(chin("a"), chin("b"), [bad])


def test_sparsity_rules(paper):
    with pytest.raises(UserError, match="sparsity"):
        savings(paper.fitted("baseline"), paper.fitted("smelt"), [1e21])
    with pytest.raises(UserError, match=r"\[0, 1\)"):
        savings(paper.fitted("baseline"), paper.fitted("smelt"), [1e21], sparsities=[1.0])
    with pytest.raises(UserError, match="only to smelt-form"):
        savings(chin("a"), chin("b"), [1e21], sparsities=[0.9])


# -- intervals and extrapolation -------------------------------------------------------------
def _samples(rng, theta: dict, K: int, sd: float = 0.03) -> np.ndarray:
    base = CHIN.theta_array(theta)
    return base * np.exp(sd * rng.standard_normal((K, base.size)))


def test_interval_is_the_percentile_of_paired_per_resample_savings():
    rng = np.random.default_rng(0)
    sr, sc = _samples(rng, BASE, 60), _samples(rng, {**BASE, "A": 420.0}, 60)
    ref, cand = chin("ref", samples=sr), chin("cand", samples=sc, A=420.0)
    res = savings(ref, cand, [1e21], level=0.9)
    row = res.rows[0]
    one_by_one = [savings(chin("r", **CHIN.as_dict(a)), chin("c", **CHIN.as_dict(b)), [1e21]).rows[0].savings
                  for a, b in zip(sr, sc)]
    assert row.savings_ci == pytest.approx(tuple(np.quantile(one_by_one, [0.05, 0.95])), abs=1e-9)
    assert row.ci_resamples == 60 and row.ci_clamped == 0
    assert row.savings_ci[0] < row.savings < row.savings_ci[1]
    # Pairing is by index: shuffling one group's resamples changes the interval.
    shuffled = savings(ref, chin("cand", samples=sc[::-1], A=420.0), [1e21], level=0.9).rows[0]
    assert shuffled.savings_ci != pytest.approx(row.savings_ci, abs=1e-9)


def test_no_interval_without_both_bootstraps():
    rng = np.random.default_rng(1)
    res = savings(chin("ref", samples=_samples(rng, BASE, 20)), chin("cand"), [1e21])
    assert res.rows[0].savings_ci is None
    assert any("no bootstrap" in w for w in res.warnings)


def test_resamples_out_of_bracket_are_clamped_and_counted():
    rng = np.random.default_rng(2)
    sr = _samples(rng, BASE, 40)
    sr[:3, 0] = 3.0  # E above the candidate's loss: these resamples never reach it
    res = savings(chin("ref", samples=sr), chin("cand", samples=_samples(rng, BASE, 40)), [1e21])
    row = res.rows[0]
    assert row.ci_clamped == 3
    assert np.isfinite(row.savings_ci).all()
    assert any("clamped" in w for w in res.warnings)


def test_extrapolation_decades_and_warning():
    res = savings(chin("ref", cmax=1e19), chin("cand", cmax=1e20, A=400.0), [1e20, 1e22])
    near, far = res.rows
    # The reference is evaluated at C_ref > C, so its distance from 1e19 dominates.
    assert near.extrapolation_decades == pytest.approx(np.log10(near.reference_compute / 1e19), rel=1e-12)
    assert far.extrapolation_decades > 3
    assert any("extrapolate" in w for w in res.warnings)
    assert savings(chin("a"), chin("b"), [1e20]).rows[0].extrapolation_decades is None


def test_result_round_trips_through_dict():
    res = savings(chin("ref"), chin("cand", A=400.0), [1e20, 1e21])
    back = SavingsResult.from_dict(res.to_dict())
    assert back == res
    assert "candidate-budget" in res.summary()


# -- the paper's reference laws -------------------------------------------------------------------
def test_law_set_registry(paper):
    assert "paper" in LAW_SETS
    assert set(paper.groups) == {"baseline", "smelt"}
    assert "2609.01343" in paper.citation and "reading notes" in paper.provenance
    with pytest.raises(UserError, match="unknown law set"):
        load_law_set("nope")
    with pytest.raises(UserError, match="unknown group"):
        paper.fitted("dense")


def test_paper_frontier_exponents(paper):
    for group, published in paper.published["frontier_exponent"].items():
        d = SMELT.derive(paper.fitted(group).theta)
        assert d["frontier_exponent"] == pytest.approx(published, abs=5e-4)


# Expected per sparsity: the reading notes' own computation from these coefficients
# (shared/reference/smelt_paper.md), 9.9/7.7/6.7% and 17.9/15.7/14.6%.
NOTES = {1e20: (0.099, 0.077, 0.067), 1e21: (0.179, 0.157, 0.146)}


def test_paper_savings_reproduce_the_published_figures(paper):
    res = savings(paper.fitted("baseline"), paper.fitted("smelt"), [1e20, 1e21], sparsities=paper.sparsities)
    assert paper.sparsities == (0.85, 0.95, 0.97)
    by = {(r.budget, r.sparsity): r for r in res.rows}
    for budget, expected in NOTES.items():
        got = [by[(budget, s)].savings for s in paper.sparsities]
        assert got == pytest.approx(expected, abs=0.003)
        lo, hi = paper.published["savings_range"][f"{budget:.0e}".replace("+", "")]
        assert lo - 0.003 <= min(got) and max(got) <= hi + 0.003
    # Tokens per dense-equivalent parameter D/(F/6) at 1e21: 56/78/91 (reference = Baseline);
    # SMELT's own optimum lies inside the published 56-91 range (reported as the same).
    tpp = [by[(1e21, s)].tokens_per_param for s in paper.sparsities]
    assert tpp == pytest.approx((56, 78, 91), abs=1.0)
    lo, hi = paper.published["tokens_per_param_range"]["1e21"]
    for s in paper.sparsities:
        assert lo - 1 <= by[(1e21, s)].candidate_tokens_per_param <= hi + 1
    # Inside the fitted range (1.3e19 to 2.2e21): no extrapolation at 1e21.
    assert all(r.extrapolation_decades < 0 for r in res.rows)


def test_paper_reference_budget_convention_is_lower(paper):
    # The notes: "about 0.4-0.6 points less"; measured here 0.26-0.57 points across the six cells.
    kw = dict(sparsities=paper.sparsities)
    a = savings(paper.fitted("baseline"), paper.fitted("smelt"), [1e20, 1e21], **kw)
    b = savings(paper.fitted("baseline"), paper.fitted("smelt"), [1e20, 1e21], convention="reference-budget",
                **kw)
    for ra, rb in zip(a.rows, b.rows):
        assert 0.002 <= ra.savings - rb.savings <= 0.007


def test_paper_extrapolated_1e22(paper):
    res = savings(paper.fitted("baseline"), paper.fitted("smelt"), [1e22], sparsities=paper.sparsities)
    assert res.savings_range[1] == pytest.approx(paper.published["savings_extrapolated"]["1e22"], abs=0.003)
    assert all(0 < r.extrapolation_decades < 1 for r in res.rows)


def test_the_savings_speed_benchmark_compares_equal_answers(bench):
    # benchmarks/savings_speed.py times the inverse against the bisection in C it replaced; at a
    # tiny size its two answers must still be the same roots
    from scaling.fitting.laws import TokenCost

    speed = bench("savings_speed")
    for cost in (TokenCost(k=13.4, e=495.0, c=1.25e6), TokenCost(k=6.0)):
        out = speed.case(cost, resamples=4, budgets=3, repeat=1)
        assert out["roots"] == 12 and out["max_dlogc"] < 1e-9
        assert out["ours_s"] > 0 and out["reference_s"] > 0


def test_budgets_no_law_answers_each_keep_their_own_reason():
    # a reference whose floor E (2.5) lies above the candidate's losses at large budgets never
    # reaches them: both budgets go unanswered, and each row says so of its own budget and loss
    from scaling.fitting.savings_answer import law_savings

    ref, cand = chin("baseline", E=2.5), chin("smelt", E=1.0)
    res, unanswered = law_savings(ref, cand, np.array([1e22, 1e24]))
    assert res.rows == () and [r.budget for r in unanswered] == [1e22, 1e24]
    for r in unanswered:
        assert r.savings is None and r.method == "law" and r.refusal == "not-reached"
        assert "never reaches the other's loss" in r.reason and f"above budget {r.budget:.3g}" in r.reason
        loss = frontier(CHIN, cand.theta, np.array(r.budget), cost=6.0).loss
        assert f"loss {float(loss):.4f}" in r.reason
    # one budget the laws answer and one they do not: the answered one has its number
    res, unanswered = law_savings(ref, cand, np.array([1e12, 1e24]))
    assert [r.budget for r in res.rows] == [1e12] and res.rows[0].savings is not None
    assert [r.budget for r in unanswered] == [1e24]
    # the error that carries those rows survives a process pool (pickled by its rows)
    import pickle

    from scaling.fitting.savings_sweep import NoBudgetAnswered

    err = NoBudgetAnswered(unanswered)
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == str(err) and [(r.budget, r.reason, r.refusal) for r in back.skipped] == [
        (r.budget, r.reason, r.refusal) for r in err.skipped]


def test_a_law_past_the_bracket_below_is_already_beaten_not_unreached():
    """A candidate with 10^6 times the reference's A (far worse): the reference reaches its loss at
    1e20 with more than 6 decades less compute, 'already-beaten' (past the bracket below), which
    is not 'not-reached'; the error pickles with its kind; bad input stays an error for all."""
    import pickle

    from scaling.fitting.savings import Unmatched
    from scaling.fitting.savings_answer import law_savings

    ref, cand = chin("baseline"), chin("smelt", A=1e6)
    with pytest.raises(Unmatched) as info:
        savings(ref, cand, [1e20])
    assert info.value.refusal == "already-beaten" and "already beats the other's loss" in str(info.value)
    back = pickle.loads(pickle.dumps(info.value))
    assert (back.refusal, back.budget, str(back)) == ("already-beaten", 1e20, str(info.value))
    res, unanswered = law_savings(ref, cand, np.array([1e12, 1e20]))
    assert res.rows == () and [(r.budget, r.refusal) for r in unanswered] == [
        (1e12, "already-beaten"), (1e20, "already-beaten")]
    with pytest.raises(UserError, match="positive number of FLOPs") as bad:
        law_savings(ref, cand, np.array([1e12, -1.0]))
    assert not isinstance(bad.value, Unmatched)


def test_a_rows_clamped_resamples_are_its_own_warnings_and_leave_with_it():
    """``savings`` files the clamped-resample warning under its row as well as the result's; a row
    withheld beyond an unidentified law's data takes it along, the answered row keeps its own."""
    from dataclasses import replace

    from scaling.fitting.savings import withhold_unidentified

    rng = np.random.default_rng(2)
    sr = _samples(rng, BASE, 40)
    sr[:3, 0] = 3.0  # E above the candidate's loss at 1e21: these resamples never reach it
    ref = chin("ref", samples=sr, cmax=1e22)
    cand = replace(chin("cand", samples=_samples(rng, BASE, 40), cmax=1e19), unidentified="E on its bound")
    res = savings(ref, cand, [1e18, 1e21])
    near, far = res.rows
    assert (near.ci_clamped, far.ci_clamped) == (0, 3) and near.warnings == ()
    assert len(far.warnings) == 1 and "in 3 of 40 resamples" in far.warnings[0]
    assert far.warnings[0] in res.warnings
    kept = withhold_unidentified(res, ref, cand)
    assert kept.rows[0] == near and kept.rows[1].refusal == "unidentified-far"
    assert far.warnings[0] not in kept.warnings and kept.rows[1].warnings == ()
