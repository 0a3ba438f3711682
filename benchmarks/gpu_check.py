"""GPU check: the 100M tier, Baseline and SMELT, trained with FSDP2 in bf16 over the local GPUs.

    python benchmarks/gpu_check.py                 # on a CUDA machine; < 8 min on one H200
    python benchmarks/gpu_check.py --json          # only the final JSON line on stdout
    python benchmarks/gpu_check.py --suite --profile --json > gpu.json
        # the issue-31 table in one command (< 8 min on one H200): micro-batch 2 x 2
        # accumulation, micro-batch 8, micro-batch 8 compiled; both architectures; per
        # configuration the top kernels and the GEMM share of GPU time, a host-sync check and
        # the activation memory after a forward against the planner

    python benchmarks/gpu_check.py --configs issue31 --profile --max-seconds 10 --out gpu.json
        # the next issue-31 run (estimated 7 min on one H200): mb16 x 4 compiled unwrapped (the
        # planner's chosen one-GPU layout); mb8 unwrapped against mb8 on a 1-rank FSDP2 mesh;
        # SMELT without head padding and with FSDP2's own gradient reduction against mb8;
        # then `python benchmarks/gpu_report.py gpu.json`: tables, A/B ratios, targets

Without CUDA it prints one line saying it was skipped and exits 0. What it does on CUDA:

1. Spawns one process per local GPU (nccl; one GPU still gets a 1-rank FSDP2 mesh, so the
   mixed-precision FSDP path is the one exercised), builds each architecture on the meta
   device, shards it (``scaling.training.parallel.data_parallel.build_model``), and trains ``--steps``
   AdamW updates (or until ``--max-seconds`` per architecture) on synthetic tokens (a pool of
   64 steps' rows, cycled): each next token is a fixed random successor of the previous one
   with probability 0.9 and uniform otherwise, so the loss can fall from ln V (10.4 at V =
   32768) towards 0.1 ln V + H(0.9), about 1.4 nats.
2. Reports per architecture: tokens/s over the timed steps (the first ``--warmup`` excluded),
   MFU = tokens/s x FLOPs/token / (world x peak), with FLOPs/token from
   ``scaling.accounting.costs.flops_per_token`` (6 x matmul parameters per token + attention,
   PaLM convention) and peak = 989.4e12 dense bf16 FLOP/s per H100/H200 SXM GPU (NVIDIA H100
   and H200 datasheets: 1,979 TFLOPS bf16 Tensor Core *with sparsity*, half of it dense);
   peak CUDA memory (``torch.cuda.max_memory_allocated``) against the memory planner's
   prediction (``scaling.accounting.memory.estimate_memory`` when that module exists); and the
   first and last losses (the check asks that the mean of the last 10 be below the first).
3. Builds the 1.6B tier on the meta device and compares its parameter count with
   ``scaling.accounting.costs.total_params``.
4. ``--profile``: ``torch.profiler`` over ``--profile-steps`` more steps on rank 0; the JSON gets
   the top kernels (device time, share) and the shares of GEMM (matmul/grouped-mm kernels),
   attention, copies/casts and host syncs (``cudaStreamSynchronize`` calls) -- on the CPU the
   same from the CPU operators, so the tests exercise it.
5. Host-sync check (CUDA): one more training step under ``torch.cuda.set_sync_debug_mode("error")``,
   which raises at the first call that waits for the device; ``sync_free`` records the result
   and the first offending call.
6. Memory: the bytes a forward leaves allocated (``memory_allocated`` after minus before one
   micro-batch's forward) against the planner's ``activations_stored``, beside the peak.
7. Other GPU checks plug in through ``EXTRA_CHECKS`` (below): a module in this folder with a
   function ``run_checks(args) -> dict`` (JSON-ready, with an ``ok`` key); its result goes under
   its name in the JSON and into ``ok``. Absent modules are skipped (listed in ``extra_skipped``).

``--compile`` is on by default on CUDA (the trainer's default), ``--no-compile`` turns it off.
``--init device`` (the default here) draws the weights on the GPU with the init's distributions
instead of the trainer's bitwise CPU draw (about 23 s per build of the 100M tier, 3.7e9 numbers):
the measured speed does not depend on the values' bits. ``--mode none`` runs one GPU unwrapped,
as the trainer does at world size 1; the default ``fsdp`` gives one GPU a 1-rank FSDP2 mesh (the
sharded path's casts and copies, measured without a network). ``--head-padding never`` runs SDPA
at the model's own head size (the 2026-12-04 runs; ``transformer.sdpa_head_size``). Each
architecture's JSON says what ran: ``layout``, ``init``, ``head_padding``, ``sdpa_head_size``,
``loop_grad``; ``--profile`` adds kernels summed by family and the attention kernels' names.

The last stdout line is one JSON document with all of it and ``ok``. Every function here is
also run on the CPU at a tiny size by tests/test_parallel_gpu_check.py (``--device cpu``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import socket
import sys
import tempfile
import time
from typing import Any, NamedTuple

import torch

PEAK_BF16_FLOPS = {"H100": 989.4e12, "H200": 989.4e12}  # dense, per GPU (datasheets, see above)

# Other GPU checks, run after this one in the same invocation, in this order: {JSON key: module
# name in this folder}, each exposing run_checks(args) -> dict with an "ok" key. "kernels": the
# MoE layer's mixed-precision kernels (issue 31, seconds); "scale": chunked CE, EP dispatch and
# per-pass reduction (issue 27).
EXTRA_CHECKS: dict[str, str] = {"kernels": "gpu_check_kernels", "scale": "gpu_check_scale"}


class Config(NamedTuple):
    """One measured configuration: fresh ranks, these settings; ``options`` override the command
    line's other settings (mode, head_padding, loop_grad, archs) for this configuration only."""

    name: str
    micro: int
    accum: int
    compile: bool
    options: tuple[tuple[str, Any], ...] = ()


