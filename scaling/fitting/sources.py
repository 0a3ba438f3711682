"""Where the laws of a savings, design or simulation come from, decided in one place, and the one
default-sparsity rule.

A computation on two groups' laws takes them from exactly one source: a published law set
(``scaling.fitting.reference_laws``), a fits file (``FitSet``, written by ``smelt-scale fit
--out``), or fits made here of a runs folder or points table (``fit_law`` per group, default the
``runs/`` folder of the working directory). :func:`load_laws` makes that choice and describes it
in one line (``LawSource.source``), which the results carry.

Default sparsity (smelt-form laws, L(F, D, S), evaluated at one S): a law set's own sparsities
(the ones its source reports results at); for fitted laws the median of the distinct sparsities
recorded in the fitted data of both groups (``FitResult.data_summary["sparsities"]``), rounded
to 4 decimals. One value, inside the fitted data, the same for every command: the shipped
proxy tiers each have their own sparsity, so "every recorded sparsity" would give one row (or
IsoFLOP set) per run size, and a median per group would compare the groups at different S.
Chinchilla-form laws take no sparsity (None).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from scaling.common.errors import UserError
from scaling.fitting.fit import FitResult, FitSet, fit_law
from scaling.fitting.laws import default_sparsity, get_law
from scaling.fitting.reference_laws import LawSet, load_law_set
from scaling.fitting.savings import FittedLaw, uses_sparsity
from scaling.fitting.tables import DEFAULT_FLOPS_PER_ND, Columns, group_rows, load_table, per_token_flops

DEFAULT_RUNS = Path("runs")  # relative to the working directory, as a user expects


@dataclass(frozen=True)
class LawSource:
    """The laws of some groups and where they come from.

    laws       group -> FittedLaw
    source     one line naming the source (law set and citation, fits file, or runs and settings)
    fits       the FitResults behind the laws, in group order (None for a law set)
    law_set    the LawSet (None unless the laws are published ones)
    runs_dir   the runs folder that was fitted (None unless the source is a runs folder)
    notes      what the reader of the laws must know about the source (an outdated fits file)
    """

    laws: dict[str, FittedLaw]
    source: str
    fits: tuple[FitResult, ...] | None = None
    law_set: LawSet | None = None
    runs_dir: Path | None = None
    notes: tuple[str, ...] = ()

    @property
    def smelt_form(self) -> bool:
        return any(uses_sparsity(fl.law) for fl in self.laws.values())

    def default_sparsities(self) -> tuple[float | None, ...]:
        """(None,) for chinchilla-form laws; a law set's sparsities; else the one default of
        :func:`default_sparsity` over both groups' recorded sparsities."""
        if not self.smelt_form:
            return (None,)
        if self.law_set is not None:
            return tuple(self.law_set.sparsities)
        return (default_sparsity(s for f in self.fits or () for s in f.data_summary.get("sparsities", [])),)

    def sparsities(self, given: Sequence[float] = ()) -> tuple[float | None, ...]:
        """``given`` if any (an error for chinchilla-form laws), else :meth:`default_sparsities`."""
        if given and not self.smelt_form:
            raise UserError("a sparsity applies only to smelt-form laws; these are chinchilla-form")
        return tuple(given) or self.default_sparsities()

    @property
    def noise(self) -> float | None:
        """The largest RMSE of log loss of the fits (None for a law set): the noise of the data."""
        rmse = [f.diagnostics.get("rmse_log") for f in self.fits or ()]
        return max((float(r) for r in rmse if r is not None), default=None)


def read_points(path: Path, *, is_default: bool = False, warn: Callable[[str], None] | None = None,
                where: Sequence[str] = (), columns: Columns | None = None) -> tuple[pd.DataFrame, int]:
    """Canonical points of a runs folder or table, and the number of rows read before ``where``;
    on the default folder, errors say what to do. ``where``: row filters on the table's own columns,
    applied as it is read (``fit --where``'s: :class:`scaling.fitting.tables.Columns`); ``columns``:
    which column is what (``fit``'s column options), its ``where`` used when given."""
    if columns is None:
        columns = Columns(where=tuple(where))
    where = columns.where
    hint = "train runs into it, or give another runs folder, a fits file or a law set"
    if is_default and (not path.is_dir() or not any(path.iterdir())):
        raise UserError(f"the default runs folder {path} is missing or empty; {hint}")
    try:
        table = load_table(path, columns)
    except UserError as exc:   # a filter that keeps nothing is not an empty folder: no hint then
        raise UserError(f"{exc}; {hint}" if is_default and not where else str(exc)) from None
    if warn is not None:
        for m in table.messages():
            warn(m)
    return table.points, table.rows_read


