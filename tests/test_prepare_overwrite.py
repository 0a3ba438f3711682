"""`prepare-data --overwrite` checks before it deletes, builds beside the target, and replaces only the
earlier preparation's files (issue 25, data loss 4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from scaling.cli import app
from scaling.training.data.shards import load_shards

runner = CliRunner()
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho".split()


def _inputs(tmp: Path, n: int = 60) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    p = tmp / "docs.jsonl"
    with open(p, "w") as fh:
        for i in range(n):
            text = " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(40 + i % 13))
            fh.write(json.dumps({"id": f"d{i}", "text": text}) + "\n")
    return p


def _prep(src, out, *extra):
    return runner.invoke(app, ["prepare-data", str(src), "--out", str(out), "--val-fraction", "0.2",
                               "--quiet", *extra])


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture()
def prepared(tmp_path):
    src = _inputs(tmp_path / "in")
    out = tmp_path / "out"
    res = _prep(src, out, "--vocab-size", "300", "--shard-tokens", "400")
    assert res.exit_code == 0, res.output
    (out / "notes.txt").write_text("mine")
    (out / "mine-00001.bin").write_bytes(b"\x00\x01")      # looks like a shard; not the preparation's
    return src, out


def _one_line(res, pattern):
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and pattern in lines[0], res.stderr


@pytest.mark.parametrize("bad, pattern", [
    (["--tokenizer", "NOPE"], "tokenizer"),
    (["--tokenizer", "BROKEN"], "tokenizer"),
    (["INPUT-MISSING"], "does not exist"),
    (["INPUT-BAD"], "not a JSON line"),
])
def test_a_refused_overwrite_changes_nothing(prepared, tmp_path, bad, pattern):
    src, out = prepared
    before = _snapshot(out)
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{oops\n')
    args = {"NOPE": str(tmp_path / "nope.json"), "BROKEN": str(tmp_path / "broken.json")}
    sources = [str(src)]
    extra = []
    for b in bad:
        if b == "INPUT-MISSING":
            sources = [str(tmp_path / "missing.jsonl")]
        elif b == "INPUT-BAD":
            sources = [str(tmp_path / "bad.jsonl")]
        else:
            extra.append(args.get(b, b))
    if "--tokenizer" not in extra:
        extra += ["--vocab-size", "300"]
    _one_line(runner.invoke(app, ["prepare-data", *sources, "--out", str(out), "--quiet", "--overwrite",
                                  *extra]), pattern)
    assert _snapshot(out) == before
    assert not list(tmp_path.glob(".out.overwrite-*"))


def test_overwrite_replaces_only_the_earlier_preparation(prepared):
    src, out = prepared
    old = json.loads((out / "manifest.json").read_text())
    res = _prep(src, out, "--vocab-size", "300", "--shard-tokens", "700", "--overwrite")
    assert res.exit_code == 0, res.output
    new = json.loads((out / "manifest.json").read_text())
    assert new["shard_tokens"] == 700 and old["shard_tokens"] == 400
    bins = {p.name for p in out.glob("*.bin")}
    assert bins == {s["path"] for s in new["shards"]} | {"mine-00001.bin"}   # stale shards gone
    assert (out / "notes.txt").read_text() == "mine" and (out / "mine-00001.bin").read_bytes() == b"\x00\x01"
    assert not (out / ".prepare").exists() and not list(out.parent.glob(".out.overwrite-*"))
    load_shards(out)                                     # the folder verifies


@pytest.mark.parametrize("fail_at", [1, 3, "manifest.json"])
def test_an_overwrite_killed_while_it_swaps_files_is_finished_by_the_next_run(prepared, tmp_path, monkeypatch,
                                                                            fail_at):
    """The swap deleted the old files (the manifest first) and moved the new ones in one by one: killed
    in between, the folder held some new shards and no manifest, and every rerun was refused. The swap
    is journaled now: the next run into the folder finishes it, to the same files a clean
    --overwrite gives, and build folders of killed runs are cleaned up."""
    import os

    from scaling.training.data import prepare as prep

    src, out = prepared
    ref = tmp_path / "ref"
    assert _prep(src, ref, "--vocab-size", "300", "--shard-tokens", "700").exit_code == 0
    stale = tmp_path / ".out.overwrite-999999"          # a build folder of an --overwrite killed earlier
    stale.mkdir()
    (stale / "train-00000.bin").write_bytes(b"\0")
    real, calls = os.replace, []

    def dies(a, b):
        if ".overwrite-" in str(a) and ".overwrite-" not in str(b):     # a move from the build into out
            calls.append(a)
            if len(calls) == fail_at or Path(b).name == fail_at:
                raise KeyboardInterrupt("killed during the swap")
        return real(a, b)

    monkeypatch.setattr(prep.os, "replace", dies)
    with pytest.raises(KeyboardInterrupt):
        prep.prepare([str(src)], out, prep.PrepareOptions(vocab_size=300, shard_tokens=700, val_fraction=0.2),
                     overwrite=True)
    monkeypatch.setattr(prep.os, "replace", real)
    assert calls and not (out / "manifest.json").exists()         # killed inside the swap
    res = _prep(src, out, "--vocab-size", "300", "--shard-tokens", "700")    # the same command, plain
    assert res.exit_code == 0, res.output
    mine = {"notes.txt", "mine-00001.bin"}
    assert {k: v for k, v in _snapshot(out).items() if k not in mine} == _snapshot(ref)
    assert (out / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.prepare-lock", ".ref.prepare-lock", "in",
                                                          "out", "ref"]
    load_shards(out)


def test_overwrite_keeps_its_own_input_tokenizer(prepared):
    src, out = prepared
    tok = out / "tokenizer.json"
    before = tok.read_bytes()
    res = _prep(src, out, "--tokenizer", str(tok), "--shard-tokens", "700", "--overwrite")
    assert res.exit_code == 0, res.output
    assert tok.read_bytes() == before
    load_shards(out)


def test_overwrite_refuses_to_replace_a_user_file_of_the_same_name(tmp_path):
    src = _inputs(tmp_path / "in")
    out = tmp_path / "out"
    out.mkdir()
    (out / "train-00000.bin").write_bytes(b"user data")
    _one_line(_prep(src, out, "--vocab-size", "300", "--overwrite"), "no earlier preparation wrote")
    assert (out / "train-00000.bin").read_bytes() == b"user data"
    assert sorted(p.name for p in out.iterdir()) == ["train-00000.bin"]


def test_an_input_inside_the_replaced_files_is_refused(prepared):
    src, out = prepared
    shard = json.loads((out / "manifest.json").read_text())["shards"][0]["path"]
    _one_line(runner.invoke(app, ["prepare-data", str(out / shard), "--out", str(out), "--quiet",
                                  "--vocab-size", "300", "--overwrite"]), "would replace")


def test_overwrite_never_deletes_indexed_shards_made_elsewhere(tmp_path):
    """A nanoGPT folder indexed with --dtype lists the user's own train.bin/val.bin in its manifest:
    --overwrite replaces that manifest, never the files it indexes."""
    import numpy as np

    out = tmp_path / "nano"
    out.mkdir()
    rng = np.random.default_rng(0)
    for name in ("train.bin", "val.bin"):
        rng.integers(0, 300, 5000, dtype=np.uint16).tofile(out / name)
    before = _snapshot(out)
    res = runner.invoke(app, ["prepare-data", str(out), "--dtype", "uint16", "--vocab-size", "300",
                              "--quiet", "--bos-id", "99999"])
    _one_line(res, "--bos-id 99999 is not an id below the vocabulary size 300")
    res = runner.invoke(app, ["prepare-data", str(out), "--dtype", "uint16", "--vocab-size", "300",
                              "--quiet"])
    assert res.exit_code == 0, res.output
    res = _prep(_inputs(tmp_path / "in"), out, "--vocab-size", "300", "--overwrite")
    assert res.exit_code == 0, res.output
    after = _snapshot(out)
    assert {k: after[k] for k in before} == before           # the user's shards, byte for byte
    manifest = json.loads((out / "manifest.json").read_text())
    assert not {"train.bin", "val.bin"} & {s["path"] for s in manifest["shards"]}
    load_shards(out)


def test_overwrite_deletes_only_names_the_tool_gives_its_files(prepared):
    """manifest.json is user data: shard paths edited to name a user's folder or file are not the
    earlier preparation's, so --overwrite leaves them."""
    src, out = prepared
    (out / "photos").mkdir()
    (out / "photos" / "p1.jpg").write_text("precious")
    (out / "README.md").write_text("mine")
    m = json.loads((out / "manifest.json").read_text())
    m["shards"] += [{"path": "photos", "split": "train", "tokens": 1, "sha256": "0" * 64},
                    {"path": "README.md", "split": "train", "tokens": 1, "sha256": "0" * 64}]
    (out / "manifest.json").write_text(json.dumps(m))
    res = _prep(src, out, "--vocab-size", "300", "--shard-tokens", "700", "--overwrite")
    assert res.exit_code == 0, res.output
    assert (out / "photos" / "p1.jpg").read_text() == "precious" and (out / "README.md").read_text() == "mine"
    load_shards(out)


