"""Measuring: the device, its copy bandwidth, and every (mode, impl) of each workload.

The first call of each (impl, mode) is timed on its own ("first call": ``torch.compile``
compiles there), followed by untimed warm-up calls; then every (impl, mode) of a workload
is timed ``repeats`` times, interleaved round by round (:mod:`cofrgenet.bench.timing`),
each sample the mean of ``calls_per_sample`` calls between two synchronizations (10 on
CUDA: the first H200 run timed one call a sample, and at the issue's sizes a ~10 us
kernel read 0.23 ms, mostly the synchronization).
Workloads run one op at a time in turn (:func:`run_order`), each reported as soon as it
is measured (a partial report), within the time budget.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

import torch
from rich.console import Console
from torch import Tensor

from cofrgenet.bench.machine import device_name
from cofrgenet.bench.ops.config import (
    BUSY_THRESHOLD,
    CUDA_ONLY_IMPLS,
    DTYPES,
    REFERENCE_IMPL,
    OpsBenchConfig,
)
from cofrgenet.bench.ops.formatting import percent
from cofrgenet.bench.ops.results import Report, Result
from cofrgenet.bench.ops.targets import check_targets, targets_for
from cofrgenet.bench.ops.workloads import (
    CFFN_OPS,
    MATMULS,
    Workload,
    forward_fn,
    make_call,
    make_inputs,
    make_layer,
    min_bytes,
)
from cofrgenet.bench.timing import (
    BackgroundLoad,
    Summary,
    is_busy,
    minor_page_faults,
    peak_memory_bytes,
    time_interleaved,
    time_once,
    wait_for_quiet,
)
from cofrgenet.errors import ConfigError
from cofrgenet.ops import resolve_impl
from cofrgenet.ops.continuant import compile_available


def resolve_device(name: str) -> torch.device:
    """``auto``: cuda if available, else cpu; any other name as torch reads it. A device
    torch cannot use here is a :class:`~cofrgenet.errors.ConfigError`, as in ``cofr eval``."""
    from cofrgenet.dataclass_options import device_problem, resolved_device

    name = resolved_device(name)
    problem = device_problem(name)
    if problem is not None:
        raise ConfigError(f"--device: {problem}")
    return torch.device(name)


def _load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages: other work on the machine skews timings."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def _error_text(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return text.splitlines()[0][:300]


def measure_copy_bandwidth(device: torch.device, repeats: int = 10) -> float:
    """GB/s of ``dst.copy_(src)`` (bytes read + written), median over ``repeats``.

    256 MiB on CUDA (well past the L2), 64 MiB on CPU.
    """
    numel = (256 if device.type == "cuda" else 64) * 2**20 // 4
    src = torch.ones(numel, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    times = [time_once(lambda: dst.copy_(src), device) for _ in range(repeats)]
    return 2 * numel * 4 / (Summary.of(times).median * 1e-3) / 1e9


def bench_workload(
    w: Workload,
    config: OpsBenchConfig,
    device: torch.device,
    log: Callable[[str], None],
    copy_gbps: float | None = None,
) -> list[Result]:
    """Warm up and time every (mode, impl) of one workload; see the module docstring.

    Compiled kernels are dropped first (``torch.compiler.reset``), so every workload
    compiles for its own shapes, as a model with fixed shapes would, its first-call time
    includes that compilation, and no kernel hits dynamo's recompile limit.
    """
    torch.compiler.reset()
    dtype = DTYPES[config.dtype]
    itemsize = torch.empty((), dtype=dtype).element_size()
    inputs = make_inputs(w, dtype, device, config.seed)
    layer = make_layer(w, dtype, device, config.seed) if w.op in CFFN_OPS else None
    results: dict[tuple[str, str], Result] = {}
    calls: dict[str, Callable[[], None]] = {}
    outputs: dict[str, Tensor] = {}
    for mode in config.modes:
        for impl in config.impls:
            resolved = resolve_impl(impl, w.units, device)
            result = Result(w, mode, impl, resolved, min_bytes=min_bytes(w, mode, itemsize))
            results[mode, impl] = result
            if resolved in CUDA_ONLY_IMPLS and device.type != "cuda":
                result.skipped = (
                    f"{resolved} runs only on CUDA (on {device.type}, Triton's interpreter "
                    "would run it: its timings mean nothing)"
                )
                continue
            call = make_call(w, inputs, impl, mode, config, layer)
            try:
                result.first_call_ms = time_once(call, device)
                for _ in range(config.warmup):
                    call()
                if mode == config.modes[0]:
                    with torch.no_grad():
                        outputs[impl] = forward_fn(w, impl, config, layer)(inputs).float()
                if resolved == "compiled" and not compile_available():
                    # continuant._run fell back to eager: its times are not compiled ones
                    raise RuntimeError("torch.compile failed; the continuant kernels ran eagerly")
            except Exception as error:  # e.g. an impl that needs another device
                result.error = _error_text(error)
                log(f"  {impl} {mode} failed: {result.error}")
                continue
            calls[f"{mode}/{impl}"] = call
        if layer is not None:  # the layer without its ladders, for the ladders' share
            call = make_call(w, inputs, MATMULS, mode, config, layer)
            call()
            calls[f"{mode}/{MATMULS}"] = call

    # On a shared machine: wait for a quiet spell, and time again if others woke up.
    deadline = time.monotonic() + config.wait_quiet
    while True:
        if config.wait_quiet > 0:
            wait_for_quiet(BUSY_THRESHOLD, max(deadline - time.monotonic(), 0.0))
        with BackgroundLoad() as background:
            samples = time_interleaved(calls, config.repeats, device, config.sample_calls(device))
        if not is_busy(background.fraction) or time.monotonic() >= deadline:
            break
        log(f"  busy machine (others used {percent(background.fraction)} of the CPU): again")
    matmuls: dict[str, float] = {}
    for key, times in samples.items():
        mode, impl = key.split("/", 1)
        if impl == MATMULS:
            matmuls[mode] = Summary.of(times).median
            continue
        result = results[mode, impl]
        result.samples_ms = times
        result.summary = Summary.of(times)
        result.peak_memory_bytes = peak_memory_bytes(calls[key], device)
        result.page_faults = minor_page_faults(calls[key], device)
        result.background_load = background.fraction
        if result.min_bytes is not None:
            result.gbps = result.min_bytes / (result.summary.median * 1e-3) / 1e9
            if copy_gbps:
                result.copy_fraction = result.gbps / copy_gbps

    for (mode, impl), result in results.items():
        reference = results.get((mode, REFERENCE_IMPL))
        if result.summary and reference and reference.summary:
            result.speedup = reference.summary.median / result.summary.median
        if impl in outputs and REFERENCE_IMPL in outputs:
            diff = (outputs[impl] - outputs[REFERENCE_IMPL]).abs().max().item()
            result.max_abs_diff = diff
        if result.summary and mode in matmuls:
            result.matmuls_ms = matmuls[mode]
            result.ladder_share = 1.0 - matmuls[mode] / result.summary.median
    return list(results.values())


def run_order(workloads: Sequence[Workload]) -> list[int]:
    """Positions in ``workloads`` one op at a time in turn (cf, ladder, ensemble, Cffn,
    cf, ...): a time budget or a wall-clock limit then cuts each op's last shapes, not
    whole ops, and the ops listed last (the ensemble, the Cffn layers) are measured too."""
    by_op: dict[str, list[int]] = {}
    for position, w in enumerate(workloads):
        by_op.setdefault(w.op, []).append(position)
    longest = max((len(group) for group in by_op.values()), default=0)
    return [group[i] for i in range(longest) for group in by_op.values() if i < len(group)]


def run_benchmark(
    config: OpsBenchConfig,
    command: str = "",
    console: Console | None = None,
    on_update: Callable[[Report], None] | None = None,
) -> Report:
    """Time every workload of ``config``; progress goes to ``console``.

    Workloads run in :func:`run_order`; the report lists them in ``config.workloads()``
    order. With ``config.time_budget``, no workload starts after the budget, nor one
    that would end after it if it took as long as the longest one so far (first calls
    compile: a workload can take tens of seconds). ``on_update`` gets the partial report
    after each workload (``meta["partial"]``, and the workloads still to run in
    ``meta["pending"]``).
    """
    config.validate()
    console = console or Console()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    device = resolve_device(config.device)
    copy_gbps = measure_copy_bandwidth(device)
    started = dt.datetime.now(dt.timezone.utc)  # UTC dates, as the other reports' names
    meta = {
        "date": started.date().isoformat(),
        "timestamp": started.isoformat(timespec="seconds"),
        "device": device.type,
        "device_name": device_name(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "copy_bandwidth_gbps": copy_gbps,
        "calls_per_sample": config.sample_calls(device),
        "load_average_start": _load_average(),
        "command": command,
        "config": asdict(config),
    }
    workloads = config.workloads()
    targets = targets_for(device, config.dtype, config.grad)
    measured: dict[int, list[Result]] = {}

    def report(meta: dict[str, Any]) -> Report:
        results = [r for position in sorted(measured) for r in measured[position]]
        return Report(meta, results, check_targets(results, targets, config))

    def labels(positions: Sequence[int]) -> list[str]:
        return [workloads[p].label for p in sorted(positions)]

    order = run_order(workloads)
    start = time.monotonic()
    longest = 0.0
    meta["not_run"] = []
    for index, position in enumerate(order, 1):
        w = workloads[position]
        if config.time_budget > 0 and time.monotonic() - start + longest > config.time_budget:
            meta["not_run"] = labels(order[index - 1 :])
            console.log(f"time budget spent: {len(meta['not_run'])} workloads not run")
            break
        console.log(f"[{index}/{len(order)}] {w.op} {w.shape}")
        began = time.monotonic()
        measured[position] = bench_workload(w, config, device, console.log, copy_gbps)
        longest = max(longest, time.monotonic() - began)
        if on_update is not None and index < len(order):
            now = {"load_average_end": _load_average(), "partial": True}
            on_update(report({**meta, **now, "pending": labels(order[index:])}))
    meta["load_average_end"] = _load_average()
    return report(meta)
