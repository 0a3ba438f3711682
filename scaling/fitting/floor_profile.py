"""The loss floor's profile: which floors E the points allow when the fit cannot pin E, and what the
law's compute-optimal exponent does across them.

A law whose best fit puts E on its bound (or whose bootstrap fits end there) is "not identified":
the points are fitted about as well by other floors, with A, alpha, B, beta moving to compensate,
and every quantity read off the law moves with them. The bootstrap cannot show this, since its
refits end on the same bound; the profile does. For E on a grid below the lowest observed loss the
law is refitted with E fixed and every other parameter free (same objective, constraints and
points; no bootstrap), and the profile statistic of each floor is

    Delta(E) = (S(E) - S_min) / (sigma^2 * deff),     sigma^2 = S_min / (n - p),

with S the sum of squared log residuals of a fit, S_min the least of the free fit's and the
profile's, n points, p the free fit's free parameters. Under Gaussian log residuals Delta is the
profile likelihood-ratio statistic (Venzon and Moolgavkar 1988, "A method for computing profile-
likelihood-based confidence intervals", Applied Statistics 37: 87-94); with sigma^2 estimated from
the same n - p residual degrees of freedom its reference is F(1, n - p), not chi2_1 (Bates and
Watts 1988, "Nonlinear Regression Analysis and Its Applications", section 6.1: the profile F
interval), and the floors with Delta <= F_{1, n-p}(level) form the interval of E. (Before the
numbers audit of 2026-12-07 the cut was chi2_1: 3.84 instead of 4.96 at n - p = 10, too narrow
for a small design; at the shipped study's n - p = 208 it is 3.89, and its allowed floors did not
move to 3 digits.) The points of one run share its
trunk and seed, so their residuals are correlated and n overstates the information; the
statistic is divided by the design effect of the runs, deff = 1 + (m - 1) rho (Kish 1965, "Survey
Sampling", section 5.4), with m the mean number of points per run and rho the intraclass
correlation of the free fit's log residuals by run (the one-way ANOVA estimator, clipped to
[0, 1]). This is a first-order correction, not an exact cluster-robust test: where rho is small
and the runs are few, read the interval as approximate.

The fitter's objective (Huber on log loss by default) is the one the profile minimises; S is only
the yardstick between fits. An objective other than squared error can end a fixed-E fit with a
smaller S than the free fit; S_min takes the least, so Delta >= 0.

Each fixed-E fit starts from the free fit's parameters and the nearest floor already fitted (E set
to the new floor), plus every ``THIN``-th start of the law's grid: on runs/ and planted studies this
reached the full grid's optimum (sum of squares within 1e-8, relative) 2-4x faster.

The grid is ``GRID`` floors from the law's lower bound of E up to 0.99 x the lowest loss, with the
free fit's E among them; each change between allowed and excluded neighbours is bisected
``REFINE`` times. The exponents reported over the allowed floors are those the fit prints:
``a_data`` (the frontier across the data's compute, where F(N) is not k N) and the law's large-
budget allocation exponent, each the best fit's at each allowed floor: how far the floor the
data cannot fix moves the exponent, not a confidence interval of the exponent (the other
parameters' uncertainty at a fixed floor is the bootstrap's; the numbers audit found the span
alone held a planted exponent in 6 of 16 small studies). Tested against planted laws
(tests/test_floor_profile.py).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import pandas as pd
from scipy import stats

from scaling.fitting.settings import FitSettings

GRID = 9          # floors on the grid (the bound, eight more up to 0.99 x the lowest loss)
REFINE = 4        # bisections of each allowed / excluded change
TOP = 0.99        # highest floor tried, as a fraction of the lowest observed loss
THIN = 100        # starts of the law's grid kept (every len/THIN-th) beside the two warm starts


def design_effect(residuals: np.ndarray, runs: np.ndarray) -> tuple[float, float, float]:
    """(deff, rho, m): Kish's design effect 1 + (m - 1) rho of points clustered in runs, rho the
    one-way ANOVA intraclass correlation of ``residuals`` by ``runs`` (clipped to [0, 1]) and m the
    mean run size. One point per run, or one run: rho = 0, deff = 1."""
    r = np.asarray(residuals, dtype=float)
    labels, idx = np.unique(np.asarray(runs).astype(str), return_inverse=True)
    k, n = labels.size, r.size
    sizes = np.bincount(idx, minlength=k).astype(float)
    m = n / k
    if k < 2 or n <= k:
        return 1.0, 0.0, m
    means = np.bincount(idx, weights=r, minlength=k) / sizes
    msb = float(np.sum(sizes * (means - r.mean()) ** 2) / (k - 1))
    msw = float(np.sum((r - means[idx]) ** 2) / (n - k))
    m0 = (n - np.sum(sizes**2) / n) / (k - 1)          # the ANOVA's size for unequal runs
    denom = msb + (m0 - 1) * msw
    rho = 0.0 if denom <= 0 else float(np.clip((msb - msw) / denom, 0.0, 1.0))
    return 1.0 + (m - 1.0) * rho, rho, m


def _refit_settings(fit: Any, E: float, warm: list[dict[str, float]]) -> FitSettings:
    """The fit's settings with E fixed, no bootstrap, starts: ``warm`` (E set to the new floor) and
    a thinned law grid."""
    s, law = fit.settings, fit.law_obj
    fixed = {**(s.get("fixed") or {}), "E": float(E)}
    grid = law.starts()
    starts = np.vstack([*(law.to_internal({**w, "E": float(E)})[None] for w in warm),
                        grid[:: max(1, len(grid) // THIN)]])
    return FitSettings(objective=s.get("objective", "huber-log"), huber_delta=s["huber_delta"],
                       n_bootstrap=0, seed=int(s.get("seed", 0)), fix=fixed, tie=tuple(s.get("tied") or ()),
                       starts=starts)


def _why_not(fit: Any) -> str | None:
    law, s = fit.law_obj, fit.settings
    if "E" not in law.params:
        return f"the {law.name} law has no floor E"
    if "E" in (s.get("fixed") or {}):
        return "E is fixed"
    if any("E" in t.split("=") for t in s.get("tied") or ()):
        return "E is tied to another parameter"
    if "E" in (s.get("shared") or ()):
        return "E is shared by a joint fit"
    return None


def floor_profile(points: pd.DataFrame, fit: Any, refit: Callable[..., Any], *,
                  level: float | None = None) -> dict[str, Any]:
    """The profile of E for ``fit`` (a ``FitResult`` of ``points``, a group's canonical points):
    floors tried, their Delta, allowed or not, and the exponents there; the allowed range of E and
    the exponents' range over it. ``{"available": False, "reason": ...}`` where E is not free.
    ``refit`` is ``scaling.fitting.fit.fit_law`` (given, so that this module does not import the
    fitter that calls it)."""
    reason = _why_not(fit)
    if reason:
        return {"available": False, "reason": reason}
    law = fit.law_obj
    level = float(fit.settings.get("ci_level", 0.95) if level is None else level)
    resid = fit.residuals()
    n = resid.size
    p = law.n_params - len(fit.settings.get("fixed") or {}) - len(fit.settings.get("tied") or ())
    if n - p < 1:
        return {"available": False, "reason": f"{n} points for {p} free parameters"}
    crit = float(stats.f.ppf(level, 1, n - p))
    deff, rho, m = design_effect(resid, points["run"].to_numpy())
    exp_keys = [k for k in ("a_data", law.allocation_exponents[0]) if k in fit.derived]
    lo_bound = law.bounds["E"][0]
    top = TOP * float(points["loss"].min())
    fits: dict[float, dict[str, Any]] = {}   # floor -> S, the exponents and the parameters there

    def record(E: float, f: Any) -> None:
        fits[E] = {"S": float(np.sum(f.residuals() ** 2)), "params": f.params,
                   **{k: float(f.derived[k]) for k in exp_keys}}

    def at(E: float) -> None:
        if E not in fits:
            near = fits[min(fits, key=lambda e: abs(e - E))]["params"]
            record(E, refit(points, law, _refit_settings(fit, E, [fit.params, near]), group=fit.group))

    E_hat = float(fit.params["E"])
    if E_hat <= lo_bound * (1 + 1e-6):      # on the bound: one floor, not two a rounding apart
        E_hat = lo_bound
    record(E_hat, fit)
    grid = sorted({lo_bound, *np.linspace(0, top, GRID)[1:], E_hat})
    for E in grid:
        if lo_bound <= E <= max(top, lo_bound):
            at(E)

    def delta(E: float, s_min: float) -> float:
        sigma2 = s_min / (n - p)
        return max(0.0, fits[E]["S"] - s_min) / (sigma2 * deff) if sigma2 > 0 else math.inf

    s_min = min(v["S"] for v in fits.values())
    for _ in range(REFINE):   # bisect every change between neighbours, on the current S_min
        tried = sorted(fits)
        ok = [delta(E, s_min) <= crit for E in tried]
        mids = [(a + b) / 2 for a, b, oa, ob in zip(tried, tried[1:], ok, ok[1:]) if oa != ob]
        if not mids:
            break
        for E in mids:
            at(E)
        s_min = min(v["S"] for v in fits.values())
    tried = sorted(fits)
    deltas = [delta(E, s_min) for E in tried]
    allowed = [d <= crit for d in deltas]
    inside = [E for E, a in zip(tried, allowed) if a]
    out: dict[str, Any] = {
        "available": True, "level": level, "critical": crit, "design_effect": deff, "icc": rho,
        "points_per_run": m, "n_points": n, "n_free": p,
        "E": tried, "S": [fits[E]["S"] for E in tried], "delta": deltas, "allowed": allowed,
        "E_range": [min(inside), max(inside)] if inside else [math.nan, math.nan],
        "up_to_lowest_loss": bool(allowed[-1]) and tried[-1] >= top,
        "from_bound": bool(allowed[0]) and tried[0] <= lo_bound,
        "contiguous": _contiguous(allowed), "exponents": exp_keys,
    }
    for k in exp_keys:
        vals = [fits[E][k] for E in inside]
        out[k] = [fits[E][k] for E in tried]
        out[f"{k}_range"] = [min(vals), max(vals)] if vals else [math.nan, math.nan]
    return out


def _contiguous(allowed: list[bool]) -> bool:
    """The allowed floors form one run of the grid (the interval has no hole)."""
    idx = [i for i, a in enumerate(allowed) if a]
    return not idx or idx[-1] - idx[0] + 1 == len(idx)
