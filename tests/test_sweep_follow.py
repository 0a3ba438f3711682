"""Following a sweep (issue 29): a failed run is reported the moment its job fails, with its log;
--fail-fast cancels the rest; a Slurm sweep returns after submission and --watch follows it."""

import json

import pytest
import submitit
from typer.testing import CliRunner

from cli import app
from scaling.training.sweep import submit as sweep_lib
from scaling.training.sweep.submit import failure_reason, run_status
from tests.test_sweep import MINI

runner = CliRunner()


def _plan(tmp_path, extra: str = "", tiers='["tiny-a", "tiny-b"]', budgets="[1024, 2048, 4096]"):
    text = MINI.format(runs=tmp_path / "runs").replace('tiers = ["tiny-a", "tiny-b"]', f"tiers = {tiers}")
    text = text.replace("budgets = [1024, 2048, 4096]", f"budgets = {budgets}")
    path = tmp_path / "plan.toml"
    path.write_text(text.replace("concurrency = 2", "concurrency = 4") + extra)
    return path


def test_failure_reason_is_one_line():
    exc = RuntimeError("Job (task=0) failed during processing with trace:\n----------------------\n"
                       "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                       "scaling.common.errors.UserError: device 'cuda' requested but CUDA is not available\n")
    assert failure_reason(exc) == "UserError: device 'cuda' requested but CUDA is not available"
    assert failure_reason(None) == "failed"


@pytest.mark.slow  # 4 submitit processes importing torch: 30-90 s on 2 shared cores
def test_failing_run_reported_at_once_and_fail_fast_cancels_the_rest(tmp_path, monkeypatch):
    """tiny-a's runs ask for CUDA on a CPU machine: they fail at start. Each is reported on one line
    with its log, and --fail-fast cancels tiny-b's long runs, which never finish."""
    monkeypatch.setenv("SMELT_CACHE", str(tmp_path / "cache"))
    extra = '\n[tier."tiny-a"]\ndevice = "cuda"\n\n[tier."tiny-b"]\nbudgets = [200000, 400000]\n'
    plan = _plan(tmp_path, extra)
    res = runner.invoke(app, ["sweep", str(plan), "--no-probe", "--fail-fast", "--max-epochs", "100",
                              "--json"])
    assert res.exit_code == 1, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("failed: run tiny-a-")]
    assert lines and all("CUDA is not available" in ln and "(log: " in ln for ln in lines), res.stderr
    assert "Traceback" not in res.stderr and "cancelled: tiny-b-" in res.stderr
    doc = json.loads(res.stdout)
    assert doc["schema"] == "smelt-scale.sweep/1" and set(doc["failed"]) <= {"tiny-a-baseline-s0",
                                                                            "tiny-a-smelt-s0"}
    for name in ("tiny-b-baseline-s0", "tiny-b-smelt-s0"):
        assert run_status(tmp_path / "runs", name) != "done"
    assert res.stderr.strip().splitlines()[-1].startswith("error: ")


class _LocalAsSlurm(submitit.LocalExecutor):
    """submitit's local executor standing in for Slurm: takes (and ignores) Slurm's parameters."""

    def update_parameters(self, **kwargs):
        pass


@pytest.mark.slow  # 2 submitit processes training: 20-50 s on 2 shared cores
def test_slurm_sweep_returns_after_submission_and_watch_follows(tmp_path, monkeypatch):
    monkeypatch.setenv("SMELT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(sweep_lib, "make_executor",
                        lambda plan, log_dir, kind=None, **kw: (_LocalAsSlurm(folder=str(log_dir)), "slurm"))
    plan = _plan(tmp_path, tiers='["tiny-a"]', budgets="[1024, 2048]")
    text = plan.read_text().replace('kind = "local"', 'kind = "slurm"')
    plan.write_text(text)
    res = runner.invoke(app, ["sweep", str(plan), "--no-probe", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["waited"] is False and len(doc["jobs"]) == 2
    assert set(doc["status"].values()) != {"done"}  # returned while the jobs still run
    import scaling.cli.sweep as cli_sweep

    monkeypatch.setattr(cli_sweep, "WATCH_INTERVAL_S", 0.5)
    res = runner.invoke(app, ["sweep", str(plan), "--watch", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["runs"]
    assert [r["status"] for r in rows] == ["done", "done"]
    assert all(r["tokens_done"] == r["tokens_total"] and r["train_loss"] > 0 for r in rows)
