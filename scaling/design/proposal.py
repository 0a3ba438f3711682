"""Design the next runs: IsoFLOP sets around each law's compute-optimal size, with buildable configs.

IsoFLOP set at a budget C (Hoffmann et al. 2022, approach 2): models of several sizes, each trained
with the same total training compute C = F * D, F the config's exact training FLOPs per token
(``scaling.accounting.costs``), so D = C / F. For a chinchilla-form law this is D = C / (k N) with k = F / N
of that config (not the median k of the fit, so that every run really spends C).

Size grid. Each law has a compute-optimal size x*(C) (``scaling.fitting.savings.frontier``): N* for the
chinchilla form (N = active non-embedding parameters, C = F(N) D with the fit's per-token FLOPs
model), F* for the smelt form (C = F D at a sparsity S). Both architectures share one set of
Baseline configs and every SMELT run is the matched twin of one of them
(``scaling.accounting.matching.smelt_twin``: same F, so the pair trains the same D = C/F).
In Baseline coordinates (the Baseline's own N or F) the SMELT optimum sits at the Baseline whose
twin has size x*_smelt. The grid is ``n`` sizes log-spaced in Baseline coordinates
between the lowest and the highest of the four edges x*_arch 10^(+-spread), each mapped to the
Baseline that builds it (the twin/Baseline size ratio drifts with scale), so that every
architecture's sizes reach ``spread`` decades either side of its own optimum.

Spread. The IsoFLOP profile L(x) = E + P x^-p + Q (C/(k x))^-q is flat at x*: its rise over L*
grows like (p q / 2) (L* - E)/L* (ln 10 u)^2 near the optimum (u decades away), so a parabola's
vertex is located only when the rise at the edges is well above the noise of the losses. The
default +-0.5 decade (a factor ~3.2 either side) with at least ``MIN_SIZES`` = 5 sizes keeps the
optimum inside and the profile depth (the smaller edge's rise, reported per set) at 3.2 / 1.8 /
0.9% for Epoch's Chinchilla fit at 1e19 / 1e21 / 1e23 FLOPs and 2.4-4.3% for the SMELT paper's
laws at 1e20-1e21 (computed from the laws); the depth shrinks as L* approaches E, so large
budgets need a wider ``spread`` or less noisy losses. Approach 2 on the design's
noise-free expected losses (``scaling.fitting.approaches.isoflop_optima``) reports the vertex offset
from x*: the parabola bias of this design (Besiroglu et al. 2024).

The sizes are built by ``scaling.design.sizing``; ``scaling.design.output`` writes a proposal as a
sweep plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from scaling.accounting.config import ModelConfig
from scaling.accounting.tiers import ARCHS, TIERS
from scaling.common.errors import UserError
from scaling.common.serialize import Record, from_dict
from scaling.common.stats import percentile_interval
from scaling.design.sizing import SizedPair, law_inputs_of, measure, nearest_tiers, pair_for_size, size_name
from scaling.fitting.approaches import isoflop_optima
from scaling.fitting.savings import (
    EXTRAPOLATION_WARN_DECADES,
    FittedLaw,
    check_budgets,
    check_sparsities,
    frontier,
    uses_sparsity,
)

SPREAD_DECADES = 0.5
MIN_SIZES = 5
MAX_SIZES = 50    # sizes per budget: beyond any IsoFLOP sweep (7 by default); a typo cannot run for ever
DEFAULT_SIZES = 7


# -- planned points and sets ---------------------------------------------------------------------
def expected_loss(
    law: FittedLaw, inputs: Mapping[str, float], level: float = 0.95
) -> tuple[float, tuple[float, float] | None]:
    """Loss the law predicts at one point, and its percentile interval over the bootstrap samples."""
    x = {k: np.array([inputs[k]]) for k in law.law.inputs}
    L = float(law.law.predict(law.theta, **x)[0])
    if law.samples is None:
        return L, None
    return L, percentile_interval(law.law.predict(law.samples, **x)[:, 0], level)


@dataclass(frozen=True)
class PlannedPoint(Record):
    """One run of an IsoFLOP set: its tier (a custom [model] table), arch, config and tokens.

    N active non-embedding params, F training FLOPs/token, S compute-equivalent sparsity of the
    arch's config; D tokens (shared by the pair); compute = F D; offset_decades = log10(size /
    x*) of this arch's size against its law's optimum; expected_loss in nats/token with its
    bootstrap interval (None without bootstrap samples).
    """

    tier: str
    arch: str
    N: int
    F: int
    S: float
    D: int
    compute: float
    offset_decades: float
    expected_loss: float
    loss_ci: tuple[float, float] | None
    config: ModelConfig

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["config"] = {k: v for k, v in d["config"].items() if k != "name"}  # the tier names it
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "PlannedPoint":
        return from_dict(cls, {**d, "config": {**d["config"], "name": str(d["tier"])}})


@dataclass(frozen=True)
class IsoFlopSet(Record):
    """The planned runs at one budget (and sparsity), both architectures.

    optima: arch -> {"size", "tokens", "loss", "tokens_per_param"} of its law at the budget.
    bracketed: whether min(size) < x* < max(size) for the arch's planned configs.
    profile_depth: min(L(first), L(last)) / min L - 1 of the noise-free expected losses.
    vertex_offset_decades: log10(approach-2 vertex / x*) on those losses (None if no vertex).
    """

    budget: float
    sparsity: float | None
    size_name: str
    optima: Mapping[str, Mapping[str, float]]
    points: tuple[PlannedPoint, ...]
    bracketed: Mapping[str, bool]
    profile_depth: Mapping[str, float]
    vertex_offset_decades: Mapping[str, float | None]
    extrapolation_decades: float | None = None

    _computed = ("flops",)

    @property
    def flops(self) -> float:
        return float(sum(p.compute for p in self.points))

    def arch_points(self, arch: str) -> list[PlannedPoint]:
        return [p for p in self.points if p.arch == arch]


def tier_label(budget_: float, sparsity: float | None, index: int) -> str:
    """Custom tier name of the index-th size (1-based) of a set: iso1e20-3, iso1e20-s0.95-3."""
    c = f"{budget_:.2g}".replace("e+", "e")
    s = "" if sparsity is None else f"-s{sparsity:.3g}"
    return f"iso{c}{s}-{index}"


@dataclass(frozen=True)
class Proposal(Record):
    """IsoFLOP sets proposed from two fitted laws (``scaling.design.output`` writes them as a sweep plan)."""

    law: str
    shape: str
    width_multiple: int
    proxy: bool
    spread_decades: float
    sizes_per_budget: int
    ci_level: float
    sets: tuple[IsoFlopSet, ...]
    source: str = ""
    warnings: tuple[str, ...] = ()

    _computed = ("n_runs", "total_flops")

    @property
    def total_flops(self) -> float:
        return float(sum(s.flops for s in self.sets))

    @property
    def n_runs(self) -> int:
        return sum(len(s.points) for s in self.sets)

    def tiers(self) -> list[str]:
        seen: list[str] = []
        for s in self.sets:
            for p in s.points:
                if p.tier not in seen:
                    seen.append(p.tier)
        return seen

    def summary(self) -> str:
        lines = [
            f"IsoFLOP plan ({self.law} law, {self.shape} shape, +-{self.spread_decades:g} decade around "
            f"the optima): {self.n_runs} runs, {self.total_flops:.3g} FLOPs"
        ]
        for s in self.sets:
            where = f"C = {s.budget:.3g}" + ("" if s.sparsity is None else f", S = {s.sparsity:g}")
            opt = ", ".join(f"{a} {s.size_name}* {o['size']:.3g}" for a, o in s.optima.items())
            lines.append(
                f"  {where}: {opt}; depth "
                + ", ".join(f"{a} {100 * v:.2f}%" for a, v in s.profile_depth.items())
            )
            for p in s.points:
                lines.append(
                    f"    {p.tier:<18} {p.arch:<8} N {p.N:>12,d} F {p.F:>14,d} D {p.D:>14,d} "
                    f"({p.offset_decades:+.2f} dec) L {p.expected_loss:.4f}"
                )
        lines += [f"  warning: {w}" for w in self.warnings]
        return "\n".join(lines)


@dataclass(frozen=True)
class _SizeRule:
    """How one tier's shape spans the sizes of a set: its Baseline config, the size measured (N or F),
    the width step, sizes per budget and their spread in decades around each optimum."""

    shape: ModelConfig
    size: str
    width_multiple: int
    n_sizes: int
    spread: float

    def pair(self, target: float, arch: str, S: float | None) -> SizedPair:
        return pair_for_size(self.shape, target, arch=arch, size=self.size,
                             width_multiple=self.width_multiple, sparsity=S)


def _set_for_budget(laws: Mapping[str, FittedLaw], C: float, S: float | None, rule: _SizeRule, level: float,
                    warnings: list[str]) -> IsoFlopSet:
    """The IsoFLOP set at budget C (and sparsity S): sizes spanning both optima, their points, profile."""
    optima = {a: frontier(laws[a].law, laws[a].theta, C, cost=laws[a].cost, S=S) for a in ARCHS}
    where = f"budget {C:.3g}" + ("" if S is None else f", S={S:g}")
    pairs = _size_grid(_edges(optima, S, rule, where), S, rule, where, warnings)
    points = _planned_points(laws, pairs, optima, C, S, rule.size, level)
    bracketed, depth, vertex = _profile(points, optima, rule.size)
    tops = [laws[a].compute_max for a in ARCHS if laws[a].compute_max is not None]
    extrap = math.log10(C / max(tops)) if tops else None
    return IsoFlopSet(
        budget=float(C),
        sparsity=None if S is None else float(S),
        size_name=rule.size,
        optima={
            a: {
                "size": float(o.size),
                "tokens": float(o.tokens),
                "loss": float(o.loss),
                "tokens_per_param": float(o.tokens_per_param),
            }
            for a, o in optima.items()
        },
        points=tuple(points),
        bracketed=bracketed,
        profile_depth=depth,
        vertex_offset_decades=vertex,
        extrapolation_decades=extrap,
    )


def _edges(optima: Mapping[str, Any], S: float | None, rule: _SizeRule, where: str) -> list[float]:
    """log10 of each arch's optimum +-spread, in Baseline coordinates (the twin/Baseline size ratio
    drifts with scale, so the SMELT edges are mapped one by one, not shifted)."""
    edges: list[float] = []
    for arch in ARCHS:
        for u in (-rule.spread, rule.spread):
            target = float(optima[arch].size) * 10.0**u
            try:
                pair = rule.pair(target, arch, S)
            except UserError as exc:
                raise UserError(
                    f"{where}: cannot build the {arch} config of {rule.size} = {target:.3g} "
                    f"({u:+g} decade from its optimum): {exc}"
                ) from None
            edges.append(math.log10(measure(pair.baseline, rule.size)))
    return edges


def _size_grid(edges: list[float], S: float | None, rule: _SizeRule, where: str,
               warnings: list[str]) -> list[SizedPair]:
    """``n_sizes`` log-spaced Baseline sizes between the edges, built and deduplicated (width steps
    can round two sizes to one config); UserError below ``MIN_SIZES`` distinct configs."""
    pairs: list[SizedPair] = []
    for g in np.linspace(min(edges), max(edges), rule.n_sizes):
        try:
            pair = rule.pair(10.0**g, "baseline", S)
        except UserError as exc:
            raise UserError(
                f"{where}: cannot build the Baseline of {rule.size} = {10.0**g:.3g}: {exc}"
            ) from None
        if pairs and pair.baseline == pairs[-1].baseline:
            continue
        pairs.append(pair)
    if len(pairs) < rule.n_sizes:
        warnings.append(
            f"{where}: {rule.n_sizes - len(pairs)} sizes of the grid round to the same config "
            f"(width steps of {rule.width_multiple}); {len(pairs)} distinct sizes kept"
        )
    if len(pairs) < MIN_SIZES:
        raise UserError(
            f"{where}: only {len(pairs)} distinct configs in the size range (need {MIN_SIZES}); "
            "widen the spread or choose a larger reference shape (tier)"
        )
    return pairs


def _planned_points(laws: Mapping[str, FittedLaw], pairs: Sequence[SizedPair], optima: Mapping[str, Any],
                    C: float, S: float | None, size: str, level: float) -> list[PlannedPoint]:
    """Both archs' runs at each size pair: tokens D = C / F of the Baseline, expected loss with interval."""
    points: list[PlannedPoint] = []
    for i, pair in enumerate(pairs, start=1):
        tier = tier_label(C, S, i)
        D = max(1, int(round(C / measure(pair.baseline, "F"))))
        for arch in ARCHS:
            cfg = pair.config(arch).replace(name=tier if arch == "baseline" else f"{tier}-smelt")
            x = law_inputs_of(cfg, D)
            L, ci = expected_loss(laws[arch], x, level)
            points.append(
                PlannedPoint(
                    tier=tier,
                    arch=arch,
                    N=int(x["N"]),
                    F=int(x["F"]),
                    S=x["S"],
                    D=D,
                    compute=x["F"] * D,
                    offset_decades=math.log10(x[size] / float(optima[arch].size)),
                    expected_loss=L,
                    loss_ci=ci,
                    config=cfg,
                )
            )
    return points


