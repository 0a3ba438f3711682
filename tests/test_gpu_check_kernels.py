"""benchmarks/gpu_check_kernels.py: on the CPU it runs both checks at a proxy tier's shapes and
finds the router GEMM and the bf16 dispatch equal to their definitions; a planted wrong router
fails it; without CUDA the default skips."""

from __future__ import annotations

import argparse

import pytest
import torch


def test_cpu_path_checks_the_router_gemm_and_the_dispatch_dtype(bench):
    res = bench("gpu_check_kernels").run_checks(argparse.Namespace(device="cpu"))
    assert res["ok"] is True and res["tier"] == "proxy-s" and "not a GPU number" in res["timing"]
    for arch in ("baseline", "smelt"):
        router, disp = res[arch]["router"], res[arch]["dispatch"]
        assert router["tensor_core_path"] is False  # the CPU build has no mm out_dtype kernel
        assert router["logits_dtype"] == "torch.float32"
        assert max(router["logits_rel_err"], router["grad_x_rel_err"], router["grad_w_rel_err"]) <= 1e-6
        assert disp["rows_equal"] and disp["grad_rel_err"] <= 1e-6
        assert router["ms_fwd_bwd"] > 0 and disp["ms_fwd_bwd_gather_first"] > 0


def test_a_router_that_rounds_its_logits_to_bf16_fails(monkeypatch, bench):
    from scaling.training.model import transformer

    real = transformer.router_logits
    monkeypatch.setattr(transformer, "router_logits", lambda x, w: real(x, w).bfloat16().float())
    res = bench("gpu_check_kernels").run_checks(argparse.Namespace(device="cpu"))
    assert res["ok"] is False and res["baseline"]["router"]["logits_rel_err"] > 1e-4


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the skip without CUDA")
def test_skips_cleanly_without_cuda(bench):
    res = bench("gpu_check_kernels").run_checks(argparse.Namespace(device="cuda"))
    assert res == {"ok": True, "skipped": "no CUDA device"}
