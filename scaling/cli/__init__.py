"""The ``smelt-scale`` command line: a thin typer shell over the library.

Holds one module per command group (each with a ``register(app)``) and ``_util`` (one-line
errors with exit 2, JSON on stdout, rich consoles). May import every other subpackage; nothing
in the library imports it.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import Any

import typer
from typer.core import TyperGroup

from scaling.cli._click import exceptions as _click_exc


class _LazyGroup(TyperGroup):
    """The top-level command group.

    Commands load lazily: a command's module (and the library it needs: torch, pandas, matplotlib)
    is imported only when that command runs, so ``smelt-scale --help`` and the arithmetic commands
    start fast; the listing uses the one-line summaries of ``COMMANDS`` (a test keeps them equal to
    each command's own). Click's usage errors (bad option value, unknown flag, missing argument)
    become the project's one-line ``error: ...`` with exit code 2 instead of a multi-line box.
    """

    _loaded: dict[str, Any] = {}

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, name: str) -> Any:
        if name not in COMMANDS:
            return None
        module = COMMANDS[name][0]
        if module not in self._loaded:
            sub = typer.Typer(rich_markup_mode=None)
            importlib.import_module(f"scaling.cli.{module}").register(sub)
            self._loaded[module] = typer.main.get_group(sub)
            for command in self._loaded[module].commands.values():
                _refuse_repeats(command)
        return self._loaded[module].commands[name]

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = [(name, summary) for name, (_, summary) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        # numpy's floating-point RuntimeWarnings ("overflow encountered in power") say nothing a
        # user can act on: the library turns what matters (an unidentified law, a misfit) into its
        # own warnings; a library fix for each known source (fitting/laws.py), this for the rest.
        warnings.filterwarnings("ignore", category=RuntimeWarning,
                                message=r"(overflow|divide by zero|invalid value|underflow) encountered")
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _click_exc.NoArgsIsHelpError as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except _click_exc.UsageError as exc:
            where = f" ({exc.ctx.command_path} --help)" if exc.ctx is not None else ""
            # typer validates choices through pydantic, whose message starts "Value error, "
            message = " ".join(exc.format_message().replace("Value error, ", "").split())
            sys.stderr.write(f"error: {message}{where}\n")
            sys.exit(2)
        except _click_exc.ClickException as exc:
            sys.stderr.write(f"error: {' '.join(exc.format_message().split())}\n")
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            sys.stderr.write("error: interrupted\n")
            sys.exit(130)
        sys.exit(rv if isinstance(rv, int) else 0)


def _refuse_repeats(command: Any) -> None:
    """Make ``command`` (and a group's subcommands) refuse, twice, an option of one value whose
    plural takes several (``--budget`` beside ``--budgets``).

    Click keeps the last of ``--budget 1e20 --budget 1e22`` silently: the user asked for two
    budgets and got one answer. Other options keep click's rule, the last one wins, on which
    scripts rely to override a base argument list (``train $BASE --lr 0.01``)."""
    for sub in getattr(command, "commands", {}).values():
        _refuse_repeats(sub)
    names = {name for p in command.params for name in getattr(p, "opts", ())}
    single = {name: p for p in command.params if getattr(p, "param_type_name", "") == "option"
              and not p.multiple and not p.is_flag for name in p.opts if name + "s" in names}
    if not single:
        return
    parse = command.parse_args

    def parse_args(ctx: Any, args: list[str]) -> Any:
        seen: dict[Any, list[str]] = {}
        for arg in args:
            if arg == "--":
                break
            name = arg.split("=", 1)[0]
            if name in single:
                seen.setdefault(single[name], []).append(name)
        for given in seen.values():
            if len(given) > 1:
                raise _click_exc.UsageError(f"option {given[0]} given {len(given)} times (it takes one "
                                            f"value; {given[0]}s takes several)", ctx)
        return parse(ctx, args)

    command.parse_args = parse_args


app = typer.Typer(
    name="smelt-scale",
    help="Compute-matched looped MoE (SMELT) vs MoE Baseline: tiers, training, scaling-law fits, savings.",
    cls=_LazyGroup,
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, PowerShell)
    pretty_exceptions_enable=False,
    # User text in help and messages is never parsed as rich markup ("[default: ...]" vanished).
    rich_markup_mode=None,
)


@app.callback()
def _root() -> None:
    # A callback makes typer build a group; the commands come from _LazyGroup.get_command.
    pass

# name -> (module in scaling/cli/ whose register(app) defines it, one-line summary for the listing).
COMMANDS: dict[str, tuple[str, str]] = {
    "tiers": ("tiers", "The paper tiers and CPU proxies: Baseline, SMELT twin, and their costs."),
    "match": ("tiers", "Derive the compute-matched SMELT twin of a Baseline config (file and/or options)."),
    "prepare-data": ("data",
                     "Tokenize text, JSONL or Parquet into uint16/uint32 token shards with a manifest.json."),
    "train": ("train", "Train a Baseline or SMELT model into runs-mine/<name>/ (--runs-dir)."),
    "sweep": ("sweep", "Run a sweep plan: finished runs are skipped, interrupted ones resume."),
    "fit": ("fit", "Fit a scaling law per group, with bootstrap intervals and diagnostics."),
    "compare": ("compare", "Paired loss difference candidate − reference at matched (tier, budget, seed)."),
    "savings": ("savings", "Compute saved by the candidate over the reference at equal loss."),
    "plan": ("plan", "Propose the next IsoFLOP set for both architectures, as a sweep plan."),
    "plan-grid": ("plan_grid", "Plan an IsoFLOP study on one shared size grid (WSD trunks with a branch "
                               "per budget), as sweep plans."),
    "simulate": ("plan", "Simulate a study: how well would it recover the savings?"),
    "export": ("evaluate",
               "Export a run as a plain Hugging Face Mixtral folder (AutoModelForCausalLM loads it)."),
    "eval": ("evaluate", "Evaluate runs on local tasks through lm-eval, fully offline."),
    "calibrate": ("evaluate", "Loss->accuracy calibration: acc-sigmoid on the reference, candidate "
                              "residual at matched loss."),
    "analyze": ("analyze", "Mechanism analyses of trained runs: attention sink, loss by length, Dyck ICL."),
    "plot": ("plot", "Draw the paper figures of a runs folder into a folder."),
}
