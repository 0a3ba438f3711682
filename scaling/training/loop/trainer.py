"""The trainer: a short loop over components (AdamW, WSD cooldown branches, resume, data parallel).

One run trains one model on the corpus of :mod:`scaling.training.data.corpus` and yields one (N, D, loss)
point per token budget. The components, each in its own module:

* :class:`~scaling.training.loop.branches.BranchPlan`: trunk to the largest budget, a cooldown branch
  from step ``P_i = S_i - K_i`` at each smaller budget, where evaluations happen (pure, no torch);
* :class:`~scaling.training.loop.state.TrainState`: the position in the plan and what the run has done;
* :class:`~scaling.training.loop.checkpoint.Checkpointer`: DCP checkpoints in ``<run_dir>/checkpoints``,
  atomic, identity-checked, resumable on another world size;
* :class:`~scaling.training.loop.evaluate.Evaluator`: validation loss with the same number of forward
  passes on every rank, overall and per data source;
* :class:`~scaling.training.loop.metrics.MetricsSink`: ``metrics.jsonl`` (+ TensorBoard / W&B mirrors),
  with MFU, peak memory and data wait per logged update.

Objective: ``CE + aux_coef * load_balance + z_coef * router_z`` (defaults 0.01 and 1e-3, as
Switch Transformer's alpha = 0.01 and ST-MoE's z-loss coefficient 1e-3). AdamW (decoupled
weight decay, Loshchilov & Hutter 2019) on every matrix except the token embedding; norm gains
(1-D) are not decayed either (decay would pull them towards 0, not towards the identity 1).
Gradients are clipped to a global norm. fp32 on CPU (bitwise reproducible for a fixed thread
count), bf16 autocast with fp32 master weights on CUDA.

Logs go to ``runs/<name>/`` (see :mod:`scaling.common.run_folder`): ``config.json``, ``metrics.jsonl``
(one line per logged update, keyed by ``iter``, the run's update counter, monotone across trunk
and branches), ``final.json`` and ``checkpoints/``. A run killed at any moment and resumed logs
exactly what an uninterrupted run logs.

Data parallel: under ``torchrun`` or a multi-task submitit job (``WORLD_SIZE`` > 1, see
:mod:`scaling.training.parallel.distributed`) the model is built by
:func:`scaling.training.parallel.data_parallel.build_model`
(DDP, or FSDP2/HSDP from the meta device, per ``TrainConfig.parallel``); rank r takes rows
[r*B/W, (r+1)*B/W) of each global batch, so the result equals a single process with
``micro_batch_size`` = B/W and W accumulation steps. Only rank 0 writes the run log.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import torch

from scaling.accounting.config import ModelConfig
from scaling.accounting.costs import Costs
from scaling.accounting.costs import costs as accounting
from scaling.accounting.memory import resolve_mode
from scaling.common.errors import UserError
from scaling.common.files import read_jsonl
from scaling.common.format import format_tokens
from scaling.common.run_folder import (
    ANALYSIS_DIR,
    ANALYSIS_KINDS,
    BUDGET_WEIGHT,
    CHECKPOINTS,
    EVAL_DATA,
    EVAL_DATA_FILES,
    Point,
    final_doc,
    is_run_folder,
    remove_stale_temporaries,
)
from scaling.training import runlog
from scaling.training.data.corpus import DataSpec
from scaling.training.data.loader import open_data
from scaling.training.loop.branches import BranchPlan, Position, TokenBudget
from scaling.training.loop.checkpoint import RUN_ID, Checkpointer, identity_diff, run_identity, split_by_owner
from scaling.training.loop.config import TrainConfig
from scaling.training.loop.evaluate import Evaluator, autocast
from scaling.training.loop.lock import RunLock, check_free
from scaling.training.loop.metrics import (
    MetricsSink,
    mfu,
    peak_memory_bytes,
    require_trackers,
    resolve_peak_flops,
)
from scaling.training.loop.progress import Progress
from scaling.training.loop.schedule import lr_at
from scaling.training.loop.state import TrainState
from scaling.training.parallel.data_parallel import (
    build_model,
    full_state_dict,
    reshard,
    resolve_compile,
    resolve_grad_sync,
    split_batch,
    train_step,
    unwrap,
)
from scaling.training.parallel.distributed import DistEnv, setup_distributed
from scaling.training.parallel.launcher import stop_requested
from scaling.training.schema import check_name

log = logging.getLogger(__name__)


# Fields that may differ between a run and its resumption: they do not change the maths, except
# device/threads/parallel/head_padding, which change float rounding (a warning is logged for those).
# data_codec_tables chooses the corpus of a new run only: a resumed run goes on with the corpus its
# data_spec records (compared as its own section), whatever the flag says now.
RESUME_FREE = {"ckpt_every", "async_ckpt", "log_every", "log_to", "peak_flops", "mfu", "val_by_source",
               "eval_batch_size", "device", "threads", "parallel", "activation_checkpointing", "compile",
               "grad_sync", "replicate", "ep", "loop_grad", "head_padding", "data_verify",
               "data_codec_tables"}


def default_warmup(budgets: tuple[TokenBudget, ...]) -> int:
    return min(1000, max(1, round(0.1 * budgets[0].steps)))


def default_run_name(tier: str, arch: str, cfg: TrainConfig) -> str:
    return f"{tier}-{arch}-{format_tokens(max(cfg.tokens))}-s{cfg.seed}"


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: decay every matrix except the token embedding; never decay 1-D gains."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        for wrapper in ("module.", "_orig_mod."):  # DDP, torch.compile
            name = name.removeprefix(wrapper)
        (no_decay if p.ndim < 2 or name.startswith("embed.") else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]


# ----- distributed ------------------------------------------------------------------------

def _not_in_another_run(ckpt_root: Path, run_dir: Path) -> None:
    """UserError when ``--ckpt-dir`` is, or lies inside, the folder of another run: one writer per run
    folder (2026-12-07 review: checkpoints went into another run's folder)."""
    own = run_dir.resolve()
    for d in (ckpt_root.resolve(), *ckpt_root.resolve().parents):
        if d != own and is_run_folder(d):
            raise UserError(f"--ckpt-dir {ckpt_root} lies in the run folder {d} of another run; choose a "
                            "folder outside it")


def _agreed(dist: DistEnv, fn: Callable[[], Any]) -> Any:
    """Run ``fn`` on rank 0 and give its result, or its UserError, to every rank."""
    result: list[Any] = [None, None]
    if dist.is_main:
        try:
            result[0] = fn()
        except UserError as exc:
            result[1] = str(exc)
    if dist.world > 1:
        torch.distributed.broadcast_object_list(result, src=0)
    if result[1] is not None:
        raise UserError(result[1])
    return result[0]


# ----- the run folder ---------------------------------------------------------------------

def _point(run: str, tier: str, proxy: bool, arch: str, acc: Costs, b: TokenBudget, val_loss: float,
           val_bpb: float, train_loss: float, seed: int, wall_s: float) -> Point:
    return Point(run=run, arch=arch, tier=tier, proxy=proxy, N=acc.active_params, D=b.tokens, loss=val_loss,
                 val_bpb=val_bpb, flops=acc.flops_per_token * b.tokens, flops_per_token=acc.flops_per_token,
                 sparsity=acc.sparsity, non_embedding_params=acc.non_embedding_params,
                 total_params=acc.total_params, seed=seed, budget_index=b.index, steps=b.steps,
                 requested_tokens=b.requested_tokens, train_loss=train_loss, wall_s=wall_s)


def _config_diff(old: dict, new: dict) -> list[str]:
    sections = {}
    for doc, key in ((old, "a"), (new, "b")):
        for section in ("model", "train", "budgets", "data_spec"):
            value = doc.get(section)
            if section == "train":
                value = {k: v for k, v in (value or {}).items() if k not in RESUME_FREE}
            if section == "budgets":
                value = {"budgets": value}
            sections.setdefault(key, {})[section] = value
    return identity_diff(sections["a"], sections["b"])


def _check_ids(batch, vocab_size: int, what: str) -> None:
    """UserError when a batch ``(inputs, targets)`` (windows shifted by one) holds an id
    the model has no embedding for: a manifest whose vocab_size or dtype is wrong would otherwise
    fail inside the embedding (CPU) or as a device-side assert (CUDA)."""
    x, y = batch
    if not y.size:
        return
    top, low = max(int(y.max()), int(x[:, 0].max())), min(int(y.min()), int(x[:, 0].min()))
    if top >= vocab_size or low < 0:
        raise UserError(f"{what} holds token id {top:,}, outside the model's vocabulary of {vocab_size:,} "
                        "ids (data made with another tokenizer, or indexed with the wrong vocab size or "
                        "dtype?)")


def _check_same_data(run: str, old: dict | None, new: dict) -> None:
    """UserError naming what changed when a resumed run would read other data than it started on
    (the manifest's hash, token counts, tokenizer, ...): a resume must never mix two data sets."""
    if not isinstance(old, dict):
        return  # a run folder older than the data identity: the checkpoint identity still checks
    # keys both record (a key added by a later version is not a change of the data)
    changed = [k for k in sorted(old) if k in new and old[k] != new[k]]
    if not changed:
        return

    def show(v):
        return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)[:16]

    what = ", ".join(f"{k} {show(old.get(k))} -> {show(new.get(k))}" for k in changed[:4])
    raise UserError(f"run {run} was started on other data ({what}); resuming would mix two data sets: "
                    "point it at the data it started on, or overwrite it")


