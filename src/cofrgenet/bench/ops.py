"""`cofr bench ops`: time the continued-fraction ops, literal form against continuants.

Workloads are ``continued_fraction`` on (N, d) partial denominators,
``univariate_ladder`` on x (rows, n) with weight/bias (d, n), ``ladder_ensemble`` (the
elementwise Cffn's ladders: x (rows, p), weight/bias (d, L, p), mix (p, L)) and whole
``Cffn`` layers (scalar and elementwise ladders) on x (rows, p). Each implementation
(``literal``, ``continuant``, ``compiled``, ``triton``, ``auto``) runs in two modes:

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

Bandwidth: each op workload has a minimum number of bytes it must move (inputs read
once, outputs written once; see :func:`min_bytes`); GB/s = that / median time, and "% copy"
compares it with the device's copy bandwidth measured at the start of the run. Cffn
workloads also time the layer's matmuls alone (gate and U, no ladders) and report the
ladders' share of the layer's time. ``triton`` is skipped on CPU: Triton's interpreter
runs there, and its timings mean nothing.
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
from cofrgenet.nn import Cffn
from cofrgenet.ops import (
    IMPLS,
    continued_fraction,
    ladder_ensemble,
    resolve_impl,
    univariate_ladder,
)

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


#: Implementations that run only on CUDA devices (on CPU, Triton's interpreter would).
CUDA_ONLY_IMPLS = ("triton",)
CFFN_OPS = ("cffn_scalar", "cffn_elementwise")


def default_impls(device: torch.device | None = None) -> tuple[str, ...]:
    """Every implementation in ``cofrgenet.ops.IMPLS``: literal first, auto last.

    ``triton`` only where CUDA is (``device``, or this machine when None).
    """
    cuda = torch.cuda.is_available() if device is None else device.type == "cuda"
    middle = [
        i for i in IMPLS if i not in (REFERENCE_IMPL, "auto") and (cuda or i not in CUDA_ONLY_IMPLS)
    ]
    return (REFERENCE_IMPL, *middle, "auto")


@dataclass(frozen=True)
class Workload:
    """One op on one input shape.

    ``width`` is n (ladders) or p (ensembles, Cffn layers), None for continued_fraction;
    ``ladders`` is L for ensembles and Cffn layers.
    """

    op: str
    rows: int
    d: int
    width: int | None = None
    ladders: int | None = None

    @property
    def units(self) -> int:
        """Number of ladders evaluated (what ``resolve_impl`` looks at)."""
        if self.op == "cffn_scalar":
            return self.rows * (self.ladders or 1)
        return self.rows * (self.width or 1) * (self.ladders or 1)

    @property
    def shape(self) -> str:
        """The input shapes: a (N, d), x (rows, n) x weight (d, n), or x and (d, L, p)."""
        if self.width is None:
            return f"({_pow2(self.rows)}, {self.d})"
        if self.ladders is None:
            return f"({_pow2(self.rows)}, {self.width}) x ({self.d}, {self.width})"
        return f"({_pow2(self.rows)}, {self.width}) x L={self.ladders}, d={self.d}"

    @property
    def label(self) -> str:
        """Short name for tables: ``cf 2^20 d=8``, ``ladder 1024x1024 d=8``,
        ``ensemble 8192x768 L=3 d=5`` or ``Cffn-scalar 8192x768 L=3 d=5``."""
        if self.width is None:
            return f"cf {_pow2(self.rows)} d={self.d}"
        size = f"{_pow2(self.rows)}x{self.width}"
        if self.ladders is None:
            return f"ladder {size} d={self.d}"
        name = "ensemble" if self.op == "ladder_ensemble" else self.op.replace("cffn_", "Cffn-")
        return f"{name} {size} L={self.ladders} d={self.d}"


def min_bytes(w: Workload, mode: str, itemsize: int) -> int | None:
    """Bytes an op must move at least: each input read once, each output written once.

    fwd+bwd adds the backward's reads (the op's inputs and the upstream gradient) and
    writes (a gradient per input). None for Cffn layers (matmuls: not bandwidth-bound).
    """
    if w.op in CFFN_OPS:
        return None
    if w.op == "continued_fraction":
        data_in, data_out, params = w.rows * w.d, w.rows, 0
    else:
        data_in = data_out = w.rows * (w.width or 1)
        n_l = w.ladders or 1
        params = 2 * w.d * n_l * (w.width or 1) + (n_l * (w.width or 1) if w.ladders else 0)
    forward = data_in + data_out + params
    if mode == "fwd":
        return forward * itemsize
    # backward: read inputs, params and the upstream gradient; write grads of both.
    backward = data_in + params + data_out + data_in + params
    return (forward + backward) * itemsize


@dataclass(frozen=True)
class Target:
    """A target: ``impl`` at least ``min_speedup`` x faster than ``versus`` or, with
    ``min_copy_fraction``, at least that fraction of the measured copy bandwidth."""

    op: str
    rows: int
    d: int
    mode: str
    impl: str
    min_speedup: float
    versus: str = REFERENCE_IMPL
    width: int | None = None
    ladders: int | None = None
    min_copy_fraction: float | None = None
    #: The device type the target is for: targets of another device are not checked.
    device: str = "cpu"

    @property
    def workload(self) -> Workload:
        return Workload(self.op, self.rows, self.d, self.width, self.ladders)

    def describe(self) -> str:
        w = self.workload
        where = (
            f"{self.op} {w.shape}" if self.width else f"{self.op} ({_pow2(self.rows)}, d={self.d})"
        )
        if self.min_copy_fraction is not None:
            return f"{self.impl} >= {_percent(self.min_copy_fraction)} of copy bandwidth, {where} {self.mode}"
        return f"{self.impl} >= {self.min_speedup:g}x {self.versus}, {where} {self.mode}"


#: The issue's targets for this CPU (fwd+bwd on (2^20, d) float32, after warm-up).
TARGETS = (
    Target("continued_fraction", 1 << 20, 5, "fwd+bwd", "auto", 5.0),
    Target("continued_fraction", 1 << 20, 8, "fwd+bwd", "auto", 8.0),
)

#: Sizes of the GPU run (scripts/gpu_check.sh) and the issue's targets there: triton
#: fwd+bwd >= 10x literal and >= 2x compiled, and >= 70% of the copy bandwidth for the
#: elementwise ops (univariate ladders and the Cffn ensemble).
GPU_CF_ROWS = 1 << 20
GPU_LADDER = (8192, 2304)  # 8 x 1024 tokens, L p ladders of a p = 768, L = 3 Cffn
GPU_ENSEMBLE = (8192, 768)
GPU_TARGETS = (
    *(
        Target("continued_fraction", GPU_CF_ROWS, d, "fwd+bwd", "triton", s, v, device="cuda")
        for d in (3, 5, 8)
        for v, s in ((REFERENCE_IMPL, 10.0), ("compiled", 2.0))
    ),
    *(
        Target("univariate_ladder", GPU_LADDER[0], d, "fwd+bwd", "triton", s, v, GPU_LADDER[1], device="cuda")
        for d in (3, 5, 8)
        for v, s in ((REFERENCE_IMPL, 10.0), ("compiled", 2.0))
    ),
    *(
        Target("ladder_ensemble", GPU_ENSEMBLE[0], 5, "fwd+bwd", "triton", s, v, GPU_ENSEMBLE[1], 3, device="cuda")
        for v, s in ((REFERENCE_IMPL, 10.0), ("compiled", 2.0))
    ),
    *(
        Target("univariate_ladder", GPU_LADDER[0], d, mode, "triton", 0.0, width=GPU_LADDER[1], min_copy_fraction=0.7, device="cuda")
        for d in (3, 5, 8)
        for mode in MODES
    ),
    *(
        Target("ladder_ensemble", GPU_ENSEMBLE[0], 5, mode, "triton", 0.0, width=GPU_ENSEMBLE[1], ladders=3, min_copy_fraction=0.7, device="cuda")
        for mode in MODES
    ),
)  # fmt: skip


@dataclass(frozen=True)
class OpsBenchConfig:
    """What to time. Sizes are rows N (continued_fraction) or (rows, n) pairs (ladders)."""

    sizes: tuple[int, ...] = (1 << 16, 1 << 20)
    depths: tuple[int, ...] = (1, 3, 5, 8)
    ladder_sizes: tuple[tuple[int, int], ...] = ((256, 256), (1024, 1024))
    ladder_depths: tuple[int, ...] = (5, 8)
    #: ladder_ensemble (rows, p) shapes, with L ladders of each depth in ensemble_depths.
    ensemble_sizes: tuple[tuple[int, int], ...] = ((1024, 768),)
    ensemble_ladders: int = 3
    ensemble_depths: tuple[int, ...] = (5,)
    #: Whole Cffn layers (rows, p), L = ensemble_ladders, d = each of ensemble_depths.
    cffn_sizes: tuple[tuple[int, int], ...] = ((1024, 768),)
    cffn_kinds: tuple[str, ...] = ("scalar", "elementwise")
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
    #: Seconds after which no new workload is started (0: none); the rest are listed.
    time_budget: float = 0.0

    def workloads(self) -> list[Workload]:
        cf = [Workload("continued_fraction", n, d) for n in self.sizes for d in self.depths]
        ladders = [
            Workload("univariate_ladder", rows, d, width)
            for rows, width in self.ladder_sizes
            for d in self.ladder_depths
        ]
        n_l = self.ensemble_ladders
        ensembles = [
            Workload("ladder_ensemble", rows, d, width, n_l)
            for rows, width in self.ensemble_sizes
            for d in self.ensemble_depths
        ]
        layers = [
            Workload(f"cffn_{kind}", rows, d, width, n_l)
            for rows, width in self.cffn_sizes
            for kind in self.cffn_kinds
            for d in self.ensemble_depths
        ]
        return cf + ladders + ensembles + layers

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
        sizes = [*self.sizes, *self.depths, *self.ladder_depths, *self.ensemble_depths]
        pairs = (*self.ladder_sizes, *self.ensemble_sizes, *self.cffn_sizes)
        sizes += [v for pair in pairs for v in pair] + [self.ensemble_ladders]
        if any(v < 1 for v in sizes):
            raise ValueError("sizes and depths must be positive")
        bad_kinds = [k for k in self.cffn_kinds if k not in ("scalar", "elementwise")]
        if bad_kinds:
            raise ValueError(f"unknown Cffn kinds {bad_kinds}; choose from scalar, elementwise")


#: Tiny sizes for tests and CI: seconds, no compilation unless asked for.
QUICK = {
    "sizes": (1 << 10,),
    "depths": (1, 3),
    "ladder_sizes": ((16, 32),),
    "ladder_depths": (3,),
    "ensemble_sizes": ((16, 32),),
    "ensemble_ladders": 2,
    "ensemble_depths": (3,),
    "cffn_sizes": ((16, 32),),
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
    #: Why the impl was not run (e.g. triton on CPU); not a failure.
    skipped: str | None = None
    min_bytes: int | None = None
    gbps: float | None = None
    copy_fraction: float | None = None
    #: Cffn workloads: median ms of the layer's matmuls alone, and the ladders' share.
    matmuls_ms: float | None = None
    ladder_share: float | None = None

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
            skipped=self.skipped,
            min_bytes=self.min_bytes,
            gbps=self.gbps,
            copy_fraction=self.copy_fraction,
        )
        if self.matmuls_ms is not None:
            out.update(matmuls_only_median_ms=self.matmuls_ms, ladder_share=self.ladder_share)
        if self.peak_memory_bytes is not None:
            out["peak_memory_bytes"] = self.peak_memory_bytes
        return out


@dataclass
class TargetCheck:
    target: Target
    #: The measured speedup, or the fraction of copy bandwidth for bandwidth targets.
    speedup: float | None
    background_load: float | None = None

    @property
    def met(self) -> bool | None:
        """None when the target's workload was not measured (or failed)."""
        if self.speedup is None:
            return None
        threshold = self.target.min_copy_fraction
        return self.speedup >= (self.target.min_speedup if threshold is None else threshold)

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
    """Inputs that keep every ladder off poles, and a fixed upstream gradient.

    Partial denominators in [0.5, 1.5) for continued_fraction; for ladders and ensembles
    a_k = weight * x + 0.5 with x, weight in [0, 1); Cffn layers get 0.3 N(0, 1) inputs.
    """
    gen = torch.Generator().manual_seed(seed)
    if w.op == "continued_fraction":
        tensors = {
            "a": 0.5 + torch.rand(w.rows, w.d, generator=gen),
            "grad_out": torch.randn(w.rows, generator=gen),
        }
    elif w.op == "univariate_ladder":
        tensors = {
            "x": torch.rand(w.rows, w.width, generator=gen),
            "weight": torch.rand(w.d, w.width, generator=gen),
            "bias": torch.full((w.d, w.width), 0.5),
            "grad_out": torch.randn(w.rows, w.width, generator=gen),
        }
    elif w.op == "ladder_ensemble":
        tensors = {
            "x": torch.rand(w.rows, w.width, generator=gen),
            "weight": torch.rand(w.d, w.ladders, w.width, generator=gen),
            "bias": torch.full((w.d, w.ladders, w.width), 0.5),
            "mix": torch.randn(w.width, w.ladders, generator=gen),
            "grad_out": torch.randn(w.rows, w.width, generator=gen),
        }
    else:  # a Cffn layer
        tensors = {
            "x": 0.3 * torch.randn(w.rows, w.width, generator=gen),
            "grad_out": torch.randn(w.rows, w.width, generator=gen),
        }
    return {k: v.to(device=device, dtype=dtype) for k, v in tensors.items()}


