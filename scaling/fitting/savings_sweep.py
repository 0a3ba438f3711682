"""Savings over a range of budgets, leaving out the budgets the savings cannot answer."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from scaling.common.errors import UserError
from scaling.fitting.savings import SavingsResult, SavingsRow, Unmatched, savings


class NoBudgetAnswered(UserError):
    """No budget of :func:`savings_over` gives a value; ``skipped`` holds each budget's refused
    row (``SavingsRow.refused``: its reason and refusal kind)."""

    def __init__(self, skipped: Sequence[SavingsRow]):
        first = skipped[0].reason if skipped else "no budgets"
        super().__init__(f"no budget gives a savings value: {first}")
        self.skipped = tuple(skipped)

    def __reduce__(self):   # picklable across process pools: rebuilt from its rows, not its text
        return (NoBudgetAnswered, (self.skipped,))


def savings_over(reference: Any, candidate: Any, budgets: Iterable[float],
                 **kwargs: Any) -> tuple[SavingsResult, tuple[SavingsRow, ...]]:
    """``scaling.fitting.savings.savings`` over many budgets, leaving out those it cannot answer.

    Returns (SavingsResult of the answered budgets, the refused rows of those left out, method
    ``law``). A budget is left out when its matching compute lies outside the bisection bracket
    (:class:`scaling.fitting.savings.Unmatched`: the reference never reaches the candidate's loss
    within 6 decades, or already beats it there), which can happen far from the data when two
    fitted frontiers cross; bad input is an error for all of them. None answered:
    :class:`NoBudgetAnswered`. Keyword arguments go to ``savings``.
    """
    budgets = [float(b) for b in budgets]
    try:
        return savings(reference, candidate, budgets, **kwargs), ()
    except Unmatched:
        pass
    keep, skipped = [], []
    for b in budgets:
        try:
            savings(reference, candidate, [b], **kwargs)
            keep.append(b)
        except Unmatched as exc:
            skipped.append(SavingsRow.refused(b, str(exc), refusal=exc.refusal, method="law"))
    if not keep:
        raise NoBudgetAnswered(skipped)
    return savings(reference, candidate, keep, **kwargs), tuple(skipped)
