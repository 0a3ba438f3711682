"""The run folder, the one format every part shares: its file names, its crash-safe writes, the
typed :class:`Point` the trainer writes and the fitter reads, and :class:`RunFolder` to read one.

``runs/<name>/`` holds:

=============================  =================================================================
``config.json``                written once at start: the config, its exact accounting, the data
``metrics.jsonl``              one line per logged update, appended durably (:func:`append_jsonl`)
``final.json``                 :func:`final_doc`: one :class:`Point` per finished budget,
                               rewritten atomically; ``complete`` once every budget is done
``final_weights.safetensors``  optional: the final weights
``weights/budget-<i>...``      optional: each budget's weights (:func:`budget_weights_path`)
``checkpoints/``               the trainer's DCP checkpoints (``scaling.training.loop.checkpoint``)
``analysis/<kind>.json``       saved analyses (``scaling.analysis.results``), with the hash of
                               the weights they were computed on (:func:`stale_analysis`)
``.lock``                      held by the one training writing the folder (``...loop.lock``)
=============================  =================================================================

Writes: ``metrics.jsonl`` lines are appended with write + flush + fsync, so a crash loses at most
the line being written and a reader skips a torn last line; every other file is rewritten whole
via a temporary file + ``os.replace`` (atomic on POSIX: a reader sees the old or the new file,
never a mix). Torch-free: training writes through it, fitting and analysis read through it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Mapping

from scaling.common.errors import UserError
from scaling.common.files import JsonlRows, read_config, read_jsonl, sha256_file
from scaling.common.serialize import to_json

# ----- file names (defined here only: tests/test_layout.py checks) ----------------------------
CONFIG, METRICS, FINAL, WEIGHTS = "config.json", "metrics.jsonl", "final.json", "final_weights.safetensors"
CHECKPOINTS = "checkpoints"
BUDGET_WEIGHTS_DIR = "weights"  # <run>/weights/budget-<i>.safetensors (TrainConfig budget order)
ANALYSIS_DIR = "analysis"
LOCK = ".lock"
FILES = (CONFIG, METRICS, FINAL, WEIGHTS, CHECKPOINTS, BUDGET_WEIGHTS_DIR, ANALYSIS_DIR, LOCK)
BUDGET_WEIGHT = re.compile(r"budget-\d+\.safetensors")  # the files of BUDGET_WEIGHTS_DIR
# The saved analysis kinds (analysis/<kind>.json): the attention sink on validation documents and
# on Dyck prompts, loss by length/position, the SMELT-over-Baseline gain, in-context learning.
ANALYSIS_KINDS = ("sink", "sink_dyck", "lengths", "lengths_gain", "icl")
# The validation-data snapshot the analyses read (<run>/eval_data/), and its files.
EVAL_DATA = "eval_data"
EVAL_DATA_FILES = ("provenance.json", "tokenizer.json", "val.npy", "val_offsets.npy", "val_names.json",
                   "train.npy")


def budget_weights_path(run_dir: Path | str, index: int) -> Path:
    """``<run_dir>/weights/budget-<index>.safetensors``: the weights at the end of budget ``index``."""
    return Path(run_dir) / BUDGET_WEIGHTS_DIR / f"budget-{index}.safetensors"


# ----- the trainer -> fitter seam ------------------------------------------------------------

@dataclass(frozen=True)
class Point:
    """One budget of one run: what ``final.json`` records per budget and the fitter reads.

    N is the active non-embedding parameters and ``flops`` = ``flops_per_token`` * D (exact
    accounting, ``scaling.accounting.costs``); ``loss``/``val_bpb`` are the validation loss in
    nats/token and bits/byte at the budget's end, ``train_loss`` the last update's. D is the budget
    rounded to whole steps (``requested_tokens`` before). The field order is the JSON key order.
    """

    run: str
    arch: str
    tier: str
    proxy: bool
    N: int
    D: int
    loss: float
    val_bpb: float
    flops: int
    flops_per_token: int
    sparsity: float
    non_embedding_params: int
    total_params: int
    seed: int
    budget_index: int
    steps: int
    requested_tokens: float
    train_loss: float
    wall_s: float

    @staticmethod
    def key(name: str) -> str:
        """The final.json key of field ``name`` (readers address points through this, so a
        renamed field fails where it is read, at import, not as a missing column later)."""
        if name not in _POINT_FIELDS:
            raise KeyError(f"Point has no field {name!r}")
        return name

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Point":
        """A point as final.json holds it; UserError naming the missing keys."""
        missing = [k for k in _POINT_FIELDS if k not in d]
        if missing:
            raise UserError(f"a final.json point lacks {', '.join(missing)}")
        return cls(**{k: d[k] for k in _POINT_FIELDS})


_POINT_FIELDS = tuple(f.name for f in dataclasses.fields(Point))


# final.json's run-level keys, which a reader copies onto each point (scaling.fitting.tables)
FINAL_META = ("run", "arch", "tier")


def final_doc(run: str, arch: str, tier: str, complete: bool, points: list[dict[str, Any]]) -> dict[str, Any]:
    """``final.json``: the run, its architecture and tier, whether every budget is done, and one
    :class:`Point` (as its dict) per finished budget, in the order they finished.

    The points are taken as dicts, as the trainer's checkpointed state holds them: a finished
    run's last checkpoint is still read after a code change (scaling.training.loop.checkpoint),
    and its points are written back as they were, even those of an older :class:`Point`.
    """
    return {"run": run, "arch": arch, "tier": tier, "complete": complete, "points": points}


@functools.lru_cache(maxsize=64)
def _weights_sha256(path: str, inode: int, mtime_ns: int, size: int) -> str:
    """SHA-256 of a weights file, once per file version (inode, mtime, size: an atomic rewrite is a
    new inode) and process (``plot all`` checks every saved kind of a run against the same file)."""
    return sha256_file(path)


def stale_analysis(doc: Mapping[str, Any], run_dir: Path | str) -> str | None:
    """Why a saved analysis document ``doc`` of the run in ``run_dir`` is not of the run's present
    weights, or None when it is, or cannot be told.

    The SHA-256 saved by ``scaling.analysis.results.save_result`` in the run's own weights record
    (the one named after ``run_dir``; the only one of a one-run analysis) is compared with the
    weights file there now.
    None when the document records no hash (saved before hashes were recorded) or the run folder
    holds no weights file (shipped without weights): there is nothing to compare against.
    """
    records = doc.get("weights")
    if not isinstance(records, list) or not records:
        return None
    mine = [w for w in records if isinstance(w, Mapping) and w.get("run") == Path(run_dir).name]
    rec = mine[0] if mine else (records[0] if len(records) == 1 else None)
    if not isinstance(rec, Mapping) or not isinstance(rec.get("sha256"), str):
        return None
    f = Path(run_dir) / WEIGHTS   # never a path read from the document
    if not f.is_file():
        return None
    st = f.stat()
    have = _weights_sha256(str(f.resolve()), st.st_ino, st.st_mtime_ns, st.st_size)
    if have != rec["sha256"]:
        return (f"it was computed on weights {rec['sha256'][:12]}, but {f.name} is now {have[:12]} "
                "(the run was extended or retrained since)")
    return None


# ----- crash-safe writes ----------------------------------------------------------------------

def fsync_dir(path: Path) -> None:
    """fsync a folder (a rename or a new file in it survives a crash); best effort."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def current_umask() -> int:
    """The process's umask. Linux reports it in /proc/self/status; elsewhere it is read by setting
    and restoring it (Python has no getter), which another thread creating a file in that instant
    would see, hence /proc first."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def umask_mode(mode: int = 0o666) -> int:
    """``mode`` as ``open``/``mkdir`` would create it under the current umask (0o666 for files,
    0o777 for folders)."""
    return mode & ~current_umask()


def atomic_write(path: Path | str, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write(fh)`` on a tmp file in the same folder, fsync, then os.replace onto ``path``.

    The file gets the mode a plain ``open(path, "w")`` would give (0o666 less the umask):
    ``mkstemp`` creates its file owner-only (0o600), which in a shared project folder would hide
    results from colleagues who can read the appended metrics.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, umask_mode(0o666))
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


_TEMPORARY = re.compile(r"^\..+\.[a-z0-9_]{8}\.tmp$")   # mkstemp's names in atomic_write


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Remove the temporary files ``atomic_write`` left in ``folder`` and its subfolders one level
    down (weights/, analysis/; not checkpoints/, whose temporaries the checkpointer owns): a
    SIGKILL between its mkstemp and its replace skips the cleanup, and a full-size weights file
    would stay forever. Only while holding the folder's lock (no writer is running). Returns them."""
    folder = Path(folder)
    subs = [p for p in folder.iterdir() if p.is_dir() and p.name != CHECKPOINTS] if folder.is_dir() else []
    removed = []
    for sub in (folder, *subs):
        for p in sub.glob(".*.tmp"):
            if _TEMPORARY.match(p.name) and p.is_file() and not p.is_symlink():
                p.unlink(missing_ok=True)
                removed.append(p)
    return removed


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    atomic_write(path, lambda fh: fh.write(data))