# --suite: the configurations of issue 31's table (name, micro-batch, accumulation, compile)
SUITE = (Config("mb2x2", 2, 2, False), Config("mb8", 8, 1, False), Config("mb8-compiled", 8, 1, True))
# more configurations --configs can name (in the order given). "-unwrapped": one GPU without
# FSDP2 (the trainer's own layout on one GPU: resolve_mode gives "none" at world size 1; the
# others use a 1-rank FSDP2 mesh, the sharded path's copies and casts); "x4": 4 micro-batches per
# optimizer step (the per-step fixed cost amortised); "-nopad": SMELT with SDPA at its own head
# size (the FA2 kernel) instead of padded to 8 (cuDNN's); "-fsdpgrad": SMELT with FSDP2's own
# gradient reduction instead of the per-pass one
MORE_CONFIGS = (
    Config("mb16-compiled", 16, 1, True), Config("mb4-compiled", 4, 1, True),
    Config("mb16x4-compiled", 16, 4, True),
    Config("mb8-unwrapped", 8, 1, False, (("mode", "none"),)),
    Config("mb16-compiled-unwrapped", 16, 1, True, (("mode", "none"),)),
    # the planner's chosen layout for the 100M tier on one H200 (sweep --dry-run --choose-layout
    # of a one-GPU paper-tiers plan: unwrapped, micro-batch 16 x 32, no checkpointing), with 4
    # micro-batches per step instead of 32 to fit the time: the optimizer amortised 4-fold
    Config("mb16x4-compiled-unwrapped", 16, 4, True,
           (("mode", "none"), ("warmup", 3), ("profile_steps", 1))),
    Config("mb8-nopad", 8, 1, False, (("head_padding", "never"), ("archs", ["smelt"]))),
    Config("mb8-fsdpgrad", 8, 1, False, (("loop_grad", "fsdp"), ("archs", ["smelt"]))),
)
# --configs issue31: the next GPU session's run for issue 31, in priority order (estimated 7
# minutes on one H200 with --init device and --max-seconds 10, from the 2026-12-04 build, compile
# and step times): the planner's chosen one-GPU layout (the target's configuration), then the
# A/B pairs in the same run: unwrapped vs 1-rank FSDP2, and against mb8 SMELT without head
# padding and with FSDP2's own gradient reduction
PRESETS = {"issue31": ("mb16x4-compiled-unwrapped", "mb8-unwrapped", "mb8", "mb8-nopad", "mb8-fsdpgrad")}

