"""GPU checks of the MoE layer's mixed-precision kernels (issue 31), at the 100M tier's shapes.

Called by ``benchmarks/gpu_check.py`` (its ``EXTRA_CHECKS``) as ``run_checks(args)``; also runs
alone: ``python benchmarks/gpu_check_kernels.py [--device cpu] [--json]``. Without CUDA (and not
asked for the CPU) it returns ``{"ok": true, "skipped": "..."}`` at once. On the CPU it runs
the same code at a proxy tier's shapes (tests/test_gpu_check_kernels.py).

For each architecture, with N = 8 x 4096 tokens (micro-batch 8) of the tier's width:

1. The router GEMM (``transformer.router_logits`` under bf16 autocast, fp32 master weight as on
   one GPU unwrapped): its logits and input/weight gradients against their definition (the fp32
   GEMM of the bf16-rounded operands and of the bf16-rounded output gradient, the gradients
   rounded to bf16; relative error, ``ok`` below 1e-4: fp32 summation order only, and on a GPU
   the tensor-core path must have run: ``mm_out_dtype_runs``), and the forward + backward time
   against the fp32 GEMM it replaces (``F.linear`` of the fp32 operands, the pre-2026-12-05
   router).
2. The dispatch (``transformer.dispatch`` of fp32 rows into bf16, k = top-k): cast-then-gather
   (the model's) against gather-then-cast, rows bitwise equal and gradients within 1e-6
   relative, forward + backward times of each.

Times are medians of ``REPS`` calls after ``WARMUP``, CUDA events on the GPU (wall clock on the
CPU, where they mean nothing for the GPU); the JSON says which.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WARMUP, REPS = 3, 10


def _median_ms(fn, device: torch.device) -> float:
    """Median wall time of fn() in ms: CUDA events on the GPU, perf_counter on the CPU."""
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(REPS):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t))
    return statistics.median(times)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _router(device: torch.device, N: int, d: int, E: int) -> dict:
    from scaling.training.model.transformer import mm_out_dtype_runs, router_logits

    gen = torch.Generator(device="cpu").manual_seed(0)
    x0 = torch.randn(N, d, generator=gen).to(device)               # the fp32 norm output
    w0 = (0.02 * torch.randn(E, d, generator=gen)).to(device)      # the fp32 master weight
    g = torch.randn(N, E, generator=gen).to(device)
    x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    with torch.autocast(device.type, dtype=torch.bfloat16):
        logits = router_logits(x, w)
    logits.backward(g)
    xb, wb, gb = x0.bfloat16().float(), w0.bfloat16().float(), g.bfloat16().float()
    res = {"tokens": N, "d": d, "experts": E, "tensor_core_path": mm_out_dtype_runs(device.type),
           "logits_dtype": str(logits.dtype), "logits_rel_err": _rel(logits.detach(), xb @ wb.t()),
           "grad_x_rel_err": _rel(x.grad, (gb @ wb).bfloat16()),
           "grad_w_rel_err": _rel(w.grad, (gb.t() @ xb).bfloat16())}

    def new():
        xx, ww = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            router_logits(xx, ww).backward(g)

    def old():
        xx, ww = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        F.linear(xx.float(), ww.float()).backward(g)

    res["ms_fwd_bwd"], res["ms_fwd_bwd_fp32"] = _median_ms(new, device), _median_ms(old, device)
    res["ok"] = (logits.dtype == torch.float32  # and on a GPU the tensor cores ran it
                 and (res["tensor_core_path"] or device.type == "cpu")
                 and max(res["logits_rel_err"], res["grad_x_rel_err"], res["grad_w_rel_err"]) <= 1e-4)
    return res


def _dispatch(device: torch.device, N: int, d: int, E: int, k: int) -> dict:
    from scaling.training.model.transformer import dispatch, expert_histogram, sort_by_expert

    gen = torch.Generator(device="cpu").manual_seed(1)
    top_i = torch.rand(N, E, generator=gen).topk(k, dim=-1).indices.to(device)
    order, inverse, _ = sort_by_expert(top_i, expert_histogram(top_i, E).sum(0))
    x0 = torch.randn(N, d, generator=gen).to(device)
    g = torch.randn(N * k, d, generator=gen).to(device).bfloat16()

    def cast_first(x):
        return dispatch(x, order, inverse, k, torch.bfloat16)

    def gather_first(x):
        return dispatch(x, order, inverse, k).to(torch.bfloat16)

    out = {}
    for name, fn in (("cast_first", cast_first), ("gather_first", gather_first)):
        x = x0.clone().requires_grad_()
        rows = fn(x)
        rows.backward(g)
        out[name] = (rows.detach(), x.grad)

        def step(fn=fn):
            xx = x0.clone().requires_grad_()
            fn(xx).backward(g)

        out[name + "_ms"] = _median_ms(step, device)
    (r1, g1), (r2, g2) = out["cast_first"], out["gather_first"]
    res = {"tokens": N, "d": d, "top_k": k, "rows_equal": bool(torch.equal(r1, r2)),
           "grad_rel_err": _rel(g1, g2), "ms_fwd_bwd": out["cast_first_ms"],
           "ms_fwd_bwd_gather_first": out["gather_first_ms"]}
    res["ok"] = res["rows_equal"] and res["grad_rel_err"] <= 1e-6
    return res


def run_checks(args: argparse.Namespace) -> dict:
    """Both checks for both architectures on ``args.device`` (default cuda); a clean skip where
    CUDA is absent."""
    from scaling.accounting.tiers import get_config

    want = getattr(args, "device", "cuda")
    if want == "cuda" and not torch.cuda.is_available():
        return {"ok": True, "skipped": "no CUDA device"}
    device = torch.device("cuda" if want == "cuda" else "cpu")
    tier, N = ("100M", 8 * 4096) if device.type == "cuda" else ("proxy-s", 256)
    res: dict = {"device": str(device), "tier": tier, "timing": "CUDA events" if device.type == "cuda"
                 else "CPU wall clock (not a GPU number)"}
    for arch in ("baseline", "smelt"):
        cfg = get_config(tier, arch)
        res[arch] = {"router": _router(device, N, cfg.d_model, cfg.n_experts),
                     "dispatch": _dispatch(device, N, cfg.d_model, cfg.n_experts, cfg.top_k)}
    res["ok"] = all(res[a][c]["ok"] for a in ("baseline", "smelt") for c in ("router", "dispatch"))
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--json", action="store_true", help="(the output is always one JSON line)")
    res = run_checks(ap.parse_args(argv))
    print(json.dumps(res))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
