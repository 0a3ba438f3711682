"""``FitSettings``: every option of an approach-3 fit in one immutable object, checked once.

``fit_law``, ``fit_groups``, ``holdout`` (``scaling.fitting.holdout``) and ``simulate``
(``scaling.design.simulate``) take one; a command builds it from its options. Bad values are
``UserError``s raised when the object is made (or changed with ``replace``), before any work.
Law-dependent checks (is ``E`` a parameter of this law, is a fixed scale > 0) stay with the law:
``scaling.fitting.constraints.ParamMap.build``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from dataclasses import replace as _replace
from typing import Any, Iterable, Mapping

import numpy as np

from scaling.common.errors import UserError
from scaling.fitting.constraints import Constraints
from scaling.fitting.objective import DEFAULT_DELTA, DEFAULT_OBJECTIVE, OBJECTIVES
from scaling.fitting.result import CI_LEVEL

DEFAULT_BOOTSTRAP = 200


@dataclass(frozen=True)
class FitSettings:
    """How to fit: objective (``OBJECTIVES``) and its Huber delta, bootstrap resamples over runs and their
    seed, the interval level, the start grid (None: the law's own), fixed and tied parameters.

    ``starts`` may be given as any (M, P) array in the law's fitted space; ``fix`` as {"E": 1.7};
    ``tie`` as "alpha=beta" strings or (a, b) pairs. They are stored as tuples, so a settings object
    is hashable and never changed by its caller's array or dict.
    """

    objective: str = DEFAULT_OBJECTIVE
    huber_delta: float = DEFAULT_DELTA
    n_bootstrap: int = DEFAULT_BOOTSTRAP
    seed: int = 0
    ci_level: float = CI_LEVEL
    starts: tuple[tuple[float, ...], ...] | None = None
    fix: tuple[tuple[str, float], ...] = ()
    tie: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        # the order of the checks is the order the fitter checked them in before this object existed;
        # the level's message is the savings' and the planner's, which simulate printed before
        if not (0 < self.ci_level < 1):
            raise UserError(f"interval level must lie in (0, 1), got {self.ci_level}")
        if not _count(self.n_bootstrap):
            raise UserError(f"the number of bootstrap resamples must be >= 0, got {self.n_bootstrap}")
        if self.objective not in OBJECTIVES:
            raise UserError(f"unknown objective {self.objective!r}; choose one of: {', '.join(OBJECTIVES)}")
        if not self.huber_delta > 0:
            raise UserError(f"the Huber delta must be > 0, got {self.huber_delta}")
        if not _count(self.seed):
            raise UserError(f"the seed must be an integer >= 0, got {self.seed}")
        object.__setattr__(self, "n_bootstrap", int(self.n_bootstrap))
        object.__setattr__(self, "seed", int(self.seed))
        object.__setattr__(self, "starts", _starts(self.starts))
        object.__setattr__(self, "fix", _fixed(self.fix))
        object.__setattr__(self, "tie", _ties(self.tie))

    def replace(self, **changes: Any) -> "FitSettings":
        """A copy with ``changes`` (field names), checked again; unknown names are a TypeError."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise TypeError(f"not a fit setting: {', '.join(sorted(unknown))}")
        return _replace(self, **changes) if changes else self

    @property
    def start_grid(self) -> np.ndarray | None:
        """``starts`` as an (M, P) float array, None for the law's own grid."""
        return None if self.starts is None else np.array(self.starts, dtype=float)

    def constraints(self, shared: Iterable[str] = ()) -> Constraints:
        """The fixed and tied parameters, with ``shared`` ones of a joint fit."""
        return Constraints(fixed=dict(self.fix), ties=self.tie, shared=tuple(shared))


def settings_of(settings: FitSettings | None, changes: Mapping[str, Any]) -> FitSettings:
    """``settings`` (default ``FitSettings()``) with keyword ``changes``: how every fit function reads
    its ``settings`` argument and its keyword fields."""
    return (FitSettings() if settings is None else settings).replace(**changes)


def _count(v: Any) -> bool:
    """An integer >= 0 (a bool is not one)."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0


def _starts(starts: Any) -> tuple[tuple[float, ...], ...] | None:
    if starts is None:
        return None
    try:
        grid = np.atleast_2d(np.asarray(starts, dtype=float))
    except (TypeError, ValueError):
        raise UserError("the fit starts must be an array of numbers (starts x parameters)") from None
    if grid.ndim != 2 or grid.size == 0 or not np.isfinite(grid).all():
        raise UserError(f"the fit starts must be a non-empty finite (starts x parameters) array, got shape "
                        f"{grid.shape}")
    return tuple(tuple(float(v) for v in row) for row in grid)


def _fixed(fix: Any) -> tuple[tuple[str, float], ...]:
    items = list((fix or {}).items()) if isinstance(fix, Mapping) else list(fix or ())
    out: dict[str, float] = {}
    for name, value in items:
        # finiteness and sign depend on the law (a scale fitted as its log must be > 0): ParamMap.build
        try:
            out[str(name)] = float(value)
        except (TypeError, ValueError):
            raise UserError(f"the fixed value of {name} must be a number, got {value!r}") from None
    return tuple(out.items())


def _ties(tie: Iterable[str | tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """Ties as pairs: "alpha=beta" (or "a=b=c": a=b, a=c) strings or (a, b) pairs."""
    out: list[tuple[str, str]] = []
    for t in tie or ():
        out += list(Constraints.parse(tie=[t]).ties) if isinstance(t, str) else [(str(t[0]), str(t[1]))]
    return tuple(out)
