"""Approach 3 scaling-law fits: robust loss on log loss, multi-start L-BFGS, bootstrap over runs.

Objective (Hoffmann et al. 2022, approach 3; as corrected by Besiroglu et al. 2024):

    J(z) = sum_i w_i * rho(r_i),   r_i = log L_i - log L_hat(x_i; z)   (or L_i - L_hat in loss space)

with ``log L_hat = logsumexp_t(G[t] z)`` from the law registry (``scaling.fitting.laws``). It is a
*sum*, not a mean: averaging shrinks the gradient by 1/n and with ordinary tolerances stops
the optimiser early, the failure Besiroglu et al. found in the original fit. The choices of
rho (``OBJECTIVES``; the argmin is the same whatever constant factor rho carries):

- ``huber-log`` (default): Huber_delta(r) on log loss, delta = 1e-3 (Hoffmann et al. 2022, sec.
  D.2; Besiroglu et al. 2024). Robust to a few outlying runs; for |r| < delta it is r^2/2.
- ``sq-log``: r^2/2 on log loss, least squares in log space (the limit delta -> inf of the Huber;
  a multiplicative-Gaussian noise model, as in e.g. Kaplan et al. 2020's fits of log loss).
- ``sq``: r^2/2 on the loss itself, r = L - L_hat (ordinary nonlinear least squares; additive
  Gaussian noise).
- ``asym-abs``: |r| on the loss, r = L - L_hat, with over-predictions (r < 0) weighted by 10: the
  asymmetric absolute error ``asymmetric_mae`` of the ``chinchilla`` library (kyo-takano/chinchilla,
  ``chinchilla/_metrics.py``: ``error = y_true - y_pred; error[error < 0] *= -w``, w = 10, averaged
  there, summed here). It fits the lower envelope of the points, not their mean.

Constraints (``Constraints``): parameters fixed to a value, tied equal (``alpha=beta``), or shared
by all groups of a joint fit. The optimiser then works on the free vector u, with every group's
fitted vector an affine map of it, z_g = M_g u + c_g; the design becomes G M_g and c_g an offset.

Optimiser: the start grid is screened for a few iterations by a batched projected L-BFGS written
here in numpy (per-start memory, step length and convergence test; the analytic gradient is one
matrix product over all starts), on at most ``SCREEN_POINTS`` points (a fixed random subset,
weighted up to the full sum, when the table is larger). The best ``N_REFINE`` starts are refined
to convergence on all points, and the winner polished by scipy's L-BFGS-B with tight tolerances.
Objective evaluations are blocked over starts so that no temporary exceeds ``EVAL_BLOCK``
elements: memory is bounded independently of the number of starts, time is linear in points.
The bootstrap resamples runs with replacement (a run may hold several token budgets), and
optimises all resamples together from the distinct optima of the full fit (warm starts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from scaling.common.errors import UserError
from scaling.common.files import read_json
from scaling.common.stats import percentile_interval
from scaling.fitting.laws import Law, frontier, get_law
from scaling.fitting.tables import flops_per_param_k, law_inputs, total_flops

DEFAULT_DELTA = 1e-3
DEFAULT_BOOTSTRAP = 200
DEFAULT_OBJECTIVE = "huber-log"
CI_LEVEL = 0.95
ASYM_WEIGHT = 10.0     # the chinchilla library's default w of asymmetric_mae
EVAL_BLOCK = 1 << 21   # elements (starts x terms x points) of one objective temporary: 16 MB of float64
SCREEN_POINTS = 1024   # points the start grid is screened on (all of them when fewer)
REFINE_POINTS = 16384  # larger tables: the best starts are refined on this many points first
ONE_STEP_POINTS = 20000  # larger tables: one-step (linearised) bootstrap instead of refits
OBJECTIVES = {
    "huber-log": "Huber(delta) on log loss (Hoffmann et al. 2022; Besiroglu et al. 2024)",
    "sq-log": "squared error on log loss",
    "sq": "squared error on loss",
    "asym-abs": "asymmetric absolute error on loss, over-prediction x10 "
                "(chinchilla library's asymmetric_mae)",
}

FITS_SCHEMA = "smelt-scale.fit"
FITS_VERSION = 2  # 2: parameters under "params"; 1 (no "schema" key): parameters as top-level keys


# -- objective ----------------------------------------------------------------------------
class Objective:
    """Weighted sum of rho(residual) for a batch of fitted vectors, with analytic gradient.

    ``weights`` is (n,) (one data set) or (R, n) (one row per bootstrap resample); ``rows`` in
    ``__call__`` picks which weight row each start in the batch uses. ``design`` (T, n, U) and
    ``offset`` (T, n) replace the law's own design for constrained or joint fits (log term_t =
    design[t] u + offset[t]).
    """

    def __init__(self, law: Law, inputs: Mapping[str, np.ndarray] | None, log_loss: np.ndarray,
                 delta: float = DEFAULT_DELTA, weights: np.ndarray | None = None, *,
                 kind: str = DEFAULT_OBJECTIVE, design: np.ndarray | None = None,
                 offset: np.ndarray | None = None):
        if kind not in OBJECTIVES:
            raise UserError(f"unknown objective {kind!r}; choose one of: {', '.join(OBJECTIVES)}")
        if not delta > 0:
            raise UserError(f"the Huber delta must be > 0, got {delta}")
        self.law = law
        self.kind = kind
        self.G = law.design(inputs) if design is None else np.asarray(design, dtype=float)   # (T, n, P)
        T, n, P = self.G.shape
        self.Gflat = self.G.reshape(T * n, P)
        self.GflatT = np.ascontiguousarray(self.Gflat.T)
        self.offset = None if offset is None or not np.any(offset) else np.asarray(offset, dtype=float)
        self.y = np.asarray(log_loss, dtype=float)
        self.loss = np.exp(self.y)
        self.delta = float(delta)
        self.weights = np.ones((1, n)) if weights is None else np.atleast_2d(np.asarray(weights, dtype=float))

    def subset(self, idx: np.ndarray) -> "Objective":
        """The objective on points ``idx``, weights scaled by n/len(idx) (same scale as the full sum)."""
        new = object.__new__(Objective)
        new.__dict__.update(self.__dict__)
        new.G = np.ascontiguousarray(self.G[:, idx])
        T, m, P = new.G.shape
        new.Gflat = new.G.reshape(T * m, P)
        new.GflatT = np.ascontiguousarray(new.Gflat.T)
        new.offset = None if self.offset is None else self.offset[:, idx]
        new.y, new.loss = self.y[idx], self.loss[idx]
        new.weights = self.weights[:, idx] * (self.y.size / m)
        return new

    def __call__(self, z: np.ndarray, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """J and dJ/dz for z (M, P); returns ((M,), (M, P)). Evaluated in blocks of starts."""
        T, n, P = self.G.shape
        M = z.shape[0]
        block = max(1, EVAL_BLOCK // (T * n))
        if M <= block:
            return self._eval(z, rows)
        f, g = np.empty(M), np.empty((M, P))
        for i in range(0, M, block):
            r = None if rows is None else rows[i:i + block]
            f[i:i + block], g[i:i + block] = self._eval(z[i:i + block], r)
        return f, g

    def _rho(self, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """rho(r) and rho'(r) of the objective kind."""
        if self.kind == "huber-log":
            c = np.clip(r, -self.delta, self.delta)
            return c * (r - 0.5 * c), c                     # Huber: c (r - c/2) with c = clip(r)
        if self.kind == "asym-abs":
            neg = r < 0
            return np.where(neg, -ASYM_WEIGHT * r, r), np.where(neg, -ASYM_WEIGHT, 1.0)
        return 0.5 * r * r, r                               # sq-log, sq

    def _eval(self, z: np.ndarray, rows: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        T, n, P = self.G.shape
        M = z.shape[0]
        terms = (z @ self.GflatT).reshape(M, T, n)
        if self.offset is not None:
            terms += self.offset
        ex = np.exp(terms)
        tot = ex.sum(axis=1)
        lse = np.log(tot)
        if not np.isfinite(lse).all():   # a term over- or underflowed: redo with the max shifted out
            top = terms.max(axis=1, keepdims=True)
            ex = np.exp(terms - top)
            tot = ex.sum(axis=1)
            lse = top[:, 0, :] + np.log(tot)
        w = self.weights[0] if rows is None else self.weights[rows]
        if self.kind in ("huber-log", "sq-log"):
            r = self.y - lse
            rho, drho = self._rho(r)
            coef = -(w * drho) / tot                         # dJ/d(log L_hat) / sum_t exp(term_t)
        else:                                                # residual on the loss: dr/dlog L_hat = -L_hat
            Lhat = np.exp(lse)
            r = self.loss - Lhat
            rho, drho = self._rho(r)
            coef = -(w * drho) * Lhat / tot
        f = (w * rho).sum(axis=-1)
        grad = (ex * coef[:, None, :]).reshape(M, T * n) @ self.Gflat
        return f, grad

    def preconditioner(self) -> np.ndarray:
        """Inverse of the design's Gram matrix, sum_t G_t^T G_t / n: the initial L-BFGS inverse Hessian.

        It removes the strong coupling of a scale and its exponent (a - alpha log N with log N ~ 20),
        which otherwise costs L-BFGS hundreds of iterations per start.
        """
        T, n, P = self.G.shape
        gram = np.einsum("tnp,tnq->pq", self.G, self.G) / n
        return np.linalg.inv(gram + 1e-10 * np.trace(gram) / P * np.eye(P))

    def residuals(self, z: np.ndarray) -> np.ndarray:
        """log L - log L_hat at one fitted vector z (P,)."""
        terms = self.G @ z
        if self.offset is not None:
            terms = terms + self.offset
        top = terms.max(axis=0)
        return self.y - (top + np.log(np.exp(terms - top).sum(axis=0)))


# -- batched projected L-BFGS ---------------------------------------------------------------
@dataclass(frozen=True)
class BatchResult:
    x: np.ndarray          # (M, P) final points
    f: np.ndarray          # (M,) final objective
    iterations: np.ndarray  # (M,)
    converged: np.ndarray  # (M,) bool: gradient or decrease test met (not the iteration cap)


def lbfgs_batch(fun: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]], x0: np.ndarray,
                lower: np.ndarray, upper: np.ndarray, *, rows: np.ndarray | None = None, memory: int = 10,
                maxiter: int = 2000, ftol: float = 1e-13, gtol: float = 1e-10, max_ls: int = 40,
                precond: np.ndarray | None = None) -> BatchResult:
    """Minimise M independent box-bounded problems at once; ``fun(x (m, P), rows (m,))`` -> (f, g).

    Per start: L-BFGS two-loop direction on the free variables (those not held at a bound by
    their gradient), initial inverse Hessian ``gamma * precond`` (identity by default), Armijo
    backtracking on the projected path, a curvature pair kept only when s.y > 0. A start stops
    when its projected gradient's largest entry is below ``gtol`` or its relative decrease below
    ``ftol`` (scipy's L-BFGS-B tests), or when its line search cannot decrease f any more
    (machine precision).
    """
    x = np.clip(np.array(x0, dtype=float), lower, upper)
    M, P = x.shape
    rows = np.zeros(M, dtype=int) if rows is None else np.asarray(rows)
    f, g = fun(x, rows)
    S = np.zeros((memory, M, P))
    Y = np.zeros((memory, M, P))
    rho = np.zeros((memory, M))
    gamma = np.ones(M)
    has_pair = np.zeros(M, dtype=bool)
    iters = np.zeros(M, dtype=int)
    converged = np.zeros(M, dtype=bool)
    active = np.ones(M, dtype=bool)
    c1 = 1e-4
    H0 = None if precond is None else np.asarray(precond, dtype=float)

    def projected_grad(xa, ga):
        return xa - np.clip(xa - ga, lower, upper)

    pg = projected_grad(x, g)
    done = np.abs(pg).max(axis=1) < gtol
    converged |= done
    active &= ~done

    for it in range(maxiter):
        idx = np.flatnonzero(active)
        if idx.size == 0:
            break
        xa, fa, ga = x[idx], f[idx], g[idx]
        free = ~(((xa <= lower) & (ga > 0)) | ((xa >= upper) & (ga < 0)))
        q = ga * free
        # two-loop recursion, newest pair first (circular buffer ordered by global iteration)
        order = [(it - 1 - j) % memory for j in range(min(it, memory))]
        alphas = []
        for k in order:
            a_k = rho[k, idx] * np.einsum("mp,mp->m", S[k, idx], q)
            q = q - a_k[:, None] * Y[k, idx]
            alphas.append(a_k)
        r = gamma[idx, None] * (q if H0 is None else q @ H0)
        for k, a_k in zip(reversed(order), reversed(alphas)):
            b_k = rho[k, idx] * np.einsum("mp,mp->m", Y[k, idx], r)
            r = r + S[k, idx] * (a_k - b_k)[:, None]
        d = -r * free
        slope = np.einsum("mp,mp->m", d, ga)
        bad = ~(slope < 0)
        if bad.any():   # not a descent direction: fall back to steepest descent, forget the memory
            d[bad] = -(ga * free)[bad]
            rho[:, idx[bad]] = 0.0
            gamma[idx[bad]] = 1.0
            has_pair[idx[bad]] = False
        first = np.minimum(1.0, 1.0 / np.maximum(np.linalg.norm(d, axis=1), 1e-300))
        step = np.where(has_pair[idx], 1.0, first)

        x_new = np.empty_like(xa)
        f_new = np.empty_like(fa)
        g_new = np.empty_like(ga)
        pending = np.arange(idx.size)
        failed = np.zeros(idx.size, dtype=bool)
        for _ in range(max_ls):
            xt = np.clip(xa[pending] + step[pending, None] * d[pending], lower, upper)
            ft, gt = fun(xt, rows[idx[pending]])
            dec = np.einsum("mp,mp->m", ga[pending], xt - xa[pending])      # predicted change (< 0)
            ok = (ft <= fa[pending] + c1 * dec) & np.isfinite(ft)
            acc = pending[ok]
            x_new[acc], f_new[acc], g_new[acc] = xt[ok], ft[ok], gt[ok]
            # next step: minimiser of the quadratic through f(0), f'(0), f(t), kept in [0.1 t, 0.5 t]
            # (a far overshoot, common from a flat start, shrinks 10x per trial rather than 2x)
            excess = np.where(np.isfinite(ft), ft - fa[pending] - dec, np.inf)[~ok]
            frac = np.where(excess > 0, -dec[~ok] / (2 * np.where(excess > 0, excess, 1.0)), 0.1)
            pending = pending[~ok]
            if pending.size == 0:
                break
            step[pending] *= np.clip(frac, 0.1, 0.5)
        else:
            failed[pending] = True
        # a start whose line search found no decrease sits at machine precision: stop it there
        if failed.any():
            fi = idx[failed]
            converged[fi] = True
            active[fi] = False
        okm = ~failed
        ia = idx[okm]
        s = x_new[okm] - xa[okm]
        yv = g_new[okm] - ga[okm]
        sy = np.einsum("mp,mp->m", s, yv)
        slot = it % memory
        good = sy > 1e-300 * np.maximum(1.0, np.einsum("mp,mp->m", yv, yv))
        S[slot, ia] = s
        Y[slot, ia] = yv
        rho[slot, ia] = np.where(good, 1.0 / np.where(good, sy, 1.0), 0.0)
        yy = np.einsum("mp,mp->m", yv, yv if H0 is None else yv @ H0)
        gamma[ia] = np.where(good & (yy > 0), sy / np.where(yy > 0, yy, 1.0), gamma[ia])
        has_pair[ia] |= good
        f_old = fa[okm]
        x[ia], f[ia], g[ia] = x_new[okm], f_new[okm], g_new[okm]
        iters[ia] += 1
        stop = (f_old - f[ia]) <= ftol * np.maximum(np.maximum(np.abs(f_old), np.abs(f[ia])), 1e-300)
        stop |= np.abs(projected_grad(x[ia], g[ia])).max(axis=1) < gtol
        converged[ia[stop]] = True
        active[ia[stop]] = False
    return BatchResult(x=x, f=f, iterations=iters, converged=converged)


