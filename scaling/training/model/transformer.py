"""Decoder-only MoE Transformer with an optional SMELT loop, in one readable file (nanoGPT style).

Architecture (pre-norm; no biases anywhere; sizes from ``scaling.accounting.config.ModelConfig``)::

    x = embed(ids)
    for (layer, pass) in cfg.schedule():          # the looped block runs r times, same weights
        s = cfg.residual_scale(layer)             # 1/r inside the loop (SMELT), else 1
        x = x + s * Attn(RMSNorm(x))              # each pass computes its own K/V
        x = x + s * MoE(RMSNorm(x))
    logits = lm_head(RMSNorm(x))                  # lm_head tied to embed when cfg.tie_embeddings

* Attention: q/k/v/o projections with head size ``h`` decoupled from ``d_model``; GQA with
  ``n_kv_heads``; RoPE (rotate-half layout, as Llama/Mixtral) on the first ``cfg.rotary_dim``
  dims of q and k; causal ``F.scaled_dot_product_attention``. Only when ``return_attn`` is
  asked is softmax(QK^T/sqrt(h) + mask) formed explicitly, so the normal path stays SDPA.
* MoE: router ``W_r`` (d -> E), softmax, top-k, the k weights renormalised to sum to 1
  (Mixtral, Jiang et al. 2024); SwiGLU experts stored stacked (``w_gate_up`` [E, d, 2f],
  ``w_down`` [E, f, d]); optional always-on shared SwiGLU expert (no gate).
  Dispatch is batched, drops nothing and never syncs with the host: a fixed-size histogram
  (``scatter_add_`` into E bins) counts the assignments on the device, the N*k (token, slot)
  assignments are stably sorted by expert, the tokens gathered once (``index_select``), each
  expert runs on its contiguous slice (``F.grouped_mm`` with device int32 offsets: fp32 on CPU,
  bf16 under CUDA autocast; odd sizes zero-padded to multiples of 4; else a loop over
  ``split``, the one path that syncs), and each token's k outputs are gathered back through
  the inverse permutation and summed with their gates (no atomic ``index_add_``; gradients
  are deterministic). Shapes depend only on N, k, E and d, so ``torch.compile(fullgraph=True)``
  captures a whole block. (``x[idx]`` advanced indexing is avoided: its backward was ~50x
  slower than ``index_select``'s on CPU.)
* Loss: with targets, cross-entropy is computed ``model.ce_chunk`` tokens at a time by
  ``scaling.training.model.chunked_ce`` (the [N, V] fp32 logits never exist whole; same loss and
  gradients as ``F.cross_entropy`` up to summation order); ``model.ce_chunk = 0`` switches to
  the plain ``F.cross_entropy`` over the whole logits.
* Auxiliary losses, returned separately and averaged over layer passes (the caller weights
  them): load balance ``E * sum_e f_e * P_e`` (Switch Transformer, Fedus et al. 2021, eq. 4-6,
  with top-k counting as in Hugging Face's Mixtral ``load_balancing_loss_func``: ``f_e`` =
  assignments to expert e / tokens, so sum_e f_e = k and a uniform router gives k;
  ``P_e`` = mean router probability of e), computed per sequence and averaged over the
  sequences (DeepSeek-V3's sequence-wise form, Liu et al. 2024): a fixed partition of the
  batch, so the objective is the same whatever the micro-batch size or world size; and router
  z-loss ``mean_tokens logsumexp(logits)^2`` (ST-MoE, Zoph et al. 2022, eq. 5).

The parameter count equals ``scaling.accounting.costs.total_params(cfg)`` exactly (tested).

CPU speed: call ``scaling.training.loop.cpu.tune_cpu_allocator()`` once per training process (~1.2x
per step here). The model compiles with ``torch.compile(model, fullgraph=True)`` (grouped_mm is wrapped
as a custom op for that), but on CPU fp32 that measured no faster than eager (~1%): the step
is bound by the matmuls (near the core's fp32 FMA peak) and the SDPA kernel.
"""

from __future__ import annotations

import functools
import math
import warnings
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from scaling.accounting.config import HEAD_PADDING, ModelConfig
from scaling.training.model.chunked_ce import chunked_cross_entropy, default_chunk

IGNORE_INDEX = -100


