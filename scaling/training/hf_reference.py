"""A Hugging Face ``MixtralForCausalLM`` copy of an unlooped model, the independent reference of the
parity test (tests/test_reference_parity.py) and the throughput benchmark."""

from __future__ import annotations

import torch

from scaling.common.errors import UserError
from scaling.training.model import MoETransformer


def to_hf_mixtral(model: MoETransformer, experts_implementation: str | None = None):
    """An equivalent Hugging Face ``MixtralForCausalLM`` holding a copy of ``model``'s weights.

    Needs ``transformers`` (a test extra) and an unlooped model without shared expert and with an
    even head_dim (Mixtral rotates the whole head). Used by the parity test and the throughput
    benchmark. Weight layout (transformers 5): ``experts.gate_up_proj`` [E, 2f, d] (rows gate|up),
    ``experts.down_proj`` [E, d, f], ``gate.weight`` [E, d]; q/k/v/o_proj [out, in].
    """
    try:
        from transformers import MixtralConfig, MixtralForCausalLM
    except ImportError:
        raise UserError("transformers is not installed (pip install -e '.[test]')") from None
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        raise UserError(
            f"transformers >= 5 is needed (fused expert weights), found {transformers.__version__}"
        )
    cfg = model.cfg
    if cfg.is_looped or cfg.shared_expert_hidden or cfg.head_dim % 2:
        raise UserError("Mixtral has no loop, no shared expert and rotates the whole (even) head")
    hf_cfg = MixtralConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.expert_hidden,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.seq_len,
        rms_norm_eps=cfg.norm_eps,
        tie_word_embeddings=cfg.tie_embeddings,
        sliding_window=None,
        num_local_experts=cfg.n_experts,
        num_experts_per_tok=cfg.top_k,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
    )
    kwargs = {"attn_implementation": "sdpa"}
    if experts_implementation is not None:
        kwargs["experts_implementation"] = experts_implementation
    hf_cfg._attn_implementation = "sdpa"
    ref = MixtralForCausalLM._from_config(hf_cfg, **kwargs)
    H, Hkv, h = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    with torch.no_grad():
        ref.model.embed_tokens.weight.copy_(model.embed.weight)
        ref.model.norm.weight.copy_(model.norm.weight)
        if model.lm_head is not None:
            ref.lm_head.weight.copy_(model.lm_head.weight)
        for ours, theirs in zip(model.layers, ref.model.layers):
            q, k, v = ours.attn.wqkv.weight.split([H * h, Hkv * h, Hkv * h])
            theirs.self_attn.q_proj.weight.copy_(q)
            theirs.self_attn.k_proj.weight.copy_(k)
            theirs.self_attn.v_proj.weight.copy_(v)
            theirs.self_attn.o_proj.weight.copy_(ours.attn.wo.weight)
            theirs.input_layernorm.weight.copy_(ours.attn_norm.weight)
            theirs.post_attention_layernorm.weight.copy_(ours.moe_norm.weight)
            theirs.mlp.gate.weight.copy_(ours.moe.router.weight)
            theirs.mlp.experts.gate_up_proj.copy_(ours.moe.w_gate_up.transpose(1, 2))
            theirs.mlp.experts.down_proj.copy_(ours.moe.w_down.transpose(1, 2))
    return ref