# -- multi-start fit of one data set ---------------------------------------------------------
@dataclass(frozen=True)
class MultistartResult:
    """Result of the multi-start search on one data set (fitted space)."""

    z: np.ndarray               # (P,) best fitted vector
    objective: float
    refined_z: np.ndarray       # (K, P) refined starts, best first
    refined_f: np.ndarray       # (K,)
    converged: bool
    n_starts: int


SCREEN_ITERS = 10   # iterations every grid start gets before the best are refined
N_REFINE = 32       # starts refined to full convergence


def _refine_large(obj: Objective, x0: np.ndarray, lo: np.ndarray, hi: np.ndarray, H0: np.ndarray,
                  refine_points: int) -> BatchResult:
    """Refine starts on a table of more than ``refine_points`` points: to convergence on a fixed random
    subset of that many points, then only the distinct optima (``distinct_optima``, tol 1e-3) on
    every point; each start reports its optimum's full-data result. Starts that agree within 1e-3
    on the subset share one full-data refinement, so the refinement costs (distinct optima) x
    (points) rather than (starts) x (points); the diagnostics that compare refined starts (spread
    among those at the best objective, threshold 1e-2) see the same optima."""
    n = obj.y.size
    idx = np.sort(np.random.default_rng(1).choice(n, size=refine_points, replace=False))
    sub = lbfgs_batch(obj.subset(idx), x0, lo, hi, precond=H0)
    reps = distinct_optima(sub.x, sub.f, tol=1e-3, limit=x0.shape[0])
    if reps.size == 0:
        return sub
    full = lbfgs_batch(obj, sub.x[reps], lo, hi, precond=H0)
    dist = np.max(np.abs(sub.x[:, None, :] - sub.x[reps][None]) / (1 + np.abs(sub.x[reps][None])), axis=2)
    near = np.argmin(dist, axis=1)
    f = np.where(np.isfinite(sub.f), full.f[near], np.inf)
    return BatchResult(x=full.x[near], f=f, iterations=sub.iterations + full.iterations[near],
                       converged=full.converged[near])


