"""Mechanism analyses of trained runs (SMELT paper, arXiv 2609.01343, "Analyses"; numbers in
shared/reference/smelt_paper.md): the attention sink per layer pass, the loss (and the
SMELT-over-Baseline gain) by sample length and token position, and in-context learning on a
Dyck-language completion task.

Each analysis is a function of a loaded run returning a frozen result with ``summary()``,
``to_dict()``/``from_dict()`` and ``to_frame()`` (pandas); :func:`save_result` writes it to
``runs/<run>/analysis/<kind>.json`` and :func:`load_result` reads it back, so notebooks need not
recompute; ``scaling.plots.figures`` (``sink``, ``lengths``, ``icl``) draws them. All losses are
natural-log cross-entropies in nats per token.

A run is a folder written by the trainer (``scaling.training.runlog``): ``config.json`` (``model``: the
ModelConfig; ``data_spec`` and ``data``: the corpus spec and its provenance) and the final
weights ``final_weights.safetensors``.
:func:`load_run` rebuilds the model from them; the tokenizer and validation data come from the
run's corpus (``scaling.training.corpus.load_corpus`` of the recorded spec), checked against the
tokenizer hash recorded at training time.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import torch

from scaling.accounting.config import ModelConfig
from scaling.analysis.dyck import SHOTS, DyckTask, ICLPrompt, PromptEncoder, fits, icl_trials, shot_counts
from scaling.common.errors import UserError
from scaling.common.serialize import to_json
from scaling.training import runlog
from scaling.training.corpus import BOS_ID, EOS_ID, Corpus, DataSpec, load_corpus
from scaling.training.model import MoETransformer

ANALYSIS_DIR = "analysis"
EVAL_DATA = "eval_data"
# What of a corpus folder the analyses read (tokenizer, validation split, provenance).
_EVAL_FILES = ("provenance.json", "tokenizer.json", "val.npy", "val_offsets.npy", "val_names.json")
KINDS = ("sink", "sink_dyck", "lengths", "lengths_gain", "icl")
ARCH_ORDER = {"baseline": 0, "smelt": 1}


# ----- runs -------------------------------------------------------------------------------

def _model_config(meta: dict, where: Path) -> ModelConfig:
    model = meta.get("model")
    if not isinstance(model, dict):
        raise UserError(f"{where / runlog.CONFIG} has no model config (key 'model')")
    return ModelConfig.from_dict(model)


def _data_spec(meta: dict, where: Path) -> tuple[DataSpec, dict]:
    """The run's DataSpec (``data_spec``) and the corpus provenance recorded at training (``data``)."""
    spec = meta.get("data_spec")
    if not isinstance(spec, dict):
        raise UserError(f"{where / runlog.CONFIG} has no data spec (key 'data_spec')")
    return DataSpec.from_dict(spec), meta.get("data") or {}


class LoadedRun:
    """A trained run: its folder, config.json, ModelConfig and model (eval mode, no grad).

    ``corpus`` and ``tokenizer`` are built on first use (the corpus build takes ~30 s once per
    machine, then it is cached).
    """

    def __init__(self, path: Path, meta: dict, config: ModelConfig, model: MoETransformer):
        self.path, self.meta, self.config, self.model = path, meta, config, model

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def arch(self) -> str:
        return self.config.arch

    @property
    def seq_len(self) -> int:
        return self.config.seq_len

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @cached_property
    def corpus(self) -> Corpus:
        """The run's evaluation data: its shipped ``eval_data/`` snapshot if present (see
        :func:`save_eval_data`), else the corpus of its data spec built on this machine; either
        must carry the tokenizer recorded at training (same SHA-256)."""
        spec, provenance = _data_spec(self.meta, self.path)
        want = (provenance.get("tokenizer") or {}).get("sha256")
        snapshot = self.path / EVAL_DATA
        if (snapshot / "provenance.json").is_file():
            corpus = Corpus(snapshot)
            have = corpus.provenance["tokenizer"]["sha256"]
            if want and want != have:
                raise UserError(f"{snapshot} holds tokenizer {have[:12]}, not the run's {want[:12]}")
            return corpus
        corpus = _corpus(spec)
        have = corpus.provenance["tokenizer"]["sha256"]
        if want and want != have:
            raise UserError(
                f"run {self.name} was trained with tokenizer {want[:12]}, but the corpus built here "
                f"({corpus.path}) has tokenizer {have[:12]}: its sources differ from the training "
                f"machine's (recorded: {_sources_line(provenance)}; "
                f"here: {_sources_line(corpus.provenance)}); "
                f"ship the run with its {EVAL_DATA}/ snapshot (scaling.analysis.mechanisms.save_eval_data)")
        return corpus

    @property
    def tokenizer(self):
        return self.corpus.tokenizer

    def require(self, arch: str | None = None) -> "LoadedRun":
        if arch is not None and self.arch != arch:
            raise UserError(f"run {self.name} is a {self.arch} run; this needs a {arch} run")
        return self

    def __repr__(self) -> str:
        return f"LoadedRun({self.name!r}, arch={self.arch!r}, path={str(self.path)!r})"


