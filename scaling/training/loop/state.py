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
    metrics_lines  lines written to metrics.jsonl so far (every rank counts them: the rule that
                 writes one is the same on all); a resume finds exactly that many up to its iter,
                 or the log lost lines. None: a checkpoint written before the count existed
    """

    iter: int = 0
    position: Position = field(default_factory=Position)
    tokens_seen: int = 0
    points: list[dict] = field(default_factory=list)
    wall_s: float = 0.0
    last_eval: dict | None = None
    best_val: float | None = None
    metrics_lines: int | None = 0

    @property
    def done(self) -> bool:
        return self.position.done

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainState":
        """The state a checkpoint's meta.json holds; ValueError (saying which key) for anything a
        trainer never wrote there: an unknown or (position, points) missing key, another type, a
        negative count. Other keys may be missing (older checkpoints): their defaults stand."""
        _check(d, _STATE_TYPES, "state", required=("position", "points"))
        _check(d["position"], _POSITION_TYPES, "state.position")
        if not all(isinstance(p, dict) for p in d["points"]):
            raise ValueError("state.points must be a list of objects")
        # a checkpoint written before the line count: unknown (None), not 0
        return cls(**{"metrics_lines": None, **d, "position": Position(**d["position"]),
                      "points": list(d["points"])})

    def copy(self) -> "TrainState":
        return TrainState.from_dict(self.to_dict())


def _count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


_STATE_TYPES = {"iter": _count, "position": lambda v: isinstance(v, dict), "tokens_seen": _count,
                "points": lambda v: isinstance(v, list), "wall_s": _number,
                "last_eval": lambda v: v is None or isinstance(v, dict),
                "best_val": lambda v: v is None or _number(v),
                "metrics_lines": lambda v: v is None or _count(v)}
_POSITION_TYPES = {"trunk_step": _count, "branch": lambda v: v is None or _count(v), "branch_step": _count,
                   "next_branch": _count, "done": lambda v: isinstance(v, bool)}


def _check(d: object, types: dict, where: str, required: tuple[str, ...] = ()) -> None:
    """``d`` a dict of keys of ``types`` (``required`` among them), each passing its check."""
    if not isinstance(d, dict):
        raise ValueError(f"{where} must be an object, got {type(d).__name__}")
    missing, extra = sorted(set(required) - set(d)), sorted(set(d) - set(types))
    if missing or extra:
        raise ValueError(f"{where} " + (f"lacks {', '.join(missing)}" if missing else
                                        f"has unknown keys {', '.join(extra)}"))
    for key, ok in types.items():
        if key in d and not ok(d[key]):
            raise ValueError(f"{where}.{key} is {str(d[key])[:30]!r}, not what a trainer writes there")
