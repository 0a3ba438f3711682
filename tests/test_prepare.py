"""prepare-data and token shards: JSONL + Parquet fixtures made here, a BPE trained here (seconds).

Checks the manifest and its hashes, that shards decode back to the documents, that the
validation split does not depend on file order, that an interrupted preparation reruns to
byte-identical output, that a run on the shards resumes to identical logs, and that bad input
gets a one-line error and exit 2.
"""

import json
import os
import signal
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from scaling.cli import app
from scaling.common.errors import UserError
from scaling.common.files import read_jsonl, sha256_file
from scaling.training import runlog
from scaling.training.data.corpus import _hash_unit
from scaling.training.data.loader import open_data
from scaling.training.data.prepare import PrepareOptions, prepare
from scaling.training.data.shards import load_shards

runner = CliRunner()
VOCAB = 512  # proxy-tiny's vocabulary
SHARD = 20_000
OPTS = PrepareOptions(vocab_size=VOCAB, val_fraction=0.15, shard_tokens=SHARD, chunk_bytes=60_000,
                      source_field="source")


def _docs() -> list[dict]:
    """About 100 documents of real code and prose from the standard library, deterministic."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(root.glob("*.py"))[:60]
    docs = []
    for i, p in enumerate(files):
        text = p.read_text(encoding="utf-8", errors="replace")[:6000]
        docs.append({"id": f"code-{i}", "source": "code", "text": text})
        # prose: the module docstrings and comments, without an id (hashed text instead)
        prose = "\n".join(line.strip("# ") for line in text.splitlines() if line.lstrip().startswith("#"))
        if prose.strip():
            docs.append({"source": "prose", "text": prose})
    return docs


def _write(tmp: Path, docs: list[dict], order: int = 0) -> list[str]:
    """JSONL (first half) and Parquet (second half); order 1 swaps halves and reverses docs."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    half = len(docs) // 2
    a, b = (docs[:half], docs[half:]) if order == 0 else (docs[half:][::-1], docs[:half][::-1])
    tmp.mkdir(parents=True, exist_ok=True)
    with open(tmp / "part-a.jsonl", "w") as fh:
        for d in a:
            fh.write(json.dumps(d) + "\n")
    cols = {k: [d.get(k) for d in b] for k in ("id", "source", "text")}
    pq.write_table(pa.table(cols), tmp / "part-b.parquet", row_group_size=15)
    return [str(tmp / "part-a.jsonl"), str(tmp / "part-b.parquet")]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    pytest.importorskip("pyarrow")
    root = tmp_path_factory.mktemp("prep")
    old = os.environ.get("SMELT_CACHE")
    os.environ["SMELT_CACHE"] = str(root / "cache")
    docs = _docs()
    inputs = _write(root / "in", docs)
    manifest = prepare(inputs, root / "out", OPTS)
    yield {"root": root, "docs": docs, "inputs": inputs, "out": root / "out", "manifest": manifest}
    if old is None:
        os.environ.pop("SMELT_CACHE", None)
    else:
        os.environ["SMELT_CACHE"] = old


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_manifest_fields_and_hashes(env):
    m, out, docs = env["manifest"], env["out"], env["docs"]
    assert json.loads((out / "manifest.json").read_text()) == m
    assert m["dtype"] == "uint16" and m["vocab_size"] == VOCAB and m["bos_id"] == 0 and m["eos_id"] is None
    assert m["tokenizer"]["sha256"] == sha256_file(out / "tokenizer.json")
    for s in m["shards"]:
        assert set(s) >= {"path", "tokens", "sha256"}
        assert (out / s["path"]).stat().st_size == 2 * s["tokens"]
        assert sha256_file(out / s["path"]) == s["sha256"]
    train = [s for s in m["shards"] if s["split"] == "train"]
    assert len(train) >= 3 and all(s["tokens"] == SHARD for s in train[:-1])
    assert m["documents"]["train"] + m["documents"]["val"] == len(docs)
    assert m["bytes"]["train"] + m["bytes"]["val"] == sum(len(d["text"].encode()) for d in docs)
    for src, path in zip(m["sources"], env["inputs"]):
        assert src["path"] == path and src["bytes"] == Path(path).stat().st_size
        assert src["sha256"] == sha256_file(path)
    assert sum(s["documents"] for s in m["sources"]) == len(docs)
    # the validation split: by hash of the text (split_by="text"), with contiguous source ranges
    import hashlib

    val = [d for d in docs if _hash_unit(hashlib.sha256(d["text"].encode()).hexdigest()) < OPTS.val_fraction]
    assert m["documents"]["val"] == len(val) > 0
    ranges = m["val_sources"]
    assert [r["name"] for r in ranges] == sorted({d["source"] for d in val})
    assert ranges[0]["start"] == 0 and ranges[-1]["stop"] == m["splits"]["val"]["tokens"]
    assert all(a["stop"] == b["start"] for a, b in zip(ranges, ranges[1:]))
    assert m["val_bytes_per_token"] == pytest.approx(
        sum(r["bytes"] for r in ranges) / sum(r["tokens"] for r in ranges))


