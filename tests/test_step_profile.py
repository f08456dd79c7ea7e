"""``bench.step_profile``: what torch.profiler says a step did, per step."""

from __future__ import annotations

import pytest
import torch

from cofrgenet.bench.step_profile import profile_steps


def test_a_step_s_dispatches_and_costliest_operators_are_per_step():
    x = torch.randn(128, 128)

    def step():
        y = x @ x
        for _ in range(4):
            y = y + 1

    one, three = (profile_steps(step, n, torch.device("cpu"), top=3) for n in (1, 3))
    assert one.dispatches == three.dispatches >= 5  # a matmul and four adds, at least
    names = {name: calls for name, _, calls in three.host_top}
    assert names.get("aten::add") == 4.0  # calls a step, not in all
    assert len(three.host_top) == 3 and three.kernels is None and three.device_top == []
    ms = [ms for _, ms, _ in three.host_top]
    assert ms == sorted(ms, reverse=True)


def test_kineto_s_own_lines_leave_stderr_and_the_step_s_stay(capfd):
    """Kineto wrote "USDT:... profiler_start" lines to file descriptor 2 at each start
    and stop, into the bench's report; what the step writes there still comes out."""
    import os

    profile_steps(lambda: os.write(2, b"the step's own line\n"), 1, torch.device("cpu"))
    err = capfd.readouterr().err
    assert "the step's own line" in err
    assert "USDT:" not in err and "profiler_start" not in err


def test_at_least_one_step_is_profiled():
    with pytest.raises(ValueError, match="at least one step"):
        profile_steps(lambda: None, 0, torch.device("cpu"))


def test_on_a_gpu_kernels_are_counted_and_timed_and_annotations_are_not(monkeypatch):
    """What the profiler hands back on a GPU, faked: two steps' events."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    from cofrgenet.bench import step_profile

    def event(name, start, end, device=DeviceType.CPU, annotation=False):
        return FunctionEvent(
            id=0, name=name, thread=0, start_us=start, end_us=end, device_type=device,
            use_device="cuda", is_user_annotation=annotation,
        )  # fmt: skip

    cuda = DeviceType.CUDA
    events = [
        event("aten::mm", 0, 30), event("cudaLaunchKernel", 5, 25),
        event("gemm_kernel", 40, 140, cuda), event("gemm_kernel", 200, 300, cuda),
        event("triton_poi_fused", 300, 310, cuda),
        event("Optimizer.step#AdamW.step", 0, 500, cuda, annotation=True),
        event("cudaDeviceSynchronize", 30, 400),  # the host waiting: not among the costliest
    ]  # fmt: skip

    class FakeProfile:
        def __init__(self, activities):
            assert torch.profiler.ProfilerActivity.CUDA in activities

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def events(self):
            return events

    monkeypatch.setattr(torch.profiler, "profile", FakeProfile)
    monkeypatch.setattr(step_profile, "synchronize", lambda device: None)
    found = profile_steps(lambda: None, 2, torch.device("cuda"))
    assert found.dispatches == 0.5  # aten::mm once in two steps; the runtime call is none
    assert found.kernels == 1.5 and found.kernel_ms == 0.105  # (100 + 100 + 10) us / 2
    assert found.device_top == [("gemm_kernel", 0.1, 1.0), ("triton_poi_fused", 0.005, 0.5)]
    assert [name for name, _, _ in found.host_top] == ["aten::mm", "cudaLaunchKernel"]
