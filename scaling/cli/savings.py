"""`smelt-scale savings`: training compute the candidate saves over the reference on the optimal frontier."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

import numpy as np
import typer
from rich.table import Table

from scaling.cli._util import (
    COLUMN_HELP,
    MAX_BOOTSTRAP,
    check_distinct,
    finish,
    one_path,
    parse_budgets,
    parse_sparsities,
    run_cli,
    stdout,
    warn,
    where_option,
)
from scaling.common.errors import UserError
from scaling.common.format import number
from scaling.fitting.envelope import BUDGET_TOLERANCE
from scaling.fitting.fit import DEFAULT_BOOTSTRAP
from scaling.fitting.reference_laws import LAW_SETS
from scaling.fitting.savings import (
    WITHHOLD_DECADES,
    SavingsResult,
)
from scaling.fitting.savings_answer import METHODS, answer_savings
from scaling.fitting.sources import DEFAULT_RUNS, read_points
from scaling.fitting.tables import Columns

_AT = {"candidate": "candidate-budget", "reference": "reference-budget"}

LawSetName = Literal[tuple(LAW_SETS)]  # choices: listed in --help and completed


def print_result(res: SavingsResult) -> None:
    who = "candidate" if res.convention == "candidate-budget" else "reference"
    stdout.print(f"[bold]Compute savings of {res.candidate} over {res.reference}[/bold] — convention "
                 f"[bold]{res.convention}[/bold]: the budget is the {who}'s; savings = 1 − "
                 f"C_{res.candidate} / C_{res.reference} at equal loss on the frontier.", highlight=False)
    if res.source:
        stdout.print(f"source: {res.source}", highlight=False, markup=False)
    if res.where:
        stdout.print(f"points kept by --where {' and '.join(repr(w) for w in res.where)}: "
                     f"{res.n_points_kept} of {res.n_points}", highlight=False, markup=False)
    sparse = any(r.sparsity is not None for r in res.rows)
    level = f"{100 * res.ci_level:.4g}% CI"
    table = Table(title_justify="left")
    cols = ["budget", *(["S"] if sparse else []), "method", f"C {res.candidate}", f"C {res.reference}",
            "loss", "savings", level, "loss gap", "D/param ref", "D/param cand", "extrap."]
    for c in cols:
        table.add_column(c, justify="right", no_wrap=True)
    notes = []
    for r in res.rows:
        S = [f"{r.sparsity:.3g}" if r.sparsity is not None else "—"] if sparse else []
        ex = ("—" if r.extrapolation_decades is None else f"{r.extrapolation_decades:+.2f} dec"
              if not r.below_data_decades else f"{r.below_data_decades:.2f} dec below")
        if r.savings is None:
            notes.append(f"budget {r.budget:.3g}: no estimate — {r.reason}")
            table.add_row(f"{r.budget:.3g}", *S, r.method, "—", "—", "—", f"no estimate [{len(notes)}]",
                          "—", "—", "—", "—", ex)
            continue
        ci = "—" if r.savings_ci is None else f"[{100 * r.savings_ci[0]:.1f}, {100 * r.savings_ci[1]:.1f}]%"
        mark = " (extrapolated!)" if r.extrapolated else ""
        table.add_row(f"{r.budget:.3g}", *S, r.method, f"{r.candidate_compute:.4g}",
                      f"{r.reference_compute:.4g}",
                      f"{r.candidate_loss:.4f}", f"{100 * r.savings:.2f}%{mark}", ci,
                      "—" if not np.isfinite(r.loss_gap) else f"{r.loss_gap:+.4f}", _num(r.tokens_per_param),
                      _num(r.candidate_tokens_per_param), ex)
    stdout.print(table)
    for i, n in enumerate(notes, 1):
        stdout.print(f"[{i}] {n}", highlight=False, markup=False)
    for c in res.cross_checks:
        ci = "" if c.savings_ci is None else f" [{100 * c.savings_ci[0]:.1f}, {100 * c.savings_ci[1]:.1f}]%"
        stdout.print(f"cross-check at {c.budget:.3g}: {c.method} {100 * c.savings:.2f}%{ci}", highlight=False)
    if res.savings_range is not None:
        lo, hi = res.savings_range
        answered = [r for r in res.rows if r.savings is not None]
        inside = [r.savings for r in answered if not r.below_data_decades
                  and (r.extrapolation_decades is None or r.extrapolation_decades <= 0)]
        part = ("" if len(inside) == len(answered) else
                "; none inside the fitted compute" if not inside else
                f"; inside the fitted compute {100 * min(inside):.2f}% to {100 * max(inside):.2f}% over "
                f"{len(inside)}")
        stdout.print(f"savings range: {100 * lo:.2f}% to {100 * hi:.2f}% over {len(answered)} row(s)"
                     f"{part}.", highlight=False)
    stdout.print("method: envelope = observed loss-compute frontiers inside the data (no law; seeds of a "
                 f"configuration averaged, computes within {BUDGET_TOLERANCE:.0%} one budget), law = fitted "
                 "or published laws. loss gap = L_ref − L_cand at equal compute (nats/token); D/param = "
                 "optimal tokens per parameter at the budget (laws only; smelt form: D/(F/6)); extrap. = "
                 "decades beyond the largest fitted compute, or below the smallest (\"below\": an "
                 "extrapolation too).", highlight=False)


def _num(x: float) -> str:
    """Tokens per parameter: one decimal, or two significant digits below 1 (an extrapolated law can
    put D*/N* at 4e-4, which one decimal printed as 0.0)."""
    return number(x, ".1f" if abs(x) >= 1 else ".2g", missing="—")


def register(app: typer.Typer) -> None:
    @app.command("savings")
    @run_cli
    def savings_cmd(
        budget: Optional[str] = typer.Option(None, "--budget", help="Training budget C in FLOPs, e.g. 1e21."),
        budgets: Optional[str] = typer.Option(None, "--budgets", help="Several budgets: 1e19,1e20,1e21 "
                                              "or lo:hi:n log-spaced (1e18:1e24:7)."),
        runs_arg: Optional[Path] = typer.Argument(
            None, metavar="[RUNS]", help="Runs folder or table, as --runs (either one)."
        ),
        runs: Optional[Path] = typer.Option(None, "--runs", help="Runs folder or table to fit on the fly "
                                            "(default: the shipped runs/ folder)."),
        fits: Optional[Path] = typer.Option(None, "--fits",
                                            help="Fits file written by `smelt-scale fit --out`."),
        law_set: Optional[LawSetName] = typer.Option(None, "--law-set",
                                              help=f"Published laws instead of fits: {', '.join(LAW_SETS)}."),
        reference: str = typer.Option("baseline", "--reference", help="Group whose compute is saved on."),
        candidate: str = typer.Option("smelt", "--candidate", help="Group that saves compute."),
        at: Literal["candidate", "reference"] = typer.Option(
            "candidate", "--at", help="Whose budget C is: candidate (the paper's convention) or reference."),
        sparsity: Optional[list[str]] = typer.Option(
            None, "--sparsity", help="Sparsity S in [0, 1) for smelt-form laws (repeatable or "
            "comma-separated; default: the law set's, or for fitted laws the median of the fitted "
            "data's distinct sparsities, which need not be one they trained at)."),
        law: Literal["chinchilla", "smelt"] = typer.Option("chinchilla", "--law",
                                help="Law form for fitting --runs: chinchilla or smelt."),
        n_bootstrap: int = typer.Option(DEFAULT_BOOTSTRAP, "--bootstrap", min=0, max=MAX_BOOTSTRAP,
                                        help="Bootstrap resamples when "
                                        "fitting --runs (0: no interval)."),
        seed: int = typer.Option(0, "--seed", min=0, help="Seed of the bootstrap resamples."),
        ci_level: float = typer.Option(0.95, "--ci-level", help="Level of the savings interval."),
        method: Literal["auto", "envelope", "law"] = typer.Option(
            "auto", "--method", help="auto: the fitted laws where both are "
            "identified and fit (the envelope inside the data is their cross-check); "
            "otherwise the envelope (observed frontiers, no law) inside the data and no "
            "estimate outside it (--max-extrapolation, --extrapolate); envelope: only the "
            "envelope (other budgets refused); "
            "law: only laws."),
        max_extrapolation: float = typer.Option(WITHHOLD_DECADES, "--max-extrapolation",
                                                help="Decades beyond the fitted compute past which an "
                                                "unidentified law gives no point estimate (default 0: "
                                                "an extrapolation from it is no result)."),
        extrapolate: bool = typer.Option(False, "--extrapolate", help="Print those estimates anyway, "
                                         "marked as extrapolated."),
        where: Optional[list[str]] = where_option(
            "runs' points", "\"seed <= 4\", \"tier != 'iso-d04'\"",
            "The envelope and the fits both see only the points kept. Columns: those of `fit runs/`."),
        n_col: Optional[str] = typer.Option(None, help=COLUMN_HELP["n_col"]),
        d_col: Optional[str] = typer.Option(None, help=COLUMN_HELP["d_col"]),
        c_col: Optional[str] = typer.Option(None, help=COLUMN_HELP["c_col"]),
        loss_col: str = typer.Option("loss", help=COLUMN_HELP["loss_col"]),
        group_col: Optional[str] = typer.Option(None, help=COLUMN_HELP["group_col"]),
        run_col: Optional[str] = typer.Option(None, help=COLUMN_HELP["run_col"]),
        flops_per_nd: Optional[float] = typer.Option(None, help=COLUMN_HELP["flops_per_nd"]),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
    ) -> None:
        """Compute saved by the candidate over the reference at equal loss on the compute-optimal frontier.

        Laws are minimised along C = F·D (smelt form) or C = F(N)·D (chinchilla form, with
        F(N) = k·N + e·√N + c fitted to the runs' FLOPs per token).

        Default (the SMELT paper's convention): the candidate trains with C and reaches L*_cand(C).

        The reference needs C_ref to reach that loss: savings = 1 − C/C_ref.

        --at reference puts the budget on the reference instead.

        With bootstrapped fits the interval pairs the two groups' resamples by index.

        Default (--method auto): fitted laws that are identified and fit their points answer at every
        budget, and inside the data the observed loss-compute frontiers (the envelope: seeds of one
        size and token count averaged, computes within 5% one budget; bootstrap over run pairs)
        cross-check them: a warning names each budget where the two intervals do not
        overlap. Laws that are not identified or misfit answer only outside the data; inside, the
        envelope does. Each row names its method.

        A law that is not identified (a parameter on its bound, or most bootstrap fits on one), or
        that misfits its points (a systematic residual trend), gives no number more than
        --max-extrapolation decades beyond its data: the row says why (savings null and a reason
        in --json), unless --extrapolate.
        """
        runs = one_path(runs_arg, runs)
        if method not in METHODS:
            raise UserError(f"--method must be auto, envelope or law, got {method!r}")
        if not (np.isfinite(max_extrapolation) and max_extrapolation >= 0):
            raise UserError(f"--max-extrapolation must be a non-negative number of decades, "
                            f"got {max_extrapolation}")
        C = parse_budgets(budget, budgets)
        if at not in _AT:
            raise UserError(f"--at must be candidate or reference, got {at!r}")
        sources = (("--runs", runs), ("--fits", fits), ("--law-set", law_set))
        given = [name for name, v in sources if v is not None]
        if len(given) > 1:
            raise UserError(f"give one source of laws, not {' and '.join(given)}")
        check_distinct(reference, candidate)
        S = parse_sparsities(sparsity)
        if method == "envelope" and (law_set is not None or fits is not None):
            raise UserError("--method envelope needs runs (--runs PATH or the default runs/), not "
                            + ("--law-set" if law_set is not None else "--fits"))
        cols = Columns(n=n_col, d=d_col, c=c_col, loss=loss_col, group=group_col, run=run_col,
                       flops_per_nd=flops_per_nd, where=tuple(where or ()))
        named = [flag for flag, v in (("--n-col", n_col), ("--d-col", d_col), ("--c-col", c_col),
                                      ("--group-col", group_col), ("--run-col", run_col),
                                      ("--flops-per-nd", flops_per_nd),
                                      ("--loss-col", None if loss_col == "loss" else loss_col))
                 if v is not None]
        if named and (law_set is not None or fits is not None):
            raise UserError(f"{', '.join(named)} name columns of a runs table; "
                            + ("--law-set" if law_set is not None else "--fits") + " reads none")
        points = path = n_read = None
        if law_set is None and fits is None:
            path = DEFAULT_RUNS if runs is None else runs
            points, n_read = read_points(path, is_default=runs is None, warn=warn, columns=cols)
        res = answer_savings(reference, candidate, C, method=method, points=points, path=path, runs=runs,
                             fits=fits, law_set=law_set, law=law, convention=_AT[at], n_bootstrap=n_bootstrap,
                             seed=seed, level=ci_level, sparsities=S, max_extrapolation=max_extrapolation,
                             extrapolate=extrapolate, warn=warn, where=tuple(where or ()), n_read=n_read)
        finish(json_out, res.to_dict, lambda: print_result(res))
