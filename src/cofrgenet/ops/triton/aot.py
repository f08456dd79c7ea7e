"""Compile the kernels ahead of time for a GPU architecture, without a GPU.

Triton's interpreter (what CPU tests run) does not go through Triton's compiler, so a
kernel can pass every interpreted test and still fail to compile. This module compiles
representative specializations of every kernel down to a cubin for a target (default
sm_90, the H100/H200) with the ptxas Triton ships, and reports registers and stack.
The ladder kernels are specialized as a launch on contiguous tensors specializes them
(unit strides become constants, pointers and multiples of 16 get divisibility hints, the
launcher's tile sizes): wider vector loads take more registers than plain i32 arguments
would show. Triton's compiler entry points (``ASTSource``, ``GPUTarget``) and the
``cuobjdump`` it bundles are not a stable API: this module follows the pinned triton
(pyproject.toml).


``cofr bench kernels [--arch 80] [--ptxas-info]`` runs it (:mod:`cofrgenet.bench.kernels`).
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from cofrgenet.ops.triton import runtime
from cofrgenet.ops.triton.continued_fraction import (
    continued_fraction_bwd_kernel,
    continued_fraction_fwd_kernel,
)
from cofrgenet.ops.triton.ladder import ladder_ensemble_bwd_kernel, ladder_ensemble_fwd_kernel

_POINTER = {tl.float32: "*fp32", tl.float64: "*fp64"}
#: The clamp threshold the specializations are compiled for (a constexpr of every kernel).
EPS = 0.01
#: The shape whose tiles the ladder specializations take: gpt2-small's (8 x 1024, 768).
LADDER_ROWS, LADDER_COLS = 8192, 768

Spec = tuple[object, dict[str, str], dict[str, object], dict[tuple[int, ...], list]]


def _as_launched(
    kernel: object, signature: dict[str, str], constexprs: dict[str, object], ones: list[str]
) -> Spec:
    """A specialization as a launch on contiguous tensors makes it: the ``ones`` (unit
    strides) become constants, pointers and the other integers get Triton's
    divisibility-by-16 hint (the ladder shapes compiled here are multiples of 16)."""
    names = kernel.arg_names  # type: ignore[attr-defined]
    signature = {k: v for k, v in signature.items() if k not in ones}
    hinted = [k for k, v in signature.items() if v.startswith("*") or k not in _UNHINTED]
    attrs = {(names.index(k),): [["tt.divisibility", 16]] for k in hinted}
    return kernel, signature, {**constexprs, **dict.fromkeys(ones, 1)}, attrs


#: Integer arguments of the ladder kernels that are not multiples of 16 in a launch.
_UNHINTED = {"stride_vn", "split"}


def _cf_specs() -> Iterator[Spec]:
    scalars = ["units", "inner", "stride_a1", "stride_a2", "stride_ad"]
    for d, compute, io, exact, force in [
        (1, tl.float32, "*fp32", True, False),
        (5, tl.float32, "*bf16", False, False),
        (8, tl.float32, "*fp16", True, True),
        (32, tl.float32, "*fp32", True, False),
        (4, tl.float64, "*fp64", True, False),
    ]:
        sig = {"a_ptr": io, "out_ptr": io, **dict.fromkeys(scalars, "i32")}
        const = {"EPS": EPS, "D": d, "COMPUTE": compute, "FORCE_RESCALE": force, "BLOCK": 512}
        yield continued_fraction_fwd_kernel, sig, const, {}
        sig = {"a_ptr": io, "grad_out_ptr": io, "grad_a_ptr": io}
        strides = ["stride_go", "stride_g1", "stride_g2", "stride_gd"]
        sig.update(dict.fromkeys(scalars + strides, "i32"))
        const = {"EPS": EPS, "D": d, "COMPUTE": compute, "EXACT": exact}
        const.update(FORCE_RESCALE=force, BLOCK=512)
        yield continued_fraction_bwd_kernel, sig, const, {}


def _ladder_specs() -> Iterator[Spec]:
    cases = [  # (d, L, mix, bias, compute, io, exact, force, floor); floor 0: the paper's
        (1, 1, False, True, tl.float32, "*fp32", True, False, 0.0),
        (5, 1, False, False, tl.float32, "*bf16", False, False, 0.5),
        (8, 1, False, True, tl.float32, "*fp32", True, True, 0.0),
        (16, 1, False, True, tl.float32, "*fp32", False, False, 0.5),
        (5, 3, True, True, tl.float32, "*bf16", False, False, 0.5),
        (5, 3, True, True, tl.float32, "*fp32", True, False, 0.0),
        (8, 2, True, False, tl.float64, "*fp64", True, False, 0.5),
    ]
    for d, n_l, mix, bias, compute, io, exact, force, floor in cases:
        param = _POINTER[compute] if compute == tl.float64 else "*fp32"
        pointers = {"x_ptr": io, "w_ptr": param, "b_ptr": param, "v_ptr": param}
        strides = ["stride_xm", "stride_xn", "stride_wk", "stride_wj", "stride_vn", "stride_vj"]
        sig = {**pointers, "out_ptr": io, "M": "i32", "N": "i32", **dict.fromkeys(strides, "i32")}
        flags = {"EPS": EPS, "D": d, "L": n_l, "HAS_BIAS": bias, "FLOOR": floor, "HAS_MIX": mix}
        flags["COMPUTE"] = compute
        ones = ["stride_xn", "stride_vj"] if mix else ["stride_xn"]
        elements = runtime.tile_elements(d, n_l, backward=False)
        block_m, block_n, _ = runtime.block_2d(LADDER_ROWS, LADDER_COLS, elements)
        tile = {"BLOCK_M": block_m, "BLOCK_N": block_n}
        fwd = {**flags, "FORCE_RESCALE": force, **tile}
        yield _as_launched(ladder_ensemble_fwd_kernel, sig, fwd, ones)
        part = "*fp64" if compute == tl.float64 else "*fp32"
        sig = {**pointers, "grad_out_ptr": io, "grad_x_ptr": io}
        sig.update(part_w_ptr=part, part_b_ptr=part, part_v_ptr=part, M="i32", N="i32")
        grad_strides = ["stride_gm", "stride_gn"]
        sig.update(dict.fromkeys(strides[:2] + grad_strides + strides[2:], "i32"))
        sig.update(row_blocks="i32", split="i32")
        elements = runtime.tile_elements(d, n_l, backward=True)
        block_m, block_n, _ = runtime.block_2d(LADDER_ROWS, LADDER_COLS, elements)
        for need_x, need_params in ((True, True), (False, True), (True, False)):
            bwd = {
                **flags,
                "P": triton.next_power_of_2(d * n_l),
                "LP": triton.next_power_of_2(n_l),
                "NEED_X": need_x,
                "NEED_PARAMS": need_params,
                "EXACT": exact,
                "FORCE_RESCALE": force,
                "BLOCK_M": block_m,
                "BLOCK_N": block_n,
            }
            yield _as_launched(ladder_ensemble_bwd_kernel, sig, bwd, [*ones, "stride_gn"])
            if d != 5 or n_l != 3 or exact:  # gradient subsets: the default Cffn case
                break


def resource_usage(cubin: bytes) -> str:
    """``N registers, S B stack`` of a compiled kernel, read from its cubin by the
    cuobjdump Triton ships: what ptxas made of it with Triton's own options. Stack above
    0 means spilled registers (these kernels keep no local arrays)."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.exists():
        return "cuobjdump not found"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        proc = subprocess.run(
            [str(tool), "-res-usage", f.name], capture_output=True, text=True, check=False
        )
    finally:
        os.unlink(f.name)
    found = re.search(r"REG:(\d+) STACK:(\d+)", proc.stdout)
    return f"{found[1]} registers, {found[2]} B stack" if found else "usage not found"


