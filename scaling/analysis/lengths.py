"""Loss by sample length and token position (SMELT paper, "Analyses"), and SMELT's gain over the
Baseline per bucket from paired per-sequence losses. Losses in nats per token."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import torch

from scaling.analysis.results import Result
from scaling.analysis.runs import LoadedRun, batched
from scaling.common.errors import UserError
from scaling.common.stats import weighted_paired_mean
from scaling.training.model.transformer import MoETransformer


def length_edges(seq_len: int) -> list[int]:
    """Document-length bucket edges in tokens (BOS excluded), adapted to the context T:
    [1, T/16), [T/16, T/8), [T/8, T/4), [T/4, T/2), [T/2, T], then > T (evaluated on its first
    T tokens). For T = 4096 the buckets from T/8 up are the paper's 512-4096-token samples."""
    inner = sorted({max(1, seq_len // d) for d in (16, 8, 4, 2)} - {1})
    return [1, *inner, seq_len + 1]


def position_edges(seq_len: int) -> list[int]:
    """Token-position bucket edges: [0, T/32), [T/32, T/16), ..., [T/2, T)."""
    inner = sorted({seq_len // d for d in (32, 16, 8, 4, 2)} - {0})
    return [0, *inner, seq_len]


@dataclass(frozen=True)
class LossBucket:
    """Mean loss (nats/token) of the tokens in [lo, hi) (``hi`` None = unbounded).

    by            "length": documents of lo <= length < hi tokens; "position": tokens at
                  window positions lo <= t < hi
    n_sequences   documents (or windows) contributing; n_tokens predicted tokens
    seq_loss      per-sequence mean loss of those tokens; seq_tokens their token counts
                  (kept for paired comparisons between runs on the same sequences)
    """

    by: str
    lo: int
    hi: int | None
    n_sequences: int
    n_tokens: int
    loss: float | None
    seq_loss: tuple[float, ...] = ()
    seq_tokens: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        return _label(self.lo, self.hi)


def _label(lo: int, hi: int | None) -> str:
    """Inclusive range text of the bucket [lo, hi)."""
    return f">= {lo}" if hi is None else (f"{lo}" if hi == lo + 1 else f"{lo}-{hi - 1}")


@dataclass(frozen=True)
class GainBucket:
    """SMELT's gain over the Baseline in one bucket: gain = L_baseline - L_smelt (nats/token,
    > 0 when SMELT is better), gain_se its standard error from the paired per-sequence
    differences (ratio estimator; None for a single sequence), rel_gain = gain / L_baseline."""

    by: str
    lo: int
    hi: int | None
    n_tokens: int
    baseline_loss: float | None
    smelt_loss: float | None
    gain: float | None
    gain_se: float | None
    rel_gain: float | None


@dataclass(frozen=True)
class LengthGain(Result, kinds=("lengths_gain",)):
    """The gain of one SMELT run over one Baseline run per bucket, and the ratio of the gain on
    long documents (length >= T/8, the paper's 512-4096 at T = 4096) to that on short ones
    (the paper: about 1.52x).

    long_gain, short_gain     pooled gains G = sum_b n_b g_b / sum_b n_b over the length buckets
                              b of each side (n_b tokens, g_b the bucket's gain); None where a
                              side has no tokens
    long_gain_se, short_gain_se   their standard errors, sqrt(sum_b (n_b / N)^2 se_b^2) with
                              N = sum_b n_b: the buckets hold disjoint documents, so their gains
                              are independent (a stratified estimate with the token totals held
                              fixed); None where a bucket with tokens has no se (one document)
    long_short_ratio          long_gain / short_gain, only where its interval is bounded (below),
                              else None
    ratio_low, ratio_high     Fieller's ``ratio_level`` interval for that ratio (see
                              :func:`fieller_interval`); None with the reason in ``ratio_note``

    The long/short fields are derived from ``buckets`` and ``long_from`` whenever a result is
    built, so results saved before the interval existed read back with it (their old point
    ratio, printed without uncertainty, is dropped where it cannot be supported).
    """

    baseline: str
    smelt: str
    buckets: tuple[GainBucket, ...]
    long_gain: float | None = None
    short_gain: float | None = None
    long_short_ratio: float | None = None
    long_from: int = 1
    long_gain_se: float | None = None
    short_gain_se: float | None = None
    ratio_low: float | None = None
    ratio_high: float | None = None
    ratio_level: float = 0.95
    ratio_note: str | None = None

    kind = "lengths_gain"

    def __post_init__(self) -> None:
        for key, value in _long_short(self.buckets, self.long_from, self.ratio_level).items():
            object.__setattr__(self, key, value)  # derived, never trusted from a file

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([{"baseline": self.baseline, "smelt": self.smelt, **dataclasses.asdict(g)}
                             for g in self.buckets])

    def ratio_text(self) -> str:
        """The long/short ratio with its interval, or "-" and why there is none."""
        if self.long_short_ratio is None:
            return f"- ({self.ratio_note})"
        return (f"{self.long_short_ratio:.2f}x [{self.ratio_low:.2f}, {self.ratio_high:.2f}] "
                f"({100 * self.ratio_level:.0f}% Fieller interval)")

    def summary(self) -> str:
        def fmt(x, se=None):
            return "-" if x is None else f"{x:+.4f}" + ("" if se is None else f" +- {se:.4f}")

        lines = [f"gain of {self.smelt} (smelt) over {self.baseline} (baseline), "
                 "L_base - L_smelt in nats/token"]
        for g in self.buckets:
            lines.append(f"  {g.by:8s} {_label(g.lo, g.hi):>12s}: {fmt(g.gain, g.gain_se)}")
        lines.append(f"  documents >= {self.long_from} tokens: {fmt(self.long_gain, self.long_gain_se)}; "
                     f"shorter: {fmt(self.short_gain, self.short_gain_se)}; long/short {self.ratio_text()} "
                     "(paper: about 1.52x)")
        return "\n".join(lines)


def fieller_interval(a: float, se_a: float, b: float, se_b: float, level: float = 0.95,
                     cov: float = 0.0) -> tuple[float, float] | None:
    """Fieller's confidence interval for the ratio rho = a / b of two normal estimates.

    The interval is the set of rho with (a - rho b)^2 <= z^2 (v_a - 2 rho c + rho^2 v_b)
    (v = se^2, c = cov(a, b), z the two-sided normal quantile of ``level``), i.e. the roots of
    (b^2 - z^2 v_b) rho^2 - 2 (a b - z^2 c) rho + (a^2 - z^2 v_a) = 0:
    rho = [(a b - z^2 c) -+ sqrt(D)] / (b^2 - z^2 v_b),
    D = (a b - z^2 c)^2 - (b^2 - z^2 v_b)(a^2 - z^2 v_a).
    It is a bounded interval iff b^2 > z^2 v_b, i.e. iff the ``level`` interval b +- z se_b
    excludes 0; otherwise the set is unbounded (the whole line or two half-lines) and this
    returns None. Source: E. C. Fieller, "Some problems in interval estimation", J. R. Stat.
    Soc. B 16 (1954) 175-185; V. H. Franz, "Ratios: a short guide to confidence limits and
    proper use", arXiv:0710.2024 (2007), eq. 4.
    """
    z = NormalDist().inv_cdf(0.5 + level / 2)
    q = b * b - z * z * se_b * se_b
    if q <= 0:
        return None
    m = a * b - z * z * cov
    disc = m * m - q * (a * a - z * z * se_a * se_a)
    root = math.sqrt(max(disc, 0.0))  # disc >= 0 whenever q > 0 (it is z^2 (a^2 v_b + v_a q) for c = 0)
    return (m - root) / q, (m + root) / q


def _long_short(buckets: tuple[GainBucket, ...], long_from: int, level: float) -> dict:
    """The pooled long and short gains, their standard errors and the Fieller interval of their
    ratio (the formulas are in :class:`LengthGain` and :func:`fieller_interval`)."""
    out: dict = {}
    for side, members in (("long", [g for g in buckets if g.by == "length" and g.lo >= long_from]),
                          ("short", [g for g in buckets if g.by == "length" and g.lo < long_from])):
        members = [g for g in members if g.n_tokens and g.gain is not None]
        n = sum(g.n_tokens for g in members)
        gain = sum(g.n_tokens * g.gain for g in members) / n if n else None
        se = None
        if n and all(g.gain_se is not None for g in members):
            se = math.sqrt(sum((g.n_tokens / n) ** 2 * g.gain_se ** 2 for g in members))
        out[f"{side}_gain"], out[f"{side}_gain_se"] = gain, se
    a, sa, b, sb = out["long_gain"], out["long_gain_se"], out["short_gain"], out["short_gain_se"]
    ratio = lo = hi = note = None
    if a is None or b is None:
        note = f"no {'long' if a is None else 'short'} documents"
    elif sa is None or sb is None:
        note = (f"the {'long' if sa is None else 'short'}-document gain has no standard error: "
                "one of its buckets holds a single document")
    else:
        interval = fieller_interval(a, sa, b, sb, level)
        if interval is None:
            note = (f"the short-document gain's {100 * level:.0f}% interval "
                    f"{b:+.4f} +- {NormalDist().inv_cdf(0.5 + level / 2) * sb:.4f} includes 0: "
                    "the ratio is unbounded")
        else:
            ratio, (lo, hi) = a / b, interval
    out.update(long_short_ratio=ratio, ratio_low=lo, ratio_high=hi, ratio_note=note)
    return out


@dataclass(frozen=True)
class LengthsResult(Result, kinds=("lengths",)):
    """Validation loss of one run by document length (documents from BOS, cut to the context)
    and by token position (the fixed validation windows the trainer evaluates on)."""

    run: str
    arch: str
    seq_len: int
    n_documents: int
    n_windows: int
    buckets: tuple[LossBucket, ...]

    kind = "lengths"

    def to_dict(self, per_sequence: bool = True) -> dict:
        """As JSON; ``per_sequence=False`` drops the per-sequence losses of each bucket."""
        d = super().to_dict()
        if not per_sequence:
            for b in d["buckets"]:
                b.pop("seq_loss", None)
                b.pop("seq_tokens", None)
        return d

    def to_frame(self):
        import pandas as pd

        rows = [{"run": self.run, "arch": self.arch,
                 **{k: v for k, v in dataclasses.asdict(b).items() if k not in ("seq_loss", "seq_tokens")}}
                for b in self.buckets]
        return pd.DataFrame(rows)

    def summary(self) -> str:
        lines = [f"{self.run} ({self.arch}), context {self.seq_len}: loss by length "
                 f"({self.n_documents} documents) and position ({self.n_windows} windows)"]
        for b in self.buckets:
            loss = "-" if b.loss is None else f"{b.loss:.4f}"
            lines.append(f"  {b.by:8s} {b.label:>12s}: {loss}  ({b.n_tokens} tokens, {b.n_sequences} seqs)")
        return "\n".join(lines)


def _bucket(by: str, lo: int, hi: int | None, per_seq: list[tuple[float, int]]) -> LossBucket:
    per_seq = [(s, n) for s, n in per_seq if n > 0]
    n_tok = sum(n for _, n in per_seq)
    loss = sum(s for s, _ in per_seq) / n_tok if n_tok else None
    return LossBucket(by, lo, hi, len(per_seq), n_tok, loss,
                      tuple(s / n for s, n in per_seq), tuple(n for _, n in per_seq))


def _per_token_loss(model: MoETransformer, inputs: np.ndarray, targets: np.ndarray, device) -> np.ndarray:
    with torch.no_grad():
        out = model(torch.as_tensor(inputs, device=device), torch.as_tensor(targets, device=device),
                    return_per_token_loss=True)
    return out.per_token_loss.double().cpu().numpy()


def loss_by_length(run: LoadedRun, n_windows: int = 64, max_documents: int | None = None,
                   batch_size: int = 16) -> LengthsResult:
    """Loss by document length and by token position (see :class:`LengthsResult`).

    Documents: each validation document d (n tokens, BOS excluded) is scored on [BOS] + its
    first min(n, T) tokens, T the run's context, and lands in the length bucket of n.
    Positions: the ``n_windows`` fixed validation windows (``Corpus.val_windows``), token t
    of a window in the position bucket of t; the token-weighted mean over all positions is
    the run's validation loss on those windows.
    """
    T = run.seq_len
    docs = [toks for _, toks in run.corpus.val_documents() if len(toks) >= 2]
    if max_documents is not None:
        docs = docs[:max_documents]
    if n_windows < 1:
        raise UserError(f"the number of windows must be >= 1, got {n_windows}")
    # documents, grouped by scored length so they batch without padding
    lengths = [len(d) - 1 for d in docs]
    doc_stats: dict[int, tuple[float, int]] = {}
    by_scored: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        by_scored.setdefault(min(n, T), []).append(i)
    for L, idx in by_scored.items():
        for chunk in batched(idx, batch_size):
            win = np.stack([np.asarray(docs[i][:L + 1], dtype=np.int64) for i in chunk])
            loss = _per_token_loss(run.model, win[:, :-1], win[:, 1:], run.device)
            for i, row in zip(chunk, loss):
                doc_stats[i] = (float(row.sum()), L)
    buckets = []
    edges = length_edges(T)
    for lo, hi in zip(edges, [*edges[1:], None]):
        members = [doc_stats[i] for i, n in enumerate(lengths) if n >= lo and (hi is None or n < hi)]
        buckets.append(_bucket("length", lo, hi, members))
    # positions
    inputs, targets = run.corpus.val_windows(T, n_windows)
    pos_loss = np.concatenate([_per_token_loss(run.model, inputs[i:i + batch_size], targets[i:i + batch_size],
                                               run.device) for i in range(0, len(inputs), batch_size)])
    edges = position_edges(T)
    for lo, hi in zip(edges[:-1], edges[1:]):
        part = pos_loss[:, lo:hi]
        buckets.append(_bucket("position", lo, hi, [(float(r.sum()), r.shape[0]) for r in part]))
    return LengthsResult(run.name, run.arch, T, len(docs), len(inputs), tuple(buckets))


def _paired_gain(b: LossBucket, s: LossBucket) -> tuple[float | None, float | None]:
    """Token-weighted mean of the per-sequence differences L_b - L_s and its ratio-estimator SE
    (:func:`scaling.common.stats.weighted_paired_mean`, the formula ``compare`` uses per bucket)."""
    if not b.n_tokens or len(b.seq_loss) != len(s.seq_loss) or b.seq_tokens != s.seq_tokens:
        return None, None
    return weighted_paired_mean(np.asarray(b.seq_loss) - np.asarray(s.seq_loss), b.seq_tokens)


def length_gain(baseline: LengthsResult, smelt: LengthsResult) -> LengthGain:
    """SMELT-over-Baseline gain per bucket (:func:`_paired_gain`), and the pooled long and short
    gains with the Fieller interval of their ratio (:class:`LengthGain`); the two results must come
    from the same sequences."""
    if baseline.arch != "baseline" or smelt.arch != "smelt":
        raise UserError(f"a gain needs a baseline and a smelt run; got {baseline.run} ({baseline.arch}) "
                        f"and {smelt.run} ({smelt.arch})")
    if baseline.seq_len != smelt.seq_len:
        raise UserError(f"runs {baseline.run} and {smelt.run} were trained with different contexts "
                        f"({baseline.seq_len} vs {smelt.seq_len}); their buckets differ")
    key = lambda r: [(b.by, b.lo, b.hi, b.seq_tokens) for b in r.buckets]  # noqa: E731
    if key(baseline) != key(smelt):
        raise UserError(f"runs {baseline.run} and {smelt.run} were evaluated on different sequences "
                        "(different data spec or options)")
    out = []
    for b, s in zip(baseline.buckets, smelt.buckets):
        gain, se = _paired_gain(b, s)
        rel = gain / b.loss if gain is not None and b.loss else None
        out.append(GainBucket(b.by, b.lo, b.hi, b.n_tokens, b.loss, s.loss, gain, se, rel))

    return LengthGain(baseline.run, smelt.run, tuple(out), long_from=max(1, baseline.seq_len // 8))
