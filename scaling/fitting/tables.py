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
    seed             str    training seed of the run, as written ("" when unknown): approach 1 averages
                            the training curves of a configuration's seeds (scaling.fitting.approaches)
    lr               float  the run's peak learning rate (NaN when unknown); see "Learning rates" below

A runs directory is what the trainer writes: ``<dir>/<run>/config.json`` and, once its token
budgets are reached, ``final.json`` = ``{"run", "arch", "tier", "complete", "points": [...]}``
with one point (``N, D, loss, flops, flops_per_token, sparsity, ...``) per budget: the typed
:class:`scaling.common.run_folder.Point`, whose field names are the default columns below; a
``final.json`` holding a single point object is accepted too. Points are read as the file holds
them (an older file with fewer or more keys reads as before). Folders without ``final.json``
(unfinished) and folders whose ``final.json`` cannot be read are left out, each named with the
reason in the returned ``skipped`` list (also logged at INFO, logger ``scaling.fitting.tables``).
The trainer's ``metrics.jsonl`` is not read here.
Each point of a runs directory also carries ``run_dir`` (:data:`RUN_DIR`): its run folder's path
relative to the directory, where its ``config.json`` and ``analysis/`` lie. It is kept apart from
``run`` (the name final.json records, which stays the run id) because the two differ when run
folders are nested (``runs/<sweep>/<run>``), renamed or linked in under another name. The numbers
a point holds (loss, D, N, flops and every ``val_loss/<source>``) must be numbers or null: a run
holding anything else is unreadable and named.

Tables a user brings (:func:`load_table`), and the traps this module guards against:

- Units: a column may be given as ``name:unit`` (``params:M``, ``tokens:B``; units K, M, B or G,
  T, or a number such as ``1e6``), multiplied out on reading. A plausibility note is raised when
  N < 1e4 or tokens per parameter D/N fall outside 1e-2..1e5 (a column in millions or billions
  read as raw counts does this).
- Derived columns: with total compute C and one of N, D, the other is C / (k X) with k the
  FLOPs per parameter per token (``flops_per_nd``, default 6: C = 6 N D, Kaplan et al. 2020;
  Besiroglu et al. 2024 derive the Chinchilla tokens this way).
- Guessed columns: ``arch`` is taken as the group and ``flops`` as total compute and ``run`` as the
  run id when present and not named otherwise; every such guess is reported in ``mapping`` and
  ``notes`` and can be switched off with the column name ``"none"``. A guessed ``flops`` column
  that equals the FLOPs-per-token column times D (within 1%) is total compute; otherwise one whose
  median flops/(N D) lies outside [0.5, 100] is not (a per-token FLOPs column gives ~1e-9) and is
  ignored with a note.
- Row filters: ``where`` holds conditions on the table's own column names in the filter language
  of :mod:`scaling.common.filter` (comparisons, and/or/not, in [...], arithmetic; nothing that can
  run code), applied in order before anything else; row numbers in messages are those of the file.
- A cell that is not a number (``n/a``, ``-``) is an error naming its column, row and value; only
  empty cells are missing values.
- Runs: without a run column every row is its own run, so the bootstrap treats rows as
  independent; a run column clusters them.

Learning rates. A scaling law describes each size at its tuned learning rate; a folder or table
that also holds an lr sweep (runs of one size at several peak lrs) would otherwise fit the law
through the mistuned runs too (and, where their seeds differ, average them as if they were seeds).
Each run's peak lr is read from its ``config.json`` (``train.lr``; a missing, unreadable or
non-positive one is unknown) in a runs directory, or from the ``lr`` column of a table
(``Columns.lr``; "none": not read). Where one group's size (N, sparsity, FLOPs per token) was
trained at several lrs, only the points of its best lr are kept: the lowest mean log loss over the
token counts every one of its lrs reached, seeds averaged first (one lr per size, as an lr rule per
width gives, so a run's curve stays whole; a size whose lrs share no token count chooses per
count). Points of unknown lr are kept. A note says how many points were left out. This is the lower
envelope over learning rates of an IsoFLOP study tuned per size (Hoffmann et al. 2022, section 3);
the best of several lrs reads a little low by seed noise (a winner's curse of order the seed spread
over the square root of the seeds), which the note says. Without any lr, two runs of one
configuration with one seed (something the table does not record differs between them) get a note
instead: every such run counts in the fit.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd

from scaling.common.errors import UserError
from scaling.common.files import bad_number, check_regular_file, read_json, read_jsonl
from scaling.common.filter import filter_rows
from scaling.common.format import CONTROL_CHARS
from scaling.common.run_folder import FINAL, FINAL_META, Point, find_run_folders
from scaling.fitting.laws import TokenCost

CANONICAL = ("group", "run", "N", "D", "loss", "flops", "flops_per_token", "sparsity", "seed", "lr")
# Law input name (scaling.fitting.laws) -> canonical column.
INPUT_COLUMNS = {"N": "N", "D": "D", "F": "flops_per_token", "S": "sparsity"}
DEFAULT_GROUP = "default"
TABLE_SUFFIXES = (".csv", ".tsv", ".jsonl", ".ndjson", ".json", ".parquet", ".pq")
NONE = "none"          # column name that switches a guessed column off
DEFAULT_FLOPS_PER_ND = 6.0
UNITS = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
PLAUSIBLE_N_MIN = 1e4
PLAUSIBLE_TOKENS_PER_PARAM = (1e-2, 1e5)
PLAUSIBLE_K = (0.5, 100.0)

log = logging.getLogger(__name__)
# Source columns guessed when not named (Columns): the trainer's point fields for compute, group, run.
GUESS_C, GUESS_GROUP, GUESS_RUN = Point.key("flops"), Point.key("arch"), Point.key("run")
GUESS_SEED = Point.key("seed")
# Column of read_runs_dir: the run folder's path relative to the runs directory (see module doc).
RUN_DIR = "run_dir"
SOURCE_LOSS_PREFIX = "val_loss/"   # per-source validation losses a point may carry (val_loss/<source>)
LR = "lr"   # column of each run's peak learning rate (read_runs_dir takes it from config.json)


