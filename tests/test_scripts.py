"""The repository's scripts keep working: the GPU check's CPU dry run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_dry_run_runs_every_step_on_cpu():
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("OUT", None)  # nothing to copy out
    done = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--dry-run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "== done: tests 0, train 0, ops 0" in output
    assert "train-cpu-" in output and "ops-cpu-" in output  # the reports it wrote