def test_shards_decode_back_to_the_documents(env):
    data = open_data(env["out"], vocab_size=VOCAB)
    tok = data.tokenizer
    import hashlib

    def doc_id(d):
        return d.get("id") or hashlib.sha256(d["text"].encode()).hexdigest()

    def held_out(d):
        return _hash_unit(hashlib.sha256(d["text"].encode()).hexdigest()) < OPTS.val_fraction

    half = len(env["docs"]) // 2
    in_order = env["docs"][:half] + env["docs"][half:]
    want_train = [d["text"] for d in in_order if not held_out(d)]
    want_val = [d["text"] for d in sorted((d for d in in_order if held_out(d)),
                                          key=lambda d: (d["source"], doc_id(d)))]
    for stream, want in ((data._train, want_train), (data._val, want_val)):
        ids = stream.read(0, len(stream)).astype(np.int64)
        bos = np.flatnonzero(ids == 0)
        assert bos[0] == 0
        got = [tok.decode(ids[a + 1:b].tolist()) for a, b in zip(bos, list(bos[1:]) + [len(ids)])]
        assert got == want


def test_validation_split_is_stable_under_file_order(env, tmp_path):
    other = _write(tmp_path / "in", env["docs"], order=1)  # halves swapped, documents reversed
    # give the tokenizer so that only the split and the order are under test
    opts = PrepareOptions(tokenizer=str(env["out"] / "tokenizer.json"), val_fraction=OPTS.val_fraction,
                          shard_tokens=SHARD, source_field="source", bos_token="<|bos|>")
    m = prepare(other, tmp_path / "out", opts)
    ref = _files(env["out"])
    got = _files(tmp_path / "out")
    val = sorted(k for k in ref if k.startswith("val-"))
    assert val and [got[k] for k in val] == [ref[k] for k in val]
    assert m["val_sources"] == env["manifest"]["val_sources"]
    assert m["documents"] == env["manifest"]["documents"]
    # the training stream holds the same tokens (in another order)
    a = open_data(tmp_path / "out", vocab_size=VOCAB)._train
    b = open_data(env["out"], vocab_size=VOCAB)._train
    assert np.array_equal(np.sort(a.read(0, len(a))), np.sort(b.read(0, len(b))))


