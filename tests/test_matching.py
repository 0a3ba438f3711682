"""The SMELT twin matches FLOPs/token, non-embedding params and KV cache within tolerance."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scaling.accounting.config import ModelConfig
from scaling.accounting.costs import costs
from scaling.accounting.matching import loop_block, smelt_twin
from scaling.accounting.tiers import TIERS, get_config, get_match
from scaling.common.errors import UserError


@pytest.mark.parametrize("n_layers,expected", [(10, (2, 7)), (12, (3, 9)), (20, (5, 15)), (30, (7, 22))])
def test_loop_block_is_the_papers_middle_half(n_layers, expected):
    # paper (1-based, inclusive): 3-7, 4-9, 6-15, 8-22
    assert loop_block(n_layers) == expected


@pytest.mark.parametrize("tier", list(TIERS))
def test_every_shipped_tier_within_one_percent(tier):
    m = get_match(tier)
    assert m.smelt.is_looped and not m.baseline.is_looped
    assert m.smelt.n_layers == m.baseline.n_layers
    assert m.smelt.top_k == m.baseline.top_k
    assert set(m.mismatch) == {"flops_per_token", "non_embedding_params", "kv_cache_per_token"}
    assert m.worst <= 0.01, m.mismatch
    if not TIERS[tier].proxy:
        assert m.smelt.d_model % 8 == 0 and m.smelt.expert_hidden % 8 == 0


def test_paper_tiers_active_params_near_reported():
    reported = {"100M": 100e6, "200M": 200e6, "600M": 600e6, "1.6B": 1.6e9}
    for tier, target in reported.items():
        active = costs(get_config(tier, "baseline")).active_params
        assert abs(active / target - 1) <= 0.10, (tier, active)
    # reported totals (non-embedding): 3.70B, ~3.9B, ~53.9B within 2%; 600M documented at -6%
    for tier, total in {"100M": 3.70e9, "200M": 3.9e9, "1.6B": 53.9e9}.items():
        assert abs(costs(get_config(tier, "baseline")).non_embedding_params / total - 1) < 0.02


def test_twin_shrinks_width_and_grows_experts_like_the_paper():
    m = get_match("100M")
    assert m.smelt.d_model < m.baseline.d_model            # paper 672 -> 576
    assert m.smelt.n_experts > m.baseline.n_experts        # paper 336 -> 504
    assert m.smelt.n_kv_heads * m.smelt.head_dim < m.baseline.n_kv_heads * m.baseline.head_dim


def test_unmatchable_kv_cache_is_a_clear_error():
    base = ModelConfig(vocab_size=100, d_model=64, n_layers=4, n_heads=1, n_kv_heads=1, head_dim=4,
                       n_experts=8, top_k=2, expert_hidden=64)
    with pytest.raises(UserError, match="KV cache"):
        smelt_twin(base, width_multiple=1)


def test_kv_refusal_names_the_nearest_choice():
    # target 4 x 16 x 3 layers / 5 passes = 38.4 per pass: 1 x 38 and 2 x 19 are 1.04% off, 4 x 10 4.2%
    base = ModelConfig(vocab_size=512, d_model=768, n_layers=3, n_heads=12, n_kv_heads=4, head_dim=16,
                       n_experts=8, top_k=1, expert_hidden=128, seq_len=1024)
    with pytest.raises(UserError, match=r"\(2 x 19\) is 1\.04% off"):
        smelt_twin(base, n_loops=3, width_multiple=8)


def test_looped_baseline_rejected():
    with pytest.raises(UserError, match="must not be looped"):
        smelt_twin(get_config("proxy-s", "smelt"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_layers=st.integers(4, 32),
    d_model=st.integers(16, 48).map(lambda x: 32 * x),        # 512..1536
    heads=st.sampled_from([(8, 2), (8, 8), (12, 4), (16, 4), (16, 8), (24, 8), (32, 8)]),
    head_dim=st.sampled_from([64, 80, 96, 128]),
    n_experts=st.integers(8, 256),
    top_k=st.sampled_from([1, 2, 4, 8]),
    ffn=st.integers(16, 160).map(lambda x: 8 * x),            # 128..1280
    vocab=st.sampled_from([32000, 50304, 65536]),
    seq_len=st.sampled_from([1024, 2048, 4096]),
    shared=st.booleans(),
)
def test_property_matcher_keeps_budgets_within_tolerance(n_layers, d_model, heads, head_dim, n_experts,
                                                         top_k, ffn, vocab, seq_len, shared):
    h, kv = heads
    base = ModelConfig(vocab_size=vocab, d_model=d_model, n_layers=n_layers, n_heads=h, n_kv_heads=kv,
                       head_dim=head_dim, n_experts=n_experts, top_k=min(top_k, n_experts),
                       expert_hidden=ffn, shared_expert_hidden=ffn if shared else 0, seq_len=seq_len)
    m = smelt_twin(base)
    assert m.worst <= 0.01, m.mismatch
    assert m.smelt.d_model % 8 == 0 and m.smelt.expert_hidden % 8 == 0
    assert m.smelt.n_layer_passes == n_layers + n_layers // 2


@settings(max_examples=30, deadline=None)
@given(d=st.integers(24, 160), L=st.sampled_from([2, 4, 6, 8]),  # even L: target KV is 2x16 exactly
        experts=st.integers(4, 16), f_mult=st.integers(1, 4))
def test_property_exact_integer_proxies(d, L, experts, f_mult):
    base = ModelConfig(vocab_size=4096, d_model=d, n_layers=L, n_heads=4, n_kv_heads=2, head_dim=24,
                       n_experts=experts, top_k=2, expert_hidden=f_mult * d, seq_len=256)
    m = smelt_twin(base, width_multiple=1)
    assert m.worst <= 0.01, m.mismatch


@pytest.mark.parametrize("shared,top_k", [(16, 2), (32, 2), (32, 1)])
def test_shared_expert_baselines_get_their_twin(shared, top_k):
    """The FLOPs slope in f' was probed at f' = 1 and 2 (the width multiple), where the shared
    expert's width max(1, round(ratio * f')) stays 1: the slope missed its share, f' overshot and
    these were refused ("FLOPs +1.40%" ... "+4.04%") although twins within 0.4% exist (audit)."""
    base = get_config("proxy-xs", "baseline").replace(shared_expert_hidden=shared, top_k=top_k)
    m = smelt_twin(base, width_multiple=1)
    assert m.worst <= 0.01, m.mismatch
    ratio = shared / base.expert_hidden
    assert m.smelt.shared_expert_hidden == max(1, round(ratio * m.smelt.expert_hidden))


def test_shared_expert_grid_matches_like_the_plain_one():
    """A grid of small Baselines whose KV cache is exactly matchable (2 x 24 over 4 layers -> 2 x 16
    over 6 passes), with a shared expert of 1/3 or 1/2 of the expert width: every one has a twin
    within 1% (before the secant solve 71 of these 72 were refused)."""
    refused = []
    for d in range(24, 97, 9):
        for experts in (8, 16):
            for f_mult in (1, 2):
                for r in (3, 2):
                    base = ModelConfig(vocab_size=4096, d_model=d, n_layers=4, n_heads=4, n_kv_heads=2,
                                       head_dim=24, n_experts=experts, top_k=2, expert_hidden=f_mult * d,
                                       shared_expert_hidden=f_mult * d // r, seq_len=256)
                    try:
                        assert smelt_twin(base, width_multiple=1).worst <= 0.01
                    except UserError as exc:
                        refused.append((d, experts, f_mult, r, str(exc)))
    assert refused == []


def test_plain_refusal_at_width_multiple_one_does_not_suggest_a_smaller_one():
    base = ModelConfig(vocab_size=4096, d_model=157, n_layers=8, n_heads=4, n_kv_heads=2, head_dim=24,
                       n_experts=4, top_k=2, expert_hidden=628, shared_expert_hidden=628, seq_len=256)
    with pytest.raises(UserError, match="get no closer; allow a larger tolerance") as exc:
        smelt_twin(base, width_multiple=1)
    assert "smaller width multiple" not in str(exc.value)


def test_few_wide_experts_trade_flops_for_parameters():
    """Four experts of 3 d each over 2 layers: one expert is ~14% of the twin's parameters, so no
    expert count is near the parameters at the FLOPs root (the best there was +3.0%); a twin within
    1% exists a few f' away (hypothesis found this Baseline; 1 of 2,000 such random ones failed)."""
    base = ModelConfig(vocab_size=4096, d_model=25, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=24,
                       n_experts=4, top_k=2, expert_hidden=75, seq_len=256)
    m = smelt_twin(base, width_multiple=1)
    assert m.worst <= 0.01, m.mismatch
