"""The Dyck generator, the completion task, its exact scorer and the ICL prompt."""

from __future__ import annotations

import collections
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scaling.analysis.dyck import (
    BRACKET_PAIRS,
    EOL,
    OPEN_TO_CLOSE,
    SEP,
    DyckProblem,
    DyckTask,
    PromptEncoder,
    closing,
    extract_completion,
    fits,
    icl_trials,
    is_balanced,
    n_paths,
    open_stack,
    random_balanced,
    shot_counts,
)
from scaling.common.errors import UserError
from scaling.training.data.corpus import BOS_ID, train_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    # A small byte-level BPE that learns bracket merges such as "((" and "))", like the corpus one.
    text = ["def f(x):\n    return [g(y) for y in {x: (1, 2)}]\n", "(())[[]]{{}}<<>>" * 20,
            "a = b(c(d[e]))\n" * 10]
    return train_tokenizer(text, 300)


# ----- the language -----------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 40), types=st.integers(1, 4))
def test_random_balanced_is_balanced(seed, n, types):
    s = random_balanced(np.random.default_rng(seed), n, types)
    assert len(s) == 2 * n
    assert is_balanced(s)
    assert closing(s) == ""
    assert set(s) <= set("".join(BRACKET_PAIRS[:types]))


def test_random_balanced_is_uniform_over_words():
    # 3 pairs of one type: the 5 (Catalan C_3) words, each with probability 1/5.
    rng = np.random.default_rng(1)
    counts = collections.Counter(random_balanced(rng, 3, 1) for _ in range(10000))
    assert set(counts) == {"((()))", "(()())", "(())()", "()(())", "()()()"}
    for c in counts.values():
        assert abs(c / 10000 - 0.2) < 0.02  # 5 sigma is 0.02
    # 2 pairs of 2 types: C_2 * 2^2 = 8 words, each 1/8
    counts = collections.Counter(random_balanced(rng, 2, 2) for _ in range(8000))
    assert len(counts) == 8 and all(abs(c / 8000 - 0.125) < 0.02 for c in counts.values())


def test_path_counts_are_catalan_and_ballot_numbers():
    for n in range(12):
        assert n_paths(2 * n, 0) == math.comb(2 * n, n) // (n + 1)
    assert n_paths(3, 1) == 2  # from height 1 in 3 steps: UDD, DUD
    assert n_paths(2, 1) == 0 and n_paths(1, 2) == 0 and n_paths(0, 0) == 1


def test_sampler_draws_the_words_the_exact_counts_draw():
    """The sampler's closed-form step probability u (h+2) / (m (h+1)) is the very float of the
    exact count ratio, so it draws, step for step, the words that sampling with the counts drew."""
    for m in range(1, 300):
        for h in range(m % 2, m + 1, 2):
            u = (m - h) // 2
            assert u * (h + 2) / (m * (h + 1)) == n_paths(m - 1, h + 1) / n_paths(m, h), (m, h)

    def by_counts(rng, n_pairs, n_types):
        out, stack, h, m = [], [], 0, 2 * n_pairs
        for _ in range(m):
            up = n_paths(m - 1, h + 1)
            if rng.random() < up / (up + n_paths(m - 1, h - 1)):
                stack.append(BRACKET_PAIRS[int(rng.integers(n_types))][0])
                out.append(stack[-1])
                h += 1
            else:
                out.append(OPEN_TO_CLOSE[stack.pop()])
                h -= 1
            m -= 1
        return "".join(out)

    for seed, (n, t) in enumerate([(1, 1), (5, 2), (40, 4), (257, 3)]):
        rngs = np.random.default_rng(seed), np.random.default_rng(seed)
        assert random_balanced(rngs[0], n, t) == by_counts(rngs[1], n, t)


@pytest.mark.parametrize("prefix, answer", [
    ("(", ")"), ("([{", "}])"), ("()[", "]"), ("(<>[", "])"), ("{[]}(<", ">)"), ("", ""),
    ("(()", ")"), ("<<[", "]>>"),
])
def test_closing_hand_cases(prefix, answer):
    assert closing(prefix) == answer
    assert is_balanced(prefix + answer)


@pytest.mark.parametrize("bad", ["(]", ")", "([)]", "(a)", "<}", "(( )"])
def test_not_a_dyck_prefix(bad):
    with pytest.raises(ValueError):
        open_stack(bad)
    assert not is_balanced(bad)


def test_is_balanced_hand_cases():
    assert is_balanced("") and is_balanced("()[]{}<>") and is_balanced("([{<>}])")
    assert not is_balanced("(") and not is_balanced("(()") and not is_balanced("][")


@pytest.mark.parametrize("generated, correct", [
    ("])", True), ("])\n((", True), ("])\n", True), ("]) ", False), (" ])", False), ("]", False),
    ("])]", False), ("", False), ("\n])", False), ("]}", False),
])
def test_scorer_is_exact(generated, correct):
    assert DyckProblem("([", "])").is_correct(generated) is correct


def test_extract_completion_cuts_at_the_first_newline():
    assert extract_completion("ab\ncd\n") == "ab" and extract_completion("abc") == "abc"


# ----- the task ---------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), types=st.integers(1, 4), lo=st.integers(1, 6), extra=st.integers(0, 8))
def test_task_samples_are_valid_problems(seed, types, lo, extra):
    task = DyckTask(types, lo, lo + extra)
    p = task.sample(np.random.default_rng(seed))
    stack = open_stack(p.prompt)  # a Dyck prefix
    assert stack, "at least one bracket is open"
    assert p.answer == closing(p.prompt) and is_balanced(p.prompt + p.answer)
    assert 1 <= len(p.answer) <= task.max_answer_chars
    assert len(p.prompt) <= task.max_prompt_chars
    assert p.is_correct(p.answer + EOL)


