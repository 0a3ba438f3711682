"""One writer per run folder: an exclusive ``flock`` on ``<run_dir>/.lock`` for the whole run.

Two trainers on one run folder (two ``train`` commands, a plan listing one run twice, a second
``--resume`` while the first runs) would both append to ``metrics.jsonl`` and the loser's run id
would end up in ``config.json``. The first writer takes ``fcntl.flock(LOCK_EX | LOCK_NB)`` on
the lock file before it writes anything and keeps the descriptor open until the run ends; the
kernel drops the lock when the process dies in any way (SIGKILL included), so a stale lock file
never blocks a resume. The file holds the holder's pid, host and start time, which the refusal
names. Under torchrun rank 0 holds it (only rank 0 writes the run folder).

``flock`` locks are per open file description and work across processes of one host; on NFS,
Linux emulates them with POSIX byte-range locks, which NFSv4 servers honour across hosts.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterable, Iterator

from scaling.common.errors import UserError
from scaling.common.run_folder import LOCK
from scaling.training.runlog import holder, take_lock


def _refusal(run_dir: Path) -> UserError:
    return UserError(f"run folder {run_dir} is in use by {holder(run_dir / LOCK)}; one process writes a "
                     "run folder at a time (a training: wait for it to end, or stop it, then --resume)")


def check_free(run_dir: Path) -> None:
    """UserError when another process holds ``run_dir``'s lock (no side effects when it is free
    or absent: the lock file is opened read-only and released at once)."""
    path = Path(run_dir) / LOCK
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _refusal(Path(run_dir)) from None
    finally:
        os.close(fd)


@contextlib.contextmanager
def held(run_dirs: Iterable[Path | str]) -> Iterator[None]:
    """Hold the lock of every folder in ``run_dirs`` for the ``with`` block: for a writer other than
    the trainer (``analyze`` writes ``analysis/`` and ``eval_data/``), so that a training started
    meanwhile is refused instead of replacing the weights under it (2026-12-07 review: an ICL result
    was saved a second after ``train --overwrite`` took the folder). UserError naming the holder
    when one is taken; the locks taken so far are released."""
    locks = []
    try:
        for d in dict.fromkeys(Path(r).resolve() for r in run_dirs):
            if not d.is_dir():   # not a run folder: the reader's own error says so
                continue
            lock = RunLock()
            lock.acquire(d)
            locks.append(lock)
        yield
    finally:
        for lock in locks:
            lock.release()


class RunLock:
    """The exclusive lock of one run folder; :meth:`acquire` once, :meth:`release` at the end."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.path: Path | None = None

    def acquire(self, run_dir: Path) -> None:
        """Take the lock (the folder must exist); UserError naming the holder when it is taken."""
        path = Path(run_dir) / LOCK
        fd = take_lock(path)
        if fd is None:
            raise _refusal(Path(run_dir))
        self.fd, self.path = fd, path

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing the descriptor drops the flock
            self.fd = None

    def __del__(self) -> None:
        self.release()
