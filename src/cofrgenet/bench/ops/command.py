"""The command line of `cofr bench ops`, generated from the config dataclasses.

:class:`OpsBenchConfig`'s fields are what to time (and go into the report); the fields
of :class:`OutputOptions` say where the report goes. Options not given take the
defaults of :class:`OpsBenchConfig`, or ``--quick``'s (:data:`QUICK`) with ``--quick``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from cofrgenet import terminal
from cofrgenet.bench.files import (
    check_file_name_part,
    make_out_dir,
    measure_keeping_partial,
    stem_once,
)
from cofrgenet.bench.ops.config import CUDA_ONLY_IMPLS, QUICK, OpsBenchConfig
from cofrgenet.bench.ops.measure import resolve_device, run_benchmark
from cofrgenet.bench.ops.report import print_report, report_stem, write_report
from cofrgenet.bench.ops.results import Report
from cofrgenet.dataclass_options import add_dataclass_arguments, dataclass_from_args
from cofrgenet.errors import ConfigError


@dataclass(frozen=True)
class OutputOptions:
    """How `cofr bench ops` runs and where its report goes (not part of the report)."""

    quick: bool = field(
        default=False,
        metadata={
            "help": "tiny sizes, 3 repeats after 1 warm-up, no torch.compile'd "
            "implementation (tests, CI), for the options not given; results are saved "
            "with a -quick suffix"
        },
    )
    out_dir: Path = field(
        default=Path("runs/bench"),
        metadata={
            "help": "folder for ops-<device>-<date>.md/.json (--out-dir docs/benchmarks "
            "records a result in the repository; --out: its older name)",
            "aliases": ("--out",),
        },
    )
    save: bool = field(
        default=True, metadata={"help": "write the report files (--no-save: print the table only)"}
    )
    tag: str = field(
        default="",
        metadata={
            "help": "appended to the report's file name, as bench train's and quality's "
            "(--tag extra: ops-cpu-<date>-extra.md; --suffix: its older name)",
            "aliases": ("--suffix",),
        },
    )
    fail_on_miss: bool = field(
        default=False, metadata={"help": "exit with status 1 if a measured target is missed"}
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``cofr bench ops``: one per field of the two dataclasses."""
    # Config options stay out of the namespace unless given, so --quick can fill the rest.
    add_dataclass_arguments(
        parser.add_argument_group("what to time"), OpsBenchConfig, given_only=True
    )
    add_dataclass_arguments(parser.add_argument_group("run and output"), OutputOptions)


def config_from_args(args: argparse.Namespace) -> OpsBenchConfig:
    """The config of the options given, over --quick's or the defaults; validated."""
    quick = getattr(args, "quick", False)
    base = replace(OpsBenchConfig(), **QUICK) if quick else OpsBenchConfig()
    config = dataclass_from_args(OpsBenchConfig, args, base=base)
    config.validate()
    return config


def run(args: argparse.Namespace) -> int:
    """Entry point of ``cofr bench ops`` (args from :func:`add_arguments`)."""
    console = terminal.console(log_path=False)
    # A bad option is a ConfigError: `cofr` prints it as "cofr bench ops: error: ...".
    config = config_from_args(args)
    device = resolve_device(config.device)  # before anything is timed or written
    cuda_only = [impl for impl in config.impls if impl in CUDA_ONLY_IMPLS]
    if cuda_only and device.type != "cuda":  # else a table of `skipped` cells, status 0
        where = "no CUDA device here" if config.device == "auto" else f"--device {config.device}"
        raise ConfigError(
            f"--impls {','.join(cuda_only)}: {cuda_only[0]} needs a CUDA device ({where}); "
            "leave it out, or run on a machine with CUDA"
        )
    options = dataclass_from_args(OutputOptions, args)
    command = getattr(args, "command_line", None) or "cofr " + " ".join(sys.argv[1:])
    check_file_name_part("--tag", options.tag)
    # An older --suffix=-extra named the same file as --tag extra does.
    tag = options.tag.lstrip("-")
    # The tag last, as bench quality's: ops-cpu-<date>-quick-extra.
    suffix = ("-quick" if options.quick else "") + (f"-{tag}" if tag else "")
    # Made now: a folder it cannot write fails before the timing, not after it.
    out = make_out_dir(options.out_dir) if options.save else Path(options.out_dir)
    stem = stem_once(lambda report: report_stem(report, out, suffix))

    def save(report: Report) -> tuple[Path, Path]:
        return write_report(report, out, stem(report))

    written: list[tuple[Report, Path]] = []  # the latest partial report written, its .md

    def save_partial(partial: Report) -> None:
        # A run cut short (a wall-clock limit) keeps the workloads it measured.
        md_path, _ = save(partial)
        written[:] = [(partial, md_path)]
        console.log(f"partial report: {md_path}")

    report = measure_keeping_partial(
        lambda: run_benchmark(
            config,
            command=command,
            console=console,
            on_update=save_partial if options.save else None,
        ),
        written,
        lambda partial, why: save(replace(partial, meta={**partial.meta, "stopped": why})),
        saving=options.save,
    )
    print_report(report, console)
    if options.save:
        paths = save(report)
        console.print("wrote " + ", ".join(str(p) for p in paths))
    missed = any(c.met is False for c in report.targets)
    if options.fail_on_miss and missed:
        return 1
    return 0
