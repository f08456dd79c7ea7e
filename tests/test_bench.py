"""`cofr bench ops` and the `cofr` CLI: tiny workloads, real timings, files written."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import itertools
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
import types
from dataclasses import field
from pathlib import Path

import pytest
import torch

from cofrgenet import cli
from cofrgenet.bench.ops import (
    QUICK,
    TARGETS,
    OpsBenchConfig,
    OutputOptions,
    Result,
    Target,
    Workload,
    add_arguments,
    check_targets,
    config_from_args,
    default_impls,
    measure,
    min_bytes,
    run_benchmark,
    run_order,
    to_markdown,
)
from cofrgenet.bench.timing import (
    BackgroundLoad,
    Summary,
    minor_page_faults,
    time_interleaved,
    wait_for_quiet,
)
from cofrgenet.dataclass_options import (
    add_dataclass_arguments,
    at_least,
    dataclass_from_args,
    parse_int,
)

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


def test_every_option_of_every_command_has_help():
    """`cofr <command> --help` explains each option (fit/validate/test: LightningCLI's
    parser, tested in test_training_cli.py)."""
    import argparse

    for command in cli.COMMANDS:
        if command.passthrough:
            continue
        parser = cli.build_parser(list(command.path))
        for word in command.path:
            subparsers = next(
                a for a in parser._actions if isinstance(a, argparse._SubParsersAction)
            )
            parser = subparsers.choices[word]
        bare = [
            action.option_strings or [action.dest]
            for action in parser._actions
            if not action.help and not isinstance(action, argparse._HelpAction)
        ]
        assert not bare, f"cofr {' '.join(command.path)}: no help for {bare}"


def test_bench_ops_help_lists_every_field(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "ops", "--help"])
    out = " ".join(capsys.readouterr().out.split())  # undo argparse's line wrapping
    for cls in (OpsBenchConfig, OutputOptions):
        for f in dataclasses.fields(cls):
            flag = "--" + f.name.replace("_", "-")
            assert f.metadata["help"], f"{cls.__name__}.{f.name} has no help"
            assert f"{flag} " in out and " ".join(f.metadata["help"].split()) in out
    # Defaults are shown as they are written: powers of two, ROWSxN pairs.
    assert "(default: 2^16,2^20)" in out and "(default: 256x256,1024x1024)" in out
    assert "under 10% of the CPU" in out  # plain % in the metadata, escaped for argparse
    assert "--no-save" in out and "--fail-on-miss" in out and "--quick" in out


def _parse(words: str) -> tuple[OpsBenchConfig, OutputOptions]:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(shlex.split(words))
    return config_from_args(args), dataclass_from_args(OutputOptions, args)


def test_bench_ops_flags_of_gpu_check_and_makefile():
    """The flags scripts/gpu_check.sh and the Makefile pass keep their meaning."""
    config, options = _parse(
        "--device cuda --out-dir docs/benchmarks --impls literal,continuant,compiled,triton "
        "--repeats 10 --warmup 3 --time-budget 70 --sizes 2^20 --depths 3,5,8 "
        "--ladder-sizes 8192x2304 --ladder-depths 3,5,8 --ensemble-sizes 8192x768 "
        "--ensemble-ladders 3 --ensemble-depths 5 --cffn-sizes '' --suffix=-extra"
    )
    assert config == dataclasses.replace(
        OpsBenchConfig(),
        device="cuda",
        impls=("literal", "continuant", "compiled", "triton"),
        repeats=10,
        warmup=3,
        time_budget=70.0,
        sizes=(1 << 20,),
        depths=(3, 5, 8),
        ladder_sizes=((8192, 2304),),
        ladder_depths=(3, 5, 8),
        ensemble_sizes=((8192, 768),),
        ensemble_ladders=3,
        ensemble_depths=(5,),
        cffn_sizes=(),
    )
    assert options == OutputOptions(out_dir=Path("docs/benchmarks"), tag="-extra")
    assert _parse("--out docs/benchmarks") == (  # its older name
        OpsBenchConfig(),
        OutputOptions(out_dir=Path("docs/benchmarks")),
    )


def test_bench_ops_quick_fills_only_the_options_not_given():
    config, options = _parse("--quick --impls literal,continuant --repeats 5 --no-save")
    assert options == OutputOptions(quick=True, save=False)
    quick = dataclasses.replace(OpsBenchConfig(), **QUICK)
    assert config == dataclasses.replace(quick, impls=("literal", "continuant"), repeats=5)
    assert config.sizes == (1 << 10,) != OpsBenchConfig().sizes


@dataclasses.dataclass(frozen=True)
class _Sample:
    shapes: tuple[tuple[int, int], ...] = field(default=((8, 16),), metadata={"help": "AxB"})
    rows: int = field(default=4, metadata={"help": "share in %", "choices": (4, 1 << 10)})
    names: tuple[str, ...] = ("a", "b")
    seed: int | None = None


def test_arguments_generator_lists_pairs_powers_and_presets():
    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser, _Sample, given_only=True)
    args = parser.parse_args(["--shapes", "2^10x3, 1<<2X5", "--rows", "2**10", "--names", ""])
    assert vars(args) == {"shapes": ((1024, 3), (4, 5)), "rows": 1024, "names": ()}
    # Options not given keep the preset's values, not the dataclass defaults.
    preset = _Sample(seed=7, names=("z",))
    assert dataclass_from_args(_Sample, args, base=preset) == _Sample(
        ((1024, 3), (4, 5)), 1024, (), 7
    )
    assert dataclass_from_args(_Sample, parser.parse_args([])) == _Sample()
    assert "share in % (default: 4)" in " ".join(parser.format_help().split())
    for bad in (["--shapes", "8x"], ["--shapes", "8x16x2"], ["--rows", "3"], ["--seed", "x"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)


def test_bench_ops_bad_shape_is_a_one_line_error(capsys):
    assert cli.main(["bench", "ops", "--ladder-sizes", "8x", "--no-save"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("cofr bench ops: error: argument --ladder-sizes")
    assert "expected NxN" in err


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
    argv = ["bench", "ops", "--quick", *TINY, "--repeats", "3", "--out-dir", str(tmp_path)]
    argv += ["--tag", "extra"]  # named as bench train's and quality's --tag names theirs
    assert cli.main(argv) == 0

    [json_path] = tmp_path.glob("ops-cpu-*-quick-extra.json")  # as quality's: tag last
    [md_path] = tmp_path.glob("ops-cpu-*-quick-extra.md")
    report = json.loads(json_path.read_text())
    assert report["command"] == "cofr " + " ".join(argv)
    assert report["threads"] == torch.get_num_threads() and report["device_name"]

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
        assert isinstance(r["minor_page_faults"], int)  # measured on CPU, not left out
    # Targets are for (2^20, d) workloads, which this run did not measure.
    assert [t["met"] for t in report["targets"]] == [None, None]

    md = md_path.read_text()
    assert "| workload | mode | literal | continuant | auto | auto uses | fastest |" in md
    assert "| cf 256 d=3 | fwd+bwd |" in md and "| ladder 8x16 d=2 | fwd |" in md
    assert "| ensemble 8x16 L=2 d=2 | fwd |" in md and "| Cffn-scalar 8x16 L=2 d=2 | fwd |" in md
    assert "cofr bench ops --quick" in md and "torch " in md


def _small_config(**changes) -> OpsBenchConfig:
    """continued_fraction d = 1, 2 and one ladder; literal forward only: milliseconds."""
    fields = dict(sizes=(64,), depths=(1, 2), ladder_sizes=((4, 8),), ladder_depths=(2,))
    fields |= dict(ensemble_sizes=(), cffn_sizes=(), impls=("literal",), modes=("fwd",))
    return OpsBenchConfig(**(fields | dict(repeats=1, warmup=0, device="cpu") | changes))


def test_bench_ops_runs_one_op_at_a_time_and_reports_after_each_workload():
    config = _small_config()
    cf1, cf2, ladder = workloads = config.workloads()
    assert run_order(workloads) == [0, 2, 1]  # cf, ladder, then cf's second shape
    partials = []
    report = run_benchmark(config, on_update=partials.append)
    assert [[r.workload for r in p.results] for p in partials] == [[cf1], [cf1, ladder]]
    assert [p.meta["pending"] for p in partials] == [[cf2.label, ladder.label], [cf2.label]]
    assert all(p.meta["partial"] for p in partials)
    # The finished report: every workload, in the config's order, and no partial mark.
    assert [r.workload for r in report.results] == [cf1, cf2, ladder]
    assert "partial" not in report.meta and "pending" not in report.meta
    text = to_markdown(partials[0])
    still = f"1 of 3 workloads measured; still to run: {cf2.label}, {ladder.label}."
    assert f"**Partial report**, written while the run was going: {still}" in text
    assert "Partial" not in to_markdown(report)


@pytest.mark.parametrize(
    "budget, not_run", [(6.0, ["cf 64 d=2", "cf 64 d=3", "ladder 4x8 d=2"]), (9.0, ["cf 64 d=3"])]
)
def test_time_budget_starts_no_workload_the_longest_so_far_says_would_overrun(
    monkeypatch, budget, not_run
):
    # A clock that only the workloads move: cf takes 4 s, the ladder 1 s.
    clock = [0.0]
    seconds = {"continued_fraction": 4.0, "univariate_ladder": 1.0}

    def bench(w, *args, **kwargs):
        clock[0] += seconds[w.op]
        return []

    monkeypatch.setattr(measure, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(measure, "bench_workload", bench)
    monkeypatch.setattr(measure, "measure_copy_bandwidth", lambda device: 1.0)
    # Runs cf d=1 (to 4 s); budget 6: the ladder may take 4 s, past 6: none starts. Budget
    # 9: the ladder (to 5 s), cf d=2 (to 9 s), and no cf d=3.
    report = run_benchmark(_small_config(depths=(1, 2, 3), time_budget=budget))
    assert report.meta["not_run"] == not_run


def test_bench_ops_cut_short_keeps_a_partial_report(monkeypatch, tmp_path, capsys):
    real = measure.bench_workload
    calls = []
    stop_at = [2]

    def bench(*args, **kwargs):  # as if the wall-clock limit struck in the second workload
        calls.append(1)
        if len(calls) == stop_at[0]:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(measure, "bench_workload", bench)
    argv = ["bench", "ops", "--quick", *TINY, "--impls", "literal", "--out-dir"]
    stop_at[0] = 1  # in the first workload: nothing to keep, and said so
    assert cli.main([*argv, str(tmp_path / "none")]) == 130
    assert "stopped: nothing was measured yet, so no report was written" in capsys.readouterr().err
    assert not list((tmp_path / "none").iterdir())
    calls.clear()
    assert cli.main([*argv, str(tmp_path / "none"), "--no-save"]) == 130  # none to write
    assert "stopped:" not in capsys.readouterr().err
    calls.clear()
    stop_at[0] = 2
    assert cli.main([*argv, str(tmp_path)]) == 130  # cofr's Ctrl-C: one line, exit 130
    [json_path] = tmp_path.glob("ops-cpu-*-quick.json")
    md_path = json_path.with_suffix(".md")
    assert f"stopped: what was measured so far is in {md_path} (partial)" in capsys.readouterr().err
    report = json.loads(json_path.read_text())
    assert report["partial"] is True and len(report["pending"]) == 5
    assert {r["op"] for r in report["results"]} == {"continued_fraction"}
    # It said "written while the run was going ... the finished run rewrites this file".
    assert report["stopped"] == "Ctrl-C"
    md = md_path.read_text()
    assert "**Stopped** by Ctrl-C: 1 of 6 workloads measured; not measured: " in md
    assert "Partial report" not in md and "rewrites this file" not in md
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


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
    literal, result = sorted(report.results, key=lambda r: r.impl != "literal")
    assert result.speedup == literal.summary.median / result.summary.median
    easy = Target("continued_fraction", 512, 5, "fwd+bwd", "continuant", 0.0)
    impossible = Target("continued_fraction", 512, 5, "fwd+bwd", "continuant", 1e9)
    absent = Target("continued_fraction", 512, 8, "fwd+bwd", "continuant", 1.0)
    checks = check_targets(report.results, [easy, impossible, absent])
    assert [c.met for c in checks] == [True, False, None]
    assert checks[0].speedup == result.speedup


def test_targets_are_checked_for_their_dtype_and_fastest_counts_auto():
    """A float64 run printed "MET: auto >= 5x literal", a float32 target; with literal and
    auto timed, "fastest" named literal at 40x auto's time (auto was left out)."""
    from cofrgenet.bench.ops import targets_for

    cpu = torch.device("cpu")
    assert (
        targets_for(cpu) and not targets_for(cpu, "float64") and not targets_for(cpu, grad="exact")
    )
    config = OpsBenchConfig(
        sizes=(4096,), depths=(8,), ladder_sizes=(), ensemble_sizes=(), cffn_sizes=(),
        impls=("literal", "auto"), modes=("fwd+bwd",), repeats=3, warmup=1, device="cpu",
        dtype="float64",
    )  # fmt: skip
    report = run_benchmark(config)
    literal, auto = sorted(report.results, key=lambda r: r.impl == "auto")
    assert report.targets == []
    # Which is faster is the machine's to say (a busy CI once timed auto at 0.5x).
    faster = auto.summary.median < literal.summary.median
    fastest = f"| auto ({auto.resolved}): " if faster else "| literal: "
    assert fastest in to_markdown(report)
    with pytest.raises(ValueError, match="--impls: nothing to time"):
        OpsBenchConfig(impls=()).validate()
    empty = {"sizes": (), "ladder_sizes": (), "ensemble_sizes": (), "cffn_sizes": ()}
    with pytest.raises(ValueError, match=r"^nothing to time: each op times its sizes at"):
        OpsBenchConfig(**empty).validate()  # an empty table was written, status 0
    # Sizes without depths time nothing either: said so, not "the sizes are empty".
    without_depths = {**empty, "sizes": (8,), "depths": ()}
    with pytest.raises(ValueError, match=r"\(--sizes at --depths, "):
        OpsBenchConfig(**without_depths).validate()


