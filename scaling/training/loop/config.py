"""The settings of one training run: four small configs, each field with its type, default, help
and range rule, and :class:`TrainConfig`, their union with the token budgets (torchtitan keeps
its job config in parts the same way).

* :class:`OptimConfig`: what is optimised how (batch, learning rate and schedule, AdamW, clipping,
  auxiliary losses, seed);
* :class:`LogConfig`: what the run writes down and when (validation, checkpoints, metrics, MFU);
* :class:`DataConfig`: the token shards or the built-in corpus;
* :class:`ParallelConfig`: device, threads and the data/expert-parallel layout.

``TrainConfig`` is flat (``cfg.lr``, ``TrainConfig(tokens=..., lr=...)``): its fields are the parts'
fields, so a run's ``config.json`` ``"train"`` table, a plan's ``[train]`` keys and the resume
check name each setting once, as they always have; :meth:`TrainConfig.part` gives one part.

Every way of making a TrainConfig goes through :meth:`TrainConfig.from_tables`: the ``[train]``,
``[data]`` and ``[parallel]`` tables of a sweep plan or of ``train --config``, plus the values
given on the command line. ``smelt-scale train`` builds its options from the fields whose
metadata says ``option`` (help text included): :func:`option_fields`.

This module imports no torch (``train --help`` reads it); the parallel modes and gradient-sync
rules are read from their torch modules when a config is checked.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

from scaling.accounting.config import HEAD_PADDING
from scaling.accounting.memory import GRAD_SYNCS, LOOP_GRADS, MODES
from scaling.common.device import DEVICE_HELP, THREADS_RULE, valid_device, valid_threads
from scaling.common.errors import UserError
from scaling.training.data.corpus import DataSpec
from scaling.training.data.loader import DATA_TO_TRAIN, expand_path
from scaling.training.loop.branches import SCHEDULES
from scaling.training.loop.metrics import check_log_to, resolve_peak_flops
from scaling.training.schema import SEED_MAX, check_fields, check_value


def setting(default: Any, help: str, rule: Callable[[Any], bool] | None = None, rule_text: str = "", *,
            option: bool = True) -> Any:
    """A config field: its default, its help, a range rule (checked unless the value is None) with
    its wording, and whether ``smelt-scale train`` has an option for it."""
    return field(default=default, metadata={"help": help, "rule": rule, "rule_text": rule_text,
                                            "option": option})


def _at_least(n: int) -> Callable[[Any], bool]:
    return lambda v: v >= n


class _Part:
    """A config part: types (annotations) and range rules (field metadata) checked on construction."""

    def __post_init__(self) -> None:
        check_fields(self)
        _check_rules(self)
        self._relations()

    def _relations(self) -> None:
        """Rules between fields of the part (after each field's own)."""


def _check_rules(obj: Any) -> None:
    for f in dataclasses.fields(obj):
        rule, value = f.metadata.get("rule"), getattr(obj, f.name)
        if rule is not None and value is not None and not rule(value):
            raise UserError(f"{f.name} must be {f.metadata['rule_text']}, got {value!r}")


@dataclass(frozen=True)
class OptimConfig(_Part):
    """What is optimised how. Objective ``CE + aux_coef * load_balance + z_coef * router_z``
    (Switch Transformer's alpha = 0.01, ST-MoE's z-loss 1e-3); AdamW (Loshchilov & Hutter 2019)."""

    batch_size: int = setting(16, "Global batch in sequences of seq_len tokens.", _at_least(1), ">= 1")
    micro_batch_size: int | None = setting(
        None, "Sequences per forward on one rank (gradient accumulation) [default: whole batch].",
        _at_least(1), ">= 1")
    # AdamW moves each weight by about lr per update: above 100 no run trains, and far above it the
    # fp32 optimizer arithmetic overflows; such a value is a typo
    lr: float = setting(3e-3, "Peak learning rate.", lambda v: 0 < v <= 100, "in (0, 100]")
    warmup: int | None = setting(
        None, "Warmup steps [default: 10% of the smallest budget's steps, at most 1000].",
        _at_least(0), ">= 0")
    schedule: str = setting("wsd", "wsd (branches a cooldown at every budget) or cosine (one budget).",
                            lambda v: v in SCHEDULES, "wsd or cosine")
    decay_fraction: float = setting(0.2, "WSD cooldown length as a fraction of each budget.",
                                    lambda v: 0 < v <= 1, "in (0, 1]")
    min_lr_ratio: float = setting(0.1, "Cosine schedule: the final learning rate as a fraction of lr.",
                                  lambda v: 0 <= v <= 1, "in [0, 1]", option=False)
    weight_decay: float = setting(0.1, "AdamW decoupled weight decay (matrices only).", _at_least(0), ">= 0")
    beta1: float = setting(0.9, "AdamW beta1.", lambda v: 0 <= v < 1, "in [0, 1)", option=False)
    beta2: float = setting(0.95, "AdamW beta2.", lambda v: 0 <= v < 1, "in [0, 1)", option=False)
    eps: float = setting(1e-8, "AdamW epsilon.", lambda v: v > 0, "> 0", option=False)
    grad_clip: float = setting(1.0, "Global gradient-norm clip (0: off).", _at_least(0), ">= 0 (0: off)")
    aux_coef: float = setting(0.01, "Coefficient of the load-balance loss.", _at_least(0), ">= 0",
                              option=False)
    z_coef: float = setting(1e-3, "Coefficient of the router z-loss.", _at_least(0), ">= 0", option=False)
    # torch.manual_seed takes a signed 64-bit integer: a larger seed failed after the run folder was
    # written (2026-12-07 review)
    seed: int = setting(0, "Seed of the initial weights and of the batch order.",
                        lambda v: 0 <= v <= SEED_MAX, "in [0, 2^63 - 1]")


@dataclass(frozen=True)
class LogConfig(_Part):
    """What the run writes down and when: validation, checkpoints, metrics lines and their mirrors."""

    eval_every: int = setting(250, "Validate every this many trunk steps (0: only at budget ends).",
                              _at_least(0), ">= 0")
    val_windows: int | None = setting(None, "Validation windows [default: the whole split].", _at_least(1),
                                      ">= 1 (or absent: the whole split)")
    val_by_source: bool = setting(False, "Also log val_loss/<source> per data source.")
    eval_batch_size: int = setting(32, "Validation windows per forward pass.", _at_least(1), ">= 1",
                                   option=False)
    ckpt_every: int = setting(100, "Checkpoint every this many updates.", _at_least(1), ">= 1")
    async_ckpt: bool = setting(False, "Write periodic checkpoints in the background.")
    log_every: int = setting(1, "Metrics line every this many updates.", _at_least(1), ">= 1")
    log_to: tuple[str, ...] = setting(
        ("jsonl",), "Comma-separated: jsonl plus tensorboard and/or wandb mirrors (extra [track]).")
    peak_flops: float | str | None = setting(
        None, "Peak FLOP/s of one device for MFU: a number or h100-sxm-bf16, h200-bf16, a100-bf16.")
    mfu: bool = setting(False, "Require MFU in the log (needs --peak-flops).")

    def _relations(self) -> None:
        check_log_to(self.log_to)
        resolve_peak_flops(self.peak_flops)
        if self.mfu and self.peak_flops is None:
            raise UserError("MFU needs peak_flops: the dense peak FLOP/s of one device or a preset "
                            "(h100-sxm-bf16, h200-bf16, a100-bf16)")


@dataclass(frozen=True)
class DataConfig(_Part):
    """The token shards of ``smelt-scale prepare-data``, or the built-in corpus (``DataSpec``)."""

    data: str | None = setting(
        None, "Token-shard folder made by `smelt-scale prepare-data` [default: the built-in corpus].")
    data_tokenizer: str | None = setting(
        None, "Refuse --data unless its shards were made with this tokenizer.json.")
    data_max_bytes: int | None = setting(
        None, "Use a small deterministic subset of the built-in corpus (tests).", _at_least(1), ">= 1")
    data_val_fraction: float = setting(0.025, "Built-in corpus: fraction of documents held out.",
                                       lambda v: 0 < v < 1, "in (0, 1)", option=False)
    data_codec_tables: bool = setting(
        False, "Built-in corpus: include the standard library's character-map codec tables, as every "
        "run before 2026-12-06 did (they put copies of validation text in training; DataSpec.codec_tables).",
        option=False)
    data_verify: str = setting(
        "cheap", "Shard check at start: cheap (hash only shards whose size or mtime changed since their "
        "last check) or full (hash every shard: catches bit rot that keeps the mtime).",
        lambda v: v in ("cheap", "full"), "cheap or full")

    def data_spec(self, vocab_size: int, codec_tables: bool | None = None) -> DataSpec:
        """The built-in corpus of this run (``codec_tables``: what a resumed run recorded, over
        ``data_codec_tables``)."""
        return DataSpec(vocab_size=vocab_size, max_bytes=self.data_max_bytes,
                        val_fraction=self.data_val_fraction,
                        codec_tables=self.data_codec_tables if codec_tables is None else codec_tables)


@dataclass(frozen=True)
class ParallelConfig(_Part):
    """Where the run trains: device, CPU threads and the data/expert-parallel layout
    (:mod:`scaling.training.parallel.data_parallel`)."""

    device: str = setting("auto", f"{DEVICE_HELP}.", valid_device, DEVICE_HELP)
    threads: int | None = setting(None, "torch CPU threads [default: torch's].", valid_threads, THREADS_RULE)
    parallel: str = setting("none", "none (DDP under torchrun), ddp, fsdp or hsdp.",
                            lambda v: v in MODES, "none, ddp, fsdp or hsdp")
    activation_checkpointing: bool = setting(False, "Recompute each layer pass in the backward.")
    # on CUDA the first step then takes ~1-2 minutes of compilation per architecture
    compile: bool | None = setting(None,
                                   "torch.compile the model's blocks [default: on CUDA, off on the CPU].")
    grad_sync: str | None = setting(
        None, "Reduce gradients on the last micro-batch only (last) or after each (every: FSDP keeps them "
        "sharded) [default: every under fsdp/hsdp, else last].", lambda v: v in GRAD_SYNCS, "last or every")
    replicate: int | None = setting(None, "HSDP replicate degree [default: the number of nodes].")
    ep: int = setting(
        1, "Expert-parallel degree (fsdp/hsdp): each rank holds 1/ep of the experts, tokens reach them by "
        "all-to-all; must divide the ranks [default: 1, no expert parallelism].", _at_least(1),
        "a positive integer")
    loop_grad: str | None = setting(
        None, "Looped layers' gradients under fsdp/hsdp: per-pass (reduce-scattered after each pass) or "
        "fsdp (FSDP2's own, after the last pass) [default: per-pass for a looped model].",
        lambda v: v in LOOP_GRADS, "per-pass or fsdp")
    head_padding: str = setting(
        "auto", "SDPA's head size: zero-padded to a multiple of 8 on CUDA (auto: lets cuDNN's attention "
        "kernel take the SMELT twins' odd sizes; the same function), never, or always.",
        lambda v: v in HEAD_PADDING, "auto, never or always")

    def _relations(self) -> None:
        if self.replicate is not None and (self.parallel != "hsdp" or self.replicate < 1):
            raise UserError(f"replicate must be a positive HSDP replicate degree, got {self.replicate!r} "
                            f"with parallel {self.parallel!r}")
        if self.ep > 1 and self.parallel not in ("fsdp", "hsdp"):
            raise UserError(f"expert parallelism (ep = {self.ep}) needs parallel fsdp or hsdp, "
                            f"got {self.parallel!r}")


PARTS = (OptimConfig, LogConfig, DataConfig, ParallelConfig)


@dataclass(frozen=True)
class TrainConfig(ParallelConfig, DataConfig, LogConfig, OptimConfig):
    """Hyperparameters and resources of one training run: the token budgets D (one point each,
    rounded to whole steps of batch_size * seq_len tokens) and the fields of the four parts."""

    tokens: tuple[float, ...] = field(kw_only=True, metadata={"help": "Token budgets D, one point each.",
                                                              "option": False})

    def __post_init__(self) -> None:
        # types first (the schema shared with plans and `train --config`), then ranges
        check_value("tokens", self.tokens, tuple[float, ...])
        check_value("log_to", self.log_to, tuple[str, ...])
        tokens = tuple(float(t) for t in self.tokens)
        if not tokens or not all(0 < t < float("inf") for t in tokens):
            raise UserError(f"token budgets must be positive finite numbers, got {list(self.tokens)}")
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "log_to", tuple(self.log_to))
        check_fields(self)
        _check_rules(self)
        ParallelConfig._relations(self)
        LogConfig._relations(self)

    @staticmethod
    def field_names() -> list[str]:
        """The fields in the order a run's config.json lists them: tokens, then each part's."""
        return ["tokens", *(f.name for part in PARTS for f in dataclasses.fields(part))]

    def part(self, cls: type) -> Any:
        """One part of this config (an ``OptimConfig``, ...)."""
        return cls(**{f.name: getattr(self, f.name) for f in dataclasses.fields(cls)})

    @classmethod
    def from_parts(cls, tokens: tuple[float, ...], *parts: Any) -> "TrainConfig":
        return cls(tokens=tokens, **{k: v for p in parts for k, v in dataclasses.asdict(p).items()})

    def to_dict(self) -> dict:
        """The config as config.json records it. ``data_codec_tables`` only when true: a run recorded
        before the field existed has no such key and is the same configuration as one with it false
        (its corpus is told apart by ``data_spec``, :meth:`DataSpec.to_dict`)."""
        d = dataclasses.asdict(self)
        d["tokens"], d["log_to"] = list(self.tokens), list(self.log_to)
        return {k: d[k] for k in self.field_names() if k != "data_codec_tables" or self.data_codec_tables}

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    @classmethod
    def from_tables(cls, train: dict[str, Any], data: dict[str, Any], parallel: dict[str, Any], what: str,
                    /, **given: Any) -> "TrainConfig":
        """The one constructor of a run's config: checked [train], [data] and [parallel] tables
        (:func:`fields_of_tables`), then ``given`` (command-line values: fields, ``data`` and
        ``parallel`` among them, hence the positional-only tables) over them."""
        return cls(**{**fields_of_tables(train, data, parallel, what), **given})


