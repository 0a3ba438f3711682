"""Design the next runs: IsoFLOP sets around each law's compute-optimal size, with buildable configs.

IsoFLOP set at a budget C (Hoffmann et al. 2022, approach 2): models of several sizes, each trained
with the same total training compute C = F * D, F the config's exact training FLOPs per token
(``scaling.accounting.costs``), so D = C / F. For a chinchilla-form law this is D = C / (k N) with k = F / N
of that config (not the median k of the fit, so that every run really spends C).

Size grid. Each law has a compute-optimal size x*(C) (``scaling.fitting.savings.frontier``): N* for the
chinchilla form (N = active non-embedding parameters, C = k N D), F* for the smelt form (C = F D
at a sparsity S). Both architectures share one set of Baseline configs and every SMELT run is the
matched twin of one of them (``scaling.accounting.matching.smelt_twin``: same F, so the pair trains the same
D = C/F). In Baseline coordinates (the Baseline's own N or F) the SMELT optimum sits at the
Baseline whose twin has size x*_smelt. The grid is ``n`` sizes log-spaced in Baseline coordinates
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

Size -> config rule. A reference tier's Baseline (the *shape*, ``scaling.accounting.tiers``) keeps its depth,
query/KV heads, head dim, top-k, vocabulary and context; d_model and expert_hidden (and a shared
expert) are scaled by one factor s, each rounded to a multiple of the tier's width multiple. s is
found by bisection in log s so that the Baseline's size (N or F) hits the target, and of the two
rounded widths around the crossing the closer in log is kept. For the smelt form at sparsity S
the expert count E is solved as well: S = 1 - N_act_eq / N (``scaling.accounting.costs.sparsity``) rises
with E, and (1 - S) N(E) = N_act_eq(E) is linear in E. The SMELT twin is ``smelt_twin`` of that
Baseline with the tier's width multiple, which is what ``scaling.training.sweep_plan`` derives again from the
emitted ``[model."name"]`` table; where the matcher cannot twin a Baseline within its 1% tolerance
(integer rounding at small widths), the nearest sizes within +-10% are tried. A built size more
than 25% from its target is an error. The default shape is the tier whose Baseline is nearest (in
log) to the Baseline optimum at the geometric mean of the budgets, among those whose family can
build every planned size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from scaling.accounting.config import ModelConfig
from scaling.accounting.costs import costs, dense_equivalent_params, non_embedding_params
from scaling.accounting.matching import smelt_twin
from scaling.accounting.tiers import TIERS, tier_names
from scaling.common.errors import UserError
from scaling.fitting.approaches import isoflop_optima
from scaling.fitting.laws import get_law
from scaling.fitting.savings import (
    EXTRAPOLATION_WARN_DECADES,
    FittedLaw,
    check_budgets,
    frontier,
    uses_sparsity,
)
from scaling.fitting.tables import CANONICAL

ARCHS = ("baseline", "smelt")
SPREAD_DECADES = 0.5
MIN_SIZES = 5
DEFAULT_SIZES = 7
SPARSITY_TOLERANCE = 0.03    # |S_config - S| accepted: with ~8 experts one expert moves S by ~0.04
_BISECT_STEPS = 60
_SIZE_TOLERANCE = math.log(1.25)   # a built size further than this from its target is an error
_NUDGES = tuple(1.0 + sign * step for step in (0.0, 0.02, 0.04, 0.06, 0.08, 0.10) for sign in (1, -1))[1:]
_NOT_IN_PLAN = ("name", "loop_start", "loop_end", "n_loops")
_TWIN_ITERS = 8


# -- size measures -----------------------------------------------------------------------------
def size_name(law_name: str) -> str:
    """The size variable of a law form: 'N' (active non-embedding params) or 'F' (FLOPs/token)."""
    return get_law(law_name).size_input


def measure(cfg: ModelConfig, name: str) -> float:
    """Size of a config: N = active non-embedding parameters, F = training FLOPs per token."""
    b = costs(cfg)
    return float(b.active_params if name == "N" else b.flops_per_token)


def law_inputs_of(cfg: ModelConfig, D: float) -> dict[str, float]:
    """The inputs every law form reads, for one config trained on D tokens."""
    b = costs(cfg)
    return {"N": float(b.active_params), "F": float(b.flops_per_token), "S": float(b.sparsity), "D": float(D)}


# -- size -> config rule -------------------------------------------------------------------------
def scaled_baseline(shape: ModelConfig, scale: float, width_multiple: int,
                    n_experts: int | None = None) -> ModelConfig:
    """The shape with d_model, expert_hidden (and a shared expert) times ``scale``, rounded to
    multiples of ``width_multiple`` (at least one multiple); optionally another expert count."""
    w = int(width_multiple)

    def rnd(x: int) -> int:
        return max(w, int(round(x * scale / w)) * w)

    return shape.replace(
        d_model=rnd(shape.d_model),
        expert_hidden=rnd(shape.expert_hidden),
        shared_expert_hidden=0 if shape.shared_expert_hidden == 0 else rnd(shape.shared_expert_hidden),
        n_experts=shape.n_experts if n_experts is None else int(n_experts),
    )


def experts_for_sparsity(cfg: ModelConfig, S: float) -> int:
    """Expert count E giving compute-equivalent sparsity closest to S at cfg's widths.

    N(E) and N_act_eq(E) are both linear in E (experts, router), so (1 - S) N(E) = N_act_eq(E) is
    solved in closed form and its floor and ceiling compared exactly.
    """
    if not 0.0 <= S < 1.0:
        raise UserError(f"sparsity must lie in [0, 1), got {S:g}")
    k = cfg.top_k
    c0, c1 = cfg.replace(n_experts=k), cfg.replace(n_experts=k + 1)
    p0, p1 = non_embedding_params(c0), non_embedding_params(c1)
    q0, q1 = dense_equivalent_params(c0), dense_equivalent_params(c1)
    denom = (1.0 - S) * (p1 - p0) - (q1 - q0)
    e = k if denom <= 0 else k + (q0 - (1.0 - S) * p0) / denom
    options = {max(k, math.floor(e)), max(k, math.ceil(e))}
    best = min(options, key=lambda E: abs(costs(cfg.replace(n_experts=E)).sparsity - S))
    got = costs(cfg.replace(n_experts=best)).sparsity
    if abs(got - S) > SPARSITY_TOLERANCE:
        raise UserError(
            f"sparsity {S:g} is out of reach of this shape (d_model {cfg.d_model}, top_k {k}): "
            f"the closest expert count {best} gives {got:.4f}"
        )
    return best


def baseline_for_size(
    shape: ModelConfig, target: float, *, size: str, width_multiple: int, sparsity: float | None = None
) -> ModelConfig:
    """The Baseline of ``shape``'s family whose size (``size`` = 'N' or 'F') is nearest ``target``."""
    if not (math.isfinite(target) and target > 0):
        raise UserError(f"a model size must be a positive number, got {target!r}")

    def build(s: float) -> ModelConfig | None:
        cfg = scaled_baseline(shape, s, width_multiple)
        if sparsity is not None:
            try:
                cfg = cfg.replace(n_experts=experts_for_sparsity(cfg, sparsity))
            except UserError:
                # too narrow for this sparsity (the router's E logits per token outweigh the experts')
                return None
        return cfg

    def size_at(log_s: float) -> float:
        cfg = build(math.exp(log_s))
        return -math.inf if cfg is None else measure(cfg, size)

    label = shape.name or "reference"
    lo = math.log(width_multiple / max(shape.d_model, shape.expert_hidden))
    if size_at(lo) > target:
        raise UserError(
            f"{size} = {target:.3g} is below the smallest config of the {label} shape "
            f"({size} = {size_at(lo):.3g} at width {width_multiple})"
        )
    hi = 0.0
    while size_at(hi) < target:
        hi += math.log(2.0)
        if hi > math.log(1e4):
            raise UserError(
                f"{size} = {target:.3g} needs the {label} shape scaled by more than 10^4 in "
                "width; choose a larger --tier"
            )
    for _ in range(_BISECT_STEPS):
        mid = 0.5 * (lo + hi)
        if size_at(mid) < target:
            lo = mid
        else:
            hi = mid
    cands = [c for c in (build(math.exp(lo)), build(math.exp(hi))) if c is not None]
    best = min(cands, key=lambda c: abs(math.log(measure(c, size) / target)))
    got = measure(best, size)
    if abs(math.log(got / target)) > _SIZE_TOLERANCE:
        why = "" if sparsity is None else f" at sparsity {sparsity:g}"
        raise UserError(
            f"the {label} shape cannot build {size} = {target:.3g}{why}: the closest config has "
            f"{size} = {got:.3g} (d_model {best.d_model}); choose another --tier"
        )
    return best


