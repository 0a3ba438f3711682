"""Law-free compute savings inside the data: the observed loss-compute frontier of each architecture.

Points first (``budget_points``): the runs of one configuration (the same architecture, N, D,
sparsity and FLOPs per token, numbers equal to 9 digits: its seeds) count as one point, at their
mean loss; a frontier taken over single runs is a minimum over seeds, which sinks with every seed
added (by about 1.35 s.d. for 7 seeds of normal noise) and makes the saving depend on where the
extra seeds were spent. Where the table records seeds and two runs of a configuration share one
(an lr sweep in one folder: they differ in what the table does not record), its runs stay apart,
each its own point (``scaling.fitting.tables.seed_replicates``); runs without a recorded seed count
as seeds: keep one study per folder. Then computes within
``BUDGET_TOLERANCE`` (5%) of the smallest compute not yet merged count as one budget (greedy
windows, ``compute_buckets``), at their geometric mean, with the lowest loss among them: an IsoFLOP
design's sizes miss their budget by up to about 1% (tokens come in whole batches), and a frontier
drawn through those offsets is steep inside each budget and answers a budget in the cluster by
which size happened to land below it. Budgets a quarter-decade apart (78%) never merge; the merge
moves a point by at most 5% of compute, and both frontiers alike. Without a configuration key every
point is its own configuration.

Frontier (per architecture): the lower envelope of those (C, L) points, C = total training
FLOPs of a point (recorded FLOPs, else F*D, else k N D: ``scaling.fitting.tables.total_flops``).
Its vertices are the Pareto points (C_i, L_i) whose loss is strictly below that of every point with
less compute; between vertices log L is linear in log C. It is defined on [C_min, C_max], the
architecture's observed compute, and nowhere else: no law, no extrapolation. Between C_min and the
first vertex (a merged budget sits at its geometric mean, inside the span) and from the last vertex
to C_max the frontier is flat: the loss of the nearest vertex.

Savings at a budget C, the conventions of ``scaling.fitting.savings``, with C_x(L) = F_x^-1(L) the
least compute on x's frontier reaching L:

- candidate-budget: L = F_cand(C); savings = 1 - C_cand(L) / C_ref(L).
- reference-budget: L = F_ref(C); savings = 1 - C_cand(L) / C_ref(L).

Inside a frontier's decreasing part its own C_x(L) is the budget C; on a flat edge it is the vertex
where the flat stretch begins, so that an architecture compared with itself saves exactly 0 at
every budget, edges included.

Refused (no number, a reason instead) unless C lies inside both architectures' observed compute
and the matched compute lies inside the other architecture's frontier, and unless each of those
computes lies within ``MAX_GAP_DECADES`` (0.6) of an observed budget of its architecture on both
sides (refusal ``data-gap``): between budgets the frontier is a chord in log L - log C, while the
true frontier is convex, so the chord overstates the loss in a gap and the saving moves with it
(planted chinchilla laws, candidate budgets 2 decades apart: 8.0% at the middle against a true
25.1%, with no run-level noise for the bootstrap to see). 0.6 decade passes the 1-3-10 designs
(gaps of 0.48 and 0.52 decade) and the quarter-decade ones.

Sparsity. Where the two architectures share trained sparsities (a smelt-form study, sparsity a
design factor: both trained at S = 0.85, 0.95, ...), a frontier that pools them is the frontier
of the best sparsity at each compute, not any one sparsity's, so the envelope is taken per shared
sparsity, on the points at that sparsity (each row carries its S), and a sparsity asked for that
both did not train is refused (``untrained-sparsity``). Where they share none (each proxy size its own
sparsity, as in the shipped runs: sparsity follows size), the envelope pools, as before.

Interval: a bootstrap over runs. Runs are grouped into units; a unit holding runs of both
architectures (the same tier and seed in a runs folder: the compute-matched pair) is drawn as a
whole, so the two frontiers of a resample come from the same pairs; runs without a partner are
resampled per architecture. Each resample rebuilds both frontiers from the runs drawn (a unit
drawn twice weighs twice in its configuration's mean) and recomputes the saving; resamples in which
the budget or the matched compute leaves a resampled frontier give no value and are dropped
(``ci_resamples`` counts those kept; below half of them, or below ``MIN_CI_RESAMPLES`` (20), no
interval: a "95%" interval of a handful of resamples is only their range). The interval is the
percentile interval of the kept values: read it as the sensitivity of the saving to which runs were
trained.

Limits, measured on simulated IsoFLOP studies (``tests/test_envelope.py``: 7 sizes a budget, 7 seeds
at three budgets and 1 at two, noise 5-10% of the frontier's drop over the decade; the shipped
``runs/`` sits near 10%): the 95% interval covered the planted saving in 90-100% of 40 studies at
the 7-seed budgets and 78-98% at a 1-seed one, counting only studies that got an interval (at 10%
noise 4-7 of 40 got none at the 1-seed budget). The frontier is still a minimum over sizes, so
where the number of seeds changes between budgets, or between the sizes of one budget, the noisier
side sinks: at 10% noise the saving was off by -3 to -5 points on average at the budgets next to
the change. Averaging removes the minimum over seeds, not the one over sizes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from scaling.common.errors import UserError
from scaling.common.stats import percentile_interval
from scaling.fitting.approaches import compute_buckets
from scaling.fitting.savings import CONVENTIONS, MIN_CI_RESAMPLES, SPARSITY_ATOL, SavingsRow, check_budgets
from scaling.fitting.tables import config_keys, read_runs_dir, seed_replicates, token_cost, total_flops

METHOD = "envelope"
BUDGET_TOLERANCE = 0.05   # computes within 5% are one budget (module docstring)
MAX_GAP_DECADES = 0.6     # the widest gap between observed budgets the frontier's chord spans


@dataclass(frozen=True)
class Envelope:
    """Lower envelope of (compute, loss): vertices with increasing compute and decreasing loss."""

    compute: np.ndarray
    loss: np.ndarray
    c_min: float
    c_max: float
    budgets: np.ndarray | None = None   # every observed (merged) budget, vertices or not

    def around(self, C: float) -> tuple[float, float]:
        """The observed budgets on either side of C (both C at a budget; the span's end where C
        lies beyond every budget but inside the span)."""
        b = self.budgets if self.budgets is not None else self.compute   # both ascending
        lo, hi = b[b <= C * (1 + 1e-12)], b[b >= C * (1 - 1e-12)]
        return (float(lo[-1]) if lo.size else self.c_min), (float(hi[0]) if hi.size else self.c_max)

    @classmethod
    def of(cls, compute: Iterable[float], loss: Iterable[float],
           span: tuple[float, float] | None = None) -> "Envelope":
        """The envelope of (compute, loss); ``span``: the observed compute range when the points are
        merged budgets (``budget_points``), whose geometric means lie inside it."""
        C = np.asarray(list(compute) if not isinstance(compute, np.ndarray) else compute, dtype=float)
        L = np.asarray(list(loss) if not isinstance(loss, np.ndarray) else loss, dtype=float)
        ok = _usable(C, L)
        if not ok.any():
            raise UserError("no finite positive (compute, loss) point to build a frontier from")
        C, L = C[ok], L[ok]
        # Computes equal up to rounding (6 N D vs F D) count as one compute: otherwise a vertex a
        # few ulps to the right makes log C non-increasing after the log and np.interp undefined.
        key = np.round(np.log(C), 9)
        order = np.lexsort((L, key))
        C, L = C[order], L[order]
        best = np.minimum.accumulate(L)
        keep = np.ones(C.size, dtype=bool)
        keep[1:] = L[1:] < best[:-1]
        lo, hi = (float(C[0]), float(C[-1])) if span is None else (min(span[0], C[0]), max(span[1], C[-1]))
        return cls(C[keep], L[keep], float(lo), float(hi))

    @classmethod
    def of_runs(cls, compute: np.ndarray, loss: np.ndarray, config: np.ndarray,
                weight: np.ndarray | None = None) -> "Envelope":
        """The frontier of one architecture's runs: ``budget_points``, spanning the observed compute of
        the points it used."""
        C, L = budget_points(compute, loss, config, weight)
        used = compute[_usable(compute, loss, weight)]
        return replace(cls.of(C, L, span=(float(used.min()), float(used.max()))), budgets=np.sort(C))

    def loss_at(self, C: np.ndarray | float) -> np.ndarray:
        """Frontier loss at compute C; NaN outside [c_min, c_max]."""
        C = np.asarray(C, dtype=float)
        out = np.exp(np.interp(np.log(C), np.log(self.compute), np.log(self.loss)))
        return np.where((C >= self.c_min) & (C <= self.c_max), out, np.nan)

    def compute_at(self, L: np.ndarray | float) -> np.ndarray:
        """Least compute at which the frontier reaches loss L; NaN if it never does within the data."""
        L = np.asarray(L, dtype=float)
        out = np.exp(np.interp(-np.log(L), -np.log(self.loss), np.log(self.compute)))
        return np.where((L >= self.loss[-1]) & (L <= self.loss[0]), out, np.nan)


def _usable(compute: np.ndarray, loss: np.ndarray, weight: np.ndarray | None = None) -> np.ndarray:
    """Points a frontier may use: finite positive compute and loss, weight above 0."""
    C, L = np.asarray(compute, dtype=float), np.asarray(loss, dtype=float)
    ok = np.isfinite(C) & np.isfinite(L) & (C > 0) & (L > 0)
    return ok if weight is None else ok & (np.asarray(weight, dtype=float) > 0)


def budget_points(compute: np.ndarray, loss: np.ndarray, config: np.ndarray | None = None,
                  weight: np.ndarray | None = None,
                  tolerance: float = BUDGET_TOLERANCE) -> tuple[np.ndarray, np.ndarray]:
    """(compute, loss) of one architecture's frontier points (module docstring): the ``weight``-ed mean
    loss and compute of each ``config`` (points with weight 0 left out), then computes within
    ``tolerance`` of the smallest not yet merged (``compute_buckets``, the buckets of approach 2)
    merged at their geometric mean with their lowest loss."""
    C, L = np.asarray(compute, dtype=float), np.asarray(loss, dtype=float)
    w = np.ones(C.size) if weight is None else np.asarray(weight, dtype=float)
    ok = _usable(C, L, w)
    if not ok.any():
        raise UserError("no finite positive (compute, loss) point to build a frontier from")
    keys = np.arange(C.size) if config is None else np.asarray(config)
    _, cfg = np.unique(keys[ok], return_inverse=True)
    wt = np.bincount(cfg, w[ok])
    logc = np.bincount(cfg, w[ok] * np.log(C[ok])) / wt
    mean_loss = np.bincount(cfg, w[ok] * L[ok]) / wt
    budget = compute_buckets(logc / np.log(10), np.log10(1 + tolerance))
    n = np.bincount(budget)
    out_c = np.exp(np.bincount(budget, logc) / n)
    out_l = np.full(n.size, np.inf)
    np.minimum.at(out_l, budget, mean_loss)
    return out_c, out_l


def _matched(ref: Envelope, cand: Envelope, C: np.ndarray, convention: str) -> dict[str, np.ndarray]:
    l_ref, l_cand = ref.loss_at(C), cand.loss_at(C)
    loss = l_cand if convention == "candidate-budget" else l_ref
    # each side's least compute reaching the loss: the budget itself except on a flat edge
    c_cand, c_ref = cand.compute_at(loss), ref.compute_at(loss)
    return {"c_cand": c_cand, "c_ref": c_ref, "loss": loss, "savings": 1.0 - c_cand / c_ref,
            "gap": l_ref - l_cand}


def _refusal(c: float, ref: Envelope, cand: Envelope, names: tuple[str, str], m: dict, i: int,
             convention: str) -> tuple[str, str] | None:
    """Which refusal (``scaling.fitting.savings.REFUSALS``) and why the budget c gets no envelope
    saving (None: it gets one)."""
    for env, name in zip((ref, cand), names):
        if not env.c_min <= c <= env.c_max:
            return "outside-data", (f"budget outside the observed compute of {name} ({env.c_min:.3g}-"
                                    f"{env.c_max:.3g} FLOPs): the envelope does not extrapolate")
    if not np.isfinite(m["savings"][i]):
        return _not_reached(ref, cand, names, m, i, convention)
    for env, name, at in ((ref, names[0], m["c_ref"][i]), (cand, names[1], m["c_cand"][i])):
        for x in (c, float(at)):
            lo, hi = env.around(x)
            if np.log10(hi / lo) > MAX_GAP_DECADES:
                return "data-gap", (f"{name} has no observed budget between {lo:.3g} and {hi:.3g} FLOPs "
                                    f"({np.log10(hi / lo):.2f} decades, more than {MAX_GAP_DECADES:g}): "
                                    "its frontier there is a chord between them, not data")
    return None


def _not_reached(ref: Envelope, cand: Envelope, names: tuple[str, str], m: dict, i: int,
                 convention: str) -> tuple[str, str]:
    solved, env = (names[0], ref) if convention == "candidate-budget" else (names[1], cand)
    loss, lo, hi = float(m["loss"][i]), float(env.loss[-1]), float(env.loss[0])
    where = (f"is below the matched loss {loss:.4f} at every observed compute (its range {lo:.4f}-"
             f"{hi:.4f}): it reaches that loss with less compute than any it was run at"
             if loss > hi else
             f"never reaches the matched loss {loss:.4f} (its range {lo:.4f}-{hi:.4f})")
    return "not-reached", f"{solved}'s observed frontier {where}"


def envelope_savings(points: pd.DataFrame, reference: str, candidate: str, budgets: Iterable[float], *,
                     convention: str = "candidate-budget", n_bootstrap: int = 200, seed: int = 0,
                     level: float = 0.95) -> tuple[SavingsRow, ...]:
    """Envelope savings of ``candidate`` over ``reference`` at each budget (module docstring).

    ``points``: columns group, compute (total FLOPs), loss, unit (the resampling unit: runs
    sharing a unit are drawn together; give each run its own unit when nothing pairs them) and
    optionally config (points sharing a group and config are replicates of one configuration and are
    averaged; without it every point is its own).
    Returns one ``SavingsRow`` per budget with ``method="envelope"``; a refused budget has
    ``savings=None`` and its ``reason``.
    """
    if convention not in CONVENTIONS:
        raise UserError(f"unknown convention {convention!r}; choose one of: {', '.join(CONVENTIONS)}")
    if not 0.0 < level < 1.0:
        raise UserError(f"interval level must lie in (0, 1), got {level}")
    C = check_budgets(np.atleast_1d(budgets))
    if n_bootstrap < 0:
        raise UserError(f"the number of bootstrap resamples must be 0 or more, got {n_bootstrap}")
    names = (reference, candidate)
    for col in ("group", "compute", "loss", "unit"):
        if col not in points.columns:
            raise UserError(f"envelope savings need a {col!r} column")
    groups = points["group"].astype(str).to_numpy()
    for g in names:
        if g not in groups:
            raise UserError(f"no runs of group {g!r}; groups: {', '.join(sorted(set(groups)))}")
    compute = points["compute"].to_numpy(dtype=float)
    loss = points["loss"].to_numpy(dtype=float)
    units = points["unit"].astype(str).to_numpy()
    # a missing key is a configuration of its own, never one shared 'nan'
    own = np.char.add("row ", np.arange(len(points)).astype(str))
    config = (np.where(points["config"].isna().to_numpy(), own, points["config"].astype(str).to_numpy())
              if "config" in points.columns else own)
    ref, cand = (Envelope.of_runs(compute[groups == g], loss[groups == g], config[groups == g])
                 for g in names)
    m = _matched(ref, cand, C, convention)
    boot = bootstrap_savings(groups, units, compute, loss, config, names, C, convention, n_bootstrap, seed)
    rows = []
    for i, c in enumerate(C):
        refusal = _refusal(float(c), ref, cand, names, m, i, convention)
        if refusal is not None:
            rows.append(SavingsRow.refused(float(c), refusal[1], refusal=refusal[0], method=METHOD))
            continue
        s_ci = g_ci = None
        kept = 0
        if boot is not None:
            s, g = boot[0][:, i], boot[1][:, i]
            ok = np.isfinite(s)
            kept = int(ok.sum())
            if kept >= max(MIN_CI_RESAMPLES, n_bootstrap // 2):
                s_ci = percentile_interval(s[ok], level)
                g_ok = np.isfinite(g)
                g_ci = percentile_interval(g[g_ok], level) if g_ok.any() else None
        rows.append(SavingsRow(
            budget=float(c), sparsity=None, candidate_compute=float(m["c_cand"][i]),
            reference_compute=float(m["c_ref"][i]), candidate_loss=float(m["loss"][i]),
            savings=float(m["savings"][i]), savings_ci=s_ci, loss_gap=float(m["gap"][i]), loss_gap_ci=g_ci,
            tokens_per_param=float("nan"), candidate_tokens_per_param=float("nan"),
            extrapolation_decades=float(np.log10(max(float(c), float(m["c_cand"][i]), float(m["c_ref"][i]))
                                                 / min(ref.c_max, cand.c_max))),
            ci_resamples=kept, ci_clamped=0, method=METHOD,
        ))
    return tuple(rows)


def bootstrap_savings(groups: np.ndarray, units: np.ndarray, compute: np.ndarray, loss: np.ndarray,
                      config: np.ndarray, names: Sequence[str], C: np.ndarray, convention: str,
                      n_bootstrap: int, seed: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(savings, loss gap) of each resample, shape (K, len(C)), NaN where a resample gives none."""
    if n_bootstrap <= 0:
        return None
    rng = np.random.default_rng(seed)
    names_of_units, unit_index = np.unique(units, return_inverse=True)
    ref_units = set(units[groups == names[0]])
    cand_units = set(units[groups == names[1]])
    pools = [np.array(sorted(ref_units & cand_units)), np.array(sorted(ref_units - cand_units)),
             np.array(sorted(cand_units - ref_units))]
    pools = [np.searchsorted(names_of_units, p) for p in pools if p.size]
    out_s = np.full((n_bootstrap, C.size), np.nan)
    out_g = np.full((n_bootstrap, C.size), np.nan)
    in_group = [groups == g for g in names]
    for b in range(n_bootstrap):
        drawn = np.concatenate([p[rng.integers(0, p.size, p.size)] for p in pools])
        weight = np.bincount(drawn, minlength=names_of_units.size)[unit_index]
        sel = [(weight > 0) & g for g in in_group]
        if not (sel[0].any() and sel[1].any()):
            continue
        ref, cand = (Envelope.of_runs(compute[s], loss[s], config[s], weight[s]) for s in sel)
        m = _matched(ref, cand, C, convention)
        out_s[b], out_g[b] = m["savings"], m["gap"]
    return out_s, out_g


