"""Cross-checks of the approach-3 fit: Hoffmann et al. (2022) approaches 1 and 2.

Both estimate the compute-optimal size exponent a in N* ~ C^a (and b for tokens, D* = C/F(N*);
b = 1 - a when F = k N) without assuming the parametric law, so they check its allocation.

Approach 2, IsoFLOP profiles: points are bucketed by total compute C (a bucket spans at most
``width`` decades; an IsoFLOP design's repeated budgets fall in one bucket each). In each
bucket, ``log L = q0 + q1 u + q2 u^2 + q3 v`` is fitted by least squares, with u = log N and
v = log C (the v term absorbs compute differences inside a bucket; it is 0 for an exact IsoFLOP
design). The vertex u* = -q1 / (2 q2) is N*(C) when q2 > 0 and it lies inside the fitted N
range. Then log N* = a log C + const, by ordinary least squares over the buckets. The OLS 95%
t-interval of that slope (n_buckets - 2 degrees of freedom) treats the buckets' vertices as
independent, which they are not when one run serves several budgets (a WSD trunk) or a seed's luck
moves all of a size's losses. Where configurations hold several seeds and the fit bootstraps, the
seeds are redrawn within each configuration (as for approach 1, ``_seed_resamples``: k - 1 draws
from a configuration's k seeds, Rao and Wu's rescaling, so a seed mean keeps its variance s^2 / k),
a is recomputed per resample, and ``a_ci`` is the union of the OLS interval and the resamples'
percentile interval (``a_ci_ols``, ``a_ci_bootstrap``). Coverage of a planted a
(``benchmarks/interval_coverage.py``, results in ``benchmarks/results/interval-coverage-2026-12-07.json``):
200 simulated studies per case shaped like the shipped one (9 sizes a factor 10 either side of the
optimum, 5 budgets over a decade, every run a curve through all 5, Epoch's Chinchilla law, F = 6 N,
100 resamples each), a run-level log-normal offset (a seed's luck, shared by all budgets of its run)
and per-point noise:

    seeds, noise            OLS     union, k draws   union, k - 1 draws (default)
    3, 2% run               57.5%   88.0%            93.5%
    3, 1% run + 0.5% point  80.0%   89.5%            92.5%
    3, 1% point             94.5%   96.0%            97.5%
    5, 1% run + 0.5% point  74.5%   91.0%            93.5%
    5, 3% run               59.5%   89.5%            92.0%
    7, 1% run + 0.5% point  80.5%   94.0%            96.0%

(Each from 200 studies: a Wilson 95% interval of about +-3.5 points at 93%. Median widths with
k - 1 draws are 1.03-1.23x those with k, the bootstrap's alone 1.07-1.27x.) So the union covers
close to 95% but still a little less where a seed's luck dominates and seeds are few.
``tests/test_approaches.py`` checks on 30 studies of the first case that the union covers more often
than the OLS interval, and that k - 1 draws widen the bootstrap. A resample's points are weighted
(a configuration weighs k, its k - 1 draws k / (k - 1) each), so its IsoFLOP buckets hold the
design's points: with repeated rows instead, 2 seeds of 4 sizes a budget left every resample below
``MIN_BUCKET_POINTS``. Below ``MIN_RESAMPLED_SHARE`` of
resamples giving an estimate, a depends on which seeds were trained and no interval is given.

Which points the parabola sees (``estimator``):

- ``"window"`` (default): only the points within ``window`` decades of N (default 1, a factor
  10 either side) around the minimum. The window starts at the size with the lowest loss and is
  re-centred on the fitted vertex until it stops moving (at most 5 times); when it holds fewer
  than 5 points, the 5 nearest in log N are used. A bucket whose lowest loss is its smallest or
  largest size is skipped (the minimum is not bracketed). Where a size has several points (its
  seeds), the lowest loss is the size's mean; the parabola is fitted through every point.
- ``"parabola"``: one parabola through the whole sweep (Hoffmann et al. 2022), kept as an option.

Why a window: a real IsoFLOP profile is not a parabola in log N. Far from the optimum it is
asymmetric (E + A N^-alpha + B (C/kN)^-beta rises as N^-alpha on one side and N^beta on the
other), so a parabola through a wide sweep puts its vertex where the sweep's shape, not the
minimum, dictates, and a design whose sweep moves relative to the optimum from budget to budget
(a fixed set of model sizes, say) turns that into an exponent bias (Besiroglu et al. 2024; Czech
2026, "Problems with Chinchilla Approach 2"). Near its minimum every smooth profile is a
parabola, so a window around it removes the bias at the price of some variance. Measured here
(``tests/test_approaches.py``): on a sweep of 26 fixed model sizes reaching twice the minimum loss
under a law with alpha = 0.684, beta = 0.439, the whole-sweep parabola is off by -0.054 in a and
the window by +0.0016 (noise-free); with 0.3% noise in the loss, over 10 seeds, the window stays
within 0.009 and the parabola at -0.053 to -0.057. Half a decade was unbiased too but scattered by
up to 0.026 at 0.2% noise, so the default is one decade; on Llama 3's and Marin's published sweeps
one decade changes a by 0.000 to 0.011 against the whole sweep. A smooth interpolation per budget
(Akima, which Open Athena uses to screen outliers) is as unbiased noise-free, but it passes through
every noisy point: at 0.3% noise its exponent was off by up to 0.06, so it is not offered.
Design-bias diagnostic, measured on the data: in every bucket both estimators run; the report
gives each bucket's vertex shift log10(N*_full / N*_window) and ``design_bias`` = a(full sweep) -
a(window) over the buckets both accept. A large value says the sweep is too wide or off-centre
for a single parabola (it does not use the approach-3 law, which misfits exactly such points).

Shape check, also measured on the data: a window only shrinks the parabola's bias, it does not
remove it. A skewed profile f2 x^2 + f3 x^3 moves a parabola's vertex by about -(3/10)(f3/f2) h^2
over a window of half-width h, and where the skew changes with compute the slope takes it in: the
profiles' shape moves with C when F(N) = k N + e sqrt(N) + c is not k N (a fixed cost per token that
dominates small models, as in the CPU proxies), or when the floor E weighs more at larger budgets.
On the noise-free planted studies of ``tests/test_token_cost.py`` (sizes a factor s either side of
each budget's true N*), the window parabola is off by +0.0015/+0.006/+0.0125 (Baseline, s = 2/4/8)
and +0.003/+0.012/+0.025 (SMELT), with OLS intervals of half-width 0.005-0.009 that exclude the
truth at s >= 4. A cubic through the same points of each bucket (``_cubic_vertex``) is off by at
most 0.0009 there; but its minimum scatters two to four times as much under noise (the wide sweep
above, 20 studies: SD 0.0145 against 0.0039 at 0.2% noise, 0.048 against 0.023 at 1%), so the
parabola stays the estimate and the cubic is its check, reported beside it: ``a_cubic`` with its
OLS t-interval, and ``shape_bias`` = a - ``a_cubic`` (the OLS slope of log(N*_parabola / N*_cubic)
on log C, with its t-interval). On the planted studies the cubic's interval excludes the
parabola's a at s >= 4 (Baseline, s = 4: 0.4303 against [0.4194, 0.4295]). It is not a warning: on
the noisy wide sweeps (60 studies each at 0.2%, 0.5% and 1% noise) the two intervals excluded each
other's estimate in 7-10 of 60, where the parabola was unbiased (mean error within 0.001) and its own
interval covered the truth in 88-93%: the cubic's interval covered it in only 83-87%, so a
disagreement there is more often the cubic's noise than the parabola's bias. Where approach 2
disagrees with approach 3 beyond their intervals and the cubics' interval agrees with approach 3,
:func:`agreement`'s warning says so (on the planted studies: parabolas 0.437 and 0.371 against a
true 0.424 and 0.346, cubics 0.425 [0.419, 0.430] and 0.347 [0.338, 0.356]).

Approach 1, frontier of training curves: first the seeds of a configuration (the same N, sparsity
and FLOPs per token, distinct recorded seeds) are one curve, at their mean loss at each budget
(``seed_curves``): a frontier over single runs is a minimum over seeds, which favours the sizes with
more seeds (on curves of 10 sizes, 7 seeds at every other size and 1 at the rest, 0.5% seed noise,
20 studies: a off by -0.057 on average as a minimum over runs, -0.013 averaged, +0.004 noise-free;
``tests/test_approaches.py``). Runs without a recorded seed, or a configuration whose runs repeat a
seed (an lr or schedule sweep: the minimum over those is what approach 1 wants), stay curves of
their own. For curves with several budgets, log L is interpolated in log C on a common grid and the
curve with the lowest loss at each C gives N*(C), kept where a smaller and a larger curve reach
that C too (so the optimum is bracketed); with one point per curve, the lowest loss of each compute
bucket (as in approach 2) is kept when it is below every smaller bucket's, a cruder estimate. Where
a seed reached only some budgets, the mean there holds fewer seeds than elsewhere on its curve (the
study's own design; the frontier does not weigh by seed count). Then log N* = a log C + const. N* is
quantised to the run sizes, so a needs many sizes over a wide range; its OLS interval treats the
frontier points as independent, which they are not (optimistic). Where configurations hold several
seeds and the fit bootstraps (``cross_checks`` passes its ``n_bootstrap`` and seed), the interval is
instead the percentile interval of a over resamples that redraw, with replacement, the seeds within
each configuration (the design kept, the seeds' luck redrawn; a configuration with one run adds no
spread; k - 1 draws from k seeds, as for approach 2), and ``resampled_share`` says in how many
resamples the frontier still gave an estimate: below half, a depends on which seeds were trained and
no interval is given (a warning says so). That interval is a lower bound on the uncertainty, not a
95% interval: under seed noise the frontier estimator is biased, and a bootstrap does not see it
(``benchmarks/interval_coverage.py``, 200 studies per case, 100 resamples). On training curves of
10 sizes over two decades through 12 budgets over three decades, with 2% seed offsets, a-hat is off
by -0.076, -0.050 and -0.045 (median; s.d. 0.065, 0.061, 0.054) with 3, 5 and 7 seeds: a lucky size
holds the frontier over a range of compute, which flattens it; the interval covered the planted a in
77.7%, 77.4% and 76.0% of studies (71.6%, 74.4%, 75.5% with k draws; the OLS interval 46-55%; the
basic bootstrap interval [2a - hi, 2a - lo], which corrects a bias the resamples show, 64-67%: they
do not show this one). On
the IsoFLOP design above (a decade of compute, the frontier moving across 2-3 sizes) a-hat exists in
79-182 of 200 studies and its seed-bootstrap interval in 26-181, a-hat is off by +0.03 to +0.22, and
the interval is 0.44-1.05 wide (median) and covered the planted a in 85-98% of the studies that got
one (the OLS interval in 21.5-49.5%).
The trainer's
``metrics.jsonl`` adds no further curve points: its validation losses are logged at the same
budget ends as ``final.json`` (warmup-stable-decay branches), and its per-step training loss is
taken at an un-decayed learning rate, which is not the loss a run of that length would reach.

``cross_checks`` adds ``warnings``: approaches whose intervals of a do not overlap approach 3's
bootstrap interval (its point estimate without a bootstrap), and approach 2 resting on fewer than
``FEW_BUDGETS`` (4) budgets.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from scaling.common.errors import UserError
from scaling.common.format import decimals
from scaling.common.stats import percentile_interval
from scaling.fitting.laws import TokenCost
from scaling.fitting.tables import SIZE_COLUMNS, config_keys, group_rows, seed_replicates, total_flops

MIN_BUCKET_POINTS = 5
MIN_BUCKETS = 3
FEW_BUDGETS = 4
MIN_RESAMPLED_SHARE = 0.5   # approach 1 needs an estimate in at least this share of its seed resamples
BUCKET_WIDTH_DECADES = 0.05
# an interval this narrow (relative) has collapsed numerically: frontier points exactly on a line
# (measured width 1e-14); wider ones print distinct ends at 9 decimals (common.format.decimals)
COLLAPSED_REL = 1e-8
ESTIMATORS = ("window", "parabola")
DEFAULT_ESTIMATOR = "window"
WINDOW_DECADES = 1.0
_WINDOW_ITERS = 5
_LEVEL = 0.95
_DRAWN = {"n-1": " (k - 1 of its k seeds drawn)", "n": " (k of its k seeds drawn)"}


def _slope(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """OLS slope and intercept of y on x."""
    A = np.column_stack([x, np.ones_like(x)])
    (s, c), *_ = np.linalg.lstsq(A, y, rcond=None)
    return float(s), float(c)


def _slope_ci(x: np.ndarray, y: np.ndarray, level: float = _LEVEL) -> tuple[float, float, float, float]:
    """OLS slope, intercept and the slope's t-interval (NaN with fewer than 3 points)."""
    s, c = _slope(x, y)
    n = x.size
    if n < 3:
        return s, c, math.nan, math.nan
    resid = y - (s * x + c)
    se = math.sqrt(float(resid @ resid) / (n - 2) / float(((x - x.mean()) ** 2).sum()))
    t = float(stats.t.ppf(0.5 + level / 2, n - 2))
    return s, c, s - t * se, s + t * se


