"""`smelt-scale train`: train one tier/arch on the corpus, one (N, D, loss) point per token budget."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from scaling.cli._util import emit_json, run_cli, show_progress, stdout
from scaling.common.errors import UserError


def parse_tokens(text: str) -> tuple[float, ...]:
    """'2e5,4e5' -> (200000.0, 400000.0); UserError on anything else."""
    try:
        values = tuple(float(t) for t in text.replace(" ", "").split(",") if t)
    except ValueError:
        raise UserError(f"--tokens must be comma-separated numbers like 2e5,4e5, got {text!r}") from None
    if not values or any(not v > 0 for v in values):
        raise UserError(f"--tokens must be positive numbers, got {text!r}")
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


def register(app: typer.Typer) -> None:
    @app.command("train")
    @run_cli
    def train_cmd(
        tier: str = typer.Option(..., help="Model tier, e.g. proxy-xs (see `smelt-scale tiers`)."),
        arch: str = typer.Option(..., help="baseline or smelt."),
        tokens: str = typer.Option(
            ..., help="Token budget(s), comma-separated, e.g. 2e5,4e5: one point each."
        ),
        run_name: Optional[str] = typer.Option(
            None, help="Run folder name [default: <tier>-<arch>-<D_max>-s<seed>]."
        ),
        runs_dir: Path = typer.Option(Path("runs"), help="Parent folder of run folders."),
        batch_size: int = typer.Option(16, help="Global batch in sequences of seq_len tokens."),
        micro_batch_size: Optional[int] = typer.Option(
            None, help="Sequences per forward on one rank (gradient accumulation) [default: whole batch]."
        ),
        lr: float = typer.Option(3e-3, help="Peak learning rate."),
        warmup: Optional[int] = typer.Option(
            None, help="Warmup steps [default: 10% of the smallest budget's steps, at most 1000]."
        ),
        schedule: str = typer.Option(
            "wsd", help="wsd (branches a cooldown at every budget) or cosine (one budget)."
        ),
        decay_fraction: float = typer.Option(0.2, help="WSD cooldown length as a fraction of each budget."),
        weight_decay: float = typer.Option(0.1, help="AdamW decoupled weight decay (matrices only)."),
        grad_clip: float = typer.Option(1.0, help="Global gradient-norm clip (0: off)."),
        seed: int = typer.Option(0, help="Seed of the initial weights and of the batch order."),
        eval_every: int = typer.Option(
            250, help="Validate every this many trunk steps (0: only at budget ends)."
        ),
        val_windows: Optional[int] = typer.Option(
            None, help="Validation windows [default: the whole split]."
        ),
        ckpt_every: int = typer.Option(100, help="Checkpoint every this many updates."),
        ckpt_dir: Optional[Path] = typer.Option(
            None, help="Checkpoint parent folder [default: $SMELT_CACHE/checkpoints]."
        ),
        log_every: int = typer.Option(1, help="Metrics line every this many updates."),
        resume: bool = typer.Option(
            False, "--resume", help="Continue an existing run from its last checkpoint."
        ),
        overwrite: bool = typer.Option(
            False, "--overwrite", help="Delete an existing run of this name first."
        ),
        device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
        threads: Optional[int] = typer.Option(None, help="torch CPU threads [default: torch's]."),
        save_final_weights: bool = typer.Option(
            False, "--save-final-weights", help="Also write final weights (safetensors) into the run folder."
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
        quiet: bool = typer.Option(False, "--quiet", help="No progress bar or messages."),
        json_out: bool = typer.Option(
            False, "--json", help="Print final.json (one JSON document) on stdout."
        ),
    ) -> None:
        """Train a Baseline or SMELT model; write runs/<name>/{config.json, metrics.jsonl, final.json}.

        With the WSD schedule one run yields one (N, D, loss) point per budget: the stable trunk runs to the
        largest budget and a cooldown branch is taken at each smaller one.

        Runs under torchrun use DDP (gloo on CPU, nccl on CUDA). A killed run continues with --resume and
        logs exactly what an uninterrupted run logs.
        """
        from scaling.accounting.tiers import get_config, is_proxy
        from scaling.training.trainer import TrainConfig, train

        model_cfg = get_config(tier, arch)
        cfg = TrainConfig(
            tokens=parse_tokens(tokens),
            batch_size=batch_size,
            micro_batch_size=micro_batch_size,
            lr=lr,
            warmup=warmup,
            schedule=schedule,
            decay_fraction=decay_fraction,
            weight_decay=weight_decay,
            grad_clip=grad_clip,
            seed=seed,
            eval_every=eval_every,
            val_windows=val_windows,
            ckpt_every=ckpt_every,
            log_every=log_every,
            data=str(data) if data is not None else None,
            data_tokenizer=str(data_tokenizer) if data_tokenizer is not None else None,
            data_max_bytes=data_max_bytes,
            device=device,
            threads=threads,
        )
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
            progress=show_progress(json_out, quiet),
        )
        import os

        if int(os.environ.get("RANK", "0")) != 0:
            return
        if json_out:
            emit_json(doc)
        elif not quiet:
            stdout.print(_table(doc))
            stdout.print(f"run folder: {doc['run_dir']}")