DEFAULT_N, DEFAULT_D = Point.key("N"), Point.key("D")  # the columns of Columns(n=None, d=None)


@dataclass(frozen=True)
class Columns:
    """Source column names, each optionally ``name:unit`` (see module doc).

    ``n`` and ``d`` None: the columns ``N`` and ``D``, either derived from the compute when absent (a
    named column must exist). ``group``, ``c`` and ``run`` None: guess (``arch``, ``flops``, ``run``
    when present); ``seed`` and ``lr`` None: the columns ``seed`` and ``lr`` when present; a named
    column must exist; ``"none"``: no such column. ``flops_per_nd``: k in C = k N D for deriving N
    or D, and for the compute of points without a compute column; None means 6 and, without a
    compute column, leaves the compute unrecorded (the fitter then uses 6).
    """

    n: str | None = None   # None: column N, or derived from C and D when there is none
    d: str | None = None   # None: column D, or derived from C and N when there is none
    loss: str = Point.key("loss")
    group: str | None = None
    c: str | None = None
    flops_per_token: str = Point.key("flops_per_token")
    sparsity: str = Point.key("sparsity")
    seed: str | None = None   # None: a column named seed when there is one
    lr: str | None = None     # None: a column named lr when there is one (a runs directory: config.json)
    run: str | None = None
    flops_per_nd: float | None = None
    where: tuple[str, ...] = ()


@dataclass(frozen=True)
class SkippedRun:
    """A run folder left out of the points, and why."""

    folder: str
    reason: str

    def __str__(self) -> str:
        return f"skipped run {self.folder}: {self.reason}"


@dataclass(frozen=True)
class Table:
    """Canonical points and how they were read: ``mapping`` (canonical name -> source, with its unit,
    guess or derivation), ``notes`` (guesses switched off, plausibility), ``skipped`` run folders,
    ``rows_read`` / ``rows_kept`` (before and after ``where``), and ``settings`` for a fit's record."""

    points: pd.DataFrame
    mapping: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    skipped: list[SkippedRun] = field(default_factory=list)
    rows_read: int = 0
    rows_kept: int = 0
    settings: dict[str, Any] = field(default_factory=dict)

    def messages(self) -> list[str]:
        """Every note and skipped run, one line each (for a caller to print once)."""
        return [*self.notes, *map(str, self.skipped)]


def parse_column(spec: str, columns: Iterable[str] = ()) -> tuple[str, float]:
    """``name`` or ``name:unit`` -> (name, scale). A name present in ``columns`` as written wins, so a
    column whose name holds a colon still works."""
    if spec in set(map(str, columns)) or ":" not in spec:
        return spec, 1.0
    name, unit = spec.rsplit(":", 1)
    u = unit.strip()
    if u.upper() in UNITS:
        return name, UNITS[u.upper()]
    try:
        scale = float(u)
    except ValueError:
        scale = math.nan
    if not (math.isfinite(scale) and scale > 0):
        raise UserError(f"unknown unit {unit!r} in column {spec!r}; use K, M, B (or G), T or a positive "
                        "number such as 1e6")
    return name, scale


