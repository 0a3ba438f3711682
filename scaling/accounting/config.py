"""The one config dataclass that the model, the trainer and the budget accounting all read.

A decoder-only Mixture-of-Experts Transformer (pre-norm, RMSNorm, RoPE, GQA attention,
top-k routed SwiGLU experts, optional shared SwiGLU expert) with an optional *loop*:
the contiguous block of physical layers ``[loop_start, loop_end)`` is executed
``n_loops`` times with the same weights (SMELT: the middle 50% of layers, twice;
Baseline: no loop). Every pass through a looped layer computes and caches its own K/V.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from scaling.common.errors import UserError

# How the model's SDPA pads its head size: to a multiple of 8 on CUDA ("auto"), "never", "always".
# An execution choice, not part of the model's function (scaling.training.model.transformer.
# sdpa_head_size); here, torch-free, for the trainer's config and the CLI.
HEAD_PADDING = ("auto", "never", "always")


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of one model. All sizes are integers; widths in units of scalars.

    vocab_size      tokens in the vocabulary (V)
    d_model         residual-stream width (d)
    n_layers        physical (weight-holding) layers (L)
    n_heads         query heads (H)
    n_kv_heads      key/value heads (H_kv, GQA: H % H_kv == 0)
    head_dim        per-head width (h); decoupled from d_model / n_heads. RoPE rotates the
                    largest even number of dims (h - h % 2), as partial-rotary models do,
                    so odd head sizes (the paper's SMELT 55) are allowed
    n_experts       routed experts per layer (E)
    top_k           experts each token is routed to (k)
    expert_hidden   SwiGLU hidden size of one routed expert (f)
    shared_expert_hidden  SwiGLU hidden size of an always-on shared expert (0 = none)
    seq_len         training context length (T), used by the attention FLOPs term
    tie_embeddings  LM head shares the token-embedding matrix
    loop_start, loop_end  the looped block is physical layers [loop_start, loop_end)
    n_loops         passes through the looped block (r; 1 = no loop)
    loop_residual_scale   scale each residual branch inside the looped block by 1/r
    """

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    n_experts: int
    top_k: int
    expert_hidden: int
    shared_expert_hidden: int = 0
    seq_len: int = 2048
    tie_embeddings: bool = False
    loop_start: int = 0
    loop_end: int = 0
    n_loops: int = 1
    loop_residual_scale: bool = True
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise UserError (one line) for an impossible configuration."""
        positive = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads",
                    "head_dim", "n_experts", "top_k", "expert_hidden", "seq_len", "n_loops")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UserError(f"{name} must be a positive integer, got {value!r}")
        for name in ("loop_start", "loop_end", "shared_expert_hidden"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise UserError(f"{name} must be an integer, got {value!r}")
        for name in ("tie_embeddings", "loop_residual_scale"):
            if not isinstance(getattr(self, name), bool):
                raise UserError(f"{name} must be true or false, got {getattr(self, name)!r}")
        for name in ("rope_theta", "norm_eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise UserError(f"{name} must be a finite number > 0, got {value!r}")
        if not isinstance(self.name, str):
            raise UserError(f"name must be text, got {self.name!r}")
        if self.shared_expert_hidden < 0:
            raise UserError(f"shared_expert_hidden must be >= 0, got {self.shared_expert_hidden}")
        if self.n_heads % self.n_kv_heads:
            raise UserError(f"n_kv_heads ({self.n_kv_heads}) must divide n_heads ({self.n_heads})")
        if self.top_k > self.n_experts:
            raise UserError(f"top_k ({self.top_k}) exceeds n_experts ({self.n_experts})")
        if not 0 <= self.loop_start <= self.loop_end <= self.n_layers:
            raise UserError(
                f"loop block [{self.loop_start}, {self.loop_end}) must lie inside 0..{self.n_layers}")
        if self.n_loops > 1 and self.loop_end == self.loop_start:
            raise UserError("n_loops > 1 needs a non-empty loop block (loop_end > loop_start)")

    # ----- the loop ---------------------------------------------------------------------
    @property
    def is_looped(self) -> bool:
        return self.n_loops > 1 and self.loop_end > self.loop_start

    @property
    def n_looped_layers(self) -> int:
        return self.loop_end - self.loop_start if self.is_looped else 0

    @property
    def n_layer_passes(self) -> int:
        """Executed layers per token: L + (r - 1) * |loop block|."""
        return self.n_layers + (self.n_loops - 1) * self.n_looped_layers

    def schedule(self) -> list[tuple[int, int]]:
        """Execution order as (physical layer, pass) pairs, pass counted from 1.

        Prelude [0, loop_start) once, Recur [loop_start, loop_end) r times, Coda once.
        """
        if not self.is_looped:
            return [(i, 1) for i in range(self.n_layers)]
        order = [(i, 1) for i in range(self.loop_start)]
        for p in range(1, self.n_loops + 1):
            order += [(i, p) for i in range(self.loop_start, self.loop_end)]
        order += [(i, 1) for i in range(self.loop_end, self.n_layers)]
        return order

    def residual_scale(self, layer: int) -> float:
        """Multiplier on both residual branches of a physical layer (1/r inside the loop)."""
        if self.is_looped and self.loop_residual_scale and self.loop_start <= layer < self.loop_end:
            return 1.0 / self.n_loops
        return 1.0

    @property
    def rotary_dim(self) -> int:
        return self.head_dim - self.head_dim % 2

    @property
    def arch(self) -> str:
        return "smelt" if self.is_looped else "baseline"

    # ----- (de)serialisation ------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ModelConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UserError(f"unknown model config keys: {', '.join(unknown)}")
        required = [f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        missing = [k for k in required if k not in data]
        if missing:
            raise UserError(f"incomplete model config: missing {', '.join(missing)} (whole configs: "
                            "`smelt-scale tiers --json`; `match --tier NAME` starts from one)")
        return cls(**data)

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)
