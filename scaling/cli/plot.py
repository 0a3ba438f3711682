"""`smelt-scale plot KIND --out DIR`: the paper figures of a runs folder (``scaling.plots``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Literal, Optional

import numpy as np
import typer
from rich.table import Table

from scaling.cli._util import (
    DPI_RANGE,
    MAX_BOOTSTRAP,
    check_distinct,
    check_output_folder,
    emit_json,
    one_path,
    parse_budgets,
    run_cli,
    stderr,
    stdout,
    warn,
)
from scaling.common.errors import UserError
from scaling.fitting.sources import DEFAULT_RUNS, default_sparsity

KINDS = ("loss-curves", "fits", "isoflop", "residuals", "params", "frontier", "savings", "sink", "lengths",
         "icl")
FORMATS = ("png", "pdf", "svg")
KindName = Literal[(*KINDS, "all")]  # choices: listed in --help and completed
FormatName = Literal[FORMATS]


class _Context:
    """Loads each input once, on first use: curves, points, fits, savings, saved analyses."""

    def __init__(self, runs: Path, n_bootstrap: int, seed: int, fits_file: Optional[Path],
                 budgets: Optional[str], reference: str, candidate: str, law: str):
        self.runs, self.n_bootstrap, self.seed, self.fits_file = runs, n_bootstrap, seed, fits_file
        self.budgets_text, self.reference, self.candidate, self.law = budgets, reference, candidate, law
        self._cache: dict[str, Any] = {}
        self.quiet = False

    def _get(self, key: str, make: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    @property
    def curves(self):
        from scaling.fitting.curves import read_curves

        return self._get("curves", lambda: read_curves(self.runs, warn=warn))

    @property
    def points(self):
        from scaling.fitting.tables import load_points

        return self._get("points", lambda: load_points(self.runs, warn=warn))

    @property
    def fits(self):
        def make():
            from scaling.fitting.fit import FitSet, fit_groups

            if self.fits_file is not None:
                return dict(FitSet.load(self.fits_file).fits)
            if not self.quiet:
                stderr.print(f"fitting {self.runs} ({self.law} law, {self.n_bootstrap} bootstrap resamples)",
                             highlight=False)
            out = fit_groups(self.points, self.law, n_bootstrap=self.n_bootstrap, seed=self.seed,
                             cross_checks=False)
            for g, f in out.items():
                for w in f.diagnostics.get("warnings", []):
                    warn(f"fit of {g}: {w}")
            return out

        return self._get("fits", make)

    def pair(self):
        fits = self.fits
        for g in (self.reference, self.candidate):
            if g not in fits:
                raise UserError(f"no fit for group {g!r}; groups: {', '.join(fits)}")
        return fits[self.reference], fits[self.candidate]

    def savings(self):
        def make():
            from scaling.fitting.savings import FittedLaw, withhold_unidentified
            from scaling.fitting.savings_sweep import savings_over

            ref_fit, cand_fit = self.pair()
            ref, cand = FittedLaw.from_fit(ref_fit), FittedLaw.from_fit(cand_fit)
            lo = min(f.data_summary.get("compute_min", np.inf) for f in (ref_fit, cand_fit))
            hi = max(f.data_summary.get("compute_max", 0.0) for f in (ref_fit, cand_fit))
            if self.budgets_text is not None:
                budgets = parse_budgets(None, self.budgets_text)
            else:  # four per decade from the smallest fitted compute's decade to 1e22
                start = np.floor(np.log10(lo)) if np.isfinite(lo) else 18.0
                budgets = np.logspace(start, 22.0, int(round(4 * (22.0 - start))) + 1)
            S = self.sparsity()
            kw = {} if S is None else {"sparsities": (S,)}
            res, skipped = savings_over(ref, cand, budgets, **kw)
            # what `smelt-scale savings` withholds, the figure marks as such (dashed, no number)
            res = withhold_unidentified(res, ref, cand, extrapolate=True)
            if skipped:
                warn(f"savings left out at {len(skipped)} budget(s) from {skipped[0].budget:.3g} to "
                     f"{skipped[-1].budget:.3g}: {skipped[0].reason}")
            for w in res.warnings:
                warn(w)
            return res, (lo, hi)

        return self._get("savings", make)

    def observed_savings(self):
        """The envelope's savings (law-free) at the figure's budgets inside the data, and whether both
        laws are identified and fit their points: where they are not, the envelope is what
        `smelt-scale savings` answers inside the data (None when the runs are not a folder or table
        of points)."""
        def make():
            from scaling.fitting.envelope import figure_budgets, observed_savings
            from scaling.fitting.savings import law_distrust

            # the rule of `savings` (law_distrust): not identified, or a misfit
            identified = law_distrust({f.group: f.diagnostics for f in self.pair()}) is None
            if self.fits_file is not None:
                return None, identified
            lo, hi = self.savings()[1]
            if not (np.isfinite(lo) and np.isfinite(hi) and hi > lo):
                return None, identified
            rows = observed_savings(self.points, self.runs, self.reference, self.candidate,
                                    figure_budgets(lo, hi), n_bootstrap=self.n_bootstrap, seed=self.seed)
            return rows, identified

        return self._get("observed_savings", make)

    def sparsity(self) -> Optional[float]:
        """None for chinchilla-form fits; for smelt-form ones the one default sparsity of fitted
        laws (``scaling.fitting.sources.default_sparsity``: one value keeps the frontier and the
        savings one curve each)."""
        ref, cand = self.pair()
        if "S" not in ref.law_obj.inputs and "S" not in cand.law_obj.inputs:
            return None
        return default_sparsity(s for f in (ref, cand) for s in f.data_summary.get("sparsities", []))

    def analyses(self, kind: str):
        from scaling.analysis.results import saved_analyses

        return self._get(f"analysis:{kind}", lambda: saved_analyses(self.runs, kind, warn=warn))


def _figures(kind: str, ctx: _Context) -> list[tuple[str, Any]]:
    """(file stem, Figure) pairs of one KIND; UserError when its inputs are missing."""
    from scaling import plots
    from scaling.fitting.slices import isoflop_slices

    if kind == "loss-curves":
        return [("loss_curves_tokens", plots.loss_curves(ctx.curves, x="tokens")),
                ("loss_curves_flops", plots.loss_curves(ctx.curves, x="flops"))]
    if kind == "fits":
        return [("fits", plots.fits(ctx.points, ctx.fits))]
    if kind == "isoflop":
        return [("isoflop", plots.isoflop(isoflop_slices(ctx.points), ctx.points, ctx.fits))]
    if kind == "residuals":
        return [("residuals", plots.residuals(ctx.points, ctx.fits))]
    if kind == "params":
        return [("params", plots.params(ctx.fits))]
    if kind == "frontier":
        ctx.pair()
        pair = {g: ctx.fits[g] for g in (ctx.reference, ctx.candidate)}
        return [("frontier", plots.frontier(pair, ctx.points, sparsity=ctx.sparsity()))]
    if kind == "savings":
        res, data_range = ctx.savings()
        observed, identified = ctx.observed_savings()
        return [("savings", plots.savings(res, data_range=data_range, observed=observed,
                                          laws_identified=identified))]
    hint = (f"run `smelt-scale analyze {kind} RUN...` first (e.g. on "
            "runs-cpu-proxy-2026-12-02/proxy-s-baseline-s0 runs-cpu-proxy-2026-12-02/proxy-s-smelt-s0)")
    if kind == "sink":
        out = []
        for stem, k in (("sink", "sink"), ("sink_dyck", "sink_dyck")):
            found = ctx.analyses(k)
            if found:
                out.append((stem, plots.sink([r for _, r in found])))
        if not out:
            raise UserError(f"no saved sink analysis under {ctx.runs}/*/analysis/; {hint}")
        return out
    if kind == "lengths":
        found = ctx.analyses("lengths")
        if not found:
            raise UserError(f"no saved lengths analysis under {ctx.runs}/*/analysis/; {hint}")
        gains = ctx.analyses("lengths_gain")
        names = {r.run for _, r in found}
        gain = next((g for _, g in gains if g.baseline in names and g.smelt in names), None)
        return [("lengths", plots.lengths([r for _, r in found], gain))]
    if kind == "icl":
        found = ctx.analyses("icl")
        if not found:
            raise UserError(f"no saved icl analysis under {ctx.runs}/*/analysis/; {hint}")
        return [("icl", plots.icl([r for _, r in found]))]
    raise UserError(f"unknown plot kind {kind!r}; choose one of: {', '.join(KINDS)}, all")


def register(app: typer.Typer) -> None:
    @app.command("plot")
    @run_cli
    def plot_cmd(
        kind: KindName = typer.Argument(..., help="Figure, or all."),
        out: Path = typer.Option(..., "--out", help="Folder to write the figures into (created)."),
        runs_arg: Optional[Path] = typer.Argument(
            None, metavar="[RUNS]", help="Runs folder, as --runs (either one)."
        ),
        runs: Optional[Path] = typer.Option(None, "--runs", help="Runs folder (default: the shipped runs/)."),
        fmt: FormatName = typer.Option("png", "--format", help="File format."),
        fits_file: Optional[Path] = typer.Option(None, "--fits", help="Fits file from `smelt-scale fit "
                                                 "--out` instead of fitting the runs (same groups)."),
        law: Literal["chinchilla", "smelt"] = typer.Option("chinchilla", "--law",
                                help="Law form when fitting the runs: chinchilla or smelt."),
        n_bootstrap: int = typer.Option(100, "--bootstrap", min=0, max=MAX_BOOTSTRAP,
                                        help="Bootstrap resamples when fitting (0: no intervals)."),
        seed: int = typer.Option(0, "--seed", min=0, help="Seed of the bootstrap resamples."),
        budgets: Optional[str] = typer.Option(None, "--budgets", help="Savings budgets: a,b,c or lo:hi:n "
                                              "(default: 4 per decade from the data up to 1e22)."),
        reference: str = typer.Option("baseline", "--reference", help="Reference group of frontier/savings."),
        candidate: str = typer.Option("smelt", "--candidate", help="Candidate group of frontier/savings."),
        dpi: int = typer.Option(200, "--dpi", min=DPI_RANGE[0], max=DPI_RANGE[1],
                                help="Resolution of raster formats."),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON object: "
                                      "{\"figures\": [{kind, path}], \"skipped\": [{kind, reason}]}."),
        force: bool = typer.Option(False, "--force", help="Write into an --out folder that is not empty "
                                   "(figures of the same name are replaced)."),
    ) -> None:
        """Draw the paper figures of a runs folder into --out (matplotlib; one file per figure).

        loss-curves: training/validation curves per tier (tokens and FLOPs axes).
        fits, isoflop, residuals, params: the approach-3 fits (bootstrap over runs).
        frontier, savings: L*(C) and the compute SMELT saves over Baseline, with intervals.
        sink, lengths, icl: the saved `smelt-scale analyze` results (runs/<run>/analysis/*.json).

        With `all`, kinds whose inputs are missing (e.g. no saved analyses) are skipped with a warning.
        """
        runs = one_path(runs_arg, runs)
        fmt = fmt.lower().lstrip(".")
        if fmt not in FORMATS:
            raise UserError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
        if kind != "all" and kind not in KINDS:
            raise UserError(f"unknown plot kind {kind!r}; choose one of: {', '.join(KINDS)}, all")
        if n_bootstrap < 0:
            raise UserError(f"--bootstrap must be >= 0, got {n_bootstrap}")
        if dpi < 10:
            raise UserError(f"--dpi must be >= 10, got {dpi}")
        if budgets is not None:
            parse_budgets(None, budgets)  # fail early on a bad --budgets
        from scaling.fitting.laws import get_law

        get_law(law)
        check_distinct(reference, candidate)
        root = DEFAULT_RUNS if runs is None else runs
        if not root.is_dir():
            raise UserError(f"plot reads a runs folder, and {root} is a file (a points table is for `fit`, "
                            "`savings` and `compare`)" if root.is_file() else f"no such runs folder: {root}")
        check_output_folder(out, "figure folder (--out)", force=force, inputs=[root])
        ctx = _Context(root, n_bootstrap, seed, fits_file, budgets, reference, candidate, law)
        ctx.quiet = json_out
        from scaling import plots

        written, skipped = [], []
        for k in (KINDS if kind == "all" else (kind,)):
            try:
                figs = _figures(k, ctx)
            except UserError as exc:
                if kind != "all":
                    raise
                skipped.append({"kind": k, "reason": str(exc)})
                warn(f"{k} skipped: {exc}")
                continue
            for stem, fig in figs:
                path = plots.save(fig, out / f"{stem}.{fmt}", dpi=dpi)
                written.append({"kind": k, "path": str(path)})
        if json_out:
            emit_json({"figures": written, "skipped": skipped})
            return
        table = Table(title=f"figures written to {out}", title_justify="left")
        table.add_column("kind")
        table.add_column("file")
        for w in written:
            table.add_row(w["kind"], w["path"])
        for s in skipped:
            table.add_row(s["kind"], f"skipped: {s['reason']}")
        stdout.print(table)
