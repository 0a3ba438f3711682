"""GPU checks of issue 27's pieces at world size 1: chunked cross-entropy, EP dispatch, per-pass reduction.

Called by ``benchmarks/gpu_check.py`` (its ``EXTRA_CHECKS``) as ``run_checks(args)``; also runs
alone: ``python benchmarks/gpu_check_scale.py [--device cpu]``. Without CUDA (and not asked for
the CPU) it returns ``{"ok": true, "skipped": "..."}`` at once.

1. Chunked cross-entropy against ``F.cross_entropy`` on the model's head, under bf16 autocast on
   CUDA (fp32 on the CPU): loss and gradient differences, and the peak memory of each path's
   forward + backward (``torch.cuda.max_memory_allocated``; on the CPU not measured).
2. Expert-parallel dispatch at EP = 1 on a one-rank process group (nccl on CUDA, gloo on the CPU):
   the counts exchange, the all-to-all of rows and the permutations of
   ``scaling.training.parallel.expert_parallel.dispatch`` against the layer's own experts.

3. Per-pass reduction of the looped gradients (``scaling.training.parallel.loop_grad``) on a
   one-rank FSDP2 mesh, SMELT (proxy-l on CUDA, proxy-tiny on the CPU): one forward + backward
   with ``loop_grad="per-pass"`` against ``"fsdp"`` (FSDP2's own), the sharded gradients compared
   (bf16 autocast and FSDP mixed precision on CUDA: per-pass sums the passes in fp32, FSDP2 in
   bf16, hence the bf16 tolerance); on CUDA also with compiled blocks and activation
   checkpointing (the trainer's CUDA default), and the peak memory of each
   (``torch.cuda.max_memory_allocated``). At world size 1 the reduce-scatter is a copy (as in
   FSDP2): the hooks, the dtype policy and torch.compile's interplay are what is checked.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _chunked_ce(device: torch.device) -> dict:
    from scaling.training.model.chunked_ce import chunked_cross_entropy

    N, d, V = (8 * 4096, 1024, 32768) if device.type == "cuda" else (512, 64, 2048)
    gen = torch.Generator(device="cpu").manual_seed(0)
    h0 = torch.randn(N, d, generator=gen).to(device)
    w0 = (0.02 * torch.randn(V, d, generator=gen)).to(device)
    t = torch.randint(0, V, (N,), generator=gen).to(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    out = {}
    for name in ("plain", "chunked"):
        h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_()
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        with torch.autocast(device.type, dtype=dtype, enabled=device.type == "cuda"):
            if name == "plain":
                loss = F.cross_entropy((h.to(dtype) @ w.to(dtype).t()).float(), t)
            else:
                total, _ = chunked_cross_entropy(h.to(dtype), w, t, max(1, (1 << 24) // V))
                loss = total / N
        loss.backward()
        peak = torch.cuda.max_memory_allocated() - base if device.type == "cuda" else None
        out[name] = (loss.detach().float(), h.grad.float(), w.grad.float(), peak)
    (lp, ghp, gwp, pp), (lc, ghc, gwc, pc) = out["plain"], out["chunked"]
    rel = lambda a, b: float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))  # noqa: E731
    res = {"tokens": N, "vocab": V, "dtype": str(dtype), "loss_rel_diff": rel(lc, lp),
           "grad_h_rel_diff": rel(ghc, ghp), "grad_w_rel_diff": rel(gwc, gwp),
           "peak_bytes_plain": pp, "peak_bytes_chunked": pc}
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5  # bf16 matmul rounding, different chunking
    res["ok"] = all(res[k] <= tol for k in ("loss_rel_diff", "grad_h_rel_diff", "grad_w_rel_diff"))
    return res


def _ep_dispatch(device: torch.device) -> dict:
    import torch.distributed as dist

    from scaling.accounting.tiers import get_config
    from scaling.training.model.transformer import MoETransformer
    from scaling.training.parallel.expert_parallel import EPGroup, dispatch

    if dist.is_initialized():
        return {"ok": True, "skipped": "a process group is already initialised"}
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            moe = MoETransformer(get_config("proxy-tiny", "smelt")).layers[1].moe.to(device)
            E = moe.n_experts
            gen = torch.Generator(device="cpu").manual_seed(1)
            counts = torch.bincount(torch.randint(0, E, (256,), generator=gen), minlength=E).to(device)
            xs = torch.randn(int(counts.sum()), moe.w_gate_up.shape[1], generator=gen).to(device)
            offsets = counts.cumsum(0).to(torch.int32)
            xa, xb = xs.clone().requires_grad_(), xs.clone().requires_grad_()
            want = moe.experts(xa, offsets, counts)
            got = dispatch(EPGroup(dist.group.WORLD, 1, 0, [E]), xb, counts, moe.experts)
            want.square().sum().backward()
            got.square().sum().backward()
            diff = float((got - want).detach().abs().max())
            gdiff = float((xb.grad - xa.grad).abs().max())
        finally:
            dist.destroy_process_group()
    return {"ok": diff <= 1e-5 and gdiff <= 1e-5, "max_abs_diff": diff, "grad_max_abs_diff": gdiff,
            "rows": int(counts.sum())}


def _per_pass(device: torch.device) -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from scaling.accounting.tiers import get_config
    from scaling.training.model.transformer import MoETransformer
    from scaling.training.parallel.data_parallel import materialize, parallelize

    if dist.is_initialized():
        return {"ok": True, "skipped": "a process group is already initialised"}
    cuda = device.type == "cuda"
    cfg = get_config("proxy-l" if cuda else "proxy-tiny", "smelt")
    gen = torch.Generator(device="cpu").manual_seed(2)
    ids = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len + 1), generator=gen).to(device)
    variants = [(lg, c) for c in ((False, True) if cuda else (False,)) for lg in ("fsdp", "per-pass")]
    res: dict = {"tier": cfg.name}
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{tmp}/store", rank=0,
                                world_size=1)
        try:
            mesh = init_device_mesh(device.type, (1,), mesh_dim_names=("dp_shard",))
            for loop_grad, compiled in variants:
                with torch.device("meta"):
                    model = MoETransformer(cfg)
                model = parallelize(model, "fsdp", mesh, activation_checkpointing=compiled, compile=compiled,
                                    loop_grad=loop_grad)
                materialize(model, device, 0)
                if cuda:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                    out = model(ids[:, :-1], ids[:, 1:])
                (out.loss + 0.01 * out.aux_loss).backward()
                grads = {n: p.grad.full_tensor().float() for n, p in model.named_parameters()}
                res[f"{loop_grad}{'_compiled' if compiled else ''}"] = {
                    "loss": float(out.loss.detach()), "grads": grads,
                    "reducers": len(getattr(model, "loop_grad_reducers", [])),
                    "peak_bytes": torch.cuda.max_memory_allocated() - base if cuda else None}
                del model, out
        finally:
            dist.destroy_process_group()
    tol = 2e-2 if cuda else 1e-6
    ok = True
    for suffix in ("", "_compiled") if cuda else ("",):
        a, b = res[f"per-pass{suffix}"], res[f"fsdp{suffix}"]
        rel = max(float((a["grads"][n] - g).abs().max() / g.abs().max().clamp_min(1e-30))
                  for n, g in b["grads"].items())
        res[f"grad_rel_diff{suffix}"] = rel
        ok = ok and rel <= tol and a["reducers"] == cfg.loop_end - cfg.loop_start and b["reducers"] == 0
    for v in res.values():
        if isinstance(v, dict):
            v.pop("grads")
    res["ok"] = ok
    return res


def run_checks(args: argparse.Namespace) -> dict:
    """The three checks on ``args.device`` (default cuda); a clean skip where CUDA is absent."""
    want = getattr(args, "device", "cuda")
    if want == "cuda" and not torch.cuda.is_available():
        return {"ok": True, "skipped": "no CUDA device"}
    device = torch.device("cuda" if want == "cuda" else "cpu")
    ce, ep, pp = _chunked_ce(device), _ep_dispatch(device), _per_pass(device)
    return {"ok": bool(ce["ok"] and ep["ok"] and pp["ok"]), "device": str(device), "chunked_ce": ce,
            "ep_dispatch": ep, "per_pass_reduction": pp}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    res = run_checks(ap.parse_args(argv))
    print(json.dumps(res))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