def _make_layer(w: Workload, dtype: torch.dtype, device: torch.device, seed: int) -> Cffn:
    """The Cffn of a layer workload, with its default (pole-avoiding) initialisation."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        kind = w.op.removeprefix("cffn_")
        layer = Cffn(w.width, w.ladders, w.d, ladder=kind)
    return layer.to(device=device, dtype=dtype)


#: The pseudo-impl timing a Cffn layer's matmuls alone (gate and U, no ladders).
MATMULS = "matmuls"


def _forward_fn(
    w: Workload, impl: str, config: OpsBenchConfig, layer: Cffn | None = None
) -> Callable[[dict[str, Tensor]], Tensor]:
    kwargs = {"eps": config.eps, "grad": config.grad, "impl": impl}
    if w.op == "continued_fraction":
        return lambda t: continued_fraction(t["a"], **kwargs)
    if w.op == "univariate_ladder":
        return lambda t: univariate_ladder(t["x"], t["weight"], t["bias"], **kwargs)
    if w.op == "ladder_ensemble":
        return lambda t: ladder_ensemble(t["x"], t["weight"], t["mix"], t["bias"], **kwargs)
    assert layer is not None
    if impl == MATMULS:
        return lambda t: layer.linear(torch.sigmoid(layer.gate(t["x"])) * t["x"])

    def run_layer(t: dict[str, Tensor]) -> Tensor:
        layer.impl = impl
        return layer(t["x"])

    return run_layer


def _make_call(
    w: Workload,
    inputs: dict[str, Tensor],
    impl: str,
    mode: str,
    config: OpsBenchConfig,
    layer: Cffn | None = None,
) -> Callable[[], None]:
    """A no-argument callable running one forward (or forward+backward) of ``impl``."""
    forward = _forward_fn(w, impl, config, layer)
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
        if layer is not None:
            layer.zero_grad(set_to_none=True)
        forward(leaves).backward(grad_out)

    return call_backward


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
    inputs = _make_inputs(w, dtype, device, config.seed)
    layer = _make_layer(w, dtype, device, config.seed) if w.op in CFFN_OPS else None
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
            call = _make_call(w, inputs, impl, mode, config, layer)
            try:
                result.first_call_ms = time_once(call, device)
                for _ in range(config.warmup):
                    call()
                if mode == config.modes[0]:
                    with torch.no_grad():
                        outputs[impl] = _forward_fn(w, impl, config, layer)(inputs).float()
            except Exception as error:  # e.g. an impl that needs another device
                result.error = _error_text(error)
                log(f"  {impl} {mode} failed: {result.error}")
                continue
            calls[f"{mode}/{impl}"] = call
        if layer is not None:  # the layer without its ladders, for the ladders' share
            call = _make_call(w, inputs, MATMULS, mode, config, layer)
            call()
            calls[f"{mode}/{MATMULS}"] = call

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


def check_targets(
    results: Sequence[Result], targets: Sequence[Target] = TARGETS
) -> list[TargetCheck]:
    """Each target against the measurements (None where its workload was not run).

    Speedups over literal are the results' own; over another impl, the ratio of the two
    medians; bandwidth targets read the fraction of the copy bandwidth.
    """
    checks = []
    for target in targets:
        by_impl = {
            r.impl: r
            for r in results
            if r.workload == target.workload and r.mode == target.mode and r.summary
        }
        value = background = None
        if (r := by_impl.get(target.impl)) is not None:
            background = r.background_load
            if target.min_copy_fraction is not None:
                value = r.copy_fraction
            elif target.versus == REFERENCE_IMPL:
                value = r.speedup
            elif (other := by_impl.get(target.versus)) is not None:
                value = other.summary.median / r.summary.median
        checks.append(TargetCheck(target, value, background))
    return checks


def targets_for(device: torch.device) -> tuple[Target, ...]:
    """The targets set for this device type (the CPU ones, or the GPU ones on CUDA)."""
    return tuple(t for t in (*TARGETS, *GPU_TARGETS) if t.device == device.type)


def run_benchmark(
    config: OpsBenchConfig, command: str = "", console: Console | None = None
) -> Report:
    """Time every workload of ``config``; progress goes to ``console``."""
    config.validate()
    console = console or Console()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    device = resolve_device(config.device)
    copy_gbps = measure_copy_bandwidth(device)
    meta = {
        "date": dt.date.today().isoformat(),
        "timestamp": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device.type,
        "device_name": device_name(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "copy_bandwidth_gbps": copy_gbps,
        "load_average_start": _load_average(),
        "command": command,
        "config": asdict(config),
    }
    results: list[Result] = []
    workloads = config.workloads()
    start = time.monotonic()
    meta["not_run"] = []
    for index, w in enumerate(workloads, 1):
        if config.time_budget > 0 and time.monotonic() - start > config.time_budget:
            meta["not_run"] = [v.label for v in workloads[index - 1 :]]
            console.log(f"time budget spent: {len(meta['not_run'])} workloads not run")
            break
        console.log(f"[{index}/{len(workloads)}] {w.op} {w.shape}")
        results += bench_workload(w, config, device, console.log, copy_gbps)
    meta["load_average_end"] = _load_average()
    return Report(meta, results, check_targets(results, targets_for(device)))


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
    if r.skipped is not None:
        return "skipped"
    if r.summary is None:
        return "failed"
    if r.impl == REFERENCE_IMPL:
        return _ms(r.summary.median)
    return f"{_ms(r.summary.median)} ({_speedup(r.speedup)})"


def _gbps(r: Result) -> str:
    if r.gbps is None:
        return "-"
    copy = "" if r.copy_fraction is None else f" ({_percent(r.copy_fraction)} copy)"
    return f"{r.gbps:.3g} GB/s{copy}"


def _fastest_cell(by_impl: dict[str, Result]) -> str:
    """The fastest measured impl, with its bandwidth (ops) or the ladders' share (Cffn)."""
    timed = [r for r in by_impl.values() if r.summary is not None and r.impl != "auto"]
    if not timed:
        return "-"
    best = min(timed, key=lambda r: r.summary.median)
    if best.ladder_share is not None:
        return f"{best.impl}: ladders {_percent(best.ladder_share)} of the layer"
    return f"{best.impl}: {_gbps(best)}"


