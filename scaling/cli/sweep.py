"""`smelt-scale sweep PLAN`: dry-run estimates or dispatch of a sweep plan through submitit."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal, Optional

import typer
from rich.table import Table

from scaling.cli._util import check_output_dir, emit_json, run_cli, show_progress, stderr, stdout, warn
from scaling.common.errors import UserError
from scaling.common.format import duration
from scaling.training.data import check_data_use, plan_data_use
from scaling.training.sweep import check_memory, estimate, run_status, submit, train_config
from scaling.training.sweep_plan import EXECUTORS, load_plan


def _memory_cells(row: dict) -> list[str]:
    mem = row.get("memory_gb_per_gpu")
    if not mem:
        return ["-"] * 5
    fits = {True: "yes", False: "[bold red]NO[/bold red]", None: "-"}[row["fits"]]
    return [
        f"{mem['total']:.1f}",
        f"{mem['params'] + mem['grads'] + mem['optimizer']:.1f}",
        f"{mem['activations'] + mem['working']:.1f}",
        f"{mem['buffers']:.1f}",
        fits,
    ]


def register(app: typer.Typer) -> None:
    @app.command()
    @run_cli
    def sweep(
        plan_file: Path = typer.Argument(..., help="Sweep plan (TOML), e.g. plans/cpu-proxy.toml."),
        dry_run: bool = typer.Option(
            False,
            "--dry-run",
            help="Print every run with FLOPs, time or GPU-hours and memory per GPU (GB = 1e9 bytes, "
            "by part); train nothing. A run that does not fit the plan's [parallel] gpu_memory_gb is "
            "marked, and after the table (or the JSON) the command exits 2 with a one-line error "
            "naming the tier and the shortfall, as the real run does before submitting anything.",
        ),
        probe: bool = typer.Option(
            True, "--probe/--no-probe", help="Measure tokens/s with a short probe (dry run)."
        ),
        executor: Optional[Literal[EXECUTORS]] = typer.Option(
            None, help="Where the runs go (default: the plan's)."
        ),
        concurrency: Optional[int] = typer.Option(
            None, min=1, help="Local: trainings at once (default: the plan's)."
        ),
        threads: Optional[int] = typer.Option(
            None, min=1, help="Torch CPU threads per training (default: the plan's)."
        ),
        runs_dir: Optional[Path] = typer.Option(None, help="Override the plan's runs folder."),
        wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait for local jobs to finish."),
        max_epochs: float = typer.Option(
            4.0, help="Refuse runs reading more passes over their training split (unless [data] "
            "allow_repeat)."
        ),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Run a sweep plan: finished runs are skipped, interrupted ones resume."""
        plan = load_plan(plan_file)
        if executor is not None and executor not in EXECUTORS:
            raise UserError(f"--executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
        if runs_dir is not None:
            plan = type(plan)(**{**plan.__dict__, "runs_dir": runs_dir})
        check_output_dir(plan.runs_dir, "runs folder")
        for run in plan.runs:  # every run's training settings, checked before anything starts
            train_config(run)
        if not max_epochs > 0:
            raise UserError(f"--max-epochs must be > 0, got {max_epochs}")
        # data first: a sweep without usable data stops here, before anything starts
        uses = plan_data_use(plan.runs)
        allow_repeat = any(bool(r.data.get("allow_repeat")) for r in plan.runs)
        data_errors, data_warnings = check_data_use(uses, allow_repeat, max_epochs)
        if not dry_run:
            check_memory(estimate(plan, probe=False))  # both refusals come before anything starts
            if data_errors:
                more = f" (and {len(data_errors) - 1} more)" if len(data_errors) > 1 else ""
                raise UserError(data_errors[0] + more)
        if not json_out:
            for msg in (data_errors if dry_run else []) + data_warnings:
                warn(msg)
        if dry_run:
            est = estimate(plan, probe=probe)
            rows = [{**e.to_dict(), **u.to_dict()} for e, u in zip(est, uses)]
            total = {
                "runs": len(rows),
                "flops": sum(r["flops"] for r in rows),
                "est_seconds_serial": sum(r["est_seconds"] or 0 for r in rows) or None,
                "gpu_hours": sum(r["gpu_hours"] or 0 for r in rows) or None,
                "mfu": float(plan.executor.get("mfu", 0.4)),
                "gpu_peak_flops": float(plan.executor.get("gpu_peak_flops", 9.89e14)),
            }
            if json_out:
                emit_json({"plan": plan.name, "runs_dir": str(plan.runs_dir), "runs": rows, "total": total,
                           "data_errors": data_errors, "data_warnings": data_warnings})
                check_memory(est)
                return
            table = Table(
                title=f"plan {plan.name}: {len(rows)} runs -> {plan.runs_dir}", title_justify="left"
            )
            for col in (
                "run",
                "budgets (tokens)",
                "status",
                "train tokens",
                "data tokens",
                "epochs",
                "FLOPs",
                "tok/s",
                "est. time",
                "GPU-h",
                "mem/GPU GB",
                "params+grads+optim",
                "activ+work",
                "buffers",
                "fits",
            ):
                table.add_column(
                    col, justify="left" if col in ("run", "budgets (tokens)", "status") else "right"
                )
            for r in rows:
                table.add_row(
                    r["run"],
                    ", ".join(f"{b:.3g}" for b in r["budgets"]),
                    r["status"],
                    f"{r['tokens']:.3g}",
                    f"{r['data_tokens']:.3g}",
                    "-" if r["epochs"] is None else f"{r['epochs']:.3g}",
                    f"{r['flops']:.3g}",
                    f"{r['tokens_per_s']:.0f}" if r["tokens_per_s"] else "-",
                    duration(r["est_seconds"]),
                    f"{r['gpu_hours']:.0f}" if r["gpu_hours"] else "-",
                    *_memory_cells(r),
                )
            stdout.print(table)
            conc = concurrency or int(plan.executor.get("concurrency", 1))
            if total["est_seconds_serial"]:
                stdout.print(
                    f"CPU estimate: {duration(total['est_seconds_serial'])} one at a time, about "
                    f"{duration(total['est_seconds_serial'] / conc)} with {conc} at once (probe measured "
                    "uncontended; concurrent runs share cores).",
                    highlight=False,
                )
            if total["gpu_hours"]:
                stdout.print(
                    f"GPU estimate: {total['gpu_hours']:.0f} GPU-hours at MFU {total['mfu']:.0%} of "
                    f"{total['gpu_peak_flops']:.3g} FLOP/s per GPU.",
                    highlight=False,
                )
            stdout.print(
                "Memory: per-GPU peak of a training step (scaling.accounting.memory; GB = 1e9 bytes); "
                "`--json` has every part and the communication per step.",
                highlight=False,
            )
            check_memory(est)
            return
        est = None
        if (executor or plan.executor.get("kind", "local")) == "local" and probe:
            est = estimate(plan, probe=True)
        jobs, skipped = submit(plan, kind=executor, concurrency=concurrency, threads=threads, estimates=est)
        if skipped and not json_out:
            stderr.print(f"skipping {len(skipped)} finished run(s): {', '.join(skipped)}", highlight=False)
        if wait:
            names = [r.name for r in plan.runs]
            if show_progress(json_out):
                from rich.progress import Progress

                with Progress(console=stderr) as bar:
                    task = bar.add_task("runs finished", total=len(names))
                    while not all(j.done() for j in jobs):
                        bar.update(task, completed=sum(run_status(plan.runs_dir, n) == "done" for n in names))
                        time.sleep(5)
            for j in jobs:
                j.result()  # re-raises a failed job's error
        status = {r.name: run_status(plan.runs_dir, r.name) for r in plan.runs}
        if json_out:
            emit_json(
                {
                    "plan": plan.name,
                    "runs_dir": str(plan.runs_dir),
                    "skipped": skipped,
                    "jobs": [str(j.job_id) for j in jobs],
                    "status": status,
                }
            )
        else:
            done = sum(v == "done" for v in status.values())
            stdout.print(
                f"{done}/{len(status)} runs finished in {plan.runs_dir}"
                + ("" if wait else f"; submitted jobs {', '.join(str(j.job_id) for j in jobs)}"),
                highlight=False,
            )
