"""`smelt-scale analyze sink|lengths|icl RUN...`: the paper's mechanism analyses on trained runs.

Each command loads the runs' final weights (``runs/<run>/final_weights.safetensors``), prints a
table with Baseline and SMELT side by side (``--json``: one document), saves each run's result
to ``runs/<run>/analysis/<kind>.json`` and draws ``--plot FILE.png`` with ``scaling.plots``.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from scaling import analysis as an
from scaling.analysis.dyck import SHOTS, DyckTask
from scaling.cli._util import (
    FORCE_HELP,
    MAX_TRIALS,
    check_output_file,
    emit_json,
    finish,
    run_cli,
    show_progress,
    stderr,
    stdout,
    warn,
)
from scaling.common.device import check_device, check_threads
from scaling.common.errors import UserError
from scaling.common.format import number

RUNS_ARG = typer.Argument(..., help="Run folders (runs/<name>) with final weights.", show_default=False)


def _device(name: str, threads: Optional[int] = None) -> str:
    """Resolve --device; set torch's CPU threads when --threads is given."""
    import torch

    if check_threads(threads) is not None:
        torch.set_num_threads(threads)
    if check_device(name, "--device") == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device {name} requested but CUDA is not available")
    return name


def _status(message: str, enabled: bool):
    return stderr.status(message) if enabled else contextlib.nullcontext()


def _each(loaded, what: str, bar: bool, analyse) -> list:
    """``analyse(run)`` for each loaded run, under a status line naming ``what`` and the run."""
    results = []
    for run in loaded:
        with _status(f"{what} on {run.name}", bar):
            results.append(analyse(run))
    return results


def _report(json_out: bool, results, loaded, save: bool, quiet: bool, plot: Optional[Path], draw: str,
            table) -> None:
    """One result per run: the JSON document ``{"runs": [...]}`` or ``table(results)``, each saved in
    its run's folder with ``--save`` and drawn with ``scaling.plots.<draw>`` to ``plot``."""
    finish(json_out, lambda: {"runs": [r.to_dict() for r in results]},
           lambda: stdout.print(table(results)),
           save=lambda: _save(results, loaded, save, quiet),
           plot=lambda: _plot(draw, plot, quiet, results))


def _writing(runs, save: bool):
    """With ``--save``, hold each run folder's lock from loading its weights to saving the result, so
    that no training replaces the weights (or writes the folder) meanwhile."""
    from scaling.training.loop.lock import held

    return held(runs) if save else contextlib.nullcontext()


def _save(results, runs, save: bool, quiet: bool, computed_from=None) -> None:
    """Save each result in its run's folder with the hash of the weights it was computed on: its
    own run's, or those of every run in ``computed_from`` (a pair's gain)."""
    if not save:
        return
    for result, run in zip(results, runs):
        try:
            weights = [r.weights_record for r in (computed_from or [run])]
            path = an.save_result(result, run.path, weights=weights)
        except OSError as exc:
            warn(f"could not save the {result.result_kind} analysis of {run.name}: {exc.strerror or exc}")
            continue
        if not quiet:
            stderr.print(f"saved {path}", highlight=False)


def _check_plot(path: Optional[Path], force: bool, runs) -> None:
    """Before any work: --plot is a figure name that may be written (see check_output_file)."""
    if path is None:
        return
    if path.suffix.lower() not in (".png", ".pdf", ".svg"):
        raise UserError(f"--plot needs a .png, .pdf or .svg file name, got {path}")
    check_output_file(path, "figure (--plot)", force=force, inputs=runs)


def _plot(draw, path: Optional[Path], quiet: bool, *args) -> None:
    """Draw with a ``scaling.plots`` figure function and save to ``path`` (.png/.pdf/.svg)."""
    if path is None:
        return
    from scaling import plots

    plots.save(getattr(plots, draw)(*args), path)
    if not quiet:
        stderr.print(f"figure {path}", highlight=False)


