"""`smelt-scale fit`: approach-3 scaling-law fits per group, with bootstrap intervals and cross-checks."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Literal, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from scaling.cli._util import (
    COLUMN_HELP,
    MAX_BOOTSTRAP,
    check_output_file,
    finish,
    run_cli,
    schema_name,
    show_progress,
    stderr,
    stdout,
    warn,
    where_option,
)
from scaling.common.errors import UserError
from scaling.common.format import decimals, number
from scaling.common.run_folder import atomic_write_bytes
from scaling.fitting.approaches import ESTIMATORS, collapsed, cross_check_groups
from scaling.fitting.fit import (
    DEFAULT_BOOTSTRAP,
    DEFAULT_DELTA,
    DEFAULT_OBJECTIVE,
    OBJECTIVES,
    Constraints,
    FitResult,
    FitSet,
    FitSettings,
    ParamMap,
    attach_floor_profiles,
    fit_groups,
)
from scaling.fitting.laws import LAWS, get_law
from scaling.fitting.result import profile_text
from scaling.fitting.tables import Columns

# Library messages name the quantity; these are the flags that set it.
ROLE_FLAGS = {"parameter column": "--n-col", "token column": "--d-col", "loss column": "--loss-col",
              "compute column": "--c-col", "group column": "--group-col", "run column": "--run-col",
              "FLOPs-per-token column": "--flops-col", "sparsity column": "--sparsity-col",
              "lr column": "--lr-col", "seed column": "--seed-col",
              "row filter": "--where", "unit": "--n-col/--d-col/--c-col NAME:UNIT",
              "FLOPs per parameter per token": "--flops-per-nd", "holdout": "--holdout",
              "IsoFLOP": "--isoflop-estimator/--isoflop-window"}

LawName = Literal[tuple(LAWS)]  # choices: listed in --help and completed
ObjectiveName = Literal[tuple(OBJECTIVES)]


def with_flags(exc: Exception) -> str:
    """A library message with the flags of the quantities it names."""
    msg = str(exc)
    flags = [f for role, f in ROLE_FLAGS.items() if role in msg]
    return msg + (f" (set with {', '.join(dict.fromkeys(flags))})" if flags else "")


def load_fit_table(path: Path, cols: "Columns"):
    """load_table with flag hints on errors; each note and skipped run printed once, as a warning."""
    from scaling.fitting.tables import load_table

    try:
        table = load_table(path, cols)
    except UserError as exc:
        raise UserError(with_flags(exc)) from None
    for m in table.messages():
        warn(with_flags(m))
    return table


def print_table_mapping(table, json_out: bool = False) -> None:
    """One line: which column was taken as what (stdout; stderr beside --json)."""
    m = table.mapping
    parts = [f"{k} <- {v}" for k, v in m.items()]
    kept = (f"; {table.rows_kept} of {table.rows_read} rows kept by --where"
            if table.settings.get("where") else "")
    k = (f"; k = {table.settings['flops_per_nd']:g} FLOPs per parameter per token (--flops-per-nd)"
         if table.settings.get("flops_per_nd_used") else "")
    (stderr if json_out else stdout).print(f"columns: {'; '.join(parts)}{k}{kept}", highlight=False,
                                           markup=False)


def print_holdout(result) -> None:
    level = 100 * result.level
    for g, s in result.summary.items():
        t = Table(title=f"{g}: held out {result.rule} ({s['n_heldout']} points; fitted on {s['n_fitted']}, "
                        f"N <= {s['fitted_N_max']:.3g}, C <= {s['fitted_compute_max']:.3g})",
                  title_justify="left")
        for name, just in (("run", "left"), ("N", "right"), ("D", "right"), ("C", "right"),
                           ("observed", "right"), ("predicted", "right"), (f"{level:.0f}% interval", "right"),
                           ("error (nats)", "right"), ("error (log)", "right"), ("inside", "center")):
            t.add_column(name, justify=just)
        for r in result.heldout[result.heldout["group"] == g].itertuples():
            inside = "-" if r.inside is None else ("yes" if r.inside else "NO")
            t.add_row(str(r.run), f"{r.N:.3g}", f"{r.D:.3g}", f"{r.compute:.3g}", f"{r.observed:.4f}",
                      f"{r.predicted:.4f}", f"[{_fmt(r.lo)}, {_fmt(r.hi)}]", f"{r.error_nats:+.4f}",
                      f"{r.error_log:+.4f}", inside)
        stdout.print(t)
    stdout.print(result.summary_text(), highlight=False, markup=False)


def _fmt(x: float) -> str:
    return number(x, ".5g")


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
    cons = [f"{k}={v:g} fixed" for k, v in (fit.settings.get("fixed") or {}).items()]
    cons += [f"{t} tied" for t in fit.settings.get("tied") or []]
    if fit.settings.get("shared"):
        cons.append(f"{', '.join(fit.settings['shared'])} shared by {', '.join(fit.joint_groups)} "
                    f"(joint fit, joint objective {d.get('joint_objective', math.nan):.10g})")
    if cons:
        stdout.print("  constraints: " + "; ".join(cons), highlight=False)
    gof = d.get("goodness_of_fit") or {}
    if gof.get("tested"):
        stdout.print(f"  goodness of fit: {'MISFIT' if gof['misfit'] else 'ok'} (quadratic trend of the log "
                     f"residuals {gof['trend_rms']:.3g} RMS vs scatter {gof['scatter_rms']:.3g}, "
                     f"p = {gof['p_value']:.2g}; worst residual "
                     f"{gof['worst_residual_in_scatter']:.1f}x scatter)",
                     highlight=False)
    ea, eb = law.allocation_exponents
    if law.budget_uses_k:
        cost = fit.cost
        # the per-token FLOPs are measured, not Kaplan's 6 N: say so where they are used (issue 29)
        fitted = (f", fitted to the points' FLOPs per token, worst error {100 * cost.max_rel_error:.2g}%"
                  if cost.max_rel_error or not cost.linear else "")
        stdout.print(f"  compute: C = F(N) D, F(N) = {cost.describe()}{fitted}", highlight=False)
    if "G" in fit.derived and ea in fit.derived:
        x = law.size_input
        kk = f"{fit.cost.k:.3g} " if law.budget_uses_k else ""
        limit = "" if not law.budget_uses_k or fit.cost.linear else ", its large-budget limit"
        stdout.print(f"  allocation (approach 3, C = {kk}{x} D{limit}): "
                     f"{x}* = G C^{ea} = {fit.derived['G']:.4g} "
                     f"C^{fit.derived[ea]:.4f}, "
                     f"D* = H C^{eb} = {fit.derived['H']:.4g} C^{fit.derived[eb]:.4f}  "
                     f"(G {_ci(fit, 'G', '.4g')}, H {_ci(fit, 'H', '.4g')}, {ea} {_ci(fit, ea, '.4f')})",
                     highlight=False)
    if "a_data" in fit.derived:
        stdout.print(f"  across the data's compute ({fit.data_summary['compute_min']:.3g} to "
                     f"{fit.data_summary['compute_max']:.3g} FLOPs, C = F(N) D): {x}* ~ C^"
                     f"{fit.derived['a_data']:.4f} {_ci(fit, 'a_data', '.4f')}", highlight=False)
    for key in ("approach1", "approach2"):
        c = fit.cross_checks.get(key)
        if not c:
            continue
        label = c.get("method", key)
        if c.get("available"):
            extra = ""
            ci = _ci_text(c.get("a_ci"))
            if key == "approach2":
                extra = f", {c['n_buckets']} compute buckets"
                if "design_bias" in c:
                    extra += (f"; whole-sweep parabola minus window on these points: {c['design_bias']:+.3f} "
                              f"(largest vertex shift {c['max_abs_vertex_shift_decades']:.2f} decades)")
                if "a_cubic" in c:  # the window's shape check (scaling.fitting.approaches)
                    extra += (f"; cubics through the same points: a = {c['a_cubic']:.3f}"
                              f"{_ci_text(c['a_cubic_ci'])}")
            else:
                extra = f", {c['mode']}, {c['n_frontier']} frontier points"
                if ci.startswith(" ["):
                    extra += f"; the interval is {a1_ci_note(c)}"
            stdout.print(f"  {label}: a = {c['a']:.3f}{ci}{extra}", highlight=False)
        else:
            stdout.print(f"  {label}: not available: {c['reason']}", highlight=False)
    prof = fit.cross_checks.get("floor_profile")
    if prof:
        stdout.print("  " + profile_text(prof, law.size_input), highlight=False)


def merged_warnings(fits: "dict[str, FitResult] | list[FitResult]") -> list[str]:
    """Each fit warning once: the same message for several groups becomes one line naming them."""
    groups_of: dict[str, list[str]] = {}
    for f in (fits.values() if isinstance(fits, dict) else fits):
        for w in [*f.diagnostics.get("warnings", []), *f.cross_checks.get("warnings", [])]:
            groups_of.setdefault(w, [])
            if f.group not in groups_of[w]:
                groups_of[w].append(f.group)
    return [f"{', '.join(gs)}: {w}" for w, gs in groups_of.items()]


ZERO_WIDTH = " (no interval: zero width, the frontier is on one step of the size grid)"


def _ci_text(ci: list | None) -> str:
    """" [lo, hi]" of an exponent, to the estimate's three decimals; " (no interval)" where its ends
    are not numbers (approach 1 when too few seed resamples give an estimate), "" without one.

    A collapsed interval (``scaling.fitting.approaches.collapsed``: frontier points exactly on a
    line) is no interval either; ``[a, a]`` would be the most confident interval the tool can print
    (numbers audit of 2026-12-07, finding 9). A narrow one that is not collapsed gets the decimals
    (up to 9) that tell its ends apart, so it never reads as ``[a, a]``."""
    if not ci:
        return ""
    if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in ci):
        return " (no interval)"
    if collapsed(ci):
        return ZERO_WIDTH
    d = decimals(*ci)
    return f" [{ci[0]:.{d}f}, {ci[1]:.{d}f}]"


# approach 1's interval under-covers on planted laws (scaling/fitting/approaches.py, measured by
# benchmarks/interval_coverage.py): the table marks it rather than let the title's 95% stand for it
A1_CI_NOTES = {
    True: "a lower bound on the uncertainty (a seed bootstrap; it covered a planted exponent in 76-79% of "
          "simulated studies of training curves, 85-98% of IsoFLOP studies where it had an interval)",
    False: "a lower bound on the uncertainty (an OLS interval over correlated frontier points; on simulated "
           "studies with seeds averaged it covered a planted exponent in 21.5-62%)",
}


def a1_ci_note(c: dict) -> str:
    """Why approach 1's interval is not a 95% one, by how it was made (``ci_method`` marks the seed
    bootstrap)."""
    return A1_CI_NOTES["ci_method" in c]


def _a_text(c: dict | None, mark: str = "") -> str:
    if not c or not c.get("available"):
        return "—"
    ci = _ci_text(c.get("a_ci"))
    return f"{c['a']:.3f}" + ci + (mark if ci.startswith(" [") else "")


def print_summary(fits: "dict[str, FitResult]") -> None:
    """The compute-optimal size exponent of the three approaches side by side, then what the fits
    do and do not say, in plain words."""
    groups = list(fits.values())
    if not groups:
        return
    law = groups[0].law_obj
    ea = law.allocation_exponents[0]
    x = law.size_input
    table = Table(title=f"compute-optimal size exponent a ({x}* ∝ C^a), 95% intervals", title_justify="left")
    for c in ("group", "approach 1 (frontier)", "approach 2 (IsoFLOP)", "approach 3 (law)"):
        table.add_column(c, justify="right" if c != "group" else "left", no_wrap=True)
    marked = []   # approach-1 checks whose interval the table marks
    spans = []    # (group, exponent range over the allowed floors) of laws not identified
    for f in groups:
        key = "a_data" if "a_data" in f.derived else ea
        a3 = f.derived.get(key)
        a3_text = "—" if a3 is None else f"{a3:.3f} {_ci(f, key, '.3f')}".replace(" [-]", "")
        span = (f.cross_checks.get("floor_profile") or {}).get(f"{key}_range")
        if a3 is not None and not f.diagnostics.get("identified") and span and math.isfinite(span[0]):
            a3_text += " †"
            spans.append(f"{span[0]:.3f} to {span[1]:.3f} ({f.group})")
        a1_text = _a_text(f.cross_checks.get("approach1"), " *")
        if a1_text.endswith(" *"):
            marked.append(f.cross_checks["approach1"])
        table.add_row(f.group, a1_text, _a_text(f.cross_checks.get("approach2")), a3_text)
    captions = []
    for note in dict.fromkeys(a1_ci_note(c) for c in marked):
        captions.append(f"* approach 1's interval is {note}, not 95%")
    if spans:
        captions.append("† the law is not identified: over the floors the points allow (loss-floor "
                        "profile) the best fit's exponent moves from " + ", ".join(spans)
                        + ": the floor's part of its uncertainty, beside the bootstrap interval's")
    if any("a_data" in f.derived for f in groups):
        # approaches 1 and 2 see the data's compute range: compare them with the law there
        captions.append("approach 3: the law's frontier across the data's compute (F(N) is not k N there; "
                        "its large-budget limit a is in the allocation line)")
    if captions:
        table.caption = "\n".join(captions)
    stdout.print(table)
    says: dict[str, list[str]] = {}
    not_says: dict[str, list[str]] = {}

    def add(to: dict[str, list[str]], group: str, text: str) -> None:
        to.setdefault(text, []).append(group)

    for f in groups:
        d = f.diagnostics
        a2 = f.cross_checks.get("approach2") or {}
        if d.get("identified") and not d.get("misfit"):
            add(says, f.group, "the law is identified and fits its points")
        elif f.bootstrap.shape[0] == 0 and d.get("point_fit_sound") and not d.get("misfit"):
            # --bootstrap 0: nothing was resampled, so nothing can be said either way
            add(not_says, f.group, "whether the law is identified: no bootstrap was run (--bootstrap 0), "
                                   "and its best fit is sound")
        else:
            why = (["not identified"] if not d.get("identified") else []) + (
                ["a misfit"] if d.get("misfit") else [])
            add(not_says, f.group, f"the law is {' and '.join(why)}: its parameters, loss floor and "
                                   "extrapolations are not supported by the data")
        if a2.get("available"):
            says.setdefault(f"{f.group}: IsoFLOP minima at {a2['n_buckets']} budgets give a = {_a_text(a2)} "
                            "without the law", [])
        elif f.law_obj.size_input != "N" or f.law_obj.fixed_inputs:
            pass   # approaches 1 and 2 are run for laws of N and D only (approaches.cross_checks)
        else:
            add(not_says, f.group, "no law-free exponent: fewer than 3 budgets bracket an IsoFLOP minimum")
    def line(d: dict[str, list[str]]) -> str:
        return "; ".join(f"{', '.join(gs)}: {t}" if gs else t for t, gs in d.items())
    stdout.print("[bold]What the data say[/bold]: " + (line(says) if says else "nothing firm") + ".",
                 highlight=False)
    if not_says:
        stdout.print("[bold]What they do not say[/bold]: " + line(not_says) + ".", highlight=False)


def _ci(fit: FitResult, key: str, spec: str = ".5g") -> str:
    lo, hi = fit.ci.get(key, (math.nan, math.nan))
    return f"[{number(lo, spec)}, {number(hi, spec)}]" if math.isfinite(lo) else "[-]"


def print_at_budget(fit: FitResult, at: dict) -> None:
    """x*, D*, L* at one budget with intervals (``fit --at C``)."""
    parts = []
    for name in [k for k in at if f"{k}_ci" in at]:
        lo, hi = at[f"{name}_ci"]
        ci = f" [{_fmt(lo)}, {_fmt(hi)}]" if math.isfinite(lo) else ""
        parts.append(f"{name}* = {_fmt(at[name])}{ci}")
    where = ""
    up, down = at.get("extrapolation_decades"), at.get("below_data_decades")
    if down:
        where = f"; {down:.2f} decades below the fitted compute (extrapolated"
    elif up is not None and up > 0:
        where = f"; {up:.2f} decades beyond the fitted compute (extrapolated"
    if where:
        where += ", and the law is not identified: no result)" if not at.get("identified", True) else ")"
    at_s = f" and S = {at['S']:g}" if at.get("S") is not None else ""
    stdout.print(f"  at C = {at['C']:.3g} FLOPs{at_s}: " + ", ".join(parts) + where, highlight=False)


def register(app: typer.Typer) -> None:
    @app.command()
    @run_cli
    def fit(
        path: Path = typer.Argument(..., help="A runs directory (runs/<run>/final.json) or a CSV, JSONL, "
                                              "JSON or Parquet table of points."),
        law: LawName = typer.Option("chinchilla", "--law", help="Law form."),
        n_col: Optional[str] = typer.Option(None, help=COLUMN_HELP["n_col"]),
        d_col: Optional[str] = typer.Option(None, help=COLUMN_HELP["d_col"]),
        loss_col: str = typer.Option("loss", help=COLUMN_HELP["loss_col"]),
        group_col: Optional[str] = typer.Option(None, help="Column to group fits by. Default: arch when "
                                                           "present (said so), else one group; 'none': one "
                                                           "group even with an arch column."),
        c_col: Optional[str] = typer.Option(None, help=COLUMN_HELP["c_col"]),
        flops_col: str = typer.Option("flops_per_token",
                                      help="Column of training FLOPs per token F (smelt law)."),
        sparsity_col: str = typer.Option("sparsity",
                                         help="Column of compute-equivalent sparsity S (smelt law)."),
        seed_col: Optional[str] = typer.Option(None, help="Column of each run's training seed (default: "
                                                          "one named seed, if any): approach 1 averages "
                                                          "the seeds of a configuration; 'none': every "
                                                          "run apart."),
        lr_col: Optional[str] = typer.Option(None, help="Column of each run's peak learning rate (default: "
                                                        "one named lr, if any; a runs folder: each run's "
                                                        "config.json): where a configuration was trained "
                                                        "at several lrs, only its best lr is fitted; "
                                                        "'none': every point."),
        n_bootstrap: int = typer.Option(DEFAULT_BOOTSTRAP, "--bootstrap", min=0, max=MAX_BOOTSTRAP,
                                        help="Bootstrap resamples over runs (0 = no intervals)."),
        seed: int = typer.Option(0, min=0, help="Seed of the bootstrap resampling."),
        huber_delta: float = typer.Option(DEFAULT_DELTA,
                                          help="Huber delta on log-loss residuals (objective huber-log; "
                                               "least squares: --objective sq-log)."),
        objective: ObjectiveName = typer.Option(DEFAULT_OBJECTIVE, "--objective",
                                      help="Objective: "
                                      + "; ".join(f"{k}: {v}" for k, v in OBJECTIVES.items()) + "."),
        fix: list[str] = typer.Option([], "--fix", help="Pin a parameter exactly, NAME=VALUE (e.g. E=1.7); "
                                                        "repeatable."),
        tie: list[str] = typer.Option([], "--tie", help="Hold parameters equal, NAME=NAME (e.g. alpha=beta); "
                                                        "repeatable."),
        share: Optional[str] = typer.Option(None, "--share",
                                            help="Parameters common to all groups, comma-separated "
                                                 "(e.g. E,beta): one joint fit, bootstrap rows paired "
                                                 "across groups."),
        at: Optional[float] = typer.Option(None, "--at", help="Also print N* (F*), D*, L* at this budget "
                                                              "C (training FLOPs), with intervals."),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
        out: Optional[Path] = typer.Option(None, "--out", help="Also write the JSON object to this file "
                                                               "(read by `smelt-scale savings --fits`)."),
        force: bool = typer.Option(False, "--force", help="Replace an existing --out or --holdout-figure "
                                                          "file (never the input table)."),
        run_col: Optional[str] = typer.Option(None, help=COLUMN_HELP["run_col"]),
        flops_per_nd: Optional[float] = typer.Option(None, help=COLUMN_HELP["flops_per_nd"]),
        where: Optional[list[str]] = where_option(
            "rows", "'loss < 4', '1e6 < N <= 1e8 and arch == \"smelt\"', '`Model Size` > 1e8'",
            "Recorded in the fit's settings."),
        isoflop_estimator: str = typer.Option("window", help="Approach-2 IsoFLOP estimator: window (a "
                                              "parabola within --isoflop-window decades of each minimum; "
                                              "robust to wide sweeps) or parabola (the whole sweep)."),
        isoflop_window: float = typer.Option(1.0, help="Half-width in decades of N of the approach-2 "
                                                       "window."),
        holdout_rule: Optional[str] = typer.Option(
            None, "--holdout", metavar="RULE",
            help="Held-out check instead of a plain fit: largest (each group's largest N), 'N>X' or 'C>X'. "
                 "Fits the rest, predicts the held-out points, reports errors and bootstrap prediction "
                 "intervals."),
        holdout_figure: Optional[Path] = typer.Option(None, help="With --holdout: also draw predicted vs "
                                                                 "observed into this .png/.pdf/.svg."),
    ) -> None:
        """Fit a scaling law per group: Huber loss on log loss, multi-start L-BFGS, bootstrap over runs.

        Approach 3 of Hoffmann et al. (2022), as corrected by Besiroglu et al. (2024).

        Approaches 1 (frontier) and 2 (IsoFLOP parabolas) are printed beside it as cross-checks.

        With --holdout, a held-out extrapolation check instead: fit on the rest, predict the held-out points.
        """
        the_law = get_law(law)
        cons = Constraints.parse(fix=fix, tie=tie, share=[share] if share else [])
        ParamMap.build(the_law, cons, ["check"])  # the names against the law, before any work
        settings = FitSettings(objective=objective, huber_delta=huber_delta, n_bootstrap=n_bootstrap,
                               seed=seed, fix=cons.fixed, tie=cons.ties)
        _check_options(at, holdout_rule, cons, isoflop_estimator, isoflop_window)
        _check_outputs(path, out, holdout_figure, holdout_rule, force)
        cols = Columns(n=n_col, d=d_col, loss=loss_col, group=group_col, c=c_col,
                       flops_per_token=flops_col, sparsity=sparsity_col, seed=seed_col, lr=lr_col,
                       run=run_col, flops_per_nd=flops_per_nd, where=tuple(where or ()))
        table = load_fit_table(path, cols)
        print_table_mapping(table, json_out)
        if holdout_rule is not None:
            _holdout(table, the_law, holdout_rule, settings, holdout_figure, out, json_out)
            return
        # cross-checks are computed once, below, with the chosen IsoFLOP estimator
        fits = _fit_groups(table.points, the_law, settings, json_out, share=list(cons.shared),
                           cross_checks=False)
        fits = cross_check_groups(table.points, fits, estimator=isoflop_estimator, window=isoflop_window)
        fits = attach_floor_profiles(table.points, fits)
        fits = {g: replace(f, settings={**f.settings, "table": table.settings}) for g, f in fits.items()}
        fitset = FitSet(fits)
        at_budget = {g: f.at_budget(at) for g, f in fits.items()} if at is not None else {}

        finish(json_out, lambda: fitset.to_dict(at_budget), lambda: _print_fits(fits, at_budget, out),
               save=None if out is None else (lambda: fitset.save(out, at_budget)),
               warnings=merged_warnings(fits))


def _check_options(at: Optional[float], holdout_rule: Optional[str], cons: Constraints,
                   isoflop_estimator: str, isoflop_window: float) -> None:
    """The option values the fit reaches only after its work, refused before it, worded with the flags."""
    if at is not None and not (math.isfinite(at) and at > 0):
        raise UserError(f"--at: the budget must be a positive number of FLOPs, got {at}")
    if holdout_rule is not None and (cons.shared or at is not None):
        raise UserError("--share and --at apply to the fit itself, not to --holdout")
    if isoflop_estimator not in ESTIMATORS:
        raise UserError(f"--isoflop-estimator must be one of {', '.join(ESTIMATORS)}, "
                        f"got {isoflop_estimator!r}")
    if not isoflop_window > 0:
        raise UserError(f"--isoflop-window must be > 0 decades, got {isoflop_window}")


def _check_outputs(path: Path, out: Optional[Path], holdout_figure: Optional[Path],
                   holdout_rule: Optional[str], force: bool) -> None:
    """--out and --holdout-figure may be written, before any work."""
    if holdout_figure is not None:
        if holdout_rule is None:
            raise UserError("--holdout-figure needs --holdout")
        if holdout_figure.suffix.lower() not in (".png", ".pdf", ".svg"):
            raise UserError(f"--holdout-figure must end in .png, .pdf or .svg, got {holdout_figure.name}")
        check_output_file(holdout_figure, "holdout figure", force=force, inputs=[path])
    if out is not None:
        if holdout_figure is not None and out.resolve() == holdout_figure.resolve():
            raise UserError("--out and --holdout-figure name the same file")
        check_output_file(out, "fits file (--out)", force=force, inputs=[path])


def _fit_groups(points, the_law, settings: FitSettings, json_out: bool, **kwargs) -> "dict[str, FitResult]":
    """fit_groups with a progress display on a terminal: an open-ended bar for the multi-start fit
    (it has no count to show), then a counted bar per group's bootstrap."""
    if not show_progress(json_out):
        return fit_groups(points, the_law, settings, **kwargs)
    if settings.n_bootstrap <= 0:
        with stderr.status(f"fitting {len(points):,} points (multi-start)"):
            return fit_groups(points, the_law, settings, **kwargs)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=stderr, transient=True) as bar:
        fitting = bar.add_task(f"fit of {len(points):,} points (multi-start)", total=None)
        tasks: dict[str, int] = {}

        def progress(group: str, done: int, total: int) -> None:
            if group not in tasks:
                bar.update(fitting, visible=False)
                tasks[group] = bar.add_task(f"bootstrap {group}", total=total)
            bar.update(tasks[group], completed=done)
            if done >= total:
                bar.update(fitting, visible=True)

        return fit_groups(points, the_law, settings, progress=progress, **kwargs)


