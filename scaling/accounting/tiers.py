"""The model tiers: the paper's four Baselines, CPU proxies, and their matched SMELT twins.

Paper tiers (SMELT paper, arXiv 2609.01343, as given by the reading notes in
shared/reference/smelt_paper.md): layers, hidden size, query/KV heads, head dim, expert
count and top-8 routing are the paper's. Not reported, chosen here:

* expert_hidden (SwiGLU f): set from the reported total parameters,
  total ~ L * E * 3 * d * f. 100M: f=544 gives 3.70B total and 102M active, both as
  reported. 200M: f=440 gives 3.94B (reported "about 3.9B") and 214M active.
  600M: the reported 21.8B total needs f~600, which gives ~690M active (+15%); f=560
  keeps active within 10% (654M) at 20.4B total (-6%). 1.6B: f=768 gives 53.9B and 1.70B.
* vocab_size 32768 (untied), seq_len 4096 (the paper analyses samples up to 4096 tokens).
  Neither enters the matched non-embedding parameters; both enter FLOPs/token.

The SMELT twins are derived by ``scaling.accounting.matching.smelt_twin`` (widths and head sizes as
multiples of 8 where the paper has them; head dims are free), not copied from the paper.
They differ from the paper's (e.g. 100M: d 552 vs the paper's 576, 480 vs 504 experts,
KV 4 x 37 vs 4 x 36) because the matcher splits the FLOPs cut evenly between width and
expert size and matches the KV cache to within 1%, where the paper reached about 4%.

CPU proxy tiers (``proxy=True``) follow the same rule at a scale two cores can train:
4 layers, top-2 of 8 experts, vocab 4096 (the shipped BPE tokenizer), seq_len 256,
KV heads x head dim = 2 x 24 so the twin's 2 x 16 matches the KV cache exactly, exact
integer widths (width_multiple 1). They are proxies: scaling behaviour at 10^5-10^6
parameters need not carry over to the paper's tiers.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from scaling.accounting.config import ModelConfig
from scaling.accounting.matching import Match, smelt_twin
from scaling.common.errors import UserError

ARCHS = ("baseline", "smelt")


@dataclass(frozen=True)
class TierSpec:
    name: str
    baseline: ModelConfig
    proxy: bool
    width_multiple: int


def _paper(name: str, **kw) -> TierSpec:
    cfg = ModelConfig(name=name, vocab_size=32768, seq_len=4096, top_k=8, **kw)
    return TierSpec(name, cfg, proxy=False, width_multiple=8)


def _proxy(name: str, d: int, f: int, *, vocab: int = 4096, seq_len: int = 256, n_heads: int = 4,
           n_kv_heads: int = 2, head_dim: int = 24, n_experts: int = 8, top_k: int = 2) -> TierSpec:
    cfg = ModelConfig(name=name, vocab_size=vocab, d_model=d, n_layers=4, n_heads=n_heads,
                      n_kv_heads=n_kv_heads, head_dim=head_dim, n_experts=n_experts, top_k=top_k,
                      expert_hidden=f, seq_len=seq_len)
    return TierSpec(name, cfg, proxy=True, width_multiple=1)


TIERS: dict[str, TierSpec] = {t.name: t for t in (
    _paper("100M", n_layers=10, d_model=672, n_heads=12, n_kv_heads=4, head_dim=56,
           n_experts=336, expert_hidden=544),
    _paper("200M", n_layers=12, d_model=1280, n_heads=16, n_kv_heads=4, head_dim=80,
           n_experts=192, expert_hidden=440),
    _paper("600M", n_layers=20, d_model=1792, n_heads=28, n_kv_heads=7, head_dim=64,
           n_experts=336, expert_hidden=560),
    _paper("1.6B", n_layers=30, d_model=2304, n_heads=36, n_kv_heads=9, head_dim=64,
           n_experts=336, expert_hidden=768),
    # for tests: seconds of CPU; its vocabulary is that of a small test tokenizer
    _proxy("proxy-tiny", d=32, f=64, vocab=512, seq_len=64, n_heads=2, n_kv_heads=1,
           n_experts=4),
    _proxy("proxy-xxs", d=24, f=48),
    _proxy("proxy-xs", d=32, f=64),
    _proxy("proxy-s", d=48, f=96),
    _proxy("proxy-m", d=64, f=128),
    _proxy("proxy-l", d=128, f=256),
)}


def tier_names(include_test: bool = False) -> list[str]:
    return [n for n in TIERS if include_test or n != "proxy-tiny"]


def _spec(tier: str) -> TierSpec:
    try:
        return TIERS[tier]
    except KeyError:
        raise UserError(f"unknown tier {tier!r}; known tiers: {', '.join(tier_names())} (and proxy-tiny, "
                        "for tests)") from None


@lru_cache(maxsize=None)
def get_match(tier: str) -> Match:
    """The Baseline of ``tier`` and its derived SMELT twin."""
    spec = _spec(tier)
    return smelt_twin(spec.baseline, width_multiple=spec.width_multiple)


def tier_width_multiple(tier: str) -> int:
    """The width multiple ``tier``'s twin is derived with (8 for the paper tiers, 1 for the proxies)."""
    return _spec(tier).width_multiple


def get_config(tier: str, arch: str) -> ModelConfig:
    """The ModelConfig of ``tier`` for ``arch`` ('baseline' or 'smelt')."""
    match = get_match(tier)
    if arch == "baseline":
        return match.baseline
    if arch == "smelt":
        return match.smelt
    raise UserError(f"unknown arch {arch!r}; choose one of {', '.join(ARCHS)}")


def is_proxy(tier: str) -> bool:
    return _spec(tier).proxy
