"""The sync-free MoE layer (issue 31): dispatch/combine equal the previous bincount + index_add_
implementation in output and gradients (fp32, 1e-6), with empty experts; no host sync and no
graph break in the model's forward; the load-balance loss is per sequence, so the objective
does not depend on how a batch is split into micro-batches or ranks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from scaling.accounting.config import ModelConfig
from scaling.training.model.transformer import (
    MoE,
    MoETransformer,
    combine,
    dispatch,
    expert_histogram,
    load_balance_loss,
    sort_by_expert,
)

torch.set_num_threads(1)


def tiny(**kw) -> ModelConfig:
    base = dict(vocab_size=97, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=8,
                n_experts=5, top_k=2, expert_hidden=12, seq_len=16)
    base.update(kw)
    return ModelConfig(**base)


def legacy_forward(moe: MoE, x: torch.Tensor):
    """The layer as it was before issue 31 (bincount, sorted gating, index_add_ combine; the
    load-balance statistics over the whole input): the reference the new layer must equal."""
    shape = x.shape
    x = x.reshape(-1, shape[-1])
    N, E, k = x.shape[0], moe.n_experts, moe.top_k
    logits, probs, top_i, gates = moe.route(x)
    flat_e = top_i.reshape(-1)
    order = torch.argsort(flat_e, stable=True)
    token = torch.div(order, k, rounding_mode="floor")
    counts = torch.bincount(flat_e, minlength=E)
    xs = x.index_select(0, token)
    ys = moe.experts(xs, counts.cumsum(0).to(torch.int32), counts)
    ys = ys * gates.reshape(-1).index_select(0, order).unsqueeze(1).to(ys.dtype)
    y = torch.zeros_like(x).index_add_(0, token, ys)
    if moe.shared_gate_up is not None:
        g, u = moe.shared_gate_up(x).chunk(2, dim=-1)
        y = y + moe.shared_down(F.silu(g) * u)
    aux = E * torch.sum(counts.to(probs.dtype) / N * probs.mean(dim=0))
    z = torch.logsumexp(logits, dim=-1).square().mean()
    return y.view(shape), aux, z, counts


def _moe(cfg: ModelConfig, seed: int, dispatch_mode: str) -> MoE:
    torch.manual_seed(seed)
    moe = MoE(cfg)
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.3)
    torch.nn.init.normal_(moe.router.weight, std=1.0)
    moe.dispatch = dispatch_mode
    return moe


def _run(moe: MoE, fn, x: torch.Tensor, w: torch.Tensor):
    moe.zero_grad()
    x = x.clone().requires_grad_()
    y, aux, z, counts = fn(moe, x)
    ((y * w).sum() + aux + z).backward()
    return [y.detach(), aux.detach(), z.detach(), counts, x.grad] + [p.grad.clone() for p in moe.parameters()]


DISPATCH = [d for d in ("grouped_mm", "loop") if d == "loop" or hasattr(F, "grouped_mm")]


@pytest.mark.parametrize("dispatch_mode", DISPATCH)
@pytest.mark.parametrize("case", ["plain", "shared", "unaligned", "empty_experts"])
def test_new_layer_equals_the_previous_one(dispatch_mode, case):
    """Forward and every gradient within 1e-6 (fp32). One sequence, so the per-sequence and the
    whole-input load-balance statistics coincide; ``empty_experts`` routes every token to experts
    2 and 0, leaving three experts with no rows."""
    cfg = {"plain": tiny(), "shared": tiny(shared_expert_hidden=8),
           "unaligned": tiny(d_model=27, expert_hidden=55, n_experts=3, top_k=2),
           "empty_experts": tiny(n_experts=5)}[case]
    moe = _moe(cfg, 3, dispatch_mode)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(1, 24, cfg.d_model, generator=g)
    w = torch.randn(1, 24, cfg.d_model, generator=g)
    if case == "empty_experts":
        with torch.no_grad():
            moe.router.weight.zero_()
            moe.router.weight[2, 0], moe.router.weight[0, 0], moe.router.weight[0, 1] = 50.0, 40.0, 1.0
        x[..., 0] = x[..., 0].abs() + 1.0
    new, old = _run(moe, lambda m, t: m(t), x, w), _run(moe, legacy_forward, x, w)
    if case == "empty_experts":
        assert new[3].tolist() == [24, 0, 24, 0, 0]
    assert torch.equal(new[3], old[3])
    for a, b in zip(new, old):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_dispatch_and_combine_are_a_permutation_and_its_inverse():
    """dispatch then combine with unit gates of one slot returns x; gradients flow back exactly."""
    N, k, E, d = 10, 3, 4, 6
    g = torch.Generator().manual_seed(0)
    top_i = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(N)])
    counts = expert_histogram(top_i, E).sum(0)
    order, inverse, offsets = sort_by_expert(top_i, counts)
    assert torch.equal(order[inverse], torch.arange(N * k))
    assert offsets.tolist() == counts.cumsum(0).tolist() and offsets.dtype == torch.int32
    assert torch.equal(counts, torch.bincount(top_i.reshape(-1), minlength=E))
    x = torch.randn(N, d, generator=g, requires_grad=True)
    xs = dispatch(x, order, inverse, k)
    assert torch.equal(top_i.reshape(-1)[order], top_i.reshape(-1)[order].sort().values)  # sorted
    gates = torch.full((N, k), 1.0 / k)
    y = combine(xs, order, inverse, gates)
    torch.testing.assert_close(y, x)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.ones(N, d))


def test_load_balance_is_per_sequence():
    """aux over B sequences = mean of the whole-input statistic of each sequence alone."""
    cfg = tiny()
    moe = _moe(cfg, 5, DISPATCH[0])
    x = torch.randn(3, 16, cfg.d_model, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        _, aux, z, counts = moe(x)
        per_seq = [legacy_forward(moe, x[b:b + 1]) for b in range(3)]
    torch.testing.assert_close(aux, torch.stack([p[1] for p in per_seq]).mean(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(z, torch.stack([p[2] for p in per_seq]).mean(), rtol=1e-6, atol=1e-7)
    assert torch.equal(counts, sum(p[3] for p in per_seq))
    # a uniform router gives k in every sequence
    probs = torch.full((32, 4), 0.25)
    hist = expert_histogram(torch.tensor([[0, 1], [2, 3]] * 16), 4, groups=2)
    torch.testing.assert_close(load_balance_loss(probs, hist), torch.tensor(2.0))


def test_objective_does_not_depend_on_the_micro_batch_split():
    """The mean of the objective over 4 micro-batches of 1 sequence equals that of 1 of 4 (and its
    gradient): the property a resume on another world size needs."""
    cfg = tiny(n_layers=3, loop_start=1, loop_end=2, n_loops=2)
    x = torch.randint(0, cfg.vocab_size, (4, 16), generator=torch.Generator().manual_seed(2))
    y = torch.randint(0, cfg.vocab_size, (4, 16), generator=torch.Generator().manual_seed(3))

    def objective(model, n_micro):
        model.zero_grad()
        total = 0.0
        for m in range(n_micro):
            sl = slice(m * 4 // n_micro, (m + 1) * 4 // n_micro)
            out = model(x[sl], y[sl])
            obj = (out.loss + 0.01 * out.aux_loss + 1e-3 * out.z_loss) / n_micro
            obj.backward()
            total += float(obj.detach())
        return total, torch.cat([p.grad.reshape(-1) for p in model.parameters()])

    model = MoETransformer(cfg, seed=1)
    (a, ga), (b, gb) = objective(model, 1), objective(model, 4)
    assert abs(a - b) <= 1e-6 * abs(a)
    torch.testing.assert_close(ga, gb, rtol=1e-5, atol=1e-7)


class _SyncSpy(TorchDispatchMode):
    """Records ops that bring a device value to the host or have data-dependent output shapes."""

    # lift_fresh: a tensor made from host data (torch.tensor / new_tensor): on CUDA a host-to-device
    # copy from pageable memory, which waits for the stream
    SYNCING = ("_local_scalar_dense", "bincount", "nonzero", "unique", "masked_select", "repeat_interleave",
               "lift_fresh")

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__
        if any(s in name for s in self.SYNCING):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("arch", ["baseline", "smelt"])
@pytest.mark.parametrize("mode", ["grouped_mm", "loop"])
def test_no_host_sync_in_a_training_step(arch, mode, monkeypatch):
    """No .item()/.tolist()/int()/bool() of a tensor, no aten._local_scalar_dense, bincount or
    data-dependent shape op in the forward or backward of the model (the CPU stand-in for
    CUDA's sync debug mode). The loop fallback syncs, and the spy must see it."""
    from scaling.accounting.tiers import get_config

    if mode == "grouped_mm" and not hasattr(F, "grouped_mm"):
        pytest.skip("this torch has no F.grouped_mm")
    cfg = get_config("proxy-xxs", arch).replace(seq_len=32)
    model = MoETransformer(cfg)
    for layer in model.layers:
        layer.moe.dispatch = mode
    x = torch.randint(0, cfg.vocab_size, (2, 32))
    with _SyncSpy() as spy:
        for name in ("tolist", "item", "__int__", "__float__", "__bool__"):
            def record(self, *a, _name=name, _orig=getattr(torch.Tensor, name)):
                spy.seen.append(_name)
                return _orig(self, *a)
            monkeypatch.setattr(torch.Tensor, name, record)
        out = model(x, x)
        (out.loss + 0.01 * out.aux_loss + 1e-3 * out.z_loss).backward()
        monkeypatch.undo()
    if mode == "loop":
        assert "tolist" in spy.seen
    else:
        assert spy.seen == []


@pytest.mark.parametrize("arch", ["baseline", "smelt"])
def test_forward_has_no_graph_break(arch):
    """torch._dynamo.explain: the whole model forward is one graph (was 6-8 graphs, all bincount)."""
    from scaling.accounting.tiers import get_config

    cfg = get_config("proxy-xxs", arch)
    model = MoETransformer(cfg)
    x = torch.randint(0, cfg.vocab_size, (2, 32))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(x, x)
    assert explained.graph_break_count == 0, [str(b.reason)[:200] for b in explained.break_reasons]
    assert explained.graph_count == 1