def _check_run_dir(run_dir: Path, resume: bool, overwrite: bool, locked: bool = False) -> bool:
    """Whether the run folder holds a run to resume; UserError for what cannot go on. No side effects."""
    if resume and overwrite:
        raise UserError("resume and overwrite exclude each other")
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"run folder {run_dir} is a file")
    if run_dir.is_dir() and not locked:
        check_free(run_dir)  # another training writes it: refuse now, before reading anything
    exists = (run_dir / runlog.CONFIG).exists() or (run_dir / runlog.METRICS).exists()
    if not exists and run_dir.is_dir():
        # results without the config.json every training writes first: not a run of this trainer,
        # so nothing proves they may be replaced (a run writes these names without asking)
        names = (runlog.FINAL, runlog.WEIGHTS, runlog.BUDGET_WEIGHTS_DIR, ANALYSIS_DIR, EVAL_DATA)
        foreign = [n for n in names if (run_dir / n).exists() or (run_dir / n).is_symlink()]
        if foreign:
            raise UserError(f"run folder {run_dir} holds {', '.join(foreign)} but no config.json: not a run "
                            "of this trainer; move them away or choose another run name")
    if exists and not (resume or overwrite):
        raise UserError(f"run folder {run_dir} already holds a run; resume it or overwrite it")
    if resume and not exists:
        raise UserError(f"no run to resume in {run_dir} (no config.json or metrics.jsonl there)")
    if exists and resume:
        if not (run_dir / runlog.CONFIG).exists():
            raise UserError(f"run folder {run_dir} has metrics.jsonl but no config.json; cannot resume it")
        read_jsonl(run_dir / runlog.METRICS, missing_ok=True)  # a corrupt line: stop before any change
    return exists and resume


