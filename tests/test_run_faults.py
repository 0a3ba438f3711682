"""Issue 25, one-line errors instead of tracebacks in the trainer: token ids beyond the model's
vocabulary (refused before the run folder exists), a full disk and Ctrl-C during a DCP save
(`error: no space left ...` / `error: interrupted`, the previous checkpoint intact, and the run
resumes). The write error is injected into DCP's own file writer, not by filling a disk."""

from __future__ import annotations

import errno
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from cli import app

runner = CliRunner()
STEP = 4 * 64  # batch 4 x proxy-tiny's seq_len 64


def _train(runs, *extra, tokens=12 * STEP):
    return runner.invoke(app, ["train", "--tier", "proxy-tiny", "--arch", "baseline", "--tokens", str(tokens),
                               "--batch-size", "4", "--threads", "1", "--val-windows", "4", "--warmup", "1",
                               "--data-max-bytes", "100000", "--ckpt-every", "4", "--eval-every", "0",
                               "--runs-dir", str(runs), "--run-name", "r", "--quiet", *extra])


def test_token_ids_beyond_the_vocabulary_are_refused_before_the_run_folder(tmp_path, env):
    folder = tmp_path / "shards"
    folder.mkdir()
    rng = np.random.default_rng(0)
    rng.integers(0, 600, 5_000, dtype=np.uint16).tofile(folder / "train.bin")
    rng.integers(0, 600, 1_000, dtype=np.uint16).tofile(folder / "val.bin")
    res = runner.invoke(app, ["prepare-data", str(folder), "--dtype", "uint16", "--vocab-size", "600"])
    assert res.exit_code == 0, res.output
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["vocab_size"] = 512  # a manifest that understates its vocabulary
    (folder / "manifest.json").write_text(json.dumps(manifest))
    res = runner.invoke(app, ["train", "--tier", "proxy-tiny", "--arch", "baseline", "--tokens",
                              str(4 * STEP), "--batch-size", "4", "--data", str(folder), "--runs-dir",
                              str(tmp_path / "runs"), "--quiet"])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.output
    assert "outside the model's vocabulary of 512 ids" in res.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("exc, code, message", [
    (OSError(errno.ENOSPC, "No space left on device"), 2,
     f"error: no space left on device while writing checkpoint iter-{8:09d}"),
    (OSError(errno.EFBIG, "File too large"), 2, "error: file too large for the file system"),
    # what torch.save's writer raises for a short write (measured under `ulimit -f 300`)
    (RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"), 2,
     "error: a write was cut short (the disk is full, or a file-size limit such as `ulimit -f`"),
    (KeyboardInterrupt(), 130, "error: interrupted"),
], ids=["ENOSPC", "EFBIG", "short-write", "Ctrl-C"])
def test_failed_checkpoint_save_keeps_the_previous_one(tmp_path, env, monkeypatch, exc, code, message):
    fs = pytest.importorskip("torch.distributed.checkpoint.filesystem")
    if not hasattr(fs, "_write_item"):
        pytest.skip("this torch's DCP has no _write_item to inject a write error into")
    original = fs._write_item

    def write_item(transforms, stream, *args, **kwargs):  # fails inside the save of iter 8 only
        if f".tmp-iter-{8:09d}" in str(getattr(stream, "name", "")):
            raise exc
        return original(transforms, stream, *args, **kwargs)

    monkeypatch.setattr(fs, "_write_item", write_item)
    res = _train(tmp_path / "runs")
    assert res.exit_code == code, res.output
    err = res.stderr.strip()
    assert err.startswith(message) and "\n" not in err and "Traceback" not in res.output, err
    ckpts = tmp_path / "runs" / "r" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == [f"iter-{4:09d}"]  # intact, no temporaries left
    if code == 2:
        assert f"the previous checkpoint iter-{4:09d} is intact" in err
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:  # space freed: the run resumes
        monkeypatch.setattr(fs, "_write_item", original)
        res = _train(tmp_path / "runs", "--resume", "--json")
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["complete"]
