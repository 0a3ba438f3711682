"""Checkpoints: when and what to save, written atomically with torch.distributed.checkpoint (DCP).

Where: ``<run_dir>/checkpoints/`` by default, so a checkpoint lives with the one run that wrote
it (``.gitignore`` keeps them out of git); a separate parent folder may be given for large
models, and then the run's folder in it is ``<parent>/<run name>-<run id>``: never keyed by the
run name alone, so two runs of one name in different runs folders cannot share checkpoints.

What: one folder per checkpoint holding the model and optimizer state dicts in DCP's sharded
format (``get_state_dict``/``set_state_dict`` of ``torch.distributed.checkpoint.state_dict``, so
the same code saves a plain module, a DDP module and an FSDP2 module, and a checkpoint saved on
W ranks loads on any other number of ranks), ``rng.pt`` (rank 0's torch/numpy/python RNG
states) and ``meta.json``: the :class:`~scaling.training.loop.state.TrainState` (position in the
run = data position = scheduler step, completed points, wall time), and the run's identity.
Folders: ``iter-<N>`` (the latest; older ones are deleted once a newer one is complete) and
``branch-<i>`` (the trunk state a WSD cooldown branch returns to; deleted once the trunk has
moved past it and a later ``iter-<N>`` exists).

Atomic: every rank writes into ``.tmp-<name>``, files fsynced; rank 0 then writes ``meta.json``
and renames the folder to ``<name>`` (a rename is atomic on POSIX), and only then deletes the
previous checkpoint. A save killed at any moment leaves the previous checkpoint intact plus a
``.tmp-*`` folder, which the next start deletes. The checkpoint folder must be one shared
filesystem path for all ranks.

Identity: ``meta.json`` records the run id (a random id written into the run's ``config.json``
when the run starts) and a hash of the model config, the train config without the keys a resume
may change, the budgets, the data (corpus key and sha256 of its sources and tokenizer) and the
code version (package version and git commit). Resume refuses, with a one-line UserError naming
what differs, a checkpoint of another run, config, data or code version (a finished run's last
checkpoint is still read after a code change: nothing is trained with it), and a checkpoint that
cannot be read (truncated or corrupt files).

Checksums: DCP keeps none, so a flipped byte in a tensor file loaded silently (the resume audit of
2026-12-07: losses drifted from the flip on, exit 0). Each rank CRC-32s the ``.distcp`` files it
wrote (``__<rank>_*``; zlib, about 1 GB/s a core: some seconds per rank at the paper tiers) and
rank 0 the ``.metadata`` and ``rng.pt``; ``meta.json`` records them (``digests``) and a load
verifies them, the files shared out over the ranks, before DCP reads anything; a mismatch is a
one-line refusal. Checkpoints written before this have no ``digests`` and load unverified.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import logging
import os
import pickle
import random
import re
import shutil
import warnings
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from scaling.common.errors import UserError
from scaling.common.files import read_json
from scaling.common.serialize import to_json
from scaling.training import runlog
from scaling.training.loop.state import TrainState
from scaling.training.parallel.expert_parallel import split_expert_stacks, stacked_checkpoint

log = logging.getLogger(__name__)

FORMAT = 2
META, RNG = "meta.json", "rng.pt"


RUN_ID = re.compile(r"[0-9a-f]{12}")  # uuid4().hex[:12], as the trainer makes it


def split_by_owner(folder: Path, run_id: str) -> tuple[list[Path], list[str]]:
    """(the entries of ``folder`` that run ``run_id`` wrote, the names of other checkpoints in it).

    Run ``run_id`` wrote its ``iter-*``/``branch-*`` folders whose meta.json names it, and the
    ``.tmp-*`` temporaries of saves (any run's; they never hold a complete checkpoint): what
    ``--overwrite`` deletes. Other folders (not dot-named) are checkpoints the run cannot claim:
    they make ``check_empty`` refuse. Files and other dot entries (a user's notes, ``.DS_Store``)
    are neither: they stay, and do not block a new run."""
    mine: list[Path] = []
    other: list[str] = []
    if not folder.is_dir():
        return mine, other
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith(".tmp-"):
            mine.append(entry)
            continue
        if entry.name.startswith(".") or entry.is_symlink() or not entry.is_dir():
            continue
        owned = False
        if RUN_ID.fullmatch(run_id or "") and entry.name.startswith(("iter-", "branch-")):
            try:
                meta = json.loads((entry / META).read_text())
                owned = isinstance(meta, dict) and meta.get("run_id") == run_id
            except (OSError, UnicodeDecodeError, ValueError):
                owned = False
        if owned:
            mine.append(entry)
        else:
            other.append(entry.name)
    return mine, other


def identity_hash(identity: dict) -> str:
    return hashlib.sha256(to_json(identity, indent=None).encode()).hexdigest()[:16]


def identity_diff(saved: dict, current: dict) -> list[str]:
    """Dotted names of the identity entries that differ (e.g. ``train.lr``, ``code.git_commit``)."""
    out = []
    for section in sorted(set(saved) | set(current)):
        a, b = saved.get(section), current.get(section)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += [f"{section}.{k}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        else:
            out.append(section)
    return out


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


# Nothing read from a checkpoint may run code (issue 25). ``rng.pt`` is read with torch's weights-only
# unpickler, allowing numpy's RNG state array besides tensors. DCP reads its ``.metadata`` with plain
# ``pickle.load``, which runs whatever a tampered file names: it is first unpickled here by an
# unpickler that resolves only DCP's metadata classes, torch dtypes and sizes, and paths.
_RNG_GLOBALS = [np.ndarray, np.dtype, type(np.dtype(np.uint32)), np._core.multiarray._reconstruct]
_DCP_MODULES = ("torch.distributed.checkpoint.metadata",)
_DCP_GLOBALS = {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
                ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
                *(("pathlib", n) for n in ("Path", "PosixPath", "PurePosixPath", "WindowsPath",
                                           "PureWindowsPath"))}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _DCP_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if module in _DCP_MODULES:
            obj = super().find_class(module, name)
            if isinstance(obj, type) and obj.__module__ == module:
                return obj
        raise pickle.UnpicklingError(f"its .metadata refers to {module}.{name}, which a checkpoint never "
                                     "holds")


def check_dcp_metadata(path: Path):
    """Refuse (pickle.UnpicklingError) a DCP folder whose ``.metadata`` names anything but metadata;
    return the metadata (read through the restricted unpickler)."""
    return _MetadataUnpickler(io.BytesIO((Path(path) / ".metadata").read_bytes())).load()


def load_rng(path: Path) -> dict:
    """``rng.pt`` through torch's weights-only unpickler (tensors, numpy's state array, plain data)."""
    try:
        with torch.serialization.safe_globals(_RNG_GLOBALS):
            return torch.load(path, weights_only=True)
    except pickle.UnpicklingError:
        raise pickle.UnpicklingError(f"{Path(path).name} holds objects other than RNG states: refusing to "
                                     "load it") from None


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Checkpointer:
    """Saves and restores one run's checkpoints (call every method on every rank).

    folder      this run's checkpoint folder
    identity    the run's identity sections (see the module docstring) and ``run_id``
    every       save the latest state every this many updates (budget ends always save)
    async_save  write the latest state in the background (``dcp.async_save``): training goes on
                while it is written; it is completed (renamed into place) before the next save
                and at the end, so a kill loses at most the save in flight
    """

    def __init__(self, folder: Path, identity: dict, run_id: str, *, rank: int = 0, world: int = 1,
                 every: int = 100, async_save: bool = False):
        self.folder = Path(folder)
        self.identity = identity
        self.hash = identity_hash(identity)
        self.run_id = run_id
        self.rank, self.world = rank, world
        self.every = every
        self.async_save = async_save
        self._pending = None  # (future, tmp, name, meta) of an async save in flight
        self._async_group = None
        if async_save and world == 1:
            # DCP's background thread warns that it assumes one process, outside _quiet()'s reach
            # (catch_warnings holds only in the thread that entered it): this one message, meant
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)

    # ----- folder -----------------------------------------------------------------------
    def check_empty(self) -> None:
        """For a new run: refuse a folder that already holds checkpoints (of another run)."""
        if self.folder.is_dir() and self._complete():
            raise UserError(f"checkpoint folder {self.folder} already holds checkpoints of another run; "
                            "delete it or choose another checkpoint folder")

    def check_writable(self) -> None:
        """Create the folder and write a probe in it (one process): UserError when it cannot be
        written, so that a run refuses before its run folder holds a config.json."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            probe = self.folder / f".tmp-probe-{os.getpid()}"
            probe.touch()
            probe.unlink()
        except OSError as exc:
            raise UserError(f"checkpoint folder {self.folder} is not writable: "
                            f"{exc.strerror or exc}") from None

    def prepare(self) -> None:
        """Create the folder and delete the temporaries of killed saves (every rank)."""
        if self.rank == 0:
            self.check_writable()
            for stale in self.folder.glob(".tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
        self._barrier()

    def _complete(self) -> list[Path]:
        return sorted(p for p in self.folder.glob("*")
                      if p.is_dir() and not p.is_symlink() and not p.name.startswith("."))

    def latest(self) -> Path | None:
        """The newest complete ``iter-<N>`` checkpoint, or None."""
        found = sorted(self.folder.glob("iter-*"), key=lambda p: _iter_of(p))
        return found[-1] if found else None

    def branch_point(self, i: int) -> Path:
        return self.folder / f"branch-{i}"

    # ----- save -------------------------------------------------------------------------
    def due(self, state: TrainState) -> bool:
        return state.iter % self.every == 0

    def save_latest(self, model, optimizer, state: TrainState) -> None:
        self.wait()
        self._save(f"iter-{state.iter:09d}", model, optimizer, state, background=self.async_save)

    def save_branch_point(self, i: int, model, optimizer, state: TrainState) -> None:
        self.wait()
        self._save(self.branch_point(i).name, model, optimizer, state, background=False)

    def _save(self, name: str, model, optimizer, state: TrainState, background: bool) -> None:
        tmp = self.folder / f".tmp-{name}"
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
        self._barrier()
        msd, osd = get_state_dict(model, optimizer)
        # one entry per expert, so that another expert-parallel degree can load it
        payload = split_expert_stacks({"model": msd, "optim": osd}, model)
        meta = {"format": FORMAT, "name": name, "iter": state.iter, "run_id": self.run_id,
                "identity_hash": self.hash, "identity": self.identity, "world_size": self.world,
                "state": state.to_dict()}
        rng = rng_state()
        if background:
            if self.world > 1 and self._async_group is None:
                self._async_group = torch.distributed.new_group(backend="gloo")
            with _quiet():
                future = dcp.async_save(payload, checkpoint_id=str(tmp),
                                        process_group=self._async_group, no_dist=self.world == 1)
            self._pending = (future, tmp, name, meta, rng)
        else:
            with self._failing_save(tmp, name):
                with _quiet():
                    dcp.save(payload, checkpoint_id=str(tmp), no_dist=self.world == 1)
                self._finish(tmp, name, meta, rng)

    def wait(self) -> None:
        """Complete an async save in flight (every rank)."""
        if self._pending is not None:
            future, tmp, name, meta, rng = self._pending
            self._pending = None
            with self._failing_save(tmp, name):
                future.result()
                self._barrier()
                self._finish(tmp, name, meta, rng)

    def _finish(self, tmp: Path, name: str, meta: dict, rng: dict) -> None:
        own = {p.name: _crc32(p) for p in sorted(tmp.glob(f"__{self.rank}_*.distcp"))}
        own = {k: v for d in self._gathered(own) for k, v in d.items()}
        if self.rank == 0:
            runlog.atomic_write(tmp / RNG, lambda fh: torch.save(rng, fh))
            shared = {p.name: _crc32(p) for p in (tmp / ".metadata", tmp / RNG) if p.is_file()}
            runlog.write_json(tmp / META, {**meta, "digests": {**own, **shared}})
            final = self.folder / name
            if final.exists():  # only a branch point saved again after a resume
                shutil.rmtree(final)
            tmp.rename(final)
            runlog.fsync_dir(self.folder)
            if name.startswith("iter-"):
                for old in self.folder.glob("iter-*"):
                    if old != final:
                        shutil.rmtree(old, ignore_errors=True)
                self._prune(TrainState.from_dict(meta["state"]))
        self._barrier()

    @contextlib.contextmanager
    def _failing_save(self, tmp: Path, name: str):
        """A save that fails (disk full, file too large, Ctrl-C, any write error) removes its
        temporary folder and says so in one line; the previous checkpoint was never touched
        (it is deleted only after the new one is renamed into place)."""
        try:
            yield
        except (Exception, CheckpointException, KeyboardInterrupt) as exc:  # DCP's type is a BaseException
            if self.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            inner = _inner_error(exc)
            if isinstance(inner, KeyboardInterrupt):
                raise KeyboardInterrupt(f"interrupted while writing checkpoint {name}") from None
            code = getattr(inner, "errno", None)
            if code in (errno.ENOSPC, errno.EDQUOT):
                what, fix = "no space left on device", "free space"
            elif code == errno.EFBIG:
                what, fix = "file too large for the file system", "use another folder"
            elif "enforce fail at inline_container" in str(inner):
                # torch.save's writer checks its position after each write and reports a short
                # write (EFBIG, ENOSPC, a quota) only as "unexpected pos", without the errno
                what, fix = ("a write was cut short (the disk is full, or a file-size limit such as "
                             "`ulimit -f` or a quota was reached)", "free space or raise the limit")
            elif isinstance(inner, OSError) or isinstance(exc, CheckpointException):
                first = (str(getattr(inner, "strerror", None) or inner).splitlines() or [""])[0][:200]
                what, fix = f"cannot write ({first or type(inner).__name__})", "fix it"
            else:
                raise
            previous = self.latest()
            kept = (f"the previous checkpoint {previous.name} is intact; {fix}, then resume the run"
                    if previous is not None else
                    f"no earlier checkpoint exists; {fix}, then resume the run (it starts over)")
            raise UserError(f"{what} while writing checkpoint {name} in {self.folder}; {kept}") from None

    def restore_branch_point(self, i: int, model, optimizer) -> None:
        """Model and optimizer back to the trunk state saved where branch ``i`` started."""
        self.load(self.branch_point(i), model, optimizer, with_state=False)

    def prune_branch_points(self, state: TrainState) -> None:
        """Delete branch points no longer needed: closed branches, or saved after ``state`` (a
        resume from an older checkpoint will save them again)."""
        if self.rank == 0:
            self._prune(state)
        self._barrier()

    def _prune(self, state: TrainState) -> None:
        pos = state.position
        for p in self.folder.glob("branch-*"):
            i = _iter_of(p)
            closed = i < pos.next_branch and pos.branch != i
            if closed or _meta_iter(p) > state.iter:
                shutil.rmtree(p, ignore_errors=True)

    # ----- load -------------------------------------------------------------------------
    def read_meta(self, path: Path) -> dict:
        """meta.json of a checkpoint, checked against this run; UserError if it is not this run's."""
        try:
            meta = read_json(path / META, "checkpoint meta.json")
            if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                raise ValueError(f"format {meta.get('format') if isinstance(meta, dict) else None}")
            for key, kind in (("run_id", str), ("identity_hash", str), ("world_size", int)):
                if not isinstance(meta.get(key), kind) or isinstance(meta.get(key), bool):
                    raise ValueError(f"{key} {str(meta.get(key))[:30]!r}")
            TrainState.from_dict(meta.get("state"))  # checked here, before anything is loaded
        except (OSError, ValueError) as exc:
            raise UserError(f"checkpoint {path} is unreadable ({exc}); delete it to start the run "
                            "again") from None
        if meta["run_id"] != self.run_id:
            raise UserError(f"checkpoint {path} belongs to another run (run id {meta['run_id']}, "
                            f"this run {self.run_id}); refusing to resume from it")
        if meta["identity_hash"] != self.hash:
            diff = identity_diff(meta.get("identity", {}), self.identity)
            finished = meta.get("state", {}).get("position", {}).get("done", False)
            if finished and all(d.startswith("code.") for d in diff):
                return meta  # nothing left to train: a finished run's result and weights stay usable
            what = ", ".join(diff[:6]) or "identity"
            raise UserError(f"checkpoint {path} was made with a different {what} "
                            "than this run; refusing to resume from it")
        return meta

    def load(self, path: Path, model, optimizer, *, with_state: bool = True) -> TrainState | None:
        """Restore model and optimizer (and RNG and the TrainState) from a checkpoint folder."""
        meta = self.read_meta(path)
        self._verify(path, meta)
        msd, osd = get_state_dict(model, optimizer)
        sd = {"model": msd, "optim": osd}
        try:
            metadata = check_dcp_metadata(path)
            # per-expert entries are views of the live stacks: loading them fills sd in place
            # (a checkpoint from before per-expert entries holds whole stacks: loaded as they are)
            payload = sd if stacked_checkpoint(metadata) else split_expert_stacks(sd, model)
            with _quiet():
                dcp.load(payload, checkpoint_id=str(path), no_dist=self.world == 1)
            if payload is not sd:  # non-tensor values (param_groups) are replaced, not filled
                sd["optim"]["param_groups"] = payload["optim"]["param_groups"]
            rng = load_rng(path / RNG) if with_state else None
        except (Exception, CheckpointException) as exc:  # DCP's own type is a BaseException
            failures = getattr(exc, "failures", None)  # {rank: exception} of a CheckpointException
            inner = next(iter(failures.values())) if failures else exc
            inner = inner[0] if isinstance(inner, tuple) else inner  # (exception, traceback frames)
            first = (str(inner).strip().splitlines() or [""])[0] or type(inner).__name__
            raise UserError(f"checkpoint {path} is unreadable ({first[:200]}); delete it to resume from "
                            "an earlier one or start the run again") from None
        set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        if meta["world_size"] != self.world and self.rank == 0:
            log.warning("resuming a checkpoint of %d ranks on %d: float summation order, hence metrics, "
                        "may differ slightly from an uninterrupted run", meta["world_size"], self.world)
        if not with_state:
            return None
        try:
            set_rng_state(rng)
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise UserError(f"checkpoint {path} is unreadable (its {RNG} holds no RNG states this trainer "
                            f"wrote: {type(exc).__name__} {str(exc)[:80]}); delete it to resume from an "
                            "earlier one or start the run again") from None
        return TrainState.from_dict(meta["state"])

    def close(self) -> None:
        self.wait()

    def _verify(self, path: Path, meta: dict) -> None:
        """The files' CRC-32s against those ``meta.json`` recorded (module docstring), rank r
        checking every world-th file; UserError on any rank's mismatch, on every rank."""
        digests = meta.get("digests")
        if not isinstance(digests, dict):
            return
        names = sorted(digests)[self.rank::self.world]
        bad = [n for n in names if not (path / n).is_file() or _crc32(path / n) != digests[n]]
        bad = sorted(n for b in self._gathered(bad) for n in b)
        if bad:
            verb = "does" if len(bad) == 1 else "do"
            raise UserError(f"checkpoint {path} is corrupt: {', '.join(bad[:3])} {verb} not match the "
                            "checksum recorded when it was written; it cannot be resumed from "
                            "(--overwrite starts the run again)")

    def _gathered(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (``[obj]`` on one process)."""
        if self.world == 1:
            return [obj]
        every: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(every, obj)
        return every

    def _barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()


def _crc32(path: Path, chunk: int = 1 << 24) -> str:
    """CRC-32 of a file, as 8 hex digits (zlib's, read in 16 MiB chunks)."""
    crc = 0
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            crc = zlib.crc32(block, crc)
    return f"{crc:08x}"


@contextlib.contextmanager
def _quiet():
    """DCP warns on every single-process save/load that it assumes a single process: it is meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _inner_error(exc: BaseException) -> BaseException:
    """The first rank's own exception inside DCP's CheckpointException ({rank: (exc, frames)})."""
    failures = getattr(exc, "failures", None)
    if isinstance(exc, CheckpointException) and failures:
        inner = next(iter(failures.values()))
        return inner[0] if isinstance(inner, tuple) else inner
    return exc


def _iter_of(path: Path) -> int:
    try:
        return int(path.name.split("-")[1])
    except (IndexError, ValueError):
        return -1


def _meta_iter(path: Path) -> int:
    try:
        return int(read_json(path / META, "checkpoint meta.json")["iter"])
    except (OSError, ValueError, KeyError, TypeError):
        return 1 << 62  # unreadable: treat as stale


def latest_iter(folder: Path) -> int | None:
    """The iteration of the newest complete checkpoint in ``folder`` (for tools and tests)."""
    found = [_iter_of(p) for p in Path(folder).glob("iter-*")]
    return max(found) if found else None


def run_identity(model: dict, train: dict, budgets: list[dict], provenance: dict, code: dict) -> dict:
    """The sections a checkpoint must match to be resumed by a run (see the module docstring)."""
    data: dict[str, Any] = {"key": provenance.get("key"), "spec": provenance.get("spec")}
    # built-in corpus sources carry a name, shard-manifest sources a path (keyed by name alone,
    # every manifest source collapsed into one key: issue 25)
    data["sources"] = {s.get("name") or s.get("path"): s.get("sha256") for s in provenance.get("sources", [])}
    data["tokenizer"] = (provenance.get("tokenizer") or {}).get("sha256")
    if provenance.get("manifest_sha256"):  # shards: the manifest fixes every shard's hash and the split
        data["manifest_sha256"] = provenance["manifest_sha256"]
    return {"model": model, "train": train, "budgets": {"budgets": budgets}, "data": data,
            "code": {"version": code.get("version"), "git_commit": code.get("git_commit")}}