def _common(batch_size: int, plot: Optional[Path], force: bool, runs, json_out: bool,
            quiet: bool) -> tuple[bool, bool]:
    """The options every analysis shares, checked before any run is loaded; (quiet, status lines)."""
    if batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {batch_size}")
    _check_plot(plot, force, runs)
    quiet = quiet or json_out
    return quiet, show_progress(json_out, quiet)


@contextlib.contextmanager
def _loaded(runs, save: bool, device: str, threads: Optional[int]):
    """The runs loaded on ``device``, their folders locked meanwhile with ``--save`` (``_writing``)."""
    with _writing(runs, save):
        yield an.load_runs(runs, _device(device, threads))


def register(app: typer.Typer) -> None:
    sub = typer.Typer(name="analyze", no_args_is_help=True, add_completion=False,
                      help="Mechanism analyses of trained runs: attention sink, loss by length, Dyck ICL.")

    @sub.command("sink")
    @run_cli
    def sink_cmd(
        runs: list[Path] = RUNS_ARG,
        probe: str = typer.Option("bos", help="bos: validation documents, queries t >= 1; dyck: the paper's "
                                  "probe, k-shot Dyck prompts, mass on BOS vs on the demonstration answers."),
        sequences: int = typer.Option(16, help="Validation documents (bos) or Dyck prompts (dyck) "
                                      "to average over."),
        seed: int = typer.Option(0, min=0, help="Seed choosing the documents / generating the Dyck prompts."),
        shots: Optional[int] = typer.Option(None, help="Dyck probe: demonstrations per prompt "
                                            "(default: the largest of 1..32 that fits the context)."),
        batch_size: int = typer.Option(4, help="Sequences per forward pass (attention maps are "
                                       "T x T per head)."),
        device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
        threads: Optional[int] = typer.Option(None, help="torch CPU threads (default: torch's)."),
        plot: Optional[Path] = typer.Option(None, "--plot", help="Write a figure (.png/.pdf/.svg)."),
        force: bool = typer.Option(False, "--force", help=FORCE_HELP),
        save: bool = typer.Option(True, "--save/--no-save",
                                  help="Write runs/<run>/analysis/sink.json "
                                  "(sink_dyck.json for --probe dyck)."),
        quiet: bool = typer.Option(False, "--quiet", help="No messages on stderr."),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON document: {\"runs\": [...]}."),
    ) -> None:
        """Mean attention mass on the BOS position and on the other tokens, per layer pass.

        A looped (SMELT) layer reports its first and second pass separately.
        Averaged over heads, query positions and sequences.
        The paper (Dyck probe): BOS 0.60 on the first pass, 0.02 on the second;
        demonstration answers 0.24 -> 0.85.
        """
        if probe not in ("bos", "dyck"):
            raise UserError(f"--probe must be bos or dyck, got {probe!r}")
        quiet, bar = _common(batch_size, plot, force, runs, json_out, quiet)
        with _loaded(runs, save, device, threads) as loaded:
            if probe == "bos":
                results = _each(loaded, "bos probe", bar,
                                lambda run: an.attention_sink(run, sequences, seed, batch_size))
            else:
                results = _each(loaded, f"{probe} probe", bar,
                                lambda run: an.dyck_sink(run, sequences, seed, shots, batch_size=batch_size))
            _report(json_out, results, loaded, save, quiet, plot, "sink", _sink_table)

    @sub.command("lengths")
    @run_cli
    def lengths_cmd(
        runs: list[Path] = RUNS_ARG,
        windows: int = typer.Option(64, min=1, help="Fixed validation windows for the position buckets."),
        documents: Optional[int] = typer.Option(None, min=1, help="At most this many validation documents "
                                                "for the length buckets (default: all)."),
        gain: Optional[bool] = typer.Option(None, "--gain/--no-gain", help="SMELT-over-Baseline gain per "
                                            "bucket; needs one baseline and one smelt run (default: when "
                                            "both architectures are given)."),
        batch_size: int = typer.Option(16, help="Sequences per forward pass."),
        device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
        threads: Optional[int] = typer.Option(None, help="torch CPU threads (default: torch's)."),
        plot: Optional[Path] = typer.Option(None, "--plot", help="Write a figure (.png/.pdf/.svg)."),
        force: bool = typer.Option(False, "--force", help=FORCE_HELP),
        save: bool = typer.Option(True, "--save/--no-save", help="Write runs/<run>/analysis/lengths.json "
                                  "(and lengths_gain.json for a pair)."),
        quiet: bool = typer.Option(False, "--quiet", help="No messages on stderr."),
        json_out: bool = typer.Option(False, "--json",
                                      help="Print one JSON document: {\"runs\": [...], \"gain\": ...}."),
    ) -> None:
        """Validation loss by document length and by token position, and SMELT's gain per bucket.

        Buckets adapt to the context T the runs were trained with:
        lengths 1 to T/16, ..., T/2 to T, above T; positions 0 to T/32, ..., T/2 to T.
        Gain = L_baseline - L_smelt (nats/token, > 0: SMELT better) with a paired standard error.
        The paper: the gain on 512-4096-token samples is about 1.52x that on shorter ones.
        """
        quiet, bar = _common(batch_size, plot, force, runs, json_out, quiet)
        with _loaded(runs, save, device, threads) as loaded:
            contexts = sorted({r.seq_len for r in loaded})
            if plot is not None and len(contexts) > 1:
                raise UserError(f"--plot needs runs of one context; these have "
                                f"{', '.join(map(str, contexts))} tokens (the buckets adapt to the "
                                "context); plot each context on its own")
            archs = {r.arch for r in loaded}
            pair = None
            if gain is None and archs == {"baseline", "smelt"} and len(loaded) > 2:
                raise UserError(f"{len(loaded)} runs of both architectures: a gain needs exactly one "
                                "baseline and one smelt run; pass --no-gain to compare the losses only")
            if gain or (gain is None and archs == {"baseline", "smelt"}):
                pair = an.pair_runs(loaded)
            results = _each(loaded, "loss by length", bar,
                            lambda run: an.loss_by_length(run, windows, documents, batch_size))
            by_name = {r.run: r for r in results}
            g = an.length_gain(by_name[pair[0].name], by_name[pair[1].name]) if pair else None

            def save_all() -> None:
                _save(results, loaded, save, quiet)
                if g is not None:
                    _save([g, g], list(pair), save, quiet, computed_from=pair)

            finish(json_out, lambda: {"runs": [r.to_dict(per_sequence=False) for r in results],
                                      "gain": None if g is None else g.to_dict()},
                   lambda: _print_lengths(results, g),
                   save=save_all, plot=lambda: _plot("lengths", plot, quiet, results, g))

    @sub.command("icl")
    @run_cli
    def icl_cmd(
        runs: list[Path] = RUNS_ARG,
        shots: str = typer.Option(",".join(map(str, SHOTS)), help="Comma-separated numbers of in-context "
                                  "demonstrations; those that do not fit the context are skipped."),
        trials: int = typer.Option(200, min=1, max=MAX_TRIALS,
                                    help="Queries per k (the same queries for every k)."),
        seed: int = typer.Option(0, min=0, help="Seed of the Dyck generator."),
        types: int = typer.Option(3, help="Bracket types, 1-4: () [] {} <>."),
        min_pairs: int = typer.Option(2, help="Fewest bracket pairs in a generated word."),
        max_pairs: int = typer.Option(8, help="Most bracket pairs in a generated word."),
        confidence: float = typer.Option(0.95, help="Level of the Wilson binomial interval."),
        batch_size: int = typer.Option(32, help="Prompts decoded together."),
        device: str = typer.Option("auto", help="auto, cpu, cuda or cuda:N."),
        threads: Optional[int] = typer.Option(None, help="torch CPU threads (default: torch's)."),
        plot: Optional[Path] = typer.Option(None, "--plot", help="Write a figure (.png/.pdf/.svg)."),
        force: bool = typer.Option(False, "--force", help=FORCE_HELP),
        save: bool = typer.Option(True, "--save/--no-save", help="Write runs/<run>/analysis/icl.json."),
        quiet: bool = typer.Option(False, "--quiet", help="No messages on stderr."),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON document: {\"runs\": [...]}."),
    ) -> None:
        """Dyck-language completion accuracy ("close the open brackets") with k demonstrations.

        Greedy decoding, exact match of the closing sequence, k in {0,1,2,4,8,16,32} as the context allows.
        Accuracy with a Wilson interval. The paper, 32 shots: SMELT 29.8%, Baseline 26.4%.
        """
        try:
            ks = [int(t) for t in shots.replace(" ", "").split(",") if t]
        except ValueError:
            raise UserError(f"--shots must be comma-separated integers like 0,1,2,4, got {shots!r}") from None
        if not 0 < confidence < 1:
            raise UserError(f"--confidence must be in (0, 1), got {confidence}")
        task = DyckTask(types, min_pairs, max_pairs)
        quiet, bar = _common(batch_size, plot, force, runs, json_out, quiet)
        with _loaded(runs, save, device, threads) as loaded:
            results = _each(loaded, "Dyck ICL", bar,
                            lambda run: an.icl_accuracy(run, ks, trials, seed, task, confidence, batch_size))
            for run, res in zip(loaded, results):
                if res.skipped and not quiet:
                    warn(f"{run.name}: prompts with k = {', '.join(map(str, res.skipped))} "
                         f"demonstrations do not fit its {run.seq_len}-token context; skipped")
            _report(json_out, results, loaded, save, quiet, plot, "icl", _icl_table)

    @sub.command("snapshot-data")
    @run_cli
    def snapshot_cmd(
        runs: list[Path] = RUNS_ARG,
        json_out: bool = typer.Option(False, "--json", help="Print one JSON document: {\"runs\": [...]}."),
    ) -> None:
        """Copy each run's tokenizer and validation split into runs/<run>/eval_data/ (about 0.5 MB).

        Ship it with the final weights: the analyses then run on a fresh clone without building the corpus,
        even where the Python standard library (part of the corpus) differs from the training machine's.
        """
        out = []
        for path in runs:
            with _writing([path], True):
                dest = an.save_eval_data(path)
            size = sum(f.stat().st_size for f in dest.iterdir())
            out.append({"run": Path(path).name, "path": str(dest), "bytes": size})
        if json_out:
            emit_json({"runs": out})
        else:
            for o in out:
                stdout.print(f"{o['run']}: {o['path']} ({o['bytes'] / 1e6:.2f} MB)", highlight=False)

    app.add_typer(sub, name="analyze")