def _matched_baseline(
    shape: ModelConfig, target: float, *, size: str, width_multiple: int, sparsity: float | None
):
    """``baseline_for_size`` and its twin; where the matcher cannot match that Baseline within its
    tolerance (integer rounding at small widths), the nearest sizes within +-10% are tried."""
    first = None
    for f in _NUDGES:
        base = baseline_for_size(
            shape, target * f, size=size, width_multiple=width_multiple, sparsity=sparsity
        )
        try:
            return base, smelt_twin(base, width_multiple=width_multiple)
        except UserError as exc:
            first = first or exc
    raise UserError(f"no Baseline within 10% of {size} = {target:.3g} has a matched twin: {first}")


@dataclass(frozen=True)
class SizedPair:
    """A Baseline, its SMELT twin (``smelt_twin``) and the relative mismatches of the twin."""

    baseline: ModelConfig
    smelt: ModelConfig
    mismatch: dict[str, float]

    def config(self, arch: str) -> ModelConfig:
        return self.baseline if arch == "baseline" else self.smelt


def pair_for_size(
    shape: ModelConfig,
    target: float,
    *,
    arch: str,
    size: str,
    width_multiple: int,
    sparsity: float | None = None,
) -> SizedPair:
    """Baseline + twin such that ``arch``'s config has size nearest ``target``.

    Where the matcher cannot twin the nearest Baseline, sizes up to 10% off are tried. For arch
    'smelt' the twin's size is reached by a fixed point on the ratio twin/Baseline size
    (the twin of a larger Baseline is larger), keeping the closest iterate.
    """
    if arch not in ARCHS:
        raise UserError(f"unknown arch {arch!r}; choose one of {', '.join(ARCHS)}")
    ratio, best = 1.0, None
    for _ in range(_TWIN_ITERS if arch == "smelt" else 1):
        base, m = _matched_baseline(
            shape, target / ratio, size=size, width_multiple=width_multiple, sparsity=sparsity
        )
        pair = SizedPair(baseline=base, smelt=m.smelt, mismatch=m.mismatch)
        err = abs(math.log(measure(pair.config(arch), size) / target))
        if best is None or err < best[0]:
            best = (err, pair)
        new = measure(m.smelt, size) / measure(base, size)
        if abs(new / ratio - 1.0) < 1e-4:
            break
        ratio = new
    return best[1]


