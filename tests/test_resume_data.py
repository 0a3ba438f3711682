"""Issue 25, "resume must refuse changed data": the exact case of the issue (the same inputs
prepared again with another validation fraction, then --resume) and bit rot that keeps the
mtime, caught by --verify-data full."""

from __future__ import annotations

import dataclasses
import os
import shutil

import pytest
from test_prepare import OPTS, VOCAB, _docs, _write
from typer.testing import CliRunner

from scaling.cli import app
from scaling.common.errors import UserError
from scaling.training.data.loader import open_data
from scaling.training.data.prepare import prepare

runner = CliRunner()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    pytest.importorskip("pyarrow")
    root = tmp_path_factory.mktemp("resume-data")
    return root, _write(root / "in", _docs())


def _train(data, runs, *extra):
    return runner.invoke(app, ["train", "--tier", "proxy-tiny", "--arch", "baseline", "--tokens", "2048",
                               "--batch-size", "4", "--threads", "1", "--val-windows", "4", "--warmup", "1",
                               "--data", str(data), "--runs-dir", str(runs), "--run-name", "r", "--quiet",
                               *extra])


def test_resume_refuses_data_prepared_again_with_another_val_fraction(inputs, tmp_path, monkeypatch):
    root, files = inputs
    monkeypatch.setenv("SMELT_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "shards"
    prepare(files, data, OPTS)
    res = _train(data, tmp_path / "runs")
    assert res.exit_code == 0, res.output
    assert _train(data, tmp_path / "runs", "--resume").exit_code == 0  # same data: resumes
    before = open_data(data, vocab_size=VOCAB).n_train_tokens
    shutil.rmtree(data)
    prepare(files, data, dataclasses.replace(OPTS, val_fraction=0.3))  # same inputs, same path
    after = open_data(data, vocab_size=VOCAB).n_train_tokens
    assert after < before
    res = _train(data, tmp_path / "runs", "--resume")
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert "\n" not in err and err.startswith("error: run r was started on other data")
    assert "manifest_sha256" in err and f"train_tokens {before:,} -> {after:,}" in err


def test_bit_rot_that_keeps_the_mtime_needs_the_full_check(inputs, tmp_path, monkeypatch):
    root, files = inputs
    monkeypatch.setenv("SMELT_CACHE", str(tmp_path / "cache"))
    data = tmp_path / "shards"
    prepare(files, data, OPTS)
    open_data(data, vocab_size=VOCAB)  # a full hash, remembered with each file's (size, mtime)
    shard = sorted(data.glob("train-*.bin"))[0]
    st = shard.stat()
    raw = bytearray(shard.read_bytes())
    raw[10] ^= 0x01
    shard.write_bytes(bytes(raw))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))  # bit rot: same size, same mtime
    open_data(data, vocab_size=VOCAB, verify="cheap")  # the cheap default cannot see it (documented)
    with pytest.raises(UserError, match=f"{shard.name} is corrupt"):
        open_data(data, vocab_size=VOCAB, verify="full")
    res = _train(data, tmp_path / "runs", "--verify-data", "full")
    assert res.exit_code == 2 and "is corrupt" in res.stderr and res.stderr.count("\n") == 1, res.output
    assert not (tmp_path / "runs" / "r").exists()  # refused before the run folder was made
    res = _train(data, tmp_path / "runs", "--verify-data", "fast")
    assert res.exit_code == 2 and "data_verify must be cheap or full" in res.stderr
