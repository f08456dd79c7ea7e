"""Nothing imports upward: ops < nn < models < training < (eval, sweeps, bench, export).

Each package may import only the packages listed as below it (``data`` stands beside the
stack: the training and evaluation layers read it, it imports none of them); the four
top packages (eval, sweeps, bench, export) import none of the others. Imports
inside functions count too: a lazy import upward is still a dependency upward, and so is
``from cofrgenet import training``, a relative import or an ``importlib.import_module``
of a literal name. The top-level utility modules (errors, dataclass_options, recipes,
the help cache...) import no subpackage; ``cli`` and ``demo`` are the apex and may import anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "cofrgenet"
STACK = {"ops", "nn", "models", "training", "eval", "sweeps", "bench", "export", "data"}
#: package or top-level module -> the cofrgenet packages and modules it must not import.
FORBIDDEN = {
    "ops": STACK - {"ops"},
    "nn": STACK - {"ops", "nn"},
    "models": {"training", "eval", "sweeps", "bench", "export", "data"},
    "data": STACK - {"data"},
    "training": {"eval", "sweeps", "bench", "export"},
}
TOP = {"eval", "sweeps", "bench", "export"}
for _package in TOP:  # side by side: what two of them share belongs below them
    FORBIDDEN[_package] = TOP - {_package}
APEX = {"cli", "demo", "__main__"}  # __main__: `python -m cofrgenet`, the cli
UTILITIES = {
    "atomic",
    "cli_cache",
    "config_variables",
    "dataclass_options",
    "databases",
    "devices",
    "dotted",
    "environment",
    "errors",
    "folder_lock",
    "hub",
    "lazy",
    "recipes",
    "redact",
    "signals",
    "terminal",
}
for _name in UTILITIES:
    FORBIDDEN[_name] = STACK | APEX
for _package in STACK:
    FORBIDDEN.setdefault(_package, set()).update(APEX)


def _modules(node: ast.AST, package: str) -> list[str]:
    """Absolute dotted names the node imports (``package``: the file's own package)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        if node.level:
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1])
            module = f"{base}.{node.module}" if node.module else base
        else:
            module = node.module or ""
        return [module] + [f"{module}.{alias.name}" for alias in node.names]
    if (
        isinstance(node, ast.Call)
        and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        return [node.args[0].value]
    return []


def imported_packages(path: Path) -> set[str]:
    """The cofrgenet subpackages and top-level modules ``path`` imports (anywhere)."""
    package = ".".join(path.relative_to(SRC.parent).parts[:-1])
    return packages_in(path.read_text(), package)


def packages_in(source: str, package: str) -> set[str]:
    """The cofrgenet subpackages and top-level modules ``source``, a module of
    ``package``, imports."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        for name in _modules(node, package):
            parts = name.split(".")
            if parts[0] == "cofrgenet" and len(parts) > 1:
                found.add(parts[1])
    return found


def _files(name: str) -> list[Path]:
    return sorted((SRC / name).rglob("*.py")) if name in STACK else [SRC / f"{name}.py"]


@pytest.mark.parametrize("name", sorted(FORBIDDEN))
def test_nothing_imports_upward(name):
    offences = []
    for path in _files(name):
        bad = imported_packages(path) & FORBIDDEN[name]
        if bad:
            offences.append(f"{path.relative_to(SRC)} imports {sorted(bad)}")
    assert not offences, "\n".join(offences)


def test_every_top_level_module_has_a_rule():
    modules = {path.stem for path in SRC.glob("*.py")} - {"__init__"}
    assert modules == UTILITIES | APEX


def test_the_scan_sees_every_import_form():
    source = (
        "import importlib\n"
        "from cofrgenet import training\n"
        "from ..models import transformer\n"
        "from . import ladder\n"
        "def f():\n"
        "    importlib.import_module('cofrgenet.sweeps.study')\n"
        "    from cofrgenet.bench.train import run\n"
    )
    assert packages_in(source, "cofrgenet.nn") == {"training", "models", "nn", "sweeps", "bench"}


#: Commands whose parsers import torch still: ``bench ops`` (its options are read off the
#: ops; a benchmark's start-up is not what one waits for).
PARSERS_WITH_TORCH = {("bench", "ops")}


def test_command_parsers_need_no_torch():
    """``cofr <command> --help`` builds the command's parser: torch and Lightning (seconds
    to import) belong in ``run``."""
    import subprocess
    import sys

    from cofrgenet.cli import COMMANDS

    paths = [c.path for c in COMMANDS if not c.passthrough and c.path not in PARSERS_WITH_TORCH]
    code = (
        "import argparse, subprocess, sys\n"
        "from cofrgenet.cli import COMMANDS\n"
        "path = tuple(sys.argv[1:])\n"
        "(command,) = [c for c in COMMANDS if c.path == path]\n"
        "command.load().add_arguments(argparse.ArgumentParser())\n"
        "assert not {'torch', 'lightning'} & set(sys.modules), path\n"
    )
    for path in paths:
        subprocess.run([sys.executable, "-c", code, *path], check=True)


@pytest.mark.parametrize(
    ("module", "not_loaded"),
    [("cofrgenet.nn.norms", "cofrgenet.nn.cffn"), ("cofrgenet.ops.reference", "cofrgenet.ops.api")],
)
def test_packages_export_their_names_lazily(module, not_loaded):
    """One convention for every package's exports (cofrgenet.lazy): importing one module
    loads no sibling it does not use (nn and ops imported every layer, every fast path);
    a name asked of the package is still there, and a typo an AttributeError."""
    import subprocess
    import sys

    package = module.rsplit(".", 1)[0]
    code = (
        f"import sys, importlib\nimport {module}\n"
        f"assert {not_loaded!r} not in sys.modules, sorted(sys.modules)\n"
        f"package = importlib.import_module({package!r})\n"
        "for name in package.__all__:\n    getattr(package, name)\n"
        "try:\n    package.no_such_name\nexcept AttributeError:\n    pass\n"
        "else:\n    raise SystemExit('no AttributeError')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
