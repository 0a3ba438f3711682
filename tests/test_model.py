"""The torch model: exact parameter count, causality, the SMELT loop, attention probabilities,
batched expert dispatch against a per-token reference, losses, determinism."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from scaling.accounting import costs
from scaling.accounting.config import ModelConfig
from scaling.training.model.transformer import MoE, MoETransformer, apply_rope, rope_tables

torch.set_num_threads(1)


def tiny(**kw) -> ModelConfig:
    base = dict(vocab_size=97, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8,
                n_experts=4, top_k=2, expert_hidden=24, seq_len=16)
    base.update(kw)
    return ModelConfig(**base)


CONFIGS = {
    "plain": tiny(),
    "tied": tiny(tie_embeddings=True),
    "shared": tiny(shared_expert_hidden=12),
    "looped": tiny(n_layers=4, loop_start=1, loop_end=3, n_loops=2),
    "looped3_noscale": tiny(n_layers=4, loop_start=1, loop_end=3, n_loops=3, loop_residual_scale=False),
    "odd_head_dim": tiny(head_dim=7, d_model=27, expert_hidden=55, n_experts=5, top_k=3),
    "mha_top1": tiny(n_kv_heads=4, top_k=1),
    "smelt_all": tiny(n_layers=4, loop_start=0, loop_end=4, n_loops=2, shared_expert_hidden=8,
                      tie_embeddings=True, head_dim=5),
}


def ids(cfg: ModelConfig, B: int = 2, T: int | None = None, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.vocab_size, (B, T or cfg.seq_len), generator=g)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_param_count_equals_budget(name):
    cfg = CONFIGS[name]
    model = MoETransformer(cfg)
    assert model.num_params() == costs.total_params(cfg)
    assert model.num_params() == sum(p.numel() for p in model.parameters())
    assert model.num_params(non_embedding=True) == costs.non_embedding_params(cfg)


def test_param_count_of_proxy_tiers():
    tiers = pytest.importorskip("scaling.accounting.tiers")
    for arch in tiers.ARCHS:
        cfg = tiers.get_config("proxy-tiny", arch)
        assert MoETransformer(cfg).num_params() == costs.total_params(cfg)


def test_no_biases_and_nonpersistent_rope():
    model = MoETransformer(CONFIGS["shared"])
    assert not any(name.endswith("bias") for name, _ in model.named_parameters())
    assert "rope_cos" not in model.state_dict() and "rope_sin" not in model.state_dict()


@pytest.mark.parametrize("name", ["looped", "odd_head_dim", "smelt_all"])
def test_causal(name):
    cfg = CONFIGS[name]
    model = MoETransformer(cfg).eval()
    a = ids(cfg)
    b = a.clone()
    t = 9
    b[:, t] = (b[:, t] + 1) % cfg.vocab_size
    with torch.no_grad():
        la, lb = model(a).logits, model(b).logits
    torch.testing.assert_close(la[:, :t], lb[:, :t], rtol=0, atol=1e-6)
    assert (la[:, t] - lb[:, t]).abs().max() > 1e-4


def test_schedule_and_attention_passes():
    cfg = CONFIGS["looped"]
    model = MoETransformer(cfg)
    out = model(ids(cfg), return_attn=True)
    seen = [(a["layer"], a["pass"]) for a in out.attn]
    assert seen == cfg.schedule() == [(0, 1), (1, 1), (2, 1), (1, 2), (2, 2), (3, 1)]
    assert out.expert_counts.shape == (cfg.n_layer_passes, cfg.n_experts)
    # the second pass sees a different residual stream: its own K/V, its own attention
    p11 = out.attn[1]["probs"]
    p12 = out.attn[3]["probs"]
    assert (p11 - p12).abs().max() > 1e-4


def _unrolled(cfg: ModelConfig, looped: MoETransformer) -> MoETransformer:
    """An unlooped model whose layers are copies of the looped one's in schedule order, with the
    residual scale folded into the output projections (each branch is linear in them)."""
    flat = cfg.replace(n_layers=cfg.n_layer_passes, loop_start=0, loop_end=0, n_loops=1)
    unrolled = MoETransformer(flat)
    sd = {k: v for k, v in looped.state_dict().items() if not k.startswith("layers.")}
    for i, (layer, _) in enumerate(cfg.schedule()):
        s = cfg.residual_scale(layer)
        for k, v in looped.layers[layer].state_dict().items():
            scaled = k.endswith(("wo.weight", "w_down", "shared_down.weight"))
            sd[f"layers.{i}.{k}"] = v * s if scaled else v
    unrolled.load_state_dict(sd)
    return unrolled


@pytest.mark.parametrize("name", ["looped", "looped3_noscale", "smelt_all"])
def test_loop_equals_unrolled_copies(name):
    cfg = CONFIGS[name]
    looped = MoETransformer(cfg, seed=3)
    unrolled = _unrolled(cfg, looped)
    x = ids(cfg)
    with torch.no_grad():
        a, b = looped(x, x), unrolled(x, x)
    torch.testing.assert_close(a.logits, b.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.aux_loss, b.aux_loss)
    torch.testing.assert_close(a.expert_counts, b.expert_counts)


def test_residual_scale_changes_output():
    on = MoETransformer(CONFIGS["looped"], seed=1)
    off = MoETransformer(CONFIGS["looped"].replace(loop_residual_scale=False), seed=1)
    x = ids(CONFIGS["looped"])
    with torch.no_grad():
        assert (on(x).logits - off(x).logits).abs().max() > 1e-4


@pytest.mark.parametrize("name", ["looped", "odd_head_dim", "mha_top1"])
def test_return_attn_probs(name):
    cfg = CONFIGS[name]
    model = MoETransformer(cfg)
    x = ids(cfg)
    with torch.no_grad():
        fast = model(x)
        slow = model(x, return_attn=True)
    assert fast.attn is None
    torch.testing.assert_close(slow.logits, fast.logits, rtol=1e-5, atol=1e-5)
    T = cfg.seq_len
    for entry in slow.attn:
        p = entry["probs"]
        assert p.shape == (2, cfg.n_heads, T, T)
        torch.testing.assert_close(p.sum(-1), torch.ones(2, cfg.n_heads, T))
        assert p.triu(1).abs().max() == 0


# ----- expert dispatch against a per-token reference ---------------------------------------

def naive_moe(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """Per-token, per-slot loop over the routed experts: the definition of the MoE output."""
    flat = x.reshape(-1, x.shape[-1])
    f = moe.hidden
    _, _, top_i, gates = moe.route(flat)
    rows = []
    for n in range(flat.shape[0]):
        y = torch.zeros_like(flat[n])
        for j in range(moe.top_k):
            e = int(top_i[n, j])
            h = flat[n] @ moe.w_gate_up[e]
            y = y + gates[n, j] * ((F.silu(h[:f]) * h[f:]) @ moe.w_down[e])
        if moe.shared_gate_up is not None:
            g, u = moe.shared_gate_up(flat[n]).chunk(2)
            y = y + moe.shared_down(F.silu(g) * u)
        rows.append(y)
    return torch.stack(rows).view_as(x)


def _grads(moe: MoE, x: torch.Tensor, fn, w: torch.Tensor):
    moe.zero_grad()
    x = x.clone().requires_grad_()
    y = fn(x)
    (y * w).sum().backward()
    return y.detach(), x.grad, {k: p.grad.clone() for k, p in moe.named_parameters()}


def _assert_matches_naive(moe, x, w):
    """Batched dispatch equals the per-token reference in output, input and weight gradients."""
    y, gx, gp = _grads(moe, x, lambda t: moe(t)[0], w)
    y_ref, gx_ref, gp_ref = _grads(moe, x, lambda t: naive_moe(moe, t), w)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gx, gx_ref, rtol=1e-5, atol=1e-5)
    for k in gp_ref:
        torch.testing.assert_close(gp[k], gp_ref[k], rtol=1e-5, atol=1e-5, msg=k)


@pytest.mark.parametrize("dispatch", ["grouped_mm", "loop"])
@pytest.mark.parametrize("shared", [0, 8])
def test_batched_dispatch_matches_per_token_reference(dispatch, shared):
    if dispatch == "grouped_mm" and not hasattr(F, "grouped_mm"):
        pytest.skip("this torch has no F.grouped_mm")
    cfg = tiny(d_model=16, expert_hidden=12, n_experts=5, top_k=2, shared_expert_hidden=shared)
    torch.manual_seed(0)
    moe = MoE(cfg)
    torch.nn.init.normal_(moe.w_gate_up, std=0.3)
    torch.nn.init.normal_(moe.w_down, std=0.3)
    torch.nn.init.normal_(moe.router.weight, std=1.0)
    moe.dispatch = dispatch
    x = torch.randn(3, 7, 16)
    w = torch.randn(3, 7, 16)
    _assert_matches_naive(moe, x, w)


@pytest.mark.parametrize("dispatch", ["grouped_mm", "loop"])
def test_unaligned_sizes_match_reference(dispatch):
    """Odd d and f (grouped_mm zero-pads them to multiples of 4): still exact."""
    if dispatch == "grouped_mm" and not hasattr(F, "grouped_mm"):
        pytest.skip("this torch has no F.grouped_mm")
    cfg = tiny(d_model=27, expert_hidden=55, n_experts=3, top_k=2)
    torch.manual_seed(2)
    moe = MoE(cfg)
    for p in (moe.w_gate_up, moe.w_down, moe.router.weight):
        torch.nn.init.normal_(p, std=0.3)
    moe.dispatch = dispatch
    x, w = torch.randn(2, 9, 27), torch.randn(2, 9, 27)
    _assert_matches_naive(moe, x, w)


@pytest.mark.parametrize("dispatch", ["grouped_mm", "loop"])
def test_no_dropped_tokens_under_collapsed_routing(dispatch):
    """All tokens routed to the same two experts: every assignment is still computed."""
    if dispatch == "grouped_mm" and not hasattr(F, "grouped_mm"):
        pytest.skip("this torch has no F.grouped_mm")
    cfg = tiny(d_model=16, expert_hidden=12, n_experts=4, top_k=2)
    torch.manual_seed(1)
    moe = MoE(cfg)
    torch.nn.init.normal_(moe.w_gate_up, std=0.3)
    torch.nn.init.normal_(moe.w_down, std=0.3)
    moe.dispatch = dispatch
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[2, 0] = 50.0
        moe.router.weight[0, 0] = 40.0
        x = torch.randn(2, 16, 16)
        x[..., 0] = x[..., 0].abs() + 1.0  # logits of experts 2 and 0 dominate for every token
        y, aux, _, counts = moe(x)
        assert counts.tolist() == [32, 0, 32, 0]
        torch.testing.assert_close(y, naive_moe(moe, x), rtol=1e-5, atol=1e-5)
        assert (y.abs().sum(-1) > 0).all()
        assert aux > 1.9  # collapsed: E * (1 * P_0 + 1 * P_2) ~ 4 * 1 * ~1 >> k = 2 at balance


def test_expert_counts_sum_to_assignments():
    cfg = CONFIGS["looped"]
    out = MoETransformer(cfg)(ids(cfg, B=3))
    assert (out.expert_counts.sum(1) == 3 * cfg.seq_len * cfg.top_k).all()


# ----- losses ---------------------------------------------------------------------------

def test_loss_ignores_minus_100_and_per_token():
    cfg = CONFIGS["plain"]
    model = MoETransformer(cfg)
    x = ids(cfg)
    targets = ids(cfg, seed=1)
    targets[0, :5] = -100
    out = model(x, targets, return_per_token_loss=True)
    ref = F.cross_entropy(out.logits.reshape(-1, cfg.vocab_size), targets.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss, ref)
    assert out.per_token_loss.shape == targets.shape
    assert (out.per_token_loss[0, :5] == 0).all()
    torch.testing.assert_close(out.per_token_loss[targets != -100].mean(), out.loss)
    assert model(x).loss is None and model(x, targets).per_token_loss is None


def test_uniform_router_losses():
    """Zero router: P_e = 1/E and sum_e f_e = k, so aux = k exactly; z = log(E)^2."""
    cfg = CONFIGS["looped"]
    model = MoETransformer(cfg)
    with torch.no_grad():
        for layer in model.layers:
            layer.moe.router.weight.zero_()
        out = model(ids(cfg))
    torch.testing.assert_close(out.aux_loss, torch.tensor(float(cfg.top_k)))
    torch.testing.assert_close(out.z_loss, torch.tensor(math.log(cfg.n_experts) ** 2))


def test_aux_and_z_losses_have_router_gradients():
    cfg = CONFIGS["plain"]
    model = MoETransformer(cfg)
    out = model(ids(cfg))
    (out.aux_loss + out.z_loss).backward()
    for layer in model.layers:
        assert layer.moe.router.weight.grad.abs().sum() > 0


# ----- RoPE -----------------------------------------------------------------------------

@pytest.mark.parametrize("head_dim", [8, 7])
def test_rope_is_relative(head_dim):
    """<rope(q, m), rope(k, n)> depends on m - n only; odd tails pass through; norms kept."""
    rd = head_dim - head_dim % 2
    cos, sin = rope_tables(rd, 32, 10000.0)
    q, k = torch.randn(head_dim, dtype=torch.float32), torch.randn(head_dim)
    Q = apply_rope(q.expand(32, head_dim), cos, sin)
    K = apply_rope(k.expand(32, head_dim), cos, sin)
    torch.testing.assert_close(Q[5] @ K[2], Q[25] @ K[22], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(Q.norm(dim=-1), q.norm().expand(32), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(Q[0], q)
    if head_dim % 2:
        assert (Q[:, -1] == q[-1]).all()


def test_longer_than_seq_len():
    cfg = CONFIGS["plain"]
    model = MoETransformer(cfg)
    x = ids(cfg, T=2 * cfg.seq_len)
    with torch.no_grad():
        long, short = model(x).logits, model(x[:, : cfg.seq_len]).logits
    torch.testing.assert_close(long[:, : cfg.seq_len], short, rtol=1e-5, atol=1e-5)


# ----- initialisation and determinism ----------------------------------------------------

def test_init_statistics():
    cfg = tiny(d_model=64, expert_hidden=64, vocab_size=512, n_layers=2)
    model = MoETransformer(cfg, seed=0)
    assert abs(model.embed.weight.std().item() - 0.02) < 1e-3
    assert abs(model.layers[0].moe.w_gate_up.std().item() - 0.02) < 1e-3
    assert abs(model.layers[0].moe.w_down.std().item() - 0.02 / math.sqrt(2 * cfg.n_layers)) < 1e-3
    assert (model.layers[1].attn_norm.weight == 1).all() and (model.norm.weight == 1).all()


def test_seeded_determinism():
    cfg = CONFIGS["smelt_all"]
    x, y = ids(cfg), ids(cfg, seed=1)

    def run(seed):
        model = MoETransformer(cfg, seed=seed)
        out = model(x, y)
        (out.loss + 0.01 * out.aux_loss + 0.001 * out.z_loss).backward()
        return out.loss.detach(), [p.grad.clone() for p in model.parameters()]

    (l1, g1), (l2, g2), (l3, _) = run(7), run(7), run(8)
    assert torch.equal(l1, l2) and all(torch.equal(a, b) for a, b in zip(g1, g2))
    assert not torch.equal(l1, l3)
    m1, m2 = MoETransformer(cfg, seed=7), MoETransformer(cfg)
    m2.init_weights(7)
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))


@pytest.mark.slow
def test_compiles_fullgraph_and_matches_eager():
    """torch.compile(fullgraph=True) works (grouped_mm is a custom op) and gives the same step."""
    cfg = CONFIGS["smelt_all"]
    x, y = ids(cfg), ids(cfg, seed=1)
    eager, compiled = MoETransformer(cfg, seed=2), MoETransformer(cfg, seed=2)
    fn = torch.compile(compiled, fullgraph=True)
    a, b = eager(x, y), fn(x, y)
    (a.loss + a.aux_loss).backward()
    (b.loss + b.aux_loss).backward()
    torch.testing.assert_close(a.logits, b.logits, rtol=1e-4, atol=1e-5)
    for p, q in zip(eager.parameters(), compiled.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-6)
