"""Inputs a review found to crash a command or to pass unchecked (2026-12-07): each is now a one-line
``error:`` with exit 2 before anything is written, or a run skipped with a warning."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def one_line_exit_2(res, fragment: str) -> None:
    assert res.exit_code == 2, (res.exit_code, res.output)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and fragment in lines[0], res.stderr


def test_a_seed_beyond_int64_is_refused_before_the_run_folder_is_written(tmp_path):
    """torch.manual_seed takes an int64: 10^20 failed with a traceback after config.json was written,
    and the same command then found a run in its folder."""
    runs = tmp_path / "runs"
    res = runner.invoke(app, ["train", "--tier", "proxy-tiny", "--arch", "baseline", "--batch-size", "2",
                              "--tokens", "4096", "--runs-dir", str(runs), "--seed", str(10**20)])
    one_line_exit_2(res, "seed must be in [0, 2^63 - 1]")
    assert not runs.exists()
    plan = tmp_path / "p.toml"
    plan.write_text('[sweep]\nname = "x"\ntiers = ["proxy-tiny"]\narchs = ["baseline"]\n'
                    f'seeds = [{10**20}]\nbudgets = [4096.0]\nruns_dir = "{runs}"\n')
    one_line_exit_2(runner.invoke(app, ["sweep", str(plan), "--dry-run"]), "seeds must be")
    assert not runs.exists()


def _table(tmp_path: Path, run0: str = "", group: str | None = None) -> Path:
    rows = [(run0, 1e6, 1e7, 3.1), ("b", 2e6, 1e7, 3.0), ("c", 4e6, 2e7, 2.8), ("d", 8e6, 4e7, 2.6),
            ("e", 1.6e7, 8e7, 2.5), ("f", 3.2e7, 1.6e8, 2.4), ("g", 6.4e7, 1.6e8, 2.3)]
    head = "run,N,D,loss" + (",family" if group is not None else "")
    body = [f"{r},{n},{d},{l}" + (f",{group if i == 0 else 'x'}" if group is not None else "")
            for i, (r, n, d, l) in enumerate(rows)]
    path = tmp_path / "t.csv"
    path.write_text("\n".join([head, *body]) + "\n")
    return path


def test_a_missing_run_id_or_group_is_refused_not_a_run_named_nan(tmp_path):
    """A blank run id crashed `fit` (pandas keeps NaN through astype(str), then np.unique compared str
    with float); a blank group made a group 'nan'."""
    one_line_exit_2(runner.invoke(app, ["fit", str(_table(tmp_path)), "--bootstrap", "0"]),
                    "column 'run' gives no run id in 1 row(s) (data row 1)")
    ok = runner.invoke(app, ["fit", str(_table(tmp_path)), "--bootstrap", "0", "--run-col", "none"])
    assert ok.exit_code == 0, ok.output
    one_line_exit_2(runner.invoke(app, ["fit", str(_table(tmp_path, "a", "")), "--bootstrap", "0",
                                        "--group-col", "family"]), "column 'family' gives no group")


@pytest.mark.parametrize("edit, why", [
    (lambda d: [p.update(arch=None) for p in d["points"]], "arch 'None' is not a name"),
    (lambda d: d["points"][0].update(seed=[1]), "seed '[1]' is not an integer or a name"),
    (lambda d: d["points"][0].update(tier={}), "tier '{}' is not a name"),
    (lambda d: d["points"][0].update(budget_index="x"), "budget_index 'x' is not an integer >= 0"),
    (lambda d: d.pop("points"), "no N or D in its point"),
    (lambda d: d["points"][0].update(run=None), "run 'None' is not a name"),
])
def test_a_tampered_final_json_skips_its_run_with_a_warning(tmp_path, edit, why):
    """These crashed `compare` (TypeError, unhashable type, NaN to int) or, for "run": null, replaced
    the folder's name by 'None'. The run is skipped and named, like one with a non-number loss."""
    src = ROOT / "runs"
    if not src.is_dir():
        pytest.skip("the shipped runs/ folder is absent")
    runs = tmp_path / "runs"
    for name in ("iso-d04-baseline-s0", "iso-d04-smelt-s0", "iso-d04-baseline-s1", "iso-d04-smelt-s1"):
        shutil.copytree(src / name, runs / name)
    final = runs / "iso-d04-baseline-s0" / "final.json"
    doc = json.loads(final.read_text())
    edit(doc)
    final.write_text(json.dumps(doc))
    res = runner.invoke(app, ["compare", str(runs), "--json"])
    assert res.exit_code == 0, res.output
    assert f"skipped run iso-d04-baseline-s0: unreadable final.json ({why})" in res.stderr
    assert json.loads(res.stdout)["n_points"] == 9     # the three other runs, 3 budgets each
    fit = runner.invoke(app, ["fit", str(runs), "--bootstrap", "0", "--json"])
    assert "Traceback" not in fit.output and fit.exit_code in (0, 2)


