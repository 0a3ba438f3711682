"""Memory planner (scaling/accounting/memory.py): hand-computed cases, exactness against a
meta-device build (and an FSDP2 sharding of it) of every paper tier, and its activation estimate
against the bytes a small model really stores / peaks at on CPU."""

from __future__ import annotations

import functools

import pytest
import torch

from scaling.accounting.config import ModelConfig
from scaling.accounting.costs import total_params
from scaling.accounting.matching import smelt_twin
from scaling.accounting.memory import (
    GB,
    Layout,
    estimate_memory,
    head_activation_bytes,
    layer_activation_bytes,
    param_shapes,
    rope_table_bytes,
    sharded_numel,
)
from scaling.accounting.tiers import get_config
from scaling.common.errors import UserError

# ----- hand-computed cases ------------------------------------------------------------------------

# V=16, d=8, L=2, H=2, H_kv=1, h=4, E=4, k=2, f=8, T=4 (d and f multiples of 4: no padding)
TINY = ModelConfig(vocab_size=16, d_model=8, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=4,
                   n_experts=4, top_k=2, expert_hidden=8, seq_len=4, name="tiny")
# per layer: attention d*h*(2H+2H_kv) = 8*4*6 = 192, router d*E = 32, experts E*3*d*f = 768,
# norms 2*d = 16 -> 1008; embedding + head 2*V*d = 256, final norm 8 -> total 2*1008 + 264 = 2280
TINY_LAYER, TINY_ROOT, TINY_TOTAL = 1008, 264, 2280


def test_parameter_count_and_tensors_by_hand():
    assert total_params(TINY) == TINY_TOTAL
    assert sum(torch.Size(s).numel() for _, s in param_shapes(TINY)) == TINY_TOTAL
    assert len(param_shapes(TINY)) == 1 + 2 * 7 + 1 + 1  # embed, 7 per layer, final norm, head
    # FSDP2 pads dim 0 to ceil(dim0 / S) rows on every rank: 10 rows over 4 ranks -> 3 rows of 3
    assert sharded_numel((10, 3), 4) == 9
    assert sharded_numel((483, 1880, 1312), 32) == 16 * 1880 * 1312


def test_persistent_state_by_hand():
    # with accumulation every gradient exists from the second micro-batch on
    m = estimate_memory(TINY, Layout(mode="none", compute_dtype="fp32", grad_accum_steps=2))
    assert m.params == 4 * 2280 and m.grads == 4 * 2280
    assert m.optimizer == 2 * 4 * 2280 + 4 * 17  # two fp32 moments + a 4-byte step per tensor
    ddp = estimate_memory(TINY, Layout(mode="ddp", gpus_per_node=4, grad_accum_steps=2))
    assert ddp.grads == 2 * 4 * 2280  # param.grad + the reducer's bucket copy
    assert ddp.all_reduce == 2 * 3 * 4 * 2280 // 4  # ring all-reduce: 2 (n-1)/n of fp32 grads
    assert ddp.all_gather == ddp.reduce_scatter == 0


def test_activations_by_hand():
    # per token and layer pass, c = 4 (fp32):
    #   norms 2*(8d+4) = 136, wqkv/router inputs 2*c*d = 64, qkv c*(H+2Hkv)*h = 64,
    #   RoPE out c*(H+Hkv)*h = 48, SDPA out c*H*h = 32, lse 4*H = 8, router 2*4*E = 32,
    #   logsumexp + top-k sum 8, ids/order/tokens/probs k*28 = 56,
    #   experts k*c*(d + d + 4f + 1) = 2*4*(8 + 8 + 32 + 1) = 392         -> 840 bytes
    assert layer_activation_bytes(TINY, 1, 4, 4) == 4 * 840
    # head per token: 8d+4 = 68, c*d = 32, (c+4)*V = 128, targets and ids 16 -> 244
    assert head_activation_bytes(TINY, 1, 4, 4) == 4 * 244
    # all grads there; the plain cross-entropy (the chunked one below)
    m = estimate_memory(TINY, Layout(compute_dtype="fp32", grad_accum_steps=2, chunked_ce=False))
    # no checkpointing: 2 layer passes + head stored
    assert m.activations_stored == 2 * 4 * 840 + 4 * 244
    # head backward: 6720 + 976 stored + N*8*V = 512 of gradients = 8208; the last layer's:
    # 6720 + 32 (ids) stored + N*(2*k*c*d + 4*d) + 4*E*f*d (w_down's gradient) = 640 + 1024
    # = 8416 -> the peak is in the last layer
    assert m.peak_at == "layer 1 pass 1" and m.working == 1664
    assert m.activations == 2 * 4 * 840 + 32
    assert m.total == m.params + m.grads + m.optimizer + m.activations + m.working + m.buffers
    # chunked cross-entropy: the head keeps per token 8d+4 = 68, c*d = 32, ids 16 -> 116, plus
    # the fp32 weight gradient 4*V*d = 4*16*8 = 512
    assert head_activation_bytes(TINY, 1, 4, 4, chunked_ce=True) == 4 * 116 + 512
    chunked = estimate_memory(TINY, Layout(compute_dtype="fp32"))
    assert chunked.activations_stored == 2 * 4 * 840 + 4 * 116 + 512


