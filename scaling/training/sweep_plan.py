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

    [data]                                 # what every run trains on (scaling.training.data)
    path = "~/data/fineweb-10B"            # shards from `smelt-scale prepare-data` (absent: the
    tokenizer = "tokenizer.json"           # built-in corpus); optional: the tokenizer they must
    allow_repeat = false                   # have; allow_repeat: permit > max_epochs passes
    # max_bytes, val_fraction              # built-in corpus only (DataSpec fields)

    [tier."proxy-l"]                       # per-tier overrides: budgets and any [train] key
    budgets = [1e6, 2e6]
    lr = 2e-3

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaling.accounting.config import ModelConfig
from scaling.accounting.costs import costs
from scaling.accounting.matching import smelt_twin
from scaling.accounting.memory import Layout
from scaling.accounting.tiers import ARCHS, TIERS, get_config, is_proxy
from scaling.common.errors import UserError
from scaling.common.files import read_config
from scaling.training.data import check_data_table

_SWEEP_KEYS = {"name", "tiers", "archs", "seeds", "budgets", "runs_dir", "description"}
EXECUTORS = ("local", "slurm", "debug")
_EXECUTOR_KEYS = {"kind", "concurrency", "threads_per_job", "partition",
                  "cpus_per_job", "time_limit_min", "mfu", "gpu_peak_flops", "mem_gb"}
_PARALLEL_KEYS = {"mode", "gpus_per_node", "nodes", "replicate", "gpu_memory_gb", "grad_sync"}


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

    def layout(self) -> Layout:
        """The run's parallel layout for the memory planner: [parallel] + the [train] micro-batch.

        Every rank takes its own rows of the global batch (data parallel degree = world for
        DDP, FSDP and HSDP alike), so per-rank batch = batch_size / world and the
        accumulation steps = per-rank batch / micro_batch_size (TrainConfig's rule).
        """
        par = {k: v for k, v in self.parallel.items() if k != "gpu_memory_gb"}
        cpu = str(self.train.get("device", "auto")) == "cpu"
        layout = Layout(**par, compute_dtype="fp32" if cpu else "bf16")  # checks the values
        world = layout.world
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

    def tokens_trained(self, decay_fraction: float) -> float:
        """Trunk to the largest budget plus one cooldown of decay_fraction*D_i per smaller budget."""
        return self.budgets[-1] + decay_fraction * sum(self.budgets[:-1])

    def flops(self, decay_fraction: float) -> float:
        """Total training FLOPs of the run (branches included)."""
        return costs(self.model).flops_per_token * self.tokens_trained(decay_fraction)


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
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise UserError(f"{where}: budget {v!r} is not a positive number of tokens")
        out.append(int(v))
    if len(set(out)) != len(out):
        raise UserError(f"{where}: budgets repeat")
    return tuple(sorted(out))


def run_name(tier: str, arch: str, seed: int) -> str:
    return f"{tier}-{arch}-s{seed}"


