"""What the op suites share: argument errors, the choice of implementation, ladder
health, positive denominators, the Triton runtime's checks, and the ops inside a layer
compiled whole."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from cofrgenet.errors import UserError
from cofrgenet.nn import Cffn
from cofrgenet.ops import (
    continued_fraction,
    denominator_stats,
    ladder_denominator_stats,
    positive_denominators,
    resolve_impl,
    univariate_ladder,
)
from cofrgenet.ops import custom_ops as ops
from cofrgenet.ops.reference import (
    reference_continued_fraction,
    reference_paper_grad,
    reference_positive_denominators,
    suffix_continuants,
)
from op_cases import HAS_TRITON, assert_same, away_from_poles, near_poles

needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="the triton package is not installed")

# ------------------------------------------------------------------------ bad input


def test_errors_name_the_problem():
    a = torch.rand(3, 4)
    with pytest.raises(ValueError, match="d >= 1"):
        continued_fraction(torch.rand(3, 0))
    with pytest.raises(TypeError, match="floating-point"):
        continued_fraction(torch.ones(3, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="eps"):
        continued_fraction(a, eps=0.0)
    with pytest.raises(ValueError, match="eps"):
        continued_fraction(a, eps=-1.0)
    with pytest.raises(ValueError, match="unknown impl 'fast'"):
        continued_fraction(a, impl="fast")
    with pytest.raises(ValueError, match="unknown grad mode 'true'"):
        continued_fraction(a, grad="true")
    x, w = torch.rand(2, 5), torch.rand(3, 5)
    with pytest.raises(ValueError, match="last dimension"):
        univariate_ladder(torch.rand(2, 4), w)
    with pytest.raises(ValueError, match="depth d >= 1"):
        univariate_ladder(x, torch.rand(0, 5))
    with pytest.raises(ValueError, match="bias must have"):
        univariate_ladder(x, w, torch.rand(3, 4))
    with pytest.raises(TypeError, match="floating-point"):
        univariate_ladder(x.long(), w)


@needs_triton
@pytest.mark.parametrize("impl", ["continuant", "compiled", "literal"])
@pytest.mark.parametrize("op", ["continued_fraction", "univariate_ladder", "pvariate_ladder"])
def test_a_second_derivative_through_a_fast_path_is_refused_not_zero(impl, op):
    """create_graph=True through a first-order backward gave a gradient without a graph:
    a gradient penalty through it came out 0, silently. The literal path differentiates
    twice; the fast paths' first derivatives are its."""
    import cofrgenet.ops as api

    torch.manual_seed(0)
    x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    weight = (0.5 * torch.randn(3, 4, dtype=torch.float64)).requires_grad_()

    def run(impl: str) -> torch.Tensor:
        if op == "continued_fraction":
            return api.continued_fraction(x.abs() + 1, impl=impl)
        if op == "univariate_ladder":
            return api.univariate_ladder(x, weight, floor=0.5, impl=impl)
        w = weight.unsqueeze(1).expand(3, 2, 4)  # (depth, L, p): two ladders
        return api.pvariate_ladder(x, w, floor=0.5, impl=impl)

    (literal,) = torch.autograd.grad(run("literal").sum(), x, create_graph=True)
    assert literal.requires_grad
    if impl == "literal":
        literal.pow(2).sum().backward()
        assert x.grad is not None and x.grad.abs().sum() > 0
        return
    (first,) = torch.autograd.grad(run(impl).sum(), x)  # first order: as before
    torch.testing.assert_close(first, literal.detach())
    with pytest.raises(RuntimeError, match=r"first-order only.*impl='literal'"):
        torch.autograd.grad(run(impl).sum(), x, create_graph=True)


def test_triton_on_a_cpu_tensor_without_the_interpreter_is_a_clear_error(monkeypatch):
    from cofrgenet.ops import triton as kernels
    from cofrgenet.ops.triton import runtime

    monkeypatch.setattr(runtime, "interpreted", lambda: False)
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        continued_fraction(torch.rand(4, 3), impl="triton")
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        univariate_ladder(torch.rand(4, 3), torch.rand(2, 3), impl="triton")
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        kernels.continued_fraction_fwd(torch.rand(4, 3), 0.01)