# ----- tables -----------------------------------------------------------------------------
def _print_lengths(results, g) -> None:
    for table in _lengths_tables(results, g):
        stdout.print(table)
    if g is not None:
        # the ratio only with its interval, and none where the short gain may be 0 (LengthGain)
        stdout.print(f"gain on documents >= {g.long_from} tokens {number(g.long_gain, '+.4f')}"
                     f"{_se(g.long_gain_se)}, shorter {number(g.short_gain, '+.4f')}{_se(g.short_gain_se)}: "
                     f"long/short {g.ratio_text()} (paper: about 1.52x)",
                     highlight=False)


def _se(se) -> str:
    return "" if se is None else f" +- {se:.4f}"


def _sink_table(results: list[an.SinkResult]) -> Table:
    dyck = results[0].probe == "dyck"
    title = ("Attention mass per layer pass, Dyck probe (query line of k-shot prompts)" if dyck
             else "Attention mass per layer pass, validation documents (queries t >= 1)")
    table = Table(title=title, title_justify="left")
    table.add_column("layer", justify="right")
    table.add_column("pass", justify="right")
    for r in results:
        label = f"{r.run} ({r.arch})"
        table.add_column(f"{label}\nBOS", justify="right")
        if dyck:
            table.add_column(f"{label}\nanswers", justify="right")
        table.add_column(f"{label}\nother", justify="right")
    for layer, pass_ in an.pass_order(results):
        cells = [str(layer), str(pass_)]
        for r in results:
            p = next((q for q in r.passes if (q.layer, q.pass_) == (layer, pass_)), None)
            cells.append(number(p.bos_mass, ".3f") if p else "")
            if dyck:
                cells.append(number(p.answer_mass, ".3f") if p else "")
            cells.append(number(p.other_mass, ".3f") if p else "")
        table.add_row(*cells)
    table.caption = "; ".join(f"{r.run}: {r.n_sequences} sequences, {r.n_queries} queries"
                              + (f", {r.shots}-shot" if r.shots else "") for r in results)
    return table