def _holdout(table, the_law, rule: str, settings: FitSettings, figure: Optional[Path], out: Optional[Path],
             json_out: bool) -> None:
    """--holdout: fit the rest, predict the held-out points, report (and draw, and save)."""
    from scaling.fitting.holdout import holdout

    try:
        result = holdout(table.points, the_law, rule, settings)
    except UserError as exc:
        raise UserError(with_flags(exc)) from None
    for f in result.fits.values():
        for w in f.diagnostics.get("warnings", []):
            warn(f"{f.group} (fitted part): {w}")
    # its "fits" are fit/2 entries: the file loads as a fits file too
    payload = {"schema": schema_name("fit"), **result.to_dict(), "table": table.settings}

    def draw() -> None:
        from scaling import plots

        plots.save(plots.holdout(result), figure)

    def save() -> None:
        from scaling.common.serialize import to_json

        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(out, (to_json(payload) + "\n").encode())  # never half-written

    def show() -> None:
        print_holdout(result)
        for extra in (figure, out):
            if extra is not None:
                stdout.print(f"wrote {extra}", highlight=False)

    finish(json_out, payload, show, save=None if out is None else save,
           plot=None if figure is None else draw)


def _print_fits(fits: "dict[str, FitResult]", at_budget: dict, out: Optional[Path]) -> None:
    for f in fits.values():
        print_fit(f)
        if f.group in at_budget:
            print_at_budget(f, at_budget[f.group])
    for w in merged_warnings(fits):
        warn(w)
    print_summary(fits)
    if out is not None:
        stdout.print(f"wrote {out}", highlight=False)
