"""The issue's speed targets, per device type, and their check against measurements."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch

from cofrgenet.bench.ops.config import MODES, REFERENCE_IMPL, OpsBenchConfig
from cofrgenet.bench.ops.formatting import percent, pow2
from cofrgenet.bench.ops.workloads import Workload

if TYPE_CHECKING:  # results.py imports TargetCheck from here: a runtime import would loop
    from cofrgenet.bench.ops.results import Result


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
    #: The input dtype and gradient mode the target was set for: a run of others checks
    #: none (float64 inputs are no float32 target's measurement).
    dtype: str = "float32"
    grad: str = "paper"

    @property
    def workload(self) -> Workload:
        return Workload(self.op, self.rows, self.d, self.width, self.ladders)

    def describe(self) -> str:
        """One line: ``triton >= 2x compiled, univariate_ladder (2^13, 2304) x ... fwd+bwd``."""
        w = self.workload
        where = (
            f"{self.op} {w.shape}" if self.width else f"{self.op} ({pow2(self.rows)}, d={self.d})"
        )
        if self.min_copy_fraction is not None:
            return f"{self.impl} >= {percent(self.min_copy_fraction)} of copy bandwidth, {where} {self.mode}"
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


def targets_for(
    device: torch.device, dtype: str = "float32", grad: str = "paper"
) -> tuple[Target, ...]:
    """The targets set for this device type (the CPU ones, or the GPU ones on CUDA), input
    dtype and gradient mode."""
    return tuple(
        t
        for t in (*TARGETS, *GPU_TARGETS)
        if (t.device, t.dtype, t.grad) == (device.type, dtype, grad)
    )


@dataclass
class TargetCheck:
    """A target and what was measured for it."""

    target: Target
    #: The measured speedup, or the fraction of copy bandwidth for bandwidth targets.
    speedup: float | None
    background_load: float | None = None
    #: Why the run never meant to time it (:func:`not_in_run`); None when it did.
    not_in_run: str | None = None

    @property
    def met(self) -> bool | None:
        """None when the target's workload was not measured (not in the run, or failed)."""
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
            "not_in_run": self.not_in_run,
        }


def not_in_run(target: Target, config: OpsBenchConfig) -> str | None:
    """Why ``config`` does not time ``target``: its workload, mode or impls not selected
    (``--quick`` has no 2^20 size; ``--impls literal,continuant`` no auto). None when it
    does: a target then left without a figure was skipped or failed."""
    impls = [target.impl]
    if target.min_copy_fraction is None:  # a speedup compares it with another impl
        impls.append(target.versus)
    reasons = [f"{i} not in --impls" for i in dict.fromkeys(impls) if i not in config.impls]
    if target.mode not in config.modes:
        reasons.insert(0, f"{target.mode} not in --modes")
    if target.workload not in config.workloads():
        reasons.insert(0, "its workload is not among this run's")
    return "; ".join(reasons) or None


def check_targets(
    results: Sequence[Result],
    targets: Sequence[Target] = TARGETS,
    config: OpsBenchConfig | None = None,
) -> list[TargetCheck]:
    """Each target against the measurements (None where its workload was not run); with
    the run's ``config``, those it never selected say so (:func:`not_in_run`).

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
        unselected = None if config is None else not_in_run(target, config)
        checks.append(TargetCheck(target, value, background, unselected))
    return checks