def load_table(path: str | Path, columns: Columns = Columns()) -> Table:
    """Points from a runs directory or a table file, with how they were read (see module doc)."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"no such file or directory: {path}")
    skipped: list[SkippedRun] = []
    if path.is_dir():
        raw, skipped = read_runs_dir(path, return_skipped=True)
    else:
        raw = read_table(path)
    table = canonicalize_table(raw, columns, source=str(path))
    for s in skipped:     # info, not warning: the caller prints the returned list once
        log.info("%s", s)
    return Table(points=table.points, mapping=table.mapping, notes=table.notes, skipped=skipped,
                 rows_read=table.rows_read, rows_kept=table.rows_kept, settings=table.settings)


def load_points(path: str | Path, columns: Columns = Columns(), *,
                warn: Callable[[str], None] | None = None) -> pd.DataFrame:
    """Points only (:func:`load_table`); its notes and skipped runs go to ``warn`` when given."""
    table = load_table(path, columns)
    if warn is not None:
        for m in table.messages():
            warn(m)
    return table.points


# -- readers ------------------------------------------------------------------------------
def read_table(path: Path) -> pd.DataFrame:
    """A table file as it is (no renaming); the format follows the suffix."""
    suffix = path.suffix.lower()
    check_regular_file(path, "table")
    if suffix in (".csv", ".tsv"):
        _check_header(path, "\t" if suffix == ".tsv" else ",")
    try:
        if suffix in (".csv", ".tsv"):
            # only empty cells are missing: "n/a", "NA", "-" stay text and are reported as not numeric
            return pd.read_csv(path, sep="\t" if suffix == ".tsv" else ",", keep_default_na=False,
                               na_values=[""])
        if suffix in (".jsonl", ".ndjson"):
            return pd.DataFrame(read_jsonl(path, strict=True).rows)
        if suffix == ".json":
            return pd.DataFrame(_points_of(read_json(path, "table"), str(path)))
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


def _check_header(path: Path, sep: str) -> None:
    """A CSV header naming one column twice is refused (pandas would rename the second ``loss.1``
    and the first would be fitted silently)."""
    import csv

    try:
        with open(path, newline="", encoding="utf-8") as fh:
            header = next(csv.reader(fh, delimiter=sep), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        return          # read_table reports it
    seen: set[str] = set()
    for name in header:
        if name in seen:
            raise UserError(f"{path}: the header names column {name!r} twice; rename one")
        seen.add(name)


def _points_of(obj: object, where: str) -> list[dict]:
    """Points of a final.json-like object: {"points": [...]}, a list of points, or one point."""
    if isinstance(obj, dict) and "points" in obj:
        pts = obj["points"]
        if not isinstance(pts, list) or not all(isinstance(p, dict) for p in pts):
            raise UserError(f"{where}: 'points' must be a list of objects")
        meta = {k: obj[k] for k in FINAL_META
                if k in obj and not isinstance(obj[k], (dict, list))}
        return [{**meta, **p} for p in pts]
    if isinstance(obj, list) and all(isinstance(p, dict) for p in obj):
        return list(obj)
    if isinstance(obj, dict):
        return [obj]
    raise UserError(f"{where}: expected a point object, a list of them or {{'points': [...]}}")


def read_runs_dir(root: Path, *, warn: Callable[[str], None] | None = None,
                  return_skipped: bool = False) -> pd.DataFrame | tuple[pd.DataFrame, list[SkippedRun]]:
    """All points of the finished runs under ``root`` (searched recursively).

    A run folder is any folder holding ``config.json`` or ``final.json``. Unfinished runs (no
    final.json) and unreadable ones are left out, each as a :class:`SkippedRun` (passed to ``warn``,
    and returned with ``return_skipped``). No points at all is an error. Each row carries
    ``run_dir`` (:data:`RUN_DIR`), the run folder's path relative to ``root`` ("." for ``root``
    itself), beside ``run``, the name final.json records (module doc).
    """
    folders = find_run_folders(root)
    rows: list[dict] = []
    skipped: list[SkippedRun] = []
    n_unfinished = n_corrupt = 0
    for run in folders:
        name = str(run.path.relative_to(root)) if run.path != root else run.name
        try:
            final = run.final()
            if final is None:
                n_unfinished += 1
                skipped.append(SkippedRun(name, "no final.json (unfinished: not all its token budgets "
                                                "reached)"))
                continue
            pts = _points_of(final, str(run.path / FINAL))
            if not pts and isinstance(final, dict) and final.get("complete") is False:
                # the trainer writes final.json when it starts: a run before its first budget
                n_unfinished += 1
                skipped.append(SkippedRun(name, "unfinished: no token budget reached yet"))
                continue
            if not pts:
                raise UserError("no points")
            for p in pts:
                # per-source losses are compared like the loss itself: a string there is corruption
                sources = sorted(k for k in p if str(k).startswith(SOURCE_LOSS_PREFIX))
                keys = ("loss", "D", "N", "flops", *sources)
                key = bad_number(p, keys)
                if key is not None:
                    raise UserError(f"{key} {str(p[key])[:30]!r} is not a number")
                for key in keys:
                    v = p.get(key)
                    if isinstance(v, int) and abs(v) > sys.float_info.max:
                        raise UserError(f"{key} {str(v)[:30]}... is beyond any float")
                why = _bad_identity(p)
                if why is not None:
                    raise UserError(why)
        except UserError as exc:
            n_corrupt += 1
            skipped.append(SkippedRun(name, f"unreadable final.json ({' '.join(str(exc).split())})"))
            continue
        lr = _peak_lr(run)
        for p in pts:
            loss = p.get("loss")
            if "loss" in p and (loss is None or not np.isfinite(loss) or loss <= 0):
                # a diverged or unrecorded budget: named, never silently lost from a comparison or a fit
                why = ("no loss" if loss is None else f"loss {loss} is not finite (diverged?)"
                       if not np.isfinite(loss) else f"loss {loss} is not positive")
                skipped.append(SkippedRun(f"{name} (D={p.get('D')})", f"{why}; that point is left out"))
                continue
            # the folder's own path last: final.json's "run" must not stand in for where the run lies
            rows.append({GUESS_RUN: name, LR: lr, **p, RUN_DIR: str(run.path.relative_to(root))})
    if warn is not None:
        for s in skipped:
            warn(str(s))
    if not rows:
        raise UserError(f"no finished runs under {root} ({len(folders)} run folders: "
                        f"{n_unfinished} unfinished, {n_corrupt} unreadable)")
    df = pd.DataFrame(rows)
    return (df, skipped) if return_skipped else df


def _peak_lr(run: Any) -> float:
    """The run's peak lr from its config.json (``train.lr``); NaN when the config is missing or
    unreadable or holds none (the points are final.json's: a config problem must not lose them)."""
    try:
        lr = (run.config().get("train") or {}).get("lr")
    except (UserError, AttributeError):
        return math.nan
    ok = isinstance(lr, (int, float)) and not isinstance(lr, bool) and math.isfinite(lr) and lr > 0
    return float(lr) if ok else math.nan


# -- canonical columns and validation -----------------------------------------------------
# Roles as library messages name them (the CLI maps each to its option).
ROLES = {"N": "parameter", "D": "token", "loss": "loss", "C": "compute", "group": "group", "run": "run",
         "F": "FLOPs-per-token", "S": "sparsity", "seed": "seed", "lr": "lr"}


def _numeric(df: pd.DataFrame, col: str, source: str, rows: np.ndarray | None = None) -> np.ndarray:
    s = df[col]
    # booleans and dates convert to numbers silently (True -> 1, a date -> nanoseconds): refused
    kind = s.dtype.kind
    if kind in "bMm" or (kind == "O" and s.map(lambda v: isinstance(v, (bool, np.bool_))).any()):
        what = "booleans (True/False)" if kind in "bO" else "dates or durations"
        raise UserError(f"{source}: column {col!r} holds {what}, not numbers")
    num = pd.to_numeric(s, errors="coerce")
    bad = (num.isna() & s.notna()) | ~np.isfinite(num.fillna(0).to_numpy(dtype=float))
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        row = int(rows[i]) if rows is not None else i + 1
        n_bad = int(bad.sum())
        raise UserError(f"{source}: column {col!r} has a value that is not a finite number: row {row} "
                        f"reads {s.iloc[i]!r} ({n_bad} such cell{'s' if n_bad > 1 else ''} in all)")
    return num.to_numpy(dtype=float)


# a point's labels: what groups, pairs and clusters it (compare, fit); a null, a list or a table there
# crashed them (2026-12-07 review)
_LABELS = ("run", "arch", "tier")


def _bad_identity(p: dict) -> str | None:
    """Why a final.json point cannot be used, else None: it has ``N`` and ``D``; ``run``, ``arch`` and
    ``tier``, where given, are non-empty strings; ``seed`` a string or an integer; ``budget_index`` an
    integer >= 0."""
    missing = [k for k in ("N", "D") if p.get(k) is None]
    if missing:   # e.g. a final.json without its "points" list, read as one point
        return f"no {' or '.join(missing)} in its point"
    for key in _LABELS:
        if key in p and not (isinstance(p[key], str) and p[key]):
            return f"{key} {str(p[key])[:30]!r} is not a name"
    seed = p.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (str, int))):
        return f"seed {str(seed)[:30]!r} is not an integer or a name"
    b = p.get("budget_index")
    if b is not None and (isinstance(b, bool) or not isinstance(b, int) or b < 0):
        return f"budget_index {str(b)[:30]!r} is not an integer >= 0"
    return None


