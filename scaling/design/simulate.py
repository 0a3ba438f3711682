"""Is a planned study big enough? Monte Carlo of fit -> savings on synthetic losses from known laws.

Per trial, for each architecture (group) with a known law (its ``FittedLaw``, the *truth*):

    loss_i = L_true(x_i) * exp(noise * z_i),   z_i ~ N(0, 1) independent,

at the design's points x_i ((N, D) or (F, S, D)): multiplicative lognormal noise, ``noise`` the
standard deviation of log loss (0.01 is about 1% scatter). Points of one run (the cooldown
branches of one WSD trunk, or the budgets of one schedule) are not independent in a real study:
they share the trunk, its data order and its initialisation. ``run_share`` = rho puts that share
of the variance on the run: z_i = sqrt(rho) u_run(i) + sqrt(1 - rho) e_i, u and e independent
N(0, 1), the same marginal sd; rho = 0 (the default) is the independent model above and draws
the same numbers as before the option existed. Independent noise overstates what a branch design
can tell: errors shared by a run's points do not average out over its branches, so the spread of
the estimates grows and the power falls (tests/test_simulate.py plants it).

Each group is fitted with the real
fitter (``scaling.fitting.fit.fit_law``: Huber on log loss, bootstrap over runs), and the savings at the
given budgets come from the real savings code (``scaling.fitting.savings.savings``, candidate-budget
convention, paired bootstrap interval). Over trials, per budget and sparsity, with s the true
savings (the same code on the truth) and s_hat the estimates:

- sign recovery: fraction of trials with sign(s_hat) = sign(s) (None when s = 0);
- power: fraction whose interval excludes 0 on the side of s;
- bias = mean(s_hat) - s, spread = std(s_hat) (ddof 1), rmse = sqrt(mean((s_hat - s)^2));
- median CI width: median of hi - lo over trials (robust to the odd trial whose reference
  never reaches the matched loss, where savings run off towards -inf);
- coverage: fraction of intervals [lo, hi] with lo - 1e-7 <= s <= hi + 1e-7 (the slack absorbs
  float round-off of zero-width intervals at zero noise), to compare with the nominal level;
- withheld: trials whose estimate ``smelt-scale savings`` would not print
  (``scaling.fitting.savings.withhold_unidentified`` at its default limit: a law not identified, or
  misfitting, and the budget outside the data); the statistics above still count them (they
  describe the fit), but power shown = fraction whose interval excludes 0 on the side of s *and*
  which ``savings`` would print: the chance that the study gives a user a result.

A trial's identification is judged at the observed share of bootstrap refits on a bound
(``identified_at_observed_share``): its 50 resamples are too few to bound that share the way
``fit``'s 200 do, so the full verdict would call nearly every trial unidentified. Without a
bootstrap (``n_bootstrap = 0``) that is the point fit's part of the verdict alone, as for
``identified_rate``; ``savings`` on a fit without a bootstrap would withhold more.

For chinchilla-form laws the compute C = F(N) D uses the truth's per-token FLOPs F for the fitted
laws too, so the savings error measures the fit alone, not a different F of the design's configs.

Starts. ``starts="grid"`` runs the fitter's full multi-start grid in every trial (what
``smelt-scale fit`` does; seconds per fit). ``starts="warm"`` (default) fits the noise-free
design once with the full grid and starts each trial's fit from that optimum, as the fitter's
own bootstrap starts every resample from the full-data optima; ``check_starts`` trials are
refitted from the full grid as well and the result says whether the grid ever found a lower
objective.

Seeds: trial t draws its noise and its bootstrap seed from ``numpy.random.default_rng([seed, t])``,
so a result is reproducible and trial t is the same whatever the number of trials.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from scaling.common.errors import UserError
from scaling.common.format import percent
from scaling.common.serialize import Record
from scaling.fitting.fit import FitResult, fit_law
from scaling.fitting.savings import (
    FittedLaw,
    SavingsResult,
    check_budgets,
    savings,
    uses_sparsity,
    withhold_unidentified,
)
from scaling.fitting.savings_sweep import NoBudgetAnswered, savings_over
from scaling.fitting.settings import FitSettings
from scaling.fitting.tables import group_rows, law_inputs

STARTS = ("warm", "grid")
COVERAGE_SLACK = 1e-7
# what a trial's "identified" means (``SimulationResult.identified_rate``), without and with a bootstrap
IDENTIFIED_BASIS = (
    "point fit only (no bootstrap: the share of refits on a bound is not checked)",
    "the fitter's verdict at the observed share of bootstrap refits on a bound",
)
SIMULATION_FIT = FitSettings(n_bootstrap=50)   # a smaller bootstrap than ``fit``'s: it runs once per trial


def true_losses(truth: FittedLaw, points: pd.DataFrame) -> np.ndarray:
    """Noise-free losses of the truth law at canonical points (nats/token)."""
    X = law_inputs(points, truth.law.inputs, source=f"design of {truth.name}")
    return truth.law.predict(truth.theta, **X)


def noisy(loss: np.ndarray, noise: float, rng: np.random.Generator, runs: Sequence[Any] | None = None,
          run_share: float = 0.0) -> np.ndarray:
    """loss * exp(noise * z), z standard normal: multiplicative lognormal noise; with ``run_share``
    rho > 0, z = sqrt(rho) u_run + sqrt(1 - rho) e over the points' ``runs`` (module doc)."""
    z = rng.standard_normal(np.shape(loss))
    if run_share > 0:
        labels, idx = np.unique(np.asarray(runs, dtype=str), return_inverse=True)
        u = rng.standard_normal(len(labels))
        z = math.sqrt(run_share) * u[idx] + math.sqrt(1.0 - run_share) * z
    return loss * np.exp(noise * z)