@lru_cache(maxsize=8)
def _corpus(spec: DataSpec) -> Corpus:
    """One Corpus per spec and process (assembling the sources to find the cache key takes ~2 s)."""
    return load_corpus(spec)


def _sources_line(provenance: dict) -> str:
    return ", ".join(f"{s.get('name')} {s.get('version')} sha {str(s.get('sha256'))[:8]}"
                     for s in provenance.get("sources", [])) or "unknown"


def load_run(path: Path | str, device: str | torch.device = "cpu") -> LoadedRun:
    """Load ``runs/<run>``: config.json -> ModelConfig -> MoETransformer with the run's final weights.

    Raises UserError (one line) for a missing folder, a folder without config.json, a run
    without final weights (train with ``--save-final-weights``), or weights that do not fit
    the config.
    """
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_dir():
        raise UserError(f"no run folder {path}")
    cfg_file = path / runlog.CONFIG
    if not cfg_file.is_file():
        raise UserError(f"{path} is not a run folder (no {runlog.CONFIG})")
    try:
        meta = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"{cfg_file} is not valid JSON: {exc}") from None
    config = _model_config(meta, path)
    weights = path / runlog.WEIGHTS
    if not weights.is_file():
        raise UserError(f"run {path.name} has no weights ({runlog.WEIGHTS}); the analyses need a "
                        "trained checkpoint: train it with --save-final-weights")
    try:
        state = load_file(str(weights), device="cpu")
    except (SafetensorError, OSError) as exc:
        raise UserError(f"cannot read {weights}: {exc}") from None
    model = MoETransformer(config)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        raise UserError(f"weights of run {path.name} do not fit its config: {' '.join(first[:2])}") from None
    model.eval().requires_grad_(False).to(device)
    return LoadedRun(path, meta, config, model)


def save_eval_data(run_dir: Path | str) -> Path:
    """Snapshot the evaluation data of a run into ``<run_dir>/eval_data/`` (~0.5 MB for the
    default corpus): the tokenizer, the validation split and the provenance of its corpus, plus
    an empty ``train.npy`` so the folder opens as a ``scaling.training.corpus.Corpus`` (training batches
    from it raise UserError). A run shipped with it (and its weights) is analysed on any machine
    without rebuilding the corpus, even where the Python standard library differs."""
    import shutil

    run = load_run(run_dir)
    if (run.path / EVAL_DATA / "provenance.json").is_file():
        return run.path / EVAL_DATA
    source = run.corpus.path  # built and checked against the recorded tokenizer
    dest = run.path / EVAL_DATA
    tmp = run.path / f".{EVAL_DATA}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name in _EVAL_FILES:
        shutil.copy2(source / name, tmp / name)
    np.save(tmp / "train.npy", np.zeros(0, dtype=np.uint16))
    tmp.rename(dest)
    return dest


