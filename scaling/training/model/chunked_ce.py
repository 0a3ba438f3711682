"""Chunked cross-entropy of the LM head: the [N, V] fp32 logits never exist whole.

``chunked_cross_entropy(h, W, targets, chunk)`` returns the *sum* over valid targets of
``logsumexp(h W^T) - (h W^T)[target]`` (the model divides by the number of valid targets) and
the per-token losses (0 where ``target == ignore_index``; not differentiable).

How: one custom autograd function. Its forward walks the tokens in chunks of ``chunk`` rows;
per chunk it forms the chunk's logits in the compute dtype, upcasts them to fp32 (as the plain
path's ``logits.float()`` does), takes the log-sum-exp, and, when a gradient is wanted, turns
the same buffer in place into d loss_sum / d logits = softmax - onehot(target) (zero rows for
ignored targets; Goodfellow et al. 2016, eq. 6.30), from which it computes the chunk's input
gradient ``g W`` and adds ``g^T h`` to an fp32 weight-gradient accumulator. The backward only
scales the two saved gradients by the incoming scalar gradient. So what is saved for the
backward is the input gradient [N, d] (in h's dtype) and the weight gradient [V, d] (fp32) --
never an [N, V] tensor -- and no extra matmul is run (``torch.utils.checkpoint`` per chunk
would recompute the logits: +2 d V FLOPs per token). torchtitan's chunked loss wrapper and
Liger-Kernel's fused linear cross-entropy take the same forward-computes-gradients route.

Peak transient memory: one chunk's fp32 logits (reused in place for the softmax gradient) plus
its copy in the compute dtype when that is narrower: ``chunk * V * (4 + c)`` bytes at most.
The default chunk keeps the fp32 buffer near ``CHUNK_ELEMENTS`` elements.

Rounding: the weight gradient sums per-chunk products in fp32, so it differs from the one-matmul
gradient only in summation order (~1e-7 relative in fp32, tests/test_chunked_ce.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

CHUNK_ELEMENTS = 1 << 24  # fp32 logits per chunk: 64 MiB


def default_chunk(vocab_size: int) -> int:
    """Tokens per chunk: CHUNK_ELEMENTS // V (at least 1); 512 tokens at V = 32,768."""
    return max(1, CHUNK_ELEMENTS // max(1, vocab_size))


class _ChunkedCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, targets: Tensor, chunk: int, ignore_index: int):
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        N = h.shape[0]
        w = weight.to(h.dtype)  # the compute-dtype head, as F.linear under autocast would use
        per_token = torch.zeros(N, dtype=torch.float32, device=h.device)
        grad_h = torch.empty_like(h) if want_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=h.device) if want_w else None
        with torch.autocast(h.device.type, enabled=False):
            for start in range(0, N, chunk):
                stop = min(N, start + chunk)
                hc, tc = h[start:stop], targets[start:stop]
                logits = (hc @ w.t()).float()  # [C, V] fp32
                valid = tc != ignore_index
                safe = tc.clamp(min=0).unsqueeze(1)
                lse = torch.logsumexp(logits, dim=-1)
                picked = logits.gather(1, safe).squeeze(1)
                per_token[start:stop] = torch.where(valid, lse - picked, 0.0)
                if not (want_h or want_w):
                    continue
                g = logits.sub_(lse.unsqueeze(1)).exp_()  # softmax, in the logits' buffer
                g.scatter_add_(1, safe, torch.full_like(picked, -1.0).unsqueeze(1))
                g.mul_(valid.unsqueeze(1))  # ignored targets contribute nothing
                gc = g.to(h.dtype)
                if want_h:
                    grad_h[start:stop] = gc @ w
                if want_w:
                    grad_w.add_((gc.t() @ hc).float())
                del logits, g, gc
        ctx.weight_dtype = weight.dtype
        ctx.save_for_backward(grad_h, grad_w)
        ctx.mark_non_differentiable(per_token)
        return per_token.sum(), per_token

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_per_token):
        grad_h, grad_w = ctx.saved_tensors
        gh = None if grad_h is None else grad_h * grad_loss.to(grad_h.dtype)
        gw = None if grad_w is None else (grad_w * grad_loss.float()).to(ctx.weight_dtype)
        return gh, gw, None, None, None


def chunked_cross_entropy(h: Tensor, weight: Tensor, targets: Tensor, chunk: int,
                          ignore_index: int = -100) -> tuple[Tensor, Tensor]:
    """(sum of CE over valid targets, per-token CE [N] fp32) for hidden ``h`` [N, d], head ``weight``
    [V, d] and ``targets`` [N], ``chunk`` tokens at a time (see the module docstring)."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    return _ChunkedCE.apply(h, weight, targets, int(chunk), int(ignore_index))
