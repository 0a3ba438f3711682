"""Goodness of fit: does a law leave a systematic trend in its log residuals?"""

from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from scaling.fitting.laws import Law

MISFIT_P = 1e-3        # significance of the residual trend
MISFIT_RATIO = 1.0     # trend RMS / scatter RMS at which the trend matters
MISFIT_FLOOR = 1e-6    # trend RMS in log loss below which no trend matters (a 1e-4 % loss error)


def goodness_of_fit(law: Law, inputs: Mapping[str, np.ndarray], resid: np.ndarray) -> dict[str, Any]:
    """Do the log residuals carry a systematic trend the law misses, measured against their own scatter?

    The residuals are regressed on a full quadratic in the law's (standardised) log inputs (S as
    it is): constant, linear, squares and products, i.e. curvature in every direction. F-test of
    that trend against the remaining scatter (a correct law leaves only noise: F ~ F(p-1, n-p)).
    Flagged ``misfit`` when the trend is significant (p < MISFIT_P) and not negligible beside the
    scatter (trend RMS >= MISFIT_RATIO x scatter RMS): with very many points a trend far below the
    noise is significant but harmless: a law whose systematic error stays below the points' own
    scatter predicts them as well as the noise allows. (Epoch's Chinchilla points under the
    Chinchilla law: p = 2e-19 but trend/scatter = 0.71, not flagged.) Nor is a trend below
    MISFIT_FLOOR in absolute terms: noise-free data on the law leave float round-off (~1e-14) as
    both trend and scatter, which the ratio test alone would call a misfit. Also reports the worst
    residual in units of the scatter.
    """
    from scipy.stats import f as f_dist

    cols = []
    for name in law.inputs:
        v = np.asarray(inputs[name], dtype=float)
        v = v if name == "S" else np.log(v)
        if np.ptp(v) > 0:
            cols.append((v - v.mean()) / v.std())
    feats = [np.ones_like(resid)] + cols + [a * b for i, a in enumerate(cols) for b in cols[i:]]
    A = np.column_stack(feats)
    n = resid.size
    coef, _, rank, _ = np.linalg.lstsq(A, resid, rcond=None)
    if n - rank < 5 or rank < 2:
        return {"tested": False, "reason": f"too few points ({n}) for a quadratic residual trend in "
                f"{len(cols)} inputs", "misfit": False}
    trend = A @ coef
    scatter = resid - trend
    ss_trend = float(np.sum((trend - resid.mean()) ** 2))
    ss_res = float(np.sum(scatter ** 2))
    df1, df2 = rank - 1, n - rank
    scatter_rms = math.sqrt(ss_res / df2)
    F = (ss_trend / df1) / max(ss_res / df2, 1e-300)
    p = float(f_dist.sf(F, df1, df2))
    trend_rms = math.sqrt(ss_trend / n)
    ratio = trend_rms / max(scatter_rms, 1e-300)
    return {"tested": True, "trend_rms": trend_rms, "scatter_rms": scatter_rms, "trend_to_scatter": ratio,
            "F": float(F), "p_value": p,
            "worst_residual_in_scatter": float(np.max(np.abs(scatter)) / max(scatter_rms, 1e-300)),
            "misfit": bool(p < MISFIT_P and ratio >= MISFIT_RATIO and trend_rms >= MISFIT_FLOOR)}
