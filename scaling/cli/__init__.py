"""The ``smelt-scale`` command line: a thin typer shell over the library.

Holds one module per command group (each with a ``register(app)``) and ``_util`` (one-line
errors with exit 2, JSON on stdout, rich consoles). May import every other subpackage; nothing
in the library imports it.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="smelt-scale",
    help="Compute-matched looped MoE (SMELT) vs MoE Baseline: tiers, training, scaling-law fits, savings.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Registration order is the order of ``smelt-scale --help``.
COMMAND_MODULES = ("tiers", "sweep", "fit", "savings", "data", "train", "analyze", "plot", "plan")
for _name in COMMAND_MODULES:
    importlib.import_module(f"scaling.cli.{_name}").register(app)
