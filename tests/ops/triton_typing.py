"""Compiled Triton's typing of float kernel arguments, reproduced under the interpreter.

Compiled Triton passes a Python float argument as fp32 (unless its parameter is a
constexpr or annotated ``tl.float64``), whatever the kernel computes in; the interpreter
passes the Python float itself, which acts as float64. A kernel that takes eps as a
runtime float then clamps float64 inputs at fp32(eps) on a GPU and at eps in the CPU
suites. :func:`type_floats_as_compiled` makes interpreted launches see fp32 values too
(the ops' conftest applies it to every kernel); :func:`scalar_probe_kernel` shows the
GPU behaviour it copies. Imports triton: import this module only when it is installed.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import numpy as np
import pytest
import triton
import triton.language as tl

import cofrgenet.ops.triton as kernels_package


def compiled_value(value: object, annotation: str) -> object:
    """``value`` as a compiled kernel receives it for a parameter with ``annotation``."""
    if not isinstance(value, float) or "constexpr" in annotation:
        return value
    if "float64" in annotation or "fp64" in annotation:
        return value
    return float(np.float32(value))


def type_floats_as_compiled(kernel, monkeypatch: pytest.MonkeyPatch) -> None:
    """Launch an interpreted ``kernel`` with its float arguments rounded as compiled
    Triton rounds them (``kernel[grid](...)`` goes through ``kernel.run``)."""
    names = list(inspect.signature(kernel.fn).parameters)
    annotations = {name: str(a) for name, a in kernel.fn.__annotations__.items()}
    run = kernel.run

    def typed_run(*args, **kwargs):
        positional = zip(names[: len(args)], args, strict=True)
        args = [compiled_value(v, annotations.get(n, "")) for n, v in positional]
        kwargs = {k: compiled_value(v, annotations.get(k, "")) for k, v in kwargs.items()}
        return run(*args, **kwargs)

    monkeypatch.setattr(kernel, "run", typed_run)


def launched_kernels() -> dict[str, object]:
    """Every ``*_kernel`` of :mod:`cofrgenet.ops.triton`, by name (``aot`` re-exports)."""
    found = {}
    for info in pkgutil.iter_modules(kernels_package.__path__):
        if info.name == "aot":  # compiles kernels, defines none; imports the compiler
            continue
        module = importlib.import_module(f"{kernels_package.__name__}.{info.name}")
        for name, value in vars(module).items():
            if name.endswith("_kernel") and hasattr(value, "run"):
                found[name] = value
    return found


@triton.jit
def scalar_probe_kernel(out_ptr, value, VALUE: tl.constexpr):
    """out[0] = value, out[1] = VALUE, both added to float64 zeros (out: float64 (2,))."""
    offs = tl.arange(0, 1)
    zero = tl.zeros([1], tl.float64)
    tl.store(out_ptr + offs, zero + value)
    tl.store(out_ptr + 1 + offs, zero + VALUE)
