"""Sweeps: Optuna studies over training configs, pruned at the global step, tracked in MLflow.

``cofr sweep run SWEEP.yaml`` is a worker (start any number against one storage);
``status``, ``report`` and ``submit`` (SLURM) complete it. See docs/sweeps.md.
"""

from cofrgenet.sweeps.spec import ParamSpec, Sweep, SweepError, load_sweep, parse_sweep

__all__ = ["ParamSpec", "Sweep", "SweepError", "load_sweep", "parse_sweep"]
