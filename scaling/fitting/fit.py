"""Approach 3 scaling-law fits: robust loss on log loss, multi-start L-BFGS, bootstrap over runs.

The pieces, one module each: the objective (``scaling.fitting.objective``: Huber on log loss and
the other ``OBJECTIVES``), the batched L-BFGS and multi-start search (``scaling.fitting.optimizer``),
constraints (``scaling.fitting.constraints``), goodness of fit (``scaling.fitting.goodness``), the
bootstrap over runs (``scaling.fitting.bootstrap``) and the result types (``scaling.fitting.result``).
Here: the drivers ``fit_law`` and ``fit_groups``, which build the joint problem of one or more
groups, search it from the law's start grid, bootstrap it and assemble one ``FitResult`` per
group. Every name callers used from this module before the split is still exported here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pandas as pd

from scaling.common.errors import UserError
from scaling.fitting.bootstrap import (
    ONE_STEP_POINTS,
    _joint_weights,
    _run_weights,
    bootstrap,
    one_step_bootstrap,
)
from scaling.fitting.constraints import Constraints, ParamMap, _design
from scaling.fitting.goodness import MISFIT_P, MISFIT_RATIO, goodness_of_fit
from scaling.fitting.laws import Law, get_law
from scaling.fitting.objective import (
    ASYM_WEIGHT,
    DEFAULT_DELTA,
    DEFAULT_OBJECTIVE,
    EVAL_BLOCK,
    OBJECTIVES,
    Objective,
)
from scaling.fitting.optimizer import (
    N_REFINE,
    REFINE_POINTS,
    SCREEN_ITERS,
    SCREEN_POINTS,
    BatchResult,
    MultistartResult,
    distinct_optima,
    lbfgs_batch,
    multistart,
)
from scaling.fitting.result import (
    CI_LEVEL,
    FITS_SCHEMA,
    FITS_VERSION,
    FitResult,
    FitSet,
    _percentile_ci,
    allocation,
    fits_version,
)
from scaling.fitting.tables import flops_per_param_k, law_inputs, total_flops

DEFAULT_BOOTSTRAP = 200

__all__ = [
    "ASYM_WEIGHT", "CI_LEVEL", "DEFAULT_BOOTSTRAP", "DEFAULT_DELTA", "DEFAULT_OBJECTIVE", "EVAL_BLOCK",
    "FITS_SCHEMA", "FITS_VERSION", "MISFIT_P", "MISFIT_RATIO", "N_REFINE", "OBJECTIVES", "ONE_STEP_POINTS",
    "REFINE_POINTS", "SCREEN_ITERS", "SCREEN_POINTS", "BatchResult", "Constraints", "FitResult", "FitSet",
    "MultistartResult", "Objective", "ParamMap", "_design", "_run_weights", "allocation", "bootstrap",
    "distinct_optima", "fit_groups", "fit_law", "fits_version", "get_law", "goodness_of_fit", "lbfgs_batch",
    "multistart", "one_step_bootstrap",
]


@dataclass
class _Block:
    group: str
    points: pd.DataFrame
    X: dict[str, np.ndarray]
    y: np.ndarray
    runs: np.ndarray


def _block(points: pd.DataFrame, law: Law, group: str) -> _Block:
    source = f"group {group!r}"
    X = law_inputs(points, law.inputs, source=source)
    y = np.log(points["loss"].to_numpy(dtype=float))
    n = len(points)
    runs = points["run"].to_numpy() if "run" in points else np.arange(n)
    return _Block(group, points, X, y, runs)


def _fit_blocks(blocks: list[_Block], law: Law, cons: Constraints, *, objective: str, huber_delta: float,
                n_bootstrap: int, seed: int, ci_level: float, starts: np.ndarray | None,
                progress: Callable[[int, int], None] | None) -> dict[str, FitResult]:
    """One (joint) fit of the blocks under the constraints; one FitResult per block."""
    if not (0 < ci_level < 1):
        raise UserError(f"the interval level must lie in (0, 1), got {ci_level}")
    if n_bootstrap < 0:
        raise UserError(f"the number of bootstrap resamples must be >= 0, got {n_bootstrap}")
    if objective not in OBJECTIVES:
        raise UserError(f"unknown objective {objective!r}; choose one of: {', '.join(OBJECTIVES)}")
    groups = [b.group for b in blocks]
    pm = ParamMap.build(law, cons, groups)
    U = pm.n_free
    n_all = sum(len(b.y) for b in blocks)
    if n_all < U:
        who = f"group {groups[0]!r}" if len(groups) == 1 else f"groups {', '.join(groups)} jointly"
        free = " left free" if cons else ""
        raise UserError(f"{who}: {n_all} points for {U} parameters of the {law.name} law{free}; "
                        f"need at least {U}")
    design, offset = _design(law, pm, [b.X for b in blocks])
    y = np.concatenate([b.y for b in blocks])
    obj = Objective(law, None, y, huber_delta, kind=objective, design=design, offset=offset)
    grid = law.starts() if starts is None else np.atleast_2d(np.asarray(starts, dtype=float))
    ustarts = grid if pm.is_identity() else pm.starts(grid)
    opt = multistart(obj, ustarts, bounds=pm.bounds)
    lo, hi = pm.bounds.T
    tol = 1e-6 * np.maximum(hi - lo, 1)
    at_bound = (np.minimum(opt.z - lo, hi - opt.z) <= tol)
    near = opt.refined_f <= opt.objective * (1 + 1e-6) + 1e-14
    distinct = distinct_optima(opt.refined_z, opt.refined_f)

    K = int(n_bootstrap)
    one_step = bool(K) and n_all > ONE_STEP_POINTS and objective != "asym-abs"
    if one_step:
        usamples, bconv = one_step_bootstrap(obj, opt.z, [b.runs for b in blocks], K, seed, pm.bounds,
                                             progress=progress)
        u_hit = (usamples - lo <= tol) | (hi - usamples <= tol)
    elif K:
        W = _joint_weights([b.runs for b in blocks], K, seed)
        usamples, bconv = bootstrap(law, None, y, np.zeros(0), opt.refined_z[distinct], n_resamples=K,
                                    seed=seed, delta=huber_delta, progress=progress, kind=objective,
                                    weights=W, design=design, offset=offset, bounds=pm.bounds)
        u_hit = (usamples - lo <= tol) | (hi - usamples <= tol)
    else:
        usamples, bconv = np.zeros((0, U)), np.zeros(0, dtype=bool)
        u_hit = np.zeros((0, U), dtype=bool)

    out: dict[str, FitResult] = {}
    joint = len(blocks) > 1
    for gi, b in enumerate(blocks):
        acts = pm.M[gi].any(axis=0)                       # free columns acting on this group
        on_bound = sorted({p for j in np.flatnonzero(at_bound & acts) for p in pm.slots[j]},
                          key=law.params.index)
        z = pm.z(opt.z, gi)
        theta = law.from_internal(z)
        gobj = Objective(law, b.X, b.y, huber_delta, kind=objective)
        resid = gobj.residuals(z)
        g_objective = float(gobj(z[None])[0][0])
        near_theta = law.from_internal(pm.z(opt.refined_z[near], gi))
        spread = 0.0
        if near.sum() > 1:
            spread = float(np.max(np.ptp(near_theta, axis=0) / np.maximum(np.abs(theta), 1e-300)))
        n, P_free = len(b.y), pm.free_params(gi)
        warnings: list[str] = []
        if n < 4 * P_free:
            warnings.append(f"few points: {n} for {P_free} free parameters; the fit is weakly constrained")
        if on_bound:
            warnings.append(f"the best fit sits on a bound of {', '.join(on_bound)}: "
                            "not identified from these points")
        if spread > 1e-2:
            warnings.append(f"starts with the same objective disagree by up to {spread:.3g}x (relative) in "
                            "some parameter: a flat direction, the parameters are not identified")
        if not opt.converged:
            warnings.append("the optimiser did not meet its convergence test")
        if one_step:
            warnings.append(f"{n_all:,} points (more than {ONE_STEP_POINTS:,}): the bootstrap takes one "
                            "Gauss-Newton step from the fit per resample instead of refitting it "
                            "(first-order equivalent; settings bootstrap_method)")
        samples = law.from_internal(pm.z(usamples, gi)) if K else np.zeros((0, law.n_params))
        boot_bound = float(u_hit[:, acts].any(axis=1).mean()) if K else math.nan
        if K and boot_bound > 0.1:
            warnings.append(f"{100 * boot_bound:.0f}% of bootstrap fits end on a bound: weakly identified")
        k = flops_per_param_k(b.points)
        S_fixed = None
        if "S" in law.fixed_inputs:
            s_vals = np.unique(b.X["S"])
            S_fixed = float(s_vals[0]) if s_vals.size == 1 else None
        derived = law.derive(theta)
        if not law.fixed_inputs or S_fixed is not None:
            derived.update({k_: float(v) for k_, v in allocation(law, theta, k, S_fixed).items()})
        derived_samples = {key: np.array([law.derive(t)[key] for t in samples]) for key in law.derive(theta)}
        if K and "G" in derived:
            derived_samples.update(allocation(law, samples, k, S_fixed))
        ci = {p: _percentile_ci(samples[:, i], ci_level) for i, p in enumerate(law.params)}
        ci.update({key: _percentile_ci(v, ci_level) for key, v in derived_samples.items()})
        if K:
            for p in law.params:
                lo_p, hi_p = ci[p]
                if p in law.log_params and lo_p > 0 and hi_p / lo_p > 10:
                    warnings.append(f"{p} is weakly identified: its {100 * ci_level:.0f}% interval spans "
                                    f"{math.log10(hi_p / lo_p):.1f} decades")
        gof = goodness_of_fit(law, b.X, resid)
        if gof["misfit"]:
            warnings.append(f"misfit: the log residuals keep a systematic trend (p = {gof['p_value']:.1e}, "
                            f"{gof['trend_to_scatter']:.2f}x their scatter): the {law.name} form does not "
                            "describe these points")
        identified = (not on_bound and spread <= 1e-2 and opt.converged and n_all > U
                      and not (K and boot_bound > 0.1))
        diagnostics = {
            "objective": g_objective,
            "rmse_log": float(np.sqrt(np.mean(resid ** 2))),
            "max_abs_residual": float(np.max(np.abs(resid))),
            "n_points": n,
            "n_runs": int(np.unique(b.runs).size),
            "on_bound": on_bound,
            "n_starts": opt.n_starts,
            "n_refined": int(opt.refined_f.size),
            "n_refined_at_best": int(near.sum()),
            "best_start_param_spread": spread,
            "distinct_optima_objectives": [float(opt.refined_f[i]) for i in distinct],
            "converged": opt.converged,
            "bootstrap_on_bound_fraction": boot_bound,
            "bootstrap_unconverged": int((~bconv).sum()) if K else 0,
            "identified": bool(identified),
            "misfit": bool(gof["misfit"]),
            "goodness_of_fit": gof,
            "warnings": warnings,
        }
        if joint:
            diagnostics["joint_objective"] = opt.objective
        C = total_flops(b.points, k)
        summary = {
            "n_points": n, "n_runs": diagnostics["n_runs"],
            "N_min": float(b.points["N"].min()), "N_max": float(b.points["N"].max()),
            "D_min": float(b.points["D"].min()), "D_max": float(b.points["D"].max()),
            "loss_min": float(b.points["loss"].min()), "loss_max": float(b.points["loss"].max()),
            "compute_min": float(C.min()), "compute_max": float(C.max()), "flops_per_param_k": k,
        }
        if "F" in b.X:
            summary.update(F_min=float(b.X["F"].min()), F_max=float(b.X["F"].max()))
        if "S" in b.X:
            summary["sparsities"] = sorted({round(float(v), 6) for v in b.X["S"]})
        settings = {"objective": objective, "huber_delta": float(huber_delta), "n_bootstrap": K,
                    "seed": int(seed), "ci_level": float(ci_level), "bootstrap_unit": "run",
                    "bootstrap_method": "one-step" if one_step else "refit",
                    **cons.describe()}
        if joint:
            # row i of every joint group's bootstrap comes from the same resample of runs
            settings["joint_groups"] = list(groups)
        out[b.group] = FitResult(law=law.name, group=b.group, params=law.as_dict(theta), ci=ci,
                                 bootstrap=samples, diagnostics=diagnostics, n_points=n,
                                 data_summary=summary, derived=derived, settings=settings)
    return out


def _group_of(points: pd.DataFrame) -> str:
    return str(points["group"].iloc[0]) if "group" in points.columns and len(points) else "default"


def fit_law(points: pd.DataFrame, law: str | Law = "chinchilla", *, group: str | None = None,
            objective: str = DEFAULT_OBJECTIVE, huber_delta: float = DEFAULT_DELTA,
            fix: Mapping[str, float] | None = None, tie: Iterable[str | tuple[str, str]] = (),
            n_bootstrap: int = DEFAULT_BOOTSTRAP, seed: int = 0, ci_level: float = CI_LEVEL,
            starts: np.ndarray | None = None,
            progress: Callable[[int, int], None] | None = None) -> FitResult:
    """Approach-3 fit of one group of canonical points (``scaling.fitting.tables``), with bootstrap over runs.

    ``objective`` is one of ``OBJECTIVES``; ``fix`` pins parameters ({"E": 1.7}); ``tie`` holds
    parameters equal ("alpha=beta" or ("alpha", "beta")). Raises UserError for fewer points than
    free parameters, unknown parameter names or inputs the law cannot use.
    """
    law = get_law(law) if isinstance(law, str) else law
    group = _group_of(points) if group is None else group
    cons = Constraints(fixed=dict(fix or {}), ties=_ties(tie))
    return _fit_blocks([_block(points, law, group)], law, cons, objective=objective, huber_delta=huber_delta,
                       n_bootstrap=n_bootstrap, seed=seed, ci_level=ci_level, starts=starts,
                       progress=progress)[group]


def _ties(tie: Iterable[str | tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    for t in tie:
        out += list(Constraints.parse(tie=[t]).ties) if isinstance(t, str) else [tuple(t)]
    return tuple(out)


def fit_groups(points: pd.DataFrame, law: str | Law = "chinchilla", *, share: Iterable[str] = (),
               cross_checks: bool = True, progress: Callable[[str, int, int], None] | None = None,
               **kwargs: Any) -> dict[str, FitResult]:
    """``fit_law`` per group (sorted by name); keyword arguments as ``fit_law``.

    ``share`` names parameters common to all groups: then one joint fit (one objective summed over
    all groups' points) with the other parameters per group, its bootstrap resampling runs within
    every group under one resample index (rows paired across groups; ``settings["joint_groups"]``).
    With ``cross_checks``, approaches 1 and 2 (``scaling.fitting.approaches``) are attached to each result.
    """
    from dataclasses import replace

    from scaling.fitting.approaches import cross_checks as run_cross_checks

    law = get_law(law) if isinstance(law, str) else law
    names = sorted(points["group"].unique(), key=str) if "group" in points.columns else ["default"]
    has = "group" in points.columns
    subs = {str(g): (points[points["group"] == g] if has else points).reset_index(drop=True) for g in names}
    share = tuple(dict.fromkeys(s for item in share for s in str(item).split(",") if s.strip()))
    out: dict[str, FitResult] = {}
    if share:
        fix, tie = kwargs.pop("fix", None), kwargs.pop("tie", ())
        kwargs.pop("group", None)
        cons = Constraints(fixed=dict(fix or {}), ties=_ties(tie), shared=tuple(s.strip() for s in share))
        cb = None if progress is None else (lambda done, total: progress("joint", done, total))
        opts = {"objective": DEFAULT_OBJECTIVE, "huber_delta": DEFAULT_DELTA,
                "n_bootstrap": DEFAULT_BOOTSTRAP, "seed": 0, "ci_level": CI_LEVEL, "starts": None, **kwargs}
        fits = _fit_blocks([_block(s, law, g) for g, s in subs.items()], law, cons, progress=cb, **opts)
    else:
        fits = {}
        for g, sub in subs.items():
            cb = None if progress is None else (lambda done, total, g=g: progress(g, done, total))
            fits[g] = fit_law(sub, law, group=g, progress=cb, **kwargs)
    for g, res in fits.items():
        out[g] = replace(res, cross_checks=run_cross_checks(subs[g], res)) if cross_checks else res
    return out