def assumed_compute_note(points: pd.DataFrame) -> str | None:
    """A warning when no point records its compute or FLOPs per token and several groups are
    compared: their compute is then C = 6 N D for all (``scaling.fitting.tables.token_cost``), while
    a looped or sparse model spends other FLOPs per parameter and token, and a saving between
    groups moves with that ratio (a 10% higher k is about a 5-point larger saving)."""
    if points["group"].astype(str).nunique() < 2 or np.isfinite(per_token_flops(points)).any():
        return None
    return (f"no point records its compute or FLOPs per token: every group's compute is taken as "
            f"C = {DEFAULT_FLOPS_PER_ND:g} N D, but a looped or MoE model spends other FLOPs per "
            "parameter and token, and the savings between groups move with that; add a flops (or "
            "flops_per_token) column")


def fit_runs(path: Path, law: str, groups: Sequence[str], n_bootstrap: int, seed: int, *,
             is_default: bool = False, warn: Callable[[str], None] | None = None,
             points: pd.DataFrame | None = None) -> list[FitResult]:
    """Fit ``groups`` of a runs folder or points table (or of ``points`` already read from it): one
    FitResult per group, in order. The fits' own warnings go to ``warn`` as "fit of <group>: ..."."""
    if points is None:
        points, _ = read_points(path, is_default=is_default, warn=warn)
    present = sorted(points["group"].unique(), key=str)
    out = []
    for g in groups:
        if g not in present:
            raise UserError(f"no runs of group {g!r} in {path}; groups: {', '.join(map(str, present))}")
        sub = group_rows(points, g)
        fit = fit_law(sub, law, group=g, n_bootstrap=n_bootstrap, seed=seed)
        if warn is not None:
            for w in fit.diagnostics.get("warnings", []):
                warn(f"fit of {g}: {w}")
        out.append(fit)
    return out


def load_laws(groups: Sequence[str], *, runs: Path | None = None, fits: Path | None = None,
              law_set: str | None = None, law: str = "chinchilla", n_bootstrap: int = 0, seed: int = 0,
              default: str = "runs", warn: Callable[[str], None] | None = None,
              points: pd.DataFrame | None = None) -> LawSource:
    """The laws of ``groups`` from the one source given: ``runs`` (a runs folder or points table,
    fitted here with ``law``, ``n_bootstrap`` resamples and ``seed``), ``fits`` (a fits file) or
    ``law_set`` (a published set's name). With none given, ``default`` decides: "runs" fits
    ``DEFAULT_RUNS``, "law_set" takes the paper's laws. UserError for two sources at once."""
    given = [name for name, v in (("a runs folder", runs), ("a fits file", fits), ("a law set", law_set))
             if v is not None]
    if len(given) > 1:
        raise UserError(f"give one source of laws, not {' and '.join(given)}")
    if default not in ("runs", "law_set"):
        raise ValueError(f"default must be 'runs' or 'law_set', got {default!r}")
    if not given and default == "law_set":
        law_set = "paper"
    if law_set is not None:
        ls = load_law_set(law_set)
        source = f"law set {ls.name!r}: {ls.citation} {ls.provenance}"
        return LawSource({g: ls.fitted(g) for g in groups}, source, law_set=ls)
    notes: list[str] = []
    if fits is not None:
        fs = FitSet.load(fits)
        pair = [fs.get(g) for g in groups]
        source, runs_dir = f"fits file {fits}", None
        for f in pair:
            k = f.data_summary.get("flops_per_param_k")
            old = get_law(f.law).budget_uses_k and "flops_per_sqrt_param" not in f.data_summary
            if old and k is not None and not 5 <= k <= 8:
                notes.append(f"{fits}: the fit of {f.group} was written before the per-token FLOPs model: "
                             f"its compute is C = k N D with k = {k:.3g}, the median FLOPs/(N D) of its "
                             "points, which can put the frontier far off; refit (smelt-scale fit --out) for "
                             "C = F(N) D")
        for n in notes:
            if warn is not None:
                warn(n)
    else:
        path = DEFAULT_RUNS if runs is None else runs
        pair = fit_runs(path, law, groups, n_bootstrap, seed, is_default=runs is None, warn=warn,
                        points=points)
        source = f"{law} fits of {path} ({n_bootstrap} bootstrap resamples, seed {seed})"
        runs_dir = path if path.is_dir() else None
    laws = {g: FittedLaw.from_fit(f, name=g, source=source) for g, f in zip(groups, pair)}
    return LawSource(laws, source, fits=tuple(pair), runs_dir=runs_dir, notes=tuple(notes))


__all__ = ["DEFAULT_RUNS", "LawSource", "assumed_compute_note", "default_sparsity", "fit_runs", "load_laws",
           "read_points"]
