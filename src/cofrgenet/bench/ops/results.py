"""What a run produces: a :class:`Result` per (workload, mode, impl), and the :class:`Report`.

Their ``to_dict`` is the layout of the JSON report.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from cofrgenet.bench.ops.targets import TargetCheck
from cofrgenet.bench.ops.workloads import Workload
from cofrgenet.bench.timing import Summary


@dataclass
class Result:
    """Timings of one (workload, mode, impl). ``summary`` is None if the impl failed."""

    workload: Workload
    mode: str
    impl: str
    resolved: str
    first_call_ms: float | None = None
    summary: Summary | None = None
    samples_ms: list[float] = field(default_factory=list)
    speedup: float | None = None
    max_abs_diff: float | None = None
    peak_memory_bytes: int | None = None
    page_faults: int | None = None
    background_load: float | None = None
    error: str | None = None
    #: Why the impl was not run (e.g. triton on CPU); not a failure.
    skipped: str | None = None
    min_bytes: int | None = None
    gbps: float | None = None
    copy_fraction: float | None = None
    #: Cffn workloads: median ms of the layer's matmuls alone, and the ladders' share.
    matmuls_ms: float | None = None
    ladder_share: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            **asdict(self.workload),
            "shape": self.workload.shape,
            "mode": self.mode,
            "impl": self.impl,
            "resolved_impl": self.resolved,
            "first_call_ms": self.first_call_ms,
        }
        if self.summary is not None:
            out.update(
                {f"{k}_ms" if k != "repeats" else k: v for k, v in asdict(self.summary).items()}
            )
        out.update(
            samples_ms=self.samples_ms,
            speedup_vs_literal=self.speedup,
            max_abs_diff_vs_literal=self.max_abs_diff,
            minor_page_faults=self.page_faults,
            background_load=self.background_load,
            error=self.error,
            skipped=self.skipped,
            min_bytes=self.min_bytes,
            gbps=self.gbps,
            copy_fraction=self.copy_fraction,
        )
        if self.matmuls_ms is not None:
            out.update(matmuls_only_median_ms=self.matmuls_ms, ladder_share=self.ladder_share)
        if self.peak_memory_bytes is not None:
            out["peak_memory_bytes"] = self.peak_memory_bytes
        return out


@dataclass
class Report:
    """A whole run: ``meta`` (device, versions, config, command), results, target checks."""

    meta: dict[str, Any]
    results: list[Result]
    targets: list[TargetCheck]

    def to_dict(self) -> dict[str, Any]:
        return {
            "benchmark": "ops",
            **self.meta,
            "results": [r.to_dict() for r in self.results],
            "targets": [t.to_dict() for t in self.targets],
        }
