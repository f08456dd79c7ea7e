"""``cofr bench train`` and whole-model compilation of every variant."""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import time
import warnings
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from cofrgenet import cli
from cofrgenet.bench import train
from cofrgenet.bench.machine import machine_summary
from cofrgenet.bench.train import (
    VARIANTS,
    TrainBenchConfig,
    round_ratios,
    run_benchmark,
    to_markdown,
)
from cofrgenet.models import ModelConfig, build_model

TINY = {"n_layer": 1, "n_embd": 32, "n_head": 2, "block_size": 16, "vocab_size": 64}


def test_bench_train_measures_speed_memory_and_generation(tmp_path):
    cfg = TrainBenchConfig(
        variants=("gpt2", "cofrgenet-f", "lstm"),
        modes=("eager", "recompute"),
        batch_size=2,
        steps=2,
        rounds=2,
        warmup=1,
        gen_tokens=3,
        out_dir=str(tmp_path),
        **TINY,
    )
    report = run_benchmark(cfg, "cofr bench train (test)")
    # Activation checkpointing: the transformers only (lstm has no blocks), timed in the
    # eager rounds, keeping a fraction of eager's activations.
    recomputed = {r["variant"]: r for r in report["results"] if r["mode"] == "recompute"}
    results = {r["variant"]: r for r in report["results"] if r["mode"] == "eager"}
    assert set(recomputed) == {"gpt2", "cofrgenet-f"}
    partial = {**report, "partial": True, "results": report["results"][:3]}
    assert "3 of 5 variant/mode pairs timed so far" in to_markdown(partial)  # not "of 6"
    for variant, r in recomputed.items():
        eager = results[variant]
        assert r["round_ids"] == eager["round_ids"] and r["gen_cached_tokens_per_s"] is None
        assert r["activation_bytes_per_token"] < eager["activation_bytes_per_token"] / 2
        assert r["peak_memory_bytes"] > 0
    line = next(x for x in to_markdown(report).splitlines() if x.startswith("Recompute"))
    # Ratios of timings on a shared machine: any number of digits (a round saw 29.40x).
    assert re.search(r"gpt2 \d+\.\d\dx \[.*\] tokens/s, 0\.\d\dx activations, \d", line)
    assert set(results) == {"gpt2", "cofrgenet-f", "lstm"} and report["peak_flops"] > 0
    for r in results.values():
        assert len(r["step_ms"]) == 4 and r["tokens_per_s"] > 0
        assert r["activation_bytes_per_token"] > 0 and r["peak_memory_bytes"] > 0
        assert r["gen_cached_tokens_per_s"] > 0 and r["latency_recompute_ms"] > 0
    # CoFrGeNet-F's FFN is cheaper than the MLP it replaces: fewer FLOPs per token.
    assert results["cofrgenet-f"]["flops_per_token"] < results["gpt2"]["flops_per_token"]
    text = to_markdown(report)
    assert "| cofrgenet-f | eager |" in text and "peak memory above the model <= gpt2's" in text
    # The column is the growth above the built model, which it now says (not "training peak").
    assert "| peak MB above the model |\n" in text
    assert "Peak MB above the model: how far memory rose above the built model over three " in text
    assert "activations; the rise of a fresh process's peak resident size)." in text
    ratio = r"\d+\.\d{3}x \[\d+\.\d{3}-\d+\.\d{3}\]"
    assert re.search(rf"\(eager\) >= 0\.9 x their FLOPs ratio: per round {ratio} vs", text)
    # Two profiled steps each: host dispatches and the costliest operators (no kernels on
    # a CPU). The p-variate ladder is one of cofrgenet-f's dispatches, not gpt2's.
    for r in results.values():
        assert r["profile"]["steps"] == 2 and r["profile"]["dispatches"] > 10
        assert r["profile"]["kernels"] is None and r["profile"]["host_top"]
    assert "| variant | mode | step ms | host dispatches/step |\n" in text
    assert ", float32, seed 0; median of the timed steps" in text  # only the JSON had it
    assert "- cofrgenet-f eager: `" in text and "kernels' share" not in text


def test_round_ratio_is_the_median_of_per_round_ratios():
    from cofrgenet.bench.train import round_ratio

    report = {"config": {"steps": 2}}
    slow = {"step_ms": [10.0, 10.0, 10.0, 30.0, 10.0, 10.0]}  # round medians 10, 20, 10
    fast = {"step_ms": [5.0, 5.0, 10.0, 10.0, 4.0, 6.0]}  # round medians 5, 10, 5
    assert round_ratio(report, fast, slow) == "2.00x [2.00-2.00]"
    assert round_ratio(report, slow, fast) == "0.50x [0.50-0.50]"
    uneven = {"step_ms": [5.0, 5.0, 20.0, 20.0, 2.5, 2.5]}  # 5, 20, 2.5
    assert round_ratio(report, uneven, slow) == "2.00x [1.00-4.00]"
    assert round_ratio(report, uneven, slow, 3) == "2.000x [1.000-4.000]"


def test_a_verdict_at_the_line_shows_why():
    """Compiled 0.2% slower than eager is MISSED, and the line says 0.998x, not 1.00x."""
    from cofrgenet.bench.train import targets

    report = {
        "config": {"steps": 1},
        "results": [
            {"variant": "gpt2", "mode": "eager", "step_ms": [100.0], "round_ids": [0],
             "tokens_per_s": 1000.0},
            {"variant": "gpt2", "mode": "compiled", "step_ms": [100.2], "round_ids": [0],
             "tokens_per_s": 998.0},
        ],
    }  # fmt: skip
    [line] = [x for x in targets(report) if "never slower" in x]
    assert "MISSED for gpt2" in line and "gpt2 0.998x [0.998-0.998]" in line