@pytest.mark.parametrize("value, why", [("1", "must lie in [0, 1)"), ("nan", "must lie in [0, 1)"),
                                        ("-0.1", "must lie in [0, 1)"), ("0.5,0.5", "given twice")])
def test_a_sparsity_out_of_range_is_refused_before_anything_is_fitted(value, why):
    """`savings --sparsity 1` printed a table (the envelope answered and no law row read S), and
    `0.5,0.5` printed every row twice."""
    one_line_exit_2(runner.invoke(app, ["savings", str(ROOT / "runs"), "--budget", "1e12", "--bootstrap", "0",
                                        "--sparsity", value]), why)


@pytest.mark.parametrize("extra, why", [
    ((), "--law chinchilla fits none (give --law smelt)"),
    (("--method", "envelope"), "--method envelope reads no law"),
])
def test_a_sparsity_no_law_reads_is_refused_even_where_the_envelope_answers(extra, why):
    """At 1.12e12 the envelope answers and no law row is made: --sparsity 0.5 was silently unread."""
    one_line_exit_2(runner.invoke(app, ["savings", str(ROOT / "runs"), "--budget", "1.12e12", "--bootstrap",
                                        "0", "--sparsity", "0.5", *extra]), why)


@pytest.mark.parametrize("section, key, value, why", [
    ("data_summary", "sparsities", ["a"], "data_summary.sparsities must be a list of numbers in [0, 1)"),
    ("data_summary", "sparsities", [-5, 2], "data_summary.sparsities must be a list of numbers in [0, 1)"),
    ("data_summary", "sparsities", 3, "data_summary.sparsities must be a list of numbers in [0, 1)"),
    ("settings", "ci_level", "abc", "settings.ci_level must be a number in (0, 1)"),
    ("settings", "ci_level", 5, "settings.ci_level must be a number in (0, 1)"),
    ("diagnostics", "goodness_of_fit", "x", "diagnostics.goodness_of_fit must be an object"),
])
def test_a_fits_file_field_that_commands_read_is_checked_on_load(tmp_path, section, key, value, why):
    """Fields read by savings/plan/simulate (the default sparsity) and plot (the level, the residual
    trend) crashed them, or moved the default S: sparsities [-5, 2] made `savings` print -137.75%."""
    from scaling.common.errors import UserError
    from scaling.fitting.result import FitSet

    entry = {"law": "chinchilla", "params": {"E": 1.7, "A": 400.0, "alpha": 0.34, "B": 410.0, "beta": 0.28},
             "n_points": 9, section: {key: value}}
    path = tmp_path / "fits.json"
    path.write_text(json.dumps({"schema": "smelt-scale.fit/2", "fits": {"baseline": entry, "smelt": entry}}))
    with pytest.raises(UserError, match="not a fit entry.*" + why.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[")):
        FitSet.load(path)
    one_line_exit_2(runner.invoke(app, ["savings", "--fits", str(path), "--budget", "1e21"]), why)


@pytest.mark.parametrize("bad, why", [("-1e18", "must be > 0"), ("0", "must be > 0"),
                                      ("", "is missing or not finite")])
def test_a_compute_column_that_is_not_positive_is_refused(tmp_path, bad, why):
    """`fit --c-col flops` took negative, zero and missing compute without a word (N and D were given,
    so the compute was only carried along as each point's budget)."""
    path = tmp_path / "t.csv"
    rows = [(1e6, 1e7, 3.1), (2e6, 1e7, 3.0), (4e6, 2e7, 2.8), (8e6, 4e7, 2.6), (1.6e7, 8e7, 2.5),
            (3.2e7, 1.6e8, 2.4), (6.4e7, 1.6e8, 2.3)]
    path.write_text("N,D,loss,flops\n" + "\n".join(
        f"{n},{d},{l},{bad if i == 2 else 6 * n * d}" for i, (n, d, l) in enumerate(rows)) + "\n")
    one_line_exit_2(runner.invoke(app, ["fit", str(path), "--c-col", "flops", "--bootstrap", "0"]),
                    f"C ('flops') {why}")


def test_figures_never_go_into_a_run_folder(tmp_path):
    """`plot --out runs/<run> --force` wrote figures into a run folder, which only its training writes."""
    run = tmp_path / "runs" / "r"
    shutil.copytree(ROOT / "runs" / "iso-d04-baseline-s0", run)
    before = sorted(p.name for p in run.iterdir())
    one_line_exit_2(runner.invoke(app, ["plot", "loss-curves", "--runs", str(tmp_path / "runs"), "--out",
                                        str(run), "--force"]), "is a run folder")
    assert sorted(p.name for p in run.iterdir()) == before
    # nor a file of another command's, at any depth (compare --plot and fit --out wrote there)
    one_line_exit_2(runner.invoke(app, ["compare", str(ROOT / "runs"), "--plot", str(run / "c.png")]),
                    f"is inside run folder {run.resolve()}")
    one_line_exit_2(runner.invoke(app, ["fit", str(ROOT / "runs"), "--bootstrap", "0", "--out",
                                        str(run / "sub" / "f.json")]), "is inside run folder")
    assert sorted(p.name for p in run.iterdir()) == before


def test_a_run_name_too_long_for_a_folder_gets_the_naming_rule(tmp_path):
    """300 characters failed with "File name too long: .../config.json" from the folder check."""
    res = runner.invoke(app, ["train", "--tier", "proxy-tiny", "--arch", "baseline", "--tokens", "4096",
                              "--runs-dir", str(tmp_path / "runs"), "--run-name", "a" * 300])
    one_line_exit_2(res, "is not a valid name: 1-64 letters")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args", [["calibrate", "t.csv", "--task", "x", "--metric", "acc"],
                                  ["plot", "savings", "--out", "{tmp}"],
                                  ["savings", "--budget", "1e12", "--bootstrap", "0"]])
