"""Issue 25, "killing the torchrun launcher leaves ranks training": SIGKILL the launcher of 2 gloo
ranks mid-run; both workers stop (parent-death signal -> the next safe point) within seconds,
and the run folder holds whole lines only, which a resume continues."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scaling.common.files import read_jsonl

STEP = 8 * 64


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_killing_torchrun_stops_its_workers(tmp_path, env):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "cli", "train", "--tier", "proxy-tiny", "--arch", "smelt", "--tokens", str(3000 * STEP),
           "--batch-size", "8", "--data-max-bytes", "100000", "--eval-every", "0", "--ckpt-every", "50",
           "--threads", "1", "--val-windows", "8", "--device", "cpu", "--run-name", "orphan",
           "--runs-dir", str(tmp_path / "runs"), "--quiet"]
    launcher = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                cwd=Path(__file__).resolve().parents[1])
    metrics = tmp_path / "runs" / "orphan" / "metrics.jsonl"
    workers: list[int] = []
    try:
        deadline = time.time() + 300
        while time.time() < deadline and launcher.poll() is None and len(read_jsonl(
                metrics, missing_ok=True).rows) < 3:
            time.sleep(0.1)
        assert launcher.poll() is None, "the run ended before the launcher could be killed"
        workers = _children(launcher.pid)
        assert len(workers) == 2, workers
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()
        t0 = time.time()
        while time.time() - t0 < 60 and any(_alive(w) for w in workers):
            time.sleep(0.1)
        took = time.time() - t0
        assert not any(_alive(w) for w in workers), "workers still training after their launcher died"
        assert took < 30
    finally:
        for w in workers or _children(launcher.pid):  # never leave orphans, even when the test fails
            if _alive(w):
                os.kill(w, signal.SIGKILL)
        if launcher.poll() is None:
            launcher.kill()
    rows = read_jsonl(metrics).rows
    assert [r["iter"] for r in rows] == list(range(1, len(rows) + 1)) and len(rows) < 3000
    n = len(rows)
    time.sleep(1)
    assert len(read_jsonl(metrics).rows) == n  # nothing writes any more
