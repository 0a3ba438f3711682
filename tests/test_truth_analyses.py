"""Planted-truth checks of `smelt-scale analyze icl`, `analyze lengths` and `eval` (multiple choice).

Every expected number here is computed in the test from first principles (a hand-written bracket
closer, the textbook Wilson formula, the model's own logits through a plain log-softmax, lm-eval's
documented arc_easy prompt), never by calling the helper of the code under test.

One proxy-tiny SMELT run is trained for the module (24 steps on a 64 kB corpus, ~1 s): far from
uniform logits (loss ~5.4 nats against ln 512 = 6.24), so per-token losses and choice
log-likelihoods differ enough to tell a wrong bucket or a wrong argmax from fp32 noise.
"""

from __future__ import annotations

import json
import math
from statistics import NormalDist

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from scaling.accounting.config import ModelConfig
from scaling.accounting.tiers import get_config
from scaling.cli import app
from scaling.training.data.corpus import BOS_ID, DataSpec, load_corpus
from scaling.training.loop.trainer import TrainConfig, train
from scaling.training.model.transformer import MoETransformer

runner = CliRunner()
MAX_BYTES = 65536


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A trained proxy-tiny SMELT run folder with final weights; SMELT_CACHE in a tmp folder."""
    root = tmp_path_factory.mktemp("truth-runs")
    old_threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:    # SMELT_CACHE back as it was after the module
        mp.setenv("SMELT_CACHE", str(tmp_path_factory.mktemp("truth-cache")))
        try:
            tc = TrainConfig(tokens=(24 * 512,), batch_size=8, eval_every=0, data_max_bytes=MAX_BYTES,
                             device="cpu", threads=1, val_windows=4, warmup=2)
            train(get_config("proxy-tiny", "smelt"), tc, tier="proxy-tiny", run_name="truth", runs_dir=root,
                  ckpt_dir=root / "ck", save_final_weights=True)
            torch.set_num_threads(1)  # tiny tensors: more threads only contend
            yield root / "truth"
        finally:
            torch.set_num_threads(old_threads)


@pytest.fixture(scope="module")
def truth(run):
    """The run's model rebuilt here from config.json + the safetensors file, its corpus and tokenizer."""
    from safetensors.torch import load_file

    meta = json.loads((run / "config.json").read_text())
    model = MoETransformer(ModelConfig.from_dict(meta["model"]))
    model.load_state_dict(load_file(str(run / "final_weights.safetensors")), strict=True)
    model.eval().requires_grad_(False)
    corpus = load_corpus(DataSpec(**meta["data_spec"]))
    return {"model": model, "corpus": corpus, "tok": corpus.tokenizer, "T": int(meta["model"]["seq_len"])}


def _token_nll(model, ids) -> np.ndarray:
    """-log p(ids[t+1] | ids[:t+1]) for every t, float64 log-softmax of the fp32 logits of one
    unbatched forward."""
    x = torch.as_tensor(np.asarray(ids[:-1], dtype=np.int64))[None]
    with torch.no_grad():
        logp = torch.log_softmax(model(x).logits[0].double(), -1)
    tgt = torch.as_tensor(np.asarray(ids[1:], dtype=np.int64))
    return -logp[torch.arange(len(tgt)), tgt].numpy()


# ----- ICL: a decoding oracle that is right on exactly the planted trials -----------------------

CLOSE = {"(": ")", "[": "]", "{": "}", "<": ">"}


def _close(prefix: str) -> str:
    """The closing sequence of a bracket prefix, written here: a stack, innermost first."""
    stack = []
    for ch in prefix:
        if ch in CLOSE:
            stack.append(ch)
        else:
            assert stack and CLOSE[stack[-1]] == ch, f"not a Dyck prefix: {prefix!r}"
            stack.pop()
    assert stack, f"nothing open in {prefix!r}"
    return "".join(CLOSE[c] for c in reversed(stack))


N_TRIALS = 12
# k -> trial indices the oracle answers correctly: 0/12, 5/12, 12/12, 11/12
PLANT = {0: set(), 1: {0, 3, 4, 9, 11}, 2: set(range(N_TRIALS)), 3: set(range(N_TRIALS)) - {6}}


def _wrong(answer: str, i: int) -> str:
    """A wrong completion of one of four kinds: one closer short, the last closer of another type,
    empty, one closer too many (the right answer as a strict prefix)."""
    kind = i % 4
    if kind == 0:
        return answer[:-1] + "\n"
    if kind == 1:
        other = next(c for c in ")]}>" if c != answer[-1])
        return answer[:-1] + other + "\n"
    if kind == 2:
        return "\n"
    return answer + answer[-1] + "\n"