def test_a_verdict_that_one_slow_step_would_flip_is_undecided():
    """Two rounds, one with a slow step of the baseline: their median (the mean of two)
    said "met" beside an all-steps ratio of 0.23. Where the two readings disagree the
    verdict is undecided, and the targets say how to settle it."""
    from cofrgenet.bench.train import speed_verdict, targets

    report = {"config": {"steps": 1}}
    fast = {"step_ms": [2.0, 2.0], "round_ids": [0, 1], "tokens_per_s": 0.23}
    slow = {"step_ms": [0.2, 20.0], "round_ids": [0, 1], "tokens_per_s": 1.0}  # ratios 0.1, 10
    assert speed_verdict(report, fast, slow, 1.0) == "undecided"
    assert speed_verdict(report, fast, slow, 0.01) == "met"  # both readings above
    assert speed_verdict(report, fast, slow, 20.0) == "MISSED"  # both below
    report["results"] = [
        {**slow, "variant": "gpt2", "mode": "eager"},
        {**fast, "variant": "gpt2", "mode": "compiled"},
    ]
    said = targets(report)
    [line] = [x for x in said if "never slower" in x]
    assert "undecided for gpt2" in line
    assert said[-1].startswith("  (undecided: the per-round median and all steps' ratio")


def _compile_as_identity(monkeypatch, graph_breaks=lambda trainer: 0):
    """The run's compiled stages without a compiler (seconds, not minutes, on a CPU)."""
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: model)
    monkeypatch.setattr(train, "graph_breaks", graph_breaks)


def _pairs(report):
    return [(r["variant"], r["mode"]) for r in report["results"]]


def test_bench_train_reports_after_each_stage_with_ratios_from_shared_rounds(monkeypatch):
    _compile_as_identity(monkeypatch)
    cfg = TrainBenchConfig(
        variants=("cofrgenet-f", "gpt2"),  # gpt2 compiles first all the same: others need it
        batch_size=2,
        steps=1,
        rounds=2,
        warmup=1,
        memory=False,
        generation=False,
        **TINY,
    )
    snapshots = []
    report = run_benchmark(cfg, "test", on_update=lambda r: snapshots.append(copy.deepcopy(r)))
    f, g = ("cofrgenet-f", "eager"), ("gpt2", "eager")
    fc, gc = ("cofrgenet-f", "compiled"), ("gpt2", "compiled")
    # Eager first (every variant: no compile), then one compiled variant per stage, then
    # the whole report but for the graph breaks (counting them re-traces every model).
    assert [_pairs(s) for s in snapshots] == [[f, g], [f, g, gc], [f, fc, g, gc], [f, fc, g, gc]]
    # The last one too: a run cut short while it counts graph breaks has not counted them.
    assert all(s["partial"] for s in snapshots) and snapshots[-1]["graph_breaks_pending"]
    assert "partial" not in report
    assert _pairs(report) == [f, fc, g, gc]  # each variant's modes together, as given
    by = {(r["variant"], r["mode"]): r for r in report["results"]}
    # Each compiled variant was timed beside its eager self and gpt2 compiled.
    assert {k: r["round_ids"] for k, r in by.items()} == {
        f: [0, 1, 4, 5],
        g: [0, 1, 2, 3],
        gc: [2, 3, 4, 5],
        fc: [4, 5],
    }
    assert all(len(r["step_ms"]) == len(r["round_ids"]) for r in by.values())
    assert (
        len(round_ratios(report, by[fc], by[gc])) == len(round_ratios(report, by[fc], by[f])) == 2
    )
    assert len(round_ratios(report, by[f], by[g])) == 2
    # Graph breaks are counted last (explain drops every compiled graph).
    assert [r["graph_breaks"] for r in snapshots[-1]["results"]] == [None] * 4
    assert by[fc]["graph_breaks"] == by[gc]["graph_breaks"] == 0
    partial, final = to_markdown(snapshots[0]), to_markdown(report)
    assert "**Partial report**" in partial and "2 of 4 variant/mode pairs timed" in partial
    assert "Partial" not in final and "Compiled against eager" in final
    assert "cofrgenet-f / gpt2 tokens/s (compiled)" in final


def test_an_unfinished_report_names_the_stages_it_lacks(monkeypatch):
    """A report stopped after the timing said "2 of 2 pairs timed" and looked whole,
    with empty memory columns and a generation table of one row."""
    monkeypatch.setattr(train, "activation_bytes", lambda trainer: 1024)
    monkeypatch.setattr(train, "peak_step_memory", lambda cfg, variant, mode: 2**20)
    monkeypatch.setattr(train, "layer_activation_bytes", lambda cfg: {"mlp": 8})
    speeds = {"gen_cached_tokens_per_s": 2.0, "gen_recompute_tokens_per_s": 1.0,
              "latency_cached_ms": 1.0, "latency_recompute_ms": 2.0}  # fmt: skip
    monkeypatch.setattr(train, "generation_speed", lambda cfg, trainer: speeds)
    cfg = TrainBenchConfig(
        variants=("gpt2", "cofrgenet-f"), modes=("eager",), batch_size=1, steps=1, rounds=1,
        warmup=1, profile_steps=0, **TINY,
    )  # fmt: skip
    snapshots = []
    report = run_benchmark(cfg, "test", on_update=lambda r: snapshots.append(copy.deepcopy(r)))
    timed, gpt2_measured = snapshots[0], snapshots[1]
    assert "still to measure: the memory of gpt2 eager, cofrgenet-f eager; the generation " \
        "speed of gpt2 eager, cofrgenet-f eager; the layers' activation memory." in \
        to_markdown(timed)  # fmt: skip
    stopped = to_markdown({**gpt2_measured, "stopped": "Ctrl-C"})
    assert (
        "**Stopped** by Ctrl-C: 2 of 2 variant/mode pairs timed. This report holds what "
        "the run measured before it stopped; not measured: the memory of cofrgenet-f eager; "
        "the generation speed of cofrgenet-f eager; the layers' activation memory." in stopped
    )
    assert "not measured" not in to_markdown({**report, "stopped": "Ctrl-C"})
    assert "still to measure" not in to_markdown({**report, "partial": True})


