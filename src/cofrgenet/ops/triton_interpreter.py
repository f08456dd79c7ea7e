"""Whether Triton runs kernels in its interpreter: the one answer of the launchers, of
``cofr fit``'s device check and of the ahead-of-time compiler.

Importable without triton (this module imports it only when it is installed and asked).
"""

from __future__ import annotations

from cofrgenet.ops.api import triton_available


def interpreted() -> bool:
    """Whether Triton runs ``@triton.jit`` kernels in its interpreter (on CPU tensors)
    instead of compiling them: Triton's own ``triton.knobs.runtime.interpret``, which reads
    ``TRITON_INTERPRET`` as a boolean (``1``, ``true``, ``on``, ``yes``...) each time it is
    asked. Triton binds a kernel to the interpreter when the kernel is defined, so this is
    the kernels' answer unless the variable changed after :mod:`cofrgenet.ops.triton` was
    imported. False without triton."""
    if not triton_available():
        return False
    import triton

    return bool(triton.knobs.runtime.interpret)