def multistart(obj: Objective, starts: np.ndarray, *, screen_iters: int = SCREEN_ITERS,
               n_refine: int = N_REFINE, bounds: np.ndarray | None = None,
               screen_points: int = SCREEN_POINTS, refine_points: int | None = None) -> MultistartResult:
    """Screen all starts for a few batched iterations, refine the best, polish the winner with scipy.

    Checked against running every grid start to convergence on 14 data sets (Epoch's Chinchilla
    points; noisy synthetic chinchilla-law grids and IsoFLOP designs; smelt-law grids; an
    unidentified design): 5 screening iterations already found the same optimum in all of them,
    though only ~30% of all 2,700 grid starts reach it on the Chinchilla points. Tables larger
    than ``screen_points`` are screened on a fixed random subset of that many points (weighted
    to the full sum): the screen only ranks starts, the refinement uses every point, so its cost
    no longer grows with starts x points. Tables larger than ``refine_points`` refine the best
    starts on a subset first (:func:`_refine_large`). ``bounds`` (P, 2) defaults to the law's.
    """
    lo, hi = (obj.law.internal_bounds() if bounds is None else np.asarray(bounds, dtype=float)).T
    H0 = obj.preconditioner()
    n = obj.y.size
    screen_obj = obj
    if n > screen_points:
        idx = np.sort(np.random.default_rng(0).choice(n, size=screen_points, replace=False))
        screen_obj = obj.subset(idx)
    screen = lbfgs_batch(screen_obj, starts, lo, hi, maxiter=screen_iters, precond=H0)
    finite = np.isfinite(screen.f)
    if not finite.any():
        raise UserError("the fit diverged from every start (non-finite objective)")
    order = np.argsort(np.where(finite, screen.f, np.inf))[: max(1, n_refine)]
    refine_points = REFINE_POINTS if refine_points is None else refine_points
    if n > refine_points:
        ref = _refine_large(obj, screen.x[order], lo, hi, H0, refine_points)
    else:
        ref = lbfgs_batch(obj, screen.x[order], lo, hi, precond=H0)
    o = np.argsort(ref.f)
    refined_z, refined_f, conv = ref.x[o], ref.f[o], ref.converged[o]

    # scipy L-BFGS-B polish of the winner, tight tolerances; kept only if it improves.
    def fun(z):
        f, g = obj(z[None, :])
        return float(f[0]), g[0]

    pol = minimize(fun, refined_z[0], jac=True, method="L-BFGS-B", bounds=list(zip(lo, hi)),
                   options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 10000, "maxcor": 20})
    z, f = refined_z[0], float(refined_f[0])
    if np.isfinite(pol.fun) and pol.fun < f:
        z, f = np.asarray(pol.x, dtype=float), float(pol.fun)
    return MultistartResult(z=z, objective=f, refined_z=refined_z, refined_f=refined_f,
                            converged=bool(conv[0]) or bool(pol.success), n_starts=int(starts.shape[0]))


