"""benchmarks/behaviour_diff.py: the diff of two output folders (the commands themselves are run by
hand before and after a refactor; see its docstring)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from behaviour_diff import diff, main  # noqa: E402


def _write(folder: Path, name: str, output) -> None:
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps({"args": [], "exit_code": 0, "output": output}))


def test_identical_different_ignored_and_missing(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    _write(a, "same", {"x": [1.0, 2.0], "y": {"z": None}})
    _write(b, "same", {"x": [1.0, 2.0], "y": {"z": None}})
    _write(a, "float", {"x": [0.1 + 0.2]})
    _write(b, "float", {"x": [0.3]})                          # one ulp apart: a difference
    _write(a, "added", {"x": 1, "fits": {"g": {"p": 1}}})
    _write(b, "added", {"x": 1, "fits": {"g": {"p": 1, "data": [1]}}})
    _write(a, "order", {"x": 1, "y": 2})
    _write(b, "order", {"y": 2, "x": 1})
    _write(a, "gone", {})
    res = diff(a, b)
    assert not res["identical"]
    c = res["commands"]
    assert c["same"] == "identical" and c["gone"] == "missing in after"
    assert c["float"] == ["/output/x/0: 0.30000000000000004 != 0.3"]
    assert c["added"] == ["/output/fits/g/data: only in after"]
    assert c["order"] == ["/output: keys in another order"]
    assert diff(a, b, frozenset({"data"}))["commands"]["added"] == "identical"
    assert main(["diff", str(a), str(b), "--json", "--ignore", "data"]) == 1
    assert json.loads(capsys.readouterr().out)["commands"]["added"] == "identical"