def _missing(df: pd.DataFrame, role: str, col: str, source: str, extra: str = "") -> UserError:
    cols = [str(c) for c in df.columns]
    if len(cols) == 1 and "\t" in cols[0]:
        # one column whose name holds tabs: a tab-separated file read as comma-separated
        extra = f"; its one column {cols[0][:60]!r} holds tabs: name a tab-separated table .tsv" + extra
    return UserError(f"{source}: no {ROLES[role]} column {col!r} (columns: {', '.join(cols)})" + extra)


def _off(name: str | None) -> bool:
    return name is not None and name.strip().lower() == NONE


def canonicalize(raw: pd.DataFrame, columns: Columns = Columns(), *, source: str = "table") -> pd.DataFrame:
    """Rename and convert a raw table to the canonical columns (see :func:`canonicalize_table`)."""
    return canonicalize_table(raw, columns, source=source).points


def canonicalize_table(raw: pd.DataFrame, columns: Columns = Columns(), *, source: str = "table") -> Table:
    """Filter, rename, unit-convert and derive a raw table's columns (see module doc); N, D, loss checked
    (finite, > 0). Returns the points with the mapping used and the notes to show the user."""
    if raw.empty:
        raise UserError(f"{source}: no rows")
    c = columns
    raw = raw.reset_index(drop=True)
    raw.columns = [str(x) for x in raw.columns]
    dup = raw.columns[raw.columns.duplicated()]
    if len(dup):
        raise UserError(f"{source}: column {dup[0]!r} appears twice; rename one")
    rows_read = len(raw)
    raw = filter_rows(raw, c.where, source)
    if raw.empty:
        raise UserError(f"{source}: no rows left after the row filters ({'; '.join(c.where)})")
    rownum = raw.index.to_numpy() + 1                # rows as numbered in the file's data
    raw = raw.reset_index(drop=True)
    cols = list(raw.columns)
    mapping: dict[str, str] = {}
    notes: list[str] = []
    k_given = c.flops_per_nd is not None
    k = float(c.flops_per_nd) if k_given else DEFAULT_FLOPS_PER_ND
    if not (math.isfinite(k) and k > 0):
        raise UserError(f"the FLOPs per parameter per token k (C = k N D) must be > 0, got {k}")

    def col(role: str, spec: str) -> tuple[str, float, bool]:
        name, scale = parse_column(spec, cols)
        return name, scale, name in cols

    def values(name: str, scale: float) -> np.ndarray:
        return _numeric(raw, name, source, rownum) * scale

    def described(name: str, scale: float, how: str = "") -> str:
        unit = f" x {scale:g}" if scale != 1 else ""
        return f"{name!r}{unit}{how}"

    n_name, n_scale, has_n = col("N", c.n or DEFAULT_N)
    d_name, d_scale, has_d = col("D", c.d or DEFAULT_D)
    # a column the user named must exist: deriving instead would answer another question silently
    for role, spec, name, has in (("N", c.n, n_name, has_n), ("D", c.d, d_name, has_d)):
        if spec is not None and not has:
            raise _missing(raw, role, name, source)
    l_name, _, has_l = col("loss", c.loss)
    if not has_l:
        raise _missing(raw, "loss", l_name, source)
    compute = None
    if c.c is not None and not _off(c.c):
        c_name, c_scale, has_c = col("C", c.c)
        if not has_c:
            raise _missing(raw, "C", c_name, source)
        compute = values(c_name, c_scale)
        # a compute that is not a positive number would be a budget no run had (2026-12-07 review:
        # negative, zero and NaN values passed unremarked)
        check_positive_finite(compute, f"C ({c_name!r})", source, rows=rownum)
        mapping["C"] = described(c_name, c_scale)
    elif c.c is None and GUESS_C in cols:
        guess = values(GUESS_C, 1.0)
        f_name = c.flops_per_token
        if has_n and has_d and not _agrees_with_per_token(guess, raw, f_name, cols, values(d_name, d_scale)):
            ratio = guess / (values(n_name, n_scale) * values(d_name, d_scale))
            med = float(np.nanmedian(ratio)) if np.isfinite(ratio).any() else math.nan
            if not (PLAUSIBLE_K[0] <= med <= PLAUSIBLE_K[1]):
                notes.append(f"column {GUESS_C!r} is not total training compute (its median flops/(N D) is "
                             f"{med:.3g}, not ~6): ignored; name a compute column explicitly if there is one")
                guess = None
        if guess is not None:
            check_positive_finite(guess, f"C ({GUESS_C!r})", source, rows=rownum)
            compute = guess
            mapping["C"] = f"{GUESS_C!r} (guessed: column named {GUESS_C})"

    def derive(target: str, other: np.ndarray, other_name: str) -> np.ndarray:
        return compute / (k * other)

    if has_n:
        N = values(n_name, n_scale)
        mapping["N"] = described(n_name, n_scale)
    if has_d:
        D = values(d_name, d_scale)
        mapping["D"] = described(d_name, d_scale)
    if not has_n:
        if not (has_d and compute is not None):
            raise _missing(raw, "N", n_name, source, "; or give compute C and tokens D to derive N = C/(k D)")
        N = derive("N", D, "D")
        mapping["N"] = f"derived: C / ({k:g} D)"
    if not has_d:
        if compute is None:
            raise _missing(raw, "D", d_name, source, "; or give compute C to derive D = C/(k N)")
        D = derive("D", N, "N")
        mapping["D"] = f"derived: C / ({k:g} N)"
    out = pd.DataFrame({"N": N, "D": D, "loss": values(l_name, 1.0)})
    mapping["loss"] = repr(l_name)
    if compute is None and k_given:
        compute = k * N * D
        mapping["C"] = f"{k:g} N D"
    out["flops"] = compute if compute is not None else np.nan
    for canon, role, name in (("flops_per_token", "F", c.flops_per_token), ("sparsity", "S", c.sparsity)):
        if _off(name) or name not in cols:
            out[canon] = np.nan
        else:
            out[canon] = values(name, 1.0)
            mapping[canon] = repr(name)
    seed_name = _optional(raw, "seed", c.seed, GUESS_SEED, source)
    lr_name = _optional(raw, "lr", c.lr, LR, source)
    out["seed"] = "" if seed_name is None else _labels(raw[seed_name])
    out["lr"] = np.nan if lr_name is None else _positive_or_missing(raw, lr_name, source, rownum)
    for canon, name in (("seed", seed_name), ("lr", lr_name)):
        if name is not None:
            mapping[canon] = repr(name)
    out["group"], mapping["group"] = _group_column(raw, c.group, source)
    run_name = GUESS_RUN if c.run is None else c.run
    if not _off(run_name) and run_name in cols:
        _no_blank(raw, run_name, "run id", source, rownum, "or --run-col none (each row its own run)")
        out["run"] = raw[run_name].astype(str).to_numpy()
        mapping["run"] = repr(run_name) + (f" (guessed: column named {GUESS_RUN})" if c.run is None else "")
    elif c.run is not None and not _off(c.run):
        raise _missing(raw, "run", c.run, source)
    else:
        # without run ids every row is its own run, so the bootstrap resamples rows as independent
        out["run"] = [f"row{int(i)}" for i in rownum]
        mapping["run"] = "none: each row is its own run (the bootstrap treats rows as independent)"

    notes += _checked_points(out, raw, k, source, rownum)
    n_kept = len(out)   # by the row filters; the lr selection's share is said apart
    out, lr_notes, lr_left_out = _at_tuned_lr(out, lr_off=_off(c.lr))
    notes += lr_notes
    order = ("N", "D", "C", "loss", "group", "run", "flops_per_token", "sparsity", "seed", "lr")
    mapping = {key: mapping[key] for key in order if key in mapping}
    # k matters where it derived a column, or stands in for an unrecorded compute
    k_used = not (has_n and has_d) or compute is None or k_given
    settings = {"columns": mapping, "where": list(c.where), "flops_per_nd": k, "flops_per_nd_used": k_used,
                "rows_read": rows_read, "rows_kept": n_kept, "lr_left_out": lr_left_out}
    return Table(points=out[list(CANONICAL)], mapping=mapping, notes=notes, rows_read=rows_read,
                 rows_kept=n_kept, settings=settings)