def _ratio_cell(by_impl: dict[str, Result], impl: str, versus: str) -> str:
    a, b = by_impl.get(impl), by_impl.get(versus)
    if a is None or b is None or a.summary is None or b.summary is None:
        return "-"
    return _speedup(b.summary.median / a.summary.median)


def summary_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    """The one-table view: a row per (workload, mode), median ms (speedup) per impl.

    Then which impl "auto" ran, the fastest impl with its bandwidth (or, for Cffn layers,
    the ladders' share of the layer's time), triton's speedup over compiled, other load.
    """
    impls = list(report.meta["config"]["impls"])
    header = ["workload", "mode", *impls]
    if "auto" in impls:
        header.append("auto uses")
    header.append("fastest")
    with_ratio = "triton" in impls and "compiled" in impls
    if with_ratio:
        header.append("triton vs compiled")
    header.append("other load")
    rows = []
    for (w, mode), by_impl in _groups(report).items():
        row = [w.label, mode, *(_summary_cell(by_impl.get(i)) for i in impls)]
        if "auto" in impls:
            row.append(by_impl["auto"].resolved if "auto" in by_impl else "-")
        row.append(_fastest_cell(by_impl))
        if with_ratio:
            row.append(_ratio_cell(by_impl, "triton", "compiled"))
        row.append(_percent(next(iter(by_impl.values())).background_load))
        rows.append(row)
    return header, rows


