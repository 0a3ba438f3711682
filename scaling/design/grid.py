"""An IsoFLOP study on one shared size grid: one WSD trunk per size, a cooldown branch per budget.

``scaling.design.proposal`` centres each budget's sizes on a fitted law's optimum. Before there is a
law worth trusting (a first study, or one whose laws are not identified) a lab trains a fixed grid
of widths instead, and with a warmup-stable-decay schedule one training run per size serves every
budget: the stable trunk is shared and a short cooldown branches off at each budget's token count
D = C / F (Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed Training
Durations"; the trainer's ``budgets`` list, ``scaling.training.loop.branches``). k sizes x m budgets
then cost about k runs at the largest budget, not k x m separate runs.

Rules, all stated in the plan file the documents become:

- Sizes: the reference shape's Baseline with d_model (and the expert width) scaled to each grid
  value (``scaling.design.sizing.scaled_baseline``); the SMELT twin is the matcher's, derived again
  when the plan is read, and trains the same tokens.
- Tokens: D_j = floor(C_j / F), F = the Baseline's exact training FLOPs per token
  (``scaling.accounting.costs``). A size serves budget j only if D_j >= ``min_tokens`` (fewer
  updates sit on the early plateau, not on a converged end point) and j <= its last budget (the
  smallest sizes stop early: at large budgets they are far from the optimum and cost the CPU's
  worst FLOP rate).
- Learning rate per size: lr(d) = lr_ref * (d / d_ref) ** -exponent, rounded to 3 significant
  digits (a rule fitted on an lr sweep; docs/proxy-study.md), d the Baseline's d_model. The SMELT
  twin trains at its Baseline's lr, or at its own rule (fitted on the twins' lr sweep, again as a
  function of the Baseline's d_model) when one is given: each architecture at its own tuned lr.
- Further seeds (1, 2, ...) of chosen sizes train to chosen budgets for the seed-to-seed noise.

Pure: no I/O; ``scaling.cli.plan`` writes the documents (``plan --grid``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from scaling.accounting.config import ModelConfig
from scaling.accounting.costs import costs
from scaling.accounting.tiers import ARCHS
from scaling.common.errors import UserError
from scaling.common.format import comment_safe
from scaling.design.output import NOT_IN_PLAN
from scaling.design.sizing import scaled_baseline


@dataclass(frozen=True)
class LrRule:
    """lr(d) = lr_ref * (d / d_ref) ** -exponent, to 3 significant digits."""

    lr_ref: float
    exponent: float
    d_ref: float = 6.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.lr_ref) and 0 < self.lr_ref <= 100):
            raise UserError(f"lr rule: the reference lr must be in (0, 100], got {self.lr_ref!r}")
        if not (math.isfinite(self.exponent) and abs(self.exponent) <= 10):
            raise UserError(f"lr rule: the exponent must be within [-10, 10], got {self.exponent!r}")
        if not (math.isfinite(self.d_ref) and self.d_ref > 0):
            raise UserError(f"lr rule: the reference d_model must be positive, got {self.d_ref!r}")

    def __call__(self, d_model: int) -> float:
        return float(f"{self.lr_ref * (d_model / self.d_ref) ** -self.exponent:.3g}")

    def describe(self) -> str:
        return f"lr = {self.lr_ref:g} * (d_model/{self.d_ref:g})^-{self.exponent:g}"

    @classmethod
    def parse(cls, text: str, flag: str = "--lr-rule") -> "LrRule":
        """``LR,EXPONENT[,D_REF]`` as typed on a command line; UserError (naming ``flag``) otherwise."""
        try:
            parts = [float(t) for t in text.split(",")]
        except ValueError:
            raise UserError(f"{flag}: expected LR,EXPONENT[,D_REF], got {text!r}") from None
        if len(parts) not in (2, 3):
            raise UserError(f"{flag}: expected LR,EXPONENT[,D_REF], got {text!r}")
        try:
            return cls(*parts)
        except UserError as exc:
            raise UserError(f"{flag}: {exc}") from None

    @classmethod
    def parse_optional(cls, text: str | None, flag: str = "--lr-rule") -> "LrRule | None":
        """As :meth:`parse`, with None for an absent value or 'none' (no rule: the other lr applies)."""
        return None if text is None or text.strip().lower() == "none" else cls.parse(text, flag)


# The peak-lr rule of the proxy shapes (proxy-xxs scaled, 8 x 256 tokens per update, WSD, AdamW wd
# 0.1), measured by the lr sweep on the built-in corpus (plans/lr-sweep.toml, runs-lr/, 2 seeds x 6
# lrs at d_model 6 and 56; `python plans/fit_lr_rule.py`): the least-squares parabola's optima
# 0.0346 (95% [0.022, 0.054]) and 0.00456 ([0.0037, 0.0057]), exponent 0.91 ([0.72, 1.10]). The
# study in runs/ trained at it; `smelt-scale plan` gives proxy sizes their lr from it.
PROXY_LR_RULE = LrRule(0.0346, 0.908)
# The SMELT twins' own rule from the same sweep of the twins (plans/lr-sweep-smelt.toml; `python
# plans/fit_lr_rule.py runs-lr --arch smelt`), d = the Baseline's d_model: optima 0.0246 (95%
# [0.018, 0.033]) and 0.00492 ([0.0043, 0.0056]), exponent 0.72 ([0.60, 0.84]).
PROXY_SMELT_LR_RULE = LrRule(0.0246, 0.721)
# Fewest tokens a proxy run needs to be past the early loss plateau (docs/proxy-study.md section 1;
# the study's plan-grid --min-tokens): 73 updates of 8 x 256 tokens.
PROXY_MIN_TOKENS = 150_000


@dataclass(frozen=True)
class GridSize:
    """One size of the grid: its Baseline config and the budgets (indices, tokens) it serves."""

    name: str
    config: ModelConfig
    flops_per_token: float
    active_params: int
    lr: float
    budget_indices: tuple[int, ...]
    tokens: tuple[int, ...]
    smelt_lr: float | None = None  # the twin's own lr; None: its Baseline's


@dataclass(frozen=True)
class GridPlan:
    """The grid study: budgets (FLOPs), sizes, lr rule, extra-seed choice."""

    shape: str
    budgets: tuple[float, ...]
    sizes: tuple[GridSize, ...]
    lr_rule: LrRule
    extra_seed_sizes: tuple[int, ...]
    extra_seed_budgets: tuple[int, ...]
    smelt_lr_rule: LrRule | None = None
    extra_seeds: tuple[int, ...] = (1,)

    def describe_lr(self) -> str:
        if self.smelt_lr_rule is None:
            return f"{self.lr_rule.describe()} (the SMELT twin at its Baseline's lr)"
        return f"Baseline {self.lr_rule.describe()}; SMELT twin {self.smelt_lr_rule.describe()}"

    def sizes_at(self, j: int) -> list[GridSize]:
        return [s for s in self.sizes if j in s.budget_indices]

    def summary(self) -> str:
        lines = [f"IsoFLOP grid on the {self.shape} shape, {self.describe_lr()}"]
        for s in self.sizes:
            twin = "" if s.smelt_lr is None else f" (SMELT {s.smelt_lr:.3g})"
            lines.append(f"{s.name}: N={s.active_params:,} F={s.flops_per_token:.4g} lr={s.lr:.3g}{twin} "
                         f"budgets={[f'{self.budgets[j]:.3g}' for j in s.budget_indices]} "
                         f"tokens={list(s.tokens)}")
        return "\n".join(lines)


MIN_SIZES_PER_BUDGET = 3  # a parabola through an IsoFLOP slice (approach 2) needs three sizes


def grid_plan(shape: ModelConfig, d_models: Sequence[int], budgets: Sequence[float], *,
              lr_rule: LrRule, min_tokens: int, last_budget: Mapping[int, int] | None = None,
              extra_seed_sizes: Sequence[int] = (), extra_seed_budgets: Sequence[int] = (0, 1),
              width_multiple: int = 1, smelt_lr_rule: LrRule | None = None,
              extra_seeds: Sequence[int] = (1,)) -> GridPlan:
    """The grid study over ``d_models`` x ``budgets`` (see the module docstring for the rules)."""
    budgets = tuple(float(c) for c in budgets)
    if (not budgets or any(not (math.isfinite(c) and c > 0) for c in budgets)
            or list(budgets) != sorted(set(budgets))):
        raise UserError("grid: budgets must be positive, finite and increasing")
    if not d_models or len(set(d_models)) != len(d_models) or any(d < 1 for d in d_models):
        raise UserError("grid: d_model values must be distinct positive integers")
    if min_tokens < 1:
        raise UserError(f"grid: min_tokens must be positive, got {min_tokens}")
    last_budget = dict(last_budget or {})
    for d, j in last_budget.items():
        if d not in d_models or not 0 <= j < len(budgets):
            raise UserError(f"grid: last budget {d}:{j} names no grid size or no budget index")
    if not extra_seeds or len(set(extra_seeds)) != len(extra_seeds) or any(s < 1 for s in extra_seeds):
        raise UserError(f"grid: the further seeds must be distinct integers >= 1 (seed 0 is the main "
                        f"plan's), got {', '.join(map(str, extra_seeds)) or 'none'}")
    if extra_seed_sizes and any(j not in range(len(budgets)) for j in extra_seed_budgets):
        raise UserError(f"grid: an extra-seed budget index is out of range (0 to {len(budgets) - 1})")
    sizes = []
    for d in d_models:
        cfg = scaled_baseline(shape, d / shape.d_model, width_multiple)
        if cfg.d_model != d:
            raise UserError(f"grid: d_model {d} cannot be built from the {shape.name} shape at width "
                            f"multiple {width_multiple} (got {cfg.d_model})")
        b = costs(cfg)
        last = last_budget.get(d, len(budgets) - 1)
        uses = tuple(j for j in range(last + 1) if budgets[j] / b.flops_per_token >= min_tokens)
        sizes.append(GridSize(
            name=f"iso-d{d:02d}", config=cfg, flops_per_token=float(b.flops_per_token),
            active_params=int(b.active_params), lr=lr_rule(d), budget_indices=uses,
            tokens=tuple(int(math.floor(budgets[j] / b.flops_per_token)) for j in uses),
            smelt_lr=None if smelt_lr_rule is None else smelt_lr_rule(d)))
    idle = [s.config.d_model for s in sizes if not s.budget_indices]
    if idle:
        raise UserError(f"grid: d_model {', '.join(map(str, idle))} serves no budget (each gives it fewer "
                        f"than the minimum of {min_tokens:,} tokens, --min-tokens, or its last budget "
                        "comes first): drop it or lower the minimum")
    thin = [(j, n) for j in range(len(budgets))
            if (n := sum(j in s.budget_indices for s in sizes)) < MIN_SIZES_PER_BUDGET]
    if thin:
        raise UserError("grid: " + "; ".join(f"budget {budgets[j]:.3g} has {n} size(s)" for j, n in thin)
                        + f": an IsoFLOP slice needs at least {MIN_SIZES_PER_BUDGET} to place its minimum "
                        "(add sizes, lower --min-tokens or move a --last-budget)")
    for d in extra_seed_sizes:  # a size named for the extra seeds that gets none is a typo, not a choice
        size = next((s for s in sizes if s.config.d_model == d), None)
        if size is None:
            raise UserError(f"grid: extra-seed size {d} is not in the grid "
                            f"({', '.join(map(str, d_models))})")
        if not set(size.budget_indices) & set(extra_seed_budgets):
            raise UserError(f"grid: extra-seed size {d} trains at none of the extra-seed budgets "
                            f"{', '.join(str(j) for j in extra_seed_budgets)}")
    return GridPlan(shape=shape.name, budgets=budgets, sizes=tuple(sizes), lr_rule=lr_rule,
                    extra_seed_sizes=tuple(extra_seed_sizes), extra_seed_budgets=tuple(extra_seed_budgets),
                    smelt_lr_rule=smelt_lr_rule, extra_seeds=tuple(sorted(extra_seeds)))


def grid_documents(plan: GridPlan, *, name: str, runs_dir: str, train: Mapping[str, Any],
                   executor: Mapping[str, Any], archs: Sequence[str] = ARCHS,
                   ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The sweep-plan documents (``scaling.training.sweep.plan``'s TOML format): the main study
    (seed 0, every size to its budgets) and the further seeds (``None`` when no size takes one).
    ``archs``: the architectures trained (default both; one of them retrains only that side of a
    study whose other side is already trained at the same settings)."""
    archs = list(dict.fromkeys(archs))
    if not archs or any(a not in ARCHS for a in archs):
        raise UserError(f"grid: architectures must be among {', '.join(ARCHS)}, "
                        f"got {', '.join(archs) or 'none'}")
    models, tiers, extra = {}, {}, {}
    for s in plan.sizes:
        models[s.name] = {**{k: v for k, v in s.config.to_dict().items() if k not in NOT_IN_PLAN},
                          "width_multiple": 1, "proxy": True}
        twin = {} if s.smelt_lr is None else {"smelt": {"lr": s.smelt_lr}}
        tiers[s.name] = {"budgets": list(s.tokens), "lr": s.lr, **twin}
        seed_tokens = [t for j, t in zip(s.budget_indices, s.tokens) if j in plan.extra_seed_budgets]
        if seed_tokens and s.config.d_model in plan.extra_seed_sizes:
            extra[s.name] = {"budgets": seed_tokens, "lr": s.lr, **twin}
    rule = plan.describe_lr()
    common = {"train": {**train, "lr": plan.lr_rule.lr_ref}, "executor": dict(executor)}
    per_budget = [len(plan.sizes_at(j)) for j in range(len(plan.budgets))]
    main = {
        "sweep": {"name": name,
                  "description": f"IsoFLOP sets at C = {', '.join(f'{c:.3g}' for c in plan.budgets)} FLOPs; "
                                 f"{len(plan.sizes)} sizes, {min(per_budget)}-{max(per_budget)} per budget; "
                                 f"seed 0; {rule}",
                  "tiers": list(models), "archs": archs, "seeds": [0], "runs_dir": runs_dir},
        **common, "tier": tiers, "model": models}
    if not extra:
        return main, None
    seeds = list(plan.extra_seeds)
    second = {
        "sweep": {"name": f"{name}-seeds",
                  "description": f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))} at C = "
                                 f"{', '.join(f'{plan.budgets[j]:.3g}' for j in plan.extra_seed_budgets)}: "
                                 "the seed-to-seed noise",
                  "tiers": list(extra), "archs": archs, "seeds": seeds, "runs_dir": runs_dir},
        **common, "tier": extra, "model": {k: models[k] for k in extra}}
    return main, second


def grid_header(plan: GridPlan, command: str) -> str:
    """The comment block a grid plan file starts with: how it was written and its rules."""
    return (
        f"# Written by `{comment_safe(command)}` (do not edit by hand; rerun the command).\n"
        f"# IsoFLOP proxy study: budgets {', '.join(f'{c:.3g}' for c in plan.budgets)} FLOPs, sizes d_model "
        f"{', '.join(str(s.config.d_model) for s in plan.sizes)}\n# ({plan.shape} shape scaled), one WSD "
        f"trunk per size with a cooldown branch at each budget it serves.\n# Per-size peak lr: "
        f"{plan.describe_lr()} (lr sweep, docs/proxy-study.md).\n")
