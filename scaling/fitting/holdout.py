"""Held-out extrapolation check: fit on the smaller part of the data, predict the rest.

A scaling law is used to extrapolate, so the honest test of a fit is whether it predicts points it
was not fitted to, in the direction it will be used: larger models or more compute (marin issue
#879 asks this of small ladders). ``holdout`` splits each group's points by a rule,

- ``largest``: the points of the group's largest model size N (all its token budgets),
- ``N>X`` / ``C>X`` (also ``>=``): the points above a size or a total compute (C as the fitter
  counts it: recorded FLOPs, else F D, else k N D),

fits the law on the rest (``scaling.fitting.fit.fit_law``, any of its options), and predicts the
held-out points. For each it reports the error in nats, observed - predicted, and in log loss,
log(observed / predicted), and whether the observation falls inside the bootstrap prediction
interval. That interval combines the two sources of error (a residual bootstrap on top of the
bootstrap over runs): for every bootstrap parameter vector b the prediction log L_b(x) gets one
log residual of the full training fit drawn at random, and the interval is the percentile range
of log L_b(x) + e_b at the fit's level. Parameter uncertainty alone (the spread of L_b) would
call a good fit wrong whenever the loss is noisier than the fit is uncertain.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pandas as pd

from scaling.common.errors import UserError
from scaling.common.stats import percentile_interval
from scaling.fitting.fit import FitResult, fit_law
from scaling.fitting.laws import Law, TokenCost, get_law
from scaling.fitting.settings import FitSettings, settings_of
from scaling.fitting.tables import group_rows, law_inputs, token_cost, total_flops

_RULE = re.compile(r"^\s*([NC])\s*(>=|>)\s*([0-9.eE+\-]+)\s*$")


def holdout_mask(points: pd.DataFrame, rule: str, cost: TokenCost | float = 6.0) -> np.ndarray:
    """Boolean mask of the held-out points of one group under ``rule`` (see module doc)."""
    r = rule.strip()
    if r.lower() == "largest":
        N = points["N"].to_numpy(dtype=float)
        return np.isclose(N, N.max(), rtol=1e-9)
    m = _RULE.match(r)
    if m is None:
        raise UserError(f"unknown holdout rule {rule!r}; use largest, N>X or C>X (e.g. 'N>1e9', 'C>=1e20')")
    name, op, value = m.groups()
    try:
        x = float(value)
    except ValueError:
        raise UserError(f"holdout rule {rule!r}: {value!r} is not a number") from None
    v = points["N"].to_numpy(dtype=float) if name == "N" else total_flops(points, cost)
    return v >= x if op == ">=" else v > x


@dataclass(frozen=True)
class HoldoutResult:
    """A held-out check: the rule, the fits on the kept points (by group), and one row per held-out
    point in ``heldout`` (group, run, N, D, compute, observed, predicted, lo, hi, error_nats, error_log,
    inside); ``summary`` has per-group counts, mean and largest absolute errors, and the share inside."""

    rule: str
    level: float
    fits: dict[str, FitResult]
    heldout: pd.DataFrame
    summary: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "level": self.level,
                "interval": "bootstrap prediction interval (parameters and residual scatter)",
                "summary": self.summary,
                "points": [{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
                           for row in self.heldout.to_dict(orient="records")],
                "fits": {g: f.to_dict() for g, f in self.fits.items()}}

    def summary_text(self) -> str:
        lines = [f"held out: {self.rule}"]
        for g, s in self.summary.items():
            inside = ("no interval (no bootstrap)" if s["n_inside"] is None else
                      f"{s['n_inside']}/{s['n_heldout']} inside the {100 * self.level:.0f}% interval")
            lines.append(f"  {g}: {s['n_heldout']} points held out, {s['n_fitted']} fitted; mean |error| "
                         f"{s['mean_abs_error_nats']:.4g} nats ({s['mean_abs_error_log']:.4g} in log loss), "
                         f"{inside}")
        return "\n".join(lines)


def prediction_interval(fit: FitResult, inputs: dict[str, np.ndarray], residuals: np.ndarray,
                        level: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval of log L_b(x) + e_b (module doc); NaN without bootstrap samples."""
    n = next(iter(inputs.values())).size
    if fit.bootstrap.shape[0] == 0:
        return np.full(n, np.nan), np.full(n, np.nan)
    logp = np.log(fit.predict_bootstrap(**inputs))                 # (K, n)
    rng = np.random.default_rng(seed)
    e = rng.choice(residuals, size=logp.shape, replace=True)
    lo, hi = percentile_interval(logp + e, level, axis=0)  # a failed resample (NaN) is left out
    return np.exp(lo), np.exp(hi)


