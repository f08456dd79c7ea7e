"""CPU counts for worker pools: ``SLURM_CPUS_PER_TASK`` first, then this process's affinity."""

from __future__ import annotations

import os


def slurm_cpus() -> int | None:
    """``SLURM_CPUS_PER_TASK`` as an int, or None when unset or not a number."""
    value = os.environ.get("SLURM_CPUS_PER_TASK", "").strip()
    try:
        return max(1, int(value)) if value else None
    except ValueError:
        return None


def available_cpus() -> int:
    """CPUs this process may use: SLURM's allocation, else its CPU affinity, else cpu_count."""
    cpus = slurm_cpus()
    if cpus is not None:
        return cpus
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def default_loader_workers() -> int:
    """DataLoader workers: one CPU left for the training process.

    Under SLURM ``SLURM_CPUS_PER_TASK - 1``; elsewhere ``min(4, cpus - 1)``; at least 0.
    """
    if slurm_cpus() is not None:
        return max(0, available_cpus() - 1)
    return max(0, min(4, available_cpus() - 1))
