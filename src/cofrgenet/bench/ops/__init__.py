"""`cofr bench ops`: time the continued-fraction ops, literal form against continuants.

Workloads are ``continued_fraction`` on (N, d) partial denominators,
``univariate_ladder`` on x (rows, n) with weight/bias (d, n), ``ladder_ensemble`` (the
elementwise Cffn's ladders: x (rows, p), weight/bias (d, L, p), mix (p, L)) and whole
``Cffn`` layers (scalar and elementwise ladders) on x (rows, p). Each implementation
(``literal``, ``continuant``, ``compiled``, ``triton``, ``auto``) runs in two modes:

* ``fwd``: the forward pass under ``torch.no_grad()``;
* ``fwd+bwd``: forward, then ``backward`` of a fixed random upstream gradient into
  leaves that require grad (a; or x, weight and bias).

The first call of each (impl, mode) is timed on its own and reported as "first call"
(``torch.compile`` compiles there), followed by untimed warm-up calls; then every
(impl, mode) of a workload is timed ``repeats`` times, interleaved round by round (see
:mod:`cofrgenet.bench.timing`). Speedup = literal median / impl median, same workload
and mode. Inputs are positive (a in [0.5, 1.5)), so no clamp is active and every
implementation computes the same values; the kernels are branch-free, so their speed
does not depend on the values.

Bandwidth: each op workload has a minimum number of bytes it must move (inputs read
once, outputs written once; see :func:`min_bytes`); GB/s = that / median time, and "% copy"
compares it with the device's copy bandwidth measured at the start of the run. Cffn
workloads also time the layer's matmuls alone (gate and U, no ladders) and report the
ladders' share of the layer's time. ``triton`` is not run on CPU: Triton's interpreter
runs there, and its timings mean nothing (the default ``--impls`` leaves it out there,
and the command refuses it without a CUDA device).

The package, in the order a run goes through it:

* :mod:`~cofrgenet.bench.ops.config`: :class:`OpsBenchConfig` (what to time; its field
  metadata is the command line's help) and ``--quick``'s sizes;
* :mod:`~cofrgenet.bench.ops.workloads`: :class:`Workload`, its inputs, the timed calls
  and :func:`min_bytes`;
* :mod:`~cofrgenet.bench.ops.measure`: copy bandwidth, :func:`bench_workload`,
  :func:`run_order`, :func:`run_benchmark` (a partial report after each workload);
* :mod:`~cofrgenet.bench.ops.results`: :class:`Result` and :class:`Report` (the JSON);
* :mod:`~cofrgenet.bench.ops.targets`: the issue's targets and :func:`check_targets`;
* :mod:`~cofrgenet.bench.ops.report`: console table, markdown, :func:`write_report`;
* :mod:`~cofrgenet.bench.ops.command`: the CLI (:func:`add_arguments`, :func:`run`),
  generated from the dataclasses by :mod:`cofrgenet.dataclass_options`.
"""

from __future__ import annotations

from cofrgenet.bench.ops.command import OutputOptions, add_arguments, config_from_args, run
from cofrgenet.bench.ops.config import (
    BUSY_THRESHOLD,
    CUDA_ONLY_IMPLS,
    DTYPES,
    MODES,
    QUICK,
    REFERENCE_IMPL,
    OpsBenchConfig,
    default_impls,
)
from cofrgenet.bench.ops.measure import (
    bench_workload,
    measure_copy_bandwidth,
    run_benchmark,
    run_order,
)
from cofrgenet.bench.ops.report import (
    busy_warning,
    detail_rows,
    device_label,
    print_report,
    summary_rows,
    to_markdown,
    write_report,
)
from cofrgenet.bench.ops.results import Report, Result
from cofrgenet.bench.ops.targets import (
    GPU_TARGETS,
    TARGETS,
    Target,
    TargetCheck,
    check_targets,
    targets_for,
)
from cofrgenet.bench.ops.workloads import CFFN_OPS, Workload, min_bytes

__all__ = [
    "BUSY_THRESHOLD",
    "CFFN_OPS",
    "CUDA_ONLY_IMPLS",
    "DTYPES",
    "GPU_TARGETS",
    "MODES",
    "QUICK",
    "REFERENCE_IMPL",
    "TARGETS",
    "OpsBenchConfig",
    "OutputOptions",
    "Report",
    "Result",
    "Target",
    "TargetCheck",
    "Workload",
    "add_arguments",
    "bench_workload",
    "busy_warning",
    "check_targets",
    "config_from_args",
    "default_impls",
    "detail_rows",
    "device_label",
    "measure_copy_bandwidth",
    "min_bytes",
    "print_report",
    "run",
    "run_benchmark",
    "run_order",
    "summary_rows",
    "targets_for",
    "to_markdown",
    "write_report",
]