def holdout(points: pd.DataFrame, law: str | Law, rule: str, settings: FitSettings | None = None, *,
            fit: Callable[..., FitResult] = fit_law, **changes: Any) -> HoldoutResult:
    """Fit ``law`` per group on the points ``rule`` keeps, predict the held-out ones (module doc).

    ``settings`` and keyword ``changes`` as ``fit_law``; their seed and interval level also draw and
    bound the prediction intervals. ``fit`` is the fitting function (``fit_law`` signature: points,
    law, settings, group=...). Raises UserError when the rule holds out nothing, or leaves a group
    fewer points than the law has parameters.
    """
    settings = settings_of(settings, changes)
    seed, ci_level = settings.seed, settings.ci_level
    law = get_law(law) if isinstance(law, str) else law
    fits: dict[str, FitResult] = {}
    rows: list[pd.DataFrame] = []
    summary: dict[str, dict[str, Any]] = {}
    any_held = False
    for group in sorted(points["group"].astype(str).unique()):
        sub = group_rows(points, group)
        cost = token_cost(sub)
        held = holdout_mask(sub, rule, cost)
        if not held.any():
            continue
        any_held = True
        train, test = sub[~held].reset_index(drop=True), sub[held].reset_index(drop=True)
        if len(train) < law.n_params:
            raise UserError(f"holdout {rule!r} leaves {len(train)} points in group {group!r} for the "
                            f"{law.n_params} parameters of the {law.name} law; hold out fewer")
        f = fit(train, law, settings, group=group)
        fits[group] = f
        X = law_inputs(test, law.inputs, source=f"group {group!r}")
        pred = f.predict(**X)
        lo, hi = prediction_interval(f, X, f.residuals(), ci_level, seed)
        obs = test["loss"].to_numpy(dtype=float)
        inside = np.where(np.isfinite(lo), (obs >= lo) & (obs <= hi), np.nan)
        rows.append(pd.DataFrame({
            "group": group, "run": test["run"].astype(str).to_numpy(),
            "N": test["N"].to_numpy(dtype=float), "D": test["D"].to_numpy(dtype=float),
            "compute": total_flops(test, cost), "observed": obs, "predicted": pred, "lo": lo, "hi": hi,
            "error_nats": obs - pred, "error_log": np.log(obs / pred),
            "inside": [None if math.isnan(v) else bool(v) for v in inside]}))
        summary[group] = {
            "n_fitted": int(len(train)), "n_heldout": int(len(test)),
            "fitted_N_max": float(train["N"].max()),
            "fitted_compute_max": float(total_flops(train, cost).max()),
            "mean_error_nats": float(np.mean(obs - pred)),
            "mean_abs_error_nats": float(np.mean(np.abs(obs - pred))),
            "max_abs_error_nats": float(np.max(np.abs(obs - pred))),
            "mean_abs_error_log": float(np.mean(np.abs(np.log(obs / pred)))),
            "n_inside": int(np.nansum(inside)) if np.isfinite(lo).all() else None,
        }
    if not any_held:
        raise UserError(f"holdout {rule!r} holds out no points")
    return HoldoutResult(rule=rule, level=float(ci_level), fits=fits,
                         heldout=pd.concat(rows, ignore_index=True), summary=summary)