def nearest_tiers(target: float, size: str) -> list[str]:
    """The shipped tiers (tests' proxy-tiny excluded), nearest Baseline size to ``target`` (log) first."""
    from scaling.accounting.tiers import get_config

    return sorted(
        tier_names(), key=lambda t: abs(math.log(measure(get_config(t, "baseline"), size) / target))
    )


# -- planned points and sets ---------------------------------------------------------------------
def _interval(x: np.ndarray, level: float) -> tuple[float, float]:
    lo, hi = np.quantile(x, [(1.0 - level) / 2.0, (1.0 + level) / 2.0], axis=0)
    return float(lo), float(hi)


def expected_loss(
    law: FittedLaw, inputs: Mapping[str, float], level: float = 0.95
) -> tuple[float, tuple[float, float] | None]:
    """Loss the law predicts at one point, and its percentile interval over the bootstrap samples."""
    x = {k: np.array([inputs[k]]) for k in law.law.inputs}
    L = float(law.law.predict(law.theta, **x)[0])
    if law.samples is None:
        return L, None
    return L, _interval(law.law.predict(law.samples, **x)[:, 0], level)


@dataclass(frozen=True)
class PlannedPoint:
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
        return {
            "tier": self.tier,
            "arch": self.arch,
            "N": self.N,
            "F": self.F,
            "S": self.S,
            "D": self.D,
            "compute": self.compute,
            "offset_decades": self.offset_decades,
            "expected_loss": self.expected_loss,
            "loss_ci": None if self.loss_ci is None else list(self.loss_ci),
            "config": {k: v for k, v in self.config.to_dict().items() if k != "name"},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "PlannedPoint":
        return cls(
            tier=str(d["tier"]),
            arch=str(d["arch"]),
            N=int(d["N"]),
            F=int(d["F"]),
            S=float(d["S"]),
            D=int(d["D"]),
            compute=float(d["compute"]),
            offset_decades=float(d["offset_decades"]),
            expected_loss=float(d["expected_loss"]),
            loss_ci=None if d.get("loss_ci") is None else (float(d["loss_ci"][0]), float(d["loss_ci"][1])),
            config=ModelConfig.from_dict({**d["config"], "name": str(d["tier"])}),
        )


@dataclass(frozen=True)
class IsoFlopSet:
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

    @property
    def flops(self) -> float:
        return float(sum(p.compute for p in self.points))

    def arch_points(self, arch: str) -> list[PlannedPoint]:
        return [p for p in self.points if p.arch == arch]

    def to_dict(self) -> dict[str, Any]:
        return {
            "budget": self.budget,
            "sparsity": self.sparsity,
            "size_name": self.size_name,
            "optima": {a: dict(o) for a, o in self.optima.items()},
            "flops": self.flops,
            "bracketed": dict(self.bracketed),
            "profile_depth": dict(self.profile_depth),
            "vertex_offset_decades": dict(self.vertex_offset_decades),
            "extrapolation_decades": self.extrapolation_decades,
            "points": [p.to_dict() for p in self.points],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "IsoFlopSet":
        return cls(
            budget=float(d["budget"]),
            sparsity=None if d.get("sparsity") is None else float(d["sparsity"]),
            size_name=str(d["size_name"]),
            optima={a: dict(o) for a, o in d["optima"].items()},
            points=tuple(PlannedPoint.from_dict(p) for p in d["points"]),
            bracketed={a: bool(v) for a, v in d["bracketed"].items()},
            profile_depth={a: float(v) for a, v in d["profile_depth"].items()},
            vertex_offset_decades={
                a: None if v is None else float(v) for a, v in d["vertex_offset_decades"].items()
            },
            extrapolation_decades=(
                None if d.get("extrapolation_decades") is None else float(d["extrapolation_decades"])
            ),
        )


def tier_label(budget_: float, sparsity: float | None, index: int) -> str:
    """Custom tier name of the index-th size (1-based) of a set: iso1e20-3, iso1e20-s0.95-3."""
    c = f"{budget_:.2g}".replace("e+", "e")
    s = "" if sparsity is None else f"-s{sparsity:.3g}"
    return f"iso{c}{s}-{index}"


@dataclass(frozen=True)
class Proposal:
    """IsoFLOP sets proposed from two fitted laws, and how to write them as a sweep plan."""

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

    def to_dict(self) -> dict[str, Any]:
        return {
            "law": self.law,
            "shape": self.shape,
            "width_multiple": self.width_multiple,
            "proxy": self.proxy,
            "spread_decades": self.spread_decades,
            "sizes_per_budget": self.sizes_per_budget,
            "ci_level": self.ci_level,
            "source": self.source,
            "n_runs": self.n_runs,
            "total_flops": self.total_flops,
            "sets": [s.to_dict() for s in self.sets],
            "warnings": list(self.warnings),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Proposal":
        return cls(
            law=str(d["law"]),
            shape=str(d["shape"]),
            width_multiple=int(d["width_multiple"]),
            proxy=bool(d["proxy"]),
            spread_decades=float(d["spread_decades"]),
            sizes_per_budget=int(d["sizes_per_budget"]),
            ci_level=float(d["ci_level"]),
            sets=tuple(IsoFlopSet.from_dict(s) for s in d["sets"]),
            source=str(d.get("source", "")),
            warnings=tuple(d.get("warnings", ())),
        )

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

    def plan_dict(
        self,
        *,
        name: str,
        runs_dir: str,
        template: Mapping[str, Any] | None = None,
        seeds: Sequence[int] = (0,),
    ) -> dict[str, Any]:
        """The sweep-plan document (``scaling.training.sweep_plan`` format): one custom [model] tier per
        size, each
        with one token budget; [train], [data] and [executor] copied from ``template``."""
        template = dict(template or {})
        tiers = self.tiers()
        models: dict[str, Any] = {}
        budgets: dict[str, Any] = {}
        for s in self.sets:
            for p in s.arch_points("baseline"):
                # a Baseline has no loop; n_loops in a [model] table is the matcher's option
                # (scaling.training.sweep_plan)
                models[p.tier] = {
                    **{k: v for k, v in p.config.to_dict().items() if k not in _NOT_IN_PLAN},
                    "width_multiple": self.width_multiple,
                    "proxy": self.proxy,
                }
                budgets[p.tier] = {"budgets": [int(p.D)]}
        desc = "; ".join(
            f"C={s.budget:.3g}"
            + ("" if s.sparsity is None else f" S={s.sparsity:g}")
            + f": {len(s.arch_points('baseline'))} sizes"
            for s in self.sets
        )
        doc: dict[str, Any] = {
            "sweep": {
                "name": name,
                "description": (f"IsoFLOP sets proposed by smelt-scale plan ({self.law} law, "
                                f"{self.shape} shape): {desc}"),
                "tiers": tiers,
                "archs": list(ARCHS),
                "seeds": [int(x) for x in seeds],
                "runs_dir": str(runs_dir),
            }
        }
        for section in ("train", "data", "executor"):
            if template.get(section):
                doc[section] = dict(template[section])
        doc["tier"] = budgets
        doc["model"] = models
        return doc


def _set_for_budget(
    laws: Mapping[str, FittedLaw],
    C: float,
    S: float | None,
    shape: ModelConfig,
    *,
    size: str,
    width_multiple: int,
    n_sizes: int,
    spread: float,
    level: float,
    warnings: list[str],
) -> IsoFlopSet:
    optima = {a: frontier(laws[a].law, laws[a].theta, C, k=laws[a].flops_per_param, S=S) for a in ARCHS}
    where = f"budget {C:.3g}" + ("" if S is None else f", S={S:g}")
    # each arch's optimum and its +-spread edges, mapped to Baseline coordinates (the twin/Baseline
    # size ratio drifts with scale, so the SMELT edges are mapped one by one, not shifted)
    edges: list[float] = []
    for arch in ARCHS:
        for u in (-spread, spread):
            target = float(optima[arch].size) * 10.0**u
            try:
                pair = pair_for_size(
                    shape, target, arch=arch, size=size, width_multiple=width_multiple, sparsity=S
                )
            except UserError as exc:
                raise UserError(
                    f"{where}: cannot build the {arch} config of {size} = {target:.3g} "
                    f"({u:+g} decade from its optimum): {exc}"
                ) from None
            edges.append(math.log10(measure(pair.baseline, size)))
    grid = np.linspace(min(edges), max(edges), n_sizes)
    pairs: list[SizedPair] = []
    for g in grid:
        try:
            pair = pair_for_size(
                shape, 10.0**g, arch="baseline", size=size, width_multiple=width_multiple, sparsity=S
            )
        except UserError as exc:
            raise UserError(f"{where}: cannot build the Baseline of {size} = {10.0**g:.3g}: {exc}") from None
        if pairs and pair.baseline == pairs[-1].baseline:
            continue
        pairs.append(pair)
    if len(pairs) < n_sizes:
        warnings.append(
            f"{where}: {n_sizes - len(pairs)} sizes of the grid round to the same config "
            f"(width steps of {width_multiple}); {len(pairs)} distinct sizes kept"
        )
    if len(pairs) < MIN_SIZES:
        raise UserError(
            f"{where}: only {len(pairs)} distinct configs in the size range (need {MIN_SIZES}); "
            "widen --spread or choose a larger --tier"
        )
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
    tops = [laws[a].compute_max for a in ARCHS if laws[a].compute_max is not None]
    extrap = math.log10(C / max(tops)) if tops else None
    return IsoFlopSet(
        budget=float(C),
        sparsity=None if S is None else float(S),
        size_name=size,
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
    missing = [a for a in ARCHS if a not in laws]
    if missing:
        raise UserError(f"planning needs a law for each architecture; missing {', '.join(missing)}")
    names = {laws[a].law.name for a in ARCHS}
    if len(names) != 1:
        raise UserError(f"the two laws must have the same form, got {', '.join(sorted(names))}")
    law_name = names.pop()
    size = size_name(law_name)
    C = check_budgets(np.atleast_1d(budgets))
    if int(n_sizes) < MIN_SIZES:
        raise UserError(
            f"--runs-per-budget must be >= {MIN_SIZES}: an IsoFLOP parabola (approach 2) needs "
            f"at least {MIN_SIZES} sizes, got {n_sizes}"
        )
    if not (math.isfinite(spread) and 0.05 <= spread <= 3.0):
        raise UserError(f"--spread must lie in [0.05, 3] decades, got {spread:g}")
    if not 0.0 < level < 1.0:
        raise UserError(f"interval level must lie in (0, 1), got {level}")
    sparsities = tuple(sparsities) or (None,)
    if uses_sparsity(laws["baseline"].law):
        if any(s is None for s in sparsities):
            raise UserError("a smelt-form law needs a sparsity: pass --sparsity")
        for s in sparsities:
            if not (math.isfinite(s) and 0.0 <= s < 1.0):
                raise UserError(f"sparsity must lie in [0, 1), got {s:g}")
    elif any(s is not None for s in sparsities):
        raise UserError("--sparsity applies only to smelt-form laws; these are chinchilla-form")
    if tier is not None and tier not in TIERS:
        raise UserError(f"unknown tier {tier!r}; known tiers: {', '.join(TIERS)}")
    if tier is None:
        # the nearest shapes first; the first whose family can build every planned size wins
        mid = float(np.exp(np.mean(np.log(C))))
        opt = frontier(
            laws["baseline"].law,
            laws["baseline"].theta,
            mid,
            k=laws["baseline"].flops_per_param,
            S=sparsities[0],
        )
        candidates = nearest_tiers(float(opt.size), size)
    else:
        candidates = [tier]
    first_error = None
    for name in candidates:
        spec = TIERS[name]
        warnings: list[str] = []
        try:
            sets = [
                _set_for_budget(
                    laws,
                    float(c),
                    s,
                    spec.baseline,
                    size=size,
                    width_multiple=spec.width_multiple,
                    n_sizes=int(n_sizes),
                    spread=float(spread),
                    level=level,
                    warnings=warnings,
                )
                for c in C
                for s in sparsities
            ]
        except UserError as exc:
            first_error = first_error or UserError(f"{name} shape: {exc}")
            continue
        tier = name
        break
    else:
        if len(candidates) > 1:
            raise UserError(f"no shipped tier's shape can build every planned size; nearest: {first_error}")
        raise first_error
    labels = [p.tier for st in sets for p in st.arch_points("baseline")]
    if len(set(labels)) != len(labels):
        raise UserError(
            "two budgets give the same tier name; give budgets that differ in their first 2 digits"
        )
    for st in sets:
        where = f"budget {st.budget:.3g}" + ("" if st.sparsity is None else f", S={st.sparsity:g}")
        for arch in ARCHS:
            if not st.bracketed[arch]:
                warnings.append(f"{where}: the {arch} optimum is not inside the planned sizes")
            if noise is not None and st.profile_depth[arch] < 3.0 * noise:
                warnings.append(
                    f"{where}: the {arch} profile rises only {100 * st.profile_depth[arch]:.2f}% at "
                    f"its edges, under 3x the fits' RMSE ({100 * noise:.2f}%): widen --spread"
                )
        if st.extrapolation_decades is not None and st.extrapolation_decades > EXTRAPOLATION_WARN_DECADES:
            warnings.append(
                f"{where}: {st.extrapolation_decades:.2f} decades beyond the largest fitted compute; "
                "the optima (and so the sizes) are extrapolated"
            )
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


# -- designs as points (for simulation) ----------------------------------------------------------
def isoflop_design(
    laws: Mapping[str, FittedLaw],
    budgets: Sequence[float],
    *,
    n_sizes: int = 6,
    spread: float = SPREAD_DECADES,
    sparsities: Sequence[float | None] = (None,),
) -> pd.DataFrame:
    """A config-free IsoFLOP design as canonical points (``scaling.fitting.tables``), loss left NaN.

    Per law (group), budget C and sparsity: ``n_sizes`` sizes x*(C) 10^u, u evenly spaced in
    [-spread, spread] decades around that law's own optimum; chinchilla form: N = x, D = C/(k N),
    F = k N; smelt form: F = x, D = C/F and N = F/6 (dense-equivalent parameters, used only in data
    summaries). Every point is its own run.
    """
    C = check_budgets(budgets)
    if int(n_sizes) < 3:
        raise UserError(f"an IsoFLOP design needs at least 3 sizes per budget, got {n_sizes}")
    rows = []
    u = np.linspace(-spread, spread, int(n_sizes))
    for group, fl in laws.items():
        smelt_form = uses_sparsity(fl.law)
        for c in C:
            for s in sparsities if smelt_form else (None,):
                x = float(frontier(fl.law, fl.theta, c, k=fl.flops_per_param, S=s).size) * 10.0**u
                for i, xi in enumerate(x):
                    if smelt_form:
                        F, N, D = xi, xi / 6.0, c / xi
                    else:
                        N, D, F = xi, c / (fl.flops_per_param * xi), fl.flops_per_param * xi
                    tag = f"{group}-C{c:.3g}" + ("" if s is None else f"-S{s:g}") + f"-{i}"
                    rows.append(
                        {
                            "group": group,
                            "run": tag,
                            "N": N,
                            "D": D,
                            "loss": np.nan,
                            "flops": F * D,
                            "flops_per_token": F,
                            "sparsity": np.nan if s is None else float(s),
                        }
                    )
    return pd.DataFrame(rows, columns=list(CANONICAL))


def plan_design(plan: Any) -> pd.DataFrame:
    """The points a sweep plan (``scaling.training.sweep_plan.Plan``) will produce: one per run and token
    budget,
    with N, F, S of the run's config and the requested tokens (the trainer rounds D to whole
    updates); run ids are the plan's run names (the bootstrap unit). Loss left NaN."""
    rows = []
    for run in plan.runs:
        b = costs(run.model)
        for D in run.budgets:
            rows.append(
                {
                    "group": run.arch,
                    "run": run.name,
                    "N": float(b.active_params),
                    "D": float(D),
                    "loss": np.nan,
                    "flops": float(b.flops_per_token) * D,
                    "flops_per_token": float(b.flops_per_token),
                    "sparsity": float(b.sparsity),
                }
            )
    if not rows:
        raise UserError("the plan has no runs")
    return pd.DataFrame(rows, columns=list(CANONICAL))


__all__ = [
    "ARCHS",
    "DEFAULT_SIZES",
    "MIN_SIZES",
    "SPREAD_DECADES",
    "IsoFlopSet",
    "PlannedPoint",
    "Proposal",
    "SizedPair",
    "baseline_for_size",
    "expected_loss",
    "experts_for_sparsity",
    "isoflop_design",
    "measure",
    "nearest_tiers",
    "pair_for_size",
    "plan_design",
    "propose",
    "scaled_baseline",
    "size_name",
    "tier_label",
]