def detail_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    """One row per (workload, mode, impl) with the spread and first-call time."""
    header = ["workload", "mode", "impl", "median ms", "IQR ms", "min-max ms"]
    header += ["first call ms", "speedup", "GB/s", "% copy", "ladders' share"]
    header += ["max abs diff", "page faults"]
    with_memory = any(r.peak_memory_bytes is not None for r in report.results)
    if with_memory:
        header.append("peak MiB")
    rows = []
    for r in report.results:
        s = r.summary
        impl = r.impl if r.resolved == r.impl else f"{r.impl} ({r.resolved})"
        row = [r.workload.label, r.mode, impl]
        if s is None:
            reason = f"skipped: {r.skipped}" if r.skipped else f"failed: {r.error}"
            row += [reason, "", "", _ms(r.first_call_ms), "", "", "", "", "", ""]
        else:
            row += [
                _ms(s.median),
                f"{_ms(s.q1)}-{_ms(s.q3)}",
                f"{_ms(s.min)}-{_ms(s.max)}",
                _ms(r.first_call_ms),
                _speedup(r.speedup),
                "-" if r.gbps is None else f"{r.gbps:.1f}",
                _percent(r.copy_fraction),
                _percent(r.ladder_share),
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
    if check.target.min_copy_fraction is not None:
        measured = _percent(check.speedup)
    else:
        measured = f"{check.speedup:.1f}x"
    line = f"{verdict}: {check.target.describe()} (measured {measured})"
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


def _copy(meta: dict[str, Any]) -> str:
    gbps = meta.get("copy_bandwidth_gbps")
    return "-" if gbps is None else f"{gbps:.3g} GB/s"


def to_markdown(report: Report) -> str:
    meta, config = report.meta, report.meta["config"]
    summary = _markdown_table(*summary_rows(report))
    details = _markdown_table(*detail_rows(report))
    targets = "\n".join(f"- {_target_line(c)}" for c in report.targets)
    warning = f"\n**Warning:** {text}\n" if (text := busy_warning(report)) else ""
    if meta.get("not_run"):
        warning += f"\nNot run (time budget spent): {', '.join(meta['not_run'])}.\n"
    return f"""# Ops benchmark: {meta["device"]} ({meta["date"]})

- date: {meta["timestamp"]}
- device: {meta["device_name"]} ({meta["device"]})
- torch {meta["torch"]}, Python {meta["python"]}, {meta["threads"]} threads
- copy bandwidth (`dst.copy_(src)`, bytes read + written): {_copy(meta)}
- dtype {config["dtype"]}, grad="{config["grad"]}", eps {config["eps"]}
- repeats {config["repeats"]} (interleaved across impls), warm-up {config["warmup"]} after the first call
- load average (1, 5, 15 min): {meta["load_average_start"]} at start, {meta["load_average_end"]} at end
- command: `{meta["command"]}`

Median wall-clock ms per call; in brackets the speedup over `literal` (literal median /
impl median, same workload and mode). `fwd` runs under `torch.no_grad()`; `fwd+bwd` adds
`backward` of a fixed random upstream gradient. `cf N d=D` is `continued_fraction` on
a (N, D); `ladder RxN d=D` is `univariate_ladder` on x (R, N) with weight and bias (D, N);
`ensemble RxP L=L d=D` is `ladder_ensemble` (the elementwise Cffn's ladders) on x (R, P)
with weight and bias (D, L, P) and mix (P, L); `Cffn-scalar` / `Cffn-elementwise` time a
whole `Cffn` layer (gate, U and ladders) on x (R, P). "fastest" names the fastest impl
(auto left out) with its bandwidth: the minimum bytes the op must move (inputs read and
outputs written once; fwd+bwd adds the backward's reads and gradient writes) over its
median time, and that as a share of the copy bandwidth above; for Cffn layers, the
ladders' share of the layer's time (1 - time of its matmuls alone / time of the layer).
"skipped": triton on a CPU, where only Triton's interpreter could run it.
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


def device_label(meta: dict[str, Any]) -> str:
    """``cpu``, or the CUDA device's name as a file-name slug (``nvidia-h200``)."""
    if meta["device"] == "cpu":
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "-", meta["device_name"].lower()).strip("-") or meta["device"]


