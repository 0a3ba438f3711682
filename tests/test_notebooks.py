"""The notebooks run top to bottom, headless, against the shipped runs/ (jupytext + nbclient).

Each ``notebooks/NN_*.py`` (jupytext percent format, the reviewed source) is executed in a fresh
ipykernel with ``MPLBACKEND=Agg``; any cell error fails the test. The paired ``.ipynb`` files are
committed with their outputs; the tests also check that they hold the same code as the ``.py``
and no error outputs.

Regenerate the committed outputs after editing a notebook or the runs (cell ids are kept):

    python tests/test_notebooks.py            # all notebooks
    python tests/test_notebooks.py 03         # those whose name contains 03
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
RUNS = ROOT / "runs"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("[0-9][0-9]_*.py"))
CELL_TIMEOUT_S = 900

jupytext = pytest.importorskip("jupytext", reason="needs the test extra: pip install -e '.[test]'")
nbclient = pytest.importorskip("nbclient", reason="needs the test extra: pip install -e '.[test]'")
nbformat = pytest.importorskip("nbformat", reason="needs the test extra: pip install -e '.[test]'")


def finished_runs() -> str | None:
    """None when runs/ has finished runs, else why not (the skip reason)."""
    from scaling.common.errors import UserError
    from scaling.fitting.tables import read_runs_dir

    if not RUNS.is_dir():
        return f"no runs folder at {RUNS}"
    try:
        read_runs_dir(RUNS)
    except UserError as exc:
        return f"runs/ has no finished runs: {exc}"
    return None


def execute(nb, where: Path):
    """Run every cell of ``nb`` in a fresh python3 kernel with cwd ``where``; raises on a cell error."""
    client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3", record_timing=False,
                                     resources={"metadata": {"path": str(where)}})
    client.execute()
    return nb


def _code(nb) -> list[str]:
    return [c.source.strip() for c in nb.cells if c.cell_type == "code"]


@pytest.mark.parametrize("source", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(source, monkeypatch):
    reason = finished_runs()
    if reason:
        pytest.skip(reason)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    execute(jupytext.read(source), source.parent)


@pytest.mark.parametrize("source", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_ipynb_is_paired_and_executed(source):
    paired = source.with_suffix(".ipynb")
    assert paired.is_file(), f"{paired.name} missing: run `python tests/test_notebooks.py`"
    nb = nbformat.read(paired, as_version=4)
    assert _code(nb) == _code(jupytext.read(source)), (
        f"{paired.name} is out of date with {source.name}: "
        f"run `python tests/test_notebooks.py {source.stem}`")
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code), f"{paired.name} is not fully executed"
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{paired.name} holds an error output: {errors[0].get('ename')}"
    assert any(o.get("output_type") in ("display_data", "execute_result") and "image/png" in o.get("data", {})
               for c in code for o in c.get("outputs", [])) or source.stem.startswith("04"), (
        f"{paired.name} shows no figure")


def regenerate(match: str = "") -> None:
    """Sync each .py into its .ipynb (keeping cell ids), execute it, write the outputs back."""
    from jupytext.cli import jupytext as jupytext_cli

    for source in NOTEBOOKS:
        if match not in source.stem:
            continue
        paired = source.with_suffix(".ipynb")
        if paired.exists():
            jupytext_cli(["--sync", "--quiet", str(source)])
        else:
            jupytext_cli(["--set-formats", "ipynb,py:percent", "--quiet", str(source)])
        nb = nbformat.read(paired, as_version=4)
        t0 = time.perf_counter()
        execute(nb, source.parent)
        nbformat.write(nb, paired)
        jupytext_cli(["--sync", "--quiet", str(source)])   # the .py keeps the ipynb's timestamp order
        print(f"{paired.relative_to(ROOT)}: executed in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    os.environ.pop("MPLBACKEND", None)  # the inline backend embeds the figures as PNG outputs
    regenerate(sys.argv[1] if len(sys.argv) > 1 else "")
