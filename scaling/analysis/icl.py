"""In-context learning (SMELT paper, "Analyses"): Dyck completion accuracy against the number of
in-context demonstrations k, greedy decoding, exact match, Wilson intervals."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from scaling.analysis.decode import greedy_decode
from scaling.analysis.dyck import (
    SHOTS,
    DyckTask,
    ICLPrompt,
    PromptEncoder,
    icl_trials,
    max_fitting_shots,
    shot_counts,
)
from scaling.analysis.results import Result
from scaling.analysis.runs import LoadedRun
from scaling.common.errors import UserError
from scaling.common.stats import wilson_interval  # noqa: F401 - part of this module's API
from scaling.training.data.corpus import BOS_ID


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
class ICLResult(Result, kinds=("icl",)):
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

