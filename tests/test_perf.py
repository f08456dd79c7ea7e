"""FLOPs and MFU: the analytic count against torch's FLOP counter, and the CPU peak."""

from __future__ import annotations

import re

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from cofrgenet.models import ModelConfig, build_model, estimate_flops_per_token
from cofrgenet.training.perf import device_peak_flops, measured_peak_flops, mfu

#: Every attention and FFN mixer, and the recurrent cells the counter can see. (It has no
#: formula for aten.lstm; LSTM shares its count with the GRU and RNN checked here.)
MODELS = {
    "gpt2": ("gpt2-tiny", {}),
    "llama3 (swiglu, gqa)": ("llama3-tiny", {}),
    "cffn": ("gpt2-tiny-f", {}),
    "cffn elementwise": ("gpt2-tiny-f", {"cffn_ladder": "elementwise"}),
    "cattn_m": ("gpt2-tiny-a", {}),
    "cattn_u": ("gpt2-tiny", {"attention": "cattn_u"}),
    "synthesizer": ("gpt2-tiny", {"attention": "synthesizer_dense"}),
    "sparse": ("gpt2-tiny", {"attention": "sparse_fixed"}),
    "gru": ("gru-tiny", {}),
    "rnn": ("rnn-tiny", {}),
}
LADDER_MIXERS = {"cffn", "cffn elementwise", "cattn_m", "cattn_u"}


@pytest.mark.parametrize("name", list(MODELS))
def test_analytic_flops_match_torchs_counter(name):
    preset, overrides = MODELS[name]
    # Width 128: the ladders' elementwise arithmetic, which the counter does not see, is
    # O(p) per token against O(p^2) of matmuls (6% of the count at width 64, 3% here).
    config = ModelConfig.from_preset(preset, block_size=64, n_embd=128, **overrides)
    model = build_model(config)
    idx = torch.randint(0, config.vocab_size, (2, 64))
    # The math backend runs attention as matmuls, which the counter sees (CPU's fused
    # kernel has no formula in it); the count is the same work.
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(idx)
    counted = counter.get_total_flops() / idx.numel()
    analytic = estimate_flops_per_token(config, seq_len=64).forward
    assert analytic == pytest.approx(counted, rel=0.05)
    if name in LADDER_MIXERS:
        # The counter sees matmuls only; the analytic count adds the ladders' own
        # arithmetic (continuants, partial denominators), so it is strictly larger.
        assert analytic > counted
    else:
        assert analytic == counted


def test_cpu_peak_is_measured_and_mfu_is_a_fraction():
    peak = measured_peak_flops()
    assert 1e8 < peak < 1e14
    assert device_peak_flops(torch.device("cpu"), "32-true") == peak
    assert mfu(1e6, 100.0, peak) == pytest.approx(1e8 / peak)
    assert mfu(1e6, 100.0, None) is None


def test_precision_kinds_of_lightning_flags_and_dtype_names():
    """`cofr bench train --dtype bfloat16` looks its data-sheet peak up by the dtype's name."""
    from cofrgenet.training.perf import precision_kind

    assert [precision_kind(p) for p in ("bf16-mixed", "bfloat16", "torch.bfloat16")] == ["bf16"] * 3
    assert [precision_kind(p) for p in ("16-mixed", "float16", 16)] == ["fp16"] * 3
    assert [precision_kind(p) for p in ("32-true", "float32", None)] == ["fp32"] * 3


def test_a_cpu_peak_beaten_by_a_step_is_measured_again(monkeypatch):
    """A peak measured while other processes held the cores made a demo's MFU read 113%:
    a step above 1 measures the peak again (at most every recheck_steps), keeping the
    better one; a peak that stays too low is flagged for a warning."""
    from cofrgenet.training import perf

    measured = iter([1e9, 4e9, 4e9])
    monkeypatch.setattr(perf, "matmul_peak_flops", lambda dtype: next(measured))
    monkeypatch.setattr(perf, "_MEASURED_PEAKS", {})
    peak = perf.RunPeak(torch.device("cpu"), "32-true", recheck_steps=10)
    assert peak.mfu(1e6, 500.0, 1, step=1) == pytest.approx(0.5)  # 5e8 of 1e9
    assert peak.mfu(1e6, 2000.0, 1, step=2) == pytest.approx(0.5)  # 2e9: measured again
    assert peak.flops == 4e9 and not peak.too_low
    assert peak.mfu(1e6, 8000.0, 1, step=5) == pytest.approx(2.0)  # not yet due
    assert peak.mfu(1e6, 8000.0, 1, step=12) == pytest.approx(2.0) and peak.too_low
    assert perf.measured_peak_flops(torch.float32) == 4e9  # the best kept, per process


def test_a_peak_given_in_the_environment_is_every_runs_denominator(monkeypatch):
    """Each cofr fit measured its own CPU peak, so two runs' MFUs did not compare (a
    demo read 38% and 90% for the slower and faster FLOP rate): $COFR_PEAK_FLOPS fixes
    it, is never measured again, and gives an unknown GPU one."""
    from cofrgenet.errors import ConfigError
    from cofrgenet.training import perf

    monkeypatch.setattr(perf, "matmul_peak_flops", lambda dtype: pytest.fail("measured"))
    monkeypatch.setenv("COFR_PEAK_FLOPS", "2e9")
    peak = perf.RunPeak(torch.device("cpu"), "32-true", recheck_steps=1)
    assert peak.mfu(1e6, 1000.0, 1, step=1) == pytest.approx(0.5)
    assert peak.mfu(1e6, 8000.0, 1, step=5) == pytest.approx(4.0)  # kept as given
    for bad in ("fast", "0", "-1e9", "inf"):
        monkeypatch.setenv("COFR_PEAK_FLOPS", bad)
        with pytest.raises(ConfigError, match=rf"COFR_PEAK_FLOPS='{re.escape(bad)}': give"):
            perf.RunPeak(torch.device("cpu"), "32-true")
    monkeypatch.setenv("COFR_PEAK_FLOPS", " ")
    assert perf.peak_flops_from_env() is None


def test_one_matmul_peak_for_the_fit_and_the_bench(monkeypatch):
    """``cofr fit``'s CPU MFU and ``cofr bench train`` measured their peak matmul with two
    copies of one loop: both read :func:`perf.matmul_peak_flops` now."""
    from cofrgenet.bench import train
    from cofrgenet.bench.train import TrainBenchConfig
    from cofrgenet.training import perf

    asked = []

    def peak(dtype, device=None, repeats=5):
        asked.append((dtype, device, repeats))
        return 7e9

    monkeypatch.setattr(perf, "matmul_peak_flops", peak)
    assert train.peak_matmul_flops(TrainBenchConfig(dtype="bfloat16")) == 7e9
    assert asked == [(torch.bfloat16, torch.device("cpu"), 6)]
    monkeypatch.setattr(perf, "_MEASURED_PEAKS", {})  # cofr fit's CPU peak: the same call
    assert perf.measured_peak_flops(torch.float32) == 7e9
    assert asked[-1] == (torch.float32, None, 5)
