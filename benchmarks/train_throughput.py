"""Training throughput of our model (eager and compiled) vs Hugging Face transformers' Mixtral, MFU,
and FSDP2 vs DDP step time on 2 gloo ranks, on this machine.

    python benchmarks/train_throughput.py [--tier proxy-l --arch baseline | --d-model 128 ...]
                                          [--steps 10] [--threads 2] [--no-compile] [--no-parallel]
                                          [--json]

Both models start from the same weights (``scaling.evaluation.export.to_hf_mixtral``) and train on the
same fixed random batch (``--batch`` sequences of seq_len + 1 tokens) with the same AdamW settings,
in one process; ``--steps`` timed steps alternate between them one at a time and each model's
fastest step counts (the machine may be shared: a load spike then hits both alike; medians and
the load average are reported beside them).
A step is forward, loss, backward, AdamW step, zero_grad:

- ours: ``MoETransformer``; loss = CE + 0.01 * aux + 0.001 * z (the trainer's coefficients)
- compiled: the same model (a copy of its weights) under ``torch.compile(fullgraph=True)``
- reference: ``MixtralForCausalLM`` (sdpa attention; experts ``--reference-experts``, default
  transformers' own choice: grouped_mm, or eager where grouped_mm cannot take the sizes);
  loss = CE + 0.01 * aux (``output_router_logits=True``, router_aux_loss_coef = 0.01; no z-loss)

- ratio = ours_tokens_per_s / reference_tokens_per_s, ours = the faster of eager and compiled
- matmul_peak_flops: best FLOP/s of a square fp32 ``torch.mm`` (2 n^3 FLOPs, n = 1024, 2048, 3072)
  with the same thread count, measured before and after the training steps (best of both)
- mfu = ours_tokens_per_s * flops_per_token / matmul_peak_flops, flops_per_token from
  ``scaling.accounting.costs.flops_per_token`` (6 x matmul weights per token + attention, PaLM convention)

FSDP vs DDP (``--no-parallel`` skips it): 2 spawned processes, gloo, ``threads // 2`` threads each
(at least 1), the same global batch split across the ranks, one update = forward, backward,
gradient reduction, clipping, AdamW (``scaling.training.parallel.data_parallel.train_step``); DDP and FSDP2
(``build_model``: meta build, one shard group per layer) alternate step by step, the fastest
step of each counts; fsdp_over_ddp = fsdp_step_s / ddp_step_s.

``--tune-malloc`` (default on) calls ``scaling.training.loop.cpu.tune_cpu_allocator`` first; it applies to
both models alike. A looped (SMELT) config has no Mixtral equivalent: its reference fields are null.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from scaling.accounting.config import ModelConfig
from scaling.accounting.costs import flops_per_token
from scaling.cli._util import emit_json, stdout
from scaling.evaluation.export import to_hf_mixtral
from scaling.training.loop.cpu import tune_cpu_allocator
from scaling.training.model.transformer import MoETransformer

AUX_COEF, Z_COEF = 0.01, 0.001
FIELDS = {"d_model": int, "n_layers": int, "n_heads": int, "n_kv_heads": int, "head_dim": int,
          "n_experts": int, "top_k": int, "expert_hidden": int, "shared_expert_hidden": int,
          "vocab_size": int, "seq_len": int}


def matmul_peak_flops(sizes=(1024, 2048, 3072), repeat: int = 5) -> float:
    """Best FLOP/s of C = A @ B (fp32, square, 2 n^3 FLOPs) over sizes and repeats."""
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        c = torch.empty(n, n)
        torch.mm(a, b, out=c)
        for _ in range(repeat):
            t0 = time.perf_counter()
            torch.mm(a, b, out=c)
            best = max(best, 2 * n**3 / (time.perf_counter() - t0))
    return best


def build_config(args) -> ModelConfig:
    if args.tier:
        from scaling.accounting.tiers import get_config

        cfg = get_config(args.tier, args.arch)
    else:
        cfg = ModelConfig(vocab_size=4096, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=24,
                          n_experts=8, top_k=2, expert_hidden=256, seq_len=256, name="custom")
    changes = {k: getattr(args, k) for k in FIELDS if getattr(args, k) is not None}
    return cfg.replace(**changes) if changes else cfg


def make_optimizer(model: torch.nn.Module, kind: str) -> torch.optim.Optimizer:
    flavour = {"fused": {"fused": True}, "foreach": {"foreach": True}, "forloop": {"foreach": False}}[kind]
    return torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, **flavour)


def ours_step(model, opt, x, y):
    out = model(x, y)
    loss = out.loss + AUX_COEF * out.aux_loss + Z_COEF * out.z_loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return out.loss.item()


def reference_step(model, opt, ids):
    out = model(ids, labels=ids, output_router_logits=True)  # shifts labels internally
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return (out.loss - model.router_aux_loss_coef * out.aux_loss).item()


def _parallel_worker(rank: int, world: int, port: int, cfg: ModelConfig, batch: int, threads: int,
                     warmup: int, steps: int, out: str) -> None:
    """One rank of the FSDP-vs-DDP timing: alternate single DDP and FSDP2 updates, keep the times."""
    import dataclasses
    import json

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(threads)
    tune_cpu_allocator()
    from scaling.training.parallel.data_parallel import build_model, train_step
    from scaling.training.parallel.distributed import setup_distributed

    dist = setup_distributed("cpu", "fsdp")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len + 1), generator=gen)
    rows = batch // world
    x = ids[rank * rows:(rank + 1) * rows, :-1].contiguous()
    y = ids[rank * rows:(rank + 1) * rows, 1:].contiguous()
    setups = {}
    for mode, env in (("ddp", dataclasses.replace(dist, mesh=None)), ("fsdp", dist)):
        model = build_model(cfg, 0, env, mode)
        params = list(model.parameters())
        setups[mode] = (model, make_optimizer(model, "fused"), params)
    times = {m: [] for m in setups}
    for i in range(warmup + steps):
        for mode, (model, opt, params) in setups.items():
            dist.barrier()
            t0 = time.perf_counter()
            train_step(model, opt, params, x, y, n_micro=1, grad_clip=1.0, aux_coef=AUX_COEF, z_coef=Z_COEF)
            t = torch.tensor([time.perf_counter() - t0])
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)  # the slower rank's time
            if i >= warmup:
                times[mode].append(t.item())
    if rank == 0:
        with open(out, "w") as f:
            json.dump(times, f)
    dist.barrier()
    dist.close()


def fsdp_vs_ddp(cfg: ModelConfig, batch: int, threads: int, warmup: int, steps: int) -> dict:
    """Best step time of DDP and of FSDP2 on 2 gloo ranks (see the module docstring)."""
    import json
    import socket
    import tempfile

    import torch.multiprocessing as mp

    if batch % 2:
        raise ValueError("the FSDP/DDP comparison needs an even --batch")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    per_rank_threads = max(1, threads // 2)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "times.json")
        mp.spawn(_parallel_worker, args=(2, port, cfg, batch, per_rank_threads, warmup, steps, out), nprocs=2)
        with open(out) as f:
            times = json.load(f)
    best = {m: min(v) for m, v in times.items()}
    return {
        "ranks": 2,
        "threads_per_rank": per_rank_threads,
        "ddp_step_s": best["ddp"],
        "fsdp_step_s": best["fsdp"],
        "ddp_median_step_s": statistics.median(times["ddp"]),
        "fsdp_median_step_s": statistics.median(times["fsdp"]),
        "fsdp_over_ddp": best["fsdp"] / best["ddp"],
    }


def run(args) -> dict:
    if args.tune_malloc:
        tune_cpu_allocator()
    torch.set_num_threads(args.threads)
    cfg = build_config(args)
    ids = torch.randint(0, cfg.vocab_size, (args.batch, cfg.seq_len + 1),
                        generator=torch.Generator().manual_seed(0))
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    ours = MoETransformer(cfg, seed=0)
    if args.dispatch != "auto":
        for layer in ours.layers:
            layer.moe.dispatch = args.dispatch
    contenders = {"ours": (ours, make_optimizer(ours, args.optimizer))}
    steps = {"ours": lambda: ours_step(ours, contenders["ours"][1], x, y)}
    if args.compile:
        twin = MoETransformer(cfg, seed=0)
        for layer in twin.layers:
            layer.moe.dispatch = ours.layers[0].moe.dispatch
        compiled = torch.compile(twin, fullgraph=True)
        contenders["compiled"] = (compiled, make_optimizer(twin, args.optimizer))
        steps["compiled"] = lambda: ours_step(compiled, contenders["compiled"][1], x, y)
    ref_impl = None
    if not cfg.is_looped and not args.no_reference:
        impl = None if args.reference_experts == "auto" else args.reference_experts
        if impl is None and any(s % 4 for s in (cfg.d_model, cfg.expert_hidden)):
            impl = "eager"  # transformers' grouped_mm raises on CPU for sizes not multiple of 4
        ref = to_hf_mixtral(ours, experts_implementation=impl).train()
        ref.config.router_aux_loss_coef = ref.router_aux_loss_coef = AUX_COEF  # copied at init
        ref_impl = ref.config._experts_implementation
        contenders["reference"] = (ref, make_optimizer(ref, args.optimizer))
        steps["reference"] = lambda: reference_step(ref, contenders["reference"][1], ids)

    peak = matmul_peak_flops()
    times = {k: [] for k in steps}
    first_loss, last_loss = {}, {}
    for k, step in steps.items():  # warmup (allocator, MKL, autograd caches)
        for _ in range(args.warmup):
            first_loss.setdefault(k, step())
    for _ in range(args.steps):  # alternate single steps: a load spike hits both alike
        for k, step in steps.items():
            t0 = time.perf_counter()
            last_loss[k] = step()
            times[k].append(time.perf_counter() - t0)
    best = {k: min(v) for k, v in times.items()}
    median = {k: statistics.median(v) for k, v in times.items()}
    peak = max(peak, matmul_peak_flops())

    tokens = args.batch * cfg.seq_len
    eager_tps = tokens / best["ours"]
    compiled_tps = tokens / best["compiled"] if "compiled" in best else None
    ours_tps = max(eager_tps, compiled_tps or 0.0)
    ref_tps = tokens / best["reference"] if "reference" in best else None
    fpt = flops_per_token(cfg)
    parallel = (fsdp_vs_ddp(cfg, args.batch, args.threads, args.warmup, args.steps)
                if args.parallel else None)
    return {
        "config": cfg.to_dict(),
        "ours_tokens_per_s": ours_tps,
        "eager_tokens_per_s": eager_tps,
        "compiled_tokens_per_s": compiled_tps,
        "reference_tokens_per_s": ref_tps,
        "ratio": ours_tps / ref_tps if ref_tps else None,
        "matmul_peak_flops": peak,
        "mfu": ours_tps * fpt / peak,
        "eager_mfu": eager_tps * fpt / peak,
        "compiled_mfu": compiled_tps * fpt / peak if compiled_tps else None,
        "reference_mfu": ref_tps * fpt / peak if ref_tps else None,
        "fsdp_over_ddp": parallel["fsdp_over_ddp"] if parallel else None,
        "parallel": parallel,
        "ours_flops_per_s": ours_tps * fpt,
        "flops_per_token": fpt,
        "tokens_per_step": tokens,
        "threads": args.threads,
        "optimizer": f"AdamW ({args.optimizer})",
        "dispatch": ours.layers[0].moe.dispatch,
        "reference_experts_implementation": ref_impl,
        "timed_steps": args.steps,
        "ours_median_tokens_per_s": tokens / median["ours"],
        "compiled_median_tokens_per_s": tokens / median["compiled"] if "compiled" in median else None,
        "reference_median_tokens_per_s": tokens / median["reference"] if "reference" in median else None,
        "first_loss": first_loss,
        "last_loss": last_loss,
        "tune_malloc": args.tune_malloc,
        "load_average_1m": os.getloadavg()[0],
        "torch": torch.__version__,
    }


def print_table(doc: dict) -> None:
    from rich.table import Table

    c = doc["config"]
    t = Table(title=f"training throughput, {doc['threads']} threads: d{c['d_model']} L{c['n_layers']} "
                    f"E{c['n_experts']} k{c['top_k']} f{c['expert_hidden']} V{c['vocab_size']} "
                    f"T{c['seq_len']}, {doc['tokens_per_step']} tokens/step", title_justify="left")
    for col in ("model", "tokens/s", "GFLOP/s", "first loss", "last loss"):
        t.add_column(col, justify="right" if col != "model" else "left")
    fpt = doc["flops_per_token"]
    t.add_row(f"ours eager ({doc['dispatch']})", f"{doc['eager_tokens_per_s']:,.0f}",
              f"{doc['eager_tokens_per_s'] * fpt / 1e9:.1f}", f"{doc['first_loss']['ours']:.4f}",
              f"{doc['last_loss']['ours']:.4f}")
    if doc["compiled_tokens_per_s"]:
        t.add_row("ours compiled", f"{doc['compiled_tokens_per_s']:,.0f}",
                  f"{doc['compiled_tokens_per_s'] * fpt / 1e9:.1f}", f"{doc['first_loss']['compiled']:.4f}",
                  f"{doc['last_loss']['compiled']:.4f}")
    if doc["reference_tokens_per_s"]:
        t.add_row(f"transformers Mixtral ({doc['reference_experts_implementation']})",
                  f"{doc['reference_tokens_per_s']:,.0f}", f"{doc['reference_tokens_per_s'] * fpt / 1e9:.1f}",
                  f"{doc['first_loss']['reference']:.4f}", f"{doc['last_loss']['reference']:.4f}")
    stdout.print(t)
    ratio = f"{doc['ratio']:.2f}" if doc["ratio"] else "n/a"
    stdout.print(f"ratio {ratio}   matmul peak {doc['matmul_peak_flops'] / 1e9:.1f} GFLOP/s   "
                 f"MFU {doc['mfu']:.3f}   load average {doc['load_average_1m']:.2f}")
    if doc["parallel"]:
        p = doc["parallel"]
        stdout.print(f"2 gloo ranks x {p['threads_per_rank']} threads: "
                     f"DDP step {p['ddp_step_s'] * 1e3:.1f} ms, FSDP2 step {p['fsdp_step_s'] * 1e3:.1f} ms, "
                     f"fsdp_over_ddp {p['fsdp_over_ddp']:.2f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tier", help="a tier of scaling.accounting.tiers (e.g. proxy-l); "
                                   "default: d128 L4 E8 k2 f256 V4096 T256")
    ap.add_argument("--arch", default="baseline", choices=("baseline", "smelt"))
    for name, typ in FIELDS.items():
        ap.add_argument("--" + name.replace("_", "-"), dest=name, type=typ, help="override the config")
    ap.add_argument("--batch", type=int, default=16, help="sequences per step")
    ap.add_argument("--steps", type=int, default=10,
                    help="timed steps per model, alternating; the fastest counts")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per model first")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch.set_num_threads")
    ap.add_argument("--optimizer", default="fused", choices=("fused", "foreach", "forloop"),
                    help="AdamW implementation, the same for both models")
    ap.add_argument("--dispatch", default="auto", choices=("auto", "grouped_mm", "loop"),
                    help="our expert dispatch (auto: the model's default)")
    ap.add_argument("--reference-experts", default="auto",
                    choices=("auto", "eager", "grouped_mm", "batched_mm"),
                    help="transformers' experts_implementation")
    ap.add_argument("--no-reference", action="store_true", help="time our model only")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                    help="also time torch.compile(fullgraph=True) of our model")
    ap.add_argument("--parallel", action=argparse.BooleanOptionalAction, default=True,
                    help="also time FSDP2 vs DDP on 2 gloo ranks")
    ap.add_argument("--tune-malloc", action=argparse.BooleanOptionalAction, default=True,
                    help="scaling.training.loop.cpu.tune_cpu_allocator() first (both models)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    for name in ("batch", "steps", "threads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1")
    from scaling.common.errors import UserError

    try:
        doc = run(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        emit_json(doc)
    else:
        print_table(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
