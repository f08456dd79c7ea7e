"""Shared test setup: Triton's interpreter on machines without a GPU, and the device.

``TRITON_INTERPRET=1`` must be set before ``triton`` is first imported (kernels are
bound to the interpreter when they are defined), so it is set here, at collection, when
no CUDA device is present. Importing torch does not import triton.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import tempfile

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# No test reaches the Hugging Face hub (evaluation sets come from local files).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# The CLI's cache (cofrgenet.cli_cache) of this test session, not the user's; removed
# at the session's end (xdist workers and subprocesses inherit the variable).
if "COFR_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="cofr-cli-cache-")
    os.environ["COFR_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)


@pytest.fixture
def device() -> torch.device:
    """The device the Triton tests run on: CUDA when present, else CPU (interpreter)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(autouse=True)
def compiled_means_compiled(request):
    """A test of the ``compiled`` implementation fails when the compiled continuant path
    fell back to eager: the fallback only warns, and every later "compiled" test of the
    session would then have tested the eager path."""
    yield
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("impl") == "compiled":
        from cofrgenet.ops import continuant

        assert continuant.compile_available(), "torch.compile of the continuant kernels failed"


@pytest.fixture(autouse=True)
def ctrl_c_not_left_ignored():
    """Lightning ignores SIGINT once a fit was interrupted, and a later in-process fit puts
    back the handler it found: an ignored SIGINT then outlived its test, and every later
    subprocess inherited it through exec (a prepare ignored the test's Ctrl-C)."""
    yield
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
