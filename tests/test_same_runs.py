"""plans/same_runs.py: runs two folders share are compared bitwise on what training decides, not on
what the machine measured; a run extended to a later budget is compared on the budgets it shares."""

import importlib.util
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "plans" / "same_runs.py"


def load():
    spec = importlib.util.spec_from_file_location("same_runs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(root: Path, name: str, losses: list[float], wall: float, step_loss: float = 3.0) -> None:
    d = root / name
    d.mkdir(parents=True)
    points = [{"run": name, "budget_index": i, "D": 100 * (i + 1), "loss": x, "wall_s": wall}
              for i, x in enumerate(losses)]
    (d / "config.json").write_text("{}")
    (d / "final.json").write_text(json.dumps({"run": name, "complete": True, "points": points}))
    lines = [{"iter": i, "step": i, "branch": None, "train_loss": step_loss + i, "wall_s": wall * i,
              "peak_mem_bytes": int(wall * 1e6)} for i in range(1, 4)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_equal_runs_differ_only_in_timing_and_an_extension_is_compared_on_what_it_shares(tmp_path):
    same = load()
    run(tmp_path / "a", "r1", [3.0, 2.5], wall=1.0)
    run(tmp_path / "b", "r1", [3.0, 2.5, 2.2], wall=2.0)      # retrained to a later budget, slower
    run(tmp_path / "a", "r2", [3.0], wall=1.0)
    run(tmp_path / "b", "r2", [3.0 + 2 ** -40], wall=1.0, step_loss=3.0 + 2 ** -40)  # one ulp-ish off
    run(tmp_path / "b", "only-b", [1.0], wall=1.0)
    out = same.compare(tmp_path / "a", tmp_path / "b")
    assert out["runs"] == 2
    assert (out["points_equal"], out["points_different"]) == (2, 1)
    assert (out["lines_equal"], out["lines_different"]) == (3, 3)
    assert out["differences"] == ["r2 budget 0: loss"]
