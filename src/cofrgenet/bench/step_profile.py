"""Where a training step's time goes: ``torch.profiler`` over a few steps.

A step is *host-bound* when the device waits for the host to queue its kernels: the
kernels' own time is then well below the step's wall time. That is what a model of many
small operations meets on a fast GPU (the first H200 run, 2026-12-04: cofrgenet-f's
compiled step kept the GPU busy 46% of the time, gpt2's 88%), and what a tokens/s figure
alone cannot show. :func:`profile_steps` counts, per step:

* host dispatches: calls named ``namespace::name`` (``aten::``, ``cofrgenet::`` custom
  ops, autograd's nodes; nested ones included), the host work a step queues. Kernels
  that inductor launches itself (``triton_*``) are no dispatch: compare eager with
  eager and compiled with compiled, and the kernels column across modes;
* device kernels and their own time (CUDA; None on a CPU, where the host runs them);
* the operators that took the most host time (self time, children excluded) and the
  kernels that took the most device time.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from cofrgenet.bench.timing import synchronize


@dataclass
class StepProfile:
    """Per-step figures of ``steps`` profiled steps (see the module docstring)."""

    steps: int
    dispatches: float
    kernels: float | None = None
    kernel_ms: float | None = None
    #: (name, self host ms per step, calls per step), most host time first.
    host_top: list[tuple[str, float, float]] = field(default_factory=list)
    #: (kernel name, device ms per step, launches per step), most device time first.
    device_top: list[tuple[str, float, float]] = field(default_factory=list)


def _is_dispatch(name: str) -> bool:
    """An operator call (``namespace::op``), not a Python range or a runtime API call."""
    return "::" in name


def _is_wait(name: str) -> bool:
    """The host waiting for the device (the closing synchronize, or one a step makes): not
    work, so left out of the costliest operators (its time is the device's lead)."""
    return name.startswith("cuda") and "Synchronize" in name


def _top(totals: dict[str, list[float]], steps: int, count: int) -> list[tuple[str, float, float]]:
    ranked = sorted(totals.items(), key=lambda item: -item[1][0])[:count]
    return [(name, us / 1e3 / steps, calls / steps) for name, (us, calls) in ranked]


#: The lines kineto (torch.profiler's tracer) writes to file descriptor 2 at each start
#: and stop, e.g. "USDT:2026-12-05 20:28:40 13239:13239 SyncActivityProfilerHandler.cpp:52]
#: profiler_start". No setting turns them off (KINETO_LOG_LEVEL leaves them).
KINETO_LINE = re.compile(rb"^(USDT|STAGE):\d{4}-\d\d-\d\d [^\]]*\.cpp:\d+\] ")


@contextlib.contextmanager
def _without_kineto_lines() -> Iterator[None]:
    """Standard error (file descriptor 2) without :data:`KINETO_LINE`'s lines, which
    broke into the bench's report; every other line written meanwhile follows at the end."""
    fd = 2  # kineto's, whatever sys.stderr is
    try:
        os.fstat(fd)
    except OSError:  # closed: nothing to keep clean
        yield
        return
    if sys.stderr is not None:
        sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), fd)
        try:
            yield
        finally:
            if sys.stderr is not None:
                sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            caught.seek(0)
            lines = caught.read().splitlines(keepends=True)
            kept = b"".join(line for line in lines if not KINETO_LINE.match(line))
            if kept:
                os.write(fd, kept)


def profile_steps(
    step: Callable[[], object], steps: int, device: torch.device, top: int = 8
) -> StepProfile:
    """Run ``step`` ``steps`` times under ``torch.profiler``; the per-step figures."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    if steps < 1:
        raise ValueError(f"profile at least one step, got {steps}")
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    synchronize(device)
    with _without_kineto_lines(), profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        synchronize(device)
    host: dict[str, list[float]] = {}
    kernels: dict[str, list[float]] = {}
    dispatches = 0
    for event in prof.events():
        if event.device_type == DeviceType.CPU:
            dispatches += _is_dispatch(event.name)
            if _is_wait(event.name):
                continue
            total = host.setdefault(event.name, [0.0, 0])
            total[0] += event.self_cpu_time_total
            total[1] += 1
        elif event.device_type == DeviceType.CUDA and not getattr(
            event, "is_user_annotation", False
        ):
            # A kernel, copy or fill: its own duration. (A record_function range, such as
            # the optimizer step's, is also drawn on the device's timeline: not a kernel.)
            total = kernels.setdefault(event.name, [0.0, 0])
            total[0] += event.self_device_time_total
            total[1] += 1
    result = StepProfile(
        steps=steps, dispatches=dispatches / steps, host_top=_top(host, steps, top)
    )
    if cuda:
        result.kernels = sum(calls for _, calls in kernels.values()) / steps
        result.kernel_ms = sum(us for us, _ in kernels.values()) / 1e3 / steps
        result.device_top = _top(kernels, steps, top)
    return result
