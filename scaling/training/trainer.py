"""The trainer: AdamW, WSD with cooldown branches at several token budgets, resume, DDP.

One run trains one model on the corpus of :mod:`scaling.training.corpus` and yields one (N, D, loss)
point per token budget. With the WSD schedule the stable *trunk* runs to the largest budget
``S_n`` (steps); for each smaller budget ``S_i`` a cooldown *branch* starts from the trunk
state at step ``P_i = S_i - K_i`` (``K_i = round(decay_fraction * S_i)``), decays the learning
rate linearly to ~0 at ``S_i``, is evaluated, and the trunk resumes from the saved state.
Because a batch is a pure function of (seed, step), every branch is exactly the run a
standalone WSD job with budget ``S_i`` would have made (tests/test_train.py checks this),
at a total cost of ``S_n + sum_{i<n} K_i`` steps (Hägele et al. 2024 show such cooldowns
match cosine runs of the same length).

Objective: ``CE + aux_coef * load_balance + z_coef * router_z`` (defaults 0.01 and 1e-3, as
Switch Transformer's alpha = 0.01 and ST-MoE's z-loss coefficient 1e-3). AdamW (decoupled
weight decay, Loshchilov & Hutter 2019) on every matrix except the token embedding; norm gains
(1-D) are not decayed either (decay would pull them towards 0, not towards the identity 1).
Gradients are clipped to a global norm. fp32 on CPU (bitwise reproducible for a fixed thread
count), bf16 autocast with fp32 master weights on CUDA.

Logs go to ``runs/<name>/`` (see :mod:`scaling.training.runlog`): ``config.json``, ``metrics.jsonl``
(one line per logged update, keyed by ``iter``, the run's update counter, which is monotone
across trunk and branches) and ``final.json``. Checkpoints (``latest.pt`` every ``ckpt_every``
updates and at every budget end, plus ``branch_point_<i>.pt`` with the trunk state each branch
returns to) go to ``$SMELT_CACHE/checkpoints/<name>/`` unless ``ckpt_dir`` is given. Resuming
restores model, optimizer and position from ``latest.pt`` and drops metric lines past it, so a
run killed at any moment and resumed logs exactly what an uninterrupted run logs.

Data parallel: under ``torchrun`` (``WORLD_SIZE`` > 1) the model is wrapped in DDP (gloo on
CPU, nccl on CUDA); rank r takes rows [r*B/W, (r+1)*B/W) of each global batch, so the
result equals a single process with ``micro_batch_size`` = B/W and W accumulation steps.
Only rank 0 writes files; the checkpoint folder must be visible to every rank.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scaling.accounting.config import ModelConfig
from scaling.accounting.costs import costs as accounting
from scaling.common.errors import UserError
from scaling.training import runlog
from scaling.training.corpus import DataSpec, cache_root
from scaling.training.data import open_data
from scaling.training.schedule import TokenBudget, lr_at, plan_budgets, total_steps

CKPT_FORMAT = 1
# Fault injection for tests/test_resume.py: SIGKILL the process right after the metrics line
# of this update is written and before its checkpoint (the most adversarial moment).
_KILL_ENV = "SMELT_FAULT_KILL_AT_ITER"


@dataclass(frozen=True)
class TrainConfig:
    """Hyperparameters and resources of one training run.

    tokens            token budgets D (one point each); rounded to whole steps of
                      batch_size * seq_len tokens
    batch_size        global batch in sequences (all ranks, all accumulation steps)
    micro_batch_size  sequences per forward/backward on one rank (None: batch_size / world)
    lr                peak learning rate; warmup: linear warmup steps (None: auto =
                      min(1000, max(1, round(0.1 * S_min))), S_min = steps of the smallest budget)
    schedule          "wsd" (several budgets per run) or "cosine" (one budget, to min_lr_ratio*lr)
    decay_fraction    WSD cooldown length as a fraction of each budget
    eval_every        periodic validation every this many trunk steps (0: only at budget ends)
    val_windows       validation windows of seq_len tokens (None: the whole split)
    ckpt_every        checkpoint every this many updates (budget ends always checkpoint)
    log_every         metrics line every this many updates (evaluations are always logged)
    data              folder of token shards (``smelt-scale prepare-data``); None: built-in corpus
    data_tokenizer    tokenizer.json the shards must have been made with (None: not checked)
    data_max_bytes    None: full corpus; else the DataSpec test subset (built-in corpus only)
    device            "auto" (cuda if available), "cpu", "cuda", "cuda:1", ...
    threads           torch intra-op threads on CPU (None: torch default)
    """

    tokens: tuple[float, ...]
    batch_size: int = 16
    micro_batch_size: int | None = None
    lr: float = 3e-3
    warmup: int | None = None
    schedule: str = "wsd"
    decay_fraction: float = 0.2
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    aux_coef: float = 0.01
    z_coef: float = 1e-3
    seed: int = 0
    eval_every: int = 250
    val_windows: int | None = None
    eval_batch_size: int = 32
    ckpt_every: int = 100
    log_every: int = 1
    data: str | None = None
    data_tokenizer: str | None = None
    data_max_bytes: int | None = None
    data_val_fraction: float = 0.025
    device: str = "auto"
    threads: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", tuple(float(t) for t in self.tokens))
        for name in ("batch_size", "eval_batch_size", "ckpt_every", "log_every"):
            if getattr(self, name) < 1:
                raise UserError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise UserError(f"micro_batch_size must be >= 1, got {self.micro_batch_size}")
        if not self.lr > 0:
            raise UserError(f"lr must be > 0, got {self.lr}")
        if self.warmup is not None and self.warmup < 0:
            raise UserError(f"warmup must be >= 0, got {self.warmup}")
        if self.eval_every < 0:
            raise UserError(f"eval_every must be >= 0, got {self.eval_every}")
        if self.threads is not None and self.threads < 1:
            raise UserError(f"threads must be >= 1, got {self.threads}")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["tokens"] = list(self.tokens)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    def data_spec(self, vocab_size: int) -> DataSpec:
        return DataSpec(vocab_size=vocab_size, max_bytes=self.data_max_bytes,
                        val_fraction=self.data_val_fraction)


# Fields that may differ between a run and its resumption (they do not change the maths,
# except threads/device which change float rounding; a warning is printed for those).
_RESUME_FREE = {"ckpt_every", "log_every", "eval_batch_size", "device", "threads"}


def default_warmup(budgets: list[TokenBudget]) -> int:
    return min(1000, max(1, round(0.1 * budgets[0].steps)))


def format_tokens(n: float) -> str:
    """2e5 -> '200k', 1.5e6 -> '1.5M', 2e9 -> '2B'."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.4g}{unit}"
    return f"{n:.4g}"


