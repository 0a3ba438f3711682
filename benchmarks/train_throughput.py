"""Training throughput of our model vs Hugging Face transformers' Mixtral, and MFU, on this machine.

    python benchmarks/train_throughput.py [--tier proxy-l --arch baseline | --d-model 128 ...]
                                          [--steps 10] [--threads 2] [--json]

Both models start from the same weights (``scaling.training.hf_reference.to_hf_mixtral``) and train on the
same fixed random batch (``--batch`` sequences of seq_len + 1 tokens) with the same AdamW settings,
in one process; ``--steps`` timed steps alternate between them one at a time and each model's
fastest step counts (the machine may be shared: a load spike then hits both alike; medians and
the load average are reported beside them).
A step is forward, loss, backward, AdamW step, zero_grad:

- ours: ``MoETransformer``; loss = CE + 0.01 * aux + 0.001 * z (the trainer's coefficients)
- reference: ``MixtralForCausalLM`` (sdpa attention; experts ``--reference-experts``, default
  transformers' own choice: grouped_mm, or eager where grouped_mm cannot take the sizes);
  loss = CE + 0.01 * aux (``output_router_logits=True``, router_aux_loss_coef = 0.01; no z-loss)

- ratio = ours_tokens_per_s / reference_tokens_per_s
- matmul_peak_flops: best FLOP/s of a square fp32 ``torch.mm`` (2 n^3 FLOPs, n = 1024, 2048, 3072)
  with the same thread count, measured before and after the training steps (best of both)
- mfu = ours_tokens_per_s * flops_per_token / matmul_peak_flops, flops_per_token from
  ``scaling.accounting.costs.flops_per_token`` (6 x matmul weights per token + attention, PaLM convention)

``--tune-malloc`` (default on) calls ``scaling.training.cpu.tune_cpu_allocator`` first; it applies to
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
from scaling.training.cpu import tune_cpu_allocator
from scaling.training.hf_reference import to_hf_mixtral
from scaling.training.model import MoETransformer

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
    ours_tps = tokens / best["ours"]
    ref_tps = tokens / best["reference"] if "reference" in best else None
    fpt = flops_per_token(cfg)
    return {
        "config": cfg.to_dict(),
        "ours_tokens_per_s": ours_tps,
        "reference_tokens_per_s": ref_tps,
        "ratio": ours_tps / ref_tps if ref_tps else None,
        "matmul_peak_flops": peak,
        "mfu": ours_tps * fpt / peak,
        "ours_flops_per_s": ours_tps * fpt,
        "flops_per_token": fpt,
        "tokens_per_step": tokens,
        "threads": args.threads,
        "optimizer": f"AdamW ({args.optimizer})",
        "dispatch": ours.layers[0].moe.dispatch,
        "reference_experts_implementation": ref_impl,
        "timed_steps": args.steps,
        "ours_median_tokens_per_s": tokens / median["ours"],
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
    t.add_row(f"ours ({doc['dispatch']})", f"{doc['ours_tokens_per_s']:,.0f}",
              f"{doc['ours_tokens_per_s'] * fpt / 1e9:.1f}", f"{doc['first_loss']['ours']:.4f}",
              f"{doc['last_loss']['ours']:.4f}")
    if doc["reference_tokens_per_s"]:
        t.add_row(f"transformers Mixtral ({doc['reference_experts_implementation']})",
                  f"{doc['reference_tokens_per_s']:,.0f}", f"{doc['reference_tokens_per_s'] * fpt / 1e9:.1f}",
                  f"{doc['first_loss']['reference']:.4f}", f"{doc['last_loss']['reference']:.4f}")
    stdout.print(t)
    ratio = f"{doc['ratio']:.2f}" if doc["ratio"] else "n/a"
    stdout.print(f"ratio {ratio}   matmul peak {doc['matmul_peak_flops'] / 1e9:.1f} GFLOP/s   "
                 f"MFU {doc['mfu']:.3f}   load average {doc['load_average_1m']:.2f}")


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
    ap.add_argument("--tune-malloc", action=argparse.BooleanOptionalAction, default=True,
                    help="scaling.training.cpu.tune_cpu_allocator() first (both models)")
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
