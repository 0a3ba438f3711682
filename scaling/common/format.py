"""Number formats for tables, titles and figure labels (one place, so they agree)."""

from __future__ import annotations

import math
import re


def _missing(x: float | None) -> bool:
    return x is None or not math.isfinite(x)


def number(x: float | None, spec: str = ".4g", missing: str = "-") -> str:
    """``format(x, spec)``; ``missing`` for None, NaN and infinities."""
    return missing if _missing(x) else format(x, spec)


def percent(x: float | None, digits: int = 1, missing: str = "-") -> str:
    """A fraction as a percentage: 0.123 -> "12.3%"."""
    return missing if _missing(x) else f"{100 * x:.{digits}f}%"


def si(x: float | None, unit: str = "", missing: str = "-") -> str:
    """Compact engineering format, three significant digits: 273k, 1.2M, 3.4B; from 1e12 on
    scientific (2e+12), since counts that large are FLOPs, not parameters."""
    if _missing(x):
        return missing
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale and abs(x) < 1e12:
            return f"{x / scale:.3g}{suffix}{unit}"
    if abs(x) >= 1e12:
        return f"{x:.2g}{unit}"
    return f"{x:.3g}{unit}"


def decimals(*values: float, least: int = 3, most: int = 9) -> int:
    """The fewest fixed decimals, from ``least`` up to ``most``, at which the distinct ``values``
    print distinct: an interval [0.5138837, 0.5138853] must not read as [0.514, 0.514]. Nine
    tell apart any two values of an exponent's size (below 10) more than 1e-8 x their size apart,
    the width below which ``scaling.fitting.approaches.collapsed`` calls an interval no interval."""
    distinct = sorted({float(v) for v in values})
    for d in range(least, most + 1):
        if len({f"{v:.{d}f}" for v in distinct}) == len(distinct):
            return d
    return most


def count(x: float) -> str:
    """An exact count with thousands separators below a million, else three digits: 27,648; 1.2e+07."""
    return f"{x:.3g}" if x >= 1e6 else f"{int(x):,d}"


def duration(seconds: float | None, missing: str = "-") -> str:
    """Seconds as s, min or h: 42 s, 3.5 min, 1.2 h."""
    if _missing(seconds):
        return missing
    s = float(seconds)
    return f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.1f} min" if s >= 60 else f"{s:.0f} s"


def format_tokens(n: float) -> str:
    """A token count as it appears in default run names: 2e5 -> '200k', 1.5e6 -> '1.5M', 2e9 -> '2B'.

    Not :func:`si`: this text is part of folder names (``<tier>-<arch>-<tokens>-s<seed>``), so it is
    frozen as the trainer first wrote it (four significant digits, no scientific form above 1e12):
    a change would give existing runs another default name, and ``--resume`` or a sweep would no
    longer find their folders. ``si`` is free to change with the tables and figures it serves.
    """
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.4g}{unit}"
    return f"{n:.4g}"


# control characters (C0, DEL, C1): a newline ends a line, an escape sequence drives the terminal
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def comment_safe(text: str) -> str:
    """``text`` for one line of a ``#`` comment: control characters (a newline in a path would end
    the comment and break the file) written as ``\\xNN`` escapes; everything else as it is."""
    return CONTROL_CHARS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