def test_task_rejects_bad_settings():
    for kw in ({"n_types": 0}, {"n_types": 5}, {"min_pairs": 0}, {"min_pairs": 5, "max_pairs": 4}):
        with pytest.raises(UserError):
            DyckTask(**kw)


def test_icl_trials_are_seeded_and_nested():
    task = DyckTask()
    a = icl_trials(task, 5, 8, seed=3)
    assert a == icl_trials(task, 5, 8, seed=3)
    assert a != icl_trials(task, 5, 8, seed=4)
    b = icl_trials(task, 5, 2, seed=3)
    for (da, qa), (db, qb) in zip(a, b):
        assert qa == qb  # the same queries whatever the number of shots
        assert da[:2] == db  # k-shot demonstrations are the first k


@pytest.mark.parametrize("task", [DyckTask(), DyckTask(1, 1, 2), DyckTask(2, 1, 3)],
                         ids=["default", "one-type", "two-types"])
def test_no_trial_shows_its_query_among_its_demonstrations(task):
    """Before the fix the default task put 40 of 200 queries verbatim among their 32 demonstrations."""
    for seed in range(4):
        full = icl_trials(task, 200, 32, seed)
        for k in (1, 2, 4, 8, 16, 32):
            nested = icl_trials(task, 200, k, seed) if k in (1, 8) else [(d[:k], q) for d, q in full]
            for (demos, query), (dfull, qfull) in zip(nested, full):
                assert query == qfull and demos == dfull[:k]  # still nested across k
                assert len(demos) == k and all(d.prompt != query.prompt for d in demos)


def test_demonstrations_are_the_stream_less_the_query():
    """Planted: the demonstrations are the first draws of default_rng([seed, 1, i]) whose prompt differs
    from the query's, in order (so one-type tasks, where "(" is most draws, still fill k)."""
    task = DyckTask(1, 1, 2)
    for i, (demos, query) in enumerate(icl_trials(task, 30, 6, seed=7)):
        rng = np.random.default_rng([7, 1, i])
        stream = [task.sample(rng) for _ in range(200)]
        assert demos == [d for d in stream if d.prompt != query.prompt][:6]
        assert query == task.sample(np.random.default_rng([7, 0, i]))


def test_a_task_with_one_prompt_cannot_hide_the_query():
    with pytest.raises(UserError, match="no other prompt"):
        icl_trials(DyckTask(1, 1, 1), 1, 1, seed=0)
    assert icl_trials(DyckTask(1, 1, 1), 3, 0, seed=0)[0][0] == []  # zero shots need no demonstration


def test_shot_counts():
    assert shot_counts([4, 0, 4, 2]) == [0, 2, 4]
    with pytest.raises(UserError):
        shot_counts([-1, 2])


# ----- the prompt -------------------------------------------------------------------------

def test_prompt_layout(tokenizer):
    enc = PromptEncoder(tokenizer, BOS_ID)
    demos = [DyckProblem("((", "))"), DyckProblem("[{}(", ")]")]
    query = DyckProblem("<(", ")>")
    p = enc.build(demos, query)
    assert p.ids[0] == BOS_ID and p.n_shots == 2 and p.answer == ")>"
    assert tokenizer.decode(list(p.ids[1:])) == f"(({SEP})){EOL}[{{}}({SEP})]{EOL}<({SEP}"
    assert [tokenizer.decode(list(p.ids[a:b])) for a, b in p.answer_spans] == ["))", ")]"]
    q0, q1 = p.query_span
    assert q1 == len(p) and tokenizer.decode(list(p.ids[q0:q1])) == "<(" + SEP
    # pieces are encoded on their own: the answer tokens are those of the answer alone
    a, b = p.answer_spans[0]
    assert p.ids[a:b] == tuple(tokenizer.encode("))").ids)
    zero = enc.build([], query)
    assert zero.n_shots == 0 and tokenizer.decode(list(zero.ids[1:])) == "<(" + SEP


def test_prompts_are_capped_by_the_context(tokenizer):
    enc = PromptEncoder(tokenizer, BOS_ID)
    task = DyckTask()
    trials = icl_trials(task, 20, 32, seed=0)
    budget = task.max_answer_chars + 1
    for seq_len in (48, 128, 1024):
        fitting = [k for k in (0, 1, 2, 4, 8, 16, 32)
                   if all(fits(enc.build(d[:k], q), seq_len, budget) for d, q in trials)]
        assert fitting == sorted(fitting) and fitting  # monotone: more shots, longer prompts
        longest = max(len(enc.build(d[:max(fitting)], q)) for d, q in trials)
        assert longest + budget <= seq_len
        if max(fitting) < 32:
            nxt = [k for k in (1, 2, 4, 8, 16, 32) if k > max(fitting)][0]
            assert max(len(enc.build(d[:nxt], q)) for d, q in trials) + budget > seq_len


def test_long_words_do_not_overflow_and_absurd_lengths_are_refused():
    """Path counts beyond 1e308 (here C_2000 ~ 4^2000) compare exactly as int / int, not as floats."""
    from scaling.analysis.dyck import MAX_PAIRS, DyckTask, closing, random_balanced

    word = random_balanced(np.random.default_rng(0), MAX_PAIRS, 3)
    assert len(word) == 2 * MAX_PAIRS and closing(word) == ""
    with pytest.raises(UserError, match="max_pairs <= 2048"):
        DyckTask(3, 2, MAX_PAIRS + 1)
