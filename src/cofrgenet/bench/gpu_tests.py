"""A pytest plugin of scripts/gpu_check.sh: run only the tests that use the GPU.

``pytest -p cofrgenet.bench.gpu_tests tests/ops`` keeps the tests that take the
``device`` fixture (tests/conftest.py: CUDA where there is one), and of the op suites'
tests parametrised by ``impl`` that run where the ``on`` fixture puts them
(tests/ops/conftest.py), only triton's: ``on`` runs every other implementation on the
CPU. The rest (CPU references, CPU inductor compiles) says nothing about the GPU and
costs the GPU check's few minutes; it is deselected, and pytest reports how many.
Chosen by fixture, not by name, so tests added to the suites are picked up as they are.
"""

from __future__ import annotations

from typing import Any


def runs_on_the_device(item: Any) -> bool:
    """Whether the test ``item`` runs on the ``device`` fixture's device."""
    names = getattr(item, "fixturenames", ())
    if "device" not in names:  # the closure: ``on`` requests ``device``
        return False
    callspec = getattr(item, "callspec", None)
    impl = callspec.params.get("impl") if callspec is not None else None
    return "on" not in names or impl is None or impl == "triton"


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """Deselect the tests that run on the CPU only."""
    keep = [item for item in items if runs_on_the_device(item)]
    dropped = [item for item in items if not runs_on_the_device(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