def _wilson(c: int, n: int, level: float) -> tuple[float, float]:
    """Wilson score interval from the textbook formula (Wilson 1927)."""
    z = NormalDist().inv_cdf(1 - (1 - level) / 2)
    p = c / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return centre - half, centre + half


def test_icl_accuracy_per_k_is_the_planted_rate_with_wilson_interval(run, truth, monkeypatch):
    """Plants: the decoder is replaced by an oracle that reads each prompt's query off its text,
    closes its brackets with the stack written above and answers correctly exactly on the trials of
    ``PLANT[k]`` (0/12, 5/12, 12/12, 11/12 for k = 0..3), with a wrong answer of one of four kinds
    elsewhere (among them the right answer plus one more closer). The reported correct counts and
    accuracies must be those, and the interval the textbook Wilson interval at the requested 90% level."""
    import scaling.analysis.icl as icl

    tok = truth["tok"]
    seen, kinds = {}, set()

    def oracle(model, prompts, max_new_tokens, stop, batch_size=32):
        out = []
        for i, ids in enumerate(prompts):
            assert ids[0] == BOS_ID
            *demos, query = tok.decode(list(ids[1:])).split("\n")
            k = len(demos)
            for line in demos:  # every demonstration answered correctly, in the documented format
                prefix, answer = line.split("=")
                assert answer == _close(prefix)
            assert query.endswith("=")
            answer = _close(query[:-1])
            text = answer + "\n" if i in PLANT[k] else _wrong(answer, i)
            gen = tok.encode(text, add_special_tokens=False).ids
            if len(gen) > max_new_tokens:  # a too-long wrong answer the decoder could not produce
                text = answer[:-1] + "\n"
                gen = tok.encode(text, add_special_tokens=False).ids
            kinds.add("long" if text.startswith(answer) and text != answer + "\n" else "other")
            assert tok.decode(gen) == text and len(gen) <= max_new_tokens and stop(gen)
            out.append(gen)
            seen.setdefault(k, []).append(len(ids))
        return out

    monkeypatch.setattr(icl, "greedy_decode", oracle)
    res = runner.invoke(app, ["analyze", "icl", str(run), "--trials", str(N_TRIALS), "--shots", "0,1,2,3",
                              "--max-pairs", "4", "--confidence", "0.9", "--json", "--no-save"])
    assert res.exit_code == 0, res.output
    (doc,) = json.loads(res.stdout)["runs"]
    assert doc["skipped"] == [] and doc["confidence"] == 0.9
    assert sorted(seen) == [0, 1, 2, 3] and all(len(v) == N_TRIALS for v in seen.values())
    got = {s["k"]: s for s in doc["shots"]}
    assert sorted(got) == [0, 1, 2, 3]
    for k, planted in PLANT.items():
        s, c = got[k], len(planted)
        assert (s["n"], s["correct"]) == (N_TRIALS, c), k
        assert s["accuracy"] == c / N_TRIALS
        lo, hi = _wilson(c, N_TRIALS, 0.9)
        assert s["ci_low"] == pytest.approx(lo, abs=1e-12) and s["ci_high"] == pytest.approx(hi, abs=1e-12), k
        assert s["mean_prompt_tokens"] == pytest.approx(np.mean(seen[k]), rel=1e-12)
    assert got[0]["ci_low"] == 0.0 and got[2]["ci_high"] == 1.0
    assert kinds == {"long", "other"}  # a wrong answer that extends the right one was given


# ----- loss by length and position: per-token losses from the model's logits ----------------------

# planted validation documents (tokens after BOS): both sides of every bucket edge of T = 64
# ([1, 4), [4, 8), [8, 16), [16, 32), [32, 65), >= 65), an empty document (no bucket) and two
# documents longer than the context (scored on their first 64 tokens)
DOC_LENGTHS = [5, 0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 33, 64, 65, 66, 150, 12, 9]


