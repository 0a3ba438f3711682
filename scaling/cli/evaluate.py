"""`smelt-scale export` (a run as a Hugging Face Mixtral folder) and `smelt-scale eval` (lm-eval, offline)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from scaling.cli._util import (
    FORCE_HELP,
    check_distinct,
    check_output_dir,
    check_output_file,
    emit_json,
    run_cli,
    stderr,
    stdout,
)
from scaling.common.device import check_threads
from scaling.common.errors import UserError


def _fmt(v, spec: str = ".4f") -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def print_rows(rows: list[dict]) -> None:
    table = Table(title_justify="left")
    for c in ("run", "budget", "N", "D", "loss", "task", "metric", "value", "s.e.", "n"):
        table.add_column(c, justify="left" if c in ("run", "task", "metric") else "right", no_wrap=True)
    for r in rows:
        table.add_row(
            r["run"],
            _fmt(r.get("budget_index")),
            _fmt(r.get("N"), ".3g"),
            _fmt(r.get("D"), ".3g"),
            _fmt(r.get("loss")),
            r["task"],
            r["metric"],
            _fmt(r.get("value")),
            _fmt(r.get("stderr")),
            _fmt(r.get("n")),
        )
    stdout.print(table)


def _floor(text: str) -> float | None:
    """--floor: a number, or None for "free" (fitted)."""
    if text.strip() == "free":
        return None
    try:
        return float(text)
    except ValueError:
        raise UserError(f"--floor must be a number or 'free', got {text!r}") from None


def register(app: typer.Typer) -> None:
    @app.command("export")
    @run_cli
    def export_cmd(
        run: Path = typer.Argument(..., help="Run folder (runs/<name>)."),
        out: Path = typer.Option(..., "--out", help="Folder to write (must not exist, or be empty)."),
        budget: Optional[int] = typer.Option(
            None, "--budget", help="Budget index (0 = smallest) [default: the largest]."
        ),
        checkpoint: Optional[Path] = typer.Option(
            None,
            "--checkpoint",
            help="Export this DCP checkpoint folder of the run (checkpoints/iter-N) instead.",
        ),
        dtype: str = typer.Option("fp32", "--dtype", help="Weights dtype: fp32 or bf16."),
        overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --out folder."),
        json_out: bool = typer.Option(False, "--json", help="Print the smelt_scale block as JSON."),
    ) -> None:
        """Export a run as a plain Hugging Face Mixtral folder (AutoModelForCausalLM loads it).

        A looped SMELT model is written unrolled: one Mixtral layer per layer pass, each a copy of its
        physical layer with the 1/r residual scale folded into its attention output and expert down
        projections (exact). Odd head sizes (partial rotary) and shared experts cannot be written as
        Mixtral and are refused: evaluate those with `eval --backend native`.
        """
        from scaling.evaluation.export import export_run

        check_output_dir(out.parent, "folder of --out")
        block = export_run(run, out, budget=budget, checkpoint=checkpoint, dtype=dtype, overwrite=overwrite)
        if json_out:
            emit_json({"out": str(out), "smelt_scale": block})
        else:
            src = block["source_weights"]
            which = "checkpoint" if block["budget"] is None else f"budget {block['budget']}"
            stdout.print(
                f"exported {block['run']} ({block['arch']}, {which}, "
                f"{len(block['loop']['hf_layers'])} Mixtral layers, {dtype}) from {src['kind']} "
                f"weights {src['sha256'][:12]} to {out}",
                highlight=False,
            )

    @app.command("eval")
    @run_cli
    def eval_cmd(
        runs: list[Path] = typer.Argument(..., help="Run folders."),
        tasks: str = typer.Option(
            ...,
            "--tasks",
            help="Comma-separated task names: folders of --data "
            "(arc_easy, arc_challenge, hellaswag, piqa, mmlu_<subject>, humaneval, mbpp, "
            'or any name whose records have a "text" field).',
        ),
        data: Path = typer.Option(
            ..., "--data", help="Local data folder: <data>/<task>/<split>.jsonl|.parquet."
        ),
        backend: str = typer.Option(
            "native",
            "--backend",
            help="native (our forward; every tier) or hf "
            "(the run exported to Mixtral, read by lm-eval's hf backend).",
        ),
        budget: Optional[str] = typer.Option(
            None, "--budget", help="Budget indices (0,2) or 'all' [default: the largest]."
        ),
        checkpoint: Optional[Path] = typer.Option(
            None,
            "--checkpoint",
            help="Evaluate this DCP checkpoint folder of the (one) run instead of budget weights.",
        ),
        limit: Optional[int] = typer.Option(None, "--limit", min=1, max=10**9,
                                            help="At most this many documents per task."),
        num_fewshot: Optional[int] = typer.Option(
            None, "--num-fewshot", help="Few-shot examples [default: each task's]."
        ),
        device: str = typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N."),
        batch_size: int = typer.Option(16, "--batch-size", help="Requests per forward."),
        threads: Optional[int] = typer.Option(
            None, "--threads", help="torch CPU threads [default: torch's]."
        ),
        allow_code: bool = typer.Option(
            False,
            "--allow-code-execution",
            help="Run model-generated programs "
            "(humaneval, mbpp), each in its own subprocess with a timeout.",
        ),
        out: Optional[Path] = typer.Option(
            None, "--out", help="Also write the rows (.csv, .jsonl or .json)."
        ),
        force: bool = typer.Option(False, "--force", help=FORCE_HELP),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON object: {\"rows\": [...]}."),
    ) -> None:
        """Evaluate runs on local tasks through lm-eval, fully offline.

        One row per (run, budget, task, metric): value, s.e. and documents n, beside the run's N, D,
        C (flops) and validation loss at that budget, and each task's bits per byte of the gold answer
        (bpb_gold). The table (--out) has the trainer's column names, so `fit` and `calibrate` read it.
        """
        from scaling.evaluation.run import EvalSettings, evaluate_runs, parse_budgets, write_table

        seen = Counter(Path(r).resolve() for r in runs)
        twice = sorted(str(p) for p, n in seen.items() if n > 1)
        if twice:   # each (run, budget) is one row of the table
            raise UserError(f"a run folder is given twice: {', '.join(twice)}")

        if out is not None:
            check_output_file(out, "--out file", force=force, inputs=[*runs, data])
            if out.suffix.lower() not in (".csv", ".jsonl", ".json"):
                raise UserError(f"--out {out}: use a .csv, .jsonl or .json file name")
        if check_threads(threads) is not None:
            import torch

            torch.set_num_threads(threads)
        settings = EvalSettings(
            tasks=tuple(t.strip() for t in tasks.split(",") if t.strip()),
            data=data,
            backend=backend,
            budgets=parse_budgets(budget),
            checkpoint=checkpoint,
            limit=limit,
            num_fewshot=num_fewshot,
            device=device,
            batch_size=batch_size,
            allow_code=allow_code,
        )
        say = None if json_out else (lambda m: stderr.print(m, highlight=False, markup=False))
        rows = evaluate_runs(runs, settings, progress=say)
        if out is not None:
            write_table(rows, out)
        if json_out:
            emit_json({"rows": rows})
        else:
            print_rows(rows)
            if out is not None:
                stdout.print(f"table: {out}", highlight=False)

    @app.command("calibrate")
    @run_cli
    def calibrate_cmd(
        table: Path = typer.Argument(
            ..., help="Evaluation table written by `eval --out` (.csv, .jsonl, .json)."
        ),
        task: str = typer.Option(
            ..., "--task", help="Task whose metric is calibrated (e.g. mmlu_anatomy)."
        ),
        metric: str = typer.Option(
            "acc", "--metric", help="Metric of that task (acc, acc_norm, pass@1, ...)."
        ),
        floor: str = typer.Option(
            "free", "--floor", help="Accuracy floor: a number (chance, e.g. 0.25) or free (fitted)."
        ),
        x: str = typer.Option(
            "loss",
            "--x",
            help="Column of the loss axis [default: the run's validation loss at that budget].",
        ),
        reference: str = typer.Option("baseline", "--reference", help="Architecture the law is fitted on."),
        candidate: str = typer.Option(
            "smelt", "--candidate", help="Architecture whose residual is reported."
        ),
        n_boot: int = typer.Option(1000, "--bootstrap", help="Bootstrap resamples of the interval."),
        level: float = typer.Option(0.95, "--level", help="Interval level."),
        seed: int = typer.Option(0, "--seed", min=0, max=2**32 - 1, help="Bootstrap seed."),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
    ) -> None:
        """Loss->accuracy calibration: acc-sigmoid on the reference, candidate residual at matched loss.

        acc = floor + (1 - floor) * sigmoid(k * (L0 - L)), least squares on the reference's
        (loss, metric) points; the residual is the candidate's mean accuracy minus the law at the
        candidate's own losses, with a percentile bootstrap interval (both sides resampled). Says
        when the law is not identified (e.g. every accuracy at chance).
        """
        from scaling.fitting.calibration import FORMULA, calibrate_table
        from scaling.fitting.tables import read_table

        fl = _floor(floor)
        if not 0 < level < 1:
            raise UserError(f"--level must lie in (0, 1), got {level}")
        check_distinct(reference, candidate)
        if not table.is_file():
            raise UserError(f"no table file {table}")
        res = calibrate_table(
            read_table(table),
            task,
            metric,
            reference=reference,
            candidate=candidate,
            x=x,
            floor=fl,
            n_boot=n_boot,
            level=level,
            seed=seed,
        )
        if json_out:
            emit_json(res.to_dict())
            return
        f = res.fit
        stdout.print(
            f"{res.task} {res.metric}: {FORMULA} fitted on {res.n_reference} {res.reference} points: "
            f"floor {f.floor:.4f}{' (fixed)' if f.floor_fixed else ''}, k {f.k:.4g}/nat, L0 {f.L0:.4f}, "
            f"rmse {f.rmse:.4f}; identified: {'yes' if f.identified else 'no (' + f.reason + ')'}",
            highlight=False,
        )
        t = Table(title_justify="left")
        for c in ("arch", "point", x, res.metric, "law", "residual"):
            t.add_column(c, justify="left" if c in ("arch", "point") else "right", no_wrap=True)
        for p in res.points:
            t.add_row(
                p["arch"],
                str(p["label"]),
                f"{p['loss']:.4f}",
                f"{p['value']:.4f}",
                f"{p['predicted']:.4f}",
                f"{p['residual']:+.4f}",
            )
        stdout.print(t)
        if not f.identified:
            # the curve is one of many that fit equally well: its residual is no result
            stdout.print(f"{res.candidate} residual at matched loss: not determined (the law is not "
                         "identified; see the note)", highlight=False)
        else:
            stdout.print(
                f"{res.candidate} residual at matched loss: {res.residual:+.4f} "
                f"[{res.residual_lo:+.4f}, {res.residual_hi:+.4f}] ({res.level:.0%} bootstrap, "
                f"{res.n_boot} resamples, {res.n_candidate} {res.candidate} points)",
                highlight=False,
            )
        for n in res.notes:
            stdout.print(f"note: {n}", highlight=False)
