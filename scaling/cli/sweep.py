"""`smelt-scale sweep PLAN`: dry-run estimates or dispatch of a sweep plan through submitit."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Literal, Optional

import typer
from rich.table import Table

from scaling.cli._util import (
    check_output_dir,
    finish,
    run_cli,
    setup_logging,
    show_progress,
    stderr,
    stdout,
    warn,
)
from scaling.common.errors import UserError
from scaling.common.format import duration, number, si
from scaling.training.data.loader import check_data_use, plan_data_use
from scaling.training.loop.progress import eta_text
from scaling.training.sweep.dry_run import (
    ESTIMATE_COLUMNS,
    NOT_FITTING,
    dry_run_rows,
    dry_run_total,
    estimate_cells,
)
from scaling.training.sweep.plan import EXECUTORS, load_plan
from scaling.training.sweep.submit import (
    check_memory,
    check_recorded,
    estimate,
    machine_load,
    run_status,
    submit_runs,
    train_config,
)

POLL_S = 1.0  # how often a waiting sweep looks at its jobs (a failure is reported within this)
WATCH_INTERVAL_S = 60.0  # --watch: how often the runs' folders are read


def _print_choices(rows: list[dict]) -> None:
    table = Table(title="--choose-layout: fastest predicted layout that fits, per run", title_justify="left")
    for col in ("run", "mode", "ep", "micro x accum", "AC", "mem/GPU GB", "step s", "MFU", "binds",
                "fit / tried"):
        table.add_column(col, justify="left" if col in ("run", "mode") else "right")
    for r in rows:
        c = r["chosen_layout"]
        b = c["best"]
        if b is None:
            table.add_row(r["run"], "[bold red]none fits[/bold red]", *["-"] * 7, f"0 / {c['tried']}")
            continue
        table.add_row(
            r["run"], b["mode"] + (f" R={b['replicate']}" if b["replicate"] else ""), str(b["ep"]),
            f"{b['micro_batch_size']} x {b['grad_accum_steps']}",
            "on" if b["activation_checkpointing"] else "off",
            f"{b['memory_gb_per_gpu']:.1f}", f"{b['predicted_step_s']:.3g}", f"{b['predicted_mfu']:.1%}",
            b["binding_resource"], f"{c['fitting']} / {c['tried']}",
        )
    stdout.print(table)


def register(app: typer.Typer) -> None:
    @app.command()
    @run_cli
    def sweep(
        plan_file: Path = typer.Argument(..., help="Sweep plan (TOML), e.g. plans/cpu-proxy.toml."),
        dry_run: bool = typer.Option(
            False,
            "--dry-run",
            help="Print every run with FLOPs, time or GPU-hours and memory per GPU (GB = 1e9 bytes, "
            "by part), and the predicted step time, MFU and binding resource (compute, nvlink, "
            "network or hbm; [parallel] nvlink_gb_s, network_gb_s, overlap, hbm_gb_s); train nothing. "
            "A run that does not fit the plan's [parallel] gpu_memory_gb is "
            "marked, and after the table (or the JSON) the command exits 2 with a one-line error "
            "naming the tier and the shortfall, as the real run does before submitting anything.",
        ),
        choose_layout: bool = typer.Option(
            False, "--choose-layout",
            help="With --dry-run: per run, try EP degree 1/2/4/8, FSDP vs HSDP (several nodes), every "
            "power-of-two micro-batch and activation checkpointing on/off on the same GPUs, keep those "
            "that fit gpu_memory_gb, and print the fastest predicted one (JSON: chosen_layout).",
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
        wait: Optional[bool] = typer.Option(
            None, "--wait/--no-wait", help="Follow the jobs until they end: per-run progress, a line per "
            "failed run at once [default: wait for local and debug jobs; return after submitting to Slurm, "
            "then follow with --watch or --status]."
        ),
        fail_fast: bool = typer.Option(
            False, "--fail-fast", help="On the first failed run, cancel the other jobs (while waiting)."
        ),
        status_only: bool = typer.Option(
            False, "--status", help="Print each run's progress from its folder (tokens, loss, ETA); "
            "submit nothing."
        ),
        watch: bool = typer.Option(
            False, "--watch", help="Follow the runs' progress from their folders until all are done (a sweep "
            "submitted earlier, e.g. to Slurm); submit nothing."
        ),
        max_epochs: float = typer.Option(
            4.0, help="Refuse runs reading more passes over their training split (unless [data] "
            "allow_repeat)."
        ),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON object."),
    ) -> None:
        """Run a sweep plan: finished runs are skipped, interrupted ones resume."""
        if choose_layout and not dry_run:
            raise UserError("--choose-layout only works with --dry-run")
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
        if status_only or watch:
            _follow_folders(plan, watch, json_out)
            return
        # data first: a sweep without usable data stops here, before anything starts
        uses = plan_data_use(plan.runs)
        allow_repeat = any(bool(r.data.get("allow_repeat")) for r in plan.runs)
        data_errors, data_warnings = check_data_use(uses, allow_repeat, max_epochs)

        def refuse() -> None:
            """The refusals of a real sweep; a dry run raises them too, after its table."""
            check_memory(estimate(plan, probe=False))
            check_recorded(plan)
            if data_errors:
                more = f" (and {len(data_errors) - 1} more)" if len(data_errors) > 1 else ""
                raise UserError(data_errors[0] + more)

        if not dry_run:
            refuse()  # both refusals come before anything starts
        if not json_out:
            for msg in data_warnings:
                warn(msg)
        if dry_run:
            _dry_run(plan, uses, probe, choose_layout, concurrency, json_out, data_errors, data_warnings)
            refuse()
            return
        _submit(plan, plan_file, executor, probe, concurrency, threads, wait, fail_fast, json_out)


def _dry_run(plan, uses, probe: bool, choose: bool, concurrency: Optional[int], json_out: bool,
             data_errors: list[str], data_warnings: list[str]) -> None:
    """--dry-run: every run's estimates and the plan's totals, as JSON or as a table."""
    load = machine_load() if probe else None     # before the probes: was the machine idle?
    rows = dry_run_rows(plan, estimate(plan, probe=probe), uses, choose=choose)
    total = dry_run_total(plan, rows)
    total["probe_load"] = load if total["est_seconds_serial"] else None
    doc = {"plan": plan.name, "runs_dir": str(plan.runs_dir), "runs": rows, "total": total,
           "data_errors": data_errors, "data_warnings": data_warnings}
    finish(json_out, doc, lambda: _print_dry_run(plan, rows, total, choose, concurrency))


def _print_dry_run(plan, rows: list[dict], total: dict, choose: bool, concurrency: Optional[int]) -> None:
    table = Table(title=f"plan {plan.name}: {len(rows)} runs -> {plan.runs_dir}", title_justify="left")
    for col, left in ESTIMATE_COLUMNS:
        table.add_column(col, justify="left" if left else "right")
    fits = [col for col, _ in ESTIMATE_COLUMNS].index("fits")
    for r in rows:
        cells = estimate_cells(r)
        if cells[fits] == NOT_FITTING:
            cells[fits] = f"[bold red]{NOT_FITTING}[/bold red]"
        table.add_row(*cells)
    stdout.print(table)
    if choose:
        _print_choices(rows)
    conc = concurrency or int(plan.executor.get("concurrency", 1))
    if total["est_seconds_serial"]:
        load = total.get("probe_load")
        how = "probe measured uncontended"
        if load and load["busy"]:
            how = (f"probe measured on a busy machine (load average {load['load_1min']:g} on "
                   f"{load['cores']} cores): slower than on an idle one")
        stdout.print(
            f"CPU estimate: {duration(total['est_seconds_serial'])} one at a time, about "
            f"{duration(total['est_seconds_serial'] / conc)} with {conc} at once ({how}; "
            "concurrent runs share cores).",
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


def _submit(plan, plan_file: Path, executor: Optional[str], probe: bool, concurrency: Optional[int],
            threads: Optional[int], wait: Optional[bool], fail_fast: bool, json_out: bool) -> None:
    """Submit the runs not yet done, follow them (``wait``), and report each run's status."""
    est = None
    if (executor or plan.executor.get("kind", "local")) == "local" and probe:
        est = estimate(plan, probe=True)
    kind = executor or plan.executor.get("kind", "local")
    submitted, skipped = submit_runs(plan, kind=executor, concurrency=concurrency, threads=threads,
                                     estimates=est)
    if skipped and not json_out:
        stderr.print(f"skipping {len(skipped)} finished run(s): {', '.join(skipped)}", highlight=False)
    if wait is None:
        wait = kind != "slurm"  # a Slurm sweep runs for days: the submitting shell must not block
    failed = _follow_jobs(plan, submitted, kind, fail_fast, json_out) if wait else {}
    status = {r.name: run_status(plan.runs_dir, r.name) for r in plan.runs}
    doc = {"plan": plan.name, "runs_dir": str(plan.runs_dir), "skipped": skipped,
           "jobs": [str(s.job.job_id) for s in submitted], "waited": wait, "status": status, "failed": failed}

    def show() -> None:
        done = sum(v == "done" for v in status.values())
        stdout.print(
            f"{done}/{len(status)} runs finished in {plan.runs_dir}"
            + ("" if wait else f"; submitted jobs {', '.join(str(s.job.job_id) for s in submitted)}; "
               f"follow with `smelt-scale sweep {plan_file} --watch`"),
            highlight=False,
        )

    finish(json_out, doc, show)
    if failed:  # the work failed (not the input): exit 1, after the status above
        _exit_failed(failed)


