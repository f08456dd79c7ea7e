"""`cofr bench ops`: time the continued-fraction ops, literal form against continuants.

Workloads are ``continued_fraction`` on (N, d) partial denominators and
``univariate_ladder`` on x (rows, n) with weight/bias (d, n). Each implementation
(``literal``, ``continuant``, ``compiled``, ``auto`` and any later one in
``cofrgenet.ops.IMPLS``) runs in two modes:

* ``fwd``: the forward pass under ``torch.no_grad()``;
* ``fwd+bwd``: forward, then ``backward`` of a fixed random upstream gradient into
  leaves that require grad (a; or x, weight and bias).

The first call of each (impl, mode) is timed on its own and reported as "first call"
(``torch.compile`` compiles there), followed by untimed warm-up calls; then every
(impl, mode) of a workload is timed ``repeats`` times, interleaved round by round (see
:mod:`cofrgenet.bench.timing`). Speedup = literal median / impl median, same workload
and mode. Inputs are positive (a in [0.5, 1.5)), so no clamp is active and every
implementation computes the same values; the kernels are branch-free, so their speed
does not depend on the values.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table
from torch import Tensor

from cofrgenet.bench.timing import (
    BackgroundLoad,
    Summary,
    minor_page_faults,
    peak_memory_bytes,
    time_interleaved,
    time_once,
    wait_for_quiet,
)
from cofrgenet.ops import IMPLS, continued_fraction, resolve_impl, univariate_ladder

MODES = ("fwd", "fwd+bwd")
DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
REFERENCE_IMPL = "literal"
#: Above this share of the machine's CPU used by other processes, timings are flagged.
BUSY_THRESHOLD = 0.10


def default_impls() -> tuple[str, ...]:
    """Every implementation in ``cofrgenet.ops.IMPLS``: literal first, auto last."""
    middle = [i for i in IMPLS if i not in (REFERENCE_IMPL, "auto")]
    return (REFERENCE_IMPL, *middle, "auto")


@dataclass(frozen=True)
class Target:
    """A speed target: ``impl`` at least ``min_speedup`` x faster than literal."""

    op: str
    rows: int
    d: int
    mode: str
    impl: str
    min_speedup: float

    def describe(self) -> str:
        return (
            f"{self.impl} >= {self.min_speedup:g}x literal, {self.op} ({_pow2(self.rows)}, "
            f"d={self.d}) {self.mode}"
        )


#: The issue's targets for this CPU (fwd+bwd on (2^20, d) float32, after warm-up).
TARGETS = (
    Target("continued_fraction", 1 << 20, 5, "fwd+bwd", "auto", 5.0),
    Target("continued_fraction", 1 << 20, 8, "fwd+bwd", "auto", 8.0),
)


@dataclass(frozen=True)
class Workload:
    """One op on one input shape. ``width`` is n for ladders, None for continued_fraction."""

    op: str
    rows: int
    d: int
    width: int | None = None

    @property
    def units(self) -> int:
        """Number of ladders evaluated (what ``resolve_impl`` looks at)."""
        return self.rows * (self.width or 1)

    @property
    def shape(self) -> str:
        """The input shapes: a (N, d), or x (rows, n) x weight (d, n)."""
        if self.width is None:
            return f"({_pow2(self.rows)}, {self.d})"
        return f"({_pow2(self.rows)}, {self.width}) x ({self.d}, {self.width})"

    @property
    def label(self) -> str:
        """Short name for tables: ``cf 2^20 d=8`` or ``ladder 1024x1024 d=8``."""
        if self.width is None:
            return f"cf {_pow2(self.rows)} d={self.d}"
        return f"ladder {_pow2(self.rows)}x{self.width} d={self.d}"


@dataclass(frozen=True)
class OpsBenchConfig:
    """What to time. Sizes are rows N (continued_fraction) or (rows, n) pairs (ladders)."""

    sizes: tuple[int, ...] = (1 << 16, 1 << 20)
    depths: tuple[int, ...] = (1, 3, 5, 8)
    ladder_sizes: tuple[tuple[int, int], ...] = ((256, 256), (1024, 1024))
    ladder_depths: tuple[int, ...] = (5, 8)
    impls: tuple[str, ...] = field(default_factory=default_impls)
    modes: tuple[str, ...] = MODES
    repeats: int = 7
    warmup: int = 2
    dtype: str = "float32"
    device: str = "auto"
    grad: str = "paper"
    eps: float = 0.01
    seed: int = 0
    threads: int | None = None
    #: Seconds per workload to wait for (and re-time until) a quiet machine; 0: never.
    wait_quiet: float = 0.0

    def workloads(self) -> list[Workload]:
        cf = [Workload("continued_fraction", n, d) for n in self.sizes for d in self.depths]
        ladders = [
            Workload("univariate_ladder", rows, d, width)
            for rows, width in self.ladder_sizes
            for d in self.ladder_depths
        ]
        return cf + ladders

    def validate(self) -> None:
        unknown = [i for i in self.impls if i not in IMPLS]
        if unknown:
            raise ValueError(f"unknown impls {unknown}; choose from {IMPLS}")
        bad_modes = [m for m in self.modes if m not in MODES]
        if bad_modes:
            raise ValueError(f"unknown modes {bad_modes}; choose from {MODES}")
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}; choose from {tuple(DTYPES)}")
        if self.repeats < 1 or self.warmup < 0 or self.wait_quiet < 0:
            raise ValueError("repeats must be >= 1, warmup and wait_quiet >= 0")
        sizes = [*self.sizes, *self.depths, *self.ladder_depths]
        sizes += [v for pair in self.ladder_sizes for v in pair]
        if any(v < 1 for v in sizes):
            raise ValueError("sizes and depths must be positive")


#: Tiny sizes for tests and CI: seconds, no compilation unless asked for.
QUICK = {
    "sizes": (1 << 10,),
    "depths": (1, 3),
    "ladder_sizes": ((16, 32),),
    "ladder_depths": (3,),
    "impls": tuple(i for i in default_impls() if i != "compiled"),
    "repeats": 3,
    "warmup": 1,
}


@dataclass
class Result:
    """Timings of one (workload, mode, impl). ``summary`` is None if the impl failed."""

    workload: Workload
    mode: str
    impl: str
    resolved: str
    first_call_ms: float | None = None
    summary: Summary | None = None
    samples_ms: list[float] = field(default_factory=list)
    speedup: float | None = None
    max_abs_diff: float | None = None
    peak_memory_bytes: int | None = None
    page_faults: int | None = None
    background_load: float | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            **asdict(self.workload),
            "shape": self.workload.shape,
            "mode": self.mode,
            "impl": self.impl,
            "resolved_impl": self.resolved,
            "first_call_ms": self.first_call_ms,
        }
        if self.summary is not None:
            out.update(
                {f"{k}_ms" if k != "repeats" else k: v for k, v in asdict(self.summary).items()}
            )
        out.update(
            samples_ms=self.samples_ms,
            speedup_vs_literal=self.speedup,
            max_abs_diff_vs_literal=self.max_abs_diff,
            minor_page_faults=self.page_faults,
            background_load=self.background_load,
            error=self.error,
        )
        if self.peak_memory_bytes is not None:
            out["peak_memory_bytes"] = self.peak_memory_bytes
        return out


@dataclass
class TargetCheck:
    target: Target
    speedup: float | None
    background_load: float | None = None

    @property
    def met(self) -> bool | None:
        """None when the target's workload was not measured (or failed)."""
        return None if self.speedup is None else self.speedup >= self.target.min_speedup

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self.target),
            "description": self.target.describe(),
            "speedup": self.speedup,
            "met": self.met,
            "background_load": self.background_load,
        }