def _optional(raw: pd.DataFrame, role: str, name: str | None, default: str, source: str) -> str | None:
    """The column of an optional role: the one named (it must exist; "none": no column), else the
    default name when the table has it, else None."""
    if name is None:
        return default if default in raw.columns else None
    if _off(name):
        return None
    if name not in raw.columns:
        raise _missing(raw, role, name, source)
    return name


def _positive_or_missing(raw: pd.DataFrame, name: str, source: str, rownum: np.ndarray) -> np.ndarray:
    """A numeric column whose cells are positive and finite or empty (NaN: unknown)."""
    x = _numeric(raw, name, source, rownum)
    given = ~raw[name].isna().to_numpy()
    if given.any():
        check_positive_finite(x[given], name, source, rows=rownum[given])
    return np.where(given, x, np.nan)


def _at_tuned_lr(points: pd.DataFrame, lr_off: bool = False) -> tuple[pd.DataFrame, list[str], int]:
    """The points of each size at its best peak lr, the notes, and how many points were left out.

    A size is one group's (N, sparsity, FLOPs per token). Among the lrs a size was trained at, the
    best has the lowest mean log loss over the token counts every one of them reached (seeds of a
    cell averaged first): one lr per size, so a run's training curve stays whole and its seeds stay
    seeds. Where a size's lrs share no token count, each (size, D) keeps its own best lr. Points of
    unknown lr are kept as they are (module doc, "Learning rates")."""
    lr = points["lr"].to_numpy(dtype=float)
    known = np.isfinite(lr)
    if not known.any():
        return points, _unrecorded_variants(points, hint=not lr_off), 0
    cells = pd.DataFrame({"group": points["group"].astype(str).to_numpy(),
                          "size": config_keys(points, SIZE_COLUMNS), "lr": _significant(lr),
                          "D": _significant(points["D"].to_numpy(dtype=float)),
                          "log_loss": np.log(points["loss"].to_numpy(dtype=float))})[known]
    by = ["group", "size"]
    cell = cells.groupby([*by, "lr", "D"], sort=False)["log_loss"].mean().reset_index()
    cell["n_lrs"] = cell.groupby(by, sort=False)["lr"].transform("nunique")
    cell = cell[cell["n_lrs"] > 1]
    if cell.empty:
        return points, [], 0
    # a token count every lr of its size reached; sizes without one choose per (size, D)
    cell["shared"] = cell.groupby([*by, "D"], sort=False)["lr"].transform("nunique") == cell["n_lrs"]
    per_size = cell.groupby(by, sort=False)["shared"].transform("any")
    whole = cell[per_size & cell["shared"]].groupby([*by, "lr"], sort=False)["log_loss"].mean().reset_index()
    best = whole.loc[whole.groupby(by, sort=False)["log_loss"].idxmin(), [*by, "lr"]]
    split = cell[~per_size]
    best_d = split.loc[split.groupby([*by, "D"], sort=False)["log_loss"].idxmin(), [*by, "D", "lr"]]
    swept = cells.merge(cell[by].drop_duplicates().assign(swept=True), on=by, how="left")["swept"].notna()
    won = (cells.merge(best.assign(w=True), on=[*by, "lr"], how="left")["w"].notna().to_numpy()
           | cells.merge(best_d.assign(w=True), on=[*by, "D", "lr"], how="left")["w"].notna().to_numpy())
    keep = np.ones(len(points), dtype=bool)
    keep[np.flatnonzero(known)] = ~swept.to_numpy() | won
    counts = cell.groupby(by, sort=False)["n_lrs"].first()
    span = f"{counts.min()}" if counts.min() == counts.max() else f"{counts.min()} to {counts.max()}"
    dropped = int((~keep).sum())
    per_d = int(split[by].drop_duplicates().shape[0])
    unknown = int((~known).sum())
    note = (f"{len(counts)} sizes (group, N) were trained at several peak lrs ({span} each, lr column): "
            "each keeps the lr with the lowest loss, averaged over seeds and the token counts all its lrs "
            f"reached{f' ({per_d} with no such count choose per token count)' if per_d else ''}, so "
            f"{dropped} of {len(points)} points are left out"
            f"{f' ({unknown} points of unknown lr are kept)' if unknown else ''}; the best of several "
            "lrs reads a little low by seed noise; the lr column set to none keeps every point")
    return points[keep].reset_index(drop=True), [note], dropped