def test_gradients_appear_layer_by_layer_without_accumulation():
    """set_to_none frees the gradients every step: with one micro-batch they grow during the
    backward. TINY: root grads 4*264 = 1056 from the start; at layer 1's backward 6720 + 32
    stored + 1664 working + 1056 = 9472; at layer 0's, layer 1's grads (4*1008) are there and
    its activations (3360) gone: 3392 + 1664 + 1056 + 4032 = 10144 -> the peak."""
    m = estimate_memory(TINY, Layout(compute_dtype="fp32"))
    assert m.peak_at == "layer 0 pass 1"
    assert m.grads == 4 * TINY_ROOT + 4 * TINY_LAYER
    assert m.activations + m.working + m.grads == 10144
    acc = estimate_memory(TINY, Layout(compute_dtype="fp32", grad_accum_steps=2))
    assert acc.grads == 4 * TINY_TOTAL and acc.total > m.total
    # DDP's reducer buckets are there all the time
    ddp = estimate_memory(TINY, Layout(mode="ddp", gpus_per_node=2, compute_dtype="fp32"))
    assert ddp.grads == 4 * TINY_TOTAL + 4 * TINY_ROOT + 4 * TINY_LAYER


def test_looped_weight_gradient_is_held_until_the_first_pass():
    looped = TINY.replace(n_layers=4, loop_start=1, loop_end=3, n_loops=2)
    m = estimate_memory(looped, Layout(compute_dtype="fp32", activation_checkpointing=True))
    # backward order: layer 3, then loop pass 2 (2, 1), then pass 1 (2, 1), then layer 0; at
    # the pass-1 backward of layer 2 both looped layers' pass-2 weight gradients wait (4 B each)
    # beside the layer's working set N*(2*k*c*d + 4*d) + 4*E*f*d = 4*(128 + 32) + 1024 = 1664
    assert m.peak_at == "layer 2 pass 1"
    assert m.working == 1664 + 2 * 4 * TINY_LAYER
    # with checkpointing a pass stores its input (N*4*d = 128 bytes; 6 passes) and the
    # layer being recomputed stores everything again, with the combine's gate product
    # (N*k*c*d = 4*2*4*8 = 256 bytes) alive where the recompute stops
    remaining = 128 * 3 + 4 * 8  # inputs of layer 2 p1 (current), layer 1 p1, layer 0; the ids
    assert m.activations == remaining + layer_activation_bytes(looped, 1, 4, 4) + 256


def test_fsdp_buffers_and_communication_by_hand():
    lay = Layout(mode="fsdp", gpus_per_node=4, micro_batch_size=1)
    m = estimate_memory(TINY, lay)
    assert lay.shards == 4 and lay.replicas == 1
    # root unsharded in bf16, two layers all-gathered, one layer's grads in bf16 + fp32
    assert m.buffers == 2 * TINY_ROOT + 2 * 2 * TINY_LAYER + (2 + 4) * TINY_LAYER
    # all-gather: (S-1)/S * c * (2 passes-worth per layer pass + root) = 3/4 * 2 * (4*1008 + 264)
    assert m.all_gather == 6444
    # reduce-scatter: (S-1)/S * 4 * (every parameter once) = 3/4 * 4 * 2280
    assert m.reduce_scatter == 6840 and m.all_reduce == 0
    # gradients synced only on the last micro-batch: FSDP2 keeps every unsharded fp32 gradient
    last = estimate_memory(TINY, Layout(mode="fsdp", gpus_per_node=4, grad_accum_steps=2, grad_sync="last"))
    every = estimate_memory(TINY, Layout(mode="fsdp", gpus_per_node=4, grad_accum_steps=2))
    assert last.buffers - every.buffers == 4 * TINY_TOTAL
    assert every.reduce_scatter == 2 * last.reduce_scatter


