"""``cofr bench train`` and whole-model compilation of every variant."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from cofrgenet.bench.train import VARIANTS, TrainBenchConfig, run_benchmark, to_markdown
from cofrgenet.models import ModelConfig, build_model

TINY = {"n_layer": 1, "n_embd": 32, "n_head": 2, "block_size": 16, "vocab_size": 64}


def test_bench_train_measures_speed_memory_and_generation(tmp_path):
    cfg = TrainBenchConfig(
        variants=("gpt2", "cofrgenet-f", "lstm"),
        modes=("eager",),
        batch_size=2,
        steps=2,
        rounds=2,
        warmup=1,
        gen_tokens=3,
        out_dir=str(tmp_path),
        **TINY,
    )
    report = run_benchmark(cfg, "cofr bench train (test)")
    results = {r["variant"]: r for r in report["results"]}
    assert set(results) == {"gpt2", "cofrgenet-f", "lstm"} and report["peak_flops"] > 0
    for r in results.values():
        assert len(r["step_ms"]) == 4 and r["tokens_per_s"] > 0
        assert r["activation_bytes_per_token"] > 0 and r["peak_memory_bytes"] > 0
        assert r["gen_cached_tokens_per_s"] > 0 and r["latency_recompute_ms"] > 0
    # CoFrGeNet-F's FFN is cheaper than the MLP it replaces: fewer FLOPs per token.
    assert results["cofrgenet-f"]["flops_per_token"] < results["gpt2"]["flops_per_token"]
    text = to_markdown(report)
    assert "| cofrgenet-f | eager |" in text and "training peak <= gpt2's" in text
    ratio = r"\d+\.\d\dx \[\d+\.\d\d-\d+\.\d\d\]"
    assert re.search(rf"\(eager\) >= 0\.9 x their FLOPs ratio: per round {ratio} vs", text)


def test_round_ratio_is_the_median_of_per_round_ratios():
    from cofrgenet.bench.train import round_ratio

    report = {"config": {"steps": 2}}
    slow = {"step_ms": [10.0, 10.0, 10.0, 30.0, 10.0, 10.0]}  # round medians 10, 20, 10
    fast = {"step_ms": [5.0, 5.0, 10.0, 10.0, 4.0, 6.0]}  # round medians 5, 10, 5
    assert round_ratio(report, fast, slow) == "2.00x [2.00-2.00]"
    assert round_ratio(report, slow, fast) == "0.50x [0.50-0.50]"
    uneven = {"step_ms": [5.0, 5.0, 20.0, 20.0, 2.5, 2.5]}  # 5, 20, 2.5
    assert round_ratio(report, uneven, slow) == "2.00x [1.00-4.00]"


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "lstm"])
def test_every_transformer_variant_compiles_whole_without_graph_breaks(variant):
    from cofrgenet.bench.train import model_config

    config = model_config(TrainBenchConfig(**TINY), variant)
    model = build_model(config)
    explained = torch._dynamo.explain(model)(torch.randint(0, 64, (2, 16)))
    torch._dynamo.reset()
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def test_a_compiled_cofrgenet_trains_like_the_eager_one():
    torch.manual_seed(0)
    config = ModelConfig.from_preset("gpt2-tiny-fa", **TINY)
    eager = build_model(config)
    compiled = build_model(config)
    compiled.load_state_dict(eager.state_dict())
    # fullgraph: the ladders' custom ops are inside the graph, no silent fallback.
    step = torch.compile(compiled, fullgraph=True)
    batch = torch.randint(0, 64, (2, 17))
    losses = []
    for forward in (eager, step):
        logits = forward(batch[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        losses.append(loss.item())
    torch._dynamo.reset()
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    for (name, p), q in zip(eager.named_parameters(), compiled.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)