def test_round_ratios_pair_the_rounds_two_variants_shared():
    report = {"config": {"steps": 1}}
    a = {"variant": "a", "step_ms": [10.0, 20.0, 40.0], "round_ids": [0, 1, 2]}
    b = {"variant": "b", "step_ms": [5.0, 4.0], "round_ids": [2, 5]}
    assert round_ratios(report, b, a) == [8.0]  # round 2 only: b 5 ms, a 40 ms
    with pytest.raises(ValueError, match="share no round"):
        round_ratios(report, {**a, "round_ids": [0, 1, 3]}, b)


def test_bench_train_cut_short_keeps_what_it_measured(monkeypatch, tmp_path, capsys):
    def killed(trainer):  # as if the wall-clock limit struck in the graph-break count
        raise KeyboardInterrupt

    _compile_as_identity(monkeypatch, graph_breaks=killed)
    argv = ["bench", "train", "--variants", "gpt2,cofrgenet-f", "--batch-size", "2"]
    argv += ["--steps", "1", "--rounds", "1", "--warmup", "1", "--no-memory", "--no-generation"]
    argv += [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
    assert cli.main([*argv, "--out-dir", str(tmp_path)]) == 130  # Ctrl-C's status
    [js] = tmp_path.glob("train-cpu-*.json")
    report = json.loads(js.read_text())  # whole, but for the graph breaks it was counting
    assert report["partial"] and len(report["results"]) == 4  # which it says
    assert all(r["tokens_per_s"] > 0 and r["graph_breaks"] is None for r in report["results"])
    md = js.with_suffix(".md").read_text()
    assert "Targets:" in md
    # It said "The finished run rewrites this file", and the console nothing of where it is.
    assert report["stopped"] == "Ctrl-C" and "rewrites this file" not in md
    assert "**Stopped** by Ctrl-C: 4 of 4 variant/mode pairs timed; graph breaks not " in md
    err = capsys.readouterr().err
    assert f"stopped: what was measured so far is in {js.with_suffix('.md')} (partial)\n" in err
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind

    monkeypatch.setattr(train, "graph_breaks", lambda trainer: 0)
    assert cli.main([*argv, "--out-dir", str(tmp_path)]) == 0
    # The next run of the day writes its own report: the first one is kept.
    second = js.with_name(js.stem + "-2.json")
    report = json.loads(second.read_text())
    assert "partial" not in report and len(report["results"]) == 4
    assert report["machine"] == machine_summary("cpu")  # the CPU model, not just "x86_64"
    assert "Partial" not in second.with_suffix(".md").read_text()
    assert report["results"][1]["graph_breaks"] == 0  # compiled gpt2's, counted this time
    assert json.loads(js.read_text())["results"][1]["graph_breaks"] is None


def test_sigterm_stops_bench_train_as_ctrl_c_does(monkeypatch, tmp_path, capsys):
    """SIGTERM (a wall-clock limit) killed the run where it was: its partial report kept
    saying the finished run would rewrite it. Each partial report's line is said once:
    the generation stage timed no new pair and repeated it."""

    def not_taken(signum, frame):  # the default action would end the tests
        raise AssertionError("SIGTERM was not taken over by the bench")

    def terminated(trainer):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends

    previous = signal.signal(signal.SIGTERM, not_taken)
    try:
        _compile_as_identity(monkeypatch, graph_breaks=terminated)
        argv = ["bench", "train", "--variants", "gpt2", "--batch-size", "1", "--steps", "1"]
        argv += ["--rounds", "1", "--warmup", "1", "--no-memory", "--gen-tokens", "1"]
        argv += ["--profile-steps", "0", "--out-dir", str(tmp_path)]
        argv += [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
        with pytest.raises(SystemExit) as stopped:
            cli.main(argv)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert stopped.value.code == 143
    [js] = tmp_path.glob("train-cpu-*.json")
    assert json.loads(js.read_text())["stopped"] == "SIGTERM"
    assert "**Stopped** by SIGTERM: 2 of 2" in js.with_suffix(".md").read_text()
    out = capsys.readouterr().out
    assert out.count(f"partial report, 1 of 2 timed: {js.with_suffix('.md')}") == 1


def test_llama3_keeps_grouped_query_attention_at_any_head_count():
    """--n-head 3 against llama3's 2 key/value heads made it plain multi-head attention,
    silently: the most key/value heads that divide the heads, named in the report."""
    from cofrgenet.bench.train import grouped_kv_heads, model_config

    assert model_config(TrainBenchConfig(**TINY), "llama3").n_kv_head == 2
    odd = TrainBenchConfig(**{**TINY, "n_embd": 48, "n_head": 3}, variants=("gpt2", "llama3"))
    assert model_config(odd, "llama3").n_kv_head == 1
    assert grouped_kv_heads(odd) == {"llama3": 1}
    six = TrainBenchConfig(**{**TINY, "n_embd": 48, "n_head": 6}, variants=("llama3",))
    assert grouped_kv_heads(six) == {"llama3": 2}


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "lstm"])
def test_every_transformer_variant_compiles_whole_without_graph_breaks(variant):
    from cofrgenet.bench.train import model_config

    config = model_config(TrainBenchConfig(**TINY), variant)
    model = build_model(config)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        explained = torch._dynamo.explain(model)(torch.randint(0, 64, (2, 16)))
    torch.compiler.reset()
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    # e.g. "Dynamo detected a call to a functools.lru_cache-wrapped function" (CAttnU's
    # triangle indices did until they became graph constants under compile)
    assert not [str(w.message) for w in caught if "Dynamo" in str(w.message)]