def _exit_failed(failed: dict) -> None:
    stderr.print(f"error: {len(failed)} run(s) failed: {', '.join(failed)}", highlight=False, markup=False)
    raise typer.Exit(1)


def _progress_row(p) -> list[str]:
    frac = p.tokens_done / p.tokens_total if p.tokens_total else 0.0
    return [p.run, p.status, f"{si(p.tokens_done)}/{si(p.tokens_total)} ({frac:.0%})",
            number(p.train_loss, ".3f"), number(p.val_loss, ".3f"), eta_text(p.eta_s)]


def _progress_lines(plan, rows) -> None:
    log = logging.getLogger("scaling.progress")
    for p in rows:
        if p.status != "done":
            log.info("%s", " ".join(f"{k} {v}" for k, v in zip(
                ("run", "status", "tokens", "loss", "val", "eta"), _progress_row(p))))


def _follow_folders(plan, watch: bool, json_out: bool) -> None:
    """--status / --watch: every run's progress from its folder (no job handles needed)."""
    from scaling.training.sweep.submit import run_progress

    setup_logging()
    while True:
        rows = [run_progress(plan, r) for r in plan.runs]
        if not watch or all(p.status == "done" for p in rows):
            break
        if show_progress(json_out):
            stderr.print(_status_table(plan, rows))
        elif not json_out:
            _progress_lines(plan, rows)
        time.sleep(WATCH_INTERVAL_S)
    finish(json_out, {"plan": plan.name, "runs_dir": str(plan.runs_dir), "runs": [p.to_dict() for p in rows]},
           lambda: stdout.print(_status_table(plan, rows)))


