"""Constraints of a fit: parameters fixed to a value, tied equal (``alpha=beta``), or shared by all
groups of a joint fit.

The optimiser then works on the free vector u, with every group's fitted vector an affine map of
it, z_g = M_g u + c_g (``ParamMap``); the design becomes G M_g and c_g an offset (``_design``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from scaling.common.errors import UserError
from scaling.fitting.laws import Law


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