# Kernel / operator name fragments by kind, for the --profile shares (lower case)
GEMM_KEYS = ("gemm", "matmul", "cutlass", "xmma", "nvjet", "wgmma", "grouped_mm", "cublas", "aten::mm",
             "aten::addmm", "aten::bmm", "aten::_grouped_mm", "sm90_", "sm80_")
ATTENTION_KEYS = ("flash", "fmha", "attention", "cudnn", "sdpa", "efficient")
COPY_KEYS = ("copy", "memcpy", "to_copy", "cast", "chunk_cat", "elementwise_kernel<128, 2")


def synthetic_tokens(vocab: int, rows: int, seq_len: int, seed: int = 0) -> torch.Tensor:
    """[rows, seq_len + 1] ids: each next token is a fixed random successor of the previous one
    with probability 0.9, uniform otherwise (the chain continues from the drawn token)."""
    gen = torch.Generator().manual_seed(seed)
    table = torch.randperm(vocab, generator=gen)
    ids = torch.empty(rows, seq_len + 1, dtype=torch.long)
    ids[:, 0] = torch.randint(0, vocab, (rows,), generator=gen)
    noise = torch.rand(rows, seq_len, generator=gen) < 0.1
    rand = torch.randint(0, vocab, (rows, seq_len), generator=gen)
    for t in range(seq_len):
        ids[:, t + 1] = torch.where(noise[:, t], rand[:, t], table[ids[:, t]])
    return ids


def layout_that_ran(mode: str, world: int) -> str:
    """The layout ``--mode`` runs on ``world`` ranks here: fsdp and hsdp keep their mesh (a 1-rank
    FSDP2 mesh on one GPU), "none" on several ranks is DDP, DDP on one rank is unwrapped."""
    if mode == "none" and world > 1:
        return "ddp"
    return "none" if mode == "ddp" and world == 1 else mode


def planned_memory_gb(cfg, mode: str, world: int, micro: int, n_micro: int, ac: bool,
                      grad_sync: str, device_type: str, compiled: bool = False,
                      loop_grad: str | None = None) -> tuple[float | None, float | None]:
    """The memory planner's per-GPU peak and activations stored at the end of the forward (GB =
    1e9 bytes), or Nones if the planner is absent."""
    try:
        from scaling.accounting.memory import Layout, estimate_memory
    except ImportError:
        return None, None
    compute = "bf16" if device_type == "cuda" else "fp32"
    layout = Layout(mode=layout_that_ran(mode, world), gpus_per_node=world,
                    micro_batch_size=micro, grad_accum_steps=n_micro, activation_checkpointing=ac,
                    grad_sync=grad_sync, compute_dtype=compute, seq_len=cfg.seq_len,
                    compiled=compiled, loop_grad=loop_grad)
    m = estimate_memory(cfg, layout)
    return m.total / 1e9, m.activations_stored / 1e9


def meta_build(tier: str) -> dict:
    """Parameter counts of both architectures of ``tier`` built on the meta device vs the accounting."""
    from scaling.accounting.costs import total_params
    from scaling.accounting.tiers import get_config
    from scaling.training.model.transformer import MoETransformer

    out = {}
    for arch in ("baseline", "smelt"):
        cfg = get_config(tier, arch)
        with torch.device("meta"):
            model = MoETransformer(cfg)
        built = sum(p.numel() for p in model.parameters())
        out[arch] = {"built": built, "accounting": total_params(cfg), "equal": built == total_params(cfg),
                     "all_meta": all(p.is_meta for p in model.parameters())}
    return out


def _kind(name: str) -> str | None:
    low = name.lower()
    for kind, keys in (("attention", ATTENTION_KEYS), ("gemm", GEMM_KEYS), ("copy", COPY_KEYS)):
        if any(k in low for k in keys):
            return kind
    return None


def kernel_family(name: str) -> str:
    """A kernel's family: its name without template arguments, parameters and a leading ``void``
    (the 60 ``cutlass::...GemmUniversal<...>`` variants of one grouped GEMM become one row)."""
    name = name.removeprefix("void ").strip()
    for stop in ("<", "("):
        name = name.split(stop, 1)[0]
    return name.strip() or "?"