@needs_triton
@pytest.mark.parametrize("value", ["true", "on", "0", "false"])
def test_interpreted_is_tritons_own_knob(monkeypatch, value):
    """TRITON_INTERPRET is a boolean to Triton (``true`` interprets): the launchers and
    the ahead-of-time compiler's refusal read Triton's knob, not the string "1"."""
    import triton

    from cofrgenet.cli import main
    from cofrgenet.ops.triton import aot, runtime

    monkeypatch.setenv("TRITON_INTERPRET", value)
    expected = value in ("true", "on")
    assert triton.knobs.runtime.interpret is expected
    assert runtime.interpreted() is expected
    monkeypatch.setattr(aot, "compile_all", lambda *args: 0)  # no compiling here
    assert main(["bench", "kernels"]) == (2 if expected else 0)


def test_the_kernels_compile_only_for_a_real_architecture(capsys):
    """`cofr bench kernels --arch 10` aborted the process in LLVM (no shfl.sync there)
    after compiling nothing: refused first, naming what to give."""
    from cofrgenet.cli import main

    assert main(["bench", "kernels", "--arch", "10"]) == 2
    assert capsys.readouterr().err.strip() == (
        "cofr bench kernels: error: --arch 10: give a compute capability x 10 of 50 or "
        "more, e.g. 80 (A100) or 90 (H100/H200)"
    )


@needs_triton
def test_a_kernel_read_from_tritons_cache_is_not_said_to_compile(monkeypatch):
    """`cofr bench kernels` said "0.0 s" of each kernel a former run had compiled."""
    import triton

    from cofrgenet.ops.triton import aot

    spec = next(aot._cf_specs())
    monkeypatch.setattr(aot, "_cf_specs", lambda: iter([spec, spec]))
    monkeypatch.setattr(aot, "_ladder_specs", lambda: iter([]))
    compiled = []

    def compile_once(source, target, options):  # a miss fills the cache, a hit reads it
        listener = triton.knobs.compilation.listener
        listener(src=source, metadata={}, metadata_group={}, times=None, cache_hit=bool(compiled))
        compiled.append(source)
        return SimpleNamespace(asm={"cubin": b""})

    monkeypatch.setattr(triton, "compile", compile_once)
    lines: list[str] = []
    assert aot.compile_all(90, log=lines.append) == 2
    assert re.fullmatch(r"continued_fraction_\w+\(.*\): \d+\.\d s", lines[0]), lines
    assert lines[1].endswith("): from Triton's cache"), lines
    assert triton.knobs.compilation.listener is None  # put back


@pytest.mark.parametrize(
    "given,arch",
    [("90", 90), ("sm90", 90), ("sm_80", 80), ("compute_86", 86), ("9.0", 90), ("sm_90a", 90)],
)
def test_arch_takes_the_ways_nvcc_triton_and_nvidia_smi_write_it(given, arch):
    """`--arch sm90` (nvcc's and Triton's spelling) was refused as not an int."""
    from cofrgenet.bench.kernels import KernelsOptions
    from cofrgenet.cli import build_parser
    from cofrgenet.dataclass_options import dataclass_from_args

    words = ["bench", "kernels", "--arch", given]
    assert dataclass_from_args(KernelsOptions, build_parser(words).parse_args(words)).arch == arch


@pytest.mark.parametrize("given", ["hopper", "9.", "sm", "9.0.1", "90.0", "a", "9000"])
def test_an_arch_that_is_no_compute_capability_is_one_line(capsys, given):
    from cofrgenet.cli import main

    assert main(["bench", "kernels", "--arch", given]) == 2
    assert (
        f"error: argument --arch: expected a compute capability x 10 (90, sm90 or 9.0), got "
        f"{given!r}"
    ) in capsys.readouterr().err


@needs_triton
def test_poisoned_buffers_are_nan():
    """The premise of the suites' NaN poisoning (tests/ops/conftest.py)."""
    from cofrgenet.ops.triton import runtime

    out = runtime.new_output((3,), torch.float32, torch.device("cpu"))
    assert torch.isnan(out).all()