def run_pair_units(path: Path, points: pd.DataFrame) -> pd.Series | None:
    """Bootstrap units of the envelope: the (tier, seed) run pair of a runs folder (the two
    architectures' compute-matched runs drawn together), else None (each run its own unit)."""
    if not Path(path).is_dir():
        return None
    raw = read_runs_dir(Path(path))
    if not {"tier", "seed", "run"} <= set(raw.columns):
        return None
    unit = dict(zip(raw["run"].astype(str), raw["tier"].astype(str) + "|s" + raw["seed"].astype(str)))
    return points["run"].astype(str).map(unit).fillna(points["run"].astype(str))


def envelope_points(points: pd.DataFrame, units: pd.Series | None = None) -> pd.DataFrame:
    """(group, compute, loss, unit, config) from canonical points (``scaling.fitting.tables``).

    ``units``: the resampling unit per point (e.g. tier and seed of a runs folder); default: the run.
    ``config``: ``config_keys``, so that the seeds of one configuration are averaged; a configuration
    whose runs repeat a seed (an lr sweep in one folder) keeps its runs apart (``seed_replicates``).
    """
    out = pd.DataFrame({
        "group": points["group"].astype(str).to_numpy(),
        "compute": total_flops(points, token_cost(points)),
        "loss": points["loss"].to_numpy(dtype=float),
        "config": seed_replicates(points, config_keys(points), unknown_together=True),
    })
    out["unit"] = (points["run"].astype(str).to_numpy() if units is None
                   else np.asarray(units, dtype=str))
    return out