@dataclass
class Report:
    meta: dict[str, Any]
    results: list[Result]
    targets: list[TargetCheck]

    def to_dict(self) -> dict[str, Any]:
        return {
            "benchmark": "ops",
            **self.meta,
            "results": [r.to_dict() for r in self.results],
            "targets": [t.to_dict() for t in self.targets],
        }


# --------------------------------------------------------------------------- measuring


def _pow2(value: int) -> str:
    """2^k for powers of two of at least 1024, the plain number otherwise."""
    if value >= 1024 and value & (value - 1) == 0:
        return f"2^{value.bit_length() - 1}"
    return str(value)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def device_name(device: torch.device) -> str:
    """The CPU model (from /proc/cpuinfo) or the CUDA device name."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages: other work on the machine skews timings."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def _make_inputs(
    w: Workload, dtype: torch.dtype, device: torch.device, seed: int
) -> dict[str, Tensor]:
    """Positive partial denominators in [0.5, 1.5), and a fixed upstream gradient."""
    gen = torch.Generator().manual_seed(seed)
    if w.width is None:
        tensors = {
            "a": 0.5 + torch.rand(w.rows, w.d, generator=gen),
            "grad_out": torch.randn(w.rows, generator=gen),
        }
    else:
        # a_k = weight[k] * x + bias[k] with x, weight in [0, 1) and bias 0.5.
        tensors = {
            "x": torch.rand(w.rows, w.width, generator=gen),
            "weight": torch.rand(w.d, w.width, generator=gen),
            "bias": torch.full((w.d, w.width), 0.5),
            "grad_out": torch.randn(w.rows, w.width, generator=gen),
        }
    return {k: v.to(device=device, dtype=dtype) for k, v in tensors.items()}


def _forward_fn(
    w: Workload, impl: str, config: OpsBenchConfig
) -> Callable[[dict[str, Tensor]], Tensor]:
    kwargs = {"eps": config.eps, "grad": config.grad, "impl": impl}
    if w.width is None:
        return lambda t: continued_fraction(t["a"], **kwargs)
    return lambda t: univariate_ladder(t["x"], t["weight"], t["bias"], **kwargs)


def _make_call(
    w: Workload, inputs: dict[str, Tensor], impl: str, mode: str, config: OpsBenchConfig
) -> Callable[[], None]:
    """A no-argument callable running one forward (or forward+backward) of ``impl``."""
    forward = _forward_fn(w, impl, config)
    if mode == "fwd":

        def call() -> None:
            with torch.no_grad():
                forward(inputs)

        return call

    # Leaves that require grad, private to this call so impls do not share .grad.
    leaves = {k: v.detach().clone().requires_grad_() for k, v in inputs.items() if k != "grad_out"}
    grad_out = inputs["grad_out"]

    def call_backward() -> None:
        for leaf in leaves.values():
            leaf.grad = None
        forward(leaves).backward(grad_out)

    return call_backward


def _error_text(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return text.splitlines()[0][:300]


def bench_workload(
    w: Workload, config: OpsBenchConfig, device: torch.device, log: Callable[[str], None]
) -> list[Result]:
    """Warm up and time every (mode, impl) of one workload; see the module docstring.

    Compiled kernels are dropped first (``torch.compiler.reset``), so every workload
    compiles for its own shapes, as a model with fixed shapes would, its first-call time
    includes that compilation, and no kernel hits dynamo's recompile limit.
    """
    torch.compiler.reset()
    inputs = _make_inputs(w, DTYPES[config.dtype], device, config.seed)
    results: dict[tuple[str, str], Result] = {}
    calls: dict[str, Callable[[], None]] = {}
    outputs: dict[str, Tensor] = {}
    for mode in config.modes:
        for impl in config.impls:
            result = Result(w, mode, impl, resolve_impl(impl, w.units, device))
            results[mode, impl] = result
            call = _make_call(w, inputs, impl, mode, config)
            try:
                result.first_call_ms = time_once(call, device)
                for _ in range(config.warmup):
                    call()
                if mode == config.modes[0]:
                    with torch.no_grad():
                        outputs[impl] = _forward_fn(w, impl, config)(inputs).float()
            except Exception as error:  # e.g. an impl that needs another device
                result.error = _error_text(error)
                log(f"  {impl} {mode} failed: {result.error}")
                continue
            calls[f"{mode}/{impl}"] = call

    # On a shared machine: wait for a quiet spell, and time again if others woke up.
    deadline = time.monotonic() + config.wait_quiet
    while True:
        if config.wait_quiet > 0:
            wait_for_quiet(BUSY_THRESHOLD, max(deadline - time.monotonic(), 0.0))
        with BackgroundLoad() as background:
            samples = time_interleaved(calls, config.repeats, device)
        busy = background.fraction is not None and background.fraction > BUSY_THRESHOLD
        if not busy or time.monotonic() >= deadline:
            break
        log(f"  busy machine (others used {_percent(background.fraction)} of the CPU): again")
    for key, times in samples.items():
        mode, impl = key.split("/", 1)
        result = results[mode, impl]
        result.samples_ms = times
        result.summary = Summary.of(times)
        result.peak_memory_bytes = peak_memory_bytes(calls[key], device)
        result.page_faults = minor_page_faults(calls[key], device)
        result.background_load = background.fraction

    for (mode, impl), result in results.items():
        reference = results.get((mode, REFERENCE_IMPL))
        if result.summary and reference and reference.summary:
            result.speedup = reference.summary.median / result.summary.median
        if impl in outputs and REFERENCE_IMPL in outputs:
            diff = (outputs[impl] - outputs[REFERENCE_IMPL]).abs().max().item()
            result.max_abs_diff = diff
    return list(results.values())


def check_targets(
    results: Sequence[Result], targets: Sequence[Target] = TARGETS
) -> list[TargetCheck]:
    """Each target against the measured speedups (None where the workload was not run)."""
    checks = []
    for target in targets:
        speedup = background = None
        for r in results:
            w = r.workload
            if (w.op, w.rows, w.d, w.width, r.mode, r.impl) == (
                target.op,
                target.rows,
                target.d,
                None,
                target.mode,
                target.impl,
            ):
                speedup, background = r.speedup, r.background_load
        checks.append(TargetCheck(target, speedup, background))
    return checks


def run_benchmark(
    config: OpsBenchConfig, command: str = "", console: Console | None = None
) -> Report:
    """Time every workload of ``config``; progress goes to ``console``."""
    config.validate()
    console = console or Console()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    device = resolve_device(config.device)
    meta = {
        "date": dt.date.today().isoformat(),
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device.type,
        "device_name": device_name(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "load_average_start": _load_average(),
        "command": command,
        "config": asdict(config),
    }
    results: list[Result] = []
    workloads = config.workloads()
    for index, w in enumerate(workloads, 1):
        console.log(f"[{index}/{len(workloads)}] {w.op} {w.shape}")
        results += bench_workload(w, config, device, console.log)
    meta["load_average_end"] = _load_average()
    return Report(meta, results, check_targets(results))


# ---------------------------------------------------------------------------- reporting


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _speedup(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}x"


def _groups(report: Report) -> dict[tuple[Workload, str], dict[str, Result]]:
    """(workload, mode) -> impl -> result, in run order."""
    groups: dict[tuple[Workload, str], dict[str, Result]] = {}
    for r in report.results:
        groups.setdefault((r.workload, r.mode), {})[r.impl] = r
    return groups


def _summary_cell(r: Result | None) -> str:
    if r is None:
        return "-"
    if r.summary is None:
        return "failed"
    if r.impl == REFERENCE_IMPL:
        return _ms(r.summary.median)
    return f"{_ms(r.summary.median)} ({_speedup(r.speedup)})"


def summary_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    """The one-table view: a row per (workload, mode), median ms (speedup) per impl."""
    impls = list(report.meta["config"]["impls"])
    header = ["workload", "mode", *impls]
    if "auto" in impls:
        header.append("auto uses")
    header.append("other load")
    rows = []
    for (w, mode), by_impl in _groups(report).items():
        row = [w.label, mode, *(_summary_cell(by_impl.get(i)) for i in impls)]
        if "auto" in impls:
            row.append(by_impl["auto"].resolved if "auto" in by_impl else "-")
        row.append(_percent(next(iter(by_impl.values())).background_load))
        rows.append(row)
    return header, rows


def detail_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    """One row per (workload, mode, impl) with the spread and first-call time."""
    header = ["workload", "mode", "impl", "median ms", "IQR ms", "min-max ms"]
    header += ["first call ms", "speedup", "max abs diff", "page faults"]
    with_memory = any(r.peak_memory_bytes is not None for r in report.results)
    if with_memory:
        header.append("peak MiB")
    rows = []
    for r in report.results:
        s = r.summary
        impl = r.impl if r.resolved == r.impl else f"{r.impl} ({r.resolved})"
        row = [r.workload.label, r.mode, impl]
        if s is None:
            row += [f"failed: {r.error}", "", "", _ms(r.first_call_ms), "", "", ""]
        else:
            row += [
                _ms(s.median),
                f"{_ms(s.q1)}-{_ms(s.q3)}",
                f"{_ms(s.min)}-{_ms(s.max)}",
                _ms(r.first_call_ms),
                _speedup(r.speedup),
                "-" if r.max_abs_diff is None else f"{r.max_abs_diff:.1e}",
                "-" if r.page_faults is None else str(r.page_faults),
            ]
        if with_memory:
            mib = r.peak_memory_bytes
            row.append("-" if mib is None else f"{mib / 2**20:.1f}")
        rows.append(row)
    return header, rows


def _target_line(check: TargetCheck) -> str:
    if check.met is None:
        return f"not measured: {check.target.describe()}"
    verdict = "MET" if check.met else "MISSED"
    line = f"{verdict}: {check.target.describe()} (measured {check.speedup:.1f}x)"
    if check.background_load is not None and check.background_load > BUSY_THRESHOLD:
        line += f", unreliable: other processes used {_percent(check.background_load)} of the CPU"
    return line


def busy_warning(report: Report) -> str | None:
    """A warning when other processes used the CPU while workloads were being timed."""
    loads = {r.workload: r.background_load for r in report.results}
    busy = [w.label for w, load in loads.items() if load is not None and load > BUSY_THRESHOLD]
    if not busy:
        return None
    return (
        f"{len(busy)} of {len(loads)} workloads were timed while other processes used more "
        f"than {_percent(BUSY_THRESHOLD)} of the CPU ({', '.join(busy)}): their timings and "
        "ratios are unreliable; rerun them on a quiet machine."
    )


def print_report(report: Report, console: Console) -> None:
    """The summary table and the target verdicts, on the console."""
    header, rows = summary_rows(report)
    meta = report.meta
    table = Table(
        title=f"cofr bench ops: median ms (speedup vs literal), {meta['device_name']}, "
        f"{meta['threads']} threads, {meta['config']['dtype']}, "
        f"{meta['config']['repeats']} repeats",
    )
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i < 2 else "right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for check in report.targets:
        style = {True: "green", False: "red", None: "yellow"}[check.met]
        console.print(f"[{style}]{_target_line(check)}[/{style}]")
    if warning := busy_warning(report):
        console.print(f"[yellow]warning: {warning}[/yellow]")


def _markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def to_markdown(report: Report) -> str:
    meta, config = report.meta, report.meta["config"]
    summary = _markdown_table(*summary_rows(report))
    details = _markdown_table(*detail_rows(report))
    targets = "\n".join(f"- {_target_line(c)}" for c in report.targets)
    warning = f"\n**Warning:** {text}\n" if (text := busy_warning(report)) else ""
    return f"""# Ops benchmark: {meta["device"]} ({meta["date"]})

