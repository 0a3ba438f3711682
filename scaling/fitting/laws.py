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

import math
from dataclasses import dataclass, field
from itertools import product
from typing import Any, Callable, Iterable, Mapping

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
    # A bootstrap fit of noisy data can reach extreme exponents: the optimum then over- or
    # underflows to inf/0 (or nan), which every caller already treats as "no finite optimum";
    # numpy's RuntimeWarnings about it would only reach the user as noise (issue 29).
    with np.errstate(over="ignore", divide="ignore", invalid="ignore", under="ignore"):
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
        size_input: the model-size input the compute budget is spent on (N, or F per-token FLOPs).
        frontier_terms: (theta by name (arrays), fixed inputs) -> (E, P, p, Q, q) of the law written
            as L = E + P x^-p + Q y^-q along the budget, x = the size input, y = tokens D.
        budget_uses_k: True when C = k x D (x = parameters, k FLOPs per parameter per token); False
            when x is already FLOPs per token, C = x D.
        fixed_inputs: further inputs held fixed along the frontier (the smelt law's sparsity S).
        allocation_exponents: the keys of ``derived`` holding the exponents of x* ~ C^. and D* ~ C^.
        params_per_size: x -> parameter-equivalents (tokens per parameter D*/that): N itself, or
            F/6 for per-token FLOPs (a dense model spends 6 FLOPs per parameter per token).
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
    size_input: str = "N"
    frontier_terms: Callable[[Mapping[str, np.ndarray], Mapping[str, np.ndarray]], tuple] | None = \
        field(default=None, repr=False)
    budget_uses_k: bool = True
    fixed_inputs: tuple[str, ...] = ()
    allocation_exponents: tuple[str, str] = ("a", "b")
    params_per_size: Callable[[np.ndarray], np.ndarray] = field(default=lambda x: x, repr=False)

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


def _chinchilla_frontier(t: Mapping[str, np.ndarray], fixed: Mapping[str, np.ndarray]) -> tuple:
    return t["E"], t["A"], t["alpha"], t["B"], t["beta"]


def _smelt_frontier(t: Mapping[str, np.ndarray], fixed: Mapping[str, np.ndarray]) -> tuple:
    """At fixed sparsity S the law is E + [A (1-S)^b] F^-a + K D^-c."""
    S = np.asarray(fixed["S"], dtype=float)
    return t["E"], t["A"] * (1.0 - S) ** t["b"], t["a"], t["K"], t["c"]


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
        size_input="N", frontier_terms=_chinchilla_frontier, budget_uses_k=True,
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
        size_input="F", frontier_terms=_smelt_frontier, budget_uses_k=False, fixed_inputs=("S",),
        allocation_exponents=("f_exponent", "d_exponent"),
        params_per_size=lambda F: F / 6.0,
    ),
}


def get_law(name: str) -> Law:
    try:
        return LAWS[name]
    except KeyError:
        raise UserError(f"unknown law {name!r}; choose one of: {', '.join(LAWS)}") from None


# -- compute-optimal frontier ------------------------------------------------------------------
@dataclass(frozen=True)
class Frontier:
    """Compute-optimal point(s) of one law: arrays broadcast from theta (..., P) and C.

    size is the law's size input at the optimum (N* for chinchilla, F* in FLOPs/token for smelt),
    tokens is D*, loss is L* (nats/token), tokens_per_param is D* / ``law.params_per_size(size)``.
    """

    size_name: str
    compute: np.ndarray
    size: np.ndarray
    tokens: np.ndarray
    loss: np.ndarray
    tokens_per_param: np.ndarray

    def as_dict(self) -> dict[str, np.ndarray]:
        """{size_name: x*, "D": D*, "loss": L*}."""
        return {self.size_name: self.size, "D": self.tokens, "loss": self.loss}


def _fixed(law: Law, S: object) -> dict[str, np.ndarray]:
    given = {"S": S}
    missing = [k for k in law.fixed_inputs if given.get(k) is None]
    if missing:
        raise UserError(f"the {law.name}-form law's optimum needs {', '.join(missing)} "
                        "(the sparsity held fixed along the frontier)")
    return {k: np.asarray(given[k], dtype=float) for k in law.fixed_inputs}


