"""Launch-side helpers of the Triton kernels: devices, dtypes, block sizes, output buffers.

On a machine without a GPU the kernels run only under Triton's interpreter
(``TRITON_INTERPRET=1`` set before ``triton`` is imported); there they run on CPU tensors,
slowly (~1e7 elements/s), which is what the CPU test suite does.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from cofrgenet.ops.triton_interpreter import interpreted

#: Fill new outputs with NaN instead of leaving them uninitialised, so that an element a
#: kernel forgot to write shows up in tests. Tests switch it on (see tests/conftest.py).
poison_outputs = False


def check_tensor(t: Tensor) -> None:
    """Raise a clear error for tensors the kernels cannot run on."""
    if t.device.type == "cuda" or (t.device.type == "cpu" and interpreted()):
        return
    raise RuntimeError(
        f"impl='triton' needs a CUDA device (or TRITON_INTERPRET=1 set before triton is "
        f"imported, to run the kernels on CPU in Triton's interpreter); got a tensor on "
        f"{t.device}. Use impl='auto' or 'continuant' on this device."
    )


def compute_dtype(*dtypes: torch.dtype) -> tl.dtype:
    """float64 if any input is float64, else float32 (fp32, bf16 and fp16 inputs)."""
    return tl.float64 if torch.float64 in dtypes else tl.float32


def torch_compute_dtype(*dtypes: torch.dtype) -> torch.dtype:
    return torch.float64 if torch.float64 in dtypes else torch.float32


def new_output(shape, dtype: torch.dtype, device: torch.device) -> Tensor:
    """An uninitialised (or, with ``poison_outputs``, NaN-filled) contiguous tensor."""
    if poison_outputs:
        return torch.full(tuple(shape), float("nan"), dtype=dtype, device=device)
    return torch.empty(tuple(shape), dtype=dtype, device=device)


def new_output_like(t: Tensor) -> Tensor:
    """``torch.empty_like(t)`` (t's strides when t is dense), NaN-filled when poisoning."""
    if poison_outputs:
        return torch.full_like(t, float("nan"))
    return torch.empty_like(t)


def _override(name: str, parts: int) -> list[int] | None:
    """Integers from an environment variable such as ``16x64x4`` (for tuning runs)."""
    text = os.environ.get(name)
    if not text:
        return None
    values = [int(v) for v in text.lower().split("x")]
    if len(values) != parts:
        raise ValueError(f"{name}={text!r}: expected {parts} integers joined by 'x'")
    return values


def block_1d() -> tuple[int, int]:
    """(units per program, warps) of the continued-fraction kernels.

    ``COFRGENET_TRITON_BLOCK=512x4`` overrides it (tuning).
    """
    if interpreted():
        return 4096, 1
    override = _override("COFRGENET_TRITON_BLOCK", 2)
    return (override[0], override[1]) if override else (512, 4)


def block_2d(rows: int, cols: int, elements: int = 1024) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, warps) of the ladder kernels: ``elements``-element tiles on a GPU.

    Wide tiles along the contiguous dim (coalesced 256 B rows of fp32), few rows; deep
    or many ladders ask for fewer elements (:func:`tile_elements`).
    ``COFRGENET_TRITON_TILE=16x64x4`` overrides it (tuning).
    """
    if interpreted():  # few, large programs: the interpreter pays per operation
        return 64, max(16, min(256, triton.next_power_of_2(cols))), 1
    override = _override("COFRGENET_TRITON_TILE", 3)
    if override:
        return override[0], override[1], override[2]
    block_n = max(16, min(64, triton.next_power_of_2(cols)))
    return max(1, elements // block_n), block_n, 4


def tile_elements(depth: int, ladders: int, backward: bool) -> int:
    """Elements per tile of the ladder kernels that keep them free of register spills.

    Every partial denominator of every ladder is live at once for each element of the
    tile (the backward keeps more per denominator than the forward), so tiles shrink as
    d L grows. Registers and stack (spills) on sm_90 with 4 warps and fp32 compute,
    specialized as a launch specializes them (``cofr bench kernels --ptxas-info``; the
    script is in docs/benchmarks/triton-registers-2026-12-02.md):

    * forward, d L = 5 x 3: 168 registers, no stack with 1024 elements;
    * forward, 16 x 1: 128 B of stack with 1024; none with 512 (108 registers);
    * backward, 8 x 1: 255 registers, no stack with 1024;
    * backward, 5 x 3 (the Cffn ensemble): 248 B of stack with 1024; none with 512;
    * backward, 16 x 1: 144 B of stack with 512; none with 256.
    """
    units = depth * ladders
    if not backward:
        return 1024 if units <= 15 else 512
    if units <= 8:
        return 1024
    return 512 if units <= 15 else 256


def reduction_split(row_blocks: int, col_blocks: int, device: torch.device) -> int:
    """Programs along the rows of a backward kernel that reduces over rows.

    Each program loops over row blocks and keeps running sums of its parameter
    gradients; the SPLIT partial sums per column are added up by torch afterwards (in a
    fixed order: deterministic). About two programs per multiprocessor in all, in one
    wave (the backward kernels use many registers: ~2 resident programs per SM).
    """
    if device.type == "cuda":
        target = 2 * torch.cuda.get_device_properties(device).multi_processor_count
    else:
        target = 2
    return max(1, min(row_blocks, target // max(1, col_blocks)))
