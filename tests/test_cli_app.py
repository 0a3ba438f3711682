"""The command-line app: the command table, lazy imports, one-line usage errors (issues 14, 19, 20)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from scaling.cli import COMMANDS, app

runner = CliRunner()


def test_command_table_matches_what_the_modules_register():
    registered: dict[str, str] = {}
    for module in sorted({m for m, _ in COMMANDS.values()}):
        sub = typer.Typer()
        importlib.import_module(f"scaling.cli.{module}").register(sub)
        for name in typer.main.get_group(sub).commands:
            registered[name] = module
    assert registered == {name: module for name, (module, _) in COMMANDS.items()}


def test_help_lists_every_command():
    res = runner.invoke(app, ["--help"])
    assert res.exit_code == 0
    for name in COMMANDS:
        assert f"  {name} " in res.stdout


def _imported_after(code: str) -> set[str]:
    probe = (f"import sys\n{code}\n"
             "heavy = [m for m in ('torch', 'matplotlib', 'pandas', 'scipy') if m in sys.modules]\n"
             "print('imported:', *heavy)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.strip().splitlines()[-1].split()[1:])


def test_help_and_arithmetic_commands_import_no_heavy_library():
    run = ("from scaling.cli import app\n"
           "try:\n    app({args})\nexcept SystemExit:\n    pass\n")
    assert _imported_after(run.format(args=["--help"])) == set()
    assert _imported_after(run.format(args=["tiers", "--json"])) == set()
    assert "torch" not in _imported_after(run.format(args=["fit", "--help"]))


@pytest.mark.parametrize("args, message", [
    (["fit", "points.csv", "--bootstrap", "-1"], "Invalid value for '--bootstrap'"),
    (["fit", "--no-such-flag"], "No such option: --no-such-flag"),
    (["fit"], "Missing argument"),
    (["train", "--tier", "proxy-tiny", "--arch", "smelt", "--tokens", "1e4", "--batch-size", "abc"],
     "Invalid value for '--batch-size'"),
    (["no-such-command"], "No such command 'no-such-command'"),
    (["analyze", "sink", "--no-such-flag"], "No such option"),
])
def test_usage_errors_are_one_line_exit_2(args, message):
    res = runner.invoke(app, args)
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], res.stderr
    assert "Traceback" not in res.output and "╭" not in res.output


def test_user_text_is_not_rich_markup(tmp_path):
    # a:b:c once rendered as an emoji and [default: ...] in help texts vanished
    res = runner.invoke(app, ["savings", "--law-set", "paper", "--budgets", "a:b:c"])
    assert res.exit_code == 2 and "a:b:c" in res.stderr
    res = runner.invoke(app, ["train", "--help"])
    assert "(default: <tier>-<arch>" in " ".join(res.stdout.split()).replace("[", "(")


@pytest.mark.parametrize("args", [
    ["simulate", "--budget", "1e20", "--budget", "1e22"],
    ["savings", "--law-set", "paper", "--budget=1e20", "--budget", "1e21"],
    ["plan", "--law-set", "paper", "--budget", "1e20", "--budget", "1e21"],
])
def test_an_option_whose_plural_takes_several_given_twice_is_refused(args):
    """Click kept the last of two values silently: `simulate --budget 1e20 --budget 1e22` answered
    for 1e22 alone, where the user asked for two budgets."""
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    option = "--budget"
    assert len(lines) == 1 and lines[0].startswith(
        f"error: option {option} given 2 times (it takes one value; {option}s takes several)"), res.stderr


def test_other_options_keep_the_last_value_flags_and_repeatable_options_repeat():
    """Scripts override a base argument list by appending (`train $BASE --lr 0.01`): an option
    without a plural keeps click's last-wins rule; flags and --where repeat freely."""
    res = CliRunner().invoke(app, ["savings", "--law-set", "paper", "--budget", "1e20", "--bootstrap", "5",
                                   "--bootstrap", "0", "--json", "--json"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(app, ["savings", "--law-set", "paper", "--budget", "1e20",
                                   "--where", "N > 0", "--where", "D > 0"])
    assert "given 2 times" not in res.stderr
