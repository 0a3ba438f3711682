"""Reading the project's small input files: TOML/JSON config documents and JSONL logs.

Bad input is a one-line ``UserError`` naming the file (and line); nothing here writes (atomic
writes live with the run folders, ``scaling.training.runlog``).
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaling.common.errors import UserError


def read_config(path: Path | str, what: str = "config", *, fmt: str | None = None) -> dict[str, Any]:
    """A TOML or JSON document holding one object, as a dict; ``fmt`` ("toml" or "json") or else
    the suffix (``.toml``: TOML, any other: JSON) says which.

    UserError (one line) for a missing or unreadable file, malformed text, or a document that is
    not an object; ``what`` names the document in the message ("plan", "template plan", ...).
    """
    path = Path(path)
    toml = fmt == "toml" if fmt is not None else path.suffix.lower() == ".toml"
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UserError(f"{what} file not found: {path}") from None
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(text) if toml else json.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"{path} is not valid {'TOML' if toml else 'JSON'}: {exc}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} must hold one {what} object")
    return data


@dataclass(frozen=True)
class JsonlRows:
    """The records of a JSONL file, how many lines were dropped (0 or 1: a torn last line), and
    whether the file ends with a newline (an appender must rewrite an unterminated file first)."""

    rows: list[dict]
    skipped: int = 0
    terminated: bool = True


def read_jsonl(path: Path | str, *, missing_ok: bool = False, strict: bool = False) -> JsonlRows:
    """Every record of a JSONL file, one JSON object per line; blank lines are ignored.

    A log being appended to may end in a torn line (the writer died mid-line, or is still
    writing): only the *final* line may be dropped, when it is not JSON, and ``skipped`` says so
    (a final object without its newline is complete: no proper prefix of a JSON object parses).
    A broken line anywhere else is corruption, not a crash: UserError naming the file and line.
    ``missing_ok``: a missing file reads as no rows. ``strict``: a broken final line is an error
    too (a table a user exported is complete; only a log being written can be torn).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if missing_ok:
            return JsonlRows([], 0, True)
        raise UserError(f"no such file: {path}") from None
    lines = text.splitlines(keepends=True)
    rows: list[dict] = []
    skipped = 0
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        last = i == len(lines)
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            if last and not strict:
                skipped = 1
                break
            raise UserError(f"{path}:{i}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise UserError(f"{path}:{i}: expected a JSON object per line")
        rows.append(row)
    return JsonlRows(rows, skipped, not lines or lines[-1].endswith("\n"))
