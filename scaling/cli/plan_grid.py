"""`smelt-scale plan-grid`: an IsoFLOP study on one shared size grid (scaling.design.grid), as
sweep plans: the main study and, when asked, further seeds."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table

from scaling.cli._util import (
    FORCE_HELP,
    check_output_file,
    emit_json,
    parse_budgets,
    run_cli,
    stderr,
    stdout,
)
from scaling.common.errors import UserError
from scaling.common.files import read_config


def _ints(text: Optional[str], what: str) -> tuple[int, ...]:
    if text is None or not text.strip():
        return ()
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise UserError(f"{what} must be comma-separated integers, got {text!r}") from None


def _pairs(text: Optional[str], what: str) -> dict[int, int]:
    out: dict[int, int] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        d, sep, j = item.partition(":")
        try:
            if not sep:
                raise ValueError
            out[int(d)] = int(j)
        except ValueError:
            raise UserError(f"{what}: expected D_MODEL:BUDGET_INDEX pairs like 4:2,6:2, "
                            f"got {item!r}") from None
    return out


def _lr_rule(text: str):
    from scaling.design.grid import LrRule

    return LrRule.parse(text)


def _optional_rule(text: Optional[str], flag: str):
    from scaling.design.grid import LrRule

    return LrRule.parse_optional(text, flag)


def register(app: typer.Typer) -> None:
    @app.command("plan-grid")
    @run_cli
    def plan_grid_cmd(
        grid: str = typer.Option(..., "--grid",
                                 help="Baseline d_model values, e.g. 4,6,10,14,20,28,40,56,80."),
        budgets: str = typer.Option(..., "--budgets", help="IsoFLOP budgets in FLOPs: a,b,c or lo:hi:n."),
        lr_rule: str = typer.Option(..., "--lr-rule",
                                    help="LR,EXPONENT[,D_REF]: lr(d) = LR * (d / D_REF)^-EXPONENT "
                                         "(D_REF default 6), e.g. from an lr sweep."),
        smelt_lr_rule: Optional[str] = typer.Option(
            None, "--smelt-lr-rule",
            help="LR,EXPONENT[,D_REF]: the SMELT twins' own rule, d = the Baseline's d_model (e.g. from "
                 "the twins' lr sweep); default or 'none': each twin trains at its Baseline's lr."),
        shape: str = typer.Option("proxy-xxs", "--shape", help="Tier whose Baseline shape is scaled."),
        min_tokens: int = typer.Option(
            150_000, "--min-tokens", min=1,
            help="A size serves a budget only if it trains at least this many tokens."),
        last_budget: Optional[str] = typer.Option(
            None, "--last-budget",
            help="D_MODEL:INDEX pairs: the last budget (0-based) a size trains to, e.g. 4:2,6:2 "
                 "(default: the last)."),
        extra_seed_sizes: Optional[str] = typer.Option(
            None, "--extra-seed-sizes", help="d_model values that also train with the --extra-seeds."),
        extra_seed_budgets: str = typer.Option("0,1", "--extra-seed-budgets",
                                               help="Budget indices the extra seeds train to."),
        extra_seeds: str = typer.Option("1", "--extra-seeds",
                                        help="The seeds of the --extra-seed-sizes, e.g. 1,2 (written to "
                                             "<stem>-seeds.toml)."),
        archs: str = typer.Option("baseline,smelt", "--archs",
                                  help="Architectures to train, e.g. smelt: retrain one side of a study "
                                       "whose other side is trained at the same settings."),
        template: Path = typer.Option(..., "--template",
                                      help="Plan whose [train] and [executor] tables the study copies "
                                           "(the lr comes from --lr-rule)."),
        runs_dir: str = typer.Option("runs", "--runs-dir", help="Where the sweep writes the runs."),
        out: Path = typer.Option(Path("plans/isoflop-study.toml"), "--out",
                                 help="Plan file; the extra seeds go beside it as <stem>-seeds.toml."),
        force: bool = typer.Option(False, "--force", help=FORCE_HELP),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print the grid; write nothing."),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON object instead of a table."),
    ) -> None:
        """Plan an IsoFLOP study on one shared size grid: one WSD trunk per size, a cooldown branch at each
        budget's D = C / F. Use it before a law is worth centring sizes on (`smelt-scale plan` does that)."""
        import tomllib

        import tomli_w

        from scaling.accounting.tiers import get_config
        from scaling.common.run_folder import atomic_write_bytes
        from scaling.design.grid import grid_documents, grid_header, grid_plan
        from scaling.training.sweep.plan import parse_plan

        C = parse_budgets(None, budgets)
        plan = grid_plan(get_config(shape, "baseline"), _ints(grid, "--grid"), [float(c) for c in C],
                         lr_rule=_lr_rule(lr_rule), min_tokens=min_tokens,
                         last_budget=_pairs(last_budget, "--last-budget"),
                         extra_seed_sizes=_ints(extra_seed_sizes, "--extra-seed-sizes"),
                         extra_seed_budgets=_ints(extra_seed_budgets, "--extra-seed-budgets"),
                         extra_seeds=_ints(extra_seeds, "--extra-seeds"),
                         smelt_lr_rule=_optional_rule(smelt_lr_rule, "--smelt-lr-rule"))
        second_out = out.with_name(f"{out.stem}-seeds{out.suffix}")
        if not dry_run:
            check_output_file(out, "plan file (--out)", force=force, inputs=[template])
            check_output_file(second_out, "extra-seed plan file", force=force, inputs=[template])
        tpl = read_config(template)
        for table in ("train", "executor"):
            if not isinstance(tpl.get(table, {}), dict):
                raise UserError(f"{template}: [{table}] must be a table, got {type(tpl[table]).__name__}")
        main, second = grid_documents(plan, name=out.stem, runs_dir=runs_dir, train=tpl.get("train", {}),
                                      executor=tpl.get("executor", {}),
                                      archs=[a.strip() for a in archs.split(",") if a.strip()])
        written: list[str] = []
        # the command as given, in a fixed order, so the header says how to write the file again
        args = [("--grid", grid), ("--budgets", budgets), ("--lr-rule", lr_rule),
                ("--smelt-lr-rule", smelt_lr_rule), ("--shape", shape),
                ("--min-tokens", str(min_tokens)), ("--last-budget", last_budget),
                ("--extra-seed-sizes", extra_seed_sizes), ("--extra-seed-budgets", extra_seed_budgets),
                ("--extra-seeds", None if extra_seeds == "1" else extra_seeds),
                ("--archs", None if archs == "baseline,smelt" else archs),
                ("--template", str(template)), ("--runs-dir", runs_dir), ("--out", str(out))]
        command = "smelt-scale plan-grid " + " ".join(f"{k} {shlex.quote(v)}" for k, v in args if v)
        header = grid_header(plan, command)
        texts = [(path, header + tomli_w.dumps(doc)) for path, doc in ((out, main), (second_out, second))
                 if doc is not None]
        for path, text in texts:
            parse_plan(tomllib.loads(text), path)  # what the sweep will read: refused before any write,
        for path, text in texts if not dry_run else ():  # and by a dry run alike
            path.parent.mkdir(parents=True, exist_ok=True)  # its nearest existing folder was checked
            atomic_write_bytes(path, text.encode())  # never half-written
            written.append(str(path))
        if json_out:
            emit_json(_json(plan, written))
            return
        stdout.print(_table(plan))
        for w in written:
            stderr.print(f"wrote {w}", highlight=False)


