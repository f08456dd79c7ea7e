"""Nothing imports upward: ops < nn < models < training < (eval, sweeps, bench, export).

Each package may import only the packages listed as below it (``data`` stands beside the
stack: the training and evaluation layers read it, it imports none of them). Imports
inside functions count too: a lazy import upward is still a dependency upward.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "cofrgenet"
#: package -> the cofrgenet packages it must not import.
FORBIDDEN = {
    "ops": {"nn", "models", "training", "eval", "sweeps", "bench", "export", "data"},
    "nn": {"models", "training", "eval", "sweeps", "bench", "export", "data"},
    "models": {"training", "eval", "sweeps", "bench", "export", "data"},
    "data": {"ops", "nn", "models", "training", "eval", "sweeps", "bench", "export"},
    "training": {"eval", "sweeps", "bench", "export"},
    "export": {"sweeps", "bench"},
    "eval": {"sweeps", "bench"},
}


def imported_packages(path: Path) -> set[str]:
    """The cofrgenet subpackages ``path`` imports (anywhere in the file)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "cofrgenet" and len(parts) > 1:
                found.add(parts[1])
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_nothing_imports_upward(package):
    offences = []
    for path in sorted((SRC / package).rglob("*.py")):
        bad = imported_packages(path) & FORBIDDEN[package]
        if bad:
            offences.append(f"{path.relative_to(SRC)} imports {sorted(bad)}")
    assert not offences, "\n".join(offences)
