"""Bootstrap over runs: resample runs with replacement (a run may hold several token budgets).

The refit bootstrap optimises all resamples together from the distinct optima of the full fit
(warm starts); tables of more than ``ONE_STEP_POINTS`` points take one Gauss-Newton step from the
fit per resample instead (``one_step_bootstrap``).
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from scaling.common.errors import UserError
from scaling.fitting.laws import Law
from scaling.fitting.objective import DEFAULT_DELTA, DEFAULT_OBJECTIVE, Objective
from scaling.fitting.optimizer import lbfgs_batch

ONE_STEP_POINTS = 20000  # larger tables: one-step (linearised) bootstrap instead of refits


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
