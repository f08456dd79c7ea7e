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


def slurm_tasks_per_node() -> int | None:
    """``SLURM_NTASKS_PER_NODE`` as an int ("8(x2)": 8), or None when unset."""
    value = os.environ.get("SLURM_NTASKS_PER_NODE", "").split("(")[0].strip()
    return max(1, int(value)) if value.isdigit() else None


def processes_sharing_cpus(devices_per_node: int) -> int:
    """Training processes that share this process's CPUs, given the trainer's devices per
    node: all of them on one machine (or one SLURM task that starts its ranks itself,
    ddp_spawn), ``devices / tasks per node`` where srun starts a task per rank."""
    tasks = slurm_tasks_per_node()
    if tasks is None:
        return max(1, devices_per_node)
    return max(1, devices_per_node // tasks)


def default_loader_workers(processes: int = 1) -> int:
    """DataLoader workers of each of ``processes`` training processes sharing these CPUs:
    one CPU left for each process.

    Under SLURM ``SLURM_CPUS_PER_TASK // processes - 1``; elsewhere
    ``min(4, cpus // processes - 1)``; at least 0.
    """
    share = available_cpus() // max(1, processes)
    if slurm_cpus() is not None:
        return max(0, share - 1)
    return max(0, min(4, share - 1))
