"""Training-compute savings of a candidate law over a reference law on the compute-optimal frontier.

Compute (total training FLOPs):

- ``smelt`` form, L(F, S, D) = E + A (1-S)^b / F^a + K / D^c: C = F * D, F per-token training
  FLOPs, at a fixed sparsity S (SMELT paper, arXiv 2609.01343).
- ``chinchilla`` form, L(N, D) = E + A / N^alpha + B / D^beta: C = k * N * D, where k is the
  median recorded flops / (N * D) of the fitted runs (6 by Kaplan et al. 2020 when a table has
  no FLOPs). A looped model spends more FLOPs per unique parameter, so its k is larger than 6.

Frontier: both forms are L = E + P x^-p + Q y^-q with x * y = C / k (x = N or F, y = D); the
minimum along C is closed form (Lagrange; Hoffmann et al. 2022, eq. 4):

    x* = (p P / (q Q))^(1/(p+q)) (C/k)^(q/(p+q)),   y* = C / (k x*),
    L*(C) = E + P x*^-p (p+q)/q  =  E + G C^-(p q/(p+q)).

Tokens per parameter at the optimum: D*/N* (chinchilla); D*/(F*/6) for the smelt form, i.e.
tokens per dense-equivalent parameter, a dense model spending 6 FLOPs per parameter per token.

Savings at a budget C, two conventions (both give 1 - C_candidate / C_reference):

- ``candidate-budget`` (the paper's, default): the candidate trains with C and reaches L*_cand(C);
  the reference needs C_ref with L*_ref(C_ref) = L*_cand(C); savings = 1 - C / C_ref.
- ``reference-budget``: the reference trains with C; the candidate needs C' with
  L*_cand(C') = L*_ref(C); savings = 1 - C' / C.

With g = L*_ref^-1 o L*_cand (the reference compute that matches the candidate at C), the
candidate-budget savings at C equal the reference-budget savings at g(C). The matching compute is
found by bisection in log C within ``span`` decades either side of C (the frontier is strictly
decreasing), so the maths works for any frontier, closed-form inverse or not.

Intervals: the fitter's bootstrap resamples of the two laws are paired by resample index and
pushed through the same computation, vectorised over resamples; the interval is their percentile
interval. Resamples whose matching compute falls outside the bracket are clamped to its edge
(their savings are bounds); quantiles are unchanged by that unless the quantile touches them.

Rows carry their ``method`` (``law`` here; ``scaling.fitting.envelope`` gives law-free ``envelope``
rows inside the data). Which one answers by default (``smelt-scale savings --method auto``):
a fitted law that is identified and fits (``law_distrust`` is None for both groups) answers at
every budget, and inside the data the envelope is its cross-check (``disagreements``: the two
intervals do not overlap). The envelope of a coarse grid of trained sizes is not the
compute-optimal frontier (it is the best of the sizes trained, an upper bound on the frontier's
loss), so where the law holds it is the less accurate of the two: measured on a planted saving in
``benchmarks/savings_accuracy.py``. A law that is not identified or misfits answers only outside
the data (and is withheld far out, below); inside, the envelope answers.
``withhold_unidentified`` removes the numbers of law rows that extrapolate
more than a stated number of decades from a law that is not identified (a parameter of the best fit
on its bound, or most bootstrap fits on one): such a row keeps only its budget and a ``reason``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from scaling.accounting.costs import check_sparsity
from scaling.common.errors import UserError
from scaling.common.stats import percentile_interval
from scaling.fitting.fit import MAX_BOOTSTRAP_ON_BOUND, MAX_START_SPREAD, bound_share_upper
from scaling.fitting.laws import (  # noqa: F401
    Frontier,
    Law,
    TokenCost,
    frontier,
    frontier_by_size,
    frontier_is_exact,
    frontier_numeric,
    get_law,
)

CONVENTIONS = ("candidate-budget", "reference-budget")
SPAN_DECADES = 6.0
EXTRAPOLATION_WARN_DECADES = 1.0
WITHHOLD_DECADES = 0.0  # default: no point estimate from an unidentified law beyond its data
# Why a row has no number, for scripts (the row's ``reason`` says it in words): the budget lies
# outside the observed compute (the envelope does not extrapolate); the side solved for never
# reaches the matched loss (an observed frontier in its range, a law within SPAN_DECADES above the
# budget); a law reaches it with more than SPAN_DECADES less compute (the saving is ~100%, past the
# bracket); the laws are not identified and the budget lies beyond the data; a law misfits its
# points (and both are identified) and the budget lies beyond the data; laws that are not identified
# or misfit, asked by the default method without their runs (a fits file), inside their data,
# where only the observed frontiers may answer and there are none. Where a budget is both beyond
# such a law's data and unmatched, the unmatched kind is given.
REFUSALS = ("outside-data", "not-reached", "already-beaten", "unidentified-far", "misfit-far",
            "distrusted-inside", "data-gap", "untrained-sparsity")
SPARSITY_ATOL = 5e-5   # sparsities equal to 4 decimals are one (scaling.fitting.laws.SPARSITY_DECIMALS)
MIN_CI_RESAMPLES = 20  # fewer resamples give their range, not a percentile interval (law and envelope)
MAX_BUDGETS = 1_000  # ~5 s of CPU for the paper laws at 3 sparsities with intervals
_BISECT_STEPS = 64  # a bracket of tens of nats / 2^64: below float64 resolution
_ROOT_RTOL = 1e-9   # the explicit root's L*(C) must equal the target this closely (else: bisection in C)


# -- frontier --------------------------------------------------------------------------------
# One frontier for the whole package: ``scaling.fitting.laws.frontier`` (closed form from the law
# registry); ``Optimum`` is its result type under the name this module has always exported.
Optimum = Frontier


def uses_sparsity(law: Law) -> bool:
    return "S" in law.fixed_inputs


def check_sparsities(sparsities: Sequence[float | None], smelt_form: bool) -> tuple[float | None, ...]:
    """The sparsities to evaluate laws at (``(None,)`` when none is given): each in [0, 1) for
    smelt-form laws, which need one; none for chinchilla-form laws. UserError otherwise."""
    sparsities = tuple(sparsities) or (None,)
    if smelt_form:
        if any(s is None for s in sparsities):
            raise UserError("a smelt-form law needs a sparsity S")
        for s in sparsities:
            check_sparsity(s)
    elif any(s is not None for s in sparsities):
        raise UserError("a sparsity applies only to smelt-form laws; these are chinchilla-form")
    return sparsities


def compute_for_loss(law: Law, theta: np.ndarray, target: np.ndarray, around: np.ndarray, *,
                     cost: TokenCost | float = 6.0, S: float | None = None,
                     span: float = SPAN_DECADES) -> tuple[np.ndarray, np.ndarray]:
    """Compute C with L*(C) = target, searched in [around 10^-span, around 10^span].

    Returns (C, status): status 0 where the root lies inside the bracket, +1 where the law never
    gets down to the target within the bracket (C clamped to the top edge), -1 where it is
    already below the target at the bottom edge (C clamped to the bottom edge); C is NaN where
    the target is. Vectorised: theta (..., P), target and around broadcast together.

    L* falls monotonically along the frontier's optimal size x, and both L* and C are explicit in
    x (``frontier_by_size``): the root is one bisection in log x between the optimal sizes of the
    bracket's two budgets, then C at that size. Where that root cannot stand for the frontier's
    (its loss misses the target, the frontier would clamp that optimum to its bracket,
    ``frontier_is_exact``: under one token, or a bootstrap sample's exponents overflow the explicit
    form) the element is solved by bisection in log C around the frontier (``_bisect_compute``), as
    before: the explicit form only saves time (5,760 frontier steps per budget for a non-linear
    F(N)), never changes an answer.
    """
    theta = law.theta_array(theta)
    target = np.asarray(target, dtype=float)
    lo = np.log(np.asarray(around, dtype=float)) - span * np.log(10.0)
    hi = lo + 2.0 * span * np.log(10.0)
    shape = np.broadcast_shapes(theta.shape[:-1], target.shape, lo.shape)
    lo, hi, target = (np.broadcast_to(v, shape).copy() for v in (lo, hi, target))
    theta = np.broadcast_to(theta, shape + theta.shape[-1:])
    bottom = frontier(law, theta, np.exp(lo), cost=cost, S=S)
    top = frontier(law, theta, np.exp(hi), cost=cost, S=S)
    never = top.loss - target > 0.0      # still above the target with 10^span more compute
    already = bottom.loss - target < 0.0  # below the target even with 10^-span of the compute
    with np.errstate(divide="ignore", invalid="ignore"):
        u_lo, u_hi = np.log(bottom.size), np.log(top.size)
    # L* above the target at that optimal size: the root's size is larger
    u = _bisect(u_lo, u_hi, lambda mid: frontier_by_size(law, theta, mid, cost=cost, S=S)[1] > target)
    at_root = frontier_by_size(law, theta, u, cost=cost, S=S)
    logc, reached = (np.broadcast_to(v, shape).copy() for v in at_root)
    with np.errstate(over="ignore", invalid="ignore"):
        # the root is one where the frontier at that budget has that optimum, unclamped
        ok = np.isfinite(logc) & (logc >= lo) & (logc <= hi) & frontier_is_exact(law, logc, u, cost) & \
            (np.abs(reached - target) <= _ROOT_RTOL * np.abs(target))
    interior = ~never & ~already & np.isfinite(target)
    redo = interior & ~ok
    if redo.any():
        logc[redo] = _bisect_compute(law, theta[redo], target[redo], lo[redo], hi[redo], cost, S)
    logc = np.where(never, hi, np.where(already, lo, logc))
    logc = np.where(np.isfinite(target), logc, np.nan)
    status = np.where(never, 1, np.where(already, -1, 0))
    return np.exp(logc), status


def _bisect_compute(law: Law, theta: np.ndarray, target: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                    cost: TokenCost | float, S: float | None) -> np.ndarray:
    """log C with L*(C) = target by bisection in log C on [lo, hi], L* from ``frontier`` (the
    fallback of ``compute_for_loss``; elementwise over theta (n, P) and the (n,) arrays)."""
    return _bisect(lo, hi, lambda mid: frontier(law, theta, np.exp(mid), cost=cost, S=S).loss > target)


def _bisect(lo: np.ndarray, hi: np.ndarray, above: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Elementwise bisection on [lo, hi] (``_BISECT_STEPS`` halvings): ``above(mid)`` is True where the
    root lies above mid. Returns the final midpoints."""
    for _ in range(_BISECT_STEPS):
        mid = 0.5 * (lo + hi)
        up = above(mid)
        lo = np.where(up, mid, lo)
        hi = np.where(up, hi, mid)
    return 0.5 * (lo + hi)


