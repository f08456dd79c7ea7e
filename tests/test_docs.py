"""The documentation's runnable command blocks run as written, on a copy of the repository.

A fenced block right after a ``<!-- runnable -->`` line in README.md or docs/*.md is
run (bash with ``set -e``, or python), in document order, in one copy of the tracked
files that shares this checkout's ``.venv``: what a user types after ``make install``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"<!-- runnable -->\n```(bash|python)\n(.*?)\n```", re.DOTALL)


def runnable_blocks() -> list[tuple[str, str, str]]:
    """(file, language, code) of every runnable block, README first."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [(f.name, lang, code) for f in files for lang, code in BLOCK.findall(f.read_text())]


def test_the_readme_marks_its_tour_runnable():
    readme = [b for b in runnable_blocks() if b[0] == "README.md"]
    codes = "\n".join(code for _, _, code in readme)
    assert len(readme) >= 4
    for command in ("make demo", "cofr fit", "cofr generate", "cofr sweep run"):
        assert command in codes
    assert all("<" not in code and "..." not in code for _, lang, code in readme if lang == "bash")


@pytest.mark.slow
def test_runnable_blocks_run_as_written(tmp_path):
    if not (ROOT / ".venv" / "bin" / "cofr").exists():
        pytest.skip("no .venv here: run `make install` first")
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    copy = tmp_path / "clone"
    for name in tracked:
        target = copy / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    (copy / ".venv").symlink_to(ROOT / ".venv")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "SLURM_"))}
    env["PATH"] = f"{copy / '.venv' / 'bin'}{os.pathsep}{env['PATH']}"
    for file, lang, code in runnable_blocks():
        command = ["bash", "-e", "-c", code] if lang == "bash" else [sys.executable, "-c", code]
        proc = subprocess.run(
            command, cwd=copy, env=env, capture_output=True, text=True, timeout=900
        )
        assert proc.returncode == 0, (
            f"{file}:\n{code}\n--- output ---\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        )
