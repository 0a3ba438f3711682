"""The one spelling of a device choice: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``, and the one range of
CPU thread counts (no torch import, so a plan or a command line is checked before anything heavy
loads)."""

from __future__ import annotations

import re

from scaling.common.errors import UserError

DEVICE_HELP = "auto, cpu, cuda or cuda:N"
_DEVICE = re.compile(r"auto|cpu|cuda(?::[0-9]{1,4})?")  # ASCII digits: torch refuses others


# torch's CPU threads: above about 1e4 OpenMP hangs or segfaults (a crash with no error line, after a
# run folder was made); 1024 threads still run (measured on 2 cores), and no CPU node has more cores
MAX_THREADS = 1024
THREADS_RULE = f"1 to {MAX_THREADS}"


def valid_threads(n: object) -> bool:
    return isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_THREADS


def check_threads(n: int | None, what: str = "--threads") -> int | None:
    """``n`` (None: torch's default) when it is a thread count torch can use, else UserError."""
    if n is not None and not valid_threads(n):
        raise UserError(f"{what} must be {THREADS_RULE}, got {n}")
    return n


def valid_device(text: object) -> bool:
    return isinstance(text, str) and _DEVICE.fullmatch(text) is not None


def check_device(text: object, what: str = "device") -> str:
    """``text`` when it is a device choice, else UserError (one line)."""
    if not valid_device(text):
        raise UserError(f"{what} must be {DEVICE_HELP}, got {text!r}")
    return str(text)