def _recorded_codec_tables(run_dir: Path) -> bool:
    """Whether the built-in corpus recorded in a run's config.json holds the codec tables (a spec
    without the key does: :meth:`DataSpec.from_dict`)."""
    try:
        meta = runlog.read_json(run_dir / runlog.CONFIG)
    except (OSError, ValueError):  # Trainer._previous refuses it in one line
        return False
    spec = meta.get("data_spec") if isinstance(meta, dict) else None
    return isinstance(spec, dict) and spec.get("codec_tables", True) is True


def _create_run_dir(run_dir: Path, overwrite: bool, doomed: list[Path], lock: RunLock,
                    unchanged: Callable[[], bool]) -> None:
    """Create the folder and take its lock before any write; then delete what --overwrite replaces.
    ``unchanged()`` re-checks, under the lock, that no other training made or finished a run there
    since this one looked."""
    created = not run_dir.exists()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-test-{uuid.uuid4().hex}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        if created and run_dir.is_dir() and not any(run_dir.iterdir()):
            run_dir.rmdir()
        raise UserError(f"run folder {run_dir} is not writable: {exc.strerror or exc}") from None
    lock.acquire(run_dir)
    if not unchanged():
        raise UserError(f"run folder {run_dir} changed while this training started (another training "
                        "wrote it); start again")
    if overwrite:
        import shutil

        # the old checkpoints first and config.json last: killed at any point, the folder still
        # holds the old run's config, so the same --overwrite command finishes the job (config.json
        # gone with checkpoints left would be a folder no command accepts)
        for path in doomed:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        if doomed:
            with contextlib.suppress(OSError):
                doomed[0].parent.rmdir()
        replaced = _replaced_files(run_dir)
        for path in sorted(replaced, key=lambda q: q.name == runlog.CONFIG):
            path.unlink()
        for name in (runlog.BUDGET_WEIGHTS_DIR, ANALYSIS_DIR, EVAL_DATA):
            with contextlib.suppress(OSError):  # only when nothing else is left in it
                (run_dir / name).rmdir()


def _replaced_files(run_dir: Path) -> list[Path]:
    """What ``--overwrite`` deletes in the run folder: the files an earlier training and the analyses
    of its model wrote (config, metrics, final results and weights, budget weights, analysis results,
    the validation snapshot). Anything else a user put there stays."""
    paths = [run_dir / n for n in (runlog.CONFIG, runlog.METRICS, runlog.FINAL, runlog.WEIGHTS)]
    weights = run_dir / runlog.BUDGET_WEIGHTS_DIR
    if weights.is_dir() and not weights.is_symlink():
        paths += [p for p in weights.iterdir() if BUDGET_WEIGHT.fullmatch(p.name)]
    analyses = [f"{k}.json" for k in ANALYSIS_KINDS]
    for folder, names in ((ANALYSIS_DIR, analyses), (EVAL_DATA, EVAL_DATA_FILES)):
        if (run_dir / folder).is_dir() and not (run_dir / folder).is_symlink():
            paths += [run_dir / folder / n for n in names]
    return [p for p in paths if p.is_symlink() or p.is_file()]


