"""The ``smelt-scale`` command line: a thin typer shell over the library.

Holds one module per command group (each with a ``register(app)``) and ``_util`` (one-line
errors with exit 2, JSON on stdout, rich consoles). May import every other subpackage; nothing
in the library imports it.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import typer
from typer.core import TyperGroup

try:  # typer >= 0.2x vendors click as typer._click; older typer uses click itself
    from typer._click import exceptions as _click_exc
except ImportError:  # pragma: no cover - depends on the installed typer
    from click import exceptions as _click_exc


class _OneLineErrors(TyperGroup):
    """Click's usage errors (bad option value, unknown flag, missing argument) as the project's
    one-line ``error: ...`` with exit code 2, instead of a multi-line usage box."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _click_exc.NoArgsIsHelpError as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except _click_exc.UsageError as exc:
            where = f" ({exc.ctx.command_path} --help)" if exc.ctx is not None else ""
            message = " ".join(exc.format_message().split())
            sys.stderr.write(f"error: {message}{where}\n")
            sys.exit(2)
        except _click_exc.ClickException as exc:
            sys.stderr.write(f"error: {' '.join(exc.format_message().split())}\n")
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            sys.stderr.write("error: interrupted\n")
            sys.exit(130)
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(
    name="smelt-scale",
    help="Compute-matched looped MoE (SMELT) vs MoE Baseline: tiers, training, scaling-law fits, savings.",
    cls=_OneLineErrors,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # User text in help and messages is never parsed as rich markup ("[default: ...]" vanished).
    rich_markup_mode=None,
)

# Registration order is the order of ``smelt-scale --help``.
COMMAND_MODULES = ("tiers", "sweep", "fit", "savings", "train", "analyze", "plot", "plan")
for _name in COMMAND_MODULES:
    importlib.import_module(f"scaling.cli.{_name}").register(app)
