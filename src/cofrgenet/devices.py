"""How many devices a Trainer's ``devices`` setting names (without Lightning), and how
many it trains on (``auto``: Lightning's count of this host's devices)."""

from __future__ import annotations

from typing import Any


def device_count(devices: Any) -> int | None:
    """The devices ``trainer.devices`` names, as Lightning reads it (``"2"``, ``2`` and
    ``[0, 1]`` and ``"0,1"`` are 2); None for ``auto``, ``-1`` and anything else that
    counts the devices of the host that trains."""
    if isinstance(devices, str):
        text = devices.strip()
        if text.lstrip("-").isdigit():
            devices = int(text)
        elif "," in text:  # "0,1": device ids
            devices = [d for d in text.split(",") if d.strip()]
    if isinstance(devices, (list, tuple)):
        return len(devices)
    if isinstance(devices, int) and not isinstance(devices, bool) and devices > 0:
        return devices
    return None


def devices_used(devices: Any, accelerator: Any) -> int:
    """The devices a Trainer with these ``devices`` and ``accelerator`` settings trains on
    here: :func:`device_count`, else (``auto``, ``-1``) Lightning's count of this host's."""
    return device_count(devices) or auto_device_count(accelerator)


def auto_device_count(accelerator: Any) -> int:
    """The devices Lightning's ``devices: auto`` takes for ``accelerator`` on this host."""
    from lightning.pytorch.accelerators import CPUAccelerator, CUDAAccelerator, MPSAccelerator

    name = str(accelerator or "auto")
    gpus = {CUDAAccelerator: ("cuda", "gpu", "auto"), MPSAccelerator: ("mps", "gpu", "auto")}
    for cls, names in gpus.items():
        if name in names and cls.is_available():
            return int(cls.auto_device_count())
    return int(CPUAccelerator.auto_device_count()) if name in ("cpu", "auto") else 1
