"""The corpus, tokenizer and sampling (scaling/data.py), on a ~100 kB subset (a few seconds)."""

import json
import math

import numpy as np
import pytest

from scaling.common.errors import UserError
from scaling.training.data.corpus import (
    BOS_ID,
    SPECIAL_TOKENS,
    DataSpec,
    _hash_unit,
    assemble_corpus,
    load_corpus,
    split_documents,
    train_tokenizer,
)

SPEC = DataSpec(vocab_size=512, max_bytes=100_000)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("data-cache")


@pytest.fixture(scope="module")
def corpus(cache):
    return load_corpus(SPEC, cache)


def test_subset_has_both_sources_and_a_split(corpus):
    prov = corpus.provenance
    names = {s["name"]: s for s in prov["sources"]}
    assert set(names) == {"shakespeare", "stdlib"}
    for s in names.values():
        assert s["files"] >= 4 and 0.8 * 50_000 <= s["bytes"] <= 50_000
        assert len(s["sha256"]) == 64
    assert names["shakespeare"]["version"] == "3.0.0"
    assert names["stdlib"]["version"].startswith("3.")
    # at least one held-out document per source, none shared with training
    sources = {n.split("/")[0] for n in corpus.val_names}
    assert sources == {"shakespeare", "stdlib"}
    docs = [json.loads(line) for line in (corpus.path / "documents.jsonl").read_text().splitlines()]
    train_names = {d["name"] for d in docs if d["split"] == "train"}
    assert train_names and not train_names & set(corpus.val_names)
    assert prov["tokens"]["train"] == len(corpus.train_tokens) > 0
    assert prov["tokenizer"]["vocab_size"] == 512 and len(prov["tokenizer"]["sha256"]) == 64


def test_split_is_by_name_hash():
    docs = assemble_corpus(SPEC)
    train, val = split_documents(docs, 0.3)
    hashed = {d.name for d in docs if _hash_unit(d.name) < 0.3}
    assert hashed <= {d.name for d in val}
    assert len(train) + len(val) == len(docs)
    assert split_documents(list(reversed(docs)), 0.3)[1] == [d for d in reversed(docs) if d in val]


def test_cache_is_reused_and_keyed_by_spec(cache, corpus):
    stamp = (corpus.path / "train.npy").stat().st_mtime_ns
    again = load_corpus(SPEC, cache)
    assert again.path == corpus.path and (again.path / "train.npy").stat().st_mtime_ns == stamp
    other = load_corpus(DataSpec(vocab_size=600, max_bytes=100_000), cache)
    assert other.path != corpus.path and other.vocab_size == 600


def test_tokenizer_is_deterministic_and_lossless(corpus):
    texts = [d.text for d in assemble_corpus(SPEC)][:6]
    a, b = train_tokenizer(texts, 400), train_tokenizer(texts, 400)
    assert a.to_str() == b.to_str()
    tok = corpus.tokenizer
    assert [tok.token_to_id(s) for s in SPECIAL_TOKENS] == [0, 1, 2]
    sample = "def f(x):\n    return x ** 2  # café ☃\nTo be, or not to be"
    assert tok.decode(tok.encode(sample).ids) == sample
    assert corpus.train_tokens.dtype == np.uint16 and int(corpus.train_tokens.max()) < 512


def test_train_batch_is_a_function_of_seed_and_step(corpus):
    x, y = corpus.train_batch(seed=3, step=7, batch_size=8, seq_len=32)
    x2, y2 = corpus.train_batch(seed=3, step=7, batch_size=8, seq_len=32)
    assert x.shape == y.shape == (8, 32) and x.dtype == np.int64
    assert np.array_equal(x, x2) and np.array_equal(y, y2)
    assert np.array_equal(x[:, 1:], y[:, :-1])  # targets are inputs shifted by one
    assert not np.array_equal(x, corpus.train_batch(3, 8, 8, 32)[0])
    assert not np.array_equal(x, corpus.train_batch(4, 7, 8, 32)[0])
    # ranks take contiguous slices of the global batch
    parts = [corpus.train_batch(3, 7, 8, 32, rank=r, world_size=4)[0] for r in range(4)]
    assert np.array_equal(np.concatenate(parts), x)
    with pytest.raises(UserError):
        corpus.train_batch(3, 7, 8, 32, rank=0, world_size=3)


def test_val_windows_fixed_and_evenly_spaced(corpus):
    T = 32
    x, y = corpus.val_windows(T)
    n = len(corpus.val_tokens) // (T + 1)
    assert x.shape == (n, T)
    assert np.array_equal(x[1], np.asarray(corpus.val_tokens[T + 1:2 * T + 1], dtype=np.int64))
    xs, _ = corpus.val_windows(T, 5)
    picks = np.linspace(0, n - 1, 5).round().astype(int)
    assert np.array_equal(xs, x[picks])
    assert np.array_equal(corpus.val_windows(T, 5)[0], xs)


def test_val_documents_and_bpb(corpus):
    docs = corpus.val_documents()
    assert [n for n, _ in docs] == corpus.val_names
    assert all(t[0] == BOS_ID and len(t) > 1 for _, t in docs)
    assert np.array_equal(np.concatenate([t for _, t in docs]), np.asarray(corpus.val_tokens))
    tok = corpus.tokenizer
    n_bytes = sum(len(tok.decode(list(map(int, t[1:]))).encode()) for _, t in docs)
    n_tok = sum(len(t) - 1 for _, t in docs)
    assert corpus.bytes_per_token == pytest.approx(n_bytes / n_tok)
    assert corpus.bpb(2.0) == pytest.approx(2.0 / math.log(2) / corpus.bytes_per_token)


def test_bad_specs():
    with pytest.raises(UserError):
        DataSpec(vocab_size=100)
    with pytest.raises(UserError):
        DataSpec(sources=("wikipedia",))
    with pytest.raises(UserError):
        DataSpec(max_bytes=10)


@pytest.mark.slow
def test_full_corpus(tmp_path):
    corpus = load_corpus(DataSpec(), tmp_path)
    src = {s["name"]: s for s in corpus.provenance["sources"]}
    assert src["shakespeare"]["files"] == 38
    assert src["stdlib"]["files"] > 500 and src["stdlib"]["bytes"] > 8e6
    val_share = corpus.provenance["tokens"]["val"] / (corpus.provenance["tokens"]["train"]
                                                      + corpus.provenance["tokens"]["val"])
    assert 0.01 < val_share < 0.05