def write_report(report: Report, out_dir: Path, suffix: str = "") -> tuple[Path, Path]:
    """Write ``ops-<device>-<date><suffix>.md`` and ``.json`` into ``out_dir``.

    <device> is ``cpu`` or the GPU's name (``ops-nvidia-h200-2026-12-01.md``).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"ops-{device_label(report.meta)}-{report.meta['date']}{suffix}"
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
        "--ensemble-sizes",
        type=_pair_list,
        help="ladder_ensemble ROWSxP shapes, '' for none (default: "
        f"{','.join(f'{r}x{n}' for r, n in d.ensemble_sizes)})",
    )
    parser.add_argument(
        "--ensemble-depths",
        type=_int_list,
        help=f"depths d of ensembles and Cffn layers (default: {','.join(map(str, d.ensemble_depths))})",
    )
    parser.add_argument(
        "--ensemble-ladders",
        type=int,
        help=f"ladders L of ensembles and Cffn layers (default: {d.ensemble_ladders})",
    )
    parser.add_argument(
        "--cffn-sizes",
        type=_pair_list,
        help="whole Cffn layers, ROWSxP shapes, '' for none (default: "
        f"{','.join(f'{r}x{n}' for r, n in d.cffn_sizes)})",
    )
    parser.add_argument(
        "--cffn-kinds",
        type=_name_list,
        help=f"Cffn ladder kinds (default: {','.join(d.cffn_kinds)})",
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
        default=Path("runs/bench"),
        help="directory for ops-<device>-<date>.md/.json (default: runs/bench; pass "
        "--out docs/benchmarks to record a result in the repository)",
    )
    parser.add_argument(
        "--no-save", action="store_true", help="print the table only, write no files"
    )
    parser.add_argument(
        "--suffix", default="", help="appended to the file names (after the date), e.g. -extra"
    )
    parser.add_argument(
        "--time-budget",
        type=float,
        metavar="SECONDS",
        help="start no new workload after SECONDS; the report lists those not run",
    )
    parser.add_argument(
        "--fail-on-miss",
        action="store_true",
        help="exit with status 1 if a measured target is missed",
    )


def config_from_args(args: argparse.Namespace) -> OpsBenchConfig:
    config = replace(OpsBenchConfig(), **QUICK) if args.quick else OpsBenchConfig()
    names = ("sizes", "depths", "ladder_sizes", "ladder_depths", "impls", "modes", "repeats")
    names += ("ensemble_sizes", "ensemble_depths", "ensemble_ladders", "cffn_sizes", "cffn_kinds")
    names += ("time_budget",)
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
        suffix = getattr(args, "suffix", "") + ("-quick" if args.quick else "")
        paths = write_report(report, args.out, suffix)
        console.print("wrote " + ", ".join(str(p) for p in paths))
    missed = any(c.met is False for c in report.targets)
    if args.fail_on_miss and missed:
        return 1
    return 0
