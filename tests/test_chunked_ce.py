"""Chunked cross-entropy: the same loss and gradients as F.cross_entropy, and no [N, V] tensor saved."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from scaling.accounting.tiers import get_config
from scaling.training.model.chunked_ce import chunked_cross_entropy, default_chunk
from scaling.training.model.transformer import MoETransformer


def _data(N=300, d=24, V=97, seed=0):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(N, d, generator=gen, dtype=torch.float64).float().requires_grad_()
    w = (0.3 * torch.randn(V, d, generator=gen)).requires_grad_()
    t = torch.randint(0, V, (N,), generator=gen)
    t[::7] = -100
    return h, w, t


@pytest.mark.parametrize("chunk", [1, 7, 64, 300, 1000])
def test_loss_and_grads_equal_plain_cross_entropy(chunk):
    h, w, t = _data()
    ref = F.cross_entropy(h @ w.t(), t, ignore_index=-100)
    gh_ref, gw_ref = torch.autograd.grad(3.0 * ref, (h, w))
    total, per_token = chunked_cross_entropy(h, w, t, chunk)
    loss = total / (t != -100).sum()
    gh, gw = torch.autograd.grad(3.0 * loss, (h, w))
    assert abs(loss.item() - ref.item()) <= 1e-6 * abs(ref.item())
    assert (gh - gh_ref).abs().max().item() <= 1e-6 * gh_ref.abs().max().item()
    assert (gw - gw_ref).abs().max().item() <= 1e-6 * gw_ref.abs().max().item()
    assert (per_token[t == -100] == 0).all()
    assert not per_token.requires_grad


def test_model_loss_and_grads_chunked_vs_plain():
    cfg = get_config("proxy-tiny", "smelt")
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, cfg.vocab_size, (3, cfg.seq_len), generator=gen)
    y = torch.randint(0, cfg.vocab_size, (3, cfg.seq_len), generator=gen)
    y[0, :9] = -100
    results = []
    for chunk in (0, 50):  # 0: plain F.cross_entropy over the whole logits
        model = MoETransformer(cfg, seed=2)
        model.ce_chunk = chunk
        out = model(x, y)
        (out.loss + 0.01 * out.aux_loss).backward()
        results.append((out.loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()},
                        out.logits.detach()))
    (la, ga, lga), (lb, gb, lgb) = results
    assert lb == pytest.approx(la, rel=1e-6)
    for n in ga:
        scale = ga[n].abs().max().item()
        assert (gb[n] - ga[n]).abs().max().item() <= 1e-6 * scale + 1e-12, n
    torch.testing.assert_close(lgb, lga)  # logits on demand equal the materialised ones


def test_no_saved_tensor_has_vocab_times_tokens_elements():
    """saved_tensors_hooks sees every tensor autograd saves: with the chunked loss none has N*V
    elements or more (the plain path saves the logits' log-softmax, which has)."""
    cfg = get_config("proxy-tiny", "baseline")
    B = 4
    N, V = B * cfg.seq_len, cfg.vocab_size
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, V, (B, cfg.seq_len), generator=gen)
    sizes = {}
    for chunk in (0, default_chunk(V), 16):
        model = MoETransformer(cfg)
        model.ce_chunk = chunk
        seen = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: seen.append(t.numel()) or t, lambda t: t):
            out = model(x, x)
        out.loss.backward()
        sizes[chunk] = max(seen)
    assert sizes[0] >= N * V  # the check can fail: the plain path does save [N, V]
    assert sizes[default_chunk(V)] < N * V and sizes[16] < N * V


def test_no_grad_path_and_per_token_loss():
    cfg = get_config("proxy-tiny", "baseline")
    model = MoETransformer(cfg)
    x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    with torch.no_grad():
        a = model(x, x, return_per_token_loss=True)
        model.ce_chunk = 0
        b = model(x, x, return_per_token_loss=True)
    torch.testing.assert_close(a.per_token_loss, b.per_token_loss)
    with pytest.raises(ValueError):
        chunked_cross_entropy(torch.zeros(2, 3), torch.zeros(4, 3), torch.zeros(2, dtype=torch.long), 0)
