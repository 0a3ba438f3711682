"""The layout is the architecture: each subpackage imports only what its docstring allows (issue 14).

Read from the source (every import statement, top-level or inside a function), so a lazy import
that breaks the layering is caught too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SCALING = Path(__file__).resolve().parents[1] / "scaling"

# subpackage -> the subpackages it may import (itself included)
ALLOWED = {
    "common": {"common"},
    "accounting": {"common", "accounting"},
    "training": {"common", "accounting", "training"},
    "fitting": {"common", "accounting", "fitting"},
    "design": {"common", "accounting", "fitting", "design"},
    "analysis": {"common", "accounting", "training", "analysis"},
    "evaluation": {"common", "accounting", "training", "analysis", "evaluation"},
    "plots": {"common", "accounting", "fitting", "plots"},
    "cli": {"common", "accounting", "training", "fitting", "design", "analysis", "evaluation", "plots",
            "cli"},
}
# the pure maths never needs torch
NO_TORCH = {"common", "accounting", "fitting", "design", "plots"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            if node.module == "scaling":
                out |= {f"scaling.{alias.name}" for alias in node.names}
    return out


def test_every_module_sits_in_a_known_subpackage():
    stray = [p.name for p in SCALING.glob("*.py") if p.name != "__init__.py"]
    assert not stray, f"modules outside the subpackages: {stray}"
    packages = {p.parent.name for p in SCALING.glob("*/__init__.py")}
    assert packages == set(ALLOWED)
    for pkg in packages:
        assert ast.get_docstring(ast.parse((SCALING / pkg / "__init__.py").read_text())), pkg


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_imports_follow_the_layering(package):
    bad = []
    for path in sorted((SCALING / package).rglob("*.py")):
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "scaling" and len(parts) > 1 and parts[1] in ALLOWED:
                if parts[1] not in ALLOWED[package]:
                    bad.append(f"{path.relative_to(SCALING)} imports {name}")
            if package in NO_TORCH and parts[0] == "torch":
                bad.append(f"{path.relative_to(SCALING)} imports torch")
    assert not bad, bad


# --- issue 30 item 10: the rooms of scaling/training -------------------------------------------
# room -> the rooms it may import (itself included). "base" is the modules directly in
# scaling/training/ (run-folder writes, typed checks): every room may use them, they use no room.
TRAINING = SCALING / "training"
TRAINING_BASE = {"runlog", "schema"}
TRAINING_ROOMS = {
    "base": {"base"},
    "data": {"base", "data"},
    "model": {"base", "model"},
    "parallel": {"base", "model", "parallel"},
    "loop": {"base", "data", "model", "parallel", "loop"},
    "sweep": {"base", "data", "model", "parallel", "loop", "sweep"},
}
# the data side is numpy, tokenizers and files: opening shards must not pull torch in
TRAINING_NO_TORCH = {"base": {"schema"}, "data": None}  # None: every module of the room


def _training_room(name: str) -> str | None:
    """The room of a dotted ``scaling.training...`` name (None for the package itself)."""
    parts = name.split(".")
    if len(parts) < 3:
        return None
    return "base" if parts[2] in TRAINING_BASE else parts[2]


def _training_violations(training: Path) -> list[str]:
    """Every breach of the room rules under ``training`` (a scaling/training tree)."""
    bad = []
    rooms = {p.parent.name for p in training.glob("*/__init__.py")}
    if rooms != set(TRAINING_ROOMS) - {"base"}:
        bad.append(f"rooms {sorted(rooms)} are not {sorted(set(TRAINING_ROOMS) - {'base'})}")
    flat = {p.stem for p in training.glob("*.py")} - {"__init__"}
    if flat != TRAINING_BASE:
        bad.append(f"modules directly in scaling/training/ must be a room's: {sorted(flat ^ TRAINING_BASE)}")
    for path in sorted(training.rglob("*.py")):
        rel = path.relative_to(training)
        tree = ast.parse(path.read_text(), filename=str(path))
        if rel.name == "__init__.py" and len(rel.parts) == 2 and not ast.get_docstring(tree):
            bad.append(f"{rel} needs a docstring saying what the room holds and may import")
        room = "base" if len(rel.parts) == 1 else rel.parts[0]
        if any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(tree)):
            bad.append(f"{rel}: relative import (write scaling.training.<room>.<module>)")
        no_torch = room in TRAINING_NO_TORCH and (TRAINING_NO_TORCH[room] is None
                                                  or path.stem in TRAINING_NO_TORCH[room])
        for name in _imports(path):
            if name.startswith("scaling.training."):
                target = _training_room(name)
                if target not in TRAINING_ROOMS:
                    bad.append(f"{rel} imports {name}: no such room")
                elif target not in TRAINING_ROOMS[room]:
                    bad.append(f"{rel} ({room}) imports {name} ({target})")
            if no_torch and name.split(".")[0] == "torch":
                bad.append(f"{rel} imports torch")
    return bad


def test_training_rooms_follow_their_layering():
    bad = _training_violations(TRAINING)
    assert not bad, bad


def test_training_room_rules_catch_a_planted_breach(tmp_path):
    """A copy of the tree passes; the same copy with one upward import, one torch import in data/,
    and one new flat module is refused for exactly those three."""
    import shutil

    copy = tmp_path / "training"
    shutil.copytree(TRAINING, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert _training_violations(copy) == []
    with open(copy / "model" / "transformer.py", "a") as fh:
        fh.write("\nfrom scaling.training.loop.trainer import train  # planted\n")
    with open(copy / "data" / "shards.py", "a") as fh:
        fh.write("\nimport torch  # planted\n")
    (copy / "stray.py").write_text('"""planted"""\n')
    bad = _training_violations(copy)
    assert len(bad) == 3, bad
    assert any("model/transformer.py (model) imports scaling.training.loop.trainer (loop)" in b for b in bad)
    assert any("data/shards.py imports torch" in b for b in bad)
    assert any("stray" in b for b in bad)
