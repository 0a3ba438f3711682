"""The trainer's state: everything besides tensors that a resumed run needs to continue exactly.

A :class:`TrainState` is written beside the model and optimizer in every checkpoint (as JSON in
the checkpoint's ``meta.json``, see :mod:`scaling.training.loop.checkpoint`) and read back on resume.
The position in the run (trunk step, open branch, next branch; see
:mod:`scaling.training.loop.branches`) is also the data position and the scheduler step: a batch is a
pure function of (seed, step) and the learning rate a pure function of (step, budget).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from scaling.training.loop.branches import Position


@dataclass
class TrainState:
    """Mutable state of one run.

    iter         updates taken so far (trunk and branches; monotone, keys metrics.jsonl lines)
    position     trunk step, open branch and its step, next branch to open, done flag
    tokens_seen  training tokens consumed by all updates (trunk and branches)
    points       final.json points of the budgets completed so far
    wall_s       training wall time so far, summed over the run's sessions
    last_eval    the latest evaluation record (val_loss, val_bpb, ... at an iter), or None
    best_val     lowest val_loss seen so far, or None
    """

    iter: int = 0
    position: Position = field(default_factory=Position)
    tokens_seen: int = 0
    points: list[dict] = field(default_factory=list)
    wall_s: float = 0.0
    last_eval: dict | None = None
    best_val: float | None = None

    @property
    def done(self) -> bool:
        return self.position.done

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainState":
        return cls(**{**d, "position": Position(**d["position"]), "points": list(d["points"])})

    def copy(self) -> "TrainState":
        return TrainState.from_dict(self.to_dict())