def test_fastest_counts_auto_unless_its_impl_was_timed_itself():
    """With literal and auto timed, "fastest" named literal at 40x auto's time (auto was
    left out); auto stands for its impl only when that impl was not timed too."""
    from cofrgenet.bench.ops.report import _fastest_cell
    from cofrgenet.bench.ops.results import Result
    from cofrgenet.bench.ops.workloads import Workload
    from cofrgenet.bench.timing import Summary

    work = Workload("continued_fraction", 4096, 8)

    def timed(impl: str, ms: float, resolved: str | None = None) -> Result:
        return Result(work, "fwd", impl, resolved or impl, summary=Summary.of([ms]))

    literal, auto = timed("literal", 4.0), timed("auto", 0.1, "continuant")
    assert _fastest_cell({"literal": literal, "auto": auto}).startswith("auto (continuant): ")
    both = {"literal": literal, "continuant": timed("continuant", 0.2), "auto": auto}
    assert _fastest_cell(both).startswith("continuant: ")  # auto was continuant: not twice


def test_a_target_whose_workload_was_not_timed_does_not_read_as_a_result():
    """`not measured: auto >= 5x literal` read as a finding about auto."""
    from cofrgenet.bench.ops.report import _target_line
    from cofrgenet.bench.ops.targets import TargetCheck, targets_for

    target = targets_for(torch.device("cpu"))[0]
    line = _target_line(TargetCheck(target, speedup=None))
    assert line == f"NOT TIMED (its workload was skipped or failed): {target.describe()}"
    assert _target_line(TargetCheck(target, speedup=1e9)).startswith("MET: ")