def _unrecorded_variants(points: pd.DataFrame, hint: bool = True) -> list[str]:
    """A note where runs of one group's configuration share a seed: they differ in something the
    table does not record (an lr or schedule sweep, or a repeated run), and all count in a fit."""
    if not (points["seed"].to_numpy() != "").any():
        return []
    n = len(_seed_clashes(points, config_keys(points))[2])
    if not n:
        return []
    return [f"{n} configurations (group, N, D) hold two or more runs with one seed: they differ in something "
            "the table does not record (an lr sweep?), and every one of them counts in a law fit"
            + ("; give each run's peak lr (lr column) to fit each size at its best lr" if hint else "")]


def _labels(s: pd.Series) -> np.ndarray:
    """A column of labels (seeds) as text, a missing cell "" (unknown). Integers are written as
    integers: an integer column as it is, and a float column's whole numbers (a numeric column holding
    a missing cell is float, so seed 3 is read as 3.0) as "3"."""
    types = pd.api.types
    if types.is_integer_dtype(s) or types.is_bool_dtype(s) or not types.is_numeric_dtype(s):
        text = s.astype(str).to_numpy()
    else:
        x = s.to_numpy(dtype=float)
        whole = np.isfinite(x) & (np.abs(x) < 2.0 ** 53)
        whole[whole] = x[whole] == np.round(x[whole])
        text = np.where(whole, np.where(whole, x, 0).astype(np.int64).astype(str), np.char.mod("%.17g", x))
    return np.where(s.isna().to_numpy(), "", text)


def _no_blank(raw: pd.DataFrame, name: str, role: str, source: str, rownum: np.ndarray,
              hint: str = "") -> None:
    """A label column (run ids, groups) with a missing value is refused: as text a missing value would
    be the label 'nan', one run or group made of unrelated rows."""
    blank = raw[name].isna().to_numpy() | (raw[name].astype(str).str.strip() == "").to_numpy()
    if blank.any():
        rows = ", ".join(str(int(r)) for r in rownum[blank][:5]) + (", ..." if blank.sum() > 5 else "")
        raise UserError(f"{source}: column {name!r} gives no {role} in {int(blank.sum())} row(s) "
                        f"(data row {rows}); give every row one" + (f", {hint}" if hint else ""))


def _printable(values: pd.Series, what: str, source: str, rownum: np.ndarray) -> None:
    """UserError for a label holding a control character: a newline would split the warning lines that
    name it, and an escape sequence would reach the terminal (a crafted table could rewrite it)."""
    text = values.astype(str)
    bad = text.str.contains(CONTROL_CHARS)
    if bad.any():
        i = int(np.flatnonzero(bad.to_numpy())[0])
        raise UserError(f"{source}: row {int(rownum[i])}: the {what} {text.iloc[i][:40]!r} holds a control "
                        "character (a newline, tab or escape); labels must be printable")


def _group_column(raw: pd.DataFrame, name: str | None, source: str) -> tuple[Any, str]:
    """(group per row, how it was read): the named column, else a guessed ``arch`` column, else one group."""
    if name is not None and not _off(name):
        if name not in raw.columns:
            raise _missing(raw, "group", name, source)
        _no_blank(raw, name, "group", source, raw.index.to_numpy() + 1)
        return raw[name].astype(str).to_numpy(), repr(name)
    if name is None and GUESS_GROUP in raw.columns:
        return (raw[GUESS_GROUP].fillna(DEFAULT_GROUP).astype(str).to_numpy(),
                f"{GUESS_GROUP!r} (guessed: column named {GUESS_GROUP})")
    return DEFAULT_GROUP, f"none: one group {DEFAULT_GROUP!r}"