- date: {meta["timestamp"]}
- device: {meta["device_name"]} ({meta["device"]})
- torch {meta["torch"]}, Python {meta["python"]}, {meta["threads"]} threads
- dtype {config["dtype"]}, grad="{config["grad"]}", eps {config["eps"]}
- repeats {config["repeats"]} (interleaved across impls), warm-up {config["warmup"]} after the first call
- load average (1, 5, 15 min): {meta["load_average_start"]} at start, {meta["load_average_end"]} at end
- command: `{meta["command"]}`

Median wall-clock ms per call; in brackets the speedup over `literal` (literal median /
impl median, same workload and mode). `fwd` runs under `torch.no_grad()`; `fwd+bwd` adds
`backward` of a fixed random upstream gradient. `cf N d=D` is `continued_fraction` on
a (N, D); `ladder RxN d=D` is `univariate_ladder` on x (R, N) with weight and bias (D, N).
"other load" is the share of the machine's CPU that other processes used while that
workload was timed (from /proc/stat); above {_percent(BUSY_THRESHOLD)} its numbers are unreliable.

{summary}
{warning}
## Targets

{targets}

## Details

"first call" is the first call of each (impl, mode) on that workload: `torch.compile`
compiles there (`auto` reuses `compiled`'s kernels when it picks them, and kernels
compiled for one workload are dropped before the next). "max abs diff" compares the
forward output with `literal`'s. "page faults" counts the minor page faults of one more
call after timing (getrusage): on CPU, tensors of 32 MiB and more come fresh from the OS
on every call and fault on first touch, which can cost more than the arithmetic.