def distinct_optima(z: np.ndarray, f: np.ndarray, tol: float = 1e-3, limit: int = 5) -> np.ndarray:
    """Indices of up to ``limit`` distinct optima (rows of z, best f first): any |dz| > tol (1 + |z|)."""
    keep: list[int] = []
    for i in np.argsort(f):
        if not np.isfinite(f[i]):
            continue
        if all(np.any(np.abs(z[i] - z[j]) > tol * (1 + np.abs(z[j]))) for j in keep):
            keep.append(int(i))
        if len(keep) >= limit:
            break
    return np.array(keep, dtype=int)


# -- results ---------------------------------------------------------------------------------
def _percentile_ci(samples: np.ndarray, level: float) -> tuple[float, float]:
    return percentile_interval(samples, level)


def _import_lmfit():
    try:
        import lmfit
    except ImportError:
        raise UserError("the lmfit report needs lmfit: pip install 'smelt-scale[lmfit]'") from None
    return lmfit


@dataclass(frozen=True)
class FitResult:
    """One approach-3 fit of one group: point estimate, bootstrap intervals, diagnostics.

    ``params`` and ``derived`` are in natural units; ``bootstrap`` holds the K resampled
    parameter vectors (K x P, ``Law.params`` order; K = 0 without a bootstrap); ``ci`` maps
    every parameter and derived quantity to its percentile interval at ``settings["ci_level"]``.
    ``data_summary`` has the ranges of the fitted points, ``compute_min``/``compute_max``
    (total training FLOPs) and ``flops_per_param_k`` (median flops/(N D); 6 when unrecorded).
    """

    law: str
    group: str
    params: dict[str, float]
    ci: dict[str, tuple[float, float]]
    bootstrap: np.ndarray
    diagnostics: dict[str, Any]
    n_points: int
    data_summary: dict[str, Any]
    derived: dict[str, float] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    cross_checks: dict[str, Any] = field(default_factory=dict)

    @property
    def law_obj(self) -> Law:
        return get_law(self.law)

    @property
    def theta(self) -> np.ndarray:
        return self.law_obj.theta_array(self.params)

    @property
    def k(self) -> float:
        return float(self.data_summary.get("flops_per_param_k", 6.0))

    def predict(self, **inputs: object) -> np.ndarray:
        """Loss at the law's inputs (chinchilla: N, D; smelt: F, S, D), numpy broadcasting."""
        return self.law_obj.predict(self.params, **inputs)

    def predict_bootstrap(self, **inputs: object) -> np.ndarray:
        """Loss under every bootstrap sample: shape (K,) + broadcast input shape."""
        if self.bootstrap.shape[0] == 0:
            raise UserError("this fit has no bootstrap samples (fitted with 0 resamples)")
        return self.law_obj.predict(self.bootstrap, **inputs)

    def optimal(self, C: np.ndarray | float, k: float | None = None,
                **fixed: object) -> dict[str, np.ndarray]:
        """Compute-optimal allocation at total training FLOPs C (``scaling.fitting.laws.frontier``).

        chinchilla: C = k N D with k = ``flops_per_param_k`` of the data unless given;
        returns {"N", "D", "loss"}. smelt: C = F D at fixed ``S=``; returns {"F", "D", "loss"}.
        """
        return frontier(self.law_obj, self.params, C, k=self.k if k is None else k,
                        S=fixed.get("S")).as_dict()

    def at_budget(self, C: float, S: float | None = None) -> dict[str, Any]:
        """x*, D*, L* at budget C with their bootstrap percentile intervals:
        {"C": C, name: value, f"{name}_ci": [lo, hi], ...} for name in (size input, "D", "loss")."""
        law = self.law_obj
        if S is None and "S" in law.fixed_inputs and len(self.data_summary.get("sparsities", [])) == 1:
            S = self.data_summary["sparsities"][0]
        level = self.settings.get("ci_level", CI_LEVEL)
        est = frontier(law, self.params, C, k=self.k, S=S).as_dict()
        out: dict[str, Any] = {"C": float(C)}
        boot = frontier(law, self.bootstrap, C, k=self.k, S=S).as_dict() if self.bootstrap.shape[0] else None
        for name, v in est.items():
            out[name] = float(v)
            ci = _percentile_ci(np.asarray(boot[name]), level) if boot else (math.nan, math.nan)
            out[f"{name}_ci"] = list(ci)
        return out

    @property
    def joint_groups(self) -> list[str]:
        """Groups fitted jointly with this one (shared parameters); their bootstrap rows are paired."""
        return list(self.settings.get("joint_groups") or [])

    # -- text and JSON ------------------------------------------------------------------------
    def summary(self) -> str:
        law = self.law_obj
        level = self.settings.get("ci_level", CI_LEVEL)
        delta = self.settings.get("huber_delta", DEFAULT_DELTA)
        kind = self.settings.get("objective", DEFAULT_OBJECTIVE)
        how = f"Huber delta {delta:g}" if kind == "huber-log" else f"objective {kind}"
        lines = [f"group {self.group}: {law.formula}  ({self.n_points} points, {how}, "
                 f"{self.bootstrap.shape[0]} bootstrap resamples)"]
        cons = [f"fixed {k}={v:g}" for k, v in (self.settings.get("fixed") or {}).items()]
        cons += [f"tied {t}" for t in self.settings.get("tied") or []]
        if self.settings.get("shared"):
            cons.append(f"shared {', '.join(self.settings['shared'])} with {', '.join(self.joint_groups)}")
        if cons:
            lines.append("  constraints: " + "; ".join(cons))
        for name, value in [*self.params.items(), *self.derived.items()]:
            lo, hi = self.ci.get(name, (math.nan, math.nan))
            ci = f"[{lo:.6g}, {hi:.6g}]" if np.isfinite(lo) else "(no bootstrap)"
            lines.append(f"  {name:>18} = {value:<12.6g} {100 * level:.0f}% CI {ci}")
        d = self.diagnostics
        lines.append(f"  RMSE(log L) {d['rmse_log']:.4g}, max |residual| {d['max_abs_residual']:.4g}, "
                     f"objective {d['objective']:.10g}, identified: {'yes' if d['identified'] else 'NO'}, "
                     f"fit: {'MISFIT' if d.get('misfit') else 'ok'}")
        lines += [f"  warning: {w}" for w in d.get("warnings", [])]
        return "\n".join(lines)

    def to_lmfit(self):
        """The parameters as ``lmfit.Parameters``: values, the law's bounds, bootstrap standard errors
        and bootstrap correlations (lmfit's ``conf_interval`` would refit plain least squares, so the
        uncertainties come from the bootstrap over runs instead). Needs the optional ``lmfit``
        (``pip install 'smelt-scale[lmfit]'``)."""
        lmfit = _import_lmfit()

        law = self.law_obj
        pars = lmfit.Parameters()
        for name in law.params:
            lo, hi = law.bounds[name]
            pars.add(name, value=self.params[name], min=lo, max=hi)
        if self.bootstrap.shape[0] > 1:
            sd = self.bootstrap.std(axis=0, ddof=1)
            corr = np.corrcoef(self.bootstrap, rowvar=False)
            for i, name in enumerate(law.params):
                pars[name].stderr = float(sd[i])
                pars[name].correl = {o: float(corr[i, j]) for j, o in enumerate(law.params) if j != i}
        return pars

    def report(self) -> str:
        """lmfit's parameter report (values, bootstrap standard errors, correlations); needs ``lmfit``."""
        lmfit = _import_lmfit()

        return lmfit.fit_report(self.to_lmfit())

    def to_dict(self) -> dict[str, Any]:
        """The FitSet entry (schema smelt-scale.fit/2): law, params {name: value}, n_points, ci,
        diagnostics, extras."""
        return {
            "law": self.law,
            "params": {k: float(v) for k, v in self.params.items()},
            "n_points": int(self.n_points),
            "ci": {k: [float(lo), float(hi)] for k, (lo, hi) in self.ci.items()},
            "diagnostics": self.diagnostics,
            "group": self.group,
            "derived": self.derived,
            "data_summary": self.data_summary,
            "bootstrap_params": list(self.law_obj.params),
            "bootstrap": self.bootstrap.tolist(),
            "settings": self.settings,
            "cross_checks": self.cross_checks,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], group: str | None = None,
                  version: int = FITS_VERSION) -> "FitResult":
        """A fit entry as written by :meth:`to_dict`, every field checked (a fits file is user input: a
        tampered ``E = NaN`` or ``alpha < 0`` is refused here, not printed as a -99999900% saving).
        Derived quantities are recomputed from the parameters, never taken from the file. ``version``:
        the fits schema (1: parameters as top-level keys, 2: under "params")."""
        where = f"fit entry{f' for group {group!r}' if group else ''}"
        try:
            if not isinstance(d, Mapping):
                raise TypeError("not an object")
            law = get_law(str(d["law"]))
            src = d if version == 1 else d["params"]
            params = {p: _checked_param(law, p, src[p]) for p in law.params}
            raw_boot = [] if d.get("bootstrap") is None else d["bootstrap"]
            if not isinstance(raw_boot, list):
                raise TypeError("bootstrap is not a list")
            boot = np.asarray([[_num(v) for v in row] for row in raw_boot], dtype=float)
            boot = boot.reshape(-1, law.n_params)
            order = d.get("bootstrap_params")
            if order is not None and list(order) != list(law.params):
                if sorted(map(str, order)) != sorted(law.params):
                    raise ValueError(f"bootstrap_params {list(order)} are not the law's {list(law.params)}")
                boot = boot[:, [list(order).index(p) for p in law.params]]
            lo_b, hi_b = np.array([law.bounds[p] for p in law.params], dtype=float).T
            finite = np.isfinite(boot)
            slack = 1e-9 * np.maximum(np.abs(lo_b), np.abs(hi_b))
            if ((boot < lo_b - slack) & finite).any() or ((boot > hi_b + slack) & finite).any():
                raise ValueError("a bootstrap sample lies outside the law's parameter bounds")
            ci_raw = {} if d.get("ci") is None else d["ci"]
            if not isinstance(ci_raw, Mapping):
                raise TypeError("ci is not an object")
            ci = {}
            for k, v in ci_raw.items():
                if not isinstance(v, (list, tuple)) or len(v) != 2:
                    raise ValueError(f"ci of {k} is not [low, high]")
                lo, hi = _num(v[0]), _num(v[1])
                if math.isfinite(lo) and math.isfinite(hi) and lo > hi:
                    raise ValueError(f"ci of {k} has low {lo} > high {hi}")
                ci[str(k)] = (lo, hi)
            n_points = d["n_points"]
            if isinstance(n_points, bool) or not isinstance(n_points, int) or n_points < 1:
                raise ValueError(f"n_points must be a positive integer, got {n_points!r}")
            sections = {}
            for key in ("diagnostics", "data_summary", "settings", "cross_checks", "derived"):
                v = d.get(key)
                v = {} if v is None else v
                if not isinstance(v, Mapping):
                    raise TypeError(f"{key} is not an object")
                sections[key] = dict(v)
            summary = sections["data_summary"]
            for key in ("compute_min", "compute_max", "flops_per_param_k", "N_min", "N_max", "D_min", "D_max",
                        "F_min", "F_max", "loss_min", "loss_max"):
                if key in summary and not (_is_number(summary[key]) and 0 < summary[key] < math.inf):
                    raise ValueError(f"data_summary.{key} must be a positive finite number, got "
                                     f"{summary[key]!r}")
            theta = law.theta_array(params)
            derived = law.derive(theta)
            if "G" in sections["derived"]:           # the allocation: recomputed at the recorded k and S
                k = float(summary.get("flops_per_param_k", 6.0))
                sp = summary.get("sparsities") or []
                S = float(sp[0]) if "S" in law.fixed_inputs and len(sp) == 1 and _is_number(sp[0]) else None
                if not law.fixed_inputs or S is not None:
                    derived.update({k_: float(v) for k_, v in allocation(law, theta, k, S).items()})
            g = d.get("group", group or "default")
            return cls(law=law.name, group=str(g), params=params, ci=ci, bootstrap=boot,
                       diagnostics=sections["diagnostics"], n_points=int(n_points), data_summary=summary,
                       derived=derived, settings=sections["settings"], cross_checks=sections["cross_checks"])
        except KeyError as exc:
            raise UserError(f"not a {where}: missing field {exc}") from None
        except (UserError, TypeError, ValueError, IndexError, OverflowError) as exc:
            raise UserError(f"not a {where}: {exc}") from None

    def save(self, path: str | Path) -> None:
        """Write as a one-group FitSet file (readable by ``FitSet.load`` and ``savings --fits``)."""
        FitSet({self.group: self}).save(path)

    @classmethod
    def load(cls, path: str | Path, group: str | None = None) -> "FitResult":
        return FitSet.load(path).get(group)