@dataclass(frozen=True)
class TokenCost:
    """Training FLOPs per token of a model of size x (x = N, non-embedding active parameters):
    F(x) = k x + e sqrt(x) + c, all three >= 0, so that C = F(N) D.

    Kaplan et al. (2020, table 1) count 6 N per token for the parameter matmuls (k = 6, e = c = 0,
    the ``C = 6 N D`` of Hoffmann et al. 2022). A real family adds terms that grow more slowly than
    N: the output layer (6 V d_model per token) and the attention scores (about 12 n_layers
    seq_len d_attn per token, forward and backward). At the paper's sizes they are a few percent of
    6 N; at CPU-proxy sizes they are most of the cost (FLOPs/(N D) from 14 to 340 in ``runs/``), so
    C = k N D with one k would spend each budget on a different model than the one trained.
    ``scaling.fitting.tables.token_cost`` fits (k, e, c) to the recorded FLOPs per token of the
    fitted points; F(N) = k N when nothing is recorded or when F/N is constant.
    """

    k: float = 6.0
    e: float = 0.0
    c: float = 0.0
    max_rel_error: float = 0.0   # of the model on the points it was fitted to

    def __post_init__(self) -> None:
        for name in ("k", "e", "c"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise UserError(f"FLOPs per token: {name} must be finite and >= 0, got {v}")
        if not self.k > 0:
            raise UserError(f"FLOPs per token: the per-parameter term k must be positive, got {self.k}")

    @classmethod
    def of(cls, value: "TokenCost | float") -> "TokenCost":
        """A TokenCost as it is, a number k as F(x) = k x."""
        return value if isinstance(value, TokenCost) else cls(k=float(value))

    @property
    def linear(self) -> bool:
        """F(x) = k x: the closed-form frontier holds."""
        return self.e == 0.0 and self.c == 0.0

    def __call__(self, x: np.ndarray | float) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        return self.k * x + self.e * np.sqrt(x) + self.c

    def log_slope(self, x: np.ndarray) -> np.ndarray:
        """d log F / d log x = (k x + e sqrt(x) / 2) / F(x), in (0, 1]."""
        x = np.asarray(x, dtype=float)
        return (self.k * x + 0.5 * self.e * np.sqrt(x)) / self(x)

    def describe(self, x: str = "N") -> str:
        if self.linear:
            return f"{self.k:.3g} {x}"
        parts = [f"{self.k:.3g} {x}"] + ([f"{self.e:.3g} sqrt({x})"] if self.e else []) + \
            ([f"{self.c:.3g}"] if self.c else [])
        return " + ".join(parts)

    def summary(self) -> dict[str, float]:
        """The data-summary keys of a fit (``FitResult.data_summary``)."""
        return {"flops_per_param_k": self.k, "flops_per_sqrt_param": self.e, "flops_per_token_offset": self.c,
                "flops_model_max_error": self.max_rel_error}

    @classmethod
    def from_summary(cls, summary: Mapping[str, Any]) -> "TokenCost":
        """From a fit's data summary; a file written before the e, c terms existed reads as k N."""
        return cls(k=float(summary.get("flops_per_param_k") or 6.0),
                   e=float(summary.get("flops_per_sqrt_param") or 0.0),
                   c=float(summary.get("flops_per_token_offset") or 0.0),
                   max_rel_error=float(summary.get("flops_model_max_error") or 0.0))


_FRONTIER_STEPS = 90      # bisection steps in log x over a 120-nat bracket: width 1e-25 nats
_FRONTIER_BRACKET = 120.0  # nats of log x below x = C/k searched by the bisection


def _general_optimum(E, P, p, Q, q, C, cost: TokenCost):
    """Minimise L = E + P x^-p + Q (C / F(x))^-q over x, F = ``cost`` (not linear).

    With u = log x, P e^(-p u) is convex and Q (F(e^u) / C)^q = Q exp(q (log F(e^u) - log C)) is
    convex too (log F(e^u) is a log-sum-exp of affine functions of u), so L is convex in u and its
    derivative, -p P x^-p + q Q (F/C)^q dlogF/dlogx, crosses zero once: bisection on its sign,
    compared in logs (no overflow for any bootstrap exponent). The bracket's top is x = C/k (then
    D < 1 token); an optimum beyond it is clamped there.
    """
    E, P, p, Q, q, C = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in (E, P, p, Q, q, C)))
    with np.errstate(over="ignore", divide="ignore", invalid="ignore", under="ignore"):
        hi = np.log(C / cost.k)
        lo = hi - _FRONTIER_BRACKET
        logPp, logQq, logC = np.log(p * P), np.log(q * Q), np.log(C)

        def rising(u: np.ndarray) -> np.ndarray:
            x = np.exp(u)
            return logQq + q * (np.log(cost(x)) - logC) + np.log(cost.log_slope(x)) > logPp - p * u

        for _ in range(_FRONTIER_STEPS):
            mid = 0.5 * (lo + hi)
            up = rising(mid)
            hi = np.where(up, mid, hi)
            lo = np.where(up, lo, mid)
        x = np.exp(0.5 * (lo + hi))
        y = C / cost(x)
        L = E + P * x ** (-p) + Q * y ** (-q)
        bad = ~(np.isfinite(logPp) & np.isfinite(logQq) & np.isfinite(logC) & np.isfinite(L))
        nan = np.full(x.shape, np.nan)
        return np.where(bad, nan, x), np.where(bad, nan, y), np.where(bad, nan, L)


