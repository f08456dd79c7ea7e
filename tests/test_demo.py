"""`cofr demo` end to end (the README's main job), on a few steps."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_demo_prepares_trains_both_and_prints_the_table(tmp_path):
    command = [
        sys.executable,
        "-m",
        "cofrgenet.cli",
        "demo",
        "--max-steps",
        "4",
        "--runs-dir",
        str(tmp_path / "runs"),
        "--data-dir",
        str(tmp_path / "data" / "pydoc-byte"),
    ]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "data" / "pydoc-byte" / "meta.json").exists()
    [summary] = (tmp_path / "runs").glob("demo-*.md")
    rows = [
        line
        for line in summary.read_text().splitlines()
        if line.startswith("| ") and "preset" not in line
    ]
    assert [row.split("|")[2].strip() for row in rows] == ["gpt2-mini", "gpt2-mini-f"]
    for row in rows:
        val_loss = float(row.split("|")[6])
        assert 0 < val_loss < 10
    assert "cofr ui" in result.stdout