def fits_version(schema: Any) -> int:
    """The version of a fits document's "schema" (None: 1); UserError for one this code cannot read."""
    if schema is None:
        return 1
    name, _, version = str(schema).rpartition("/")
    if name == FITS_SCHEMA and version in ("1", "2"):
        return int(version)
    raise UserError(f"fits schema {schema!r} is not one this version of smelt-scale reads "
                    f"({FITS_SCHEMA}/1 or /{FITS_VERSION}); refit with `smelt-scale fit --out`")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _num(v: Any) -> float:
    """A number of a fits file: null is NaN (an interval that could not be formed); anything but a
    number (a string, a boolean, a list) is a TypeError."""
    if v is None:
        return math.nan
    if not _is_number(v):
        raise TypeError(f"expected a number, got {v!r}")
    return float(v)


def _checked_param(law: Law, name: str, v: Any) -> float:
    """A fitted parameter from a file: a finite number within the law's bounds (those every fit obeys)."""
    if not _is_number(v) or not math.isfinite(float(v)):
        raise ValueError(f"parameter {name} must be a finite number, got {v!r}")
    lo, hi = law.bounds[name]
    slack = 1e-9 * max(abs(lo), abs(hi))
    if not (lo - slack <= float(v) <= hi + slack):
        raise ValueError(f"parameter {name} = {v!r} lies outside the {law.name} law's bounds "
                         f"[{lo:g}, {hi:g}]")
    return float(v)