def load_runs(paths: Sequence[Path | str], device: str | torch.device = "cpu") -> list[LoadedRun]:
    if not paths:
        raise UserError("no runs given")
    runs = [load_run(p, device) for p in paths]
    names = [r.name for r in runs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UserError(f"more than one run named {', '.join(dup)}: results are keyed by run folder name")
    return runs


def pair_runs(runs: Sequence[LoadedRun]) -> tuple[LoadedRun, LoadedRun]:
    """(baseline, smelt) from exactly one run of each architecture; UserError otherwise."""
    archs = [r.arch for r in runs]
    if len(runs) != 2 or sorted(archs) != ["baseline", "smelt"]:
        raise UserError("a SMELT-minus-Baseline gain needs one baseline and one smelt run; got "
                        + (", ".join(f"{r.name} ({r.arch})" for r in runs) or "none"))
    base, smelt = sorted(runs, key=lambda r: ARCH_ORDER[r.arch])
    return base, smelt


# ----- shared result plumbing -------------------------------------------------------------

def _f(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


class _Result:
    """to_dict / from_dict / JSON for the frozen results below (nested dataclasses, tuples)."""

    kind: str = ""
    _nested: dict[str, type] = {}

    def to_dict(self) -> dict:
        return json.loads(to_json(dataclasses.asdict(self), indent=None))

    @classmethod
    def from_dict(cls, data: dict):
        kwargs = {}
        for f in dataclasses.fields(cls):
            if f.name not in data:
                continue
            value = data[f.name]
            sub = cls._nested.get(f.name)
            if sub is not None:
                value = tuple(sub.from_dict(v) if hasattr(sub, "from_dict") else sub(**v) for v in value)
            elif isinstance(value, list):
                value = tuple(value)
            kwargs[f.name] = value
        return cls(**kwargs)

    def to_json(self) -> str:
        return to_json(self.to_dict())

    @property
    def result_kind(self) -> str:
        """The file name under analysis/ (without .json)."""
        return self.kind


def save_result(result: _Result, run_dir: Path | str, kind: str | None = None) -> Path:
    """Write ``result`` to ``<run_dir>/analysis/<kind>.json`` (atomic) and return the path."""
    kind = kind or result.result_kind
    folder = Path(run_dir) / ANALYSIS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{kind}.json"
    runlog.write_json(path, {"kind": kind, "result": result.to_dict()})
    return path


def load_result(run_dir: Path | str, kind: str):
    """Read back ``<run_dir>/analysis/<kind>.json`` as its result object."""
    classes = {"sink": SinkResult, "sink_dyck": SinkResult, "lengths": LengthsResult,
               "lengths_gain": LengthGain, "icl": ICLResult}
    if kind not in classes:
        raise UserError(f"unknown analysis kind {kind!r}; one of {', '.join(classes)}")
    path = Path(run_dir) / ANALYSIS_DIR / f"{kind}.json"
    if not path.is_file():
        raise UserError(f"no saved {kind} analysis at {path}; run `smelt-scale analyze` first")
    return classes[kind].from_dict(json.loads(path.read_text())["result"])


def _batches(items: Sequence, size: int) -> Iterable[Sequence]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


# ----- 1. attention sink ------------------------------------------------------------------

@dataclass(frozen=True)
class PassMass:
    """Mean attention mass of one layer pass (averaged over heads, query positions, sequences).

    bos_mass      on key position 0 (the BOS token)
    answer_mass   on the tokens of the demonstration answers (Dyck probe only, else None)
    other_mass    on all other keys; bos + answer + other = 1 up to rounding
    """

    layer: int
    pass_: int
    bos_mass: float
    other_mass: float
    answer_mass: float | None = None

    def to_dict(self) -> dict:
        d = {"layer": self.layer, "pass": self.pass_, "bos_mass": self.bos_mass,
             "other_mass": self.other_mass}
        if self.answer_mass is not None:
            d["answer_mass"] = self.answer_mass
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "PassMass":
        return cls(int(d["layer"]), int(d["pass"]), float(d["bos_mass"]), float(d["other_mass"]),
                   None if d.get("answer_mass") is None else float(d["answer_mass"]))


@dataclass(frozen=True)
class SinkResult(_Result):
    """Attention mass per layer pass of one run, in execution order.

    probe         "bos": validation documents, every query position >= 1;
                  "dyck": k-shot Dyck ICL prompts, the query line's positions, with the mass on
                  the demonstration answers reported separately (the paper's probe)
    n_sequences   sequences averaged over; n_queries query positions in all
    """

    run: str
    arch: str
    probe: str
    n_sequences: int
    n_queries: int
    seed: int
    passes: tuple[PassMass, ...]
    shots: int | None = None

    kind = "sink"
    _nested = {"passes": PassMass}

    def to_dict(self) -> dict:
        d = {"run": self.run, "arch": self.arch, "probe": self.probe, "n_sequences": self.n_sequences,
             "n_queries": self.n_queries, "seed": self.seed, "shots": self.shots,
             "passes": [p.to_dict() for p in self.passes]}
        return json.loads(to_json(d, indent=None))

    @property
    def result_kind(self) -> str:
        return "sink" if self.probe == "bos" else "sink_dyck"

    def to_frame(self):
        import pandas as pd

        rows = [{"run": self.run, "arch": self.arch, **p.to_dict()} for p in self.passes]
        return pd.DataFrame(rows)

    def summary(self) -> str:
        lines = [f"{self.run} ({self.arch}), {self.probe} probe: mean attention mass over "
                 f"{self.n_sequences} sequences, {self.n_queries} query positions"]
        for p in self.passes:
            extra = f"  answers {p.answer_mass:.3f}" if p.answer_mass is not None else ""
            lines.append(f"  layer {p.layer} pass {p.pass_}: BOS {p.bos_mass:.3f}{extra}  "
                         f"other {p.other_mass:.3f}")
        return "\n".join(lines)


def attention_masses(model: MoETransformer, input_ids: torch.Tensor, queries: torch.Tensor,
                     groups: dict[str, torch.Tensor]
                     ) -> tuple[list[tuple[int, int]], dict[str, np.ndarray], int]:
    """Summed attention mass per layer pass on groups of key positions.

    input_ids  [B, T] token ids; queries [B, T] bool, the query positions to average over;
    groups     name -> [B, T] bool over key positions (disjoint); "other" = the remaining keys.
    For every layer pass and group g: sum over (b, query t) of mean_h sum_{s in g} P[b, h, t, s],
    with P the softmax attention probabilities (causal, so rows sum to 1 over s <= t).
    Returns (schedule [(layer, pass)], {g: [n_passes] sums}, number of query positions).
    """
    with torch.no_grad():
        out = model(input_ids, return_attn=True)
    qmask = queries.to(torch.float64)
    schedule, sums = [], {g: [] for g in (*groups, "other")}
    covered = torch.zeros_like(queries)
    for m in groups.values():
        covered = covered | m
    for entry in out.attn:
        probs = entry["probs"].double().mean(dim=1)  # [B, T, T], head-averaged
        schedule.append((int(entry["layer"]), int(entry["pass"])))
        for g, m in groups.items():
            mass = (probs * m[:, None, :].to(probs.dtype)).sum(-1)  # [B, T] per query
            sums[g].append(float((mass * qmask).sum()))
        rest = (probs * (~covered)[:, None, :].to(probs.dtype)).sum(-1)
        sums["other"].append(float((rest * qmask).sum()))
    return schedule, {g: np.asarray(v) for g, v in sums.items()}, int(queries.sum())


def sink_sequences(run: LoadedRun, n_sequences: int, seed: int) -> list[np.ndarray]:
    """``n_sequences`` validation documents (chosen by ``seed``), each [BOS] + its first tokens,
    cut to the run's context; documents of fewer than 2 tokens are skipped."""
    docs = [toks for _, toks in run.corpus.val_documents() if len(toks) >= 2]
    if not docs:
        raise UserError("the validation split has no document of 2 or more tokens")
    if n_sequences < 1:
        raise UserError(f"the number of sequences must be >= 1, got {n_sequences}")
    order = np.random.default_rng(seed).permutation(len(docs))[:n_sequences]
    return [np.asarray(docs[i][:run.seq_len], dtype=np.int64) for i in sorted(order)]


def _sink_from_sums(run: LoadedRun, probe: str, schedule, sums, n_q, n_seq, seed, shots=None) -> SinkResult:
    passes = []
    for i, (layer, p) in enumerate(schedule):
        passes.append(PassMass(layer, p, sums["bos"][i] / n_q, sums["other"][i] / n_q,
                               sums["answers"][i] / n_q if "answers" in sums else None))
    return SinkResult(run.name, run.arch, probe, n_seq, n_q, seed, tuple(passes), shots)


def _accumulate(total: dict | None, sums: dict) -> dict:
    return dict(sums) if total is None else {g: total[g] + sums[g] for g in total}


def attention_sink(run: LoadedRun, n_sequences: int = 16, seed: int = 0, batch_size: int = 4) -> SinkResult:
    """Mean attention mass on BOS vs the other tokens per layer pass, over validation documents.

    Averaged over heads, query positions t >= 1 (position 0 can only attend to itself) and
    ``n_sequences`` validation documents that start with BOS (token-weighted).
    """
    seqs = sink_sequences(run, n_sequences, seed)
    total, n_q, schedule = None, 0, None
    by_len: dict[int, list[np.ndarray]] = {}
    for s in seqs:
        by_len.setdefault(len(s), []).append(s)
    for T, group in sorted(by_len.items()):
        for chunk in _batches(group, batch_size):
            ids = torch.as_tensor(np.stack(chunk), device=run.device)
            queries = torch.ones_like(ids, dtype=torch.bool)
            queries[:, 0] = False
            bos = torch.zeros_like(queries)
            bos[:, 0] = True
            schedule, sums, n = attention_masses(run.model, ids, queries, {"bos": bos})
            total, n_q = _accumulate(total, sums), n_q + n
    return _sink_from_sums(run, "bos", schedule, total, n_q, len(seqs), seed)


def max_fitting_shots(encoder: PromptEncoder, trials, seq_len: int, max_new_tokens: int,
                      shots: Sequence[int]) -> list[int]:
    """The shot counts whose prompts, for every trial, fit the context with room to generate."""
    ok = []
    for k in shots:
        if all(fits(encoder.build(d[:k], q), seq_len, max_new_tokens) for d, q in trials):
            ok.append(k)
    return ok


def dyck_sink(run: LoadedRun, n_sequences: int = 16, seed: int = 0, shots: int | None = None,
              task: DyckTask = DyckTask(), batch_size: int = 4) -> SinkResult:
    """The paper's Dyck probe: attention mass on BOS, on the demonstration answers and on the
    rest, from the query line's positions (its prefix and separator) of ``n_sequences``
    k-shot Dyck prompts; k = ``shots`` or, by default, the largest of 1..32 that fits."""
    encoder = PromptEncoder(run.tokenizer, BOS_ID)
    candidates = [k for k in SHOTS if k >= 1] if shots is None else [shots]
    if min(candidates) < 1:
        raise UserError(f"the Dyck probe needs at least one demonstration, got {shots}")
    trials = icl_trials(task, n_sequences, max(candidates), seed)
    fitting = max_fitting_shots(encoder, trials, run.seq_len, 0, candidates)
    if not fitting:
        raise UserError(f"a {candidates[0]}-shot Dyck prompt does not fit the context of {run.seq_len} "
                        f"tokens of run {run.name}")
    k = max(fitting)
    prompts = [encoder.build(d[:k], q) for d, q in trials]
    total, n_q, schedule = None, 0, None
    for p in prompts:  # one at a time: prompt lengths differ
        ids = torch.as_tensor([p.ids], device=run.device)
        T = len(p)
        queries = torch.zeros(1, T, dtype=torch.bool, device=run.device)
        queries[0, p.query_span[0]:p.query_span[1]] = True
        bos = torch.zeros_like(queries)
        bos[0, 0] = True
        answers = torch.zeros_like(queries)
        for a, b in p.answer_spans:
            answers[0, a:b] = True
        schedule, sums, n = attention_masses(run.model, ids, queries, {"bos": bos, "answers": answers})
        total, n_q = _accumulate(total, sums), n_q + n
    return _sink_from_sums(run, "dyck", schedule, total, n_q, len(prompts), seed, shots=k)


# ----- 2. loss by sample length and token position ----------------------------------------

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

    @classmethod
    def from_dict(cls, d: dict) -> "LossBucket":
        return cls(d["by"], int(d["lo"]), None if d["hi"] is None else int(d["hi"]), int(d["n_sequences"]),
                   int(d["n_tokens"]), d["loss"], tuple(d.get("seq_loss", ())),
                   tuple(d.get("seq_tokens", ())))

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
class LengthGain(_Result):
    """The gain of one SMELT run over one Baseline run per bucket, and the ratio of the gain on
    long documents (length >= T/8, the paper's 512-4096 at T = 4096) to that on short ones
    (the paper: about 1.52x). None where a side has no tokens."""

    baseline: str
    smelt: str
    buckets: tuple[GainBucket, ...]
    long_gain: float | None
    short_gain: float | None
    long_short_ratio: float | None
    long_from: int

    kind = "lengths_gain"
    _nested = {"buckets": GainBucket}

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([{"baseline": self.baseline, "smelt": self.smelt, **dataclasses.asdict(g)}
                             for g in self.buckets])

    def summary(self) -> str:
        def fmt(x):
            return "-" if x is None else f"{x:+.4f}"

        lines = [f"gain of {self.smelt} (smelt) over {self.baseline} (baseline), "
                 "L_base - L_smelt in nats/token"]
        for g in self.buckets:
            se = "" if g.gain_se is None else f" +- {g.gain_se:.4f}"
            lines.append(f"  {g.by:8s} {_label(g.lo, g.hi):>12s}: {fmt(g.gain)}{se}")
        ratio = "-" if self.long_short_ratio is None else f"{self.long_short_ratio:.2f}x"
        lines.append(f"  documents >= {self.long_from} tokens: {fmt(self.long_gain)}; shorter: "
                     f"{fmt(self.short_gain)}; long/short {ratio} (paper: about 1.52x)")
        return "\n".join(lines)


@dataclass(frozen=True)
class LengthsResult(_Result):
    """Validation loss of one run by document length (documents from BOS, cut to the context)
    and by token position (the fixed validation windows the trainer evaluates on)."""

    run: str
    arch: str
    seq_len: int
    n_documents: int
    n_windows: int
    buckets: tuple[LossBucket, ...]

    kind = "lengths"
    _nested = {"buckets": LossBucket}

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
        for chunk in _batches(idx, batch_size):
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
    """Token-weighted mean of the per-sequence differences L_b - L_s and its ratio-estimator SE."""
    if not b.n_tokens or len(b.seq_loss) != len(s.seq_loss) or b.seq_tokens != s.seq_tokens:
        return None, None
    w = np.asarray(b.seq_tokens, dtype=float)
    d = np.asarray(b.seq_loss) - np.asarray(s.seq_loss)
    gain = float((w * d).sum() / w.sum())
    n = len(w)
    if n < 2:
        return gain, None
    se = float(np.sqrt((w ** 2 * (d - gain) ** 2).sum() * n / (n - 1)) / w.sum())
    return gain, se


def length_gain(baseline: LengthsResult, smelt: LengthsResult) -> LengthGain:
    """SMELT-over-Baseline gain per bucket; the two results must come from the same sequences."""
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

    long_from = max(1, baseline.seq_len // 8)

    def pooled(pred: Callable[[LossBucket], bool]) -> float | None:
        parts = [(b, s) for b, s in zip(baseline.buckets, smelt.buckets) if b.by == "length" and pred(b)]
        w = sum(b.n_tokens for b, _ in parts)
        if not w:
            return None
        return sum(b.n_tokens * (b.loss - s.loss) for b, s in parts if b.n_tokens) / w

    long_g = pooled(lambda b: b.lo >= long_from)
    short_g = pooled(lambda b: b.lo < long_from)
    ratio = long_g / short_g if long_g is not None and short_g else None
    return LengthGain(baseline.run, smelt.run, tuple(out), long_g, short_g, ratio, long_from)


# ----- 3. in-context learning on Dyck -----------------------------------------------------

def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (Wilson 1927; Agresti & Coull 1998):
    (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n), z the normal quantile."""
    from statistics import NormalDist

    if n <= 0:
        return (math.nan, math.nan)
    if not 0 <= successes <= n:
        raise ValueError(f"successes {successes} outside 0..{n}")
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # At p = 0 (p = 1) the lower (upper) end is exactly 0 (1); rounding would leave 1e-17.
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


def greedy_decode(model: MoETransformer, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                  stop: Callable[[list[int]], bool], batch_size: int = 32) -> list[list[int]]:
    """Greedy continuations of token-id prompts, up to ``max_new_tokens`` each or until
    ``stop(generated ids)`` is true.

    Prompts are right-padded into one batch: with causal attention and per-token routing
    (no capacity, nothing dropped) the logits at a row's last real position do not depend on
    the padding after it, so each step is one forward pass of the batch (no KV cache).
    """
    device = next(model.parameters()).device
    results: list[list[int]] = [[] for _ in prompts]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths together
    for chunk in _batches(order, batch_size):
        lens = [len(prompts[i]) for i in chunk]
        width = max(lens) + max_new_tokens
        ids = torch.full((len(chunk), width), EOS_ID, dtype=torch.long, device=device)
        for r, i in enumerate(chunk):
            ids[r, :lens[r]] = torch.as_tensor(list(prompts[i]), device=device)
        cur = torch.as_tensor(lens, device=device)
        done = [False] * len(chunk)
        for _ in range(max_new_tokens):
            live = [r for r in range(len(chunk)) if not done[r]]
            if not live:
                break
            upto = int(cur.max())
            with torch.no_grad():
                logits = model(ids[:, :upto]).logits
            nxt = logits[torch.arange(len(chunk), device=device), cur - 1].argmax(-1)
            for r in live:
                t = int(nxt[r])
                ids[r, int(cur[r])] = t
                results[chunk[r]].append(t)
                cur[r] += 1
                if t == EOS_ID or stop(results[chunk[r]]):
                    done[r] = True
    return results


@dataclass(frozen=True)
class ShotAccuracy:
    """Exact-match accuracy with k demonstrations: correct of n, Wilson 95% interval."""

    k: int
    n: int
    correct: int
    accuracy: float
    ci_low: float
    ci_high: float
    mean_prompt_tokens: float


@dataclass(frozen=True)
class ICLResult(_Result):
    """Dyck completion accuracy by number of in-context demonstrations k (greedy decoding,
    exact match). ``skipped`` lists requested k whose prompts do not fit the context."""

    run: str
    arch: str
    seq_len: int
    task: dict
    n_trials: int
    seed: int
    confidence: float
    shots: tuple[ShotAccuracy, ...]
    skipped: tuple[int, ...] = ()

    kind = "icl"
    _nested = {"shots": ShotAccuracy}

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame([{"run": self.run, "arch": self.arch, **dataclasses.asdict(s)}
                             for s in self.shots])

    def summary(self) -> str:
        lines = [f"{self.run} ({self.arch}): Dyck completion, {self.n_trials} trials, task {self.task}"]
        for s in self.shots:
            lines.append(f"  k={s.k:>2d}: {100 * s.accuracy:5.1f}%  "
                         f"[{100 * s.ci_low:.1f}, {100 * s.ci_high:.1f}]"
                         f"  ({s.correct}/{s.n}, prompt ~{s.mean_prompt_tokens:.0f} tokens)")
        if self.skipped:
            lines.append(f"  not fitting the {self.seq_len}-token context: "
                         f"k = {', '.join(map(str, self.skipped))}")
        return "\n".join(lines)


def icl_accuracy(run: LoadedRun, shots: Sequence[int] = SHOTS, n_trials: int = 200, seed: int = 0,
                 task: DyckTask = DyckTask(), confidence: float = 0.95, batch_size: int = 32) -> ICLResult:
    """Dyck "close the open brackets" accuracy with k in-context demonstrations.

    For every k, the same ``n_trials`` queries (``scaling.analysis.dyck.icl_trials``, seeded) with
    nested demonstrations; greedy decoding of at most ``task.max_answer_chars + 1`` tokens
    (every token decodes to >= 1 character, so the answer and its newline always fit), the
    completion up to the first newline compared exactly with the answer. A k is kept only if
    all its prompts plus that budget fit the run's context.
    """
    ks = shot_counts(shots)
    if n_trials < 1:
        raise UserError(f"the number of trials must be >= 1, got {n_trials}")
    encoder = PromptEncoder(run.tokenizer, BOS_ID)
    budget = task.max_answer_chars + 1
    trials = icl_trials(task, n_trials, max(ks), seed)
    keep = max_fitting_shots(encoder, trials, run.seq_len, budget, ks)
    skipped = tuple(k for k in ks if k not in keep)
    if not keep:
        raise UserError(f"no requested shot count fits the {run.seq_len}-token context of run {run.name}")
    tok = run.tokenizer
    eol = "\n"

    def stop(gen: list[int]) -> bool:
        return eol in tok.decode(gen)

    rows = []
    for k in keep:
        prompts: list[ICLPrompt] = [encoder.build(d[:k], q) for d, q in trials]
        outs = greedy_decode(run.model, [p.ids for p in prompts], budget, stop, batch_size)
        correct = sum(q.is_correct(tok.decode(o)) for (_, q), o in zip(trials, outs))
        lo, hi = wilson_interval(correct, n_trials, confidence)
        rows.append(ShotAccuracy(k, n_trials, int(correct), correct / n_trials, lo, hi,
                                 float(np.mean([len(p) for p in prompts]))))
    return ICLResult(run.name, run.arch, run.seq_len, task.to_dict(), n_trials, seed, confidence,
                     tuple(rows), skipped)


# ----- display helpers ----------------------------------------------------------------

def pass_order(results: Sequence[SinkResult]) -> list[tuple[int, int]]:
    """The (layer, pass) rows to show several runs on: the execution order of the run with
    the most passes, then any pass only another run has."""
    longest = max(results, key=lambda r: len(r.passes))
    keys = [(p.layer, p.pass_) for p in longest.passes]
    for r in results:
        keys += [(p.layer, p.pass_) for p in r.passes if (p.layer, p.pass_) not in keys]
    return keys
