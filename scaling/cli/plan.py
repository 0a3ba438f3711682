"""`smelt-scale plan` (the next IsoFLOP runs, as a sweep plan) and `smelt-scale simulate`
(is a study big enough?)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import typer
from rich.table import Table

from scaling.accounting.tiers import ARCHS
from scaling.cli._util import (
    MAX_BOOTSTRAP,
    MAX_TRIALS,
    check_output_file,
    fail,
    finish,
    one_path,
    parse_budgets,
    parse_sparsities,
    run_cli,
    show_progress,
    stderr,
    stdout,
    warn,
)
from scaling.common.errors import UserError
from scaling.common.files import read_config
from scaling.common.format import comment_safe, count, percent
from scaling.common.run_folder import atomic_write_bytes
from scaling.design.grid import PROXY_LR_RULE, PROXY_MIN_TOKENS, PROXY_SMELT_LR_RULE, LrRule
from scaling.design.output import sweep_plan_document
from scaling.design.points import (
    DESIGN_BUDGETS,
    DESIGN_SIZES,
    SimulationDesign,
    default_design,
    savings_budgets,
    savings_sparsities,
)
from scaling.design.proposal import DEFAULT_SIZES, SPREAD_DECADES, Proposal, propose
from scaling.design.simulate import STARTS, SimulationResult, simulate
from scaling.fitting.fit import DEFAULT_BOOTSTRAP, FitSettings
from scaling.fitting.reference_laws import LAW_SETS
from scaling.fitting.sources import LawSource, load_laws
from scaling.training.sweep.plan import load_plan, parse_plan

PLANS_DIR = Path(str(resources.files("scaling").joinpath("resources", "plans")))  # package data
TEMPLATES = {True: PLANS_DIR / "isoflop-proxy.toml", False: PLANS_DIR / "paper-tiers.toml"}
MIN_STEPS = 20  # fewer optimiser updates than this and a run is mostly warm-up


# -- laws ------------------------------------------------------------------------------------------
def _laws(runs: Optional[Path], fits: Optional[Path], law_set: Optional[str], **kwargs: Any) -> LawSource:
    """``scaling.fitting.sources.load_laws`` of both architectures; two sources name their flags."""
    flags = (("--runs", runs), ("--fits", fits), ("--law-set", law_set))
    given = [name for name, v in flags if v is not None]
    if len(given) > 1:
        raise UserError(f"give one source of laws, not {' and '.join(given)}")
    return load_laws(ARCHS, runs=runs, fits=fits, law_set=law_set, warn=warn, **kwargs)


def _rel(path: Path) -> str:
    """A path as the plan should name it: relative to the working directory when inside it."""
    try:
        return (
            os.path.relpath(path.resolve(), Path.cwd())
            if path.resolve().is_relative_to(Path.cwd())
            else str(path)
        )
    except (OSError, ValueError):
        return str(path)


def _read_template(path: Path) -> dict[str, Any]:
    data = read_config(path, "template plan", fmt="toml")
    for k in ("train", "data", "executor"):
        if k in data and not isinstance(data[k], dict):
            raise UserError(f"{path}: [{k}] must be a table, got {type(data[k]).__name__}")
    return {k: data[k] for k in ("train", "data", "executor") if k in data}


# -- plan ------------------------------------------------------------------------------------------
def print_proposal(p: Proposal, plan_file: str | None, runs_dir: str) -> None:
    stdout.print(
        f"[bold]Next IsoFLOP runs[/bold] — {p.law} law, sizes of the [bold]{p.shape}[/bold] shape "
        f"(d_model and expert size scaled, width multiple {p.width_multiple}), {p.sizes_per_budget} sizes "
        f"per budget over ±{p.spread_decades:g} decade around the two optima; each SMELT run is the "
        "matched twin of the Baseline on its row and trains the same tokens D = C / F.",
        highlight=False,
    )
    if p.source:
        stdout.print(f"laws: {p.source}", highlight=False)
    level = f"{100 * p.ci_level:.0f}% CI"
    for s in p.sets:
        where = f"C = {s.budget:.3g} FLOPs" + ("" if s.sparsity is None else f", S = {s.sparsity:g}")
        opt = "; ".join(
            f"{a} {s.size_name}* = {o['size']:.4g}, D* = {o['tokens']:.4g}, L* = {o['loss']:.4f}"
            for a, o in s.optima.items()
        )
        table = Table(title=f"{where}: {opt}", title_justify="left")
        for c in ("tier", "arch", "N", "F/token", "S", "D", "C", "vs opt.", "exp. loss", level):
            table.add_column(c, justify="left" if c in ("tier", "arch") else "right", no_wrap=True)
        for pt in s.points:
            ci = "—" if pt.loss_ci is None else f"[{pt.loss_ci[0]:.4f}, {pt.loss_ci[1]:.4f}]"
            table.add_row(
                pt.tier,
                pt.arch,
                count(pt.N),
                f"{pt.F:.4g}",
                f"{pt.S:.4f}",
                f"{pt.D:.4g}",
                f"{pt.compute:.4g}",
                f"{pt.offset_decades:+.2f} dec",
                f"{pt.expected_loss:.4f}",
                ci,
            )
        stdout.print(table)
        stdout.print(
            "  "
            + "; ".join(
                f"{a}: optimum {'inside' if s.bracketed[a] else 'OUTSIDE'} the sizes, profile rises "
                f"{100 * s.profile_depth[a]:.2f}% at the nearer edge, parabola vertex "
                + (
                    "—"
                    if s.vertex_offset_decades[a] is None
                    else f"{s.vertex_offset_decades[a]:+.3f} dec from the optimum"
                )
                for a in ARCHS
            )
            + (
                f"; budget {s.extrapolation_decades:+.2f} decades from the largest fitted compute"
                if s.extrapolation_decades is not None
                else ""
            ),
            highlight=False,
        )
    stdout.print(
        f"{p.n_runs} runs, {p.total_flops:.4g} training FLOPs in all; runs go to {runs_dir}.", highlight=False
    )
    if plan_file:
        stdout.print(
            f"wrote {plan_file}: run it with `smelt-scale sweep {plan_file}` "
            f"(`--dry-run` first for time estimates).",
            highlight=False,
        )
    else:
        stdout.print("dry run: no plan file written.", highlight=False)


def _check_round_trip(doc: dict[str, Any], proposal: Proposal, where: Path | None) -> Any:
    """Parse the emitted plan as the sweep will and check it rebuilds exactly the proposed configs."""
    plan = parse_plan(doc, where)
    want = {(pt.tier, pt.arch): pt for s in proposal.sets for pt in s.points}
    for run in plan.runs:
        pt = want.get((run.tier, run.arch))
        if pt is None or run.model != pt.config or list(run.budgets) != [pt.D]:
            fail(
                f"internal error: the emitted plan rebuilds {run.name} differently from the proposal", code=1
            )
    return plan


def _short_runs(proposal: Proposal, template: dict[str, Any]) -> list[str]:
    """Runs too short to say much: fewer than MIN_STEPS updates (mostly warm-up), and for proxy
    shapes fewer than PROXY_MIN_TOKENS tokens (still on the early loss plateau, docs/proxy-study.md
    section 1)."""
    batch = template.get("train", {}).get("batch_size")
    if not isinstance(batch, int) or batch < 1:
        return []
    out = []
    for s in proposal.sets:
        for pt in s.arch_points("baseline"):
            steps = pt.D / (batch * pt.config.seq_len)
            if steps < MIN_STEPS:
                out.append(f"{pt.tier}: {steps:.1f} optimiser updates of {batch} sequences (mostly warm-up)")
            elif proposal.proxy and pt.D < PROXY_MIN_TOKENS:
                out.append(f"{pt.tier}: {pt.D:,.0f} tokens, below the {PROXY_MIN_TOKENS:,} a proxy run "
                           "needs to leave the early loss plateau (docs/proxy-study.md)")
    return out


def _template(template: Optional[Path], proposal: Proposal) -> tuple[Path, dict[str, Any]]:
    """The template plan (given, or the shipped one for the proposal's kind of shape) and its train,
    data and executor tables (none, with a warning, when the shipped one is missing)."""
    tpl_path = template if template is not None else TEMPLATES[proposal.proxy]
    if tpl_path.exists() or template is not None:
        return tpl_path, _read_template(tpl_path)
    warn(f"no template plan at {tpl_path}: the plan has no [train] section (TrainConfig defaults)")
    return tpl_path, {}


def _write_plan(out: Path, doc: dict[str, Any], proposal: Proposal, src: LawSource, tpl_path: Path,
                tpl: dict[str, Any], json_out: bool) -> str:
    """Write the plan file with a header saying where it comes from, and check it reads back."""
    import tomli_w

    header = (
        f"# Proposed by `smelt-scale plan`: {proposal.n_runs} runs, "
        f"{proposal.total_flops:.4g} FLOPs.\n"
        f"# Laws: {src.source}\n"
        f"# Shape {proposal.shape} (d_model, expert_hidden scaled; width multiple "
        f"{proposal.width_multiple}); each tier's SMELT twin is derived by the matcher.\n"
        f"# Train/data/executor copied from "
        f"{comment_safe(str(tpl_path)) if tpl else 'nothing (defaults)'}.\n"
    )
    text = header + tomli_w.dumps(doc)
    import tomllib

    _check_round_trip(tomllib.loads(text), proposal, out)  # as the sweep will read it, before writing
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out, text.encode())  # never half-written; a link at out is replaced, not followed
    plan = load_plan(out)
    if not json_out:
        stderr.print(f"wrote {out} ({len(plan.runs)} runs)", highlight=False)
    return str(out)


# -- simulate --------------------------------------------------------------------------------------
def _pct(v: float | None, digits: int = 1) -> str:
    return percent(v, digits, missing="—")


def _share(v: float | None, n: int) -> str:
    """A share of n trials as a count beside the percentage: 8 trials make 100%, not 100.0%."""
    return "—" if v is None else f"{round(v * n)}/{n} ({100 * v:.0f}%)"


def print_simulation(res: SimulationResult) -> None:
    d = res.design
    stdout.print(
        f"[bold]Simulated study[/bold]: {res.trials} trials of synthetic losses from the known laws "
        f"× exp({res.noise:g}·z), fitted with the real fitter ({res.bootstrap} bootstrap resamples, "
        f"starts: {res.starts}), savings of {res.candidate} over {res.reference} (candidate-budget "
        f"convention). Seed {res.seed}.",
        highlight=False,
    )
    stdout.print(f"laws: {res.source}", highlight=False)
    stdout.print(
        f"design: {d.get('source', '')}: "
        + ", ".join(f"{g} {n} points / {d['n_runs'][g]} runs" for g, n in d.get("n_points", {}).items())
        + f", compute {d['compute_range'][0]:.3g}–{d['compute_range'][1]:.3g} FLOPs"
        + (f", sparsities {', '.join(f'{s:g}' for s in d['sparsities'])}" if d.get("sparsities") else ""),
        highlight=False,
    )
    sparse = any(r.sparsity is not None for r in res.rows)
    table = Table(title_justify="left")
    cols = [
        "budget",
        *(["S"] if sparse else []),
        "true",
        "mean est.",
        "bias",
        "spread (sd)",
        "rmse",
        "sign right",
        "CI excl. 0",
        "shown",
        f"coverage ({100 * res.ci_level:.0f}%)",
        "median CI width",
        "extrap.",
    ]
    for c in cols:
        table.add_column(c, justify="right", no_wrap=True)
    for r in res.rows:
        table.add_row(
            f"{r.budget:.3g}",
            *([f"{r.sparsity:.3g}"] if sparse else []),
            _pct(r.true_savings, 2),
            _pct(r.mean_savings, 2),
            _pct(r.bias, 2),
            _pct(r.spread, 2),
            _pct(r.rmse, 2),
            _share(r.sign_recovery, r.n_trials),
            _share(r.power, r.n_trials),
            _share(r.power_shown, r.n_trials),
            _share(r.coverage, r.n_trials),
            _pct(r.median_ci_width, 2),
            "—" if r.extrapolation_decades is None else f"{r.extrapolation_decades:+.2f} dec",
        )
    stdout.print(table)
    stdout.print(
        "savings in % of the reference's compute; bias = mean − true; sign right = trials whose "
        "estimate has the true sign; CI excl. 0 = trials whose interval excludes 0 on that side; "
        "shown = those of them whose estimate `savings` would print (not withheld as an "
        "unidentified or misfitting law beyond the data); "
        "coverage = intervals containing the true savings; extrap. = decades beyond the design's "
        "largest compute.",
        highlight=False,
    )
    ident = ", ".join(f"{g} {100 * v:.0f}%" for g, v in res.identified_rate.items())
    stdout.print(f"fits identified ({res.identified_basis}): {ident}", highlight=False)
    if res.start_check:
        c = res.start_check
        stdout.print(
            f"warm-start check: {c['trials_checked']} fits refitted from the full grid, "
            f"{c['grid_lower_objective']} found a lower objective",
            highlight=False,
        )


def register(app: typer.Typer) -> None:
    @app.command("plan")
    @run_cli
    def plan_cmd(
        budget: Optional[str] = typer.Option(None, "--budget", help="IsoFLOP budget C in FLOPs, e.g. 1e20."),
        budgets: Optional[str] = typer.Option(
            None, "--budgets", help="Several budgets: 1e19,1e20 or lo:hi:n."
        ),
        runs_arg: Optional[Path] = typer.Argument(
            None, metavar="[RUNS]", help="Runs folder or table, as --runs (either one)."
        ),
        runs: Optional[Path] = typer.Option(
            None, "--runs", help="Runs folder or table to fit (default: the shipped runs/ folder)."
        ),
        fits: Optional[Path] = typer.Option(
            None, "--fits", help="Fits file written by `smelt-scale fit --out`."
        ),
        law_set: Optional[str] = typer.Option(
            None, "--law-set", help=f"Published laws instead of fits: {', '.join(LAW_SETS)}."
        ),
        law: str = typer.Option(
            "chinchilla", "--law", help="Law form for fitting --runs: chinchilla or smelt."
        ),
        n_bootstrap: int = typer.Option(
            DEFAULT_BOOTSTRAP,
            "--bootstrap",
            min=0,
            max=MAX_BOOTSTRAP,
            help="Bootstrap resamples when fitting --runs (0: no loss interval).",
        ),
        seed: int = typer.Option(0, "--seed", min=0, help="Seed of the bootstrap resamples."),
        runs_per_budget: int = typer.Option(
            DEFAULT_SIZES, "--runs-per-budget", help="Model sizes per budget and architecture (5 to 50)."
        ),
        spread: float = typer.Option(
            SPREAD_DECADES, "--spread", help="Decades beyond each optimum the sizes reach on either side."
        ),
        sparsity: Optional[list[str]] = typer.Option(
            None,
            "--sparsity",
            help="Sparsities for smelt-form laws "
            "(one IsoFLOP set each; default: the law set's, or the "
            "median of the fitted runs').",
        ),
        tier: Optional[str] = typer.Option(
            None,
            "--tier",
            help="Reference shape whose d_model and expert size "
            "are scaled (default: the tier nearest the Baseline optimum that can "
            "build every size).",
        ),
        template: Optional[Path] = typer.Option(
            None,
            "--template",
            help="Plan whose train, data and executor "
            "tables the new plan copies (default: the IsoFLOP study's for proxy shapes, "
            "plans/paper-tiers.toml otherwise).",
        ),
        lr_rule: Optional[str] = typer.Option(
            None,
            "--lr-rule",
            help="Peak lr per size, LR,EXPONENT[,D_REF]: lr = LR (d_model / D_REF)^-EXPONENT (D_REF 6) "
            f"(default for proxy shapes: {PROXY_LR_RULE.lr_ref:g},{PROXY_LR_RULE.exponent:g}, the lr "
            "sweep's; otherwise the template's one lr); 'none': the template's lr for every size.",
        ),
        smelt_lr_rule: Optional[str] = typer.Option(
            None,
            "--smelt-lr-rule",
            help="The SMELT twins' own peak lr, LR,EXPONENT[,D_REF] of the Baseline's d_model (default for "
            "proxy shapes without --lr-rule: "
            f"{PROXY_SMELT_LR_RULE.lr_ref:g},{PROXY_SMELT_LR_RULE.exponent:g}, "
            "the twins' lr sweep; otherwise each twin trains at its Baseline's lr); 'none': at its "
            "Baseline's lr.",
        ),
        runs_dir: Optional[str] = typer.Option(
            None,
            "--runs-dir",
            help="Where the sweep writes the runs (default: the --runs folder, so that the next fit sees "
            "old and new runs together; the default template and lr rule are that study's; else "
            "runs-<plan name>).",
        ),
        out: Path = typer.Option(Path("plans/next.toml"), "--out", help="Plan file to write (an existing "
                                 "file only with --force)."),
        force: bool = typer.Option(False, "--force", help="Replace an existing --out plan (never an input: "
                                   "--template, --fits, --runs)."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Propose and check the plan; write nothing."),
        ci_level: float = typer.Option(0.95, "--ci-level", help="Level of the expected-loss intervals."),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables."),
    ) -> None:
        """Propose the next IsoFLOP set at budget C for both architectures and write it as a sweep plan.

        Sizes are log-spaced around each law's compute-optimal size N*(C) (F*(C) for smelt-form laws).

        Each Baseline scales a reference tier's widths; its SMELT twin comes from the matcher; both train D
        = C / F.

        Expected losses carry the fits' bootstrap intervals. Run the plan with `smelt-scale sweep PLAN`.
        """
        runs = one_path(runs_arg, runs)
        C = parse_budgets(budget, budgets)
        given_rule = LrRule.parse_optional(lr_rule)   # a typo: before any fitting
        given_twin = LrRule.parse_optional(smelt_lr_rule, "--smelt-lr-rule")
        if not dry_run:
            check_output_file(out, "plan file (--out)", force=force, inputs=[runs, fits, template])
        src = _laws(runs, fits, law_set, law=law, n_bootstrap=n_bootstrap, seed=seed)
        S = src.sparsities(parse_sparsities(sparsity))
        proposal = propose(
            src.laws,
            C,
            tier=tier,
            n_sizes=runs_per_budget,
            spread=spread,
            sparsities=S,
            level=ci_level,
            noise=src.noise,
            source=src.source,
        )
        tpl_path, tpl = _template(template, proposal)
        if runs_dir is None:
            runs_dir = _rel(src.runs_dir) if src.runs_dir is not None else f"runs-{out.stem}"
        # without --lr-rule, proxy sizes take the lr sweep's rule (the template's one lr is right
        # for no proxy size: docs/proxy-study.md section 2)
        rule = given_rule if lr_rule is not None else (PROXY_LR_RULE if proposal.proxy else None)
        # the twins' own rule belongs with the Baseline rule it was measured beside: by default only
        # when both come from the lr sweep
        twin_default = PROXY_SMELT_LR_RULE if proposal.proxy and lr_rule is None else None
        twin = given_twin if smelt_lr_rule is not None else twin_default
        doc = sweep_plan_document(proposal, name=out.stem, runs_dir=runs_dir, template=tpl, lr_rule=rule,
                                  smelt_lr_rule=twin)
        _check_round_trip(doc, proposal, None)
        warnings = list(proposal.warnings) + [f"short run {s}" for s in _short_runs(proposal, tpl)]
        plan_file = None if dry_run else _write_plan(out, doc, proposal, src, tpl_path, tpl, json_out)
        for w in warnings:
            warn(w)
        finish(json_out, lambda: {
            **proposal.to_dict(),
            "warnings": warnings,
            "plan_file": plan_file,
            "runs_dir": runs_dir,
            "template": str(tpl_path) if tpl else None,
            "sweep_command": None if plan_file is None else f"smelt-scale sweep {plan_file}",
        }, lambda: print_proposal(proposal, plan_file, runs_dir))

    @app.command("simulate")
    @run_cli
    def simulate_cmd(
        law_set: Optional[str] = typer.Option(
            None, "--law-set", help=f"Known laws: {', '.join(LAW_SETS)} (default: paper, unless --fits)."
        ),
        fits: Optional[Path] = typer.Option(
            None, "--fits", help="Known laws from `smelt-scale fit --out` (groups baseline and smelt)."
        ),
        sparsity: Optional[list[str]] = typer.Option(
            None,
            "--sparsity",
            help="Sparsities the savings are "
            "evaluated at (smelt-form laws; default: the law set's, or "
            "the design's median).",
        ),
        noise: float = typer.Option(
            0.01,
            "--noise",
            help="Standard deviation of log loss (multiplicative lognormal noise; 0.01 is about 1%).",
        ),
        run_share: float = typer.Option(
            0.0,
            "--run-share",
            help="Share of the noise variance common to the points of one run (its WSD branches), in "
            "[0, 1); 0: every point independent, which overstates what a branch design can tell.",
        ),
        design: Optional[Path] = typer.Option(
            None,
            "--design",
            help="Sweep plan whose (N, D) points are "
            "simulated (default: an IsoFLOP design over the laws' compute "
            f"range, {DESIGN_BUDGETS} budgets x {DESIGN_SIZES} sizes).",
        ),
        trials: int = typer.Option(100, "--trials", min=1, max=MAX_TRIALS, help="Simulated studies."),
        budget: Optional[str] = typer.Option(None, "--budget", help="Budget C (FLOPs) of the savings."),
        budgets: Optional[str] = typer.Option(
            None,
            "--budgets",
            help="Several budgets: 1e20,1e21 or lo:hi:n "
            "(default: the law set's published budgets, else the design's "
            "largest compute and 10x it).",
        ),
        n_bootstrap: int = typer.Option(
            50, "--bootstrap", min=0, max=MAX_BOOTSTRAP, help="Bootstrap resamples per fit (0: no intervals)."
        ),
        seed: int = typer.Option(0, "--seed", min=0, help="Seed of the noise and the resamples."),
        ci_level: float = typer.Option(0.95, "--ci-level", help="Level of the savings intervals."),
        starts: str = typer.Option(
            "warm",
            "--starts",
            help=f"Fit starts per trial: {' | '.join(STARTS)} "
            "(warm: from the noise-free fit's optimum; grid: the full grid, slow).",
        ),
        check_starts: int = typer.Option(
            1,
            "--check-starts",
            help="With warm starts, refit this many trials from the full grid to check the warm start.",
        ),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
    ) -> None:
        """Simulate a study: synthetic losses from known laws, real fits, and how well the savings are
        recovered.

        Losses are the known law times exp(noise * z) at the design's points, fitted with the real fitter.

        Answers "is this sweep big enough?": sign recovery, bias and spread of the savings estimate, and
        coverage of its bootstrap intervals over trials.
        """
        src = _laws(None, fits, law_set, seed=seed, default="law_set")
        truth = {g: replace(fl, samples=None) for g, fl in src.laws.items()}
        given_s = parse_sparsities(sparsity)
        if given_s and not src.smelt_form:
            raise UserError("--sparsity applies only to smelt-form laws; these are chinchilla-form")
        if design is not None:
            the_design = SimulationDesign.of_sweep_plan(load_plan(design), str(design))
        else:
            the_design = default_design(src, truth)
        S = savings_sparsities(src, the_design, given_s)
        if budget is None and budgets is None:
            C = savings_budgets(src, the_design)
        else:
            C = parse_budgets(budget, budgets)
        with _trials_bar(json_out, trials) as progress:
            res = simulate(
                truth,
                the_design.points,
                C,
                FitSettings(n_bootstrap=n_bootstrap, seed=seed, ci_level=ci_level),
                sparsities=S,
                noise=noise,
                run_share=run_share,
                trials=trials,
                starts=starts,
                check_starts=check_starts,
                design_source=the_design.source,
                source=src.source,
                progress=progress,
            )
        for w in res.warnings:
            warn(w)
        finish(json_out, res.to_dict, lambda: print_simulation(res))


@contextmanager
def _trials_bar(json_out: bool, trials: int) -> Iterator[Callable[[int, int], None] | None]:
    """A transient progress bar over the simulated trials (None when bars are off)."""
    if not show_progress(json_out):
        yield None
        return
    from rich.progress import Progress

    bar = Progress(console=stderr, transient=True)
    task = bar.add_task("trials", total=trials)
    bar.start()
    try:
        yield lambda done, total: bar.update(task, completed=done)
    finally:
        bar.stop()