{details}
"""


def write_report(report: Report, out_dir: Path, suffix: str = "") -> tuple[Path, Path]:
    """Write ``ops-<device>-<date><suffix>.md`` and ``.json`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"ops-{report.meta['device']}-{report.meta['date']}{suffix}"
    md_path, json_path = out_dir / f"{stem}.md", out_dir / f"{stem}.json"
    md_path.write_text(to_markdown(report))
    json_path.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return md_path, json_path


# ---------------------------------------------------------------------------------- CLI


def parse_int(text: str) -> int:
    """An integer written as 65536, 2^16, 2**16 or 1<<16."""
    text = text.strip()
    if match := re.fullmatch(r"(\d+)\s*(?:\^|\*\*)\s*(\d+)", text):
        return int(match[1]) ** int(match[2])
    if match := re.fullmatch(r"(\d+)\s*<<\s*(\d+)", text):
        return int(match[1]) << int(match[2])
    return int(text)


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(parse_int(v) for v in text.split(",") if v.strip())
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers: {error}") from None


def _pair_list(text: str) -> tuple[tuple[int, int], ...]:
    pairs = []
    for item in filter(None, (v.strip() for v in text.split(","))):
        parts = item.lower().split("x")
        if len(parts) != 2:
            raise argparse.ArgumentTypeError(f"expected ROWSxN pairs, got {item!r}")
        pairs.append((parse_int(parts[0]), parse_int(parts[1])))
    return tuple(pairs)


def _name_list(text: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in text.split(",") if v.strip())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``cofr bench ops``; unset options take OpsBenchConfig's (or --quick's)."""
    d = OpsBenchConfig()
    parser.add_argument(
        "--sizes",
        type=_int_list,
        help=f"continued_fraction rows N, e.g. 2^16,2^20 (default: {','.join(_pow2(v) for v in d.sizes)})",
    )
    parser.add_argument(
        "--depths",
        type=_int_list,
        help=f"continued_fraction depths d (default: {','.join(map(str, d.depths))})",
    )
    parser.add_argument(
        "--ladder-sizes",
        type=_pair_list,
        help=f"univariate_ladder ROWSxN shapes, '' for none (default: {','.join(f'{r}x{n}' for r, n in d.ladder_sizes)})",
    )
    parser.add_argument(
        "--ladder-depths",
        type=_int_list,
        help=f"univariate_ladder depths d (default: {','.join(map(str, d.ladder_depths))})",
    )
    parser.add_argument(
        "--impls",
        type=_name_list,
        help=f"implementations, from {', '.join(IMPLS)} (default: {','.join(d.impls)})",
    )
    parser.add_argument("--modes", type=_name_list, help=f"from {', '.join(MODES)} (default: both)")
    parser.add_argument(
        "--repeats",
        type=int,
        help=f"timed calls per (impl, mode), interleaved (default: {d.repeats})",
    )
    parser.add_argument(
        "--warmup", type=int, help=f"untimed calls after the first one (default: {d.warmup})"
    )
    parser.add_argument("--dtype", choices=tuple(DTYPES), help=f"input dtype (default: {d.dtype})")
    parser.add_argument(
        "--device", help="cpu, cuda, cuda:N or auto (default: auto = cuda if available)"
    )
    parser.add_argument(
        "--grad",
        choices=("paper", "exact"),
        help=f"gradient mode of the continuant impls (default: {d.grad})",
    )
    parser.add_argument(
        "--threads", type=int, help="torch.set_num_threads before timing (default: torch's)"
    )
    parser.add_argument("--seed", type=int, help=f"input seed (default: {d.seed})")
    parser.add_argument(
        "--wait-quiet",
        type=float,
        metavar="SECONDS",
        help="on a shared machine: per workload, wait up to SECONDS for other processes to "
        f"use under {100 * BUSY_THRESHOLD:.0f}%% of the CPU, and time it again if they got "
        "busy meanwhile (default: 0, time at once)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes and 3 repeats (tests, CI); results are saved with a -quick suffix",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("docs/benchmarks"),
        help="directory for ops-<device>-<date>.md/.json (default: docs/benchmarks)",
    )
    parser.add_argument(
        "--no-save", action="store_true", help="print the table only, write no files"
    )
    parser.add_argument(
        "--fail-on-miss",
        action="store_true",
        help="exit with status 1 if a measured target is missed",
    )


def config_from_args(args: argparse.Namespace) -> OpsBenchConfig:
    config = replace(OpsBenchConfig(), **QUICK) if args.quick else OpsBenchConfig()
    names = ("sizes", "depths", "ladder_sizes", "ladder_depths", "impls", "modes", "repeats")
    names += ("warmup", "dtype", "device", "grad", "threads", "seed", "wait_quiet")
    overrides = {n: getattr(args, n) for n in names if getattr(args, n) is not None}
    config = replace(config, **overrides)
    config.validate()
    return config


def run(args: argparse.Namespace) -> int:
    """Entry point of ``cofr bench ops`` (args from :func:`add_arguments`)."""
    console = Console(log_path=False)
    if not console.is_terminal:  # a log file: do not squeeze the table into 80 columns
        console.width = max(console.width, 140)
    try:
        config = config_from_args(args)
    except ValueError as error:
        console.print(f"[red]error:[/red] {error}")
        return 2
    command = getattr(args, "command_line", None) or "cofr " + " ".join(sys.argv[1:])
    report = run_benchmark(config, command=command, console=console)
    print_report(report, console)
    if not args.no_save:
        paths = write_report(report, args.out, "-quick" if args.quick else "")
        console.print("wrote " + ", ".join(str(p) for p in paths))
    missed = any(c.met is False for c in report.targets)
    if args.fail_on_miss and missed:
        return 1
    return 0
