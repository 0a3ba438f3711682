"""Read scaling-law points from a runs directory or a table (CSV, JSONL, JSON, Parquet).

Every reader returns one pandas DataFrame with canonical columns:

    group            str    fit group (one law per group); "default" without a group column
    run              str    run id; bootstrap resamples runs (a run may hold several budgets)
    N                float  non-embedding (active) parameters
    D                float  training tokens
    loss             float  validation loss, nats/token
    flops            float  total training FLOPs (NaN when unknown)
    flops_per_token  float  training FLOPs per token F (NaN when unknown)
    sparsity         float  compute-equivalent sparsity S in [0, 1) (NaN when unknown)

A runs directory is what the trainer writes: ``<dir>/<run>/config.json`` and, once its token
budgets are reached, ``final.json`` = ``{"run", "arch", "tier", "complete", "points": [...]}``
with one point (``N, D, loss, flops, flops_per_token, sparsity, ...``) per budget; a
``final.json`` holding a single point object is accepted too. Folders without ``final.json``
are unfinished and ignored; folders whose ``final.json`` cannot be read are skipped with a
warning that names them.

With a compute column (``c_col``) and no token column, D = C / (6 N), as Besiroglu et al.
(2024) derive tokens for the Chinchilla runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import pandas as pd

from scaling.common.errors import UserError

CANONICAL = ("group", "run", "N", "D", "loss", "flops", "flops_per_token", "sparsity")
# Law input name (scaling.fitting.laws) -> canonical column.
INPUT_COLUMNS = {"N": "N", "D": "D", "F": "flops_per_token", "S": "sparsity"}
DEFAULT_GROUP = "default"
TABLE_SUFFIXES = (".csv", ".tsv", ".jsonl", ".ndjson", ".json", ".parquet", ".pq")


@dataclass(frozen=True)
class Columns:
    """Source column names. ``group=None`` means ``arch`` when present, else one group."""

    n: str = "N"
    d: str = "D"
    loss: str = "loss"
    group: str | None = None
    c: str | None = None
    flops_per_token: str = "flops_per_token"
    sparsity: str = "sparsity"
    run: str = "run"


def load_points(path: str | Path, columns: Columns = Columns(), *,
                warn: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Points from a runs directory or a table file, canonical columns, validated (see module doc)."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"no such file or directory: {path}")
    if path.is_dir():
        raw = read_runs_dir(path, warn=warn)
    else:
        raw = read_table(path)
    return canonicalize(raw, columns, source=str(path))


# -- readers ------------------------------------------------------------------------------
def read_table(path: Path) -> pd.DataFrame:
    """A table file as it is (no renaming); the format follows the suffix."""
    suffix = path.suffix.lower()
    try:
        if suffix in (".csv", ".tsv"):
            return pd.read_csv(path, sep="\t" if suffix == ".tsv" else ",")
        if suffix in (".jsonl", ".ndjson"):
            return pd.DataFrame(_read_jsonl(path))
        if suffix == ".json":
            return pd.DataFrame(_points_of(json.loads(path.read_text()), str(path)))
        if suffix in (".parquet", ".pq"):
            try:
                import pyarrow  # noqa: F401
            except ImportError:
                raise UserError(f"reading {path.name} needs pyarrow: "
                                "pip install 'smelt-scale[parquet]'") from None
            return pd.read_parquet(path)
    except UserError:
        raise
    except (pd.errors.ParserError, pd.errors.EmptyDataError, json.JSONDecodeError, UnicodeDecodeError,
            ValueError, OSError) as exc:
        raise UserError(f"cannot read {path}: {' '.join(str(exc).split())}") from None
    raise UserError(f"unknown table format {suffix!r} for {path}; use one of {', '.join(TABLE_SUFFIXES)} "
                    "or a runs directory")


def _read_jsonl(path: Path) -> list[dict]:
    # json line by line, not pd.read_json: that turns fields named like timestamps into dates
    # and cannot say which line is broken.
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{i}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise UserError(f"{path}:{i}: expected a JSON object per line")
        rows.append(row)
    return rows


def _points_of(obj: object, where: str) -> list[dict]:
    """Points of a final.json-like object: {"points": [...]}, a list of points, or one point."""
    if isinstance(obj, dict) and "points" in obj:
        pts = obj["points"]
        if not isinstance(pts, list) or not all(isinstance(p, dict) for p in pts):
            raise UserError(f"{where}: 'points' must be a list of objects")
        meta = {k: obj[k] for k in ("run", "arch", "tier")
                if k in obj and not isinstance(obj[k], (dict, list))}
        return [{**meta, **p} for p in pts]
    if isinstance(obj, list) and all(isinstance(p, dict) for p in obj):
        return list(obj)
    if isinstance(obj, dict):
        return [obj]
    raise UserError(f"{where}: expected a point object, a list of them or {{'points': [...]}}")


def read_runs_dir(root: Path, *, warn: Callable[[str], None] | None = None) -> pd.DataFrame:
    """All points of the finished runs under ``root`` (searched recursively).

    A run folder is any folder holding ``config.json`` or ``final.json``. Unfinished runs (no
    final.json) are left out; unreadable ones are skipped with a warning. No points at all is an
    error.
    """
    folders = sorted({p.parent for name in ("config.json", "final.json") for p in root.rglob(name)})
    rows: list[dict] = []
    unfinished, corrupt = [], []
    for folder in folders:
        final = folder / "final.json"
        if not final.exists():
            unfinished.append(folder)
            continue
        try:
            pts = _points_of(json.loads(final.read_text()), str(final))
            if not pts:
                raise UserError("no points")
        except (UserError, json.JSONDecodeError, UnicodeDecodeError, OSError) as exc:
            corrupt.append(folder)
            if warn is not None:
                warn(f"skipping run {folder}: unreadable final.json ({' '.join(str(exc).split())})")
            continue
        default_run = str(folder.relative_to(root)) if folder != root else folder.name
        rows.extend({"run": default_run, **p} for p in pts)
    if not rows:
        raise UserError(f"no finished runs under {root} ({len(folders)} run folders: "
                        f"{len(unfinished)} unfinished, {len(corrupt)} unreadable)")
    return pd.DataFrame(rows)


# -- canonical columns and validation -----------------------------------------------------
def _numeric(df: pd.DataFrame, col: str, source: str) -> np.ndarray:
    s = df[col]
    num = pd.to_numeric(s, errors="coerce")
    bad = num.isna() & s.notna()
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise UserError(f"{source}: column {col!r} is not numeric (row {i + 1}: {s.iloc[i]!r})")
    return num.to_numpy(dtype=float)


def _require(df: pd.DataFrame, col: str, source: str, option: str) -> None:
    if col not in df.columns:
        raise UserError(f"{source}: no column {col!r} (columns: {', '.join(map(str, df.columns))}); "
                        f"name it with {option}")


def canonicalize(raw: pd.DataFrame, columns: Columns = Columns(), *, source: str = "table") -> pd.DataFrame:
    """Rename and convert a raw table to the canonical columns; N, D, loss checked (finite, > 0)."""
    if raw.empty:
        raise UserError(f"{source}: no rows")
    c = columns
    out = pd.DataFrame(index=range(len(raw)))
    raw = raw.reset_index(drop=True)

    _require(raw, c.n, source, "--n-col")
    _require(raw, c.loss, source, "--loss-col")
    out["N"] = _numeric(raw, c.n, source)
    out["loss"] = _numeric(raw, c.loss, source)

    compute = None
    if c.c is not None:
        _require(raw, c.c, source, "--c-col")
        compute = _numeric(raw, c.c, source)
    elif "flops" in raw.columns:
        compute = _numeric(raw, "flops", source)
    if c.d in raw.columns:
        out["D"] = _numeric(raw, c.d, source)
    elif c.c is not None:
        out["D"] = compute / (6.0 * out["N"].to_numpy())
    else:
        raise UserError(f"{source}: no column {c.d!r} (columns: {', '.join(map(str, raw.columns))}); "
                        "name the token column with --d-col, or a compute column with --c-col to use "
                        "D = C/(6N)")
    out["flops"] = compute if compute is not None else np.nan
    for canon, col in (("flops_per_token", c.flops_per_token), ("sparsity", c.sparsity)):
        out[canon] = _numeric(raw, col, source) if col in raw.columns else np.nan

    if c.group is not None:
        _require(raw, c.group, source, "--group-col")
        out["group"] = raw[c.group].astype(str).to_numpy()
    elif "arch" in raw.columns:
        out["group"] = raw["arch"].fillna(DEFAULT_GROUP).astype(str).to_numpy()
    else:
        out["group"] = DEFAULT_GROUP
    # Without run ids every row is its own run, so the bootstrap resamples points.
    out["run"] = (raw[c.run].astype(str).to_numpy() if c.run in raw.columns
                  else [f"row{i + 1}" for i in range(len(raw))])

    for col in ("N", "D", "loss"):
        check_positive_finite(out[col].to_numpy(), col, source)
    return out[list(CANONICAL)]


def check_positive_finite(x: np.ndarray, name: str, source: str) -> None:
    bad = ~np.isfinite(x)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise UserError(f"{source}: {name} has {int(bad.sum())} NaN/inf values (first at row {i + 1})")
    bad = x <= 0
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise UserError(f"{source}: {name} must be > 0; {int(bad.sum())} rows are not "
                        f"(row {i + 1}: {x[i]:g})")


def law_inputs(df: pd.DataFrame, law_inputs: Iterable[str], *,
               source: str = "table") -> dict[str, np.ndarray]:
    """The arrays a law needs from canonical points, validated (F > 0, 0 <= S < 1)."""
    out = {}
    for name in law_inputs:
        col = INPUT_COLUMNS[name]
        x = df[col].to_numpy(dtype=float)
        if col == "sparsity":
            if not np.isfinite(x).all():
                raise UserError(f"{source}: the law needs sparsity for every point (column missing or NaN; "
                                "name it with --sparsity-col)")
            if ((x < 0) | (x >= 1)).any():
                raise UserError(f"{source}: sparsity must lie in [0, 1)")
        elif col == "flops_per_token" and not np.isfinite(x).all():
            raise UserError(f"{source}: the law needs flops_per_token for every point (column missing "
                            "or NaN; name it with --flops-col)")
        else:
            check_positive_finite(x, col, source)
        out[name] = x
    return out


def total_flops(df: pd.DataFrame, k: float = 6.0) -> np.ndarray:
    """Training FLOPs per point: recorded flops, else F*D, else k*N*D."""
    flops = df["flops"].to_numpy(dtype=float)
    fd = df["flops_per_token"].to_numpy(dtype=float) * df["D"].to_numpy(dtype=float)
    knd = k * df["N"].to_numpy(dtype=float) * df["D"].to_numpy(dtype=float)
    return np.where(np.isfinite(flops) & (flops > 0), flops, np.where(np.isfinite(fd) & (fd > 0), fd, knd))


def flops_per_param_k(df: pd.DataFrame) -> float:
    """Median of flops/(N D) over points with recorded FLOPs; 6 (Kaplan et al. 2020) otherwise."""
    flops = df["flops"].to_numpy(dtype=float)
    ok = np.isfinite(flops) & (flops > 0)
    if not ok.any():
        return 6.0
    ratio = flops[ok] / (df["N"].to_numpy(dtype=float)[ok] * df["D"].to_numpy(dtype=float)[ok])
    return float(np.median(ratio))
