"""Fixtures of the op suites: NaN-poisoned Triton outputs, float arguments typed as on a
GPU, and where each impl runs."""

from __future__ import annotations

import pytest
import torch

from op_cases import HAS_TRITON


@pytest.fixture(autouse=True)
def poison_outputs(monkeypatch):
    """NaN in every fresh Triton output and partial-sum buffer: unwritten elements show."""
    if HAS_TRITON:
        from cofrgenet.ops.triton import runtime

        monkeypatch.setattr(runtime, "poison_outputs", True)


@pytest.fixture(autouse=True)
def compiled_float_arguments(monkeypatch):
    """Under the interpreter, kernels get float arguments as compiled Triton passes them
    (fp32 unless constexpr; see triton_typing.py): a GPU-only rounding fails on CPU."""
    if HAS_TRITON:
        from cofrgenet.ops.triton import runtime

        if runtime.interpreted():
            from triton_typing import launched_kernels, type_floats_as_compiled

            for kernel in launched_kernels().values():
                type_floats_as_compiled(kernel, monkeypatch)


@pytest.fixture
def on(impl, device) -> torch.device:
    """Where ``impl`` runs: triton on the ``device`` fixture's device (CUDA when present,
    else CPU under Triton's interpreter), every other implementation on CPU."""
    return device if impl == "triton" else torch.device("cpu")