@dataclass(frozen=True)
class SimulationRow(Record):
    """Recovery of the savings at one budget (and sparsity) over the successful trials."""

    budget: float
    sparsity: float | None
    true_savings: float
    n_trials: int
    mean_savings: float
    median_savings: float
    bias: float
    spread: float
    rmse: float
    sign_recovery: float | None
    power: float | None
    coverage: float | None
    median_ci_width: float | None
    extrapolation_decades: float | None
    estimates: tuple[float, ...] = ()
    n_failed: int = 0   # trials whose fit, or whose savings at this budget, failed
    n_withheld: int = 0   # of the n_trials, those whose estimate ``savings`` would withhold (module doc)
    power_shown: float | None = None   # power counting a withheld trial as no result (module doc)


@dataclass(frozen=True)
class SimulationResult(Record):
    """Outcome of ``simulate``: settings, the design, one row per budget and sparsity."""

    law: str
    reference: str
    candidate: str
    noise: float
    trials: int
    bootstrap: int
    seed: int
    ci_level: float
    starts: str
    design: Mapping[str, Any]
    rows: tuple[SimulationRow, ...]
    failures: int = 0
    failure_reasons: tuple[str, ...] = ()
    identified_rate: Mapping[str, float] = field(default_factory=dict)
    # what ``identified_rate`` judged: without a bootstrap only the point fit's part of the verdict
    # (no parameter on a bound, the starts agree, converged), which cannot see a law whose refits
    # pile up on a bound, so it reads higher than the full verdict would
    identified_basis: str = ""
    start_check: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""
    warnings: tuple[str, ...] = ()
    run_share: float = 0.0   # the run's share of the noise variance (module doc)

    def summary(self) -> str:
        lines = [
            f"Simulated study: {self.trials} trials, noise {self.noise:g} (sd of log loss"
            + ("" if not self.run_share else f", {100 * self.run_share:.0f}% of its variance shared within "
               "a run") + "), "
            f"{self.bootstrap} bootstrap resamples, {100 * self.ci_level:.0f}% intervals, seed {self.seed}; "
            f"design {self.design.get('source', '')} "
            f"({', '.join(f'{g} {n}' for g, n in self.design.get('n_points', {}).items())} points)",
            f"{'budget':>9} {'S':>5} {'true':>7} {'mean':>7} {'bias':>7} {'spread':>7} {'sign':>6} "
            f"{'power':>6} {'shown':>6} {'cover':>6} {'width':>7}",
        ]
        for r in self.rows:
            s = "-" if r.sparsity is None else f"{r.sparsity:.2f}"
            lines.append(
                f"{r.budget:>9.3g} {s:>5} {percent(r.true_savings):>7} {percent(r.mean_savings):>7} "
                f"{percent(r.bias):>7} {percent(r.spread):>7} {percent(r.sign_recovery):>6} "
                f"{percent(r.power):>6} {percent(r.power_shown):>6} {percent(r.coverage):>6} "
                f"{percent(r.median_ci_width):>7}"
            )
        if self.failures:
            lines.append(f"{self.failures} trial(s) failed: {'; '.join(self.failure_reasons[:3])}")
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def _fit(points: pd.DataFrame, truth: FittedLaw, settings: FitSettings) -> tuple[FitResult, FittedLaw]:
    fit = fit_law(points, truth.law, settings, group=truth.name)
    fl = FittedLaw.from_fit(fit, name=truth.name)
    if fit.diagnostics.get("identified_at_observed_share"):
        fl = replace(fl, unidentified=None)   # its small bootstrap cannot bound the share (module doc)
    # the truth's F(N): the savings error then measures the fit, not a different C = F(N) D convention
    return fit, replace(fl, cost=truth.cost)


