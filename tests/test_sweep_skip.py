"""Issue 25, "a sweep skips a finished run by final.json alone": a run is skipped only when its
recorded config is the plan's and every output the plan asks for exists; a run killed while
writing its final weights is resumed (and gets them), a run of another config is refused, by the
dry run and the real sweep alike."""

from __future__ import annotations

import json

from test_sweep import MINI
from typer.testing import CliRunner

from cli import app
from scaling.training.sweep.plan import load_plan
from scaling.training.sweep.submit import planned_status, run_progress

runner = CliRunner()


def _plan(tmp_path, lr="3e-3"):
    text = (MINI.replace('"tiny-a", "tiny-b"', '"tiny-a"').replace('["baseline", "smelt"]', '["baseline"]')
            .replace("budgets = [1024, 2048, 4096]", "budgets = [1024]")
            .replace("lr = 3e-3", f"lr = {lr}\nsave_final_weights = true")
            .replace('kind = "local"', 'kind = "debug"'))
    path = tmp_path / "plan.toml"
    path.write_text(text.format(runs=tmp_path / "runs"))
    return path


def test_skip_only_the_same_finished_run_with_its_outputs(tmp_path, env):
    plan = _plan(tmp_path)
    res = runner.invoke(app, ["sweep", str(plan), "--no-probe", "--json"])
    assert res.exit_code == 0, res.output
    folder = tmp_path / "runs" / "tiny-a-baseline-s0"
    weights = folder / "final_weights.safetensors"
    assert json.loads(res.stdout)["status"] == {"tiny-a-baseline-s0": "done"} and weights.is_file()
    # killed while writing its final weights: final.json is complete, the weights are not there
    weights.unlink()
    run = load_plan(plan).runs[0]
    assert planned_status(run, tmp_path / "runs") == "partial"
    res = runner.invoke(app, ["sweep", str(plan), "--no-probe", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["skipped"] == [] and weights.is_file(), res.output
    res = runner.invoke(app, ["sweep", str(plan), "--no-probe", "--json"])
    assert json.loads(res.stdout)["skipped"] == ["tiny-a-baseline-s0"]  # now it is finished
    # the same folder under a plan with another [train] config: refused, dry run and real run alike
    other = _plan(tmp_path, lr="1e-3")
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name != ".lock"}
    errors = []
    for extra in (["--dry-run"], []):
        res = runner.invoke(app, ["sweep", str(other), "--no-probe", *extra])
        assert res.exit_code == 2, res.output
        errors.append(res.stderr)
    assert errors[0] == errors[1] and errors[0].count("\n") == 1
    assert "run tiny-a-baseline-s0" in errors[0] and "another configuration" in errors[0]
    assert "train.lr 0.003 -> 0.001" in errors[0]
    assert before == {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name != ".lock"}


def _budgets_plan(tmp_path, budgets: str, runs: str, schedule: str = "wsd", final_weights: bool = False):
    weights = "\nsave_final_weights = true" if final_weights else ""
    text = (MINI.replace('"tiny-a", "tiny-b"', '"tiny-a"').replace('["baseline", "smelt"]', '["baseline"]')
            .replace("budgets = [1024, 2048, 4096]", f"budgets = [{budgets}]")
            .replace("lr = 3e-3", f'lr = 3e-3\nschedule = "{schedule}"{weights}')
            .replace('kind = "local"', 'kind = "debug"'))
    path = tmp_path / f"plan-{runs}-{budgets.replace(', ', '-')}{'-w' if final_weights else ''}.toml"
    path.write_text(text.format(runs=tmp_path / runs))
    return path


def test_a_finished_wsd_run_trained_further_is_the_shorter_plans_run(tmp_path, env):
    for budgets, runs in (("1024, 2048", "a"), ("1024, 2048, 4096", "b")):
        plan = _budgets_plan(tmp_path, budgets, runs)
        res = runner.invoke(app, ["sweep", str(plan), "--no-probe", "--json"])
        assert res.exit_code == 0, res.output
    points = {k: json.loads((tmp_path / k / "tiny-a-baseline-s0" / "final.json").read_text())["points"]
              for k in ("a", "b")}
    # the premise, bitwise: the longer run's points at the shorter plan's budgets are that plan's
    assert [p["loss"] for p in points["a"]] == [p["loss"] for p in points["b"][:2]]
    assert [p["D"] for p in points["a"]] == [p["D"] for p in points["b"][:2]]
    # so the shorter plan finds its run done in the longer run's folder, and leaves it alone
    into_b = _budgets_plan(tmp_path, "1024, 2048", "b")
    assert planned_status(load_plan(into_b).runs[0], tmp_path / "b") == "done"
    folder = tmp_path / "b" / "tiny-a-baseline-s0"
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name != ".lock"}
    res = runner.invoke(app, ["sweep", str(into_b), "--no-probe", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["skipped"] == ["tiny-a-baseline-s0"], res.output
    assert before == {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name != ".lock"}
    # its progress line shows it at the plan's last budget, not at the longer run's
    shown = run_progress(load_plan(into_b), load_plan(into_b).runs[0])
    assert shown.status == "done" and shown.val_loss == points["b"][1]["loss"] != points["b"][2]["loss"]
    # not the other way: a longer plan over a shorter finished run is another configuration
    into_a = _budgets_plan(tmp_path, "1024, 2048, 4096", "a")
    res = runner.invoke(app, ["sweep", str(into_a), "--no-probe", "--dry-run"])
    assert res.exit_code == 2 and "train.tokens" in res.stderr and "another configuration" in res.stderr
    # nor budgets that are not a prefix, nor a longer run that has not finished
    other = _budgets_plan(tmp_path, "2048", "b")
    assert planned_status(load_plan(other).runs[0], tmp_path / "b") == "differs"
    # nor when the plan wants final weights: the longer run's are of its own last budget
    wants_weights = _budgets_plan(tmp_path, "1024, 2048", "b", final_weights=True)
    assert planned_status(load_plan(wants_weights).runs[0], tmp_path / "b") == "differs"
    (folder / "final.json").unlink()
    assert planned_status(load_plan(into_b).runs[0], tmp_path / "b") == "differs"


def test_extends_is_wsd_budget_prefixes_only():
    from scaling.training.sweep.submit import extends

    wsd = {"schedule": "wsd", "tokens": [1.0, 2.0, 3.0]}
    assert extends(wsd, {"schedule": "wsd", "tokens": [1.0, 2.0]})
    assert not extends(wsd, {"schedule": "wsd", "tokens": [1.0, 2.0, 3.0]})      # the same: no diff anyway
    assert not extends(wsd, {"schedule": "wsd", "tokens": [2.0]})
    assert not extends(wsd, {"schedule": "wsd", "tokens": []})
    assert not extends({**wsd, "schedule": "cosine"}, {"schedule": "cosine", "tokens": [1.0]})
    # the further budgets must come after the plan's: sorted, a smaller one would be budget 0
    assert not extends({**wsd, "tokens": [1.0, 2.0, 0.5]},
                       {"schedule": "wsd", "tokens": [1.0, 2.0]})
    assert not extends({"schedule": "wsd", "tokens": "1,2"}, {"schedule": "wsd", "tokens": [1.0]})