def _status_table(plan, rows) -> Table:
    t = Table(title=f"plan {plan.name}: {sum(p.status == 'done' for p in rows)}/{len(rows)} runs done",
              title_justify="left")
    for col in ("run", "status", "tokens", "loss", "val", "ETA"):
        t.add_column(col, justify="left" if col in ("run", "status") else "right")
    for p in rows:
        t.add_row(*_progress_row(p))
    return t


def _follow_jobs(plan, submitted, kind: str, fail_fast: bool, json_out: bool) -> dict:
    """Wait for the jobs: a line per failed run the moment its job fails (with its log), per-run
    progress (a bar per run on a terminal, a log line per run every minute otherwise), and with
    ``fail_fast`` the other jobs cancelled at the first failure. Returns {run: {reason, log}}."""
    from scaling.training.sweep.submit import failed_run, failure_reason, run_progress

    setup_logging()
    failed: dict[str, dict] = {}
    by_name = {r.name: r for r in plan.runs}
    names = [n for s in submitted for n in s.runs]

    def report(sub) -> None:
        try:
            exc = sub.job.exception()
        except Exception as err:  # noqa: BLE001 - submitit raises when a job vanished; report it
            exc = err
        if exc is None:
            return
        name = failed_run(sub, plan.runs_dir)
        failed[name] = {"reason": failure_reason(exc), "log": str(sub.log)}
        stderr.print(f"failed: run {name}: {failed[name]['reason']} (log: {sub.log})", highlight=False,
                     markup=False)

    if kind == "debug":  # in-process: a job runs when its result is asked for
        for sub in submitted:
            report(sub)
            if failed and fail_fast:
                break
        return failed
    bar = tasks = None
    if show_progress(json_out):
        from rich.progress import BarColumn, Progress, TextColumn

        bar = Progress(TextColumn("{task.description}"), BarColumn(bar_width=20),
                       TextColumn("{task.percentage:>3.0f}% loss {task.fields[loss]} ETA {task.fields[eta]}"),
                       console=stderr)
        tasks = {n: bar.add_task(n, total=1.0, loss="-", eta="-") for n in names}
        bar.start()
    pending = list(submitted)
    last_lines = time.monotonic()
    try:
        while pending:
            for sub in [s for s in pending if s.job.done()]:
                pending.remove(sub)
                report(sub)
            if failed and fail_fast and pending:
                for sub in pending:
                    sub.job.cancel(check=False)
                    stderr.print(f"cancelled: {', '.join(sub.runs)} (--fail-fast)", highlight=False,
                                 markup=False)
                pending = []
                break
            rows = [run_progress(plan, by_name[n]) for n in names]
            if bar is not None:
                for p in rows:
                    frac = p.tokens_done / p.tokens_total if p.tokens_total else 0.0
                    bar.update(tasks[p.run], completed=frac, loss=number(p.train_loss, ".3f"),
                               eta=eta_text(p.eta_s))
            elif not json_out and time.monotonic() - last_lines >= 60:
                _progress_lines(plan, rows)
                last_lines = time.monotonic()
            if pending:
                time.sleep(POLL_S)
    finally:
        if bar is not None:
            bar.stop()
    return failed
