"""DDP: `smelt-scale train` under torchrun with 2 CPU processes (gloo) matches one process.

Rank r of W computes rows [r*B/W, (r+1)*B/W) of each global batch; the single-process
reference runs the same global batch as W accumulation steps of B/W rows (the load-balancing
loss is a per-forward statistic, so the micro-batch must match for the objective to be the
same function). The two differ only in float summation order (DDP's gradient all-reduce,
the validation split across ranks), which stays ~1e-7 relative over these few steps; 1e-5
relative is far below a change of one update (the loss moves by ~1e-2 per step here).
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from scaling.accounting.tiers import get_config
from scaling.common.files import read_jsonl
from scaling.training import runlog
from scaling.training.loop.trainer import TrainConfig, train

TIER = "proxy-tiny"
STEP_TOKENS = 8 * 64
TOKENS = (10 * STEP_TOKENS, 20 * STEP_TOKENS)
REL = 1e-5


@pytest.fixture()
def cache(tmp_path_factory, monkeypatch):
    cache = str(tmp_path_factory.getbasetemp() / "smelt-cache")
    monkeypatch.setenv("SMELT_CACHE", cache)
    threads = torch.get_num_threads()
    yield cache
    torch.set_num_threads(threads)


def test_two_gloo_ranks_match_one_process(tmp_path, cache):
    cfg = TrainConfig(tokens=TOKENS, batch_size=8, micro_batch_size=4, data_max_bytes=100_000, eval_every=5,
                      ckpt_every=4, threads=1, val_windows=16, warmup=2)
    ref = train(get_config(TIER, "smelt"), cfg, tier=TIER, run_name="single", runs_dir=tmp_path / "runs",
                ckpt_dir=tmp_path / "ckpt")

    env = {**os.environ, "SMELT_CACHE": cache, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "cli",
        "train",
        "--tier",
        TIER,
        "--arch",
        "smelt",
        "--tokens",
        ",".join(map(str, TOKENS)),
        "--batch-size",
        "8",
        "--data-max-bytes",
        "100000",
        "--eval-every",
        "5",
        "--ckpt-every",
        "4",
        "--threads",
        "1",
        "--val-windows",
        "16",
        "--warmup",
        "2",
        "--device",
        "cpu",
        "--run-name",
        "ddp",
        "--runs-dir",
        str(tmp_path / "runs"),
        "--ckpt-dir",
        str(tmp_path / "ckpt"),
        "--json",
    ]
    proc = subprocess.run(
        cmd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)  # exactly one JSON document: rank 1 prints nothing

    meta = runlog.read_json(tmp_path / "runs" / "ddp" / "config.json")
    assert meta["resolved"]["world_size"] == 2 and meta["resolved"]["micro_batch_size"] == 4
    single = read_jsonl(tmp_path / "runs" / "single" / "metrics.jsonl", missing_ok=True).rows
    ddp = read_jsonl(tmp_path / "runs" / "ddp" / "metrics.jsonl", missing_ok=True).rows
    assert [(r["iter"], r["step"], r["branch"]) for r in ddp] == [
        (r["iter"], r["step"], r["branch"]) for r in single
    ]  # rank 0 alone logs
    for a, b in zip(single, ddp):
        for key in ("train_loss", "aux_loss", "z_loss", "val_loss"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=REL), (key, a["iter"])
        assert b["lr"] == a["lr"]
    assert [p["D"] for p in doc["points"]] == [p["D"] for p in ref["points"]]
    for p, q in zip(doc["points"], ref["points"]):
        assert p["loss"] == pytest.approx(q["loss"], rel=REL)
