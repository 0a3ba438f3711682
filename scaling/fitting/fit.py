"""Approach 3 scaling-law fits: Huber loss on log loss, multi-start L-BFGS, bootstrap over runs.

Objective (Hoffmann et al. 2022, approach 3; as corrected by Besiroglu et al. 2024):

    J(z) = sum_i w_i * Huber_delta(log L_i - log L_hat(x_i; z)),   delta = 1e-3 by default,

with ``log L_hat = logsumexp_t(G[t] z)`` from the law registry (``scaling.fitting.laws``). It is a
*sum*, not a mean: averaging shrinks the gradient by 1/n and with ordinary tolerances stops
the optimiser early, the failure Besiroglu et al. found in the original fit.

Optimiser: every start of a grid is optimised at once by a batched projected L-BFGS written
here in numpy (per-start memory, step length and convergence test; the analytic gradient is
one matrix product over all starts), and the best few distinct results are polished by
scipy's L-BFGS-B with tight tolerances. The bootstrap resamples runs with replacement (a run
may hold several token budgets), and optimises all resamples together from the best
full-data optima.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from scaling.common.errors import UserError
from scaling.fitting.laws import Law, get_law
from scaling.fitting.laws import optimal as law_optimal
from scaling.fitting.tables import flops_per_param_k, law_inputs, total_flops

DEFAULT_DELTA = 1e-3
DEFAULT_BOOTSTRAP = 200
CI_LEVEL = 0.95


# -- objective ----------------------------------------------------------------------------
class Objective:
    """Weighted Huber sum on log residuals for a batch of fitted vectors, with analytic gradient.

    ``weights`` is (n,) (one data set) or (R, n) (one row per bootstrap resample); ``rows`` in
    ``__call__`` picks which weight row each start in the batch uses.
    """

    def __init__(self, law: Law, inputs: Mapping[str, np.ndarray], log_loss: np.ndarray,
                 delta: float = DEFAULT_DELTA, weights: np.ndarray | None = None):
        if not delta > 0:
            raise UserError(f"the Huber delta must be > 0, got {delta}")
        self.law = law
        self.G = law.design(inputs)                      # (T, n, P)
        T, n, P = self.G.shape
        self.Gflat = self.G.reshape(T * n, P)
        self.GflatT = np.ascontiguousarray(self.Gflat.T)
        self.y = np.asarray(log_loss, dtype=float)
        self.delta = float(delta)
        self.weights = np.ones((1, n)) if weights is None else np.atleast_2d(np.asarray(weights, dtype=float))

    def __call__(self, z: np.ndarray, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """J and dJ/dz for z (M, P); returns ((M,), (M, P))."""
        T, n, P = self.G.shape
        M = z.shape[0]
        terms = (z @ self.GflatT).reshape(M, T, n)
        ex = np.exp(terms)
        tot = ex.sum(axis=1)
        r = self.y - np.log(tot)
        if not np.isfinite(r).all():   # a term over- or underflowed: redo with the max shifted out
            top = terms.max(axis=1, keepdims=True)
            ex = np.exp(terms - top)
            tot = ex.sum(axis=1)
            r = self.y - (top[:, 0, :] + np.log(tot))
        w = self.weights[0] if rows is None else self.weights[rows]
        c = np.clip(r, -self.delta, self.delta)
        f = (w * c * (r - 0.5 * c)).sum(axis=-1)             # Huber: c (r - c/2) with c = clip(r)
        coef = -(w * c) / tot                                 # dJ/d(log L_hat) / sum_t exp(term_t)
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
class Optimum:
    """Result of the multi-start search on one data set (fitted space)."""

    z: np.ndarray               # (P,) best fitted vector
    objective: float
    refined_z: np.ndarray       # (K, P) refined starts, best first
    refined_f: np.ndarray       # (K,)
    converged: bool
    n_starts: int


SCREEN_ITERS = 10   # iterations every grid start gets before the best are refined
N_REFINE = 32       # starts refined to full convergence


def multistart(obj: Objective, starts: np.ndarray, *, screen_iters: int = SCREEN_ITERS,
               n_refine: int = N_REFINE) -> Optimum:
    """Screen all starts for a few batched iterations, refine the best, polish the winner with scipy.

    Checked against running every grid start to convergence on 14 data sets (Epoch's Chinchilla
    points; noisy synthetic chinchilla-law grids and IsoFLOP designs; smelt-law grids; an
    unidentified design): 5 screening iterations already found the same optimum in all of them,
    though only ~30% of all 2,700 grid starts reach it on the Chinchilla points.
    """
    law = obj.law
    lo, hi = law.internal_bounds().T
    H0 = obj.preconditioner()
    screen = lbfgs_batch(obj, starts, lo, hi, maxiter=screen_iters, precond=H0)
    finite = np.isfinite(screen.f)
    if not finite.any():
        raise UserError("the fit diverged from every start (non-finite objective)")
    order = np.argsort(np.where(finite, screen.f, np.inf))[: max(1, n_refine)]
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
    return Optimum(z=z, objective=f, refined_z=refined_z, refined_f=refined_f,
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
    samples = samples[np.isfinite(samples)]
    if samples.size == 0:
        return (math.nan, math.nan)
    q = 100 * (1 - level) / 2
    lo, hi = np.percentile(samples, [q, 100 - q])
    return (float(lo), float(hi))


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
            raise UserError("this fit has no bootstrap samples (fitted with --bootstrap 0)")
        return self.law_obj.predict(self.bootstrap, **inputs)

    def optimal(self, C: np.ndarray | float, k: float | None = None,
                **fixed: object) -> dict[str, np.ndarray]:
        """Compute-optimal allocation at total training FLOPs C (closed form).

        chinchilla: C = k N D with k = ``flops_per_param_k`` of the data unless given;
        returns {"N", "D", "loss"}. smelt: C = F D at fixed ``S=``; returns {"F", "D", "loss"}.
        """
        return law_optimal(self.law_obj, self.params, C, k=self.k if k is None else k, **fixed)

    # -- text and JSON ------------------------------------------------------------------------
    def summary(self) -> str:
        law = self.law_obj
        level = self.settings.get("ci_level", CI_LEVEL)
        delta = self.settings.get("huber_delta", DEFAULT_DELTA)
        lines = [f"group {self.group}: {law.formula}  ({self.n_points} points, Huber delta {delta:g}, "
                 f"{self.bootstrap.shape[0]} bootstrap resamples)"]
        for name, value in [*self.params.items(), *self.derived.items()]:
            lo, hi = self.ci.get(name, (math.nan, math.nan))
            ci = f"[{lo:.6g}, {hi:.6g}]" if np.isfinite(lo) else "(no bootstrap)"
            lines.append(f"  {name:>18} = {value:<12.6g} {100 * level:.0f}% CI {ci}")
        d = self.diagnostics
        lines.append(f"  RMSE(log L) {d['rmse_log']:.4g}, max |residual| {d['max_abs_residual']:.4g}, "
                     f"objective {d['objective']:.10g}, identified: {'yes' if d['identified'] else 'NO'}")
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
        """The FitSet entry: law, the parameters as top-level keys, n_points, ci, diagnostics, extras."""
        return {
            "law": self.law,
            **{k: float(v) for k, v in self.params.items()},
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
    def from_dict(cls, d: Mapping[str, Any], group: str | None = None) -> "FitResult":
        try:
            law = get_law(str(d["law"]))
            params = {p: float(d[p]) for p in law.params}
            boot = np.asarray(d.get("bootstrap") or [], dtype=float).reshape(-1, law.n_params)
            order = d.get("bootstrap_params")
            if order is not None and list(order) != list(law.params):
                boot = boot[:, [list(order).index(p) for p in law.params]]
            ci = {k: (_num(v[0]), _num(v[1])) for k, v in (d.get("ci") or {}).items()}
            return cls(law=law.name, group=str(d.get("group", group or "default")), params=params, ci=ci,
                       bootstrap=boot, diagnostics=dict(d.get("diagnostics") or {}),
                       n_points=int(d["n_points"]),
                       data_summary=dict(d.get("data_summary") or {}),
                       derived=dict(d.get("derived") or law.derive(params)),
                       settings=dict(d.get("settings") or {}), cross_checks=dict(d.get("cross_checks") or {}))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise UserError(f"not a fit entry{f' for group {group!r}' if group else ''}: {exc}") from None

    def save(self, path: str | Path) -> None:
        """Write as a one-group FitSet file (readable by ``FitSet.load`` and ``savings --fits``)."""
        FitSet({self.group: self}).save(path)

    @classmethod
    def load(cls, path: str | Path, group: str | None = None) -> "FitResult":
        return FitSet.load(path).get(group)


def _num(v: Any) -> float:
    return math.nan if v is None else float(v)


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
        return {"fits": {g: f.to_dict() for g, f in self.fits.items()}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "FitSet":
        if not isinstance(d, Mapping) or not isinstance(d.get("fits"), Mapping) or not d["fits"]:
            raise UserError('not a fits file: expected {"fits": {"<group>": {...}}}')
        return cls({str(g): FitResult.from_dict(e, group=str(g)) for g, e in d["fits"].items()})

    def save(self, path: str | Path) -> None:
        from scaling.common.serialize import to_json

        Path(path).write_text(to_json(self.to_dict()) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "FitSet":
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise UserError(f"no such fits file: {path}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UserError(f"{path}: not JSON ({exc})") from None
        return cls.from_dict(data)

    def summary(self) -> str:
        return "\n\n".join(f.summary() for f in self.fits.values())


# -- fitting ---------------------------------------------------------------------------------
def _run_weights(runs: np.ndarray, n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(K, n) point weights: how often each point's run is drawn when resampling runs with replacement."""
    ids, inv = np.unique(runs, return_inverse=True)
    draws = rng.integers(0, ids.size, size=(n_resamples, ids.size))
    counts = np.zeros((n_resamples, ids.size))
    np.add.at(counts, (np.repeat(np.arange(n_resamples), ids.size), draws.ravel()), 1.0)
    return counts[:, inv]


