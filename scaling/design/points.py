"""Designs as canonical points (``scaling.fitting.tables``), loss left NaN, for the simulation of a
study (``scaling.design.simulate``): a config-free IsoFLOP design around given laws' optima, or the
points a sweep plan will produce."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from scaling.accounting.costs import costs
from scaling.common.errors import UserError
from scaling.design.proposal import SPREAD_DECADES
from scaling.fitting.savings import FittedLaw, check_budgets, frontier, uses_sparsity
from scaling.fitting.tables import CANONICAL


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
                }
            )
    if not rows:
        raise UserError("the plan has no runs")
    return pd.DataFrame(rows, columns=list(CANONICAL))

