"""Reading a run folder, the one format every part shares (written by the trainer,
``scaling.training.runlog``, which owns the atomic writes).

``runs/<name>/`` holds ``config.json`` (written once at start: the config, its exact accounting,
the data spec), ``metrics.jsonl`` (one line per logged step, appended), ``final.json`` (the budget
points, rewritten atomically; ``complete`` once every budget is done) and, optionally, the final
weights ``final_weights.safetensors``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaling.common.errors import UserError
from scaling.common.files import JsonlRows, read_config, read_jsonl

CONFIG, METRICS, FINAL, WEIGHTS = "config.json", "metrics.jsonl", "final.json", "final_weights.safetensors"


def find_run_folders(root: Path | str, marker: str | tuple[str, ...] = (CONFIG, FINAL)) -> list["RunFolder"]:
    """Every run folder under ``root`` (searched recursively): a folder holding one of the
    ``marker`` files; sorted by path. UserError when ``root`` is not a folder."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"no such runs folder: {root}")
    markers = (marker,) if isinstance(marker, str) else marker
    return [RunFolder(p) for p in sorted({f.parent for m in markers for f in root.rglob(m)})]


@dataclass(frozen=True)
class RunFolder:
    """One run folder; each reader raises UserError naming the file when it is unreadable."""

    path: Path

    @property
    def name(self) -> str:
        return self.path.name

    def config(self) -> dict[str, Any]:
        return read_config(self.path / CONFIG, "run config")

    def final(self) -> dict[str, Any] | None:
        """final.json, or None before the first budget is done."""
        f = self.path / FINAL
        return read_config(f, "final") if f.exists() else None

    def complete(self) -> bool:
        """Whether final.json says every budget is done (False when it is missing or unreadable:
        a run that cannot show it finished is not finished)."""
        try:
            final = self.final()
        except UserError:
            return False
        return bool(final and final.get("complete", False))

    def metrics(self) -> JsonlRows:
        """The logged lines (a torn last line is dropped and counted)."""
        return read_jsonl(self.path / METRICS, missing_ok=True)

    def status(self) -> str:
        """'done' (final.json complete), 'partial' (started) or 'new'."""
        if self.complete():
            return "done"
        return "partial" if (self.path / CONFIG).exists() or (self.path / FINAL).exists() else "new"
