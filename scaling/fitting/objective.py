"""The approach-3 objective: a weighted sum of rho(residual) over points, with its analytic gradient.

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
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from scaling.common.errors import UserError
from scaling.fitting.laws import Law

DEFAULT_DELTA = 1e-3
DEFAULT_OBJECTIVE = "huber-log"
ASYM_WEIGHT = 10.0     # the chinchilla library's default w of asymmetric_mae
EVAL_BLOCK = 1 << 21   # elements (starts x terms x points) of one objective temporary: 16 MB of float64
OBJECTIVES = {
    "huber-log": "Huber(delta) on log loss (Hoffmann et al. 2022; Besiroglu et al. 2024)",
    "sq-log": "squared error on log loss",
    "sq": "squared error on loss",
    "asym-abs": "asymmetric absolute error on loss, over-prediction x10 "
                "(chinchilla library's asymmetric_mae)",
}


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