@dataclass(frozen=True)
class ModelOutput:
    """What ``MoETransformer.forward`` returns.

    logits          [B, T, V] float (a property: with targets and the chunked loss it is formed
                    from the final hidden states only when read, so training never holds it)
    loss            mean cross-entropy (nats/token) over targets != -100; None without targets
    aux_loss        load-balancing loss, mean over layer passes (scalar; k for a uniform router)
    z_loss          router z-loss, mean over layer passes (scalar)
    per_token_loss  [B, T] cross-entropy per position (0 where target == -100), if asked
    attn            if asked: one dict per layer pass, in execution order,
                    {"layer": physical layer, "pass": pass from 1, "probs": [B, H, T, T]}
    expert_counts   [n_layer_passes, E] int64: (token, slot) assignments per expert per pass,
                    in execution order (detached statistics; sums to B*T*k per row)
    """

    _logits: Tensor | None = None
    loss: Tensor | None = None
    aux_loss: Tensor | None = None
    z_loss: Tensor | None = None
    per_token_loss: Tensor | None = None
    attn: list[dict] | None = None
    expert_counts: Tensor | None = None
    # (final hidden [B, T, d], head weight [V, d]) when the loss was chunked: logits on demand
    _head: tuple[Tensor, Tensor] | None = field(default=None, repr=False)

    @property
    def logits(self) -> Tensor:
        """[B, T, V]; under the chunked loss formed only when asked for (then cached)."""
        if self._logits is None and self._head is not None:
            object.__setattr__(self, "_logits", F.linear(*self._head))
        return self._logits


# ----- building blocks -------------------------------------------------------------------


class RMSNorm(nn.Module):
    """y = g * x / sqrt(mean(x^2) + eps) (Zhang & Sennrich 2019), accumulated in fp32.

    ``F.rms_norm`` computes in fp32 (its opmath type) for a bf16 input and rounds once at the
    output, so no explicit fp32 round trip is made: under FSDP2 bf16 that saved 4 casts of a
    [B, T, d] tensor per norm and step (forward and backward) and its saved fp32 copy. It runs
    outside autocast, so its output keeps x's dtype whatever the torch version's autocast policy
    (CUDA autocast lists ``rms_norm`` among its fp32 ops in recent releases, which would upcast a
    bf16 residual stream under FSDP2 and keep an fp32 copy of it for the backward).
    """

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        w = self.weight if self.weight.dtype == x.dtype else self.weight.to(x.dtype)
        with torch.autocast(x.device.type, enabled=False):
            return F.rms_norm(x, (x.shape[-1],), w, self.eps)


