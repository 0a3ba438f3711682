"""plans/fit_lr_rule.py, the per-width lr rule of the proxy study: it reads the lr sweep through the
package's runs reader, finds a planted optimum, and refuses a folder that is not an lr sweep."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def rule():
    spec = importlib.util.spec_from_file_location("fit_lr_rule", ROOT / "plans" / "fit_lr_rule.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_shipped_sweep_reads_as_two_widths_of_six_lrs_and_two_seeds(rule):
    for arch in ("baseline", "smelt"):
        data = rule.load(ROOT / "runs-lr", 1, arch)
        assert sorted(data) == [6, 56]
        for by_lr in data.values():
            assert len(by_lr) == 6 and all(sorted(runs) == [0, 1] for runs in by_lr.values())


def test_the_least_squares_vertex_is_the_planted_optimum(rule):
    # L = 5 + 0.1 (log10 lr - log10 0.01)^2 at 6 lrs, 2 seeds 0.001 apart: the vertex is 0.01
    lrs = [10 ** x for x in (-3.0, -2.5, -2.2, -1.8, -1.5, -1.0)]
    by_lr = {lr: {s: (1e5, 5 + 0.1 * (math.log10(lr) + 2) ** 2 + 0.001 * s) for s in (0, 1)} for lr in lrs}
    got = rule.ls_optimum(by_lr)
    assert got["bracketed"] and got["lr"] == pytest.approx(0.01, rel=1e-9)
    assert got["lo"] < 0.01 < got["hi"]


def test_a_folder_that_is_not_an_lr_sweep_is_a_one_line_error():
    res = subprocess.run([sys.executable, str(ROOT / "plans" / "fit_lr_rule.py"), str(ROOT / "runs")],
                         capture_output=True, text=True)
    assert res.returncode == 2 and res.stderr.startswith("error: ") and res.stderr.count("\n") == 1
    assert "is not an lr-sweep run" in res.stderr
