"""`smelt-scale plan-grid` (scaling.design.grid): the shipped study plans are its output, and its
token counts, lr rule and budget choice follow the stated rules (checked against the accounting)."""

from __future__ import annotations

import json
import math
import shutil
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from scaling.accounting.costs import costs
from scaling.accounting.tiers import get_config
from scaling.cli import app
from scaling.common.errors import UserError
from scaling.design.grid import LrRule, grid_plan

ROOT = Path(__file__).resolve().parents[1]
PLANS = ROOT / "plans"


def _command_of(plan_file: Path) -> list[str]:
    first = plan_file.read_text().splitlines()[0]
    assert first.startswith("# Written by `smelt-scale plan-grid ")
    return first.split("`")[1].split()[2:]  # after "smelt-scale plan-grid"


@pytest.mark.parametrize("stem", ["isoflop-study", "lr-check-oldlr", "sharedlr-check", "isoflop-topseeds",
                                  "isoflop-d04seeds", "isoflop-seeds34"])
def test_the_shipped_study_plans_are_what_the_command_writes(tmp_path, stem):
    """Rerunning the command in the header of a shipped grid plan writes both its files byte for
    byte (the extra seeds' beside it)."""
    args = _command_of(PLANS / f"{stem}.toml")
    out_at = args.index("--out") + 1
    assert args[out_at] == f"plans/{stem}.toml"
    args[args.index("--template") + 1] = str(PLANS / "isoflop-template.toml")
    shutil.copy(PLANS / "isoflop-template.toml", tmp_path / "isoflop-template.toml")
    args[out_at] = str(tmp_path / f"{stem}.toml")
    res = CliRunner().invoke(app, ["plan-grid", *args, "--json"])
    assert res.exit_code == 0, res.output
    assert list(json.loads(res.stdout)) == ["schema", "shape", "budgets", "lr_rule",  # docs/json.md
                                            "smelt_lr_rule", "extra_seeds", "sizes", "sizes_per_budget",
                                            "plan_files"]
    for name in (f"{stem}.toml", f"{stem}-seeds.toml"):
        body = lambda p: p.read_text().split("\n", 1)[1]  # noqa: E731 - the header names the paths
        assert body(tmp_path / name) == body(PLANS / name), name
    if "--archs" in args:                           # one side retrained: only that architecture runs
        archs = args[args.index("--archs") + 1].split(",")
        assert tomllib.loads((PLANS / f"{stem}-seeds.toml").read_text())["sweep"]["archs"] == archs


def test_archs_must_be_known():
    res = CliRunner().invoke(app, ["plan-grid", "--grid", "6,10,14", "--budgets", "3.56e11",
                                   "--lr-rule", "0.03,0.9", "--archs", "smelt,moe",
                                   "--template", str(PLANS / "isoflop-template.toml"), "--dry-run"])
    assert res.exit_code == 2 and "error: grid: architectures must be among baseline, smelt" in res.stderr


def test_tokens_budgets_and_lr_follow_the_rules():
    shape = get_config("proxy-xxs", "baseline")
    budgets = (3.56e11, 1.12e12, 3.56e12)
    rule = LrRule(0.05, 1.27)
    plan = grid_plan(shape, (4, 10, 14, 56), budgets, lr_rule=rule, min_tokens=200_000, last_budget={4: 1},
                     extra_seed_sizes=(14,), extra_seed_budgets=(0,))
    for s in plan.sizes:
        F = costs(s.config).flops_per_token
        assert s.flops_per_token == F and s.config.d_model == int(s.name[5:])
        assert s.lr == float(f"{0.05 * (s.config.d_model / 6) ** -1.27:.3g}")
        want = [j for j in range(len(budgets))
                if budgets[j] / F >= 200_000 and (s.config.d_model != 4 or j <= 1)]
        assert list(s.budget_indices) == want
        assert list(s.tokens) == [math.floor(budgets[j] / F) for j in want]
        for j, t in zip(s.budget_indices, s.tokens):  # each point within one token of its budget
            assert t * F <= budgets[j] < (t + 1) * F
    assert [s.name for s in plan.sizes_at(2)] == ["iso-d10", "iso-d14", "iso-d56"]  # d4 stops at 1
    assert plan.sizes[2].config.d_model == 14 and plan.sizes[0].budget_indices == (0, 1)


