"""Savings over a range of budgets, leaving out the budgets the savings cannot answer."""

from __future__ import annotations

from typing import Any, Iterable

from scaling.common.errors import UserError
from scaling.fitting.savings import savings


class NoBudgetAnswered(UserError):
    """No budget of :func:`savings_over` gives a value; ``skipped`` holds (budget, reason) for each."""

    def __init__(self, skipped: list[tuple[float, str]]):
        super().__init__("no budget gives a savings value: " + (skipped[0][1] if skipped else "no budgets"))
        self.skipped = skipped

    def __reduce__(self):   # picklable across process pools: rebuilt from its budgets, not its text
        return (NoBudgetAnswered, (self.skipped,))


def savings_over(reference: Any, candidate: Any, budgets: Iterable[float], **kwargs: Any):
    """``scaling.fitting.savings.savings`` over many budgets, leaving out those it cannot answer.

    Returns (SavingsResult of the answered budgets, [(budget, reason) left out]). A budget is
    left out when its matching compute lies outside the bisection bracket (the reference never
    reaches the candidate's loss within 6 decades, or already beats it there), which can happen
    far from the data when two fitted frontiers cross. None answered: :class:`NoBudgetAnswered`.
    Keyword arguments go to ``savings``.
    """
    budgets = [float(b) for b in budgets]
    try:
        return savings(reference, candidate, budgets, **kwargs), []
    except UserError:
        pass
    keep, skipped = [], []
    for b in budgets:
        try:
            savings(reference, candidate, [b], **kwargs)
            keep.append(b)
        except UserError as exc:
            skipped.append((b, str(exc)))
    if not keep:
        raise NoBudgetAnswered(skipped)
    return savings(reference, candidate, keep, **kwargs), skipped