def test_lengths_buckets_match_per_token_losses_computed_here(run, truth, tmp_path):
    """Plants: the run's validation split is replaced (in its eval_data/ snapshot, which the analyses
    read) by documents of the lengths ``DOC_LENGTHS``, cut from real validation text. Each document
    of n tokens is scored here on [BOS] + its first min(n, T) tokens by one unbatched forward and a
    float64 log-softmax, and put in the length bucket of n with the docstring's edges [1, T/16),
    [T/16, T/8), [T/8, T/4), [T/4, T/2), [T/2, T], > T, so each bucket's document and token counts
    are known by construction. Positions: every (T + 1)-token window tiling the planted stream
    (--windows above the tiling keeps all), token t in [0, T/32), ..., [T/2, T). Counts must match
    exactly, mean losses to 1e-5 relative (fp32 logits, batched there and not here)."""
    import shutil

    model, T = truth["model"], truth["T"]
    assert T == 64
    text = np.asarray(truth["corpus"].val_tokens, dtype=np.int64)
    text = text[text != BOS_ID]
    docs, at = [], 0
    for n in DOC_LENGTHS:
        docs.append(np.concatenate([[BOS_ID], text[at:at + n]]).astype(np.int64))
        at += n
    assert at <= len(text)
    stream = np.concatenate(docs)
    offsets = np.cumsum([0] + [len(d) for d in docs])

    shipped = tmp_path / "planted"
    shutil.copytree(run, shipped)
    res = runner.invoke(app, ["analyze", "snapshot-data", str(shipped)])
    assert res.exit_code == 0, res.output
    snap = shipped / "eval_data"
    np.save(snap / "val.npy", stream.astype(np.uint16))
    np.save(snap / "val_offsets.npy", offsets.astype(np.int64))
    (snap / "val_names.json").write_text(json.dumps([f"planted/{i}" for i in range(len(docs))]))

    edges = [1, T // 16, T // 8, T // 4, T // 2, T + 1, None]
    want = {("length", lo, hi): [0, 0, 0.0] for lo, hi in zip(edges[:-1], edges[1:])}  # seqs, tokens, sum
    for d in docs:
        n = len(d) - 1
        if n == 0:
            continue
        nll = _token_nll(model, d[:min(n, T) + 1])
        key = next(k for k in want if k[1] <= n and (k[2] is None or n < k[2]))
        want[key][0] += 1
        want[key][1] += len(nll)
        want[key][2] += float(nll.sum())
    # by construction: documents 1-3 | 4,5,7 | 8,9,12,15 | 16,31 | 32,33,64 | 65,66,150 (cut to 64)
    assert [v[:2] for v in want.values()] == [[3, 6], [3, 16], [4, 44], [2, 47], [3, 129], [3, 192]]
    pos_edges = [0, T // 32, T // 16, T // 8, T // 4, T // 2, T]
    n_win = len(stream) // (T + 1)
    pos_nll = np.stack([_token_nll(model, stream[i * (T + 1):(i + 1) * (T + 1)]) for i in range(n_win)])
    for lo, hi in zip(pos_edges[:-1], pos_edges[1:]):
        want[("position", lo, hi)] = [n_win, n_win * (hi - lo), float(pos_nll[:, lo:hi].sum())]

    res = runner.invoke(app, ["analyze", "lengths", str(shipped), "--windows", "100000", "--json",
                              "--no-save"])
    assert res.exit_code == 0, res.output
    (doc,) = json.loads(res.stdout)["runs"]
    assert doc["seq_len"] == T and doc["n_windows"] == n_win
    assert doc["n_documents"] == sum(n > 0 for n in DOC_LENGTHS)
    got = {(b["by"], b["lo"], b["hi"]): b for b in doc["buckets"]}
    assert list(got) == list(want)
    for key, (n_seq, n_tok, total) in want.items():
        b = got[key]
        assert (b["n_sequences"], b["n_tokens"]) == (n_seq, n_tok), key
        assert b["loss"] == pytest.approx(total / n_tok, rel=1e-5), key
    losses = [v[2] / v[1] for v in want.values()]
    assert max(losses) - min(losses) > 0.05  # the buckets differ: a swap or a shifted edge would show


# ----- eval: acc / acc_norm / bpb_gold of arc_easy from log-likelihoods computed here ------------

QUESTIONS = [
    ("Which of these is a colour?", ["red", "seven", "a very quickly moving small river"]),
    ("What do plants need to grow?", ["sunlight and water", "it", "noise", "iron bars on the window"]),
    ("How many legs has a spider?", ["eight", "two", "six or perhaps more than that"]),
    ("Where does the sun rise?", ["in the east", "up", "over the hills at dawn each day"]),
    ("What is water at 100 °C?", ["steam", "ice", "a café crème with milk"]),
    ("Which animal says moo?", ["a cow", "the cat", "an old dog"]),
]


def _choice_loglik(model, tok, question: str, choice: str) -> float:
    """log p(" " + choice | "Question: {q}\\nAnswer:") as lm-eval's arc_easy scores it: its YAML's
    doc_to_text, target delimiter " ", the whole string encoded and the context's tokens cut off
    (TemplateLM._encode_pair for a causal model), no BOS before a non-empty context."""
    ctx = f"Question: {question}\nAnswer:"
    ctx_ids = tok.encode(ctx, add_special_tokens=False).ids
    whole = tok.encode(ctx + " " + choice, add_special_tokens=False).ids
    assert len(whole) <= 65  # fits the 64-token context: no truncation
    nll = _token_nll(model, whole)
    return -float(nll[len(ctx_ids) - 1:].sum())


def test_eval_arc_easy_acc_and_acc_norm_match_logliks_computed_here(run, truth, tmp_path):
    """Plants: the log-likelihood of every choice is computed here; per item the gold answer is then
    chosen so that the item's (acc, acc_norm) is a planted pair: (1, 0), (0, 1) or (0, 0) where the
    argmax of loglik and of loglik / len(choice in characters) (lm-eval's acc_norm) differ, (1, 1)
    or (0, 0) where they agree. acc and acc_norm must be the means of those pairs, their stderr
    the sample standard error, and bpb_gold the gold continuations' bits over their UTF-8 bytes."""
    model, tok = truth["model"], truth["tok"]
    records, acc, norm, bits, nbytes = [], [], [], [], []
    split_pattern, agree_pattern = [(1, 0), (0, 1), (1, 0), (0, 0)], [(1, 1), (0, 0)]
    n_split = n_agree = 0
    for i, (q, choices) in enumerate(QUESTIONS):
        ll = np.array([_choice_loglik(model, tok, q, c) for c in choices])
        per_char = ll / np.array([len(c) for c in choices], dtype=float)
        pred, pred_norm = int(ll.argmax()), int(per_char.argmax())
        for v in (ll, per_char):  # a clear winner: fp32 noise cannot flip the argmax
            top2 = np.sort(v)[-2:]
            assert top2[1] - top2[0] > 1e-3, (q, v)
        if pred != pred_norm:
            want = split_pattern[n_split % 4]
            n_split += 1
            other = next(j for j in range(len(choices)) if j not in (pred, pred_norm))
            gold = {(1, 0): pred, (0, 1): pred_norm, (0, 0): other}[want]
        else:
            want = agree_pattern[n_agree % 2]
            n_agree += 1
            gold = pred if want == (1, 1) else (pred + 1) % len(choices)
        acc.append(want[0])
        norm.append(want[1])
        bits.append(-ll[gold] / math.log(2))
        nbytes.append(len((" " + choices[gold]).encode("utf-8")))
        labels = [chr(ord("A") + j) for j in range(len(choices))]
        records.append({"id": f"q{i}", "question": q, "choices": {"text": choices, "label": labels},
                        "answerKey": labels[gold]})
    assert n_split >= 3 and sum(acc) != sum(norm)  # the two metrics are told apart
    (tmp_path / "arc_easy").mkdir()
    (tmp_path / "arc_easy" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    res = runner.invoke(app, ["eval", str(run), "--tasks", "arc_easy", "--data", str(tmp_path),
                              "--device", "cpu", "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["metric"]: r for r in json.loads(res.stdout)["rows"]}
    n = len(QUESTIONS)
    for metric, flags in (("acc", acc), ("acc_norm", norm)):
        mean = sum(flags) / n
        se = math.sqrt(sum((f - mean) ** 2 for f in flags) / (n - 1)) / math.sqrt(n)
        assert rows[metric]["value"] == pytest.approx(mean, abs=1e-12), metric
        assert rows[metric]["stderr"] == pytest.approx(se, rel=1e-9), metric
        assert rows[metric]["n"] == n
    a, b = np.array(bits), np.array(nbytes, dtype=float)
    r = a.sum() / b.sum()
    assert rows["bpb_gold"]["value"] == pytest.approx(r, rel=1e-5)
    # delta method for the ratio of means: grad (1/mean b, -mean a / mean b^2), sample covariance / n
    grad = np.array([1 / b.mean(), -a.mean() / b.mean() ** 2])
    se = math.sqrt(grad @ np.cov(np.stack([a, b])) @ grad / n)
    assert rows["bpb_gold"]["stderr"] == pytest.approx(se, rel=1e-4)


def test_bpb_gold_stderr_is_the_delta_method_se_of_a_ratio_of_sums():
    """Plants: hand-made bits a_i and bytes b_i; the standard error of sum(a) / sum(b) by the
    delta method written here (gradient of mean(a) / mean(b) against the sample covariance of the
    means, numpy's cov with n - 1) must equal ``_ratio_stderr`` to 1e-12."""
    from scaling.evaluation.run import _ratio_stderr

    rng = np.random.default_rng(7)
    cases = [([3.0, 5.0, 4.0], [2.0, 4.0, 3.0]), ([10.0, 1.0], [3.0, 7.0])]
    cases += [(list(rng.uniform(1, 60, m) * 8), list(rng.integers(3, 90, m).astype(float))) for m in (5, 40)]
    for a_list, b_list in cases:
        a, b = np.array(a_list), np.array(b_list)
        grad = np.array([1 / b.mean(), -a.mean() / b.mean() ** 2])
        want = math.sqrt(grad @ np.cov(np.stack([a, b])) @ grad / len(a))
        assert _ratio_stderr(a_list, b_list) == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert _ratio_stderr([1.0], [2.0]) is None
