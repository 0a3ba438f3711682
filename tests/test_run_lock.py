"""Issue 25, "one writer per run folder": a run holds an exclusive lock on its folder; a second
training (new, --resume or --overwrite) on the same folder is refused at once, one line naming
the holder, and the first run's files are untouched."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest
from test_resume import CFG, STEP_TOKENS, TIER, in_process, launch
from typer.testing import CliRunner

from cli import app
from scaling.common.errors import UserError
from scaling.common.files import read_jsonl
from scaling.training.loop.lock import LOCK, RunLock, check_free


def test_lock_names_its_holder_and_dies_with_the_process(tmp_path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    lock = RunLock()
    lock.acquire(run_dir)
    with pytest.raises(UserError, match=f"in use by pid {os.getpid()} on {socket.gethostname()}"):
        check_free(run_dir)
    with pytest.raises(UserError, match="in use by pid"):
        RunLock().acquire(run_dir)
    lock.release()
    check_free(run_dir)
    # a holder killed with SIGKILL leaves the file but not the lock
    code = (f"import sys, time; sys.path.insert(0, {os.getcwd()!r}); "
            "from scaling.training.loop.lock import RunLock; lock = RunLock(); "
            f"lock.acquire({str(run_dir)!r}); print('held', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout.readline().strip() == b"held"
    with pytest.raises(UserError, match=f"pid {proc.pid}"):
        check_free(run_dir)
    proc.kill()
    proc.wait()
    check_free(run_dir)
    assert (run_dir / LOCK).exists()


def test_a_folder_where_the_lock_file_goes_is_named(tmp_path):
    """The resume audit: a .lock that is a folder gave 'error: Is a directory'."""
    run_dir = tmp_path / "r"
    (run_dir / LOCK).mkdir(parents=True)
    with pytest.raises(UserError, match=r"\.lock is a folder, where the run folder keeps its lock file"):
        RunLock().acquire(run_dir)


def test_in_process_second_writer_is_refused(tmp_path, env):
    """A new run and a --resume on a folder whose lock is held are refused before any write."""
    cfg = {**CFG, "tokens": [4 * STEP_TOKENS]}
    run_dir = tmp_path / "runs" / "held"
    run_dir.mkdir(parents=True)
    lock = RunLock()
    lock.acquire(run_dir)
    with pytest.raises(UserError, match="is in use by pid"):
        in_process(tmp_path, "held", cfg=cfg)
    assert sorted(p.name for p in run_dir.iterdir()) == [LOCK]  # nothing written
    lock.release()
    in_process(tmp_path, "held", cfg=cfg)  # free again: the run goes
    lock.acquire(run_dir)
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file() and p.name != LOCK}
    with pytest.raises(UserError, match="is in use by pid"):
        in_process(tmp_path, "held", resume=True, cfg=cfg)
    assert before == {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file() and p.name != LOCK}
    lock.release()


def test_two_concurrent_trainers(tmp_path, env):
    """The issue's case: a second `train` (--resume, then --overwrite) while the first runs gets
    exit 2 quickly; the first keeps writing every line once, under its own run id."""
    cfg = {**CFG, "tokens": [2000 * STEP_TOKENS], "eval_every": 0}
    first = launch(tmp_path, "busy", env, cfg=cfg)
    metrics = tmp_path / "runs" / "busy" / "metrics.jsonl"
    try:
        deadline = time.time() + 300
        while time.time() < deadline and first.poll() is None and not read_jsonl(metrics,
                                                                                 missing_ok=True).rows:
            time.sleep(0.05)
        assert first.poll() is None, first.stderr.read().decode()[-800:]
        run_id = json.loads((tmp_path / "runs" / "busy" / "config.json").read_text())["run_id"]
        base = ["train", "--tier", TIER, "--arch", "smelt", "--tokens",
                str(2000 * STEP_TOKENS), "--batch-size", "8", "--data-max-bytes", "100000", "--threads", "1",
                "--runs-dir", str(tmp_path / "runs"), "--run-name", "busy", "--val-windows", "16",
                "--warmup", "2", "--eval-every", "0", "--ckpt-every", "4", "--quiet"]
        for flag in ("--resume", "--overwrite"):
            t0 = time.time()
            second = CliRunner().invoke(app, base + [flag])  # in-process: no second torch start-up
            assert time.time() - t0 < 20  # refused before any data or model is built
            assert second.exit_code == 2, second.output
            err = second.stderr.strip()
            assert err.startswith("error: run folder") and f"in use by pid {first.pid}" in err
            assert "\n" not in err
        assert first.poll() is None  # the first run was running all along
    finally:
        first.kill()
        first.communicate(timeout=60)
    rows = read_jsonl(metrics, missing_ok=True).rows
    assert len(rows) >= 1 and [r["iter"] for r in rows] == list(range(1, len(rows) + 1))
    assert json.loads((tmp_path / "runs" / "busy" / "config.json").read_text())["run_id"] == run_id
