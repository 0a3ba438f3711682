"""`smelt-scale train`: train one tier/arch on the corpus, one (N, D, loss) point per token budget."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import typer
from rich.markup import escape

from scaling.accounting.tiers import ARCHS, TIERS
from scaling.cli._util import emit_json, run_cli, setup_logging, show_progress, stderr, stdout
from scaling.common.errors import UserError
from scaling.common.run_folder import CONFIG, METRICS

# Choice options: typer lists the values in --help, completes them and refuses others (exit 2).
# Spelled out, not imported: the library's tuples live in torch modules, which --help must not
# load; tests/test_cluster_use.py keeps them equal to training.loop.branches.SCHEDULES,
# distributed.PARALLEL_MODES, parallel.GRAD_SYNC and loop_grad.LOOP_GRADS.
SCHEDULES = ("wsd", "cosine")
PARALLEL_MODES = ("none", "ddp", "fsdp", "hsdp")
GRAD_SYNC = ("last", "every")
LOOP_GRADS = ("per-pass", "fsdp")
TierName = Literal[tuple(TIERS)]
ArchName = Literal[ARCHS]
ScheduleName = Literal[SCHEDULES]
ParallelMode = Literal[PARALLEL_MODES]
GradSync = Literal[GRAD_SYNC]
LoopGrad = Literal[LOOP_GRADS]

# Not "runs": the shipped study lives there and fit/compare/savings read it by default; one extra
# run in it changes their answers (issue 29).
DEFAULT_RUNS_DIR = "runs-mine"


def parse_tokens(text: str) -> tuple[float, ...]:
    """'2e5,4e5' -> (200000.0, 400000.0); UserError on anything else."""
    try:
        values = tuple(float(t) for t in text.replace(" ", "").split(",") if t)
    except ValueError:
        raise UserError(f"--tokens must be comma-separated numbers like 2e5,4e5, got {text!r}") from None
    if not values or any(not 0 < v < float("inf") for v in values):
        raise UserError(f"--tokens must be positive finite numbers, got {text!r}")
    return values


def _table(doc: dict):
    from rich.table import Table

    t = Table(
        title=f"{doc['run']} ({doc['arch']}, {doc['tier']})" + ("" if doc["complete"] else " - incomplete")
    )
    for col in ("budget", "D (tokens)", "N (active)", "val loss", "val bpb", "FLOPs", "wall s"):
        t.add_column(col, justify="right")
    for p in doc["points"]:
        t.add_row(
            str(p["budget_index"]),
            f"{p['D']:,}",
            f"{p['N']:,}",
            f"{p['loss']:.4f}",
            "-" if p["val_bpb"] is None else f"{p['val_bpb']:.4f}",
            f"{p['flops']:.3e}",
            f"{p['wall_s']:.1f}",
        )
    return t


class _Bar:
    """The rich progress bar (tokens, tokens/s, loss, ETA) fed by the trainer's progress callback."""

    def __init__(self):
        self.bar = self.task = None

    def __call__(self, p) -> None:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        if self.bar is None:
            self.bar = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(bar_width=16),
                TextColumn("{task.percentage:>3.0f}% {task.fields[tps]} tok/s loss {task.fields[loss]}"
                           " val {task.fields[val]}"),
                TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=stderr)
            self.task = self.bar.add_task(escape(p.run), total=p.tokens_total, tps="-", loss="-", val="-")
            self.bar.start()
        # which budget and which part of the WSD walk (trunk or a cooldown branch) runs now
        where = f"budget {p.budget + 1}/{p.n_budgets} {p.phase}" if p.budget is not None else ""
        fields = {"description": escape(f"{p.run} {where}".strip())}
        if p.tokens_per_s is not None:
            fields["tps"] = f"{p.tokens_per_s:,.0f}"
        if p.train_loss is not None:
            fields["loss"] = f"{p.train_loss:.3f}"
        if p.val_loss is not None:
            fields["val"] = f"{p.val_loss:.3f}"
        self.bar.update(self.task, completed=p.tokens_done, **fields)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _check_flags(folder: Path, resume: bool, overwrite: bool) -> None:
    """The run-folder refusals, worded with the flags (the library names the quantities)."""
    holds = (folder / CONFIG).exists() or (folder / METRICS).exists()
    if resume and overwrite:
        raise UserError("--resume and --overwrite exclude each other")
    if holds and not (resume or overwrite):
        raise UserError(f"run folder {folder} already holds a run; pass --resume to continue it "
                        "or --overwrite to start again")
    if resume and not holds:
        raise UserError(f"--resume: no run to resume in {folder}; start it without --resume")