@needs_triton
def test_float_kernel_arguments_are_fp32_on_a_gpu(device, monkeypatch):
    """The premise of the suites' float typing (tests/ops/conftest.py): compiled Triton
    passes a runtime float as fp32, a constexpr exactly (checked on CUDA); under the
    interpreter, :func:`type_floats_as_compiled` does the same to every kernel."""
    from cofrgenet.ops.triton import runtime
    from triton_typing import launched_kernels, scalar_probe_kernel, type_floats_as_compiled

    assert set(launched_kernels()) == {
        "continued_fraction_fwd_kernel",
        "continued_fraction_bwd_kernel",
        "ladder_ensemble_fwd_kernel",
        "ladder_ensemble_bwd_kernel",
    }
    if runtime.interpreted():
        type_floats_as_compiled(scalar_probe_kernel, monkeypatch)
    out = torch.zeros(2, dtype=torch.float64, device=device)
    scalar_probe_kernel[(1,)](out, 0.01, VALUE=0.01)
    assert out.tolist() == [float(np.float32(0.01)), 0.01]


# ------------------------------------------------------- custom ops: fake against real


def _triton_op_case(name: str, device: torch.device):
    """(forward op, backward op, tensors, options, backward flag sets) of one case."""
    g = torch.Generator().manual_seed(0)

    def rand(*shape, dtype=torch.float32):
        return (torch.rand(*shape, generator=g, dtype=torch.float64) + 0.5).to(device, dtype)

    bias = "nobias" not in name
    ladder_options = (0.01, True, 0.5 if "floor" in name else 0.0)
    needs = [(True, True), (True, False), (False, True)]
    if name.startswith("cf_"):
        a = {
            "cf_contiguous": lambda: rand(3, 5, 4),
            "cf_depth_major": lambda: rand(4, 3, 5).permute(1, 2, 0),
            "cf_permuted": lambda: rand(6, 5, 7, 3).permute(1, 0, 2, 3),  # 3 stride groups
            "cf_gapped_channels_last": lambda: rand(2, 5, 8, 3).permute(0, 3, 1, 2)[..., ::2],
            "cf_float64": lambda: rand(7, 3, dtype=torch.float64),
            "cf_bf16": lambda: rand(7, 3, dtype=torch.bfloat16),
        }[name]()
        ops_pair = ops.continued_fraction_op, ops.continued_fraction_backward_op
        return (*ops_pair, [a], (0.01, True, "triton"), [()])
    if name.startswith("univariate"):
        x = rand(12, 2, 7).transpose(0, 2) if "transposed" in name else rand(2, 7, 12)
        tensors = [x, rand(3, 12), rand(3, 12) if bias else None]
        ops_pair = ops.univariate_ladder_op, ops.univariate_ladder_backward_op
        return (*ops_pair, tensors, (*ladder_options, "triton"), needs)
    if name.startswith("pvariate"):
        tensors = [rand(2, 7, 6), rand(3, 2, 6), rand(3, 2) if bias else None]
        ops_pair = ops.pvariate_ladder_op, ops.pvariate_ladder_backward_op
        return (*ops_pair, tensors, (*ladder_options, "triton"), needs)
    mix = rand(2, 12).t() if "transposed" in name else rand(12, 2)
    tensors = [rand(2, 7, 12), rand(3, 2, 12), rand(3, 2, 12) if bias else None, mix]
    ops_pair = ops.ladder_ensemble_op, ops.ladder_ensemble_backward_op
    return (*ops_pair, tensors, ladder_options, needs)


def _layout(t: torch.Tensor | None):
    return None if t is None else (tuple(t.shape), t.dtype, t.stride(), t.device.type)