def compile_all(
    arch: int = 90, ptxas_info: bool = False, log: Callable[[str], object] = print
) -> int:
    """Compile every representative specialization; returns the number compiled. One
    that Triton's cache held (a former run's, keyed by source, options and Triton's
    version) is said to be read from it, not timed as a 0.0 s compile."""
    target = GPUTarget("cuda", arch, 32)
    count = 0
    for spec in itertools.chain(_cf_specs(), _ladder_specs()):
        _compile_one(spec, target, ptxas_info, log)
        count += 1
    return count


def _compile_one(
    spec: Spec, target: GPUTarget, ptxas_info: bool, log: Callable[[str], object]
) -> None:
    kernel, signature, constexprs, attrs = spec
    hits: list[bool] = []

    def heard(*, cache_hit: bool, **_: Any) -> None:  # Triton's compilation listener
        hits.append(cache_hit)

    start = time.perf_counter()
    source = ASTSource(
        fn=kernel,
        signature={**signature, **dict.fromkeys(constexprs, "constexpr")},
        constexprs=constexprs,
        attrs=attrs,
    )
    with triton.knobs.compilation.scope():
        triton.knobs.compilation.listener = heard
        compiled = triton.compile(source, target=target, options={"num_warps": 4})
    took = time.perf_counter() - start
    how = "from Triton's cache" if hits == [True] else f"{took:.1f} s"
    info = f", {resource_usage(compiled.asm['cubin'])}" if ptxas_info else ""
    flags = ", ".join(f"{k}={getattr(v, 'name', v)}" for k, v in constexprs.items())
    log(f"{kernel.__name__}({flags}): {how}{info}")
