"""Savings over a range of budgets, leaving out the budgets the savings cannot answer."""

from __future__ import annotations

from dataclasses import replace
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
    ``law``), per budget and sparsity. A budget is left out when its matching compute lies outside
    the bisection bracket (:class:`scaling.fitting.savings.Unmatched`: the reference never reaches
    the candidate's loss within 6 decades, or already beats it there), which can happen far from
    the data when two fitted frontiers cross; bad input is an error for all of them. None
    answered: :class:`NoBudgetAnswered`. Keyword arguments go to ``savings``.
    """
    budgets = [float(b) for b in budgets]
    sparsities = list(kwargs.pop("sparsities", None) or (None,))
    try:
        return savings(reference, candidate, budgets, sparsities=sparsities, **kwargs), ()
    except Unmatched:
        pass
    # each (budget, sparsity) on its own: one unmatched sparsity must not take the others of its
    # budget with it (a budget's answer at S = 0.3 must not depend on whether S = 0.7 was asked)
    answered, rows, warnings, skipped = None, [], [], []
    for b in budgets:
        for s in sparsities:
            try:
                one = savings(reference, candidate, [b], sparsities=[s], **kwargs)
            except Unmatched as exc:
                skipped.append(SavingsRow.refused(b, str(exc), refusal=exc.refusal, method="law", sparsity=s))
                continue
            answered = one
            rows += one.rows
            warnings += [w for w in one.warnings if w not in warnings]
    if answered is None:
        raise NoBudgetAnswered(skipped)
    return replace(answered, rows=tuple(rows), warnings=tuple(warnings)), tuple(skipped)
