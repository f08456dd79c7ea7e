"""Model FLOPs utilisation: analytic FLOPs per token against a device's peak."""

from __future__ import annotations

import torch

#: Dense peak FLOP/s by device name fragment and compute dtype (no sparsity). Sources:
#: vendor data sheets (SXM parts). Matched case-insensitively, first match wins.
PEAK_FLOPS: list[tuple[str, dict[str, float]]] = [
    ("h200", {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}),
    ("h100", {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}),
    ("gh200", {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12}),
    ("b200", {"bf16": 2250e12, "fp16": 2250e12, "fp32": 80e12}),
    ("a100", {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12}),
    ("l40s", {"bf16": 362e12, "fp16": 362e12, "fp32": 91.6e12}),
    ("a10g", {"bf16": 125e12, "fp16": 125e12, "fp32": 31.2e12}),
    ("v100", {"bf16": 0.0, "fp16": 125e12, "fp32": 15.7e12}),
    ("mi300x", {"bf16": 1307e12, "fp16": 1307e12, "fp32": 163e12}),
]


def precision_kind(precision: str | int | None) -> str:
    """Lightning precision flag -> "bf16" | "fp16" | "fp32"."""
    text = str(precision)
    if "bf16" in text:
        return "bf16"
    if "16" in text:
        return "fp16"
    return "fp32"


def device_peak_flops(device: torch.device, precision: str | int | None) -> float | None:
    """Peak dense FLOP/s of ``device`` for ``precision``, or None when unknown (e.g. CPUs)."""
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