def _lengths_tables(results: list[an.LengthsResult], gain) -> list[Table]:
    """Two tables (by length, by position) per context T: the buckets adapt to T, so runs trained
    with different contexts share no rows. Within a table every number sits in the row of its own
    bucket (lo, hi), looked up by key, never by position."""
    tables = []
    contexts = sorted({r.seq_len for r in results})
    for T in contexts:
        group = [r for r in results if r.seq_len == T]
        gains = {}
        if gain is not None and {gain.baseline, gain.smelt} <= {r.run for r in group}:
            gains = {(g.by, g.lo, g.hi): g for g in gain.buckets}
        for by, what in (("length", "document length (tokens)"), ("position", "token position")):
            table = Table(title=f"Validation loss (nats/token) by {what}, context {T}", title_justify="left")
            table.add_column(what.split(" (")[0], justify="right")
            for r in group:
                table.add_column(f"{r.run} ({r.arch})", justify="right")
                table.add_column("tokens", justify="right")
            if gains:
                table.add_column("gain L_b - L_s", justify="right")
                table.add_column("+- se", justify="right")
                table.add_column("rel", justify="right")
            cells_of = [{(b.lo, b.hi): b for b in r.buckets if b.by == by} for r in group]
            keys = sorted({k for c in cells_of for k in c}, key=lambda k: (k[0], k[1] is None, k[1] or 0))
            for lo, hi in keys:
                cells = [an.LossBucket(by, lo, hi, 0, 0, None).label]
                for c in cells_of:
                    b = c.get((lo, hi))
                    cells += [number(b.loss, ".4f") if b else "", str(b.n_tokens) if b else ""]
                if gains:
                    g = gains.get((by, lo, hi))
                    cells += [number(g.gain, "+.4f") if g else "", number(g.gain_se, ".4f") if g else "",
                              "" if g is None else "-" if g.rel_gain is None else f"{100 * g.rel_gain:+.2f}%"]
                table.add_row(*cells)
            tables.append(table)
    return tables


def _icl_table(results: list[an.ICLResult]) -> Table:
    r0 = results[0]
    table = Table(title=f"Dyck completion accuracy (exact match, greedy), {r0.n_trials} trials, "
                        f"{100 * r0.confidence:.0f}% Wilson interval", title_justify="left")
    table.add_column("k", justify="right")
    for r in results:
        table.add_column(f"{r.run} ({r.arch})", justify="right")
    ks = sorted({s.k for r in results for s in r.shots})
    for k in ks:
        cells = [str(k)]
        for r in results:
            s = next((s for s in r.shots if s.k == k), None)
            cells.append(f"{100 * s.accuracy:.1f}% [{100 * s.ci_low:.1f}, {100 * s.ci_high:.1f}]"
                         if s else "-")
        table.add_row(*cells)
    t = r0.task
    table.caption = (f"{t['n_types']} bracket types, {t['min_pairs']}-{t['max_pairs']} pairs; "
                     "- : prompt does not fit the context")
    return table