@dataclass(frozen=True)
class FitSet:
    """Fits by group; its JSON is exactly what ``smelt-scale fit --json`` prints: {"fits": {group: entry}}."""

    fits: dict[str, FitResult]

    def __getitem__(self, group: str) -> FitResult:
        return self.get(group)

    def __iter__(self):
        return iter(self.fits)

    def __len__(self) -> int:
        return len(self.fits)

    def get(self, group: str | None = None) -> FitResult:
        if group is None:
            if len(self.fits) != 1:
                raise UserError(f"several fits ({', '.join(self.fits)}); name a group")
            return next(iter(self.fits.values()))
        if group not in self.fits:
            raise UserError(f"no fit for group {group!r}; groups: {', '.join(self.fits) or 'none'}")
        return self.fits[group]

    def to_dict(self) -> dict[str, Any]:
        return {"schema": f"{FITS_SCHEMA}/{FITS_VERSION}",
                "fits": {g: f.to_dict() for g, f in self.fits.items()}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FitSet":
        """A fits document: schema smelt-scale.fit/2, or a file without "schema" (written before
        schemas existed: read as version 1, parameters as top-level keys of each entry). Any other
        schema is refused: a renamed field must not be dropped silently."""
        if not isinstance(d, Mapping) or not isinstance(d.get("fits"), Mapping) or not d["fits"]:
            raise UserError('not a fits file: expected {"fits": {"<group>": {...}}}')
        version = fits_version(d.get("schema"))
        return cls({str(g): FitResult.from_dict(e, group=str(g), version=version)
                    for g, e in d["fits"].items()})

    def save(self, path: str | Path) -> None:
        from scaling.common.serialize import to_json

        Path(path).write_text(to_json(self.to_dict()) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "FitSet":
        path = Path(path)
        if not path.exists():
            raise UserError(f"no such fits file: {path}")
        try:
            return cls.from_dict(read_json(path, "fits file"))
        except UserError as exc:
            msg = str(exc)
            raise UserError(msg if str(path) in msg else f"{path}: {msg}") from None

    def summary(self) -> str:
        return "\n\n".join(f.summary() for f in self.fits.values())

    def paired(self, a: str, b: str) -> bool:
        """Whether groups a and b were fitted jointly, so that bootstrap row i of one and row i of the
        other come from the same resample of runs (savings then pairs them by index)."""
        ga = self.get(a).joint_groups
        return a == b or (b in ga and a in ga)


# -- constraints -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Constraints:
    """Fixed, tied and shared parameters of a fit (natural units, the law's parameter names).

    fixed: {name: value}, pinned exactly. ties: pairs (a, b) held equal (a = b; both fitted as
    logs or both as they are). shared: parameters common to all groups of a joint fit.
    """

    fixed: Mapping[str, float] = field(default_factory=dict)
    ties: tuple[tuple[str, str], ...] = ()
    shared: tuple[str, ...] = ()

    @classmethod
    def parse(cls, fix: Iterable[str] = (), tie: Iterable[str] = (),
              share: Iterable[str] = ()) -> "Constraints":
        """From text: fix items "E=1.7", tie items "alpha=beta", share items "E,beta" (or "E")."""
        fixed: dict[str, float] = {}
        for item in fix:
            name, sep, value = str(item).partition("=")
            if name.strip() in fixed:
                raise UserError(f"{name.strip()} is fixed twice ({name.strip()}={fixed[name.strip()]:g} and "
                                f"{item!r}); give one value")
            try:
                fixed[name.strip()] = float(value)
            except ValueError:
                sep = ""
            if not sep or not name.strip():
                raise UserError(f"a fixed parameter is NAME=VALUE (e.g. E=1.7), got {item!r}")
        ties = []
        for item in tie:
            parts = [t.strip() for t in str(item).split("=")]
            if len(parts) < 2 or not all(parts):
                raise UserError(f"a tie is NAME=NAME (e.g. alpha=beta), got {item!r}")
            ties += [(parts[0], p) for p in parts[1:]]
        shared = [t.strip() for item in share for t in str(item).split(",") if t.strip()]
        return cls(fixed=fixed, ties=tuple(ties), shared=tuple(dict.fromkeys(shared)))

    def __bool__(self) -> bool:
        return bool(self.fixed or self.ties or self.shared)

    def describe(self) -> dict[str, Any]:
        return {"fixed": {k: float(v) for k, v in self.fixed.items()},
                "tied": [f"{a}={b}" for a, b in self.ties], "shared": list(self.shared)}


@dataclass(frozen=True)
class ParamMap:
    """Affine map from the free vector u (U,) to each group's fitted vector z_g = M[g] u + c[g] (P,)."""

    law: Law
    groups: tuple[str, ...]
    M: np.ndarray            # (n_groups, P, U)
    c: np.ndarray            # (n_groups, P)
    bounds: np.ndarray       # (U, 2) fitted-space bounds of u
    slots: tuple[tuple[str, ...], ...]   # per column of u: the parameters it sets
    slot_group: tuple[str | None, ...]   # per column: its group, None when shared

    @classmethod
    def build(cls, law: Law, cons: Constraints, groups: Sequence[str]) -> "ParamMap":
        params = list(law.params)
        known = ", ".join(params)
        named = [*cons.fixed, *(n for t in cons.ties for n in t), *cons.shared]
        for name in named:
            if name not in params:
                raise UserError(f"{name!r} is not a parameter of the {law.name} law ({known})")
        lo_all, hi_all = law.internal_bounds().T
        is_log = dict(zip(params, law.is_log))
        for name, v in cons.fixed.items():
            if not math.isfinite(v) or (is_log[name] and v <= 0):
                raise UserError(f"the fixed value of {name} must be {'> 0' if is_log[name] else 'finite'}, "
                                f"got {v}")
        # tie classes (union-find over the names)
        parent = {p: p for p in params}

        def root(p: str) -> str:
            while parent[p] != p:
                p = parent[p]
            return p

        for a, b in cons.ties:
            if a == b:
                continue
            if is_log[a] != is_log[b]:
                raise UserError(f"cannot tie {a} and {b}: one is a scale fitted as its log, the other an "
                                "exponent or offset fitted as it is")
            if a in cons.fixed or b in cons.fixed:
                raise UserError(f"{a if a in cons.fixed else b} is both fixed and tied; fix every parameter "
                                "of the tie instead")
            parent[root(b)] = root(a)
        classes: dict[str, list[str]] = {}
        for p in params:
            if p not in cons.fixed:
                classes.setdefault(root(p), []).append(p)
        for name in cons.shared:
            if name in cons.fixed:
                raise UserError(f"{name} is both fixed and shared; a fixed value is common to all "
                                "groups anyway")
        shared_cls = [c for c in classes.values() if any(p in cons.shared for p in c)]
        own_cls = [c for c in classes.values() if not any(p in cons.shared for p in c)]
        groups = tuple(groups)
        slots = [tuple(c) for c in shared_cls]
        slot_group: list[str | None] = [None] * len(shared_cls)
        for g in groups:
            slots += [tuple(c) for c in own_cls]
            slot_group += [g] * len(own_cls)
        U, P = len(slots), len(params)
        M = np.zeros((len(groups), P, U))
        c = np.zeros((len(groups), P))
        for gi, g in enumerate(groups):
            for j, (members, sg) in enumerate(zip(slots, slot_group)):
                if sg is None or sg == g:
                    for p in members:
                        M[gi, params.index(p), j] = 1.0
            for p, v in cons.fixed.items():
                c[gi, params.index(p)] = math.log(v) if is_log[p] else v
        if U == 0:
            raise UserError(f"every parameter of the {law.name} law is fixed ({known}): nothing is left to "
                            "fit; leave at least one free")
        bounds = np.array([[max(lo_all[params.index(p)] for p in m), min(hi_all[params.index(p)] for p in m)]
                           for m in slots]).reshape(U, 2)
        return cls(law=law, groups=groups, M=M, c=c, bounds=bounds, slots=tuple(slots),
                   slot_group=tuple(slot_group))

    @property
    def n_free(self) -> int:
        return self.M.shape[2]

    def is_identity(self) -> bool:
        return len(self.groups) == 1 and self.M.shape[1] == self.M.shape[2] and \
            np.array_equal(self.M[0], np.eye(self.M.shape[1])) and not self.c.any()

    def z(self, u: np.ndarray, gi: int) -> np.ndarray:
        """Group gi's fitted vector(s) z (..., P) from u (..., U)."""
        return np.asarray(u) @ self.M[gi].T + self.c[gi]

    def starts(self, grid: np.ndarray) -> np.ndarray:
        """The law's start grid (M, P) in u: each slot takes its first parameter's grid value, every
        group the same values; duplicates dropped."""
        params = list(self.law.params)
        cols = [params.index(m[0]) for m in self.slots]
        u = np.unique(grid[:, cols], axis=0) if cols else np.zeros((1, 0))
        return np.clip(u, *self.bounds.T)

    def free_params(self, gi: int) -> int:
        """Free parameters that act on group gi."""
        return int(np.count_nonzero(self.M[gi].any(axis=0)))


def _design(law: Law, pm: ParamMap,
            X: Sequence[Mapping[str, np.ndarray]]) -> tuple[np.ndarray, np.ndarray | None]:
    """Joint design (T, n, U) and offset (T, n) over the groups' points, in group order."""
    Gs = [law.design(x) for x in X]
    if pm.is_identity():
        return Gs[0], None
    design = np.concatenate([G @ pm.M[gi] for gi, G in enumerate(Gs)], axis=1)
    offset = np.concatenate([G @ pm.c[gi] for gi, G in enumerate(Gs)], axis=1)
    return design, offset


# -- goodness of fit and allocation ------------------------------------------------------------------
MISFIT_P = 1e-3        # significance of the residual trend
MISFIT_RATIO = 1.0     # trend RMS / scatter RMS at which the trend matters


def goodness_of_fit(law: Law, inputs: Mapping[str, np.ndarray], resid: np.ndarray) -> dict[str, Any]:
    """Do the log residuals carry a systematic trend the law misses, measured against their own scatter?

    The residuals are regressed on a full quadratic in the law's (standardised) log inputs (S as
    it is): constant, linear, squares and products, i.e. curvature in every direction. F-test of
    that trend against the remaining scatter (a correct law leaves only noise: F ~ F(p-1, n-p)).
    Flagged ``misfit`` when the trend is significant (p < MISFIT_P) and not negligible beside the
    scatter (trend RMS >= MISFIT_RATIO x scatter RMS): with very many points a trend far below the
    noise is significant but harmless: a law whose systematic error stays below the points' own
    scatter predicts them as well as the noise allows. (Epoch's Chinchilla points under the
    Chinchilla law: p = 2e-19 but trend/scatter = 0.71, not flagged.) Also reports the worst
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
            "misfit": bool(p < MISFIT_P and ratio >= MISFIT_RATIO)}


def allocation(law: Law, theta: np.ndarray, k: float, S: float | None = None) -> dict[str, np.ndarray]:
    """Coefficients of the compute-optimal allocation x* = G C^a, D* = H C^b (x = N, or F), H = 1/(k G)
    (k = 1 for per-token FLOPs): the frontier at C = 1 (``scaling.fitting.laws.frontier``)."""
    fr = frontier(law, theta, 1.0, k=k, S=S)
    return {"G": fr.size, "H": fr.tokens}


# -- fitting ---------------------------------------------------------------------------------
def _run_weights(runs: np.ndarray, n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(K, n) point weights: how often each point's run is drawn when resampling runs with replacement."""
    ids, inv = np.unique(runs, return_inverse=True)
    draws = rng.integers(0, ids.size, size=(n_resamples, ids.size))
    counts = np.zeros((n_resamples, ids.size))
    np.add.at(counts, (np.repeat(np.arange(n_resamples), ids.size), draws.ravel()), 1.0)
    return counts[:, inv]


def _joint_weights(runs: Sequence[np.ndarray], n_resamples: int, seed: int) -> np.ndarray:
    """(K, n_total): runs resampled within each group (each keeps its number of runs), one resample
    index across all groups, so the groups' bootstrap rows are paired."""
    rng = np.random.default_rng(seed)
    return np.concatenate([_run_weights(np.asarray(r), n_resamples, rng) for r in runs], axis=1)


def bootstrap(law: Law, inputs: Mapping[str, np.ndarray] | None, log_loss: np.ndarray, runs: np.ndarray,
              starts: np.ndarray, *, n_resamples: int, seed: int, delta: float = DEFAULT_DELTA,
              chunk: int = 50, progress: Callable[[int, int], None] | None = None,
              kind: str = DEFAULT_OBJECTIVE, weights: np.ndarray | None = None,
              design: np.ndarray | None = None, offset: np.ndarray | None = None,
              bounds: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Resample runs with replacement; refit each resample from ``starts`` (fitted space, e.g. the
    distinct optima of the full fit). Returns (samples (K, U) in fitted space, converged (K,)).

    ``weights`` (K, n) replaces the resampling of ``runs`` (joint fits pass their paired weights);
    memory stays bounded: objective blocks (``EVAL_BLOCK``) and ``chunk`` resamples at a time.
    """
    W = weights if weights is not None else _run_weights(np.asarray(runs), n_resamples,
                                                         np.random.default_rng(seed))
    lo, hi = (law.internal_bounds() if bounds is None else bounds).T
    S, U = starts.shape
    out = np.full((n_resamples, U), np.nan)
    conv = np.zeros(n_resamples, dtype=bool)
    base = Objective(law, inputs, log_loss, delta, kind=kind, design=design, offset=offset)
    H0 = base.preconditioner()
    for b0 in range(0, n_resamples, chunk):
        b1 = min(n_resamples, b0 + chunk)
        obj = Objective(law, None, log_loss, delta, weights=W[b0:b1], kind=kind, design=base.G,
                        offset=base.offset)
        rows = np.repeat(np.arange(b1 - b0), S)
        res = lbfgs_batch(obj, np.tile(starts, (b1 - b0, 1)), lo, hi, rows=rows, precond=H0)
        f = res.f.reshape(b1 - b0, S)
        best = np.argmin(np.where(np.isfinite(f), f, np.inf), axis=1)
        pick = np.arange(b1 - b0) * S + best
        out[b0:b1] = res.x[pick]
        conv[b0:b1] = res.converged[pick]
        if progress is not None:
            progress(b1, n_resamples)
    return out, conv


def one_step_bootstrap(obj: Objective, u0: np.ndarray, runs: Sequence[np.ndarray], n_resamples: int,
                       seed: int, bounds: np.ndarray,
                       progress: Callable[[int, int], None] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Bootstrap over runs by one Gauss-Newton step from the full fit per resample (large tables).

    For resample weights w_b (how often each point's run is drawn; runs resampled within each
    block of ``runs``, one index across blocks as in a joint fit), u_b = u0 - H^-1 g_b with
    g_b = sum_i w_bi rho'(r_i) dr_i/du the resample's gradient and H = sum_i rho''(r_i)
    (dr_i/du)(dr_i/du)^T the full data's Gauss-Newton Hessian, both at the full-data optimum u0:
    the linearised (one-step) bootstrap of an M-estimator, which agrees with refitting every
    resample to first order (Shao & Tu 1995, The Jackknife and Bootstrap, sec. 5.4.3; a fixed H
    rather than each resample's: Huber's rho'' is 1 only inside +-delta, so a resample's own H is
    noisy). Per-run gradient sums are formed once, so a resample costs (runs) x (parameters), not
    (points) x (L-BFGS iterations). Checked against refitting (tests/test_fit_large.py: bootstrap
    standard deviations within 10% on 2,000 points). Returns (samples (K, U), finite (K,)).
    """
    T, n, U = obj.G.shape
    terms = np.einsum("tnu,u->tn", obj.G, u0)
    if obj.offset is not None:
        terms = terms + obj.offset
    top = terms.max(axis=0)
    ex = np.exp(terms - top)
    tot = ex.sum(axis=0)
    lse = top + np.log(tot)
    J = np.einsum("tn,tnu->nu", ex / tot, obj.G)                   # d log L_hat / du, (n, U)
    if obj.kind in ("huber-log", "sq-log"):
        r = obj.y - lse
        dr = -J
        d2 = (np.abs(r) < obj.delta).astype(float) if obj.kind == "huber-log" else np.ones(n)
    elif obj.kind == "sq":
        lhat = np.exp(lse)
        r = obj.loss - lhat
        dr = -lhat[:, None] * J
        d2 = np.ones(n)
    else:
        raise UserError(f"the one-step bootstrap needs a smooth objective, not {obj.kind}")
    _, drho = obj._rho(r)
    grad = drho[:, None] * dr                                      # (n, U) per-point gradients
    H = np.einsum("n,nu,nv->uv", d2, dr, dr)
    try:
        Hinv = np.linalg.inv(H)
    except np.linalg.LinAlgError:
        return np.full((n_resamples, U), np.nan), np.zeros(n_resamples, dtype=bool)
    rng = np.random.default_rng(seed)
    blocks, off = [], 0
    for rb in runs:
        rb = np.asarray(rb)
        ids, inv = np.unique(rb, return_inverse=True)
        sums = np.stack([np.bincount(inv, weights=grad[off:off + rb.size, c], minlength=ids.size)
                         for c in range(U)], axis=1)
        blocks.append((ids.size, sums))
        off += rb.size
    out = np.full((n_resamples, U), np.nan)
    lo, hi = np.asarray(bounds, dtype=float).T
    chunk = max(1, min(n_resamples, (1 << 22) // max(1, max(R for R, _ in blocks))))
    for b0 in range(0, n_resamples, chunk):
        k = min(chunk, n_resamples - b0)
        g = np.zeros((k, U))
        for R, sums in blocks:
            draws = rng.integers(0, R, size=(k, R)) + (np.arange(k) * R)[:, None]
            counts = np.bincount(draws.ravel(), minlength=k * R).reshape(k, R).astype(float)
            g += counts @ sums
        out[b0:b0 + k] = np.clip(u0 - g @ Hinv.T, lo, hi)
        if progress is not None:
            progress(b0 + k, n_resamples)
    ok = np.isfinite(out).all(axis=1)
    out[~ok] = np.nan
    return out, ok


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
