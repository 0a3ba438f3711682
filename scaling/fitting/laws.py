"""Registry of parametric scaling-law forms, fitted in log space (logsumexp parameterisation).

Every law here is a sum of power-law terms, ``L = sum_t exp(g_t(x) . z)``, where ``z`` is the
vector of *fitted* parameters (log of each scale parameter, the exponents as they are) and
``g_t(x)`` a row of log-features of the inputs. So ``log L = logsumexp_t(G[t] @ z)`` with
``G`` of shape (T terms, n points, P params), and the analytic gradient is
``d log L / dz = sum_t softmax_t * G[t]``. This is the parameterisation of Hoffmann et al.
(2022, approach 3) as corrected by Besiroglu et al. (2024, arXiv:2404.10102), who fit
``log L = LSE(a - alpha log N, b - beta log D, e)`` with ``A = e^a, B = e^b, E = e^e``.

Laws:

- ``chinchilla``: L(N, D) = E + A / N^alpha + B / D^beta, N = non-embedding (active)
  parameters, D = training tokens, L in nats/token.
- ``smelt``: L(F, S, D) = E + A (1 - S)^b / F^a + K / D^c (SMELT paper, arXiv 2609.01343),
  F = training FLOPs per token, S = compute-equivalent sparsity in [0, 1), D = tokens.

Adding a law that is a sum of power-law terms is one entry in ``LAWS``: its parameter
names, which of them are fitted as logs, bounds, the design function and the start grid.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product
from typing import Callable, Mapping

import numpy as np

from scaling.common.errors import UserError

Inputs = Mapping[str, np.ndarray]


def two_term_optimum(E: np.ndarray, P: np.ndarray, p: np.ndarray, Q: np.ndarray, q: np.ndarray,
                     budget: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Minimise L = E + P x^-p + Q y^-q subject to x*y = budget (closed form, Lagrange).

    x* = G budget^(q/(p+q)), y* = budget / x*, with G = (p P / (q Q))^(1/(p+q)).
    Returns (x*, y*, L*). Arrays broadcast.
    """
    E, P, p, Q, q, budget = (np.asarray(v, dtype=float) for v in (E, P, p, Q, q, budget))
    G = (p * P / (q * Q)) ** (1.0 / (p + q))
    x = G * budget ** (q / (p + q))
    y = budget / x
    return x, y, E + P * x ** (-p) + Q * y ** (-q)


