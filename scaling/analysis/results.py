"""Saved analysis results: the base of the frozen result classes and their files.

Each analysis result has ``summary()``, ``to_dict()``/``from_dict()`` (the generic dataclass
serializer of ``scaling.common.serialize``) and ``to_frame()`` (pandas). :func:`save_result` writes
one to ``runs/<run>/analysis/<kind>.json`` and :func:`load_result` reads it back, so notebooks
and ``smelt-scale plot`` need not recompute; :func:`saved_analyses` collects one kind over a runs
folder.

The kind -> class map fills itself: each result class names the kinds it is saved under
(``class SinkResult(Result, kinds=("sink", "sink_dyck"))``), so this module imports none of them
(the package ``scaling.analysis`` imports every analysis, hence every class is registered before a
result is read back).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from scaling.common.errors import UserError
from scaling.common.files import read_config
from scaling.common.run_folder import ANALYSIS_DIR, ANALYSIS_KINDS, stale_analysis, write_json
from scaling.common.serialize import Record, to_json

KINDS = ANALYSIS_KINDS  # the saved kinds (file names under analysis/), defined with the run folder
_CLASSES: dict[str, type] = {}  # kind -> result class, filled by Result.__init_subclass__


class Result(Record):
    """JSON for the frozen results (nested dataclasses, tuples); NaN/inf become None."""

    kind: str = ""

    def __init_subclass__(cls, kinds: tuple[str, ...] = (), **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for kind in kinds:
            if kind not in KINDS or _CLASSES.get(kind, cls) is not cls:
                raise TypeError(f"{cls.__name__}: kind {kind!r} is not a free one of {KINDS}")
            _CLASSES[kind] = cls

    def to_dict(self) -> dict:
        return json.loads(to_json(super().to_dict(), indent=None))

    def to_json(self) -> str:
        return to_json(self.to_dict())

    @property
    def result_kind(self) -> str:
        """The file name under analysis/ (without .json)."""
        return self.kind


def _result_class(kind: str) -> type:
    if kind not in KINDS:
        raise UserError(f"unknown analysis kind {kind!r}; one of {', '.join(KINDS)}")
    return _CLASSES[kind]


def save_result(result: Result, run_dir: Path | str, kind: str | None = None, *,
                weights: Sequence[Mapping[str, Any]] = ()) -> Path:
    """Write ``result`` to ``<run_dir>/analysis/<kind>.json`` (atomic) and return the path.

    ``weights``: the weights the result was computed on, one record per run
    (``LoadedRun.weights_record``: run, file, sha256), saved under the key ``weights`` so that a
    reader can tell whether the run's weights changed since (a run extended to a larger budget, or
    retrained): :func:`scaling.common.run_folder.stale_analysis`.
    """
    kind = kind or result.result_kind
    folder = Path(run_dir) / ANALYSIS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{kind}.json"
    doc: dict[str, Any] = {"kind": kind, "result": result.to_dict()}
    if weights:
        doc["weights"] = [dict(w) for w in weights]
    write_json(path, doc)
    return path


def load_result(run_dir: Path | str, kind: str):
    """Read back ``<run_dir>/analysis/<kind>.json`` as its result object."""
    cls = _result_class(kind)
    path = Path(run_dir) / ANALYSIS_DIR / f"{kind}.json"
    if not path.is_file():
        raise UserError(f"no saved {kind} analysis at {path}; run the {kind} analysis first",
                        hint="(smelt-scale analyze)", sep=" ")
    return cls.from_dict(read_config(path, f"{kind} analysis")["result"])


def saved_analyses(runs_dir: str | Path, kind: str,
                   warn: Callable[[str], None] | None = None) -> list[tuple[Path, Any]]:
    """Every saved ``runs/<run>/analysis/<kind>.json`` under ``runs_dir`` as (run folder, result);
    [] when there is none. ``warn`` is told of each one computed on other weights than its run
    folder holds now (``scaling.common.run_folder.stale_analysis``); it is still returned."""
    cls = _result_class(kind)
    files = sorted(Path(runs_dir).rglob(f"{ANALYSIS_DIR}/{kind}.json"))
    out = []
    for f in files:
        run = f.parent.parent
        try:
            doc = read_config(f, f"{kind} analysis")
            result = cls.from_dict(doc["result"])
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"cannot read {f}: {exc}") from None
        if warn is not None and (why := stale_analysis(doc, run)) is not None:
            warn(f"the saved {kind} analysis of {run.name} is not of its present weights: {why}; "
                 f"rerun `smelt-scale analyze`")
        out.append((run, result))
    return out
