"""Run-folder I/O: crash-safe appends and rewrites, run metadata, final weights.

A run folder ``runs/<name>/`` holds ``config.json`` (written once at start),
``metrics.jsonl`` (one JSON object per line, each appended with write + flush + fsync, so a
crash loses at most the line being written, and a reader skips a torn last line) and
``final.json`` (rewritten whole, via a temporary file + ``os.replace``, which is atomic on
POSIX: a reader sees the old or the new file, never a mix), and ``checkpoints/`` (see
:mod:`scaling.training.loop.checkpoint`).
"""

from __future__ import annotations

import os
import platform
import subprocess
import tempfile
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable

from scaling.common import files
from scaling.common.serialize import to_json

CONFIG, METRICS, FINAL, WEIGHTS = "config.json", "metrics.jsonl", "final.json", "final_weights.safetensors"
# weights at the end of each budget: <run>/weights/budget-<i>.safetensors (TrainConfig budget order)
BUDGET_WEIGHTS_DIR = "weights"


def _fsync_dir(path: Path) -> None:
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
    _fsync_dir(path.parent)


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    atomic_write(path, lambda fh: fh.write(data))


def write_json(path: Path | str, obj: Any) -> None:
    """Atomic JSON write (NaN/inf as null, numpy scalars converted)."""
    atomic_write_bytes(path, (to_json(obj) + "\n").encode())


def read_json(path: Path | str) -> Any:
    """A JSON file, bounded (``scaling.common.files.read_json``: regular file, size, nesting)."""
    return files.read_json(path)


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


# ----- run folder -------------------------------------------------------------------------

def code_version() -> dict:
    """Package version and, when the source is a git checkout, its commit and dirty flag."""
    from scaling import __version__

    info: dict[str, Any] = {"package": "smelt-scale", "version": __version__, "git_commit": None,
                            "git_dirty": None}
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10)
        if commit.returncode == 0:
            info["git_commit"] = commit.stdout.strip()
            dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10)
            info["git_dirty"] = bool(dirty.stdout.strip()) if dirty.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def environment() -> dict:
    import torch

    return {"torch": torch.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "hostname": platform.node(),
            "cuda": torch.version.cuda, "cpu_count": os.cpu_count()}


# ----- final weights ----------------------------------------------------------------------

def budget_weights_path(run_dir: Path | str, index: int) -> Path:
    """``<run_dir>/weights/budget-<index>.safetensors``: the weights at the end of budget ``index``."""
    return Path(run_dir) / BUDGET_WEIGHTS_DIR / f"budget-{index}.safetensors"


def save_weights(path: Path | str, weights, metadata: dict[str, str] | None = None) -> None:
    """Weights as one safetensors file, written atomically.

    ``weights`` is a module or a full (gathered) state dict; a tensor shared by two names (tied
    embeddings) is stored under each name as its own copy, so the file loads with
    ``load_state_dict``.
    """
    from safetensors.torch import save

    state = weights.state_dict() if hasattr(weights, "state_dict") else weights
    tensors = {k: v.detach().cpu().clone().contiguous() for k, v in state.items()}
    atomic_write_bytes(path, save(tensors, metadata=metadata or {}))
