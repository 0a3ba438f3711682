"""Reported numbers against planted truths computed here, never from the code under test.

1. ``simulate``'s per-budget statistics (``scaling.design.simulate._rows``) on hand-made trial
   outcomes whose coverage, power and median interval width are counted by hand.
2. ``savings``' loss gap and tokens per parameter for two chinchilla laws under C = 6 N D, against
   the closed-form compute-optimal allocation written out in this file.
3. ``fit``'s ``a_data`` (the frontier exponent across the data's compute where F(N) is not k N)
   against the chord of log N*(C) of the planted family of tests/test_token_cost.py, N* found here
   from the first-order condition.
4. ``sweep --dry-run --json``: train tokens, FLOPs and GPU-hours per run against the optimizer
   steps the trainer takes (``round(D / tokens_per_step)``, WSD cooldowns of max(1, round(f S))).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import test_token_cost as T
from scipy.optimize import brentq
from typer.testing import CliRunner

from cli import app
from scaling.accounting.costs import costs
from scaling.design.simulate import _Outcomes, _rows
from scaling.fitting.result import FitSet
from scaling.training.sweep.plan import load_plan

runner = CliRunner()
nan = math.nan


# -- 1. simulate: coverage, power, median CI width ---------------------------------------------------
def _outcomes(est, lo, hi) -> _Outcomes:
    est = np.asarray(est, dtype=float).T   # given per budget (rows); _Outcomes holds (trials, budgets)
    return _Outcomes(est=est, lo=np.asarray(lo, dtype=float).T, hi=np.asarray(hi, dtype=float).T,
                     extrap=[None] * est.shape[1], identified={})


def _truth(*savings_):
    return SimpleNamespace(rows=[SimpleNamespace(budget=1e20 * (i + 1), sparsity=None, savings=s)
                                 for i, s in enumerate(savings_)])


def test_simulate_row_statistics_are_the_hand_counts():
    """Planted: 5 trials at 3 budgets with known true savings and hand-made intervals.

    Budget 0 (s = 0.2): trial 4's savings failed there (NaN), so by ``_run_trials``' docstring it is
    counted out of that row only (n_trials 4, n_failed 1), not as a miss. Of the other 4: trials
    0, 1, 2 cover s (trial 2's upper bound 5e-8 below s, inside the documented 1e-7 slack; trial
    3's 2e-7 below, outside) -> coverage 3/4; lo > 0 in trials 0 and 1 only (trial 2's lo = 0
    exactly does not exclude 0) -> power 2/4; widths 0.30, 0.25, 0.2 - 5e-8, 0.5 - 2e-7 -> median
    (0.25 + 0.30) / 2 = 0.275. Estimates 0.25, 0.18, 0.05, 0.0: mean 0.12, median 0.115, sign
    recovery 3/4 (sign(0) is not sign(0.2)), rmse sqrt(0.0654 / 4), spread sqrt(0.0398 / 3).
    Budget 1 (s = -0.1): all 5 trials, the failed one of budget 0 included -> coverage 3/5, power
    is "hi < 0" (the side of s): trials 0 and 2 (trial 1's hi = 0 does not) -> 2/5; median width
    0.23; sign recovery 4/5. Budget 2 (s = 0): no power and no sign recovery (None), coverage 4/5.
    """
    S = 0.2
    est = [[0.25, 0.18, 0.05, 0.0, nan],
           [-0.12, -0.05, -0.20, 0.03, -0.09],
           [0.01, -0.02, 0.03, 0.2, 0.0]]
    lo = [[0.10, 0.05, 0.0, -0.3, nan],
          [-0.30, -0.20, -0.35, -0.08, -0.25],
          [-0.05, -0.1, -0.01, 0.1, -0.02]]
    hi = [[0.40, 0.30, S - 5e-8, S - 2e-7, nan],
          [-0.01, 0.0, -0.15, 0.15, 0.05],
          [0.05, 0.02, 0.07, 0.3, 0.02]]
    rows = _rows(_truth(S, -0.1, 0.0), _outcomes(est, lo, hi), trials=5, n_bootstrap=50)
    assert len(rows) == 3
    r0, r1, r2 = rows

    assert (r0.true_savings, r0.n_trials, r0.n_failed) == (S, 4, 1)
    assert r0.coverage == pytest.approx(0.75, abs=1e-15)
    assert r0.power == pytest.approx(0.5, abs=1e-15)
    assert r0.median_ci_width == pytest.approx(0.275, rel=1e-12)
    assert r0.mean_savings == pytest.approx(0.12, rel=1e-12)
    assert r0.median_savings == pytest.approx(0.115, rel=1e-12)
    assert r0.bias == pytest.approx(-0.08, rel=1e-12)
    assert r0.sign_recovery == pytest.approx(0.75, abs=1e-15)
    assert r0.rmse == pytest.approx(math.sqrt(0.0654 / 4), rel=1e-12)
    assert r0.spread == pytest.approx(math.sqrt(0.0398 / 3), rel=1e-12)
    assert r0.estimates == (0.25, 0.18, 0.05, 0.0)

    assert (r1.n_trials, r1.n_failed) == (5, 0)
    assert r1.coverage == pytest.approx(0.6, abs=1e-15)
    assert r1.power == pytest.approx(0.4, abs=1e-15)
    assert r1.median_ci_width == pytest.approx(0.23, rel=1e-12)
    assert r1.sign_recovery == pytest.approx(0.8, abs=1e-15)

    assert r2.power is None and r2.sign_recovery is None
    assert r2.coverage == pytest.approx(0.8, abs=1e-15)     # trial 3's [0.1, 0.3] misses 0


def test_simulate_power_shown_drops_the_trials_savings_would_withhold():
    """Planted: budget 0 of the test above (s = 0.2, power 2/4) with trials 0 and 3 withheld (as
    ``savings`` would, an unidentified law beyond the data). Of the two trials whose interval
    excludes 0 (0 and 1) only trial 1 is shown: power shown 1/4; power and every estimate statistic
    keep all 4 trials; a withheld trial whose savings failed (4) is not counted."""
    est, lo, hi = [[0.25, 0.18, 0.05, 0.0, nan]], [[0.10, 0.05, 0.0, -0.3, nan]], [[0.4, 0.3, 0.1, 0.1, nan]]
    out = _outcomes(est, lo, hi)
    out.withheld = np.array([[True], [False], [False], [True], [True]])
    (r,) = _rows(_truth(0.2), out, trials=5, n_bootstrap=50)
    assert (r.n_trials, r.n_withheld) == (4, 2)
    assert r.power == pytest.approx(0.5, abs=1e-15) and r.power_shown == pytest.approx(0.25, abs=1e-15)
    assert r.mean_savings == pytest.approx(0.12, rel=1e-12)


def test_simulate_row_without_every_interval_reports_no_interval_statistics():
    """Planted: 4 trials with finite estimates at s = 0.2, one of them without an interval (its
    resamples gave none). The code's rule (not spelled out in the module doc): coverage, power and
    width are None for that row rather than computed over the trials that have one; the estimate
    statistics still use all 4 (mean (0.1 + 0.2 + 0.3 + 0.4) / 4 = 0.25). Without a bootstrap
    (n_bootstrap = 0) no interval statistic is reported either."""
    est = [[0.1, 0.2, 0.3, 0.4]]
    lo, hi = [[0.0, 0.1, nan, 0.3]], [[0.3, 0.3, nan, 0.5]]
    (row,) = _rows(_truth(0.2), _outcomes(est, lo, hi), trials=4, n_bootstrap=50)
    assert (row.coverage, row.power, row.median_ci_width) == (None, None, None)
    assert row.n_trials == 4 and row.n_failed == 0
    assert row.mean_savings == pytest.approx(0.25, rel=1e-12)
    full_lo, full_hi = [[0.0, 0.1, 0.1, 0.3]], [[0.3, 0.3, 0.5, 0.5]]
    (row,) = _rows(_truth(0.2), _outcomes(est, full_lo, full_hi), trials=4, n_bootstrap=0)
    assert (row.coverage, row.power, row.median_ci_width) == (None, None, None)


# -- 2. savings: loss gap and D/param of chinchilla laws, C = 6 N D ----------------------------------
CHIN = {"E": 1.8, "alpha": 0.34, "B": 410.0, "beta": 0.28}
A_REF, A_CAND = 400.0, 300.0
SAVINGS_BUDGETS = (1e18, 3e20, 1e22, 5e23)


def _chinchilla_optimum(A: float, C: float) -> tuple[float, float, float]:
    """(N*, D*, L*) of L = E + A N^-a + B D^-b under C = 6 N D (Hoffmann et al. 2022, eq. 4)."""
    a, b, B, E = CHIN["alpha"], CHIN["beta"], CHIN["B"], CHIN["E"]
    G = (a * A / (b * B)) ** (1.0 / (a + b))
    N = G * (C / 6.0) ** (b / (a + b))
    D = (C / 6.0) / N
    return N, D, E + A * N ** -a + B * D ** -b


def _write_fits(path: Path) -> Path:
    """A fits file holding exactly the planted laws (k = 6: C = 6 N D, no e, c terms)."""
    doc = {"schema": "smelt-scale.fit/2", "fits": {
        g: {"law": "chinchilla", "params": {**CHIN, "A": A}, "n_points": 12,
            "data_summary": {"flops_per_param_k": 6.0}, "diagnostics": {"identified": True}}
        for g, A in (("baseline", A_REF), ("smelt", A_CAND))}}
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("at", ["candidate", "reference"])
def test_savings_loss_gap_and_tokens_per_param_are_the_closed_form(tmp_path, at):
    """Planted: reference and candidate chinchilla laws differing only in A (400 vs 300), C = 6 N D.
    The code reports, under either convention (``SavingsRow``): loss_gap = L*_ref(C) - L*_cand(C)
    at equal compute C = the budget, tokens_per_param = D*/N* of the reference's optimum at C and
    candidate_tokens_per_param = D*/N* of the candidate's optimum at C (the convention only decides
    which side the budget C is and so the savings, not these three). Truth: the closed-form optimum
    N* = G (C/6)^(b/(a+b)), G = (a A / (b B))^(1/(a+b)), D* = (C/6)/N*; L* = E + A N*^-a + B D*^-b.
    With only A differing, L* - E is proportional to A^(b/(a+b)) C^-(ab/(a+b)), so the saving is the
    same at every budget: 1 - (A_cand / A_ref)^(1/alpha) (candidate-budget) and the same number
    (reference-budget), and the reported matched compute follows from it."""
    fits = _write_fits(tmp_path / "fits.json")
    budgets = ",".join(f"{c:g}" for c in SAVINGS_BUDGETS)
    res = runner.invoke(app, ["savings", "--fits", str(fits), "--budgets", budgets, "--method", "law",
                              "--at", at, "--json"])
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["convention"] == f"{at}-budget"
    rows = doc["rows"]
    assert [r["budget"] for r in rows] == list(SAVINGS_BUDGETS)
    s_true = 1.0 - (A_CAND / A_REF) ** (1.0 / CHIN["alpha"])
    for r, C in zip(rows, SAVINGS_BUDGETS):
        n_r, d_r, l_r = _chinchilla_optimum(A_REF, C)
        n_c, d_c, l_c = _chinchilla_optimum(A_CAND, C)
        assert l_r - l_c > 0
        assert r["loss_gap"] == pytest.approx(l_r - l_c, rel=1e-9)
        assert r["tokens_per_param"] == pytest.approx(d_r / n_r, rel=1e-9)
        assert r["candidate_tokens_per_param"] == pytest.approx(d_c / n_c, rel=1e-9)
        assert r["savings"] == pytest.approx(s_true, rel=1e-9)
        if at == "candidate":
            assert r["candidate_loss"] == pytest.approx(l_c, rel=1e-12)
            assert r["reference_compute"] == pytest.approx(C / (1.0 - s_true), rel=1e-9)
        else:
            assert r["candidate_loss"] == pytest.approx(l_r, rel=1e-12)
            assert r["candidate_compute"] == pytest.approx(C * (1.0 - s_true), rel=1e-9)


# -- 3. fit: a_data across the data's compute -----------------------------------------------------------
def _n_star(C: float, arch: str) -> float:
    """N* of the planted family at budget C: the root in u = log N of dL/du along D = C / F(N),
        -alpha A N^-alpha + beta B D^-beta (k N + e sqrt(N) / 2) / F(N) = 0,
    solved by brentq (d/du log F = (k N + e sqrt(N) / 2) / F)."""
    A = T.ARCH[arch][0]
    k, e, c = T.ARCH[arch][1]
    a, b, B = T.LAW["alpha"], T.LAW["beta"], T.LAW["B"]

    def slope(u: float) -> float:
        N = math.exp(u)
        F = k * N + e * math.sqrt(N) + c
        D = C / F
        return -a * A * N ** -a + b * B * D ** -b * (k * N + 0.5 * e * math.sqrt(N)) / F

    return math.exp(brentq(slope, 0.0, math.log(C / k), xtol=1e-14, rtol=1e-15))


@pytest.fixture(scope="module")
def fit_doc(tmp_path_factory) -> dict:
    runs = T.write_runs(tmp_path_factory.mktemp("truth-a-data") / "runs")
    res = runner.invoke(app, ["fit", str(runs), "--bootstrap", "0", "--json"])
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.parametrize("arch", list(T.ARCH))
def test_fit_a_data_is_the_chord_of_the_true_frontier(fit_doc, arch):
    """Planted: tests/test_token_cost.py's noise-free family, L = E + A N^-alpha + B D^-beta with
    F(N) = k N + e sqrt(N) + c FLOPs per token, runs at compute exactly T.BUDGETS (3e11 .. 4e12).
    ``a_data`` is defined (``exponent_over_data``, called by the fitter with the min and max of the
    points' total FLOPs) as the endpoint chord (log N*(C_max) - log N*(C_min)) / log(C_max / C_min),
    not a regression over a grid. Truth: that chord with N* from the first-order condition above;
    T.true_optimum (bounded minimisation) agrees with it. The large-budget limit a = beta / (alpha +
    beta) = 0.545 is far from a_data (0.42 and 0.35) here, so the check is not a trivial one. The
    fits file read back (``FitSet.from_dict`` recomputes a_data from compute_min / compute_max)
    gives it too."""
    c_lo, c_hi = float(T.BUDGETS[0]), float(T.BUDGETS[-1])
    n_lo, n_hi = _n_star(c_lo, arch), _n_star(c_hi, arch)
    for C, n in ((c_lo, n_lo), (c_hi, n_hi)):
        assert T.true_optimum(C, arch)[0] == pytest.approx(n, rel=1e-6)
    truth = math.log(n_hi / n_lo) / math.log(c_hi / c_lo)
    entry = fit_doc["fits"][arch]
    assert entry["data_summary"]["compute_min"] == pytest.approx(c_lo, rel=1e-12)
    assert entry["data_summary"]["compute_max"] == pytest.approx(c_hi, rel=1e-12)
    limit = T.LAW["beta"] / (T.LAW["alpha"] + T.LAW["beta"])
    assert entry["derived"]["a"] == pytest.approx(limit, rel=1e-9)
    assert abs(truth - limit) > 0.1
    assert entry["derived"]["a_data"] == pytest.approx(truth, abs=1e-7)
    again = FitSet.from_dict(fit_doc)[arch]
    assert again.derived["a_data"] == pytest.approx(truth, abs=1e-7)


# -- 4. sweep --dry-run: tokens, FLOPs, GPU-hours ---------------------------------------------------------
PLAN = """
[sweep]
name = "truth"
tiers = ["proxy-tiny", "gpu-tiny"]
archs = ["baseline", "smelt"]
seeds = [0]
budgets = {budgets}
runs_dir = "{runs}"

[model."gpu-tiny"]
vocab_size = 512
d_model = 16
n_layers = 2
n_heads = 2
n_kv_heads = 1
head_dim = 24
n_experts = 4
top_k = 2
expert_hidden = 32
seq_len = 64
width_multiple = 1
proxy = false

[train]
batch_size = 4
lr = 3e-3
warmup = 1
decay_fraction = {decay}
device = "cpu"

[executor]
kind = "local"
mfu = 0.37
gpu_peak_flops = 1.5e15
"""
TOKENS_PER_STEP = 4 * 64      # batch_size x seq_len, both tiers
MFU, PEAK = 0.37, 1.5e15


def _steps_trained(budgets, decay: float) -> int:
    """Updates of a WSD run (scaling/training/loop/branches.py's rule, written out): S_i =
    round(D_i / tokens_per_step), trunk to S_n plus a cooldown of K_i = max(1, round(f S_i)) per
    smaller budget."""
    S = sorted(round(d / TOKENS_PER_STEP) for d in budgets)
    return S[-1] + sum(max(1, round(decay * s)) for s in S[:-1])


def _dry_run(tmp_path: Path, budgets, decay: float) -> tuple[dict, dict]:
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN.format(budgets=list(budgets), decay=decay, runs=tmp_path / "runs"))
    res = runner.invoke(app, ["sweep", str(plan), "--dry-run", "--no-probe", "--json"])
    assert res.exit_code == 0, res.output
    models = {r.name: r.model for r in load_plan(plan).runs}
    return json.loads(res.stdout), models


def _check_dry_run(doc: dict, models: dict, tokens: float) -> None:
    assert len(doc["runs"]) == 4
    flops_total = gpu_total = 0.0
    for r in doc["runs"]:
        flops = costs(models[r["run"]]).flops_per_token * tokens
        assert r["tokens"] == pytest.approx(tokens, rel=1e-9), r["run"]
        assert r["flops"] == pytest.approx(flops, rel=1e-9), r["run"]
        if r["tier"] == "proxy-tiny":     # a proxy tier is timed by a probe (off here), not in GPU-hours
            assert r["gpu_hours"] is None
        else:
            assert r["gpu_hours"] == pytest.approx(flops / (MFU * PEAK) / 3600.0, rel=1e-9), r["run"]
            gpu_total += flops / (MFU * PEAK) / 3600.0
        flops_total += flops
    total = doc["total"]
    assert (total["mfu"], total["gpu_peak_flops"], total["runs"]) == (MFU, PEAK, 4)
    assert total["flops"] == pytest.approx(flops_total, rel=1e-9)
    assert total["gpu_hours"] == pytest.approx(gpu_total, rel=1e-9)


def test_sweep_dry_run_on_whole_steps(tmp_path):
    """Planted: budgets 1024, 2048, 5120 tokens at 256 tokens per step (batch 4 x seq_len 64), WSD
    decay fraction 0.25: S = 4, 8, 20 steps, cooldowns K = 1, 2 -> 20 + 1 + 2 = 23 updates = 5888
    tokens per run (budgets that are whole steps and whole cooldowns). FLOPs = flops_per_token of
    the run's model (scaling.accounting.costs, what the dry run multiplies by) x tokens; GPU-hours
    (non-proxy tier only) = FLOPs / (mfu 0.37 x peak 1.5e15) / 3600, the plan's stated values;
    totals are the sums."""
    budgets, decay = (1024, 2048, 5120), 0.25
    assert _steps_trained(budgets, decay) == 23
    doc, models = _dry_run(tmp_path, budgets, decay)
    _check_dry_run(doc, models, 23 * TOKENS_PER_STEP)


def test_sweep_dry_run_counts_the_steps_the_trainer_takes(tmp_path):
    """Planted: budgets 1000, 2600, 5000 tokens at 256 tokens per step, decay fraction 0.2: the
    trainer (BranchPlan.build, trainer's total = total_steps x tokens_per_step) takes S = 4, 10, 20
    steps (3.91, 10.16, 19.53 rounded), cooldowns K = max(1, round(0.8)) = 1 and round(2.0) = 2:
    23 updates = 5888 tokens. Until 2026-12-07 the dry run reported 5000 + 0.2 (1000 + 2600) = 5720
    (-2.9%), and its FLOPs and GPU-hours with it."""
    budgets, decay = (1000, 2600, 5000), 0.2
    assert _steps_trained(budgets, decay) == 23
    doc, models = _dry_run(tmp_path, budgets, decay)
    _check_dry_run(doc, models, 23 * TOKENS_PER_STEP)