def _terms(law: Law, theta: Mapping[str, float] | np.ndarray, S: object) -> tuple:
    """(E, P, p, Q, q) of the law along a budget (``Law.frontier_terms``); theta may be (..., P)."""
    if law.frontier_terms is None:
        raise UserError(f"law {law.name!r} has no closed-form frontier")
    arr = law.theta_array(theta)
    return law.frontier_terms({name: arr[..., i] for i, name in enumerate(law.params)}, _fixed(law, S))


def _budget_cost(law: Law, cost: TokenCost | float) -> TokenCost:
    """F(x) with C = F(x) D: ``cost`` for a law whose size input is parameters, x itself (the smelt
    form, whose size input is the FLOPs per token) otherwise."""
    return TokenCost.of(cost) if law.budget_uses_k else TokenCost(k=1.0)


def frontier(law: Law, theta: Mapping[str, float] | np.ndarray, C: np.ndarray | float, *,
             cost: TokenCost | float = 6.0, S: float | np.ndarray | None = None) -> Frontier:
    """Compute-optimal allocation and loss L*(C) of any registry law.

    Every law here is, along a budget, L = E + P x^-p + Q y^-q (``Law.frontier_terms``), x the size
    input and y = D tokens. Per-token FLOPs as the size input (smelt form): x y = C exactly. Parameters
    as the size input (chinchilla form): y = C / F(x) with F = ``cost`` (``TokenCost``; a number k
    means F = k x, k = 6 by Kaplan et al. 2020). For F = k x the optimum is Lagrange's closed form
    (Hoffmann et al. 2022, eq. 4): x* = G (C/k)^(q/(p+q)), G = (p P / (q Q))^(1/(p+q)),
    y* = (C/k) / x*; for F with a sqrt or constant term, the unique minimum of the convex profile in
    log x (``_general_optimum``). theta may be (..., P) (bootstrap samples) and broadcasts against C.
    """
    E, P, p, Q, q = _terms(law, theta, S)
    C = np.asarray(C, dtype=float)
    cost = TokenCost.of(cost)
    if law.budget_uses_k and not cost.linear:
        x, y, L = _general_optimum(E, P, p, Q, q, C, cost)
    else:
        x, y, L = two_term_optimum(E, P, p, Q, q, C / cost.k if law.budget_uses_k else C)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore", under="ignore"):  # as above
        return Frontier(law.size_input, C, x, y, L, y / law.params_per_size(x))


def frontier_is_exact(law: Law, log_c: np.ndarray, log_x: np.ndarray, cost: TokenCost | float = 6.0
                      ) -> np.ndarray:
    """Where ``frontier`` at budget e^log_c returns the optimum e^log_x itself: everywhere for the
    closed forms; for a non-linear F(N) where log x lies inside the bracket ``_general_optimum``
    searches (an optimum outside it, under one token or 120 nats below, is clamped to its edge)."""
    cost = TokenCost.of(cost)
    log_c, log_x = np.asarray(log_c, dtype=float), np.asarray(log_x, dtype=float)
    if not (law.budget_uses_k and not cost.linear):
        return np.ones(np.broadcast_shapes(log_c.shape, log_x.shape), dtype=bool)
    top = log_c - np.log(cost.k)
    return (log_x <= top) & (log_x >= top - _FRONTIER_BRACKET)


