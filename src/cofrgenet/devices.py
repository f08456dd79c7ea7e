"""How many devices a Trainer's ``devices`` setting names, without Lightning."""

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
