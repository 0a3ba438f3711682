"""Paired comparison of two architectures at matched (tier, budget, seed): candidate minus reference.

A *pair* is the candidate's and the reference's validation loss (nats/token) at the same tier,
budget index and seed; the two runs of a pair are compute-matched (FLOPs/token, non-embedding
parameters, KV cache), see the same batches (batches are a function of seed and step) and are
evaluated on the same held-out split. d = L_candidate - L_reference: negative = candidate better.

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

Sign test: the number of pairs with d < 0 against Binomial(n, 1/2), exact two-sided p-value
(ties, d == 0, are dropped). It treats pairs as independent, which the clustering above says they
are not: read it as a description, not as a test at the stated level.

Seed spread: the mean over (tier, architecture, budget) of max - min loss across seeds, the scale
of run-to-run noise the paired differences are measured against.

Per source: points carrying ``val_loss/<source>`` (logged when the corpus has several sources) give
the same statistics per source. Per length bucket: ``analysis/lengths.json`` of both runs of a pair
(``smelt-scale analyze lengths``) gives the per-bucket difference, its s.e. over the paired
evaluation sequences, at that run's final weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy.stats import binomtest

from scaling.common.errors import UserError
from scaling.common.files import read_json

CLUSTERS = ("run", "seed", "none")
SOURCE_PREFIX = "val_loss/"
_KEYS = ("tier", "budget_index", "seed")


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

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "mean": self.mean, "se": self.se, "n_pairs": self.n_pairs,
                "se_iid": self.se_iid, "n_clusters": self.n_clusters,
                "n_candidate_better": self.n_candidate_better, "sign_test_p": self.sign_p,
                "tokens": self.tokens}


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
    by_source: Mapping[str, PairStats] = field(default_factory=dict)
    by_length: tuple[Mapping[str, Any], ...] = ()
    notes: tuple[str, ...] = ()

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
            "seed_spread": self.seed_spread, "n_seeds": self.n_seeds,
            "by_tier": [s.to_dict() for s in self.by_tier],
            "by_budget": [s.to_dict() for s in self.by_budget],
            "cells": [s.to_dict() for s in self.cells],
            "by_source": {k: v.to_dict() for k, v in self.by_source.items()},
            "by_length": [dict(b) for b in self.by_length],
            "notes": list(self.notes),
        }

    def summary(self) -> str:
        def line(s: PairStats) -> str:
            se = "   -  " if s.se is None else f"{s.se:.4f}"
            p = "-" if s.sign_p is None else f"{s.sign_p:.3g}"
            return (f"{s.label:>24} {s.mean:+.4f} {se} {s.n_pairs:>5} {s.n_clusters:>4} "
                    f"{s.n_candidate_better:>4} {p:>7}")
        head = f"{'':>24} {'mean':>7} {'se':>6} {'pairs':>5} {'clus':>4} {'cand<':>4} {'sign p':>7}"
        out = [f"{self.candidate} - {self.reference} validation loss (nats/token), s.e. clustered by "
               f"{self.cluster}", head, line(self.overall)]
        out += [line(s) for s in (*self.by_tier, *self.by_budget)]
        out.append(f"{self.candidate} better in {self.n_cells_candidate_better} of {len(self.cells)} cells")
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)


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
    return PairStats(label, n, float(d.mean()), cluster_se(d, keys), se_iid, n_clusters, better, p, tokens)


def _cluster_keys(pairs: pd.DataFrame, cluster: str) -> np.ndarray:
    if cluster == "run":
        return (pairs["tier"].astype(str) + "|" + pairs["seed"].astype(str)).to_numpy()
    if cluster == "seed":
        return pairs["seed"].astype(str).to_numpy()
    return np.arange(len(pairs))


def paired_points(points: pd.DataFrame, reference: str, candidate: str) -> pd.DataFrame:
    """One row per matched (tier, budget_index, seed): columns tier, budget_index, seed, tokens,
    reference, candidate, diff, and ``diff/<source>`` for every ``val_loss/<source>`` both carry.

    ``points``: raw run points (``scaling.fitting.tables.read_runs_dir``) with columns arch, tier,
    seed, budget_index, loss, D.
    """
    need = ["arch", *_KEYS, "loss"]
    missing = [c for c in need if c not in points.columns]
    if missing:
        raise UserError(f"the points lack {', '.join(missing)}: a paired comparison needs run folders "
                        "whose final.json records arch, tier, seed and budget_index")
    archs = sorted(points["arch"].astype(str).unique())
    for g in (reference, candidate):
        if g not in archs:
            raise UserError(f"no runs of architecture {g!r}; architectures: {', '.join(archs)}")
    sources = [c for c in points.columns if str(c).startswith(SOURCE_PREFIX)]
    cols = ["loss", "D", *sources]

    def side(g: str) -> pd.DataFrame:
        sub = points[points["arch"].astype(str) == g]
        dup = sub.duplicated(list(_KEYS))
        if dup.any():
            k = sub.loc[dup, list(_KEYS)].iloc[0].to_dict()
            raise UserError(f"two {g} points share tier {k['tier']}, budget index {k['budget_index']} "
                            f"and seed {k['seed']}: a runs folder must hold each run once")
        return sub.set_index(list(_KEYS))[[c for c in cols if c in sub.columns]]

    ref, cand = side(reference), side(candidate)
    joined = ref.merge(cand, how="inner", left_index=True, right_index=True, suffixes=("_ref", "_cand"))
    if joined.empty:
        raise UserError(f"no (tier, budget, seed) has both a {reference} and a {candidate} run")
    out = pd.DataFrame({
        "reference": joined["loss_ref"].to_numpy(dtype=float),
        "candidate": joined["loss_cand"].to_numpy(dtype=float),
    }, index=joined.index).reset_index()
    out["diff"] = out["candidate"] - out["reference"]
    if "D_ref" in joined:
        out["tokens"] = joined["D_ref"].to_numpy(dtype=float)
    for s in sources:
        if f"{s}_ref" in joined and f"{s}_cand" in joined:
            out["diff/" + s[len(SOURCE_PREFIX):]] = (joined[f"{s}_cand"].to_numpy(dtype=float)
                                                     - joined[f"{s}_ref"].to_numpy(dtype=float))
    return out.sort_values(list(_KEYS), kind="stable").reset_index(drop=True)


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


def seed_spread(points: pd.DataFrame, archs: Sequence[str]) -> tuple[float | None, int]:
    """Mean over (tier, arch, budget) cells with >= 2 seeds of max - min loss across seeds."""
    sub = points[points["arch"].astype(str).isin(archs)]
    g = sub.groupby(["tier", "arch", "budget_index"])["loss"]
    span = (g.max() - g.min())[g.count() >= 2]
    return (float(span.mean()) if len(span) else None), int(sub["seed"].nunique())


def compare(points: pd.DataFrame, reference: str = "baseline", candidate: str = "smelt", *,
            cluster: str = "run", lengths: Sequence[Mapping[str, Any]] = ()) -> CompareResult:
    """Paired comparison of ``candidate`` against ``reference`` (module docstring).

    ``lengths``: per-pair length-bucket records from :func:`length_buckets` (optional).
    """
    if cluster not in CLUSTERS:
        raise UserError(f"unknown clustering {cluster!r}; choose one of: {', '.join(CLUSTERS)}")
    pairs = paired_points(points, reference, candidate)
    notes = []
    by_tier = tuple(pair_stats(g, str(t), cluster) for t, g in pairs.groupby("tier", sort=False))
    by_tier = tuple(sorted(by_tier, key=lambda s: _tier_size(points, s.label)))
    by_budget = tuple(pair_stats(g, f"budget {int(b)}", cluster)
                      for b, g in pairs.groupby("budget_index"))
    cells = tuple(pair_stats(g, f"{t} budget {int(b)}", cluster)
                  for (t, b), g in pairs.groupby(["tier", "budget_index"], sort=False))
    overall = pair_stats(pairs, "overall", cluster)
    if overall.n_clusters < 5 and cluster != "none":
        notes.append(f"only {overall.n_clusters} clusters: the clustered s.e. is itself very uncertain")
    sources = [c[len("diff/"):] for c in pairs.columns if c.startswith("diff/")]
    by_source = {s: pair_stats(pairs, s, cluster, column="diff/" + s) for s in sources}
    if not sources:
        notes.append(f"no per-source loss: the runs record no {SOURCE_PREFIX}<source> values")
    if not lengths:
        notes.append("no per-length-bucket loss: no run pair holds analysis/lengths.json for both sides")
    spread, n_seeds = seed_spread(points, (reference, candidate))
    return CompareResult(reference=reference, candidate=candidate, cluster=cluster, overall=overall,
                         by_tier=by_tier, by_budget=by_budget, cells=cells, pairs=pairs,
                         seed_spread=spread, n_seeds=n_seeds, by_source=by_source,
                         by_length=tuple(lengths), notes=tuple(notes))


def _tier_size(points: pd.DataFrame, tier: str) -> float:
    n = points.loc[points["tier"].astype(str) == tier, "N"] if "N" in points else pd.Series([], dtype=float)
    return float(n.max()) if len(n) else math.inf


# -- length buckets (I/O edge: reads the analyses that `smelt-scale analyze lengths` saved) ------------
def length_buckets(root: Path, points: pd.DataFrame, reference: str, candidate: str, *,
                   warn: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Per-bucket candidate - reference loss for every run pair with ``analysis/lengths.json`` on both sides.

    Each record: run pair (tier, seed), bucket kind (``length`` of the document or token
    ``position``), [lo, hi), difference of the bucket losses, its s.e. over the paired
    evaluation sequences (sd / sqrt(n) of per-sequence differences), sequences and tokens.
    """
    runs = points.drop_duplicates("run")[["run", "arch", "tier", "seed"]]
    by_key: dict[tuple[str, str], dict[str, Path]] = {}
    for r in runs.itertuples(index=False):
        f = root / str(r.run) / "analysis" / "lengths.json"
        if f.exists():
            by_key.setdefault((str(r.tier), str(r.seed)), {})[str(r.arch)] = f
    out: list[dict[str, Any]] = []
    for (tier, seed), files in sorted(by_key.items()):
        if reference not in files or candidate not in files:
            continue
        try:
            ref, cand = (read_json(files[g])["result"]["buckets"]
                         for g in (reference, candidate))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            if warn is not None:
                warn(f"skipping the length buckets of {tier} seed {seed}: unreadable ({exc})")
            continue
        for br, bc in zip(ref, cand):
            if (br.get("by"), br.get("lo"), br.get("hi")) != (bc.get("by"), bc.get("lo"), bc.get("hi")):
                continue
            if br.get("loss") is None or bc.get("loss") is None:
                continue
            sr, sc = np.asarray(br.get("seq_loss", []), float), np.asarray(bc.get("seq_loss", []), float)
            se = (float(np.std(sc - sr, ddof=1) / math.sqrt(sr.size))
                  if sr.size == sc.size and sr.size > 1 else None)
            out.append({"tier": tier, "seed": seed, "by": br["by"], "lo": br["lo"], "hi": br["hi"],
                        "diff": float(bc["loss"]) - float(br["loss"]), "se": se,
                        "n_sequences": int(br.get("n_sequences", 0)), "n_tokens": int(br.get("n_tokens", 0))})
    return out
