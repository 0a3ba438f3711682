"""`smelt-scale train`: train one tier/arch on the corpus, one (N, D, loss) point per token budget."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, Callable, Literal, Optional

import typer
from rich.markup import escape

from scaling.accounting.config import HEAD_PADDING
from scaling.accounting.memory import GRAD_SYNCS, LOOP_GRADS, MODES
from scaling.accounting.tiers import ARCHS, TIERS
from scaling.cli._util import emit_json, run_cli, setup_logging, show_progress, stderr, stdout
from scaling.common.errors import UserError
from scaling.common.run_folder import CONFIG, METRICS
from scaling.training.schema import check_name

# Choice options: typer lists the values in --help, completes them and refuses others (exit 2).
# SCHEDULES is spelled out, not imported: it lives in a torch module, which --help must not load;
# tests/test_cluster_use.py keeps it equal to training.loop.branches.SCHEDULES. The parallel
# choices are the torch-free planner's (scaling.accounting.memory).
SCHEDULES = ("wsd", "cosine")
TierName = Literal[tuple(TIERS)]
ArchName = Literal[ARCHS]
ScheduleName = Literal[SCHEDULES]
ParallelMode = Literal[MODES]
GradSync = Literal[GRAD_SYNCS]
LoopGrad = Literal[LOOP_GRADS]
HeadPadding = Literal[HEAD_PADDING]

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


# How a `train` option differs from its TrainConfig field (scaling.training.loop.config, which
# gives the name, default and help): its command-line type (a choice, a path, text parsed by
# _setting), a flag that is not --<field-name>, a lower bound shown in --help.
_OPTION_TYPES: dict[str, Any] = {"schedule": ScheduleName, "parallel": ParallelMode,
                                 "grad_sync": Optional[GradSync], "loop_grad": Optional[LoopGrad],
                                 "head_padding": HeadPadding,
                                 "data": Optional[Path],
                                 "data_tokenizer": Optional[Path], "peak_flops": Optional[str], "log_to": str}
_FLAGS = {"data_verify": ("--verify-data",), "compile": ("--compile/--no-compile",)}
_MIN = {"seed": 0}


def _config_options() -> list[inspect.Parameter]:
    """One keyword parameter with its typer.Option per TrainConfig field that is an option."""
    from scaling.training.loop.config import field_types, option_fields

    hints = field_types()
    params = []
    for f in option_fields():
        kind = _OPTION_TYPES.get(f.name, hints[f.name])
        default = ",".join(f.default) if f.name == "log_to" else f.default
        decls = _FLAGS.get(f.name) or ((f"--{f.name.replace('_', '-')}",) if kind is bool else ())
        extra = {"min": _MIN[f.name]} if f.name in _MIN else {}
        option = typer.Option(default, *decls, help=f.metadata["help"], **extra)
        params.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=option,
                                        annotation=kind))
    return params


def _setting(name: str, value: Any) -> Any:
    """A TrainConfig field's value from its option's."""
    if name == "log_to":
        return tuple(t.strip() for t in value.split(",") if t.strip())
    if name in ("data", "data_tokenizer"):
        return None if value is None else str(value)
    return value


def _with_config_options(fn: Callable, after: str) -> Callable:
    """``fn`` (whose ``**settings`` take the TrainConfig options) with those options in its signature,
    after the parameter ``after``: typer reads the signature."""
    sig = inspect.signature(fn, eval_str=True)
    fixed = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    at = [p.name for p in fixed].index(after) + 1
    fixed = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in fixed]
    params = [*fixed[:at], *_config_options(), *fixed[at:]]
    fn.__signature__ = sig.replace(parameters=params)
    fn.__annotations__ = {p.name: p.annotation for p in params}
    return fn


def _given(ctx: typer.Context, param: str) -> bool:
    """Whether a parameter was given on the command line (typer may vendor click: compare by name)."""
    source = ctx.get_parameter_source(param)
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT", "PROMPT")


def _progress(json_out: bool, quiet: bool, every: int) -> tuple[Optional[_Bar], Any]:
    """The trainer's progress callback: a bar on a terminal, else a log line every ``every`` updates."""
    bar = _Bar() if show_progress(json_out, quiet) else None
    if bar is None and not quiet:
        from scaling.training.loop.progress import ProgressLog

        setup_logging()
        return None, ProgressLog(every=every)
    return bar, bar