def test_a_target_this_run_never_selected_is_not_read_as_skipped_or_failed():
    """`--quick --impls literal,continuant` printed "NOT TIMED (its workload was skipped
    or failed): auto >= 5x literal, ... (2^20, d=5)": no 2^20 size, no auto, nothing
    skipped. A target the run never selected now says so, and why."""
    from cofrgenet.bench.ops.report import _target_line

    report = run_benchmark(_small_config())  # cf 64, literal, fwd: neither CPU target
    lines = [_target_line(c) for c in report.targets]
    why = "its workload is not among this run's; fwd+bwd not in --modes; auto not in --impls"
    assert lines[0] == f"NOT IN THIS RUN ({why}): {TARGETS[0].describe()}"
    assert all(line.startswith("NOT IN THIS RUN (") for line in lines)
    assert "NOT TIMED" not in to_markdown(report)
    assert report.to_dict()["targets"][0]["not_in_run"] == why
    assert report.targets[0].met is None  # nor a miss for --fail-on-miss
    # Selected, then not timed (it failed, or the time budget ran out): as before.
    selected = OpsBenchConfig(sizes=(1 << 20,), depths=(5, 8), impls=("literal", "auto"))
    [check, _] = check_targets([], TARGETS, selected)
    assert _target_line(check).startswith("NOT TIMED (its workload was skipped or failed): ")
    only_auto = OpsBenchConfig(sizes=(1 << 20,), depths=(5,), impls=("auto",))
    assert check_targets([], TARGETS[:1], only_auto)[0].not_in_run == "literal not in --impls"


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
    "words, message",
    [
        ("--impls literal,litteral", "--impls: unknown 'litteral' (did you mean 'literal'?)"),
        ("--modes fwdd", "--modes: unknown 'fwdd' (did you mean 'fwd'?); choose from fwd"),
        ("--repeats 0", "--repeats must be >= 1, got 0"),
        ("--threads 0", "--threads must be >= 1, got 0"),
        ("--time-budget -1", "--time-budget must be >= 0, got -1.0"),
        ("--ladder-sizes 0x8", "--ladder-sizes: sizes and depths must be >= 1, got 0"),
        ("--device foo", "--device: unknown device 'foo'; use cpu, cuda, cuda:N or auto"),
        ("--eps 0", "--eps must be > 0 (the least |K_d|), got 0.0"),  # every op would fail
        ("--tag a/b", "--tag 'a/b': it goes into the report's file name"),
        ("--calls-per-sample 0", "--calls-per-sample must be >= 1, got 0"),
        # Python's "invalid literal for int() with base 10" named no accepted form.
        (
            "--sizes 1024,2^x",
            "argument --sizes: expected comma-separated ints (each as 65536, 2^16 or 1<<16): "
            "'2^x' is not one",
        ),
        ("--cffn-sizes 2x", "argument --cffn-sizes: expected NxN (e.g. 8192x768), got '2x'"),
    ],
)
def test_bench_ops_bad_options_are_one_line_errors_with_the_command(
    capsys, tmp_path, words, message
):
    argv = ["bench", "ops", "--quick", "--out-dir", str(tmp_path / "out"), *shlex.split(words)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"cofr bench ops: error: {message}") and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()  # refused before anything is timed or written


