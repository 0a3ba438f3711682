"""LR schedules (scaling/training/loop/schedule.py): pure functions, fast."""

import math

import pytest

from scaling.training.loop.branches import BranchPlan
from scaling.training.loop.schedule import (
    cosine_lr,
    lr_at,
    warmup_factor,
    wsd_lr,
)


def test_warmup_is_linear_from_first_update():
    assert [warmup_factor(s, 4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert warmup_factor(0, 0) == 1.0


def test_wsd_shape():
    peak, total, k = 1e-3, 100, 20
    lrs = [wsd_lr(s, peak, 10, total, k) for s in range(total)]
    assert lrs[0] == pytest.approx(peak / 10)
    assert all(lr == peak for lr in lrs[10:total - k])          # stable
    decay = lrs[total - k:]
    assert all(a > b for a, b in zip(decay, decay[1:]))          # strictly decreasing
    assert all(lr < peak for lr in decay)                        # every cooldown step is below peak
    assert decay[0] == pytest.approx(peak * k / (k + 1))
    assert decay[-1] == pytest.approx(peak / (k + 1))            # ~0 at the last update
    assert wsd_lr(total, peak, 10, total, k) == 0.0


def test_wsd_stable_part_does_not_depend_on_budget():
    """What makes cooldown branches exact: before S - K, every budget's schedule is the trunk's."""
    for s in range(0, 80):
        assert wsd_lr(s, 1.0, 5, 100, 20) == wsd_lr(s, 1.0, 5, 1000, 200)


def test_cosine_endpoints():
    peak = 2e-3
    assert cosine_lr(0, peak, 10, 110) == pytest.approx(peak / 10)
    assert cosine_lr(10, peak, 10, 110) == pytest.approx(peak)
    assert cosine_lr(60, peak, 10, 110, min_ratio=0.1) == pytest.approx(peak * (0.1 + 0.9 * 0.5))
    assert cosine_lr(110, peak, 10, 110, min_ratio=0.1) == pytest.approx(0.1 * peak)
    lrs = [cosine_lr(s, peak, 10, 110) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_lr_at_dispatches():
    (b,) = BranchPlan.build([40960], 4096, "wsd", 0.2).budgets
    assert lr_at(9, b, "wsd", 1.0, 2) == wsd_lr(9, 1.0, 2, 10, 2)
    (c,) = BranchPlan.build([40960], 4096, "cosine").budgets
    assert c.decay_steps == 0 and c.branch_step == c.steps
    assert lr_at(5, c, "cosine", 1.0, 2, 0.0) == pytest.approx(0.5 * (1 + math.cos(math.pi * 3 / 8)))