def profile_summary(prof, device_type: str, top: int = 30, steps: int = 0) -> dict:
    """Top kernels (CUDA) or operators (CPU) by self time, the same summed by family, and the
    shares by kind; ``steps`` profiled steps give the milliseconds per step."""
    from torch.autograd import DeviceType

    rows = []
    syncs = {"cudaStreamSynchronize": 0, "cudaDeviceSynchronize": 0, "cudaMemcpyAsync": 0}
    sync_ms = 0.0
    for evt in prof.key_averages():
        if evt.key in syncs:
            syncs[evt.key] += evt.count
            if evt.key != "cudaMemcpyAsync":
                sync_ms += evt.cpu_time_total / 1e3
        if device_type == "cuda":
            # user annotations (e.g. "Optimizer.step#AdamW.step") span kernels counted on their own:
            # the first H200 profile double-counted the optimizer's 10% this way
            if evt.device_type != DeviceType.CUDA or getattr(evt, "is_user_annotation", False):
                continue
            t = evt.self_device_time_total
        else:
            if not evt.key.startswith("aten::") or evt.key in ("aten::empty", "aten::view"):
                continue
            t = evt.self_cpu_time_total
        if t > 0:
            rows.append((evt.key, t / 1e3, evt.count))
    total = sum(r[1] for r in rows) or 1.0
    shares = {"gemm": 0.0, "attention": 0.0, "copy": 0.0}
    for name, ms, _ in rows:
        kind = _kind(name)
        if kind:
            shares[kind] += ms / total
    rows.sort(key=lambda r: -r[1])
    families: dict[str, list] = {}
    for name, ms, calls in rows:
        fam = families.setdefault(kernel_family(name), [0.0, 0, _kind(name)])
        fam[0] += ms
        fam[1] += calls
    return {
        "what": "CUDA kernels, self device time" if device_type == "cuda" else "CPU operators, self time",
        "total_ms": total,
        "steps": steps,
        "ms_per_step": total / steps if steps else None,
        "top": [{"name": n[:160], "ms": ms, "share": ms / total, "calls": c, "kind": _kind(n)}
                for n, ms, c in rows[:top]],
        "families": [{"family": f[:120], "ms": v[0], "share": v[0] / total, "calls": v[1], "kind": v[2]}
                     for f, v in sorted(families.items(), key=lambda kv: -kv[1][0])[:top]],
        "attention_kernels": sorted({n[:120] for n, _, _ in rows if _kind(n) == "attention"}),
        "gemm_share": shares["gemm"], "attention_share": shares["attention"], "copy_share": shares["copy"],
        "host_syncs": syncs, "host_sync_ms": sync_ms,
    }


def sync_check(step) -> dict:
    """Run ``step()`` under CUDA's sync debug mode "error": does anything wait for the device?"""
    if not torch.cuda.is_available():
        return {"sync_free": None, "error": "no CUDA: not checked"}
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
        result = {"sync_free": True, "error": None}
    except RuntimeError as exc:
        result = {"sync_free": False, "error": str(exc).strip().splitlines()[0][:300]}
    finally:
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
    return result


