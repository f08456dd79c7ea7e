"""The repository's scripts keep working: the GPU check's CPU dry run, its test selection."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: An op suite's test of an implementation that the ``on`` fixture runs on the CPU.
CPU_IMPL = re.compile(r"[\[-](literal|continuant|compiled)[\]-]")


def _selected_ids(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("tests/ops/")]


def _assert_gpu_selection(ids: list[str]) -> None:
    """Every Triton test, the tests on the ``device`` fixture, and nothing CPU-only."""
    assert sum("triton" in i for i in ids) > 100
    assert any("test_cffn_compiles_fullgraph_with_inductor" in i for i in ids)
    assert any("test_compiles_fullgraph[auto]" in i for i in ids)
    # On the CPU: other impls (but the fullgraph test of continuant, skipped on CUDA), the
    # CPU-side checks of the triton dispatch.
    assert [i for i in ids if CPU_IMPL.search(i) and "compiles_fullgraph" not in i] == []
    assert not any("without_the_interpreter" in i or "poisoned_buffers" in i for i in ids)


def test_gpu_check_selects_the_tests_that_run_on_the_gpu():
    collect = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [*collect, "-p", "cofrgenet.bench.gpu_tests", "tests/ops"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    _assert_gpu_selection(_selected_ids(done.stdout))
    assert re.search(r"\d+/\d+ tests collected \(\d+ deselected\)", done.stdout)


@pytest.mark.slow
def test_gpu_check_dry_run_runs_every_step_on_cpu(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out)}
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
    # Each step's files reach $OUT as soon as it ends, before the next step starts.
    marks = ["== tests:", "copied 1 files to $OUT after tests", "== train:"]
    marks += ["copied 3 files to $OUT after train", "== ops:", "copied 5 files to $OUT after ops"]
    positions = [output.find(mark) for mark in marks]
    assert -1 not in positions and positions == sorted(positions), list(
        zip(marks, positions, strict=True)
    )
    names = sorted(p.name for p in out.iterdir())
    assert [re.sub(r"\d{4}-\d\d-\d\d", "DATE", n) for n in names] == [
        "gpu-check-cpu-DATE.log",
        "ops-cpu-DATE-quick.json",
        "ops-cpu-DATE-quick.md",
        "train-cpu-DATE.json",
        "train-cpu-DATE.md",
    ]
    # The whole output of every step is in the log: the tests selected, the reports
    # rewritten (partial) as the benchmarks went, and the finished ones.
    log = next(out.glob("gpu-check-*.log")).read_text()
    _assert_gpu_selection(_selected_ids(log))
    assert "partial report, 4 of 4 timed" in log and "partial report: " in log
    for report in out.glob("*.json"):
        assert "partial" not in json.loads(report.read_text()), report.name


def test_a_second_gpu_check_of_the_day_keeps_the_first_one_s_log(tmp_path):
    """The log's name is chosen as the reports' are: -2, -3, ... when taken (a second run
    of the day replaced the first's log in docs/benchmarks)."""
    script = (ROOT / "scripts" / "gpu_check.sh").read_text().splitlines()
    start = next(i for i, line in enumerate(script) if line.startswith("LOG="))
    naming = "\n".join(script[start : start + 3])
    assert naming.splitlines()[-1].startswith("while ")
    (tmp_path / "gpu-check-h200-2026-12-03.log").write_text("first")
    (tmp_path / "gpu-check-h200-2026-12-03-2.log").write_text("second")
    done = subprocess.run(
        ["bash", "-c", f'RESULTS={tmp_path}; GPU=h200; DATE=2026-12-03\n{naming}\necho "$LOG"'],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout.strip() == str(tmp_path / "gpu-check-h200-2026-12-03-3.log")
