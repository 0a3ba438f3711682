"""The attention sink (SMELT paper, "Analyses"): attention mass per layer pass on the BOS token,
over validation documents or, the paper's probe, on k-shot Dyck prompts with the mass on the
demonstration answers apart."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from scaling.analysis.dyck import SHOTS, DyckTask, PromptEncoder, icl_trials, max_fitting_shots
from scaling.analysis.results import Result
from scaling.analysis.runs import LoadedRun, batched
from scaling.common.errors import UserError
from scaling.common.serialize import to_dict
from scaling.training.data.corpus import BOS_ID
from scaling.training.model.transformer import MoETransformer


@dataclass(frozen=True)
class PassMass:
    """Mean attention mass of one layer pass (averaged over heads, query positions, sequences).

    bos_mass      on key position 0 (the BOS token)
    answer_mass   on the tokens of the demonstration answers (Dyck probe only, else None)
    other_mass    on all other keys; bos + answer + other = 1 up to rounding
    """

    layer: int
    pass_: int = field(metadata={"key": "pass"})
    bos_mass: float
    other_mass: float
    answer_mass: float | None = field(default=None, metadata={"omit_none": True})


@dataclass(frozen=True)
class SinkResult(Result, kinds=("sink", "sink_dyck")):
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

    @property
    def result_kind(self) -> str:
        return "sink" if self.probe == "bos" else "sink_dyck"

    def to_frame(self):
        import pandas as pd

        rows = [{"run": self.run, "arch": self.arch, **to_dict(p)} for p in self.passes]
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
        for chunk in batched(group, batch_size):
            ids = torch.as_tensor(np.stack(chunk), device=run.device)
            queries = torch.ones_like(ids, dtype=torch.bool)
            queries[:, 0] = False
            bos = torch.zeros_like(queries)
            bos[:, 0] = True
            schedule, sums, n = attention_masses(run.model, ids, queries, {"bos": bos})
            total, n_q = _accumulate(total, sums), n_q + n
    return _sink_from_sums(run, "bos", schedule, total, n_q, len(seqs), seed)


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



def pass_order(results: Sequence[SinkResult]) -> list[tuple[int, int]]:
    """The (layer, pass) rows to show several runs on: the execution order of the run with
    the most passes, then any pass only another run has."""
    longest = max(results, key=lambda r: len(r.passes))
    keys = [(p.layer, p.pass_) for p in longest.passes]
    for r in results:
        keys += [(p.layer, p.pass_) for p in r.passes if (p.layer, p.pass_) not in keys]
    return keys