def rope_tables(rotary_dim: int, length: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos, sin tables [length, rotary_dim] in rotate-half layout (both halves share a frequency).

    inv_freq_i = theta^(-2i / rotary_dim), i < rotary_dim / 2 (Su et al. 2021; Llama layout).
    The sin table carries the rotate-half sign: its first half is negated, so that
    rope(x) = x * cos + swap_halves(x) * sin.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
    freqs = torch.outer(torch.arange(length, dtype=torch.float64), inv_freq)
    cos = torch.cat([freqs.cos(), freqs.cos()], dim=-1)
    sin = torch.cat([-freqs.sin(), freqs.sin()], dim=-1)
    return cos.float(), sin.float()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the first cos.shape[-1] dims of x [..., T, h]; the remaining dims pass through."""
    rd = cos.shape[-1]
    if rd == 0:
        return x
    if rd == x.shape[-1]:
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([x2, x1], dim=-1) * sin
    rot, rest = x[..., :rd], x[..., rd:]
    r1, r2 = rot.chunk(2, dim=-1)
    return torch.cat([rot * cos + torch.cat([r2, r1], dim=-1) * sin, rest], dim=-1)


def sdpa_head_size(h: int, device_type: str, padding: str = "auto") -> int:
    """The head size SDPA runs at: h, or h rounded up to a multiple of 8 (zero-padded q, k, v).

    Why: PyTorch's SDPA picks its kernel from the *unpadded* shapes, and cuDNN's attention (the
    one it prefers on Hopper) takes only head sizes that are multiples of 8; any other size falls
    to the FlashAttention-2 kernel, which pads to 8 itself (``pad_last_dim<8>`` in
    aten/src/ATen/native/transformers/attention.cpp) and runs its 64-wide template. The SMELT
    twins have such sizes (37, 43, 53: the KV-cache match fixes h); on the first H200 run their
    attention took 10-16% of GPU time on FA2 against 6-9% for the Baseline's h = 56 on cuDNN.
    Padding first does the same zero-padding FA2 does, so the saved tensors are the same, and lets
    cuDNN's kernel be chosen. "auto": on CUDA only; "never"; "always" (the CPU tests of exactness).
    """
    if padding not in HEAD_PADDING:
        raise ValueError(f"head padding must be one of {', '.join(HEAD_PADDING)}, got {padding!r}")
    if padding == "never" or (padding == "auto" and device_type != "cuda"):
        return h
    return _round_up(h, 8)


class Attention(nn.Module):
    """Causal GQA self-attention with RoPE; q/k/v share one fused projection matrix.

    ``wqkv`` rows are [q (H*h) | k (H_kv*h) | v (H_kv*h)]; ``wo`` maps H*h -> d. SDPA runs at
    ``sdpa_head_size(h, device, self.head_padding)``: zero columns added to q, k and v leave
    q.k and the first h output columns unchanged (the softmax scale stays 1/sqrt(h)).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.head_padding = "auto"
        qkv = (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
        self.wqkv = nn.Linear(cfg.d_model, qkv, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, return_probs: bool = False):
        B, T, _ = x.shape
        H, Hkv, h = self.n_heads, self.n_kv_heads, self.head_dim
        qkv = self.wqkv(x).view(B, T, H + 2 * Hkv, h).transpose(1, 2)  # [B, H+2Hkv, T, h]
        # split, not slicing: a slice's backward zero-fills the whole input per slice
        qk, v = qkv.split([H + Hkv, Hkv], dim=1)
        cos, sin = cos.to(qk.dtype), sin.to(qk.dtype)  # no-op: the model casts them once per forward
        q, k = apply_rope(qk, cos, sin).split([H, Hkv], dim=1)  # q and k rotated in one pass
        probs = None
        if return_probs:
            if Hkv != H:
                k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(h)
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            probs = scores.masked_fill(mask, float("-inf")).softmax(dim=-1)
            y = probs @ v
        else:
            hp = sdpa_head_size(h, x.device.type, self.head_padding)
            if hp != h:
                q, k, v = (F.pad(t, (0, hp - h)) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=Hkv != H,
                                               scale=None if hp == h else 1.0 / math.sqrt(h))
            y = y[..., :h] if hp != h else y
        y = self.wo(y.transpose(1, 2).reshape(B, T, H * h))
        return y, probs


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


if hasattr(F, "grouped_mm"):
    # F.grouped_mm wrapped as an opaque custom op: torch.compile's fake-tensor rule for it
    # accepts bf16 only, so without the wrapper a CPU fp32 model cannot be compiled.
    @torch.library.custom_op("smelt_scale::grouped_mm", mutates_args=())
    def grouped_mm(a: Tensor, b: Tensor, offs: Tensor) -> Tensor:
        """out[rows of group g] = a[rows of group g] @ b[g]; a [S, K], b [G, K, N], offs int32 [G]."""
        return F.grouped_mm(a, b, offs=offs)

    @grouped_mm.register_fake
    def _(a: Tensor, b: Tensor, offs: Tensor) -> Tensor:
        return a.new_empty(a.shape[0], b.shape[2])

    def _grouped_mm_setup(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    def _grouped_mm_backward(ctx, grad):
        a, b, offs = ctx.saved_tensors
        grad = grad.contiguous()  # the CPU kernel needs 16-byte-aligned row strides
        grad_a = grouped_mm(grad, b.transpose(-2, -1), offs)
        grad_b = _grouped_mm_weight_grad(a, grad, offs)  # [G, K, N]; empty groups give zeros
        return grad_a, grad_b, None

    @torch.library.custom_op("smelt_scale::grouped_mm_weight_grad", mutates_args=())
    def _grouped_mm_weight_grad(a: Tensor, grad: Tensor, offs: Tensor) -> Tensor:
        return F.grouped_mm(a.t(), grad, offs=offs)

    @_grouped_mm_weight_grad.register_fake
    def _(a: Tensor, grad: Tensor, offs: Tensor) -> Tensor:
        return a.new_empty(offs.shape[0], a.shape[1], grad.shape[1])

    grouped_mm.register_autograd(_grouped_mm_backward, setup_context=_grouped_mm_setup)


# ----- the MoE layer as small functions ----------------------------------------------------
#
# route -> sort_by_expert -> dispatch -> (expert compute) -> combine, each a function of
# tensors whose shapes depend only on (tokens N, top-k k, experts E, width d): N*k routed rows
# always, the per-expert counts and offsets stay on the device (no .item(), .tolist() or
# bincount anywhere in forward or backward, so torch.compile captures a block whole and CUDA
# graphs are possible). Expert parallelism plugs in between dispatch and combine: it receives
# the expert-sorted rows and the device offsets and returns rows in the same order (see
# /work/notes/moe-interface.md and ``MoE.expert_fn``).


def compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype the matmuls run in: autocast's where it is on, else x's."""
    dev = x.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype


@functools.cache
def mm_out_dtype_runs(device_type: str) -> bool:
    """Whether aten's mm with ``out_dtype`` (bf16 operands, fp32 output) runs on this device type,
    in the three layouts the router uses (x @ w.t(), grad @ w, x.t() @ grad): asked once with tiny
    GEMMs (cuBLAS has it since torch 2.8, pytorch/pytorch#150812; the CPU build has none). Where
    it does not, ``_mm_bf16_fp32`` computes the same function in fp32."""
    try:
        a = torch.zeros(16, 8, dtype=torch.bfloat16, device=device_type)
        w = torch.zeros(4, 8, dtype=torch.bfloat16, device=device_type)
        g = torch.zeros(16, 4, dtype=torch.bfloat16, device=device_type)
        for x, y in ((a, w.t()), (g, w), (a.t(), g)):
            if torch.mm(x, y, out_dtype=torch.float32).dtype != torch.float32:
                raise RuntimeError("mm with out_dtype returned another dtype")
        return True
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        if device_type != "cpu":  # a GPU that takes the slow path should say so, once
            warnings.warn(f"the router GEMM runs in fp32 on {device_type}: mm with out_dtype "
                          f"failed ({type(exc).__name__}: {str(exc)[:120]})", stacklevel=2)
        return False


# The router's GEMM as an opaque custom op (one extern call under torch.compile): bf16
# operands, fp32 accumulation and output. On CUDA that is aten's mm with out_dtype, one
# tensor-core GEMM; elsewhere (the CPU tests, a torch without it) the same function
# computed from the bf16 values upcast to fp32: a product of two bf16 numbers is exact in
# fp32, so both sum the same products in fp32 and differ only in summation order.
@torch.library.custom_op("smelt_scale::mm_bf16_fp32", mutates_args=())
def _mm_bf16_fp32(a: Tensor, b: Tensor) -> Tensor:
    """fp32 [M, N] = bf16(a) [M, K] @ bf16(b) [K, N], products accumulated in fp32."""
    a, b = a.to(torch.bfloat16), b.to(torch.bfloat16)
    if a.device.type != "cpu" and mm_out_dtype_runs(a.device.type):
        return torch.mm(a, b, out_dtype=torch.float32)
    with torch.autocast(a.device.type, enabled=False):  # a backward run inside autocast stays fp32
        return a.float() @ b.float()


@_mm_bf16_fp32.register_fake
def _(a: Tensor, b: Tensor) -> Tensor:
    return a.new_empty(a.shape[0], b.shape[1], dtype=torch.float32)


def _mm_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _mm_backward(ctx, grad):
    # the fp32 output gradient is rounded to bf16 once (as autocast's linear backward
    # receives it); each input gradient is accumulated in fp32 and returned in the input's dtype
    a, b = ctx.saved_tensors
    g = grad.to(torch.bfloat16)
    return _mm_bf16_fp32(g, b.t()).to(a.dtype), _mm_bf16_fp32(a.t(), g).to(b.dtype)


_mm_bf16_fp32.register_autograd(_mm_backward, setup_context=_mm_setup)


def router_logits(x: Tensor, router_weight: Tensor) -> Tensor:
    """x [N, d] -> router logits [N, E] in fp32, whatever the compute dtype.

    Softmax and top-k over the E logits are where bf16 rounding would flip ties between experts,
    so the logits are accumulated and kept in fp32. In bf16 mixed precision the operands are
    the bf16 values (under FSDP2 bf16 both already are: the norm's output and the bf16-rounded
    master weight; under autocast on one GPU they are rounded to bf16, as autocast rounds every
    other weight and input, and the GEMM saves that bf16 copy, not the fp32 input) and the GEMM
    runs on the tensor cores (``_mm_bf16_fp32``): on the first H200 run the fp32 version ran as
    an FFMA GEMM, ~11 ms per step for the SMELT twin's 15 forward passes alone at micro-batch 16.
    The forward is then the same function as that fp32 GEMM of the bf16 values; the backward
    rounds the logits' fp32 gradient to bf16 once, as every autocast matmul's backward receives
    its gradient. In fp32 training (the CPU proxies) it is the fp32 GEMM.
    """
    mixed = compute_dtype(x) == torch.bfloat16
    with torch.autocast(x.device.type, enabled=False):
        if mixed:
            return _mm_bf16_fp32(x.to(torch.bfloat16), router_weight.to(torch.bfloat16).t())
        return F.linear(x.float(), router_weight.float())


def route(x: Tensor, router_weight: Tensor, top_k: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """x [N, d] -> router logits, probs [N, E] (fp32), top-k expert ids [N, k], gates [N, k] (fp32).

    The logits are fp32 (``router_logits``). Gates are the top-k probabilities renormalised to
    sum to 1 (Mixtral).
    """
    logits = router_logits(x, router_weight)
    probs = logits.softmax(dim=-1)
    top_p, top_i = probs.topk(top_k, dim=-1)
    gates = top_p / top_p.sum(dim=-1, keepdim=True)
    return logits, probs, top_i, gates


def expert_histogram(top_i: Tensor, n_experts: int, groups: int = 1) -> Tensor:
    """Assignments per expert as a fixed-size int64 histogram [groups, E] on the device.

    ``scatter_add_`` of ones into E bins (integer adds: exact and order-free), not ``bincount``,
    whose output length depends on the data and so breaks a compiled graph. ``top_i`` [N, k] is
    split into ``groups`` equal consecutive blocks of tokens (one per sequence for the load
    balance loss); the sum over groups is the layer's histogram.
    """
    flat = top_i.reshape(groups, -1)
    return torch.zeros(groups, n_experts, dtype=torch.int64, device=top_i.device).scatter_add_(
        1, flat, torch.ones_like(flat))


def sort_by_expert(top_i: Tensor, counts: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Expert-major order of the N*k (token, slot) assignments a = token*k + slot.

    Returns ``order`` [N*k] (assignment at each sorted position; stable, so ties keep token
    order), ``inverse`` [N*k] (sorted position of each assignment: order[inverse[a]] = a) and
    ``offsets`` int32 [E] (end of each expert's rows, the cumulative ``counts`` [E]).
    """
    flat_e = top_i.reshape(-1)
    order = torch.argsort(flat_e, stable=True)
    inverse = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
    offsets = counts.cumsum(0).to(torch.int32)
    return order, inverse, offsets


class _Dispatch(torch.autograd.Function):
    """xs = x[order // k] in ``dtype``: each token cast once, then copied to its k sorted rows.
    The backward gathers each token's k row gradients through ``inverse`` and sums them in x's
    dtype (a fixed-order sum: no atomic ``index_add_``, so gradients are deterministic and each
    row is written once).

    Casting before the gather is the same function as gathering and then casting, but moves
    N rows through the cast instead of N*k: on one GPU under autocast the residual stream (and
    so the norm's output) is fp32 while the experts run in bf16, and the fp32 [N*k, d] temporary
    and its fp32 gradient were 8x the layer input each (1.4 GB per layer pass at micro-batch 16
    of the 100M tier: memory traffic, not stored for the backward). The backward sums the bf16
    row gradients with fp32 accumulation (``sum(dtype=)``), as the cast-then-sum it replaced did.
    """

    @staticmethod
    def forward(ctx, x: Tensor, order: Tensor, inverse: Tensor, k: int, dtype: torch.dtype) -> Tensor:
        ctx.save_for_backward(inverse)
        ctx.k, ctx.x_dtype = k, x.dtype
        return x.to(dtype).index_select(0, torch.div(order, k, rounding_mode="floor"))

    @staticmethod
    def backward(ctx, grad: Tensor):
        (inverse,) = ctx.saved_tensors
        g = grad.index_select(0, inverse)
        return g.view(-1, ctx.k, g.shape[-1]).sum(1, dtype=ctx.x_dtype), None, None, None, None


class _Unsort(torch.autograd.Function):
    """ys [N*k, d] in expert order -> token-major order (row token*k + slot): a permutation,
    whose backward is the inverse permutation (a gather, no scatter)."""

    @staticmethod
    def forward(ctx, ys: Tensor, order: Tensor, inverse: Tensor) -> Tensor:
        ctx.save_for_backward(order)
        return ys.index_select(0, inverse)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (order,) = ctx.saved_tensors
        return grad.index_select(0, order), None, None


def dispatch(x: Tensor, order: Tensor, inverse: Tensor, top_k: int,
             dtype: torch.dtype | None = None) -> Tensor:
    """x [N, d] -> xs [N*k, d]: the routed rows, sorted by expert (``sort_by_expert``), in
    ``dtype`` (None: x's); the gradient comes back in x's dtype."""
    return _Dispatch.apply(x, order, inverse, top_k, dtype or x.dtype)


def combine(ys: Tensor, order: Tensor, inverse: Tensor, gates: Tensor,
            lead: tuple[int, ...] | None = None) -> Tensor:
    """ys [N*k, d] (expert order) -> y [N, d] = sum_j gates[:, j] * (expert output of slot j), or
    [*lead, d] with ``lead`` the token dimensions (their product N).

    Each token's k outputs are gathered through the inverse permutation and summed in slot order:
    deterministic, and one elementwise kernel under compile (replaces a scatter ``index_add_``).
    The sum is taken in the output's shape, so the result is a tensor of its own, not a view:
    FSDP2 warns for every view a wrapped module returns (expert parallelism wraps the MoE).
    """
    N, k = gates.shape
    lead = (N,) if lead is None else tuple(lead)
    yk = _Unsort.apply(ys, order, inverse).view(*lead, k, ys.shape[-1])
    return (yk * gates.to(yk.dtype).view(*lead, k, 1)).sum(-2)


def load_balance_loss(probs: Tensor, counts: Tensor) -> Tensor:
    """E * mean_g sum_e f_ge * P_ge over token groups g (Switch Transformer eq. 4-6, top-k counting).

    probs [N, E] fp32, counts [G, E] (``expert_histogram`` with G groups of N/G consecutive
    tokens): f_ge = counts / (N/G) (sums to k), P_ge = mean probability of e over group g.
    The model's groups are its sequences (DeepSeek-V3's sequence-wise balance loss, Liu et al.
    2024, eq. 17-20): statistics over a fixed partition of the batch, so the objective does not
    depend on the micro-batch size or the number of ranks (a resume on another world size
    optimises the same function).
    """
    G, E = counts.shape
    P = probs.view(G, -1, E).mean(dim=1)
    # a Python divisor: P.new_tensor(n) would copy host -> device, one stream sync per layer pass
    # on CUDA in eager mode (the first H200 sync check found exactly one per MoE layer pass)
    f = counts.to(probs.dtype) / (probs.shape[0] // G)
    return E * (f * P).sum(dim=1).mean()


class MoE(nn.Module):
    """Top-k routed SwiGLU experts (+ optional shared expert), batched dispatch, no dropped tokens.

    Parameters: ``router`` [E, d]; ``w_gate_up`` [E, d, 2f] (columns [gate | up]);
    ``w_down`` [E, f, d]; shared expert ``shared_gate_up`` (d -> 2 f_s), ``shared_down`` (f_s -> d).
    Expert e computes (silu(x W_gate_e) * (x W_up_e)) W_down_e.

    ``expert_fn`` (None: ``self.experts``) is called as ``expert_fn(xs, offsets, counts)`` on the
    expert-sorted rows and must return their outputs in the same order: the hook expert
    parallelism replaces (all-to-all out, local experts, all-to-all back).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, E, f = cfg.d_model, cfg.n_experts, cfg.expert_hidden
        self.n_experts, self.top_k, self.hidden = E, cfg.top_k, f
        self.router = nn.Linear(d, E, bias=False)
        self.w_gate_up = nn.Parameter(torch.empty(E, d, 2 * f))
        self.w_down = nn.Parameter(torch.empty(E, f, d))
        self.shared_gate_up = self.shared_down = None
        if cfg.shared_expert_hidden > 0:
            self.shared_gate_up = nn.Linear(d, 2 * cfg.shared_expert_hidden, bias=False)
            self.shared_down = nn.Linear(cfg.shared_expert_hidden, d, bias=False)
        # "grouped_mm" | "loop": how the experts run on their slices. grouped_mm measured
        # faster on CPU fp32 (benchmarks/train_throughput.py --dispatch) and is sync-free; the
        # loop is the fallback where grouped_mm cannot run (old torch; CUDA without bf16) and
        # the one place that syncs (its slice sizes come to the host).
        self.dispatch = "grouped_mm" if hasattr(F, "grouped_mm") else "loop"
        # expert parallelism: the EPGroup (scaling.training.parallel.expert_parallel) and the hook that
        # sends the rows to their experts' ranks; None = all E experts here
        self.ep = None
        self.expert_fn = None

    def route(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """x [N, d] -> router logits, probs [N, E] (fp32), top-k expert ids [N, k], gates [N, k]."""
        return route(x, self.router.weight, self.top_k)

    def _grouped_dtype(self, xs: Tensor) -> torch.dtype | None:
        """dtype to run F.grouped_mm in, or None to use the loop (CUDA kernels take bf16 only)."""
        if self.dispatch != "grouped_mm" or not hasattr(F, "grouped_mm"):
            return None
        if xs.device.type == "cpu":
            return xs.dtype
        return torch.bfloat16 if compute_dtype(xs) == torch.bfloat16 else None

    def _grouped(self, xs: Tensor, offsets: Tensor, dtype: torch.dtype) -> Tensor:
        """Both expert matmuls as F.grouped_mm over the expert-sorted rows of xs (device offsets).

        The kernel needs 16-byte-aligned strides, i.e. sizes % 4 == 0 in fp32 and % 8 == 0 in
        bf16; other d or f (the SMELT twins have them) are zero-padded to those multiples: padded
        rows and columns of the weights are zero, so silu(0) * 0 = 0 and the result is exact.
        """
        d, f = xs.shape[1], self.hidden
        multiple = 16 // torch.empty(0, dtype=dtype).element_size()
        d4, f4 = _round_up(d, multiple), _round_up(f, multiple)
        w_gu, w_d = self.w_gate_up, self.w_down
        if (d4, f4) != (d, f):
            gate_w, up_w = w_gu.split(f, dim=2)
            w_gu = torch.cat([F.pad(gate_w, (0, f4 - f, 0, d4 - d)), F.pad(up_w, (0, f4 - f, 0, d4 - d))], 2)
            w_d = F.pad(w_d, (0, d4 - d, 0, f4 - f))
            xs = F.pad(xs, (0, d4 - d))
        hidden = grouped_mm(xs.to(dtype), w_gu.to(dtype), offsets)
        gate, up = hidden.chunk(2, dim=-1)
        out = grouped_mm(F.silu(gate) * up, w_d.to(dtype), offsets)
        return out[:, :d] if d4 != d else out

    def experts(self, xs: Tensor, offsets: Tensor, counts: Tensor) -> Tensor:
        """Run expert e on rows [offsets[e-1], offsets[e]) of xs (sorted by expert) -> [S, d]."""
        dtype = self._grouped_dtype(xs)
        if dtype is not None:
            return self._grouped(xs, offsets, dtype)
        outs = []
        # unbind once: per-expert w[e] indexing would make autograd build a full-size zero
        # gradient for every expert (SelectBackward); unbind's backward is one stack.
        # counts.tolist() syncs the device: this fallback is not sync-free (see __init__).
        w_gu, w_d = self.w_gate_up.unbind(0), self.w_down.unbind(0)
        for e, chunk in enumerate(xs.split(counts.tolist())):
            if chunk.shape[0] == 0:
                continue
            gate, up = (chunk @ w_gu[e]).chunk(2, dim=-1)
            outs.append((F.silu(gate) * up) @ w_d[e])
        return torch.cat(outs) if outs else xs.new_zeros(0, xs.shape[1])

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """x [B, T, d] (or [N, d]) -> (y like x, aux_loss, z_loss, expert counts [E]).

        The load-balance statistics are per sequence (B groups; one group for a 2-D input).
        """
        shape = x.shape
        groups = shape[0] if x.dim() == 3 else 1
        x = x.reshape(-1, shape[-1])
        logits, probs, top_i, gates = self.route(x)
        per_group = expert_histogram(top_i, self.n_experts, groups)
        counts = per_group.sum(0)
        order, inverse, offsets = sort_by_expert(top_i, counts)
        # the rows travel in the experts' dtype (bf16 on CUDA even where x is fp32)
        xs = dispatch(x, order, inverse, self.top_k, self._grouped_dtype(x))
        ys = (self.expert_fn or self.experts)(xs, offsets, counts)
        y = combine(ys, order, inverse, gates, shape[:-1]).to(x.dtype)   # [*shape]: not a view

        if self.shared_gate_up is not None:
            g, u = self.shared_gate_up(x).chunk(2, dim=-1)
            y = y + self.shared_down(F.silu(g) * u).view(shape)

        aux = load_balance_loss(probs, per_group)
        z = torch.logsumexp(logits, dim=-1).square().mean()
        return y, aux, z, counts


class Block(nn.Module):
    """One physical layer: pre-norm attention and MoE, each residual branch scaled by ``scale``."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.scale = cfg.residual_scale(layer)
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.moe_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.moe = MoE(cfg)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, return_probs: bool = False):
        a, probs = self.attn(self.attn_norm(x), cos, sin, return_probs)
        x = x + a if self.scale == 1.0 else x + self.scale * a
        m, aux, z, counts = self.moe(self.moe_norm(x))
        x = x + m if self.scale == 1.0 else x + self.scale * m
        return x, aux, z, counts, probs


# ----- the model --------------------------------------------------------------------------


class MoETransformer(nn.Module):
    """Baseline or SMELT MoE decoder built from a ModelConfig; weights initialised from ``seed``."""

    def __init__(self, cfg: ModelConfig, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.schedule = cfg.schedule()
        # expert parallelism: parameter name -> (full shape, first row, end row) of the expert
        # stacks this rank holds (scaling.training.parallel.expert_parallel.localize_experts)
        self.ep_slices: dict[str, tuple[tuple[int, ...], int, int]] = {}
        # tokens per chunk of the cross-entropy (scaling.training.model.chunked_ce); 0 = one plain
        # F.cross_entropy over the whole [N, V] logits
        self.ce_chunk = default_chunk(cfg.vocab_size)
        cos, sin = rope_tables(cfg.rotary_dim, cfg.seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        if self.embed.weight.device.type != "meta":  # a meta build is filled after sharding
            self.init_weights(seed)

    def set_head_padding(self, padding: str) -> None:
        """How every layer's SDPA pads its heads: "auto" (on CUDA, to a multiple of 8), "never",
        "always" (``sdpa_head_size``)."""
        sdpa_head_size(self.cfg.head_dim, "cpu", padding)  # checks the name
        for block in self.layers:
            getattr(block, "_checkpoint_wrapped_module", block).attn.head_padding = padding

    # -- parameters ------------------------------------------------------------------------
    def num_params(self, non_embedding: bool = False) -> int:
        """Exact parameter count (tied head counted once); = scaling.accounting.costs.total_params(cfg).

        non_embedding=True excludes the token embedding and the untied LM head
        (= scaling.accounting.costs.non_embedding_params(cfg)).
        """
        total = sum(p.numel() for p in self.parameters())
        if non_embedding:
            total -= self.embed.weight.numel()
            if self.lm_head is not None:
                total -= self.lm_head.weight.numel()
        return total

    @torch.no_grad()
    def init_weights(self, seed: int, write=None, device: torch.device | str = "cpu") -> None:
        """N(0, 0.02) for every matrix (embedding, router, projections, experts); RMSNorm gains 1.

        Matrices that write into the residual stream (attention ``wo``, expert ``w_down``, shared
        expert down) use 0.02 / sqrt(2 L) as GPT-2 does (Radford et al. 2019; nanoGPT), with L the
        physical layers: the loop's 1/r residual scale keeps the looped block's total write
        comparable to one pass. Deterministic given ``seed`` (own generator, fixed order).

        ``write(param, full_value)`` stores one parameter's full fp32 initial value (default: a
        copy). ``scaling.training.parallel.data_parallel.materialize`` passes one that keeps only the local
        shard of a sharded parameter, so a sharded model gets bitwise these values.

        ``device``: where the values are drawn, with that device's generator. The CPU (default) is
        the init of every training run: bitwise the same on any machine and world size. A GPU
        draws the same distributions in milliseconds instead of a CPU draw of every full
        parameter (about 23 s for the 100M tier's 3.7e9), but other bits: for throughput
        benchmarks (``build_model(init="device")``, benchmarks/gpu_check.py) only. Every rank
        draws every full value either way, so shards, replicas and expert slices stay consistent.
        """
        write = write or (lambda p, value: p.copy_(value.to(p)))
        gen = torch.Generator(device=device).manual_seed(seed)
        std, resid_std = 0.02, 0.02 / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():
            if p.ndim == 1:
                write(p, torch.ones(p.shape, device=device))
                continue
            s = resid_std if name.endswith(("wo.weight", "w_down", "shared_down.weight")) else std
            full_shape, lo, hi = self.ep_slices.get(name.replace("_checkpoint_wrapped_module.", ""),
                                                    (p.shape, None, None))
            value = torch.randn(full_shape, generator=gen, dtype=torch.float32, device=device).mul_(s)
            write(p, value if lo is None else value[lo:hi])

    def init_buffers(self) -> None:
        """Recompute the RoPE tables where the model lives (after ``to_empty`` from the meta device:
        they are non-persistent buffers, so no state dict carries them)."""
        cos, sin = rope_tables(self.cfg.rotary_dim, self.cfg.seq_len, self.cfg.rope_theta)
        self.rope_cos, self.rope_sin = cos.to(self.rope_cos.device), sin.to(self.rope_sin.device)

    # -- forward ---------------------------------------------------------------------------
    def _rope(self, T: int, device: torch.device) -> tuple[Tensor, Tensor]:
        if T > self.rope_cos.shape[0]:  # longer than cfg.seq_len: extend the tables
            cos, sin = rope_tables(self.cfg.rotary_dim, T, self.cfg.rope_theta)
            self.rope_cos, self.rope_sin = cos.to(device), sin.to(device)
        return self.rope_cos[:T], self.rope_sin[:T]

    def forward(
        self,
        input_ids: Tensor,
        targets: Tensor | None = None,
        return_attn: bool = False,
        return_per_token_loss: bool = False,
    ) -> ModelOutput:
        """input_ids, targets: LongTensor [B, T] (targets -100 = ignored). See ModelOutput."""
        B, T = input_ids.shape
        cos, sin = self._rope(T, input_ids.device)
        x = self.embed(input_ids)
        # q and k are in the compute dtype (autocast's, else the weights'): cast the tables once
        # per forward, not once per layer pass
        dtype = compute_dtype(x)
        cos, sin = cos.to(dtype), sin.to(dtype)
        aux_total = z_total = 0.0
        counts, attn = [], [] if return_attn else None
        for layer, pass_ in self.schedule:
            x, aux, z, c, probs = self.layers[layer](x, cos, sin, return_attn)
            aux_total, z_total = aux_total + aux, z_total + z
            counts.append(c)
            if return_attn:
                attn.append({"layer": layer, "pass": pass_, "probs": probs})
        n = len(self.schedule)
        x = self.norm(x)
        head_w = self.lm_head.weight if self.lm_head is not None else self.embed.weight

        logits = per_token = loss = None
        # chunked unless switched off, or asked for per-token losses with a graph (they carry none)
        chunked = targets is not None and self.ce_chunk and not (
            return_per_token_loss and torch.is_grad_enabled())
        if chunked:
            total, flat = chunked_cross_entropy(x.reshape(B * T, -1), head_w, targets.reshape(B * T),
                                                self.ce_chunk, IGNORE_INDEX)
            loss = total / (targets != IGNORE_INDEX).sum()
        else:
            logits = self.lm_head(x) if self.lm_head is not None else F.linear(x, self.embed.weight)
            if targets is not None:
                flat = F.cross_entropy(
                    logits.view(B * T, -1).float(),
                    targets.reshape(B * T),
                    ignore_index=IGNORE_INDEX,
                    reduction="none",
                )
                loss = flat.sum() / (targets != IGNORE_INDEX).sum()
        if targets is not None and return_per_token_loss:
            per_token = flat.view(B, T)
        return ModelOutput(
            _logits=logits,
            _head=(x, head_w) if chunked else None,
            loss=loss,
            aux_loss=aux_total / n,
            z_loss=z_total / n,
            per_token_loss=per_token,
            attn=attn,
            expert_counts=torch.stack(counts).detach(),
        )
