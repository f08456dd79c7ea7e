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


#: Where SLURM says how many tasks run on this node, the step's own first (srun -n 4
#: sets no SLURM_NTASKS_PER_NODE); "8(x2)" and "2,1" forms: the first count.
TASKS_PER_NODE_VARIABLES = (
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
)


def slurm_tasks_per_node() -> int | None:
    """Tasks SLURM runs on this node, or None outside SLURM (no variable set)."""
    for name in TASKS_PER_NODE_VARIABLES:
        value = os.environ.get(name, "").split("(")[0].split(",")[0].strip()
        if value.isdigit():
            return max(1, int(value))
    return None


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
