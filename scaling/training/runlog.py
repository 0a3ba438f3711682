"""The training side of the run folder: run metadata (code version, environment) and weights files.

The folder's layout, file names and crash-safe writes are :mod:`scaling.common.run_folder`'s (the
one owner, torch-free so that fitting and analysis read the same definitions); they are imported
here because the training rooms write the folder through this module. What stays here needs torch
(``environment``, ``save_weights``) or the package checkout (``code_version``), and the exclusive
``flock`` of a folder's writer (``exclusive``, ``holder``: the run lock and the data preparation's).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

from scaling.common import files
from scaling.common.errors import UserError
from scaling.common.run_folder import (  # noqa: F401  (the training rooms' access to the run folder)
    BUDGET_WEIGHTS_DIR,
    CHECKPOINTS,
    CONFIG,
    FINAL,
    METRICS,
    WEIGHTS,
    append_jsonl,
    atomic_write,
    atomic_write_bytes,
    budget_weights_path,
    current_umask,
    fsync_dir,
    rewrite_jsonl,
    umask_mode,
    write_json,
)


def read_json(path: Path | str) -> Any:
    """A JSON file, bounded (``scaling.common.files.read_json``: regular file, size, nesting)."""
    return files.read_json(path)


# ----- run metadata -------------------------------------------------------------------------

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

def save_weights(path: Path | str, weights, metadata: dict[str, str] | None = None) -> None:
    """Weights as one safetensors file, written atomically.

    ``weights`` is a module or a full (gathered) state dict; a tensor shared by two names (tied
    embeddings) is stored under each name as its own copy, so the file loads with
    ``load_state_dict``.
    """
    from safetensors.torch import save

    state = weights.state_dict() if hasattr(weights, "state_dict") else weights
    tensors = {k: v.detach().cpu().clone().contiguous() for k, v in state.items()}
    atomic_write_bytes(path, _sorted_metadata(save(tensors, metadata=metadata or {})))


def _sorted_metadata(data: bytes) -> bytes:
    """safetensors bytes with the header's ``__metadata__`` keys in sorted order: the library writes
    them in a hash map's order, new in every process, so the same weights gave other bytes (and
    another sha256) in every run, and analyses saved against them read as stale (the resume audit
    of 2026-12-07). Same length (only the order moves), so every offset stays valid; anything
    unexpected leaves the bytes as they were."""
    n = int.from_bytes(data[:8], "little")
    try:
        header = json.loads(data[8:8 + n].decode("utf-8"))
        if not isinstance(header.get("__metadata__"), dict):
            return data
        header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except (ValueError, UnicodeDecodeError, AttributeError):
        return data
    if len(text) > n:
        return data
    return data[:8] + text + b" " * (n - len(text)) + data[8 + n:]


def holder(path: Path) -> str:
    """Who holds the lock file ``path``, as its holder wrote it (pid, host, since)."""
    try:
        info = json.loads(Path(path).read_text())
        return f"pid {info['pid']} on {info['host']}, since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def take_lock(path: Path) -> int | None:
    """An exclusive ``flock`` on the file ``path`` (created), with this process written into it as
    the holder: the open descriptor (closing it drops the lock), or None when another process
    holds it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except IsADirectoryError:
        raise UserError(f"{path} is a folder, where the run folder keeps its lock file: move it "
                        "away") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
    return fd


@contextlib.contextmanager
def exclusive(path: Path, busy: str) -> Iterator[None]:
    """Hold :func:`take_lock` on ``path`` for the ``with`` block; UserError ``busy`` (with the
    holder named) when another process holds it. For folders other than runs (a data preparation's
    output), whose contents must not include a lock file."""
    fd = take_lock(path)
    if fd is None:
        raise UserError(f"{busy} (held by {holder(path)})")
    try:
        yield
    finally:
        os.close(fd)
