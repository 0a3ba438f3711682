"""Dyck languages: a seeded generator, the "close the open brackets" task, its exact scorer,
and the in-context-learning (ICL) prompt that the project's BPE tokenizer encodes.

Alphabet. Up to four bracket types, ``()``, ``[]``, ``{}``, ``<>`` (``n_types`` takes the first
n). Each of the eight characters is one byte, so the byte-level BPE of ``scaling.training.data.corpus``
encodes any bracket string; its vocabulary (trained on Python code and Shakespeare, 4096
tokens) also holds merges such as ``()``, ``((``, ``))``, ``)))``, ``())``, ``])``, ``)]``,
``]]``, ``][``, ``)[``, ``([``, ``{}``, ``>>``, ``>>>``, but none of a bracket with ``=`` or a
newline. The prompt is nevertheless encoded piece by piece (prefix, ``=``, answer, newline
separately), so that the token boundary in front of every answer, the one the model must
continue from, is the same in the demonstrations as in the query, whatever the vocabulary.

Balanced strings. :func:`random_balanced` draws a Dyck word of ``n`` pairs uniformly over
the C_n * t^n words (C_n the Catalan number, t the number of types): the up/down shape by
sequential sampling with the exact path counts (ballot numbers; the number of +-1 walks of m
steps from height h down to 0 that never go below 0 is C(m, (m-h)/2) - C(m, (m-h)/2 - 1) by
the reflection principle), each pair's type uniformly. The step goes up with probability
n(m-1, h+1) / n(m, h), which with u = (m-h)/2 up-steps left reduces to u (h+2) / (m (h+1)): a ratio
of small integers, so a word of 2048 pairs takes milliseconds, not the seconds (and a cache of
big integers) that the counts themselves cost.

Task. Draw a balanced word of n pairs (n uniform in [min_pairs, max_pairs]) and cut it at a
uniformly chosen interior position where at least one bracket is open; the prompt is the
prefix, the answer the closing sequence of its open brackets, innermost first (as in
BIG-bench's ``dyck_languages``, Suzgun et al. 2019; the SMELT paper's exact protocol is not
known). The answer is unique, so exact match is the metric.

ICL prompt (token ids; BOS first, as every training document starts)::

    <|bos|>{prefix_1}={answer_1}\\n ... {prefix_k}={answer_k}\\n{query prefix}=

Greedy decoding continues from the final ``=``; the completion is the decoded text up to the
first newline, and it is correct iff it equals the answer exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from scaling.common.errors import UserError
from scaling.common.serialize import Record

BRACKET_PAIRS = ("()", "[]", "{}", "<>")
OPEN_TO_CLOSE = {p[0]: p[1] for p in BRACKET_PAIRS}
CLOSE_TO_OPEN = {p[1]: p[0] for p in BRACKET_PAIRS}
SEP = "="
EOL = "\n"
SHOTS = (0, 1, 2, 4, 8, 16, 32)


# ----- the language -----------------------------------------------------------------------

def open_stack(s: str) -> list[str]:
    """The unclosed opening brackets of a Dyck prefix, outermost first.

    Raises ValueError for a character that is not a bracket, or a closer that does not
    match the innermost open bracket (the string is then no Dyck prefix).
    """
    stack: list[str] = []
    for i, ch in enumerate(s):
        if ch in OPEN_TO_CLOSE:
            stack.append(ch)
        elif ch in CLOSE_TO_OPEN:
            if not stack or stack[-1] != CLOSE_TO_OPEN[ch]:
                raise ValueError(f"{s!r} is not a Dyck prefix: {ch!r} at {i} closes nothing open")
            stack.pop()
        else:
            raise ValueError(f"{s!r} holds {ch!r} at {i}, not a bracket")
    return stack


def closing(prefix: str) -> str:
    """The shortest string that balances a Dyck prefix: its open brackets closed, innermost first."""
    return "".join(OPEN_TO_CLOSE[ch] for ch in reversed(open_stack(prefix)))


def is_balanced(s: str) -> bool:
    """True iff ``s`` is a (possibly empty) word of the Dyck language over the four bracket types."""
    try:
        return not open_stack(s)
    except ValueError:
        return False


def n_paths(steps: int, height: int) -> int:
    """+-1 walks of ``steps`` steps from ``height`` to 0 never below 0: C(m, u) - C(m, u-1), u = (m-h)/2
    (the sampler uses only the ratio of two of them; see the module docstring)."""
    if height < 0 or height > steps or (steps - height) % 2:
        return 0
    u = (steps - height) // 2
    return math.comb(steps, u) - (math.comb(steps, u - 1) if u >= 1 else 0)


def random_balanced(rng: np.random.Generator, n_pairs: int, n_types: int) -> str:
    """A Dyck word of ``n_pairs`` pairs over the first ``n_types`` bracket types, uniform over all
    C_n * n_types^n such words (exact path counts; see the module docstring)."""
    _check_types(n_types)
    if n_pairs < 0:
        raise UserError(f"n_pairs must be >= 0, got {n_pairs}")
    out: list[str] = []
    stack: list[str] = []
    height, remaining = 0, 2 * n_pairs
    for _ in range(2 * n_pairs):
        ups = (remaining - height) // 2
        # = n_paths(remaining - 1, height + 1) / n_paths(remaining, height), the same correctly
        # rounded float (int / int), so the words are those the counts themselves would draw
        if rng.random() < ups * (height + 2) / (remaining * (height + 1)):
            ch = BRACKET_PAIRS[int(rng.integers(n_types))][0]
            stack.append(ch)
            height += 1
        else:
            ch = OPEN_TO_CLOSE[stack.pop()]
            height -= 1
        out.append(ch)
        remaining -= 1
    return "".join(out)


def _check_types(n_types: int) -> None:
    if not 1 <= n_types <= len(BRACKET_PAIRS):
        raise UserError(f"n_types must be in 1..{len(BRACKET_PAIRS)}, got {n_types}")


# ----- the completion task ----------------------------------------------------------------

@dataclass(frozen=True)
class DyckProblem:
    """One completion problem: ``answer`` = closing(``prompt``), never empty."""

    prompt: str
    answer: str

    def is_correct(self, generated: str) -> bool:
        """Exact match of the generated text, up to its first newline, with the answer."""
        return extract_completion(generated) == self.answer


MAX_PAIRS = 2048  # prompts up to 4095 characters: beyond any context the proxies train with


@dataclass(frozen=True)
class DyckTask(Record):
    """The "close the open brackets" task: words of ``min_pairs..max_pairs`` pairs over
    ``n_types`` bracket types, cut where at least one bracket is open.

    Prompts are at most ``2 * max_pairs - 1`` characters, answers at most ``max_pairs``.
    """

    n_types: int = 3
    min_pairs: int = 2
    max_pairs: int = 8

    def __post_init__(self) -> None:
        _check_types(self.n_types)
        if not 1 <= self.min_pairs <= self.max_pairs <= MAX_PAIRS:
            raise UserError(f"need 1 <= min_pairs <= max_pairs <= {MAX_PAIRS} (a prompt of 2 max_pairs - 1 "
                            f"characters), got {self.min_pairs}, {self.max_pairs}")

    @property
    def max_prompt_chars(self) -> int:
        return 2 * self.max_pairs - 1

    @property
    def max_answer_chars(self) -> int:
        return self.max_pairs

    def sample(self, rng: np.random.Generator) -> DyckProblem:
        n = int(rng.integers(self.min_pairs, self.max_pairs + 1))
        word = random_balanced(rng, n, self.n_types)
        depth = np.cumsum([1 if ch in OPEN_TO_CLOSE else -1 for ch in word])
        cuts = [i + 1 for i in range(len(word) - 1) if depth[i] > 0]  # prefix word[:i+1] has open brackets
        prefix = word[:cuts[int(rng.integers(len(cuts)))]]
        return DyckProblem(prefix, closing(prefix))


def extract_completion(generated: str) -> str:
    """The generated text up to (not including) the first newline."""
    return generated.split(EOL, 1)[0]


MAX_REDRAWS = 10_000  # per demonstration; only a task with (almost) one prompt needs many


def icl_trials(task: DyckTask, n_trials: int, max_shots: int, seed: int
               ) -> list[tuple[list[DyckProblem], DyckProblem]]:
    """``n_trials`` (demonstrations, query) pairs with ``max_shots`` demonstrations each.

    Trial i draws its query from ``default_rng([seed, 0, i])`` and its demonstrations from
    ``default_rng([seed, 1, i])``, so every k uses the same queries and the k-shot
    demonstrations are the first k of the ``max_shots`` ones (nested designs: differences
    between k are not differences between query sets).

    No demonstration has the query's prompt: a draw equal to it is discarded and the next one
    from the same generator taken, so the demonstrations are the first ``max_shots`` draws of
    that stream that differ from the query. Otherwise the query's answer sits verbatim in its
    own prompt (with the default task and 200 trials, 40 queries at k = 32) and copying it would
    count as in-context learning. The rule depends on the query and the stream only, not on
    ``max_shots``, so the nesting above holds. Demonstrations may still repeat one another.
    UserError for a task whose only prompt is the query's (one bracket type, one pair).
    """
    trials = []
    for i in range(n_trials):
        query = task.sample(np.random.default_rng([seed, 0, i]))
        drng = np.random.default_rng([seed, 1, i])
        demos = []
        for _ in range(max_shots):
            for _ in range(MAX_REDRAWS):
                demo = task.sample(drng)
                if demo.prompt != query.prompt:
                    break
            else:
                raise UserError(f"cannot draw a demonstration unlike the query {query.prompt!r}: the task "
                                f"({task.n_types} bracket types, {task.min_pairs}-{task.max_pairs} pairs) "
                                "has (almost) no other prompt; allow more pairs or bracket types")
            demos.append(demo)
        trials.append((demos, query))
    return trials


# ----- the prompt, as tokens --------------------------------------------------------------

class Tokenizer(Protocol):  # the subset of ``tokenizers.Tokenizer`` used here
    def encode(self, sequence: str, add_special_tokens: bool = ...): ...
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


@dataclass(frozen=True)
class ICLPrompt:
    """A tokenised k-shot prompt.

    ids             token ids, BOS first, ending with the query's separator
    answer          the query's answer (what greedy decoding should produce)
    answer_spans    [start, end) token ranges of the k demonstration answers
    query_span      [start, end) token range of the query line (its prefix and separator)
    """

    ids: tuple[int, ...]
    answer: str
    answer_spans: tuple[tuple[int, int], ...]
    query_span: tuple[int, int]

    @property
    def n_shots(self) -> int:
        return len(self.answer_spans)

    def __len__(self) -> int:
        return len(self.ids)


class PromptEncoder:
    """Encodes ICL prompts with one tokenizer, piece by piece (see the module docstring)."""

    def __init__(self, tokenizer: Tokenizer, bos_id: int = 0):
        self.tokenizer = tokenizer
        self.bos_id = bos_id
        self._cache: dict[str, tuple[int, ...]] = {}

    def piece(self, text: str) -> tuple[int, ...]:
        ids = self._cache.get(text)
        if ids is None:
            ids = tuple(self.tokenizer.encode(text, add_special_tokens=False).ids)
            if self.tokenizer.decode(list(ids)) != text:
                raise UserError(f"the tokenizer does not round-trip {text!r}")
            self._cache[text] = ids
        return ids

    def build(self, demos: Sequence[DyckProblem], query: DyckProblem) -> ICLPrompt:
        ids: list[int] = [self.bos_id]
        spans = []
        for d in demos:
            ids += self.piece(d.prompt) + self.piece(SEP)
            start = len(ids)
            ids += self.piece(d.answer)
            spans.append((start, len(ids)))
            ids += self.piece(EOL)
        q0 = len(ids)
        ids += self.piece(query.prompt) + self.piece(SEP)
        return ICLPrompt(tuple(ids), query.answer, tuple(spans), (q0, len(ids)))

    def eol_ids(self) -> tuple[int, ...]:
        return self.piece(EOL)


def shot_counts(requested: Sequence[int] = SHOTS) -> list[int]:
    """Sorted, de-duplicated shot counts; UserError for a negative one."""
    ks = sorted(set(int(k) for k in requested))
    if not ks or ks[0] < 0:
        raise UserError(f"shot counts must be >= 0, got {list(requested)}")
    return ks


def fits(prompt: ICLPrompt, seq_len: int, max_new_tokens: int) -> bool:
    """Whether the prompt and ``max_new_tokens`` generated tokens fit in a context of ``seq_len``."""
    return len(prompt) + max_new_tokens <= seq_len


def max_fitting_shots(encoder: PromptEncoder, trials, seq_len: int, max_new_tokens: int,
                      shots: Sequence[int]) -> list[int]:
    """The shot counts whose prompts, for every trial, fit the context with room to generate."""
    ok = []
    for k in shots:
        if all(fits(encoder.build(d[:k], q), seq_len, max_new_tokens) for d, q in trials):
            ok.append(k)
    return ok