@pytest.mark.parametrize("after", [1, 3])
def test_interrupted_prepare_reruns_to_identical_output(env, tmp_path, after):
    out = tmp_path / "out"

    def fail(n_shards):
        if n_shards == after:
            raise RuntimeError(f"fault injected after {after} shards")

    with pytest.raises(RuntimeError, match="fault injected"):
        prepare(env["inputs"], out, OPTS, after_shard=fail)
    assert not (out / "manifest.json").exists()
    shards = sorted(out.glob("train-*.bin"))
    assert len(shards) == after  # finished shards are complete under their final names
    assert all(p.stat().st_size == 2 * SHARD for p in shards)
    # another chunk size moves every checkpoint; the output must not depend on it
    prepare(env["inputs"], out, PrepareOptions(**{**OPTS.__dict__, "chunk_bytes": 25_000}))
    assert _files(out) == _files(env["out"])
    assert not (out / ".prepare").exists()
    # a finished folder is left alone; other options are refused
    assert prepare(env["inputs"], out, OPTS) == env["manifest"]
    with pytest.raises(UserError, match="another tokenizer"):
        prepare(env["inputs"], out, PrepareOptions(**{**OPTS.__dict__, "vocab_size": 600}))


def test_sampling_is_a_pure_function_and_crosses_shards(env):
    data = open_data(env["out"], vocab_size=VOCAB)
    x, y = data.train_batch(3, 7, 8, 64)
    x2, _ = open_data(env["out"], vocab_size=VOCAB).train_batch(3, 7, 8, 64)
    assert x.shape == (8, 64) and np.array_equal(x, x2) and np.array_equal(x[:, 1:], y[:, :-1])
    halves = [data.train_batch(3, 7, 8, 64, rank=r, world_size=2)[0] for r in (0, 1)]
    assert np.array_equal(np.concatenate(halves), x)
    whole = data._train.read(0, len(data._train))
    assert np.array_equal(data._train.read(SHARD - 10, 30), whole[SHARD - 10:SHARD + 20])
    vx, vy = data.val_windows(64, 5)
    assert vx.shape == (5, 64)
    by = data.val_windows_by_source(64, 3)
    assert set(by) == {r["name"] for r in env["manifest"]["val_sources"]}
    assert data.bpb(1.0) == pytest.approx(1 / np.log(2) / data.bytes_per_token)
    assert data.identity["manifest_sha256"] == load_shards(env["out"]).manifest_sha256


TRAIN = """
import json, os, signal, sys
from scaling.accounting.tiers import get_config
from scaling.training.loop.trainer import TrainConfig, train
a = json.loads(sys.argv[1])
def kill(state):  # after update kill_at's metrics line, before its checkpoint
    if state.iter == a["kill_at"]:
        os.kill(os.getpid(), signal.SIGKILL)
train(get_config("proxy-tiny", "smelt"), TrainConfig(**a["cfg"]), tier="proxy-tiny", run_name=a["name"],
      runs_dir=a["runs"], ckpt_dir=a["ckpt"], after_update=kill)
"""