@dataclass(frozen=True)
class _Study:
    """What every trial shares: the known laws, the design's points with their true losses, the
    budgets and sparsities, the noise, the fit settings and each group's warm start (None: grid)."""

    truth: Mapping[str, FittedLaw]
    points: Mapping[str, pd.DataFrame]
    reference: str
    candidate: str
    budgets: np.ndarray
    sparsities: Sequence[float | None]
    noise: float
    run_share: float
    settings: FitSettings
    warm: Mapping[str, np.ndarray | None]
    check_starts: int

    @property
    def groups(self) -> tuple[str, str]:
        return (self.reference, self.candidate)


@dataclass
class _Outcomes:
    """Per trial and (budget, sparsity): the estimate and its interval; what else the trials tell."""

    est: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    extrap: list
    identified: dict[str, int]
    withheld: np.ndarray | None = None   # (trials, keys) bool: ``savings`` would not print it (module doc)
    failures: list[str] = field(default_factory=list)   # whole trials: a fit failed
    budget_failures: list[str] = field(default_factory=list)   # one budget's savings failed
    check: dict[str, Any] = field(default_factory=lambda: {
        "trials_checked": 0, "grid_lower_objective": 0, "max_relative_objective_gain": 0.0})


def simulate(
    truth: Mapping[str, FittedLaw],
    design: pd.DataFrame,
    budgets: Sequence[float],
    settings: FitSettings | None = None,
    *,
    reference: str = "baseline",
    candidate: str = "smelt",
    sparsities: Sequence[float | None] = (None,),
    noise: float = 0.01,
    run_share: float = 0.0,
    trials: int = 100,
    starts: str = "warm",
    check_starts: int = 1,
    design_source: str = "",
    source: str = "",
    progress: Callable[[int, int], None] | None = None,
    **changes: Any,
) -> SimulationResult:
    """Monte Carlo of the design's savings estimate (see the module doc).

    ``truth``: group -> known law; ``design``: canonical points (``scaling.fitting.tables``; the loss column
    is ignored) with a group per architecture. ``settings`` (default ``SIMULATION_FIT``) and keyword
    ``changes`` of it (``n_bootstrap=20``) set every fit; their seed seeds the trials, their interval
    level the savings intervals. Raises UserError for bad settings or a design the laws cannot be
    fitted on (missing group or inputs, fewer points than parameters).
    """
    settings = (SIMULATION_FIT if settings is None else settings).replace(**changes)
    if not (math.isfinite(run_share) and 0.0 <= run_share < 1.0):
        raise UserError(f"the run's share of the noise variance must be in [0, 1), got {run_share!r}")
    _check_settings(truth, reference, candidate, noise, trials, settings, starts, check_starts)
    C = check_budgets(budgets)
    points = _true_points(truth, design, (reference, candidate))
    # the truth's savings (the same code, on the known laws, no intervals)
    true_res = savings(replace(truth[reference], samples=None), replace(truth[candidate], samples=None),
                       C, sparsities=sparsities, level=settings.ci_level)
    warm, warnings = _warm_starts(truth, points, settings, starts)
    study = _Study(truth, points, reference, candidate, C, sparsities, float(noise), float(run_share),
                   settings, warm,
                   check_starts if starts == "warm" else 0)
    keys = [(float(r.budget), r.sparsity) for r in true_res.rows]
    out = _run_trials(study, keys, trials, progress)
    if not np.isfinite(out.est).any():  # no statistic exists: an error, not a table of NaNs
        first = (out.failures + out.budget_failures)[0]
        raise UserError(f"all {trials} trials failed (fit or savings error); the first: {first}")
    rows = _rows(true_res, out, trials, settings.n_bootstrap)
    if out.failures:
        warnings.append(
            f"{len(out.failures)} of {trials} trials failed (fit error); every row uses the rest"
        )
    for r in rows:
        if r.n_failed > len(out.failures):
            warnings.append(
                f"C = {r.budget:.3g}" + ("" if r.sparsity is None else f", S = {r.sparsity:g}")
                + f": {r.n_failed - len(out.failures)} of {trials} trials gave no savings there "
                "(e.g. the fitted frontier does not reach the loss); the row is over the "
                f"{r.n_trials} that did, which need not be a random subset"
            )
    for r in rows:
        if r.n_withheld:
            warnings.append(
                f"C = {r.budget:.3g}" + ("" if r.sparsity is None else f", S = {r.sparsity:g}")
                + f": `smelt-scale savings` would withhold the estimate of {r.n_withheld} of the "
                f"{r.n_trials} trials (a law not identified, or misfitting, and the budget outside "
                "the data); power shown counts them as no result"
            )
    if out.check["grid_lower_objective"]:
        warnings.append(
            f"in {out.check['grid_lower_objective']} of {out.check['trials_checked']} checked fits the full "
            "start grid found a lower objective than the warm start: use grid starts"
        )
    return SimulationResult(
        law=", ".join(sorted({truth[g].law.name for g in study.groups})),
        reference=reference,
        candidate=candidate,
        noise=float(noise),
        run_share=float(run_share),
        trials=int(trials),
        bootstrap=int(settings.n_bootstrap),
        seed=int(settings.seed),
        ci_level=float(settings.ci_level),
        starts=starts,
        design=_design_info(study, design_source),
        rows=tuple(rows),
        failures=len(out.failures),
        failure_reasons=tuple((out.failures + out.budget_failures)[:10]),
        identified_rate={g: out.identified[g] / trials for g in study.groups},
        identified_basis=IDENTIFIED_BASIS[settings.n_bootstrap > 0],
        start_check=out.check if starts == "warm" else {},
        source=source,
        warnings=tuple(warnings),
    )