def test_one_preparation_per_output_folder_and_a_refusal_leaves_nothing(tmp_path):
    """A second prepare-data on an output folder being prepared is refused (two once appended to the
    same work files: a manifest with every validation document twice); a folder holding a user's
    files is refused before anything is written into it."""
    from scaling.training.runlog import exclusive

    src = _inputs(tmp_path / "in")
    out = tmp_path / "out"
    with exclusive(tmp_path / ".out.prepare-lock", "held by this test"):
        _one_line(_prep(src, out, "--vocab-size", "300"), "is being prepared by another process")
    assert not out.exists() or not any(out.iterdir())
    assert _prep(src, out, "--vocab-size", "300").exit_code == 0      # free again once released
    mine = tmp_path / "in"
    before = _snapshot(mine)
    _one_line(_prep(src, mine, "--vocab-size", "300"), "is not empty")
    assert _snapshot(mine) == before and not (mine / ".prepare").exists()


@pytest.mark.parametrize("flag", ["--source-field", "--id-field"])
def test_a_named_field_no_record_holds_is_refused(tmp_path, flag):
    """--source-field/--id-field naming a field no record has once fell back silently (no per-source
    validation; hash ids, hence another split); the default id field may be absent."""
    src = _inputs(tmp_path / "in")
    _one_line(_prep(src, tmp_path / "out", "--vocab-size", "300", flag, "nope"),
              f"{flag} 'nope': no record holds it")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    assert _prep(src, tmp_path / "ok", "--vocab-size", "300", flag, "id").exit_code == 0


