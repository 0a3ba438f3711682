"""Is a planned study big enough? Monte Carlo of fit -> savings on synthetic losses from known laws.

Per trial, for each architecture (group) with a known law (its ``FittedLaw``, the *truth*):

    loss_i = L_true(x_i) * exp(noise * z_i),   z_i ~ N(0, 1) independent,

at the design's points x_i ((N, D) or (F, S, D)): multiplicative lognormal noise, ``noise`` the
standard deviation of log loss (0.01 is about 1% scatter). Each group is fitted with the real
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
  float round-off of zero-width intervals at zero noise), to compare with the nominal level.

For chinchilla-form laws the compute C = k N D uses the truth's k for the fitted laws too, so
the savings error measures the fit alone, not a different k of the design's configs.

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
from scaling.fitting.fit import DEFAULT_DELTA, fit_law
from scaling.fitting.savings import FittedLaw, check_budgets, savings, uses_sparsity
from scaling.fitting.tables import law_inputs

STARTS = ("warm", "grid")
COVERAGE_SLACK = 1e-7


def true_losses(truth: FittedLaw, points: pd.DataFrame) -> np.ndarray:
    """Noise-free losses of the truth law at canonical points (nats/token)."""
    X = law_inputs(points, truth.law.inputs, source=f"design of {truth.name}")
    return truth.law.predict(truth.theta, **X)


def noisy(loss: np.ndarray, noise: float, rng: np.random.Generator) -> np.ndarray:
    """loss * exp(noise * z), z standard normal: multiplicative lognormal noise."""
    return loss * np.exp(noise * rng.standard_normal(np.shape(loss)))


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
    start_check: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""
    warnings: tuple[str, ...] = ()

    def summary(self) -> str:
        lines = [
            f"Simulated study: {self.trials} trials, noise {self.noise:g} (sd of log loss), "
            f"{self.bootstrap} bootstrap resamples, {100 * self.ci_level:.0f}% intervals, seed {self.seed}; "
            f"design {self.design.get('source', '')} "
            f"({', '.join(f'{g} {n}' for g, n in self.design.get('n_points', {}).items())} points)",
            f"{'budget':>9} {'S':>5} {'true':>7} {'mean':>7} {'bias':>7} {'spread':>7} {'sign':>6} "
            f"{'power':>6} {'cover':>6} {'width':>7}",
        ]
        for r in self.rows:
            s = "-" if r.sparsity is None else f"{r.sparsity:.2f}"
            lines.append(
                f"{r.budget:>9.3g} {s:>5} {percent(r.true_savings):>7} {percent(r.mean_savings):>7} "
                f"{percent(r.bias):>7} {percent(r.spread):>7} {percent(r.sign_recovery):>6} "
                f"{percent(r.power):>6} {percent(r.coverage):>6} {percent(r.median_ci_width):>7}"
            )
        if self.failures:
            lines.append(f"{self.failures} trial(s) failed: {'; '.join(self.failure_reasons[:3])}")
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def _fit(
    points: pd.DataFrame,
    truth: FittedLaw,
    *,
    n_bootstrap: int,
    seed: int,
    level: float,
    delta: float,
    starts: np.ndarray | None,
):
    fit = fit_law(
        points,
        truth.law,
        group=truth.name,
        huber_delta=delta,
        n_bootstrap=n_bootstrap,
        seed=seed,
        ci_level=level,
        starts=starts,
    )
    fl = FittedLaw.from_fit(fit, name=truth.name)
    # the truth's k: the savings error then measures the fit, not a different C = k N D convention
    return fit, replace(fl, flops_per_param=truth.flops_per_param)


def simulate(
    truth: Mapping[str, FittedLaw],
    design: pd.DataFrame,
    budgets: Sequence[float],
    *,
    reference: str = "baseline",
    candidate: str = "smelt",
    sparsities: Sequence[float | None] = (None,),
    noise: float = 0.01,
    trials: int = 100,
    n_bootstrap: int = 50,
    seed: int = 0,
    level: float = 0.95,
    starts: str = "warm",
    check_starts: int = 1,
    huber_delta: float = DEFAULT_DELTA,
    design_source: str = "",
    source: str = "",
    progress: Callable[[int, int], None] | None = None,
) -> SimulationResult:
    """Monte Carlo of the design's savings estimate (see the module doc).

    ``truth``: group -> known law; ``design``: canonical points (``scaling.fitting.tables``; the loss column
    is ignored) with a group per architecture. Raises UserError for bad settings or a design the
    laws cannot be fitted on (missing group or inputs, fewer points than parameters).
    """
    for g in (reference, candidate):
        if g not in truth:
            raise UserError(f"no known law for group {g!r}; laws: {', '.join(truth)}")
    if reference == candidate:
        raise UserError(f"reference and candidate are the same group {reference!r}")
    if not (math.isfinite(noise) and noise >= 0):
        raise UserError(f"the noise (sd of log loss) must be a non-negative number, got {noise:g}")
    if trials < 1:
        raise UserError(f"the number of trials must be >= 1, got {trials}")
    if n_bootstrap < 0 or n_bootstrap == 1:
        raise UserError(f"the bootstrap resamples must be 0 (no intervals) or >= 2, got {n_bootstrap}")
    if starts not in STARTS:
        raise UserError(f"the fit starts must be one of {', '.join(STARTS)}, got {starts!r}")
    if check_starts < 0:
        raise UserError(f"the number of trials to check the starts of must be >= 0, got {check_starts}")
    if not 0.0 < level < 1.0:
        raise UserError(f"interval level must lie in (0, 1), got {level}")
    C = check_budgets(budgets)
    groups = (reference, candidate)
    law_names = {truth[g].law.name for g in groups}
    pts: dict[str, pd.DataFrame] = {}
    for g in groups:
        sub = design[design["group"] == g].reset_index(drop=True)
        law = truth[g].law
        if len(sub) < law.n_params:
            raise UserError(
                f"the design has {len(sub)} points of group {g!r}; the {law.name} law has "
                f"{law.n_params} parameters"
            )
        sub = sub.assign(loss=true_losses(truth[g], sub))
        pts[g] = sub

    # the truth's savings (the same code, on the known laws, no intervals)
    ref_t = replace(truth[reference], samples=None)
    cand_t = replace(truth[candidate], samples=None)
    true_res = savings(ref_t, cand_t, C, sparsities=sparsities, level=level)
    keys = [(r.budget, r.sparsity) for r in true_res.rows]

    # noise-free fits: the warm starts, and the design's compute range for extrapolation
    warnings: list[str] = []
    warm: dict[str, np.ndarray | None] = {}
    for g in groups:
        fit0, _ = _fit(
            pts[g], truth[g], n_bootstrap=0, seed=seed, level=level, delta=huber_delta, starts=None
        )
        warm[g] = np.atleast_2d(truth[g].law.to_internal(fit0.theta)) if starts == "warm" else None
        if not fit0.diagnostics.get("identified", True):
            warnings.append(
                f"{g}: the noise-free design does not identify the {truth[g].law.name} law "
                f"({'; '.join(fit0.diagnostics.get('warnings', [])) or 'see fit diagnostics'})"
            )

    est = np.full((trials, len(keys)), np.nan)
    lo = np.full_like(est, np.nan)
    hi = np.full_like(est, np.nan)
    extrap = [None] * len(keys)
    identified = {g: 0 for g in groups}
    failures: list[str] = []
    check = {"trials_checked": 0, "grid_lower_objective": 0, "max_relative_objective_gain": 0.0}
    for t in range(trials):
        rng = np.random.default_rng([int(seed), t])
        fitted, fits = {}, {}
        try:
            for g in groups:
                trial_pts = pts[g].assign(loss=noisy(pts[g]["loss"].to_numpy(), noise, rng))
                bseed = int(rng.integers(0, 2**31 - 1))
                fits[g], fitted[g] = _fit(
                    trial_pts,
                    truth[g],
                    n_bootstrap=n_bootstrap,
                    seed=bseed,
                    level=level,
                    delta=huber_delta,
                    starts=warm[g],
                )
                identified[g] += bool(fits[g].diagnostics.get("identified", False))
                if starts == "warm" and t < check_starts:
                    grid_fit, _ = _fit(
                        trial_pts,
                        truth[g],
                        n_bootstrap=0,
                        seed=bseed,
                        level=level,
                        delta=huber_delta,
                        starts=None,
                    )
                    f_w, f_g = fits[g].diagnostics["objective"], grid_fit.diagnostics["objective"]
                    gain = (f_w - f_g) / max(abs(f_w), 1e-300)
                    check["trials_checked"] += 1
                    check["grid_lower_objective"] += int(gain > 1e-9)
                    check["max_relative_objective_gain"] = max(
                        check["max_relative_objective_gain"], float(gain)
                    )
            res = savings(fitted[reference], fitted[candidate], C, sparsities=sparsities, level=level)
        except UserError as exc:
            failures.append(f"trial {t}: {exc}")
            if progress is not None:
                progress(t + 1, trials)
            continue
        for j, r in enumerate(res.rows):
            est[t, j] = r.savings
            if r.savings_ci is not None:
                lo[t, j], hi[t, j] = r.savings_ci
            extrap[j] = r.extrapolation_decades
        if progress is not None:
            progress(t + 1, trials)

    ok = np.isfinite(est[:, 0]) if keys else np.zeros(trials, dtype=bool)
    rows = []
    for j, (b, s) in enumerate(keys):
        s0 = true_res.rows[j].savings
        e = est[ok, j]
        n = int(e.size)
        if n == 0:
            continue
        sign = None if abs(s0) < 1e-12 else float(np.mean(np.sign(e) == np.sign(s0)))
        has_ci = bool(np.isfinite(lo[ok, j]).all()) and n_bootstrap > 0
        cov = power = width = None
        if has_ci:
            l, h = lo[ok, j], hi[ok, j]
            cov = float(np.mean((l - COVERAGE_SLACK <= s0) & (s0 <= h + COVERAGE_SLACK)))
            width = float(np.median(h - l))
            if abs(s0) >= 1e-12:
                power = float(np.mean(l > 0) if s0 > 0 else np.mean(h < 0))
        rows.append(
            SimulationRow(
                budget=float(b),
                sparsity=s,
                true_savings=float(s0),
                n_trials=n,
                mean_savings=float(e.mean()),
                median_savings=float(np.median(e)),
                bias=float(e.mean() - s0),
                spread=float(e.std(ddof=1)) if n > 1 else 0.0,
                rmse=float(np.sqrt(np.mean((e - s0) ** 2))),
                sign_recovery=sign,
                power=power,
                coverage=cov,
                median_ci_width=width,
                extrapolation_decades=extrap[j],
                estimates=tuple(float(x) for x in e),
            )
        )
    if failures:
        warnings.append(
            f"{len(failures)} of {trials} trials failed (fit or savings error); statistics use the rest"
        )
    if check["grid_lower_objective"]:
        warnings.append(
            f"in {check['grid_lower_objective']} of {check['trials_checked']} checked fits the full "
            "start grid found a lower objective than the warm start: use grid starts"
        )
    design_info = {
        "source": design_source,
        "n_points": {g: int(len(pts[g])) for g in groups},
        "n_runs": {g: int(pts[g]["run"].nunique()) for g in groups},
        "compute_range": [
            float(min(p["flops"].min() for p in pts.values())),
            float(max(p["flops"].max() for p in pts.values())),
        ],
        "sparsities": sorted(
            {
                round(float(x), 4)
                for g in groups
                if uses_sparsity(truth[g].law)
                for x in pts[g]["sparsity"]
                if np.isfinite(x)
            }
        ),
    }
    return SimulationResult(
        law=", ".join(sorted(law_names)),
        reference=reference,
        candidate=candidate,
        noise=float(noise),
        trials=int(trials),
        bootstrap=int(n_bootstrap),
        seed=int(seed),
        ci_level=float(level),
        starts=starts,
        design=design_info,
        rows=tuple(rows),
        failures=len(failures),
        failure_reasons=tuple(failures[:10]),
        identified_rate={g: identified[g] / trials for g in groups},
        start_check=check if starts == "warm" else {},
        source=source,
        warnings=tuple(warnings),
    )


__all__ = ["STARTS", "SimulationResult", "SimulationRow", "noisy", "simulate", "true_losses"]