@dataclass(frozen=True, eq=False)
class Law:
    """One parametric law form. ``theta`` is always in natural units, in ``params`` order.

    Fields:
        name: registry key.
        params: natural parameter names, the order of every parameter vector.
        inputs: names of the input columns the law needs (keyword arguments of ``predict``).
        bounds: natural-unit bounds per parameter, used by the optimiser (log-space for
            log-fitted parameters).
        log_params: parameters fitted as their logarithm (scale factors).
        design: inputs -> G (T, n, P): ``log term_t = G[t] @ z`` for fitted vector z.
        start_grid: per parameter, starting values in *fitted* space (logs for log_params).
        derived: theta -> derived quantities (compute-optimal exponents and so on).
        formula: one-line human formula.
    """

    name: str
    params: tuple[str, ...]
    inputs: tuple[str, ...]
    bounds: dict[str, tuple[float, float]]
    log_params: frozenset[str]
    design: Callable[[Inputs], np.ndarray] = field(repr=False)
    start_grid: dict[str, tuple[float, ...]] = field(repr=False)
    derived: Callable[[Mapping[str, float]], dict[str, float]] = field(repr=False)
    formula: str = ""

    # -- parameter transforms -------------------------------------------------------------
    @property
    def n_params(self) -> int:
        return len(self.params)

    @property
    def is_log(self) -> np.ndarray:
        return np.array([p in self.log_params for p in self.params])

    def theta_array(self, theta: Mapping[str, float] | np.ndarray) -> np.ndarray:
        """Natural parameters as an array (..., P) in ``params`` order."""
        if isinstance(theta, Mapping):
            missing = [p for p in self.params if p not in theta]
            if missing:
                raise UserError(f"law {self.name!r} needs parameters {', '.join(missing)}")
            return np.array([float(theta[p]) for p in self.params])
        arr = np.asarray(theta, dtype=float)
        if arr.shape[-1] != self.n_params:
            raise UserError(f"law {self.name!r} has {self.n_params} parameters, got {arr.shape[-1]}")
        return arr

    def to_internal(self, theta: Mapping[str, float] | np.ndarray) -> np.ndarray:
        """Natural parameters -> fitted vector z (log for scale parameters)."""
        arr = self.theta_array(theta)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.is_log, np.log(arr), arr)

    def from_internal(self, z: np.ndarray) -> np.ndarray:
        """Fitted vector z (..., P) -> natural parameters (..., P)."""
        z = np.asarray(z, dtype=float)
        return np.where(self.is_log, np.exp(z), z)

    def as_dict(self, theta: np.ndarray) -> dict[str, float]:
        return {p: float(v) for p, v in zip(self.params, np.asarray(theta, dtype=float))}

    def internal_bounds(self) -> np.ndarray:
        """(P, 2) bounds in fitted space."""
        b = np.array([self.bounds[p] for p in self.params], dtype=float)
        b[self.is_log] = np.log(b[self.is_log])
        return b

    def starts(self) -> np.ndarray:
        """Cartesian grid of starting points in fitted space, (M, P), clipped into the bounds."""
        grid = np.array(list(product(*(self.start_grid[p] for p in self.params))), dtype=float)
        lo, hi = self.internal_bounds().T
        return np.clip(grid, lo, hi)

    # -- inputs and prediction ------------------------------------------------------------
    def check_inputs(self, inputs: Mapping[str, object]) -> dict[str, np.ndarray]:
        """The law's inputs as float arrays broadcast to one shape (n,); one-line errors."""
        missing = [k for k in self.inputs if k not in inputs]
        if missing:
            raise UserError(f"law {self.name!r} needs inputs {', '.join(self.inputs)}; "
                            f"missing {', '.join(missing)}")
        arrays = np.broadcast_arrays(*(np.atleast_1d(np.asarray(inputs[k], dtype=float))
                                       for k in self.inputs))
        return {k: np.ravel(a) for k, a in zip(self.inputs, arrays)}

    def log_terms(self, z: np.ndarray, inputs: Inputs) -> tuple[np.ndarray, np.ndarray]:
        """Log of each additive term for fitted vectors z (M, P): returns (terms (M, T, n), G (T, n, P))."""
        G = self.design(inputs)
        z = np.atleast_2d(np.asarray(z, dtype=float))
        return np.einsum("tnp,mp->mtn", G, z), G

    def predict_log(self, theta: Mapping[str, float] | np.ndarray, **inputs: object) -> np.ndarray:
        """log L at the inputs (broadcast together). theta (P,) gives shape (n,); (K, P) gives (K, n)."""
        arr = self.theta_array(theta)
        shape = np.broadcast_shapes(*(np.shape(inputs[k]) for k in self.inputs if k in inputs))
        X = self.check_inputs(inputs)
        terms, _ = self.log_terms(self.to_internal(arr).reshape(-1, self.n_params), X)
        out = _logsumexp(terms, axis=1)
        return out.reshape(arr.shape[:-1] + shape)

    def predict(self, theta: Mapping[str, float] | np.ndarray, **inputs: object) -> np.ndarray:
        """Loss L (nats/token) at the inputs."""
        return np.exp(self.predict_log(theta, **inputs))

    def derive(self, theta: Mapping[str, float] | np.ndarray) -> dict[str, float]:
        return self.derived(self.as_dict(self.theta_array(theta)))


def _logsumexp(x: np.ndarray, axis: int) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    return np.squeeze(m, axis=axis) + np.log(np.sum(np.exp(x - m), axis=axis))


# -- chinchilla -----------------------------------------------------------------------------
# z = (e, a, alpha, b, beta) with E = e^e, A = e^a, B = e^b.
def _chinchilla_design(X: Inputs) -> np.ndarray:
    logN, logD = np.log(X["N"]), np.log(X["D"])
    n = logN.shape[0]
    G = np.zeros((3, n, 5))
    G[0, :, 0] = 1.0            # e
    G[1, :, 1] = 1.0            # a
    G[1, :, 2] = -logN          # -alpha log N
    G[2, :, 3] = 1.0            # b
    G[2, :, 4] = -logD          # -beta log D
    return G


def _chinchilla_derived(t: Mapping[str, float]) -> dict[str, float]:
    """Compute-optimal exponents for C = k N D: N* ~ C^a, D* ~ C^b, L* - E ~ C^-frontier."""
    s = t["alpha"] + t["beta"]
    return {"a": t["beta"] / s, "b": t["alpha"] / s, "frontier_exponent": t["alpha"] * t["beta"] / s}


