"""prepare-data's document boundaries and split against planted truths: a separator's spelling inside
a text stays text, and exact duplicates under different ids never straddle the split."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from scaling.cli import app
from scaling.training.data.prepare import PrepareOptions, prepare

runner = CliRunner()


def _stream(out: Path, m: dict, split: str) -> np.ndarray:
    return np.concatenate([np.fromfile(out / s["path"], dtype=m["dtype"]) for s in m["shards"]
                           if s["split"] == split])


def _texts(n: int) -> list[str]:
    return [f"document {i} about html pages and code; words {i * 7 % 13} and {i * 5 % 11}. " * 3
            for i in range(n)]


def test_a_separator_written_in_a_text_is_not_a_separator(tmp_path):
    """`<|bos|>` (the trained BPE's BOS) and `<s>`/`</s>` (a given tokenizer's BOS/EOS) inside a
    document once became separator ids mid-document: a false boundary. Planted: 60 documents, one
    holding both spellings; exactly one BOS (and EOS) per document, and its tokens decode to its text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    texts = _texts(60)
    texts[3] = "In HTML, <s>struck</s> text; the marker <|bos|> and <|eos|> written literally."
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    given = Tokenizer(models.BPE())
    given.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    given.decoder = decoders.ByteLevel()
    given.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
                                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                         show_progress=False))
    given.save(str(tmp_path / "given.json"))
    for name, opts in (("trained", PrepareOptions(vocab_size=300, val_fraction=0.1)),
                       ("given", PrepareOptions(tokenizer=str(tmp_path / "given.json"), val_fraction=0.1))):
        out = tmp_path / name
        m = prepare([str(src)], out, opts)
        assert m["special_tokens_in_text"] == "encoded as text"
        train, val = _stream(out, m, "train"), _stream(out, m, "val")
        n_docs = m["documents"]["train"] + m["documents"]["val"]
        both = np.concatenate([train, val])
        for sep in (m["bos_id"], m["eos_id"]):
            if sep is not None:
                assert int((both == sep).sum()) == n_docs, (name, sep)
        tok = Tokenizer.from_file(str(out / "tokenizer.json"))
        starts = np.flatnonzero(both == m["bos_id"])
        pieces = np.split(both, starts[1:])
        decoded = {tok.decode([int(t) for t in p[1:] if t != m["eos_id"]], skip_special_tokens=False)
                   for p in pieces}
        assert texts[3] in decoded, name


def test_exact_duplicates_under_other_ids_share_a_split(tmp_path):
    """A dump that re-posts each text under a second id: split by id, every held-out text had its copy
    in training (planted: 200 texts x 2 ids); split by text (the default) none has, and documents
    without ids split as before."""
    texts = _texts(200)
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"{k}{i}", "text": t}) + "\n"
                           for i, t in enumerate(texts) for k in "ab"))

    def split_texts(out: Path) -> tuple[set, set]:
        from tokenizers import Tokenizer

        m = json.loads((out / "manifest.json").read_text())
        tok = Tokenizer.from_file(str(out / "tokenizer.json"))
        sets = []
        for split in ("train", "val"):
            s = _stream(out, m, split)
            docs = np.split(s, np.flatnonzero(s == m["bos_id"])[1:])
            sets.append({tok.decode([int(t) for t in p[1:]]) for p in docs})
        return sets[0], sets[1]

    base = ["prepare-data", str(src), "--vocab-size", "300", "--val-fraction", "0.1", "--quiet"]
    assert runner.invoke(app, [*base, "--out", str(tmp_path / "by-text")]).exit_code == 0
    train, val = split_texts(tmp_path / "by-text")
    assert len(val) >= 5 and not train & val and train | val == set(texts)
    assert runner.invoke(app, [*base, "--out", str(tmp_path / "by-id"), "--split-by", "id"]).exit_code == 0
    train, val = split_texts(tmp_path / "by-id")
    assert len(train & val) >= 0.5 * len(val) > 0          # the leak the default closes
    res = runner.invoke(app, [*base, "--out", str(tmp_path / "x"), "--split-by", "url"])
    assert res.exit_code == 2 and "split_by must be 'text' or 'id'" in res.stderr
