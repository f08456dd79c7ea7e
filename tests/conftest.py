"""Shared test setup: Triton's interpreter on machines without a GPU, and the device.

``TRITON_INTERPRET=1`` must be set before ``triton`` is first imported (kernels are
bound to the interpreter when they are defined), so it is set here, at collection, when
no CUDA device is present. Importing torch does not import triton.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def device() -> torch.device:
    """The device the Triton tests run on: CUDA when present, else CPU (interpreter)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
