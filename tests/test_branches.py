"""BranchPlan (scaling/training/loop/branches.py): the WSD trunk and cooldown branches, without torch."""

import sys

import pytest

from scaling.common.errors import UserError
from scaling.training.loop.branches import BranchPlan, Position
from scaling.training.loop.schedule import decay_steps_for


def test_build_rounds_sorts_and_branches():
    plan = BranchPlan.build([4e5, 1e5, 2e5], tokens_per_step=4096, decay_fraction=0.2)
    b = plan.budgets
    assert [x.steps for x in b] == [round(1e5 / 4096), round(2e5 / 4096), round(4e5 / 4096)]
    assert [x.index for x in b] == [0, 1, 2]
    for x in b:
        assert x.tokens == x.steps * 4096
        assert x.decay_steps == decay_steps_for(x.steps, 0.2) == max(1, round(0.2 * x.steps))
        assert x.branch_step == x.steps - x.decay_steps
    assert plan.total_steps == b[-1].steps + b[0].decay_steps + b[1].decay_steps
    assert plan.trunk is b[-1] and plan.target(None) is b[-1] and plan.target(0) is b[0]


@pytest.mark.parametrize("kwargs, message", [
    (dict(token_budgets=[100], tokens_per_step=4096), "below one optimizer step"),
    (dict(token_budgets=[4096, 4100], tokens_per_step=4096), "round to the same"),
    (dict(token_budgets=[1e5, 2e5], tokens_per_step=4096, schedule="cosine"), "one budget per run"),
    (dict(token_budgets=[1e5], tokens_per_step=4096, schedule="linear"), "unknown schedule"),
    (dict(token_budgets=[1e5], tokens_per_step=4096, decay_fraction=0.0), "decay fraction"),
    (dict(token_budgets=[], tokens_per_step=4096), "no token budget"),
])
def test_build_rejects(kwargs, message):
    with pytest.raises(UserError, match=message):
        BranchPlan.build(**kwargs)


def test_walk_trunk_branch_and_evaluations():
    # budgets of 10 and 20 steps, K = 2 and 4: branch 0 runs steps 9..10 from the trunk at P = 8
    plan = BranchPlan.build([10, 20], tokens_per_step=1, decay_fraction=0.2)
    ups = list(plan.walk(eval_every=5))
    assert len(ups) == plan.total_steps == 22
    order = [(u.branch, u.step) for u in ups]
    assert order == [(None, s) for s in range(1, 9)] + [(0, 9), (0, 10)] + [(None, s) for s in range(9, 21)]
    assert [u.opened for u in ups if u.opened is not None] == [0] and ups[7].opened == 0
    assert [(u.branch, u.step) for u in ups if u.closed is not None] == [(0, 10)]
    assert [(u.branch, u.step) for u in ups if u.budget_end is not None] == [(0, 10), (None, 20)]
    assert [(u.branch, u.step) for u in ups if u.evaluate] == [(None, 5), (0, 10), (None, 10), (None, 15),
                                                              (None, 20)]


def test_branches_sharing_a_branch_point_and_opening_at_zero():
    # S = 10 (K = 5, P = 5) and S = 11 (K = round(5.5) = 6, P = 5): both branch at trunk step 5
    plan = BranchPlan.build([10, 11, 30], tokens_per_step=1, decay_fraction=0.5)
    assert plan.budgets[0].branch_step == plan.budgets[1].branch_step == 5
    ups = list(plan.walk())
    assert [u.opened for u in ups if u.opened is not None] == [0, 1]
    assert [(u.branch, u.step) for u in ups if u.budget_end is not None] == [(0, 10), (1, 11), (None, 30)]
    assert len(ups) == plan.total_steps
    # a 1-step budget with K = 1 branches at P = 0, before the first update
    plan = BranchPlan.build([1, 5], tokens_per_step=1, decay_fraction=0.2)
    pos, opened = plan.start()
    assert opened == 0 and pos == Position(0, 0, 0, 0, False)
    assert [(u.branch, u.step) for u in plan.walk()] == [(0, 1)] + [(None, s) for s in range(1, 6)]


def test_cosine_is_one_trunk_and_no_torch():
    plan = BranchPlan.build([12], tokens_per_step=1, schedule="cosine")
    ups = list(plan.walk(eval_every=0))
    assert [u.step for u in ups] == list(range(1, 13)) and all(u.branch is None for u in ups)
    assert [u.step for u in ups if u.evaluate] == [12]
    import subprocess

    code = "import sys, scaling.training.loop.branches; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
    assert out.strip() == "False"


def test_train_state_round_trips_through_json():
    import json

    from scaling.training.loop.state import TrainState

    plan = BranchPlan.build([10, 20], tokens_per_step=1)
    pos, _ = plan.start()
    for _ in range(9):
        pos, _ = plan.advance(pos)
    state = TrainState(iter=9, position=pos, tokens_seen=9 * 512, points=[{"D": 10}], wall_s=1.5,
                       last_eval={"iter": 5, "val_loss": 3.0}, best_val=3.0)
    assert pos.branch == 0 and pos.step == 9
    back = TrainState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert back == state and back.position == pos and not back.done


def test_absurd_budget_is_refused_as_a_typo():
    # 3.4e37 tokens (a fuzz-found value) would start a run that never ends; refused at once
    with pytest.raises(UserError, match="likely typo"):
        BranchPlan.build([1e5, 3.4e37], tokens_per_step=512)
    assert BranchPlan.build([512 * 10**9], tokens_per_step=512).trunk.steps == 10**9
