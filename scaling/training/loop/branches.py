"""The WSD cooldown branches of one run, as a pure plan (no torch).

A run trains one model at several token budgets ``D_1 < ... < D_n``. Each budget is a whole
number of optimizer steps ``S_i = round(D_i / tokens_per_step)``. With the warmup-stable-decay
schedule (:mod:`scaling.training.loop.schedule`) the learning rate before a budget's cooldown does not
depend on the budget, so one stable *trunk* runs to the largest budget ``S_n``, and for each
smaller budget a cooldown *branch* starts from the trunk state at step

    P_i = S_i - K_i,      K_i = max(1, round(decay_fraction * S_i)),

takes the ``K_i`` updates of budget i's decay (steps ``P_i .. S_i - 1``), is evaluated at its end
``S_i``, and the trunk resumes from the state saved at ``P_i`` (the *branch point*). Because a
batch is a pure function of (seed, step), each branch is the run a standalone job with budget
``S_i`` would have made. Total cost: ``S_n + sum_{i<n} K_i`` updates (Hägele et al. 2024,
"Scaling Laws and Compute-Optimal Training Beyond Fixed Training Durations", show such cooldowns
match cosine runs of the same length). The cosine schedule allows one budget per run.

The trainer walks the plan with :meth:`BranchPlan.advance`; :meth:`BranchPlan.walk` replays the
whole run without training (the order of updates, evaluations and branch-point saves).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterator

from scaling.common.errors import UserError
from scaling.training.loop.schedule import decay_steps_for

SCHEDULES = ("wsd", "cosine")


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


@dataclass(frozen=True)
class Position:
    """Where a run is: trunk step, the open branch (None: on the trunk) and its step, the next
    branch to open, and whether the run is done. ``step`` is the step of the update to take next."""

    trunk_step: int = 0
    branch: int | None = None
    branch_step: int = 0
    next_branch: int = 0
    done: bool = False

    @property
    def step(self) -> int:
        return self.trunk_step if self.branch is None else self.branch_step


@dataclass(frozen=True)
class Update:
    """What happened at one update (the result of :meth:`BranchPlan.advance`).

    branch, step   the branch (None: trunk) and the step count after the update
    budget_end     the budget this update completed (its index), else None
    evaluate       an evaluation is due after this update
    opened         a branch opened after this update (save its branch point first)
    closed         a branch closed: restore the trunk from its branch point
    """

    branch: int | None
    step: int
    budget_end: int | None
    evaluate: bool
    opened: int | None
    closed: int | None


# A bound on one run's optimizer updates: three orders of magnitude above the longest published
# LLM runs (~1e6 updates), far below where the int64 step counters and float64 token counts lose
# exactness; a budget beyond it is a typo (an exponent too many), not a run to start.
MAX_STEPS = 10**9


@dataclass(frozen=True)
class BranchPlan:
    """The budgets of one run (ascending) and the walk over trunk and cooldown branches."""

    budgets: tuple[TokenBudget, ...]
    schedule: str = "wsd"

    @classmethod
    def build(cls, token_budgets, tokens_per_step: int, schedule: str = "wsd",
              decay_fraction: float = 0.2) -> "BranchPlan":
        """Turn token budgets into step budgets, sorted ascending.

        Steps are ``round(D / tokens_per_step)``; a budget below one step, two budgets that round
        to the same step count, or several budgets with the cosine schedule raise UserError.
        """
        if schedule not in SCHEDULES:
            raise UserError(f"unknown schedule {schedule!r}; choose wsd or cosine")
        if not 0.0 < decay_fraction <= 1.0:
            raise UserError(f"decay fraction must be in (0, 1], got {decay_fraction}")
        requested = sorted(float(t) for t in token_budgets)
        if not requested:
            raise UserError("no token budget given")
        if schedule == "cosine" and len(requested) > 1:
            raise UserError("the cosine schedule depends on the budget everywhere: one budget per run "
                            "(the wsd schedule takes several budgets in one run)")
        out: list[TokenBudget] = []
        for i, d in enumerate(requested):
            steps = round(d / tokens_per_step)
            if steps > MAX_STEPS:
                raise UserError(f"token budget {d:g} is {steps:.3g} optimizer steps of {tokens_per_step} "
                                f"tokens; more than {MAX_STEPS:.0e} steps is refused as a likely typo "
                                "(the largest published runs take about 1e6)")
            if steps < 1:
                raise UserError(f"token budget {d:g} is below one optimizer step ({tokens_per_step} tokens)")
            if out and steps == out[-1].steps:
                raise UserError(f"token budgets {out[-1].requested_tokens:g} and {d:g} round to the same "
                                f"{steps} steps of {tokens_per_step} tokens")
            k = decay_steps_for(steps, decay_fraction) if schedule == "wsd" else 0
            out.append(TokenBudget(i, d, steps * tokens_per_step, steps, k, steps - k))
        return cls(tuple(out), schedule)

    def check_warmup(self, warmup: int) -> None:
        """UserError if a given warmup is longer than the smallest budget: that budget (the whole
        run, with one) would end before its lr reached the peak. A warmup that overlaps a cooldown
        is a schedule (``wsd_lr`` multiplies the two ramps; the default warmup of 10% does so with
        a decay fraction above 0.9), so only this is refused: ``--warmup 1e8`` is a typo."""
        first = self.budgets[0]
        if warmup > first.steps:
            raise UserError(f"warmup of {warmup} updates is longer than the smallest budget ({first.steps} "
                            f"updates, {first.tokens:,} tokens), which would end before its lr reached the "
                            f"peak: give at most {first.steps}")

    @property
    def trunk(self) -> TokenBudget:
        return self.budgets[-1]

    @property
    def total_steps(self) -> int:
        """Updates the whole run takes: trunk to the largest budget plus each smaller cooldown."""
        return self.trunk.steps + sum(b.decay_steps for b in self.budgets[:-1])

    def target(self, branch: int | None) -> TokenBudget:
        """The budget whose schedule the current update follows (trunk: the largest)."""
        return self.trunk if branch is None else self.budgets[branch]

    def to_dicts(self) -> list[dict]:
        return [b.to_dict() for b in self.budgets]

    def opening(self, pos: Position) -> int | None:
        """The branch that opens at this position (its branch point is the trunk here), else None."""
        i = pos.next_branch
        if pos.done or pos.branch is not None or i >= len(self.budgets) - 1:
            return None
        return i if self.budgets[i].branch_step == pos.trunk_step else None

    def open(self, pos: Position, i: int) -> Position:
        return Position(pos.trunk_step, i, pos.trunk_step, pos.next_branch, False)

    def start(self) -> tuple[Position, int | None]:
        """The position before the first update, and a branch that opens there (P_i = 0)."""
        pos = Position()
        i = self.opening(pos)
        return (pos if i is None else self.open(pos, i)), i

    def advance(self, pos: Position, eval_every: int = 0) -> tuple[Position, Update]:
        """The position after one update at ``pos`` and what the trainer must do around it.

        Evaluations: at every budget end, and every ``eval_every`` trunk steps (0: never).
        At a branch's end the trunk returns to its branch point and the next branch may open
        at once (two budgets can share a branch point).
        """
        if pos.done:
            raise ValueError("the run is done")
        step = pos.step + 1
        target = self.target(pos.branch)
        end = step == target.steps
        periodic = pos.branch is None and eval_every > 0 and step % eval_every == 0
        closed = None
        if pos.branch is None:
            new = Position(step, None, 0, pos.next_branch, end)
        elif end:
            closed = pos.branch
            new = Position(self.budgets[closed].branch_step, None, 0, closed + 1, False)
        else:
            new = Position(pos.trunk_step, pos.branch, step, pos.next_branch, False)
        opened = self.opening(new)
        if opened is not None:
            new = self.open(new, opened)
        return new, Update(pos.branch, step, target.index if end else None, end or periodic, opened, closed)

    def walk(self, eval_every: int = 0) -> Iterator[Update]:
        """Every update of the run in order (a dry run of the trainer's loop)."""
        pos, _ = self.start()
        while not pos.done:
            pos, update = self.advance(pos, eval_every)
            yield update
