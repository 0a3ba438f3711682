"""benchmarks/gpu_check.py: skipped without CUDA; its code path at a tiny size on the CPU (2 gloo ranks)."""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def load():
    # importable by name: the spawned ranks unpickle gpu_check._worker (sys.path is passed on)
    if str(SCRIPT.parent) not in sys.path:
        sys.path.insert(0, str(SCRIPT.parent))
    return importlib.import_module("gpu_check")


def test_without_cuda_it_skips_in_one_line():
    if torch.cuda.is_available():
        return
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout == "gpu_check: skipped, no CUDA device\n"


def test_the_check_at_tiny_size_on_two_cpu_ranks(capsys):
    gpu_check = load()
    rc = gpu_check.main(["--device", "cpu", "--tier", "proxy-tiny", "--archs", "smelt", "--steps", "6",
                         "--warmup", "1", "--lr", "1e-2", "--nproc", "2", "--json"])
    lines = capsys.readouterr().out.strip().splitlines()
    doc = json.loads(lines[-1])
    assert rc == 0 and doc["ok"] and len(lines) == 1
    (arch,) = doc["archs"]
    assert arch["arch"] == "smelt" and arch["steps"] == 6 and arch["timed_steps"] == 5
    assert arch["tokens_per_s"] > 0 and arch["tokens_per_step"] == 2 * 2 * 2 * 64
    assert arch["loss_fell"] and arch["last_loss"] < arch["first_loss"]
    assert arch["mfu"] is None and arch["peak_memory_gb"] is None  # CUDA-only numbers
    assert 0 < arch["planned_memory_gb"] < 1  # the planner's estimate for this layout (fp32, 2 ranks)
    for which in ("baseline", "smelt"):
        m = doc["meta_build"][which]
        assert m["equal"] and m["all_meta"] and m["built"] > 50e9


def test_synthetic_tokens_follow_the_successor_table():
    gpu_check = load()
    ids = gpu_check.synthetic_tokens(97, 8, 200, seed=1)
    table = torch.randperm(97, generator=torch.Generator().manual_seed(1))
    follows = (ids[:, 1:] == table[ids[:, :-1]]).float().mean().item()
    assert ids.shape == (8, 201) and 0.85 < follows < 0.95
