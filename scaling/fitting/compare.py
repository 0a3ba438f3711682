"""Paired comparison of two architectures at matched (tier, budget, seed): candidate minus reference.

A *pair* is the candidate's and the reference's validation loss (nats/token) at the same tier and
seed and the same actual budget: the two points' token counts D agree within ``TOKENS_RTOL`` (1%:
whole batches round a requested budget down by less than one batch) and, where both record their
training FLOPs, so do their FLOPs within ``FLOPS_RTOL`` (2%: the matcher's twins are within 1% on
FLOPs/token). Where both runs record their validation data (``val_set``, :func:`validation_id` of
the run's config: corpus key, tokenizer hash, held-out windows and their length), it must be the
same. A point without such a partner is dropped from the comparison and named in the notes
(``dropped``): the budget index alone does not make two runs comparable (0.125M tokens of one run
are not budget 0 of another trained to 20k). The two runs of a pair are compute-matched
(FLOPs/token, non-embedding parameters, KV cache) and see the same batches (batches are a function
of seed and step). d = L_candidate - L_reference: negative = candidate better.

Standard error of the mean, clustered. Pairs are not independent: every budget of one run is a
cooldown branch of the same trunk, so the budgets of one (tier, seed) run pair share its
noise. The default cluster is therefore that run pair (``cluster="run"``); ``"seed"`` pools every
tier of one seed (with the shipped two seeds that is 2 clusters, 1 degree of freedom), ``"none"``
treats pairs as independent. With n pairs in G clusters g, mean dbar, the cluster-robust (CR1,
Liang & Zeger 1986) standard error of a mean is

    se^2 = G / (G - 1) * sum_g ( sum_{i in g} (d_i - dbar) )^2 / n^2

(Cameron & Miller 2015, "A Practitioner's Guide to Cluster-Robust Inference", J. Human Resources
50(2), eqs. 11-12 with the regressor a constant; the small-sample factor (n-1)/(n-K) is 1 for K = 1).
With one pair per cluster it is the plain s.e. sd(d)/sqrt(n); ``se_iid`` is always reported beside
it. Fewer than 2 clusters: no s.e.

95% interval, every row: dbar -/+ t_{0.975}(G - 1) * se, Student's t with G - 1 degrees of freedom
(Cameron & Miller 2015, section VI.C: with few clusters CR1 Wald tests use t(G - 1) critical values,
not the normal's). Below 2 clusters a row has no interval; with 2 to 4 clusters (``FEW_CLUSTERS``)
the interval is printed but flagged: t(1) = 12.7, t(3) = 3.18, and it still leans on the cluster
sums being near normal (the notes name those rows). With ``cluster="none"`` G is the number of
pairs.

Sign test: the number of pairs with d < 0 against Binomial(n, 1/2), exact two-sided p-value
(ties, d == 0, are dropped). It treats pairs as independent, which the clustering above says they
are not: read it as a description, not as a test at the stated level.

Seed spread: the mean over (tier, architecture, budget) of max - min loss across seeds, the scale
of run-to-run noise the paired differences are measured against.

Per source: points carrying ``val_loss/<source>`` (logged when the corpus has several sources) give
the same statistics per source; a source no pair carries on both sides is left out and noted.

Per length bucket: ``analysis/lengths.json`` of both runs of a (tier, seed) run pair
(``smelt-scale analyze lengths``, at each run's final weights) gives per bucket the difference of
the token-weighted bucket losses, which is the token-weighted mean of the per-sequence differences
d_i with weights w_i = the sequence's tokens, and its ratio-estimator s.e. over the paired
sequences, sqrt(n / (n - 1) * sum w_i^2 (d_i - dbar_w)^2) / sum w_i
(:func:`scaling.common.stats.weighted_paired_mean`, the formula ``analyze lengths`` uses for its
gain). The two sides must have been evaluated on the same sequences (the same bucket definitions
and, per bucket, the same per-sequence token counts); a run pair that was not, or that the
comparison left out (no matched point), contributes no bucket and is named in the notes. Run
folders are found by their own path (``run_dir``), not by the run name final.json records.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy.stats import binomtest
from scipy.stats import t as student_t

from scaling.common.errors import UserError
from scaling.common.files import read_json
from scaling.common.filter import filter_rows
from scaling.common.run_folder import ANALYSIS_DIR, CONFIG, stale_analysis
from scaling.common.stats import weighted_paired_mean
from scaling.fitting.tables import RUN_DIR, SOURCE_LOSS_PREFIX

CLUSTERS = ("run", "seed", "none")
LEVEL = 0.95         # the level of every row's t(G - 1) interval
FEW_CLUSTERS = 5     # below this many clusters an interval is flagged (G - 1 <= 3 degrees of freedom)
_KEYS = ("tier", "budget_index", "seed")
TOKENS_RTOL = 0.01   # a pair's token counts agree within 1% (whole batches of one run's rounding)
FLOPS_RTOL = 0.02    # ... and their training FLOPs within 2% (twins match FLOPs/token within 1%)
VAL_SET = "val_set"  # column: the identity of a point's validation data (validation_id)
VAL_SET_PROBLEM = "val_set_problem"  # column: why a point's validation data could not be identified


@dataclass(frozen=True)
class PairStats:
    """Statistics of a set of paired differences d = candidate - reference (nats/token)."""

    label: str
    n_pairs: int
    mean: float
    se: float | None
    se_iid: float | None
    n_clusters: int
    n_candidate_better: int
    sign_p: float | None
    tokens: float | None = None   # mean tokens per pair (a budget's size), when known
    df: int | None = None          # degrees of freedom of the interval, G - 1 (None: no s.e.)
    ci_lo: float | None = None     # LEVEL interval mean -/+ t(G - 1) se (module docstring)
    ci_hi: float | None = None

    @property
    def few_clusters(self) -> bool:
        """True when the row has an interval from fewer than ``FEW_CLUSTERS`` clusters."""
        return self.se is not None and self.n_clusters < FEW_CLUSTERS

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "mean": self.mean, "se": self.se, "n_pairs": self.n_pairs,
                "se_iid": self.se_iid, "n_clusters": self.n_clusters,
                "n_candidate_better": self.n_candidate_better, "sign_test_p": self.sign_p,
                "tokens": self.tokens, "df": self.df, "ci_level": LEVEL, "ci_lo": self.ci_lo,
                "ci_hi": self.ci_hi, "few_clusters": self.few_clusters}


@dataclass(frozen=True)
class CompareResult:
    """Paired comparison; every ``PairStats`` mean is candidate minus reference, nats/token."""

    reference: str
    candidate: str
    cluster: str
    overall: PairStats
    by_tier: tuple[PairStats, ...]
    by_budget: tuple[PairStats, ...]
    cells: tuple[PairStats, ...]
    pairs: pd.DataFrame = field(repr=False, compare=False)
    seed_spread: float | None = None
    n_seeds: int = 0
    seed_sd: float | None = None
    by_source: Mapping[str, PairStats] = field(default_factory=dict)
    by_length: tuple[Mapping[str, Any], ...] = ()
    notes: tuple[str, ...] = ()
    dropped: tuple[Mapping[str, Any], ...] = ()   # points left unpaired, each with the reason
    where: tuple[str, ...] = ()   # the row filters the points passed (``compare --where``)
    n_points: int = 0             # points read, before the filters
    n_points_kept: int = 0        # points the filters kept

    @property
    def n_cells_candidate_better(self) -> int:
        return sum(c.mean < 0 for c in self.cells)

    def subset(self, mask: np.ndarray, label: str) -> PairStats:
        """Statistics of the pairs selected by a boolean mask over ``pairs``."""
        return pair_stats(self.pairs[np.asarray(mask, dtype=bool)], label, self.cluster)

    def to_dict(self) -> dict[str, Any]:
        return {
            "reference": self.reference, "candidate": self.candidate,
            "difference": f"{self.candidate} minus {self.reference}, validation loss in nats/token",
            "cluster": self.cluster,
            "overall": self.overall.to_dict(),
            "cells_candidate_better": self.n_cells_candidate_better, "n_cells": len(self.cells),
            "seed_spread": self.seed_spread, "n_seeds": self.n_seeds, "seed_sd": self.seed_sd,
            "by_tier": [s.to_dict() for s in self.by_tier],
            "by_budget": [s.to_dict() for s in self.by_budget],
            "cells": [s.to_dict() for s in self.cells],
            "by_source": {k: v.to_dict() for k, v in self.by_source.items()},
            "by_length": [dict(b) for b in self.by_length],
            "notes": list(self.notes),
            "dropped": [dict(d) for d in self.dropped],
            "where": list(self.where), "n_points": self.n_points, "n_points_kept": self.n_points_kept,
        }

    def summary(self) -> str:
        def line(s: PairStats) -> str:
            se = "   -  " if s.se is None else f"{s.se:.4f}"
            p = "-" if s.sign_p is None else f"{s.sign_p:.3g}"
            return (f"{s.label:>24} {s.mean:+.4f} {se} {interval_text(s):>24} {s.n_pairs:>5} "
                    f"{s.n_clusters:>4} {s.n_candidate_better:>4} {p:>7}")
        head = (f"{'':>24} {'mean':>7} {'se':>6} {f'{LEVEL:.0%} CI, t(G-1)':>24} {'pairs':>5} {'clus':>4} "
                f"{'cand<':>4} {'sign p':>7}")
        out = [f"{self.candidate} - {self.reference} validation loss (nats/token), s.e. clustered by "
               f"{self.cluster}"]
        if self.where:
            out.append(f"points kept by {' and '.join(repr(w) for w in self.where)}: "
                       f"{self.n_points_kept} of {self.n_points}")
        out += [head, line(self.overall)]
        out += [line(s) for s in (*self.by_tier, *self.by_budget)]
        out.append(f"{self.candidate} better in {self.n_cells_candidate_better} of {len(self.cells)} cells")
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)


def interval_text(s: PairStats) -> str:
    """The row's interval as printed: ``[lo, hi] df k``, ``*`` after it when from few clusters
    (fewer than FEW_CLUSTERS), ``-`` when the row has none (fewer than 2 clusters)."""
    if s.ci_lo is None or s.ci_hi is None:
        return "-"
    return f"[{s.ci_lo:+.4f}, {s.ci_hi:+.4f}] df {s.df}" + ("*" if s.few_clusters else "")


def t_interval(mean: float, se: float | None, n_clusters: int, level: float = LEVEL
               ) -> tuple[int | None, float | None, float | None]:
    """(df, lo, hi) of mean -/+ t_{(1+level)/2}(G - 1) se (module docstring); Nones below 2 clusters
    or without an s.e."""
    if se is None or n_clusters < 2 or not math.isfinite(mean):
        return None, None, None
    df = n_clusters - 1
    q = float(student_t.ppf((1.0 + level) / 2.0, df))
    return df, mean - q * se, mean + q * se


def cluster_se(d: np.ndarray, clusters: np.ndarray) -> float | None:
    """CR1 cluster-robust standard error of mean(d) (module docstring); None below 2 clusters."""
    d = np.asarray(d, dtype=float)
    _, g = np.unique(np.asarray(clusters), return_inverse=True)
    G = int(g.max()) + 1 if d.size else 0
    if G < 2:
        return None
    u = np.bincount(g, weights=d - d.mean(), minlength=G)
    return float(math.sqrt(G / (G - 1) * np.sum(u ** 2)) / d.size)


def pair_stats(pairs: pd.DataFrame, label: str, cluster: str, column: str = "diff") -> PairStats:
    """Mean, clustered s.e., i.i.d. s.e. and sign test of ``pairs[column]``."""
    sub = pairs[np.isfinite(pairs[column].to_numpy(dtype=float))]
    d = sub[column].to_numpy(dtype=float)
    n = int(d.size)
    if n == 0:
        return PairStats(label, 0, math.nan, None, None, 0, 0, None)
    keys = _cluster_keys(sub, cluster)
    n_clusters = int(np.unique(keys).size)
    se_iid = float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else None
    better, worse = int((d < 0).sum()), int((d > 0).sum())
    p = float(binomtest(better, better + worse, 0.5).pvalue) if better + worse else None
    tokens = float(sub["tokens"].mean()) if "tokens" in sub and sub["tokens"].notna().any() else None
    mean, se = float(d.mean()), cluster_se(d, keys)
    df, lo, hi = t_interval(mean, se, n_clusters)
    return PairStats(label, n, mean, se, se_iid, n_clusters, better, p, tokens, df, lo, hi)


def _cluster_keys(pairs: pd.DataFrame, cluster: str) -> np.ndarray:
    if cluster == "run":
        return (pairs["tier"].astype(str) + "|" + pairs["seed"].astype(str)).to_numpy()
    if cluster == "seed":
        return pairs["seed"].astype(str).to_numpy()
    return np.arange(len(pairs))


def validation_id(config: Mapping[str, Any]) -> str | None:
    """The identity of a run's validation data, from its config.json: corpus key, tokenizer
    SHA-256, number of held-out windows and their length (``val_windows`` x ``seq_len``).

    Two runs with the same identity were evaluated on the same tokens. None when the config does
    not record it (a table from elsewhere).
    """
    data = config.get("data") if isinstance(config, Mapping) else None
    if not isinstance(data, Mapping):
        return None
    tok = data.get("tokenizer") if isinstance(data.get("tokenizer"), Mapping) else {}
    resolved = config.get("resolved") if isinstance(config.get("resolved"), Mapping) else {}
    model = config.get("model") if isinstance(config.get("model"), Mapping) else {}
    parts = (data.get("key"), tok.get("sha256"), resolved.get("val_windows"), model.get("seq_len"))
    if all(p is None for p in parts):
        return None
    return "|".join("-" if p is None else str(p) for p in parts)


def _close(a: np.ndarray, b: np.ndarray, rtol: float) -> np.ndarray:
    return np.abs(a - b) <= rtol * np.maximum(np.abs(a), np.abs(b))


def match_pairs(points: pd.DataFrame, reference: str, candidate: str
                ) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """Reference and candidate points joined on (tier, seed) and the same actual budget.

    Returns the joined rows (columns of both sides, suffixed ``_ref``/``_cand``, plus tier, seed
    and the reference's budget_index) and the points left out, each a record with arch, run,
    tier, seed, budget_index, D and the reason: no partner at the same tokens (within
    ``TOKENS_RTOL``), FLOPs that differ by more than ``FLOPS_RTOL``, or other validation data.
    """
    sources = [c for c in points.columns if str(c).startswith(SOURCE_LOSS_PREFIX)]
    cols = ["loss", "D", *[c for c in ("flops", VAL_SET, "run", RUN_DIR) if c in points.columns], *sources]

    def side(g: str) -> pd.DataFrame:
        sub = points[points["arch"].astype(str) == g]
        dup = sub.duplicated(list(_KEYS))
        if dup.any():
            k = sub.loc[dup, list(_KEYS)].iloc[0].to_dict()
            same = sub[(sub[list(_KEYS)] == pd.Series(k)).all(axis=1)]
            lrs = sorted(set(same["lr"].dropna())) if "lr" in same.columns else []
            why = (f" (they trained at peak lrs {', '.join(f'{v:g}' for v in lrs)}: an lr sweep pairs "
                   f"twins per lr when each lr is its own tier or folder, or compare one lr at a time "
                   f"with the row filter 'lr == {float(lrs[0])!r}')" if len(lrs) > 1 else "")
            raise UserError(f"two {g} points share tier {k['tier']}, budget index {k['budget_index']} "
                            f"and seed {k['seed']}: a runs folder must hold each run once{why}")
        out = sub[["tier", "seed", "budget_index", *[c for c in cols if c in sub.columns]]].copy()
        out["_row"] = np.arange(len(out))
        return out

    ref, cand = side(reference), side(candidate)
    j = ref.merge(cand, how="inner", on=["tier", "seed"], suffixes=("_ref", "_cand"))
    D_r, D_c = j["D_ref"].to_numpy(dtype=float), j["D_cand"].to_numpy(dtype=float)
    j = j[_close(D_r, D_c, TOKENS_RTOL)]
    # the same tokens: keep the closest candidate per reference point (and vice versa)
    j = j.assign(_gap=np.abs(np.log(j["D_cand"].astype(float) / j["D_ref"].astype(float))))
    j = j.sort_values("_gap", kind="stable").drop_duplicates("_row_ref").drop_duplicates("_row_cand")
    reasons: dict[tuple[str, int], str] = {}
    keep = np.ones(len(j), dtype=bool)
    if "flops_ref" in j and "flops_cand" in j:
        fr, fc = j["flops_ref"].to_numpy(dtype=float), j["flops_cand"].to_numpy(dtype=float)
        bad = np.isfinite(fr) & np.isfinite(fc) & ~_close(fr, fc, FLOPS_RTOL)
        for k in np.flatnonzero(bad & keep):
            why = (f"training FLOPs {fc[k] / fr[k] - 1:+.1%} off its partner's at the same tokens "
                   f"(more than {FLOPS_RTOL:.0%}: not compute-matched)")
            reasons[(reference, int(j["_row_ref"].iloc[k]))] = why
            reasons[(candidate, int(j["_row_cand"].iloc[k]))] = why
        keep &= ~bad
    if f"{VAL_SET}_ref" in j and f"{VAL_SET}_cand" in j:
        vr, vc = j[f"{VAL_SET}_ref"], j[f"{VAL_SET}_cand"]
        bad = (vr.notna() & vc.notna() & (vr.astype(str) != vc.astype(str))).to_numpy()
        for k in np.flatnonzero(bad & keep):
            why = ("evaluated on other validation data than its partner "
                   "(corpus, tokenizer or held-out windows)")
            reasons[(reference, int(j["_row_ref"].iloc[k]))] = why
            reasons[(candidate, int(j["_row_cand"].iloc[k]))] = why
        keep &= ~bad
    j = j[keep]
    dropped: list[dict[str, Any]] = []
    for g, frame, other in ((reference, ref, candidate), (candidate, cand, reference)):
        paired = set(j["_row_ref" if g == reference else "_row_cand"].astype(int))
        for r in frame.to_dict("records"):
            row = int(r["_row"])
            if row in paired:
                continue
            why = reasons.get((g, row), f"no {other} point of the same tier and seed at these tokens "
                                        f"(within {TOKENS_RTOL:.0%})")
            rec = {"arch": g, "tier": str(r["tier"]), "seed": r["seed"],
                   "budget_index": int(r["budget_index"]), "D": float(r["D"]), "reason": why}
            for c in ("run", RUN_DIR):
                if c in r:
                    rec[c] = str(r[c])
            dropped.append(rec)
    j = j.rename(columns={"budget_index_ref": "budget_index"})
    return j.drop(columns=["_gap", "_row_ref", "_row_cand", "budget_index_cand"]), dropped


def paired_points(points: pd.DataFrame, reference: str, candidate: str,
                  dropped: list[dict[str, Any]] | None = None) -> pd.DataFrame:
    """One row per matched (tier, budget, seed) (module docstring: the same actual tokens, FLOPs
    and validation data): columns tier, budget_index (the reference's), seed, tokens, reference,
    candidate, diff, and ``diff/<source>`` for every ``val_loss/<source>`` both carry.

    ``points``: raw run points (``scaling.fitting.tables.read_runs_dir``) with columns arch, tier,
    seed, budget_index, loss, D (and optionally flops, val_set). The points left unpaired are
    appended to ``dropped`` when given (:func:`match_pairs`). UserError when nothing pairs.
    """
    need = ["arch", *_KEYS, "loss", "D"]
    missing = [c for c in need if c not in points.columns]
    if missing:
        raise UserError(f"the points lack {', '.join(missing)}: a paired comparison needs run folders "
                        "whose final.json records arch, tier, seed, budget_index and tokens D")
    archs = sorted(points["arch"].astype(str).unique())
    for g in (reference, candidate):
        if g not in archs:
            raise UserError(f"no runs of architecture {g!r}; architectures: {', '.join(archs)}")
    sources = [c for c in points.columns if str(c).startswith(SOURCE_LOSS_PREFIX)]
    joined, left_out = match_pairs(points, reference, candidate)
    if dropped is not None:
        dropped.extend(left_out)
    if joined.empty:
        why = "; ".join(sorted({d["reason"] for d in left_out})) or "no common tier and seed"
        raise UserError(f"no (tier, budget, seed) has both a {reference} and a {candidate} point at the "
                        f"same tokens and validation data ({len(left_out)} points unpaired: {why})")
    out = pd.DataFrame({
        "tier": joined["tier"].to_numpy(), "budget_index": joined["budget_index"].to_numpy(),
        "seed": joined["seed"].to_numpy(),
        "reference": joined["loss_ref"].to_numpy(dtype=float),
        "candidate": joined["loss_cand"].to_numpy(dtype=float),
    })
    out["diff"] = out["candidate"] - out["reference"]
    out["tokens"] = joined["D_ref"].to_numpy(dtype=float)
    if "flops_ref" in joined:
        out["flops"] = joined["flops_ref"].to_numpy(dtype=float)
    for s in sources:
        if f"{s}_ref" in joined and f"{s}_cand" in joined:
            out["diff/" + s[len(SOURCE_LOSS_PREFIX):]] = (joined[f"{s}_cand"].to_numpy(dtype=float)
                                                     - joined[f"{s}_ref"].to_numpy(dtype=float))
    return out.sort_values(list(_KEYS), kind="stable").reset_index(drop=True)


def describe_dropped(dropped: Sequence[Mapping[str, Any]], limit: int = 3) -> str:
    """One line on the points a comparison left unpaired: how many, why, and the first few."""
    if not dropped:
        return ""
    by_reason: dict[str, list[Mapping[str, Any]]] = {}
    for d in dropped:
        by_reason.setdefault(str(d["reason"]), []).append(d)
    parts = []
    for why, ds in by_reason.items():
        ex = ", ".join(f"{d['arch']} {d['tier']} seed {d['seed']} at {d['D']:,.0f} tokens"
                       for d in ds[:limit])
        more = f" and {len(ds) - limit} more" if len(ds) > limit else ""
        parts.append(f"{len(ds)} point{'s' if len(ds) > 1 else ''} {why}: {ex}{more}")
    return f"left out of the comparison ({len(dropped)} unpaired): " + "; ".join(parts)


def at_least_tokens(points: pd.DataFrame, tokens: float) -> pd.DataFrame:
    """Points whose budget is at least ``tokens`` (the requested budget where recorded: a run's
    actual D is rounded down to whole batches, 499,712 for 0.5M)."""
    if "D" not in points.columns:
        raise UserError("the points record no token counts (D)")
    d = points["D"].to_numpy(dtype=float)
    if "requested_tokens" in points.columns:
        req = points["requested_tokens"].to_numpy(dtype=float)
        d = np.where(np.isfinite(req), req, d)
    return points[d >= tokens]


def seed_spread(points: pd.DataFrame, archs: Sequence[str]) -> tuple[float | None, int, float | None]:
    """Seed-to-seed noise of the loss over (tier, arch, budget) cells with >= 2 seeds: the mean of
    max - min across seeds (grows with the number of seeds: 1.13 sigma for 2 normal draws, 1.69 for
    3), the number of seeds, and the pooled within-cell standard deviation
    sqrt(sum_c (n_c - 1) s_c^2 / sum_c (n_c - 1)) (comparable across studies with other numbers of
    seeds)."""
    sub = points[points["arch"].astype(str).isin(archs)]
    g = sub.groupby(["tier", "arch", "budget_index"])["loss"]
    var = g.var(ddof=1)
    multi = (g.count() >= 2) & np.isfinite(var)  # a non-finite loss has no spread to pool
    span = (g.max() - g.min())[multi]
    dof = (g.count() - 1)[multi]
    sd = float(np.sqrt((dof * var[multi]).sum() / dof.sum())) if len(span) else None
    return (float(span.mean()) if len(span) else None), int(sub["seed"].nunique()), sd


def compare(points: pd.DataFrame, reference: str = "baseline", candidate: str = "smelt", *,
            cluster: str = "run", lengths: Sequence[Mapping[str, Any]] = (),
            length_notes: Sequence[str] = (), where: Sequence[str] = ()) -> CompareResult:
    """Paired comparison of ``candidate`` against ``reference`` (module docstring).

    ``where``: row filters on the points' columns (:func:`scaling.common.filter.filter_rows`, e.g.
    ``"lr == 0.006"`` or ``"seed >= 3"``); every statistic, the seed spread included, is of the
    points they keep, and the result records them.

    ``lengths``: per-pair length-bucket records from :func:`length_buckets` (optional); only
    those of (tier, seed) run pairs that the comparison keeps are reported, the others are named in
    the notes. ``length_notes``: what :func:`length_buckets` left out, passed on to the notes.
    """
    if cluster not in CLUSTERS:
        raise UserError(f"unknown clustering {cluster!r}; choose one of: {', '.join(CLUSTERS)}")
    n_read = len(points)
    where = (where,) if isinstance(where, str) else tuple(where)
    if where:
        points = filter_rows(points, where, "the runs' points")
        if points.empty:
            raise UserError(f"no point of the {n_read} is kept by the row filters ({'; '.join(where)})")
    dropped: list[dict[str, Any]] = []
    pairs = paired_points(points, reference, candidate, dropped)
    notes = [describe_dropped(dropped)] if dropped else []
    notes += _unchecked_validation(points, (reference, candidate))
    by_tier = tuple(pair_stats(g, str(t), cluster) for t, g in pairs.groupby("tier", sort=False))
    by_tier = tuple(sorted(by_tier, key=lambda s: _tier_size(points, s.label)))
    by_budget = tuple(pair_stats(g, label, cluster) for label, g in _budget_groups(pairs))
    cells = tuple(pair_stats(g, f"{t} budget {int(b)}", cluster)
                  for (t, b), g in pairs.groupby(["tier", "budget_index"], sort=False))
    overall = pair_stats(pairs, "overall", cluster)
    if overall.n_clusters < FEW_CLUSTERS and cluster != "none":
        notes.append(f"only {overall.n_clusters} clusters: the clustered s.e. is itself very uncertain")
    sources = [c[len("diff/"):] for c in pairs.columns if c.startswith("diff/")]
    by_source = {}
    for src in sources:
        st = pair_stats(pairs, src, cluster, column="diff/" + src)
        if st.n_pairs == 0:   # logged on one side only, or null on every pair: nothing to compare
            notes.append(f"source {src}: no pair has a finite {SOURCE_LOSS_PREFIX}{src} on both sides; "
                         "left out")
            continue
        if st.n_pairs < overall.n_pairs:
            notes.append(f"source {src}: only {st.n_pairs} of {overall.n_pairs} pairs have a finite "
                         f"{SOURCE_LOSS_PREFIX}{src} on both sides")
        by_source[src] = st
    if not sources:
        notes.append(f"no per-source loss: the runs record no {SOURCE_LOSS_PREFIX}<source> values")
    notes += _interval_notes((overall, *by_tier, *by_budget, *by_source.values()), cells)
    kept, length_left = _lengths_of_pairs(pairs, lengths)
    notes += [*length_notes, *length_left]
    if not kept:
        notes.append("no per-length-bucket loss: no run pair in the comparison has usable "
                     "analysis/lengths.json on both sides" if lengths or length_notes else
                     "no per-length-bucket loss: no run pair holds analysis/lengths.json for both sides")
    spread, n_seeds, seed_sd = seed_spread(points, (reference, candidate))
    return CompareResult(reference=reference, candidate=candidate, cluster=cluster, overall=overall,
                         by_tier=by_tier, by_budget=by_budget, cells=cells, pairs=pairs,
                         seed_spread=spread, n_seeds=n_seeds, seed_sd=seed_sd, by_source=by_source,
                         by_length=tuple(kept), notes=tuple(notes), dropped=tuple(dropped),
                         where=where, n_points=n_read, n_points_kept=len(points))


def _interval_notes(rows: Sequence[PairStats], cells: Sequence[PairStats]) -> list[str]:
    """Notes naming the rows without an interval (< 2 clusters) and those whose interval rests on
    few clusters (2 to FEW_CLUSTERS - 1: t(G - 1) with 1 to 3 degrees of freedom)."""
    out = []
    none = [s.label for s in rows if s.se is None]
    few = [f"{s.label} ({s.n_clusters})" for s in rows if s.few_clusters]
    if none:
        out.append(f"no s.e. and no {LEVEL:.0%} interval (fewer than 2 clusters): {', '.join(none)}")
    if few:
        out.append(f"{LEVEL:.0%} intervals from few clusters (t with G - 1 <= {FEW_CLUSTERS - 2} degrees of "
                   f"freedom; wide, and they lean on near-normal cluster sums): {', '.join(few)}")
    n_few = sum(c.se is None or c.few_clusters for c in cells)
    if n_few:
        out.append(f"{n_few} of {len(cells)} (tier, budget) cells have fewer than {FEW_CLUSTERS} clusters: "
                   "their intervals are wide or absent")
    return out


def _unchecked_validation(points: pd.DataFrame, archs: Sequence[str]) -> list[str]:
    """A note naming the runs whose validation data could not be identified (:func:`with_validation_ids`):
    their pairs were made without the validation-data check."""
    if VAL_SET_PROBLEM not in points.columns:
        return []
    sub = points[points["arch"].astype(str).isin(archs) & points[VAL_SET_PROBLEM].notna()]
    col = RUN_DIR if RUN_DIR in sub.columns else "run"
    runs = sub.drop_duplicates(col)
    if runs.empty:
        return []
    named = [f"{r[col]} ({r[VAL_SET_PROBLEM]})" for r in runs.to_dict("records")[:5]]
    more = f" and {len(runs) - 5} more" if len(runs) > 5 else ""
    return [f"validation data not checked for {len(runs)} run{'s' if len(runs) > 1 else ''}: "
            f"{'; '.join(named)}{more}"]


def _lengths_of_pairs(pairs: pd.DataFrame, lengths: Sequence[Mapping[str, Any]]
                      ) -> tuple[list[Mapping[str, Any]], list[str]]:
    """The length-bucket records of the (tier, seed) run pairs that have a matched point, and a
    note naming the run pairs whose buckets were left out because the comparison left them out."""
    kept_keys = set(zip(pairs["tier"].astype(str), pairs["seed"].astype(str)))
    kept = [b for b in lengths if (str(b["tier"]), str(b["seed"])) in kept_keys]
    gone = sorted({(str(b["tier"]), str(b["seed"])) for b in lengths} - kept_keys)
    if not gone:
        return kept, []
    names = ", ".join(f"{t} seed {sd}" for t, sd in gone)
    return kept, [f"length buckets left out for {len(gone)} run pair{'s' if len(gone) > 1 else ''} the "
                  f"comparison left out (no matched point): {names}"]


def _clusters(values: np.ndarray, rtol: float = 0.05) -> np.ndarray:
    """A cluster id per value: sorted values within ``rtol`` of their neighbour share one (whole
    batches round the same budget to slightly different tokens and FLOPs per size)."""
    order = np.argsort(values)
    ids = np.empty(values.size, dtype=int)
    k = 0
    for j, i in enumerate(order):
        if j and values[i] > values[order[j - 1]] * (1 + rtol):
            k += 1
        ids[i] = k
    return ids


def _budget_groups(pairs: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The pairs grouped by budget: by training compute when the budgets are IsoFLOP sets (fewer
    distinct computes than token counts, within 5%), by tokens when the budgets are token counts
    shared across sizes, by budget index when neither is recorded. A budget index alone names
    different budgets for runs whose budget lists differ."""
    keys = {}
    for col in ("flops", "tokens"):
        if col in pairs and len(pairs) and np.isfinite(pairs[col].to_numpy(dtype=float)).all():
            keys[col] = _clusters(pairs[col].to_numpy(dtype=float))
    if not keys:
        return [(f"budget {int(b)}", g) for b, g in pairs.groupby("budget_index")]
    by = min(keys, key=lambda k: (len(set(keys[k])), k != "flops"))
    out = []
    for k in sorted(set(keys[by])):
        g = pairs[keys[by] == k]
        v = float(np.median(g[by].to_numpy(dtype=float)))
        out.append((f"C {v:.3g} FLOPs" if by == "flops" else f"{v / 1e6:.3g}M tokens", g))
    return out


def _tier_size(points: pd.DataFrame, tier: str) -> float:
    n = points.loc[points["tier"].astype(str) == tier, "N"] if "N" in points else pd.Series([], dtype=float)
    return float(n.max()) if len(n) else math.inf


# -- validation identity (I/O edge: reads each run's config.json) ---------------------------------
def _run_folder_column(points: pd.DataFrame) -> str | None:
    """The column naming each point's run folder under the runs directory: ``run_dir`` from
    :func:`scaling.fitting.tables.read_runs_dir`, else ``run`` (a table built elsewhere)."""
    return RUN_DIR if RUN_DIR in points.columns else "run" if "run" in points.columns else None


def with_validation_ids(root: Path, points: pd.DataFrame) -> pd.DataFrame:
    """``points`` with a ``val_set`` column: :func:`validation_id` of each run's config.json, read
    from the run's folder ``root / run_dir``; and a ``val_set_problem`` column saying why a run has
    none (config.json missing or unreadable, or recording no validation data), which
    :func:`compare` names in its notes: such a run is paired without the check."""
    col = _run_folder_column(points)
    if col is None:
        return points
    ids: dict[str, str | None] = {}
    problems: dict[str, str | None] = {}
    for run in points[col].astype(str).unique():
        try:
            ids[run] = validation_id(read_json(root / run / CONFIG, "run config"))
            problems[run] = None if ids[run] is not None else f"its {CONFIG} records no validation data"
        except (OSError, ValueError, UserError) as exc:
            ids[run] = None
            why = " ".join(str(exc).split())[:160]
            problems[run] = f"no readable {CONFIG}: {why}"
    key = points[col].astype(str)
    return points.assign(**{VAL_SET: key.map(ids), VAL_SET_PROBLEM: key.map(problems)})


# -- length buckets (I/O edge: reads the analyses that `smelt-scale analyze lengths` saved) ------------
def length_buckets(root: Path, points: pd.DataFrame, reference: str, candidate: str, *,
                   warn: Callable[[str], None] | None = None,
                   notes: list[str] | None = None) -> list[dict[str, Any]]:
    """Per-bucket candidate - reference loss for every run pair with ``analysis/lengths.json`` on both sides.

    Each run's file is read from its own folder (``root / run_dir``). Each record: run pair (tier,
    seed), bucket kind (``length`` of the document or token ``position``), [lo, hi), ``diff`` (the
    difference of the token-weighted bucket losses) and ``se`` (its ratio-estimator s.e. over the
    paired sequences; module docstring; None without per-sequence losses or with one sequence),
    sequences and tokens. A run pair whose two files were not computed on the same sequences (other
    bucket definitions, or other per-sequence token counts), whose file on one side is missing,
    unreadable or malformed, or was computed on other weights than the run's weights file holds now
    (the hash ``analyze`` saved with it; ``scaling.common.run_folder.stale_analysis``: the run was
    extended or retrained since), contributes no record: the reason goes to ``notes`` when given,
    else to ``warn``. A file saved without a hash is taken as of the final weights, and said so.
    """
    def say(msg: str) -> None:
        if notes is not None:
            notes.append(msg)
        elif warn is not None:
            warn(msg)

    col = _run_folder_column(points)
    if col is None:
        return []
    runs = points.drop_duplicates(col)[[col, "arch", "tier", "seed"]]
    by_key: dict[tuple[str, str], dict[str, Path]] = {}
    twice: set[tuple[str, str]] = set()
    for r in runs.to_dict("records"):
        f = root / str(r[col]) / ANALYSIS_DIR / "lengths.json"
        if f.exists():
            files = by_key.setdefault((str(r["tier"]), str(r["seed"])), {})
            if str(r["arch"]) in files:   # two runs of one arch, tier and seed (an lr sweep in one tier)
                twice.add((str(r["tier"]), str(r["seed"])))
            files[str(r["arch"])] = f
    out: list[dict[str, Any]] = []
    for (tier, seed), files in sorted(by_key.items()):
        if (tier, seed) in twice:
            say(f"length buckets of {tier} seed {seed} left out: more than one run of an architecture "
                "has analysis/lengths.json (keep one with --where)")
            continue
        if reference not in files and candidate not in files:
            continue
        if reference not in files or candidate not in files:
            have = reference if reference in files else candidate
            say(f"length buckets of {tier} seed {seed} left out: only its {have} run has "
                "analysis/lengths.json")
            continue
        try:
            docs = {g: read_json(files[g]) for g in (reference, candidate)}
            stale = [(g, why) for g in (reference, candidate)
                     if (why := stale_analysis(docs[g], files[g].parent.parent)) is not None]
            if stale:
                g, why = stale[0]
                say(f"length buckets of {tier} seed {seed} left out: the {g} run's analysis/lengths.json "
                    f"is not of its present weights: {why}; rerun `smelt-scale analyze lengths`")
                continue
            unhashed = [g for g in (reference, candidate) if not docs[g].get("weights")]
            if unhashed:
                whose = " and ".join(unhashed) + (" runs'" if len(unhashed) > 1 else " run's")
                say(f"length buckets of {tier} seed {seed}: the {whose} "
                    "analysis/lengths.json records no weights hash (saved by an older version); taken "
                    "as computed on the final weights")
            ref, cand = (docs[g]["result"]["buckets"] for g in (reference, candidate))
            recs, problem = _bucket_diffs(tier, seed, ref, cand)
        except (OSError, ValueError, KeyError, TypeError, AttributeError, UserError) as exc:  # user data
            say(f"length buckets of {tier} seed {seed} left out: unreadable or malformed "
                f"analysis/lengths.json ({' '.join(str(exc).split())[:160]})")
            continue
        if problem is not None:
            say(f"length buckets of {tier} seed {seed} left out: {problem}")
            continue
        out.extend(recs)
    return out


def _bucket_key(b: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    return b["by"], b["lo"], b["hi"]


def _same_sequences(br: Mapping[str, Any], bc: Mapping[str, Any]) -> bool:
    """Both sides of one bucket hold the same sequences: the same per-sequence token counts where
    both record them, else the same numbers of sequences and tokens (the most that can be checked)."""
    tr, tc = br.get("seq_tokens") or [], bc.get("seq_tokens") or []
    if tr and tc:
        return [int(x) for x in tr] == [int(x) for x in tc]
    return (int(br.get("n_sequences", 0)), int(br.get("n_tokens", 0))) == (
        int(bc.get("n_sequences", 0)), int(bc.get("n_tokens", 0)))


def _bucket_diffs(tier: str, seed: str, ref: list, cand: list) -> tuple[list[dict[str, Any]], str | None]:
    """The records of one run pair's buckets (:func:`length_buckets`), or none and the reason the
    two sides are not comparable."""
    if [_bucket_key(b) for b in ref] != [_bucket_key(b) for b in cand]:
        return [], "the two runs' lengths.json hold different buckets (other context or options)"
    out = []
    for br, bc in zip(ref, cand):
        if not _same_sequences(br, bc):
            return [], (f"bucket {br['by']} [{br['lo']}, {br['hi']}) was evaluated on other sequences on "
                        "the two sides (different data or options of analyze lengths)")
        if br.get("loss") is None and bc.get("loss") is None:
            continue   # an empty bucket on both sides: no tokens, nothing to compare
        if br.get("loss") is None or bc.get("loss") is None:
            return [], f"bucket {br['by']} [{br['lo']}, {br['hi']}) has a loss on one side only"
        w = np.asarray(br.get("seq_tokens") or [], float)
        sr, sc = (np.asarray(b.get("seq_loss") or [], float) for b in (br, bc))
        if w.size and sr.size == w.size and sc.size == w.size:
            diff, se = weighted_paired_mean(sc - sr, w)   # module docstring: one formula, shared
        else:   # no per-sequence losses: the bucket losses' difference, without an s.e.
            diff, se = float(bc["loss"]) - float(br["loss"]), None
        if diff is None:
            continue
        out.append({"tier": tier, "seed": seed, "by": br["by"], "lo": br["lo"], "hi": br["hi"],
                    "diff": diff, "se": se,
                    "n_sequences": int(br.get("n_sequences", 0)), "n_tokens": int(br.get("n_tokens", 0))})
    return out, None