def train_arch(cfg, dist, *, mode: str, steps: int, warmup: int, micro: int, n_micro: int, lr: float,
               activation_checkpointing: bool, compile: bool, grad_sync: str, max_seconds: float,
               peak_flops: float | None, profile_steps: int = 0, loop_grad: str | None = None,
               head_padding: str = "auto", init: str = "exact") -> dict:
    """Train ``cfg`` on synthetic tokens on ``dist`` (this rank); the measurements as a dict."""
    from scaling.accounting.costs import flops_per_token
    from scaling.training.loop.evaluate import autocast  # the trainer's: bf16 on CUDA, nothing on CPU
    from scaling.training.model.transformer import sdpa_head_size
    from scaling.training.parallel.data_parallel import build_model, train_step, unwrap

    cuda = dist.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(dist.device)
    t_build = time.perf_counter()
    model = build_model(cfg, 0, dist, mode, activation_checkpointing=activation_checkpointing,
                        compile=compile, loop_grad=loop_grad, init=init)
    unwrap(model).set_head_padding(head_padding)
    layout = layout_that_ran(mode, dist.world)
    if cuda:
        torch.cuda.synchronize(dist.device)
    build_s = time.perf_counter() - t_build
    params = [p for p in model.parameters()]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.1, fused=cuda)
    rows = micro * n_micro
    pool = synthetic_tokens(cfg.vocab_size, 64 * rows * dist.world, cfg.seq_len).to(dist.device)
    losses, t_timed, n_timed, step_s = [], 0.0, 0, []
    for step in range(steps):
        first = (step % 64) * rows * dist.world + dist.rank * rows  # this rank's rows of the step
        x, y = pool[first:first + rows, :-1], pool[first:first + rows, 1:]
        if cuda:
            torch.cuda.synchronize(dist.device)
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / max(1, warmup))
        stats, _ = train_step(model, opt, params, x, y, n_micro=n_micro, grad_clip=1.0, aux_coef=0.01,
                              z_coef=1e-3, grad_sync=grad_sync, autocast=lambda: autocast(dist.device))
        if dist.world > 1:
            torch.distributed.all_reduce(stats)
            stats = stats / dist.world
        loss = float(stats[0])  # syncs the device
        step_s.append(time.perf_counter() - t0)
        if step >= warmup:
            t_timed += time.perf_counter() - t0
            n_timed += 1
        losses.append(loss)
        if t_timed > max_seconds:  # timed seconds: compile time (in the warm-up steps) does not count
            break
    tokens_per_s = n_timed * rows * dist.world * cfg.seq_len / t_timed if n_timed else None
    fpt = flops_per_token(cfg)
    peak_mem = torch.cuda.max_memory_allocated(dist.device) / 1e9 if cuda else None
    ac = lambda: autocast(dist.device)  # noqa: E731

    def one_step(s: int = 0) -> None:
        first = (s % 64) * rows * dist.world + dist.rank * rows
        x, y = pool[first:first + rows, :-1], pool[first:first + rows, 1:]
        train_step(model, opt, params, x, y, n_micro=n_micro, grad_clip=1.0, aux_coef=0.01, z_coef=1e-3,
                   grad_sync=grad_sync, autocast=ac)

    profile = None
    if profile_steps > 0:
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as torch_profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with torch_profile(activities=activities) as prof:
            for s in range(profile_steps):
                one_step(s)
            if cuda:
                torch.cuda.synchronize(dist.device)
        profile = profile_summary(prof, dist.device.type, steps=profile_steps) if dist.is_main else None
    sync = sync_check(one_step) if cuda else {"sync_free": None, "error": "no CUDA: not checked"}

    # the bytes one micro-batch's forward leaves allocated (the activations it stores), against
    # the planner's activations_stored (CUDA only: the CPU allocator keeps no such count)
    stored = None
    if cuda:
        torch.cuda.synchronize(dist.device)
        before = torch.cuda.memory_allocated(dist.device)
        x, y = pool[:micro, :-1], pool[:micro, 1:]
        with ac():
            out = model(x, y)
        torch.cuda.synchronize(dist.device)
        stored = (torch.cuda.memory_allocated(dist.device) - before) / 1e9
        (out.loss + 0.01 * out.aux_loss + 1e-3 * out.z_loss).backward()
        del out
        opt.zero_grad(set_to_none=True)
    planned, planned_stored = planned_memory_gb(cfg, mode, dist.world, micro, n_micro,
                                                activation_checkpointing, grad_sync, dist.device.type,
                                                compiled=compile, loop_grad=loop_grad)
    tail = losses[-10:]
    return {
        "arch": cfg.arch,
        "steps": len(losses),
        "timed_steps": n_timed,
        "tokens_per_step": rows * dist.world * cfg.seq_len,
        "tokens_per_s": tokens_per_s,
        "flops_per_token": fpt,
        "mfu": (tokens_per_s * fpt / (dist.world * peak_flops)) if tokens_per_s and peak_flops else None,
        "peak_memory_gb": peak_mem,
        "planned_memory_gb": planned,
        "memory_ratio": (peak_mem / planned) if peak_mem and planned else None,
        "stored_after_forward_gb": stored,
        "planned_activations_stored_gb": planned_stored,
        "compile": compile,
        "layout": layout,  # what ran: an FSDP2/HSDP mesh (1-rank on one GPU), DDP, or one unwrapped model
        "init": init,
        "head_padding": head_padding,
        "sdpa_head_size": sdpa_head_size(cfg.head_dim, dist.device.type, head_padding),
        "loop_grad": "per-pass" if getattr(model, "loop_grad_reducers", None) else "fsdp",
        # wall seconds: building + materialising the model; the first step (compile time when
        # compiling, measured as first step - median later step); the median timed step
        "build_s": build_s,
        "first_step_s": step_s[0],
        "median_step_s": sorted(step_s[warmup:])[len(step_s[warmup:]) // 2] if step_s[warmup:] else None,
        "micro_batch_size": micro,
        "grad_accum_steps": n_micro,
        "sync_check": sync,
        "profile": profile,
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "loss_fell": sum(tail) / len(tail) < losses[0],
        "finite": all(math.isfinite(v) for v in losses),
    }


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    from scaling.accounting.tiers import get_config
    from scaling.training.parallel.data_parallel import resolve_compile, resolve_grad_sync
    from scaling.training.parallel.distributed import build_mesh, setup_distributed

    if args.device == "cpu":
        torch.set_num_threads(1)
    dist = setup_distributed(args.device, args.mode)
    # one rank: a 1-rank FSDP2 mesh all the same (mode "none" keeps the trainer's one-GPU layout)
    if dist.mesh is None and args.mode in ("fsdp", "hsdp"):
        torch.distributed.init_process_group(dist.backend, rank=0, world_size=1)
        dist = dataclasses.replace(dist, mesh=build_mesh("fsdp", 1, dist.device.type), initialized_here=True)
    mode = "fsdp" if args.mode == "hsdp" and dist.world == 1 else args.mode
    grad_sync = resolve_grad_sync(args.grad_sync, mode)
    results = []
    try:
        for arch in args.archs:
            cfg = get_config(args.tier, arch)
            if args.seq_len:
                cfg = cfg.replace(seq_len=args.seq_len)
            try:
                results.append(train_arch(
                    cfg, dist, mode=mode, steps=args.steps, warmup=args.warmup, micro=args.micro_batch,
                    n_micro=args.grad_accum, lr=args.lr,
                    activation_checkpointing=args.activation_checkpointing,
                    compile=resolve_compile(args.compile, dist.device.type), grad_sync=grad_sync,
                    max_seconds=args.max_seconds, profile_steps=args.profile_steps if args.profile else 0,
                    loop_grad=args.loop_grad, head_padding=args.head_padding, init=args.init,
                    peak_flops=args.peak_flops if dist.device.type == "cuda" else None))
            except Exception as exc:  # keep the other architecture's numbers (an OOM, a compile error)
                if dist.world > 1:
                    raise  # the other ranks would wait forever in a collective
                import traceback

                results.append({"arch": arch, "error": "".join(traceback.format_exception(exc))[-3000:]})
            if dist.device.type == "cuda":
                torch.cuda.empty_cache()
                torch._dynamo.reset()
        if rank == 0:
            with open(out, "w") as f:
                json.dump(results, f)
    finally:
        dist.barrier()
        dist.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(args: argparse.Namespace, world: int) -> list[dict]:
    """One configuration: fresh processes (clean memory statistics and compile caches)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "results.json")
        mp.spawn(_worker, args=(world, _free_port(), args, out), nprocs=world, join=True)
        with open(out) as f:
            return json.load(f)


def run_extra_checks(args: argparse.Namespace, here: str | None = None) -> tuple[dict, list[str]]:
    """The checks of ``EXTRA_CHECKS`` whose module exists in ``here`` (this folder): {key: result},
    and the skipped keys."""
    import importlib

    here = here or os.path.dirname(os.path.abspath(__file__))
    results, skipped = {}, []
    for key, module in EXTRA_CHECKS.items():
        if not os.path.exists(os.path.join(here, module + ".py")):
            skipped.append(key)
            continue
        if here not in sys.path:
            sys.path.insert(0, here)
        try:  # one check that fails must not lose the others' results
            results[key] = importlib.import_module(module).run_checks(args)
        except Exception as exc:
            results[key] = {"ok": False, "error": _last_lines(exc)}
    return results, skipped


def run(args: argparse.Namespace) -> dict:
    """Spawn the ranks for each configuration, train every architecture, build the meta tier,
    run the extra checks; the whole report."""
    world = _world(args)
    t0 = time.perf_counter()
    configs = SUITE if args.suite else (Config("single", args.micro_batch, args.grad_accum, args.compile),)
    if args.configs:  # in the order named, so a time-limited run measures the first ones first
        by_name = {c.name: c for c in SUITE + MORE_CONFIGS}
        configs = tuple(by_name[n] for n in args.configs)
    runs = []
    for name, micro, accum, compile, options in configs:
        sub = argparse.Namespace(**{**vars(args), "micro_batch": micro, "grad_accum": accum,
                                    "compile": compile, **dict(options)})
        t = time.perf_counter()
        try:
            archs, error = _spawn(sub, world), None
        except Exception as exc:  # one failing configuration must not lose the others' numbers
            archs, error = [], _last_lines(exc)
        for a in archs:
            a["config"] = name
        runs.append({"name": name, "micro_batch_size": micro, "grad_accum_steps": accum,
                     "options": dict(options), "archs": archs, "wall_s": time.perf_counter() - t,
                     "error": error})
        _write_partial(args, runs, t0)
    meta = meta_build(args.meta_tier)
    try:
        extras, skipped = run_extra_checks(args)
    except Exception as exc:
        extras, skipped = {"extra_error": {"ok": False, "error": _last_lines(exc)}}, []
    archs = [a for r in runs for a in r["archs"]]
    ok = (all(r["error"] is None for r in runs)
          and all(a.get("finite") and a.get("loss_fell") for a in archs)
          and all(m["equal"] and m["all_meta"] for m in meta.values())
          and all(bool(e.get("ok")) for e in extras.values()))
    doc = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "world": world,
        "mode": args.mode,
        "tier": args.tier,
        "seq_len": args.seq_len,
        "micro_batch_size": args.micro_batch,
        "grad_accum_steps": args.grad_accum,
        "activation_checkpointing": args.activation_checkpointing,
        "compile": args.compile,
        "init": args.init,
        "head_padding": args.head_padding,
        "suite": args.suite,
        "peak_flops_per_gpu": args.peak_flops,
        "archs": archs,
        "configs": [{k: v for k, v in r.items() if k != "archs"} for r in runs],
        "meta_build": {"tier": args.meta_tier, **meta},
        **extras,
        "extra_skipped": skipped,
        "wall_s": time.perf_counter() - t0,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "ok": ok,
    }
    if args.out:
        _atomic_write(args.out, doc)
    return doc


def _last_lines(exc: BaseException, n: int = 12) -> str:
    """The end of an exception's text (a spawned rank's traceback arrives inside it)."""
    return "\n".join(f"{type(exc).__name__}: {exc}".strip().splitlines()[-n:])[-3000:]


def _atomic_write(path: str, doc: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, path)


def _world(args: argparse.Namespace) -> int:
    """The processes a configuration spawns: --nproc, else the GPUs (2 on the CPU)."""
    return args.nproc or (torch.cuda.device_count() if args.device == "cuda" else 2)


def _write_partial(args: argparse.Namespace, runs: list[dict], t0: float) -> None:
    """After each configuration: what is measured so far, so a run cut off by a time limit keeps it."""
    if args.out:
        _atomic_write(args.out, {"partial": True, "tier": args.tier, "torch": torch.__version__,
                                 "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
                                 "world": _world(args),
                                 "mode": args.mode, "configs": runs, "wall_s": time.perf_counter() - t0})


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tier", default="100M")
    ap.add_argument("--archs", default="baseline,smelt", type=lambda s: s.split(","))
    ap.add_argument("--mode", default="fsdp", choices=("fsdp", "hsdp", "ddp", "none"),
                    help="fsdp: FSDP2 over the GPUs, a 1-rank mesh on one; none: one GPU unwrapped "
                         "(the trainer's one-GPU layout), DDP on several")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=10, help="untimed first steps (and LR warmup)")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="of timed training (after the warm-up steps) per architecture "
                         "[default: 150; 20 with --suite]")
    ap.add_argument("--micro-batch", type=int, default=2, help="sequences per forward per GPU")
    ap.add_argument("--grad-accum", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=None, help="override the tier's")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--grad-sync", default=None, choices=("last", "every"),
                    help="default: every under fsdp/hsdp, last under ddp (the trainer's rule)")
    ap.add_argument("--activation-checkpointing", action="store_true")
    ap.add_argument("--loop-grad", default=None, choices=("per-pass", "fsdp"),
                    help="looped layers' gradient reduction under fsdp/hsdp [default: the trainer's, "
                         "per-pass for SMELT]; the 2026-12-04 H200 numbers predate per-pass (= fsdp)")
    ap.add_argument("--head-padding", default="auto", choices=("auto", "never"),
                    help="SDPA head size padded to a multiple of 8 on CUDA (auto, the model's default) "
                         "or not (never: the 2026-12-04 setting)")
    ap.add_argument("--init", default="device", choices=("device", "exact"),
                    help="weights drawn on the GPU (device, the default: seconds; the same distributions) or "
                         "the trainer's exact CPU-drawn init (about 23 s per build of the 100M tier)")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                    help="torch.compile each block [default: on CUDA, off on the CPU]")
    ap.add_argument("--suite", action="store_true",
                    help="run " + ", ".join(c.name for c in SUITE) + " (micro-batch, accumulation, compile "
                         "as named) instead of one configuration")
    ap.add_argument("--configs", default=None,
                    type=lambda s: list(PRESETS[s]) if s in PRESETS else s.split(","),
                    help="these configurations, in this order, of "
                         + ", ".join(c.name for c in SUITE + MORE_CONFIGS)
                         + "; or a preset: " + ", ".join(f"{k} = {','.join(v)}" for k, v in PRESETS.items()))
    ap.add_argument("--out", default=None,
                    help="also write the JSON here, rewritten after each configuration")
    ap.add_argument("--profile", action="store_true", help="top kernels and GEMM share into the JSON")
    ap.add_argument("--profile-steps", type=int, default=3)
    ap.add_argument("--peak-flops", type=float, default=PEAK_BF16_FLOPS["H200"], help="per GPU")
    ap.add_argument("--meta-tier", default="1.6B")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: the same code at a tiny size, for the tests")
    ap.add_argument("--nproc", type=int, default=None, help="processes [default: the GPUs; cpu: 2]")
    ap.add_argument("--json", action="store_true", help="only the JSON line on stdout")
    args = ap.parse_args(argv)
    known = {c.name for c in SUITE + MORE_CONFIGS}
    if args.configs and not set(args.configs) <= known:
        ap.error(f"--configs: unknown {sorted(set(args.configs) - known)}; known: {sorted(known)}")
    if args.configs:
        args.suite = True
    if args.max_seconds is None:
        args.max_seconds = 20.0 if args.suite else 150.0
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: skipped, no CUDA device")
        return 0
    doc = run(args)
    if not args.json:
        for r in doc["configs"]:
            if r["error"]:
                print(f"{r['name']}: failed: {r['error'].splitlines()[-1]}")
        for a in doc["archs"]:
            if "error" in a:
                print(f"{doc['tier']} {a['arch']} [{a['config']}]: failed: {a['error'].splitlines()[-1]}")
                continue
            mem = (f"peak {a['peak_memory_gb']:.1f} GB vs planned {a['planned_memory_gb']:.1f} GB"
                   if a["peak_memory_gb"] and a["planned_memory_gb"] else
                   f"peak {a['peak_memory_gb']} GB (planner: {a['planned_memory_gb']})")
            tps = f"{a['tokens_per_s']:,.0f}" if a["tokens_per_s"] else "-"
            mfu = f"{a['mfu']:.3f}" if a["mfu"] else "-"
            prof = a.get("profile")
            gemm = f", GEMM {prof['gemm_share']:.0%} of GPU time" if prof else ""
            sync = a["sync_check"]["sync_free"]
            print(f"{doc['tier']} {a['arch']} [{a['config']}: {a['layout']}, micro-batch "
                  f"{a['micro_batch_size']} x {a['grad_accum_steps']}, compile {a['compile']}]: "
                  f"{a['steps']} steps, {tps} tokens/s, "
                  f"MFU {mfu}, {mem}, loss {a['first_loss']:.3f} -> {a['last_loss']:.3f}{gemm}, "
                  f"sync-free {sync}")
        for arch in ("baseline", "smelt"):
            m = doc["meta_build"][arch]
            print(f"meta build {doc['meta_build']['tier']} {arch}: {m['built']:,} parameters, "
                  f"accounting {m['accounting']:,}, equal {m['equal']}")
    print(json.dumps(doc))
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
