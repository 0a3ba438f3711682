"""Small statistics shared by the fitter, the savings, the study design, the analyses and the figures:
every quantile the project computes goes through :func:`quantiles` (one interpolation rule), every
binomial proportion's interval through :func:`wilson_interval`."""

from __future__ import annotations

import math

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


def weighted_paired_mean(diff, weights) -> tuple[float | None, float | None]:
    """Weight-averaged paired difference and its ratio-estimator standard error.

    ``diff``: per-unit differences d_i (e.g. per-sequence mean losses of two models on the same
    sequence); ``weights``: w_i > 0 (the sequence's token count). With W = sum_i w_i and n units,

        m    = sum_i w_i d_i / W                                   (the token-weighted mean)
        se^2 = n / (n - 1) * sum_i w_i^2 (d_i - m)^2 / W^2

    m is the ratio of two sample totals, sum w_i d_i over sum w_i; se is the linearised
    (Taylor) variance of a ratio estimator with the n/(n-1) small-sample factor (Cochran 1977,
    "Sampling Techniques", 3rd ed., ch. 6: v(R) = sum (y_i - R x_i)^2 / (n (n-1) xbar^2) with
    y_i = w_i d_i, x_i = w_i). With equal weights it is the plain sd(d)/sqrt(n). When the d_i
    are per-sequence losses weighted by their tokens, m equals the difference of the two
    token-weighted bucket losses, so the s.e. belongs to that difference (an unweighted
    sd(d)/sqrt(n) would belong to the unweighted mean instead).

    Returns (m, se): (None, None) without units or with a total weight of 0; se None for one unit.
    ValueError when the two have different lengths or a weight is negative or not finite.
    """
    d = np.asarray(diff, dtype=float).ravel()
    w = np.asarray(weights, dtype=float).ravel()
    if d.shape != w.shape:
        raise ValueError(f"{d.size} differences but {w.size} weights")
    if not np.isfinite(w).all() or (w < 0).any():
        raise ValueError("weights must be finite and non-negative")
    total = float(w.sum())
    if d.size == 0 or total <= 0:
        return None, None
    m = float((w * d).sum() / total)
    n = d.size
    if n < 2:
        return m, None
    se = float(np.sqrt((w ** 2 * (d - m) ** 2).sum() * n / (n - 1)) / total)
    return m, se


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (Wilson 1927; Agresti & Coull 1998):
    (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n), z the normal quantile; computed by
    ``scipy.stats.binomtest(successes, n).proportion_ci(confidence, method="wilson")``."""
    from scipy.stats import binomtest

    if n <= 0:
        return (math.nan, math.nan)
    if not 0 <= successes <= n:
        raise ValueError(f"successes {successes} outside 0..{n}")
    ci = binomtest(int(successes), int(n)).proportion_ci(confidence_level=confidence, method="wilson")
    # At p = 0 (p = 1) the lower (upper) end is exactly 0 (1); rounding would leave 1e-17.
    lo = 0.0 if successes == 0 else max(0.0, float(ci.low))
    hi = 1.0 if successes == n else min(1.0, float(ci.high))
    return lo, hi
