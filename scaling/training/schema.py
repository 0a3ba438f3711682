"""One typed schema for sweep plans and the trainer: type and range checks with one-line errors.

Every value a plan or ``train --config`` file gives (TOML: strings, integers, floats, booleans,
arrays, tables) is checked against the type its consumer declares, before anything runs:

* ``[train]`` (and the ``[train]`` keys of ``[tier."x"]``): the fields of
  :class:`scaling.training.loop.config.TrainConfig`, typed by its annotations (:func:`check_fields`,
  called by ``TrainConfig.__post_init__``, so the trainer, ``train --config`` and plans share it);
* ``[sweep]``, ``[executor]``, ``[parallel]``, ``[data]``: the tables below (:data:`SWEEP`,
  :data:`EXECUTOR`, :data:`PARALLEL`, :data:`DATA`), checked by :func:`check_table`.

Rules: an ``int`` is an integer and never a boolean (TOML ``true`` is not 1) nor a float
(``16.5`` is refused, not truncated); a ``float`` accepts integers but not booleans, strings,
``inf`` or ``nan``; ``X | None`` accepts a missing value; ``tuple[T, ...]`` is a TOML array of T.
Nothing is converted from text: ``lr = "3e-3"`` is an error naming ``lr``, as the issue that
asked for this schema (#25) demanded.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable

from scaling.accounting.memory import GRAD_SYNCS, LOOP_GRADS, MODES
from scaling.common.errors import UserError

SEED_MAX = 2**63 - 1   # torch.manual_seed's int64: the one range of a seed (train config, plans)

# A name that becomes part of a folder name (tiers, runs): no separators, no leading dot, bounded.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")


def check_name(name: Any, what: str) -> str:
    """A tier or run name safe as one folder name component; UserError otherwise."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        shown = repr(name) if not isinstance(name, str) or len(name) <= 40 else repr(name[:40] + "...")
        raise UserError(f"{what} {shown} is not a valid name: 1-64 letters, digits, '.', '_', '+' or '-', "
                        "starting with a letter or digit")
    return name


def describe(hint: Any) -> str:
    """'an integer', 'a number or null', 'a list of numbers', ... for error messages."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        parts = [describe(a) for a in args if a is not type(None)]
        return " or ".join(parts) + (" (or absent)" if type(None) in args else "")
    if origin is tuple or origin is list:
        return f"a list of {describe(args[0]).removeprefix('an ').removeprefix('a ')}s"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(hint, str(hint))


def _matches(value: Any, hint: Any) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in args)
    if hint is type(None):
        return value is None
    if origin in (tuple, list):
        return isinstance(value, (list, tuple)) and all(_matches(v, args[0]) for v in value)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if hint is str:
        return isinstance(value, str)
    return isinstance(value, hint)


def check_value(key: str, value: Any, hint: Any) -> None:
    """UserError ``<key> must be <type>, got <value>`` unless ``value`` has the type ``hint``."""
    if not _matches(value, hint):
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise UserError(f"{key} must be {describe(hint)}, got {shown}")


def check_fields(obj: Any) -> None:
    """Type-check every field of a dataclass instance against its annotation."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        check_value(f.name, getattr(obj, f.name), hints[f.name])


# ----- plan tables ----------------------------------------------------------------------

def positive(v: float) -> bool:
    return v > 0


def non_negative(v: float) -> bool:
    return v >= 0


@dataclass(frozen=True)
class Key:
    """One key of a plan table: its type, an optional range rule (with its wording) and help."""

    hint: Any
    help: str
    rule: Callable[[Any], bool] | None = None
    rule_text: str = ""


def _pos_int(help: str) -> Key:
    return Key(int, help, positive, "a positive integer")


