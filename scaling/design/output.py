"""A proposal (``scaling.design.proposal.Proposal``) as a sweep-plan document, the TOML format of
``scaling.training.sweep.plan``: one custom ``[model]`` tier per proposed Baseline size, each with
its one token budget; the SMELT twins are derived again from it by the matcher when the sweep
plan is read."""

from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence

from scaling.accounting.tiers import ARCHS
from scaling.design.proposal import Proposal


class LrRuleLike(Protocol):
    """What the plan needs of ``scaling.design.grid.LrRule`` (grid.py imports this module)."""

    def __call__(self, d_model: int) -> float: ...

    def describe(self) -> str: ...

# ModelConfig fields a [model] table leaves out: the tier names it, and a Baseline has no loop
# (n_loops in a [model] table is the matcher's option, scaling.training.sweep.plan).
NOT_IN_PLAN = ("name", "loop_start", "loop_end", "n_loops")


def sweep_plan_document(
    proposal: Proposal,
    *,
    name: str,
    runs_dir: str,
    template: Mapping[str, Any] | None = None,
    seeds: Sequence[int] = (0,),
    lr_rule: LrRuleLike | None = None,
    smelt_lr_rule: LrRuleLike | None = None,
) -> dict[str, Any]:
    """The sweep-plan document of ``proposal``: [sweep] (``name``, ``runs_dir``, ``seeds``), one
    [model] table and one [tier] budget per size, with its own peak lr from ``lr_rule`` when given
    (else every size trains at the template's [train] lr) and its SMELT twin's from
    ``smelt_lr_rule`` when given (else the twin trains at its Baseline's lr; both rules take the
    Baseline's d_model); [train], [data] and [executor] copied from ``template`` (a plan document)."""
    template = dict(template or {})
    models: dict[str, Any] = {}
    budgets: dict[str, Any] = {}
    for s in proposal.sets:
        for p in s.arch_points("baseline"):
            models[p.tier] = {
                **{k: v for k, v in p.config.to_dict().items() if k not in NOT_IN_PLAN},
                "width_multiple": proposal.width_multiple,
                "proxy": proposal.proxy,
            }
            budgets[p.tier] = {"budgets": [int(p.D)]}
            if lr_rule is not None:
                budgets[p.tier]["lr"] = lr_rule(p.config.d_model)
            if smelt_lr_rule is not None:
                budgets[p.tier]["smelt"] = {"lr": smelt_lr_rule(p.config.d_model)}
    desc = "; ".join(
        f"C={s.budget:.3g}"
        + ("" if s.sparsity is None else f" S={s.sparsity:g}")
        + f": {len(s.arch_points('baseline'))} sizes"
        for s in proposal.sets
    )
    doc: dict[str, Any] = {
        "sweep": {
            "name": name,
            "description": (f"IsoFLOP sets proposed by smelt-scale plan ({proposal.law} law, "
                            f"{proposal.shape} shape): {desc}"
                            + ("" if lr_rule is None else f"; {lr_rule.describe()}")
                            + ("" if smelt_lr_rule is None else f"; SMELT {smelt_lr_rule.describe()}")),
            "tiers": proposal.tiers(),
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
