"""Cast once (issue 31): in one training step under FSDP2 bf16 mixed precision + autocast (the
CUDA recipe, run here on one gloo rank with CPU autocast), every weight matrix is cast to bf16
exactly once per FSDP all-gather and never again (autocast finds bf16 weights and leaves them),
and the model's own explicit casts are the few it needs: the gates, the expert offsets and
counts, the RoPE tables once per forward, the logits for the fp32 loss (the router takes its
bf16 operands as they are and returns fp32 logits)."""

from __future__ import annotations

import collections
import os
import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from scaling.accounting.tiers import get_config

torch.set_num_threads(1)
TORCH_DIR = os.path.dirname(torch.__file__)
MODEL_FILE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "scaling", "training", "model",
                                          "transformer.py"))


class DispatchCasts(TorchDispatchMode):
    """dtype-changing aten._to_copy / copy_ calls, by source shape (what the kernels see; FSDP2
    casts flat 1-D shards)."""

    def __init__(self):
        super().__init__()
        self.by_shape: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.__name__
        if name.startswith(("_to_copy", "copy_")):
            src, dst = (args[1], args[0]) if name.startswith("copy_") else (args[0], out)
            if isinstance(src, torch.Tensor) and src.dtype != dst.dtype:
                self.by_shape[tuple(src.shape)] += 1
        return out


class ExplicitCasts(TorchFunctionMode):
    """dtype-changing .to/.float/.bfloat16/.type calls made by the model's own code
    (scaling/training/model/transformer.py; FSDP's casts are counted by ``DispatchCasts``)."""

    NAMES = {"to", "float", "bfloat16", "half", "double", "type"}

    def __init__(self):
        super().__init__()
        self.calls: collections.Counter = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        tensors = args and isinstance(args[0], torch.Tensor) and isinstance(out, torch.Tensor)
        if name in self.NAMES and tensors:
            if out.dtype != args[0].dtype and _caller_is_the_model():
                self.calls[(tuple(args[0].shape), str(args[0].dtype), str(out.dtype))] += 1
        return out


def _caller_is_the_model() -> bool:
    """Whether the code that called the cast (the first frame outside this file and torch's
    override machinery) is the model's."""
    frame, overrides = sys._getframe(1), os.path.join(TORCH_DIR, "overrides")
    while frame is not None and (frame.f_code.co_filename == __file__
                                 or frame.f_code.co_filename.startswith(overrides)):
        frame = frame.f_back
    return frame is not None and frame.f_code.co_filename == MODEL_FILE