def default_run_name(tier: str, arch: str, cfg: TrainConfig) -> str:
    return f"{tier}-{arch}-{format_tokens(max(cfg.tokens))}-s{cfg.seed}"


# ----- distributed ------------------------------------------------------------------------

@dataclass
class _Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    initialized_here: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()


def _setup_dist(device_pref: str) -> tuple[_Dist, torch.device]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device_pref == "auto":
        device = torch.device(f"cuda:{local}" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(device_pref)
        if device.type == "cuda" and device.index is None:
            device = torch.device(f"cuda:{local}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"device {device_pref!r} requested but CUDA is not available")
        torch.cuda.set_device(device)
    info = _Dist(rank, world, local)
    if world > 1 and not torch.distributed.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        torch.distributed.init_process_group(backend=backend)
        info.initialized_here = True
    return info, device


def _all_reduce_mean(t: torch.Tensor, dist: _Dist) -> torch.Tensor:
    if dist.world > 1:
        torch.distributed.all_reduce(t)
        t = t / dist.world
    return t


# ----- pieces -----------------------------------------------------------------------------

def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: decay every matrix except the token embedding; never decay 1-D gains."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim < 2 or name.startswith("embed.") else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@torch.no_grad()
def evaluate(model: torch.nn.Module, windows: tuple[np.ndarray, np.ndarray], batch_size: int,
             device: torch.device, dist: _Dist | None = None) -> float:
    """Mean cross-entropy (nats/token) over the validation windows (all of equal length).

    Ranks share the windows round-robin and all-reduce the sum; every rank gets the result.
    """
    dist = dist or _Dist()
    x_all, y_all = windows
    mine = np.arange(dist.rank, len(x_all), dist.world)
    was_training = model.training
    model.eval()
    total = torch.zeros(2, dtype=torch.float64, device=device)
    for i in range(0, len(mine), batch_size):
        idx = mine[i:i + batch_size]
        x = torch.from_numpy(x_all[idx]).to(device)
        y = torch.from_numpy(y_all[idx]).to(device)
        with _autocast(device):
            out = model(x, y)
        total[0] += out.loss.double() * len(idx)
        total[1] += len(idx)
    if dist.world > 1:
        torch.distributed.all_reduce(total)
    model.train(was_training)
    return float(total[0] / total[1])


def _autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


class _Progress:
    """Rich progress bar on stderr (tokens, tokens/s, loss, ETA), or nothing."""

    def __init__(self, enabled: bool, total_tokens: int, done_tokens: int, name: str):
        self.bar = None
        if not enabled:
            return
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        from scaling.cli._util import stderr

        self.bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=16),
            TextColumn(
                "{task.percentage:>3.0f}% {task.fields[tps]} tok/s loss {task.fields[loss]}"
                " val {task.fields[val]}"
            ),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=stderr,
            transient=False,
        )
        self.task = self.bar.add_task(
            name, total=total_tokens, completed=done_tokens, tps="-", loss="-", val="-"
        )
        self.bar.start()

    def update(self, tokens: int, **fields: Any) -> None:
        if self.bar is not None:
            self.bar.update(self.task, advance=tokens, **fields)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


