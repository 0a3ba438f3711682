"""Learning-rate schedules as pure functions of the optimizer step.

Step ``s`` is the 0-based index of the update being taken (the learning rate used by the
``s``-th ``optimizer.step()``). All schedules share a linear warmup
``peak * (s + 1) / warmup`` for ``s < warmup`` (so the first update is not wasted at 0).

Warmup-stable-decay (WSD; Hu et al. 2024 "MiniCPM", Hägele et al. 2024 "Scaling Laws and
Compute-Optimal Training Beyond Fixed Training Durations"): constant ``peak`` after warmup,
then a linear decay over the last ``decay_steps`` of the ``total`` steps,

    lr(s) = peak * min(1, (s + 1) / warmup) * min(1, (total - s) / (decay_steps + 1))

so each of the last ``decay_steps`` updates is below ``peak`` (from ``peak * K/(K+1)`` at
``s = total - K`` down to ``peak / (K + 1)`` ~ 0 at the last update ``s = total - 1``). Before ``total -
decay_steps`` the schedule does not depend on
``total``: runs with different budgets share the same stable trunk, so one trunk can branch
a cooldown at each budget (see :class:`scaling.training.loop.branches.BranchPlan`).

Cosine (Loshchilov & Hutter 2017, as in Chinchilla): after warmup,
``min + (peak - min) * (1 + cos(pi * p)) / 2`` with ``p = (s - warmup) / (total - warmup)``,
reaching ``min_ratio * peak`` at the end; it depends on ``total`` everywhere, so it needs one
run per budget.
"""

from __future__ import annotations

import math


def warmup_factor(step: int, warmup: int) -> float:
    """Linear warmup multiplier (s + 1) / warmup, capped at 1 (1 when warmup <= 0)."""
    return 1.0 if warmup <= 0 else min(1.0, (step + 1) / warmup)


def wsd_lr(step: int, peak: float, warmup: int, total: int, decay_steps: int) -> float:
    """Warmup-stable-decay learning rate at 0-based update ``step`` of a ``total``-step budget."""
    decay = 1.0 if decay_steps <= 0 else min(1.0, max(0.0, (total - step) / (decay_steps + 1)))
    return peak * warmup_factor(step, warmup) * decay


def cosine_lr(step: int, peak: float, warmup: int, total: int, min_ratio: float = 0.1) -> float:
    """Warmup then cosine decay from ``peak`` to ``min_ratio * peak`` at ``step = total``."""
    if step < warmup:
        return peak * warmup_factor(step, warmup)
    span = max(1, total - warmup)
    p = min(1.0, (step - warmup) / span)
    return peak * (min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * p)))


def decay_steps_for(total: int, decay_fraction: float) -> int:
    """Steps of the WSD cooldown of a ``total``-step budget: round(f * total), at least 1."""
    return max(1, round(decay_fraction * total))


def lr_at(step: int, budget, schedule: str, peak: float, warmup: int, min_ratio: float = 0.1) -> float:
    """Learning rate of update ``step`` on the way to ``budget`` (a
    :class:`~scaling.training.loop.branches.TokenBudget`; trunk: the largest budget)."""
    if schedule == "wsd":
        return wsd_lr(step, peak, warmup, budget.steps, budget.decay_steps)
    return cosine_lr(step, peak, warmup, budget.steps, min_ratio)