def _check_settings(truth: Mapping[str, FittedLaw], reference: str, candidate: str, noise: float,
                    trials: int, settings: FitSettings, starts: str, check_starts: int) -> None:
    """The simulation's own settings (the fit's are checked by ``FitSettings``)."""
    for g in (reference, candidate):
        if g not in truth:
            raise UserError(f"no known law for group {g!r}; laws: {', '.join(truth)}")
    if reference == candidate:
        raise UserError(f"reference and candidate are the same group {reference!r}")
    if not (math.isfinite(noise) and noise >= 0):
        raise UserError(f"the noise (sd of log loss) must be a non-negative number, got {noise:g}")
    if trials < 1:
        raise UserError(f"the number of trials must be >= 1, got {trials}")
    if settings.n_bootstrap == 1:
        raise UserError(f"the bootstrap resamples must be 0 (no intervals) or >= 2, got "
                        f"{settings.n_bootstrap}")
    if starts not in STARTS:
        raise UserError(f"the fit starts must be one of {', '.join(STARTS)}, got {starts!r}")
    if check_starts < 0:
        raise UserError(f"the number of trials to check the starts of must be >= 0, got {check_starts}")


def _true_points(truth: Mapping[str, FittedLaw], design: pd.DataFrame,
                 groups: Sequence[str]) -> dict[str, pd.DataFrame]:
    """Each group's design points with the truth's noise-free losses."""
    pts: dict[str, pd.DataFrame] = {}
    for g in groups:
        sub = group_rows(design, g)
        law = truth[g].law
        if len(sub) < law.n_params:
            raise UserError(
                f"the design has {len(sub)} points of group {g!r}; the {law.name} law has "
                f"{law.n_params} parameters"
            )
        pts[g] = sub.assign(loss=true_losses(truth[g], sub))
    return pts


