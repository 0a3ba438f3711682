"""Small statistics shared by the fitter, the savings, the study design and the figures."""

from __future__ import annotations

import numpy as np


def percentile_interval(samples: np.ndarray, level: float = 0.95, axis: int | None = None):
    """Central percentile interval of bootstrap ``samples`` at ``level`` (Efron & Tibshirani 1993,
    ch. 13): the (1 - level)/2 and (1 + level)/2 quantiles, linearly interpolated (numpy's
    default), over ``axis`` (None: all values). Non-finite samples are left out (a resample whose
    fit failed is not evidence); where none is left the ends are NaN. Returns (lo, hi): floats
    for ``axis=None``, else arrays."""
    x = np.asarray(samples, dtype=float)
    x = np.where(np.isfinite(x), x, np.nan)
    q = [(1.0 - level) / 2.0, (1.0 + level) / 2.0]
    if axis is None:
        x = x[~np.isnan(x)]
        if x.size == 0:
            return float("nan"), float("nan")
        lo, hi = np.quantile(x, q)
        return float(lo), float(hi)
    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices give NaN, as documented
            lo, hi = np.nanquantile(x, q, axis=axis)
    return lo, hi
