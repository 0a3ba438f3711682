"""Learning-rate schedules as pure functions of the optimizer step, and the budget plan of a run.

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
a cooldown at each budget (see :func:`plan_budgets`).

Cosine (Loshchilov & Hutter 2017, as in Chinchilla): after warmup,
``min + (peak - min) * (1 + cos(pi * p)) / 2`` with ``p = (s - warmup) / (total - warmup)``,
reaching ``min_ratio * peak`` at the end; it depends on ``total`` everywhere, so it needs one
run per budget.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from scaling.common.errors import UserError


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


@dataclass(frozen=True)
class TokenBudget:
    """One token budget of a run, in optimizer steps.

    tokens        actual tokens D = steps * tokens_per_step (the requested budget rounded)
    steps         S, updates to reach the budget
    decay_steps   K, length of the cooldown (WSD) or 0 (cosine)
    branch_step   P = S - K, the trunk step a cooldown branch starts from
    """

    index: int
    requested_tokens: float
    tokens: int
    steps: int
    decay_steps: int
    branch_step: int

    def to_dict(self) -> dict:
        return asdict(self)


def plan_budgets(
    token_budgets, tokens_per_step: int, schedule: str = "wsd", decay_fraction: float = 0.2
) -> list[TokenBudget]:
    """Turn token budgets into step budgets, sorted ascending.

    Steps are ``round(D / tokens_per_step)``; a budget below one step, two budgets that round
    to the same step count, or several budgets with the cosine schedule raise UserError.
    The run's compute is ``S_max + sum of K_i over the smaller budgets`` steps.
    """
    if schedule not in ("wsd", "cosine"):
        raise UserError(f"unknown schedule {schedule!r}; choose wsd or cosine")
    if not 0.0 < decay_fraction <= 1.0:
        raise UserError(f"decay fraction must be in (0, 1], got {decay_fraction}")
    budgets = sorted(float(t) for t in token_budgets)
    if not budgets:
        raise UserError("no token budget given")
    if schedule == "cosine" and len(budgets) > 1:
        raise UserError(
            "the cosine schedule depends on the budget everywhere: one budget per run "
            "(use --schedule wsd for several budgets in one run)"
        )
    out: list[TokenBudget] = []
    for i, d in enumerate(budgets):
        steps = round(d / tokens_per_step)
        if steps < 1:
            raise UserError(f"token budget {d:g} is below one optimizer step ({tokens_per_step} tokens)")
        if out and steps == out[-1].steps:
            raise UserError(
                f"token budgets {out[-1].requested_tokens:g} and {d:g} round to the same "
                f"{steps} steps of {tokens_per_step} tokens"
            )
        k = decay_steps_for(steps, decay_fraction) if schedule == "wsd" else 0
        out.append(TokenBudget(i, d, steps * tokens_per_step, steps, k, steps - k))
    return out


def total_steps(budgets: list[TokenBudget]) -> int:
    """Updates the whole run takes: trunk to the largest budget plus each smaller cooldown."""
    return budgets[-1].steps + sum(b.decay_steps for b in budgets[:-1])


def lr_at(
    step: int, budget: TokenBudget, schedule: str, peak: float, warmup: int, min_ratio: float = 0.1
) -> float:
    """Learning rate of update ``step`` on the way to ``budget`` (trunk: the largest budget)."""
    if schedule == "wsd":
        return wsd_lr(step, peak, warmup, budget.steps, budget.decay_steps)
    return cosine_lr(step, peak, warmup, budget.steps, min_ratio)
