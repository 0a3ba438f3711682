"""The savings of ``smelt-scale savings``: the observed frontiers (the envelope) and the fitted or
published laws, combined by a method (auto, envelope or law) into one :class:`SavingsResult`.

auto: laws that are identified and fit their points answer at every budget, and inside the data
the envelope cross-checks them (a warning per budget where the intervals do not overlap); laws
that are not give no number beyond their data by default (``WITHHOLD_DECADES`` = 0), the
envelope answers inside, and where it cannot (a frontier never reaches the other's loss) nobody
does: budget by budget, so a budget gets the same answer whatever other budgets are asked (before
2026-12-07, when the envelope answered none of the budgets asked, the unidentified laws answered
them all, inside the data too). Laws from a fits file come without runs, so there is no envelope:
inside their data nobody answers either (refusal ``distrusted-inside``; before 2026-12-07 evening
the laws did, with a warning). envelope: only the envelope. law: only the laws. A law that is not
identified gives no number beyond ``max_extrapolation`` decades past its data
(:func:`scaling.fitting.savings.withhold_unidentified`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd

from scaling.common.errors import UserError
from scaling.fitting.envelope import observed_savings
from scaling.fitting.savings import (
    SavingsResult,
    SavingsRow,
    disagreements,
    law_distrust,
    sparsity_warning,
    withheld_warnings,
    withhold_unidentified,
)
from scaling.fitting.savings_sweep import NoBudgetAnswered, savings_over
from scaling.fitting.sources import assumed_compute_note, load_laws

METHODS = ("auto", "envelope", "law")


def law_savings(ref: Any, cand: Any, budgets: np.ndarray, **kwargs: Any):
    """``savings`` at every budget it can answer, and the refused rows of the others (the two
    frontiers never reach each other's loss within the bisection bracket), instead of one error
    for the whole command."""
    try:
        return savings_over(ref, cand, budgets, **kwargs)
    except NoBudgetAnswered as exc:   # each budget keeps its own reason
        empty = SavingsResult(reference=ref.name, candidate=cand.name,
                              convention=kwargs.get("convention", "candidate-budget"), rows=())
        return empty, exc.skipped


def _refuse_inside(result: SavingsResult, distrust: str) -> SavingsResult:
    """The default method's rule for laws it distrusts (not identified, or misfitting), when it has
    no runs to read the observed frontiers from (``--fits``): inside the data only those frontiers
    may answer, so nobody does. Measured on the shipped study's fits (2026-12-07, 30 resamples):
    the unidentified laws gave 10.5% [6.7, 17.3] at 1.12e12 where the runs' envelope gives −3.3%
    [−7.2, 8.8]. Rows beyond the data were already withheld or marked by
    :func:`scaling.fitting.savings.withhold_unidentified`; ``--method law`` keeps the laws' number."""
    rows = []
    for r in result.rows:
        inside = (r.method == "law" and r.savings is not None and not r.extrapolated
                  and (r.extrapolation_decades is None or r.extrapolation_decades <= 0))
        rows.append(SavingsRow.refused(
            r.budget, refusal="distrusted-inside", method="law", sparsity=r.sparsity,
            extrapolation_decades=r.extrapolation_decades,
            reason=f"inside the data only the observed frontiers answer for laws they distrust "
                   f"({distrust}), and a fits file has none: give the runs (--runs PATH), or "
                   "--method law for the laws' number") if inside else r)
    gone = withheld_warnings(result.rows, rows)
    return replace(result, rows=tuple(rows), warnings=tuple(w for w in result.warnings if w not in gone))


def merge(rows: list[SavingsRow]) -> list[SavingsRow]:
    """Rows by budget, then sparsity."""
    return sorted(rows, key=lambda r: (r.budget, -1.0 if r.sparsity is None else r.sparsity))


def answer_savings(reference: str, candidate: str, budgets: np.ndarray, *, method: str = "auto",
                   points: pd.DataFrame | None = None, path: Path | None = None, runs: Path | None = None,
                   fits: Path | None = None, law_set: str | None = None, law: str = "chinchilla",
                   convention: str = "candidate-budget", n_bootstrap: int = 0, seed: int = 0,
                   level: float = 0.95, sparsities: Sequence[float] = (), max_extrapolation: float,
                   extrapolate: bool = False, warn: Callable[[str], None] | None = None,
                   where: Sequence[str] = (), n_read: int | None = None) -> SavingsResult:
    """The savings at ``budgets`` by ``method`` (see the module doc). ``points`` (read from ``path``)
    feed the envelope and the fits of ``runs``; ``fits`` or ``law_set`` name the laws instead
    (:func:`scaling.fitting.sources.load_laws`). ``where``: the row filters the points were read with
    (:func:`scaling.fitting.sources.read_points`), recorded in the result with the counts (``n_read``:
    the rows read before them; default ``len(points)``); the envelope
    and the fits both see only the points kept. Each warning goes to ``warn`` once, as it arises,
    and into the result's ``warnings``."""
    shown: dict[str, None] = {}  # ordered set: each warning once

    def warn_once(message: str) -> None:
        if message not in shown:
            shown[message] = None
            if warn is not None:
                warn(message)

    where = (where,) if isinstance(where, str) else tuple(where)
    if where and points is None:
        raise UserError("--where filters the runs' points: it needs runs (--runs PATH or the default "
                        "runs/), not " + ("--law-set" if law_set is not None else "--fits"))
    if sparsities and method == "envelope":
        raise UserError("--sparsity is a law's input; --method envelope reads no law")
    if sparsities and law_set is None and fits is None and law != "smelt":
        # known before any fit: the laws fitted here have the form --law names
        raise UserError("a sparsity applies only to smelt-form laws; --law chinchilla fits none "
                        "(give --law smelt)")
    n_points = None if points is None else (len(points) if n_read is None else n_read)
    assumed = None if points is None else assumed_compute_note(points)
    if assumed:
        warn_once(assumed)
    C = budgets
    rows: list[SavingsRow] = []
    checks: list[SavingsRow] = []
    sources: list[str] = []
    laws: dict[str, str] = {}
    env: tuple[SavingsRow, ...] = ()

    def envelope(at: Sequence[float] | None) -> tuple[SavingsRow, ...]:
        if points is None or method == "law":
            return ()
        return observed_savings(points, path, reference, candidate, C, sparsities=at, convention=convention,
                                n_bootstrap=n_bootstrap, seed=seed, level=level)

    env_source = (f"envelope: observed frontiers of {path} ({n_bootstrap} bootstrap resamples over run "
                  f"pairs, seed {seed})")
    if method == "envelope":
        env = envelope(None)
        rows += env
        sources.append(env_source)
    else:
        fit_notes: list[str] = []
        src = load_laws((reference, candidate), runs=runs, fits=fits, law_set=law_set, law=law,
                        n_bootstrap=n_bootstrap, seed=seed, warn=fit_notes.append, points=points)
        # the fits' own warnings are `smelt-scale fit`'s to print (the main job runs both): here
        # only whether the laws may answer, in one line below
        ref, cand = src.laws[reference], src.laws[candidate]
        at_sparsities = src.sparsities(sparsities)  # refused now, even if the envelope answers every budget
        outside = sparsity_warning(ref, cand, at_sparsities)
        if outside:
            warn_once(outside)
        # per shared sparsity where the study trained several (envelope.observed_savings)
        env = envelope([s for s in at_sparsities if s is not None] or None)
        for note in src.notes:  # about the source itself: the reader must see these
            warn_once(note)
        distrust = law_distrust({f.group: getattr(f, "diagnostics", None) for f in (src.fits or ())})
        if method == "auto" and distrust and points is not None:
            # the laws do not hold: inside the data the observed frontiers answer, and where
            # they cannot (a frontier never reaches the other's loss) nobody does. Budget by
            # budget, whatever else was asked: one budget gets one answer
            # one envelope per shared sparsity (its rows carry S): then a (budget, S) is answered
            # by one method; a pooled envelope answers a budget for every S
            split = any(r.sparsity is not None for r in env)
            answered = [r for r in env if r.savings is not None]
            inside = [r for r in env if r.savings is None and r.refusal != "outside-data"]
            rows += answered
            rows += [SavingsRow.refused(r.budget, f"{r.reason}; the laws are not identified ({distrust})",
                                        refusal=r.refusal or "not-reached", method="envelope",
                                        sparsity=r.sparsity)
                     for r in inside]
            done_rows = answered + inside
            done_at = {(float(r.budget), round(r.sparsity, 4)) for r in done_rows if r.sparsity is not None}
            done_budgets = {float(r.budget) for r in done_rows}

            def is_done(budget: float, s: float | None) -> bool:
                if split and s is not None:
                    return (float(budget), round(s, 4)) in done_at
                return float(budget) in done_budgets

            done = bool(done_budgets)
            law_budgets = np.array([c for c in C if not all(is_done(c, s) for s in at_sparsities)])
            if done:
                sources.append(env_source)
                warn_once(f"inside the data the envelope answers, not the laws: {distrust} "
                          "(`smelt-scale fit` for the details)")
        else:
            law_budgets, done = C, False
            checks = [r for r in env if r.savings is not None]
        if law_budgets.size:
            law_res, unanswered = law_savings(ref, cand, law_budgets, sparsities=at_sparsities,
                                              convention=convention, level=level, source=src.source)
            if done:   # a (budget, S) the envelope answered or refused inside the data
                law_res = replace(law_res, rows=tuple(r for r in law_res.rows
                                                      if not is_done(r.budget, r.sparsity)))
                unanswered = [r for r in unanswered if not is_done(r.budget, r.sparsity)]
            tops = [x for x in (ref.compute_max, cand.compute_max) if x]
            rows += [SavingsRow.refused(
                r.budget, r.reason if not distrust else f"laws not identified ({distrust}); and {r.reason}",
                refusal=r.refusal, method="law", sparsity=r.sparsity,
                extrapolation_decades=float(np.log10(r.budget / min(tops))) if tops else None)
                for r in unanswered]
            law_res = withhold_unidentified(law_res, ref, cand, max_decades=max_extrapolation,
                                            extrapolate=extrapolate)
            if method == "auto" and distrust and points is None:
                law_res = _refuse_inside(law_res, distrust)
            if distrust and any(r.savings is not None for r in law_res.rows):
                warn_once(f"the laws answer although {distrust} (`smelt-scale fit` for the details)")
            rows += law_res.rows
            laws = dict(law_res.laws)
            sources.append(f"law: {src.source}")
            for w in law_res.warnings:
                warn_once(w)
            if checks:
                sources.append(f"cross-check, {env_source}")
                for w in disagreements(law_res.rows, checks):
                    warn_once(w)
    return SavingsResult(reference=reference, candidate=candidate, convention=convention,
                         rows=tuple(merge(rows)), ci_level=level, warnings=tuple(shown), laws=laws,
                         source="; ".join(sources), cross_checks=tuple(checks), where=where,
                         n_points=n_points, n_points_kept=None if points is None else len(points))
