"""The click that typer runs on, in one place.

typer >= 0.2x vendors click as the private ``typer._click``; older typer uses click itself. The
CLI needs click's exceptions (to turn usage errors into one-line errors) and the current context
(to name a command's JSON schema) from the *same* click as typer's, or neither is seen.
``tests/test_cluster_use.py`` checks that both work with the installed typer, so a typer that
moves them fails a test instead of silently printing multi-line errors.
"""

from __future__ import annotations

try:
    from typer._click import exceptions
    from typer._click.globals import get_current_context
except ImportError:  # pragma: no cover - depends on the installed typer
    from click import exceptions
    from click.globals import get_current_context

__all__ = ["exceptions", "get_current_context"]
