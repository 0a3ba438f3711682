"""Published scaling laws shipped as named reference sets (``smelt-scale savings --law-set NAME``).

``paper``: the SMELT paper's two fits (arXiv 2609.01343 v1), one per architecture, of
L(F, S, D) = E + A (1-S)^b / F^a + K / D^c. The coefficients, the fitted compute range
(1.3e19 to 2.2e21 FLOPs) and the published figures come from third-party reading notes of the
v1 PDF (see ``scaling/data/paper_laws.json``: citation and provenance), not from the PDF itself.

What ``scaling.fitting.savings`` derives from them (checked in tests/test_savings.py): savings
(candidate-budget) 9.86 / 7.70 / 6.66% at 1e20 and 17.94 / 15.68 / 14.57% at 1e21 for
S = 0.85 / 0.95 / 0.97, published 6.8-10.0% and 14.7-18.0%. Optimal tokens per dense-equivalent
parameter D/(F/6) at 1e21: 56.5 / 78.2 / 91.1 for the Baseline law (the notes' 56 / 78 / 91) and
56.1 / 75.3 / 86.4 for the SMELT law, both inside the published 56-91 ("the same for both").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping

from scaling.common.errors import UserError
from scaling.fitting.laws import get_law
from scaling.fitting.savings import FittedLaw

LAW_SETS = {"paper": "paper_laws.json"}


@dataclass(frozen=True)
class LawSet:
    """A named set of published fits: group -> parameters, with where they come from.

    compute_range: (min, max) total training FLOPs of the fitted runs. sparsities: the
    sparsities the source reports results at. published: the source's headline figures.
    """

    name: str
    law: str
    groups: Mapping[str, Mapping[str, float]]
    citation: str
    provenance: str
    compute_range: tuple[float, float] | None
    sparsities: tuple[float, ...]
    published: Mapping[str, Any]
    n_points: int | None = None

    def fitted(self, group: str) -> FittedLaw:
        """One group as a FittedLaw (no bootstrap samples: the source gives no intervals)."""
        if group not in self.groups:
            raise UserError(f"unknown group {group!r} in law set {self.name!r}; "
                            f"choose one of: {', '.join(self.groups)}")
        law = get_law(self.law)
        lo, hi = self.compute_range or (None, None)
        return FittedLaw(name=group, law=law, theta=law.theta_array(self.groups[group]),
                         compute_min=lo, compute_max=hi, source=f"law set {self.name!r}: {self.citation}",
                         sparsities=tuple(self.sparsities))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "law": self.law, "groups": {g: dict(p) for g, p in self.groups.items()},
                "citation": self.citation, "provenance": self.provenance,
                "compute_range": None if self.compute_range is None else list(self.compute_range),
                "sparsities": list(self.sparsities), "published": dict(self.published),
                "n_points": self.n_points}


@lru_cache(maxsize=None)
def load_law_set(name: str) -> LawSet:
    """The named reference law set; one-line error for an unknown name."""
    if name not in LAW_SETS:
        raise UserError(f"unknown law set {name!r}; choose one of: {', '.join(LAW_SETS)}")
    raw = json.loads(resources.files("scaling").joinpath("resources", LAW_SETS[name]).read_text())
    rng = raw.get("compute_range")
    return LawSet(
        name=raw["name"], law=raw["law"],
        groups={g: {k: float(v) for k, v in p.items()} for g, p in raw["groups"].items()},
        citation=raw["citation"], provenance=raw["provenance"],
        compute_range=None if rng is None else (float(rng[0]), float(rng[1])),
        sparsities=tuple(float(s) for s in raw.get("sparsities", ())),
        published=raw.get("published", {}), n_points=raw.get("n_points"),
    )
