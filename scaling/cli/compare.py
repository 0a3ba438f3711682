"""`smelt-scale compare`: paired candidate − reference validation loss at matched (tier, budget, seed)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from scaling.cli._util import FORCE_HELP, check_output_file, finish, run_cli, stdout, warn, where_option
from scaling.common.errors import UserError
from scaling.common.filter import filter_rows
from scaling.fitting.compare import (
    CLUSTERS,
    FEW_CLUSTERS,
    LEVEL,
    CompareResult,
    PairStats,
    at_least_tokens,
    compare,
    describe_dropped,
    interval_text,
    length_buckets,
    with_validation_ids,
)
from scaling.fitting.tables import read_runs_dir


def _row(s: PairStats) -> list[str]:
    se = "—" if s.se is None else f"{s.se:.4f}"
    iid = "—" if s.se_iid is None else f"{s.se_iid:.4f}"
    p = "—" if s.sign_p is None else f"{s.sign_p:.3g}"
    tokens = "—" if s.tokens is None else f"{s.tokens / 1e6:.3g}M"
    ci = "—" if s.ci_lo is None else interval_text(s)
    return [s.label, tokens, f"{s.mean:+.4f}", se, ci, iid, str(s.n_pairs), str(s.n_clusters),
            f"{s.n_candidate_better}/{s.n_pairs}", p]


def print_result(res: CompareResult, show_cells: bool) -> None:
    stdout.print(f"[bold]{res.candidate} − {res.reference}[/bold] validation loss at matched (tier, budget, "
                 f"seed), nats/token; negative = {res.candidate} better. s.e. clustered by "
                 f"[bold]{res.cluster}[/bold] (CR1); {LEVEL:.0%} interval mean ± t(G−1)·s.e. over G "
                 "clusters; sign test exact binomial over pairs.", highlight=False)
    if res.where:
        stdout.print(f"points kept by --where {' and '.join(repr(w) for w in res.where)}: "
                     f"{res.n_points_kept} of {res.n_points}", highlight=False)
    table = Table(title_justify="left")
    for c in ("", "tokens", "mean", "s.e.", f"{LEVEL:.0%} CI (t, df)", "s.e. iid", "pairs", "clusters",
              f"{res.candidate} better", "sign p"):
        table.add_column(c, justify="left" if not c else "right", no_wrap=True)
    table.add_row(*_row(res.overall), end_section=True)
    for i, s in enumerate(res.by_tier):
        table.add_row(*_row(s), end_section=i == len(res.by_tier) - 1)
    for i, s in enumerate(res.by_budget):
        table.add_row(*_row(s), end_section=i == len(res.by_budget) - 1)
    if show_cells:
        for s in res.cells:
            table.add_row(*_row(s))
    stdout.print(table)
    rows = (res.overall, *res.by_tier, *res.by_budget, *(res.cells if show_cells else ()))
    if any(s.few_clusters for s in rows):
        stdout.print(f"* interval from fewer than {FEW_CLUSTERS} clusters (t with 1 to {FEW_CLUSTERS - 2} "
                     "degrees of freedom): wide, and only as good as the cluster sums are near normal; "
                     "— : fewer than 2 clusters, no s.e. and no interval.", highlight=False)
    for name, s in res.by_source.items():
        se = "no s.e." if s.se is None else f"s.e. {s.se:.4f}"
        stdout.print(f"source {name}: {s.mean:+.4f}, {se}, {LEVEL:.0%} CI {interval_text(s)} "
                     f"({s.n_pairs} pairs, {s.n_clusters} clusters)", highlight=False)
    if res.by_length:
        lt = Table(title="length buckets (final weights of the run pairs with analysis/lengths.json)",
                   title_justify="left")
        for c in ("pair", "bucket", "diff", "s.e.", "sequences", "tokens"):
            lt.add_column(c, justify="right", no_wrap=True)
        for b in res.by_length:
            hi = "∞" if b["hi"] is None else b["hi"]
            se = "—" if b["se"] is None else f"{b['se']:.4f}"
            lt.add_row(f"{b['tier']} s{b['seed']}", f"{b['by']} [{b['lo']}, {hi})", f"{b['diff']:+.4f}", se,
                       str(b["n_sequences"]), str(b["n_tokens"]))
        stdout.print(lt)
    spread = ("—" if res.seed_spread is None else
              f"{res.seed_spread:.4f} nats on average (max - min over the cells with 2 or more seeds, "
              f"{res.n_seeds} seeds in all: it grows with a cell's seeds; pooled s.d. {res.seed_sd:.4f})")
    stdout.print(f"{res.candidate} better in {res.n_cells_candidate_better} of {len(res.cells)} "
                 f"(tier, budget) cells (cell mean over seeds); seeds of one config differ by {spread}.",
                 highlight=False)
    for n in res.notes:
        stdout.print(f"note: {n}", highlight=False)
    if res.dropped:
        warn(describe_dropped(res.dropped))


def register(app: typer.Typer) -> None:
    @app.command("compare")
    @run_cli
    def compare_cmd(
        runs: Path = typer.Argument(..., help="Runs folder (run folders with final.json)."),
        reference: str = typer.Option("baseline", "--reference", help="Architecture subtracted."),
        candidate: str = typer.Option("smelt", "--candidate", help="Architecture compared."),
        cluster: str = typer.Option("run", "--cluster", help="Clusters of the s.e.: run (the (tier, seed) "
                                    "run pair: its budgets share a trunk), seed, or none (independent)."),
        min_tokens: float = typer.Option(0.0, "--min-tokens", min=0.0, max=1e30,  # max: refuses NaN too
                                         help="Only budgets of at least this many tokens (the requested "
                                         "budget, e.g. 5e5)."),
        where: Optional[list[str]] = where_option(
            "points", "\"lr == 0.006\", \"seed >= 3\", \"tier != 'iso-d04'\"",
            "Columns: those of `fit runs/` (arch, tier, seed, lr, N, D, flops, loss, budget_index, ...)."),
        cells: bool = typer.Option(False, "--cells", help="Also list every (tier, budget) cell."),
        plot: Optional[Path] = typer.Option(None, "--plot", help="Write a figure of the differences "
                                            "(.png, .pdf or .svg)."),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
        force: bool = typer.Option(False, "--force", help=FORCE_HELP),
    ) -> None:
        """Paired loss difference candidate − reference at matched (tier, budget, seed).

        A pair needs the same tier and seed, the same actual tokens (within 1%) and FLOPs (within
        2%), and the same validation data (corpus, tokenizer, held-out windows, from each run's
        config.json); points without such a partner are left out and named on stderr.

        Per (tier, budget) cell, per tier, per budget and overall: mean, cluster-robust s.e. (CR1;
        default clusters: the run pair, because a run's budgets are cooldown branches of one trunk),
        the i.i.d. s.e. beside it, and an exact sign test over pairs. Per-source losses
        (val_loss/<source>) and length buckets (analysis/lengths.json) where the runs have them.
        """
        if cluster not in CLUSTERS:
            raise UserError(f"--cluster must be one of {', '.join(CLUSTERS)}, got {cluster!r}")
        if not runs.is_dir():
            raise UserError(f"{runs} is not a runs folder")
        if reference == candidate:
            raise UserError(f"--reference and --candidate are both {reference!r}: a difference of an "
                            "architecture with itself is 0 by construction; name two architectures")
        if plot is not None and plot.suffix.lower() not in (".png", ".pdf", ".svg"):
            raise UserError(f"--plot {plot}: use a .png, .pdf or .svg file name")
        if plot is not None:
            check_output_file(plot, "figure (--plot)", force=force, inputs=[runs])
        points = with_validation_ids(runs, read_runs_dir(runs, warn=warn))
        if min_tokens > 0:
            points = at_least_tokens(points, min_tokens)
            if points.empty:
                raise UserError(f"no budget of at least {min_tokens:g} tokens in {runs}")
        where = tuple(where or ())
        length_notes: list[str] = []   # pairs whose buckets are left out: named in the notes
        # the buckets of the runs the filters keep (compare applies the same filters to the points)
        lengths = length_buckets(runs, filter_rows(points, where, "the runs' points"), reference, candidate,
                                 notes=length_notes)
        res = compare(points, reference, candidate, cluster=cluster, lengths=lengths,
                      length_notes=length_notes, where=where)

        def draw() -> None:
            from scaling import plots

            plots.save(plots.compare(res), plot)

        def show() -> None:
            print_result(res, cells)
            if plot is not None:
                stdout.print(f"figure: {plot}", highlight=False)

        finish(json_out, res.to_dict, show, plot=None if plot is None else draw)