def _table(plan: Any) -> Table:
    table = Table(title=plan.summary().splitlines()[0], title_justify="left")
    twin = plan.smelt_lr_rule is not None
    cols = ("size", "N (active)", "F (FLOPs/token)", "lr", *(("SMELT lr",) if twin else ()),
            "budgets (tokens)")
    for col in cols:
        table.add_column(col, justify="left" if col in ("size", "budgets (tokens)") else "right")
    for s in plan.sizes:
        served = ", ".join(f"{plan.budgets[j]:.3g}: {t:,}" for j, t in zip(s.budget_indices, s.tokens))
        table.add_row(s.name, f"{s.active_params:,}", f"{s.flops_per_token:.4g}", f"{s.lr:.3g}",
                      *((f"{s.smelt_lr:.3g}",) if twin else ()), served)
    return table


def _json(plan: Any, written: list[str]) -> dict[str, Any]:
    return {
        "shape": plan.shape,
        "budgets": list(plan.budgets),
        "lr_rule": _rule_json(plan.lr_rule),
        "smelt_lr_rule": None if plan.smelt_lr_rule is None else _rule_json(plan.smelt_lr_rule),
        "extra_seeds": list(plan.extra_seeds) if plan.extra_seed_sizes else [],
        "sizes": [{"name": s.name, "d_model": s.config.d_model, "active_params": s.active_params,
                   "flops_per_token": s.flops_per_token, "lr": s.lr, "smelt_lr": s.smelt_lr,
                   "budgets": [plan.budgets[j] for j in s.budget_indices], "tokens": list(s.tokens)}
                  for s in plan.sizes],
        "sizes_per_budget": [len(plan.sizes_at(j)) for j in range(len(plan.budgets))],
        "plan_files": written,
    }


def _rule_json(rule: Any) -> dict[str, float]:
    return {"lr_ref": rule.lr_ref, "exponent": rule.exponent, "d_ref": rule.d_ref}