def register(app: typer.Typer) -> None:
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
        ckpt_dir: Optional[Path] = typer.Option(
            None, help="Checkpoint parent folder, one <run-name>-<run-id> folder per run "
            "[default: <runs-dir>/<run-name>/checkpoints]."
        ),
        progress_every: int = typer.Option(
            100, min=1, help="When stderr is not a terminal (Slurm, nohup, CI): a progress line every this "
            "many updates, and at least every 60 s (logger scaling.progress)."
        ),
        resume: bool = typer.Option(
            False, "--resume",
            help="Continue an existing run from its last checkpoint (an error if the run does not exist).",
        ),
        overwrite: bool = typer.Option(
            False, "--overwrite", help="Delete an existing run of this name first."
        ),
        save_final_weights: bool = typer.Option(
            False, "--save-final-weights", help="Also write final weights (safetensors) into the run folder."
        ),
        save_budget_weights: bool = typer.Option(
            False, "--save-budget-weights", help="Also write each budget's final weights, as its cooldown "
            "branch ends, to weights/budget-<i>.safetensors (for export/eval at every budget)."
        ),
        quiet: bool = typer.Option(False, "--quiet", help="No progress bar or messages."),
        json_out: bool = typer.Option(
            False, "--json", help="Print final.json (one JSON document) on stdout."
        ),
        **settings: Any,
    ) -> None:
        """Train a Baseline or SMELT model; write <runs-dir>/<name>/{config.json, metrics.jsonl, final.json}.

        With the WSD schedule one run yields one (N, D, loss) point per budget: the stable trunk runs to the
        largest budget and a cooldown branch is taken at each smaller one.

        Runs under torchrun (or a multi-task submitit job) train data-parallel: --parallel ddp, fsdp
        (FSDP2, sharded) or hsdp; none means DDP there (gloo on CPU, nccl on CUDA). A killed run
        continues with --resume and logs exactly what an uninterrupted run logs (see the README,
        "What happens when things go wrong"); --resume on a run that does not exist is an error.
        """
        from scaling.accounting.tiers import get_config, is_proxy
        from scaling.training.loop.config import TrainConfig
        from scaling.training.loop.trainer import default_run_name, train
        from scaling.training.sweep.plan import read_train_file

        model_cfg = get_config(tier, arch)
        # with --config, the file's values except where a flag was given on the command line
        given = {k: _setting(k, v) for k, v in settings.items() if config is None or _given(ctx, k)}
        if tokens is not None:
            given["tokens"] = parse_tokens(tokens)
        tables: tuple[dict, ...] = ({}, {}, {})
        if config is not None:
            *tables, options = read_train_file(config)
            if not _given(ctx, "save_final_weights"):
                save_final_weights = bool(options.get("save_final_weights", save_final_weights))
        if given.get("tokens", tables[0].get("tokens")) is None:
            raise UserError("give the token budget(s): --tokens 2e5,4e5 (or [train] tokens in --config)")
        cfg = TrainConfig.from_tables(*tables, str(config or "the command line"), **given)
        if run_name is not None:   # before any look at the folder, whose name it would be
            check_name(run_name, "run name")
        _check_flags(runs_dir / (run_name or default_run_name(tier, arch, cfg)), resume, overwrite)
        bar, progress = _progress(json_out, quiet, progress_every)
        try:
            doc = train(model_cfg, cfg, tier=tier, proxy=is_proxy(tier), run_name=run_name, runs_dir=runs_dir,
                        ckpt_dir=ckpt_dir, resume=resume, overwrite=overwrite,
                        save_final_weights=save_final_weights, save_budget_weights=save_budget_weights,
                        progress=progress)
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

    app.command("train")(run_cli(_with_config_options(train_cmd, after="runs_dir")))