def test_the_same_group_as_reference_and_candidate_is_refused(tmp_path, args):
    """`compare` and `savings` refused it; `calibrate` and `plot savings` compared a group with itself."""
    args = [a.replace("{tmp}", str(tmp_path / "figs")) for a in args]
    one_line_exit_2(runner.invoke(app, [*args, "--reference", "smelt", "--candidate", "smelt"]),
                    "--reference and --candidate are the same group 'smelt'")


@pytest.mark.parametrize("extra, why", [(["--budget", "0,0"], "--budget gives a budget index twice"),
                                        (["{run}/"], "a run folder is given twice")])
def test_eval_refuses_a_budget_or_run_given_twice(tmp_path, extra, why):
    """Each (run, budget) is one row of eval's table; given twice, the table had duplicate rows."""
    run = str(ROOT / "runs" / "iso-d04-baseline-s0")
    args = ["eval", run, *[e.replace("{run}", run) for e in extra], "--tasks", "x", "--data", str(tmp_path)]
    one_line_exit_2(runner.invoke(app, args), why)


def test_checkpoints_never_go_into_another_runs_folder(tmp_path):
    """`train --ckpt-dir <another run>/ck` wrote its checkpoints into that run's folder."""
    other = tmp_path / "other"
    shutil.copytree(ROOT / "runs" / "iso-d04-baseline-s0", other)
    before = sorted(p.name for p in other.iterdir())
    res = runner.invoke(app, ["train", "--tier", "proxy-tiny", "--arch", "baseline", "--tokens", "4096",
                              "--batch-size", "2", "--runs-dir", str(tmp_path / "runs"), "--ckpt-dir",
                              str(other / "ck")])
    one_line_exit_2(res, "lies in the run folder")
    assert sorted(p.name for p in other.iterdir()) == before and not (tmp_path / "runs").exists()


