"""The one spelling of a device choice: ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (no torch import, so a
plan or a command line is checked before anything heavy loads)."""

from __future__ import annotations

import re

from scaling.common.errors import UserError

DEVICE_HELP = "auto, cpu, cuda or cuda:N"
_DEVICE = re.compile(r"auto|cpu|cuda(?::[0-9]{1,4})?")  # ASCII digits: torch refuses others


def valid_device(text: object) -> bool:
    return isinstance(text, str) and _DEVICE.fullmatch(text) is not None


def check_device(text: object, what: str = "device") -> str:
    """``text`` when it is a device choice, else UserError (one line)."""
    if not valid_device(text):
        raise UserError(f"{what} must be {DEVICE_HELP}, got {text!r}")
    return str(text)