SWEEP = {
    "name": Key(str, "name of the sweep"),
    "description": Key(str, "free text"),
    "tiers": Key(list[str], "built-in tier names or [model.\"x\"] tables", bool, "a non-empty list"),
    "archs": Key(list[str], "architectures: baseline and/or smelt", bool, "a non-empty list"),
    "seeds": Key(list[int], "seeds, one run each", lambda v: bool(v) and min(v) >= 0 and max(v) <= SEED_MAX,
                 "a non-empty list of integers in [0, 2^63 - 1] (torch's int64 seed)"),
    "budgets": Key(list[float], "token budgets, one point each (ranges: checked by the plan reader)"),
    "runs_dir": Key(str, "folder of the run folders, relative to the working directory", bool,
                    "a non-empty path"),
}
EXECUTOR = {
    "kind": Key(str, "local, slurm or debug"),
    "concurrency": _pos_int("local: trainings at once; slurm: array parallelism"),
    "threads_per_job": _pos_int("torch CPU threads per training"),
    "cpus_per_job": _pos_int("slurm: CPUs per task"),
    "time_limit_min": _pos_int("time limit of a job in minutes"),
    "partition": Key(str, "slurm partition"),
    "mem_gb": Key(float, "slurm: memory per node in GB", positive, "> 0"),
    "mfu": Key(float, "assumed model FLOPs utilisation for GPU-hour estimates", lambda v: 0 < v <= 1,
               "in (0, 1]"),
    "gpu_peak_flops": Key(float, "dense peak FLOP/s of one GPU", positive, "> 0"),
}
PARALLEL = {
    "mode": Key(str, "none, ddp, fsdp or hsdp", lambda v: v in MODES,
                "one of none, ddp, fsdp, hsdp"),
    "gpus_per_node": _pos_int("GPUs (ranks) per node"),
    "nodes": _pos_int("nodes"),
    "replicate": _pos_int("hsdp: replicate degree"),
    "gpu_memory_gb": Key(float, "per-GPU memory in GB (1e9 bytes) the run must fit in", positive,
                         "a positive number of GB"),
    "grad_sync": Key(str, "every or last", lambda v: v in GRAD_SYNCS, "every or last"),
    "ep": _pos_int("expert-parallel degree (fsdp/hsdp; default 1)"),
    "loop_grad": Key(str, "per-pass or fsdp: when looped layers' gradients are reduce-scattered",
                     lambda v: v in LOOP_GRADS, "per-pass or fsdp"),
    # step-time model only (scaling/accounting/steptime.py), never passed to the trainer
    "nvlink_gb_s": Key(float, "step-time model: intra-node bus bandwidth per GPU per direction, GB/s "
                       "(default 450, H100/H200 SXM NVLink)", positive, "a positive number of GB/s"),
    "network_gb_s": Key(float, "step-time model: inter-node bandwidth per GPU, GB/s (default 50, "
                        "400 Gb/s InfiniBand NDR per GPU)", positive, "a positive number of GB/s"),
    "overlap": Key(float, "step-time model: fraction of compute time FSDP collectives can hide "
                   "behind (default 0.8)", lambda v: 0 <= v <= 1, "in [0, 1]"),
    "hbm_gb_s": Key(float, "step-time model: GPU memory bandwidth, GB/s (default 4800, H200; H100 "
                    "SXM 3350), for the optimizer step", positive, "a positive number of GB/s"),
}
DATA = {
    "path": Key(str, "folder made by `smelt-scale prepare-data` (absent: the built-in corpus)", bool,
                "a non-empty path"),
    "tokenizer": Key(str, "tokenizer.json the shards must have been made with", bool,
                     "a non-empty path"),
    "allow_repeat": Key(bool, "allow more passes over the training split than the limit"),
    "max_bytes": Key(int, "built-in corpus only: a small deterministic subset", positive, ">= 1"),
    "val_fraction": Key(float, "built-in corpus only: fraction of documents held out",
                        lambda v: 0 < v < 1, "in (0, 1)"),
    "codec_tables": Key(bool, "built-in corpus only: include the stdlib's character-map codec tables, as "
                        "runs before 2026-12-06 did (they put copies of validation text in training)"),
    "verify": Key(str, "shard check at start: cheap (size, mtime) or full (SHA-256 of every shard)",
                  lambda v: v in ("cheap", "full"), "cheap or full"),
}


def check_table(table: Any, schema: dict[str, Key], where: str, name: str) -> dict[str, Any]:
    """The plan table ``name`` (e.g. ``[train]``) checked against ``schema``: unknown keys, types and
    ranges, each a one-line UserError naming the key; a copy of the table."""
    if not isinstance(table, dict):
        raise UserError(f"{where}: {name} must be a table")
    unknown = sorted(set(table) - set(schema))
    if unknown:
        raise UserError(f"{where}: unknown {name} keys: {', '.join(unknown)}; "
                        f"valid keys: {', '.join(schema)}")
    for key, value in table.items():
        spec = schema[key]
        try:
            check_value(key, value, spec.hint)
        except UserError as exc:
            raise UserError(f"{where}: {name} {exc}") from None
        if spec.rule is not None and not spec.rule(value):
            raise UserError(f"{where}: {name} {key} must be {spec.rule_text}, got {value!r}")
    return dict(table)