@needs_triton
@pytest.mark.parametrize(
    "case",
    [
        "cf_contiguous",
        "cf_depth_major",
        "cf_permuted",
        "cf_gapped_channels_last",
        "cf_float64",
        "cf_bf16",
        "univariate",
        "univariate_transposed_nobias_floor",
        "pvariate",
        "pvariate_nobias_floor",
        "ensemble",
        "ensemble_transposed_nobias_floor",
    ],
)
def test_triton_ops_fake_layouts_are_the_real_ones(device, case):
    """Each triton custom op, forward and backward (every gradient subset), returns the
    shapes, dtypes and strides its fake implementation promises: inductor asserts them
    at run time (assert_size_stride), so a mismatch breaks compiled models on a GPU."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    op, backward_op, tensors, options, flag_sets = _triton_op_case(case, device)
    mode = FakeTensorMode()
    fake_tensors = [None if t is None else mode.from_tensor(t) for t in tensors]
    out = op(*tensors, *options)
    with mode:
        fake_out = op(*fake_tensors, *options)
    assert _layout(out) == _layout(fake_out)
    grad_out = torch.randn_like(out)
    fake_grad_out = mode.from_tensor(grad_out)
    for flags in flag_sets:
        grads = backward_op(*tensors, grad_out, *options, *flags)
        with mode:
            fake_grads = backward_op(*fake_tensors, fake_grad_out, *options, *flags)
        if isinstance(grads, torch.Tensor):
            grads, fake_grads = (grads,), (fake_grads,)
        assert [_layout(t) for t in grads] == [_layout(t) for t in fake_grads], flags


# ------------------------------------------------------------- choosing an implementation


def test_auto_picks_triton_on_cuda_compiles_large_cpu_inputs_and_honours_the_switch(
    monkeypatch,
):
    cpu = torch.device("cpu")
    assert resolve_impl("auto", 10, cpu) == "continuant"
    assert resolve_impl("auto", 1 << 20, cpu) == "compiled"
    assert resolve_impl("literal", 1 << 20, cpu) == "literal"
    assert resolve_impl("triton", 10, cpu) == "triton"
    if HAS_TRITON:
        assert resolve_impl("auto", 1 << 20, torch.device("cuda")) == "triton"
        assert resolve_impl("auto", 10, torch.device("cuda", 0)) == "triton"
    for off in ("0", "false", "no", "off"):  # COFRGENET_COMPILE=false compiled
        monkeypatch.setenv("COFRGENET_COMPILE", off)
        assert resolve_impl("auto", 1 << 20, cpu) == "continuant", off
    for on in ("1", "true", ""):
        monkeypatch.setenv("COFRGENET_COMPILE", on)
        assert resolve_impl("auto", 1 << 20, cpu) == "compiled", on
    monkeypatch.setenv("COFRGENET_COMPILE", "maybe")
    with pytest.raises(UserError, match=r"COFRGENET_COMPILE='maybe' is not a yes or no"):
        resolve_impl("auto", 1 << 20, cpu)


def test_only_a_failure_of_the_compiled_kernel_alone_turns_compiling_off(monkeypatch):
    """An error the eager kernel raises too (out of memory, a bad input) is the caller's
    and leaves compiling on; a compiler failure falls back for the rest of the process."""
    from cofrgenet.ops import continuant

    def broken_compile(fn):
        def run(*args):
            raise RuntimeError("inductor: no C compiler")

        return run

    def kernel(x, fail):
        if fail:
            raise MemoryError("out of memory")
        return x + 1

    monkeypatch.setattr(continuant, "_compiled", broken_compile)
    monkeypatch.setattr(continuant, "_compile_failed", False)
    with pytest.raises(MemoryError):
        continuant._run(kernel, True, 1, True)
    assert continuant.compile_available()
    with pytest.warns(RuntimeWarning, match="falling back to the eager continuant path"):
        assert continuant._run(kernel, True, 1, False) == 2
    assert not continuant.compile_available()


@needs_triton
def test_choosing_triton_for_cuda_traces_without_a_graph_break():
    """The CUDA branch of impl="auto" (checked on any machine: no tensor on the GPU)."""

    def fn(x):
        picked = resolve_impl("auto", 10, torch.device("cuda"))
        return x + (1.0 if picked == "triton" else 0.0)

    torch.compiler.reset()
    assert torch.compile(fn, backend="eager", fullgraph=True)(torch.zeros(1)).item() == 1.0


# --------------------------------------------------------------------------- health


def test_denominator_stats():
    eps = 0.01
    a = torch.cat([near_poles(10, 3, eps), away_from_poles(30, 3)])
    stats = denominator_stats(a, eps)
    true_kd = suffix_continuants(a)[-1].abs()
    assert stats.clamped.item() == pytest.approx(0.25)
    assert stats.near_pole.item() == pytest.approx((true_kd < 0.1).double().mean().item())
    assert stats.min_abs_kd.item() == pytest.approx(true_kd.min().item(), rel=1e-6)
    values = reference_continued_fraction(a, eps).abs()
    assert stats.max_abs_value.item() == pytest.approx(values.max().item(), rel=1e-6)
    x, w = torch.rand(4, 6) + 1, torch.rand(2, 6) + 1
    stats = ladder_denominator_stats(x, w, None, eps)
    assert stats.clamped.item() == 0.0 and stats.near_pole.item() == 0.0
    assert stats.min_abs_kd.item() > 1.0


# ---------------------------------------------------------------- positive denominators


def test_positive_denominators_reference_and_errors():
    u = torch.linspace(-40, 40, 101, dtype=torch.float64)
    a = positive_denominators(u, 0.5)
    # torch's softplus returns u itself above u = 20: 2e-9 away, relative 1e-10.
    assert torch.allclose(a, reference_positive_denominators(u, 0.5), rtol=1e-9, atol=0)
    assert a.min() >= 0.5 and a.dtype == torch.float64
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="floor must be None"):
            positive_denominators(u, bad)
        with pytest.raises(ValueError, match="floor must be None"):
            univariate_ladder(u[None, :3].float(), torch.ones(2, 3), floor=bad)


@pytest.mark.parametrize("floor", [0.1, 0.5, 1.0, 2.0])
def test_positive_denominators_have_no_poles(floor):
    """Any input, any weights: K_d >= min(1, floor), |f~| <= 1 / floor, and every
    |d f~ / d a_k| <= 1 / min(1, floor)^2 (the bounds docs/layers.md derives)."""
    g = torch.Generator().manual_seed(0)
    u = torch.randn(20000, 7, generator=g, dtype=torch.float64) * 10  # far outside any init
    a = positive_denominators(u, floor)
    stats = denominator_stats(a, eps=0.01)
    bound = min(1.0, floor)
    assert stats.clamped.item() == 0.0
    assert stats.min_abs_kd.item() >= bound * (1 - 1e-12)
    assert stats.max_abs_value.item() <= 1 / floor * (1 + 1e-12)
    grads = reference_paper_grad(a)
    assert grads.abs().max().item() <= 1 / bound**2 * (1 + 1e-12)


# ---------------------------------------------------------------- compiled as a layer


@pytest.mark.parametrize("ladder", ["scalar", "elementwise"])
def test_cffn_compiles_fullgraph_with_inductor(device, ladder):
    """A whole Cffn through inductor (C++ on CPU), default impl="auto", in one graph."""
    torch.manual_seed(0)
    layer = Cffn(16, 3, 4, ladder=ladder).to(device)
    x = torch.randn(2, 6, 16, device=device)

    def run(module):
        layer.zero_grad()
        xi = x.clone().requires_grad_()
        out = module(xi)
        out.square().sum().backward()
        return out.detach(), [xi.grad, *(p.grad.clone() for p in layer.parameters())]

    torch.compiler.reset()
    eager = run(layer)
    assert_same(eager, run(torch.compile(layer, fullgraph=True)), rtol=1e-5, atol=1e-6)


@needs_triton
@pytest.mark.slow
def test_kernels_compile_for_hopper_without_a_gpu():
    """Triton's compiler, not its interpreter: every kernel compiles to a cubin for sm_90,
    and the ladder kernels in fp32 compute (bf16/fp16/fp32 inputs) with the launcher's
    tiles spill no registers (at most a few bytes where x needs no gradient).

    The interpreter runs the Python source of a kernel directly, so a kernel can pass
    every suite and still fail to compile; this catches that on a CPU machine
    (2-10 minutes with a cold Triton cache: the unrolled backward kernels are large).
    """
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "cofrgenet", "bench", "kernels", "--arch", "90", "--ptxas-info"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "compiled" in proc.stdout and "sm_90" in proc.stdout
    ladders = [line for line in proc.stdout.splitlines() if line.startswith("ladder_")]
    fp32 = [line for line in ladders if "COMPUTE=fp32" in line]
    assert len(fp32) >= 10 and all(" B stack" in line for line in fp32), proc.stdout
    for line in fp32:
        stack = int(re.search(r"(\d+) B stack", line)[1])
        assert stack <= 16 if "NEED_X=False" in line else stack == 0, line