def test_hsdp_layout():
    lay = Layout(mode="hsdp", gpus_per_node=4, nodes=2)
    assert (lay.world, lay.shards, lay.replicas) == (8, 4, 2) and lay.grad_sync == "every"
    assert Layout(mode="ddp", gpus_per_node=2).grad_sync == "last"  # no_sync is free for DDP
    m = estimate_memory(TINY, lay)
    # the shard's fp32 gradients all-reduced over 2 replicas: 2 * 1/2 * 4 * (local elements)
    local = sum(sharded_numel(s, 4) for _, s in param_shapes(TINY))
    assert m.all_reduce == 4 * local


@pytest.mark.parametrize("kw, msg", [
    ({"mode": "zero3"}, "parallel mode must be one of"),
    ({"mode": "none", "gpus_per_node": 2}, "runs on one GPU"),
    ({"mode": "hsdp", "gpus_per_node": 4, "nodes": 2, "replicate": 3}, "must divide"),
    ({"micro_batch_size": 0}, "micro_batch_size must be a positive integer"),
    ({"compute_dtype": "fp8"}, "compute_dtype must be one of"),
])
def test_bad_layouts(kw, msg):
    with pytest.raises(UserError, match=msg):
        Layout(**kw)


def test_result_to_dict_and_summary():
    m = estimate_memory(get_config("100M", "smelt"), Layout(mode="fsdp", gpus_per_node=8,
                                                            micro_batch_size=16, grad_accum_steps=4,
                                                            activation_checkpointing=True))
    d = m.to_dict()
    assert d["unit"] == "GB (1e9 bytes)"
    parts = ("params", "grads", "optimizer", "activations", "working", "buffers")
    assert d["total"] == pytest.approx(sum(d[p] for p in parts))
    assert d["total"] == m.total / GB
    comm = d["communication_per_step"]
    assert set(comm) == {"all_gather", "reduce_scatter", "all_reduce", "all_to_all", "reduce_scatter_inline",
                         "all_reduce_inline", "total"}
    # the in-line part (SMELT's per-pass reductions) is inside reduce_scatter, not added to the total
    assert 0 < comm["reduce_scatter_inline"] < comm["reduce_scatter"]
    assert comm["total"] == pytest.approx(sum(comm[k] for k in ("all_gather", "reduce_scatter", "all_reduce",
                                                                 "all_to_all")))
    assert "GB per GPU" in m.summary() and "fsdp" in m.summary()


def test_expert_parallel_layout_by_hand():
    """TINY (E = 4 experts of 3*d*f = 192 params: 768 per layer, 240 non-expert, root 264) on 4
    GPUs, FSDP with EP 2: each rank holds 2 experts per layer, FSDP-sharded over the other 2."""
    fsdp = estimate_memory(TINY, Layout(mode="fsdp", gpus_per_node=4, micro_batch_size=1))
    ep = estimate_memory(TINY, Layout(mode="fsdp", gpus_per_node=4, micro_batch_size=1, ep=2))
    # persistent state: 1 expert row per stack either way (4 over 4, or 2 over 2)
    assert ep.params == fsdp.params and ep.optimizer == fsdp.optimizer
    # a layer as gathered: 240 + 2 * 192 = 624 instead of 1008; bf16 x 2 layers + bf16 + fp32 grads
    assert fsdp.buffers - ep.buffers == (2 * 2 + 2 + 4) * (1008 - 624)
    # all-gather, bf16, 2 layer passes, forward + backward: non-expert 3/4 of 2*2*240 + root 264,
    # expert shares 1/2 of 2*2*384
    assert ep.all_gather == 2 * (3 / 4 * (2 * 2 * 240 + 264) + 1 / 2 * 2 * 2 * 384)
    # all-to-all: 2 passes x 4 transfers x 1/2 leaving x N*k*d*c = 4*2*8*2
    assert ep.all_to_all == 2 * 4 * 0.5 * 4 * 2 * 8 * 2 and fsdp.all_to_all == 0
    assert ep.communication == ep.all_gather + ep.reduce_scatter + ep.all_reduce + ep.all_to_all
    assert "expert-parallel 2" in ep.summary()
    with pytest.raises(UserError, match="must divide the shard degree"):
        Layout(mode="fsdp", gpus_per_node=4, ep=3)
    with pytest.raises(UserError, match="needs parallel mode fsdp or hsdp"):
        Layout(mode="ddp", gpus_per_node=4, ep=2)
    with pytest.raises(UserError, match="exceeds the 4 experts"):
        estimate_memory(TINY, Layout(mode="fsdp", gpus_per_node=8, ep=8))