# ----- the run ----------------------------------------------------------------------------


def _point(
    run: str,
    tier: str,
    proxy: bool,
    model_cfg: ModelConfig,
    b: TokenBudget,
    val_loss: float,
    val_bpb: float,
    train_loss: float,
    seed: int,
    wall_s: float,
) -> dict:
    acc = accounting(model_cfg)
    return {
        "run": run,
        "arch": model_cfg.arch,
        "tier": tier,
        "proxy": proxy,
        "N": acc.active_params,
        "D": b.tokens,
        "loss": val_loss,
        "val_bpb": val_bpb,
        "flops": acc.flops_per_token * b.tokens,
        "flops_per_token": acc.flops_per_token,
        "sparsity": acc.sparsity,
        "non_embedding_params": acc.non_embedding_params,
        "total_params": acc.total_params,
        "seed": seed,
        "budget_index": b.index,
        "steps": b.steps,
        "requested_tokens": b.requested_tokens,
        "train_loss": train_loss,
        "wall_s": wall_s,
    }


def _config_diff(old: dict, new: dict) -> list[str]:
    diffs = []
    for section in ("model", "train", "budgets", "data_spec", "data_identity"):
        if section == "data_identity" and section not in old:  # runs made before it was recorded
            continue
        a, b = old.get(section), new.get(section)
        if section == "train":
            a = {k: v for k, v in (a or {}).items() if k not in _RESUME_FREE}
            b = {k: v for k, v in (b or {}).items() if k not in _RESUME_FREE}
        if a != b:
            if isinstance(a, dict) and isinstance(b, dict):
                diffs += [f"{section}.{k}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
            else:
                diffs.append(section)
    return diffs


def train(
    model_cfg: ModelConfig,
    train_cfg: TrainConfig,
    *,
    tier: str = "custom",
    proxy: bool | None = None,
    run_name: str | None = None,
    runs_dir: str | Path = "runs",
    ckpt_dir: str | Path | None = None,
    resume: bool = False,
    overwrite: bool = False,
    save_final_weights: bool = False,
    progress: bool = False,
    data_cache: str | Path | None = None,
) -> dict:
    """Train one model; returns the final.json document (plus ``run_dir`` and ``ckpt_dir``).

    Resumable: with ``resume=True`` an existing run continues from its last checkpoint (a
    complete run returns its final.json at once). Raises UserError for bad input (an existing
    run without resume/overwrite, a budget below one step, an unwritable folder, ...).
    """
    dist, device = _setup_dist(train_cfg.device)
    try:
        return _train(
            model_cfg,
            train_cfg,
            dist,
            device,
            tier=tier,
            proxy=proxy,
            run_name=run_name,
            runs_dir=Path(runs_dir),
            ckpt_dir=ckpt_dir,
            resume=resume,
            overwrite=overwrite,
            save_final_weights=save_final_weights,
            progress=progress,
            data_cache=data_cache,
        )
    finally:
        if dist.initialized_here:
            torch.distributed.destroy_process_group()


def _train(
    model_cfg,
    cfg: TrainConfig,
    dist: _Dist,
    device: torch.device,
    *,
    tier,
    proxy,
    run_name,
    runs_dir: Path,
    ckpt_dir,
    resume,
    overwrite,
    save_final_weights,
    progress,
    data_cache,
) -> dict:
    from scaling.training.model import MoETransformer

    proxy = tier.startswith("proxy") if proxy is None else proxy
    T = model_cfg.seq_len
    tokens_per_step = cfg.batch_size * T
    budgets = plan_budgets(cfg.tokens, tokens_per_step, cfg.schedule, cfg.decay_fraction)
    warmup = default_warmup(budgets) if cfg.warmup is None else cfg.warmup
    if cfg.batch_size % dist.world:
        raise UserError(f"batch size {cfg.batch_size} is not divisible by the {dist.world} ranks")
    per_rank = cfg.batch_size // dist.world
    micro = cfg.micro_batch_size or per_rank
    if per_rank % micro:
        raise UserError(f"micro batch {micro} does not divide the per-rank batch {per_rank}")
    n_micro = per_rank // micro

    run_name = run_name or default_run_name(tier, model_cfg.arch, cfg)
    if not run_name or "/" in run_name or run_name.startswith("."):
        raise UserError(f"bad run name {run_name!r}")
    run_dir = runs_dir / run_name
    ckpt_dir = Path(ckpt_dir) / run_name if ckpt_dir is not None else cache_root() / "checkpoints" / run_name
    latest = ckpt_dir / "latest.pt"

    if cfg.threads is not None and device.type == "cpu":
        torch.set_num_threads(cfg.threads)

    # -- data first: unusable data is refused before any folder is made ------------------
    def _open_data():
        return open_data(cfg.data, vocab_size=model_cfg.vocab_size, max_bytes=cfg.data_max_bytes,
                         val_fraction=cfg.data_val_fraction, cache_dir=data_cache,
                         tokenizer=cfg.data_tokenizer)

    if dist.is_main:  # rank 0 builds (or hash-checks) first; the others then find it ready
        corpus = _open_data()
    dist.barrier()
    if not dist.is_main:
        corpus = _open_data()
    val = corpus.val_windows(T, cfg.val_windows)

    # -- folders (rank 0 decides, the others follow) ---------------------------------------
    existed = False
    if dist.is_main:
        existed = runlog.prepare_run_dir(run_dir, resume, overwrite)
        runlog.prepare_ckpt_dir(ckpt_dir, overwrite or not existed)
    if dist.world > 1:  # every rank must take the same resume decision
        flag = [existed]
        torch.distributed.broadcast_object_list(flag, src=0)
        existed = bool(flag[0])
    dist.barrier()

    meta = {
        "run": run_name,
        "tier": tier,
        "arch": model_cfg.arch,
        "proxy": proxy,
        "model": model_cfg.to_dict(),
        "accounting": accounting(model_cfg).to_dict(),
        "train": cfg.to_dict(),
        "resolved": {
            "warmup": warmup,
            "micro_batch_size": micro,
            "grad_accum_steps": n_micro,
            "world_size": dist.world,
            "tokens_per_step": tokens_per_step,
            "total_steps": total_steps(budgets),
            "val_windows": int(len(val[0])),
        },
        "budgets": [b.to_dict() for b in budgets],
        "data_spec": cfg.data_spec(model_cfg.vocab_size).to_dict() if cfg.data is None else None,
        "data": corpus.provenance,
        "data_identity": corpus.identity,
        "seed": cfg.seed,
        "code": runlog.code_version(),
        "env": {
            **runlog.environment(),
            "device": str(device),
            "threads": torch.get_num_threads(),
            "world_size": dist.world,
            "precision": "bf16-autocast" if device.type == "cuda" else "fp32",
        },
        "run_dir": str(run_dir),
        "ckpt_dir": str(ckpt_dir),
    }
    if dist.is_main:
        cfg_path = run_dir / runlog.CONFIG
        if existed and cfg_path.exists():
            diff = _config_diff(runlog.read_json(cfg_path), meta)
            if diff:
                raise UserError(
                    f"run {run_name} exists with a different configuration "
                    f"({', '.join(diff[:6])}); use --overwrite or another --run-name"
                )
        else:
            runlog.write_json(cfg_path, meta)

    # -- model and optimizer ----------------------------------------------------------------
    torch.manual_seed(cfg.seed)
    raw = MoETransformer(model_cfg, seed=cfg.seed).to(device)
    model: torch.nn.Module = raw
    if dist.world > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(
            raw, device_ids=[device.index] if device.type == "cuda" else None, broadcast_buffers=False
        )
    opt = torch.optim.AdamW(
        param_groups(raw, cfg.weight_decay),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        fused=device.type == "cuda",
    )
    params = [p for p in raw.parameters() if p.requires_grad]

    state: dict[str, Any] = {
        "iter": 0,
        "trunk_step": 0,
        "branch": None,
        "branch_step": 0,
        "next_branch": 0,
        "points": [],
        "wall_s": 0.0,
        "done": False,
    }

    def snapshot() -> dict:
        return {
            "format": CKPT_FORMAT,
            "state": dict(state, points=list(state["points"])),
            "model": raw.state_dict(),
            "optimizer": opt.state_dict(),
            "rng": _rng_state(),
            "budgets": [b.to_dict() for b in budgets],
            "model_config": model_cfg.to_dict(),
            "train_config": cfg.to_dict(),
        }

    def write_final() -> dict:
        doc = {
            "run": run_name,
            "arch": model_cfg.arch,
            "tier": tier,
            "complete": bool(state["done"]),
            "points": state["points"],
        }
        if dist.is_main:
            runlog.write_json(run_dir / runlog.FINAL, doc)
        return doc

    metrics_path = run_dir / runlog.METRICS
    if existed and latest.exists():
        ck = runlog.load_checkpoint(latest, map_location=device)
        if ck.get("budgets") != [b.to_dict() for b in budgets]:
            raise UserError(f"checkpoint {latest} was made for other budgets; use --overwrite")
        raw.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        _set_rng_state(ck["rng"])
        state = ck["state"]
        for key in ("device", "threads"):
            if ck["train_config"].get(key) != cfg.to_dict().get(key) and dist.is_main:
                from scaling.cli._util import warn

                warn(
                    f"resuming with {key}={cfg.to_dict().get(key)!r} (was {ck['train_config'].get(key)!r}):"
                    " float rounding, hence metrics, may differ from an uninterrupted run"
                )
        del ck
    if dist.is_main:
        kept = [r for r in runlog.read_jsonl(metrics_path) if r.get("iter", 0) <= state["iter"]]
        runlog.rewrite_jsonl(metrics_path, kept)
        write_final()
    dist.barrier()

    def branch_point_path(i: int) -> Path:
        return ckpt_dir / f"branch_point_{i}.pt"

    def save_latest() -> None:
        if dist.is_main:
            runlog.save_checkpoint(latest, snapshot())
            # branch points of finished branches are no longer referenced by latest.pt
            for i in range(state["next_branch"]):
                if state["branch"] != i:
                    branch_point_path(i).unlink(missing_ok=True)
        dist.barrier()

    def train_step(step: int, target: TokenBudget) -> tuple[torch.Tensor, float, float]:
        lr = lr_at(step, target, cfg.schedule, cfg.lr, warmup, cfg.min_lr_ratio)
        for g in opt.param_groups:
            g["lr"] = lr
        x_np, y_np = corpus.train_batch(cfg.seed, step, cfg.batch_size, T, dist.rank, dist.world)
        x_all = torch.from_numpy(x_np).to(device, non_blocking=True)
        y_all = torch.from_numpy(y_np).to(device, non_blocking=True)
        sums = torch.zeros(3, dtype=torch.float64, device=device)
        for m in range(n_micro):
            sl = slice(m * micro, (m + 1) * micro)
            sync = dist.world == 1 or m == n_micro - 1
            ctx = contextlib.nullcontext() if sync else model.no_sync()
            with ctx:
                with _autocast(device):
                    out = model(x_all[sl], y_all[sl])
                objective = out.loss + cfg.aux_coef * out.aux_loss + cfg.z_coef * out.z_loss
                (objective / n_micro).backward()
            sums += torch.stack([out.loss.detach(), out.aux_loss.detach(), out.z_loss.detach()]).double()
        if cfg.grad_clip > 0:
            gnorm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        else:
            gnorm = torch.nn.utils.clip_grad_norm_(params, float("inf"))
        opt.step()
        opt.zero_grad(set_to_none=True)
        stats = _all_reduce_mean(sums / n_micro, dist)
        return stats, float(gnorm), lr

    def eval_now() -> tuple[float, float]:
        loss = evaluate(raw, val, cfg.eval_batch_size, device, dist)
        return loss, corpus.bpb(loss)

    def start_branches() -> bool:
        """Open the next cooldown branch(es) whose branch point the trunk has reached."""
        started = False
        while (
            state["branch"] is None
            and state["next_branch"] < len(budgets) - 1
            and state["trunk_step"] == budgets[state["next_branch"]].branch_step
        ):
            i = state["next_branch"]
            if dist.is_main:
                runlog.save_checkpoint(branch_point_path(i), snapshot())
            dist.barrier()
            state["branch"], state["branch_step"] = i, state["trunk_step"]
            started = True
        return started

    def close_branch() -> None:
        i = state["branch"]
        ck = runlog.load_checkpoint(branch_point_path(i), map_location=device)
        raw.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        del ck
        state["branch"], state["branch_step"] = None, 0
        state["trunk_step"] = budgets[i].branch_step
        state["next_branch"] = i + 1

    total_iters = total_steps(budgets)
    bar = _Progress(
        progress and dist.is_main and not state["done"],
        total_iters * tokens_per_step,
        state["iter"] * tokens_per_step,
        model_cfg.arch,
    )
    kill_at = int(os.environ.get(_KILL_ENV, "-1"))
    t_resume = time.perf_counter()
    wall_base = state["wall_s"]
    train_time, train_tokens = 0.0, 0
    try:
        if state["iter"] == 0 and not state["done"] and start_branches():
            save_latest()
        while not state["done"]:
            in_branch = state["branch"] is not None
            target = budgets[state["branch"]] if in_branch else budgets[-1]
            step = state["branch_step"] if in_branch else state["trunk_step"]
            t0 = time.perf_counter()
            stats, gnorm, lr = train_step(step, target)
            state["iter"] += 1
            if in_branch:
                state["branch_step"] += 1
            else:
                state["trunk_step"] += 1
            step += 1
            loss, aux, z = (float(v) for v in stats.tolist())  # syncs the device
            train_time += time.perf_counter() - t0
            train_tokens += tokens_per_step
            state["wall_s"] = wall_base + time.perf_counter() - t_resume
            if not math.isfinite(loss):
                raise FloatingPointError(f"training loss is {loss} at update {state['iter']} (step {step})")

            record: dict[str, Any] = {
                "iter": state["iter"],
                "step": step,
                "tokens": step * tokens_per_step,
                "branch": state["branch"],
                "train_loss": loss,
                "aux_loss": aux,
                "z_loss": z,
                "lr": lr,
                "grad_norm": gnorm,
            }
            force_ckpt = False
            budget_end = (state["branch_step"] == target.steps) if in_branch else (step == budgets[-1].steps)
            periodic = not in_branch and cfg.eval_every > 0 and step % cfg.eval_every == 0
            if budget_end or periodic:
                vl, vb = eval_now()
                record.update(val_loss=vl, val_bpb=vb)
                bar.update(0, val=f"{vl:.3f}")
            if budget_end:
                state["wall_s"] = wall_base + time.perf_counter() - t_resume
                record["budget_index"] = target.index
                state["points"].append(
                    _point(
                        run_name,
                        tier,
                        proxy,
                        model_cfg,
                        target,
                        record["val_loss"],
                        record["val_bpb"],
                        loss,
                        cfg.seed,
                        state["wall_s"],
                    )
                )
                if in_branch:
                    close_branch()
                else:
                    state["done"] = True
                force_ckpt = True
            if not state["done"] and start_branches():
                force_ckpt = True

            record["tokens_per_s"] = train_tokens / train_time if train_time > 0 else None
            if not budget_end:  # a budget end's wall_s is the one stored in its point
                state["wall_s"] = wall_base + time.perf_counter() - t_resume
            record["wall_s"] = state["wall_s"]
            if dist.is_main and (state["iter"] % cfg.log_every == 0 or "val_loss" in record or state["done"]):
                runlog.append_jsonl(metrics_path, record)
                if budget_end:
                    write_final()
            bar.update(tokens_per_step, tps=f"{record['tokens_per_s']:,.0f}", loss=f"{loss:.3f}")
            if state["iter"] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            if force_ckpt or state["iter"] % cfg.ckpt_every == 0:
                save_latest()
            if state["iter"] % cfg.log_every == 0:
                train_time, train_tokens = 0.0, 0
    finally:
        bar.close()

    doc = write_final()
    if save_final_weights and dist.is_main:
        runlog.save_weights(
            run_dir / runlog.WEIGHTS, raw, {"run": run_name, "arch": model_cfg.arch, "tier": tier}
        )
    dist.barrier()
    return {**doc, "run_dir": str(run_dir), "ckpt_dir": str(ckpt_dir)}
