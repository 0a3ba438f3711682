"""Paths for GPU speed, checked for exactness on the CPU: SDPA at a head size padded to a multiple
of 8 (so cuDNN's attention kernel may take it on CUDA) is the same function as the unpadded
attention, forward and gradients, in one graph; the benchmark's device-side init draws the eager
init's distributions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from scaling.accounting.config import ModelConfig
from scaling.training.model.transformer import MoETransformer, sdpa_head_size

torch.set_num_threads(1)


def test_the_padded_head_size():
    assert sdpa_head_size(37, "cpu") == 37                # auto: the CPU kernels take any size
    assert sdpa_head_size(37, "cuda") == 40
    assert sdpa_head_size(43, "cuda") == 48 and sdpa_head_size(53, "cuda") == 56
    assert sdpa_head_size(56, "cuda") == 56               # the Baselines' sizes are left alone
    assert sdpa_head_size(37, "cuda", "never") == 37
    assert sdpa_head_size(37, "cpu", "always") == 40
    with pytest.raises(ValueError, match="head padding"):
        sdpa_head_size(37, "cuda", "sometimes")


def _smelt(head_dim: int) -> ModelConfig:
    # an odd head size with odd RoPE split (rotary_dim = h - 1), GQA and the loop, as the twins have
    return ModelConfig(vocab_size=97, d_model=24, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=head_dim,
                       n_experts=4, top_k=2, expert_hidden=16, seq_len=24, loop_start=1, loop_end=3,
                       n_loops=2)


def _loss_and_grads(model: MoETransformer, x: torch.Tensor):
    model.zero_grad(set_to_none=True)
    out = model(x, x)
    (out.loss + 0.01 * out.aux_loss + 1e-3 * out.z_loss).backward()
    return out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("head_dim", [13, 37])
def test_padded_attention_is_the_same_function(head_dim):
    cfg = _smelt(head_dim)
    model = MoETransformer(cfg, seed=3)
    x = torch.randint(0, cfg.vocab_size, (3, cfg.seq_len), generator=torch.Generator().manual_seed(1))
    model.set_head_padding("never")
    loss, grads = _loss_and_grads(model, x)
    model.set_head_padding("always")
    padded_loss, padded_grads = _loss_and_grads(model, x)
    assert torch.allclose(padded_loss, loss, rtol=1e-6, atol=0)
    for name, g in grads.items():
        assert torch.allclose(padded_grads[name], g, rtol=1e-5, atol=1e-7), name
    # (SDPA's default scale, 1/sqrt of the padded size, fails the comparisons above: checked)
    attn = model.layers[0].attn
    assert attn.head_padding == "always"
    with pytest.raises(ValueError):
        model.set_head_padding("on")


def test_padded_attention_is_one_graph():
    cfg = _smelt(13)
    model = MoETransformer(cfg)
    model.set_head_padding("always")
    x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(x, x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def test_device_init_is_the_exact_init_drawn_where_the_model_lives():
    """build_model(init="device") (benchmarks only): the eager init's distributions drawn with the
    device's generator; on the CPU that is the exact init bitwise, also on the meta-built path."""
    from scaling.accounting.tiers import get_config
    from scaling.training.parallel.data_parallel import build_model
    from scaling.training.parallel.distributed import setup_distributed

    cfg = get_config("proxy-l", "smelt")
    dist = setup_distributed("cpu", "none")
    fast = build_model(cfg, 0, dist, "none", init="device")
    exact = MoETransformer(cfg, seed=0)
    assert all(torch.equal(p, q) for p, q in zip(fast.parameters(), exact.parameters()))
    with pytest.raises(Exception, match="init must be one of"):
        build_model(cfg, 0, dist, "none", init="fast")