# -- smelt ----------------------------------------------------------------------------------
# z = (e, log A, a, b, log K, c): log term_1 = log A + b log(1 - S) - a log F.
def _smelt_design(X: Inputs) -> np.ndarray:
    logF, logD = np.log(X["F"]), np.log(X["D"])
    with np.errstate(divide="ignore"):
        log1mS = np.log1p(-X["S"])
    n = logF.shape[0]
    G = np.zeros((3, n, 6))
    G[0, :, 0] = 1.0            # e
    G[1, :, 1] = 1.0            # log A
    G[1, :, 2] = -logF          # -a log F
    G[1, :, 3] = log1mS         # b log(1 - S)
    G[2, :, 4] = 1.0            # log K
    G[2, :, 5] = -logD          # -c log D
    return G


def _smelt_derived(t: Mapping[str, float]) -> dict[str, float]:
    """Compute-optimal exponents for C = F D at fixed S: F* ~ C^f, D* ~ C^d, L* - E ~ C^-frontier."""
    s = t["a"] + t["c"]
    return {"f_exponent": t["c"] / s, "d_exponent": t["a"] / s, "frontier_exponent": t["a"] * t["c"] / s}


_SCALE = (1e-6, 1e20)      # bounds of A, B, K: wide enough never to bind on real data
_EXPONENT = (1e-4, 3.0)
_E = (1e-4, 100.0)

LAWS: dict[str, Law] = {
    "chinchilla": Law(
        name="chinchilla",
        params=("E", "A", "alpha", "B", "beta"),
        inputs=("N", "D"),
        bounds={"E": _E, "A": _SCALE, "alpha": _EXPONENT, "B": _SCALE, "beta": _EXPONENT},
        log_params=frozenset({"E", "A", "B"}),
        design=_chinchilla_design,
        # Epoch's grid (Besiroglu et al. 2024), coarsened: e in -1..1, a, b in 0..25, exponents 0..2.
        start_grid={"E": (-1.0, 0.0, 1.0), "A": (0.0, 5.0, 10.0, 15.0, 20.0, 25.0),
                    "alpha": (0.0, 0.5, 1.0, 1.5, 2.0), "B": (0.0, 5.0, 10.0, 15.0, 20.0, 25.0),
                    "beta": (0.0, 0.5, 1.0, 1.5, 2.0)},
        derived=_chinchilla_derived,
        formula="L = E + A/N^alpha + B/D^beta",
    ),
    "smelt": Law(
        name="smelt",
        params=("E", "A", "a", "b", "K", "c"),
        inputs=("F", "S", "D"),
        bounds={"E": _E, "A": _SCALE, "a": _EXPONENT, "b": (-3.0, 3.0), "K": _SCALE, "c": _EXPONENT},
        log_params=frozenset({"E", "A", "K"}),
        design=_smelt_design,
        start_grid={"E": (-1.0, 0.0, 1.0), "A": (0.0, 5.0, 10.0, 15.0, 20.0, 25.0),
                    "a": (0.0, 0.5, 1.0, 1.5), "b": (0.0, 0.5), "K": (0.0, 5.0, 10.0, 15.0, 20.0, 25.0),
                    "c": (0.0, 0.5, 1.0, 1.5)},
        derived=_smelt_derived,
        formula="L = E + A(1-S)^b/F^a + K/D^c",
    ),
}


def get_law(name: str) -> Law:
    try:
        return LAWS[name]
    except KeyError:
        raise UserError(f"unknown law {name!r}; choose one of: {', '.join(LAWS)}") from None


def optimal(law: Law, theta: Mapping[str, float] | np.ndarray, C: np.ndarray | float, k: float = 6.0,
            **fixed: object) -> dict[str, np.ndarray]:
    """Compute-optimal allocation along a budget C (closed form).

    chinchilla: C = k N D (k = 6 by Kaplan's approximation, or the measured flops/(N D));
        returns {"N", "D", "loss"}.
    smelt: C = F D (F is per-token FLOPs, so no k), at fixed sparsity ``S=...``;
        returns {"F", "D", "loss"}.
    """
    t = law.as_dict(law.theta_array(theta))
    C = np.asarray(C, dtype=float)
    if law.name == "chinchilla":
        N, D, L = two_term_optimum(t["E"], t["A"], t["alpha"], t["B"], t["beta"], C / k)
        return {"N": N, "D": D, "loss": L}
    if law.name == "smelt":
        if "S" not in fixed:
            raise UserError("the smelt law's optimum needs a sparsity S")
        S = np.asarray(fixed["S"], dtype=float)
        F, D, L = two_term_optimum(t["E"], t["A"] * (1.0 - S) ** t["b"], t["a"], t["K"], t["c"], C)
        return {"F": F, "D": D, "loss": L}
    raise UserError(f"law {law.name!r} has no closed-form optimum")
