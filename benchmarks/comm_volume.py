"""Bytes each rank sends in one training step, FSDP vs FSDP + expert parallelism, on 2 gloo ranks,
against the memory planner's communication model for the same configuration.

    PYTHONPATH=. python benchmarks/comm_volume.py [--json] [--tier proxy-tiny] [--arch baseline]

What is counted (per rank, one optimizer step of 2 micro-batches of 2 sequences, fp32 on the CPU):
FSDP2's ``all_gather_single`` and ``reduce_scatter_single`` calls (wrapped: (n-1)/n of the gathered
output / of the reduced input, the ring volume the planner uses) and ``all_reduce`` (2 (n-1)/n);
the EP all-to-all of token rows, forward and backward, seen as ``_c10d_functional.all_to_all_single``
ops by a dispatch mode (the rows this rank sends to the other rank); the small all-to-all of the
per-expert counts is reported apart (the planner ignores it). Not a test: routing of a real router
is not uniform, so the all-to-all is compared with the planner's uniform-routing figure.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile

import torch
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

WORLD, MICRO, N_MICRO = 2, 2, 2


class _A2A(TorchDispatchMode):
    def __init__(self, world: int, rank: int):
        super().__init__()
        self.bytes, self.world, self.rank = 0, world, rank

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if "all_to_all_single" in str(func):
            inp, in_splits = args[0], args[2]
            row = inp[0].numel() * inp.element_size() if inp.shape[0] else 0
            own = in_splits[self.rank] if in_splits else inp.shape[0] // self.world
            self.bytes += (inp.shape[0] - own) * row
        return func(*args, **kwargs)


def _worker(rank, port, tier, arch, ep, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(WORLD))
    torch.set_num_threads(1)
    import torch.distributed as dist

    from scaling.accounting.tiers import get_config
    from scaling.training.parallel.data_parallel import build_model, train_step
    from scaling.training.parallel.distributed import setup_distributed

    cfg = get_config(tier, arch)
    env = setup_distributed("cpu", "fsdp", ep=ep)
    model = build_model(cfg, 0, env, "fsdp")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, cfg.vocab_size, (MICRO * N_MICRO, cfg.seq_len + 1),
                        generator=torch.Generator().manual_seed(rank))
    counted = {"all_gather": 0, "reduce_scatter": 0, "all_reduce": 0, "all_to_all_counts": 0}
    originals = {n: getattr(dist, n) for n in ("all_gather_single", "reduce_scatter_single", "all_reduce",
                                               "all_to_all_single")}

    def size(group):
        return dist.get_world_size(group)

    def ag(output_tensor, input_tensor, group=None, async_op=False):
        n = size(group)
        counted["all_gather"] += (n - 1) * output_tensor.numel() * output_tensor.element_size() // n
        return originals["all_gather_single"](output_tensor, input_tensor, group=group, async_op=async_op)

    def rs(output, input, op=dist.ReduceOp.SUM, group=None, async_op=False):
        n = size(group)
        counted["reduce_scatter"] += (n - 1) * input.numel() * input.element_size() // n
        return originals["reduce_scatter_single"](output=output, input=input, op=op, group=group,
                                                  async_op=async_op)

    def a2a_counts(*args, **kwargs):
        counted["all_to_all_counts"] += args[1].numel() * args[1].element_size()
        return originals["all_to_all_single"](*args, **kwargs)

    step = lambda: train_step(model, opt, list(model.parameters()), ids[:, :-1], ids[:, 1:],  # noqa: E731
                              n_micro=N_MICRO, grad_clip=1.0, aux_coef=0.01, z_coef=1e-3, grad_sync="every")
    step()  # warm-up: lazy init
    dist.all_gather_single, dist.reduce_scatter_single, dist.all_to_all_single = ag, rs, a2a_counts
    mode = _A2A(WORLD, rank)
    try:
        with mode:
            step()
    finally:
        for n, f in originals.items():
            setattr(dist, n, f)
    counted["all_to_all"] = mode.bytes
    if rank == 0:
        with open(out, "w") as f:
            json.dump(counted, f)
    env.barrier()
    env.close()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(tier: str, arch: str, ep: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bytes.json")
        mp.spawn(_worker, args=(_free_port(), tier, arch, ep, out), nprocs=WORLD, join=True)
        with open(out) as f:
            return json.load(f)


def predict(tier: str, arch: str, ep: int) -> dict:
    from scaling.accounting.memory import Layout, estimate_memory
    from scaling.accounting.tiers import get_config

    m = estimate_memory(get_config(tier, arch), Layout(
        mode="fsdp", gpus_per_node=WORLD, micro_batch_size=MICRO, grad_accum_steps=N_MICRO, ep=ep,
        compute_dtype="fp32", reduce_dtype="fp32"))
    return {"all_gather": m.all_gather, "reduce_scatter": m.reduce_scatter, "all_reduce": m.all_reduce,
            "all_to_all": m.all_to_all}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="bytes per step: FSDP vs FSDP + EP, measured vs planned")
    ap.add_argument("--tier", default="proxy-tiny")
    ap.add_argument("--arch", default="baseline")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    for ep in (1, 2):
        got, want = measure(args.tier, args.arch, ep), predict(args.tier, args.arch, ep)
        tot_got = sum(got[k] for k in want)
        tot_want = sum(want.values())
        rows.append({"layout": "fsdp" if ep == 1 else f"fsdp+ep{ep}", "measured": got, "planned": want,
                     "total_measured": tot_got, "total_planned": tot_want,
                     "rel_error": (tot_want - tot_got) / tot_got if tot_got else None})
    doc = {"tier": args.tier, "arch": args.arch, "world": WORLD, "micro_batch": MICRO,
           "micro_batches": N_MICRO, "unit": "bytes sent per rank per step", "rows": rows}
    if args.json:
        print(json.dumps(doc))
    else:
        for r in rows:
            parts = ", ".join(f"{k} {r['measured'][k]}/{r['planned'][k]}" for k in r["planned"])
            print(f"{r['layout']}: measured/planned {parts}; "
                  f"total {r['total_measured']}/{r['total_planned']} ({100 * r['rel_error']:+.1f}%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
