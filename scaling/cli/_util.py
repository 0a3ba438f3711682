"""Shared CLI plumbing: one-line errors with exit 2, JSON on stdout, messages on stderr.

Conventions (every command follows them):
- ``--json`` prints exactly one JSON document on stdout; nothing else goes to stdout.
- Human tables go to stdout with rich; progress and warnings go to stderr, and progress
  bars are off with ``--json``/``--quiet`` or when stderr is not a terminal.
- Bad input raises ``UserError``; ``run_cli`` turns it into ``error: <message>`` on stderr
  and exit code 2 (never a traceback). A failure of the work itself exits 1.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional

import typer
from rich.console import Console
from rich.markup import escape

from scaling.common.errors import UserError
from scaling.common.filter import GRAMMAR as FILTER_GRAMMAR
from scaling.common.serialize import to_json

if TYPE_CHECKING:
    import numpy as np

# Tables stay readable when piped or captured (rich would fall back to 80 columns).
_WIDTH = None if sys.stdout.isatty() else 200
stdout = Console(soft_wrap=True, width=_WIDTH, emoji=False)
stderr = Console(stderr=True, soft_wrap=True, width=None if sys.stderr.isatty() else 200, emoji=False)


# Version of each command's --json document (docs/json.md); bump one when a key is renamed or moved.
# fit/2: a law's parameters moved under "params" (fit/1 had them as top-level keys of each entry).
SCHEMA_VERSIONS: dict[str, int] = {"fit": 2}


def schema_name(command: str) -> str:
    """``"smelt-scale.<command>/<n>"``, the "schema" of a command's JSON ("analyze sink": analyze-sink)."""
    command = "-".join(command.split())
    return f"smelt-scale.{command}/{SCHEMA_VERSIONS.get(command, 1)}"


def _current_command() -> str | None:
    from scaling.cli._click import get_current_context

    ctx = get_current_context(silent=True)
    if ctx is None:
        return None
    parts = ctx.command_path.split()[1:]  # without the program name
    return " ".join(parts) or None


def emit_json(obj: Any) -> None:
    """Print one JSON document on stdout, its first key ``"schema": "smelt-scale.<command>/<n>"``
    (unless the document names its schema itself, as a fits document does)."""
    command = _current_command()
    if isinstance(obj, dict) and "schema" not in obj and command is not None:
        obj = {"schema": schema_name(command), **obj}
    sys.stdout.write(to_json(obj) + "\n")
    sys.stdout.flush()


def finish(json_out: bool, document: Any, show: Callable[[], None], *, save: Callable[[], Any] | None = None,
           plot: Callable[[], Any] | None = None, warnings: Iterable[str] = ()) -> None:
    """The end every command shares: write its result file (``save``), draw its figure (``plot``),
    then either ``warnings`` and one JSON document (``--json``; ``document`` may be a function that
    builds it) or the human output (``show``, which prints its own warnings where they belong)."""
    if save is not None:
        save()
    if plot is not None:
        plot()
    if json_out:
        for w in warnings:
            warn(w)
        emit_json(document() if callable(document) else document)
    else:
        show()


def warn(message: str) -> None:
    stderr.print(f"[yellow]warning:[/yellow] {escape(str(message))}", highlight=False)


def fail(message: str, code: int = 2) -> None:
    """Print a one-line error on stderr and exit."""
    stderr.print(f"error: {' '.join(str(message).split())}", highlight=False, markup=False)
    raise typer.Exit(code)


