"""Designs as canonical points (``scaling.fitting.tables``), loss left NaN, for the simulation of a
study (``scaling.design.simulate``): a config-free IsoFLOP design around given laws' optima, or the
points a sweep plan will produce."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from scaling.accounting.costs import costs
from scaling.common.errors import UserError
from scaling.common.stats import quantiles
from scaling.design.proposal import SPREAD_DECADES
from scaling.fitting.savings import FittedLaw, check_budgets, frontier, uses_sparsity
from scaling.fitting.sources import LawSource, default_sparsity
from scaling.fitting.tables import CANONICAL

DESIGN_BUDGETS = 4  # default simulation design: IsoFLOP budgets over the laws' compute range
DESIGN_SIZES = 6  # ... and sizes per budget (4 x 6 x 3 sparsities = the paper's 72 runs)


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
    [-spread, spread] decades around that law's own optimum; chinchilla form: N = x, F = F(N) (the law's
    ``cost``), D = C/F; smelt form: F = x, D = C/F and N = F/6 (dense-equivalent parameters, used only in data
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
                x = float(frontier(fl.law, fl.theta, c, cost=fl.cost, S=s).size) * 10.0**u
                for i, xi in enumerate(x):
                    if smelt_form:
                        F, N, D = xi, xi / 6.0, c / xi
                    else:
                        N, F = xi, float(fl.cost(xi))
                        D = c / F
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
                            "seed": "",
                        }
                    )
    return pd.DataFrame(rows, columns=list(CANONICAL))


def points_of_sweep_plan(plan: Any) -> pd.DataFrame:
    """The points a sweep plan (``scaling.training.sweep.plan.SweepPlan``) will produce: one per run and token
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
                    "seed": str(run.seed),
                }
            )
    if not rows:
        raise UserError("the plan has no runs")
    return pd.DataFrame(rows, columns=list(CANONICAL))



@dataclass(frozen=True)
class SimulationDesign:
    """The points a simulated study fits, where they come from, and their sparsities.

    points       canonical points, loss NaN (:func:`isoflop_design` or :func:`points_of_sweep_plan`)
    source       one line naming the design
    sparsities   the design's sparsities ((None,) for chinchilla-form laws or a plan without any)
    of_plan      True for a plan's points: the savings are then evaluated at the plan's sparsity
    """

    points: pd.DataFrame
    source: str
    sparsities: tuple[float | None, ...]
    of_plan: bool = False

    @classmethod
    def of_sweep_plan(cls, plan: Any, name: str) -> "SimulationDesign":
        """The points of a sweep plan, at the default sparsity of its runs (if they record any)."""
        points = points_of_sweep_plan(plan)
        recorded = [float(x) for x in points["sparsity"] if np.isfinite(x)]
        return cls(points, f"plan {name}", (default_sparsity(recorded),) if recorded else (None,), True)


def default_design(src: LawSource, truth: Mapping[str, FittedLaw]) -> SimulationDesign:
    """The default design of a simulation: :data:`DESIGN_BUDGETS` IsoFLOP budgets log-spaced over the
    laws' compute range x :data:`DESIGN_SIZES` sizes around each law's optimum; smelt-form laws at a
    law set's sparsities, else at the ends and middle of the fitted range of S."""
    if src.law_set is not None and src.law_set.compute_range is not None:
        lo, hi = src.law_set.compute_range
    else:
        lo = (min(fl.compute_min for fl in truth.values() if fl.compute_min)
              if all(fl.compute_min for fl in truth.values()) else None)
        hi = (max(fl.compute_max for fl in truth.values() if fl.compute_max)
              if all(fl.compute_max for fl in truth.values()) else None)
        if lo is None or hi is None:
            raise UserError("the fits record no compute range for a default design: pass --design PLAN")
    if src.smelt_form:
        if src.law_set is not None:
            design_s = tuple(src.law_set.sparsities)
        else:  # the design samples the fitted range of S: its ends and its middle
            seen = sorted({float(s) for f in src.fits for s in f.data_summary.get("sparsities", [])})
            if not seen:
                raise UserError("the smelt-form fits record no sparsities: pass --design PLAN")
            design_s = tuple(sorted({round(float(q), 4) for q in quantiles(seen, [0.0, 0.5, 1.0])}))
    else:
        design_s = (None,)
    budgets = np.logspace(np.log10(lo), np.log10(hi), DESIGN_BUDGETS)
    points = isoflop_design(truth, budgets, n_sizes=DESIGN_SIZES, sparsities=design_s)
    source = (f"IsoFLOP design, {DESIGN_BUDGETS} budgets {lo:.3g}–{hi:.3g} FLOPs x {DESIGN_SIZES} "
              f"sizes over ±{SPREAD_DECADES:g} decade around each law's optimum")
    return SimulationDesign(points, source, design_s)


def savings_sparsities(src: LawSource, design: SimulationDesign,
                       given: Sequence[float] = ()) -> tuple[float | None, ...]:
    """Where a simulation evaluates the savings: ``given``, else the one default sparsity of the laws'
    source (:mod:`scaling.fitting.sources`) or, for a plan's design, of the plan's runs; (None,) for
    chinchilla-form laws."""
    if not src.smelt_form:
        return (None,)
    S = tuple(given) or (design.sparsities if design.of_plan else src.default_sparsities())
    if any(s is None for s in S):
        raise UserError("the design records no sparsity for the smelt-form law: pass --sparsity")
    return S


def savings_budgets(src: LawSource, design: SimulationDesign) -> np.ndarray:
    """The default budgets of a simulation's savings: a law set's published ones, else the design's
    largest compute and 10x it."""
    published = src.law_set.published.get("savings_range", {}) if src.law_set is not None else {}
    if published:
        return np.array(sorted(float(k) for k in published))
    top = float(design.points["flops"].max())
    return np.array([top, 10.0 * top])