def shared_sparsities(points: pd.DataFrame, reference: str, candidate: str) -> list[float]:
    """The sparsities both groups trained at (to 4 decimals), sorted, where the study trained at
    more than one: a design factor. Empty where they share none (sparsity follows size), where
    every run has one sparsity (one frontier is that sparsity's), or where none is recorded."""
    if "sparsity" not in points.columns:
        return []
    S = pd.to_numeric(points["sparsity"], errors="coerce").round(4)
    g = points["group"].astype(str)
    ref, cand = (set(S[(g == name) & S.notna()].tolist()) for name in (reference, candidate))
    return sorted(ref & cand) if len(ref | cand) > 1 else []


def observed_savings(points: pd.DataFrame, path: Path | None, reference: str, candidate: str,
                     budgets: Iterable[float], *, sparsities: Sequence[float] | None = None,
                     **options) -> tuple[SavingsRow, ...]:
    """``envelope_savings`` of canonical ``points`` with the run pairs of the runs folder ``path``
    drawn together (``run_pair_units``; each run its own unit when ``path`` is not a runs folder).
    The one way `savings`, `plot savings` and the notebooks ask the envelope; ``options`` go to
    ``envelope_savings``.

    Where the two groups share trained sparsities (``shared_sparsities``), one envelope per
    sparsity (module docstring), at ``sparsities`` if given (a sparsity both did not train gets
    refused rows), else at every shared one; each row carries its sparsity."""
    units = run_pair_units(path, points) if path is not None else None
    env_points = envelope_points(points, units)
    shared = shared_sparsities(points, reference, candidate)
    if not shared:
        return envelope_savings(env_points, reference, candidate, budgets, **options)
    S = pd.to_numeric(points["sparsity"], errors="coerce").to_numpy(dtype=float)
    C = check_budgets(np.atleast_1d(budgets))
    rows: list[SavingsRow] = []
    for s in (shared if sparsities is None else sparsities):
        at = np.isclose(S, s, rtol=0.0, atol=SPARSITY_ATOL)
        if not any(np.isclose(s, x, rtol=0.0, atol=SPARSITY_ATOL) for x in shared):
            trained = ", ".join(f"{x:g}" for x in shared)
            why = (f"no runs of both {reference} and {candidate} at sparsity {s:g} (both trained at "
                   f"{trained}): the envelope does not extrapolate")
            rows += [SavingsRow.refused(float(c), why, refusal="untrained-sparsity", method=METHOD,
                                        sparsity=float(s)) for c in C]
            continue
        sub = env_points[at].reset_index(drop=True)
        rows += [replace(r, sparsity=float(s))
                 for r in envelope_savings(sub, reference, candidate, C, **options)]
    return tuple(rows)


def figure_budgets(lo: float, hi: float, per_decade: int = 8) -> np.ndarray:
    """Budgets at which a figure shows the envelope inside the data [lo, hi]: ``per_decade`` per
    decade, geometric, both ends included (the envelope is piecewise, moving from one trained size
    to the next, so a few per decade show its steps)."""
    return np.geomspace(lo, hi, max(2, int(np.ceil(per_decade * np.log10(hi / lo))) + 1))