def _checked_points(out: pd.DataFrame, raw: pd.DataFrame, k: float, source: str,
                    rownum: np.ndarray) -> list[str]:
    """Labels printable, N, D and loss positive and finite, k N D finite (UserError otherwise); the
    notes on implausible counts and repeated rows."""
    notes: list[str] = []
    for col, what in (("group", "group"), ("run", "run id"), ("seed", "seed")):
        _printable(out[col], what, source, rownum)
    for name in ("N", "D", "loss"):
        check_positive_finite(out[name].to_numpy(), name, source, rows=rownum)
    with np.errstate(over="ignore"):
        nd = k * out["N"].to_numpy() * out["D"].to_numpy()
    if not np.isfinite(nd).all():
        i = int(np.flatnonzero(~np.isfinite(nd))[0])
        raise UserError(f"{source}: {k:g} N D overflows (row {int(rownum[i])}: N = {out['N'].iloc[i]:.3g}, "
                        f"D = {out['D'].iloc[i]:.3g}); are N and D in the right units?")
    # runs this trainer marked as CPU proxies are small on purpose: their counts are not in a wrong unit
    proxies = "proxy" in raw.columns and bool(raw["proxy"].fillna(False).astype(bool).all())
    if not proxies:
        notes += plausibility(out["N"].to_numpy(), out["D"].to_numpy())
    dups = int(out.duplicated(subset=["group", "N", "D", "loss"]).sum())
    if dups:
        every = " (every row appears twice or more: was the table concatenated with itself?)" \
            if dups * 2 >= len(out) else ""
        notes.append(f"{dups} of {len(out)} rows repeat another row exactly (same group, N, D and "
                     f"loss){every}; they count as separate points in the fit and the bootstrap")
    return notes


def plausibility(N: np.ndarray, D: np.ndarray) -> list[str]:
    """Notes when N or D/N look like counts in the wrong unit (see module doc)."""
    out = []
    if N.min() < PLAUSIBLE_N_MIN:
        out.append(f"implausible parameter counts: N down to {N.min():.3g} (below {PLAUSIBLE_N_MIN:.0e}); "
                   "is the column in millions or billions? give its unit (e.g. params:M)")
    tpp = D / N
    lo, hi = PLAUSIBLE_TOKENS_PER_PARAM
    if tpp.min() < lo or tpp.max() > hi:
        out.append(f"implausible tokens per parameter: D/N spans {tpp.min():.3g} to {tpp.max():.3g} "
                   f"(expected within {lo:g} to {hi:g}); are N and D in the same unit? give units "
                   "(e.g. params:M, tokens:B)")
    return out


def check_positive_finite(x: np.ndarray, name: str, source: str, rows: np.ndarray | None = None) -> None:
    bad = ~np.isfinite(x)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise UserError(f"{source}: {name} is missing or not finite in {int(bad.sum())} rows (first: row "
                        f"{int(rows[i]) if rows is not None else i + 1})")
    bad = x <= 0
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise UserError(f"{source}: {name} must be > 0; {int(bad.sum())} rows are not "
                        f"(row {int(rows[i]) if rows is not None else i + 1}: {x[i]:g})")


def law_inputs(df: pd.DataFrame, law_inputs: Iterable[str], *,
               source: str = "table") -> dict[str, np.ndarray]:
    """The arrays a law needs from canonical points, validated (F > 0, 0 <= S < 1)."""
    out = {}
    for name in law_inputs:
        col = INPUT_COLUMNS[name]
        x = df[col].to_numpy(dtype=float)
        if col == "sparsity":
            if not np.isfinite(x).all():
                raise UserError(f"{source}: the law needs sparsity for every point (no sparsity column, "
                                "or empty cells in it)")
            if ((x < 0) | (x >= 1)).any():
                raise UserError(f"{source}: sparsity must lie in [0, 1)")
        elif col == "flops_per_token" and not np.isfinite(x).all():
            raise UserError(f"{source}: the law needs flops_per_token for every point (no FLOPs-per-token "
                            "column, or empty cells in it)")
        else:
            check_positive_finite(x, col, source)
        out[name] = x
    return out


CONFIG_COLUMNS = ("N", "D", "sparsity", "flops_per_token")
SIZE_COLUMNS = ("N", "sparsity", "flops_per_token")   # a configuration without its token count


