"""Sweep plans: a TOML file listing tiers, architectures, token budgets, seeds and data.

Format (see ``plans/cpu-proxy.toml``)::

    [sweep]
    name = "cpu-proxy"
    tiers = ["proxy-xs", "proxy-s"]        # names from scaling.accounting.tiers
    archs = ["baseline", "smelt"]
    seeds = [0]
    budgets = [2.5e5, 5e5, 1e6, 2e6]       # tokens; one WSD cooldown branch per budget
    runs_dir = "runs"                      # relative to the working directory

    [train]                                # TrainConfig fields shared by every run
    batch_size = 16
    lr = 3e-3

    [data]                                 # what every run trains on (scaling.training.data.loader)
    path = "~/data/fineweb-10B"            # shards from `smelt-scale prepare-data` (absent: the
    tokenizer = "tokenizer.json"           # built-in corpus); optional: the tokenizer they must
    allow_repeat = false                   # have; allow_repeat: permit > max_epochs passes
    # max_bytes, val_fraction, codec_tables  # built-in corpus only (DataSpec fields)

    [tier."proxy-l"]                       # per-tier overrides: budgets and any [train] key
    budgets = [1e6, 2e6]
    lr = 2e-3

    [tier."proxy-l".smelt]                 # per-tier, per-architecture [train] keys ("baseline"
    lr = 1.5e-3                            # or "smelt"), e.g. each architecture's own tuned lr

    [model."my-tier"]                      # a custom Baseline tier (ModelConfig keys); list it
    vocab_size = 4096                      # in [sweep] tiers; its SMELT twin is derived by the
    d_model = 80                           # matcher (width_multiple: 1 = exact integers)
    ...
    width_multiple = 1
    proxy = true

    [executor]                             # how `smelt-scale sweep` dispatches (submitit)
    kind = "local"                         # "local" | "slurm" | "debug"
    concurrency = 2
    threads_per_job = 1
    partition = "gpu"                      # slurm only
    time_limit_min = 1440
    mfu = 0.4                              # assumed model FLOPs utilisation for GPU-hour estimates
    gpu_peak_flops = 9.89e14               # per GPU (H100 SXM dense bf16)

    [parallel]                             # the layout of every run (scaling.accounting.memory),
                                           # also how it is launched: one task (rank) per GPU on
                                           # each of `nodes` nodes (local executor: gpus_per_node
                                           # processes, gloo on the CPU); mode and grad_sync go to
                                           # TrainConfig
    mode = "fsdp"                          # "none" | "ddp" | "fsdp" | "hsdp"
    gpus_per_node = 8
    nodes = 1
    replicate = 2                          # hsdp only: replicate degree (default: nodes)
    gpu_memory_gb = 141                    # per GPU, GB = 1e9 bytes; runs must fit under it
    grad_sync = "every"                    # "every" micro-batch or only the "last" (default:
                                           # "every" when sharded, "last" otherwise)
    ep = 8                                 # expert-parallel degree (fsdp/hsdp; default 1)
    loop_grad = "per-pass"                 # looped layers' gradients reduce-scattered after each
                                           # pass, or "fsdp" after the last (default: per-pass
                                           # when sharded)
    nvlink_gb_s = 450                      # step-time model only (scaling.accounting.steptime):
    network_gb_s = 50                      # per-GPU link bandwidths, GB/s, and the fraction of
    overlap = 0.8                          # compute FSDP traffic can hide behind (defaults shown);
    hbm_gb_s = 4800                        # GPU memory bandwidth for the optimizer step (H200)

    [tier."1.6B".parallel]                 # per-tier layout overrides
    nodes = 4

The micro-batch and activation checkpointing of the memory estimate are the run's [train]
``micro_batch_size`` and ``activation_checkpointing``; the compute dtype is bf16 unless [train]
``device = "cpu"`` (fp32).

One run = (tier, arch, seed); it trains a WSD trunk to the largest budget and branches a
cooldown at each smaller one, so each run yields one (N, D) point per budget.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaling.accounting.config import ModelConfig
from scaling.accounting.costs import costs
from scaling.accounting.matching import smelt_twin
from scaling.accounting.memory import Layout, resolve_mode
from scaling.accounting.steptime import Links
from scaling.accounting.tiers import ARCHS, TIERS, get_config, is_proxy
from scaling.common.errors import UserError
from scaling.common.files import read_config
from scaling.training import schema
from scaling.training.data.loader import check_data_table
from scaling.training.loop.branches import BranchPlan
from scaling.training.loop.config import (
    PARALLEL_TO_TRAIN,
    RUN_OPTIONS,
    TrainConfig,
    field_types,
    fields_of_tables,
)
from scaling.training.schema import check_name, check_table

EXECUTORS = ("local", "slurm", "debug")
TABLES = ("sweep", "train", "data", "parallel", "executor", "tier", "model")
# [parallel] keys read by the planner only, not part of the memory planner's Layout: the card's
# memory and the step-time model's links (the fields of ``Links``)
LINK_KEYS = tuple(f.name for f in dataclasses.fields(Links))
PLANNER_ONLY_KEYS = ("gpu_memory_gb", *LINK_KEYS)


@dataclass(frozen=True)
class PlannedRun:
    """One training run of a sweep: a tier, an architecture, a seed and its token budgets."""

    name: str
    tier: str
    arch: str
    seed: int
    budgets: tuple[int, ...]
    train: dict[str, Any]
    data: dict[str, Any]
    model: ModelConfig
    proxy: bool
    parallel: dict[str, Any] = field(default_factory=dict)

    @property
    def gpu_memory_gb(self) -> float | None:
        """The per-GPU memory the run must fit in (GB = 1e9 bytes), if the plan states one."""
        value = self.parallel.get("gpu_memory_gb")
        return None if value is None else float(value)

    def links(self) -> Links:
        """Link bandwidths and overlap of the step-time model: [parallel] values or the defaults."""
        return Links(**{k: float(self.parallel[k]) for k in LINK_KEYS if k in self.parallel})

    def layout(self) -> Layout:
        """The run's parallel layout for the memory planner: [parallel] + the [train] micro-batch.

        Every rank takes its own rows of the global batch (data parallel degree = world for
        DDP, FSDP and HSDP alike), so per-rank batch = batch_size / world and the
        accumulation steps = per-rank batch / micro_batch_size (TrainConfig's rule).
        """
        par = {k: v for k, v in self.parallel.items() if k not in PLANNER_ONLY_KEYS}
        cpu = str(self.train.get("device", "auto")) == "cpu"
        compile_ = self.train.get("compile")  # the trainer's default: compiled on CUDA
        compiled = (not cpu) if compile_ is None else bool(compile_)
        layout = Layout(**par, compute_dtype="fp32" if cpu else "bf16", compiled=compiled)  # checks values
        world = layout.world
        if resolve_mode(layout.mode, world) != layout.mode:
            # one GPU trains unwrapped whatever the plan asks (the trainer's rule): count that layout
            par = {k: v for k, v in par.items() if k not in ("mode", "grad_sync", "loop_grad", "replicate")}
            layout = Layout(**par, mode=resolve_mode(layout.mode, world),
                            compute_dtype="fp32" if cpu else "bf16", compiled=compiled)
        batch = int(self.train.get("batch_size", 16))
        if batch % world:
            raise UserError(f"run {self.name}: the {world} GPUs do not divide batch_size {batch}")
        per_rank = batch // world
        micro = self.train.get("micro_batch_size") or per_rank
        if per_rank % micro:
            raise UserError(f"run {self.name}: micro_batch_size {micro} does not divide the per-GPU "
                            f"batch {per_rank} (batch_size {batch} over {world} GPUs)")
        return dataclasses.replace(
            layout,
            micro_batch_size=int(micro),
            grad_accum_steps=per_rank // int(micro),
            activation_checkpointing=bool(self.train.get("activation_checkpointing", False)),
        )

    def train_config(self, threads: int | None = None):
        """The TrainConfig this run trains with: [train] + [tier] keys, [data], its seed and budgets,
        and the [parallel] mode (UserError for contradictions and for what TrainConfig refuses)."""
        given = {"tokens": self.budgets, "seed": self.seed}
        if threads is not None:
            given["threads"] = threads
        return TrainConfig.from_tables(self.train, self.data, self.parallel, f"run {self.name}", **given)

    def branches(self) -> BranchPlan:
        """The updates the trainer takes (``BranchPlan.build`` on this run's config, as ``train``)."""
        cfg = self.train_config()
        return BranchPlan.build(cfg.tokens, cfg.batch_size * self.model.seq_len, cfg.schedule,
                                cfg.decay_fraction)

    def tokens_trained(self) -> int:
        """Tokens the trainer reads: whole updates, the trunk to the largest budget plus one cooldown
        branch per smaller budget (S_n + sum K_i) x tokens per update; a budget off a whole update
        trains its rounded step count, not the tokens written in the plan."""
        plan = self.branches()
        return plan.total_steps * (plan.trunk.tokens // plan.trunk.steps)

    def flops(self) -> float:
        """Total training FLOPs of the run (branches included): FLOPs per token x tokens_trained."""
        return costs(self.model).flops_per_token * self.tokens_trained()


def read_train_file(path: Path | str) -> tuple[dict[str, Any], ...]:
    """``train --config FILE``: its checked [train], [data] and [parallel] tables (for
    :meth:`TrainConfig.from_tables`) and its train() options. A plan file may be given: its
    sweep-only tables ([sweep], [executor], [tier], [model]) are not read by ``train`` and [train]
    may also hold ``tokens`` and ``seed`` (a plan takes them from [sweep])."""
    path = Path(path)
    where = str(path)
    doc = read_toml(path, "config")
    unknown = sorted(set(doc) - set(TABLES))
    if unknown:
        raise UserError(f"{where}: unknown tables: {', '.join(unknown)}; `train --config` reads [train], "
                        "[data] and [parallel]")
    train = check_table(doc.get("train", {}), _train_schema(), where, "[train]")
    data = check_data_table(doc.get("data", {}), where)
    parallel = check_table(doc.get("parallel", {}), schema.PARALLEL, where, "[parallel]")
    fields_of_tables(train, data, parallel, where)  # contradictions between the tables, before any work
    options = {k: train[k] for k in RUN_OPTIONS if k in train}
    return train, data, parallel, options


@dataclass(frozen=True)
class SweepPlan:
    name: str
    path: Path | None
    runs_dir: Path
    runs: tuple[PlannedRun, ...]
    executor: dict[str, Any] = field(default_factory=dict)
    description: str = ""


def _as_budgets(values: Any, where: str) -> tuple[int, ...]:
    if not isinstance(values, list) or not values:
        raise UserError(f"{where}: budgets must be a non-empty list of token counts")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
            raise UserError(f"{where}: budget {v!r} is not a positive finite number of tokens")
        out.append(int(v))
    if len(set(out)) != len(out):
        raise UserError(f"{where}: budgets repeat")
    return tuple(sorted(out))


def run_name(tier: str, arch: str, seed: int) -> str:
    return f"{tier}-{arch}-s{seed}"


def _unique(values: list, what: str, where: str) -> None:
    seen = set()
    for v in values:
        if v in seen:
            raise UserError(f"{where}: [sweep] {what} lists {v!r} twice; each (tier, arch, seed) is one run "
                            "folder, which one training writes")
        seen.add(v)


def parse_plan(data: dict[str, Any], path: Path | None = None) -> SweepPlan:
    """Validate a plan dict (as read from TOML) into a SweepPlan; UserError on any problem.

    Everything a run would refuse when it starts is refused here (types and ranges through
    :mod:`scaling.training.schema` and the TrainConfig each run will use, the budget schedule,
    the layout), so ``sweep --dry-run`` and ``sweep`` refuse the same plans.
    """
    where = str(path) if path else "plan"
    if not isinstance(data.get("sweep"), dict):
        raise UserError(f"{where}: missing [sweep] table")
    unknown = sorted(set(data) - set(TABLES))
    if unknown:
        raise UserError(f"{where}: unknown tables: {', '.join(unknown)}; valid tables: {', '.join(TABLES)}")
    sweep = check_table(data["sweep"], schema.SWEEP, where, "[sweep]")
    if "tiers" not in sweep:
        raise UserError(f"{where}: [sweep] tiers must be a non-empty list")
    tiers = sweep["tiers"]
    models = data.get("model", {})
    if not isinstance(models, dict):
        raise UserError(f"{where}: [model] must hold one table per custom tier")
    custom = {}
    for name, spec in models.items():
        check_name(name, f"{where}: custom tier")
        if name in TIERS:
            raise UserError(f"{where}: [model.\"{name}\"] would shadow the built-in tier {name}; "
                            "give the custom tier another name")
        custom[name] = _custom_tier(name, spec, where)
    for t in tiers:
        check_name(t, f"{where}: tier")
        if t not in TIERS and t not in custom:
            raise UserError(f"{where}: unknown tier {t!r}; known tiers: {', '.join([*TIERS, *custom])}")
    archs = sweep.get("archs", list(ARCHS))
    for a in archs:
        if a not in ARCHS:
            raise UserError(f"{where}: unknown arch {a!r}; choose from {', '.join(ARCHS)}")
    seeds = sweep.get("seeds", [0])
    for what, values in (("tiers", tiers), ("archs", archs), ("seeds", seeds)):
        _unique(values, what, where)
    train = check_table(data.get("train", {}), _train_schema(), where, "[train]")
    for key, by in (("seed", "[sweep] seeds"), ("tokens", "[sweep] budgets")):
        if key in train:
            raise UserError(f"{where}: [train] {key} is set by {by}; remove it from [train]")
    _no_layout_keys(train, where, "[train]")
    data_spec = check_data_table(data.get("data", {}), where)
    per_tier = data.get("tier", {})
    if not isinstance(per_tier, dict) or not all(isinstance(v, dict) for v in per_tier.values()):
        raise UserError(f'{where}: [tier] must hold one table per tier, e.g. [tier."proxy-l"]')
    unknown_tiers = set(per_tier) - set(tiers)
    if unknown_tiers:
        raise UserError(f"{where}: [tier.*] overrides for tiers not in the sweep: "
                        f"{', '.join(sorted(unknown_tiers, key=str))}")
    executor = check_table(data.get("executor", {}), schema.EXECUTOR, where, "[executor]")
    _check_executor(executor, where)
    parallel = _parallel_table(data.get("parallel", {}), where, "[parallel]")
    runs_dir = Path(sweep.get("runs_dir", "runs"))  # relative paths are relative to the working dir
    runs = []
    for tier in tiers:
        override = dict(per_tier.get(tier, {}))
        budgets = _as_budgets(override.pop("budgets", sweep.get("budgets")), f"{where} [{tier}]")
        tier_parallel = {**parallel, **_parallel_table(override.pop("parallel", {}), where,
                                                       f'[tier."{tier}".parallel]')}
        by_arch = {a: override.pop(a) for a in ARCHS if a in override}
        override = check_table(override, _train_schema(), where, f'[tier."{tier}"]')
        for arch, table in by_arch.items():
            if not isinstance(table, dict):
                raise UserError(f'{where}: [tier."{tier}".{arch}] must be a table of [train] keys')
            if arch not in archs:
                raise UserError(f'{where}: [tier."{tier}".{arch}] overrides an architecture the sweep does '
                                f"not train ([sweep] archs: {', '.join(archs)})")
            _no_layout_keys(table, where, f'[tier."{tier}".{arch}]')  # before the types: a table is no mode
            by_arch[arch] = check_table(table, _train_schema(), where, f'[tier."{tier}".{arch}]')
        _no_layout_keys(override, where, f'[tier."{tier}"]')  # the per-arch tables: checked above
        for name, table in ((f'[tier."{tier}"]', override),
                            *((f'[tier."{tier}".{a}]', t) for a, t in by_arch.items())):
            for key in ("seed", "tokens"):
                if key in table:
                    raise UserError(f"{where}: {name} {key} is set by [sweep]; remove it")
        for arch in archs:
            if tier in custom:
                model, proxy = custom[tier][arch], custom[tier]["proxy"]
            else:
                model, proxy = get_config(tier, arch), is_proxy(tier)
            for seed in seeds:
                runs.append(
                    PlannedRun(
                        name=run_name(tier, arch, seed),
                        tier=tier,
                        arch=arch,
                        seed=seed,
                        budgets=budgets,
                        train={**train, **override, **by_arch.get(arch, {})},
                        data=data_spec,
                        model=model,
                        proxy=proxy,
                        parallel=tier_parallel,
                    )
                )
    for run in runs:  # what a run refuses when it starts is an error of the plan, found before any work
        try:
            cfg = run.train_config()  # types and ranges first: layout() divides by batch sizes
            run.layout()
            branches = run.branches()
            if cfg.warmup is not None:
                branches.check_warmup(cfg.warmup)
        except UserError as exc:
            raise UserError(f"{where} [{run.tier}] run {run.name}: {exc}") from None
    return SweepPlan(
        name=str(sweep.get("name", path.stem if path else "sweep")),
        path=path,
        runs_dir=runs_dir,
        runs=tuple(runs),
        executor=executor,
        description=str(sweep.get("description", "")),
    )


def _no_layout_keys(table: dict[str, Any], where: str, name: str) -> None:
    """A plan sets the parallel layout in [parallel] (or [tier."x".parallel]), where the memory planner
    reads it, never in a [train]-keyed table, whose value would train a layout the planner did not
    check."""
    for in_parallel, key in PARALLEL_TO_TRAIN.items():
        if key in table:
            raise UserError(f"{where}: {name} {key} is the parallel layout: set it as {in_parallel} in "
                            "[parallel] (or [tier.\"x\".parallel]), where the memory planner checks it")


@functools.cache
def _train_schema() -> dict[str, schema.Key]:
    """The [train] / [tier."x"] keys: TrainConfig's fields, typed by its annotations, + RUN_OPTIONS."""
    hints = field_types()
    by_name = {f.name: f for f in dataclasses.fields(TrainConfig)}
    out = {name: schema.Key(hints[name], by_name[name].metadata["help"])
           for name in TrainConfig.field_names()}
    out.update({k: schema.Key(t, "train() option") for k, t in RUN_OPTIONS.items()})
    return out


def _check_executor(executor: dict[str, Any], where: str) -> None:
    kind = executor.get("kind", "local")
    if kind not in EXECUTORS:
        raise UserError(f"{where}: [executor] kind must be one of {', '.join(EXECUTORS)}, got {kind!r}")


def _parallel_table(table: Any, where: str, name: str) -> dict[str, Any]:
    """A [parallel] table (or a tier's override of it), its keys and types checked; values by Layout."""
    return check_table(table, schema.PARALLEL, where, name)


def _custom_tier(name: str, spec: Any, where: str) -> dict[str, Any]:
    """A [model."name"] table: a Baseline ModelConfig plus matcher options -> both configs."""
    if not isinstance(spec, dict):
        raise UserError(f"{where}: [model.{name}] must be a table of ModelConfig keys")
    spec = dict(spec)
    proxy = spec.pop("proxy", True)
    if not isinstance(proxy, bool):
        raise UserError(f"{where}: [model.{name}] proxy must be true or false, got {proxy!r}")
    options = {k: spec.pop(k) for k in ("width_multiple", "width_ratio", "tolerance", "n_loops") if k in spec}
    base = ModelConfig.from_dict({**spec, "name": name})
    match = smelt_twin(base, **options)
    return {"baseline": match.baseline, "smelt": match.smelt, "proxy": proxy}


def read_toml(path: Path | str, what: str = "plan") -> dict[str, Any]:
    """A TOML file as a dict; UserError (one line) when missing or malformed."""
    return read_config(path, what, fmt="toml")


def load_plan(path: Path | str) -> SweepPlan:
    return parse_plan(read_toml(path), Path(path))
