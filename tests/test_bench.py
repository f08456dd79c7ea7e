"""`cofr bench ops` and the `cofr` CLI: tiny workloads, real timings, files written."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import types

import pytest
import torch

from cofrgenet import cli
from cofrgenet.bench.ops import (
    OpsBenchConfig,
    Result,
    Target,
    Workload,
    check_targets,
    default_impls,
    min_bytes,
    parse_int,
    run_benchmark,
    to_markdown,
)
from cofrgenet.bench.timing import BackgroundLoad, Summary, time_interleaved, wait_for_quiet

TINY = ["--sizes", "256", "--depths", "1,3", "--ladder-sizes", "8x16", "--ladder-depths", "2"]
TINY += ["--ensemble-sizes", "8x16", "--ensemble-depths", "2", "--cffn-sizes", "8x16"]


def test_cli_help_lists_commands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "bench" in out and "cofr bench ops" in out


def test_cli_help_runs_as_a_script():
    # The console script's module, in a fresh interpreter: no torch import needed.
    proc = subprocess.run(
        [sys.executable, "-m", "cofrgenet.cli", "--help"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert "cofr bench ops" in proc.stdout


def test_bench_ops_help_lists_options(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "ops", "--help"])
    out = capsys.readouterr().out
    for option in ("--sizes", "--depths", "--repeats", "--impls", "--dtype", "--device"):
        assert option in out
    assert "--quick" in out and "--out" in out


def test_no_command_prints_help(capsys):
    assert cli.main([]) == 2
    assert "cofr bench ops" in capsys.readouterr().out


def test_registry_adds_commands(monkeypatch, capsys):
    # A passthrough command hands its words to the module's own main(argv).
    fake = types.ModuleType("fake_fit")
    seen: list[list[str]] = []
    fake.main = lambda argv: seen.append(list(argv)) or 3
    monkeypatch.setitem(sys.modules, "fake_fit", fake)
    fit = cli.Command(("fake-fit",), "train a model", "fake_fit", passthrough=True)
    monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS, fit))
    assert cli.main(["fake-fit", "--config", "x.yaml", "--help"]) == 3
    assert seen == [["--config", "x.yaml", "--help"]]
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "cofr fake-fit" in out and "cofr bench ops" in out and "cofr fit" in out


def test_bench_ops_writes_table_and_json(tmp_path):
    argv = ["bench", "ops", "--quick", *TINY, "--repeats", "3", "--out", str(tmp_path)]
    assert cli.main(argv) == 0

    [json_path] = tmp_path.glob("ops-cpu-*-quick.json")
    [md_path] = tmp_path.glob("ops-cpu-*-quick.md")
    report = json.loads(json_path.read_text())
    assert report["command"] == "cofr " + " ".join(argv)
    assert report["threads"] >= 1 and report["device_name"]

    impls = ["literal", "continuant", "auto"]  # --quick leaves out "compiled"
    assert report["config"]["impls"] == impls
    rows = report["results"]
    # 2 continued-fraction depths + 1 ladder + 1 ensemble + 2 Cffn layers, 2 modes, 3 impls.
    assert len(rows) == 6 * 2 * 3
    keys = {(r["op"], r["d"], r["mode"], r["impl"]) for r in rows}
    assert ("continued_fraction", 3, "fwd+bwd", "continuant") in keys
    assert ("univariate_ladder", 2, "fwd", "auto") in keys
    assert ("ladder_ensemble", 2, "fwd+bwd", "literal") in keys
    assert ("cffn_elementwise", 2, "fwd", "continuant") in keys
    assert report["copy_bandwidth_gbps"] > 0
    for r in rows:
        if r["op"].startswith("cffn"):  # layers: the ladders' share, no bandwidth
            assert r["gbps"] is None and r["matmuls_only_median_ms"] > 0
            assert r["ladder_share"] == pytest.approx(
                1 - r["matmuls_only_median_ms"] / r["median_ms"]
            )
        else:
            assert r["gbps"] == pytest.approx(r["min_bytes"] / r["median_ms"] / 1e6)
            assert r["copy_fraction"] == pytest.approx(r["gbps"] / report["copy_bandwidth_gbps"])
        assert r["error"] is None
        assert len(r["samples_ms"]) == r["repeats"] == 3
        assert all(math.isfinite(t) and t > 0 for t in r["samples_ms"])
        assert 0 < r["min_ms"] <= r["q1_ms"] <= r["median_ms"] <= r["q3_ms"] <= r["max_ms"]
        assert r["first_call_ms"] > 0
        literal = next(
            x
            for x in rows
            if (x["op"], x["d"], x["mode"], x["impl"]) == (r["op"], r["d"], r["mode"], "literal")
        )
        assert r["speedup_vs_literal"] == pytest.approx(literal["median_ms"] / r["median_ms"])
        # Positive inputs: every impl computes the literal form's values.
        assert r["max_abs_diff_vs_literal"] < 1e-5
        assert "peak_memory_bytes" not in r  # not measurable on CPU: left out, not faked
        assert r["minor_page_faults"] >= 0
    # Targets are for (2^20, d) workloads, which this run did not measure.
    assert [t["met"] for t in report["targets"]] == [None, None]

    md = md_path.read_text()
    assert "| workload | mode | literal | continuant | auto | auto uses | fastest |" in md
    assert "| cf 256 d=3 | fwd+bwd |" in md and "| ladder 8x16 d=2 | fwd |" in md
    assert "| ensemble 8x16 L=2 d=2 | fwd |" in md and "| Cffn-scalar 8x16 L=2 d=2 | fwd |" in md
    assert "cofr bench ops --quick" in md and "torch " in md


def test_targets_come_from_measurements():
    config = OpsBenchConfig(
        sizes=(512,),
        depths=(5,),
        ladder_sizes=(),
        ensemble_sizes=(),
        cffn_sizes=(),
        impls=("literal", "continuant"),
        modes=("fwd+bwd",),
        repeats=2,
        warmup=0,
        device="cpu",
    )
    report = run_benchmark(config)
    [result] = [r for r in report.results if r.impl == "continuant"]
    assert result.speedup is not None and result.speedup > 0
    easy = Target("continued_fraction", 512, 5, "fwd+bwd", "continuant", 0.0)
    impossible = Target("continued_fraction", 512, 5, "fwd+bwd", "continuant", 1e9)
    absent = Target("continued_fraction", 512, 8, "fwd+bwd", "continuant", 1.0)
    checks = check_targets(report.results, [easy, impossible, absent])
    assert [c.met for c in checks] == [True, False, None]
    assert checks[0].speedup == result.speedup


def test_triton_is_skipped_on_cpu_with_a_note():
    config = OpsBenchConfig(
        sizes=(64,),
        depths=(2,),
        ladder_sizes=(),
        ensemble_sizes=(),
        cffn_sizes=(),
        impls=("literal", "triton"),
        modes=("fwd",),
        repeats=1,
        warmup=0,
        device="cpu",
    )
    report = run_benchmark(config)
    triton = next(r for r in report.results if r.impl == "triton")
    assert triton.summary is None and triton.error is None
    assert "CUDA" in triton.skipped and "interpreter" in triton.skipped
    assert "| cf 64 d=2 | fwd |" in to_markdown(report) and "skipped" in to_markdown(report)
    assert "triton" not in default_impls(torch.device("cpu"))
    assert "triton" in default_impls(torch.device("cuda"))


def test_min_bytes():
    cf = Workload("continued_fraction", 100, 5)
    assert min_bytes(cf, "fwd", 4) == (100 * 5 + 100) * 4
    # fwd+bwd: read a, write f; read a and the upstream gradient, write d loss / d a.
    assert min_bytes(cf, "fwd+bwd", 4) == (3 * 100 * 5 + 2 * 100) * 4
    ladder = Workload("univariate_ladder", 10, 3, 8)
    assert min_bytes(ladder, "fwd", 2) == (2 * 80 + 2 * 3 * 8) * 2
    ensemble = Workload("ladder_ensemble", 10, 3, 8, 2)
    params = 2 * 3 * 2 * 8 + 8 * 2
    assert min_bytes(ensemble, "fwd+bwd", 4) == (2 * 80 + params + 3 * 80 + 2 * params) * 4
    assert min_bytes(Workload("cffn_scalar", 10, 3, 8, 2), "fwd", 4) is None


def test_targets_against_another_impl_and_bandwidth():
    w = Workload("univariate_ladder", 64, 3, 32)
    results = []
    for impl, median, fraction in (
        ("literal", 8.0, 0.1),
        ("compiled", 4.0, 0.2),
        ("triton", 1.0, 0.8),
    ):
        r = Result(w, "fwd+bwd", impl, impl, summary=Summary.of([median]))
        r.speedup, r.copy_fraction = 8.0 / median, fraction
        results.append(r)
    targets = [
        Target("univariate_ladder", 64, 3, "fwd+bwd", "triton", 2.0, "compiled", 32),
        Target("univariate_ladder", 64, 3, "fwd+bwd", "triton", 10.0, width=32),
        Target("univariate_ladder", 64, 3, "fwd+bwd", "triton", 0, width=32, min_copy_fraction=0.7),
        Target("univariate_ladder", 64, 3, "fwd", "triton", 0, width=32, min_copy_fraction=0.7),
    ]
    checks = check_targets(results, targets)
    assert [c.speedup for c in checks] == [4.0, 8.0, 0.8, None]
    assert [c.met for c in checks] == [True, False, True, None]
    assert "of copy bandwidth" in targets[2].describe()


def test_unknown_impl_is_an_error():
    assert cli.main(["bench", "ops", "--quick", "--impls", "literal,nope", "--no-save"]) == 2


@pytest.mark.parametrize(
    "text, value", [("65536", 65536), ("2^16", 65536), ("2**4", 16), ("1<<20", 1 << 20)]
)
def test_parse_int(text, value):
    assert parse_int(text) == value


def test_summary_statistics():
    s = Summary.of([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.median, s.min, s.max, s.q1, s.q3, s.repeats) == (3.0, 1.0, 5.0, 2.0, 4.0, 5)
    assert Summary.of([7.0]).q1 == 7.0


def test_time_interleaved_rotates_order():
    import torch

    order: list[str] = []
    fns = {name: (lambda n=name: order.append(n)) for name in "abc"}
    samples = time_interleaved(fns, repeats=3, device=torch.device("cpu"))
    assert order == list("abc" + "bca" + "cab")
    assert all(len(v) == 3 for v in samples.values())


def test_background_load_is_a_fraction():
    with BackgroundLoad() as background:
        sum(range(200_000))
    assert background.fraction is None or 0.0 <= background.fraction <= 1.0
    # Gives up at once with no time to wait, whatever the load.
    load = wait_for_quiet(threshold=0.0, max_wait_s=0.0, window_s=0.05)
    assert load is None or 0.0 <= load <= 1.0


@pytest.mark.slow
def test_bench_ops_compiled(tmp_path):
    """The torch.compile path end to end (compiles: tens of seconds)."""
    argv = ["bench", "ops", "--quick", "--sizes", "4096", "--depths", "3", "--ladder-sizes"]
    argv += ["64x64", "--impls", "literal,compiled", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    report = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert all(r["error"] is None and r["median_ms"] > 0 for r in report["results"])