def _profile(points: Sequence[PlannedPoint], optima: Mapping[str, Any],
             size: str) -> tuple[dict[str, bool], dict[str, float], dict[str, float | None]]:
    """Per arch: is the optimum inside the sizes, how deep is the expected-loss profile at its edges,
    and where does an IsoFLOP parabola through the expected losses put its vertex (decades off)."""
    bracketed, depth, vertex = {}, {}, {}
    for arch in ARCHS:
        pts = [p for p in points if p.arch == arch]
        sizes = np.array([p.N if size == "N" else p.F for p in pts], dtype=float)
        L = np.array([p.expected_loss for p in pts])
        x_star = float(optima[arch].size)
        bracketed[arch] = bool(sizes.min() < x_star < sizes.max())
        depth[arch] = float(min(L[0], L[-1]) / L.min() - 1.0)
        used, _ = isoflop_optima(sizes, np.array([p.compute for p in pts]), L)
        vertex[arch] = math.log10(used[0]["N_opt"] / x_star) if len(used) == 1 else None
    return bracketed, depth, vertex


def _check_laws(laws: Mapping[str, FittedLaw]) -> str:
    """The one law form of both architectures' laws."""
    missing = [a for a in ARCHS if a not in laws]
    if missing:
        raise UserError(f"planning needs a law for each architecture; missing {', '.join(missing)}")
    names = {laws[a].law.name for a in ARCHS}
    if len(names) != 1:
        raise UserError(f"the two laws must have the same form, got {', '.join(sorted(names))}")
    return names.pop()