def _warm_starts(truth: Mapping[str, FittedLaw], points: Mapping[str, pd.DataFrame],
                 settings: FitSettings, starts: str) -> tuple[dict[str, np.ndarray | None], list[str]]:
    """Noise-free fits: each group's warm start (None with grid starts), and a warning per group the
    noise-free design does not identify."""
    warnings: list[str] = []
    warm: dict[str, np.ndarray | None] = {}
    for g, pts in points.items():
        fit0, _ = _fit(pts, truth[g], settings.replace(n_bootstrap=0, starts=None))
        warm[g] = np.atleast_2d(truth[g].law.to_internal(fit0.theta)) if starts == "warm" else None
        # the trials' verdict (``IDENTIFIED_BASIS``): a noise-free fit has no bootstrap, and "no
        # bootstrap" alone made this say "does not identify" beside 100% of trials identified
        if not fit0.diagnostics.get("identified_at_observed_share", fit0.diagnostics.get("identified", True)):
            warnings.append(
                f"{g}: the noise-free design does not identify the {truth[g].law.name} law "
                f"({'; '.join(fit0.diagnostics.get('warnings', [])) or 'see fit diagnostics'})"
            )
    return warm, warnings


def _run_trials(study: _Study, keys: Sequence[tuple[float, float | None]], trials: int,
                progress: Callable[[int, int], None] | None) -> _Outcomes:
    """Every trial: noisy losses, fits, and the savings at every budget it can answer
    (``savings_over``). A trial whose fit fails is counted out of every row; one whose savings
    fails at one budget only out of that budget's rows (it still counts at the others: dropping it
    everywhere biased the rows it could answer, as the failures are not a random subset)."""
    est = np.full((trials, len(keys)), np.nan)
    out = _Outcomes(est=est, lo=np.full_like(est, np.nan), hi=np.full_like(est, np.nan),
                    extrap=[None] * len(keys), identified={g: 0 for g in study.groups},
                    withheld=np.zeros(est.shape, dtype=bool))
    index = {k: j for j, k in enumerate(keys)}
    for t in range(trials):
        try:
            fitted = _trial(study, t, out)
        except UserError as exc:
            out.failures.append(f"trial {t}: {exc}")
        else:
            try:   # every budget at once; one by one only when some budget fails
                res, skipped = savings_over(fitted[study.reference], fitted[study.candidate],
                                            study.budgets, sparsities=study.sparsities,
                                            level=study.settings.ci_level)
            except NoBudgetAnswered as exc:   # no budget answers: each says why
                res, skipped = None, exc.skipped
            except UserError as exc:
                res, skipped = None, ()
                out.budget_failures += [f"trial {t}, C = {float(c):.3g}: {exc}" for c in study.budgets]
            out.budget_failures += [f"trial {t}, C = {r.budget:.3g}: {r.reason}" for r in skipped]
            shown = (None if res is None else
                     withhold_unidentified(res, fitted[study.reference], fitted[study.candidate]).rows)
            for i, r in enumerate(() if res is None else res.rows):
                j = index[(float(r.budget), r.sparsity)]
                out.est[t, j] = r.savings
                out.withheld[t, j] = r.savings is not None and shown[i].savings is None
                if r.savings_ci is not None:
                    out.lo[t, j], out.hi[t, j] = r.savings_ci
                out.extrap[j] = r.extrapolation_decades
        if progress is not None:
            progress(t + 1, trials)
    return out


