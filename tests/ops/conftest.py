"""Fixtures of the op suites: NaN-poisoned Triton outputs, and where each impl runs."""

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


@pytest.fixture
def on(impl, device) -> torch.device:
    """Where ``impl`` runs: triton on the ``device`` fixture's device (CUDA when present,
    else CPU under Triton's interpreter), every other implementation on CPU."""
    return device if impl == "triton" else torch.device("cpu")