@pytest.mark.parametrize("arch", ["baseline", "smelt"])
def test_one_cast_per_all_gather_and_few_explicit_casts(arch, tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from scaling.training.model.transformer import MoETransformer
    from scaling.training.parallel.data_parallel import materialize, parallelize, train_step

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        cfg = get_config("proxy-xxs", arch).replace(seq_len=32)
        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp_shard",))
        with torch.device("meta"):
            model = MoETransformer(cfg)
        model = parallelize(model, "fsdp", mesh, mixed_precision=True)
        materialize(model, torch.device("cpu"), 0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        params = list(model.parameters())
        x = torch.randint(0, cfg.vocab_size, (2, 32))

        def step():
            train_step(model, opt, params, x, x, n_micro=1, grad_clip=1.0, aux_coef=0.01, z_coef=1e-3,
                       grad_sync="every", autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16))

        step()  # the first step builds AdamW's state
        with DispatchCasts() as low, ExplicitCasts() as high:
            step()
    finally:
        dist.destroy_process_group()

    passes = cfg.n_layer_passes
    # every weight matrix of a layer: cast in the forward and the backward all-gather of each
    # pass (reshard_after_forward=True), nothing else
    d, E, f = cfg.d_model, cfg.n_experts, cfg.expert_hidden
    qkv = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim * d
    matrices = {"wqkv": qkv, "wo": cfg.n_heads * cfg.head_dim * d, "w_gate_up": E * d * 2 * f,
                "w_down": E * f * d}
    for name, numel in matrices.items():
        expected = 2 * passes
        assert low.by_shape[(numel,)] == expected, (name, low.by_shape[(numel,)], expected)
    assert low.by_shape[(cfg.vocab_size * d,)] == 2  # the root's embedding: once per all-gather

    N = 2 * 32
    want = collections.Counter({
        # none of the router's operands: its GEMM takes them in bf16 and returns fp32 logits
        # (transformer._mm_bf16_fp32; it was 2 fp32 casts per pass and an fp32 GEMM)
        ((N, cfg.top_k), "torch.float32", "torch.bfloat16"): passes,   # gates
        ((E,), "torch.int64", "torch.int32"): passes,              # expert offsets
        ((2, E), "torch.int64", "torch.float32"): passes,          # per-sequence counts
        ((cfg.seq_len, cfg.rotary_dim), "torch.float32", "torch.bfloat16"): 2,  # RoPE cos, sin
        # the logits' fp32 cast happens chunk by chunk in scaling/training/model/chunked_ce.py, which
        # this counter (casts called from model.py) does not see
    })
    assert high.calls == want


@pytest.mark.parametrize("arch", ["baseline", "smelt"])
def test_one_gpu_unwrapped_casts(arch, monkeypatch):
    """The trainer's one-GPU layout (no wrapper; autocast over fp32 weights), with CUDA's expert
    policy (bf16 grouped GEMMs) applied on the CPU: the dense weights are cast once per forward
    (autocast's cache) and their gradient once back; the expert stacks once per layer *pass*, so
    a looped layer's two passes each bring their bf16 weight gradient back to fp32 and the
    passes sum in fp32, as the per-pass reduction does under FSDP2 (sharing one cast would sum
    them in bf16). The MoE input is cast for the router and, before the dispatch gather, for the
    experts (N rows, never the N*k gathered ones)."""
    from scaling.training.model import transformer
    from scaling.training.model.transformer import MoETransformer
    from scaling.training.parallel.data_parallel import train_step

    monkeypatch.setattr(transformer.MoE, "_grouped_dtype", lambda self, xs: transformer.compute_dtype(xs))
    cfg = get_config("proxy-xxs", arch).replace(seq_len=32)
    model = MoETransformer(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, cfg.vocab_size, (2, 32))

    def step():
        train_step(model, opt, list(model.parameters()), x, x, n_micro=1, grad_clip=1.0, aux_coef=0.01,
                   z_coef=1e-3, grad_sync="every",
                   autocast=lambda: torch.autocast("cpu", dtype=torch.bfloat16))

    step()
    with DispatchCasts() as low, ExplicitCasts() as high:
        step()
    passes, N, d, E, k = cfg.n_layer_passes, 2 * 32, cfg.d_model, cfg.n_experts, cfg.top_k
    qkv = ((cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim, d)
    assert low.by_shape[qkv] == 2 * cfg.n_layers   # once per forward, once back: not per pass
    dp, fp = (-(-d // 8) * 8, -(-cfg.expert_hidden // 8) * 8)  # bf16 grouped_mm widths
    assert low.by_shape[(E, dp, 2 * fp)] == 2 * passes and low.by_shape[(E, fp, dp)] == 2 * passes
    f32, b16 = "torch.float32", "torch.bfloat16"
    # the MoE input: the router's bf16 operand (saved for its backward) and the dispatch's, before
    # the gather; two casts of N rows, so that each path's gradient comes back to the fp32
    # residual summed in fp32 (one shared cast would sum them in bf16)
    assert high.calls[((N, d), f32, b16)] == 2 * passes
    assert high.calls[((N * k, d), f32, b16)] == 0          # never the N*k gathered rows
    assert high.calls[((2, 32, d), b16, f32)] == passes    # the combined output [B, T, d], to the residual
    assert high.calls[((N, d), b16, f32)] == 0
    assert high.calls[((E, d), f32, b16)] == passes       # the router weight, as autocast would