def _check_options(laws: Mapping[str, FittedLaw], n_sizes: int, spread: float, level: float,
                   sparsities: Sequence[float | None], tier: str | None) -> tuple[float | None, ...]:
    """UserError for a bad option; returns the sparsities (``(None,)`` for none given)."""
    if int(n_sizes) > MAX_SIZES:
        raise UserError(f"the number of sizes per budget must be <= {MAX_SIZES} (one training run each), "
                        f"got {n_sizes}")
    if int(n_sizes) < MIN_SIZES:
        raise UserError(
            f"the number of sizes per budget must be >= {MIN_SIZES}: an IsoFLOP parabola (approach 2) needs "
            f"at least {MIN_SIZES} sizes, got {n_sizes}"
        )
    if not (math.isfinite(spread) and 0.05 <= spread <= 3.0):
        raise UserError(f"the spread must lie in [0.05, 3] decades, got {spread:g}")
    if not 0.0 < level < 1.0:
        raise UserError(f"interval level must lie in (0, 1), got {level}")
    sparsities = check_sparsities(sparsities, uses_sparsity(laws["baseline"].law))
    if tier is not None and tier not in TIERS:
        raise UserError(f"unknown tier {tier!r}; known tiers: {', '.join(TIERS)}")
    return sparsities


def _nearest_tiers(laws: Mapping[str, FittedLaw], C: np.ndarray, sparsities: Sequence[float | None],
                   size: str) -> list[str]:
    """The shipped shapes nearest the Baseline optimum at the budgets' geometric middle, nearest first
    (the first whose family can build every planned size wins)."""
    mid = float(np.exp(np.mean(np.log(C))))
    base = laws["baseline"]
    opt = frontier(base.law, base.theta, mid, cost=base.cost, S=sparsities[0])
    return nearest_tiers(float(opt.size), size)