@pytest.mark.parametrize("attention", ["cattn_m", "cattn_u"])
def test_a_compiled_cofrgenet_trains_like_the_eager_one(attention):
    """Loss and every gradient of the whole model compiled (inductor), against eager:
    the Cffn ladders and each CAttn variant."""
    torch.manual_seed(0)
    config = ModelConfig.from_preset("gpt2-tiny-fa", **TINY, attention=attention)
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
    torch.compiler.reset()
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    for (name, p), q in zip(eager.named_parameters(), compiled.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_a_compile_that_fails_is_reported_and_the_run_goes_on(monkeypatch, tmp_path):
    """A cold compile that raises (a new GPU, a new inductor) costs its variant only: the
    others are timed, the report names the failure and the command exits 1."""

    def failing_for_cofrgenet(model, **kwargs):
        if not any("Cffn" in type(m).__name__ for m in model.modules()):
            return model

        def broken(*args, **kw):
            raise RuntimeError("inductor: no kernel for this\nsecond line")

        return broken

    monkeypatch.setattr(torch, "compile", failing_for_cofrgenet)
    monkeypatch.setattr(train, "graph_breaks", lambda trainer: 0)
    argv = ["bench", "train", "--variants", "gpt2,cofrgenet-f", "--batch-size", "2"]
    argv += ["--steps", "1", "--rounds", "1", "--warmup", "1", "--no-memory", "--no-generation"]
    argv += [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
    assert cli.main([*argv, "--out-dir", str(tmp_path)]) == 1
    [js] = tmp_path.glob("train-cpu-*.json")
    report = json.loads(js.read_text())
    assert "partial" not in report
    assert report["failed"] == {
        "cofrgenet-f compiled": "RuntimeError: inductor: no kernel for this"
    }
    assert _pairs(report) == [("gpt2", "eager"), ("gpt2", "compiled"), ("cofrgenet-f", "eager")]
    text = js.with_suffix(".md").read_text()
    assert "**cofrgenet-f compiled failed**, not timed: `RuntimeError: inductor" in text
    assert "cofrgenet-f / gpt2 tokens/s (eager)" in text
    assert "cofrgenet-f / gpt2 tokens/s (compiled)" not in text


def test_a_report_of_the_day_is_never_overwritten(monkeypatch, tmp_path, capsys):
    report = {"device": "NVIDIA H200", "date": "2026-12-02", "config": {"tag": None}}
    monkeypatch.setattr(train, "to_markdown", lambda report: "report\n")
    first = train.write_report(report, tmp_path)
    stem = "train-nvidia-h200-2026-12-02"
    assert [p.name for p in first] == [f"{stem}.md", f"{stem}.json"]
    (tmp_path / "train-nvidia-h200-2026-12-02-2.json").write_text("{}")  # an orphan counts
    second = train.write_report(report, tmp_path)
    assert second[0].name == "train-nvidia-h200-2026-12-02-3.md"
    # A run rewrites its own files (its partial reports) in place.
    assert train.write_report(report, tmp_path, second[0].with_suffix("")) == second
    tagged = train.write_report({**report, "config": {"tag": "x"}}, tmp_path)
    assert tagged[1].name == "train-nvidia-h200-2026-12-02-x.json"
    assert len(list(tmp_path.iterdir())) == 7


@pytest.mark.parametrize(
    "options, message",
    [
        (["--steps", "0"], "--steps must be >= 1, got 0"),
        (["--rounds", "0"], "--rounds must be >= 1, got 0"),
        (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
        (["--seed", "-1"], "--seed must be in [0, 4294967295], got -1"),
        (["--warmup", "-1"], "--warmup must be >= 0, got -1"),
        (["--profile-steps", "-1"], "--profile-steps must be >= 0, got -1"),
        (["--n-head", "3"], "--n-head 3 does not divide --n-embd 32"),
        (["--dtype", "foo"], "argument --dtype: invalid choice: 'foo'"),
        (["--device", "foo"], "--device: unknown device 'foo'"),
        (["--variants", "gpt2-nope"], "variant gpt2-nope: unknown preset 'gpt2-nope'"),
        (["--variants", "lstn"], "--variants: unknown variant 'lstn' (did you mean 'lstm'?)"),
        (["--modes", "eagre"], "--modes: unknown mode 'eagre' (did you mean 'eager'?)"),
        (
            ["--variants", "lstm", "--modes", "recompute"],
            "--modes recompute: none of --variants lstm has transformer blocks to recompute, "
            "so nothing would be timed; add eager or compiled to --modes, or a transformer",
        ),
        (
            ["--block-size", "2"],
            "--block-size 2: generation times a one-token step after a prefill, within a "
            "context of the block less one token; give --block-size 3 or more, or --no-generation",
        ),
        (
            ["--modes", "eager,compiled", "--warmup", "0"],
            "--warmup 0: compiled compiles the model in its first step, which would be timed; "
            "give --warmup 1 or more",
        ),
        (
            ["--modes", "eager,cudagraphs"],
            "--modes cudagraphs needs --device cuda (on cpu inductor runs no CUDA graphs); "
            "give --device cuda, or time --modes compiled here",
        ),
        (
            ["--modes", "cudagraphs", "--warmup", "1", "--device", "cuda"],
            "--warmup 1: cudagraphs records its graphs in the second step",
        ),
    ],
)
def test_bad_settings_are_one_line_before_any_work(monkeypatch, tmp_path, capsys, options, message):
    from test_cli_errors import one_line_error

    def no_work(*args, **kwargs):
        raise AssertionError("started the benchmark")

    monkeypatch.setattr(train, "peak_matmul_flops", no_work)
    argv = ["bench", "train", "--out-dir", str(tmp_path / "out")]
    argv += [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
    line = one_line_error(capsys, [*argv, *options])
    assert line.startswith(f"cofr bench train: error: {message}")
    assert not (tmp_path / "out").exists()


def test_quick_fills_the_options_not_given_and_tags_its_report():
    from cofrgenet import cli

    words = ["bench", "train", "--quick", "--n-embd", "64", "--tag", "mine", "--device", "auto"]
    cfg = train.config_from_args(cli.build_parser(words).parse_args(words))
    assert (cfg.n_layer, cfg.n_embd, cfg.modes, cfg.steps) == (1, 64, ("eager",), 2)
    assert cfg.tag == "quick-mine" and cfg.device in ("cpu", "cuda")
    again = ["bench", "train", "--quick", "--tag", "quick"]
    assert train.config_from_args(cli.build_parser(again).parse_args(again)).tag == "quick"
    plain = train.config_from_args(cli.build_parser(words).parse_args(["bench", "train"]))
    assert plain == replace(TrainBenchConfig(), device=plain.device) and plain.tag is None


def test_no_save_prints_the_table_and_writes_nothing(monkeypatch, tmp_path, capsys):
    """As `bench ops --no-save`; stopped, it prints what it had timed, marked stopped."""
    from cofrgenet import cli

    argv = ["bench", "train", "--quick", "--variants", "gpt2", "--no-memory", "--no-save"]
    argv += ["--out-dir", str(tmp_path / "out")]
    assert cli.main([*argv, "--no-generation"]) == 0
    out = capsys.readouterr().out
    assert "| gpt2 | eager |" in out and "Stopped" not in out
    assert not (tmp_path / "out").exists()

    def interrupted(cfg, trainer):
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "generation_speed", interrupted)
    assert cli.main(argv) == 130
    out = capsys.readouterr().out
    assert "| gpt2 | eager |" in out and "**Stopped** by Ctrl-C" in out
    assert not (tmp_path / "out").exists()


def test_only_the_compiled_modes_need_a_warm_up_step():
    """--warmup 0 timed the compilation as a compiled step (17 s, 7 tokens/s): refused
    with a compiled mode (see above), still fine without one."""
    train.check_settings(TrainBenchConfig(modes=("eager", "recompute"), warmup=0, **TINY))
    train.check_settings(TrainBenchConfig(modes=("eager", "compiled"), warmup=1, **TINY))


def test_an_out_dir_that_is_a_file_or_a_missing_gpu_is_one_line(monkeypatch, tmp_path, capsys):
    from test_cli_errors import one_line_error

    monkeypatch.setattr(train, "peak_matmul_flops", lambda cfg: 1 / 0)  # never reached
    afile = tmp_path / "afile"
    afile.write_text("mine")
    argv = ["bench", "train", *(f"--{k.replace('_', '-')}={v}" for k, v in TINY.items())]
    line = one_line_error(capsys, [*argv, "--out-dir", str(afile)])
    assert line == (
        f"cofr bench train: error: --out-dir {afile}: cannot make this folder: '{afile}' is a file"
    )
    assert afile.read_text() == "mine"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    line = one_line_error(capsys, [*argv, "--out-dir", str(tmp_path), "--device", "cuda"])
    assert "--device: device 'cuda': torch sees no cuda device on this machine" in line


def test_a_run_without_the_targets_pairs_says_so_under_its_heading():
    """--variants lstm,gpt2 --modes eager printed "Targets:" over nothing."""
    from cofrgenet.bench.train import targets

    timed = {"step_ms": [10.0], "round_ids": [0], "flops_per_token": 10, "tokens_per_s": 1.0}
    report = {
        "config": {"steps": 1},
        "results": [
            {"variant": v, "mode": "eager", **timed, "peak_memory_bytes": 1}
            for v in ("lstm", "gpt2")
        ],
    }
    assert targets(report) == [
        "Targets: none in this run (they compare cofrgenet-f with gpt2, both in --variants, "
        "and compiled with eager, both in --modes)"
    ]


def test_a_partial_report_with_one_peak_of_two_states_its_targets():
    """cofrgenet-f measured before gpt2 (--variants cofrgenet-f,gpt2): the partial report
    after its memory stage has its peak and not yet gpt2's, and crashed on it."""
    from cofrgenet.bench.train import targets

    timed = {"step_ms": [10.0], "round_ids": [0], "flops_per_token": 10, "tokens_per_s": 1.0}
    report = {
        "config": {"steps": 1},
        "results": [
            {"variant": "cofrgenet-f", "mode": "eager", **timed, "peak_memory_bytes": 2**20},
            {"variant": "gpt2", "mode": "eager", **timed, "peak_memory_bytes": None},
        ],
    }
    lines = targets(report)
    assert any("tokens/s (eager)" in line for line in lines)
    assert not any("peak memory" in line for line in lines)


def test_on_a_gpu_of_known_peak_the_issues_gpu_targets_and_the_usual_mfu_are_reported():
    """A synthetic H200 report: MFU against the data sheet beside the measured peak's, and
    the GPU targets (-f >= 1.2x gpt2 compiled, compiled >= 1.3x eager, gpt2 MFU >= 40%)."""
    from cofrgenet.bench.train import targets, to_markdown

    def result(variant, mode, ms, flops):
        return {
            "variant": variant, "mode": mode, "step_ms": [ms], "round_ids": [0],
            "flops_per_token": flops, "tokens_per_s": 8192 / (ms / 1e3), "params": 1,
            "graph_breaks": 0, "activation_bytes_per_token": None, "peak_memory_bytes": None,
            "gen_cached_tokens_per_s": None,
        }  # fmt: skip

    report = {
        "device": "NVIDIA H200", "date": "2026-12-03", "command": "c", "machine": "m",
        "minutes": 1.0, "peak_flops": 700e12, "datasheet_peak_flops": 989e12,
        "config": {"steps": 1, "rounds": 1, "n_layer": 12, "n_embd": 768, "n_head": 12,
                   "block_size": 1024, "vocab_size": 50257, "batch_size": 8,
                   "dtype": "bfloat16", "seed": 0, "variants": ["gpt2", "cofrgenet-f"],
                   "modes": ["eager", "compiled"]},
        "layer_activation_bytes_per_token": {},
        "results": [
            result("gpt2", "eager", 100.0, 6e9), result("gpt2", "compiled", 70.0, 6e9),
            result("cofrgenet-f", "eager", 90.0, 4e9), result("cofrgenet-f", "compiled", 60.0, 4e9),
        ],
    }  # fmt: skip
    lines = targets(report)
    assert "- GPU: cofrgenet-f / gpt2 tokens/s (compiled) >= 1.2: per round 1.167x" in "\n".join(
        lines
    )
    assert any(x.startswith("- GPU: cofrgenet-f / gpt2") and x.endswith("MISSED") for x in lines)
    assert any(x.startswith("- GPU: gpt2 compiled / eager") and x.endswith(": met") for x in lines)
    gpt2_mfu = 8192 / 0.07 * 6e9 / 989e12  # 71.0%
    assert f"- GPU: gpt2 MFU (compiled, data sheet) >= 40%: {gpt2_mfu:.1%}: met" in lines
    md = to_markdown(report)
    assert "the data sheet's dense peak (bfloat16): 989 TFLOP/s" in md
    assert f"| {gpt2_mfu:.1%} |" in md
    report["results"] += [
        result("gpt2", "cudagraphs", 50.0, 6e9), result("cofrgenet-f", "cudagraphs", 40.0, 4e9),
    ]  # fmt: skip
    lines = targets(report)
    assert any(x.startswith("- GPU: cofrgenet-f / gpt2 tokens/s (cudagraphs) >= 1.2: per round "
                            "1.250x") and x.endswith(": met") for x in lines)  # fmt: skip
    assert any(x.startswith("- GPU: gpt2 cudagraphs / eager tokens/s >= 1.3") for x in lines)
    assert any(x.startswith("- GPU: gpt2 MFU (cudagraphs, data sheet)") for x in lines)
    never_slower = next(x for x in lines if x.startswith("- compiled never slower"))
    assert "gpt2 1.429x" in never_slower and "gpt2 cudagraphs 2.000x" in never_slower
    assert "Cudagraphs against eager" in to_markdown(report)
    del report["datasheet_peak_flops"]  # a CPU, or a GPU the table does not know
    assert not any("GPU:" in x for x in targets(report))


def test_a_step_faster_than_the_measured_peak_gets_no_mfu(monkeypatch, tmp_path, capsys):
    """bf16 on a CPU without bf16 matmuls: the measured peak (0.7 GFLOP/s) was below what
    a step achieved, and the report read MFU 154.5%. Now the cell is marked and a note
    says why; the JSON keeps the figures; the run warns once about the dtype."""
    monkeypatch.setattr(train, "peak_matmul_flops", lambda cfg: 1e3)  # slower than any step
    argv = ["bench", "train", "--variants", "gpt2", "--modes", "eager", "--batch-size", "1"]
    argv += ["--steps", "1", "--rounds", "1", "--warmup", "0", "--no-memory", "--no-generation"]
    argv += ["--profile-steps", "0", "--dtype", "bfloat16", "--out-dir", str(tmp_path)]
    argv += [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert err.count("warning: --dtype bfloat16 on cpu: a CPU without native bfloat16") == 1
    [js] = tmp_path.glob("train-cpu-*.json")
    report = json.loads(js.read_text())
    assert report["peak_flops"] == 1e3 and report["results"][0]["tokens_per_s"] > 0
    md = js.with_suffix(".md").read_text()
    row = next(x for x in md.splitlines() if x.startswith("| gpt2 | eager |"))
    assert "| † |" in row and "%" not in row
    assert "† No MFU: gpt2 eager achieved more FLOP/s than the bfloat16 matmul peak" in md
    # A step under the peak keeps its MFU, and no note.
    report["peak_flops"] = 1e18
    md = to_markdown(report)
    assert "No MFU" not in md and "| 0.0% |" in md


def test_an_eager_run_says_nothing_of_graph_breaks(tmp_path, capsys):
    """`--modes eager` printed "report, graph breaks to count" (no compiled mode ran, so
    there were none to count) and its partial reports said they were counted at the end."""
    argv = ["bench", "train", "--variants", "gpt2", "--modes", "eager", "--batch-size", "1"]
    argv += ["--steps", "1", "--rounds", "1", "--warmup", "0", "--no-memory", "--no-generation"]
    argv += ["--profile-steps", "0", "--out-dir", str(tmp_path)]
    argv += [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "partial report, 1 of 1 timed: " in printed and "graph breaks to count" not in printed
    report = json.loads(next(tmp_path.glob("train-cpu-*.json")).read_text())
    partial = to_markdown({**report, "partial": True})
    assert "pairs timed so far. The finished run rewrites this file." in partial
    compiled = {**report, "config": {**report["config"], "modes": ["eager", "compiled"]}}
    assert "; graph breaks are counted at the end." in to_markdown({**compiled, "partial": True})


@pytest.mark.parametrize("load, busy", [(0.4, True), (0.02, False)])
def test_other_load_while_timing_is_reported_as_bench_ops_does(monkeypatch, load, busy):
    """A busy machine went unflagged here, while `cofr bench ops` flags it: the same
    BackgroundLoad and threshold now measure each stage of rounds, and the generations."""
    import cofrgenet.bench.timing as timing

    class Load:  # other processes used ``load`` of the CPU while the rounds ran
        fraction = None

        def __enter__(self):
            return self

        def __exit__(self, *exc_info):
            self.fraction = load

    monkeypatch.setattr(timing, "BackgroundLoad", Load)
    monkeypatch.setattr(train, "peak_matmul_flops", lambda cfg: 1e12)
    cfg = TrainBenchConfig(
        variants=("gpt2", "cofrgenet-f"), modes=("eager",), batch_size=1, steps=1, rounds=1,
        warmup=0, memory=False, gen_tokens=2, profile_steps=0, **TINY,
    )  # fmt: skip
    report = run_benchmark(cfg, "test")
    assert [r["background_load"] for r in report["results"]] == [load, load]
    assert [r["gen_background_load"] for r in report["results"]] == [load, load]
    md = to_markdown(report)
    other = (
        "- other load (the CPU share other processes used while steps were timed, from "
        f"/proc/stat): up to {load:.0%}; above 10% a figure is unreliable"
    )
    assert other in md
    warning = (
        "**Warning:** 2 of 2 variant/mode pairs were timed while other processes used more "
        "than 10% of the CPU (gpt2 eager, cofrgenet-f eager): their timings and ratios are "
        "unreliable; rerun them on a quiet machine."
    )
    assert (warning in md) == busy
    generations = (
        "**Warning:** 2 of 2 variants' generations were timed while other processes used "
        "more than 10% of the CPU (gpt2, cofrgenet-f)"
    )
    assert (generations in md) == busy
    # The verdicts from those figures say so too, as bench ops' do.
    [verdict] = [x for x in md.splitlines() if x.startswith("- cofrgenet-f / gpt2 tokens/s")]
    assert verdict.endswith(f", unreliable: other processes used {load:.0%} of the CPU") == busy


def test_a_profiled_gpu_step_shows_how_much_of_it_the_kernels_fill():
    """The kernels' own time over the median step: a host-bound variant reads low."""

    def result(variant, ms, kernel_ms):
        profile = {
            "steps": 2, "dispatches": 900.0, "kernels": 400.0, "kernel_ms": kernel_ms,
            "host_top": [["aten::mm", 1.5, 147.0]], "device_top": [["nvjet_gemm", 9.0, 99.0]],
        }  # fmt: skip
        return {"variant": variant, "mode": "compiled", "step_ms": [ms, ms], "profile": profile}

    lines = train._profile_lines(
        {"results": [result("gpt2", 25.0, 22.0), result("cofrgenet-f", 46.0, 21.5)]}
    )
    assert "| gpt2 | compiled | 25.00 | 900 | 400 | 22.00 | 88% |" in lines
    assert "| cofrgenet-f | compiled | 46.00 | 900 | 400 | 21.50 | 47% |" in lines
    assert "- gpt2 compiled: `nvjet_gemm` 9.00 (99x)" in lines
    assert "- gpt2 compiled: `aten::mm` 1.50 (147x)" in lines
    assert train._profile_lines({"results": [{**result("gpt2", 1.0, 1.0), "profile": None}]}) == []


@pytest.mark.parametrize(
    "args, message",
    [
        (["--variants", "gpt2,gpt2"], "--variants: 'gpt2' is given twice"),
        (["--modes", "eager,eager"], "--modes: 'eager' is given twice"),
        (["--tag", "a/b"], "--tag 'a/b': it goes into the report's file name"),
        (["--out-dir", "{file}/sub"], "--out-dir {file}/sub: cannot make this folder: "),
    ],
)
def test_bad_settings_fail_before_anything_is_measured(
    tmp_path, capsys, monkeypatch, args, message
):
    def measured(*args, **kwargs):
        raise AssertionError("measured before the settings were checked")

    monkeypatch.setattr(train, "run_benchmark", measured)
    blocker = tmp_path / "file"
    blocker.write_text("mine")
    args = [a.replace("{file}", str(blocker)) for a in args]
    # Each run's own --out-dir, unless the case gives one (the last one given wins).
    assert cli.main(["bench", "train", "--out-dir", str(tmp_path / "out"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message.replace("{file}", str(blocker)) in err and len(err.splitlines()) == 1
    assert blocker.read_text() == "mine"


def test_every_variant_of_the_quality_bench_can_be_timed():
    """A name means one model in both benches (synthesizer-d was 'unknown preset' here)."""
    from cofrgenet.bench import variants
    from cofrgenet.bench.train import check_settings

    check_settings(TrainBenchConfig(variants=tuple(variants.MODELS), **TINY))


def test_a_variant_that_cannot_train_here_is_reported_and_the_others_timed(monkeypatch):
    """float16 LSTMs have no CPU kernel: the eager warm-up failed with a traceback and
    no report; now the failure is in the report and the others are timed."""
    trainer = train.Trainer

    def fails_for_lstm(cfg, variant, mode):
        if variant == "lstm":
            raise RuntimeError("no float16 kernel\nmore detail")
        return trainer(cfg, variant, mode)

    monkeypatch.setattr(train, "Trainer", fails_for_lstm)
    _compile_as_identity(monkeypatch)
    cfg = TrainBenchConfig(
        variants=("gpt2", "lstm"), batch_size=2, steps=1, rounds=1, warmup=1,
        memory=False, generation=False, **TINY,
    )  # fmt: skip
    report = run_benchmark(cfg, "test")
    assert _pairs(report) == [("gpt2", "eager"), ("gpt2", "compiled")]
    assert report["failed"] == {
        "lstm eager": "RuntimeError: no float16 kernel",
        "lstm compiled": "RuntimeError: no float16 kernel",
    }


def test_generation_tokens_per_s_are_medians_of_interleaved_calls(monkeypatch):
    """One timed call each was the figure: a slow first call set it (14 ms against 0.1)."""
    from cofrgenet.bench import timing
    from cofrgenet.bench.train import GENERATION_REPEATS, Trainer, generation_speed

    calls = []
    real = timing.time_interleaved

    def recorded(fns, repeats, device):
        calls.append((sorted(fns), repeats))
        return real(fns, repeats, device)

    monkeypatch.setattr(timing, "time_interleaved", recorded)
    cfg = TrainBenchConfig(variants=("gpt2",), batch_size=1, gen_tokens=2, **TINY)
    speed = generation_speed(cfg, Trainer(cfg, "gpt2", "eager"))
    assert calls == [(["cached", "recomputed"], GENERATION_REPEATS)] and GENERATION_REPEATS >= 3
    assert speed["gen_cached_tokens_per_s"] > 0 and speed["gen_recompute_tokens_per_s"] > 0


def test_a_short_block_is_refused_for_generation_and_its_prompt_fits_it(monkeypatch):
    """--block-size 1 was timed, then crashed in generation (an empty context); --block-size
    4 generated after a prompt of 5 tokens, reported as "an 8-token prompt"."""
    from cofrgenet.errors import UserError

    short = {**TINY, "block_size": 1}
    with pytest.raises(UserError, match="--block-size 1: generation times a one-token step"):
        train.check_settings(TrainBenchConfig(variants=("lstm",), modes=("eager",), **short))
    # Without generation (or its eager mode) a one-token block trains and is timed.
    train.check_settings(TrainBenchConfig(variants=("lstm",), generation=False, **short))
    train.check_settings(TrainBenchConfig(variants=("gpt2",), modes=("recompute",), **short))
    cfg = TrainBenchConfig(
        variants=("gpt2",), modes=("eager",), batch_size=1, steps=1, rounds=1, warmup=0,
        memory=False, profile_steps=0, gen_tokens=2, **{**TINY, "block_size": 4},
    )  # fmt: skip
    prompts = []
    generate = train.Trainer.__init__

    def recording(self, *args):
        generate(self, *args)
        real = self.model.generate
        self.model.generate = lambda idx, *a, **k: (
            prompts.append(idx.shape[1]) or real(idx, *a, **k)
        )

    monkeypatch.setattr(train.Trainer, "__init__", recording)
    report = run_benchmark(cfg, "test")
    assert set(prompts) == {4}
    assert (
        "Generation (2 tokens after a prompt of 4 tokens, each step past 4 tokens reading the "
        "last 4 again, batch 1, greedy; latency of one token after 3). Tokens/s are of whole "
    ) in to_markdown(report)
    wide = {**report, "config": {**report["config"], "block_size": 16}}
    assert "Generation (2 tokens after a prompt of 8 tokens, batch 1" in to_markdown(wide)


def test_compiled_only_says_that_memory_and_generation_go_unmeasured(monkeypatch, tmp_path, capsys):
    _compile_as_identity(monkeypatch)
    argv = ["bench", "train", "--variants", "gpt2", "--modes", "compiled", "--batch-size", "1"]
    argv += ["--steps", "1", "--rounds", "1", "--warmup", "1", "--out-dir", str(tmp_path)]
    argv += [f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]
    assert cli.main(argv) == 0
    err = capsys.readouterr().err
    assert "note: memory and generation measured on the uncompiled trainers only" in err
    recompute = TrainBenchConfig(variants=("gpt2", "lstm"), modes=("eager", "recompute"), **TINY)
    assert train.timed_keys(recompute) == [("gpt2", "eager"), ("gpt2", "recompute"),
                                           ("lstm", "eager")]  # fmt: skip


def test_compiled_variants_have_room_in_dynamo_s_cache(monkeypatch):
    """The variants' models share forward's code object: past dynamo's 8 cached graphs,
    the 9th compiled variant ran eager with a warning and was timed as compiled."""
    seen = {}

    def recording_run(cfg, command, on_update):
        config = torch.compiler.config
        seen.update(limit=config.recompile_limit, fail=config.fail_on_recompile_limit_hit)
        seen["graphs_or_error"] = torch._inductor.config.triton.cudagraph_or_error
        return {}

    monkeypatch.setattr(train, "_run_benchmark", recording_run)
    names = sorted(train.VARIANTS)[:3]
    train.run_benchmark(TrainBenchConfig(variants=tuple(names), **TINY), "test")
    # cudagraphs that inductor would skip are an error (recorded), not timed as cudagraphs
    assert seen == {"limit": max(8, 4 * len(names)), "fail": True, "graphs_or_error": True}
    many = TrainBenchConfig(variants=tuple(sorted(train.VARIANTS)), **TINY)
    train.run_benchmark(many, "test")
    assert seen["limit"] >= 4 * len(train.VARIANTS) > 8
    assert torch.compiler.config.recompile_limit == 8  # put back
    assert not torch._inductor.config.triton.cudagraph_or_error
    # cudagraphs is for a GPU: a cuda device, as if there were one (nothing runs on it).
    monkeypatch.setattr("cofrgenet.dataclass_options.device_problem", lambda device: None)
    both = TrainBenchConfig(
        variants=tuple(names), modes=("eager", "compiled", "cudagraphs"), device="cuda", **TINY
    )
    train.run_benchmark(both, "test")  # a graph per variant and compiled mode
    assert seen["limit"] == max(8, 4 * 2 * len(names))


def test_cudagraphs_mode_compiles_for_replay_and_marks_each_step(monkeypatch):
    """cudagraphs: torch.compile's reduce-overhead mode, a new CUDA-graph step marked
    before each training step; timed in its own stages beside eager and gpt2 alike."""
    modes, marks = [], []

    def fake_compile(model, mode=None):
        modes.append(mode)
        return model

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    cfg = TrainBenchConfig(variants=("gpt2",), batch_size=1, **TINY)
    for mode in ("compiled", "cudagraphs"):
        trainer = train.Trainer(cfg, "gpt2", mode)
        trainer.timed_steps(2)
    assert modes == [None, "reduce-overhead"] and len(marks) == 2
    cfg = TrainBenchConfig(
        variants=("cofrgenet-f", "gpt2"), modes=("eager", "compiled", "cudagraphs"), **TINY
    )
    assert train.compiled_stages(cfg) == [
        (("gpt2", "compiled"), (("gpt2", "eager"),)),
        (("cofrgenet-f", "compiled"), (("cofrgenet-f", "eager"), ("gpt2", "compiled"))),
        (("gpt2", "cudagraphs"), (("gpt2", "eager"),)),
        (("cofrgenet-f", "cudagraphs"), (("cofrgenet-f", "eager"), ("gpt2", "cudagraphs"))),
    ]


def test_graph_breaks_are_counted_once_a_variant_in_both_compiled_modes(monkeypatch):
    """The count re-traces the model, whatever its compile mode: once a variant."""
    counted = []
    monkeypatch.setattr(torch, "compile", lambda model, mode=None: model)
    monkeypatch.setattr(train, "graph_breaks", lambda trainer: counted.append(1) or 3)
    # cudagraphs is refused on a CPU; with torch.compile faked it only names the compile.
    monkeypatch.setattr(train, "check_settings", lambda cfg: None)
    cfg = TrainBenchConfig(
        variants=("gpt2",), modes=("compiled", "cudagraphs"), batch_size=1, steps=1,
        rounds=1, warmup=1, profile_steps=0, **TINY,
    )  # fmt: skip
    report = run_benchmark(cfg, "test")
    assert len(counted) == 1 and [r["graph_breaks"] for r in report["results"]] == [3, 3]


def test_activation_bytes_leave_out_autocasts_weight_copies():
    """Under bf16 autocast a matmul keeps a bf16 copy of its weight for backward: counted
    as an activation, it made a layer's bytes per token depend on the batch, and read a
    Cffn at 0.74x of the MLP it replaces where its activations are 0.78x."""
    layer = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
    x = torch.randn(8, 16, requires_grad=True)

    def forward():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return layer(x)

    # Kept: the bf16 input of each Linear and the GELU's input and output, 2 bytes each.
    assert train.saved_bytes(layer, forward) == 2 * (8 * 16 + 8 * 64 + 8 * 64)
    assert train.saved_bytes(layer, lambda: layer(x)) == 4 * (8 * 16 + 8 * 64 + 8 * 64)
