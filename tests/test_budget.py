"""Budget accounting against numbers computed by hand (arithmetic in the comments)."""

import pytest

from scaling.accounting import costs as B
from scaling.accounting.config import ModelConfig
from scaling.common.errors import UserError

# A: V=100 d=8 L=2 H=2 H_kv=1 h=4 E=4 k=2 f=16, untied, T=32, no loop.
A = ModelConfig(vocab_size=100, d_model=8, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=4,
                n_experts=4, top_k=2, expert_hidden=16, seq_len=32)
# B: V=50 d=6 L=4 H=3 H_kv=3 h=2 E=3 k=1 f=4 shared f_s=2, tied, T=10, loop layers [1,3) twice.
LOOPED = ModelConfig(vocab_size=50, d_model=6, n_layers=4, n_heads=3, n_kv_heads=3, head_dim=2,
                     n_experts=3, top_k=1, expert_hidden=4, shared_expert_hidden=2, seq_len=10,
                     tie_embeddings=True, loop_start=1, loop_end=3, n_loops=2)


def test_config_a_by_hand():
    # attention: q 8*8 + k 8*4 + v 8*4 + o 8*8 = 192; router 8*4 = 32; experts 4*3*8*16 = 1536; norms 16
    assert B.attention_params(A) == 192
    assert B.layer_params(A) == 192 + 32 + 1536 + 16 == 1776
    assert B.non_embedding_params(A) == 2 * 1776 + 8 == 3560
    assert B.embedding_params(A) == 2 * 100 * 8 == 1600
    assert B.total_params(A) == 5160
    # active layer: 192 + 32 + 2 experts * 384 + 16 = 1008
    assert B.active_params(A) == 2 * 1008 + 8 == 2024
    # matmul weights per token: 2 passes * (192 + 32 + 768) + LM head 800 = 2784
    assert B.matmul_params_per_token(A) == 2784
    # attention scores/values: 12 * 2 passes * T=32 * H*h=8 = 6144
    assert B.attention_flops_per_token(A) == 6144
    assert B.flops_per_token(A) == 6 * 2784 + 6144 == 22848
    assert B.flops_6n(A) == 6 * 2024
    assert B.kv_cache_per_token(A) == 2 * 2 * 1 * 4 == 16
    # dense-equivalent: 2 * 992 = 1984 of 3560 non-embedding
    assert B.sparsity(A) == pytest.approx(1 - 1984 / 3560)


def test_looped_tied_shared_config_by_hand():
    assert LOOPED.n_layer_passes == 6
    assert LOOPED.schedule() == [(0, 1), (1, 1), (2, 1), (1, 2), (2, 2), (3, 1)]
    # attention 6*2*(6+6) = 144; router 18; experts 3*3*6*4 = 216; shared 3*6*2 = 36; norms 12
    assert B.layer_params(LOOPED) == 144 + 18 + 216 + 36 + 12 == 426
    assert B.non_embedding_params(LOOPED) == 4 * 426 + 6 == 1710
    assert B.embedding_params(LOOPED) == 50 * 6 == 300  # tied: counted once
    assert B.total_params(LOOPED) == 2010
    # parameters once per weight: active layer 144 + 18 + 72 + 36 + 12 = 282
    assert B.active_params(LOOPED) == 4 * 282 + 6 == 1134
    # FLOPs once per pass: 6 passes * (144 + 18 + 72 + 36) + LM head 300 = 1920
    assert B.matmul_params_per_token(LOOPED) == 1920
    assert B.attention_flops_per_token(LOOPED) == 12 * 6 * 10 * 6 == 4320
    assert B.flops_per_token(LOOPED) == 6 * 1920 + 4320 == 15840
    assert B.flops_per_token(LOOPED) > B.flops_6n(LOOPED)
    assert B.kv_cache_per_token(LOOPED) == 2 * 6 * 3 * 2 == 72


def test_residual_scale_only_inside_loop():
    assert [LOOPED.residual_scale(i) for i in range(4)] == [1.0, 0.5, 0.5, 1.0]
    assert LOOPED.replace(loop_residual_scale=False).residual_scale(1) == 1.0
    assert A.residual_scale(0) == 1.0 and A.schedule() == [(0, 1), (1, 1)]


def test_mismatch_is_relative_difference():
    wider = A.replace(d_model=16)
    mm = B.mismatch(wider, A)
    assert mm["flops_per_token"] == pytest.approx(B.flops_per_token(wider) / 22848 - 1)
    assert mm["kv_cache_per_token"] == 0.0


@pytest.mark.parametrize("bad", [
    dict(n_kv_heads=3),                   # does not divide n_heads=2
    dict(top_k=5),                        # more than n_experts
    dict(d_model=0),
    dict(loop_start=1, loop_end=3, n_loops=2),  # block outside 2 layers
    dict(n_loops=2),                      # loop count without a block
])
def test_impossible_configs_raise(bad):
    with pytest.raises(UserError):
        A.replace(**bad)


def test_config_round_trip_and_unknown_keys():
    assert ModelConfig.from_dict(LOOPED.to_dict()) == LOOPED
    with pytest.raises(UserError, match="unknown"):
        ModelConfig.from_dict({**A.to_dict(), "bogus": 1})
