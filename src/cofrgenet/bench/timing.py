"""Small timing helpers: wall-clock per call, interleaved repeats, robust summaries.

Every timed call is bracketed by a device synchronisation, so CUDA times cover the
kernels and not just their launch. On a shared or throttling machine the speed drifts
during a run; :func:`time_interleaved` therefore runs one call of every candidate per
round (in a varying order) instead of timing each candidate in one block, so drift
hits all of them alike and their ratios stay fair.
"""

from __future__ import annotations

import gc
import os
import resource
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TypeVar

import torch

T = TypeVar("T")


def synchronize(device: torch.device) -> None:
    """Wait for queued work on ``device`` (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_once(fn: Callable[[], object], device: torch.device, calls: int = 1) -> float:
    """Wall-clock milliseconds a call of ``fn``: ``calls`` calls back to back, synchronised
    on both sides, divided by ``calls``. Several calls share one synchronisation, which
    on a GPU can cost as much as a small kernel (a training step does not synchronise
    between its ops)."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) * 1e3 / calls


@dataclass(frozen=True)
class Summary:
    """Statistics of repeated timings, in milliseconds."""

    median: float
    q1: float
    q3: float
    min: float
    max: float
    repeats: int

    @classmethod
    def of(cls, samples: list[float]) -> Summary:
        """Median, quartiles (inclusive method) and range of ``samples`` (at least one)."""
        if not samples:
            raise ValueError("need at least one timing sample")
        if len(samples) == 1:
            q1 = q3 = samples[0]
        else:
            q1, _, q3 = statistics.quantiles(samples, n=4, method="inclusive")
        return cls(
            median=statistics.median(samples),
            q1=q1,
            q3=q3,
            min=min(samples),
            max=max(samples),
            repeats=len(samples),
        )

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def round_order(names: Sequence[T], round_index: int) -> list[T]:
    """The order of round ``round_index`` of interleaved timings: rotated by one each
    round, backwards every other cycle of rotations, so that no candidate always runs
    first or right after a given other one (with three, six rounds run all six orders)."""
    cycle, shift = divmod(round_index, len(names) or 1)
    order = [*names[shift:], *names[:shift]]
    return order[::-1] if cycle % 2 else order


def time_interleaved(
    fns: Mapping[str, Callable[[], object]], repeats: int, device: torch.device, calls: int = 1
) -> dict[str, list[float]]:
    """Time every function ``repeats`` times, one sample of each per round (a sample:
    :func:`time_once` of ``calls`` calls).

    The order of each round is :func:`round_order`'s. As in ``timeit``,
    garbage is collected once before and the collector is off while timing: a collection
    between rounds made the call after it up to 3x slower, and with two candidates that
    call was the first-listed one's in most rounds.

    Returns:
        name -> list of ``repeats`` timings in milliseconds, in round order.
    """
    names = list(fns)
    samples: dict[str, list[float]] = {name: [] for name in names}
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for round_index in range(repeats):
            for name in round_order(names, round_index):
                samples[name].append(time_once(fns[name], device, calls))
    finally:
        if collecting:
            gc.enable()
    return samples


def peak_memory_bytes(fn: Callable[[], object], device: torch.device) -> int | None:
    """Peak extra device memory allocated during one call of ``fn``.

    Measured with the CUDA caching allocator's statistics; returns None on devices where
    this helper cannot measure it (CPU), rather than a guess.
    """
    if device.type != "cuda":
        return None
    synchronize(device)
    gc.collect()
    torch.cuda.reset_peak_memory_stats(device)
    baseline = torch.cuda.memory_allocated(device)
    fn()
    synchronize(device)
    return torch.cuda.max_memory_allocated(device) - baseline


def minor_page_faults(fn: Callable[[], object], device: torch.device) -> int:
    """Minor page faults of this process during one call of ``fn`` (getrusage).

    On CPU, fresh memory from the OS costs a fault per 4 KiB page on first touch; glibc
    hands blocks of 32 MiB and more straight back to the OS on free, so large tensors
    can fault on every call and the faults, not the arithmetic, set the time.
    """
    synchronize(device)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    fn()
    synchronize(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def _cpu_jiffies() -> tuple[int, int] | None:
    """(busy, total) clock ticks of all CPUs since boot, from /proc/stat (Linux only)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal (guest time is inside user).
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])
    return total - idle, total


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


#: Above this share of the machine's CPU used by other processes, timings are flagged
#: (``cofr bench ops`` per workload, ``cofr bench train`` per variant and mode).
BUSY_THRESHOLD = 0.10


class BackgroundLoad:
    """CPU used by *other* processes (and the hypervisor's steal) while in the block.

    ``fraction`` is that CPU time over the machine's total CPU time in the block: 0 on
    an idle machine, 0.5 when one other process kept one of two cores busy. None where
    /proc/stat is unavailable. Resolution is a clock tick (10 ms) per core.
    """

    def __init__(self) -> None:
        self.fraction: float | None = None

    def __enter__(self) -> BackgroundLoad:
        self._start = _cpu_jiffies()
        self._own = _own_cpu_seconds()
        return self

    def __exit__(self, *exc_info: object) -> None:
        end, own = _cpu_jiffies(), _own_cpu_seconds()
        if self._start is None or end is None or end[1] <= self._start[1]:
            return
        hz = os.sysconf("SC_CLK_TCK")
        busy = (end[0] - self._start[0]) / hz
        total = (end[1] - self._start[1]) / hz
        self.fraction = min(max((busy - (own - self._own)) / total, 0.0), 1.0)


def wait_for_quiet(threshold: float, max_wait_s: float, window_s: float = 1.0) -> float | None:
    """Sleep until other processes use at most ``threshold`` of the CPU over ``window_s``.

    Gives up after ``max_wait_s`` seconds. Returns the last measured background load
    (None where it cannot be measured, in which case it returns at once).
    """
    deadline = time.monotonic() + max_wait_s
    while True:
        with BackgroundLoad() as background:
            time.sleep(window_s)
        load = background.fraction
        if load is None or load <= threshold or time.monotonic() >= deadline:
            return load


def is_busy(load: float | None) -> bool:
    """Whether other processes used more than :data:`BUSY_THRESHOLD` of the CPU (``load``:
    a :class:`BackgroundLoad` fraction; None, not measured, is not busy)."""
    return load is not None and load > BUSY_THRESHOLD


def unreliable_note(load: float | None) -> str:
    """What a target's verdict adds where other processes loaded the CPU while it was
    timed (``load``: :func:`is_busy`'s); nothing on a quiet machine."""
    if not is_busy(load):
        return ""
    return f", unreliable: other processes used {100 * load:.0f}% of the CPU"


def busy_warning(loads: Mapping[str, float | None], what: str) -> str | None:
    """One sentence naming the timings (label -> :class:`BackgroundLoad` fraction while
    it was timed) taken on a busy machine, out of all ``what`` ("workloads"); None when
    none was."""
    busy = [label for label, load in loads.items() if is_busy(load)]
    if not busy:
        return None
    return (
        f"{len(busy)} of {len(loads)} {what} were timed while other processes used more "
        f"than {100 * BUSY_THRESHOLD:.0f}% of the CPU ({', '.join(busy)}): their timings and "
        "ratios are unreliable; rerun them on a quiet machine."
    )
