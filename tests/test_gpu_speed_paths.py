"""Paths for GPU speed, checked for exactness on the CPU: SDPA at a head size padded to a multiple
of 8 (so cuDNN's attention kernel may take it on CUDA) is the same function as the unpadded
attention, forward and gradients, in one graph; the benchmark's device-side init draws the eager
init's distributions."""

from __future__ import annotations

import pytest
import torch

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
    import torch.nn.functional as F

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