def register(app: typer.Typer) -> None:
    @app.command("train")
    @run_cli
    def train_cmd(
        ctx: typer.Context,
        tier: TierName = typer.Option(..., help="Model tier (see `smelt-scale tiers`)."),
        arch: ArchName = typer.Option(..., help="Baseline MoE or its compute-matched looped twin."),
        tokens: Optional[str] = typer.Option(
            None, help="Token budget(s), comma-separated, e.g. 2e5,4e5: one point each (required unless "
            "--config sets [train] tokens)."
        ),
        config: Optional[Path] = typer.Option(
            None, "--config", help="TOML file with [train], [data] and [parallel] tables, as in a sweep plan "
            "(a plan file works: its sweep tables are not read); flags given on the command line override "
            "it. [parallel] mode/grad_sync/replicate set --parallel/--grad-sync/--replicate; its other keys "
            "describe a sweep's launch (torchrun decides it here)."
        ),
        run_name: Optional[str] = typer.Option(
            None, help="Run folder name [default: <tier>-<arch>-<D_max>-s<seed>]."
        ),
        runs_dir: Path = typer.Option(
            Path(DEFAULT_RUNS_DIR), help="Parent folder of run folders (not runs/: that holds the shipped "
            "study, which fit, compare and savings read by default)."
        ),
        batch_size: int = typer.Option(16, help="Global batch in sequences of seq_len tokens."),
        micro_batch_size: Optional[int] = typer.Option(
            None, help="Sequences per forward on one rank (gradient accumulation) [default: whole batch]."
        ),
        lr: float = typer.Option(3e-3, help="Peak learning rate."),
        warmup: Optional[int] = typer.Option(
            None, help="Warmup steps [default: 10% of the smallest budget's steps, at most 1000]."
        ),
        schedule: ScheduleName = typer.Option(
            "wsd", help="wsd (branches a cooldown at every budget) or cosine (one budget)."
        ),
        decay_fraction: float = typer.Option(0.2, help="WSD cooldown length as a fraction of each budget."),
        weight_decay: float = typer.Option(0.1, help="AdamW decoupled weight decay (matrices only)."),
        grad_clip: float = typer.Option(1.0, help="Global gradient-norm clip (0: off)."),
        seed: int = typer.Option(0, min=0, help="Seed of the initial weights and of the batch order."),
        eval_every: int = typer.Option(
            250, help="Validate every this many trunk steps (0: only at budget ends)."
        ),
        val_windows: Optional[int] = typer.Option(
            None, help="Validation windows [default: the whole split]."
        ),
        ckpt_every: int = typer.Option(100, help="Checkpoint every this many updates."),
        ckpt_dir: Optional[Path] = typer.Option(
            None, help="Checkpoint parent folder, one <run-name>-<run-id> folder per run "
            "[default: <runs-dir>/<run-name>/checkpoints]."
        ),
        async_ckpt: bool = typer.Option(
            False, "--async-ckpt", help="Write periodic checkpoints in the background."
        ),
        log_every: int = typer.Option(1, help="Metrics line every this many updates."),
        progress_every: int = typer.Option(
            100, min=1, help="When stderr is not a terminal (Slurm, nohup, CI): a progress line every this "
            "many updates, and at least every 60 s (logger scaling.progress)."
        ),
        log_to: str = typer.Option(
            "jsonl", help="Comma-separated: jsonl plus tensorboard and/or wandb mirrors (extra [track])."
        ),
        peak_flops: Optional[str] = typer.Option(
            None, help="Peak FLOP/s of one device for MFU: a number or h100-sxm-bf16, h200-bf16, a100-bf16."
        ),
        mfu: bool = typer.Option(False, "--mfu", help="Require MFU in the log (needs --peak-flops)."),
        val_by_source: bool = typer.Option(
            False, "--val-by-source", help="Also log val_loss/<source> per data source."
        ),
        parallel: ParallelMode = typer.Option(
            "none", help="none (DDP under torchrun), ddp, fsdp or hsdp."
        ),
        activation_checkpointing: bool = typer.Option(
            False, "--activation-checkpointing", help="Recompute each layer pass in the backward."
        ),
        compile_model: Optional[bool] = typer.Option(
            None, "--compile/--no-compile",
            help="torch.compile the model's blocks [default: on CUDA, off on the CPU].",
        ),
        grad_sync: Optional[GradSync] = typer.Option(
            None, help="Reduce gradients on the last micro-batch only (last) or after each (every: FSDP "
            "keeps them sharded) [default: every under fsdp/hsdp, else last]."
        ),
        replicate: Optional[int] = typer.Option(
            None, help="HSDP replicate degree [default: the number of nodes]."
        ),
        ep: int = typer.Option(
            1, help="Expert-parallel degree (fsdp/hsdp): each rank holds 1/ep of the experts, tokens "
            "reach them by all-to-all; must divide the ranks [default: 1, no expert parallelism]."
        ),
        loop_grad: Optional[LoopGrad] = typer.Option(
            None, help="Looped layers' gradients under fsdp/hsdp: reduce-scattered after each pass "
            "(per-pass) or by FSDP2 after the last (fsdp, holds them unsharded) [default: per-pass]."
        ),
        resume: bool = typer.Option(
            False, "--resume",
            help="Continue an existing run from its last checkpoint (an error if the run does not exist).",
        ),
        overwrite: bool = typer.Option(
            False, "--overwrite", help="Delete an existing run of this name first."
        ),
        device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
        threads: Optional[int] = typer.Option(None, help="torch CPU threads [default: torch's]."),
        save_final_weights: bool = typer.Option(
            False, "--save-final-weights", help="Also write final weights (safetensors) into the run folder."
        ),
        save_budget_weights: bool = typer.Option(
            False, "--save-budget-weights", help="Also write each budget's final weights, as its cooldown "
            "branch ends, to weights/budget-<i>.safetensors (for export/eval at every budget)."
        ),
        data: Optional[Path] = typer.Option(
            None, help="Token-shard folder made by `smelt-scale prepare-data` [default: the built-in corpus]."
        ),
        data_tokenizer: Optional[Path] = typer.Option(
            None, help="Refuse --data unless its shards were made with this tokenizer.json."
        ),
        data_max_bytes: Optional[int] = typer.Option(
            None, help="Use a small deterministic subset of the built-in corpus (tests)."
        ),
        verify_data: str = typer.Option(
            "cheap", help="Shard check at start: cheap (hash only shards whose size or mtime changed since "
            "their last check) or full (hash every shard: catches bit rot that keeps the mtime)."
        ),
        quiet: bool = typer.Option(False, "--quiet", help="No progress bar or messages."),
        json_out: bool = typer.Option(
            False, "--json", help="Print final.json (one JSON document) on stdout."
        ),
    ) -> None:
        """Train a Baseline or SMELT model; write runs/<name>/{config.json, metrics.jsonl, final.json}.

        With the WSD schedule one run yields one (N, D, loss) point per budget: the stable trunk runs to the
        largest budget and a cooldown branch is taken at each smaller one.

        Runs under torchrun (or a multi-task submitit job) train data-parallel: --parallel ddp, fsdp
        (FSDP2, sharded) or hsdp; none means DDP there (gloo on CPU, nccl on CUDA). A killed run
        continues with --resume and logs exactly what an uninterrupted run logs (see the README,
        "What happens when things go wrong"); --resume on a run that does not exist is an error.
        """
        from scaling.accounting.tiers import get_config, is_proxy
        from scaling.training.loop.trainer import TrainConfig, default_run_name, train

        model_cfg = get_config(tier, arch)
        values = {  # TrainConfig field -> (command-line parameter, its value)
            "tokens": ("tokens", parse_tokens(tokens) if tokens is not None else None),
            "batch_size": ("batch_size", batch_size),
            "micro_batch_size": ("micro_batch_size", micro_batch_size),
            "lr": ("lr", lr),
            "warmup": ("warmup", warmup),
            "schedule": ("schedule", schedule),
            "decay_fraction": ("decay_fraction", decay_fraction),
            "weight_decay": ("weight_decay", weight_decay),
            "grad_clip": ("grad_clip", grad_clip),
            "seed": ("seed", seed),
            "eval_every": ("eval_every", eval_every),
            "val_windows": ("val_windows", val_windows),
            "ckpt_every": ("ckpt_every", ckpt_every),
            "log_every": ("log_every", log_every),
            "data": ("data", str(data) if data is not None else None),
            "data_tokenizer": ("data_tokenizer", str(data_tokenizer) if data_tokenizer is not None else None),
            "data_max_bytes": ("data_max_bytes", data_max_bytes),
            "data_verify": ("verify_data", verify_data),
            "device": ("device", device),
            "threads": ("threads", threads),
            "async_ckpt": ("async_ckpt", async_ckpt),
            "log_to": ("log_to", tuple(t.strip() for t in log_to.split(",") if t.strip())),
            "peak_flops": ("peak_flops", peak_flops),
            "mfu": ("mfu", mfu),
            "val_by_source": ("val_by_source", val_by_source),
            "parallel": ("parallel", parallel),
            "activation_checkpointing": ("activation_checkpointing", activation_checkpointing),
            "compile": ("compile_model", compile_model),
            "grad_sync": ("grad_sync", grad_sync),
            "replicate": ("replicate", replicate),
            "ep": ("ep", ep),
            "loop_grad": ("loop_grad", loop_grad),
        }
        fields = {k: v for k, (_, v) in values.items()}
        if config is not None:  # the file's values, except where a flag was given on the command line
            from scaling.training.sweep.plan import read_train_file

            def given(param: str) -> bool:  # typer may vendor click: compare the enum by name
                source = ctx.get_parameter_source(param)
                return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT", "PROMPT")

            file_fields, options = read_train_file(config)
            fields.update({k: v for k, v in file_fields.items() if not given(values[k][0])})
            if not given("save_final_weights"):
                save_final_weights = bool(options.get("save_final_weights", save_final_weights))
        if fields["tokens"] is None:
            raise UserError("give the token budget(s): --tokens 2e5,4e5 (or [train] tokens in --config)")
        cfg = TrainConfig(**fields)
        _check_flags(runs_dir / (run_name or default_run_name(tier, arch, cfg)), resume, overwrite)
        bar = _Bar() if show_progress(json_out, quiet) else None
        progress = bar
        if bar is None and not quiet:
            from scaling.training.loop.progress import ProgressLog

            setup_logging()
            progress = ProgressLog(every=progress_every)
        try:
            doc = train(
                model_cfg,
                cfg,
                tier=tier,
                proxy=is_proxy(tier),
                run_name=run_name,
                runs_dir=runs_dir,
                ckpt_dir=ckpt_dir,
                resume=resume,
                overwrite=overwrite,
                save_final_weights=save_final_weights,
                save_budget_weights=save_budget_weights,
                progress=progress,
            )
        finally:
            if bar is not None:
                bar.close()
        from scaling.training.parallel.distributed import launch_rank

        if launch_rank() != 0:
            return
        if json_out:
            emit_json(doc)
        elif not quiet:
            stdout.print(_table(doc))
            stdout.print(f"run folder: {doc['run_dir']}")