def _significant(x: np.ndarray, digits: int = 9) -> np.ndarray:
    """``x`` rounded to ``digits`` significant digits (NaN stays NaN; zero, infinities and numbers
    too small to scale stay as they are): numbers that differ by float rounding (8886 and 8886.0, N a
    few ulps apart) come out equal, as their ``%.{digits}g`` text would, computed without text (two
    numbers either side of a rounding edge still differ, as their text would)."""
    x = np.asarray(x, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        scale = 10.0 ** np.floor(np.log10(np.abs(x)))
        m = np.round(x / scale, digits - 1)
        # a mantissa rounded up to 10 (9.9999999996 -> 10) is the next decade's 1, as the text would be
        return np.where(np.isfinite(scale) & (scale > 0) & (x != 0), m * scale, x)


def config_keys(points: pd.DataFrame, columns: Iterable[str] = CONFIG_COLUMNS) -> np.ndarray:
    """One integer key per point naming its configuration: the ``columns`` the table has (default
    N, D, sparsity and FLOPs per token), each to 9 significant digits (8886 and 8886.0, or two N a
    few ulps apart, are one configuration). Without any of them every point is its own configuration."""
    cols = [c for c in columns if c in points.columns]
    if not cols:
        return np.arange(len(points))
    rounded = pd.DataFrame({c: _significant(pd.to_numeric(points[c], errors="coerce").to_numpy(dtype=float))
                            for c in cols})
    return rounded.groupby(cols, dropna=False, sort=False).ngroup().to_numpy()


def _seed_clashes(points: pd.DataFrame, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, set, set]:
    """(key per point, run per point, keys whose runs repeat a seed, keys holding a run of unknown
    seed); a key is a group's ``keys`` value. A seed repeated by two runs of a key is a clash; a run
    holding several seeds is judged by each."""
    def text(col: str) -> np.ndarray:
        return (points[col].fillna("").astype(str).to_numpy() if col in points.columns
                else np.full(len(points), ""))

    group, runs, seeds = text("group"), text("run"), text("seed")
    key = pd.DataFrame({"group": group, "key": np.asarray(keys)}).groupby(
        ["group", "key"], sort=False, dropna=False).ngroup().to_numpy()
    per_run = pd.DataFrame({"key": key, "run": runs, "seed": seeds}).drop_duplicates()
    known = per_run["seed"] != ""
    clash = per_run[known].duplicated(["key", "seed"], keep=False)
    return key, runs, set(per_run.loc[clash[clash].index, "key"]), set(per_run.loc[~known, "key"])


def seed_replicates(points: pd.DataFrame, keys: np.ndarray, *, unknown_together: bool) -> np.ndarray:
    """Integer labels, one per point: the same for points of one group and one key (``config_keys``)
    whose runs are seeds of one configuration, a label per run where they are not.

    The runs of a key are seeds of one configuration when their seeds (the ``seed`` column, one per
    run) are distinct. Two runs of a key with the same seed differ in something the table does not
    record (learning rate, schedule: an lr sweep), so that key keeps all its runs apart. Runs without
    a known seed ("" or no column) count as distinct seeds when ``unknown_together`` (the envelope's
    reading of a folder as one study), and keep their key's runs apart otherwise (approach 1, whose
    frontier over other schedules of one size is wanted). The twins of a pair may share N, D and a
    seed: the group is part of the key."""
    key, runs, apart, unknown = _seed_clashes(points, keys)
    if not unknown_together:
        apart |= unknown
    sep = pd.Series(key).isin(apart).to_numpy()
    label = pd.DataFrame({"key": key, "run": np.where(sep, runs, "")})
    return label.groupby(["key", "run"], sort=False, dropna=False).ngroup().to_numpy()


def group_rows(points: pd.DataFrame, group: Any) -> pd.DataFrame:
    """The canonical points of ``group`` (all of them where there is no group column), renumbered:
    the one way a group's rows are taken, by its name as text (canonical groups are text)."""
    if "group" not in points.columns:
        return points.reset_index(drop=True)
    return points[points["group"].astype(str) == str(group)].reset_index(drop=True)


def total_flops(df: pd.DataFrame, cost: TokenCost | float = DEFAULT_FLOPS_PER_ND) -> np.ndarray:
    """Training FLOPs per point: recorded flops, else F*D, else cost(N)*D (k N D for a number k)."""
    flops = df["flops"].to_numpy(dtype=float)
    fd = df["flops_per_token"].to_numpy(dtype=float) * df["D"].to_numpy(dtype=float)
    knd = TokenCost.of(cost)(df["N"].to_numpy(dtype=float)) * df["D"].to_numpy(dtype=float)
    return np.where(np.isfinite(flops) & (flops > 0), flops, np.where(np.isfinite(fd) & (fd > 0), fd, knd))


def _agrees_with_per_token(flops: np.ndarray, raw: pd.DataFrame, f_name: str, cols: list[str],
                           D: np.ndarray) -> bool:
    """Whether a guessed compute column equals FLOPs-per-token x tokens on every row (within 1%): then
    it is total training compute whatever its flops/(N D), which tiny models put far above 6."""
    if _off(f_name) or f_name not in cols:
        return False
    F = pd.to_numeric(raw[f_name], errors="coerce").to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = flops / (F * D) - 1.0
    return bool(np.isfinite(rel).all() and np.abs(rel).max() <= 0.01)


def per_token_flops(df: pd.DataFrame) -> np.ndarray:
    """Training FLOPs per token of each point: recorded flops / D, else the flops_per_token column
    (NaN where neither is known)."""
    flops = df["flops"].to_numpy(dtype=float)
    D = df["D"].to_numpy(dtype=float)
    F = df["flops_per_token"].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_token = np.where(np.isfinite(F) & (F > 0), F, np.nan)
        return np.where(np.isfinite(flops) & (flops > 0), flops / D, per_token)


def token_cost(df: pd.DataFrame) -> TokenCost:
    """F(N) = k N + e sqrt(N) + c (``scaling.fitting.laws.TokenCost``) fitted to the points' per-token
    FLOPs: non-negative least squares on the relative error, (k N_i + e sqrt(N_i) + c) / F_i = 1.

    Terms by the number of distinct sizes with a known F: none -> k = 6 (Kaplan et al. 2020);
    one -> k = F/N; two -> k N + c; three or more -> all three. When F/N is the same for every point
    (to 1e-9, e.g. a table whose compute is 6 N D) the fit is k N exactly, and the frontier is
    Lagrange's closed form. ``max_rel_error`` is the model's worst relative error on the points.
    """
    from scipy.optimize import nnls

    N = df["N"].to_numpy(dtype=float)
    F = per_token_flops(df)
    ok = np.isfinite(F) & (F > 0) & np.isfinite(N) & (N > 0)
    if not ok.any():
        return TokenCost(k=DEFAULT_FLOPS_PER_ND)
    N, F = N[ok], F[ok]
    ratio = F / N
    if np.ptp(ratio) <= 1e-9 * np.median(ratio):
        return TokenCost(k=float(np.median(ratio)))
    n_sizes = np.unique(N).size
    basis = [N, np.sqrt(N), np.ones_like(N)]
    basis = [basis[0]] if n_sizes == 1 else [basis[0], basis[2]] if n_sizes == 2 else basis
    coef, _ = nnls(np.column_stack([b / F for b in basis]), np.ones_like(F))
    if n_sizes == 1 or coef[0] <= 0:
        # one size, or a per-parameter term the fit drove to 0 (F falling with N): no cost model
        # to trust beyond the data, keep the median ratio
        return TokenCost(k=float(np.median(ratio)),
                         max_rel_error=float(np.max(np.abs(np.median(ratio) / ratio - 1.0))))
    k, e, c = (float(coef[0]), 0.0, float(coef[1])) if len(coef) == 2 else (float(v) for v in coef)
    cost = TokenCost(k=k, e=e, c=c)
    return TokenCost(k=k, e=e, c=c, max_rel_error=float(np.max(np.abs(cost(N) / F - 1.0))))
