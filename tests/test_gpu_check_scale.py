"""benchmarks/gpu_check_scale.py: its CPU path runs the three checks; without CUDA the default skips."""

from __future__ import annotations

import argparse

import pytest
import torch


def test_cpu_path_runs_chunked_ce_ep_dispatch_and_per_pass_reduction(bench):
    if torch.distributed.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    res = bench("gpu_check_scale").run_checks(argparse.Namespace(device="cpu"))
    assert res["ok"] is True
    assert res["chunked_ce"]["loss_rel_diff"] <= 1e-5 and res["ep_dispatch"]["max_abs_diff"] <= 1e-5
    pp = res["per_pass_reduction"]
    assert pp["grad_rel_diff"] <= 1e-6 and pp["per-pass"]["reducers"] == 2 and pp["fsdp"]["reducers"] == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the skip without CUDA")
def test_skips_cleanly_without_cuda(bench):
    res = bench("gpu_check_scale").run_checks(argparse.Namespace(device="cuda"))
    assert res == {"ok": True, "skipped": "no CUDA device"}
