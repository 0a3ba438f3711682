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