def test_records_without_a_named_field_are_counted_and_warned(tmp_path):
    """A field that only some records hold fell back per record without a word; the manifest now
    counts the records that lacked it, also across an interrupted and resumed preparation, and the
    command warns with the planted counts."""
    from scaling.training.data.prepare import PrepareOptions, fallback_warnings, prepare

    src = tmp_path / "in" / "docs.jsonl"
    src.parent.mkdir()
    no_id, no_src = {3, 9, 17, 40, 41, 55, 58}, {0, 5, 9, 22, 33, 34, 35, 36, 50, 51, 59}
    with open(src, "w") as fh:
        for i in range(60):
            rec = {"text": " ".join(WORDS[(i * 5 + j) % len(WORDS)] for j in range(30 + i % 11))}
            if i not in no_id:
                rec["id"] = f"d{i}"
            if i not in no_src:
                rec["src"] = "web" if i % 2 else None if i in (4, 8) else "code"
            fh.write(json.dumps(rec) + "\n")
    nulls = {4, 8}
    res = _prep(src, tmp_path / "out", "--vocab-size", "300", "--source-field", "src", "--json")
    assert res.exit_code == 0, res.output
    fb = json.loads(res.stdout)["field_fallbacks"]
    assert fb["records"] == 60
    assert fb["id"]["records_without"] == len(no_id)
    assert fb["source"]["records_without"] == len(no_src | nulls)
    warned = [ln for ln in res.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warned) == 2 and f"{len(no_src | nulls)} of 60 records have no 'src'" in warned[0]
    assert f"{len(no_id)} of 60 records have no 'id'" in warned[1]

    def fail(n_shards):
        raise RuntimeError("fault injected")

    opts = PrepareOptions(source_field="src", vocab_size=300, val_fraction=0.2, shard_tokens=200,
                          chunk_bytes=2_000)
    with pytest.raises(RuntimeError, match="fault injected"):
        prepare([str(src)], tmp_path / "resumed", opts, after_shard=fail)
    m = prepare([str(src)], tmp_path / "resumed", opts)
    assert m["field_fallbacks"] == fb
    # every record with an id, and no source field asked for: nothing to say
    full = _inputs(tmp_path / "full")
    res = _prep(full, tmp_path / "out2", "--vocab-size", "300")
    assert res.exit_code == 0 and "warning" not in res.stderr
    assert fallback_warnings({"field_fallbacks": {"records": 5, "id": {"field": "id", "records_without": 5},
                                                  "source": {"field": None, "records_without": None}}}) == []
