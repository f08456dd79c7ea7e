"""``cofr bench kernels``: compile every Triton kernel for a GPU architecture, no GPU needed.

Triton's interpreter (what the CPU tests run) does not go through Triton's compiler, so a
kernel can pass every interpreted test and still fail to compile, or spill registers.
This compiles representative specializations of each kernel to a cubin
(:mod:`cofrgenet.ops.triton.aot`) and prints each one's compile time and, with
``--ptxas-info``, its registers and stack.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from cofrgenet.dataclass_options import add_dataclass_arguments, dataclass_from_args
from cofrgenet.errors import ConfigError


def compute_capability(text: str) -> int:
    """argparse ``type`` of ``--arch``: a compute capability x 10 as ``90``, ``sm90``,
    ``sm_90``, ``sm_90a``, ``compute_90`` or ``9.0`` (how nvcc, Triton and nvidia-smi
    write it; ``a``, an architecture's own features, compiles as its base here)."""
    plain = text.strip().lower().removeprefix("compute_").removeprefix("sm").lstrip("_")
    plain = plain.removesuffix("a") if plain[:-1].isdigit() else plain
    major, dot, minor = plain.partition(".")
    if dot and major.isdigit() and int(major) < 20 and len(minor) == 1 and minor.isdigit():
        return int(major) * 10 + int(minor)
    if plain.isdigit() and len(plain) <= 3:
        return int(plain)
    raise argparse.ArgumentTypeError(
        f"expected a compute capability x 10 (90, sm90 or 9.0), got {text!r}"
    )


@dataclass(frozen=True)
class KernelsOptions:
    """What ``cofr bench kernels`` compiles for, and what it prints."""

    arch: int = field(
        default=90,
        metadata={
            "help": "the GPU's compute capability x 10 (90: H100/H200, 80: A100; sm90 and 9.0 "
            "read as 90)",
            "type": compute_capability,
        },
    )
    ptxas_info: bool = field(
        default=False,
        metadata={"help": "print each kernel's registers and stack (spills), from its cubin"},
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``cofr bench kernels``: one per field of :class:`KernelsOptions`."""
    add_dataclass_arguments(parser, KernelsOptions)


def run(args: argparse.Namespace) -> int:
    """Entry point of ``cofr bench kernels``."""
    options = dataclass_from_args(KernelsOptions, args)
    if options.arch < 50:  # LLVM aborts the process on an older one (no shfl.sync)
        raise ConfigError(
            f"--arch {options.arch}: give a compute capability x 10 of 50 or more, e.g. 80 "
            "(A100) or 90 (H100/H200)"
        )
    from cofrgenet.ops.api import triton_available
    from cofrgenet.ops.triton_interpreter import interpreted

    if not triton_available():
        raise ConfigError("compiling the kernels needs triton: pip install triton (Linux)")
    if interpreted():
        raise ConfigError(
            "TRITON_INTERPRET is set, and Triton's interpreter compiles nothing: unset it"
        )
    from cofrgenet.ops.triton.aot import compile_all

    count = compile_all(options.arch, options.ptxas_info)
    print(f"compiled {count} kernel specializations for sm_{options.arch}")
    return 0
