"""What a benchmark ran on, named in its report: figures mean little without the machine.

torch is imported inside the functions, as in the rest of ``cofrgenet.bench``'s entry
points, so that ``cofr bench --help`` starts fast.
"""

from __future__ import annotations

import platform
import re
from pathlib import Path
from typing import Any


def cpu_name() -> str:
    """The CPU model (``model name`` of /proc/cpuinfo), else the architecture."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: Any) -> str:
    """The CUDA device's name, or the CPU model for a CPU device."""
    import torch

    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_name()


def name_slug(name: str) -> str:
    """A device name as report files hold it: ``NVIDIA H200`` -> ``nvidia-h200``."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def device_slug(device: Any) -> str:
    """A device as report files name it: the GPU's name as a slug, else its type (cpu)."""
    import torch

    device = torch.device(device)
    return name_slug(torch.cuda.get_device_name(device)) if device.type == "cuda" else device.type


def machine_summary(device: Any) -> str:
    """One line: the host CPU, torch's threads, the versions (CUDA's on a GPU) and the code,
    e.g. ``AMD EPYC, 2 threads, python 3.11.7, torch 2.13.0+cpu, cofrgenet 0.1.0, commit
    1a2b3c4``: what a figure needs to be reproduced."""
    import torch

    from cofrgenet.training.run_store import code_description

    cuda = f", cuda {torch.version.cuda}" if torch.device(device).type == "cuda" else ""
    return (
        f"{cpu_name()}, {torch.get_num_threads()} threads, python {platform.python_version()}, "
        f"torch {torch.__version__}{cuda}, {code_description()}"
    )