@pytest.mark.parametrize(
    "words, where",
    [("", "no CUDA device here"), ("--device cpu", "--device cpu")],
)
def test_bench_ops_refuses_triton_without_cuda(capsys, tmp_path, monkeypatch, words, where):
    """`--impls triton` on a machine without CUDA printed a table of `skipped` cells and
    exited 0."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = ["bench", "ops", "--quick", "--impls", "literal,triton", "--out-dir"]
    assert cli.main([*argv, str(tmp_path / "out"), *shlex.split(words)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"cofr bench ops: error: --impls triton: triton needs a CUDA device ({where}); leave "
        "it out, or run on a machine with CUDA"
    )
    assert not (tmp_path / "out").exists()


def test_bench_ops_out_dir_that_cannot_be_made_fails_before_the_timing(
    capsys, tmp_path, monkeypatch
):
    import cofrgenet.bench.ops.command as command

    def timed(*args, **kwargs):
        raise AssertionError("timed before the output folder was checked")

    monkeypatch.setattr(command, "run_benchmark", timed)
    blocker = tmp_path / "notes.txt"
    blocker.write_text("mine")
    assert cli.main(["bench", "ops", "--quick", "--out-dir", str(blocker / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"cofr bench ops: error: --out-dir {blocker / 'out'}: cannot make this folder: "
        f"'{blocker}' is a file"
    )
    assert blocker.read_text() == "mine"


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here")
def test_bench_ops_on_cuda_without_cuda_says_so(capsys, tmp_path):
    argv = ["bench", "ops", "--quick", "--device", "cuda", "--out-dir", str(tmp_path / "out")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "cofr bench ops: error: --device: device 'cuda': torch sees no cuda device on this "
        "machine; use cpu or auto"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "text, value", [("65536", 65536), ("2^16", 65536), ("2**4", 16), ("1<<20", 1 << 20)]
)
def test_parse_int(text, value):
    assert parse_int(text) == value


def test_bounded_int_options_read_ints_as_dataclass_options_do():
    """at_least(int, ...) options took only plain ints: ``--x 2^16`` was "expected an
    int", while the benchmarks' dataclass options read it (parse_int)."""
    positive = at_least(int, 1)
    assert positive("2^16") == positive("1<<16") == positive("2**16") == 65536
    assert positive(" 7 ") == 7
    for bad in ("x", "1.5", "2^"):
        with pytest.raises(argparse.ArgumentTypeError) as raised:
            positive(bad)
        assert str(raised.value) == f"expected an int, got {bad!r}"
    with pytest.raises(argparse.ArgumentTypeError, match="must be >= 1, got 0"):
        positive("0")
    assert at_least(float, 0.5)("2.5") == 2.5  # floats as before


