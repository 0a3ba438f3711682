"""`smelt-scale fit`: approach-3 scaling-law fits per group, with bootstrap intervals and cross-checks."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from scaling.cli._util import emit_json, run_cli, show_progress, stderr, stdout, warn
from scaling.fitting.fit import DEFAULT_BOOTSTRAP, DEFAULT_DELTA, FitResult, FitSet, fit_groups
from scaling.fitting.laws import LAWS, get_law
from scaling.fitting.tables import Columns, load_points


def _fmt(x: float) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.5g}"


def print_fit(fit: FitResult) -> None:
    level = fit.settings.get("ci_level", 0.95)
    law = fit.law_obj
    title = f"{fit.group}: {law.formula}  ({fit.n_points} points, {fit.diagnostics['n_runs']} runs)"
    table = Table(title=title, title_justify="left")
    table.add_column("parameter", no_wrap=True)
    table.add_column("estimate", justify="right")
    table.add_column(f"{100 * level:.0f}% bootstrap CI ({fit.bootstrap.shape[0]} resamples)", justify="right")
    for name, value in [*fit.params.items(), *fit.derived.items()]:
        lo, hi = fit.ci.get(name, (math.nan, math.nan))
        table.add_row(name, _fmt(value), f"[{_fmt(lo)}, {_fmt(hi)}]" if math.isfinite(lo) else "-")
    stdout.print(table)
    d = fit.diagnostics
    stdout.print(f"  RMSE(log L) {d['rmse_log']:.4g}   max |log residual| {d['max_abs_residual']:.4g}   "
                 f"objective {d['objective']:.10g}   starts {d['n_starts']} "
                 f"({d['n_refined_at_best']}/{d['n_refined']} refined at the best, "
                 f"param spread {d['best_start_param_spread']:.1e})   on a bound: "
                 f"{', '.join(d['on_bound']) or 'none'}   identified: {'yes' if d['identified'] else 'NO'}",
                 highlight=False)
    if fit.law == "chinchilla":
        a3 = f"a = {fit.derived['a']:.3f} [{_fmt(fit.ci['a'][0])}, {_fmt(fit.ci['a'][1])}]"
        stdout.print(f"  N* ~ C^a, D* ~ C^b (C = {fit.k:.3g} N D): approach 3 {a3}", highlight=False)
    for key in ("approach1", "approach2"):
        c = fit.cross_checks.get(key)
        if not c:
            continue
        label = c.get("method", key)
        if c.get("available"):
            extra = ""
            if key == "approach2":
                extra = f", {c['n_buckets']} compute buckets"
                if "design_bias" in c:
                    extra += f"; this design's parabola bias on the fitted law: {c['design_bias']:+.3f}"
            else:
                extra = f", {c['mode']}, {c['n_frontier']} frontier points"
            stdout.print(f"  {label}: a = {c['a']:.3f}{extra}", highlight=False)
        else:
            stdout.print(f"  {label}: not available: {c['reason']}", highlight=False)
    for w in d.get("warnings", []):
        warn(f"{fit.group}: {w}")


def register(app: typer.Typer) -> None:
    @app.command()
    @run_cli
    def fit(
        path: Path = typer.Argument(..., help="A runs directory (runs/<run>/final.json) or a CSV, JSONL, "
                                              "JSON or Parquet table of points."),
        law: str = typer.Option("chinchilla", "--law", help=f"Law form: {', '.join(LAWS)}."),
        n_col: str = typer.Option("N", help="Column of parameters N (non-embedding, active)."),
        d_col: str = typer.Option("D", help="Column of training tokens D."),
        loss_col: str = typer.Option("loss", help="Column of the loss (nats/token)."),
        group_col: Optional[str] = typer.Option(None, help="Column to group fits by. Default: arch when "
                                                           "present, else one group named default."),
        c_col: Optional[str] = typer.Option(None, help="Column of total training FLOPs C; without a token "
                                                       "column D = C/(6N)."),
        flops_col: str = typer.Option("flops_per_token",
                                      help="Column of training FLOPs per token F (smelt law)."),
        sparsity_col: str = typer.Option("sparsity",
                                         help="Column of compute-equivalent sparsity S (smelt law)."),
        n_bootstrap: int = typer.Option(DEFAULT_BOOTSTRAP, "--bootstrap", min=0,
                                        help="Bootstrap resamples over runs (0 = no intervals)."),
        seed: int = typer.Option(0, help="Seed of the bootstrap resampling."),
        huber_delta: float = typer.Option(DEFAULT_DELTA, help="Huber delta on log-loss residuals."),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
        out: Optional[Path] = typer.Option(None, "--out", help="Also write the JSON object to this file "
                                                               "(read by `smelt-scale savings --fits`)."),
    ) -> None:
        """Fit a scaling law per group: Huber loss on log loss, multi-start L-BFGS, bootstrap over runs.

        Approach 3 of Hoffmann et al. (2022), as corrected by Besiroglu et al. (2024).

        Approaches 1 (frontier) and 2 (IsoFLOP parabolas) are printed beside it as cross-checks.
        """
        the_law = get_law(law)
        cols = Columns(n=n_col, d=d_col, loss=loss_col, group=group_col, c=c_col,
                       flops_per_token=flops_col, sparsity=sparsity_col)
        points = load_points(path, cols, warn=warn)
        kwargs = dict(huber_delta=huber_delta, n_bootstrap=n_bootstrap, seed=seed)
        if show_progress(json_out) and n_bootstrap > 0:
            with Progress(TextColumn("bootstrap {task.description}"), BarColumn(), MofNCompleteColumn(),
                          TimeElapsedColumn(), console=stderr, transient=True) as bar:
                tasks: dict[str, int] = {}

                def progress(group: str, done: int, total: int) -> None:
                    if group not in tasks:
                        tasks[group] = bar.add_task(group, total=total)
                    bar.update(tasks[group], completed=done)

                fits = fit_groups(points, the_law, progress=progress, **kwargs)
        else:
            fits = fit_groups(points, the_law, **kwargs)
        fitset = FitSet(fits)
        if out is not None:
            fitset.save(out)
        if json_out:
            for f in fits.values():
                for w in f.diagnostics.get("warnings", []):
                    warn(f"{f.group}: {w}")
            emit_json(fitset.to_dict())
            return
        for f in fits.values():
            print_fit(f)
        if out is not None:
            stdout.print(f"wrote {out}", highlight=False)