# ----- the trainer ------------------------------------------------------------------------

class Trainer:
    """Builds the components of one run, then :meth:`train` runs the loop (see the module docstring)."""

    def __init__(self, model_cfg: ModelConfig, cfg: TrainConfig, dist: DistEnv, *, tier: str,
                 proxy: bool | None,
                 run_name: str | None, runs_dir: Path, ckpt_dir: Path | None, resume: bool, overwrite: bool,
                 progress: Callable[[Progress], None] | None, data_cache, save_budget_weights: bool = False,
                 lock: RunLock | None = None, after_update: Callable[[TrainState], None] | None = None):

        self.model_cfg, self.cfg, self.dist = model_cfg, cfg, dist
        self.acc = accounting(model_cfg)  # exact costs: config.json, every point, MFU
        self.after_update = after_update
        self.save_budget_weights = save_budget_weights
        self.lock = lock if lock is not None else RunLock()  # rank 0 takes it when it creates the folder
        self.tier = tier
        self.proxy = tier.startswith("proxy") if proxy is None else proxy
        self.progress = progress if dist.is_main else None
        device = dist.device

        # -- everything that can be refused is checked before a folder is created ----------------
        T = model_cfg.seq_len
        self.tokens_per_step = cfg.batch_size * T
        self.plan = BranchPlan.build(cfg.tokens, self.tokens_per_step, cfg.schedule, cfg.decay_fraction)
        self.warmup = default_warmup(self.plan.budgets) if cfg.warmup is None else cfg.warmup
        _, self.micro, self.n_micro = split_batch(cfg.batch_size, dist.world, cfg.micro_batch_size)
        self.peak_flops = resolve_peak_flops(cfg.peak_flops)
        require_trackers(cfg.log_to)
        self.run_name = run_name or default_run_name(tier, model_cfg.arch, cfg)
        check_name(self.run_name, "run name")  # one folder name: no '/', no leading '.', no control chars
        self.run_dir = run_dir = Path(runs_dir) / self.run_name
        existed = _agreed(dist, lambda: _check_run_dir(run_dir, resume, overwrite))
        if cfg.warmup is not None and not existed:
            self.plan.check_warmup(cfg.warmup)  # a run begun before the rule resumes as it began
        if cfg.threads is not None and device.type == "cpu":
            torch.set_num_threads(cfg.threads)

        # a resumed run goes on with the corpus it started on: one recorded before
        # DataSpec.codec_tables existed holds the codec tables that new runs leave out
        codec_tables = cfg.data_codec_tables
        if existed and cfg.data is None:
            codec_tables = _agreed(dist, lambda: _recorded_codec_tables(run_dir))
        spec = cfg.data_spec(model_cfg.vocab_size, codec_tables) if cfg.data is None else None

        def open_():
            return open_data(cfg.data, vocab_size=model_cfg.vocab_size, max_bytes=cfg.data_max_bytes,
                             val_fraction=cfg.data_val_fraction, cache_dir=data_cache,
                             tokenizer=cfg.data_tokenizer, codec_tables=codec_tables,
                             verify=cfg.data_verify if dist.is_main else "cheap")  # rank 0 checked it

        if dist.is_main:  # rank 0 builds (or hash-checks) first; the others then find it ready
            self.corpus = open_()
        dist.barrier()
        if not dist.is_main:
            self.corpus = open_()
        windows = {"": self.corpus.val_windows(T, cfg.val_windows)}
        if cfg.val_by_source:
            windows.update(self.corpus.val_windows_by_source(T, cfg.val_windows))
        # ids the model has no embedding for: refused here, before the run folder exists (and
        # every batch is checked again in train_step)
        _check_ids(windows[""], model_cfg.vocab_size, "the validation split")
        _check_ids(self.corpus.train_batch(cfg.seed, 0, cfg.batch_size, T), model_cfg.vocab_size,
                   "the first training batch")
        self.evaluator = Evaluator(windows, cfg.eval_batch_size, device, dist.rank, dist.world)

        code = runlog.code_version()
        train_id = {k: v for k, v in cfg.to_dict().items() if k not in RESUME_FREE}
        identity = run_identity(model_cfg.to_dict(), train_id, self.plan.to_dicts(),
                                self.corpus.provenance, code)
        meta = self._meta(spec, code, device)
        old = _agreed(dist, lambda: self._previous(existed, meta, overwrite))
        run_id = _agreed(dist, lambda: old["run_id"] if existed else uuid.uuid4().hex[:12])
        ckpt_root = Path(ckpt_dir) if ckpt_dir is not None else None
        if ckpt_root is not None:
            _agreed(dist, lambda: _not_in_another_run(ckpt_root, run_dir))

        def ckpt_folder(rid: str) -> Path:  # never the run name alone: see checkpoint.py
            return run_dir / CHECKPOINTS if ckpt_root is None else ckpt_root / f"{self.run_name}-{rid}"

        self.ckpt_dir = ckpt_folder(run_id)
        # --overwrite deletes only the old run's own checkpoints (config.json is user data: its run id
        # must be one this trainer makes, and each checkpoint's meta.json must name it), and refuses
        # before deleting anything when other checkpoints would then block this run's folder
        old_id = str(old.get("run_id") or "")
        doomed: list[Path] = []
        if overwrite:
            old_ckpt = ckpt_folder(old_id) if RUN_ID.fullmatch(old_id) else self.ckpt_dir
            doomed, other = _agreed(dist, lambda: split_by_owner(old_ckpt, old_id))
            if old_ckpt == self.ckpt_dir and other:
                raise UserError(f"checkpoint folder {old_ckpt} holds checkpoints that are not the "
                                f"overwritten run's ({', '.join(other[:3])}); move them away or choose "
                                "--ckpt-dir")
        meta.update(run_id=run_id, ckpt_dir=str(self.ckpt_dir), identity=identity)

        # -- folders ---------------------------------------------------------------------------
        self.checkpointer = Checkpointer(self.ckpt_dir, identity, run_id, rank=dist.rank, world=dist.world,
                                         every=cfg.ckpt_every, async_save=cfg.async_ckpt)

        def create():
            # the checkpoint folder first: a refused one must leave no config.json behind
            if not existed and not overwrite:
                self.checkpointer.check_empty()
            self.checkpointer.check_writable()
            _create_run_dir(run_dir, overwrite, doomed, self.lock,
                            lambda: _check_run_dir(run_dir, resume, overwrite, locked=True) == existed)
            if existed:   # under the lock: a killed writer's temporaries (a whole weights file)
                remove_stale_temporaries(run_dir)
            weights = run_dir / runlog.BUDGET_WEIGHTS_DIR
            if self.save_budget_weights and weights.exists() and not weights.is_dir():
                # said now, not at the first budget's end after its training
                raise UserError(f"{weights} is a file, where the budget weights go (--save-budget-weights): "
                                "move it away")
            if not existed:
                if overwrite:  # the old run's checkpoints are gone only now
                    self.checkpointer.check_empty()
                runlog.write_json(run_dir / runlog.CONFIG, meta)

        _agreed(dist, create)
        self.checkpointer.prepare()

        # -- model, optimizer, state -------------------------------------------------------------
        torch.manual_seed(cfg.seed)
        self.grad_sync = resolve_grad_sync(cfg.grad_sync, resolve_mode(cfg.parallel, dist.world))
        self.model = build_model(model_cfg, cfg.seed, dist, cfg.parallel,
                                 activation_checkpointing=cfg.activation_checkpointing,
                                 compile=resolve_compile(cfg.compile, device.type),
                                 loop_grad=cfg.loop_grad)
        unwrap(self.model).set_head_padding(cfg.head_padding)
        self.optimizer = torch.optim.AdamW(param_groups(self.model, cfg.weight_decay), lr=cfg.lr,
                                           betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                                           fused=device.type == "cuda")
        self.state = TrainState()
        latest = self.checkpointer.latest() if existed else None
        if latest is not None:
            self.state = self.checkpointer.load(latest, self.model, self.optimizer)
        elif existed:
            _agreed(dist, lambda: self._refuse_starting_over(old))
        from scaling.training.loop.metrics import resume_metrics

        # every rank stops on a damaged log, not rank 0 alone with the others waiting at the
        # barrier, and before anything (stale branch points) is deleted; a checkpoint written
        # before the line count existed takes the count of the log it resumes
        kept = _agreed(dist, lambda: resume_metrics(run_dir / runlog.METRICS, self.state.iter,
                                                    self.state.metrics_lines))
        if self.state.metrics_lines is None:
            self.state.metrics_lines = kept
        self.checkpointer.prune_branch_points(self.state)
        self.metrics = MetricsSink(run_dir, enabled=dist.is_main, log_to=cfg.log_to,
                                   start_iter=self.state.iter,
                                   run_name=self.run_name, run_id=run_id, config=meta)
        self.write_final()
        dist.barrier()

    def _meta(self, spec: DataSpec | None, code: dict, device: torch.device) -> dict:
        cfg, dist = self.cfg, self.dist
        return {
            "run": self.run_name, "tier": self.tier, "arch": self.model_cfg.arch, "proxy": self.proxy,
            "model": self.model_cfg.to_dict(), "accounting": self.acc.to_dict(),
            "train": cfg.to_dict(),
            "resolved": {"warmup": self.warmup, "micro_batch_size": self.micro,
                         "grad_accum_steps": self.n_micro,
                         "world_size": dist.world, "tokens_per_step": self.tokens_per_step,
                         "total_steps": self.plan.total_steps, "val_windows": self.evaluator.n_windows,
                         "peak_flops": self.peak_flops},
            "budgets": self.plan.to_dicts(), "data_spec": spec and spec.to_dict(),
            "data": self.corpus.provenance, "data_identity": self.corpus.identity,
            "seed": cfg.seed, "code": code,
            "env": {**runlog.environment(), "device": str(device), "threads": torch.get_num_threads(),
                    "world_size": dist.world,
                    "parallel": resolve_mode(cfg.parallel, dist.world),
                    "grad_sync": resolve_grad_sync(cfg.grad_sync, resolve_mode(cfg.parallel, dist.world)),
                    "precision": "bf16-autocast" if device.type == "cuda" else "fp32"},
            "run_dir": str(self.run_dir),
        }

    def _refuse_starting_over(self, old: dict) -> None:
        """A resume that finds no checkpoint starts the run over, dropping its metrics and points:
        refused where the run got further than its first checkpoint (more logged updates than
        ``ckpt_every``, or a finished budget), i.e. where a checkpoint should exist but is not in
        this checkpoint folder (another --ckpt-dir than the run's, or checkpoints deleted). A run
        killed before its first checkpoint starts over, as it must."""
        rows = read_jsonl(self.run_dir / runlog.METRICS, missing_ok=True).rows
        logged = max((int(r.get("iter") or 0) for r in rows if isinstance(r.get("iter"), (int, float))),
                     default=0)
        try:
            final = runlog.read_json(self.run_dir / runlog.FINAL)
        except (OSError, ValueError):
            final = {}
        finished = isinstance(final, dict) and bool(final.get("points") or final.get("complete"))
        every = self.cfg.ckpt_every or 0
        if not (finished or (every and logged > every)):
            return
        recorded = old.get("ckpt_dir")
        hint = ("pass the --ckpt-dir it was trained with" if not recorded or Path(recorded) == self.ckpt_dir
                else f"its config.json records checkpoints in {recorded}: pass --ckpt-dir "
                     f"{Path(recorded).parent}" if Path(recorded).name != CHECKPOINTS
                else f"its config.json records checkpoints in {recorded}: leave --ckpt-dir out")
        what = f"{logged} logged updates" + (" and finished budgets" if finished else "")
        raise UserError(f"run {self.run_name} has {what} but no checkpoint in {self.ckpt_dir}: resuming "
                        f"would start it over and drop them; {hint}, or --overwrite to start again")

    def _previous(self, existed: bool, meta: dict, overwrite: bool) -> dict:
        """The existing run's config.json (resume: checked against this run), else {}."""
        path = self.run_dir / runlog.CONFIG
        if not (existed or overwrite) or not path.exists():
            return {}
        try:
            old = runlog.read_json(path)
        except (OSError, ValueError):
            if overwrite:
                return {}
            raise UserError(f"{path} is unreadable; cannot resume this run") from None
        shapes = {"model": dict, "train": dict, "data_spec": dict, "budgets": list}
        if isinstance(old, dict):
            bad = [k for k, t in shapes.items() if old.get(k) is not None and not isinstance(old[k], t)]
        else:
            bad = ["the whole file"]
        if bad:  # config.json is user data: a wrong shape is refused (resume) or replaced (overwrite)
            if overwrite:
                return {}
            raise UserError(f"{path} is not a run config (wrong type: {', '.join(bad)}); cannot resume this "
                            "run")
        if existed:
            _check_same_data(self.run_name, old.get("data_identity"), meta["data_identity"])
            diff = _config_diff(old, meta)
            if diff:
                raise UserError(f"run {self.run_name} exists with a different configuration "
                                f"({', '.join(diff[:6])}); overwrite it or choose another run name")
            for key in ("device", "threads", "parallel", "head_padding"):
                if old["train"].get(key) != meta["train"].get(key):
                    log.warning("resuming with %s=%r (was %r): float rounding, hence metrics, may differ "
                            "from an uninterrupted run", key, meta["train"].get(key), old["train"].get(key))
            old.setdefault("run_id", "")
            if old["run_id"] != "" and not RUN_ID.fullmatch(str(old["run_id"])):  # "": written before ids
                raise UserError(f"{path} has run id {str(old['run_id'])[:40]!r}, not one this trainer makes "
                                "(12 hex digits); cannot resume this run")
        return old

    # ----- pieces of the loop --------------------------------------------------------------
    def write_final(self) -> dict:
        doc = final_doc(self.run_name, self.model_cfg.arch, self.tier, self.state.done, self.state.points)
        if self.dist.is_main:
            runlog.write_json(self.run_dir / runlog.FINAL, doc)
        return doc

    def train_step(self, pos: Position) -> tuple[dict, float]:
        """One optimizer update at ``pos``; returns its record and the seconds spent waiting for data."""
        cfg, device = self.cfg, self.dist.device
        step, target = pos.step, self.plan.target(pos.branch)
        lr = lr_at(step, target, cfg.schedule, cfg.lr, self.warmup, cfg.min_lr_ratio)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        t0 = time.perf_counter()
        x_np, y_np = self.corpus.train_batch(cfg.seed, step, cfg.batch_size, self.model_cfg.seq_len,
                                             self.dist.rank, self.dist.world)
        _check_ids((x_np, y_np), self.model_cfg.vocab_size, f"the training batch of step {step + 1}")
        x_all = torch.from_numpy(x_np).to(device, non_blocking=True)
        y_all = torch.from_numpy(y_np).to(device, non_blocking=True)
        data_wait = time.perf_counter() - t0
        params = [p for g in self.optimizer.param_groups for p in g["params"]]  # the (sharded) leaves
        stats, gnorm = train_step(self.model, self.optimizer, params, x_all, y_all, n_micro=self.n_micro,
                                  grad_clip=cfg.grad_clip, aux_coef=cfg.aux_coef, z_coef=cfg.z_coef,
                                  grad_sync=self.grad_sync, autocast=lambda: autocast(device))
        if self.dist.world > 1:
            torch.distributed.all_reduce(stats)
            stats = stats / self.dist.world
        loss, aux, z = (float(v) for v in stats.tolist())  # syncs the device
        if not math.isfinite(loss):
            # a diverged run is almost always a setting (lr, warm-up) the user chose: one line, exit 2
            raise UserError(f"training diverged: loss is {loss} at update {self.state.iter + 1} "
                            f"(step {step + 1}) with peak lr {cfg.lr:g}; lower the learning rate or "
                            "lengthen the warm-up (the last checkpoint is kept)")
        record = {"iter": self.state.iter + 1, "step": step + 1, "tokens": (step + 1) * self.tokens_per_step,
                  "branch": pos.branch, "train_loss": loss, "aux_loss": aux, "z_loss": z, "lr": lr,
                  "grad_norm": float(gnorm)}
        return record, data_wait

    def save(self) -> None:
        self.metrics.sync()
        self.checkpointer.save_latest(self.model, self.optimizer, self.state)

    # ----- the loop -------------------------------------------------------------------------
    def train(self) -> dict:
        cfg, s, plan = self.cfg, self.state, self.plan
        total = plan.total_steps * self.tokens_per_step
        report = self.progress or (lambda p: None)
        n_budgets = len(plan.budgets)

        def where(branch: int | None) -> dict:
            # the budget trained towards: the open cooldown's, else the next to finish on the trunk
            budget = branch if branch is not None else min(s.position.next_branch, n_budgets - 1)
            return {"iter": s.iter, "total_iters": plan.total_steps, "n_budgets": n_budgets,
                    "budget": budget, "branch": branch}

        report(Progress(self.run_name, s.iter * self.tokens_per_step, total, **where(s.position.branch)))
        fpt = self.acc.flops_per_token
        t_start, wall_base = time.perf_counter(), s.wall_s
        timer = {"train": 0.0, "tokens": 0, "data": 0.0}
        if s.iter == 0 and not s.done:
            s.position, opened = plan.start()
            if opened is not None:
                self.checkpointer.save_branch_point(opened, self.model, self.optimizer, s)
                self.save()
        try:
            while not s.done:
                reason = stop_requested()  # a safe point: nothing of update s.iter + 1 is written yet
                if reason is not None:
                    raise UserError(f"{reason}: stopped before update {s.iter + 1} without writing more; "
                                    "resume the run with --resume")
                t0 = time.perf_counter()
                record, data_wait = self.train_step(s.position)
                timer["train"] += time.perf_counter() - t0
                timer["tokens"] += self.tokens_per_step
                timer["data"] += data_wait
                s.position, up = plan.advance(s.position, cfg.eval_every)
                s.iter += 1
                s.tokens_seen += self.tokens_per_step
                if up.evaluate:
                    record.update(self.evaluator(self.model, self.corpus.bpb))
                    reshard(self.model)  # FSDP2's root stays gathered after a forward without backward
                    s.last_eval = {k: v for k, v in record.items() if k.startswith("val_") or k == "iter"}
                    s.best_val = min(record["val_loss"], s.best_val if s.best_val is not None else math.inf)
                s.wall_s = wall_base + time.perf_counter() - t_start
                if up.budget_end is not None:
                    record["budget_index"] = up.budget_end
                    point = _point(self.run_name, self.tier, self.proxy, self.model_cfg.arch, self.acc,
                                   plan.budgets[up.budget_end], record["val_loss"], record["val_bpb"],
                                   record["train_loss"], cfg.seed, s.wall_s)
                    s.points.append(point.to_dict())
                    if self.save_budget_weights:  # before the branch closes and the trunk returns
                        self.save_weights(runlog.budget_weights_path(self.run_dir, up.budget_end))
                if up.closed is not None:  # back to the trunk at the branch point
                    self.checkpointer.restore_branch_point(up.closed, self.model, self.optimizer)
                if up.opened is not None:
                    self.checkpointer.save_branch_point(up.opened, self.model, self.optimizer, s)
                tps = timer["tokens"] / timer["train"] if timer["train"] > 0 else None
                record.update(tokens_per_s=tps, wall_s=s.wall_s, data_wait_s=timer["data"],
                              peak_mem_bytes=peak_memory_bytes(self.dist.device))
                if self.peak_flops is not None and tps is not None:
                    record["mfu"] = mfu(tps, fpt, self.peak_flops, self.dist.world)
                if s.iter % cfg.log_every == 0 or up.evaluate or s.done:
                    self.metrics.log(record)
                    s.metrics_lines += 1   # never None here: a resume seeds an old checkpoint's
                    if up.budget_end is not None:
                        self.write_final()
                report(Progress(self.run_name, s.iter * self.tokens_per_step, total, tps,
                                record["train_loss"], s.last_eval.get("val_loss") if s.last_eval else None,
                                mfu=record.get("mfu"), peak_mem_bytes=record["peak_mem_bytes"],
                                **where(record["branch"])))
                if self.after_update is not None:  # its line and point are written, its checkpoint not yet
                    self.after_update(s)
                if up.budget_end is not None or up.opened is not None or self.checkpointer.due(s):
                    self.save()
                if s.iter % cfg.log_every == 0:
                    timer = {"train": 0.0, "tokens": 0, "data": 0.0}
            self.checkpointer.close()
        finally:
            self.metrics.close()
        return self.write_final()

    def save_weights(self, path: Path | None = None) -> None:
        """Gather the full weights and write one safetensors file (rank 0; default: the final weights)."""
        full = full_state_dict(self.model)
        if self.dist.is_main:
            path = self.run_dir / runlog.WEIGHTS if path is None else path
            path.parent.mkdir(exist_ok=True)
            runlog.save_weights(path, full,
                                {"run": self.run_name, "arch": self.model_cfg.arch, "tier": self.tier})
        self.dist.barrier()


