"""Exact cost accounting of a ModelConfig: parameters, training FLOPs and KV cache per token.

Parameter counts are exact for ``scaling.training.model.transformer.MoETransformer`` (a test checks them
against the instantiated torch model). No linear layer has a bias.

Per physical layer (d = d_model, h = head_dim, H = n_heads, H_kv = n_kv_heads,
E = n_experts, k = top_k, f = expert_hidden, f_s = shared_expert_hidden):

    attention  = d*H*h (q) + 2*d*H_kv*h (k, v) + H*h*d (o)
    router     = d*E
    experts    = E * 3*d*f            (SwiGLU: gate, up, down)
    shared     = 3*d*f_s              (0 when there is no shared expert)
    norms      = 2*d                  (RMSNorm gains before attention and before the MoE)

Embedding parameters are the token embedding V*d plus the LM head V*d when untied.
Non-embedding parameters are everything else: L layers + the final RMSNorm (d).
Active parameters per token count the k routed experts a token uses (not all E), every
other non-embedding parameter once, and each looped layer's weights once (parameters
are shared across passes; FLOPs are not). This is a convention, a function of the config
alone: a token is routed again on a looped layer's second pass and may reach other experts
there, so the distinct weights it touches lie between this count and one with r*k experts per
looped layer, and depend on the trained router (measured on shipped SMELT weights, k = 2:
2.12-2.26 distinct experts per looped layer over the two passes, +2.6% to +4.6% over this
count; 2026-12-06, proxy-s final weights and iso-d28 budget weights of runs-overlap-effect/).
The N of every SMELT point (and so the fits of L(N, D)) uses this convention.

FLOPs convention (PaLM, Chowdhery et al. 2022, appendix B; also nanoGPT's ``estimate_mfu``
and torchtitan): training FLOPs per token = 3 x forward (backward = 2 x forward), with

    forward = 2 * (matmul weights touched per token, per layer *pass*)
            + 2 * 2 * T * H*h per layer pass        (QK^T scores and AV values, full T, no causal discount)
            + 2 * d*V                               (LM head)

where "matmul weights touched" per pass = attention + router (all E logits) + k*3*d*f + 3*d*f_s.
Norms, softmax, RoPE, gating and the embedding lookup are not counted (O(d) per token).
So F = 6 * N_matmul + 12 * n_layer_passes * T * H*h, with N_matmul counting looped layers
once per pass. The Kaplan et al. (2020) approximation 6N (N = active non-embedding
parameters, each weight once) is given beside it; for a looped model F > 6N.

KV cache: every layer pass keeps its own K and V (a second pass through a looped layer
recomputes K/V from a different residual stream, so they cannot be shared), hence
kv_cache_per_token = 2 * n_layer_passes * H_kv * h scalars.

Compute-equivalent sparsity (SMELT paper, arXiv 2609.01343, via its reading notes):
S = 1 - N_act_eq / N with N_act_eq = (F/F0)*N0 from a dense control and N the non-embedding
parameters. We take a dense control whose FLOPs obey F0 = 6*N0 when F counts the layers'
matmuls only (no LM head, no attention-score terms, which would dominate at proxy scale and
make S negative), so N_act_eq = layer matmul weights per token (looped layers once per pass)
and S = 1 - N_act_eq / N. For an unlooped MoE this is 1 - active/total (up to norms); a
looped model's second pass counts as extra dense-equivalent parameters.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from scaling.accounting.config import ModelConfig
from scaling.common.errors import UserError


def attention_params(cfg: ModelConfig) -> int:
    """q, k, v, o projections of one layer: d*h*(2H + 2H_kv)."""
    return cfg.d_model * cfg.head_dim * (2 * cfg.n_heads + 2 * cfg.n_kv_heads)


def router_params(cfg: ModelConfig) -> int:
    return cfg.d_model * cfg.n_experts


def expert_params(cfg: ModelConfig) -> int:
    """One routed SwiGLU expert: 3*d*f."""
    return 3 * cfg.d_model * cfg.expert_hidden


def shared_expert_params(cfg: ModelConfig) -> int:
    return 3 * cfg.d_model * cfg.shared_expert_hidden


def layer_params(cfg: ModelConfig) -> int:
    """All weights of one physical layer, norms included."""
    return (attention_params(cfg) + router_params(cfg) + cfg.n_experts * expert_params(cfg)
            + shared_expert_params(cfg) + 2 * cfg.d_model)


def embedding_params(cfg: ModelConfig) -> int:
    """Token embedding V*d, plus the LM head V*d when it is not tied."""
    return cfg.vocab_size * cfg.d_model * (1 if cfg.tie_embeddings else 2)


def non_embedding_params(cfg: ModelConfig) -> int:
    """L * layer_params + d (final norm)."""
    return cfg.n_layers * layer_params(cfg) + cfg.d_model


def total_params(cfg: ModelConfig) -> int:
    return embedding_params(cfg) + non_embedding_params(cfg)


def active_layer_params(cfg: ModelConfig) -> int:
    """Weights of one layer a single token touches: k of the E experts."""
    return (attention_params(cfg) + router_params(cfg) + cfg.top_k * expert_params(cfg)
            + shared_expert_params(cfg) + 2 * cfg.d_model)


def active_params(cfg: ModelConfig) -> int:
    """Active non-embedding parameters per token, each looped weight counted once."""
    return cfg.n_layers * active_layer_params(cfg) + cfg.d_model


def matmul_params_per_token(cfg: ModelConfig) -> int:
    """Matmul weights a token multiplies by, looped layers once per pass, LM head included."""
    per_pass = (attention_params(cfg) + router_params(cfg) + cfg.top_k * expert_params(cfg)
                + shared_expert_params(cfg))
    return cfg.n_layer_passes * per_pass + cfg.vocab_size * cfg.d_model


def attention_flops_per_token(cfg: ModelConfig) -> int:
    """Training FLOPs of the score and value products: 12 * passes * T * H*h."""
    return 12 * cfg.n_layer_passes * cfg.seq_len * cfg.n_heads * cfg.head_dim


def flops_per_token(cfg: ModelConfig) -> int:
    """Training FLOPs per token (forward + backward): 6*N_matmul + 12*passes*T*H*h."""
    return 6 * matmul_params_per_token(cfg) + attention_flops_per_token(cfg)


def flops_6n(cfg: ModelConfig) -> int:
    """Kaplan et al. (2020) approximation: 6 * active non-embedding parameters."""
    return 6 * active_params(cfg)


def kv_cache_per_token(cfg: ModelConfig) -> int:
    """K and V scalars cached per token: 2 * n_layer_passes * H_kv * h (each pass its own)."""
    return 2 * cfg.n_layer_passes * cfg.n_kv_heads * cfg.head_dim


def dense_equivalent_params(cfg: ModelConfig) -> int:
    """N_act_eq: layer matmul weights per token, looped layers once per pass (no LM head)."""
    return matmul_params_per_token(cfg) - cfg.vocab_size * cfg.d_model


def sparsity(cfg: ModelConfig) -> float:
    """Compute-equivalent sparsity S = 1 - N_act_eq / N_non_embedding."""
    return 1.0 - dense_equivalent_params(cfg) / non_embedding_params(cfg)


def check_sparsity(S: float) -> float:
    """``S`` if it is a sparsity a model can have, [0, 1) (1 would leave no active parameter);
    UserError otherwise. The one range rule: sizing, laws and savings all check through here."""
    if not (math.isfinite(S) and 0.0 <= S < 1.0):
        raise UserError(f"sparsity must lie in [0, 1), got {S:g}")
    return S


@dataclass(frozen=True)
class Costs:
    """The accounting of one config, as plain numbers (params in scalars, FLOPs per token)."""

    total_params: int
    embedding_params: int
    non_embedding_params: int
    active_params: int
    flops_per_token: int
    flops_6n: int
    attention_flops_per_token: int
    kv_cache_per_token: int
    n_layer_passes: int
    sparsity: float

    def to_dict(self) -> dict:
        return asdict(self)


def costs(cfg: ModelConfig) -> Costs:
    return Costs(
        total_params=total_params(cfg),
        embedding_params=embedding_params(cfg),
        non_embedding_params=non_embedding_params(cfg),
        active_params=active_params(cfg),
        flops_per_token=flops_per_token(cfg),
        flops_6n=flops_6n(cfg),
        attention_flops_per_token=attention_flops_per_token(cfg),
        kv_cache_per_token=kv_cache_per_token(cfg),
        n_layer_passes=cfg.n_layer_passes,
        sparsity=sparsity(cfg),
    )


MATCHED = ("flops_per_token", "non_embedding_params", "kv_cache_per_token")


def mismatch(candidate: ModelConfig, reference: ModelConfig) -> dict[str, float]:
    """Relative differences candidate/reference - 1 of the three matched budgets."""
    c, r = costs(candidate), costs(reference)
    return {key: getattr(c, key) / getattr(r, key) - 1.0 for key in MATCHED}
