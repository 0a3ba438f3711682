"""smelt-scale command line: a thin typer layer over the ``scaling`` package.

Each command lives with its library code's caller here; the maths is in ``scaling/``.
"""

from __future__ import annotations

import typer

app = typer.Typer(
    name="smelt-scale",
    help="Compute-matched looped MoE (SMELT) vs MoE Baseline: tiers, training, scaling-law fits, savings.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Commands are registered by the modules below; each owns one area of the CLI.
from scaling.commands import tiers as _tiers  # noqa: E402

_tiers.register(app)

from scaling.commands import sweep as _sweep  # noqa: E402

_sweep.register(app)

# -- more command modules register here (fit, savings, train, sweep, analyze, plot, plan) --
from scaling.commands import fit as _fit  # noqa: E402
_fit.register(app)
from scaling.commands import savings as _savings  # noqa: E402
_savings.register(app)
from scaling.commands import train as _train  # noqa: E402
_train.register(app)

from scaling.commands import analyze as _analyze  # noqa: E402
_analyze.register(app)
from scaling.commands import plot as _plot  # noqa: E402
_plot.register(app)
from scaling.commands import plan as _plan  # noqa: E402
_plan.register(app)

if __name__ == "__main__":
    app()
