"""Model FLOPs utilisation: analytic FLOPs per token against a device's peak."""

from __future__ import annotations

import math
import os

import torch

from cofrgenet.errors import ConfigError

#: The environment variable that sets the peak FLOP/s of one device for ``perf/mfu``,
#: in place of the data sheet's (GPUs) or a matmul measured at the start (CPUs): MFUs of
#: runs in different processes then share a denominator, and a GPU missing from
#: :data:`PEAK_FLOPS` gets one.
PEAK_FLOPS_ENV = "COFR_PEAK_FLOPS"


def peak_flops_from_env() -> float | None:
    """``$COFR_PEAK_FLOPS`` as a number, None when unset or empty; ConfigError when it is
    not a positive number."""
    text = os.environ.get(PEAK_FLOPS_ENV, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(
            f"{PEAK_FLOPS_ENV}={text!r}: give one device's peak FLOP/s as a positive number "
            "(e.g. 9.89e14 for an H100 in bf16), or unset it"
        )
    return value


#: Dense peak FLOP/s by device name fragment and compute dtype (no sparsity). Sources:
#: vendor data sheets (SXM parts). Matched case-insensitively, first match wins.
PEAK_FLOPS: list[tuple[str, dict[str, float]]] = [
    ("h200", {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}),  # GH200's "h200" too
    ("h100", {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}),
    ("b200", {"bf16": 2250e12, "fp16": 2250e12, "fp32": 80e12}),
    ("a100", {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12}),
    ("l40s", {"bf16": 362e12, "fp16": 362e12, "fp32": 91.6e12}),
    ("a10g", {"bf16": 125e12, "fp16": 125e12, "fp32": 31.2e12}),
    ("v100", {"bf16": 0.0, "fp16": 125e12, "fp32": 15.7e12}),
    ("mi300x", {"bf16": 1307e12, "fp16": 1307e12, "fp32": 163e12}),
]


def precision_kind(precision: str | int | None) -> str:
    """Lightning precision flag (or a dtype's name: ``bfloat16``) -> "bf16" | "fp16" | "fp32"."""
    text = str(precision)
    if "bf16" in text or "bfloat16" in text:
        return "bf16"
    if "16" in text:
        return "fp16"
    return "fp32"


def measured_peak_flops(dtype: torch.dtype = torch.float32, again: bool = False) -> float:
    """Best FLOP/s of a few square CPU matmuls in ``dtype`` (~0.1 s, once per process
    and dtype): the peak a CPU run's MFU is measured against, since CPUs have no data
    sheet figure that holds for a shared, throttled or partly used machine.

    ``again``: measure anew and keep the better of the two. A peak measured while other
    processes held the cores is too low, which a step faster than it shows."""
    if again or dtype not in _MEASURED_PEAKS:
        _MEASURED_PEAKS[dtype] = max(_MEASURED_PEAKS.get(dtype, 0.0), matmul_peak_flops(dtype))
    return _MEASURED_PEAKS[dtype]


_MEASURED_PEAKS: dict[torch.dtype, float] = {}


def matmul_peak_flops(
    dtype: torch.dtype, device: torch.device | None = None, repeats: int = 5
) -> float:
    """Best FLOP/s of ``repeats`` square (n, n) @ (n, n) matmuls in ``dtype`` on ``device``
    (CPU by default): n = 1024 on a CPU, 8192 on a GPU (an H200 is still ramping up at
    4096). Each is timed between two device synchronisations; the first warms up."""
    import time

    device = device or torch.device("cpu")
    n = 8192 if device.type == "cuda" else 1024
    # Its own generator: drawing from the global one would shift a run's dropout masks
    # by whether this process had measured already (a resume measures again).
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, dtype=dtype, device=device, generator=generator)
    b = torch.randn(n, n, dtype=dtype, device=device, generator=generator)

    def synchronize() -> None:  # CUDA runs the matmul after the call returns
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    best = float("inf")
    for _ in range(repeats):
        synchronize()
        start = time.perf_counter()
        torch.mm(a, b)
        synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def device_peak_flops(
    device: torch.device, precision: str | int | None, again: bool = False
) -> float | None:
    """Peak dense FLOP/s of ``device`` for ``precision``: the data sheet's for known GPUs,
    a measured matmul peak on CPUs (:func:`measured_peak_flops`, ``again`` to measure
    anew), None for unknown GPUs."""
    if device.type == "cpu":
        dtype = torch.bfloat16 if precision_kind(precision) == "bf16" else torch.float32
        return measured_peak_flops(dtype, again)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device).lower()
    kind = precision_kind(precision)
    for fragment, table in PEAK_FLOPS:
        if fragment in name:
            return table.get(kind) or None
    return None


def mfu(
    flops_per_token: float, tokens_per_sec: float, peak_flops: float | None, world_size: int = 1
) -> float | None:
    """Achieved / peak FLOP/s; tokens_per_sec is the global rate over ``world_size`` devices."""
    if not peak_flops:
        return None
    return flops_per_token * tokens_per_sec / (peak_flops * world_size)


class RunPeak:
    """The peak a training run's MFU is measured against: ``$COFR_PEAK_FLOPS`` when set,
    else the device's (:func:`device_peak_flops`). A measured CPU peak is measured again
    (at most every ``recheck_steps`` steps) when a step's MFU comes out above 1; if it
    still does, :attr:`too_low` says so (the caller warns once)."""

    def __init__(self, device: torch.device, precision: str | int | None, recheck_steps: int = 50):
        self.device, self.precision, self.recheck_steps = device, precision, recheck_steps
        given = peak_flops_from_env()
        self.measured = given is None and device.type == "cpu"
        self.flops = given if given is not None else device_peak_flops(device, precision) or 0.0
        #: The step at which the peak was last measured again (None: not yet).
        self.checked_at: int | None = None
        self.too_low = False

    def mfu(
        self, flops_per_token: float, tokens_per_sec: float, world_size: int, step: int
    ) -> float | None:
        """:func:`mfu` of the step against this peak (None without one)."""
        value = mfu(flops_per_token, tokens_per_sec, self.flops, world_size)
        due = self.checked_at is None or step - self.checked_at >= self.recheck_steps
        if value is not None and value > 1 and self.measured and due:
            self.checked_at = step
            self.flops = device_peak_flops(self.device, self.precision, again=True) or 0.0
            value = mfu(flops_per_token, tokens_per_sec, self.flops, world_size)
            self.too_low = value is not None and value > 1
        return value