def test_a_warmup_longer_than_the_smallest_budget_is_refused(tmp_path):
    """--warmup 1e8 was accepted: no budget would ever train at the peak lr. A warmup that only
    overlaps a cooldown is a schedule (the default warmup does so above a decay fraction of 0.9)."""
    runs = tmp_path / "runs"
    # 4096 and 8192 tokens of batch 2 x 64: 32 and 64 updates
    base = ["train", "--tier", "proxy-tiny", "--arch", "baseline", "--batch-size", "2",
            "--tokens", "4096,8192", "--runs-dir", str(runs)]
    one_line_exit_2(runner.invoke(app, [*base, "--warmup", "100000000"]),
                    "warmup of 100000000 updates is longer than the smallest budget (32 updates, 4,096")
    assert not runs.exists()
    one_line_exit_2(runner.invoke(app, [*base, "--warmup", "33"]), "give at most 32")
    plan = tmp_path / "p.toml"
    body = ('[sweep]\nname = "x"\ntiers = ["proxy-tiny"]\narchs = ["baseline"]\nseeds = [0]\n'
            f'budgets = [4096.0]\nruns_dir = "{runs}"\n[train]\nbatch_size = 2\ndecay_fraction = 1.0\n')
    plan.write_text(body + "warmup = 4000\n")
    one_line_exit_2(runner.invoke(app, ["sweep", str(plan), "--dry-run"]), "warmup of 4000 updates")
    plan.write_text(body + "warmup = 32\n")   # all warmup, then all cooldown: a schedule, accepted
    res = runner.invoke(app, ["sweep", str(plan), "--dry-run", "--no-probe"])
    assert res.exit_code == 0, res.output
    assert not runs.exists()


def test_shard_tokens_that_would_write_a_file_per_token_are_refused(tmp_path):
    """--shard-tokens 1 was accepted: up to one shard file per input byte."""
    text = tmp_path / "a.txt"
    text.write_text("abcdefgh\n" * 250_000)  # 2.25 MB
    out = tmp_path / "shards"
    one_line_exit_2(runner.invoke(app, ["prepare-data", str(text), "--out", str(out), "--vocab-size", "300",
                                        "--shard-tokens", "1"]),
                    "into up to 2,250,000 shard files (more than 1,000,000); give at least 3")
    assert not out.exists() and list(tmp_path.iterdir()) == [text]


@pytest.mark.skipif(not Path("/proc/version").is_file(), reason="needs Linux's /proc")
def test_an_output_where_nothing_can_be_created_is_refused_before_the_fit(tmp_path):
    """As root, os.access says /proc is writable: `fit --out /proc/version --force` fitted, then failed
    writing. A file is now made (and dropped unseen) where the output goes, first."""
    res = runner.invoke(app, ["fit", str(ROOT / "runs"), "--bootstrap", "0", "--out", "/proc/version",
                              "--force"])
    one_line_exit_2(res, "cannot write in /proc")
    assert res.stdout == ""