def train(model_cfg: ModelConfig, train_cfg: TrainConfig, *, tier: str = "custom", proxy: bool | None = None,
          run_name: str | None = None, runs_dir: str | Path = "runs", ckpt_dir: str | Path | None = None,
          resume: bool = False, overwrite: bool = False, save_final_weights: bool = False,
          save_budget_weights: bool = False, progress: Callable[[Progress], None] | None = None,
          data_cache: str | Path | None = None,
          after_update: Callable[[TrainState], None] | None = None) -> dict:
    """Train one model; returns the final.json document (plus ``run_dir`` and ``ckpt_dir``).

    ``resume=True`` continues an existing run from its last checkpoint (a complete run returns its
    final.json at once) and refuses a run folder that holds no run. ``ckpt_dir`` is a parent folder
    for checkpoints (default: ``<run_dir>/checkpoints``). ``save_budget_weights`` writes each budget's
    final weights to ``<run_dir>/weights/budget-<i>.safetensors`` as its cooldown branch ends
    (a resumed run rewrites the ones after its checkpoint). ``progress`` is called after every
    update with a :class:`Progress`. ``after_update`` (every rank) is called with the
    :class:`TrainState` after each update once its metrics line (and, at a budget end, its
    final.json point) is durable and before its checkpoint: the most adversarial moment for a
    crash, where the kill-and-resume tests kill the process (tests/killing_cli.py). Raises
    UserError for bad input (an existing run without resume/overwrite, a budget below one step, an
    unwritable folder, a checkpoint of another run, ...), before creating any folder where it can.
    """
    dist = setup_distributed(train_cfg.device, train_cfg.parallel, replicate=train_cfg.replicate,
                             ep=train_cfg.ep)
    lock = RunLock()
    try:
        trainer = Trainer(model_cfg, train_cfg, dist, tier=tier, proxy=proxy, run_name=run_name,
                          runs_dir=Path(runs_dir), ckpt_dir=ckpt_dir, resume=resume, overwrite=overwrite,
                          progress=progress, data_cache=data_cache, save_budget_weights=save_budget_weights,
                          lock=lock, after_update=after_update)
        doc = trainer.train()
        if save_final_weights:
            trainer.save_weights()
        # every rank done before any destroys the process group (only on success: a rank that
        # failed must exit, for the launcher to stop the others, not wait here)
        dist.barrier()
        return {**doc, "run_dir": str(trainer.run_dir), "ckpt_dir": str(trainer.ckpt_dir)}
    finally:
        lock.release()
        dist.close()