def parse_plan(data: dict[str, Any], path: Path | None = None) -> SweepPlan:
    """Validate a plan dict (as read from TOML) into a SweepPlan; UserError on any problem."""
    where = str(path) if path else "plan"
    sweep = data.get("sweep")
    if not isinstance(sweep, dict):
        raise UserError(f"{where}: missing [sweep] table")
    unknown = set(sweep) - _SWEEP_KEYS
    if unknown:
        raise UserError(f"{where}: unknown [sweep] keys: {', '.join(sorted(unknown))}")
    tiers = sweep.get("tiers")
    if not isinstance(tiers, list) or not tiers:
        raise UserError(f"{where}: [sweep] tiers must be a non-empty list")
    custom = {name: _custom_tier(name, spec, where) for name, spec in data.get("model", {}).items()}
    for t in tiers:
        if t not in TIERS and t not in custom:
            raise UserError(f"{where}: unknown tier {t!r}; known tiers: {', '.join([*TIERS, *custom])}")
    archs = sweep.get("archs", list(ARCHS))
    for a in archs:
        if a not in ARCHS:
            raise UserError(f"{where}: unknown arch {a!r}; choose from {', '.join(ARCHS)}")
    seeds = sweep.get("seeds", [0])
    if not isinstance(seeds, list) or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise UserError(f"{where}: seeds must be a list of integers")
    train = dict(data.get("train", {}))
    data_spec = check_data_table(data.get("data", {}), where)
    per_tier = data.get("tier", {})
    unknown_tiers = set(per_tier) - set(tiers)
    if unknown_tiers:
        raise UserError(f"{where}: [tier.*] overrides for tiers not in the sweep: "
                        f"{', '.join(sorted(unknown_tiers))}")
    executor = dict(data.get("executor", {}))
    unknown = set(executor) - _EXECUTOR_KEYS
    if unknown:
        raise UserError(f"{where}: unknown [executor] keys: {', '.join(sorted(unknown))}; valid keys: "
                        f"{', '.join(sorted(_EXECUTOR_KEYS))}")
    _check_executor(executor, where)
    parallel = _parallel_table(data.get("parallel", {}), f"{where} [parallel]")
    runs_dir = Path(sweep.get("runs_dir", "runs"))  # relative paths are relative to the working dir
    runs = []
    for tier in tiers:
        override = dict(per_tier.get(tier, {}))
        budgets = _as_budgets(override.pop("budgets", sweep.get("budgets")), f"{where} [{tier}]")
        tier_parallel = {**parallel, **_parallel_table(override.pop("parallel", {}),
                                                       f'{where} [tier."{tier}".parallel]')}
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
                        train={**train, **override},
                        data=data_spec,
                        model=model,
                        proxy=proxy,
                        parallel=tier_parallel,
                    )
                )
    for run in runs:  # a layout that cannot exist is an error of the plan, found before any work
        try:
            run.layout()
        except UserError as exc:
            raise UserError(f"{where} [{run.tier}]: {exc}") from None
    return SweepPlan(
        name=str(sweep.get("name", path.stem if path else "sweep")),
        path=path,
        runs_dir=runs_dir,
        runs=tuple(runs),
        executor=executor,
        description=str(sweep.get("description", "")),
    )


def _check_executor(executor: dict[str, Any], where: str) -> None:
    kind = executor.get("kind", "local")
    if kind not in EXECUTORS:
        raise UserError(f"{where}: [executor] kind must be one of {', '.join(EXECUTORS)}, got {kind!r}")
    for key in ("concurrency", "threads_per_job", "cpus_per_job", "time_limit_min"):
        v = executor.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise UserError(f"{where}: [executor] {key} must be a positive integer, got {v!r}")


def _parallel_table(table: Any, where: str) -> dict[str, Any]:
    """A [parallel] table (or a tier's override of it), its keys checked; values checked by Layout."""
    if not isinstance(table, dict):
        raise UserError(f"{where} must be a table")
    unknown = set(table) - _PARALLEL_KEYS
    if unknown:
        raise UserError(f"{where}: unknown keys {', '.join(sorted(unknown))}; valid keys: "
                        f"{', '.join(sorted(_PARALLEL_KEYS))}")
    gb = table.get("gpu_memory_gb")
    if gb is not None and (isinstance(gb, bool) or not isinstance(gb, (int, float)) or not gb > 0):
        raise UserError(f"{where}: gpu_memory_gb must be a positive number of GB, got {gb!r}")
    return dict(table)


def _custom_tier(name: str, spec: Any, where: str) -> dict[str, Any]:
    """A [model."name"] table: a Baseline ModelConfig plus matcher options -> both configs."""
    if not isinstance(spec, dict):
        raise UserError(f"{where}: [model.{name}] must be a table of ModelConfig keys")
    spec = dict(spec)
    proxy = bool(spec.pop("proxy", True))
    options = {k: spec.pop(k) for k in ("width_multiple", "width_ratio", "tolerance", "n_loops") if k in spec}
    base = ModelConfig.from_dict({**spec, "name": name})
    match = smelt_twin(base, **options)
    return {"baseline": match.baseline, "smelt": match.smelt, "proxy": proxy}


def read_toml(path: Path | str, what: str = "plan") -> dict[str, Any]:
    """A TOML file as a dict; UserError (one line) when missing or malformed."""
    return read_config(path, what, fmt="toml")


def load_plan(path: Path | str) -> SweepPlan:
    return parse_plan(read_toml(path), Path(path))
