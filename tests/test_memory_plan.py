"""The memory planner in sweep plans: [parallel] keys, the dry run's memory columns and JSON, and
the refusal of a plan that does not fit its gpu_memory_gb (one line, exit 2, nothing started)."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app
from scaling.common.errors import UserError
from scaling.training.sweep.plan import load_plan

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "plans" / "paper-tiers.toml"
PARTS = {"total", "params", "grads", "optimizer", "activations", "working", "buffers"}


def _paper(tmp_path, edit=lambda s: s):
    path = tmp_path / "paper.toml"
    text = PAPER.read_text().replace('runs_dir = "runs-paper"', f'runs_dir = "{tmp_path / "runs"}"')
    path.write_text(edit(text))
    return path


def test_paper_plan_fits_every_run_and_its_copy_is_identical():
    assert PAPER.read_text() == (ROOT / "scaling" / "resources" / "plans" / "paper-tiers.toml").read_text()
    res = runner.invoke(app, ["sweep", str(PAPER), "--dry-run", "--json"])
    # the shipped plan's [data] path is for the cluster: the dry run prints its estimates, then
    # refuses the missing data as the real sweep would (issue 25)
    assert res.exit_code == 2 and "[data] path data/paper-shards does not exist" in res.stderr, res.output
    rows = json.loads(res.stdout)["runs"]
    assert len(rows) == 8
    for r in rows:
        assert set(r["memory_gb_per_gpu"]) == PARTS and r["gpu_memory_gb"] == 141 and r["fits"] is True
        mem = r["memory_gb_per_gpu"]
        assert mem["total"] == pytest.approx(sum(v for k, v in mem.items() if k != "total"))
        assert r["communication_gb_per_step"]["total"] > 0
    by = {r["run"]: r for r in rows}
    assert by["1.6B-smelt-s0"]["layout"]["nodes"] == 4 and by["100M-smelt-s0"]["layout"]["nodes"] == 1
    assert by["1.6B-smelt-s0"]["layout"]["micro_batch_size"] == 8
    assert by["1.6B-smelt-s0"]["layout"]["grad_accum_steps"] == 2  # 512 / (32 GPUs x 8)


def test_dry_run_refuses_a_plan_that_does_not_fit(tmp_path):
    # per-pass reduction of the looped gradients (the default) fits every run in 80 GB ...
    res = runner.invoke(app, ["sweep", str(_paper(tmp_path, lambda s: s.replace(
        "gpu_memory_gb = 141", "gpu_memory_gb = 80"))), "--dry-run", "--json"])
    assert all(r["fits"] and r["layout"]["loop_grad"] == "per-pass" for r in json.loads(res.stdout)["runs"])
    # ... FSDP2's own reduction does not fit SMELT at 600M and 1.6B
    plan = _paper(tmp_path, lambda s: s.replace("gpu_memory_gb = 141",
                                                'gpu_memory_gb = 80\nloop_grad = "fsdp"'))
    res = runner.invoke(app, ["sweep", str(plan), "--dry-run"])
    assert res.exit_code == 2
    errors = [line for line in res.stderr.splitlines() if not line.startswith("warning: ")]  # [data] path
    assert len(errors) == 1 and errors[0].startswith("error: tier 600M (600M-smelt-s0) needs ")
    assert "GB more than gpu_memory_gb = 80" in res.stderr and "1.6B-smelt-s0 (+" in res.stderr
    assert "NO" in res.stdout and "mem/GPU GB" in res.stdout  # the table is printed first
    res = runner.invoke(app, ["sweep", str(plan), "--dry-run", "--json"])
    assert res.exit_code == 2 and res.stderr.startswith("error: tier 600M")
    fits = {r["run"]: r["fits"] for r in json.loads(res.stdout)["runs"]}
    assert fits["100M-smelt-s0"] is True and fits["600M-smelt-s0"] is False and fits["1.6B-smelt-s0"] is False


def test_real_run_is_refused_before_anything_starts(tmp_path):
    plan = _paper(tmp_path, lambda s: s.replace("gpu_memory_gb = 141", "gpu_memory_gb = 15"))
    res = runner.invoke(app, ["sweep", str(plan), "--executor", "debug", "--no-wait"])
    assert res.exit_code == 2 and res.stderr.startswith("error: tier 100M") and "needs" in res.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("edit, msg", [
    (lambda s: s.replace('mode = "fsdp"', 'mode = "fsdp"\nshards = 8'),
     "unknown [parallel] keys: shards; valid keys: mode, gpus_per_node, nodes, replicate, gpu_memory_gb"),
    (lambda s: s.replace("nodes = 4  ", "node = 4  "), 'unknown [tier."1.6B".parallel] keys: node'),
    (lambda s: s.replace("nodes = 4  ", "nodes = 0  "),
     '[tier."1.6B".parallel] nodes must be a positive integer'),
    (lambda s: s.replace('mode = "fsdp"', 'mode = "zero"'),
     "[parallel] mode must be one of none, ddp, fsdp, hsdp"),
    (lambda s: s.replace("gpu_memory_gb = 141", "gpu_memory_gb = -1"), "gpu_memory_gb must be a positive"),
    (lambda s: s.replace("micro_batch_size = 16", "micro_batch_size = 24"),
     "does not divide the per-GPU batch 64"),
])
def test_bad_parallel_tables_are_one_line_errors(tmp_path, edit, msg):
    plan = _paper(tmp_path, edit)
    with pytest.raises(UserError, match=msg.replace("[", r"\[").replace(".", r"\.")):
        load_plan(plan)
    res = runner.invoke(app, ["sweep", str(plan), "--dry-run"])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and msg in res.stderr


def test_plan_without_parallel_table_has_no_verdict():
    plan = load_plan(ROOT / "plans" / "cpu-proxy.toml")
    lay = plan.runs[0].layout()
    assert lay.mode == "none" and lay.compute_dtype == "fp32" and plan.runs[0].gpu_memory_gb is None



def test_h100_plan_fits_every_run_with_expert_parallelism(tmp_path):
    """plans/paper-tiers-h100.toml: the eight runs on 80 GB GPUs with EP 8 inside a node (planner);
    the same plan without EP fits too with per-pass looped gradients, but not SMELT at 600M
    with FSDP2's own (loop_grad = "fsdp")."""
    h100 = ROOT / "plans" / "paper-tiers-h100.toml"
    res = runner.invoke(app, ["sweep", str(h100), "--dry-run", "--json"])
    # the estimates are printed; the only refusal is the [data] folder this machine does not have
    assert res.exit_code == 2 and "[data] path data/paper-shards does not exist" in res.stderr, res.output
    rows = json.loads(res.stdout)["runs"]
    assert len(rows) == 8 and all(r["fits"] and r["gpu_memory_gb"] == 80 for r in rows)
    assert all(r["layout"]["ep"] == 8 and r["communication_gb_per_step"]["all_to_all"] > 0 for r in rows)
    no_ep = tmp_path / "no-ep.toml"
    no_ep.write_text(h100.read_text().replace("\nep = 8 ", "\n# ep = 8 "))
    res = runner.invoke(app, ["sweep", str(no_ep), "--dry-run", "--json"])
    assert all(r["fits"] for r in json.loads(res.stdout)["runs"])
    no_ep.write_text(h100.read_text().replace("\nep = 8 ", '\nloop_grad = "fsdp"\n# ep = 8 '))
    res = runner.invoke(app, ["sweep", str(no_ep), "--dry-run"])
    assert res.exit_code == 2 and "error: tier 600M (600M-smelt-s0) needs" in res.stderr