def test_each_architecture_trains_at_its_own_rule(tmp_path):
    """--smelt-lr-rule: the twin's lr follows its own rule (of the Baseline's d_model), the Baseline's
    stays, and the sweep reading the written plan gives each run its architecture's lr."""
    from scaling.training.sweep.plan import load_plan

    tpl = tmp_path / "tpl.toml"
    tpl.write_text('[train]\nbatch_size = 8\nlr = 1e-3\ndevice = "cpu"\n')
    out = tmp_path / "study.toml"
    res = CliRunner().invoke(app, ["plan-grid", "--grid", "6,10,14", "--budgets", "3.56e11,6.32e11",
                                   "--lr-rule", "0.05,1.0", "--smelt-lr-rule", "0.03,0.5", "--template",
                                   str(tpl), "--out", str(out), "--min-tokens", "1000", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["smelt_lr_rule"] == {"lr_ref": 0.03, "exponent": 0.5, "d_ref": 6.0}
    lrs = {(r.tier, r.arch): r.train["lr"] for r in load_plan(out).runs}
    for d in (6, 10, 14):
        assert lrs[(f"iso-d{d:02d}", "baseline")] == float(f"{0.05 * (d / 6) ** -1.0:.3g}")
        assert lrs[(f"iso-d{d:02d}", "smelt")] == float(f"{0.03 * (d / 6) ** -0.5:.3g}")
    assert "SMELT twin lr = 0.03 * (d_model/6)^-0.5" in out.read_text().splitlines()[3]
    # 'none' is the default (each twin at its Baseline's lr); a rule out of range names its flag
    res = CliRunner().invoke(app, ["plan-grid", "--grid", "6,10,14", "--budgets", "3.56e11,6.32e11",
                                   "--lr-rule", "0.05,1.0", "--smelt-lr-rule", "none", "--template", str(tpl),
                                   "--out", str(out), "--min-tokens", "1000", "--json", "--dry-run"])
    assert res.exit_code == 0 and json.loads(res.stdout)["smelt_lr_rule"] is None, res.output
    res = CliRunner().invoke(app, ["plan-grid", "--grid", "6,10,14", "--budgets", "3.56e11,6.32e11",
                                   "--lr-rule", "0.05,1.0", "--smelt-lr-rule", "500,1", "--template",
                                   str(tpl), "--out", str(out), "--dry-run"])
    assert res.exit_code == 2 and res.stderr.startswith("error: --smelt-lr-rule: lr rule: the reference lr")


@pytest.mark.parametrize("kwargs, message", [
    ({"budgets": (1e12, 1e11)}, "increasing"),
    ({"d_models": (6, 6)}, "distinct"),
    ({"last_budget": {7: 0}}, "names no grid size"),
    ({"extra_seed_budgets": (5,), "extra_seed_sizes": (6,)}, "out of range"),
    ({"extra_seed_sizes": (8,)}, "extra-seed size 8 is not in the grid"),
    ({"extra_seed_sizes": (6,), "extra_seeds": (0, 1)}, "distinct integers >= 1"),  # seed 0: main plan
    ({"extra_seed_sizes": (6,), "extra_seeds": (2, 2)}, "distinct integers >= 1"),
    ({"extra_seeds": (0,)}, "distinct integers >= 1"),        # checked without --extra-seed-sizes too
    ({"d_models": (6,)}, "has 1 size"),                                  # one size: no slice
    ({"min_tokens": 1_000_000}, r"d_model 6, 10, 14 serves no budget.*--min-tokens"),
    ({"last_budget": {6: 0, 10: 0}}, "budget 1e\\+12 has 1 size"),
])
def test_bad_grids_are_refused(kwargs, message):
    """The design audit: a single-budget grid failed on the unused second-seed default, a budget that no
    size serves, a one-size grid and a size serving no budget were accepted or named a TOML key."""
    args = {"d_models": (6, 10, 14), "budgets": (1e11, 1e12), **kwargs}
    with pytest.raises(UserError, match=message):
        grid_plan(get_config("proxy-xxs", "baseline"), args.pop("d_models"), args.pop("budgets"),
                  lr_rule=LrRule(0.05, 1.0), min_tokens=args.pop("min_tokens", 1), **args)


def test_never_overwrites_without_force(tmp_path):
    out = tmp_path / "study.toml"
    out.write_text("# mine\n")
    base = ["plan-grid", "--grid", "6,10,14", "--budgets", "3.56e11,6.32e11", "--lr-rule", "0.05,1.27",
            "--template", str(PLANS / "isoflop-template.toml"), "--out", str(out)]
    res = CliRunner().invoke(app, base)
    assert res.exit_code == 2 and "exists; give --force" in res.output
    assert out.read_text() == "# mine\n" and not (tmp_path / "study-seeds.toml").exists()
    res = CliRunner().invoke(app, [*base, "--force", "--extra-seed-sizes", "6"])
    assert res.exit_code == 0, res.output
    doc = tomllib.loads(out.read_text())
    assert doc["tier"]["iso-d06"]["lr"] == 0.05 and doc["train"]["batch_size"] == 8
    assert tomllib.loads((tmp_path / "study-seeds.toml").read_text())["sweep"]["seeds"] == [1]
    res = CliRunner().invoke(app, [*base, "--force", "--lr-rule", "abc"])
    assert res.exit_code == 2 and "--lr-rule" in res.output


def test_a_newline_in_a_path_keeps_the_header_a_comment(tmp_path):
    """The header quotes the command; a newline in --out or --runs-dir ended the comment line and the
    file failed to parse (a traceback). Control characters are escaped there; the paths themselves
    are kept."""
    out = tmp_path / "p\ng.toml"
    template = str(PLANS / "isoflop-template.toml")
    res = CliRunner().invoke(app, ["plan-grid", "--grid", "6,10,14", "--budgets", "3.56e11,6.32e11",
                                   "--lr-rule", "0.05,1.27", "--template", template,
                                   "--runs-dir", "a\nb", "--out", str(out)])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "--runs-dir 'a\\x0ab'" in text.splitlines()[0] and "g.toml'`" in text.splitlines()[0]
    assert tomllib.loads(text)["sweep"]["runs_dir"] == "a\nb"


@pytest.mark.parametrize("template, message", [
    ("train = 5\n", "[train] must be a table"),
    ("[train]\nbatch_size = -3\n", "batch_size"),
    ("[executor]\nkind = 7\n", "executor"),
])
def test_a_bad_template_writes_nothing(tmp_path, template, message):
    """A template the sweep would refuse is refused before any plan file is written, in one line
    (--force or not: the old plan stays)."""
    tpl = tmp_path / "t.toml"
    tpl.write_text(template)
    out = tmp_path / "study.toml"
    out.write_text("# mine\n")
    res = CliRunner().invoke(app, ["plan-grid", "--grid", "6,10,14", "--budgets", "3.56e11,6.32e11",
                                   "--lr-rule", "0.05,1.27", "--template", str(tpl), "--out", str(out),
                                   "--force", "--extra-seed-sizes", "6"])
    assert res.exit_code == 2 and message in res.stderr, res.output
    assert len(res.stderr.strip().splitlines()) == 1
    dry = CliRunner().invoke(app, ["plan-grid", "--grid", "6,10,14", "--budgets", "3.56e11,6.32e11",
                                   "--lr-rule", "0.05,1.27", "--template", str(tpl), "--out", str(out),
                                   "--dry-run"])
    assert dry.exit_code == 2 and message in dry.stderr, dry.output  # the dry run refuses it alike
    assert out.read_text() == "# mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.toml", "t.toml"]


def test_a_single_budget_grid_without_a_second_seed_is_fine():
    plan = grid_plan(get_config("proxy-xxs", "baseline"), (6, 10, 14), (1e12,), lr_rule=LrRule(0.05, 1.0),
                     min_tokens=1)
    assert [len(plan.sizes_at(0))] == [3]