def compute_buckets(logC10: np.ndarray, width: float = BUCKET_WIDTH_DECADES) -> np.ndarray:
    """Bucket label per point: greedy windows of ``width`` decades from the smallest compute up."""
    order = np.argsort(logC10)
    labels = np.empty(logC10.size, dtype=int)
    label, start = -1, -np.inf
    for i in order:
        if logC10[i] > start + width:
            label += 1
            start = logC10[i]
        labels[i] = label
    return labels


def _vertex(u: np.ndarray, v: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> tuple[float, str]:
    """Vertex of the (``w``-weighted) least-squares parabola in u (with a linear v term); NaN and why
    when unusable. Weights are a bootstrap resample's (``_seed_resamples``), all positive here."""
    if np.unique(np.round(u, 9)).size < 4:
        return math.nan, f"{np.unique(np.round(u, 9)).size} distinct sizes (need 4)"
    c = u.mean()
    uc, vc = u - c, v - v.mean()
    cols = [np.ones_like(uc), uc, uc ** 2] + ([vc] if np.ptp(vc) > 1e-9 else [])
    sw = np.ones_like(u) if w is None else np.sqrt(w)
    q, *_ = np.linalg.lstsq(np.column_stack(cols) * sw[:, None], y * sw, rcond=None)
    if q[2] <= 0:
        return math.nan, "profile not convex"
    ustar = c - q[1] / (2 * q[2])
    if not (u.min() <= ustar <= u.max()):
        return math.nan, "minimum outside the sampled N range"
    return float(ustar), ""


def _cubic_vertex(u: np.ndarray, v: np.ndarray, y: np.ndarray, near: float) -> float:
    """Local minimum of the least-squares cubic in u (with the linear v term) nearest ``near`` (the
    parabola's vertex), NaN where the points hold fewer than 5 sizes or the cubic has no minimum in
    their range. A parabola fitted to a skewed profile, f2 x^2 + f3 x^3 over a window of half-width h,
    takes the x^3 term into its slope and moves its vertex by about -(3/10) (f3 / f2) h^2; the cubic
    carries that term itself, so its minimum moves only through the quartic and higher terms."""
    if np.unique(np.round(u, 9)).size < 5:
        return math.nan
    c = u.mean()
    x, vc = u - c, v - v.mean()
    cols = [np.ones_like(x), x, x ** 2, x ** 3] + ([vc] if np.ptp(vc) > 1e-9 else [])
    q, *_ = np.linalg.lstsq(np.column_stack(cols), y, rcond=None)
    # stationary points: q1 + 2 q2 x + 3 q3 x^2 = 0; a minimum where 2 q2 + 6 q3 x > 0
    roots = (np.roots([3 * q[3], 2 * q[2], q[1]]) if abs(q[3]) > 1e-12 * abs(q[2])
             else np.array([-q[1] / (2 * q[2])]))
    minima = [r.real for r in roots if abs(r.imag) < 1e-12 and 2 * q[2] + 6 * q[3] * r.real > 0]
    if not minima:
        return math.nan
    ustar = c + min(minima, key=lambda r: abs(r - (near - c)))
    return float(ustar) if u.min() <= ustar <= u.max() else math.nan


def _window_vertex(u: np.ndarray, v: np.ndarray, y: np.ndarray, half: float,
                   min_points: int, w: np.ndarray | None = None) -> tuple[float, str, np.ndarray]:
    """Vertex of the parabola through the points within ``half`` (natural log units) of the minimum.
    The minimum is the size with the lowest mean log loss: the points of one size in the bucket (its
    seeds, or anything else trained at that size and compute) are averaged first, so the bracket check
    and the first centre do not follow the luckiest seed. ``w``: the points' weights (a resample's;
    the means and the fit are weighted, and a window holds ``min_points`` by weight). Returns the
    vertex, why it is NaN, and the mask of the points the last parabola was fitted to."""
    w = np.ones_like(u) if w is None else w
    sizes, which = np.unique(np.round(u, 9), return_inverse=True)
    mean_y = np.bincount(which, y * w) / np.bincount(which, w)
    # digitised tables repeat losses: an edge size tied with an interior one still brackets the minimum
    lowest = np.flatnonzero(mean_y == mean_y.min())
    inside = lowest[(lowest > 0) & (lowest < sizes.size - 1)]
    if not inside.size:
        return math.nan, "lowest loss at the edge of the sampled N range", np.zeros(u.size, dtype=bool)
    centre, ustar, used = float(sizes[inside[0]]), math.nan, np.zeros(u.size, dtype=bool)
    for _ in range(_WINDOW_ITERS):
        dist = np.abs(u - centre)
        m = dist <= half + 1e-12
        if w[m].sum() < min_points - 1e-9:
            m = dist <= np.sort(dist)[min(min_points, u.size) - 1] + 1e-12
        ustar, why = _vertex(u[m], v[m], y[m], w[m])
        used = m
        if not math.isfinite(ustar):
            return math.nan, f"window: {why}", used
        if abs(ustar - centre) < 1e-6:
            break
        centre = ustar
    return ustar, "", used


def isoflop_optima(N: np.ndarray, C: np.ndarray, loss: np.ndarray, *, width: float = BUCKET_WIDTH_DECADES,
                   min_points: int = MIN_BUCKET_POINTS, estimator: str = DEFAULT_ESTIMATOR,
                   window: float = WINDOW_DECADES, weight: np.ndarray | None = None
                   ) -> tuple[list[dict[str, Any]], list[str]]:
    """Per compute bucket: N* by ``estimator`` (see module doc), or why the bucket was not used.

    Each used bucket also carries both estimators' vertices, ``N_opt_full`` (whole sweep) and
    ``N_opt_window`` (NaN where unusable), and ``vertex_shift_decades`` = log10(N_opt_full / N_opt_window).
    ``weight`` (per point, a bootstrap resample's): the buckets, their compute and whether they hold
    ``min_points`` are the design's (all points), the parabolas are fitted to the points of positive
    weight, weighted, so a resample that draws fewer runs than the design keeps its buckets.
    """
    if estimator not in ESTIMATORS:
        raise UserError(f"unknown IsoFLOP estimator {estimator!r}; choose one of {', '.join(ESTIMATORS)}")
    if not window > 0:
        raise UserError(f"the IsoFLOP window must be > 0 decades, got {window}")
    u_all, v_all, y_all = np.log(N), np.log(C), np.log(loss)
    w_all = np.ones_like(u_all) if weight is None else np.asarray(weight, dtype=float)
    labels = compute_buckets(np.log10(C), width)
    used, skipped = [], []
    for lab in np.unique(labels):
        m = labels == lab
        Cg = float(np.exp(v_all[m].mean()))
        if m.sum() < min_points:
            skipped.append(f"C~{Cg:.2g}: {int(m.sum())} points")
            continue
        m &= w_all > 0
        u, v, y, w = u_all[m], v_all[m], y_all[m], w_all[m]
        full, why_full = _vertex(u, v, y, w)
        win, why_win, in_win = _window_vertex(u, v, y, window * math.log(10), min_points, w)
        ustar, why, n_fit = ((full, why_full, int(m.sum())) if estimator == "parabola"
                             else (win, why_win, int(in_win.sum())))
        # the shape check (approach2's shape_bias): a cubic through the points the parabola used
        fitted = np.ones(u.size, dtype=bool) if estimator == "parabola" else in_win
        cubic = (_cubic_vertex(u[fitted], v[fitted], y[fitted], ustar)
                 if weight is None and math.isfinite(ustar) else math.nan)
        if not math.isfinite(ustar):
            skipped.append(f"C~{Cg:.2g}: {why}")
            continue
        shift = (full - win) / math.log(10) if math.isfinite(full) and math.isfinite(win) else math.nan
        used.append({"compute": Cg, "N_opt": float(np.exp(ustar)), "n_points": int(m.sum()),
                     "n_fitted": n_fit,
                     "N_opt_full": float(np.exp(full)) if math.isfinite(full) else math.nan,
                     "N_opt_window": float(np.exp(win)) if math.isfinite(win) else math.nan,
                     "N_opt_cubic": float(np.exp(cubic)) if math.isfinite(cubic) else math.nan,
                     "vertex_shift_decades": shift})
    return used, skipped


def _shape_bias(used: list[dict[str, Any]]) -> dict[str, Any]:
    """The parabola's exponent minus the cubic's, through the same points of each bucket: the OLS
    slope of log(N*_parabola / N*_cubic) on log C over the buckets that have a cubic minimum, with
    its t-interval (a - a_cubic where every bucket has one: both are OLS slopes on the same log C).
    Empty where fewer than ``MIN_BUCKETS`` buckets have both."""
    both = [b for b in used if math.isfinite(b["N_opt_cubic"])]
    if len(both) < MIN_BUCKETS:
        return {}
    lc = np.log([b["compute"] for b in both])
    diff = np.log([b["N_opt"] for b in both]) - np.log([b["N_opt_cubic"] for b in both])
    bias, _, lo, hi = _slope_ci(lc, diff)
    a_cubic, _, clo, chi = _slope_ci(lc, np.log([b["N_opt_cubic"] for b in both]))
    return {"a_cubic": a_cubic, "a_cubic_ci": [clo, chi], "shape_bias": bias, "shape_bias_ci": [lo, hi],
            "shape_bias_buckets": len(both)}


def approach2(points: pd.DataFrame, fit: Any | None = None, *, width: float = BUCKET_WIDTH_DECADES,
              min_points: int = MIN_BUCKET_POINTS, estimator: str = DEFAULT_ESTIMATOR,
              window: float = WINDOW_DECADES, n_bootstrap: int = 0, seed: int = 0,
              seed_draws: str = "n-1") -> dict[str, Any]:
    """IsoFLOP estimate of a (see module doc); ``fit`` (a FitResult) gives the FLOPs per token F(N)
    for points without recorded compute. With ``n_bootstrap`` and configurations holding several
    seeds, ``a_ci`` also spans the seed bootstrap's percentile interval (module doc; ``seed_draws``:
    ``_seed_resamples``'s ``draws``)."""
    cost = fit.cost if fit is not None else TokenCost()
    N = points["N"].to_numpy(dtype=float)
    C = total_flops(points, cost)
    loss = points["loss"].to_numpy(dtype=float)
    used, skipped = isoflop_optima(N, C, loss, width=width, min_points=min_points, estimator=estimator,
                                   window=window)
    label = ("IsoFLOP parabolas, whole sweep" if estimator == "parabola"
             else f"IsoFLOP parabolas, {window:g}-decade window around the minimum")
    out: dict[str, Any] = {"method": f"approach 2 ({label})", "estimator": estimator,
                           "window_decades": window if estimator == "window" else None,
                           "bucket_width_decades": width, "n_buckets": len(used), "buckets": used,
                           "skipped_buckets": skipped}
    if len(used) < MIN_BUCKETS:
        out.update(available=False, reason=f"{len(used)} compute buckets with a bracketed minimum "
                   f"(need {MIN_BUCKETS}; a bucket needs >= {min_points} points within {width} decades "
                   "of compute, 4 distinct sizes and its minimum inside them)")
        return out
    logC = np.log([b["compute"] for b in used])
    a, c, lo, hi = _slope_ci(logC, np.log([b["N_opt"] for b in used]))
    # D* = C / F(N*): b = 1 - a and log H = -c - log k only when F = k N
    b, d_intercept = _slope(logC, logC - np.log(cost(np.array([b_["N_opt"] for b_ in used]))))
    out.update(available=True, reason="", a=a, b=b, log_intercept=c, a_ci=[lo, hi],
               k=cost.k, D_log_intercept=d_intercept)
    both = [b for b in used if math.isfinite(b["vertex_shift_decades"])]
    shifts = [b["vertex_shift_decades"] for b in both]
    out["max_abs_vertex_shift_decades"] = float(np.max(np.abs(shifts))) if shifts else math.nan
    if len(both) >= 2:
        lc = np.log([b["compute"] for b in both])
        a_full, _ = _slope(lc, np.log([b["N_opt_full"] for b in both]))
        a_win, _ = _slope(lc, np.log([b["N_opt_window"] for b in both]))
        out.update(a_full_sweep=a_full, a_window=a_win, design_bias=a_full - a_win,
                   design_bias_buckets=len(both))
    out.update(_shape_bias(used))
    weights = (_seed_resamples(points, _configurations(points)[0], n_bootstrap, seed, seed_draws)
               if n_bootstrap > 0 else None)
    if weights is None:
        return out
    boot = np.full(n_bootstrap, np.nan)
    for k, w in enumerate(weights):
        got, _ = isoflop_optima(N, C, loss, width=width, min_points=min_points, estimator=estimator,
                                window=window, weight=w)
        if len(got) >= MIN_BUCKETS:
            boot[k] = _slope(np.log([g["compute"] for g in got]), np.log([g["N_opt"] for g in got]))[0]
    share = float(np.isfinite(boot).mean())
    if share >= MIN_RESAMPLED_SHARE:
        blo, bhi = percentile_interval(boot)
        ci = [min(lo, float(blo)), max(hi, float(bhi))]
    else:
        blo = bhi = math.nan
        ci = [math.nan, math.nan]
    out.update(a_ci=ci, a_ci_ols=[lo, hi], a_ci_bootstrap=[float(blo), float(bhi)],
               n_resamples=n_bootstrap, resampled_share=share,
               ci_method="union of the OLS interval and a bootstrap over the seeds of each configuration"
                         + _DRAWN[seed_draws])
    return out


def _interp_curves(x: np.ndarray, y: np.ndarray, start: np.ndarray, count: np.ndarray,
                   grid: np.ndarray) -> np.ndarray:
    """(curves, grid): each curve ``x[s:s+c], y[s:s+c]`` (x sorted) linearly interpolated at ``grid``
    as ``np.interp`` does, inf outside the curve's range; one vectorised pass per grid value
    instead of one ``np.interp`` per curve (a table may hold a million runs)."""
    L = np.full((start.size, grid.size), np.inf)
    last = start + count - 1
    for j, g in enumerate(grid):
        below = np.add.reduceat((x <= g).astype(np.int64), start)   # curves are contiguous slices
        inside = (below >= 1) & (x[last] >= g)
        left = start + below - 1
        at_end = inside & (left == last)
        mid = inside & ~at_end
        lm = left[mid]
        slope = (y[lm + 1] - y[lm]) / (x[lm + 1] - x[lm])
        L[mid, j] = slope * (g - x[lm]) + y[lm]
        L[at_end, j] = y[left[at_end]]
    return L


def _configurations(points: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(curve label, budget key) of each point: the label is one per configuration whose runs are
    distinct seeds, else one per run (``scaling.fitting.tables.seed_replicates``); the key is D to 9
    digits (``config_keys``). Computed once per table, reused by every bootstrap resample."""
    curve = seed_replicates(points, config_keys(points, SIZE_COLUMNS),
                            unknown_together=False)
    return curve, config_keys(points, ("D",))


def seed_curves(points: pd.DataFrame, C: np.ndarray, weight: np.ndarray | None = None,
                keys: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[pd.DataFrame, int]:
    """(curves, n_runs): training curves with columns run (the curve's id), N, C and loss, where the
    runs of one configuration (the same N, sparsity and FLOPs per token) with distinct recorded seeds
    are one curve, at their mean loss at each budget D (over the seeds that reached it); runs without
    a recorded seed, or whose configuration repeats a seed, are curves of their own
    (``scaling.fitting.tables.seed_replicates``). ``weight`` (per point, e.g. a run's multiplicity in a
    bootstrap resample) weighs the means, 0 leaves a point out; ``keys``: ``_configurations``, when
    already computed."""
    curve, d = _configurations(points) if keys is None else keys
    w = np.ones(len(points)) if weight is None else np.asarray(weight, dtype=float)
    # bincounts over (curve, D) cells, not a groupby: a bootstrap calls this once per resample
    curve, d = np.asarray(curve, dtype=np.int64), np.asarray(d, dtype=np.int64)
    span = int(d.max(initial=0)) + 1
    _, first, cell = np.unique(curve * span + d, return_index=True, return_inverse=True)
    used = (w > 0).astype(float)
    wsum = np.bincount(cell, weights=w)
    with np.errstate(invalid="ignore", divide="ignore"):
        loss = np.bincount(cell, weights=points["loss"].to_numpy(dtype=float) * w) / wsum
        c = np.bincount(cell, weights=np.asarray(C, dtype=float) * used) / np.bincount(cell, weights=used)
    here = wsum > 0
    out = pd.DataFrame({"run": curve[first][here], "N": points["N"].to_numpy(dtype=float)[first][here],
                        "C": c[here], "loss": loss[here]})
    return out, points["run"][w > 0].nunique()


def _seed_resamples(points: pd.DataFrame, labels: np.ndarray, n: int, seed: int,
                    draws: str = "n-1") -> np.ndarray | None:
    """(n, points) weights: each resample draws, within every configuration of k runs, runs with
    replacement (a run's weight is how often it was drawn); None when no configuration holds two runs
    (nothing to resample). ``draws``: ``"n-1"`` (default) draws k - 1 of the k and scales their
    weights by k / (k - 1), so a configuration weighs k in every resample as in the estimate (Rao and
    Wu 1988's rescaled bootstrap with m = n - 1); ``"n"`` draws k.

    Why k - 1: the approaches average the seeds of a configuration, and the mean of m draws with
    replacement from k values with sample variance s^2 has variance (k - 1) s^2 / (k m). With m = k
    that is (k - 1) / k of s^2 / k, the usual estimate of the mean's variance: the naive bootstrap
    understates a configuration's seed spread by 18% in s.d. at 3 seeds, 11% at 5, 7% at 7. With
    m = k - 1 it is s^2 / k exactly (Rao and Wu 1988, "Resampling inference with complex survey
    data", JASA 83: the rescaled bootstrap per stratum; here a configuration is a stratum), at every
    budget all k seeds reached; at a budget only some of them reached, the number of draws landing
    there varies and the variance is close to, not exactly, that of their mean. Measured coverage of
    a planted exponent, both ways: ``benchmarks/interval_coverage.py``."""
    if draws not in ("n-1", "n"):
        raise ValueError(f"draws must be 'n-1' or 'n', got {draws!r}")
    runs, run_of_point = np.unique(points["run"].astype(str).to_numpy(), return_inverse=True)
    conf = np.zeros(runs.size, dtype=np.int64)
    conf[run_of_point] = labels
    order = np.argsort(conf, kind="stable")                     # runs grouped by configuration
    _, start, size = np.unique(conf[order], return_index=True, return_counts=True)
    if size.max() < 2:
        return None
    rng = np.random.default_rng(seed)
    slot_start, slot_size = np.repeat(start, size), np.repeat(size, size)
    # one draw per slot; "n-1" drops the last slot of every configuration of two runs or more and
    # scales its draws by k / (k - 1)
    slot = np.ones(runs.size, dtype=bool)
    scale = np.ones(runs.size)
    if draws == "n-1":
        slot[(start + size - 1)[size >= 2]] = False
        scale[order] = np.where(slot_size >= 2, slot_size / np.maximum(slot_size - 1, 1), 1.0)
    out = np.empty((n, len(points)))
    for b in range(n):
        drawn = order[slot_start + (rng.random(runs.size) * slot_size).astype(np.int64)]
        out[b] = (np.bincount(drawn[slot], minlength=runs.size) * scale)[run_of_point]
    return out


def envelope_optima(points: pd.DataFrame, C: np.ndarray, n_grid: int = 50, weight: np.ndarray | None = None,
                    keys: tuple[np.ndarray, np.ndarray] | None = None
                    ) -> tuple[list[tuple[float, float]], str]:
    """(C, N*) pairs on the lower envelope of the seed-averaged curves (``seed_curves``, with its
    ``weight`` and ``keys``); the second value names the mode used."""
    df, n_runs = seed_curves(points, C, weight, keys)
    df = df.sort_values(["run", "C"], kind="stable").reset_index(drop=True)
    C = df["C"].to_numpy()
    run_id = pd.factorize(df["run"])[0]
    start = np.flatnonzero(np.r_[True, run_id[1:] != run_id[:-1]])
    count = np.diff(np.r_[start, len(df)])
    # a curve is a run with at least 2 distinct budgets (vectorised: a table may hold 1e6 runs)
    logc = np.log(df["C"].to_numpy())
    first_c, last_c = logc[start], logc[start + count - 1]
    keep = last_c > first_c
    n_curves = int(keep.sum())
    if n_curves >= 2:
        lo, hi = np.log(df["C"].min()), np.log(df["C"].max())
        grid = np.linspace(lo, hi, n_grid)
        pts = np.repeat(keep, count)
        kc = count[keep]
        L = _interp_curves(logc[pts], np.log(df["loss"].to_numpy()[pts]), np.r_[0, np.cumsum(kc)[:-1]], kc,
                           grid)
        sizes = df["N"].to_numpy()[start[keep]]
        pairs = []
        for j in range(n_grid):
            cover = np.isfinite(L[:, j])
            if cover.sum() < 3:
                continue
            best = int(np.argmin(L[:, j]))
            # keep only optima bracketed by a smaller and a larger run at the same compute: at the edge
            # of the covered sizes the winner is the extreme run whatever the true optimum
            if sizes[cover].min() < sizes[best] < sizes[cover].max():
                pairs.append((float(np.exp(grid[j])), float(sizes[best])))
        return pairs, f"training curves of {n_curves} {_of_runs(df['run'].nunique(), n_runs)}"
    # one candidate per compute bucket (its lowest loss), kept when below every smaller bucket's
    labels = compute_buckets(np.log10(C))
    pairs, best = [], np.inf
    for lab in range(labels.max() + 1):
        m = np.flatnonzero(labels == lab)
        i = m[np.argmin(df["loss"].to_numpy()[m])]
        if df["loss"].iloc[i] < best:
            best = df["loss"].iloc[i]
            pairs.append((float(C[i]), float(df["N"].iloc[i])))
    seeds = ("" if df["run"].nunique() == n_runs
             else f"; the seeds of each configuration averaged: {n_runs} runs")
    return pairs, f"lower envelope of the points per compute bucket (no run has several budgets{seeds})"


def _of_runs(n_labels: int, n_runs: int) -> str:
    """How the curves were made: runs, or configurations whose seeds were averaged (``n_labels``, the
    seed-averaged curves of any length, fewer than the ``n_runs`` runs)."""
    return ("runs" if n_labels == n_runs
            else f"configurations (the seeds of each averaged: {n_runs} runs)")


def _frontier_slope(pairs: list[tuple[float, float]]) -> tuple[float, float, float, float] | str:
    """(a, intercept, lo, hi) of log N* on log C over the frontier pairs, or why there is none."""
    sizes = {round(n, 3) for _, n in pairs}
    if not pairs:
        return ("no compute has a frontier point: at none is the lowest loss's size bracketed by a "
                "smaller and a larger size trained to it (need 3 points and 3 sizes)")
    if len(pairs) < 3 or len(sizes) < 3:
        return f"the frontier has {len(pairs)} points and {len(sizes)} distinct sizes (need 3 of each)"
    return _slope_ci(np.log([p[0] for p in pairs]), np.log([p[1] for p in pairs]))


def approach1(points: pd.DataFrame, fit: Any | None = None, *, n_bootstrap: int = 0,
              seed: int = 0, seed_draws: str = "n-1") -> dict[str, Any]:
    """Frontier estimate of a (see module doc). With ``n_bootstrap`` and configurations holding several
    seeds, the seeds are resampled within each configuration (``_seed_resamples``) and a recomputed
    per resample: ``a_ci`` becomes the percentile interval of the resamples that give an estimate
    (the OLS interval stays as ``a_ci_ols``), and ``resampled_share`` says how many do; below
    ``MIN_RESAMPLED_SHARE`` the estimate depends on which seeds were trained, ``a_ci`` is NaN and a
    warning says so (``agreement``). ``seed_draws``: ``_seed_resamples``'s ``draws``."""
    C = total_flops(points, fit.cost if fit is not None else 6.0)
    keys = _configurations(points)
    pairs, mode = envelope_optima(points, C, keys=keys)
    out: dict[str, Any] = {"method": "approach 1 (frontier of training curves)", "mode": mode,
                           "n_frontier": len(pairs)}
    got = _frontier_slope(pairs)
    if isinstance(got, str):
        out.update(available=False, reason=got)
        return out
    a, c, lo, hi = got
    out.update(available=True, reason="", a=a, b=1.0 - a, log_intercept=c, a_ci=[lo, hi],
               n_sizes=len({round(n, 3) for _, n in pairs}))
    weights = _seed_resamples(points, keys[0], n_bootstrap, seed, seed_draws) if n_bootstrap > 0 else None
    if weights is None:
        return out
    boot = np.full(n_bootstrap, np.nan)
    for b, w in enumerate(weights):
        got = _frontier_slope(envelope_optima(points, C, weight=w, keys=keys)[0])
        boot[b] = math.nan if isinstance(got, str) else got[0]
    share = float(np.isfinite(boot).mean())
    blo, bhi = percentile_interval(boot) if share >= MIN_RESAMPLED_SHARE else (math.nan, math.nan)
    out.update(a_ci=[float(blo), float(bhi)], a_ci_ols=[lo, hi], n_resamples=n_bootstrap,
               resampled_share=share,
               ci_method="bootstrap over the seeds of each configuration" + _DRAWN[seed_draws])
    return out


def _cubic_note(c: dict[str, Any], lo3: float, hi3: float, a3: float, has3: bool) -> str:
    """Where approach 2's shape check (cubics through the same points) agrees with approach 3 while
    its parabolas do not: say so, since the window parabola's shape bias may be the disagreement."""
    clo, chi = (math.nan if x is None else float(x) for x in c.get("a_cubic_ci") or (None, None))
    if not (math.isfinite(clo) and math.isfinite(chi)):
        return ""
    agrees = not (chi < lo3 or clo > hi3) if has3 else clo <= a3 <= chi
    return (f" (cubics through the same points give a = {c['a_cubic']:.3f} [{clo:.3f}, {chi:.3f}], which "
            "agrees with approach 3: the parabolas' shape bias may be the difference)") if agrees else ""


def collapsed(ci: Any) -> bool:
    """An interval of zero width up to float round-off (``COLLAPSED_REL``). On an IsoFLOP design
    centred on the optimum every budget's best size is on the same step of one size grid, the
    frontier points lie exactly on a line and approach 1's OLS interval collapses (measured
    [0.51388888888888853, 0.51388888888888955] on noise-free points): the grid's step, not the
    interval, is then the resolution, so it is no interval at all."""
    lo, hi = (math.nan if x is None else float(x) for x in (ci or (None, None)))
    return (math.isfinite(lo) and math.isfinite(hi)
            and hi - lo <= COLLAPSED_REL * max(1.0, abs(lo), abs(hi)))


def agreement(checks: dict[str, Any], fit: Any) -> list[str]:
    """Warnings: an approach whose interval of a misses approach 3's, approach 2 on few budgets.
    Approach 3's exponent is the one across the data's compute (``a_data``) where F(N) is not k N:
    approaches 1 and 2 measure that one, not the large-budget limit ``a``.

    Where ``checks`` holds a loss-floor profile (a law that is not identified), approach 3's interval
    is its bootstrap interval joined with the exponent's span over the allowed floors: the bootstrap
    refits end on the same bound as the point fit, so alone they hide how far the exponent moves
    with the floor the data cannot fix, and would call a consistent approach 1 or 2 apart."""
    out = []
    key3 = "a_data" if "a_data" in fit.derived else "a"
    a3 = float(fit.derived[key3])
    lo3, hi3 = (float(x) for x in fit.ci.get(key3, (math.nan, math.nan)))
    what = "approach 3's interval"
    prof = checks.get("floor_profile") or {}
    span = [math.nan if x is None else float(x) for x in prof.get(f"{key3}_range") or (None, None)]
    if prof.get("available") and all(map(math.isfinite, span)):
        lo3 = span[0] if not math.isfinite(lo3) else min(lo3, span[0])
        hi3 = span[1] if not math.isfinite(hi3) else max(hi3, span[1])
        what = "approach 3's interval with its span over the allowed loss floors"
    has3 = math.isfinite(lo3) and math.isfinite(hi3)
    for key, name in (("approach1", "approach 1"), ("approach2", "approach 2")):
        c = checks.get(key) or {}
        if not c.get("available"):
            continue
        lo, hi = (math.nan if x is None else float(x) for x in c.get("a_ci") or (None, None))
        # no interval (read from JSON: null), or one of zero width: frontier points exactly on a line
        # (every budget's best size on the same step of one size grid), which is the grid's
        # resolution, not a measurement; it would call any other value apart
        if not (math.isfinite(lo) and math.isfinite(hi)) or collapsed((lo, hi)):
            continue
        apart = (hi < lo3 or lo > hi3) if has3 else not (lo <= a3 <= hi)
        if apart:
            # decimals that show the gap: a miss by 3e-6 must not read "[0.514, 0.514] vs 0.514"
            d = decimals(lo, hi, *((lo3, hi3) if has3 else (a3,)))
            ref = f"{what} [{lo3:.{d}f}, {hi3:.{d}f}]" if has3 else f"approach 3's a = {a3:.{d}f}"
            out.append(f"{name} disagrees with approach 3 beyond their intervals: a = {c['a']:.{d}f} "
                       f"[{lo:.{d}f}, {hi:.{d}f}] vs {ref}" + _cubic_note(c, lo3, hi3, a3, has3))
    for key, name in (("approach1", "approach 1"), ("approach2", "approach 2")):
        c = checks.get(key) or {}
        if c.get("available") and c.get("resampled_share", 1.0) < MIN_RESAMPLED_SHARE:
            out.append(f"{name} gives an exponent in {c['resampled_share']:.0%} of {c['n_resamples']} "
                       "resamples of the seeds of each configuration: it depends on which seeds were "
                       "trained (no interval)")
    c2 = checks.get("approach2") or {}
    if c2.get("available") and c2["n_buckets"] < FEW_BUDGETS:
        out.append(f"approach 2 rests on {c2['n_buckets']} compute budgets (fewer than {FEW_BUDGETS}): "
                   "its exponent has little support")
    return out


def cross_checks(points: pd.DataFrame, fit: Any, *, estimator: str = DEFAULT_ESTIMATOR,
                 window: float = WINDOW_DECADES) -> dict[str, Any]:
    """Approaches 1 and 2 beside an approach-3 fit (chinchilla form: they estimate N* ~ C^a), with
    ``warnings`` from :func:`agreement`."""
    law = fit.law_obj
    if law.size_input != "N" or law.fixed_inputs:
        reason = (f"approaches 1 and 2 estimate N* ~ C^a from N alone; the {fit.law} law sizes models by "
                  f"{law.size_input} at fixed {', '.join(law.fixed_inputs) or 'nothing'}, so they are run "
                  "for laws of N and D only")
        out: dict[str, Any] = {**{key: {"available": False, "reason": reason}
                                  for key in ("approach1", "approach2")}, "warnings": []}
    else:
        boot = {"n_bootstrap": int(fit.settings.get("n_bootstrap", 0)),
                "seed": int(fit.settings.get("seed", 0))}
        out = {"approach1": approach1(points, fit, **boot),
               "approach2": approach2(points, fit, estimator=estimator, window=window, **boot)}
        out["warnings"] = agreement(out, fit)
    return out


def cross_check_groups(points: pd.DataFrame, fits: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """``fits`` (group -> FitResult) with :func:`cross_checks` recomputed per group (keyword arguments
    as ``cross_checks``); a new dict, the results are immutable."""
    from dataclasses import replace

    return {g: replace(f, cross_checks=cross_checks(group_rows(points, g), f, **kwargs))
            for g, f in fits.items()}
