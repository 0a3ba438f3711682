"""One way for the fuzz tests to run a command in-process with a time limit."""

from __future__ import annotations

import signal

from typer.testing import CliRunner

from scaling.cli import app

runner = CliRunner()


class CommandTimeout(Exception):
    """No answer in time. Not a TimeoutError: that is an OSError, which the CLI's handler turns into
    a tidy one-line error, so a hang would pass as a refusal."""


def invoke_within(args: list[str], limit_s: int):
    """``runner.invoke(app, args)``, raising CommandTimeout after ``limit_s`` seconds."""
    def alarm(signum, frame):
        raise CommandTimeout(f"no answer within {limit_s} s: smelt-scale {' '.join(args)}")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(limit_s)
    try:
        return runner.invoke(app, args)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
