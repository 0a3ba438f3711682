"""Small statistics shared by the fitter, the savings, the study design and the figures: every
quantile the project computes goes through :func:`quantiles` (one interpolation rule)."""

from __future__ import annotations

import numpy as np


def quantiles(samples, q):
    """The ``q`` quantiles (a float or a sequence in [0, 1]) of the finite values of ``samples``,
    linearly interpolated between order statistics (numpy's and pandas' default: Hyndman & Fan
    1996, definition 7). NaN where no finite value is left. A float for a float ``q``, else an
    array."""
    x = np.asarray(samples, dtype=float).ravel()
    x = x[np.isfinite(x)]
    if x.size == 0:
        return float("nan") if np.ndim(q) == 0 else np.full(np.shape(q), np.nan)
    out = np.quantile(x, q)
    return float(out) if np.ndim(q) == 0 else out


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
        lo, hi = quantiles(x, q)
        return float(lo), float(hi)
    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices give NaN, as documented
            lo, hi = np.nanquantile(x, q, axis=axis)
    return lo, hi
