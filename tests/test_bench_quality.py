"""`cofr bench quality`: variants, the matched baseline, and a quick end-to-end run."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest
import torch

from cofrgenet import cli
from cofrgenet.bench.quality import (
    VARIANTS,
    QualityBenchConfig,
    RunResult,
    fit_arguments,
    matched_ffn_hidden,
    summarize,
    variant_model_config,
)
from cofrgenet.dataclass_options import add_dataclass_arguments, dataclass_from_args
from cofrgenet.models import ModelConfig, build_model
from cofrgenet.models.presets import preset_dict
from test_cli_errors import one_line_error


def n_params(fields: dict) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in build_model(ModelConfig.from_dict(fields)).parameters())


@pytest.mark.parametrize("shape", [{}, {"n_layer": 2, "n_embd": 32, "n_head": 2}])
def test_matched_baseline_has_cofrgenet_f_parameter_count(shape):
    fields = {"vocab_size": 2048, "block_size": 128, **shape}
    hidden = matched_ffn_hidden(fields)
    f_count = n_params({**preset_dict("gpt2-mini-f"), **fields})
    matched = n_params({**preset_dict("gpt2-mini"), **fields, "ffn_hidden": hidden})
    full = n_params({**preset_dict("gpt2-mini"), **fields})
    assert matched < full
    per_unit = 2 * 2 * (fields.get("n_embd") or 128)  # one hidden unit more, every layer
    assert abs(matched - f_count) <= per_unit


def test_fit_arguments_are_a_cofr_fit_command_line():
    cfg = QualityBenchConfig(steps=7, n_embd=32, n_head=2, lr=3e-3)
    args = fit_arguments(cfg, VARIANTS["cofrgenet-a-u"], seed=3, name="x")
    assert args[:3] == ["fit", "--config", cfg.recipe]
    joined = " ".join(args)
    assert "--trainer.max_steps 7" in joined and "--seed_everything 3" in joined
    assert "--model.optimizer.lr 0.003" in joined
    model = json.loads(args[args.index("--model.config") + 1])
    assert model["attention"] == "cattn_u" and model["n_embd"] == 32
    assert model["vocab_size"] == 2048  # the recipe's own model.config is kept


def test_ladder_settings_go_to_the_ladder_variants_alone():
    """`--model-config '{"depth": 3}'` (or a recipe's ladder settings) went to the
    baselines too, where they change nothing, and each baseline's fit warned of them."""
    cfg = QualityBenchConfig(model_config='{"depth": 3}', n_layer=3)

    def model(variant: str) -> dict:
        args = fit_arguments(cfg, VARIANTS[variant], seed=0, name="x")
        return json.loads(args[args.index("--model.config") + 1])

    assert model("cofrgenet-f")["depth"] == 3 and model("cofrgenet-a-u")["depth"] == 3
    for baseline in ("gpt2", "gpt2-matched", "synthesizer-d"):
        assert "depth" not in model(baseline) and model(baseline)["n_layer"] == 3
    # The head count likewise goes to the variants whose attention splits into heads
    # (--quick's n_head: 2 made every cattn variant's fit warn that it changes nothing).
    from cofrgenet.training.model_options import settings_changing_nothing

    heads = QualityBenchConfig(n_head=2, n_embd=64)
    for name, variant in VARIANTS.items():
        config = variant_model_config(heads, variant)
        assert settings_changing_nothing({"preset": variant.preset, "config": config}) is None
        headless = name in ("cofrgenet-a", "cofrgenet-a-u", "cofrgenet")  # CAttnM, CAttnU
        assert ("n_head" not in config) == headless, name


def test_a_report_whose_model_config_set_the_shape_still_resumes():
    """Reports written before --model-config refused the shape fields hold them there:
    their --resume was refused with advice no option could follow. They move to their
    options, and such a report agrees with a command that gives them so."""
    from cofrgenet.bench.quality import config_of, finished_runs

    report = {"config": {"model_config": '{"n_layer": 3, "depth": 2}', "seeds": [0]}, "runs": []}
    cfg = config_of(report)
    assert (cfg.n_layer, json.loads(cfg.model_config)) == (3, {"depth": 2})
    assert (
        finished_runs(
            report, QualityBenchConfig(seeds=(0,), n_layer=3, model_config='{"depth": 2}')
        )
        == []
    )


def test_a_recipes_base_files_keep_their_model_config(tmp_path):
    """Only the recipe file's own model.config was read: a key set in one of its base:
    files was dropped from every run (a run's --model.config replaces the section)."""
    (tmp_path / "shape.yaml").write_text("model:\n  config:\n    n_layer: 3\n    vocab_size: 300\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("base: [shape.yaml]\nmodel:\n  config:\n    vocab_size: 512\n")
    args = fit_arguments(QualityBenchConfig(recipe=str(recipe)), VARIANTS["gpt2"], 0, "x")
    model = json.loads(args[args.index("--model.config") + 1])
    assert model["n_layer"] == 3 and model["vocab_size"] == 512  # the recipe's own wins


def test_config_errors_and_generated_options():
    with pytest.raises(ValueError, match="unknown variant"):
        QualityBenchConfig(variants=("gpt3",))
    with pytest.raises(ValueError, match="--dyadic must be one of"):
        QualityBenchConfig(dyadic="sometimes")
    parser = argparse.ArgumentParser()
    add_dataclass_arguments(parser, QualityBenchConfig)
    args = parser.parse_args(["--seeds", "4,5", "--variants", "gpt2", "--quick", "--steps", "3"])
    cfg = dataclass_from_args(QualityBenchConfig, args)
    assert cfg.seeds == (4, 5) and cfg.variants == ("gpt2",) and cfg.steps == 3
    assert cfg.n_embd == 32  # --quick fills what was not given
    assert "--no-quick" in parser.format_help() and "--runs-dir" in parser.format_help()
    # Like every bench: into runs/bench, not a checkout's tracked docs, unless asked.
    assert cfg.out_dir == "runs/bench" and QualityBenchConfig().out_dir == "runs/bench"
    assert QualityBenchConfig(out_dir="docs/benchmarks").out_dir == "docs/benchmarks"


RECIPE = Path(__file__).resolve().parents[1] / "conf" / "experiment" / "quality-cpu.yaml"


@pytest.mark.parametrize(
    "words, message",
    [
        (["--variants", "nope"], "--variants: unknown variant 'nope'; known: gpt2, "),
        (["--variants", "cofrgenet-ff"], "--variants: unknown variant 'cofrgenet-ff' (did you mean 'cofrgenet-f'?)"),
        (["--model-config", "{bad"], "--model-config '{bad' is not JSON (Expecting property name"),
        (["--model-config", "[1]"], "--model-config must be a JSON object"),
        (["--model-config", '{"depht": 3}'], "--model-config: unknown ModelConfig field 'depht' (did you mean 'depth'?)"),
        # Trained at the JSON's width while the report named --n-embd's.
        (["--n-embd", "32", "--model-config", '{"n_embd": 64}'], "--model-config sets n_embd, which --n-embd sets: give it as --n-embd 64"),
        (["--model-config", '{"block_size": 16}'], "--model-config sets block_size, which --block-size sets: give it as --block-size 16"),
        (["--dyadic", "papr"], "--dyadic must be one of none, paper, release, got 'papr' (did you"),
        (["--recipe", "nope.yaml"], "--recipe nope.yaml: no such file; give a cofr fit config (default: conf/experiment/quality-cpu.yaml)"),
        (["--recipe", "bad.yaml"], "--recipe bad.yaml, line 2, column 1: not valid YAML"),
        (["--recipe", "list.yaml"], "--recipe list.yaml: expected a cofr fit config"),
        (["--steps", "-5"], "--steps must be >= 1, got -5"),
        (["--lr", "0"], "--lr must be a finite number > 0, got 0.0"),
        (["--lr", "inf"], "--lr must be a finite number > 0, got inf"),  # was fit's own error
        (["--tag", "a b"], "--tag 'a b': it goes into the report's file name; use letters"),
        (["--out-dir", "bad.yaml/out"], "--out-dir bad.yaml/out: cannot make this folder: 'bad.yaml' is a file"),
        (["--seeds", "0,1,0"], "--seeds: 0 given twice; give each once"),
        # Refused by the first run's fit: a report begun, and a --resume that failed again.
        (["--n-head", "3"], "gpt2: model.config: n_embd (32) must be a multiple of n_head (3)"),
        (["--model-config", '{"ladders": 0}'], "gpt2: model.config: ladders must be a positive integer, got 0"),
        (["--variants", "gpt2,gpt2"], "--variants: gpt2 given twice; give each once"),
        (["--seeds", "-1"], "--seeds must be in [0, 4294967295], got -1"),
        (["--seeds", "0,4294967296"], "--seeds must be in [0, 4294967295], got 4294967296"),
        (["--runs-dir", "bad.yaml/runs"], "--runs-dir bad.yaml/runs: cannot make this folder: 'bad.yaml' is a file"),
        (["--recipe", str(RECIPE), "--data-dir", "data/nope"], "--data-dir data/nope: no prepared data there (no meta.json); make it with `cofr data prepare --out data/nope`"),
    ],
)  # fmt: skip
def test_bad_options_are_one_line_errors_before_the_data_is_made(
    tmp_path, monkeypatch, capsys, words, message
):
    import cofrgenet.bench.quality as quality

    def no_run(*args, **kwargs):
        raise AssertionError("a run started, or the data was made, before the check")

    monkeypatch.setattr(quality, "run_variant", no_run)
    monkeypatch.setattr("cofrgenet.data.prepare.prepare_data", no_run)
    monkeypatch.chdir(tmp_path)  # the default recipe and data folder are relative: not here
    (tmp_path / "bad.yaml").write_text("model: [\n")
    (tmp_path / "list.yaml").write_text("- 1\n")
    assert cli.main(["bench", "quality", "--quick", *words]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"cofr bench quality: error: {message}"), err
    assert len(err.splitlines()) == 1 and not (tmp_path / "data").exists()
    if words[0] in ("--n-head", "--model-config") and "gpt2:" in message:
        assert not (tmp_path / "runs").exists()  # no report begun, no folder made
    # The default recipe is found from any folder (here too): no "run from the root".
    assert "repository root" not in err


@pytest.mark.parametrize(
    "model_config, fix",
    [(None, '{"vocab_size": 50257}'), ('{"ladders": 8}', '{"ladders": 8, "vocab_size": 50257}')],
)
def test_data_of_a_larger_vocabulary_names_this_commands_option(
    tmp_path, monkeypatch, capsys, model_config, fix
):
    """gpt2-tokenized data said "set model.config.vocab_size: 50257", cofr fit's key:
    here the fix is --model-config, before any run."""
    import types

    import cofrgenet.bench.quality as quality

    def no_run(*args, **kwargs):
        raise AssertionError("a run started before the check")

    monkeypatch.setattr(quality, "run_variant", no_run)
    gpt2_data = types.SimpleNamespace(vocab_size=50257)
    monkeypatch.setattr("cofrgenet.data.meta.read_meta", lambda data_dir: gpt2_data)
    data = tmp_path / "gpt2-data"
    data.mkdir()
    (data / "meta.json").write_text("{}")
    argv = ["bench", "quality", "--quick", "--recipe", str(RECIPE), "--data-dir", str(data)]
    argv += ["--variants", "gpt2,cofrgenet-f", "--out-dir", str(tmp_path / "out")]
    argv += ["--runs-dir", str(tmp_path / "runs")]
    argv += ["--model-config", model_config] if model_config else []
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"cofr bench quality: error: --data-dir {data}: its tokenizer has 50257 token ids but "
        f"gpt2's vocab_size is 2048: give --model-config '{fix}' (or more), or data prepared "
        "with the recipe's tokenizer"
    )


def _result(variant, seed, loss, spikes=0, steps=10, unclipped=None):
    return RunResult(variant, seed, 100, loss, unclipped, 1000.0, 2.0, spikes, steps,
                     not math.isfinite(loss), 1.0, "")  # fmt: skip


def test_summary_rows():
    results = [
        _result("gpt2", 0, 5.0), _result("gpt2", 1, 5.2),
        _result("gpt2-matched", 0, 5.3), _result("gpt2-matched", 1, 5.3),
        _result("cofrgenet-f", 0, 4.9, spikes=1, steps=30, unclipped=4.95),
        _result("cofrgenet-f", 1, math.nan, steps=30),
    ]  # fmt: skip
    rows = {r.variant: r for r in summarize(results)}
    assert rows["gpt2"].val_mean == pytest.approx(5.1) and rows["gpt2"].val_std > 0
    f = rows["cofrgenet-f"]
    assert f.val_mean == pytest.approx(4.9) and f.nonfinite == 1
    # Over the seeds both finished (seed 0): gpt2's mean of both seeds, 5.1, gave -0.2.
    assert f.delta_gpt2 == pytest.approx(-0.1) and f.delta_matched == pytest.approx(-0.4)
    # A spike needs 20 norms before it: 1 of the 2 x 10 steps that could be one.
    assert f.clip_effect == pytest.approx(-0.05) and f.spike_share == pytest.approx(0.05)
    assert rows["gpt2"].spike_share is None  # 10 steps: none could (it read 0.0%)
    # One finished seed has no spread: not "± 0.0000".
    from cofrgenet.bench.quality import table_rows

    cells = {row[0]: row[3] for row in table_rows(list(rows.values()))}
    assert cells["cofrgenet-f"] == "4.9000 (one seed)" and f.val_std is None
    assert cells["gpt2"].startswith("5.1000 ± 0.14")
    # A run too short to time, or stopped before its first step, measured no rate and no
    # norm: the others' median and largest stand (a NaN among them read nan, or not,
    # by the runs' order); none measured reads n/a.
    results[4].tokens_per_sec, results[5].max_grad_norm = math.nan, math.nan
    results[0].tokens_per_sec = results[1].tokens_per_sec = math.nan
    rows = {r.variant: r for r in summarize(results)}
    assert rows["cofrgenet-f"].tokens_per_sec == 1000.0
    assert rows["cofrgenet-f"].max_grad_norm == 2.0
    gpt2 = {row[0]: row for row in table_rows(list(rows.values()))}["gpt2"]
    assert (gpt2[7], gpt2[8]) == ("n/a", "n/a")


def test_the_report_names_each_variants_schedule_where_they_differ():
    from cofrgenet.bench.quality import trained_with

    plan = {"steps": 200, "batch_size": 16, "block_size": 128, "lr": 1e-3,
            "warmup_steps": 20, "min_lr_ratio": 0.1, "weight_decay": 0.1}  # fmt: skip
    same = [_result("gpt2", 0, 5.0), _result("cofrgenet-f", 0, 5.0), _result("x", 0, math.nan)]
    for result in same[:2]:
        result.schedule = dict(plan)
    assert trained_with(same) == (
        "200 steps of 16 x 128 tokens, lr 0.001 (warm-up 20, cosine to 0.1x), weight decay 0.1"
    )
    same[1].schedule["lr"] = 3e-4
    assert trained_with(same).startswith("gpt2: 200 steps") and "; cofrgenet-f: " in (
        trained_with(same)
    )
    assert "lr 0.0003" in trained_with(same) and trained_with([]) == ""


def test_quick_benchmark_end_to_end(tmp_path, monkeypatch):
    """Real `cofr fit` runs of three variants (a few steps each), report files written."""
    monkeypatch.chdir(tmp_path)  # the default data folder (made on first use) is relative
    from pathlib import Path

    import cofrgenet

    root = Path(cofrgenet.__file__).resolve().parents[2]
    out = tmp_path / "out"
    status = cli.main(
        ["bench", "quality", "--quick", "--seeds", "0", "--recipe",
         str(root / "conf/experiment/quality-cpu.yaml"),
         "--variants", "gpt2,cofrgenet-f,cofrgenet-f-ladders-off",
         "--runs-dir", str(tmp_path / "runs"),
         "--out-dir", str(out)]
    )  # fmt: skip
    assert status == 0
    (md,) = out.glob("quality-cpu-*-quick.md")
    report = json.loads(md.with_suffix(".json").read_text())
    assert "cofr bench quality --quick" in md.read_text()
    # What the runs trained with, as the fit resolved it (the recipe's lr, quick's warm-up).
    trained = "8 steps of 4 x 32 tokens, lr 0.001 (warm-up 2, cosine to 0.1x), weight decay 0.1"
    assert f"Trained with: {trained}." in md.read_text()
    runs = {r["variant"]: r for r in report["runs"]}
    assert set(runs) == {"gpt2", "cofrgenet-f", "cofrgenet-f-ladders-off"}
    # Where the recipe's trainer put the runs (it said "cpu" whatever the recipe).
    assert report["device"] == "cpu" and {r["device"] for r in runs.values()} == {"cpu"}
    for run in runs.values():
        assert math.isfinite(run["val_loss"]) and run["steps"] == 8 and not run["nonfinite"]
    assert runs["gpt2"]["val_loss_unclipped"] is None  # no ladders, nothing to clip
    assert runs["cofrgenet-f"]["val_loss_unclipped"] is not None
    # The clip effect's validation is the report's alone: MLflow keeps the run's own score.
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    (run_id,) = [r.info.run_id for e in client.search_experiments()
                 for r in client.search_runs([e.experiment_id])
                 if r.info.run_name.endswith("-cofrgenet-f-s0")]  # fmt: skip
    history = client.get_metric_history(run_id, "val/loss")
    assert [(m.step, round(m.value, 4)) for m in history] == [
        (8, round(runs["cofrgenet-f"]["val_loss"], 4))
    ]
    # ladders off: same parameter count, different training
    assert runs["cofrgenet-f"]["parameters"] == runs["cofrgenet-f-ladders-off"]["parameters"]
    assert runs["cofrgenet-f"]["val_loss"] != runs["cofrgenet-f-ladders-off"]["val_loss"]


def test_a_setting_the_data_refuses_leaves_no_partial_report(tmp_path, monkeypatch, capsys):
    """A block no document of the data fills: the fit's error, after a partial report
    "stopped by an error" and a --resume that would only meet it again."""
    from test_cli_errors import one_line_error

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    argv = ["bench", "quality", "--quick", "--seeds", "0", "--recipe", str(RECIPE),
            "--variants", "gpt2", "--block-size", "100000", "--runs-dir",
            str(tmp_path / "runs"), "--out-dir", str(out)]  # fmt: skip
    line = one_line_error(capsys, argv)
    assert "100001" in line and "--resume" not in line
    assert list(out.iterdir()) == []


def test_a_run_that_diverged_reports_what_it_trained(tmp_path, monkeypatch):
    """A run stopped by a NaN loss read 0 parameters and 0.0% spikes (defaults, never
    measured), had no "Trained with" line, and its NaNs made the JSON unreadable by
    strict parsers (bare NaN). What it trained is measured; the JSON holds null."""
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    argv = ["bench", "quality", "--quick", "--seeds", "0", "--recipe", str(RECIPE),
            "--variants", "gpt2", "--lr", "1e6", "--runs-dir", str(tmp_path / "runs"),
            "--out-dir", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    (js,) = out.glob("*.json")

    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    report = json.loads(js.read_text(), parse_constant=refuse)
    (run,) = report["runs"]
    assert run["nonfinite"] and run["val_loss"] is None
    assert run["parameters"] > 0 and run["schedule"]["steps"] == 8
    assert "Trained with: " in js.with_suffix(".md").read_text()


def test_a_ctrl_c_in_the_unclipped_validation_keeps_the_trained_run(tmp_path, monkeypatch, capsys):
    """After a ladder run's last step the bench validates it again without clipping: a
    Ctrl-C there ended the bench with status 1, "Stopped by an error (SystemExit: 1)",
    and the trained, scored run among those "not run" (a --resume trained it again).
    It goes into the report (without its clip effect), and the bench stops with 130."""
    import contextlib

    import cofrgenet.bench.quality as quality

    monkeypatch.chdir(tmp_path)

    @contextlib.contextmanager
    def interrupted(model):
        raise KeyboardInterrupt
        yield

    monkeypatch.setattr(quality, "clipping_disabled", interrupted)
    out = tmp_path / "out"
    argv = ["bench", "quality", "--quick", "--seeds", "0,1", "--recipe", str(RECIPE),
            "--variants", "cofrgenet-f", "--runs-dir", str(tmp_path / "runs"),
            "--out-dir", str(out)]  # fmt: skip
    assert cli.main(argv) == 130
    err = capsys.readouterr().err
    assert "stopped by Ctrl-C after the run of cofrgenet-f seed 0 had trained (" in err
    (js,) = out.glob("*.json")
    report = json.loads(js.read_text())
    (run,) = report["runs"]
    assert (run["seed"], run["val_loss_unclipped"]) == (0, None) and run["steps"] == 8
    assert report["pending"] == ["cofrgenet-f seed 1"] and report["stopped"] == "Ctrl-C"
    # The resumed bench's table says the clip effect is one seed's: it read as both's.
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    assert cli.main(["bench", "quality", "--resume", str(js)]) == 0
    markdown = js.with_suffix(".md").read_text()
    (row,) = [line for line in markdown.splitlines() if line.startswith("| cofrgenet-f ")]
    assert "(1 of 2 seeds) |" in row
    assert "No clip effect for cofrgenet-f seed 0: a stop came during the validation" in markdown


def test_the_report_before_the_first_run_is_named_by_where_the_runs_will_train(
    tmp_path, monkeypatch
):
    """The report is written before the first run now, before a run has said its
    device: it is named by the one the recipe's trainer will take (a GPU bench's was
    named quality-cpu-...)."""
    import torch

    import cofrgenet.bench.quality as quality

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(quality, "device_slug", lambda device: "nvidia-h200")
    assert quality.expected_device(QualityBenchConfig(recipe=str(RECIPE))) == "cpu"
    gpu = tmp_path / "gpu.yaml"
    gpu.write_text(f"base: [{RECIPE}]\ntrainer:\n  accelerator: auto\n")
    assert quality.expected_device(QualityBenchConfig(recipe=str(gpu))) == "nvidia-h200"


def _two_by_two_bench(tmp_path: Path) -> list[str]:
    """The words of a bench of gpt2 and cofrgenet-f, seeds 0 and 1, in ``tmp_path`` (its
    data folder a stand-in: the runs are faked)."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "meta.json").write_text("{}")
    return ["bench", "quality", "--quick", "--recipe", str(RECIPE), "--data-dir",
            str(tmp_path / "data"), "--variants", "gpt2,cofrgenet-f", "--seeds", "0,1",
            "--out-dir", str(tmp_path / "out"), "--runs-dir", str(tmp_path / "runs")]  # fmt: skip


def test_each_finished_run_is_in_a_partial_report(tmp_path, monkeypatch, capsys):
    """The report was written only once every run had finished: a Ctrl-C (or a failed
    run) hours in kept nothing of the finished runs but their MLflow records."""
    import cofrgenet.bench.quality as quality

    finished = []

    def fake_run(cfg, variant, seed, stamp, resume=False):
        if len(finished) == 2:
            raise KeyboardInterrupt
        finished.append(_result(variant.name, seed, 5.0))
        return finished[-1]

    monkeypatch.setattr(quality, "run_variant", fake_run)
    argv = _two_by_two_bench(tmp_path)
    assert cli.main(argv) == 130  # Ctrl-C's status
    (md,) = (tmp_path / "out").glob("*.md")
    text = md.read_text()
    assert (
        "**Stopped** by Ctrl-C: 2 runs finished; not run: gpt2 seed 1, cofrgenet-f seed 1. "
        "The command with `--resume` and this file trains those and completes it." in text
    )  # it said "The finished benchmark rewrites this file", which nothing would
    assert json.loads(md.with_suffix(".json").read_text())["partial"] is True
    assert f"stopped: the runs finished so far are in {md} (partial)" in capsys.readouterr().err
    # A run that finishes rewrites its own partial report, with nothing pending.
    finished.clear()
    monkeypatch.setattr(
        quality, "run_variant", lambda cfg, v, seed, stamp, resume=False: _result(v.name, seed, 5.0)
    )
    assert cli.main(argv) == 0
    (whole,) = set((tmp_path / "out").glob("*.md")) - {md}
    assert "Partial" not in whole.read_text() and "Stopped" in md.read_text()
    assert "partial" not in json.loads(whole.with_suffix(".json").read_text())


def test_a_stopped_bench_resumes_into_its_own_report(tmp_path, monkeypatch, capsys):
    """A stop hours in left a partial report that nothing completed: running the command
    again trained every run anew. `--resume REPORT` trains only the runs it lacks, with
    the bench's own settings, and completes that report."""
    import cofrgenet.bench.quality as quality

    trained = []

    def fake_run(cfg, variant, seed, stamp, resume=False):
        if len(trained) == 2 and not resuming:
            raise KeyboardInterrupt
        trained.append((variant.name, seed))
        return _result(variant.name, seed, 5.0 + seed)

    monkeypatch.setattr(quality, "run_variant", fake_run)
    argv = _two_by_two_bench(tmp_path)
    resuming = False
    assert cli.main(argv) == 130
    (md,) = (tmp_path / "out").glob("*.md")
    js = md.with_suffix(".json")
    err = capsys.readouterr().err
    assert "to train the rest into it: cofr bench quality --quick " in err
    assert f"--resume {js}\ncofr: interrupted" in err
    assert "The command with `--resume` and this file trains those" in md.read_text()

    # Other settings than the stopped bench's: refused, naming them and its command.
    line = one_line_error(capsys, [*argv, "--steps", "9", "--resume", str(js)])
    assert "--resume: that bench ran with other settings (steps: 8 there, 9 here)" in line
    resuming = True
    trained.clear()
    # The report alone (its .md names it too): its settings are the report's (the
    # options had to be typed again, every one of them).
    assert cli.main(["bench", "quality", "--resume", str(md)]) == 0
    assert trained == [("gpt2", 1), ("cofrgenet-f", 1)]
    assert list((tmp_path / "out").glob("*.md")) == [md]  # completed, not a second file
    report = json.loads(js.read_text())
    assert "partial" not in report and len(report["runs"]) == 4
    assert "Stopped" not in md.read_text() and "Partial" not in md.read_text()
    line = one_line_error(capsys, [*argv, "--resume", str(js)])
    assert line.endswith(f"--resume {js}: that bench finished; nothing is left to run")
    js.unlink()
    line = one_line_error(capsys, [*argv, "--resume", str(md)])
    assert line.endswith(f"no such report ({js.name}, the report's data beside it, is missing)")


def _simulated_lightning_stop(how: str):
    """A CofrCLI that ends as Lightning ends a fit a signal stopped."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    def stopped(*args, **kwargs):
        if how == "second Ctrl-C":  # Lightning's handler: sys.exit(1) from the interrupt
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt:
                raise SystemExit(1)  # noqa: B904 (Lightning's own way)
        if how == "Ctrl-C while starting":
            raise KeyboardInterrupt
        if how == "Ctrl-C":  # StopOnSignal saved the step, set the status
            raise SIGTERMException(130)
        if how == "SIGTERM":
            raise SIGTERMException(143)
        raise SystemExit(1)  # a failure, not a signal

    return stopped


@pytest.mark.parametrize(
    "how, status",
    [("second Ctrl-C", 130), ("Ctrl-C while starting", 130), ("Ctrl-C", 130), ("SIGTERM", 143)],
)
def test_a_signal_that_stops_a_run_ends_the_bench_with_its_status(
    tmp_path, monkeypatch, capsys, how, status
):
    """A second Ctrl-C reaches Lightning's handler, which exits 1: the bench ended with
    status 1 and only "stopped: ..." (`cofr fit` reads that as 130); and the fit's own
    "stopped by" lines are inside the bench's quiet output. The bench exits with the
    fit's status and names the run that was stopped."""
    import cofrgenet.bench.quality as quality
    import cofrgenet.training.cli as training_cli

    real_run = quality.run_variant

    def first_finishes(cfg, variant, seed, stamp, resume=False):
        if seed == 0:
            return _result(variant.name, seed, 5.0)
        return real_run(cfg, variant, seed, stamp, resume)

    monkeypatch.setattr(quality, "run_variant", first_finishes)
    monkeypatch.setattr(training_cli, "CofrCLI", _simulated_lightning_stop(how))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "meta.json").write_text("{}")
    argv = ["bench", "quality", "--quick", "--recipe", str(RECIPE), "--data-dir",
            str(tmp_path / "data"), "--variants", "gpt2", "--seeds", "0,1",
            "--out-dir", str(tmp_path / "out"), "--runs-dir", str(tmp_path / "runs")]  # fmt: skip
    if status == 130:
        assert cli.main(argv) == 130
    else:
        with pytest.raises(SystemExit) as done:
            cli.main(argv)
        assert done.value.code == status
    err = capsys.readouterr().err
    said = "Ctrl-C" if status == 130 else "SIGTERM"
    # Before its first step: its folder is gone, no checkpoint to go on from.
    assert f"stopped by {said} in the run of gpt2 seed 1 before its first step; --resume " in err
    (md,) = (tmp_path / "out").glob("*.md")
    assert f"stopped: the runs finished so far are in {md} (partial)" in err
    assert ("cofr: interrupted" in err) == (status == 130)
    # Not a signal's: the failure goes on as it is.
    monkeypatch.setattr(training_cli, "CofrCLI", _simulated_lightning_stop("failure"))
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 1


def _real_bench_with_a_signal(tmp_path, monkeypatch, seeds: str, **signal_at_step) -> list[str]:
    """``cofr bench quality``'s words for real gpt2 runs of ``seeds``, each fit given
    ``sweep_helpers.SignalAtStep(**signal_at_step)``."""
    import cofrgenet.bench.quality as quality

    monkeypatch.chdir(tmp_path)
    real_arguments = quality.fit_arguments
    options = [f"--trainer.callbacks.{key}={value}" for key, value in signal_at_step.items()]

    def with_the_signal(*args, **kwargs):
        callback = "--trainer.callbacks+=sweep_helpers.SignalAtStep"
        return [*real_arguments(*args, **kwargs), callback, *options]

    monkeypatch.setattr(quality, "fit_arguments", with_the_signal)
    return ["bench", "quality", "--quick", "--seeds", seeds, "--recipe", str(RECIPE),
            "--variants", "gpt2", "--runs-dir", str(tmp_path / "runs"),
            "--out-dir", str(tmp_path / "out")]  # fmt: skip


def test_a_second_ctrl_c_in_a_real_fit_ends_the_bench_with_130(tmp_path, monkeypatch, capsys):
    """The real thing: two Ctrl-Cs at step 2 of the bench's only run (Lightning exits 1)."""
    argv = _real_bench_with_a_signal(tmp_path, monkeypatch, "0", step=2, signum=2, times=2)
    assert cli.main(argv) == 130
    err = capsys.readouterr().err
    assert "stopped by Ctrl-C in the run of gpt2 seed 0 after step 2 (" in err
    # A report before the first run: its --resume goes on with that run (it said "no
    # report was written", and a rerun trained it anew under a new name).
    (md,) = (tmp_path / "out").glob("*.md")
    assert f"stopped: no run had finished; the runs to train are in {md} (partial); " in err
    assert "cofr: interrupted" in err
    monkeypatch.undo()  # no signal in the resumed run
    monkeypatch.chdir(tmp_path)
    assert cli.main(["bench", "quality", "--resume", str(md)]) == 0
    (run,) = json.loads(md.with_suffix(".json").read_text())["runs"]
    assert run["steps"] == 8 and len(list((tmp_path / "runs").glob("*/*-gpt2-s0"))) == 1


def test_a_resumed_bench_goes_on_from_its_stopped_runs_checkpoint(tmp_path, monkeypatch, capsys):
    """`--resume` trained the run a stop had cut short again from step 0 (a bench's runs
    can take hours), under a new name beside the stopped one's folder. It goes on from
    that run's checkpoint and ends where one go ends, its steps, spikes and largest
    gradient norm those of the whole run."""
    import cofrgenet.bench.quality as quality

    monkeypatch.chdir(tmp_path)
    real_arguments = quality.fit_arguments
    stop = [True]

    def sigterm_in_seed_1(cfg, variant, seed, name):
        words = real_arguments(cfg, variant, seed, name)
        if seed == 1 and stop[0]:
            words += ["--trainer.callbacks+=sweep_helpers.SignalAtStep",
                      "--trainer.callbacks.step=5", "--trainer.callbacks.signum=15"]  # fmt: skip
        return words

    monkeypatch.setattr(quality, "fit_arguments", sigterm_in_seed_1)

    def bench(seeds: str, out: str) -> list[str]:
        return ["bench", "quality", "--quick", "--seeds", seeds, "--recipe", str(RECIPE),
                "--variants", "gpt2", "--runs-dir", str(tmp_path / "runs"),
                "--out-dir", str(tmp_path / out)]  # fmt: skip

    with pytest.raises(SystemExit) as done:
        cli.main(bench("0,1", "out"))
    assert done.value.code == 143
    # The step SIGTERM landed in ends, and is saved (StopOnSignal).
    err = capsys.readouterr().err
    assert "in the run of gpt2 seed 1 after step 6 (" in err
    assert "-gpt2-s1): it is not in the report; --resume goes on with it from its " in err
    (js,) = (tmp_path / "out").glob("*.json")
    stop[0] = False
    assert cli.main([*bench("0,1", "out"), "--resume", str(js)]) == 0
    assert "gpt2 seed 1 (resumed at step 6): val loss" in capsys.readouterr().err
    report = json.loads(js.read_text())
    resumed = {r["seed"]: r for r in report["runs"]}[1]
    assert resumed["resumed_at"] == 6 and resumed["steps"] == 8
    assert "Resumed from their checkpoints after the stop: gpt2 seed 1 at step 6." in (
        js.with_suffix(".md").read_text()
    )
    assert len(list((tmp_path / "runs").glob("*/*-gpt2-s1"))) == 1  # the stopped one's
    assert cli.main(bench("1", "one-go")) == 0
    (one_go,) = json.loads(next((tmp_path / "one-go").glob("*.json")).read_text())["runs"]
    assert one_go["resumed_at"] == 0
    for key in ("val_loss", "max_grad_norm", "spikes", "steps", "parameters"):
        assert resumed[key] == one_go[key], key


@pytest.mark.parametrize(
    ("step", "during"),
    [(0, "end"), (8, "validation"), (7, "training")],
    ids=["final-save", "final-validation", "last-step"],
)
def test_a_signal_after_a_runs_last_step_keeps_it_and_stops_the_bench(
    tmp_path, monkeypatch, capsys, step, during
):
    """SIGTERM after the run's last step, as its final checkpoint is saved: the fit ends
    normally and keeps the signal for what runs it (StopOnSignal.late_signals), which the
    bench did not read: it went on to the next run, maybe hours long. The finished run
    goes into the report, and the bench stops with 143. So in the validation after the
    last step (the whole val split, much of a --quick run), which stopped the finished
    run there: KILLED, and "not in the report". So in the last step (8 of 8): stopped
    and saved at step 8 unscored, which --resume could not go on from (no step left)."""
    argv = _real_bench_with_a_signal(
        tmp_path, monkeypatch, "0,1", step=step, signum=15, during=during
    )
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 143
    err = capsys.readouterr().err
    assert "stopped by SIGTERM after the run of gpt2 seed 0 had trained (" in err
    (md,) = (tmp_path / "out").glob("*.md")
    assert "**Stopped** by SIGTERM: 1 runs finished; not run: gpt2 seed 1." in md.read_text()
    assert len(list((tmp_path / "runs").glob("*/*-gpt2-s*"))) == 1


def test_a_signal_after_the_last_run_leaves_a_complete_report(tmp_path, monkeypatch, capsys):
    """SIGTERM after the bench's last run had trained: the rewrite as "stopped" read the
    report's pending runs, which a complete one has not (KeyError, exit 1)."""
    argv = _real_bench_with_a_signal(tmp_path, monkeypatch, "0", step=0, signum=15, during="end")
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 143
    (md,) = (tmp_path / "out").glob("*.md")
    assert f"stopped after the last run: the report {md} is complete" in capsys.readouterr().err
    text = md.read_text()
    assert "Stopped" not in text and "Partial" not in text and "| gpt2 |" in text


def test_the_help_says_what_an_unset_field_means(capsys):
    """No "(default: None)": unset shape fields keep the recipe's, and a help that says
    its own default is not given a second one."""
    from cofrgenet.cli import main

    with pytest.raises(SystemExit) as done:
        main(["bench", "quality", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in text and ") (default:" not in text
    assert "optimizer steps per run (default: the recipe's)" in text
    assert "validation batches (default: the whole val split)" in text


def test_making_the_default_data_folder_is_said(tmp_path, monkeypatch, capsys):
    """Tens of seconds of tokenizing and BPE training passed in silence on first use."""
    from cofrgenet.bench.quality import ensure_data

    made = []
    monkeypatch.setattr("cofrgenet.data.prepare.prepare_data", lambda *a, **k: made.append(a))
    monkeypatch.chdir(tmp_path)
    ensure_data(QualityBenchConfig())
    assert made and capsys.readouterr().err == (
        "making data/pydoc-bpe-quality from the bundled pydoc text (BPE of 2048 ids, 15% "
        "held out): once, for every later run\n"
    )


def test_the_default_data_folder_must_hold_the_benchmarks_tokens(tmp_path, monkeypatch):
    """A folder made otherwise under the default name (a byte prepare, following a wrong
    hint) is refused, naming what differs, instead of being benchmarked silently; one
    made for the benchmark under another Python (pydoc's text records its version) is
    taken as it is."""
    import shutil

    from cofrgenet.bench.quality import ensure_data
    from cofrgenet.data import DataFolderError, PydocSource, prepare_data

    monkeypatch.chdir(tmp_path)
    cfg = QualityBenchConfig()
    prepare_data(PydocSource(), cfg.data_dir, tokenizer="byte", max_docs=20, num_workers=1)
    with pytest.raises(DataFolderError, match=r"other tokens than the benchmark's .*'byte'.*rm -r"):
        ensure_data(cfg)
    shutil.rmtree(cfg.data_dir)
    prepare_data(PydocSource(), cfg.data_dir, tokenizer="bpe", vocab_size=2048, val_fraction=0.15,
                 max_docs=20, num_workers=1)  # fmt: skip
    meta = Path(cfg.data_dir) / "meta.json"
    text = json.loads(meta.read_text())
    text["source_args"]["python"] = "3.0.1"
    meta.write_text(json.dumps(text))
    ensure_data(cfg)
    # One made before 2026-12-05 (every pydoc topic, nested ones too) is refused: its
    # held-out topics were partly training text.
    del text["source_args"]["topics"]
    meta.write_text(json.dumps(text))
    with pytest.raises(DataFolderError, match=r"'topics': 'nested ones too'.*rm -r"):
        ensure_data(cfg)
    # One made before 2026-12-06 (rng.choice: the last topics held out) is refused too.
    text["source_args"]["topics"] = "distinct"
    text["split_args"]["method"] = "random documents"
    meta.write_text(json.dumps(text))
    with pytest.raises(DataFolderError, match=r"'split': 'random documents'.*rm -r"):
        ensure_data(cfg)
    # The missing-folder hint makes the same folder.
    from cofrgenet.bench.quality import BENCH_DATA
    from cofrgenet.data.meta import prepare_command

    made_so = "--tokenizer {tokenizer} --vocab-size {vocab_size} --val-fraction {val_fraction}"
    assert made_so.format(**BENCH_DATA) in prepare_command(cfg.data_dir)


def test_a_difference_that_rounds_to_zero_is_shown_unsigned():
    from cofrgenet.bench.quality import _signed

    assert [_signed(v) for v in (-3e-6, 0.0, 2e-6, -0.00012, None)] == [
        "0.0000",
        "0.0000",
        "0.0000",
        "-0.0001",
        "",
    ]