def test_the_trainer_takes_head_padding_as_a_run_setting(tmp_path, monkeypatch):
    """`train --head-padding` (an escape hatch should cuDNN misbehave on some GPU): recorded in the
    run's config, free to change on resume, and the same training to float rounding."""
    from scaling.training import runlog
    from scaling.training.loop.trainer import RESUME_FREE, TrainConfig, train

    monkeypatch.setenv("SMELT_CACHE", str(tmp_path / "cache"))
    cfg = _smelt(13).replace(seq_len=64, vocab_size=4096)
    losses, sizes = {}, []
    sdpa = F.scaled_dot_product_attention

    def spy(q, *a, **kw):  # the head size SDPA really ran at
        sizes.append(q.shape[-1])
        return sdpa(q, *a, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    for padding in ("never", "always"):
        sizes.clear()
        tc = TrainConfig(tokens=(6 * 4 * 64,), batch_size=4, data_max_bytes=50_000, eval_every=0,
                         threads=1, val_windows=8, warmup=2, head_padding=padding)
        doc = train(cfg, tc, tier="custom", run_name=padding, runs_dir=tmp_path / "runs")
        losses[padding] = doc["points"][0]["loss"]
        meta = runlog.read_json(tmp_path / "runs" / padding / "config.json")
        assert meta["train"]["head_padding"] == padding
        assert set(sizes) == {13 if padding == "never" else 16}
    assert losses["always"] == pytest.approx(losses["never"], rel=1e-5)
    assert "head_padding" in RESUME_FREE
    with pytest.raises(Exception, match="head_padding"):
        TrainConfig(tokens=(1024,), head_padding="sometimes")


# ----- mixed precision: the router's GEMM and the dispatch's dtype ---------------------------


def _bf16_values(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).bfloat16().float()


@pytest.mark.parametrize("operands", ["bf16", "fp32"])
def test_the_router_gemm_is_the_fp32_gemm_of_the_bf16_values(operands):
    """Under bf16 mixed precision the logits are sum_j bf16(x)_ij bf16(w)_ej in fp32 and each input
    gradient is the fp32-accumulated GEMM of the bf16-rounded output gradient, rounded to bf16
    (as an autocast matmul's input gradients are) and returned in the input's dtype. ``bf16``:
    the FSDP2 case (operands already bf16: the forward is the fp32 GEMM it replaced, the
    backward now rounds the logits' gradient to bf16); ``fp32``: autocast on one GPU (fp32 norm
    output and master weight, rounded as autocast rounds every other weight and input)."""
    from scaling.training.model.transformer import router_logits

    dtype = torch.bfloat16 if operands == "bf16" else torch.float32
    x0 = torch.randn(40, 24, generator=torch.Generator().manual_seed(0)).to(dtype)
    w0 = torch.randn(9, 24, generator=torch.Generator().manual_seed(1)).to(dtype)
    g = torch.randn(40, 9, generator=torch.Generator().manual_seed(2))
    x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = router_logits(x, w)
    assert logits.dtype == torch.float32
    logits.backward(g)
    xb, wb, gb = x0.bfloat16().float(), w0.bfloat16().float(), g.bfloat16().float()
    torch.testing.assert_close(logits, xb @ wb.t(), rtol=1e-6, atol=1e-6)
    assert x.grad.dtype == dtype and w.grad.dtype == dtype
    torch.testing.assert_close(x.grad, (gb @ wb).bfloat16().to(dtype), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(w.grad, (gb.t() @ xb).bfloat16().to(dtype), rtol=1e-6, atol=1e-6)
    if operands == "bf16":  # the previous fp32 path, on the same bf16 values
        ref = F.linear(x0.float(), w0.float())
        torch.testing.assert_close(logits, ref, rtol=1e-6, atol=1e-6)
    # fp32 training (the CPU proxies) keeps the fp32 GEMM, bitwise
    x32, w32 = x0.float().requires_grad_(), w0.float()
    assert torch.equal(router_logits(x32, w32), F.linear(x32, w32))


def test_dispatch_in_the_experts_dtype_is_gather_then_cast():
    """Cast N rows before the gather, not N*k after it: the same rows, bitwise, and the gradient
    (k bf16 row gradients summed with fp32 accumulation) equal to the cast-then-sum it replaces."""
    from scaling.training.model.transformer import dispatch, expert_histogram, sort_by_expert

    N, k, E, d = 12, 3, 5, 8
    gen = torch.Generator().manual_seed(0)
    top_i = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(N)])
    order, inverse, _ = sort_by_expert(top_i, expert_histogram(top_i, E).sum(0))
    x0 = torch.randn(N, d, generator=gen)
    g = torch.randn(N * k, d, generator=gen).bfloat16()
    new, old = x0.clone().requires_grad_(), x0.clone().requires_grad_()
    xs = dispatch(new, order, inverse, k, torch.bfloat16)
    ref = old.index_select(0, torch.div(order, k, rounding_mode="floor")).bfloat16()
    assert xs.dtype == torch.bfloat16 and torch.equal(xs, ref)
    xs.backward(g)
    ref.backward(g)
    assert new.grad.dtype == torch.float32
    torch.testing.assert_close(new.grad, old.grad, rtol=1e-6, atol=1e-7)


def test_a_mixed_precision_model_dispatches_in_bf16_with_the_same_result(monkeypatch):
    """The CUDA policy (bf16 experts under autocast over fp32 weights) on the CPU: a SMELT model's
    loss and every gradient equal those of the path that gathers fp32 rows and casts them."""
    from scaling.training.model import transformer

    monkeypatch.setattr(transformer.MoE, "_grouped_dtype",
                        lambda self, xs: transformer.compute_dtype(xs))
    cfg = _smelt(16)
    model = MoETransformer(cfg, seed=5)
    x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len), generator=torch.Generator().manual_seed(2))
    seen = []
    real = transformer._Dispatch.apply

    def gather_then_cast(x, order, inverse, k, dtype=None):
        return real(x, order, inverse, k, x.dtype).to(dtype)

    def spy(x, order, inverse, k, dtype=None):
        seen.append((x.dtype, dtype))
        return real(x, order, inverse, k, dtype)

    results = {}
    for name, fn in (("cast first", spy), ("gather first", gather_then_cast)):
        monkeypatch.setattr(transformer, "dispatch", fn)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            results[name] = _loss_and_grads(model, x)
    assert set(seen) == {(torch.float32, torch.bfloat16)}  # fp32 residual, bf16 rows
    (loss, grads), (ref_loss, ref_grads) = results["cast first"], results["gather first"]
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=0)
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("arch", ["baseline", "smelt"])
def test_the_mixed_precision_forward_is_one_graph(arch, monkeypatch):
    """Under bf16 autocast with the CUDA expert policy, the router's custom op and the bf16
    dispatch keep the forward one graph (no break at the new op)."""
    from scaling.accounting.tiers import get_config
    from scaling.training.model import transformer

    monkeypatch.setattr(transformer.MoE, "_grouped_dtype",
                        lambda self, xs: transformer.compute_dtype(xs))
    cfg = get_config("proxy-xxs", arch).replace(seq_len=32)
    model = MoETransformer(cfg)
    x = torch.randint(0, cfg.vocab_size, (2, 32))
    torch._dynamo.reset()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        explained = torch._dynamo.explain(model)(x, x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