# -- fitted laws -----------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class FittedLaw:
    """One fitted law as the savings maths needs it.

    theta: (P,) natural parameters in ``law.params`` order. samples: (K, P) bootstrap resamples
    in the same order (row i pairs with row i of the other law), or None. cost: the training FLOPs
    per token F(N) of the chinchilla form, C = F(N) D (``TokenCost``; a number k means F = k N;
    unused by the smelt form, whose C = F D). compute_min /
    compute_max: total training FLOPs of the smallest / largest fitted point, None if unknown.
    sparsities: the sparsities of the fitted points (smelt form; empty if unknown).
    """

    name: str
    law: Law
    theta: np.ndarray
    samples: np.ndarray | None = None
    cost: TokenCost | float = 6.0
    compute_min: float | None = None
    compute_max: float | None = None
    source: str = ""
    unidentified: str | None = None  # why the fit is not identified (None: identified or unknown)
    misfit: bool = False             # the fit's residuals trend (``goodness_of_fit``): it misfits
    sparsities: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "theta", self.law.theta_array(self.theta).astype(float))
        if self.samples is not None:
            s = np.asarray(self.samples, dtype=float)
            if s.ndim != 2 or s.shape[1] != self.law.n_params:
                raise UserError(f"{self.name}: bootstrap samples must be (K, {self.law.n_params}), "
                                f"got {s.shape}")
            object.__setattr__(self, "samples", s if s.shape[0] else None)
        try:  # TokenCost checks its terms: a number k must be finite and positive
            object.__setattr__(self, "cost", TokenCost.of(self.cost))
        except UserError as exc:
            raise UserError(f"{self.name}: {exc}") from None

    @property
    def params(self) -> dict[str, float]:
        return self.law.as_dict(self.theta)

    @classmethod
    def from_fit(cls, fit: Any, name: str | None = None, source: str = "") -> "FittedLaw":
        """From a ``scaling.fitting.fit.FitResult`` (law, group, params, bootstrap, data_summary)."""
        law = fit.law if isinstance(fit.law, Law) else get_law(str(fit.law))
        summary = dict(getattr(fit, "data_summary", None) or {})
        boot = getattr(fit, "bootstrap", None)
        return cls(
            name=name or str(fit.group),
            law=law,
            theta=law.theta_array(dict(fit.params)),
            samples=None if boot is None else np.asarray(boot, dtype=float).reshape(-1, law.n_params),
            cost=TokenCost.from_summary(summary),
            compute_min=_positive_or_none(summary.get("compute_min")),
            compute_max=_positive_or_none(summary.get("compute_max")),
            source=source,
            unidentified=unidentified(getattr(fit, "diagnostics", None) or {},
                                      None if boot is None else int(np.size(boot) // law.n_params)),
            misfit=bool((getattr(fit, "diagnostics", None) or {}).get("misfit")),
            sparsities=tuple(float(x) for x in summary.get("sparsities") or ()),
        )


def unidentified(diagnostics: Mapping[str, Any], n_resamples: int | None = None) -> str | None:
    """Why a fit is not identified, from ``FitResult.diagnostics``; None when it is. The verdict is
    the fit's own (``identified``, :func:`scaling.fitting.fit.fit_law`'s rule: no parameter of the
    best fit on its bound, no flat direction among the starts, converged, at least
    ``MIN_RESIDUAL_DOF`` residual degrees of freedom, at most ``MAX_BOOTSTRAP_ON_BOUND`` of the
    bootstrap refits on a bound, shown by its one-sided upper bound ``bootstrap_on_bound_upper``), so
    that ``savings`` never answers with a law that ``fit`` calls
    not identified. Diagnostics without the verdict (a fits file written by hand) are judged by the
    parts of that rule they hold; without the upper bound (a fits file written before it) it is
    computed from the observed share and ``n_resamples``, the number of bootstrap refits."""
    on_bound = list(diagnostics.get("on_bound") or [])
    why = []
    if on_bound:
        why.append(f"{', '.join(map(str, on_bound))} on its bound")
    frac = _positive_or_none(diagnostics.get("bootstrap_on_bound_fraction"))
    upper = _positive_or_none(diagnostics.get("bootstrap_on_bound_upper"))
    share = _finite_or_none(diagnostics.get("bootstrap_on_bound_fraction"))
    if "bootstrap_on_bound_upper" not in diagnostics and share is not None and n_resamples:
        upper = bound_share_upper(int(round(share * n_resamples)), n_resamples)
    if frac is not None and frac > MAX_BOOTSTRAP_ON_BOUND:
        why.append(f"{100 * frac:.0f}% of bootstrap fits on a bound")
    elif upper is not None and upper > MAX_BOOTSTRAP_ON_BOUND:
        why.append(f"too few bootstrap resamples to show that at most {100 * MAX_BOOTSTRAP_ON_BOUND:.0f}% of "
                   f"refits end on a bound ({100 * upper:.0f}% upper bound)")
    spread = _positive_or_none(diagnostics.get("best_start_param_spread"))
    if spread is not None and spread > MAX_START_SPREAD:
        why.append("a flat direction among the best starts")
    if diagnostics.get("converged") is False:
        why.append("the optimiser did not converge")
    if diagnostics.get("identified") is False and not why:
        why.append("the fit's own verdict (`smelt-scale fit` says why)")
    return "; ".join(why) or None


def _finite_or_none(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if np.isfinite(f) else None


def _positive_or_none(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if np.isfinite(f) and f > 0 else None


class Unmatched(UserError):
    """``savings`` cannot match one budget: the side solved for needs more than ``span`` decades
    more compute than the budget to reach the other's loss (``refusal`` 'not-reached') or reaches
    it with more than ``span`` decades less (``refusal`` 'already-beaten'). Callers that answer
    budget by budget (``scaling.fitting.savings_sweep.savings_over``) catch this, never the
    UserErrors of bad input."""

    def __init__(self, message: str, budget: float, refusal: str):
        super().__init__(message)
        self.budget, self.refusal = float(budget), refusal

    def __reduce__(self):   # picklable across process pools
        return (Unmatched, (str(self), self.budget, self.refusal))


# -- result ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class SavingsRow:
    """One budget (and sparsity). Computes in FLOPs, losses in nats/token, savings as fractions.

    candidate_compute / reference_compute: the compute each side spends to reach the same loss
    (one of them is the budget, by the convention); candidate_loss: that loss.
    savings = 1 - candidate_compute / reference_compute. loss_gap = L*_ref(C) - L*_cand(C) at
    equal compute C = budget (positive: the candidate is better). tokens_per_param: the
    reference's optimum at the budget; candidate_tokens_per_param: the candidate's.
    extrapolation_decades: log10(compute / compute_max) of the furthest point either law is
    evaluated at (None if no law knows its data range). method: ``law`` (fitted or published laws)
    or ``envelope`` (the observed frontiers, ``scaling.fitting.envelope``). A row without a number
    (``savings`` None, the other quantities NaN) says why in ``reason`` and which kind of refusal
    in ``refusal`` (one of REFUSALS); ``extrapolated`` marks a row shown although its laws are not
    identified far beyond the data (the caller asked for it). ``warnings``: the row's own warnings
    (clamped resamples), also listed in the result's. below_data_decades: how far below the
    larger of the two laws' smallest fitted compute the smallest compute the row uses lies
    (decades; None when inside or unknown): an extrapolation down, which the negative
    ``extrapolation_decades`` alone would read as "well inside".
    """

    budget: float
    sparsity: float | None
    candidate_compute: float
    reference_compute: float
    candidate_loss: float
    savings: float | None
    savings_ci: tuple[float, float] | None
    loss_gap: float
    loss_gap_ci: tuple[float, float] | None
    tokens_per_param: float
    candidate_tokens_per_param: float
    extrapolation_decades: float | None
    ci_resamples: int = 0
    ci_clamped: int = 0
    below_data_decades: float | None = None
    method: str = "law"
    reason: str | None = None
    extrapolated: bool = False
    warnings: tuple[str, ...] = ()
    refusal: str | None = None

    @classmethod
    def refused(cls, budget: float, reason: str, *, refusal: str, method: str,
                sparsity: float | None = None, extrapolation_decades: float | None = None) -> "SavingsRow":
        """A row that gives no number, only why (``reason``) and which kind of refusal (REFUSALS)."""
        if refusal not in REFUSALS:
            raise ValueError(f"unknown refusal {refusal!r}; one of {REFUSALS}")
        nan = float("nan")
        return cls(budget=budget, sparsity=sparsity, candidate_compute=nan, reference_compute=nan,
                   candidate_loss=nan, savings=None, savings_ci=None, loss_gap=nan, loss_gap_ci=None,
                   tokens_per_param=nan, candidate_tokens_per_param=nan,
                   extrapolation_decades=extrapolation_decades, method=method, reason=reason,
                   refusal=refusal)

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget": self.budget, "sparsity": self.sparsity, "method": self.method,
            "reason": self.reason, "refusal": self.refusal, "extrapolated": self.extrapolated,
            "candidate_loss": self.candidate_loss, "reference_compute": self.reference_compute,
            "savings": self.savings,
            "savings_ci": None if self.savings_ci is None else list(self.savings_ci),
            "tokens_per_param": self.tokens_per_param,
            "extrapolation_decades": self.extrapolation_decades,
            "candidate_compute": self.candidate_compute,
            "loss_gap": self.loss_gap,
            "loss_gap_ci": None if self.loss_gap_ci is None else list(self.loss_gap_ci),
            "candidate_tokens_per_param": self.candidate_tokens_per_param,
            "ci_resamples": self.ci_resamples, "ci_clamped": self.ci_clamped,
            "below_data_decades": self.below_data_decades,
            "warnings": list(self.warnings),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SavingsRow":
        def pair(v: Any) -> tuple[float, float] | None:
            return None if v is None else (float(v[0]), float(v[1]))

        return cls(
            budget=float(d["budget"]),
            sparsity=None if d.get("sparsity") is None else float(d["sparsity"]),
            candidate_compute=_float(d.get("candidate_compute", d["budget"])),
            reference_compute=_float(d.get("reference_compute")),
            candidate_loss=_float(d.get("candidate_loss")),
            savings=None if d.get("savings") is None else float(d["savings"]),
            savings_ci=pair(d.get("savings_ci")),
            loss_gap=_float(d.get("loss_gap")), loss_gap_ci=pair(d.get("loss_gap_ci")),
            tokens_per_param=_float(d.get("tokens_per_param")),
            candidate_tokens_per_param=_float(d.get("candidate_tokens_per_param")),
            extrapolation_decades=(None if d.get("extrapolation_decades") is None
                                   else float(d["extrapolation_decades"])),
            ci_resamples=int(d.get("ci_resamples", 0)), ci_clamped=int(d.get("ci_clamped", 0)),
            below_data_decades=(None if d.get("below_data_decades") is None
                                else float(d["below_data_decades"])),
            method=str(d.get("method", "law")), reason=d.get("reason"), refusal=d.get("refusal"),
            extrapolated=bool(d.get("extrapolated", False)),
            warnings=tuple(str(w) for w in d.get("warnings", ())),
        )


def _float(v: Any) -> float:
    return float("nan") if v is None else float(v)


@dataclass(frozen=True)
class SavingsResult:
    """Savings of ``candidate`` over ``reference`` at each budget, with the convention used."""

    reference: str
    candidate: str
    convention: str
    rows: tuple[SavingsRow, ...]
    ci_level: float = 0.95
    warnings: tuple[str, ...] = ()
    laws: Mapping[str, str] = field(default_factory=dict)
    source: str = ""
    cross_checks: tuple[SavingsRow, ...] = ()   # the other method's rows at the same budgets
    where: tuple[str, ...] = ()                 # row filters applied to the points (``--where``)
    n_points: int | None = None                 # points read, before the filters (None: no points)
    n_points_kept: int | None = None            # points the filters kept: every number is of these

    @property
    def savings_range(self) -> tuple[float, float] | None:
        """(min, max) over the rows that give a number; None if none does."""
        s = [r.savings for r in self.rows if r.savings is not None]
        return (min(s), max(s)) if s else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "reference": self.reference, "candidate": self.candidate, "convention": self.convention,
            "rows": [r.to_dict() for r in self.rows],
            "savings_range": None if self.savings_range is None else list(self.savings_range),
            "ci_level": self.ci_level, "laws": dict(self.laws), "source": self.source,
            "warnings": list(self.warnings),
            "cross_checks": [r.to_dict() for r in self.cross_checks],
            "where": list(self.where), "n_points": self.n_points, "n_points_kept": self.n_points_kept,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SavingsResult":
        return cls(
            reference=str(d["reference"]), candidate=str(d["candidate"]), convention=str(d["convention"]),
            rows=tuple(SavingsRow.from_dict(r) for r in d["rows"]),
            ci_level=float(d.get("ci_level", 0.95)), warnings=tuple(d.get("warnings", ())),
            laws=dict(d.get("laws", {})), source=str(d.get("source", "")),
            cross_checks=tuple(SavingsRow.from_dict(r) for r in d.get("cross_checks", ())),
            where=tuple(d.get("where", ())), n_points=d.get("n_points"), n_points_kept=d.get("n_points_kept"),
        )

    def summary(self) -> str:
        who = "candidate" if self.convention == "candidate-budget" else "reference"
        lines = [
            f"Compute savings of {self.candidate} over {self.reference} ({self.convention}: the budget is "
            f"the {who}'s; savings = 1 - C_{self.candidate} / C_{self.reference} at equal optimal loss)",
            f"{'budget':>10} {'S':>5} {'C_cand':>10} {'C_ref':>10} {'loss':>7} {'savings':>8} {'CI':>17} "
            f"{'gap':>8} {'D/N':>6} {'extrap':>6} method",
        ]
        for r in self.rows:
            if r.savings is None:
                lines.append(f"{r.budget:>10.3g} no estimate ({r.method}): {r.reason}")
                continue
            ci = ("" if r.savings_ci is None
                  else f"[{100 * r.savings_ci[0]:.1f}, {100 * r.savings_ci[1]:.1f}]%")
            s = "-" if r.sparsity is None else f"{r.sparsity:.2f}"
            ex = "-" if r.extrapolation_decades is None else f"{r.extrapolation_decades:+.2f}"
            lines.append(f"{r.budget:>10.3g} {s:>5} {r.candidate_compute:>10.4g} "
                         f"{r.reference_compute:>10.4g} {r.candidate_loss:>7.4f} {100 * r.savings:>7.2f}% "
                         f"{ci:>17} {r.loss_gap:>8.4f} {r.tokens_per_param:>6.1f} {ex:>6} {r.method}"
                         + (" (extrapolated, laws not identified)" if r.extrapolated else ""))
        if self.savings_range is not None:
            lo, hi = self.savings_range
            lines.append(f"savings range: {100 * lo:.2f}% to {100 * hi:.2f}%")
        lines.extend(f"warning: {w}" for w in self.warnings)
        return "\n".join(lines)


# -- savings ---------------------------------------------------------------------------------
def _matched(ref: FittedLaw, cand: FittedLaw, theta_r: np.ndarray, theta_c: np.ndarray, C: np.ndarray,
             S: float | None, convention: str, span: float) -> dict[str, np.ndarray]:
    """The matched computes and losses; theta (..., P) and C broadcast."""
    fr = frontier(ref.law, theta_r, C, cost=ref.cost, S=S)
    fc = frontier(cand.law, theta_c, C, cost=cand.cost, S=S)
    if convention == "candidate-budget":
        c_ref, status = compute_for_loss(ref.law, theta_r, fc.loss, C, cost=ref.cost, S=S, span=span)
        c_cand, loss = np.broadcast_to(C, c_ref.shape), np.broadcast_to(fc.loss, c_ref.shape)
    else:
        c_cand, status = compute_for_loss(cand.law, theta_c, fr.loss, C, cost=cand.cost, S=S,
                                          span=span)
        c_ref, loss = np.broadcast_to(C, c_cand.shape), np.broadcast_to(fr.loss, c_cand.shape)
    return {"c_cand": c_cand, "c_ref": c_ref, "loss": loss, "status": status,
            "savings": 1.0 - c_cand / c_ref, "gap": fr.loss - fc.loss,
            "tpp_ref": fr.tokens_per_param, "tpp_cand": fc.tokens_per_param}


def _far_warning(rows: Sequence[SavingsRow]) -> str | None:
    far = [r for r in rows if r.savings is not None and r.extrapolation_decades is not None
           and r.extrapolation_decades > EXTRAPOLATION_WARN_DECADES]
    if not far:
        return None
    worst = max(r.extrapolation_decades for r in far)
    return (f"{len({r.budget for r in far})} budget(s) extrapolate more than {EXTRAPOLATION_WARN_DECADES:g} "
            f"decade beyond the largest fitted compute (up to {worst:.2f} decades): treat those savings as "
            "extrapolations")


def _where(budget: float, sparsity: float | None) -> str:
    """How warnings name a row: its budget, and its sparsity where the law has one."""
    return f"budget {budget:.3g}" + ("" if sparsity is None else f", S={sparsity:g}")


def _decades(compute: float, top: float | None) -> float | None:
    return None if top is None else float(np.log10(compute / top))


def check_budget_count(n: int) -> None:
    """Refuse more than MAX_BUDGETS budgets (each costs a vectorised bisection over the resamples)."""
    if n > MAX_BUDGETS:
        raise UserError(f"{n} budgets asked for; at most {MAX_BUDGETS} per call")


def check_budgets(budgets: Iterable[float]) -> np.ndarray:
    """Budgets as a float array; one-line error unless every one is a finite positive number and
    there are at most MAX_BUDGETS of them."""
    b = np.atleast_1d(np.asarray(list(budgets), dtype=float))
    if b.size == 0:
        raise UserError("no budget given")
    check_budget_count(int(b.size))
    bad = [v for v in b if not (np.isfinite(v) and v > 0)]
    if bad:
        raise UserError(f"budget must be a positive number of FLOPs, got {bad[0]:g}")
    return b


def savings(reference: FittedLaw, candidate: FittedLaw, budgets: Iterable[float] | float, *,
            sparsities: Sequence[float | None] = (None,), convention: str = "candidate-budget",
            level: float = 0.95, span: float = SPAN_DECADES, source: str = "") -> SavingsResult:
    """Savings of ``candidate`` over ``reference`` at each budget (FLOPs) and sparsity.

    Raises UserError for a bad budget, sparsity or convention, and :class:`Unmatched` when the
    point estimate's matching compute lies outside ``span`` decades of the budget.
    """
    if convention not in CONVENTIONS:
        raise UserError(f"unknown convention {convention!r}; choose one of: {', '.join(CONVENTIONS)}")
    if not 0.0 < level < 1.0:
        raise UserError(f"interval level must lie in (0, 1), got {level}")
    C = check_budgets(np.atleast_1d(budgets))
    sparsities = check_sparsities(sparsities, uses_sparsity(reference.law) or uses_sparsity(candidate.law))

    warnings: list[str] = []
    paired = None
    if reference.samples is not None and candidate.samples is not None:
        K = min(len(reference.samples), len(candidate.samples))
        if len(reference.samples) != len(candidate.samples):
            warnings.append(f"bootstrap sizes differ ({len(reference.samples)} vs {len(candidate.samples)}); "
                            f"pairing the first {K} resamples")
        sr, sc = reference.samples[:K], candidate.samples[:K]
        ok = np.isfinite(sr).all(axis=1) & np.isfinite(sc).all(axis=1)
        if not ok.all():
            warnings.append(f"dropped {int((~ok).sum())} bootstrap resamples with non-finite parameters")
        paired = (sr[ok], sc[ok]) if ok.any() else None
        if paired is not None and len(paired[0]) < MIN_CI_RESAMPLES:
            warnings.append(f"{len(paired[0])} paired bootstrap resamples: no savings interval (a "
                            f"{100 * level:.4g}% percentile interval needs at least {MIN_CI_RESAMPLES})")
            paired = None
    elif (reference.samples is None) != (candidate.samples is None):
        lacking = reference.name if reference.samples is None else candidate.name
        warnings.append(f"no bootstrap samples for {lacking}: no savings interval")

    solved = "reference" if convention == "candidate-budget" else "candidate"
    rows: list[SavingsRow] = []
    for c in C:
        for s in sparsities:
            m = _matched(reference, candidate, reference.theta, candidate.theta, np.array(c), s,
                         convention, span)
            st = int(m["status"])
            where = _where(float(c), s)
            if st == 1:
                who = reference.name if solved == "reference" else candidate.name
                raise Unmatched(f"the {solved} ({who}) never reaches the other's loss {float(m['loss']):.4f} "
                                f"within {span:g} decades of compute above {where}", c, "not-reached")
            if st == -1:
                raise Unmatched(f"the {solved} already beats the other's loss {float(m['loss']):.4f} with "
                                f"{span:g} decades less compute than {where}", c, "already-beaten")
            s_ci = g_ci = None
            n_res = n_clamped = 0
            own: list[str] = []
            if paired is not None:
                mb = _matched(reference, candidate, paired[0], paired[1], np.array(c), s, convention, span)
                n_res, n_clamped = int(mb["savings"].size), int(np.count_nonzero(mb["status"]))
                s_ci = percentile_interval(mb["savings"], level)
                g_ci = percentile_interval(mb["gap"], level)
                if n_clamped:
                    own.append(f"{where}: in {n_clamped} of {n_res} resamples the {solved} does not "
                               f"reach the matched loss within {span:g} decades; their savings are "
                               "clamped to the bracket edge (the interval is a bound where it touches them)")
                    warnings.extend(own)
            c_cand, c_ref = float(m["c_cand"]), float(m["c_ref"])
            ex = [d for d in (_decades(max(c, c_cand), candidate.compute_max),
                              _decades(max(c, c_ref), reference.compute_max)) if d is not None]
            floors = [x for x in (candidate.compute_min, reference.compute_min) if x]
            below = float(np.log10(max(floors) / min(c, c_cand, c_ref))) if floors else 0.0
            rows.append(SavingsRow(
                budget=float(c), sparsity=None if s is None else float(s),
                candidate_compute=c_cand, reference_compute=c_ref, candidate_loss=float(m["loss"]),
                savings=float(m["savings"]), savings_ci=s_ci, loss_gap=float(m["gap"]), loss_gap_ci=g_ci,
                tokens_per_param=float(m["tpp_ref"]), candidate_tokens_per_param=float(m["tpp_cand"]),
                extrapolation_decades=max(ex) if ex else None, ci_resamples=n_res, ci_clamped=n_clamped,
                warnings=tuple(own), below_data_decades=below if below > 0 else None,
            ))

    far = _far_warning(rows)
    if far:
        warnings.append(far)
    lows = [(law.name, law.compute_min) for law in (reference, candidate) if law.compute_min is not None]
    low = [c for c in C if any(np.log10(cm / c) > EXTRAPOLATION_WARN_DECADES for _, cm in lows)]
    if low:
        warnings.append(f"{len(low)} budget(s) lie more than {EXTRAPOLATION_WARN_DECADES:g} decade below the "
                        "smallest fitted compute")
    return SavingsResult(
        reference=reference.name, candidate=candidate.name, convention=convention, rows=tuple(rows),
        ci_level=level, warnings=tuple(warnings),
        laws={reference.name: reference.law.name, candidate.name: candidate.law.name}, source=source,
    )


def law_distrust(fits: Mapping[str, Any]) -> str | None:
    """Why fitted laws should not answer inside their data, from each group's
    ``FitResult.diagnostics`` ({group: diagnostics}): not identified (``unidentified``) or a misfit
    (systematic residual trend, ``scaling.fitting.fit.goodness_of_fit``). None: every law is
    identified and fits."""
    why = []
    for g, diag in fits.items():
        diag = diag or {}
        u = unidentified(diag)
        if u:
            why.append(f"{g} not identified ({u})")
        if diag.get("misfit"):
            why.append(f"{g} misfits (systematic residual trend)")
    return "; ".join(why) or None


def disagreements(rows: Sequence[SavingsRow], checks: Sequence[SavingsRow]) -> list[str]:
    """One message per budget where a row and its cross-check (same budget and sparsity) disagree
    beyond their intervals: the two intervals do not overlap, or, where one has no interval, the
    other's interval excludes its point estimate."""
    by = {(c.budget, c.sparsity): c for c in checks if c.savings is not None}
    out = []
    for r in rows:
        c = by.get((r.budget, r.sparsity))
        if c is None or r.savings is None:
            continue
        a = r.savings_ci or (r.savings, r.savings)
        b = c.savings_ci or (c.savings, c.savings)
        if r.savings_ci is None and c.savings_ci is None:
            continue
        if a[1] < b[0] or b[1] < a[0]:
            def show(x: SavingsRow) -> str:
                ci = "" if x.savings_ci is None else (f" [{100 * x.savings_ci[0]:.1f}, "
                                                      f"{100 * x.savings_ci[1]:.1f}]%")
                return f"{x.method} {100 * x.savings:.1f}%{ci}"
            out.append(f"budget {r.budget:.3g}: {show(r)} and {show(c)} disagree beyond their intervals")
    return out


def withhold_unidentified(result: SavingsResult, reference: FittedLaw, candidate: FittedLaw, *,
                          max_decades: float = WITHHOLD_DECADES, extrapolate: bool = False) -> SavingsResult:
    """No point estimate from an unidentified or misfitting law outside its data.

    A law row whose extrapolation exceeds ``max_decades`` decades beyond the largest fitted
    compute, or whose budget or matched compute lies more than ``max_decades`` below the smallest
    (the larger of the two laws' smallest: an extrapolation down is one too), while either law is
    not identified (``FittedLaw.unidentified``: a parameter of the best fit on its bound, or most
    bootstrap fits on one; refusal ``unidentified-far``) or misfits its points
    (``FittedLaw.misfit``: a systematic residual trend; refusal ``misfit-far``), loses its numbers
    and says why: such a law's frontier outside the data is set by the bounds or by a form the data
    reject, not by the data. With ``extrapolate`` the numbers stay and the row is marked
    ``extrapolated`` instead.
    """
    if not np.isfinite(max_decades) or max_decades < 0:
        raise UserError(f"the extrapolation limit must be a non-negative number of decades, "
                        f"got {max_decades}")
    why = [f"{law.name}: {law.unidentified}" for law in (reference, candidate) if law.unidentified]
    misfits = [f"{law.name}: misfits its points (systematic residual trend)"
               for law in (reference, candidate) if law.misfit]
    if not why and not misfits:
        return result
    kind, what = (("unidentified-far", "laws not identified") if why
                  else ("misfit-far", "laws that misfit their points"))
    floors = [law.compute_min for law in (reference, candidate) if law.compute_min]
    trained = trained_sparsities(reference, candidate)
    rows = []
    for r in result.rows:
        far = (r.method == "law" and r.extrapolation_decades is not None
               and r.extrapolation_decades > max_decades)
        # below the data is outside it too: the smallest compute the row uses under the larger floor
        lows = [x for x in (r.budget, r.candidate_compute, r.reference_compute) if x and x > 0]
        below = (float(np.log10(max(floors) / min(lows)))
                 if r.method == "law" and floors and lows and r.savings is not None else 0.0)
        # a sparsity the fitted runs did not span is outside the data as well (the S-dependence)
        off_s = r.method == "law" and outside_sparsities(r.sparsity, trained)
        if (not far and below <= max_decades and not off_s) or r.savings is None:
            rows.append(r)
        elif extrapolate:
            rows.append(replace(r, extrapolated=True))
        else:
            where = (f"the budget lies {r.extrapolation_decades:.1f} decades beyond the fitted compute"
                     if far else f"the budget lies {below:.2f} decades below the fitted compute"
                     if below > max_decades else
                     f"the sparsity {r.sparsity:g} lies outside the fitted sparsities "
                     f"({min(trained):g} to {max(trained):g})")
            rows.append(SavingsRow.refused(
                r.budget, refusal=kind,
                reason=f"{what} ({'; '.join(why + misfits)}) and {where} (limit {max_decades:g} "
                "decades): the data cannot speak to it", method=r.method, sparsity=r.sparsity,
                extrapolation_decades=r.extrapolation_decades))
    old, new = _far_warning(result.rows), _far_warning(rows)
    gone = withheld_warnings(result.rows, rows)
    warnings = [w for w in result.warnings if w != old and w not in gone] + ([new] if new else [])
    return replace(result, rows=tuple(rows), warnings=tuple(warnings))


def trained_sparsities(*laws: FittedLaw) -> list[float]:
    """The sparsities the laws' data were trained at (fitted points, or a law set's levels)."""
    return [x for law in laws for x in law.sparsities]


def outside_sparsities(s: float | None, trained: Sequence[float]) -> bool:
    """A sparsity outside the span of the trained ones (none known: not outside), where a smelt-form
    law's S-dependence is extrapolated."""
    return (s is not None and bool(trained)
            and not min(trained) - SPARSITY_ATOL <= s <= max(trained) + SPARSITY_ATOL)


def sparsity_warning(reference: FittedLaw, candidate: FittedLaw,
                     sparsities: Sequence[float | None]) -> str | None:
    """A warning for the sparsities asked outside those the laws' data trained at: there the laws'
    S-dependence (A (1 - S)^b) is extrapolated, which the compute column cannot show."""
    trained = trained_sparsities(reference, candidate)
    out = [s for s in sparsities if outside_sparsities(s, trained)]
    if not out:
        return None
    return (f"sparsity {', '.join(f'{s:g}' for s in out)} lies outside the sparsities the laws' data "
            f"trained at ({min(trained):g} to {max(trained):g}): the laws' dependence on S is "
            "extrapolated there")


def withheld_warnings(before: Sequence[SavingsRow], after: Sequence[SavingsRow]) -> set[str]:
    """The warnings of the rows that lost their number between ``before`` and ``after`` (the same rows,
    in order): a withheld row has no interval, so its own warnings (about its resamples) go with it."""
    return {w for r, kept in zip(before, after) if r.savings is not None and kept.savings is None
            for w in r.warnings}