def test_summary_statistics():
    s = Summary.of([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.median, s.min, s.max, s.q1, s.q3, s.repeats) == (3.0, 1.0, 5.0, 2.0, 4.0, 5)
    assert Summary.of([7.0]).q1 == 7.0


def test_time_interleaved_varies_the_order_and_collects_no_garbage_while_timing():
    """Each candidate goes first, and after each other one, equally often; the garbage
    collector never runs inside a round (a collection slowed the call after it 3x)."""
    order: list[str] = []
    fns = {name: (lambda n=name: order.append(n)) for name in "abc"}
    samples = time_interleaved(fns, repeats=6, device=torch.device("cpu"))
    rounds = ["".join(order[i : i + 3]) for i in range(0, 18, 3)]
    assert sorted(rounds) == sorted(map("".join, itertools.permutations("abc")))
    assert all(len(v) == 6 for v in samples.values())
    pair = []
    time_interleaved({n: (lambda n=n: pair.append(n)) for n in "ab"}, 4, torch.device("cpu"))
    assert pair == list("ab" + "ba" + "ba" + "ab")  # first 2 of 4 times each
    enabled = []
    time_interleaved({"a": lambda: enabled.append(gc.isenabled())}, 3, torch.device("cpu"))
    assert enabled == [False] * 3 and gc.isenabled()


def test_a_sample_is_the_mean_of_its_calls_between_two_synchronizations(monkeypatch):
    """--calls-per-sample: one pair of synchronizations for several calls (10 by default on
    CUDA, where one costs as much as a small kernel), each sample their mean."""
    from cofrgenet.bench import timing
    from cofrgenet.bench.ops.config import OpsBenchConfig
    from cofrgenet.bench.ops.report import _calls

    clock, syncs, calls = iter([1.0, 1.006]), [], []
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(timing, "synchronize", lambda device: syncs.append(device))
    ms = timing.time_once(lambda: calls.append(1), torch.device("cpu"), calls=3)
    assert ms == pytest.approx(2.0) and len(calls) == 3 and len(syncs) == 2
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert (OpsBenchConfig().sample_calls(cpu), OpsBenchConfig().sample_calls(cuda)) == (1, 10)
    assert OpsBenchConfig(calls_per_sample=4).sample_calls(cuda) == 4
    assert _calls({"calls_per_sample": 10}, " of {} calls") == " of 10 calls"
    assert _calls({"calls_per_sample": 1}, " of {} calls") == _calls({}, " of {} calls") == ""


LINUX_PROC = os.path.exists("/proc/stat")


def test_background_load_is_measured_where_proc_stat_is():
    with BackgroundLoad() as background:
        time.sleep(0.05)  # a few clock ticks: a shorter block may measure nothing
    assert (background.fraction is not None) == LINUX_PROC
    # Gives up after one window with no time to wait, whatever the load.
    start = time.monotonic()
    load = wait_for_quiet(threshold=0.0, max_wait_s=0.0, window_s=0.05)
    assert time.monotonic() - start < 1.0
    assert (load is not None) == LINUX_PROC


def test_a_busy_machine_is_flagged_per_workload():
    """The warning of `cofr bench ops`, now shared with `cofr bench train`."""
    from cofrgenet.bench.ops import busy_warning
    from cofrgenet.bench.ops.results import Report

    busy, quiet = Workload("continued_fraction", 64, 2), Workload("continued_fraction", 64, 3)
    results = [Result(busy, "fwd", "literal", "literal", background_load=0.5)]
    results += [Result(quiet, "fwd", "literal", "literal", background_load=0.05)]
    assert busy_warning(Report({}, results, [])) == (
        "1 of 2 workloads were timed while other processes used more than 10% of the CPU "
        "(cf 64 d=2): their timings and ratios are unreliable; rerun them on a quiet machine."
    )
    assert busy_warning(Report({}, results[1:], [])) is None


def test_minor_page_faults_count_fresh_memory():
    # 64 MiB comes straight from the OS (mmap) and faults when first written; a call
    # that allocates nothing faults (next to) never. The count is the process's: a thread
    # an earlier test left running (MLflow's, say) may fault meanwhile, hence the min.
    cpu = torch.device("cpu")
    assert minor_page_faults(lambda: torch.ones(1 << 24), cpu) > 16
    assert min(minor_page_faults(lambda: None, cpu) for _ in range(5)) < 16


@pytest.mark.slow
def test_bench_ops_compiled(tmp_path):
    """The torch.compile path end to end (compiles: tens of seconds)."""
    argv = ["bench", "ops", "--quick", "--sizes", "4096", "--depths", "3", "--ladder-sizes"]
    argv += ["64x64", "--impls", "literal,compiled", "--out-dir", str(tmp_path)]
    assert cli.main(argv) == 0
    report = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert all(r["error"] is None and r["median_ms"] > 0 for r in report["results"])


def test_a_compile_that_fell_back_to_eager_is_no_compiled_timing(tmp_path, monkeypatch):
    """continuant._run runs eagerly once torch.compile fails: timed, that read as the
    compiled path's speed (and the GPU targets judged Triton against it)."""
    from cofrgenet.ops import continuant

    def broken(fn):
        def run(*args):
            raise RuntimeError("inductor: no C compiler")

        return run

    monkeypatch.setattr(continuant, "_compiled", broken)
    monkeypatch.setattr(continuant, "_compile_failed", False)
    argv = ["bench", "ops", "--quick", "--sizes", "256", "--depths", "3", "--ladder-sizes"]
    argv += ["16x16", "--ensemble-sizes", "", "--cffn-sizes", "", "--impls", "literal,compiled"]
    with pytest.warns(RuntimeWarning, match="falling back"):
        cli.main([*argv, "--out-dir", str(tmp_path)])
    report = json.loads(next(tmp_path.glob("*.json")).read_text())
    compiled = [r for r in report["results"] if r["impl"] == "compiled"]
    assert compiled and all("continuant kernels ran eagerly" in r["error"] for r in compiled)


def test_reports_never_replace_another_runs_report(tmp_path):
    """Every bench (ops, train, quality) names its files through free_stem."""
    from cofrgenet.bench.files import free_stem, with_suffix

    first = free_stem(tmp_path, "ops-cpu-2026-12-02-v1.2")
    assert first == tmp_path / "ops-cpu-2026-12-02-v1.2"
    assert with_suffix(first, ".md").name == "ops-cpu-2026-12-02-v1.2.md"  # the tag's dot stays
    with_suffix(first, ".json").write_text("{}")  # either file marks the name as taken
    second = free_stem(tmp_path, "ops-cpu-2026-12-02-v1.2")
    assert second.name == "ops-cpu-2026-12-02-v1.2-2"
    with_suffix(second, ".md").write_text("")
    assert free_stem(tmp_path, "ops-cpu-2026-12-02-v1.2").name.endswith("-3")


def test_reports_name_the_cpu_model():
    """Reports name the CPU (the dev VMs change from Intel to AMD between sessions, and
    the ratios with them): /proc/cpuinfo's model name where there is one."""
    from pathlib import Path

    from cofrgenet.bench.machine import cpu_name, device_name, machine_summary

    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        models = [line for line in cpuinfo.read_text().splitlines() if "model name" in line]
        if models:
            assert cpu_name() == models[0].split(":", 1)[1].strip()
    assert device_name(torch.device("cpu")) == cpu_name()
    from cofrgenet.training.run_store import code_description

    assert machine_summary("cpu") == (
        f"{cpu_name()}, {torch.get_num_threads()} threads, python {platform.python_version()}, "
        f"torch {torch.__version__}, {code_description()}"
    )
    # The commit of the checkout the figures came from, and whether it had changes.
    assert code_description().startswith("cofrgenet ")
    if (Path(__file__).resolve().parents[1] / ".git").exists():
        assert ", commit " in code_description()


def test_report_files_name_a_device_alike_in_every_bench():
    from cofrgenet.bench.machine import device_slug, name_slug

    assert name_slug("NVIDIA H200") == "nvidia-h200"
    assert name_slug(" Tesla V100-SXM2 (16GB) ") == "tesla-v100-sxm2-16gb"
    assert device_slug("cpu") == "cpu"


def test_a_negative_ladder_share_reads_as_noise():
    """A Cffn layer timed faster than its own matmuls alone printed "ladders -21% of the
    layer": a difference of two timings below zero is their noise."""
    from cofrgenet.bench.ops.formatting import share

    assert share(-0.21) == "<0% (noise)"
    assert share(0.345) == "34%" and share(None) == "-"