def option_fields() -> list[dataclasses.Field]:
    """The fields ``smelt-scale train`` has an option for, in config.json order, each with its help."""
    by_name = {f.name: f for f in dataclasses.fields(TrainConfig)}
    return [by_name[n] for n in TrainConfig.field_names() if by_name[n].metadata.get("option", True)]


def field_types() -> dict[str, Any]:
    """Field name -> its annotation (the types a plan's [train] table is checked against)."""
    return typing.get_type_hints(TrainConfig)


# [train] keys that are options of train() (what the run keeps, not its maths), not TrainConfig fields
RUN_OPTIONS = {"save_final_weights": bool, "save_budget_weights": bool}


# [parallel] keys that are TrainConfig fields, and their field names: the run's parallel layout
PARALLEL_TO_TRAIN = {"mode": "parallel", "grad_sync": "grad_sync", "replicate": "replicate", "ep": "ep",
                     "loop_grad": "loop_grad"}


def fields_of_tables(train: dict[str, Any], data: dict[str, Any], parallel: dict[str, Any],
                     what: str) -> dict[str, Any]:
    """TrainConfig fields from checked [train], [data] and [parallel] tables, the one rule shared by
    plans and ``train --config``: [data] keys map to their ``data_*`` fields, [parallel] mode /
    grad_sync / replicate / ep / loop_grad to the fields of those names (mode: ``parallel``); a key set in
    two tables is an error (UserError naming ``what``); :data:`RUN_OPTIONS` are left out."""
    fields = {k: v for k, v in train.items() if k not in RUN_OPTIONS}
    unknown = set(fields) - {f.name for f in dataclasses.fields(TrainConfig)}
    if unknown:
        raise UserError(f"{what}: unknown [train] keys: {', '.join(sorted(unknown))}")
    for key, name in DATA_TO_TRAIN.items():
        if key in data:
            if name in fields:
                raise UserError(f"{what}: {name} is set in [train] and as {key} in [data]; keep one")
            value = data[key]
            fields[name] = str(expand_path(value)) if key in ("path", "tokenizer") else value
    # the [parallel] layout that the memory planner checked is the one trained
    for key, name in PARALLEL_TO_TRAIN.items():
        if key in parallel:
            if name in fields and fields[name] != parallel[key]:
                raise UserError(f"{what}: [train] {name} = {fields[name]!r} contradicts "
                                f"[parallel] {key} = {parallel[key]!r}; set it in [parallel] only")
            fields[name] = parallel[key]
    return fields