def test_train_on_shards_kill_and_resume_gives_identical_logs(env, tmp_path):
    from scaling.accounting.tiers import get_config
    from scaling.training.loop.trainer import TrainConfig, train

    cfg = dict(tokens=[20 * 4 * 64], batch_size=4, data=str(env["out"]), eval_every=5, ckpt_every=4,
               threads=1, val_windows=8, warmup=2, val_by_source=True)
    train(get_config("proxy-tiny", "smelt"), TrainConfig(**cfg), tier="proxy-tiny", run_name="ref",
          runs_dir=tmp_path / "runs", ckpt_dir=tmp_path / "ckpt")
    args = json.dumps({"cfg": cfg, "name": "killed", "runs": str(tmp_path / "runs"),
                       "ckpt": str(tmp_path / "ckpt"), "kill_at": 11})
    proc = subprocess.run([sys.executable, "-c", TRAIN, args], capture_output=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    train(get_config("proxy-tiny", "smelt"), TrainConfig(**cfg), tier="proxy-tiny", run_name="killed",
          runs_dir=tmp_path / "runs", ckpt_dir=tmp_path / "ckpt", resume=True)

    def logs(name):
        rows = read_jsonl(tmp_path / "runs" / name / "metrics.jsonl").rows
        timing = ("tokens_per_s", "wall_s", "data_wait_s", "peak_mem_bytes")
        return [{k: v for k, v in r.items() if k not in timing} for r in rows]

    ref = logs("ref")
    assert len(ref) == 20 and ref[-1]["val_bpb"] > 0
    assert {"val_loss/code", "val_loss/prose"} <= set(ref[-1])  # the manifest's sources
    assert logs("killed") == ref
    meta = runlog.read_json(tmp_path / "runs" / "ref" / "config.json")
    assert meta["data_identity"]["manifest_sha256"] == load_shards(env["out"]).manifest_sha256
    assert meta["train"]["data"] == str(env["out"])


# ----- bad input: one line, exit 2 ----------------------------------------------------------


def _one_line_error(res, needle):
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr
    assert needle in res.stderr, res.stderr


def test_bad_inputs_are_one_line_errors(env, tmp_path):
    out = str(tmp_path / "o")
    (tmp_path / "notext.jsonl").write_text('{"content": "hello"}\n')
    _one_line_error(runner.invoke(app, ["prepare-data", str(tmp_path / "notext.jsonl"), "--out", out,
                                        "--vocab-size", "300"]), "no text field 'text'")
    (tmp_path / "empty.jsonl").write_text("")
    _one_line_error(runner.invoke(app, ["prepare-data", str(tmp_path / "empty.jsonl"), "--out", out,
                                        "--vocab-size", "300"]), "is empty")
    (tmp_path / "blank.jsonl").write_text('{"text": ""}\n\n')
    _one_line_error(runner.invoke(app, ["prepare-data", str(tmp_path / "blank.jsonl"), "--out", out,
                                        "--vocab-size", "300"]), "holds no documents")
    (tmp_path / "latin1.txt").write_bytes("café au lait\n".encode("latin-1"))
    _one_line_error(runner.invoke(app, ["prepare-data", str(tmp_path / "latin1.txt"), "--out", out,
                                        "--vocab-size", "300"]), "is not UTF-8")
    (tmp_path / "bad.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "\xff\xfe"}\n')
    _one_line_error(runner.invoke(app, ["prepare-data", str(tmp_path / "bad.jsonl"), "--out", out,
                                        "--vocab-size", "300"]), "is not UTF-8")
    _one_line_error(runner.invoke(app, ["prepare-data", str(tmp_path / "nope.jsonl"), "--out", out,
                                        "--vocab-size", "300"]), "does not exist")
    import gzip

    (tmp_path / "cut.jsonl.gz").write_bytes(gzip.compress(b'{"text": "hello"}\n' * 50)[:40])
    _one_line_error(runner.invoke(app, ["prepare-data", str(tmp_path / "cut.jsonl.gz"), "--out", out,
                                        "--vocab-size", "300"]), "cannot be read")
    res = runner.invoke(app, ["prepare-data", str(tmp_path / "blank.jsonl"), "--out", out,
                              "--vocab-size", "300", "--val-fraction", "0.9"])
    _one_line_error(res, "validation fraction")
    assert not Path(out).exists() or not any(Path(out).glob("*.bin"))


def test_vocabulary_and_tokenizer_mismatch_are_refused(env, tmp_path):
    small = prepare(env["inputs"][:1], tmp_path / "v600",
                    PrepareOptions(vocab_size=600, val_fraction=0.15, shard_tokens=SHARD))
    assert small["vocab_size"] == 600
    common = ["train", "--tier", "proxy-tiny", "--arch", "baseline", "--tokens", "512",
              "--runs-dir", str(tmp_path / "runs"), "--batch-size", "4", "--quiet"]
    _one_line_error(runner.invoke(app, common + ["--data", str(tmp_path / "v600")]),
                    "model vocabulary 512 is smaller than the vocabulary 600")
    _one_line_error(runner.invoke(app, common + ["--data", str(env["out"]), "--data-tokenizer",
                                                 str(tmp_path / "v600" / "tokenizer.json")]),
                    "differs from the one the shards")
    assert not (tmp_path / "runs").exists()  # refused before any run folder was made


def test_corrupt_shard_is_refused(env, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(env["out"], bad)
    shard = bad / "train-00001.bin"
    raw = bytearray(shard.read_bytes())
    raw[100] ^= 0xFF
    shard.write_bytes(bytes(raw))
    with pytest.raises(UserError, match="train-00001.bin is corrupt"):
        open_data(bad, vocab_size=VOCAB)
    res = runner.invoke(app, ["train", "--tier", "proxy-tiny", "--arch", "baseline", "--tokens", "512",
                              "--runs-dir", str(tmp_path / "runs"), "--batch-size", "4", "--quiet",
                              "--data", str(bad)])
    _one_line_error(res, "is corrupt")
    shard.write_bytes(raw[:-2])  # truncated: caught by the size check before any hashing
    with pytest.raises(UserError, match="the manifest says"):
        open_data(bad, vocab_size=VOCAB, verify=False)


def test_existing_nanogpt_and_npy_shards_are_indexed(tmp_path):
    rng = np.random.default_rng(0)
    folder = tmp_path / "nanogpt"
    folder.mkdir()
    train_ids = rng.integers(0, 50257, 10_000, dtype=np.uint16)
    train_ids.tofile(folder / "train.bin")
    np.save(folder / "train_extra.npy", rng.integers(0, 50257, 3_000).astype(np.uint16))
    rng.integers(0, 50257, 2_000, dtype=np.uint16).tofile(folder / "val.bin")
    res = runner.invoke(app, ["prepare-data", str(folder), "--dtype", "uint16", "--vocab-size", "50257",
                              "--eos-id", "50256", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["train_tokens"] == 13_000 and doc["val_tokens"] == 2_000
    data = open_data(folder, vocab_size=50304)
    assert data.bytes_per_token is None and data.bpb(2.0) is None
    assert np.array_equal(data._train.read(0, 10_000), train_ids)
    assert np.array_equal(data._train.read(10_000, 3_000), np.load(folder / "train_extra.npy"))
    with pytest.raises(UserError, match="smaller than the vocabulary 50,257"):
        open_data(folder, vocab_size=32768)
    bad = tmp_path / "bad"
    bad.mkdir()
    rng.integers(0, 600, 100, dtype=np.uint16).tofile(bad / "train.bin")
    rng.integers(0, 600, 100, dtype=np.uint16).tofile(bad / "val.bin")
    res = runner.invoke(app, ["prepare-data", str(bad), "--dtype", "uint16", "--vocab-size", "500"])
    _one_line_error(res, "outside the stated vocabulary")


PLAN = """
[sweep]
name = "data"
tiers = ["proxy-tiny"]
archs = ["baseline"]
budgets = [{budget}]
runs_dir = "{runs}"

[train]
batch_size = 4
device = "cpu"

[data]
{data}
"""


def test_plan_data_table(env, tmp_path):
    def plan(data, budget=2048):
        p = tmp_path / "plan.toml"
        p.write_text(PLAN.format(runs=tmp_path / "runs", data=data, budget=budget))
        return str(p)

    missing = plan('path = "no/such/folder"')
    _one_line_error(runner.invoke(app, ["sweep", missing, "--no-probe"]), "[data] path")
    res = runner.invoke(app, ["sweep", missing, "--dry-run", "--no-probe", "--json"])
    # the dry run shows its estimates, then refuses what the real sweep refuses (issue 25); JSON, since
    # the table's many columns wrap the run names at the 200 columns used off a terminal
    assert res.exit_code == 2 and "[data] path" in res.stderr
    assert [r["run"] for r in json.loads(res.stdout)["runs"]] == ["proxy-tiny-baseline-s0"]
    _one_line_error(runner.invoke(app, ["sweep", plan('pth = "x"'), "--dry-run", "--no-probe"]),
                    "unknown [data] keys: pth; valid keys: path")
    train_tokens = load_shards(env["out"]).n_train_tokens
    ok = plan(f'path = "{env["out"]}"', budget=train_tokens // 2)
    res = runner.invoke(app, ["sweep", ok, "--dry-run", "--no-probe", "--json"])
    row = json.loads(res.stdout)["runs"][0]
    assert row["train_tokens"] == train_tokens and row["epochs"] == pytest.approx(0.5, rel=1e-3)
    many = plan(f'path = "{env["out"]}"', budget=train_tokens * 5)
    _one_line_error(runner.invoke(app, ["sweep", many, "--no-probe"]), "allow_repeat = true")
    res = runner.invoke(app, ["sweep", many, "--dry-run", "--no-probe", "--max-epochs", "6", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["data_warnings"]
    from scaling.training.sweep.plan import load_plan
    from scaling.training.sweep.submit import train_config

    assert train_config(load_plan(ok).runs[0]).data == str(env["out"])


def test_builtin_corpus_has_the_same_interface(env):
    data = open_data(None, vocab_size=VOCAB, max_bytes=100_000)
    x, y = data.train_batch(0, 1, 4, 64)
    assert x.shape == (4, 64) and data.n_train_tokens == len(data.train_tokens)
    by = data.val_windows_by_source(64, 4)
    assert set(by) == {"shakespeare", "stdlib"} and all(len(w[0]) <= 4 for w in by.values())
    # each source's windows come from its own documents: the stdlib ones decode to Python
    code = "".join(data.tokenizer.decode(w.tolist()) for w in by["stdlib"][0])
    prose = "".join(data.tokenizer.decode(w.tolist()) for w in by["shakespeare"][0])
    assert "def " in code and "def " not in prose and "ACT" in prose
    assert data.identity["kind"] == "builtin" and data.identity["spec"]["vocab_size"] == VOCAB


KILLED = """
import json, sys
from scaling.training.data.prepare import PrepareOptions, prepare
a = json.loads(sys.argv[1])
prepare(a["inputs"], a["out"], PrepareOptions(**a["opts"]))
"""


def test_sigkill_during_prepare_then_rerun_gives_identical_output(env, tmp_path):
    import time

    out = tmp_path / "out"
    opts = {**OPTS.__dict__, "chunk_bytes": 4_000}  # many checkpoints: the kill lands between two
    args = json.dumps({"inputs": env["inputs"], "out": str(out), "opts": opts})
    proc = subprocess.Popen([sys.executable, "-c", KILLED, args], stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not (out / "train-00001.bin").exists():
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    if proc.returncode != -signal.SIGKILL or (out / "manifest.json").exists():
        pytest.fail(f"prepare ended (rc={proc.returncode}) before it could be killed")
    assert (out / ".prepare" / "state.json").exists()
    prepare(env["inputs"], out, OPTS)
    assert _files(out) == _files(env["out"])


def test_one_file_under_two_source_names_is_refused(tmp_path):
    """`prepare-data a=docs.jsonl b=docs.jsonl` kept source a alone, silently."""
    from scaling.training.data.prepare import find_inputs

    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"text": "hello world"}\n')
    with pytest.raises(UserError, match="given under two source names \\(a and b\\)"):
        find_inputs([f"a={docs}", f"b={docs}"])
    assert [f.source for f in find_inputs([f"a={docs}", f"a={docs}"])] == ["a"]   # the same name: one input
    with pytest.raises(UserError, match="\\(a and none\\)"):      # a glob without a name reaches it too
        find_inputs([f"a={docs}", str(tmp_path / "*.jsonl")])


def test_a_refused_input_leaves_no_output_folder(tmp_path):
    """A bad record refused after the inputs were hashed left out/.prepare/input_hashes.json behind."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{oops\n')
    res = CliRunner().invoke(app, ["prepare-data", str(bad), "--out", str(tmp_path / "out"),
                                   "--vocab-size", "300"])
    assert res.exit_code == 2 and "not a JSON line" in res.stderr
    assert not (tmp_path / "out").exists()