def write_json(path: Path | str, obj: Any) -> None:
    """Atomic JSON write (NaN/inf as null, numpy scalars converted)."""
    atomic_write_bytes(path, (to_json(obj) + "\n").encode())


def append_jsonl(path: Path | str, record: dict) -> None:
    """Append one line and make it durable (write, flush, fsync) before returning."""
    line = to_json(record, indent=None) + "\n"
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())


def rewrite_jsonl(path: Path | str, records: Iterable[dict]) -> None:
    """Replace a JSONL file atomically with ``records``."""
    text = "".join(to_json(r, indent=None) + "\n" for r in records)
    atomic_write_bytes(path, text.encode())


# ----- reading --------------------------------------------------------------------------------

def is_run_folder(path: Path | str) -> bool:
    """Whether ``path`` holds a run: its config.json beside a metrics.jsonl or a final.json (what a
    training writes first and next). Such a folder has one writer; other commands' outputs stay out."""
    p = Path(path)
    return (p / CONFIG).is_file() and ((p / METRICS).exists() or (p / FINAL).exists())


def find_run_folders(root: Path | str, marker: str | tuple[str, ...] = (CONFIG, FINAL)) -> list["RunFolder"]:
    """Every run folder under ``root`` (searched recursively, following links to folders, each
    folder once: a study often links runs in from elsewhere): a folder holding one of the
    ``marker`` files; sorted by path. UserError when ``root`` is not a folder."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"no such runs folder: {root}")
    markers = (marker,) if isinstance(marker, str) else marker
    found, seen = [], set()
    for here, dirs, files in os.walk(root, followlinks=True):
        try:
            st = os.stat(here)
        except OSError:
            dirs[:] = []
            continue
        if (st.st_dev, st.st_ino) in seen:  # a link cycle, or a folder reached twice
            dirs[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        dirs.sort()
        if any(m in files for m in markers):
            found.append(Path(here))
    return [RunFolder(p) for p in sorted(found)]


@dataclass(frozen=True)
class RunFolder:
    """One run folder; each reader raises UserError naming the file when it is unreadable."""

    path: Path

    @property
    def name(self) -> str:
        return self.path.name

    def config(self) -> dict[str, Any]:
        return read_config(self.path / CONFIG, "run config")

    def final(self) -> dict[str, Any] | None:
        """final.json, or None before the first budget is done."""
        f = self.path / FINAL
        return read_config(f, "final") if f.exists() else None

    def complete(self) -> bool:
        """Whether final.json says every budget is done and holds its points (False when it is
        missing or unreadable, or its ``points`` is not a non-empty list of objects: a run that
        cannot show it finished is not finished), and config.json, which the trainer wrote first,
        is there (a final.json alone was copied or left over: nothing says which run it is)."""
        try:
            final = self.final()
        except UserError:
            return False
        if not (final and final.get("complete", False) is True):
            return False
        pts = final.get("points")
        return (isinstance(pts, list) and bool(pts) and all(isinstance(p, dict) for p in pts)
                and (self.path / CONFIG).exists())

    def metrics(self) -> JsonlRows:
        """The logged lines (a torn last line is dropped and counted)."""
        return read_jsonl(self.path / METRICS, missing_ok=True)

    def status(self) -> str:
        """'done', 'partial' or 'new': the one rule (the sweep decides by it whether to skip,
        resume or start a run).

        'done': :meth:`complete` (an incomplete or unreadable final.json, or one without points or
        without its config.json, is never finished). 'partial': otherwise, when config.json
        exists: the trainer wrote it before anything else and resumes from it. 'new': otherwise,
        a final.json alone included (copied or left over without its config.json): the trainer
        cannot resume that, it starts the run afresh and rewrites final.json.
        """
        if self.complete():
            return "done"
        return "partial" if (self.path / CONFIG).exists() else "new"