def _first_buildable(laws: Mapping[str, FittedLaw], C: np.ndarray, sparsities: Sequence[float | None],
                     candidates: Sequence[str], size: str, n_sizes: int, spread: float,
                     level: float) -> tuple[str, list[IsoFlopSet], list[str]]:
    """The first candidate tier whose shape builds every set: (tier, sets, warnings so far)."""
    first_error = None
    for name in candidates:
        spec = TIERS[name]
        rule = _SizeRule(spec.baseline, size, spec.width_multiple, n_sizes, spread)
        warnings: list[str] = []
        try:
            sets = [_set_for_budget(laws, float(c), s, rule, level, warnings) for c in C for s in sparsities]
        except UserError as exc:
            first_error = first_error or UserError(f"{name} shape: {exc}")
            continue
        return name, sets, warnings
    if len(candidates) > 1:
        raise UserError(f"no shipped tier's shape can build every planned size; nearest: {first_error}")
    raise first_error


def _set_warnings(sets: Sequence[IsoFlopSet], noise: float | None) -> list[str]:
    """Per set and arch: an optimum outside the sizes, a profile too shallow for the noise, extrapolation."""
    warnings: list[str] = []
    for st in sets:
        where = f"budget {st.budget:.3g}" + ("" if st.sparsity is None else f", S={st.sparsity:g}")
        for arch in ARCHS:
            if not st.bracketed[arch]:
                warnings.append(f"{where}: the {arch} optimum is not inside the planned sizes")
            if noise is not None and st.profile_depth[arch] < 3.0 * noise:
                warnings.append(
                    f"{where}: the {arch} profile rises only {100 * st.profile_depth[arch]:.2f}% at "
                    f"its edges, under 3x the fits' RMSE ({100 * noise:.2f}%): widen the spread"
                )
        if st.extrapolation_decades is not None and st.extrapolation_decades > EXTRAPOLATION_WARN_DECADES:
            warnings.append(
                f"{where}: {st.extrapolation_decades:.2f} decades beyond the largest fitted compute; "
                "the optima (and so the sizes) are extrapolated"
            )
    return warnings