def bootstrap(law: Law, inputs: Mapping[str, np.ndarray], log_loss: np.ndarray, runs: np.ndarray,
              starts: np.ndarray, *, n_resamples: int, seed: int, delta: float = DEFAULT_DELTA,
              chunk: int = 50, progress: Callable[[int, int], None] | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
    """Resample runs with replacement; refit each resample from ``starts`` (fitted space, e.g. the
    distinct optima of the full fit). Returns (samples (K, P) natural units, converged (K,))."""
    rng = np.random.default_rng(seed)
    W = _run_weights(np.asarray(runs), n_resamples, rng)
    lo, hi = law.internal_bounds().T
    S = starts.shape[0]
    out = np.full((n_resamples, law.n_params), np.nan)
    conv = np.zeros(n_resamples, dtype=bool)
    H0 = Objective(law, inputs, log_loss, delta).preconditioner()
    for b0 in range(0, n_resamples, chunk):
        b1 = min(n_resamples, b0 + chunk)
        obj = Objective(law, inputs, log_loss, delta, weights=W[b0:b1])
        rows = np.repeat(np.arange(b1 - b0), S)
        res = lbfgs_batch(obj, np.tile(starts, (b1 - b0, 1)), lo, hi, rows=rows, precond=H0)
        f = res.f.reshape(b1 - b0, S)
        best = np.argmin(np.where(np.isfinite(f), f, np.inf), axis=1)
        pick = np.arange(b1 - b0) * S + best
        out[b0:b1] = law.from_internal(res.x[pick])
        conv[b0:b1] = res.converged[pick]
        if progress is not None:
            progress(b1, n_resamples)
    return out, conv


def fit_law(points: pd.DataFrame, law: str | Law = "chinchilla", *, group: str | None = None,
            huber_delta: float = DEFAULT_DELTA, n_bootstrap: int = DEFAULT_BOOTSTRAP, seed: int = 0,
            ci_level: float = CI_LEVEL, starts: np.ndarray | None = None,
            progress: Callable[[int, int], None] | None = None) -> FitResult:
    """Approach-3 fit of one group of canonical points (``scaling.fitting.tables``), with bootstrap over runs.

    Raises UserError for fewer points than parameters or inputs the law cannot use.
    """
    law = get_law(law) if isinstance(law, str) else law
    if group is None:
        group = str(points["group"].iloc[0]) if "group" in points.columns and len(points) else "default"
    source = f"group {group!r}"
    P = law.n_params
    n = len(points)
    if n < P:
        raise UserError(f"{source}: {n} points for {P} parameters of the {law.name} law; need at least {P}")
    if not (0 < ci_level < 1):
        raise UserError(f"the interval level must lie in (0, 1), got {ci_level}")
    if n_bootstrap < 0:
        raise UserError(f"--bootstrap must be >= 0, got {n_bootstrap}")
    X = law_inputs(points, law.inputs, source=source)
    y = np.log(points["loss"].to_numpy(dtype=float))
    runs = points["run"].to_numpy() if "run" in points else np.arange(n)
    obj = Objective(law, X, y, huber_delta)
    grid = law.starts() if starts is None else np.atleast_2d(np.asarray(starts, dtype=float))
    opt = multistart(obj, grid)
    theta = law.from_internal(opt.z)
    params = law.as_dict(theta)
    derived = law.derive(theta)

    # diagnostics
    resid = obj.residuals(opt.z)
    lo, hi = law.internal_bounds().T
    span = hi - lo
    tol = 1e-6 * np.maximum(span, 1)
    on_bound = [p for p, v, a, b, t in zip(law.params, opt.z, lo, hi, tol) if min(v - a, b - v) <= t]
    near = opt.refined_f <= opt.objective * (1 + 1e-6) + 1e-14
    near_theta = law.from_internal(opt.refined_z[near])
    spread = 0.0
    if near.sum() > 1:
        spread = float(np.max(np.ptp(near_theta, axis=0) / np.maximum(np.abs(theta), 1e-300)))
    distinct = distinct_optima(opt.refined_z, opt.refined_f)
    warnings: list[str] = []
    if n < 4 * P:
        warnings.append(f"few points: {n} for {P} parameters; the fit is weakly constrained")
    if on_bound:
        warnings.append(f"the best fit sits on a bound of {', '.join(on_bound)}: "
                        "not identified from these points")
    if spread > 1e-2:
        warnings.append(f"starts with the same objective disagree by up to {spread:.3g}x (relative) in some "
                        "parameter: a flat direction, the parameters are not identified")
    if not opt.converged:
        warnings.append("the optimiser did not meet its convergence test")

    # bootstrap over runs, from the distinct optima of the full fit
    K = int(n_bootstrap)
    if K:
        samples, bconv = bootstrap(law, X, y, runs, opt.refined_z[distinct], n_resamples=K, seed=seed,
                                   delta=huber_delta, progress=progress)
        zs = law.to_internal(samples)
        hit = np.any((zs - lo <= tol) | (hi - zs <= tol), axis=1)
        boot_bound = float(hit.mean())
        if boot_bound > 0.1:
            warnings.append(f"{100 * boot_bound:.0f}% of bootstrap fits end on a bound: weakly identified")
        n_unconv = int((~bconv).sum())
    else:
        samples = np.zeros((0, P))
        boot_bound, n_unconv = math.nan, 0
    derived_samples = {k: np.array([law.derive(s)[k] for s in samples]) for k in derived}
    ci = {p: _percentile_ci(samples[:, i], ci_level) for i, p in enumerate(law.params)}
    ci.update({k: _percentile_ci(v, ci_level) for k, v in derived_samples.items()})
    if K:
        for p in law.params:
            lo_p, hi_p = ci[p]
            if p in law.log_params and lo_p > 0 and hi_p / lo_p > 10:
                warnings.append(f"{p} is weakly identified: its {100 * ci_level:.0f}% interval spans "
                                f"{math.log10(hi_p / lo_p):.1f} decades")

    identified = not on_bound and spread <= 1e-2 and opt.converged and n > P and not (K and boot_bound > 0.1)
    diagnostics = {
        "objective": opt.objective,
        "rmse_log": float(np.sqrt(np.mean(resid ** 2))),
        "max_abs_residual": float(np.max(np.abs(resid))),
        "n_points": n,
        "n_runs": int(np.unique(runs).size),
        "on_bound": on_bound,
        "n_starts": opt.n_starts,
        "n_refined": int(opt.refined_f.size),
        "n_refined_at_best": int(near.sum()),
        "best_start_param_spread": spread,
        "distinct_optima_objectives": [float(opt.refined_f[i]) for i in distinct],
        "converged": opt.converged,
        "bootstrap_on_bound_fraction": boot_bound,
        "bootstrap_unconverged": n_unconv,
        "identified": bool(identified),
        "warnings": warnings,
    }
    k = flops_per_param_k(points)
    C = total_flops(points, k)
    summary = {
        "n_points": n, "n_runs": diagnostics["n_runs"],
        "N_min": float(points["N"].min()), "N_max": float(points["N"].max()),
        "D_min": float(points["D"].min()), "D_max": float(points["D"].max()),
        "loss_min": float(points["loss"].min()), "loss_max": float(points["loss"].max()),
        "compute_min": float(C.min()), "compute_max": float(C.max()), "flops_per_param_k": k,
    }
    if "F" in X:
        summary.update(F_min=float(X["F"].min()), F_max=float(X["F"].max()))
    if "S" in X:
        summary["sparsities"] = sorted({round(float(s), 6) for s in X["S"]})
    settings = {"huber_delta": float(huber_delta), "n_bootstrap": K, "seed": int(seed),
                "ci_level": float(ci_level), "bootstrap_unit": "run"}
    return FitResult(law=law.name, group=group, params=params, ci=ci, bootstrap=samples,
                     diagnostics=diagnostics, n_points=n, data_summary=summary, derived=derived,
                     settings=settings)


def fit_groups(points: pd.DataFrame, law: str | Law = "chinchilla", *, cross_checks: bool = True,
               progress: Callable[[str, int, int], None] | None = None,
               **kwargs: Any) -> dict[str, FitResult]:
    """``fit_law`` per group (sorted by name); keyword arguments as ``fit_law``. With ``cross_checks``,
    approaches 1 and 2 (``scaling.fitting.approaches``) are attached to each result."""
    from dataclasses import replace

    from scaling.fitting.approaches import cross_checks as run_cross_checks

    out: dict[str, FitResult] = {}
    for group in sorted(points["group"].unique(), key=str):
        sub = points[points["group"] == group].reset_index(drop=True)
        cb = None if progress is None else (lambda done, total, g=group: progress(g, done, total))
        res = fit_law(sub, law, group=str(group), progress=cb, **kwargs)
        if cross_checks:
            res = replace(res, cross_checks=run_cross_checks(sub, res))
        out[str(group)] = res
    return out