# ----- exactness against a meta-device build ---------------------------------------------------

PAPER = [(t, a) for t in ("100M", "200M", "600M", "1.6B") for a in ("baseline", "smelt")]


def _meta_model(cfg, monkeypatch):
    from scaling.training.model.transformer import MoETransformer

    # initialisation does not change shapes; skipping it keeps the build instant on meta
    monkeypatch.setattr(MoETransformer, "init_weights", lambda self, seed: None)
    with torch.device("meta"):
        return MoETransformer(cfg)


@pytest.mark.parametrize("tier, arch", PAPER)
def test_params_and_optimizer_equal_a_meta_build(tier, arch, monkeypatch):
    cfg = get_config(tier, arch)
    model = _meta_model(cfg, monkeypatch)
    assert [(n, tuple(p.shape)) for n, p in model.named_parameters()] == param_shapes(cfg)
    m = estimate_memory(cfg, Layout())
    assert m.params == sum(p.numel() * p.element_size() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    for p in model.parameters():
        p.grad = torch.empty_like(p)
    opt.step()  # meta tensors: creates the states, allocates nothing
    moments = [v for st in opt.state.values() for k, v in st.items() if k != "step"]
    steps = [st["step"] for st in opt.state.values()]
    # 2 moments per parameter; the 4-byte step per tensor lives on the GPU with the fused AdamW
    assert m.optimizer == sum(v.numel() * v.element_size() for v in moments) + 4 * len(steps)
    assert len(steps) == len(param_shapes(cfg))


@pytest.mark.parametrize("tier, arch, shards", [("1.6B", "smelt", 32), ("600M", "baseline", 8)])
def test_fsdp2_shards_equal_the_planner(tier, arch, shards, monkeypatch):
    """fully_shard on the meta device over a fake process group of ``shards`` ranks (rank 0)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    cfg = get_config(tier, arch)
    model = _meta_model(cfg, monkeypatch)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=shards)
    try:
        mesh = init_device_mesh("cpu", (shards,))
        for block in model.layers:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        local = [p.to_local() for p in model.parameters()]
        m = estimate_memory(cfg, Layout(mode="fsdp", gpus_per_node=8, nodes=shards // 8))
        assert m.params == sum(t.numel() * t.element_size() for t in local)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        moments = [v.to_local() for st in opt.state.values() for k, v in st.items() if k != "step"]
        assert m.optimizer == sum(v.numel() * v.element_size() for v in moments) + 4 * len(local)
    finally:
        dist.destroy_process_group()


# ----- activations: estimate vs measured on CPU ------------------------------------------------

# An MoE-heavy small model (the peak falls inside the layers), its SMELT twin, and a proxy twin
# whose odd widths make the model zero-pad the expert weights.
HEAVY = ModelConfig(name="moe-heavy", vocab_size=256, d_model=64, n_layers=4, n_heads=4, n_kv_heads=2,
                    head_dim=24, n_experts=8, top_k=4, expert_hidden=128, seq_len=64)
MEASURED = {
    "heavy-baseline": HEAVY,
    "heavy-smelt": smelt_twin(HEAVY, width_multiple=4).smelt,
    "tiny-smelt-padded": get_config("proxy-tiny", "smelt"),
    # an odd head size (the paper twins' 37, 43, 53): CPU's attention returns another memory
    # layout, and wo's reshape copies what it saves (2.6% of this model's saved bytes, unplanned
    # before the accounting audit of 2026-12-06)
    "heavy-odd-head": HEAVY.replace(name="moe-heavy-odd", head_dim=23),
}
BATCH = 4
SAVED_TOL, PEAK_TOL = 0.01, 0.05


def _model(cfg, checkpointing=False):
    from torch.utils.checkpoint import checkpoint

    from scaling.training.model.transformer import MoETransformer

    torch.manual_seed(0)
    model = MoETransformer(cfg)
    if checkpointing:  # per layer *pass*: every call of a block is checkpointed on its own
        for block in model.layers:
            block.forward = functools.partial(checkpoint, block.forward, use_reentrant=False)
    return model


def _batch(cfg):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (BATCH, cfg.seq_len + 1), generator=gen)
    return ids[:, :-1], ids[:, 1:]


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked-ce", "plain-ce"])
@pytest.mark.parametrize("name", sorted(MEASURED))
def test_saved_activation_bytes_match_autograd(name, chunked):
    """Bytes autograd saves for backward, counted by a saved_tensors_hooks pack hook (each storage
    once, parameters and buffers excluded), against the planner's per-pass + head formula
    (less the logits, which the caller holds rather than autograd)."""
    cfg = MEASURED[name]
    model = _model(cfg)
    model.ce_chunk = model.ce_chunk if chunked else 0
    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in own:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    x, y = _batch(cfg)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x, y)
    measured = sum(saved.values())
    N = BATCH * cfg.seq_len
    predicted = (cfg.n_layer_passes * layer_activation_bytes(cfg, BATCH, cfg.seq_len, 4)
                 + head_activation_bytes(cfg, BATCH, cfg.seq_len, 4, chunked)
                 - (0 if chunked else 4 * N * cfg.vocab_size))
    assert predicted == pytest.approx(measured, rel=SAVED_TOL)


class _FusedRMSNorm(torch.autograd.Function):
    """What CUDA's fused rms_norm kernel saves (its input and the fp32 rstd), not the CPU
    decomposition's intermediates; the forward only (the test counts saved bytes)."""

    @staticmethod
    def forward(ctx, x, w, eps):
        with torch.autocast("cpu", enabled=False):
            rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
            y = (x.float() * rstd * w.float()).to(x.dtype)
        ctx.save_for_backward(x, rstd, w)
        return y


# (compute bytes c, residual bytes r): FSDP2's layout (a bf16 model: its casts happen in the
# all-gather) and one GPU unwrapped (autocast over fp32 weights)
CUDA_LAYOUTS = {"fsdp2-bf16": (2, 2), "unwrapped-autocast": (2, 4)}


@pytest.mark.parametrize("layout", sorted(CUDA_LAYOUTS))
@pytest.mark.parametrize("name", ["heavy-baseline", "heavy-smelt", "heavy-shared"])
def test_saved_activation_bytes_of_the_cuda_layouts(name, layout, monkeypatch):
    """The planner's bf16 terms (c = 2, and r = 4 under autocast) against autograd's saved bytes on
    CPU emulations of the CUDA layouts: CUDA's expert policy (bf16 grouped GEMMs), a norm that
    saves what the fused CUDA kernel saves, bf16 autocast; the layers' saved tensors counted as
    above, less the bf16 weight copies autocast and the experts make (the planner's buffers)."""
    from scaling.training.model import transformer

    monkeypatch.setattr(transformer.MoE, "_grouped_dtype", lambda self, xs: transformer.compute_dtype(xs))
    monkeypatch.setattr(transformer.RMSNorm, "forward",
                        lambda self, x: _FusedRMSNorm.apply(x, self.weight.to(x.dtype), self.eps))
    cfg = MEASURED[name] if name in MEASURED else HEAVY.replace(name="heavy-shared", shared_expert_hidden=64)
    c, r = CUDA_LAYOUTS[layout]
    model = _model(cfg)
    if r == 2:
        model = model.to(torch.bfloat16)
    weights = {tuple(p.shape) for p in model.parameters()}
    weights |= {(s[1], s[0]) for s in list(weights) if len(s) == 2}
    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    saved: dict[int, int] = {}

    def pack(t):
        if t.dtype == torch.bfloat16 and tuple(t.shape) in weights and r != c:
            return t  # a bf16 copy of a weight: counted as the planner's autocast buffers
        storage = t.untyped_storage()
        if storage.data_ptr() not in own:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    for block in model.layers:  # the layers' tensors only (the head's are checked above)
        block.forward = functools.partial(
            lambda f, *a, **kw: _packing(pack, f, *a, **kw), block.forward)
    B = 5  # N = 320 tokens: no activation shares a weight's shape (V = 256)
    ids = torch.randint(0, cfg.vocab_size, (B, cfg.seq_len), generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(ids, ids)
    predicted = (cfg.n_layer_passes * layer_activation_bytes(cfg, B, cfg.seq_len, c, r)
                 + rope_table_bytes(cfg, cfg.seq_len, c))
    assert predicted == pytest.approx(sum(saved.values()), rel=1e-3)


def _packing(pack, forward, *args, **kwargs):
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        return forward(*args, **kwargs)


def _measured_peak(cfg, checkpointing: bool, chunked: bool) -> int:
    """Peak bytes of a forward + backward on CPU, tracked by PyTorch's MemTracker (a dispatch
    mode that sees every storage allocated and freed), less the parameters and the gradients
    (allocated before, as in every accumulation step after the first)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    model = _model(cfg, checkpointing)
    model.ce_chunk = model.ce_chunk if chunked else 0
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    x, y = _batch(cfg)
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        out = model(x, y)
        (out.loss + 0.01 * out.aux_loss + 1e-3 * out.z_loss).backward()
        del out
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    static = sum(v for k, v in peak.items() if getattr(k, "name", "") in ("PARAM", "GRAD", "BUFFER"))
    return peak["Total"] - static


@pytest.mark.parametrize("chunked", [False, True], ids=["plain-ce", "chunked-ce"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["ac-off", "ac-on"])
@pytest.mark.parametrize("name", ["heavy-baseline", "heavy-smelt"])
def test_peak_step_memory_matches_the_estimate(name, checkpointing, chunked):
    """The measured peak (:func:`_measured_peak`) against the planner's activations + working +
    buffers."""
    cfg = MEASURED[name]
    measured = _measured_peak(cfg, checkpointing, chunked)
    m = estimate_memory(cfg, Layout(micro_batch_size=BATCH, activation_checkpointing=checkpointing,
                                    compute_dtype="fp32", chunked_ce=chunked))
    predicted = m.activations + m.working + m.buffers
    if chunked and checkpointing:
        # measured 4.64 MB vs 4.89 predicted (heavy-baseline): the plain-CE case matched only
        # because the caller-held logits (N*4*V, gone with the chunked loss) filled the planner's
        # over-count of a recomputed layer's backward; the estimate stays an upper bound
        assert measured <= predicted <= 1.08 * measured
    else:
        assert predicted == pytest.approx(measured, rel=PEAK_TOL)


def test_peak_at_the_chunked_loss_counts_its_gradient_products():
    """A step whose peak is the chunked loss's forward (large V, small d and few tokens): its fp32
    softmax gradient and the products gc @ w, gc.t() @ hc are alive together. The planner left the
    products out (-4.6% here; -7.1% at 96 tokens in the audit; now -0.08%)."""
    cfg = ModelConfig(vocab_size=1001, d_model=42, n_layers=5, n_heads=6, n_kv_heads=2, head_dim=8,
                      n_experts=6, top_k=1, expert_hidden=30, seq_len=48)
    measured = _measured_peak(cfg, checkpointing=False, chunked=True)
    m = estimate_memory(cfg, Layout(micro_batch_size=BATCH, compute_dtype="fp32", chunked_ce=True))
    assert m.activations + m.working + m.buffers == pytest.approx(measured, rel=0.01)


def test_planner_within_10_percent_of_the_h200_measurements(bench):
    """Every configuration measured on one H200 (benchmarks/results/gpu-h200-2026-12-04*.json:
    torch 2.11, FSDP2 bf16, the sync-free MoE layer; eager and compiled, micro-batch 8 and 16):
    the planner's peak within +-10% of torch.cuda.max_memory_allocated, and its stored
    activations within +-10% of the bytes a forward left allocated
    (benchmarks/memory_calibration.py builds the rows)."""
    rows = bench("memory_calibration").measured_rows()
    assert len(rows) == 8  # 2 + 2 + 2 in the first file, 2 in the second
    for r in rows:
        where = (r["file"], r["micro"], r["compiled"], r["arch"])
        assert abs(r["planned"] / r["measured"] - 1) <= 0.10, where
        assert abs(r["planned_stored"] / r["stored"] - 1) <= 0.10, where
