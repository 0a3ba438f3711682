"""Errors that the CLI turns into a one-line message and exit code 2."""

from __future__ import annotations


class UserError(ValueError):
    """Bad input from the user (config, file, option): reported in one line, exit 2.

    The message speaks the library's language (a notebook or another program calls the library).
    What to do in the command line's words (a command to run, a flag to pass) goes into ``hint``:
    the CLI shows :meth:`with_hint`, the message and the hint joined by ``sep``; ``str(exc)`` is the
    message alone.
    """

    def __init__(self, message: str = "", *, hint: str | None = None, sep: str = "; ") -> None:
        super().__init__(message)
        self.hint, self.sep = hint, sep

    def with_hint(self) -> str:
        """The message as the command line shows it: with its hint, when it has one."""
        return f"{self}{self.sep}{self.hint}" if self.hint else str(self)
