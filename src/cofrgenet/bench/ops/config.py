"""What `cofr bench ops` times: :class:`OpsBenchConfig`, its constants and ``--quick``.

The fields' ``help`` metadata is the command line's help: the options are generated
from this dataclass (:mod:`cofrgenet.dataclass_options`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from cofrgenet.bench.ops.formatting import pow2
from cofrgenet.bench.ops.workloads import Workload
from cofrgenet.bench.timing import BUSY_THRESHOLD  # shared with bench train; re-exported
from cofrgenet.dataclass_options import DEVICE_HELP
from cofrgenet.errors import ConfigError, did_you_mean
from cofrgenet.nn.cffn import LADDER_KINDS
from cofrgenet.ops import GRAD_MODES, IMPLS

MODES = ("fwd", "fwd+bwd")
DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
REFERENCE_IMPL = "literal"
#: Implementations that run only on CUDA devices (on CPU, Triton's interpreter would).
CUDA_ONLY_IMPLS = ("triton",)
CFFN_KINDS = LADDER_KINDS


def default_impls(device: torch.device | None = None) -> tuple[str, ...]:
    """Every implementation in ``cofrgenet.ops.IMPLS``: literal first, auto last.

    ``triton`` only where CUDA is (``device``, or this machine when None).
    """
    cuda = torch.cuda.is_available() if device is None else device.type == "cuda"
    middle = [
        i for i in IMPLS if i not in (REFERENCE_IMPL, "auto") and (cuda or i not in CUDA_ONLY_IMPLS)
    ]
    return (REFERENCE_IMPL, *middle, "auto")


def _help(text: str, **extra: object) -> dict[str, object]:
    return {"help": text, **extra}


@dataclass(frozen=True)
class OpsBenchConfig:
    """What to time. Sizes are rows N (continued_fraction) or (rows, n) pairs (ladders)."""

    sizes: tuple[int, ...] = field(
        default=(1 << 16, 1 << 20),
        metadata=_help("continued_fraction rows N, e.g. 2^16,2^20", format=pow2, metavar="N,..."),
    )
    depths: tuple[int, ...] = field(
        default=(1, 3, 5, 8), metadata=_help("continued_fraction depths d", metavar="D,...")
    )
    ladder_sizes: tuple[tuple[int, int], ...] = field(
        default=((256, 256), (1024, 1024)),
        metadata=_help("univariate_ladder ROWSxN shapes, '' for none", metavar="ROWSxN,..."),
    )
    ladder_depths: tuple[int, ...] = field(
        default=(5, 8), metadata=_help("univariate_ladder depths d", metavar="D,...")
    )
    ensemble_sizes: tuple[tuple[int, int], ...] = field(
        default=((1024, 768),),
        metadata=_help(
            "ladder_ensemble ROWSxP shapes, '' for none; L = --ensemble-ladders ladders of "
            "each depth in --ensemble-depths",
            metavar="ROWSxP,...",
        ),
    )
    ensemble_ladders: int = field(
        default=3, metadata=_help("ladders L of ensembles and Cffn layers")
    )
    ensemble_depths: tuple[int, ...] = field(
        default=(5,), metadata=_help("depths d of ensembles and Cffn layers", metavar="D,...")
    )
    cffn_sizes: tuple[tuple[int, int], ...] = field(
        default=((1024, 768),),
        metadata=_help(
            "whole Cffn layers, ROWSxP shapes, '' for none; L = --ensemble-ladders, "
            "d = each of --ensemble-depths",
            metavar="ROWSxP,...",
        ),
    )
    cffn_kinds: tuple[str, ...] = field(
        default=CFFN_KINDS,
        metadata=_help(f"Cffn ladder kinds, from {', '.join(CFFN_KINDS)}", metavar="KIND,..."),
    )
    impls: tuple[str, ...] = field(
        default_factory=default_impls,
        metadata=_help(
            f"implementations, from {', '.join(IMPLS)}; triton only on CUDA", metavar="IMPL,..."
        ),
    )
    modes: tuple[str, ...] = field(
        default=MODES, metadata=_help(f"from {', '.join(MODES)}", metavar="MODE,...")
    )
    repeats: int = field(default=7, metadata=_help("timed calls per (impl, mode), interleaved"))
    warmup: int = field(default=2, metadata=_help("untimed calls after the first one"))
    calls_per_sample: int | None = field(
        default=None,
        metadata=_help(
            "calls timed back to back between two synchronizations, a sample being their "
            "mean (default: 10 on CUDA, where a synchronization costs as much as a small "
            "kernel, 1 on CPU)"
        ),
    )
    dtype: str = field(default="float32", metadata=_help("input dtype", choices=tuple(DTYPES)))
    device: str = field(default="auto", metadata=_help(DEVICE_HELP))
    grad: str = field(
        default="paper",
        metadata=_help("gradient mode of the continuant impls", choices=GRAD_MODES),
    )
    eps: float = field(
        default=0.01, metadata=_help("the ops' eps: |K_d| is clamped to at least eps")
    )
    seed: int = field(default=0, metadata=_help("input seed"))
    threads: int | None = field(
        default=None, metadata=_help("torch.set_num_threads before timing (default: torch's own)")
    )
    wait_quiet: float = field(
        default=0.0,
        metadata=_help(
            "on a shared machine: per workload, wait up to SECONDS for other processes to "
            f"use under {100 * BUSY_THRESHOLD:.0f}% of the CPU, and time it again if they "
            "got busy meanwhile; 0: time at once",
            metavar="SECONDS",
        ),
    )
    time_budget: float = field(
        default=0.0,
        metadata=_help(
            "start no new workload after SECONDS, nor one that would end after them if it "
            "took as long as the longest one so far; 0: no limit; the report lists those "
            "not run",
            metavar="SECONDS",
        ),
    )

    def workloads(self) -> list[Workload]:
        """Every workload, in report order: cf, ladders, ensembles, then Cffn layers (they
        run one op at a time in turn: :func:`~cofrgenet.bench.ops.measure.run_order`)."""
        cf = [Workload("continued_fraction", n, d) for n in self.sizes for d in self.depths]
        ladders = [
            Workload("univariate_ladder", rows, d, width)
            for rows, width in self.ladder_sizes
            for d in self.ladder_depths
        ]
        n_l = self.ensemble_ladders
        ensembles = [
            Workload("ladder_ensemble", rows, d, width, n_l)
            for rows, width in self.ensemble_sizes
            for d in self.ensemble_depths
        ]
        layers = [
            Workload(f"cffn_{kind}", rows, d, width, n_l)
            for rows, width in self.cffn_sizes
            for kind in self.cffn_kinds
            for d in self.ensemble_depths
        ]
        return cf + ladders + ensembles + layers

    def sample_calls(self, device: torch.device) -> int:
        """Calls a timed sample holds on ``device`` (``calls_per_sample``, or its default)."""
        if self.calls_per_sample is not None:
            return self.calls_per_sample
        return 10 if device.type == "cuda" else 1

    def validate(self) -> None:
        """Raise :class:`~cofrgenet.errors.ConfigError` (a ValueError) naming the first
        bad option (the device is checked when the run starts: parsing stays fast)."""
        choices = (("--impls", self.impls, IMPLS), ("--modes", self.modes, MODES))
        choices += (("--cffn-kinds", self.cffn_kinds, CFFN_KINDS),)
        for option, given in (("--impls", self.impls), ("--modes", self.modes)):
            if not given:  # an empty report, status 0
                raise ConfigError(f"{option}: nothing to time; give at least one")
        for option, given, known in choices:
            for name in given:
                if name not in known:
                    raise ConfigError(
                        f"{option}: unknown {name!r}{did_you_mean(name, known)}; choose from "
                        f"{', '.join(known)}"
                    )
        if self.dtype not in DTYPES:
            raise ConfigError(f"--dtype: unknown {self.dtype!r}; choose from {', '.join(DTYPES)}")
        least = {"--repeats": (self.repeats, 1), "--warmup": (self.warmup, 0)}
        least |= {"--wait-quiet": (self.wait_quiet, 0), "--time-budget": (self.time_budget, 0)}
        if self.threads is not None:
            least["--threads"] = (self.threads, 1)
        if self.calls_per_sample is not None:
            least["--calls-per-sample"] = (self.calls_per_sample, 1)
        for option, (value, low) in least.items():
            if value < low:
                raise ConfigError(f"{option} must be >= {low}, got {value}")
        sizes = {"--sizes": self.sizes, "--depths": self.depths}
        sizes |= {"--ladder-depths": self.ladder_depths, "--ensemble-depths": self.ensemble_depths}
        sizes |= {"--ensemble-ladders": (self.ensemble_ladders,)}
        sizes |= {"--ladder-sizes": tuple(v for pair in self.ladder_sizes for v in pair)}
        sizes |= {"--ensemble-sizes": tuple(v for pair in self.ensemble_sizes for v in pair)}
        sizes |= {"--cffn-sizes": tuple(v for pair in self.cffn_sizes for v in pair)}
        for option, values in sizes.items():
            if any(v < 1 for v in values):
                raise ConfigError(f"{option}: sizes and depths must be >= 1, got {min(values)}")
        if not self.eps > 0:  # every op refuses it: each workload would only "fail"
            raise ConfigError(f"--eps must be > 0 (the least |K_d|), got {self.eps}")
        if not self.workloads():  # an empty table and report, status 0
            raise ConfigError(
                "nothing to time: each op times its sizes at its depths (--sizes at --depths, "
                "--ladder-sizes at --ladder-depths, --ensemble-sizes at --ensemble-depths, "
                "--cffn-sizes at --ensemble-depths for --cffn-kinds), and every pair has an "
                "empty list; give one op both"
            )


#: Tiny sizes for tests and CI: seconds, no compilation unless asked for.
QUICK = {
    "sizes": (1 << 10,),
    "depths": (1, 3),
    "ladder_sizes": ((16, 32),),
    "ladder_depths": (3,),
    "ensemble_sizes": ((16, 32),),
    "ensemble_ladders": 2,
    "ensemble_depths": (3,),
    "cffn_sizes": ((16, 32),),
    "impls": tuple(i for i in default_impls() if i != "compiled"),
    "repeats": 3,
    "warmup": 1,
}