def frontier_by_size(law: Law, theta: Mapping[str, float] | np.ndarray, log_x: np.ndarray | float, *,
                     cost: TokenCost | float = 6.0, S: float | np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """The frontier read the other way: (log C, L*) of the budget whose optimal size is x = e^log_x.

    At the optimum of L = E + P x^-p + Q y^-q along y = C / F(x) (``frontier``), the derivative in
    log x vanishes: p P x^-p = q Q y^-q s(x), s = d log F / d log x (``TokenCost.log_slope``; 1 when
    F = k x, and F(x) = x, s = 1, for the smelt form, whose budget is x y = C). Hence
    y^-q = p P x^-p / (q Q s), so L* = E + P x^-p (1 + p / (q s)) and
    log C = log F(x) + (log(q Q s) + p log x - log(p P)) / q, both explicit in x. Both are monotone
    (x* grows with C because the profile is convex in log x; s is non-decreasing, log F being convex
    in log x): L* falls and C rises with x, so a loss target is met by one bisection in x, not a
    bisection in C around a bisection in x. Logs throughout: no overflow for bootstrap exponents.
    theta may be (..., P) and broadcasts against log_x.
    """
    E, P, p, Q, q = _terms(law, theta, S)
    cost = _budget_cost(law, cost)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore", under="ignore"):
        u = np.asarray(log_x, dtype=float)
        x = np.exp(u)
        s = cost.log_slope(x)
        log_c = np.log(cost(x)) + (np.log(q * Q) + np.log(s) + p * u - np.log(p * P)) / q
        loss = E + P * np.exp(-p * u) * (1.0 + p / (q * s))
    return log_c, loss


def frontier_numeric(law: Law, theta: np.ndarray | Mapping[str, float], C: float, *,
                     cost: TokenCost | float = 6.0, S: float | None = None) -> tuple[float, float, float]:
    """(size*, D*, L*) by minimising ``law.predict`` along the budget numerically (a cross-check).

    Scans log x over [0, log(C/k)] (x = the size input, D = C / F(x) tokens), then refines the best
    grid cell with a bounded Brent search. Independent of the closed form, of the bisection and of
    ``frontier_terms``.
    """
    from scipy.optimize import minimize_scalar

    theta = law.theta_array(theta)
    cost = _budget_cost(law, cost)
    fixed = _fixed(law, S)
    top = np.log(C / cost.k)

    def loss(logx: np.ndarray) -> np.ndarray:
        x = np.exp(logx)
        inputs = {law.size_input: x, "D": C / cost(x)}
        inputs.update({name: np.full_like(x, v) for name, v in fixed.items()})
        return law.predict(theta, **inputs)

    grid = np.linspace(0.0, top, 2001)
    i = int(np.argmin(loss(grid)))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
    res = minimize_scalar(lambda z: float(loss(np.array([z]))[0]), bounds=(lo, hi), method="bounded",
                          options={"xatol": 1e-12})
    x = float(np.exp(res.x))
    return x, C / float(cost(x)), float(res.fun)


def optimal(law: Law, theta: Mapping[str, float] | np.ndarray, C: np.ndarray | float,
            cost: TokenCost | float = 6.0, **fixed: object) -> dict[str, np.ndarray]:
    """``frontier(...).as_dict()``: {"N" or "F": x*, "D": D*, "loss": L*} (fixed inputs as keywords)."""
    return frontier(law, theta, C, cost=cost, S=fixed.get("S")).as_dict()


SPARSITY_DECIMALS = 4  # the default sparsity is rounded to this (scaling.fitting.sources)


def default_sparsity(recorded: Iterable[float]) -> float:
    """The default sparsity of fitted smelt-form laws: the median of the distinct recorded
    sparsities (of both groups together), rounded to 4 decimals (the rule: scaling.fitting.sources)."""
    seen = sorted({float(s) for s in recorded})
    if not seen:
        raise UserError("a smelt-form law needs a sparsity and the fitted data record none: give one")
    return round(float(np.median(seen)), SPARSITY_DECIMALS)