def run_cli(fn: Callable) -> Callable:
    """Decorator for typer commands: UserError and bad files become one-line errors, exit 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except typer.Exit:
            raise
        except UserError as exc:
            fail(exc.with_hint())
        except OSError as exc:
            # a path the user gave that cannot be read or written (missing, a file where a folder is
            # needed, no permission, disk full): the system's reason and the path, in one line
            fail(f"{exc.strerror or exc}: {exc.filename}" if getattr(exc, "filename", None) else str(exc))
        except UnicodeDecodeError:
            fail("an input file is not UTF-8 text (a binary file, or another encoding)")
        except KeyboardInterrupt:
            fail("interrupted", code=130)

    return wrapper


def setup_logging(level: int | None = None) -> None:
    """Send the library's ``logging`` records (logger ``scaling``: progress lines, warnings) to stderr
    as ``2026-01-31 12:00:00 message`` lines, unless the user or a host program configured logging
    already (a handler on the root or the ``scaling`` logger)."""
    import logging

    lib = logging.getLogger("scaling")
    if logging.getLogger().handlers or lib.handlers:
        return
    class _Stderr(logging.StreamHandler):
        # whatever sys.stderr is when a record comes (a test runner or notebook swaps it)
        def emit(self, record: logging.LogRecord) -> None:
            self.stream = sys.stderr
            super().emit(record)

    handler = _Stderr(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%Y-%m-%d %H:%M:%S"))
    lib.addHandler(handler)
    lib.setLevel(logging.INFO if level is None else level)


def show_progress(json_mode: bool = False, quiet: bool = False) -> bool:
    """Whether to draw rich progress bars (never into a pipe, never with --json)."""
    return not (json_mode or quiet) and sys.stderr.isatty()


def where_option(what: str, examples: str, note: str = "") -> Any:
    """The ``--where`` option of every command that reads points (one grammar, one wording)."""
    return typer.Option(None, "--where", metavar="EXPR",
                        help=f"Keep only the {what} matching {FILTER_GRAMMAR} Repeatable (all must "
                        f"hold); never evaluated as Python. E.g. {examples}. {note}".rstrip())


def _first_existing(path: Path) -> Path:
    for parent in (path, *path.parents):
        if parent.exists():
            return parent
    return Path(".")


def check_output_dir(path: Path | str, what: str = "output folder") -> Path:
    """Fail before any work if ``path`` cannot become a writable folder (it, or a parent, is a file)."""
    path = Path(path)
    base = _first_existing(path)
    if not base.is_dir():
        fail(f"{what} {path}: {base} is a file, not a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        fail(f"{what} {path}: {base} is not writable")
    try:
        # os.access says yes to root everywhere, also in /proc or on a read-only bind mount: write
        # nothing visible (Linux: O_TMPFILE) to learn it before the work, not after
        with tempfile.TemporaryFile(dir=base):
            pass
    except OSError as exc:
        fail(f"{what} {path}: cannot write in {base} ({exc.strerror or exc})")
    return path


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def _inside(path: Path, folder: Path) -> bool:
    try:
        return path.resolve().is_relative_to(folder.resolve())
    except OSError:
        return False


def check_distinct(reference: str, candidate: str) -> None:
    """``--reference`` and ``--candidate`` name two groups: a group compared with itself answers nothing."""
    if reference == candidate:
        fail(f"--reference and --candidate are the same group {reference!r}")


def check_output_file(path: Path | str, what: str = "output file", *, force: bool = False,
                      inputs: Iterable[Path | str | None] = ()) -> Path:
    """Fail before any work unless ``path`` may be written as a file (every ``--out`` goes through here).

    Refused: a folder, a path below a file, an unwritable or non-regular file (a FIFO would block); an
    existing file unless ``force`` (``--force``); and, even with ``force``, an input of the same
    command: one of ``inputs``, or an existing file inside an input folder (a run's final.json).
    """
    path = Path(path)
    if path.is_dir():
        fail(f"{what} {path} is a folder, not a file")
    check_output_dir(path.parent, what=f"folder of the {what}")
    for src in inputs:
        if src is None:
            continue
        src = Path(src)
        if _same_file(path, src) or (src.is_dir() and path.exists() and _inside(path, src)):
            fail(f"{what} {path} is an input of this command ({src}); refusing to write over it, "
                 "even with --force: choose another path")
    _outside_run_folders(path, what)
    if path.exists() or path.is_symlink():
        if not path.is_file():
            fail(f"{what} {path} exists and is not a regular file")
        if not force:
            fail(f"{what} {path} exists; give --force to replace it")
        if not os.access(path, os.W_OK):
            fail(f"{what} {path} is not writable")
    return path


def _outside_run_folders(target: Path, what: str) -> None:
    """Refuse an output that is a run folder or lies in one (at any depth): a run folder is the
    trainer's (one writer, under its lock), and --force must not put other commands' files there."""
    from scaling.common.run_folder import is_run_folder

    here = target.resolve()
    for p in (here, *here.parents):
        if p.is_dir() and is_run_folder(p):
            fail(f"{what} {target} is a run folder; choose a folder outside it" if p == here
                 else f"{what} {target} is inside run folder {p}; choose a path outside it")


def one_path(positional: Optional[Path], option: Optional[Path], flag: str = "--runs") -> Optional[Path]:
    """A path given positionally or with ``flag`` (the same path twice is fine; two different are not)."""
    if positional is not None and option is not None and Path(positional) != Path(option):
        raise UserError(f"give the runs path once: {positional} and {flag} {option} differ")
    return positional if positional is not None else option


def check_output_folder(path: Path | str, what: str = "output folder", *, force: bool = False,
                        inputs: Iterable[Path | str | None] = ()) -> Path:
    """Like :func:`check_output_file` for a folder that files are written into: an existing folder that
    holds anything needs ``force`` (files of the same name are then replaced, others left alone); an
    input folder of the command is refused even with ``force``."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        fail(f"{what} {path} exists and is not a folder")
    check_output_dir(path, what)
    for src in inputs:
        if src is None:
            continue
        src = Path(src)
        if _same_file(path, src):
            fail(f"{what} {path} is an input of this command; choose another folder")
    _outside_run_folders(path, what)
    if path.is_dir() and any(path.iterdir()) and not force:
        fail(f"{what} {path} is not empty; give --force to write into it (files of the same name are "
             "replaced)")
    return path


FORCE_HELP = "Replace an existing output file (never an input of this command)."
# Caps on counts a typo could make run for days or fill memory (each bootstrap resample is a refit,
# each trial a simulated study): far beyond any useful value, refused in one line.
MAX_BOOTSTRAP = 100_000
MAX_TRIALS = 100_000
DPI_RANGE = (20, 2400)


# -- numbers given as text: budgets and sparsities ----------------------------------------------
_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


def _number(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise UserError(f"{what} must be a number, got {text!r}") from None


def parse_budgets(budget: Optional[str], budgets: Optional[str]) -> "np.ndarray":
    """``--budget C`` or ``--budgets a,b,c`` / ``--budgets lo:hi:n`` (n log-spaced values, ends included)."""
    import numpy as np

    from scaling.fitting.savings import check_budget_count, check_budgets  # scipy: only when used
    if budget is not None and budgets is not None:
        raise UserError("give --budget or --budgets, not both")
    if budget is None and budgets is None:
        raise UserError("give a training budget in FLOPs: --budget 1e21, --budgets 1e20,1e21 "
                        "or --budgets 1e18:1e24:7")
    if budget is not None:
        return check_budgets([_number(budget.strip(), "budget")])
    text = budgets.strip()
    m = re.fullmatch(rf"\s*({_NUM})\s*:\s*({_NUM})\s*:\s*(\d+)\s*", text)
    if m:
        lo, hi, n = float(m.group(1)), float(m.group(2)), int(m.group(3))
        check_budgets([lo, hi])
        check_budget_count(n)
        if n < 1 or (n == 1 and lo != hi):
            raise UserError(f"--budgets {text}: need at least 2 points between two different ends")
        return np.logspace(np.log10(lo), np.log10(hi), n)
    if ":" in text:
        raise UserError(f"--budgets {text!r}: expected lo:hi:n, e.g. 1e18:1e24:7")
    if re.fullmatch(r"\d{1,3}(,\d{3})+", text.replace(" ", "")):
        raise UserError(f"--budgets {text!r}: commas separate budgets, so this reads as "
                        f"{', '.join(text.split(','))}; write one budget without separators (1e21, 1000)")
    return check_budgets([_number(t.strip(), "budget") for t in text.split(",") if t.strip()])


def parse_sparsities(values: Optional[list[str]]) -> tuple[float, ...]:
    """``--sparsity`` values (repeated or comma-separated): each in [0, 1), no value twice. Checked
    here, before any fit, so that a chinchilla-form answer cannot pass one by unread."""
    from scaling.fitting.savings import check_sparsities  # scipy: only when used

    out: list[float] = []
    for v in values or []:
        for t in (t.strip() for t in v.split(",")):
            if not t:
                continue
            S = _number(t, "sparsity")
            check_sparsities((S,), smelt_form=True)   # the range, the laws' own rule
            if S in out:
                raise UserError(f"sparsity {t} is given twice")
            out.append(S)
    return tuple(out)


# the table-column options of the commands that read a points table (fit, savings): one wording
COLUMN_HELP = {
    "n_col": "Column of parameters N (non-embedding, active), as NAME or NAME:UNIT (params:M = millions; "
             "units K, M, B or G, T or a number). Default: N, derived from C and D when absent.",
    "d_col": "Column of training tokens D, as NAME or NAME:UNIT (tokens:B). Default: D, derived from C and "
             "N when absent.",
    "loss_col": "Column of the loss (nats/token).",
    "group_col": "Column to group by. Default: arch when present (said so), else one group; 'none': one "
                 "group even with an arch column.",
    "c_col": "Column of total training FLOPs C (NAME[:UNIT]); with two of N, D, C the third is derived "
             "(C = k N D). Default: a column named flops when it is total compute (said so); 'none': no "
             "compute column.",
    "run_col": "Column of run ids: the bootstrap resamples runs, so rows of one run stay together. Without "
               "it (and without a column named run) every row counts as an independent run, which "
               "understates the intervals when a run contributes several rows. 'none': ignore a run column.",
    "flops_per_nd": "k in C = k N D, used to derive N or D from C and for the compute of tables without a "
                    "compute column. Default 6 (printed).",
}
