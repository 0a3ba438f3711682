"""Reading the project's small input files: TOML/JSON config documents and JSONL logs; a file's SHA-256.

Bad input is a one-line ``UserError`` naming the file (and line); nothing here writes (atomic
writes live with the run folders, ``scaling.common.run_folder``).

Every document reader here is bounded, so that no file can hang a command or crash it with a
traceback: only regular files are opened (a FIFO would block for ever, ``/dev/zero`` never ends),
a document is at most :data:`MAX_DOCUMENT_BYTES` long, and nested at most :data:`MAX_NESTING`
levels deep (Python's JSON and TOML parsers recurse: a few thousand ``[`` raise ``RecursionError``,
and code walking the result would recurse too).
"""

from __future__ import annotations

import hashlib
import json
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from scaling.common.errors import UserError

MAX_DOCUMENT_BYTES = 64 * 2**20
MAX_NESTING = 64
_HASH_BLOCK = 1 << 22


def check_regular_file(path: Path | str, what: str = "file") -> Path:
    """``path`` as a Path when it is a regular file (symlinks followed); UserError for a missing
    path, a folder, or a device, FIFO or socket (reading one blocks or never ends)."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise UserError(f"{what} not found: {path}") from None
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(mode):
        raise UserError(f"{what} {path} is a folder, not a file")
    if not stat.S_ISREG(mode):
        raise UserError(f"{what} {path} is not a regular file (a device, FIFO or socket): refusing to "
                        "read it")
    return path


def read_text(path: Path | str, what: str = "file", *, max_bytes: int | None = MAX_DOCUMENT_BYTES) -> str:
    """A regular file's UTF-8 text, at most ``max_bytes`` long (None: any length); UserError otherwise."""
    path = check_regular_file(path, what)
    if max_bytes is not None:
        size = path.stat().st_size
        if size > max_bytes:
            raise UserError(f"{what} {path} is {size:,} bytes long; at most {max_bytes:,} are read")
    try:
        with open(path, "rb") as fh:
            data = fh.read() if max_bytes is None else fh.read(max_bytes + 1)
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    if max_bytes is not None and len(data) > max_bytes:
        raise UserError(f"{what} {path} is longer than {max_bytes:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path} is not UTF-8 text (a binary file, or another encoding)") from None


def check_nesting(obj: Any, where: str, limit: int = MAX_NESTING) -> Any:
    """``obj`` when its lists/dicts nest at most ``limit`` levels; UserError otherwise (iterative)."""
    stack = [(obj, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth >= limit:
                raise UserError(f"{where} is nested more than {limit} levels deep")
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return obj


def parse_json(text: str, where: str) -> Any:
    """JSON text as Python data; UserError (one line, naming ``where``) for bad or too deep JSON."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{where} is not valid JSON: {exc}") from None
    except RecursionError:
        raise UserError(f"{where} is nested too deeply to read") from None
    return check_nesting(data, where)


def parse_toml(text: str, where: str) -> dict[str, Any]:
    """TOML text as a dict; UserError for bad or too deep TOML."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{where} is not valid TOML: {exc}") from None
    except RecursionError:
        raise UserError(f"{where} is nested too deeply to read") from None
    return check_nesting(data, where)


def read_json(path: Path | str, what: str = "JSON file") -> Any:
    """A JSON file (any value), bounded as the module doc says."""
    return parse_json(read_text(path, what), str(path))


def read_config(path: Path | str, what: str = "config", *, fmt: str | None = None) -> dict[str, Any]:
    """A TOML or JSON document holding one object, as a dict; ``fmt`` ("toml" or "json") or else
    the suffix (``.toml``: TOML, any other: JSON) says which.

    UserError (one line) for a missing or unreadable file, malformed text, or a document that is
    not an object; ``what`` names the document in the message ("plan", "template plan", ...).
    """
    path = Path(path)
    toml = fmt == "toml" if fmt is not None else path.suffix.lower() == ".toml"
    text = read_text(path, f"{what} file")
    data = parse_toml(text, str(path)) if toml else parse_json(text, str(path))
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


# the fields of a metrics.jsonl record that readers compute with
METRIC_NUMBERS = ("iter", "step", "tokens", "branch", "budget_index", "train_loss", "val_loss", "val_bpb",
                  "lr", "wall_s")


def bad_number(row: dict, keys: Iterable[str] = METRIC_NUMBERS) -> str | None:
    """The first of ``keys`` that ``row`` holds as something other than a number or null, else None."""
    for k in keys:
        v = row.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            return k
    return None


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
    if missing_ok and not path.exists():
        return JsonlRows([], 0, True)
    if not path.exists():
        raise UserError(f"no such file: {path}")
    text = read_text(path, "JSONL file", max_bytes=None)
    lines = text.splitlines(keepends=True)
    rows: list[dict] = []
    skipped = 0
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        last = i == len(lines)
        try:
            row = check_nesting(json.loads(line), f"{path}:{i}")
        except json.JSONDecodeError as exc:
            if last and not strict:
                skipped = 1
                break
            raise UserError(f"{path}:{i}: not JSON ({exc.msg})") from None
        except RecursionError:
            raise UserError(f"{path}:{i}: nested too deeply to read") from None
        if not isinstance(row, dict):
            raise UserError(f"{path}:{i}: expected a JSON object per line")
        rows.append(row)
    return JsonlRows(rows, skipped, not lines or lines[-1].endswith("\n"))


def sha256_file(path: Path | str, start: int = 0) -> str:
    """Hex SHA-256 of a file's bytes from offset ``start`` (read in 4 MiB blocks: any size)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        fh.seek(start)
        while block := fh.read(_HASH_BLOCK):
            h.update(block)
    return h.hexdigest()