def _trial(study: _Study, t: int, out: _Outcomes) -> dict[str, FittedLaw]:
    """Trial t's fitted laws: its noise and bootstrap seeds from ``default_rng([seed, t])`` (module doc)."""
    rng = np.random.default_rng([int(study.settings.seed), t])
    fitted = {}
    for g in study.groups:
        pts = study.points[g]
        trial_pts = pts.assign(loss=noisy(pts["loss"].to_numpy(), study.noise, rng, pts["run"].to_numpy(),
                                          study.run_share))
        bseed = int(rng.integers(0, 2**31 - 1))
        settings = study.settings.replace(seed=bseed, starts=study.warm[g])
        fit, fitted[g] = _fit(trial_pts, study.truth[g], settings)
        # judged at the observed share of refits on a bound: the trials' small bootstrap cannot show
        # the share small (at K = 50 only 0-1 of 50 would pass), which `fit` at its K = 200 can
        out.identified[g] += bool(fit.diagnostics.get("identified_at_observed_share", False))
        if t < study.check_starts:
            _check_start(study, g, trial_pts, fit, bseed, out.check)
    return fitted


def _check_start(study: _Study, g: str, trial_pts: pd.DataFrame, fit: FitResult, bseed: int,
                 check: dict[str, Any]) -> None:
    """Refit a warm-started trial from the full grid: did the grid find a lower objective?"""
    settings = study.settings.replace(n_bootstrap=0, seed=bseed, starts=None)
    grid_fit, _ = _fit(trial_pts, study.truth[g], settings)
    f_w, f_g = fit.diagnostics["objective"], grid_fit.diagnostics["objective"]
    gain = (f_w - f_g) / max(abs(f_w), 1e-300)
    check["trials_checked"] += 1
    check["grid_lower_objective"] += int(gain > 1e-9)
    check["max_relative_objective_gain"] = max(check["max_relative_objective_gain"], float(gain))


def _rows(true_res: SavingsResult, out: _Outcomes, trials: int, n_bootstrap: int) -> list[SimulationRow]:
    """One row per (budget, sparsity) over the trials with a finite savings there (module doc)."""
    rows = []
    for j, tr in enumerate(true_res.rows):
        s0 = tr.savings
        ok = np.isfinite(out.est[:, j])
        e = out.est[ok, j]
        n = int(e.size)
        if n == 0:
            continue
        held = np.zeros(n, dtype=bool) if out.withheld is None else out.withheld[ok, j]
        has_ci = bool(np.isfinite(out.lo[ok, j]).all()) and n_bootstrap > 0
        cov = power = shown = width = None
        if has_ci:
            l, h = out.lo[ok, j], out.hi[ok, j]
            cov = float(np.mean((l - COVERAGE_SLACK <= s0) & (s0 <= h + COVERAGE_SLACK)))
            width = float(np.median(h - l))
            if abs(s0) >= 1e-12:
                excludes = l > 0 if s0 > 0 else h < 0
                power, shown = float(np.mean(excludes)), float(np.mean(excludes & ~held))
        rows.append(SimulationRow(
            budget=float(tr.budget), sparsity=tr.sparsity, true_savings=float(s0), n_trials=n,
            mean_savings=float(e.mean()), median_savings=float(np.median(e)), bias=float(e.mean() - s0),
            spread=float(e.std(ddof=1)) if n > 1 else 0.0, rmse=float(np.sqrt(np.mean((e - s0) ** 2))),
            sign_recovery=None if abs(s0) < 1e-12 else float(np.mean(np.sign(e) == np.sign(s0))),
            power=power, coverage=cov, median_ci_width=width, extrapolation_decades=out.extrap[j],
            estimates=tuple(float(x) for x in e), n_failed=int(trials - n), n_withheld=int(held.sum()),
            power_shown=shown,
        ))
    return rows


def _design_info(study: _Study, design_source: str) -> dict[str, Any]:
    """The design's source, points and runs per group, compute range and sparsities."""
    pts = study.points
    return {
        "source": design_source,
        "n_points": {g: int(len(pts[g])) for g in study.groups},
        "n_runs": {g: int(pts[g]["run"].nunique()) for g in study.groups},
        "compute_range": [
            float(min(p["flops"].min() for p in pts.values())),
            float(max(p["flops"].max() for p in pts.values())),
        ],
        "sparsities": sorted({
            round(float(x), 4)
            for g in study.groups
            if uses_sparsity(study.truth[g].law)
            for x in pts[g]["sparsity"]
            if np.isfinite(x)
        }),
    }


__all__ = ["SIMULATION_FIT", "STARTS", "SimulationResult", "SimulationRow", "noisy", "simulate",
           "true_losses"]
