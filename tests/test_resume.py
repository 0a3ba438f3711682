"""Kill a training subprocess with SIGKILL, resume it, and get exactly the uninterrupted run's logs.

The kills land at the worst moments: right after an update's metrics line (and, at a budget
end, its final.json point) is written but before its checkpoint, in the trunk before any
checkpoint exists, at the end of a cooldown branch, and after the trunk has returned from the
branch; plus one kill from outside at an arbitrary moment. CPU, 1 thread: bitwise equal.
"""

import json
import signal
import subprocess
import sys
import time

import pytest

from scaling.accounting.tiers import get_config
from scaling.common.files import read_jsonl
from scaling.training import runlog
from scaling.training.loop.checkpoint import latest_iter
from scaling.training.loop.trainer import TrainConfig, train

TIER = "proxy-tiny"
STEP_TOKENS = 8 * 64
TIMING = {"tokens_per_s", "wall_s", "data_wait_s", "peak_mem_bytes"}
CFG = dict(tokens=[10 * STEP_TOKENS, 20 * STEP_TOKENS], batch_size=8, data_max_bytes=100_000, eval_every=5,
           ckpt_every=4, threads=1, val_windows=16, warmup=2)
SCRIPT = """
import json, os, signal, sys
from scaling.accounting.tiers import get_config
from scaling.training.loop.trainer import TrainConfig, train
a = json.loads(sys.argv[1])
resume = os.path.exists(os.path.join(a["runs"], a["name"], "config.json"))
def kill(state):  # after update kill_at's metrics line (and final.json point), before its checkpoint
    if state.iter == a["kill_at"]:
        os.kill(os.getpid(), signal.SIGKILL)
train(get_config(a["tier"], "smelt"), TrainConfig(**a["cfg"]), tier=a["tier"], run_name=a["name"],
      runs_dir=a["runs"], resume=resume, after_update=kill)
"""


def launch(tmp_path, name, env, kill_at=None, cfg=CFG):
    args = json.dumps({"tier": TIER, "cfg": cfg, "name": name, "runs": str(tmp_path / "runs"),
                       "kill_at": kill_at})
    return subprocess.Popen([sys.executable, "-c", SCRIPT, args], env=env, stderr=subprocess.PIPE)


def in_process(tmp_path, name, resume=False, cfg=CFG):
    return train(get_config(TIER, "smelt"), TrainConfig(**cfg), tier=TIER, run_name=name,
                 runs_dir=tmp_path / "runs", resume=resume)


def logs(tmp_path, name):
    rd = tmp_path / "runs" / name
    metrics = [
        {k: v for k, v in r.items() if k not in TIMING}
        for r in read_jsonl(rd / "metrics.jsonl", missing_ok=True).rows
    ]
    final = runlog.read_json(rd / "final.json")
    del final["run"]
    final["points"] = [{k: v for k, v in p.items() if k not in ("wall_s", "run")} for p in final["points"]]
    return metrics, final


def test_killed_runs_resume_to_identical_logs(tmp_path, env):
    in_process(tmp_path, "ref")
    ref_metrics, ref_final = logs(tmp_path, "ref")
    assert len(ref_metrics) == 22 and ref_final["complete"]

    # iter 3: trunk, no checkpoint yet; 10: end of the 10-step budget's branch (point written,
    # checkpoint not); 15: trunk after the branch (last checkpoint at 12)
    ckpts = tmp_path / "runs" / "killed" / "checkpoints"
    for kill_at, ckpt_iter in ((3, None), (10, 8), (15, 12)):
        proc = launch(tmp_path, "killed", env, kill_at)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
        metrics = read_jsonl(tmp_path / "runs" / "killed" / "metrics.jsonl", missing_ok=True).rows
        assert metrics[-1]["iter"] == kill_at  # the line was durable before the kill
        if kill_at == 10:
            final = runlog.read_json(tmp_path / "runs" / "killed" / "final.json")
            assert [p["budget_index"] for p in final["points"]] == [0] and not final["complete"]
        # the resume starts at the latest checkpoint and drops the lines after it
        assert latest_iter(ckpts) == ckpt_iter
    in_process(tmp_path, "killed", resume=True)
    metrics, final = logs(tmp_path, "killed")
    assert metrics == ref_metrics  # nothing lost, nothing duplicated, same numbers
    assert final == ref_final


def test_kill_from_outside_at_any_moment(tmp_path, env):
    cfg = {**CFG, "tokens": [30 * STEP_TOKENS], "ckpt_every": 3}
    in_process(tmp_path, "ref", cfg=cfg)
    ref_metrics, ref_final = logs(tmp_path, "ref")

    proc = launch(tmp_path, "ext", env, cfg=cfg)
    path = tmp_path / "runs" / "ext" / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if len(read_jsonl(path, missing_ok=True).rows) >= 7:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    proc.communicate(timeout=60)
    if proc.returncode != -signal.SIGKILL:
        pytest.fail(f"the run ended (rc={proc.returncode}) before it could be killed")
    n_lines = len(read_jsonl(path, missing_ok=True).rows)
    assert 7 <= n_lines < 30
    in_process(tmp_path, "ext", resume=True, cfg=cfg)
    metrics, final = logs(tmp_path, "ext")
    assert metrics == ref_metrics
    assert final == ref_final