def propose(
    laws: Mapping[str, FittedLaw],
    budgets: Sequence[float] | float,
    *,
    tier: str | None = None,
    n_sizes: int = DEFAULT_SIZES,
    spread: float = SPREAD_DECADES,
    sparsities: Sequence[float | None] = (None,),
    level: float = 0.95,
    noise: float | None = None,
    source: str = "",
) -> Proposal:
    """IsoFLOP sets at each budget (and sparsity) for the 'baseline' and 'smelt' laws (see module doc).

    ``noise``: the fits' RMSE of log loss, if known; a set whose profile depth is below 3x it is
    flagged. Raises UserError for bad options and for sizes the size rule or the matcher cannot build.
    """
    law_name = _check_laws(laws)
    size = size_name(law_name)
    C = check_budgets(np.atleast_1d(budgets))
    sparsities = _check_options(laws, n_sizes, spread, level, sparsities, tier)
    candidates = [tier] if tier is not None else _nearest_tiers(laws, C, sparsities, size)
    tier, sets, warnings = _first_buildable(laws, C, sparsities, candidates, size, int(n_sizes),
                                            float(spread), level)
    spec = TIERS[tier]
    labels = [p.tier for st in sets for p in st.arch_points("baseline")]
    if len(set(labels)) != len(labels):
        raise UserError(
            "two budgets give the same tier name; give budgets that differ in their first 2 digits"
        )
    warnings += [f"the {arch} law is not identified ({laws[arch].unidentified}; `smelt-scale fit` says "
                 "why): its optimum and the expected losses below are no result (`savings` gives none "
                 "from it), only the centre the sizes spread around"
                 for arch in ARCHS if laws[arch].unidentified]
    warnings += _set_warnings(sets, noise)
    return Proposal(
        law=law_name,
        shape=tier,
        width_multiple=spec.width_multiple,
        proxy=spec.proxy,
        spread_decades=float(spread),
        sizes_per_budget=int(n_sizes),
        ci_level=float(level),
        sets=tuple(sets),
        source=source,
        warnings=tuple(warnings),
    )

