"""``cofr fit`` end to end: configs, run folders, MLflow, resume, bad input."""

from __future__ import annotations

import copy
import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from unittest import mock

import mlflow
import pytest
import torch
import yaml

from cofrgenet.errors import ConfigError, UserError
from cofrgenet.models import ModelConfig
from cofrgenet.ops import triton_available
from cofrgenet.training.cli import CofrCLI, ParseOnlyCLI, RunExistsError
from cofrgenet.training.console import RunSummary

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
EXPERIMENTS = sorted((CONF / "experiment").glob("*.yaml"))
#: Experiment models bigger than this are scaled down (same mixers) for CPU smoke runs.
SMOKE_SHAPE = {
    "n_layer": 2,
    "n_embd": 32,
    "n_head": 2,
    "n_kv_head": 2,  # = n_head: plain multi-head (None would mean "the preset's")
    "block_size": 32,
    "vocab_size": 320,
}


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> Path:
    """A small byte-tokenized corpus made by the real prepare path."""
    from cofrgenet.data import prepare_data

    out = tmp_path_factory.mktemp("data") / "pydoc-byte"
    prepare_data(source="pydoc", tokenizer="byte", out=out, max_docs=12, num_workers=1)
    return out


def fit_args(tmp_path: Path, data: Path, *extra: str) -> list[str]:
    return [
        "fit",
        "--config",
        str(CONF / "trainer" / "cpu-debug.yaml"),
        "--model.preset",
        "gpt2-tiny-f",
        "--model.config",
        '{"vocab_size": 320, "block_size": 32}',
        "--data.data_dir",
        str(data),
        "--data.block_size",
        "32",
        "--data.batch_size",
        "4",
        "--data.num_workers",
        "0",
        "--run.runs_dir",
        str(tmp_path / "runs"),
        "--run.experiment",
        "test",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.enable_model_summary",
        "false",
        *extra,
    ]


def mlflow_runs(runs_dir: Path, experiment: str = "test"):
    mlflow.set_tracking_uri(f"sqlite:///{runs_dir / 'mlflow.db'}")
    return mlflow.search_runs(experiment_names=[experiment])


def test_every_conf_file_parses_against_the_code():
    """Every YAML under conf/ is valid for the CLI; every model section builds (meta)."""

    files = sorted(CONF.rglob("*.yaml"))
    assert len(files) >= 15  # trainer and data groups, experiments
    for path in files:
        parsed = ParseOnlyCLI(args=["fit", "--config", str(path)]).config["fit"]
        # Lightning counts val_check_interval in training batches, not optimizer steps:
        # a recipe that validates where it checkpoints multiplies by the accumulation.
        accumulate = parsed["trainer"]["accumulate_grad_batches"]
        interval = parsed["trainer"]["val_check_interval"]
        every = parsed["run"]["checkpoint_every_n_steps"]
        if isinstance(interval, int) and every and accumulate > 1:
            assert interval == every * accumulate, f"{path}: validates every {interval} batches"
        section = yaml.safe_load(path.read_text()).get("model")
        if section and "preset" in section:  # not a trainer file's `compile: true` alone
            config = ModelConfig.from_preset(section["preset"], **(section.get("config") or {}))
            with torch.device("meta"):
                from cofrgenet.models import build_model

                build_model(config)


@pytest.mark.parametrize("experiment", EXPERIMENTS, ids=lambda p: p.stem)
def test_experiment_configs_run(experiment, tiny_data, tmp_path):
    """fast_dev_run of each experiment's model (scaled down when large) on a tiny corpus."""
    config = yaml.safe_load(experiment.read_text())
    model = copy.deepcopy(config["model"])
    overrides = dict(model.get("config") or {})
    full = ModelConfig.from_preset(model["preset"], **overrides)
    if full.n_layer * full.n_embd**2 > 1e7:
        overrides.update(SMOKE_SHAPE)
    overrides.update(vocab_size=320, block_size=32)
    model.update(config=overrides, compile=False)
    config["base"] = [str(ROOT / b) for b in config.get("base") or []]
    config["model"] = model
    config["data"] = {
        "data_dir": str(tiny_data),
        "block_size": 32,
        "batch_size": 2,
        "num_workers": 0,
    }
    # The file stays a delta over its `base:` groups; these win over the GPU groups' values.
    config.setdefault("trainer", {}).update(
        fast_dev_run=2,
        accelerator="cpu",
        devices=1,
        num_nodes=1,
        strategy="auto",
        precision="32-true",
        enable_progress_bar=False,
    )
    config["run"] = {**config.get("run", {}), "runs_dir": str(tmp_path / "runs"), "name": "smoke"}
    path = tmp_path / experiment.name
    path.write_text(yaml.safe_dump(config))
    CofrCLI(args=["fit", "--config", str(path)])


def test_fit_resume_continues_exactly(tiny_data, tmp_path):
    """k steps, stop, resume to n == n uninterrupted steps, losses bit for bit, same MLflow run
    (with dropout: each batch's masks follow from the seed and the batch's place)."""
    n, k = 12, 5
    common = [
        "--model.config.dropout",
        "0.1",
        "--trainer.max_steps",
        str(n),
        "--trainer.log_every_n_steps",
        "1",
        "--trainer.val_check_interval",
        "100",
    ]
    CofrCLI(args=fit_args(tmp_path / "a", tiny_data, *common, "--run.name", "straight"))
    CofrCLI(
        args=fit_args(
            tmp_path / "b",
            tiny_data,
            *common,
            "--run.name",
            "interrupted",
            "--run.checkpoint_every_n_steps",
            str(k),
            "--trainer.callbacks+=helpers.StopAtStep",
            f"--trainer.callbacks.step={k}",
        )
    )
    run_dir = tmp_path / "b" / "runs" / "test" / "interrupted"
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == k
    with pytest.raises(FileExistsError, match="--ckpt_path last"):
        CofrCLI(args=fit_args(tmp_path / "b", tiny_data, *common, "--run.name", "interrupted"))
    CofrCLI(
        args=fit_args(
            tmp_path / "b", tiny_data, *common, "--run.name", "interrupted", "--ckpt_path", "last"
        )
    )

    histories = {}
    for label in ("a", "b"):
        runs = mlflow_runs(tmp_path / label / "runs")
        client = mlflow.tracking.MlflowClient(
            f"sqlite:///{tmp_path / label / 'runs' / 'mlflow.db'}"
        )
        assert len(runs) == 1, "a resumed run must write into the same MLflow run"
        history = client.get_metric_history(runs.run_id[0], "train/loss")
        histories[label] = {m.step: m.value for m in history}
    assert sorted(histories["b"]) == list(range(n)), "the resumed run skipped or replayed steps"
    assert histories["a"] == histories["b"]


def test_a_replayed_validation_is_not_logged_twice(tmp_path):
    """Killed after val/loss at step 20 but before train/loss of step 20: the resume from
    step 15 replayed val/loss at 20, which train/loss's history had not reached."""
    from mlflow.entities import Metric

    from cofrgenet.training.tracking import RUN_ID_FILE, CofrMLFlowLogger

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.tracking.MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    losses = [Metric("train/loss", 1.0, 0, step) for step in range(20)]
    client.log_batch(run_id, metrics=[*losses, Metric("val/loss", 2.0, 0, 20)])
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / RUN_ID_FILE).write_text(run_id + "\n")
    logger = CofrMLFlowLogger(run_dir=tmp_path / "run", experiment_name="e", tracking_uri=uri)
    logger.log_metrics({"train/loss": 1.0}, step=19)  # replayed
    logger.log_metrics({"val/loss": 2.0, "val/ppl": 7.4}, step=20)  # val/ppl: new at 20
    logger.log_metrics({"train/loss": 1.0}, step=20)
    logger.log_metrics({"val/loss": 2.0}, step=30)
    steps = {k: [m.step for m in client.get_metric_history(run_id, k)] for k in ("train/loss", "val/loss", "val/ppl")}  # fmt: skip
    assert steps == {"train/loss": [*range(20), 20], "val/loss": [20, 30], "val/ppl": [20]}


def test_a_validation_of_other_blocks_stays_off_the_runs_val_curve(tmp_path, tiny_data):
    """cofr validate on 1 process of a run that scored its val split on 2 warned "not
    comparable" and still logged val/loss at the run's step, as the run's latest score."""
    from types import SimpleNamespace

    from mlflow.entities import Metric

    from cofrgenet.data import TokenDataModule
    from cofrgenet.training.tracking import RUN_ID_FILE, CofrMLFlowLogger

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.tracking.MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    client.log_batch(run_id, metrics=[Metric("val/loss", 2.0, 0, 20)])
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / RUN_ID_FILE).write_text(run_id + "\n")
    logger = CofrMLFlowLogger(
        run_dir=tmp_path / "run", experiment_name="e", tracking_uri=uri, evaluation=True,
        eval_step=20,
    )  # fmt: skip

    def attach(processes: int, fn: str, dm: TokenDataModule | None = None) -> TokenDataModule:
        dm = dm or TokenDataModule(str(tiny_data), block_size=16, batch_size=2, num_workers=0)
        dm.trainer = SimpleNamespace(
            world_size=processes, global_rank=0, state=SimpleNamespace(fn=fn),
            limit_val_batches=4, loggers=[logger], is_last_batch=False,
        )  # fmt: skip
        return dm

    fitted = TokenDataModule(str(tiny_data), block_size=16, batch_size=2, num_workers=0)
    next(iter(fitted.train_dataloader()))
    attach(2, "fit", fitted)
    with pytest.warns(UserWarning, match=r"not comparable .*; logged as eval/val/1x8blocks/loss"):
        attach(1, "validate").load_state_dict(fitted.state_dict())
    logger.log_metrics({"val/loss": 2.5, "val/ppl": 12.2}, step=0)
    assert [m.value for m in client.get_metric_history(run_id, "val/loss")] == [2.0]
    [apart] = client.get_metric_history(run_id, "eval/val/1x8blocks/loss")
    assert (apart.value, apart.step) == (2.5, 20)
    note = client.get_run(run_id).data.tags["eval/val/1x8blocks/note"]
    assert note.startswith("val/loss scores other blocks of the val split")


def test_a_stopped_run_reads_killed_before_it_finalizes(tmp_path):
    """KILLED was written at finalize: a second SIGTERM on the way out (SLURM's, a
    user's) ended the process first, and the run stayed RUNNING. A requeue that does not
    come takes it back."""
    from cofrgenet.training.tracking import RUN_ID_FILE, CofrMLFlowLogger

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.tracking.MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / RUN_ID_FILE).write_text(run_id + "\n")
    logger = CofrMLFlowLogger(run_dir=tmp_path / "run", experiment_name="e", tracking_uri=uri)
    logger.mark_killed(7)
    run = client.get_run(run_id)
    assert run.info.status == "KILLED" and run.data.tags["cofr.stopped_at_step"] == "7"
    logger.mark_going_on()
    run = client.get_run(run_id)
    assert run.info.status == "RUNNING" and "cofr.stopped_at_step" not in run.data.tags


def test_a_ctrl_c_after_the_stop_is_saved_lets_the_stop_end(tmp_path):
    """A second Ctrl-C once the stop's checkpoint was saved raised KeyboardInterrupt
    inside MLflow's last writes (a SQLAlchemy traceback); the save is done: it is let be."""
    import signal

    from cofrgenet.training.callbacks import StopOnSignal

    stop = StopOnSignal()
    stop._phase, stop.signal = "training", signal.SIGINT
    with pytest.raises(KeyboardInterrupt):  # before the save: abort without saving
        stop._on_sigint(signal.SIGINT, None)
    stop.saved = tmp_path / "last.ckpt"
    try:
        stop._on_sigint(signal.SIGINT, None)  # after it: nothing to abort
        stop._phase = "ending"  # the fit's end, reached on the stop's way out
        stop._on_sigint(signal.SIGINT, None)
        stop._on_sigint(signal.SIGINT, None)
    except KeyboardInterrupt:
        pytest.fail("a Ctrl-C after the stop's save interrupted its way out")


def test_ctrl_c_is_said_by_rank_zero_only(capsys, monkeypatch):
    """Under DDP every rank gets the terminal's Ctrl-C and each printed its own copy of
    "Ctrl-C: stopping after this step"."""
    import signal

    from lightning.pytorch.utilities import rank_zero_only

    from cofrgenet.training.callbacks import StopOnSignal

    for rank in (1, 0):
        monkeypatch.setattr(rank_zero_only, "rank", rank)
        stop = StopOnSignal()
        stop._phase = "training"
        stop._on_sigint(signal.SIGINT, None)
        out = capsys.readouterr().out
        assert ("Ctrl-C: stopping after this step" in out) == (rank == 0)
        stop._phase = "ending"
        stop._pending.clear()
        stop._on_sigint(signal.SIGINT, None)
        out = capsys.readouterr().out
        assert ("finishing its save" in out) == (rank == 0)


def test_mlflow_records_params_metrics_and_config(tiny_data, tmp_path):
    CofrCLI(
        args=fit_args(
            tmp_path, tiny_data, "--trainer.max_steps", "4", "--trainer.log_every_n_steps", "1"
        )
    )
    runs = mlflow_runs(tmp_path / "runs")
    assert len(runs) == 1
    run_id = runs.run_id[0]
    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    run = client.get_run(run_id)
    params = run.data.params
    assert params["model.preset"] == "gpt2-tiny-f"
    assert params["trainer.max_steps"] == "4"
    assert all(len(v) <= 500 for v in params.values())
    # The model as built (the preset's depth and ladder count, not "None"), searchable;
    # unset keys and how the command was called (config files, ckpt_path) are no params.
    from cofrgenet.models import count_parameters
    from cofrgenet.models.config import resolve_model_config

    built = resolve_model_config("gpt2-tiny-f", {"vocab_size": 320, "block_size": 32})
    assert params["model.config.depth"] == str(built.depth) and built.depth is not None
    assert params["model.config.ladders"] == str(built.ladders)
    assert "None" not in params.values() and "config" not in params and "ckpt_path" not in params
    found = client.search_runs(
        [run.info.experiment_id], f"params.`model.config.depth` = '{built.depth}'"
    )
    assert [r.info.run_id for r in found] == [run_id]
    assert run.data.metrics["model/n_params"] == count_parameters(built).total
    assert run.data.metrics["model/n_params_ladder"] == count_parameters(built).ladder > 0
    assert run.data.metrics["model/training_flops_per_token"] > 0
    # What it trained on: the folder as a whole path, the tokenizer, each split's tokens.
    from cofrgenet.data.meta import read_meta

    meta = read_meta(tiny_data)
    assert params["data.folder"] == str(tiny_data.resolve())
    assert params["data.tokenizer"] == meta.tokenizer
    assert params["data.train_tokens"] == str(meta.train_tokens)
    # Which code ran: the package's version and, in a checkout, its commit.
    import subprocess
    from importlib.metadata import version

    import cofrgenet

    tags = run.data.tags
    assert tags["cofrgenet.version"] == version("cofrgenet") and tags["cofrgenet.command"]
    source = Path(cofrgenet.__file__).parent
    head = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True)
    if head.returncode == 0:
        assert tags["mlflow.source.git.commit"] == head.stdout.decode().strip()
        assert tags["cofrgenet.git_dirty"] in ("true", "false")
    assert len(client.get_metric_history(run_id, "train/loss")) == 4
    # From the second step on (the first has no previous step to time against).
    flops = client.get_metric_history(run_id, "perf/flops_per_s")
    utilisation = client.get_metric_history(run_id, "perf/mfu")
    assert len(flops) == 3 and len(utilisation) == 3
    assert all(m.value > 0 for m in flops) and all(0 < m.value < 1 for m in utilisation)
    assert {a.path for a in client.list_artifacts(run_id)} >= {"config.yaml"}
    run_dirs = list((tmp_path / "runs" / "test").iterdir())
    assert (run_dirs[0] / "mlflow_run_id").read_text().strip() == run_id
    assert (run_dirs[0] / "checkpoints" / "last.ckpt").exists()
    # The tokenizer it trained with, kept beside its checkpoints.
    kept = run_dirs[0] / "tokenizer" / "meta.json"
    assert kept.read_bytes() == (tiny_data / "meta.json").read_bytes()


def test_missing_data_folder_names_the_prepare_command(tmp_path):
    with pytest.raises(Exception, match="cofr data prepare"):
        CofrCLI(args=fit_args(tmp_path, tmp_path / "nowhere"))


def test_unknown_model_key_fails_fast(tiny_data, tmp_path):
    """ModelConfig's fields are typed options: a typo or a bad choice fails at parse time,
    before a run folder exists, and help lists every field."""
    hint = r"unknown key 'model.config.depht' \(did you mean 'model.config.depth'\?\)"
    with pytest.raises(ConfigError, match=hint):
        CofrCLI(args=fit_args(tmp_path, tiny_data, "--model.config", '{"depht": 3}'))
    with pytest.raises(ConfigError, match=hint):
        CofrCLI(args=fit_args(tmp_path, tiny_data, "--model.config.depht", "3"))
    choice = r"model.config.attention: 'cattn_x' is not one of .*did you mean 'cattn_u'"
    with pytest.raises(ConfigError, match=choice):
        CofrCLI(args=fit_args(tmp_path, tiny_data, "--model.config.attention", "cattn_x"))
    # In a list, the item outside the choices is named (the whole list was, with no hint).
    item = r"model.config.ffn_pattern: \['mlp', 'cfn'\]: 'cfn' is not one of .*did you mean 'cffn'"
    with pytest.raises(ConfigError, match=item):
        CofrCLI(args=fit_args(tmp_path, tiny_data, "--model.config.ffn_pattern", "[mlp, cfn]"))
    assert not (tmp_path / "runs" / "test").exists()
    parser = CofrCLI(args=fit_args(tmp_path, tiny_data)[1:], run=False).parser  # no subcommand
    help_text = parser.format_help()
    assert all(f"--model.config.{name}" in help_text for name in ModelConfig.field_names())


def test_unknown_yaml_key_fails_fast(tiny_data, tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  max_stepz: 3\n")
    with pytest.raises(ConfigError, match=r"unknown key 'trainer.max_stepz' in .*bad.yaml"):
        CofrCLI(args=fit_args(tmp_path, tiny_data, "--config", str(bad)))


@pytest.mark.parametrize(
    "model,match",
    [
        ('{"vocab_size": 100, "block_size": 32}', "vocab"),
        ('{"vocab_size": 320, "block_size": 16}', "block_size"),
    ],
    ids=["vocab", "block"],
)
def test_config_data_mismatch_fails_fast_and_leaves_nothing(tiny_data, tmp_path, model, match):
    with pytest.raises(ValueError, match=match):
        CofrCLI(args=fit_args(tmp_path, tiny_data, "--model.config", model))
    runs = tmp_path / "runs"
    assert not (runs / "test").exists(), "a run folder was left behind"
    if (runs / "mlflow.db").exists():
        assert len(mlflow_runs(runs)) == 0, "an MLflow run was left behind"


def test_a_resume_on_data_of_a_larger_tokenizer_says_the_data_changed(tiny_data, tmp_path):
    """A data folder prepared again with another tokenizer under a run: its resume said
    "set model.config.vocab_size", which a resume (the checkpoint's model) cannot take."""
    from cofrgenet.data import prepare_data

    CofrCLI(args=fit_args(tmp_path, tiny_data, "--trainer.max_steps", "2", "--run.name", "a"))
    bpe = tmp_path / "bpe"
    prepare_data(
        source="pydoc", tokenizer="bpe", vocab_size=400, out=bpe, max_docs=8, num_workers=1
    )
    said = r"resumed checkpoint's model only 320: .*bpe is not tokenized as the data the run"
    for ckpt in ("last", str(tmp_path / "runs" / "test" / "a" / "checkpoints" / "last.ckpt")):
        with pytest.raises(ConfigError, match=said):
            CofrCLI(args=fit_args(tmp_path, bpe, "--run.name", "a", "--ckpt_path", ckpt))
    # A run with no checkpoint yet starts afresh: its model's size is the one to change.
    with pytest.raises(ConfigError, match=r"set model.config.vocab_size: 400"):
        CofrCLI(args=fit_args(tmp_path, bpe, "--run.name", "b", "--ckpt_path", "last"))


def test_token_ids_past_the_tokenizer_in_a_damaged_chunk_are_one_line(tiny_data, tmp_path, capsys):
    """A chunk overwritten in place (its size intact, so the index's checks pass) raised
    IndexError in the embedding, a traceback (and a lost peer on the other ranks)."""
    import shutil

    from test_cli_errors import one_line_error

    damaged = tmp_path / "damaged"
    shutil.copytree(tiny_data, damaged)
    for chunk in (damaged / "train").glob("*.bin"):
        data = bytearray(chunk.read_bytes())
        half = len(data) // 2
        data[half:] = b"\xff" * (len(data) - half)
        chunk.write_bytes(bytes(data))
    line = one_line_error(capsys, fit_args(tmp_path, damaged, "--trainer.max_steps", "20"))
    assert line.startswith(f"cofr fit: error: {damaged} holds token id 65535, outside its ")
    assert line.endswith(  # prepared here by the Python API: no command is recorded
        "ids: a chunk file is damaged. Prepare it again: cofr data prepare <the options "
        f"that made it> --out {damaged} --overwrite"
    )


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn", "auto"])
def test_dyadic_unfreezing_under_a_ddp_expecting_every_gradient_is_refused_at_start(
    tiny_data, tmp_path, strategy
):
    """Each rank refused it once its model was wrapped: the error twice, and under
    ddp_spawn a traceback that left the MLflow run RUNNING and the run folder behind."""
    name = "ddp" if strategy == "auto" else strategy
    args = fit_args(
        tmp_path, tiny_data, "--trainer.devices", "2", "--trainer.strategy", strategy,
        "--trainer.callbacks+=cofrgenet.training.callbacks.DyadicUnfreezing",
    )  # fmt: skip
    with pytest.raises(
        ConfigError, match=rf"set trainer.strategy: {name}_find_unused_parameters_true"
    ) as refused:
        CofrCLI(args=args)
    assert not (tmp_path / "runs" / "test").exists(), "a run folder was left behind"
    # auto is named as given, with what it runs (it said "ddp", a strategy not chosen).
    said = "trainer.strategy auto (ddp on several devices)" if strategy == "auto" else strategy
    assert f"gradient; {said} must be told" in str(refused.value)


def test_a_resume_that_drops_the_dyadic_schedule_is_refused(tiny_data, tmp_path):
    """Resumed without the DyadicUnfreezing it trained under, a run trained every depth
    still frozen from the resumed step on; Lightning's warning about the checkpoint's
    callbacks was the only sign. The schedule given again (or one whose depths are all
    released by the checkpoint) goes on."""
    dyadic = [
        "--trainer.callbacks+=cofrgenet.training.callbacks.DyadicUnfreezing",
        "--trainer.callbacks.total_steps=64",  # depth 1 at 32, depth 2 at 48...
    ]
    name = ["--run.name", "dyadic", "--model.config.depth", "2"]
    CofrCLI(args=fit_args(tmp_path, tiny_data, "--trainer.max_steps", "2", *name, *dyadic))
    more = [*name, "--ckpt_path", "last", "--trainer.max_steps", "4"]
    with pytest.raises(ConfigError, match=(
        r"last\.ckpt trained under DyadicUnfreezing, which releases depth 1 at step 32, "
        r"depth 2 at step 48, and this fit has no DyadicUnfreezing callback: those depths "
        r"would train from step 2 on\. Give it again"
    )):  # fmt: skip
        CofrCLI(args=fit_args(tmp_path, tiny_data, *more))
    resumed = CofrCLI(args=fit_args(tmp_path, tiny_data, *more, *dyadic))
    assert resumed.trainer.global_step == 4


def test_a_resume_whose_optimizer_groups_differ_is_refused_before_anything_is_written(
    tiny_data, tmp_path
):
    """DyadicUnfreezing's lr: release gives each ladder depth a parameter group of its
    own: resumed without it (or with it, after a run without), Lightning's "loaded state
    dict has a different number of parameter groups" traceback came after config.yaml
    had been rewritten with the wrong settings, which then failed as the run's own."""
    dyadic = [
        "--trainer.callbacks+=cofrgenet.training.callbacks.DyadicUnfreezing",
        "--trainer.callbacks.schedule=none",  # every depth trains: only lr matters
    ]
    release = [*dyadic, "--trainer.callbacks.lr=release"]
    runs = {"split": release, "one": dyadic}
    for name, callbacks in runs.items():
        args = ["--run.name", name, "--trainer.max_steps", "2", *callbacks]
        CofrCLI(args=fit_args(tmp_path, tiny_data, *args))
    config = {name: (tmp_path / "runs" / "test" / name / "config.yaml") for name in runs}
    written = {name: path.read_text() for name, path in config.items()}

    def resume(name: str, *callbacks: str) -> CofrCLI:
        more = ["--run.name", name, "--ckpt_path", "last", "--trainer.max_steps", "4"]
        return CofrCLI(args=fit_args(tmp_path, tiny_data, *more, *callbacks))

    for callbacks, now in [((), "has no DyadicUnfreezing"), (dyadic, "gives it lr: global")]:
        with pytest.raises(ConfigError, match=(
            r"last\.ckpt trained under DyadicUnfreezing with lr: release, which gives each "
            rf"ladder depth a parameter group of its own, and this fit {now}"
        )):  # fmt: skip
            resume("split", *callbacks)
    with pytest.raises(ConfigError, match=r"one parameter group for every ladder depth.*"
                       r"Resume with lr: global"):  # fmt: skip
        resume("one", *release)
    assert {name: path.read_text() for name, path in config.items()} == written
    assert resume("split", *release).trainer.global_step == 4
    assert resume("one", *dyadic).trainer.global_step == 4


def test_a_copied_run_folder_is_refused_the_run_it_was_copied_from(tiny_data, tmp_path):
    """`cp -r runs/x/a runs/x/b` then `--run.name b --ckpt_path last` wrote b's steps
    into a's MLflow run (the copied mlflow_run_id), and a's own resumed steps were then
    dropped as replayed. Without the file the copy goes on as a new MLflow run."""
    runs = tmp_path / "runs" / "test"
    every = ["--trainer.log_every_n_steps", "1"]
    CofrCLI(
        args=fit_args(tmp_path, tiny_data, "--run.name", "a", "--trainer.max_steps", "2", *every)
    )
    shutil.copytree(runs / "a", runs / "b")
    more = ["--run.name", "b", "--ckpt_path", "last", "--trainer.max_steps", "4", *every]
    run_id = (runs / "a" / "mlflow_run_id").read_text().strip()
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    history = client.get_metric_history(run_id, "train/loss")
    assert [m.step for m in history] == [0, 1]
    with pytest.raises(ConfigError, match=(
        rf"{re.escape(str(runs / 'b'))} is a copy of {re.escape(str((runs / 'a').resolve()))}: "
        rf"both name MLflow run {run_id} in mlflow_run_id, so this fit would write its steps "
        rf"into a's history\. To go on with the copy, deleting .*mlflow_run_id logs this "
        "folder's run as a new MLflow run; or resume .* itself"
    )):  # fmt: skip
        CofrCLI(args=fit_args(tmp_path, tiny_data, *more))
    assert client.get_metric_history(run_id, "train/loss") == history
    # A whole runs folder copied, its store too (a node-local copy of a SLURM job): the
    # copy's run goes on in the copied store.
    shutil.copytree(tmp_path / "runs", tmp_path / "copy" / "runs")
    shutil.rmtree(tmp_path / "copy" / "runs" / "test" / "b")
    copied = ["--run.name", "a", "--ckpt_path", "last", "--trainer.max_steps", "4", *every]
    assert CofrCLI(args=fit_args(tmp_path / "copy", tiny_data, *copied)).trainer.global_step == 4
    assert client.get_metric_history(run_id, "train/loss") == history
    (runs / "b" / "mlflow_run_id").unlink()
    assert CofrCLI(args=fit_args(tmp_path, tiny_data, *more)).trainer.global_step == 4
    assert (runs / "b" / "mlflow_run_id").read_text().strip() != run_id


def test_a_moved_run_folder_goes_on_in_its_store_and_is_refused_in_another(tiny_data, tmp_path):
    """A run folder renamed beside its store goes on (its MLflow run's run_dir tag follows
    it); one moved to another runs folder, whose store lacks its run, ended in MLflow's
    "Run ... not found" traceback at the first step."""
    runs = tmp_path / "runs" / "test"
    every = ["--trainer.log_every_n_steps", "1"]
    CofrCLI(
        args=fit_args(tmp_path, tiny_data, "--run.name", "a", "--trainer.max_steps", "2", *every)
    )
    run_id = (runs / "a" / "mlflow_run_id").read_text().strip()
    (runs / "a").rename(runs / "moved")
    more = ["--ckpt_path", "last", "--trainer.max_steps", "4", *every]
    CofrCLI(args=fit_args(tmp_path, tiny_data, "--run.name", "moved", *more))
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    assert client.get_run(run_id).data.tags["run_dir"] == str((runs / "moved").resolve())
    assert [m.step for m in client.get_metric_history(run_id, "train/loss")][-1] == 3
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "runs" / "test").mkdir(parents=True)
    (runs / "moved").rename(elsewhere / "runs" / "test" / "moved")
    args = fit_args(elsewhere, tiny_data, "--run.name", "moved", "--ckpt_path", "last")
    with pytest.raises(ConfigError, match=(
        r"cannot go on with .*moved's MLflow run: no MLflow store at sqlite:///.*elsewhere"
        r".*\(was the run folder moved or copied\? --run.tracking_uri gives its store; "
        r"deleting .*mlflow_run_id logs this folder's run as a new MLflow run\)"
    )):  # fmt: skip
        CofrCLI(args=[*args, "--trainer.max_steps", "6"])
    assert not (elsewhere / "runs" / "mlflow.db").exists()


@pytest.mark.slow
def test_ddp_two_processes_keep_replicas_identical(tiny_data, tmp_path):
    """2-process DDP on CPU (gloo) with dyadic unfreezing and dropout: every rank ends with
    the same weights, and each drew dropout masks of its own."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    args = fit_args(
        tmp_path,
        tiny_data,
        "--model.config.dropout",
        "0.1",
        "--trainer.max_steps",
        "8",
        "--trainer.devices",
        "2",
        "--trainer.strategy",
        "ddp_find_unused_parameters_true",
        "--trainer.callbacks+=cofrgenet.training.callbacks.DyadicUnfreezing",
        "--trainer.callbacks+=helpers.DumpWeights",
        f"--trainer.callbacks.folder={tmp_path / 'weights'}",
        "--trainer.callbacks+=helpers.DumpBatchSeeds",
        f"--trainer.callbacks.folder={tmp_path / 'weights'}",
    )
    subprocess.run(
        [sys.executable, "-m", "cofrgenet.training.cli", *args], check=True, env=env, timeout=600
    )
    seeds = [torch.load(tmp_path / "weights" / f"rank{r}-seeds.pt") for r in (0, 1)]
    assert len(seeds[0]) == len(seeds[1]) == 8
    assert not set(seeds[0]) & set(seeds[1]), "the processes drew the same dropout masks"
    rank0 = torch.load(tmp_path / "weights" / "rank0.pt")
    rank1 = torch.load(tmp_path / "weights" / "rank1.pt")
    assert rank0.keys() == rank1.keys()
    for key in rank0:
        assert torch.equal(rank0[key], rank1[key]), key


@pytest.mark.slow
def test_fsdp_two_processes_with_dyadic_unfreezing_agree_and_resume(tiny_data, tmp_path):
    """2-process FSDP on CPU (gloo): frozen depths stay bit-identical, replicas agree, and
    the run resumes from its checkpoint, also into another wrapping: saved with the whole
    model as one FSDP unit (as before wrap_blocks), resumed with one unit per block, it
    ends where an uninterrupted per-block run does (its optimizer state carried over), one
    that recomputes its blocks' activations in backward."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}

    def fit(steps: int, folder: str, *extra: str, name: str = "fsdp", blocks: bool = True):
        strategy = {
            "class_path": "cofrgenet.training.strategies.LadderFSDPStrategy",
            # state_dict_type as conf/trainer/fsdp.yaml
            "init_args": {"state_dict_type": "sharded", "wrap_blocks": blocks},
        }
        args = fit_args(
            tmp_path,
            tiny_data,
            "--run.name",
            name,
            "--trainer.max_steps",
            str(steps),
            "--trainer.devices",
            "2",
            "--trainer.strategy",
            json.dumps(strategy),
            "--trainer.callbacks+=cofrgenet.training.callbacks.DyadicUnfreezing",
            "--trainer.callbacks.total_steps=8",
            "--trainer.callbacks+=helpers.DumpWeights",
            f"--trainer.callbacks.folder={tmp_path / folder}",
            "--trainer.callbacks+=helpers.DumpGradNorms",
            f"--trainer.callbacks.folder={tmp_path / folder}",
            *extra,
        )
        subprocess.run(
            [sys.executable, "-m", "cofrgenet.training.cli", *args],
            check=True,
            env=env,
            timeout=600,
        )

    fit(4, "first", blocks=False)
    fit(8, "resumed", "--ckpt_path", "last")
    # Activation checkpointing inside the per-block FSDP units changes no result either.
    fit(8, "straight", "--model.activation_checkpointing", "true", name="straight")
    start = torch.load(tmp_path / "first" / "rank0-start.pt")
    resumed_start = torch.load(tmp_path / "resumed" / "rank0-start.pt")
    end = [torch.load(tmp_path / "resumed" / f"rank{r}.pt") for r in (0, 1)]
    first_end = torch.load(tmp_path / "first" / "rank0.pt")
    assert end[0].keys() == end[1].keys() == start.keys()
    for key in start:
        assert torch.equal(end[0][key], end[1][key]), key  # replicas agree
        assert torch.equal(resumed_start[key], first_end[key]), key  # resumed where it stopped
    # Depths released after step 4 of 8 (depth 2 at 6, 3 at 7, 4 and 5 never) were
    # frozen for the whole first run: bit-identical to their initial values there.
    frozen = [k for k in start if ".denominators.weight." in k and k.split(".")[-1] != "0"]
    assert frozen
    for key in frozen:
        assert torch.equal(first_end[key], start[key]), key
    late = [k for k in frozen if k.split(".")[-1] in ("3", "4")]  # depths 4 and 5
    for key in late:
        assert torch.equal(end[0][key], start[key]), key
    straight = torch.load(tmp_path / "straight" / "rank0.pt")
    for key in start:  # the same sums, in another order across FSDP units
        torch.testing.assert_close(end[0][key], straight[key], rtol=1e-5, atol=1e-7)
    # The gradient norm is the whole gradient's on every rank, not the rank's shard's.
    norms = [torch.load(tmp_path / "first" / f"rank{r}-grad-norms.pt") for r in (0, 1)]
    assert len(norms[0]) == 4 and norms[0] == pytest.approx(norms[1], rel=1e-5)


@pytest.mark.slow
def test_fsdp_on_cpu_saves_a_full_checkpoint_and_resumes_from_it(tiny_data, tmp_path):
    """LadderFSDPStrategy keeps Lightning's default state_dict_type: full. On CPU, FSDP's
    gather of a full state dict with offload_to_cpu (Lightning's setting) segfaulted rank
    0 at the first checkpoint (torch 2.13, gloo)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}

    def fit(steps: int, folder: str, *extra: str) -> None:
        args = fit_args(
            tmp_path, tiny_data, "--run.name", "full", "--trainer.max_steps", str(steps),
            "--trainer.devices", "2",
            "--trainer.strategy.class_path=cofrgenet.training.strategies.LadderFSDPStrategy",
            "--trainer.callbacks+=helpers.DumpWeights",
            f"--trainer.callbacks.folder={tmp_path / folder}", *extra,
        )  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "cofrgenet.training.cli", *args],
            env=env, timeout=600, capture_output=True, text=True,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]

    fit(3, "first")
    last = tmp_path / "runs" / "test" / "full" / "checkpoints" / "last.ckpt"
    assert last.is_file()  # one file, not a folder of shards
    saved = torch.load(last, weights_only=True)["state_dict"]
    end = torch.load(tmp_path / "first" / "rank0.pt")
    for key, value in end.items():
        assert torch.equal(saved[key], value), key
    fit(5, "resumed", "--ckpt_path", "last")
    resumed_start = torch.load(tmp_path / "resumed" / "rank0-start.pt")
    for key, value in end.items():
        assert torch.equal(resumed_start[key], value), key


def test_a_sharded_save_cut_short_leaves_a_folder_that_is_not_resumed_from(tmp_path, monkeypatch):
    """FSDP's sharded save rewrites last.ckpt's shards in place and its markers last: cut
    short (a kill while saving), the old markers stood beside a mix of two steps' shards
    and the folder passed as intact. The markers go before the save starts; a meta.pt
    cut short is refused too."""
    from lightning.pytorch.strategies import FSDPStrategy

    from cofrgenet.training.checkpoints import is_intact
    from cofrgenet.training.strategies import LadderFSDPStrategy

    folder = tmp_path / "last.ckpt"
    folder.mkdir()
    (folder / "__0_0.distcp").write_bytes(b"step 4")
    (folder / ".metadata").write_bytes(b"step 4")
    torch.save({"global_step": 4}, folder / "meta.pt")
    assert is_intact(folder)

    def killed_while_saving(self, checkpoint, filepath, storage_options=None):
        (Path(filepath) / "__0_0.distcp").write_bytes(b"step 6, half")
        raise KeyboardInterrupt

    monkeypatch.setattr(FSDPStrategy, "save_checkpoint", killed_while_saving)
    with pytest.raises(KeyboardInterrupt):
        LadderFSDPStrategy(state_dict_type="sharded").save_checkpoint({}, folder)
    assert not is_intact(folder)
    # A full save (another state_dict_type on resume) replaces the folder, as Lightning
    # does by its markers: not removed first.
    (folder / ".metadata").write_bytes(b"step 4")
    torch.save({"global_step": 4}, folder / "meta.pt")
    full = []
    monkeypatch.setattr(
        FSDPStrategy, "save_checkpoint", lambda *a, **k: full.append(is_intact(folder))
    )
    LadderFSDPStrategy(state_dict_type="full").save_checkpoint({}, folder)
    assert full == [True]
    (folder / ".metadata").write_bytes(b"step 6")
    meta = folder / "meta.pt"
    torch.save({"global_step": 6, "loops": list(range(1000))}, meta)
    assert is_intact(folder)
    meta.write_bytes(meta.read_bytes()[: meta.stat().st_size // 2])
    assert not is_intact(folder)


def test_fsdp_keeps_the_ladders_output_ranges_in_float32():
    """Lightning's FSDP casts buffers to bf16 under bf16-mixed and bf16-true, bypassing
    OutputRange's own guard: its 1% drift a step then rounds away. The strategy keeps
    buffers float32 (the models' only buffers), and a mixed_precision given is kept."""
    from lightning.pytorch.plugins.precision import FSDPPrecision
    from torch.distributed.fsdp import MixedPrecision

    from cofrgenet.training.strategies import LadderFSDPStrategy

    for precision in ("bf16-mixed", "bf16-true", "16-mixed", "32-true"):
        strategy = LadderFSDPStrategy()
        strategy.precision_plugin = FSDPPrecision(precision)
        config = strategy.mixed_precision_config
        assert config.buffer_dtype == torch.float32, precision
        assert config.param_dtype == FSDPPrecision(precision).mixed_precision_config.param_dtype
    given = MixedPrecision(buffer_dtype=torch.bfloat16)
    assert LadderFSDPStrategy(mixed_precision=given).mixed_precision_config is given


@pytest.mark.parametrize(
    "setting,said",
    [
        (("use_orig_params", "false"), "use_orig_params: false is not supported"),
        (("activation_checkpointing_policy", "[torch.nn.Linear]"), "set model.activation"),
    ],
    ids=["flat-params", "lightning-checkpointing"],
)
def test_fsdp_settings_it_refuses_are_one_line_before_launch(
    tiny_data, tmp_path, capsys, setting, said
):
    """Refused inside the strategy's build, they came as jsonargparse's union type error,
    a traceback ("Expected a <class 'str'>"); use_orig_params false, unrefused, was a
    KeyError on every rank at the first step."""
    from test_cli_errors import one_line_error

    name, value = setting
    args = fit_args(
        tmp_path, tiny_data, "--trainer.devices", "2", "--trainer.strategy",
        "cofrgenet.training.strategies.LadderFSDPStrategy",
        f"--trainer.strategy.init_args.{name}", value,
    )  # fmt: skip
    line = one_line_error(capsys, args)
    assert line.startswith(f"cofr fit: error: trainer.strategy.init_args.{name}: ")
    assert said in line
    assert not (tmp_path / "runs").exists()


def test_generate_samples_from_a_checkpoint(tiny_data, tmp_path, capsys):
    from cofrgenet.cli import main

    CofrCLI(args=fit_args(tmp_path, tiny_data, "--trainer.max_steps", "2", "--run.name", "g"))
    ckpt = tmp_path / "runs" / "test" / "g" / "checkpoints" / "last.ckpt"
    capsys.readouterr()
    argv = ["generate", "--ckpt", str(ckpt), "--prompt", "The ", "--max-new-tokens", "12"]
    assert main([*argv, "--temperature", "0"]) == 0
    first = capsys.readouterr().out
    assert first.startswith("The ") and len(first.split("\n")[0]) > len("The ")
    assert main([*argv, "--temperature", "0"]) == 0
    assert capsys.readouterr().out == first  # greedy decoding is deterministic
    assert main(["generate", "--ckpt", str(tmp_path / "missing.ckpt")]) == 2
    assert "no checkpoint file at" in capsys.readouterr().err


def test_a_store_mlflow_refuses_is_named_with_what_mlflow_says_to_do(tmp_path, monkeypatch):
    """Only MLflow's first sentence was kept: a file:// store read "... is in maintenance
    mode and will not receive further updates", without the way out (a sqlite store, or
    MLFLOW_ALLOW_FILE_STORE=true), and an unknown scheme without the schemes it knows."""
    from cofrgenet.training.run_store import check_tracking_uri

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    uri = (tmp_path / "mlruns").as_uri()
    with pytest.raises(ConfigError) as refused:
        check_tracking_uri(uri, fix="fix --tracking-uri")
    assert str(refused.value) == (
        f"MLflow cannot use {uri!r}: MLflow refuses a file store (a plain path or a file:// "
        "URI) unless MLFLOW_ALLOW_FILE_STORE=true is set: use a sqlite store such as "
        "sqlite:///runs/mlflow.db (the default; `mlflow migrate-filestore` moves a file "
        "store's runs into one), or set that variable; fix --tracking-uri"
    )
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # as the message says: then it works
    check_tracking_uri(uri)
    with pytest.raises(ConfigError) as refused:
        check_tracking_uri("foo://bar", fix="fix --tracking-uri")
    message = str(refused.value)
    assert message.startswith("MLflow cannot use 'foo://bar': ")
    assert "Supported URI schemes are: [" in message and "'sqlite'" in message
    assert "See http" not in message and message.endswith("]; fix --tracking-uri")


def test_models_list_and_ui_command(capsys, tmp_path, monkeypatch):
    import argparse

    monkeypatch.setenv("COLUMNS", "200")  # a wide console: rich would elide names otherwise
    from cofrgenet.cli import main
    from cofrgenet.training.ui import ui_command

    assert main(["models", "list", "--filter", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "gpt2-tiny-fa" in out and "gpt2-xl" not in out
    args = argparse.Namespace(
        runs_dir=str(tmp_path), tracking_uri=None, host="127.0.0.1", port=5001, allowed_hosts=""
    )
    command = ui_command(args)
    assert "--no-access-log" in command  # no line per request in the server's log
    assert "--allowed-hosts" not in command  # on loopback, MLflow's default suffices
    assert (
        command[command.index("--backend-store-uri") + 1]
        == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    )
    assert main(["ui", "--runs-dir", str(tmp_path / "empty")]) == 2  # no store yet: says so
    assert "no run store at" in capsys.readouterr().err
    # A mistyped store is refused too: serving it would make an empty one and show no runs.
    assert main(["ui", "--tracking-uri", f"sqlite:///{tmp_path}/typo.db"]) == 2
    assert "fix --tracking-uri" in capsys.readouterr().err
    assert not (tmp_path / "typo.db").exists()
    assert main(["ui", "--tracking-uri", "foo://bar"]) == 2
    assert "MLflow cannot use 'foo://bar'" in capsys.readouterr().err
    for port in ("-1", "0", "65536"):
        assert main(["ui", "--port", port]) == 2
    assert "argument --port: must be at most 65535" in capsys.readouterr().err


def test_ui_refuses_a_tracking_server_however_it_is_named(capsys, monkeypatch, tmp_path):
    """A server named by MLFLOW_TRACKING_URI was handed to `mlflow ui`, whose traceback
    showed; named by --tracking-uri, it was one line. Both are one line now, and the help
    of `cofr ui` and `cofr compare` says the variable wins over --runs-dir."""
    from cofrgenet.cli import main
    from cofrgenet.training import run_store
    from test_cli_errors import one_line_error

    monkeypatch.setattr(run_store, "USER_TRACKING_URI", "http://127.0.0.1:1")
    line = one_line_error(capsys, ["ui", "--runs-dir", str(tmp_path)])
    assert line == (
        "cofr ui: error: MLFLOW_TRACKING_URI=http://127.0.0.1:1 is a tracking server, which "
        "has its own UI: open it in a browser (cofr ui serves a store, e.g. "
        "sqlite:///runs/mlflow.db)"
    )
    line = one_line_error(capsys, ["ui", "--tracking-uri", "http://127.0.0.1:1"])
    assert "error: --tracking-uri http://127.0.0.1:1 is a tracking server" in line
    monkeypatch.setattr(run_store, "USER_TRACKING_URI", "foo://bar")
    line = one_line_error(capsys, ["ui"])
    assert "MLflow cannot use 'foo://bar'" in line and line.endswith("fix MLFLOW_TRACKING_URI")
    for command in ("ui", "compare"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        out = " ".join(capsys.readouterr().out.split())  # undo argparse's line wrapping
        assert "(default: MLFLOW_TRACKING_URI when set, else <runs-dir>/mlflow.db)" in out


def free_port() -> str:
    """A port nothing listens on now (a named --port in use is refused)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


def test_a_ui_server_that_fails_to_start_shows_the_end_of_its_log(capsys, tmp_path, monkeypatch):
    """The server's output goes to a log file (the terminal shows cofr ui's own lines);
    when it exits before answering, its last lines are printed."""
    import mlflow

    from cofrgenet.cli import main
    from cofrgenet.training import ui

    mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").search_experiments()
    failing = [
        sys.executable,
        "-c",
        "import sys; print('address already in use: boom'); sys.exit(3)",
    ]
    monkeypatch.setattr(ui, "ui_command", lambda args: failing)
    assert main(["ui", "--runs-dir", str(tmp_path), "--port", free_port()]) == 1
    captured = capsys.readouterr()
    assert (
        "the MLflow server stopped before it answered (exit status 3); the end of its log, "
        in captured.err
    )
    assert "  address already in use: boom" in captured.err
    assert "boom" not in captured.out
    # Its log file is not opened through a link another user left in /tmp.
    victim, link = tmp_path / "victim", tmp_path / "cofr-ui.log"
    victim.write_text("mine")
    link.symlink_to(victim)
    assert ui._open_log(link) is None and victim.read_text() == "mine"


def fake_ui_server(monkeypatch, tmp_path: Path, seconds: int) -> Path:
    """A run store in ``tmp_path`` and, for `cofr ui`, a server that writes its pid to the
    file returned, answers once it has, and lives ``seconds``."""
    import mlflow

    from cofrgenet.training import ui

    mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").search_experiments()
    pid_file = tmp_path / "server.pid"
    server = [sys.executable, "-c",
              f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
              f"time.sleep({seconds})"]  # fmt: skip
    monkeypatch.setattr(ui, "ui_command", lambda args: server)
    monkeypatch.setattr(ui, "answers", lambda url: pid_file.exists())
    return pid_file


def test_a_named_ui_port_in_use_is_refused_and_the_default_moves_on(capsys, tmp_path, monkeypatch):
    """`--port 5081` busy served on 5082, where an SSH tunnel or a bookmark does not
    point (and may be another user's server): a named port is refused; the default
    takes the next free one. Ctrl-C before the server answered exited 0, unsaid: 130."""
    import socket

    from cofrgenet.cli import main
    from cofrgenet.training import ui
    from test_cli_errors import one_line_error

    pid_file = fake_ui_server(monkeypatch, tmp_path, seconds=2)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = one_line_error(capsys, ["ui", "--runs-dir", str(tmp_path), "--port", str(port)])
        assert line == (
            f"cofr ui: error: --port {port}: in use on 127.0.0.1 (another `cofr ui`, or "
            "another program): give another port, or leave --port out for the first free "
            f"one from {ui.DEFAULT_PORT}"
        )
        monkeypatch.setattr(ui, "DEFAULT_PORT", port)
        assert main(["ui", "--runs-dir", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        assert f"port {port} is in use (another `cofr ui`?): using " in out
        assert "MLflow UI: http://127.0.0.1:" in out

    def interrupted(url: str) -> bool:
        raise KeyboardInterrupt

    monkeypatch.setattr(ui, "answers", interrupted)
    pid_file.unlink()
    assert main(["ui", "--runs-dir", str(tmp_path)]) == 130
    assert "interrupted" in capsys.readouterr().err


def test_a_port_not_ours_to_take_is_not_said_to_be_in_use(capsys, tmp_path, monkeypatch):
    """A user's `--port 80` (EACCES) was "in use (another `cofr ui`, ...)"."""
    import errno
    import socket
    import tempfile

    import mlflow

    from cofrgenet.folder_lock import FolderLock
    from cofrgenet.training import ui
    from test_cli_errors import one_line_error

    class Privileged(socket.socket):
        def bind(self, address):
            raise PermissionError(errno.EACCES, "Permission denied")

    mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").search_experiments()
    monkeypatch.setattr(ui.socket, "socket", Privileged)
    line = one_line_error(capsys, ["ui", "--runs-dir", str(tmp_path), "--port", "80"])
    assert line == (
        "cofr ui: error: port 80 on 127.0.0.1: permission denied (ports below 1024 need root "
        "privileges): give --port 1024 or above"
    )
    # The port's lock was let go (another `cofr ui --port 80`, run as root, may take it).
    lock = FolderLock(Path(tempfile.gettempdir()) / f"cofr-ui-{os.getuid()}-80.lock")
    assert lock.try_acquire()
    lock.release()


def test_a_hangup_stops_the_ui_server_with_cofr_ui(tmp_path, monkeypatch):
    """SIGHUP (a closed terminal, a dropped SSH session) ended cofr ui alone: the server,
    in its own session, kept running and kept the port, orphaned."""

    from cofrgenet.cli import main

    pid_file = fake_ui_server(monkeypatch, tmp_path, seconds=120)
    unhandled = []  # where cofr ui does not handle it: noted, not the test run's end

    def note(signum, frame):
        unhandled.append(signum)
        os.kill(int(pid_file.read_text()), signal.SIGTERM)  # the server ends, the test too

    before = signal.signal(signal.SIGHUP, note)
    hangup = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGHUP))
    hangup.start()
    try:
        with pytest.raises(SystemExit) as ended:
            main(["ui", "--runs-dir", str(tmp_path), "--port", free_port()])
        assert signal.getsignal(signal.SIGHUP) == note  # put back
    finally:
        hangup.cancel()
        signal.signal(signal.SIGHUP, before)
    assert not unhandled and ended.value.code == 128 + signal.SIGHUP
    server_pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # stopped and reaped with cofr ui
        os.kill(server_pid, 0)


def test_a_port_another_cofr_ui_claimed_is_passed_over():
    """Two `cofr ui` started together: the second does not take the port whose server is
    still starting (not yet listening); once the first lets go, the port is free again."""

    from cofrgenet.training.ui import claim_port

    port = int(free_port())
    first = claim_port("127.0.0.1", port)
    assert first is not None and first[0] == port
    second = claim_port("127.0.0.1", port)
    assert second is not None and second[0] > port
    assert f'pid": {os.getpid()}' in first[1].path.read_text()  # who holds it
    first[1].release()
    second[1].release()
    again = claim_port("127.0.0.1", port)
    assert again is not None and again[0] == port
    again[1].release()


def test_the_ui_port_probe_knows_ipv6_and_stops_at_65535(monkeypatch):
    """`--host ::1` was probed with an IPv4 socket (every port "in use"), and a busy
    65535 made it try 65536 (OverflowError)."""
    import socket

    from cofrgenet.training import ui

    asked = []
    monkeypatch.setattr(ui, "port_free", lambda host, port: asked.append(port) and False)
    assert ui.claim_port("127.0.0.1", 65534) is None and asked == [65534, 65535]
    monkeypatch.undo()
    if socket.has_ipv6:
        try:
            with socket.socket(socket.AF_INET6) as probe:
                probe.bind(("::1", 0))
                port = probe.getsockname()[1]
        except OSError:
            pytest.skip("no IPv6 loopback here")
        assert ui.port_free("::1", port)


def test_ui_allows_this_machines_names_when_it_listens_beyond_loopback(monkeypatch):
    """`cofr ui --host 0.0.0.0` ("every interface") answered other machines that named it
    by its host name 403 (MLflow's DNS-rebinding check allows loopback and private
    addresses alone): their names are allowed, and --allowed-hosts adds more."""
    import argparse
    import socket

    from mlflow.server.security_utils import is_allowed_host_header

    from cofrgenet.training import ui
    from cofrgenet.training.ui import ui_command

    monkeypatch.setattr(socket, "gethostname", lambda: "Node7")
    monkeypatch.setattr(socket, "getfqdn", lambda name="": "node7.lab.org")
    monkeypatch.delenv("MLFLOW_SERVER_ALLOWED_HOSTS", raising=False)

    def allowed(host: str, given: str = "") -> list[str]:
        args = argparse.Namespace(
            runs_dir="runs", tracking_uri=None, host=host, port=5001, allowed_hosts=given
        )
        command = ui_command(args)
        return command[command.index("--allowed-hosts") + 1].split(",")

    every = allowed("0.0.0.0")
    for header in ("node7:5001", "node7.lab.org:5001", "node7", "localhost:5001", "10.1.2.3:5001"):
        assert is_allowed_host_header(every, header), header
    assert not is_allowed_host_header(every, "evil.example.com:5001")
    ipv6 = allowed("2001:db8::5")
    assert is_allowed_host_header(ipv6, "[2001:db8::5]:5001")
    assert is_allowed_host_header(ipv6, "[2001:db8::5]")
    assert is_allowed_host_header(allowed("127.0.0.1", "mlflow.lab.org"), "mlflow.lab.org:443")
    with_port = allowed("127.0.0.1", "proxy.lab.org:8443")
    assert is_allowed_host_header(with_port, "proxy.lab.org:8443")
    assert not is_allowed_host_header(with_port, "proxy.lab.org:80")
    assert is_allowed_host_header(allowed("0.0.0.0", "gpu-*.cluster"), "gpu-3.cluster:5001")
    assert is_allowed_host_header(allowed("0.0.0.0", "*"), "anything:1")
    # A bracketed address given; names lowered (browsers send them so, MLflow compares
    # them as they are); a machine calling itself localhost is no name for others.
    assert is_allowed_host_header(allowed("127.0.0.1", "[2001:db8::7]"), "[2001:db8::7]:5000")
    assert is_allowed_host_header(allowed("127.0.0.1", "Proxy.Lab.org"), "proxy.lab.org:80")
    monkeypatch.setattr(socket, "getfqdn", lambda name="": "localhost")
    assert ui.machine_names("0.0.0.0") == ["node7"]
    # The hosts MLflow's own variable allows stay allowed beside this machine's names.
    monkeypatch.setenv("MLFLOW_SERVER_ALLOWED_HOSTS", "mine.example.org")
    kept = allowed("0.0.0.0")
    assert is_allowed_host_header(kept, "mine.example.org")
    assert is_allowed_host_header(kept, "node7:5001")
    assert not is_allowed_host_header(kept, "10.1.2.3:5001")  # the variable replaced these


@pytest.mark.slow
def test_ui_serves_the_run_store(tiny_data, tmp_path):
    """`cofr ui` prints the URL once the server answers, and on SIGTERM stops the whole
    server (nothing keeps the port). On every interface, it answers requests that name
    this machine."""
    import json
    import time
    import urllib.request

    from cofrgenet.training.ui import machine_names, port_free

    CofrCLI(args=fit_args(tmp_path, tiny_data, "--trainer.max_steps", "1"))
    port = int(free_port())
    command = [sys.executable, "-m", "cofrgenet.cli", "ui", "--runs-dir", str(tmp_path / "runs"),
               "--port", str(port), "--host", "0.0.0.0"]  # fmt: skip
    ui = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 120
        while not any(line.startswith("MLflow UI: ") for line in lines):
            assert time.monotonic() < deadline and ui.poll() is None, lines
            lines.append(ui.stdout.readline().strip())
        # Only cofr ui's own lines: the server's (uvicorn, warnings) go to its log file.
        assert len(lines) == 2 and lines[0].startswith("starting the MLflow UI"), lines
        names = machine_names("0.0.0.0")  # this machine's, as others name it
        if names:
            named = ui.stdout.readline()
            assert named.startswith(f"from other machines: http://{names[0]}:"), named
        assert ui.stdout.readline().startswith("server log: ")
        url = lines[-1].split()[2]
        served = url.split("/#/")[0]
        assert url.endswith("/#/experiments") and served == f"http://127.0.0.1:{port}"  # loopback
        api = f"{served}/api/2.0/mlflow/experiments/search?max_results=10"
        by_name = [{"Host": f"{name}:{served.rsplit(':', 1)[1]}"} for name in names[:1]]
        for headers in ({}, *by_name):
            request = urllib.request.Request(api, headers=headers)
            with urllib.request.urlopen(request, timeout=10) as response:  # answers at once
                assert "test" in [e["name"] for e in json.load(response)["experiments"]]
        ui.send_signal(15)  # cofr ui alone, not its group: it must stop the server itself
        ui.wait(timeout=30)
        served_port = int(served.rsplit(":", 1)[1])
        deadline = time.monotonic() + 20
        while not port_free("127.0.0.1", served_port):
            assert time.monotonic() < deadline, "the MLflow server outlived cofr ui"
            time.sleep(0.5)
    finally:
        if ui.poll() is None:
            ui.kill()


def test_a_run_folder_is_held_by_one_fit(tiny_data, tmp_path):
    """A second fit of the same run folder stops before writing anything, naming the
    holder; a holder killed with SIGKILL leaves nothing stuck; a finished fit lets go."""
    import signal
    import subprocess
    import sys

    from cofrgenet.training.runlock import RunFolderBusyError

    run_dir = tmp_path / "runs" / "test" / "shared"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from cofrgenet.training.runlock import RunLock; "
         f"RunLock({str(run_dir)!r}).acquire(); print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunFolderBusyError, match=rf"in use by process {holder.pid} on "):
            CofrCLI(args=fit_args(tmp_path, tiny_data, "--run.name", "shared"))
        assert not (run_dir / "checkpoints").exists() and not (run_dir / "mlflow_run_id").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # The kernel dropped the dead holder's lock: this fit runs, then releases it.
    CofrCLI(args=fit_args(tmp_path, tiny_data, "--run.name", "shared", "--trainer.max_steps", "2"))
    assert (run_dir / "checkpoints" / "last.ckpt").exists()
    from cofrgenet.training.runlock import RunLock

    again = RunLock(run_dir)
    again.acquire()
    again.release()


def test_damaged_checkpoints_get_a_clear_error_or_a_fallback(tiny_data, tmp_path, capsys):
    from cofrgenet import cli
    from cofrgenet.training.checkpoints import CheckpointError

    junk = tmp_path / "junk.ckpt"
    junk.write_bytes(b"\x80\x03not a checkpoint at all" * 100)
    with pytest.raises(CheckpointError, match=f"damaged or not a cofrgenet checkpoint: {junk}"):
        CofrCLI(args=fit_args(tmp_path, tiny_data, "--ckpt_path", str(junk)))
    assert cli.main(["generate", "--ckpt", str(junk), "--data", str(tiny_data)]) == 2
    assert "error: this checkpoint is damaged or not a cofrgenet checkpoint" in (
        capsys.readouterr().err
    )
    # A zip that is no torch archive is not offered as "intact".
    import zipfile

    with zipfile.ZipFile(tmp_path / "other.ckpt", "w") as archive:
        archive.writestr("notes.txt", "not a checkpoint")
    with pytest.raises(CheckpointError, match=r"\(a save cut short, or another kind of file\)"):
        CofrCLI(args=fit_args(tmp_path, tiny_data, "--ckpt_path", str(junk)))
    # A last.ckpt cut short: --ckpt_path last resumes from the newest intact one instead.
    args = ("--run.name", "cut", "--run.checkpoint_every_n_steps", "2", "--run.mlflow", "false")
    CofrCLI(args=fit_args(tmp_path, tiny_data, *args, "--trainer.max_steps", "4"))
    folder = tmp_path / "runs" / "test" / "cut" / "checkpoints"
    last = folder / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    step = max(folder.glob("step*.ckpt"))  # the newest periodic one
    with pytest.warns(UserWarning, match=rf"{last} is damaged .*resuming from {step}"):
        resumed = CofrCLI(
            args=fit_args(tmp_path, tiny_data, *args, "--trainer.max_steps", "6",
                          "--ckpt_path", "last")
        )  # fmt: skip
    assert resumed.trainer.global_step == 6 and resumed.model.tokens_seen == 6 * 4 * 32
    # Given by path, a damaged checkpoint's error names an intact one beside it; a typo'd
    # name gets a did-you-mean.
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    with pytest.raises(CheckpointError, match=r"damaged .*step\d+\.ckpt, of the same run, is"):
        CofrCLI(args=fit_args(tmp_path, tiny_data, *args, "--ckpt_path", str(last)))
    # Outside a run's checkpoints folder, another .ckpt beside it may be anything.
    loose = tmp_path / "loose"
    loose.mkdir()
    shutil.copy(last, loose / "mine.ckpt")
    shutil.copy(step, loose / "other.ckpt")
    with pytest.raises(CheckpointError, match=r"mine\.ckpt \(a save cut short, or another"):
        CofrCLI(args=fit_args(tmp_path, tiny_data, *args, "--ckpt_path", str(loose / "mine.ckpt")))
    with pytest.raises(
        CheckpointError, match=r"no checkpoint file at .*lats.ckpt \(did you mean 'last"
    ):
        CofrCLI(args=fit_args(tmp_path, tiny_data, *args, "--ckpt_path", str(folder / "lats.ckpt")))


def test_the_newest_checkpoint_is_the_latest_step_not_the_latest_file(tmp_path):
    """`cp -r` of a run folder gives its files new times in any order: the resume and the
    evaluation of a run then took step 10 while last.ckpt held step 20, and a damaged
    last.ckpt's hint named step 10 while step 20 was intact."""
    from cofrgenet.training import checkpoints

    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    (folder.parent / "config.yaml").write_text("{}\n")
    for name, step in (("last", 20), ("step0000010", 10), ("step0000020", 20)):
        torch.save({"state_dict": {}, "global_step": step}, folder / f"{name}.ckpt")
    os.utime(folder / "step0000010.ckpt", (2e9, 2e9))  # copied last: the newest file
    os.utime(folder / "last.ckpt", (1e9, 1e9))
    os.utime(folder / "step0000020.ckpt", (1e9 + 1, 1e9 + 1))
    names = [p.name for p in checkpoints.candidates(folder.parent)]
    assert names == ["step0000020.ckpt", "last.ckpt", "step0000010.ckpt"]  # ties: by time
    (folder / "last.ckpt").write_bytes(b"cut")  # damaged: tried first, passed over
    assert checkpoints.newest_intact(folder.parent) == (
        folder / "step0000020.ckpt",
        [folder / "last.ckpt"],
    )
    assert "step0000020.ckpt, of the same run, is intact" in str(
        checkpoints.damaged(folder / "last.ckpt")
    )
    (folder / "step0000020.ckpt").unlink()
    assert checkpoints.newest_intact(folder.parent)[0] == folder / "step0000010.ckpt"


def test_a_resume_applies_the_optimizer_settings_it_is_given(tiny_data, tmp_path):
    """Optimizer.load_state_dict took lr, weight decay, betas and eps from the checkpoint,
    and LambdaLR its base lrs: a resume with another lr went on with the old one while
    config.yaml and MLflow said the new one. The moments and step counters are kept."""
    from cofrgenet.training.optim import warmup_cosine

    args = ("--run.name", "lr", "--run.mlflow", "false", "--model.optimizer.warmup_steps", "2")
    CofrCLI(args=fit_args(tmp_path, tiny_data, *args, "--trainer.max_steps", "4"))
    changed = ("--model.optimizer.lr", "1e-4", "--model.optimizer.weight_decay", "0.3",
               "--model.optimizer.betas", "[0.8, 0.9]", "--model.optimizer.eps", "1e-6")  # fmt: skip
    resumed = CofrCLI(
        args=fit_args(tmp_path, tiny_data, *args, *changed, "--trainer.max_steps", "6",
                      "--ckpt_path", "last")
    )  # fmt: skip
    optimizer = resumed.trainer.optimizers[0]
    scheduler = resumed.trainer.lr_scheduler_configs[0].scheduler
    assert scheduler.base_lrs == [1e-4] * len(optimizer.param_groups)
    for group in optimizer.param_groups:
        assert group["initial_lr"] == 1e-4 and group["betas"] == (0.8, 0.9)
        assert group["eps"] == 1e-6 and group["weight_decay"] in (0.0, 0.3)
        if group["depth"] == 0:  # not held back by a dyadic release
            assert group["lr"] == pytest.approx(1e-4 * warmup_cosine(6, 6, 2, 0.1))
    assert any(group["weight_decay"] == 0.3 for group in optimizer.param_groups)
    assert all(int(optimizer.state[p]["step"]) == 6 for p in resumed.model.parameters())


def cofr_in_a_process(
    args: list[str], own_group: bool = False, timeout: float | None = None
) -> tuple[subprocess.CompletedProcess, str]:
    """``cofr <args>`` in its own process (signals to it stay there; ``own_group``: in a
    process group of its own, for signals to the group), with the tests' helpers
    (``sweep_helpers.SignalAtStep``) importable; the result and its whole output."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), *sys.path])}
    env.pop("MLFLOW_TRACKING_URI", None)  # set by earlier in-process runs (mlflow does)
    proc = subprocess.run(
        [sys.executable, "-m", "cofrgenet.cli", *args], capture_output=True, text=True, env=env,
        start_new_session=own_group, timeout=timeout,
    )  # fmt: skip
    return proc, proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_signal_to_one_rank_in_a_step_that_validates_stops_every_rank_after_it(
    tiny_data, tmp_path
):
    """SIGTERM to rank 0 alone during step 10, which a validation follows: rank 0 skipped
    the step end's exchange (it held a signal) while rank 1 made it, which then paired
    with another collective (a hang, or a stop on garbage). Both ranks wait for the
    validation alike, then agree, stop and save step 10 with its score."""
    args = fit_args(
        tmp_path, tiny_data, "--run.name", "one-rank", "--trainer.max_steps", "16",
        "--trainer.devices", "2", "--trainer.strategy", "ddp",
        "--trainer.callbacks+=sweep_helpers.SignalAtStep", "--trainer.callbacks.step=9",
        "--trainer.callbacks.signum=15", "--trainer.callbacks.rank=0",
    )  # fmt: skip
    proc, out = cofr_in_a_process(args, timeout=300)
    assert proc.returncode == 143, out[-3000:]
    run_dir = tmp_path / "runs" / "test" / "one-rank"
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 10, out[-3000:]
    run_id = (run_dir / "mlflow_run_id").read_text().strip()
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    assert [m.step for m in client.get_metric_history(run_id, "val/loss")] == [10]


@pytest.mark.slow
@pytest.mark.parametrize("signum", [15, 2], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_ddp_spawn_launcher_alone_stops_its_ranks_saved(
    tiny_data, tmp_path, signum
):
    """`kill PID` of a ddp_spawn fit: Lightning passed nothing on to the ranks, which
    trained to max_steps while the launcher waited to exit (with 143 after SIGTERM, 0
    after SIGINT)."""
    args = fit_args(
        tmp_path, tiny_data, "--run.name", "spawned", "--trainer.max_steps", "40",
        "--trainer.devices", "2", "--trainer.strategy", "ddp_spawn",
        "--trainer.callbacks+=sweep_helpers.SignalAtStep", "--trainer.callbacks.step=3",
        f"--trainer.callbacks.signum={signum}", "--trainer.callbacks.parent=true",
    )  # fmt: skip
    proc, out = cofr_in_a_process(args)
    assert proc.returncode == 128 + signum, out[-3000:]
    run_dir = tmp_path / "runs" / "test" / "spawned"
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert 3 <= saved["global_step"] < 10, out[-3000:]
    assert f"stopped by SIGTERM after step {saved['global_step']}" in out
    run_id = (run_dir / "mlflow_run_id").read_text().strip()
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    assert client.get_run(run_id).info.status == "KILLED"


@pytest.mark.parametrize("signum", [15, 2], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_whole_process_group_stops_at_the_step_end_with_loader_workers(
    tiny_data, tmp_path, signum
):
    """SLURM signals every process of a job step, a terminal's Ctrl-C its whole group:
    data loader workers too. A worker killed by SIGTERM made the trainer raise mid-step
    ("DataLoader worker ... killed by signal"), with no save and the run FAILED."""
    args = fit_args(
        tmp_path, tiny_data, "--run.name", "group", "--trainer.max_steps", "12",
        "--data.num_workers", "1", "--trainer.callbacks+=sweep_helpers.SignalAtStep",
        "--trainer.callbacks.step=5", f"--trainer.callbacks.signum={signum}",
        "--trainer.callbacks.group=true",
    )  # fmt: skip
    proc, out = cofr_in_a_process(args, own_group=True)
    assert proc.returncode == 128 + signum, out[-3000:]
    assert "killed by signal" not in out and "exited unexpectedly" not in out
    last = tmp_path / "runs" / "test" / "group" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 6
    (run,) = mlflow_runs(tmp_path / "runs").itertuples()
    assert run.status == "KILLED"


@pytest.mark.parametrize("signum", [15, 2], ids=["SIGTERM", "SIGINT"])
def test_a_signal_saves_the_step_marks_the_run_killed_and_exits_nonzero(
    tiny_data, tmp_path, signum
):
    """`cofr fit` in its own process, accumulating 2 micro-batches a step, gets SIGTERM
    (or Ctrl-C) during the first micro-batch of step 5: it finishes the step (both
    micro-batches), saves it (the periodic checkpoint was at step 4), ends the MLflow
    run as KILLED with step 5's metrics, prints how to resume, and exits 128 + signal;
    the resume carries on from 6 and ends where an uninterrupted run does."""
    args = fit_args(
        tmp_path, tiny_data, "--run.name", "sig", "--run.checkpoint_every_n_steps", "4",
        "--trainer.max_steps", "12", "--trainer.accumulate_grad_batches", "2",
        "--trainer.log_every_n_steps", "1", "--trainer.callbacks+=sweep_helpers.SignalAtStep", "--trainer.callbacks.step=5",
        f"--trainer.callbacks.signum={signum}",
    )  # fmt: skip
    proc, out = cofr_in_a_process(args)
    assert proc.returncode == 128 + signum, out[-3000:]
    run_dir = tmp_path / "runs" / "test" / "sig"
    assert f"saved {run_dir / 'checkpoints' / 'last.ckpt'}" in out
    assert "resume with: cofr fit" in out and "--run.name sig --ckpt_path last" in out
    name = {15: "SIGTERM", 2: "SIGINT"}[signum]
    assert f"stopped by {name} after step 6" in out
    assert "Received SIGTERM" not in out  # Lightning's line, below the resume command
    assert "weights_only" not in out  # Lightning's note when a save does not say
    saved = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 6  # step 5 (0-based) completed, nothing lost
    (run,) = mlflow_runs(tmp_path / "runs").itertuples()
    assert run.status == "KILLED"
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    assert [m.step for m in client.get_metric_history(run.run_id, "train/loss")] == [*range(6)]
    assert client.get_run(run.run_id).data.tags["cofr.stopped_at_step"] == "6"  # cofr compare's
    more = ["--trainer.max_steps", "8", "--trainer.accumulate_grad_batches", "2"]
    more += ["--trainer.log_every_n_steps", "1"]
    resumed = CofrCLI(args=fit_args(
        tmp_path, tiny_data, "--run.name", "sig", *more, "--ckpt_path", "last"
    ))  # fmt: skip
    assert resumed.trainer.global_step == 8
    assert "cofr.stopped_at_step" not in client.get_run(run.run_id).data.tags  # resumed
    whole = CofrCLI(args=fit_args(tmp_path, tiny_data, "--run.name", "whole", *more))
    ours, theirs = resumed.model.state_dict(), whole.model.state_dict()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key  # the same micro-batches, same steps

    def history(name: str) -> list[tuple[int, float]]:  # each step once, at its own step
        run_id = (run_dir.parent / name / "mlflow_run_id").read_text().strip()
        metrics = client.get_metric_history(run_id, "train/loss")
        return [(m.step, round(m.value, 5)) for m in metrics]

    assert history("sig") == history("whole")


#: Epochs of 38 batches (16 sequences of 33 tokens) at 3 batches a step: 12 steps of 3
#: and a last of 2, so step 13 has trained 38 batches, not 39.
SHORT_STEP_EPOCHS = [
    "--data.batch_size", "16", "--trainer.accumulate_grad_batches", "3",
    "--trainer.log_every_n_steps", "1", "--run.checkpoint_every_n_steps", "100",
]  # fmt: skip


def test_a_stop_after_an_epoch_that_ended_on_a_short_step_resumes_exactly(tiny_data, tmp_path):
    """Stopped by Ctrl-C in the short step that ends the first epoch, a fit that
    validates every 39 batches took that validation as due after step 13 (13 x 3),
    waited, validated one micro-batch into step 14 (Lightning counts batches: 39 came
    there) and saved "step 13" there: the resume skipped that micro-batch, and warned of
    a validation "that did not finish". It stops after step 13 and resumes as if never
    stopped."""
    common = [*SHORT_STEP_EPOCHS, "--trainer.val_check_interval", "39"]
    common += ["--trainer.max_steps", "15"]
    args = fit_args(
        tmp_path, tiny_data, "--run.name", "short", *common,
        "--trainer.callbacks+=sweep_helpers.SignalAtStep", "--trainer.callbacks.step=12",
        "--trainer.callbacks.signum=2",
    )  # fmt: skip
    proc, out = cofr_in_a_process(args)
    assert proc.returncode == 130, out[-3000:]
    assert "stopped by SIGINT after step 13" in out
    assert "this step validates" not in out  # step 13 does not: it had trained 38 batches
    last = tmp_path / "runs" / "test" / "short" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["batches_trained"] == 38
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = CofrCLI(args=fit_args(
            tmp_path, tiny_data, "--run.name", "short", *common, "--ckpt_path", "last"
        ))  # fmt: skip
    assert not [w for w in caught if "did not finish" in str(w.message)]
    whole = CofrCLI(args=fit_args(tmp_path, tiny_data, "--run.name", "whole", *common))
    assert resumed.trainer.global_step == whole.trainer.global_step == 15
    ours, theirs = resumed.model.state_dict(), whole.model.state_dict()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key  # the same micro-batches, same steps


def test_a_periodic_checkpoint_at_an_epochs_end_is_saved_there(tiny_data, tmp_path):
    """A periodic save that fell on an epoch's last step was put off by Lightning to the
    next validation's end (it expects one after each epoch; here one every 39 batches
    came one micro-batch into step 14): ``step0000013.ckpt`` held that later state under
    the earlier step's name. It is step 13's, saved at its end."""
    args = fit_args(
        tmp_path, tiny_data, "--run.name", "epochs", *SHORT_STEP_EPOCHS,
        "--trainer.val_check_interval", "39", "--trainer.max_steps", "14",
    )  # fmt: skip
    args[args.index("--run.checkpoint_every_n_steps") + 1] = "13"
    CofrCLI(args=args)
    periodic = tmp_path / "runs" / "test" / "epochs" / "checkpoints" / "step0000013.ckpt"
    saved = torch.load(periodic, weights_only=True)
    assert (saved["global_step"], saved["batches_trained"]) == (13, 38)


def test_a_resume_from_an_epoch_cut_short_by_limit_train_batches_starts_the_next_one(
    tiny_data, tmp_path
):
    """``limit_train_batches`` ends each epoch with batches left in the loader: a resume
    from the checkpoint of an epoch's last step read the rest of that epoch, where the
    fit had begun the next one (in a new order). It begins the next one."""
    common = [
        "--trainer.limit_train_batches", "10", "--trainer.max_steps", "13",
        "--trainer.val_check_interval", "100", "--run.checkpoint_every_n_steps", "10",
    ]  # fmt: skip
    whole = CofrCLI(args=fit_args(tmp_path, tiny_data, "--run.name", "whole", *common))
    epoch_end = tmp_path / "runs" / "test" / "whole" / "checkpoints" / "step0000010.ckpt"
    branch = CofrCLI(args=fit_args(
        tmp_path, tiny_data, "--run.name", "branch", *common, "--ckpt_path", str(epoch_end)
    ))  # fmt: skip
    ours, theirs = branch.model.state_dict(), whole.model.state_dict()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key  # the next epoch's batches


def test_last_ckpt_is_the_newest_step_after_a_resume_from_a_signal_stop(tiny_data, tmp_path):
    """Stopped by a signal before the first periodic checkpoint, the run's only
    ``last.ckpt`` is the stop's save, which Lightning's checkpoint state does not know as
    its own: the resumed run must still write its later steps into ``last.ckpt`` (once
    they went to ``last-v1.ckpt``, and generate/eval/export read the stopped weights)."""
    args = fit_args(
        tmp_path, tiny_data, "--run.name", "early", "--run.checkpoint_every_n_steps", "100",
        "--trainer.max_steps", "8", "--trainer.callbacks+=sweep_helpers.SignalAtStep",
        "--trainer.callbacks.step=1", "--trainer.callbacks.signum=15",
    )  # fmt: skip
    proc, out = cofr_in_a_process(args)
    assert proc.returncode == 143, out[-3000:]
    checkpoints = tmp_path / "runs" / "test" / "early" / "checkpoints"
    assert torch.load(checkpoints / "last.ckpt", weights_only=True)["global_step"] == 2
    resumed = CofrCLI(args=fit_args(
        tmp_path, tiny_data, "--run.name", "early", "--run.checkpoint_every_n_steps", "3",
        "--trainer.max_steps", "8", "--ckpt_path", "last",
    ))  # fmt: skip
    assert resumed.trainer.global_step == 8
    assert not list(checkpoints.glob("last-v*.ckpt"))
    assert torch.load(checkpoints / "last.ckpt", weights_only=True)["global_step"] == 8


def test_an_epoch_limited_fit_saves_its_last_step(tiny_data, tmp_path):
    """No max_steps, one epoch of 7 steps, checkpoints every 3: Lightning's end-of-fit
    save is skipped once a periodic one was made, and last.ckpt stayed at step 6."""
    args = fit_args(
        tmp_path, tiny_data, "--run.name", "epoch", "--trainer.max_steps", "-1",
        "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "7",
        "--run.checkpoint_every_n_steps", "3", "--trainer.limit_val_batches", "1",
    )  # fmt: skip
    assert CofrCLI(args=args).trainer.global_step == 7
    last = tmp_path / "runs" / "test" / "epoch" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 7
    # max_steps a multiple of the interval on an epoch's last batch, no validation due
    # there: Lightning puts that save off to a validation that never comes.
    args = fit_args(
        tmp_path, tiny_data, "--run.name", "deferred", "--trainer.max_steps", "6",
        "--trainer.limit_train_batches", "6", "--run.checkpoint_every_n_steps", "3",
        "--trainer.val_check_interval", "4", "--trainer.limit_val_batches", "1",
    )  # fmt: skip
    assert CofrCLI(args=args).trainer.global_step == 6
    last = tmp_path / "runs" / "test" / "deferred" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 6
    # A filesystem clock an hour ahead of the node's: step 6's last.ckpt looked written
    # during step 7 (its mtime after the step began), and step 7 was not saved.
    args = fit_args(
        tmp_path, tiny_data, "--run.name", "skew", "--trainer.max_steps", "-1",
        "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "7",
        "--run.checkpoint_every_n_steps", "3", "--trainer.limit_val_batches", "1",
        "--trainer.callbacks+=sweep_helpers.LastCheckpointFromTheFuture",
    )  # fmt: skip
    assert CofrCLI(args=args).trainer.global_step == 7
    last = tmp_path / "runs" / "test" / "skew" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 7


@pytest.mark.parametrize("every", [2, 10], ids=["checkpointed", "no-checkpoint"])
def test_a_second_ctrl_c_exits_130_with_the_run_killed(tiny_data, tmp_path, every):
    """An impatient second Ctrl-C reaches Lightning's own handler, which ends the process
    with status 1: `cofr fit` exits 130 all the same (a script or SLURM tells an
    interrupted fit from a failed one by it), its MLflow run is KILLED, and it says what
    is left (Lightning's "attempting graceful shutdown" was the last line): the newest
    checkpoint and how to resume, or that there is none."""
    args = fit_args(
        tmp_path, tiny_data, "--run.name", "twice", "--trainer.max_steps", "8",
        "--run.checkpoint_every_n_steps", str(every),
        "--trainer.callbacks+=sweep_helpers.SignalAtStep", "--trainer.callbacks.step=3",
        "--trainer.callbacks.signum=2", "--trainer.callbacks.times=2",
    )  # fmt: skip
    proc, out = cofr_in_a_process(args)
    assert proc.returncode == 130, out[-3000:]
    run_dir = tmp_path / "runs" / "test" / "twice"
    run_id = (run_dir / "mlflow_run_id").read_text().strip()
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    assert client.get_run(run_id).info.status == "KILLED"
    assert "aborted by a second Ctrl-C in step 4: not saved" in out
    if every == 2:
        assert "the newest checkpoint is checkpoints/last.ckpt\nresume with: cofr fit" in out
        assert torch.load(run_dir / "checkpoints" / "last.ckpt")["global_step"] == 2
    else:
        assert "no checkpoint was saved before it: start again with another --run.name" in out


def test_an_aborting_ctrl_c_names_the_checkpoint_a_resume_takes(tmp_path, caplog):
    """The newest of the run's checkpoints is named, not last.ckpt alone (a requeue's
    hpc_ckpt resumes too: "no checkpoint ... or remove" invited deleting a resumable run);
    a sweep worker's (no resume hint) gets no advice to start again; a Ctrl-C before the
    callback's setup (the MLflow run and the data are made first) is the first one."""
    from types import SimpleNamespace

    from cofrgenet.training.callbacks import StopOnSignal

    trainer = SimpleNamespace(default_root_dir=str(tmp_path), global_step=3,
                              state=SimpleNamespace(fn="fit"))  # fmt: skip

    def said(stop: StopOnSignal) -> str:
        caplog.clear()
        with caplog.at_level(logging.INFO):
            stop._say_aborted(trainer)
        return "\n".join(r.getMessage() for r in caplog.records)

    worker = StopOnSignal(resume_hint=lambda name: None)
    worker._set_up, worker._phase = True, "training"
    assert said(worker) == (
        "aborted by a second Ctrl-C in step 4: not saved, and no checkpoint was saved before it"
    )
    (tmp_path / "hpc_ckpt_1.ckpt").write_bytes(b"")
    assert said(worker).endswith("not saved; the newest checkpoint is hpc_ckpt_1.ckpt")
    fit = StopOnSignal(resume_hint=lambda name: f"cofr fit --run.name {name}")
    fit._set_up, fit._phase = True, "training"
    assert said(fit).endswith(f"hpc_ckpt_1.ckpt\nresume with: cofr fit --run.name {tmp_path.name}")
    early = StopOnSignal(resume_hint=lambda name: None)  # idle: its setup has not run
    assert said(early) == "stopped by Ctrl-C before training began: nothing new to save"


def test_a_sigterm_while_the_fit_starts_ends_its_mlflow_run_killed(tiny_data, tmp_path):
    """After the MLflow run exists and before the first step (data, checkpoint, compile):
    the fit stops at once with 143, saves nothing and ends its run KILLED, not RUNNING."""
    args = fit_args(
        tmp_path, tiny_data, "--run.name", "early", "--trainer.max_steps", "4",
        "--trainer.callbacks+=sweep_helpers.SignalAtStep", "--trainer.callbacks.step=0",
        "--trainer.callbacks.signum=15", "--trainer.callbacks.during=start",
    )  # fmt: skip
    proc, out = cofr_in_a_process(args)
    assert proc.returncode == 143, out[-3000:]
    assert "stopped by SIGTERM before training began" in out
    run_dir = tmp_path / "runs" / "test" / "early"
    assert not list(run_dir.glob("checkpoints/*.ckpt"))
    run_id = (run_dir / "mlflow_run_id").read_text().strip()
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    assert client.get_run(run_id).info.status == "KILLED"


def test_a_ctrl_c_in_the_sanity_check_aborts_with_130_and_saves_nothing(tiny_data, tmp_path):
    """The sanity check runs before the first step (a GPU config's compile is there): a
    Ctrl-C then saved a step-0 last.ckpt and the fit ended with status 0."""
    args = fit_args(
        tmp_path, tiny_data, "--run.name", "sane", "--trainer.max_steps", "4",
        "--trainer.num_sanity_val_steps", "2", "--trainer.callbacks+=sweep_helpers.SignalAtStep",
        "--trainer.callbacks.step=0", "--trainer.callbacks.signum=2",
        "--trainer.callbacks.during=sanity",
    )  # fmt: skip
    proc, out = cofr_in_a_process(args)
    assert proc.returncode == 130, out[-3000:]
    run_dir = tmp_path / "runs" / "test" / "sane"
    assert not list(run_dir.glob("checkpoints/*.ckpt"))
    run_id = (run_dir / "mlflow_run_id").read_text().strip()
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    assert client.get_run(run_id).info.status == "KILLED"


@pytest.mark.parametrize("during", ["validation", "training"])
def test_a_signal_during_validation_stops_once_the_whole_validation_is_scored(
    tiny_data, tmp_path, during
):
    """SIGTERM at the second of 4 validation batches after step 10, or during step 10
    itself, which a validation follows: the validation ends and is logged as an
    uninterrupted run logs it, then the run stops and saves step 10. (In step 10 the stop
    came first, and the resumed run never validated at 10: a sweep trial's pruner lost
    that report.)"""
    common = ["--trainer.max_steps", "12", "--trainer.log_every_n_steps", "1"]
    step = 10 if during == "validation" else 9  # SignalAtStep's step: global_step then
    args = fit_args(
        tmp_path, tiny_data, "--run.name", "sig", *common,
        "--trainer.callbacks+=sweep_helpers.SignalAtStep", f"--trainer.callbacks.step={step}",
        "--trainer.callbacks.signum=15", f"--trainer.callbacks.during={during}",
    )  # fmt: skip
    proc, out = cofr_in_a_process(args)
    assert proc.returncode == 143, out[-3000:]
    assert "stopped by SIGTERM after step 10" in out
    assert "Received SIGTERM" not in out  # Lightning's line, below the resume command
    run_dir = tmp_path / "runs" / "test" / "sig"
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 10
    CofrCLI(args=fit_args(tmp_path, tiny_data, "--run.name", "whole", *common))
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")

    def val_losses(name: str) -> list[tuple[int, float]]:
        run_id = (tmp_path / "runs" / "test" / name / "mlflow_run_id").read_text().strip()
        return [(m.step, m.value) for m in client.get_metric_history(run_id, "val/loss")]

    assert val_losses("sig") == val_losses("whole") != []
    # Resumed, it logs every later step where the uninterrupted run does.
    CofrCLI(args=fit_args(tmp_path, tiny_data, "--run.name", "sig", *common, "--ckpt_path", "last"))

    def history(name: str, key: str) -> list[tuple[int, float]]:
        run_id = (tmp_path / "runs" / "test" / name / "mlflow_run_id").read_text().strip()
        return [(m.step, round(m.value, 5)) for m in client.get_metric_history(run_id, key)]

    for key in ("train/loss", "opt/lr", "val/loss"):
        assert history("sig", key) == history("whole", key), key


def test_a_bare_fit_trains_on_the_default_data(tmp_path, monkeypatch):
    """`cofr data prepare` then `cofr fit` with nothing else (here capped at 2 steps)."""
    from cofrgenet import cli

    monkeypatch.chdir(tmp_path)
    assert cli.main(["data", "prepare", "--max-docs", "12", "--num-workers", "1"]) == 0
    assert cli.main(["fit", "--trainer.max_steps", "2", "--trainer.enable_progress_bar",
                     "false", "--data.num_workers", "0"]) == 0  # fmt: skip
    (run,) = (tmp_path / "runs" / "default").iterdir()
    assert (run / "checkpoints" / "last.ckpt").is_file()


def test_the_newest_k_periodic_checkpoints_are_kept(tiny_data, tmp_path):
    CofrCLI(args=fit_args(
        tmp_path, tiny_data, "--run.name", "k", "--run.checkpoint_every_n_steps", "2",
        "--run.keep_checkpoints", "2", "--trainer.max_steps", "8", "--run.mlflow", "false",
    ))  # fmt: skip
    folder = tmp_path / "runs" / "test" / "k" / "checkpoints"
    names = sorted(p.name for p in folder.glob("*.ckpt"))
    assert names == ["last.ckpt", "step0000006.ckpt", "step0000008.ckpt"]
    with pytest.raises(ConfigError, match="keep_checkpoints"):
        CofrCLI(args=fit_args(tmp_path, tiny_data, "--run.keep_checkpoints", "0"))


def test_a_resume_after_a_hard_kill_logs_each_step_once(tiny_data, tmp_path):
    """Killed at step 6 with its newest checkpoint at step 4: the resume replays 4 and 5,
    which MLflow already has; the run's history holds every step once, equal to a run
    that was never stopped."""
    common = ["--trainer.max_steps", "8", "--trainer.log_every_n_steps", "1",
              "--trainer.val_check_interval", "100", "--run.checkpoint_every_n_steps", "4",
              "--run.keep_checkpoints", "-1"]  # fmt: skip
    CofrCLI(args=fit_args(tmp_path / "a", tiny_data, *common, "--run.name", "straight"))
    b = ["--run.name", "killed"]
    CofrCLI(args=fit_args(tmp_path / "b", tiny_data, *common, *b,
                          "--trainer.callbacks+=helpers.StopAtStep", "--trainer.callbacks.step=6"))  # fmt: skip
    folder = tmp_path / "b" / "runs" / "test" / "killed" / "checkpoints"
    (folder / "last.ckpt").write_bytes((folder / "step0000004.ckpt").read_bytes())  # the kill
    CofrCLI(args=fit_args(tmp_path / "b", tiny_data, *common, *b, "--ckpt_path", "last"))
    histories = {}
    for label in ("a", "b"):
        runs = mlflow_runs(tmp_path / label / "runs")
        client = mlflow.tracking.MlflowClient(
            f"sqlite:///{tmp_path / label / 'runs' / 'mlflow.db'}"
        )
        history = client.get_metric_history(runs.run_id[0], "train/loss")
        steps = [m.step for m in history]
        assert sorted(steps) == list(range(8)), f"{label}: {sorted(steps)}"  # each step once
        histories[label] = {m.step: m.value for m in history}
    assert histories["a"] == histories["b"]


def test_data_block_size_defaults_to_the_models(tiny_data, tmp_path):
    args = [a for a in fit_args(tmp_path, tiny_data)[1:]]
    i = args.index("--data.block_size")
    del args[i : i + 2]  # unset: the model's (32 here)
    cli = CofrCLI(args=args, run=False)
    assert cli.datamodule.block_size == cli.model.model_config.block_size == 32
    shorter = CofrCLI(args=[*args, "--data.block_size", "16"], run=False)
    assert shorter.datamodule.block_size == 16  # shorter training sequences stay possible


def test_lightning_private_api_is_pinned():
    """cofr fit reaches into LightningCLI through training/lightning_cli.py only: those
    private methods exist in the installed Lightning, which is the version they were
    written for (an upgrade must re-check them and move PINNED_LIGHTNING on purpose)."""
    import inspect

    from lightning.pytorch.cli import LightningCLI

    from cofrgenet.training import lightning_cli

    assert lightning_cli.pinned_version_ok(), "Lightning moved: re-check lightning_cli.py"
    for name in lightning_cli.PRIVATE_METHODS:
        assert callable(getattr(LightningCLI, name, None)), name
    from lightning.pytorch.strategies import FSDPStrategy

    from cofrgenet.training import strategies

    for name in strategies.PRIVATE_METHODS:
        assert callable(getattr(FSDPStrategy, name, None)), name
        assert name in vars(strategies.LadderFSDPStrategy), name
    params = inspect.signature(LightningCLI._instantiate_trainer).parameters
    assert list(params)[1:3] == ["config", "callbacks"]
    # Loggers named by their modules' paths: a renamed module would leave a filter idle.
    import importlib.util

    from cofrgenet.training import callbacks, console

    for logger in (*console.FILTERED_LOGGERS, callbacks._LIGHTNING_SIGNAL_LOGGER):
        assert importlib.util.find_spec(logger) is not None, logger
    src = ROOT / "src" / "cofrgenet"
    sources = [src / "training" / "cli.py", *sorted((src / "sweeps").glob("*.py"))]
    for path in sources:
        text = path.read_text()
        used = [
            n for n in lightning_cli.PRIVATE_METHODS if f"self.{n}(" in text or f"def {n}(" in text
        ]
        assert not used, f"{path} uses LightningCLI's {used}: go through lightning_cli.py"


def option_help(help_text: str, option: str) -> str:
    """What argparse ``help_text`` says of ``option``, without jsonargparse's
    ``(type: ..., default: ...)`` suffix and with the lines joined."""
    lines = help_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == [option])
    block = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith(" " * 10):  # the next option, or the next group's title
            break
        block.append(line)
    text = " ".join(" ".join(block).split())
    text = text.split(" ", 1)[1] if " " in text else ""  # drop the option itself
    metavar = option.rsplit(".", 1)[-1].lstrip("-").upper()
    if text.startswith(metavar):
        text = text[len(metavar) :]
    if text[:1] in ("{", "["):  # choices, or a list's [ITEM,...]
        text = text.split("}" if text[0] == "{" else "]", 1)[1]
    return re.sub(r"\(type: .*$", "", text).strip()


def test_fit_help_gives_cofr_meanings(capsys):
    """`cofr fit --help` says what cofr does with --ckpt_path (a path, or `last`; none of
    Lightning's keywords), and has a help line for every field of RunConfig and
    OptimizerConfig (jsonargparse reads them from the classes' ``Args:`` sections)."""
    import dataclasses

    from cofrgenet import cli
    from cofrgenet.training.optim import OptimizerConfig
    from cofrgenet.training.run_store import RunConfig

    assert cli.main(["fit", "--help"]) == 0
    fit_help = capsys.readouterr().out
    ckpt = option_help(fit_help, "--ckpt_path")
    assert "`last`" in ckpt and "newest intact checkpoint" in ckpt
    assert "\ncheckpoint:\n  --ckpt_path" in fit_help  # its group, not Lightning's docstring
    for lightning_word in ("registry", 'hpc"', "best", "an exception is raised"):
        assert lightning_word not in ckpt, lightning_word
    for field in dataclasses.fields(RunConfig):
        assert option_help(fit_help, f"--run.{field.name}"), f"run.{field.name} has no help"
    # jsonargparse's "Path to a configuration file." where the README passes JSON.
    for section in ("--model", "--model.config", "--data", "--run"):
        assert "inline ('{field: value, ...}')" in option_help(fit_help, section), section
    assert "Path to a configuration file." not in fit_help
    optimizer = option_help(fit_help, "--model.optimizer")  # names every field
    assert all(field.name in optimizer for field in dataclasses.fields(OptimizerConfig))
    with pytest.raises(SystemExit):
        ParseOnlyCLI(args=["fit", "--model.optimizer.help"])
    optimizer_help = capsys.readouterr().out
    for field in dataclasses.fields(OptimizerConfig):
        option = f"--model.optimizer.{field.name}"
        assert option_help(optimizer_help, option), f"{option} has no help"
    assert cli.main(["validate", "--help"]) == 0
    assert "`last` (also when unset)" in option_help(capsys.readouterr().out, "--ckpt_path")
    assert cli.main(["test", "--help"]) == 0  # our description, not Lightning's cut one
    test_help = " ".join(capsys.readouterr().out.split())
    assert "Score a checkpoint like validate, logged as test/loss" in test_help
    assert "separated from fit" not in test_help and "checkpoint: --ckpt_path" in test_help
    assert ":data:`" not in fit_help and "(*) marks fields whose default" in " ".join(
        fit_help.split()
    )


@pytest.mark.parametrize(
    "args,match",
    [
        (
            ["--model.preset", "gpt2-tinyy"],
            r"unknown preset 'gpt2-tinyy' \(did you mean 'gpt2-tiny'",
        ),
        (["--data.batch_size", "0"], "data.batch_size must be >= 1"),
        (["--data.val_batch_size", "-3"], "data.val_batch_size must be >= 1"),
        (["--data.num_workers", "-1"], "data.num_workers must be >= 0"),
        (["--data.seed", "-1"], r"data\.seed must be in \[0, 4294967295\], got -1"),
        (
            ["--run.runs_dir", "${COFR_TEST_UNSET}/runs"],
            r"^run\.runs_dir: \$\{COFR_TEST_UNSET\} is not set in the environment",
        ),
        (["--seed_everything", "4294967296"], r"^seed_everything must be in \[0, 4294967295\]"),
        (
            ["--model.config.n_head", "3"],
            r"^model\.config: n_embd \(64\) must be a multiple of n_head",
        ),
        (["--model.optimizer.lr", "-1"], "^model.optimizer.lr must be positive"),
        (
            ["--model.optimizer", '{"betas": [0.9, 1.5]}'],
            r"^model.optimizer.betas must be two .*\[0, 1\)",
        ),
        (["--trainer.gradient_clip_algorithm", "nrm"], "trainer: `gradient_clip_algorithm` nrm"),
        (["--trainer.max_steps", "0"], "trainer.max_steps must be >= 1"),
        (["--trainer.max_steps", "-5"], "trainer: `max_steps` must be"),
        (["--trainer.max_steps", "x"], "trainer.max_steps: expected an integer, got 'x'"),
        (
            ["--model.optimizer.betas", "0.9,0.95"],
            r"^model\.optimizer\.betas: expected a list in brackets \('\[a, b\]'\), got",
        ),
        (
            ["--model.optimizer.betas", "[0.9]"],
            r"^model\.optimizer\.betas: expected a list of 2 values in brackets, got '\[0\.9\]'$",
        ),
        (["--trainer.accumulate_grad_batches", "0"], "accumulate_grad_batches must be >= 1"),
        (["--trainer.gradient_clip_val", "-1"], r"gradient_clip_val must be >= 0"),
        (["--run.checkpoint_every_n_steps", "0"], r"checkpoint_every_n_steps must be >= 1"),
        (["--trainer.val_check_interval", "0"], r"val_check_interval must be > 0"),
        (["--trainer.limit_train_batches", "0"], "limit_train_batches is 0: nothing would"),
        (["--trainer.max_epochs", "0"], "trainer.max_epochs is 0: nothing would train"),
        (
            ["--trainer.limit_val_batches", "-1"],
            r"^trainer\.limit_val_batches must be >= 0 \(a fraction of the batches up to 1\.0, "
            r"or a number of batches; null: all\), got -1$",
        ),
        (
            ["--trainer.strategy", "ddpp"],
            r"^trainer\.strategy: no strategy 'ddpp' \(did you mean 'ddp'\?\): give auto, one "
            r"of Lightning's \(ddp, ddp_spawn, ddp_fork, fsdp, \.\.\.\) or a class path "
            r"\(cofrgenet\.training\.strategies\.LadderFSDPStrategy\)$",
        ),
        (
            ["--trainer.strategy", "fsdp"],
            r"^trainer: The strategy `fsdp` requires a GPU accelerator.* \(cofr's FSDP runs on "
            r"CPU too: --trainer\.strategy cofrgenet\.training\.strategies\.LadderFSDPStrategy\)$",
        ),
        (
            ["--trainer.callbacks+=DyadicUnfreezng"],
            r"^trainer\.callbacks: 'DyadicUnfreezng' is no callback class \(did you mean "
            r"'cofrgenet\.training\.callbacks\.DyadicUnfreezing'\?\)",
        ),
        (
            ["--trainer.callbacks+", "cofrgenet.training.callbacks.DyadicUnfreezng"],
            r"^trainer\.callbacks: 'cofrgenet\.training\.callbacks\.DyadicUnfreezng' is no "
            r"callback class \(did you mean 'cofrgenet\.training\.callbacks\.DyadicUnfreezing'",
        ),
        (
            ["--model.optimizer.fused", "maybe"],
            r"^model\.optimizer\.fused: expected true or false, got 'maybe'$",
        ),
        (
            ["--model.optimizer", '{"fused": "maybe"}'],
            r"^model\.optimizer\.fused: expected true or false, got 'maybe'$",
        ),
        (["--model.config", "no/such.yaml"], r"^model\.config no/such\.yaml: no such file$"),
        (
            ["--config", str(CONF / "trainer" / "cpu-debug.yaml"), "--config", "{depth_three}"],
            r"^model\.config\.depth \(in .*depth-three\.yaml\): expected an integer, got 'three'$",
        ),
        (
            ["--config", "conf/trainer/cpu-debg.yaml"],
            r"^--config conf/trainer/cpu-debg\.yaml: no such file \(did you mean "
            r"'conf/trainer/cpu-debug\.yaml'\?\)$",
        ),
        (["-config", "x.yaml"], r"^-config: options take two dashes \(--config\)$"),
        (["-trainer.max_steps=3"], r"^-trainer\.max_steps: options take two dashes"),
        (["--trainer.devices", "abc"], r"^trainer: `devices` selected with `CPUAccelerator`"),
        (["--trainer.devices", "-2"], r"^trainer: `devices` selected with `CPUAccelerator`"),
        (["--trainer.default_root_dir", "elsewhere"], r"^trainer\.default_root_dir is the run"),
        (["--trainer.enable_checkpointing", "false"], r"enable_checkpointing: false is not"),
        (
            [
                "--trainer.callbacks+=cofrgenet.training.callbacks.DyadicUnfreezing",
                "--trainer.callbacks.schedule",
                "papr",
            ],
            r"^unknown dyadic schedule 'papr'",
        ),
        (
            ["--model.config.depth", "1.5"],
            r"^model\.config\.depth: expected an integer, got '1\.5'$",
        ),
        (  # given as JSON, the key was doubled (model.config.model.config.depth)
            ["--model.config", '{"depth": "three"}'],
            r"^model\.config\.depth: expected an integer, got 'three'$",
        ),
        (
            ["--model", '{"config": {"depth": "three"}}'],
            r"^model\.config\.depth: expected an integer, got 'three'$",
        ),
        (  # and a dataclass option's field was named alone ("lr: expected a number")
            ["--model.optimizer", '{"lr": "fast"}'],
            r"^model\.optimizer\.lr: expected a number, got 'fast'$",
        ),
        (["--trainer.precision", "17"], "trainer.precision: '17' is not one of 64, 32, 16, .*bf16"),
        (["--ckpt_path", "last"], "no run of experiment 'test' .* has a checkpoint to resume"),
        (["--run.name", ".."], r"run\.name '\.\.' is not a folder name"),
        (["--run.name", "ab/c"], r"run\.name 'ab/c' has a path separator.*use 'ab-c'"),
        (
            ["--run.experiment", "my exp"],
            r"run\.experiment 'my exp' is not a folder name as "
            r"given.*e\.g\. 'my-exp'",
        ),  # it would share runs/my-exp with the experiment my-exp
        (
            ["--run.name", "über run"],
            r"run\.name 'über run' is not a folder name.*e\.g\. 'uber-run'",
        ),
        (["--trainer.accelerator", "mps"], r"not available.*--trainer\.accelerator cpu"),
        (  # refused by the callback's setup, once the fit ran: was a traceback
            ["--run.mlflow", "false", "--trainer.callbacks+=LearningRateMonitor"],
            r"^trainer: Cannot use `LearningRateMonitor` callback with `Trainer` that has no logger",
        ),
        (  # Lightning refused it at the first validation, a training interval in
            ["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor=val_loss"],
            r"^trainer.callbacks: EarlyStopping monitors 'val_loss', which a fit does not log "
            r"\(did you mean 'val/loss'\?\); it logs val/loss, val/ppl, train/loss",
        ),
        (["--run.tracking_uri", "foo://bar"], r"MLflow cannot use 'foo://bar'.*--run.mlflow false"),
        (["--run.tracking_uri", "http://127.0.0.1:9"], r"no MLflow server answers at http"),
    ],
    ids=lambda v: v[0] if isinstance(v, list) else None,
)
def test_bad_settings_are_one_line_errors_that_leave_no_run(tiny_data, tmp_path, args, match):
    """Each is a UserError (``cofr`` prints its message alone), raised before a run starts."""
    if "{depth_three}" in args:  # a bad value in a file: the message names the file
        (tmp_path / "depth-three.yaml").write_text("model:\n  config:\n    depth: three\n")
        args = [str(tmp_path / "depth-three.yaml") if a == "{depth_three}" else a for a in args]
    with pytest.raises(UserError, match=match):
        CofrCLI(args=fit_args(tmp_path, tiny_data, *args))
    # Nor the empty experiment folder it made (runs/<experiment>/ with no run in it).
    assert not (tmp_path / "runs" / "test").exists(), "a failed start left its folders"


@pytest.mark.parametrize(
    "text",
    [
        "model:\n  preset: gpt2-tiny\nmodel.config.vocab_size: 320\n",  # the preset was reset
        "model.config.vocab_size: 320\nmodel:\n  preset: gpt2-tiny\n",  # the size was lost
        "model:\n  config.depth: 3\n  config:\n    ladders: 2\n",
    ],
    ids=["dotted-after", "dotted-before", "nested"],
)
def test_a_dotted_key_beside_its_group_in_one_file_is_refused(tiny_data, tmp_path, text):
    """`model: {preset: X}` and `model.config.vocab_size: 320` in one file: the merge
    dropped one of them by their order, silently."""
    config = tmp_path / "mixed.yaml"
    config.write_text(text)
    with pytest.raises(UserError, match=r"^config file .*mixed\.yaml: `model\.config.*` beside "
                       r"`model.*:` in one mapping \(one of the two would be dropped\)"):  # fmt: skip
        CofrCLI(args=fit_args(tmp_path, tiny_data, "--config", str(config)))
    assert not (tmp_path / "runs" / "test").exists()


#: What launchers across nodes set (a test's own shell may run under one).
NODE_LAUNCH_VARIABLES = (
    "NODE_RANK", "GROUP_RANK", "RANK", "WORLD_SIZE", "SLURM_NTASKS", "SLURM_STEP_ID",
    "TORCHELASTIC_RUN_ID", "LSB_JOBID",
)  # fmt: skip


def test_several_nodes_without_a_launcher_are_refused(tiny_data, tmp_path, monkeypatch):
    """trainer.num_nodes 2 in a process started alone waited in the rendezvous forever,
    deaf to Ctrl-C: refused before the run starts. Under a launcher it is Lightning's."""
    from cofrgenet.training.cli import launched_across_nodes

    for name in NODE_LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert not launched_across_nodes()
    match = r"^trainer\.num_nodes is 2, but this process was started alone .*trainer\.num_nodes 1$"
    with pytest.raises(UserError, match=match):
        CofrCLI(args=fit_args(tmp_path, tiny_data, "--trainer.num_nodes", "2"))
    assert not (tmp_path / "runs" / "test").exists()
    monkeypatch.setenv("NODE_RANK", "1")  # a manual launch, one command per node
    assert launched_across_nodes()
    monkeypatch.delenv("NODE_RANK")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    monkeypatch.setenv("SLURM_STEP_ID", "0")  # a job step: srun started it
    assert launched_across_nodes()


def test_a_fit_in_a_batch_script_of_several_tasks_without_srun_is_refused(
    tiny_data, tmp_path, monkeypatch
):
    """`cofr fit` run by an sbatch script of --ntasks-per-node=2 without srun waited for a
    second rank forever: Lightning reads the job's tasks as its ranks (the batch script
    has SLURM_NTASKS but no SLURM_STEP_ID; .ci's SLURM shows it). One task, or srun's job
    step, goes on."""
    from cofrgenet.training.cli import launched_across_nodes, slurm_tasks_without_srun

    for name in NODE_LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_NAME", "train.sbatch")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    for name, value in {"SLURM_NTASKS_PER_NODE": "2", "SLURM_NODEID": "0", "SLURM_PROCID": "0",
                        "SLURM_LOCALID": "0", "SLURM_NNODES": "1"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)  # as in the batch script (.ci's SLURM)
    assert slurm_tasks_without_srun() == 2
    assert not launched_across_nodes()
    match = (
        r"^this process runs in a SLURM batch script itself, whose job has 2 tasks "
        r"\(SLURM_NTASKS\): .* wait for the other 1 forever\. Start it with srun"
    )
    with pytest.raises(UserError, match=match):
        CofrCLI(args=fit_args(tmp_path, tiny_data, "--trainer.devices", "2"))
    assert not (tmp_path / "runs" / "test").exists()

    # What reads no SLURM ranks goes on: a one-device fit (runs packed in one job), a
    # cluster environment given (a sweep worker's), torchrun's ranks.
    def checked(*extra: str) -> None:
        CofrCLI(args=fit_args(tmp_path, tiny_data, *extra)[1:], run=False).check_launched_by_srun()

    with pytest.raises(UserError, match=match):
        checked("--trainer.devices", "2")
    checked("--trainer.devices", "1")
    environment = "lightning.pytorch.plugins.environments.LightningEnvironment"
    checked("--trainer.devices", "2", "--trainer.plugins", environment)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    assert slurm_tasks_without_srun() is None
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    assert slurm_tasks_without_srun() is None
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    assert slurm_tasks_without_srun() is None


def test_a_damaged_run_store_is_refused_before_the_run(tiny_data, tmp_path, capsys):
    """A runs/mlflow.db that is no database: cofr fit printed SQLAlchemy's traceback ("file
    is not a database") once the run's folder and lock were made."""
    store = tmp_path / "runs"
    store.mkdir()
    (store / "mlflow.db").write_text("hello\n")
    with pytest.raises(UserError) as refused:
        CofrCLI(args=fit_args(tmp_path, tiny_data))
    assert str(refused.value) == (
        f"{store / 'mlflow.db'} is not an MLflow database (file is not a database): move it "
        "aside (the next cofr fit makes a new store), or fix --run.tracking_uri (or "
        "MLFLOW_TRACKING_URI), or train with --run.mlflow false"
    )
    assert sorted(p.name for p in store.iterdir()) == ["mlflow.db"]  # nothing made, nor lost
    # A folder at the database's path: SQLite's "unable to open database file" traceback.
    (store / "mlflow.db").unlink()
    (store / "mlflow.db").mkdir()
    with pytest.raises(UserError, match=r"mlflow.db is a folder, not an MLflow database file"):
        CofrCLI(args=fit_args(tmp_path, tiny_data))
    from cofrgenet.cli import main

    assert main(["compare", "--runs-dir", str(store)]) == 2
    assert "mlflow.db is a folder, not an MLflow database" in capsys.readouterr().err


def test_a_read_only_checkpoints_folder_is_refused_before_the_steps(
    tiny_data, tmp_path, monkeypatch
):
    """Refused at the first save, once the steps to it had trained (500 at the default
    interval)."""
    run = ["--run.name", "ro", "--trainer.max_steps"]
    CofrCLI(args=fit_args(tmp_path, tiny_data, *run, "1"))
    saves = tmp_path / "runs" / "test" / "ro" / "checkpoints"
    kept = sorted(p.name for p in saves.iterdir())
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != saves and real(path, mode))
    with pytest.raises(UserError, match=rf"^cannot write in {saves} \(read-only\)"):
        CofrCLI(args=fit_args(tmp_path, tiny_data, *run, "3", "--ckpt_path", "last"))
    assert sorted(p.name for p in saves.iterdir()) == kept


def test_a_run_store_that_cannot_be_written_is_refused_before_the_run(tmp_path, monkeypatch):
    """A read-only mlflow.db (or its folder): a screen of MLflow tracebacks, after the
    resumed run's config.yaml was rewritten."""
    from cofrgenet.training import run_store

    store = tmp_path / "runs" / "mlflow.db"
    store.parent.mkdir()
    store.write_text("")
    uri, fix = f"sqlite:///{store}", "choose another"
    run_store.check_store_writable(uri, fix)  # writable: nothing said
    for read_only in (store, store.parent):
        monkeypatch.setattr(run_store.os, "access", lambda path, mode, r=read_only: path != r)
        what = "file" if read_only == store else "folder"
        with pytest.raises(ConfigError, match=rf"its {what} {read_only} is read-only; make it "):
            run_store.check_store_writable(uri, fix)


def test_monitors_are_checked_where_cofr_knows_every_metric_logged():
    """A monitor no fit logs is refused (EarlyStopping's `val_loss`), unless the callback
    allows it missing (strict: false) or a callback of the user's may log it."""
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    import helpers
    from cofrgenet.training.cli import _check_monitors

    with pytest.raises(ConfigError, match=r"EarlyStopping monitors 'val_loss'.*'val/loss'"):
        _check_monitors([EarlyStopping(monitor="val_loss")])
    _check_monitors([EarlyStopping(monitor="val/loss"), ModelCheckpoint(monitor="step")])
    _check_monitors([EarlyStopping(monitor="val_loss", strict=False)])
    _check_monitors([EarlyStopping(monitor="my/acc"), helpers.StopAtStep(3)])  # its own
    _check_monitors(None)


def test_only_a_callbacks_misconfiguration_is_a_one_line_error():
    """Lightning's MisconfigurationException from a callback's hook is a setting refused;
    from elsewhere (the module's hooks) it is a bug, and keeps its traceback."""
    import lightning.pytorch as L
    from lightning.pytorch.utilities.exceptions import MisconfigurationException

    from cofrgenet.training.cli import raised_by_a_callback

    class Refusing(L.Callback):
        def setup(self, trainer, pl_module, stage):
            raise MisconfigurationException("no logger")

    def caught(call) -> BaseException:
        try:
            call()
        except MisconfigurationException as error:
            return error
        raise AssertionError("not raised")

    assert raised_by_a_callback(caught(lambda: Refusing().setup(None, None, "fit")))
    assert not raised_by_a_callback(caught(lambda: (_ for _ in ()).throw(
        MisconfigurationException("configure_optimizers returned 3"))))  # fmt: skip


def test_a_run_store_is_made_whole_or_not_at_all(tmp_path, monkeypatch):
    """A Ctrl-C as a first fit started (MLflow making the store's tables, seconds) left a
    mlflow.db that every later command failed to open with SQLAlchemy's traceback ("table
    label_schemas already exists"). The tables are made beside it, then linked in whole."""
    import mlflow.tracking

    from cofrgenet.training import run_store

    store = tmp_path / "runs" / "mlflow.db"
    uri = f"sqlite:///{store}"
    real = mlflow.tracking.MlflowClient

    class CutShort:  # the tables half made, then Ctrl-C
        def __init__(self, made_at: str) -> None:
            Path(made_at.removeprefix("sqlite:///")).write_bytes(b"SQLite format 3\x00")
            raise KeyboardInterrupt

    monkeypatch.setattr(mlflow.tracking, "MlflowClient", CutShort)
    with pytest.raises(KeyboardInterrupt):
        run_store.make_store(uri)
    assert list(store.parent.iterdir()) == []  # no store, nor the half-made one beside it
    monkeypatch.setattr(mlflow.tracking, "MlflowClient", real)
    run_store.make_store(uri)
    assert [p.name for p in store.parent.iterdir()] == ["mlflow.db"]
    assert [e.name for e in real(uri).search_experiments()] == ["Default"]
    before = store.stat().st_mtime_ns
    run_store.make_store(uri)  # there already: left as it is
    assert store.stat().st_mtime_ns == before

    def no_links(*args):
        raise PermissionError("this file system has no hard links")

    monkeypatch.setattr(os, "link", no_links)  # moved in instead
    other = tmp_path / "other" / "mlflow.db"
    run_store.make_store(f"sqlite:///{other}")
    assert [p.name for p in other.parent.iterdir()] == ["mlflow.db"]


def test_a_store_made_before_half_is_refused_in_one_line(tiny_data, tmp_path):
    """A store cut short before cofr made stores whole (no experiment, not even MLflow's
    Default): cofr fit and cofr ui ended in SQLAlchemy's traceback, every time."""
    import sqlite3

    from cofrgenet.training.run_store import check_store_exists, make_store

    store = tmp_path / "runs" / "mlflow.db"
    make_store(f"sqlite:///{store}")
    with sqlite3.connect(store) as connection:
        connection.execute("DELETE FROM experiments")
    with pytest.raises(UserError) as refused:
        CofrCLI(args=fit_args(tmp_path, tiny_data))
    assert str(refused.value).startswith(
        f"{store} is an MLflow store whose making was cut short (it has no experiment, not "
        "even MLflow's Default: a Ctrl-C as a first run started?): move it aside (it holds "
        "no run; the next cofr fit makes a new store), or fix --run.tracking_uri"
    )
    with pytest.raises(UserError, match=r"whose making was cut short .*, or name the runs folder"):
        check_store_exists(f"sqlite:///{store}", None)  # cofr ui, cofr compare


def test_a_bad_peak_in_the_environment_fails_before_the_run(tiny_data, tmp_path, monkeypatch):
    """$COFR_PEAK_FLOPS is read at the first step's end: a typo there is found first."""
    monkeypatch.setenv("COFR_PEAK_FLOPS", "1e12x")
    with pytest.raises(UserError, match=r"^COFR_PEAK_FLOPS='1e12x': give one device's peak"):
        CofrCLI(args=fit_args(tmp_path, tiny_data))
    assert not (tmp_path / "runs" / "test").exists(), "a failed start left its folders"


def test_the_seed_is_said_once_the_run_is_built_not_above_an_error(tiny_data, tmp_path, caplog):
    def said() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.getMessage().startswith(("Seed set", "seed_everything"))
        ]

    with caplog.at_level(logging.INFO), pytest.raises(UserError, match="unknown preset"):
        CofrCLI(args=fit_args(tmp_path, tiny_data, "--model.preset", "gpt2-tinyy"))
    assert said() == []
    caplog.clear()
    with caplog.at_level(logging.INFO):
        CofrCLI(
            args=fit_args(tmp_path, tiny_data, "--trainer.max_steps", "1", "--seed_everything", "7")
        )
    assert said() == ["seed_everything: 7"]


def test_seed_everything_true_draws_a_seed_and_records_it(tiny_data, tmp_path, monkeypatch):
    """`--seed_everything true` ("a random seed", its help says) trained every run with
    seed 0 (Lightning's seed_everything() without a seed): runs meant to differ were the
    same. A seed is drawn, recorded in config.yaml; a rank Lightning started takes its
    launcher's; ranks srun or torchrun started, which would each draw their own, are
    refused with the fix."""
    import secrets

    import yaml

    from cofrgenet.training.cli import drawn_seed

    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    monkeypatch.delenv("SLURM_STEP_NUM_TASKS", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv("PL_GLOBAL_SEED", "5")  # restored after the test: the fit sets it
    monkeypatch.setattr(secrets, "randbelow", lambda limit: 48879 if limit == 2**32 else 0)
    CofrCLI(
        args=fit_args(
            tmp_path, tiny_data, "--trainer.max_steps", "1", "--seed_everything", "true",
            "--run.name", "drawn",
        )
    )  # fmt: skip
    saved = yaml.safe_load((tmp_path / "runs" / "test" / "drawn" / "config.yaml").read_text())
    assert saved["seed_everything"] == 48879
    assert os.environ["PL_GLOBAL_SEED"] == "48879"  # Lightning's seed_everything(48879) ran
    monkeypatch.setattr(secrets, "randbelow", lambda limit: 7)
    # Its resume keeps the seed it drew (a new draw rewrote the record of what seeded
    # its initial weights), as does a sweep trial's retry, which parses in its folder.
    CofrCLI(
        args=fit_args(
            tmp_path, tiny_data, "--trainer.max_steps", "2", "--seed_everything", "true",
            "--run.name", "drawn", "--ckpt_path", "last",
        )
    )  # fmt: skip
    saved = yaml.safe_load((tmp_path / "runs" / "test" / "drawn" / "config.yaml").read_text())
    assert saved["seed_everything"] == 48879
    assert drawn_seed() == 7  # another fit in this process: PL_GLOBAL_SEED is the last one's
    monkeypatch.setenv("LOCAL_RANK", "0")  # Lightning's launcher sets it in its own process
    assert drawn_seed() == 7
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert drawn_seed() == 48879  # a rank Lightning started: its launcher's seed
    monkeypatch.delenv("PL_GLOBAL_SEED")
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "4")
    with pytest.raises(ConfigError, match=r"the 4 ranks srun started .* --seed_everything 1234"):
        drawn_seed()
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="the 2 ranks torchrun started"):
        drawn_seed()


@pytest.mark.parametrize(
    "text,match",
    [
        ("# nothing set\n", "holds no settings"),
        ("trainer:\n  max_steps: 2\n   bad: [1,\n", r"line 3, column 7: .*not valid YAML"),
        ("trainer: 5\n", "`trainer:` holds a number, not its keys"),
        # These reset every earlier setting of the section, or dropped a block, silently.
        ("trainer:\n  # max_steps: 3\n", "`trainer:` holds nothing, not its keys"),
        ("run: [a]\n", "`run:` holds a list, not its keys"),
        ("model:\n  config: [1, 2]\n", "`model.config:` holds a list"),
        ("trainer:\n  max_steps: 7\ntrainer:\n  accelerator: cpu\n", "'trainer' is given twice"),
    ],
    ids=["empty", "syntax", "not-a-mapping", "empty-section", "list-section", "list-config",
         "twice"],
)  # fmt: skip
def test_a_bad_config_file_is_named(tiny_data, tmp_path, text, match):
    """Before jsonargparse reads it: an empty section or a list there reset every earlier
    setting of the section to its default (accelerator: auto, no clipping), and a key
    given twice kept only its last block."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(UserError, match=match):
        CofrCLI(args=fit_args(tmp_path, tiny_data, "--config", str(bad)))


def test_triton_ladders_on_a_cpu_run_are_refused_before_the_run_starts(
    tiny_data, tmp_path, monkeypatch
):
    """The kernels would raise at the first step, after the run folder was written."""
    monkeypatch.delenv("TRITON_INTERPRET")  # the test suite's interpreter: as on a user's CPU
    args = fit_args(tmp_path, tiny_data, "--model.config.ladder_impl", "triton")
    with pytest.raises(UserError, match=r"ladder_impl: triton needs a CUDA device.*on CPU"):
        CofrCLI(args=args)
    with pytest.raises(UserError, match=r"or TRITON_INTERPRET=1 in the environment"):
        CofrCLI(args=args)  # the way to run them here all the same
    assert not (tmp_path / "runs" / "test").exists() or not any(
        (tmp_path / "runs" / "test").iterdir()
    )


@pytest.mark.skipif(not triton_available(), reason="the triton package is not installed")
@pytest.mark.parametrize("value", ["1", "true", "on", "yes", "0", "false", ""])
def test_the_ladder_device_check_reads_triton_interpret_as_triton_does(monkeypatch, value):
    """TRITON_INTERPRET=true runs the kernels on CPU (Triton reads a boolean): a CPU fit
    with ladder_impl: triton goes on exactly when Triton's own knob says it interprets."""
    import triton

    from cofrgenet.training.cli import _check_ladder_device

    monkeypatch.setenv("TRITON_INTERPRET", value)
    config = ModelConfig(ladder_impl="triton")
    if triton.knobs.runtime.interpret:
        _check_ladder_device(config, "cpu")
    else:
        with pytest.raises(ConfigError, match="ladder_impl: triton needs a CUDA device"):
            _check_ladder_device(config, "cpu")
    assert triton.knobs.runtime.interpret == (value in ("1", "true", "on", "yes"))


def test_a_callback_argument_typo_names_the_closest_and_the_callbacks_help(tiny_data, tmp_path):
    """`cofr fit --help` does not list a callback's arguments: its own help does."""
    bad = tmp_path / "callbacks.yaml"
    bad.write_text(
        "trainer:\n  callbacks:\n    - class_path: cofrgenet.training.callbacks.DyadicUnfreezing\n"
        "      init_args: {schedul: paper}\n"
    )
    with pytest.raises(UserError) as raised:
        CofrCLI(args=fit_args(tmp_path, tiny_data, "--config", str(bad)))
    assert str(raised.value) == (
        "unknown key 'trainer.callbacks.schedul' (did you mean 'trainer.callbacks.schedule'?); "
        "the arguments of cofrgenet.training.callbacks.DyadicUnfreezing: `cofr fit "
        "--trainer.callbacks.help cofrgenet.training.callbacks.DyadicUnfreezing`"
    )


@pytest.mark.parametrize(
    "text,match",
    [
        ("", r"^--trainer \S+section\.yaml holds no settings"),
        ("- 1\n", r"^--trainer \S+section\.yaml must hold a mapping of trainer keys, not a list"),
        ("max_stepz: 3\n", r"^unknown key 'trainer\.max_stepz' in \S+section\.yaml \(did you mean "
                           r"'trainer\.max_steps'\?\)"),
    ],
    ids=["empty", "list", "typo"],
)  # fmt: skip
def test_a_bad_section_file_is_named(tiny_data, tmp_path, text, match):
    """`--trainer FILE` as `--config FILE`: the file and the key in full."""
    section = tmp_path / "section.yaml"
    section.write_text(text)
    with pytest.raises(UserError, match=match):
        CofrCLI(args=fit_args(tmp_path, tiny_data, "--trainer", str(section)))


def test_a_config_file_that_is_not_utf8_is_named(tiny_data, tmp_path):
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("# café\ntrainer:\n  max_steps: 2\n".encode("latin-1"))
    with pytest.raises(UserError, match=r"latin1\.yaml is not UTF-8 text \(byte 5\)"):
        CofrCLI(args=fit_args(tmp_path, tiny_data, "--config", str(latin1)))


def test_too_little_data_for_one_batch_is_an_error(tiny_data, tmp_path):
    """Said before a run folder and an MLflow run exist: it came once the fit had begun
    and left a FAILED run in the MLflow UI for each try."""
    from cofrgenet.data import TokenDataModule

    with pytest.raises(ConfigError, match=r"gives no full batch of data\.batch_size=100000"):
        CofrCLI(args=fit_args(tmp_path, tiny_data, "--data.batch_size", "100000"))
    assert not (tmp_path / "runs").exists()
    # A block longer than the val split (1,142 tokens): no validation could score it.
    long = ["--model.config", '{"vocab_size": 320, "block_size": 2048}', "--data.block_size"]
    with pytest.raises(
        ConfigError, match=r"the val split of .* holds no block of block_size "
    ) as no:
        CofrCLI(args=fit_args(tmp_path, tiny_data, *long, "2048"))
    assert str(no.value).endswith("or fit without validation (--trainer.limit_val_batches 0)")
    assert not (tmp_path / "runs").exists()
    data = TokenDataModule(tiny_data, block_size=2048, batch_size=4, num_workers=0)
    data.check_sizes(train=True, val=False)  # a fit without validation reads no val split
    with pytest.raises(ConfigError, match=r"a larger --val-fraction\)$"):  # validate, test
        data.check_sizes(train=False, val=True)
    with pytest.raises(ConfigError, match=r"the train split of .* holds no block"):
        TokenDataModule(tiny_data, block_size=30000, batch_size=1).check_sizes(True, False)


def test_a_runs_saved_config_is_whole_and_reads_from_any_folder(tiny_data, tmp_path, monkeypatch):
    """The saved config.yaml holds what its bases gave; it names none (relative paths
    from where the run started, which the error of a resume tells users to pass)."""
    recipes_dir = tmp_path / "mine"
    (recipes_dir / "groups").mkdir(parents=True)
    (recipes_dir / "groups" / "steps.yaml").write_text("trainer:\n  max_steps: 2\n")
    (recipes_dir / "exp.yaml").write_text("base: [groups/steps.yaml]\nrun:\n  name: made\n")
    monkeypatch.chdir(recipes_dir)
    CofrCLI(args=fit_args(tmp_path, tiny_data, "--config", "exp.yaml"))
    saved = tmp_path / "runs" / "test" / "made" / "config.yaml"
    text = saved.read_text()
    assert "base: null" in text and "max_steps: 2" in text
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cli = CofrCLI(args=["validate", "--config", str(saved)])  # the run's last checkpoint
    assert cli.trainer.callback_metrics["val/loss"] > 0
    with pytest.raises(ConfigError, match=r"--base is read in config files only"):
        CofrCLI(args=fit_args(tmp_path, tiny_data, "--base", str(recipes_dir / "exp.yaml")))
    with pytest.raises(ConfigError, match=r"--base is read in config files only"):
        CofrCLI(args=fit_args(tmp_path, tiny_data, "--base+", str(recipes_dir / "exp.yaml")))


def test_ladder_settings_a_model_never_reads_are_said(tiny_data, tmp_path):
    """`--model.preset gpt2-tiny --model.config.depth 7` trained a model without a ladder
    and recorded depth 7 as if it mattered (a depth sweep of it looked like one); so did
    ladder_floor beside 'paper' denominators. Said at the start (a warning: runs recorded
    with them still resume); a ladder model's settings are not."""
    from cofrgenet.training.model_options import settings_changing_nothing

    args = fit_args(tmp_path, tiny_data, "--trainer.max_steps", "1")
    at = args.index("gpt2-tiny-f")
    plain = [*args[:at], "gpt2-tiny", *args[at + 1 :]]
    with pytest.warns(UserWarning, match=r"depth=7 changes nothing: this model \(attention "):
        CofrCLI(args=[*plain, "--model.config.depth", "7", "--run.name", "plain"])
    assert settings_changing_nothing({"preset": "gpt2-tiny-f", "config": {"depth": 7}}) is None
    mixed = {"preset": "gpt2-tiny", "config": {"ffn_pattern": ["mlp", "cffn"], "ladders": 2}}
    assert settings_changing_nothing(mixed) is None  # one layer has a ladder
    # The sparse patterns' settings beside attention that reads none of them.
    strided = {"attention": "sparse_strided", "sparse_summary": 2}
    assert settings_changing_nothing({"preset": "gpt2-tiny", "config": strided}) == (
        "model.config: sparse_summary=2 changes nothing: this model's attention "
        "(sparse_strided) does not read it (sparse_stride: sparse_strided and sparse_fixed; "
        "sparse_summary: sparse_fixed); leave it out"
    )
    unread = {"sparse_stride": 4, "sparse_summary": 2}
    assert "sparse_stride=4, sparse_summary=2 change nothing: this model's attention (softmax)" in (
        settings_changing_nothing({"preset": "gpt2-tiny", "config": unread})
    )
    fixed = {"attention_pattern": ["softmax", "sparse_fixed"], **unread}
    assert settings_changing_nothing({"preset": "gpt2-tiny", "config": fixed}) is None
    both = settings_changing_nothing({"preset": "gpt2-tiny", "config": {"depth": 3, **unread}})
    assert "depth=3 changes nothing" in both and "sparse_stride=4, sparse_summary=2" in both
    paper = {"ladder_denominators": "paper", "ladder_floor": 0.3}
    assert settings_changing_nothing({"preset": "gpt2-tiny-f", "config": paper}) == (
        "model.config: ladder_floor=0.3 changes nothing: it bounds 'positive' denominators, "
        "and these are 'paper'"
    )
    # Heads where no attention splits the width into them (a head count that divides
    # nothing was taken silently there, and refused beside softmax attention).
    heads = {"n_head": 3}
    assert settings_changing_nothing({"preset": "gpt2-tiny-a", "config": heads}) == (
        "model.config: n_head=3 changes nothing: this model's attention (cattn_m) reads the "
        "whole width, not heads; leave it out"
    )
    assert settings_changing_nothing({"preset": "gpt2-tiny-f", "config": {"n_head": 4}}) is None
    both = {"n_head": 4, "n_kv_head": 2}
    assert "n_head=4, n_kv_head=2 change nothing" in settings_changing_nothing(
        {"preset": "gpt2-tiny-a", "config": both}
    )
    one_softmax = {"attention_pattern": ["cattn_m", "softmax"], "n_head": 4}
    assert settings_changing_nothing({"preset": "gpt2-tiny-a", "config": one_softmax}) is None
    # No preset and a config without the shape: GPT-2 small's defaults, said.
    from cofrgenet.training.model_options import shape_defaults_taken

    assert shape_defaults_taken({"preset": None, "config": {"vocab_size": 320}}) == (
        "model.preset null and model.config without block_size, n_layer, n_embd, n_head: "
        "ModelConfig's defaults are used (block_size=1024, n_layer=12, n_embd=768, "
        "n_head=12, GPT-2 small's); give them, or name a preset and change what differs"
    )
    lstm = {"arch": "lstm", "vocab_size": 8, "block_size": 8, "n_layer": 1, "n_embd": 8}
    assert shape_defaults_taken({"preset": None, "config": lstm}) is None  # reads no heads
    # Nor does attention of cattn_m alone: asking for n_head, then saying it changes
    # nothing, contradicted itself.
    cattn = {**lstm, "arch": "gpt", "attention": "cattn_m", "ffn": "mlp", "depth": 1}
    assert shape_defaults_taken({"preset": None, "config": cattn}) is None
    assert "this model (arch 'lstm') has no" in settings_changing_nothing(
        {"preset": "lstm-tiny", "config": {"depth": 3}}
    )
    whole = dict.fromkeys(("vocab_size", "block_size", "n_layer", "n_embd", "n_head"), 8)
    assert shape_defaults_taken({"preset": None, "config": whole}) is None
    assert shape_defaults_taken({"preset": "gpt2-tiny", "config": {}}) is None
    # The bundled recipes set none (the paper's baselines set the ladders' clamp eps).
    for recipe in sorted((CONF / "experiment").glob("*.yaml")):
        model = yaml.safe_load(recipe.read_text()).get("model")
        if model is not None:
            assert settings_changing_nothing(model) is None, recipe.name


def test_a_bad_value_names_the_file_that_gave_it_and_only_that(tmp_path):
    """The file named is the first (in load order) holding the bad value at the key; none
    where the command line sets the key or a mapping above it, or no file holds it."""
    from cofrgenet.training.config_words import set_in

    three, four = tmp_path / "three.yaml", tmp_path / "four.yaml"
    three.write_text("model:\n  config:\n    depth: three\n")
    four.write_text("model:\n  config:\n    depth: 4\n")
    key = "model.config.depth"
    assert set_in(key, ["--config", str(three), "--config", str(four)], "three") == (
        f" (in {three})"
    )
    assert set_in(key, ["--config", str(four), "--config", str(three)], "three") == (
        f" (in {three})"
    )
    assert set_in(key, ["--config", str(four), "--model.config", '{"depth": "x"}'], "x") == ""
    assert set_in(key, ["--config", str(three), "--model.config.depth", "x"], "x") == ""
    assert set_in("trainer.max_steps", ["--config", str(four), "--trainer", "t.yaml"], "a") == ""
    assert set_in(key, ["--config", str(four)], "x") == ""  # no file holds it
    # A mapping option that does not hold the key leaves the file's value standing.
    given = ["--model.config", '{"n_layer": 2}', "--config", str(three)]
    assert set_in(key, given, "three") == f" (in {three})"
    section = tmp_path / "trainer.yaml"
    section.write_text("max_steps: abc\n")
    assert set_in("trainer.max_steps", ["--trainer", str(section)], "abc") == ""


def test_a_bad_choice_or_range_from_a_file_names_the_file(tiny_data, tmp_path):
    """Type errors named the file; a choice outside the list and a count out of range
    (refused once the class is built) did not."""
    from cofrgenet.training.config_words import naming_the_file

    delta = tmp_path / "delta.yaml"
    delta.write_text("model:\n  config:\n    ladder_denominators: pape\n")
    with pytest.raises(ConfigError, match=rf"ladder_denominators \(in {delta}\): 'pape' is not "):
        CofrCLI(args=fit_args(tmp_path, tiny_data, "--config", str(delta)))
    delta.write_text("data:\n  batch_size: -4\n")
    with pytest.raises(
        ConfigError, match=rf"^data.batch_size \(in {delta}\) must be >= 1, got -4$"
    ):
        CofrCLI(args=fit_args(tmp_path, tiny_data, "--config", str(delta)))
    with pytest.raises(ConfigError, match=r"^data.batch_size must be >= 1, got -4$"):
        CofrCLI(args=fit_args(tmp_path, tiny_data, "--data.batch_size", "-4"))
    # A model field's refusal (`model.config: n_layer ...`) and a value the file writes
    # otherwise than the message (-1 against -1.0).
    delta.write_text("model:\n  optimizer:\n    lr: -1\n")
    with pytest.raises(ConfigError, match=rf"^model.optimizer.lr \(in {delta}\) must be .*-1.0$"):
        CofrCLI(args=fit_args(tmp_path, tiny_data, "--config", str(delta)))
    delta.write_text("model:\n  config:\n    n_layer: -1\n")
    with pytest.raises(ConfigError, match=rf"^model.config: n_layer \(in {delta}\) must be a "):
        CofrCLI(args=fit_args(tmp_path, tiny_data, "--config", str(delta)))
    words = ["--config", str(delta)]
    assert naming_the_file("no key here, got -4", words) == "no key here, got -4"
    from cofrgenet.training.config_words import bad_choice

    unhashable = 'Parser key "model.config.ffn": Literal[mlp, cffn] Given value: {[1]: 2}'
    assert bad_choice(unhashable).startswith("model.config.ffn: '{[1]: 2}' is not one of")
    assert naming_the_file("data.batch_size must be >= 1, got 3", words) == (
        "data.batch_size must be >= 1, got 3"  # not the file's value
    )


def test_a_later_files_callbacks_list_that_drops_a_recipes_callbacks_is_said(tmp_path, capsys):
    """A delta file adding a LearningRateMonitor under `trainer.callbacks:` replaced the
    paper recipe's list, and its dyadic unfreezing was silently gone (lists are not
    merged): said, with the two ways to keep it. A list that keeps it is not said."""
    from cofrgenet.training.config_words import lists_replaced_by_later_files

    recipe = str(CONF / "experiment" / "paper-cofrgenet-f-gpt2-xl-owt.yaml")
    monitor = "  - class_path: lightning.pytorch.callbacks.LearningRateMonitor\n"
    delta, both = tmp_path / "delta.yaml", tmp_path / "both.yaml"
    delta.write_text("trainer:\n  callbacks:\n" + monitor)
    both.write_text(
        "trainer:\n  callbacks:\n" + monitor + "  - cofrgenet.training.callbacks.DyadicUnfreezing\n"
    )
    (said,) = lists_replaced_by_later_files(["--config", recipe, "--config", str(delta)])
    assert said == (
        f"{delta} gives trainer.callbacks as a list, which replaces {recipe}'s: "
        f"DyadicUnfreezing is not in it, and will not run; list it in {delta} too, or add "
        "entries with --trainer.callbacks+ CLASS"
    )
    assert lists_replaced_by_later_files(["--config", recipe, "--config", str(both)]) == []
    # Following the advice: appended after the files, it is in the run's list.
    files = ["--config", recipe, "--config", str(delta)]
    assert lists_replaced_by_later_files([*files, "--trainer.callbacks+", "DyadicUnfreezing"]) == []
    assert lists_replaced_by_later_files([*files, "--trainer.callbacks+=DyadicUnfreezing"]) == []
    before = ["--trainer.callbacks+", "DyadicUnfreezing", *files]  # the later file replaces it
    assert lists_replaced_by_later_files(before) == [said]
    assert lists_replaced_by_later_files(["--config", str(delta), "--config", recipe]) == [
        f"{recipe} gives trainer.callbacks as a list, which replaces {delta}'s: "
        f"LearningRateMonitor is not in it, and will not run; list it in {recipe} too, or "
        "add entries with --trainer.callbacks+ CLASS"
    ]
    with (
        pytest.warns(UserWarning, match="DyadicUnfreezing is not in it"),
        pytest.raises(SystemExit),
    ):
        CofrCLI(args=["fit", "--config", recipe, "--config", str(delta), "--print_config"])
    assert "LearningRateMonitor" in capsys.readouterr().out


def test_an_option_a_later_config_file_sets_again_is_said(tiny_data, tmp_path, capsys):
    """Files and options apply in order: `--trainer.max_steps 3 --config F` loses the 3
    when F sets max_steps."""
    args = fit_args(tmp_path, tiny_data, "--print_config")
    with (
        pytest.warns(UserWarning, match=r"--trainer\.max_steps is replaced by .*cpu-debug\.yaml"),
        pytest.raises(SystemExit),
    ):
        CofrCLI(args=["fit", "--trainer.max_steps", "3", *args[1:]])
    assert "max_steps: 20" in capsys.readouterr().out  # cpu-debug.yaml's
    from cofrgenet.training.config_words import replaced_by_later_files

    debug = str(CONF / "trainer" / "cpu-debug.yaml")
    given_again = ["--trainer.max_steps", "3", "--config", debug, "--trainer.max_steps", "5"]
    assert replaced_by_later_files(given_again) == []  # the last value stands
    merged = tmp_path / "depth.yaml"  # a mapping is merged field by field
    merged.write_text("model:\n  config:\n    depth: 2\n")
    assert (
        replaced_by_later_files(["--model.config", '{"ladders": 3}', "--config", str(merged)]) == []
    )
    assert replaced_by_later_files(["--model.config", '{"depth": 3}', "--config", str(merged)])
    # Top-level keys and section files count too; the file named is the one that wins.
    seed = tmp_path / "seed.yaml"
    seed.write_text("seed_everything: 7\ntrainer:\n  max_steps: 9\n")
    section = tmp_path / "trainer.yaml"
    section.write_text("max_steps: 4\nlog_every_n_steps: 2\n")
    assert replaced_by_later_files(["--seed_everything", "5", "--config", str(seed)]) == [
        f"--seed_everything is replaced by {seed}, given after it"
    ]
    assert replaced_by_later_files(
        ["--trainer.max_steps", "50", "--trainer", str(section), "--config", debug]
    ) == [
        f"--trainer.max_steps is replaced by {debug}, given after it",
        f"trainer.log_every_n_steps, trainer.max_steps of --trainer {section} replaced by "
        f"{debug}, given after it",
    ]
    assert replaced_by_later_files(["--trainer.max_steps", "50", "--trainer", str(section)]) == [
        f"--trainer.max_steps is replaced by {section}, given after it"
    ]
    assert replaced_by_later_files(["--trainer", str(section), "--config", str(seed)]) == [
        f"trainer.max_steps of --trainer {section} replaced by {seed}, given after it"
    ]


def test_a_refused_resume_names_the_checkpoints_preset_for_settings_it_left_unset(
    tiny_data, tmp_path
):
    """ffn_hidden, n_kv_head... unset (None) as trained have no --model.config option
    (None there is "the preset's value"): resumed under another preset, the fix is the
    checkpoint's preset, which resumes; set by an override, the fix drops it."""
    CofrCLI(args=fit_args(tmp_path, tiny_data, "--trainer.max_steps", "2", "--run.name", "r"))
    resume = ["--run.name", "r", "--ckpt_path", "last", "--trainer.max_steps", "4"]
    with pytest.raises(ConfigError) as refused:
        CofrCLI(args=fit_args(tmp_path, tiny_data, *resume, "--model.preset", "llama3-tiny-f"))
    message = str(refused.value)
    assert "ffn_hidden None (here" in message
    fix = re.search(r"resume with (.*), or start a new run", message)
    assert fix and fix.group(1) == "--model.preset gpt2-tiny-f", message
    assert "null" not in message
    given = ["--model.preset", "llama3-tiny-f", *shlex.split(fix.group(1))]
    CofrCLI(args=fit_args(tmp_path, tiny_data, *resume, *given))  # the fix resumes
    run = tmp_path / "runs" / "test" / "r" / "checkpoints" / "last.ckpt"
    assert torch.load(run, map_location="cpu", weights_only=False)["global_step"] == 4
    more = ["--run.name", "r", "--ckpt_path", "last", "--trainer.max_steps", "6"]
    override = ["--model.config.n_kv_head", "2"]
    with pytest.raises(ConfigError, match=r"n_kv_head None \(here 2\): resume without "
                       r"--model\.config\.n_kv_head, or start"):  # fmt: skip
        CofrCLI(args=fit_args(tmp_path, tiny_data, *more, *override))


def test_paths_in_a_config_take_variables_and_the_home_folder(tiny_data, tmp_path, monkeypatch):
    """${VAR} and ~ as in a shell (and in sweep files): not a folder named '$HOME'."""
    monkeypatch.setenv("COFR_TEST_DATA", str(tiny_data.parent))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    args = fit_args(tmp_path, tiny_data, "--trainer.max_steps", "1", "--run.name", "vars")
    args[args.index(str(tiny_data))] = "${COFR_TEST_DATA}/" + tiny_data.name
    args[args.index(str(tmp_path / "runs"))] = "~/runs"
    cli = CofrCLI(args=args)
    assert cli.datamodule.data_dir == tiny_data.resolve()
    assert (tmp_path / "home" / "runs" / "test" / "vars" / "checkpoints" / "last.ckpt").is_file()


def test_resume_refuses_another_model_and_warns_of_a_missing_run(tiny_data, tmp_path):
    """A resume with other model or data settings fails before the run's config.yaml is
    rewritten;
    --ckpt_path last with a name that has no folder starts from scratch, saying so."""
    steps = ["--trainer.max_steps", "2"]
    CofrCLI(args=fit_args(tmp_path, tiny_data, *steps, "--run.name", "first"))
    config = tmp_path / "runs" / "test" / "first" / "config.yaml"
    before = config.read_text()
    resume = ["--run.name", "first", "--ckpt_path", "last", "--trainer.max_steps", "4"]
    # The recorded model_config names the settings and the options that give them back.
    message = (
        r"another network .* trained with depth 5 \(here 2\): resume with --model.config.depth 5,"
    )
    with pytest.raises(ConfigError, match=message):
        CofrCLI(args=fit_args(tmp_path, tiny_data, *resume, "--model.config.depth", "2"))
    assert config.read_text() == before
    with pytest.raises(ConfigError, match=r"cannot resume the data stream exactly.*seed: \d+ -> 5"):
        CofrCLI(args=fit_args(tmp_path, tiny_data, *resume, "--data.seed", "5"))
    assert config.read_text() == before
    # Settings of the same shapes: the weights would train on as another function.
    other = '{"vocab_size": 320, "block_size": 32, "ladder_floor": 2.0, "ladder_grad": "exact"}'
    message = (
        r"other model settings .*: ladder_floor 0\.5 \(here 2\.0\), ladder_grad 'paper' "
        r"\(here 'exact'\): resume with --model.config.ladder_floor 0.5 "
        r"--model.config.ladder_grad paper, or"
    )
    with pytest.raises(ConfigError, match=message):
        CofrCLI(args=fit_args(tmp_path, tiny_data, *resume, "--model.config", other))
    assert config.read_text() == before
    run_folder = str(config.parent)
    with pytest.raises(UserError, match=r"is a folder, not a checkpoint file: did you mean .*last"):
        CofrCLI(
            args=fit_args(tmp_path, tiny_data, "--run.name", "first", "--ckpt_path", run_folder)
        )
    with pytest.warns(UserWarning, match=r"frist does not exist.*did you mean 'first'") as said:
        typo = CofrCLI(
            args=fit_args(tmp_path, tiny_data, *steps, "--run.name", "frist", "--ckpt_path", "last")
        )
    # Not Lightning's own warning too, whose hint (ModelCheckpoint(save_last=True)) misleads.
    assert not [w for w in said if "save_last" in str(w.message)]
    # Said again below the summary lines, where the progress output cannot push it away.
    (summary,) = [c for c in typo.trainer.callbacks if isinstance(c, RunSummary)]
    assert summary.notes == [
        f"note: this run started from scratch: --ckpt_path last found no "
        f"{tmp_path / 'runs' / 'test' / 'frist'} (did you mean 'first'?)"
    ]
    # A typo in the experiment: the run of that name in another experiment is named.
    typo = ["--run.name", "first", "--run.experiment", "tset", "--ckpt_path", "last"]
    with pytest.warns(UserWarning, match=r"tset/first does not exist") as said:
        CofrCLI(args=fit_args(tmp_path, tiny_data, *steps, *typo))
    first = tmp_path / "runs" / "test" / "first"
    assert f"(did you mean --run.experiment 'test'? {first} exists)" in str(said[0].message)


def test_a_first_slurm_start_is_not_taken_for_a_typo(tiny_data, tmp_path, monkeypatch):
    """slurm/train.sbatch resumes with --ckpt_path last under the job's name: the first
    start of job 4812377 beside job 4812350's run is no probable typo."""
    (tmp_path / "runs" / "test" / "slurm-4812350").mkdir(parents=True)
    monkeypatch.setenv("SLURM_JOB_ID", "4812377")
    with pytest.warns(UserWarning, match=r"slurm-4812377 does not exist") as said:
        cli = CofrCLI(
            args=fit_args(tmp_path, tiny_data, "--trainer.max_steps", "1", "--ckpt_path", "last")
        )
    assert not [w for w in said if "did you mean" in str(w.message)]
    (summary,) = [c for c in cli.trainer.callbacks if isinstance(c, RunSummary)]
    assert summary.notes == []


def test_a_runs_dir_under_a_file_is_one_line(tiny_data, tmp_path):
    (tmp_path / "a-file").write_text("mine")
    runs = str(tmp_path / "a-file" / "runs")
    with pytest.raises(UserError, match=r"cannot make the run folder .*a-file' is a file"):
        CofrCLI(args=[*fit_args(tmp_path, tiny_data), "--run.runs_dir", runs])


def test_a_rollback_or_a_fork_goes_into_a_new_run(tiny_data, tmp_path):
    """--ckpt_path FILE into a run folder with later checkpoints, or with its own when the
    file is another run's, mixed two histories: last-v1.ckpt beside a stale last.ckpt
    (which `cofr generate` then loaded) and two val/loss values at a step."""
    every = ("--run.checkpoint_every_n_steps", "2", "--run.mlflow", "false")
    CofrCLI(args=fit_args(tmp_path, tiny_data, *every, "--run.name", "a", "--trainer.max_steps", "4"))  # fmt: skip
    folder = tmp_path / "runs" / "test" / "a" / "checkpoints"
    early = str(folder / "step0000002.ckpt")
    more = ("--trainer.max_steps", "6", "--ckpt_path")
    with pytest.raises(RunExistsError, match=r"is at step 2, but run folder .* goes on to step 4"):
        CofrCLI(args=fit_args(tmp_path, tiny_data, *every, "--run.name", "a", *more, early))
    # A new run from it is the way: its history starts there, with no bookkeeping of the
    # other run's files (Lightning's raw "The dirpath has changed" warning said so).
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        forked = CofrCLI(args=fit_args(tmp_path, tiny_data, *every, "--run.name", "b", *more, early))  # fmt: skip
    assert forked.trainer.global_step == 6
    assert not [w for w in caught if "dirpath has changed" in str(w.message)]
    theirs = str(tmp_path / "runs" / "test" / "b" / "checkpoints" / "last.ckpt")
    with pytest.raises(RunExistsError, match=r"is another run's checkpoint, and run folder"):
        CofrCLI(args=fit_args(tmp_path, tiny_data, *every, "--run.name", "a", "--trainer.max_steps", "8", "--ckpt_path", theirs))  # fmt: skip
    # Resuming its own newest stays as it was.
    resumed = CofrCLI(args=fit_args(tmp_path, tiny_data, *every, "--run.name", "a", *more, "last"))
    assert resumed.trainer.global_step == 6


def test_a_moved_run_keeps_counting_its_newest_checkpoints(tiny_data, tmp_path):
    """A run folder moved (or its runs folder) and resumed there: its kept checkpoints
    were forgotten with the old folder's path, so the newest K were counted afresh and
    the older ones stayed on disk for good."""
    every = ("--run.checkpoint_every_n_steps", "2", "--run.keep_checkpoints", "2")
    args = [*every, "--run.mlflow", "false", "--run.name", "a"]
    CofrCLI(args=fit_args(tmp_path, tiny_data, *args, "--trainer.max_steps", "6"))
    (tmp_path / "runs").rename(tmp_path / "moved")
    moved = ("--run.runs_dir", str(tmp_path / "moved"), "--ckpt_path", "last")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = CofrCLI(args=fit_args(tmp_path, tiny_data, *args, *moved, "--trainer.max_steps", "10"))  # fmt: skip
    assert resumed.trainer.global_step == 10
    assert not [w for w in caught if "dirpath has changed" in str(w.message)]
    folder = tmp_path / "moved" / "test" / "a" / "checkpoints"
    assert sorted(p.name for p in folder.glob("step*.ckpt")) == [
        "step0000008.ckpt",
        "step0000010.ckpt",
    ]


def test_a_moved_runs_state_drops_the_checkpoints_lost_in_the_move(tmp_path):
    from cofrgenet.training.checkpoint_callback import RunCheckpoint

    here = tmp_path / "checkpoints"
    here.mkdir()
    (here / "step0000006.ckpt").write_bytes(b"x")  # step 4's did not come along
    old = "/elsewhere/checkpoints"
    state = {
        "dirpath": old,
        "best_k_models": {f"{old}/step0000004.ckpt": 4, f"{old}/step0000006.ckpt": 6},
        "kth_best_model_path": f"{old}/step0000004.ckpt",
        "kth_value": 4,
        "best_model_path": f"{old}/step0000006.ckpt",
        "best_model_score": 6,
        "last_model_path": f"{old}/last.ckpt",
    }
    callback = RunCheckpoint(dirpath=here, save_top_k=2, monitor="step", mode="max")
    callback.load_state_dict(state)
    six = str(here / "step0000006.ckpt")
    assert callback.best_k_models == {six: 6}
    assert (callback.kth_best_model_path, callback.kth_value) == (six, 6)
    assert callback.best_model_path == six and callback.last_model_path == str(here / "last.ckpt")
    other = RunCheckpoint(dirpath=tmp_path / "new", save_top_k=2, monitor="step", mode="max")
    other.load_state_dict(state)  # another run's: nothing of it is taken
    assert other.best_k_models == {} and other.best_model_path == ""


def test_a_resume_with_no_time_left_is_refused(tiny_data, tmp_path):
    """trainer.max_time counts every start's training time (Lightning's Timer goes on
    from the checkpoint's): a run it stopped, started again with the same command (a
    SLURM requeue), trained 0 steps and exited 0, its MLflow run FINISHED."""
    timed = ["--run.name", "timed", "--trainer.max_time", "00:00:10:00"]
    CofrCLI(args=fit_args(tmp_path, tiny_data, "--trainer.max_steps", "2", *timed))
    last = tmp_path / "runs" / "test" / "timed" / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=False)
    saved["callbacks"]["Timer"]["time_elapsed"]["train"] = 700.5  # as if stopped by it
    torch.save(saved, last)
    more = ["--ckpt_path", "last", "--trainer.max_steps", "4"]
    with pytest.raises(ConfigError, match=(
        r"last\.ckpt has trained for 00:00:11:40 already, and trainer\.max_time \(00:00:10:00\) "
        r"counts the training time of every start of the run: raise --trainer\.max_time above "
        r"00:00:11:40 to train on$"
    )):  # fmt: skip
        CofrCLI(args=fit_args(tmp_path, tiny_data, *timed, *more))
    timed[-1] = "00:00:20:00"
    assert CofrCLI(args=fit_args(tmp_path, tiny_data, *timed, *more)).trainer.global_step == 4
    # A sweep's trial resumes as it stands (its CLI's check takes the same arguments).
    from cofrgenet.sweeps.objective import SweepCLI

    more[-1] = "6"
    assert SweepCLI(args=fit_args(tmp_path, tiny_data, *timed, *more)).trainer.global_step == 6


def test_validation_due_counts_batches_as_lightning_does():
    """val_check_interval counts batches with check_val_every_n_epoch null: a
    checkpoint's step validates where the batches it trained are a multiple of it (under
    gradient accumulation, steps x accumulation for a checkpoint that does not record
    them); none without validation or with epoch-counted intervals."""
    from cofrgenet.training.cli import validation_due

    steps = {"val_check_interval": 10, "check_val_every_n_epoch": None}
    assert [s for s in range(1, 21) if validation_due(steps, s, {})] == [10, 20]
    accumulated = {**steps, "accumulate_grad_batches": 4}
    assert [s for s in range(1, 21) if validation_due(accumulated, s, {})] == [5, 10, 15, 20]
    # An epoch of 38 batches ended on a step of 2: step 10 trained 38 batches, not 40.
    assert not validation_due(accumulated, 10, {"batches_trained": 38})
    assert validation_due(accumulated, 13, {"batches_trained": 50})
    # A checkpoint from before the key: Lightning's own count in its loop state.
    loops = {"fit_loop": {"epoch_loop.batch_progress": {"total": {"ready": 38}}}}
    assert not validation_due(accumulated, 10, {"loops": loops})
    assert not validation_due({**steps, "limit_val_batches": 0}, 10, {})
    assert not validation_due({"val_check_interval": 10}, 10, {})  # counted in each epoch
    assert not validation_due({**steps, "val_check_interval": 0.5}, 10, {})


@pytest.mark.slow
def test_a_resume_after_a_kill_in_a_validation_says_how_to_score_it(tiny_data, tmp_path):
    """Killed during the validation due at a periodic checkpoint's step, a run resumed
    from that checkpoint without that validation (Lightning takes it as done): the
    step's val/loss was lost without a word. The resume says so with the command that
    scores it, and that command puts it on the run's curve."""
    # Not an earlier test's store: mlflow.set_tracking_uri (mlflow_runs) exports it.
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["PYTHONPATH"] = str(Path(__file__).parent)
    name = ["--run.name", "killed"]
    killed = fit_args(tmp_path, tiny_data, *name, "--trainer.callbacks+=helpers.KillInValidation",
                      "--trainer.callbacks.step=10")  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "cofrgenet.training.cli", *killed], env=env,
                          timeout=600, check=False)  # fmt: skip
    assert proc.returncode == 9
    resume = fit_args(tmp_path, tiny_data, *name, "--ckpt_path", "last")
    with pytest.warns(UserWarning, match=r"the validation due at step 10 did not finish") as said:
        CofrCLI(args=resume)
    (note,) = [str(w.message) for w in said if "validation due" in str(w.message)]
    command = re.search(r"`cofr (validate .*?)`", note).group(1)
    runs = mlflow_runs(tmp_path / "runs")
    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    steps = [m.step for m in client.get_metric_history(runs.run_id[0], "val/loss")]
    assert steps == [20]  # 10's was lost
    CofrCLI(args=shlex.split(command))
    steps = [m.step for m in client.get_metric_history(runs.run_id[0], "val/loss")]
    assert sorted(steps) == [10, 20]


def test_what_would_end_at_once_or_mislead_is_refused(tiny_data, tmp_path, caplog):
    """A resume with no step left, a fresh fit into a run folder that still holds an
    MLflow run, and an evaluation with no checkpoint are errors that leave the run as it
    was; validate scores the run's newest checkpoint and keeps its config."""
    CofrCLI(args=fit_args(tmp_path, tiny_data, "--trainer.max_steps", "2", "--run.name", "a"))
    run = tmp_path / "runs" / "test" / "a"
    config = (run / "config.yaml").read_text()
    resume = ["--run.name", "a", "--ckpt_path", "last", "--trainer.max_steps", "2"]
    with pytest.raises(ConfigError, match=r"at step 2 already: raise --trainer.max_steps above 2"):
        CofrCLI(args=fit_args(tmp_path, tiny_data, *resume))
    assert (run / "config.yaml").read_text() == config

    def validate(*extra: str) -> CofrCLI:
        return CofrCLI(args=["validate", *fit_args(tmp_path, tiny_data, *extra)[1:]])

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # other checkpoint settings than the fit's: Lightning would ask for its callbacks
        first = validate("--run.name", "a", "--run.checkpoint_every_n_steps", "7")
    first = first.trainer.callback_metrics["val/loss"]
    assert not [w for w in caught if "callbacks used to create" in str(w.message)]
    last_ckpt = str(run / "checkpoints" / "last.ckpt")
    given = validate("--run.name", "a", "--ckpt_path", last_ckpt).trainer.callback_metrics
    assert float(first) == float(given["val/loss"])  # the run's newest checkpoint, by default
    # The network is the checkpoint's (its hyperparameters), whatever the command builds.
    with caplog.at_level(logging.INFO):
        other = validate("--run.name", "a", "--model.preset", "gpt2-tiny", "--model.config", "{}")
    assert float(other.trainer.callback_metrics["val/loss"]) == float(first)
    note = (
        "cofr validate scores the checkpoint's own model: --model.config, --model.preset not used"
    )
    assert note in caplog.text
    tested = CofrCLI(args=["test", *fit_args(tmp_path, tiny_data, "--run.name", "a")[1:]])
    runs = mlflow_runs(tmp_path / "runs")
    assert len(runs) == 1  # onto the run's own MLflow run, at its step (2)
    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    (logged,) = client.get_metric_history(runs.run_id[0], "test/loss")
    assert (logged.step, logged.value) == (2, float(tested.trainer.callback_metrics["test/loss"]))
    assert (run / "config.yaml").read_text() == config
    with pytest.raises(ConfigError, match=r"^no experiment 'nothing' in .*runs \(experiments "
                       r"there: test\): name"):  # fmt: skip
        validate("--run.experiment", "nothing")
    assert not (tmp_path / "runs" / "nothing").exists()
    with pytest.raises(ConfigError, match=r"^no experiment 'tset' in .*\(did you mean 'test'\?\)"):
        validate("--run.experiment", "tset")
    (tmp_path / "runs" / "nothing").mkdir()  # there, without runs
    with pytest.raises(ConfigError, match=r"^experiment 'nothing' has no run in .*nothing: name"):
        validate("--run.experiment", "nothing")
    (tmp_path / "runs" / "nothing").rmdir()
    for typo in ("lats", "best"):  # what `last` takes, or Lightning's `best`, not a file
        with pytest.raises(UserError, match=rf"^--ckpt_path {typo}: no such file \(--ckpt_path "
                           "last takes the run's newest checkpoint; any other"):  # fmt: skip
            validate("--ckpt_path", typo)
    with pytest.raises(ConfigError, match=r"aa holds no checkpoint to evaluate \(did you mean 'a'"):
        validate("--run.name", "aa")
    # Without --data.data_dir: the run's typo is said, not the default data folder's absence.
    bare = ["validate", "--run.runs_dir", str(tmp_path / "runs"), "--run.experiment", "test"]
    with pytest.raises(ConfigError, match=r"aa holds no checkpoint to evaluate \(did you mean 'a'"):
        CofrCLI(args=[*bare, "--run.name", "aa"])
    for dated in ("demo-20261204-100000", "demo-20261204-110000", "demo-small"):
        (run.parent / dated).mkdir()
    newest = r"\(did you mean 'demo-20261204-110000', the newest run named so\?\)"
    with pytest.raises(ConfigError, match=rf"demo holds no checkpoint to evaluate {newest}"):
        validate("--run.name", "demo")

    kept = shutil.copy(run / "checkpoints" / "last.ckpt", tmp_path / "kept.ckpt")
    for ckpt in (run / "checkpoints").glob("*.ckpt"):
        ckpt.unlink()  # a run whose checkpoints were deleted, or one that died before a save
    no_checkpoint = r"belongs to MLflow run \w+, which has no checkpoint left: start a new run"
    with pytest.raises(UserError, match=no_checkpoint):
        CofrCLI(args=fit_args(tmp_path, tiny_data, "--trainer.max_steps", "2", "--run.name", "a"))
    with pytest.raises(ConfigError, match=r"holds no checkpoint to evaluate: name"):
        validate("--run.name", "a")  # no "did you mean 'a'" for itself
    with pytest.raises(ConfigError, match=r"^no run of experiment 'test' in .* has a checkpoint"):
        validate()
    # Stopped on a NaN loss before any other checkpoint: from step 0 with other settings,
    # the MLflow run would keep the diverged values of the steps it had logged.
    shutil.copy(kept, run / "checkpoints" / "nonfinite-step0000002.ckpt")
    stopped = r"stopped on a non-finite loss .*: start a new run .*nonfinite-step0000002\.ckpt\)$"
    for resume in ((), ("--ckpt_path", "last")):
        more = ("--trainer.max_steps", "4", "--run.name", "a", *resume)
        with pytest.raises(RunExistsError, match=stopped):
            CofrCLI(args=fit_args(tmp_path, tiny_data, *more))


def test_an_evaluated_file_logs_onto_the_run_that_saved_it_and_leaves_its_status(
    tiny_data, tmp_path
):
    """validate --ckpt_path FILE: the metrics go to the MLflow run of FILE's run folder
    (not the experiment's newest run), whose status stays; a file outside any run
    folder is evaluated and logged nowhere."""
    import shutil

    for name in ("a", "b"):  # b: the experiment's newest run
        CofrCLI(args=fit_args(tmp_path, tiny_data, "--trainer.max_steps", "2", "--run.name", name))
    runs = tmp_path / "runs" / "test"
    ids = {name: (runs / name / "mlflow_run_id").read_text().strip() for name in ("a", "b")}
    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    client.set_terminated(ids["a"], "KILLED")  # a run stopped by a signal, awaiting its resume

    def history(name: str) -> list[tuple[int, float]]:
        return [(m.step, m.value) for m in client.get_metric_history(ids[name], "val/loss")]

    before = {name: history(name) for name in ids}
    ckpt = runs / "a" / "checkpoints" / "last.ckpt"
    args = fit_args(tmp_path, tiny_data, "--ckpt_path", str(ckpt))[1:]
    loss = float(CofrCLI(args=["validate", *args]).trainer.callback_metrics["val/loss"])
    assert history("a") == [*before["a"], (2, loss)] and history("b") == before["b"]
    assert client.get_run(ids["a"]).info.status == "KILLED"
    CofrCLI(args=["validate", *args])  # the same scores again: no second point at step 2
    assert history("a") == [*before["a"], (2, loss)]

    lone = tmp_path / "elsewhere" / "copy.ckpt"
    lone.parent.mkdir()
    shutil.copy(ckpt, lone)
    args = fit_args(tmp_path, tiny_data, "--ckpt_path", str(lone))[1:]
    again = CofrCLI(args=["validate", *args]).trainer.callback_metrics["val/loss"]
    assert float(again) == loss
    assert {name: history(name) for name in ids} == {
        "a": [*before["a"], (2, loss)],
        "b": before["b"],
    }
    assert len(mlflow_runs(tmp_path / "runs")) == 2 and sorted(lone.parent.iterdir()) == [lone]


def test_a_resumed_run_reads_running_in_mlflow_while_it_trains(tiny_data, tmp_path):
    import lightning as L

    CofrCLI(args=fit_args(tmp_path, tiny_data, "--trainer.max_steps", "2", "--run.name", "a"))
    run_id = (tmp_path / "runs" / "test" / "a" / "mlflow_run_id").read_text().strip()
    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    client.set_terminated(run_id, "KILLED")  # stopped by a signal
    seen: list[str] = []

    class Status(L.Callback):
        def on_train_start(self, trainer, pl_module) -> None:
            seen.append(client.get_run(run_id).info.status)

    resume = ["--trainer.max_steps", "3", "--run.name", "a", "--ckpt_path", "last"]
    CofrCLI(args=fit_args(tmp_path, tiny_data, *resume), extra_callbacks=[Status()])
    assert seen == ["RUNNING"] and client.get_run(run_id).info.status == "FINISHED"


def test_disabled_ladders_are_not_released_by_dyadic_unfreezing(tiny_data, tmp_path):
    """DyadicUnfreezing released the ladders DisableLadders froze (then weight-decayed at
    zero gradient): the two together are refused, naming the fix."""
    args = fit_args(
        tmp_path, tiny_data, "--run.mlflow", "false", "--trainer.max_steps", "2",
        "--trainer.callbacks+=cofrgenet.training.callbacks.DisableLadders",
        "--trainer.callbacks+=cofrgenet.training.callbacks.DyadicUnfreezing",
    )  # fmt: skip
    with pytest.raises(ConfigError, match="drop one of the two callbacks"):
        CofrCLI(args=args)


def test_a_resume_reads_its_checkpoint_through_once_to_check_it(tiny_data, tmp_path, monkeypatch):
    """Checking an archive reads every byte of it (18 GB at gpt2-xl, on every rank): the
    command line, the resume's choice and the load checked last.ckpt three times."""
    import zipfile

    args = ("--run.name", "once", "--run.mlflow", "false")
    CofrCLI(args=fit_args(tmp_path, tiny_data, *args, "--trainer.max_steps", "2"))
    checked = []
    testzip = zipfile.ZipFile.testzip

    def counted(archive):
        checked.append(Path(archive.filename).name)
        return testzip(archive)

    monkeypatch.setattr(zipfile.ZipFile, "testzip", counted)
    more = ("--trainer.max_steps", "4", "--ckpt_path", "last")
    assert CofrCLI(args=fit_args(tmp_path, tiny_data, *args, *more)).trainer.global_step == 4
    assert checked.count("last.ckpt") == 1, checked


def test_checkpoints_are_written_beside_themselves_and_renamed(tiny_data, tmp_path, monkeypatch):
    """Not through $TMPDIR (node-local on clusters: the move onto the shared file system
    would be a copy into the open checkpoint); a save that fails leaves the old file."""
    import tempfile

    from cofrgenet.training import checkpoints
    from cofrgenet.training.checkpoint_io import AtomicCheckpointIO

    cli = CofrCLI(args=fit_args(tmp_path, tiny_data, "--trainer.max_steps", "2"))
    assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    (last,) = (tmp_path / "runs" / "test").glob("*/checkpoints/last.ckpt")
    before = last.read_bytes()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-tmp"))  # unusable
    cli.trainer.save_checkpoint(tmp_path / "copy" / "again.ckpt")
    assert checkpoints.is_intact(tmp_path / "copy" / "again.ckpt")

    def full_disk(obj, file):
        file.write(b"half a checkpoint")
        try:
            raise OSError(28, "No space left on device")
        except OSError:  # as torch.save reports it
            raise RuntimeError("[enforce fail at inline_container.cc:672] unexpected pos") from None

    monkeypatch.setattr(torch, "save", full_disk)
    message = (
        r"cannot write the checkpoint .*last.ckpt: No space left on device; .*--ckpt_path last"
    )
    with pytest.raises(UserError, match=message):
        cli.trainer.save_checkpoint(last)
    assert [p.name for p in last.parent.iterdir()] == ["last.ckpt"]
    assert last.read_bytes() == before


def test_a_run_killed_in_its_first_save_resumes_from_scratch(tiny_data, tmp_path):
    """A kill during the first checkpoint's write leaves only its temporary file: that is
    no checkpoint to resume (nor one a fresh fit would overwrite), and the resume removes it."""
    CofrCLI(args=fit_args(tmp_path, tiny_data, "--trainer.max_steps", "2", "--run.name", "a"))
    folder = tmp_path / "runs" / "test" / "a" / "checkpoints"
    for path in folder.iterdir():
        path.unlink()
    unfinished = folder / ".step0000001.ckpt.12866.tmp.ckpt"
    unfinished.write_bytes(b"")
    resume = ["--trainer.max_steps", "2", "--run.name", "a", "--ckpt_path", "last"]
    cli = CofrCLI(args=fit_args(tmp_path, tiny_data, *resume))
    assert cli.trainer.global_step == 2
    assert not unfinished.exists() and (folder / "last.ckpt").is_file()


def test_periodic_checkpoints_are_named_by_the_step_they_hold(tiny_data, tmp_path):
    """Validations between saves must not rename them: each step<N>.ckpt holds step N and
    the newest K are kept."""
    args = ["--trainer.max_steps", "9", "--trainer.val_check_interval", "3"]
    args += ["--run.checkpoint_every_n_steps", "2", "--run.keep_checkpoints", "2"]
    CofrCLI(args=fit_args(tmp_path, tiny_data, *args, "--run.name", "a"))
    folder = tmp_path / "runs" / "test" / "a" / "checkpoints"
    periodic = sorted(p.name for p in folder.glob("step*.ckpt"))
    assert periodic == ["step0000006.ckpt", "step0000008.ckpt"]
    for name in periodic:
        assert torch.load(folder / name, weights_only=False)["global_step"] == int(name[4:11])


def test_a_finished_run_trained_further_logs_like_one_that_never_stopped(
    tiny_data, tmp_path, monkeypatch
):
    """Its last step is no periodic one (3 of every 10): last.ckpt is still taken where
    a periodic checkpoint is, so the resume to 5 steps logs every metric at the same
    step, with the same value and epoch, as an uninterrupted 5-step run (Lightning's
    end-of-training checkpoint started a new epoch, one step later)."""
    every = ("--trainer.log_every_n_steps", "1", "--trainer.val_check_interval", "3")
    CofrCLI(
        args=fit_args(tmp_path, tiny_data, *every, "--trainer.max_steps", "3", "--run.name", "a")
    )
    resume = ("--trainer.max_steps", "5", "--ckpt_path", "last")
    # Its folders spelled otherwise (a sweep trial begun under SLURM with --runs-dir
    # /abs/runs, resumed locally with runs): the same folders, no latest/ tag of them.
    monkeypatch.chdir(tmp_path)
    places = ("--run.runs_dir", "runs", "--data.data_dir", os.path.relpath(tiny_data))
    CofrCLI(args=fit_args(tmp_path, tiny_data, *every, *resume, "--run.name", "a", *places))
    CofrCLI(
        args=fit_args(tmp_path, tiny_data, *every, "--trainer.max_steps", "5", "--run.name", "b")
    )
    assert [p.name for p in (tmp_path / "runs" / "test" / "a" / "checkpoints").iterdir()] == [
        "last.ckpt"
    ]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    runs = mlflow_runs(tmp_path / "runs")
    ids = dict(zip(runs["tags.mlflow.runName"], runs["run_id"], strict=True))
    for key in ("train/loss", "val/loss", "epoch", "data/tokens_seen"):
        a, b = (
            [(m.step, round(m.value, 5)) for m in client.get_metric_history(ids[name], key)]
            for name in "ab"
        )
        assert a == b, key
    # A score is logged at the step its weights reached (3 steps taken: step 3), the step
    # of the checkpoint and of the sweep pruner's report.
    assert [m.step for m in client.get_metric_history(ids["b"], "val/loss")] == [3]
    resumed = client.get_run(ids["a"]).data  # params cannot change: the new budget is a tag
    assert resumed.params["trainer.max_steps"] == "3"
    assert resumed.tags["latest/trainer.max_steps"] == "5"
    assert not {"latest/run.runs_dir", "latest/data.data_dir"} & set(resumed.tags)


def test_a_param_back_at_its_first_value_loses_its_latest_tag(tmp_path):
    """lr 6e-4, resumed at 1e-4 (tag latest/<key> 1e-4), then at 6e-4 again: the tag
    still said 1e-4, as only the params that differ from the first value were looked at.
    Now it goes; a param still changed keeps its tag, with the newest value."""
    from cofrgenet.training.run_store import log_params_tagging_changes

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("x", artifact_location=(tmp_path / "a").as_uri())
    run_id = client.create_run(experiment).info.run_id
    first = {"model.optimizer.lr": "0.0006", "data.batch_size": "4"}
    assert log_params_tagging_changes(client, run_id, first) == []
    other = {"model.optimizer.lr": "0.0001", "data.batch_size": "8"}
    assert log_params_tagging_changes(client, run_id, other) == list(other)
    tags = client.get_run(run_id).data.tags
    assert tags["latest/model.optimizer.lr"] == "0.0001" and tags["latest/data.batch_size"] == "8"
    back = {"model.optimizer.lr": "0.0006", "data.batch_size": "16"}
    assert log_params_tagging_changes(client, run_id, back) == ["data.batch_size"]
    data = client.get_run(run_id).data
    assert data.params == first
    assert "latest/model.optimizer.lr" not in data.tags
    assert data.tags["latest/data.batch_size"] == "16"


def test_a_fit_stopped_by_a_callback_that_saved_resumes_like_one_that_never_stopped(
    tiny_data, tmp_path
):
    """A sweep trial stopped for a requeue: its callback saves last.ckpt at the end of
    step 3 and stops the fit. Lightning's end-of-training save must not replace it (that
    checkpoint resumes one step late, in a new epoch)."""
    import lightning as L

    class SaveAndStop(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == 3:
                trainer.save_checkpoint(
                    Path(trainer.default_root_dir) / "checkpoints" / "last.ckpt"
                )
                trainer.should_stop = True

    every = ("--trainer.log_every_n_steps", "1", "--trainer.val_check_interval", "2")
    first = fit_args(tmp_path, tiny_data, *every, "--trainer.max_steps", "5", "--run.name", "a")
    CofrCLI(args=first, extra_callbacks=[SaveAndStop()])
    CofrCLI(
        args=fit_args(
            tmp_path,
            tiny_data,
            *every,
            "--trainer.max_steps",
            "5",
            "--run.name",
            "a",
            "--ckpt_path",
            "last",
        )
    )
    CofrCLI(
        args=fit_args(tmp_path, tiny_data, *every, "--trainer.max_steps", "5", "--run.name", "b")
    )
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    runs = mlflow_runs(tmp_path / "runs")
    ids = dict(zip(runs["tags.mlflow.runName"], runs["run_id"], strict=True))
    history = {
        (name, key): [
            (m.step, round(m.value, 5)) for m in client.get_metric_history(ids[name], key)
        ]
        for name in "ab"
        for key in ("train/loss", "val/loss", "epoch")
    }
    for key in ("train/loss", "epoch"):
        assert history["a", key] == history["b", key], key
    # Lightning validates a fit stopped early once more, at 3: the rest is the same.
    assert [v for v in history["a", "val/loss"] if v[0] != 3] == history["b", "val/loss"]


def test_ctrl_c_after_a_fit_in_the_same_process_interrupts(tiny_data, tmp_path):
    """Lightning puts back the handlers it found at fit start, StopOnSignal's SIGINT one
    among them: a Ctrl-C between two fits of one process (bench quality, a sweep worker)
    only printed "stopping after this step" and the process went on."""
    import signal
    import time

    # Python's own handler before the fit (a pytest-xdist worker may ignore SIGINT).
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        CofrCLI(args=fit_args(tmp_path, tiny_data, "--trainer.max_steps", "2"))
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize("requeued", [True, False], ids=["requeued", "requeue-refused"])
def test_a_slurm_requeue_leaves_the_mlflow_run_killed_not_finished(tiny_data, tmp_path, requeued):
    """SLURM's SIGUSR1 before the time limit: Lightning's handler (run at the step's end)
    ends the loggers as "finished", saves hpc_ckpt_1 and runs ``scontrol requeue``, after
    which SLURM kills the job. Killed hard there, the run stayed FINISHED, a finished
    run in the UI that was about to go on; it is KILLED at the step it stopped. A
    requeue that scontrol refuses trains on, and the run ends FINISHED."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"  # notes its arguments, then kills the job hard
    end = "kill -9 $PPID" if requeued else "exit 1"
    scontrol.write_text(f'#!/bin/sh\necho "$@" > {tmp_path / "scontrol.args"}\n{end}\n')
    scontrol.chmod(0o755)
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1",
             "SLURM_JOB_NAME": "cofr-train", "SLURM_NODEID": "0", "SLURM_PROCID": "0",
             "SLURM_LOCALID": "0", "SLURM_NODELIST": "localhost"}  # fmt: skip
    args = fit_args(
        tmp_path, tiny_data, "--run.name", "requeued", "--trainer.max_steps", "12",
        "--trainer.log_every_n_steps", "1", "--trainer.callbacks+=sweep_helpers.SignalAtStep",
        "--trainer.callbacks.step=5", "--trainer.callbacks.signum=10",
    )  # fmt: skip
    env = {**os.environ, **slurm, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), *sys.path])
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run(
        [sys.executable, "-m", "cofrgenet.cli", *args], capture_output=True, text=True, env=env
    )
    out = proc.stdout + proc.stderr
    assert (tmp_path / "scontrol.args").read_text().split() == ["requeue", "4242"]
    if not requeued:
        assert proc.returncode == 0, out[-3000:]
        (run,) = mlflow_runs(tmp_path / "runs").itertuples()
        client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
        assert run.status == "FINISHED"
        assert "cofr.stopped_at_step" not in client.get_run(run.run_id).data.tags
        return
    assert proc.returncode == -9, out[-3000:]  # killed by the fake scontrol
    saved = torch.load(tmp_path / "runs" / "test" / "requeued" / "hpc_ckpt_1.ckpt",
                       weights_only=True)  # fmt: skip
    assert saved["global_step"] == 6
    (run,) = mlflow_runs(tmp_path / "runs").itertuples()
    assert run.status == "KILLED"
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    tags = client.get_run(run.run_id).data.tags
    assert tags["cofr.stopped_at_step"] == "6"
    assert tags["slurm.job_id"] == "4242" and "slurm.array_job_id" not in tags  # its job


def test_a_finished_fit_removes_its_requeue_checkpoints(tiny_data, tmp_path):
    """A requeued job's hpc_ckpt_<n>.ckpt stayed beside the finished run's last.ckpt: a
    second copy of weights and optimizer (gigabytes at xl) that no resume would take."""
    args = ("--run.name", "rq", "--run.mlflow", "false")
    CofrCLI(args=fit_args(tmp_path, tiny_data, *args, "--trainer.max_steps", "2"))
    run_dir = tmp_path / "runs" / "test" / "rq"
    requeue = run_dir / "hpc_ckpt_1.ckpt"
    shutil.copy(run_dir / "checkpoints" / "last.ckpt", requeue)
    os.utime(requeue, (1, 1))  # older than last.ckpt: the resume takes last.ckpt
    (run_dir / "hpc_ckpt_notes.txt").write_text("not a checkpoint of Lightning's")
    more = ("--trainer.max_steps", "4", "--ckpt_path", "last")
    assert CofrCLI(args=fit_args(tmp_path, tiny_data, *args, *more)).trainer.global_step == 4
    assert not requeue.exists() and (run_dir / "hpc_ckpt_notes.txt").exists()


def test_a_new_requeue_checkpoint_replaces_the_older_ones(tmp_path):
    """Lightning numbers hpc_ckpt_<n> anew at each SLURM requeue and removes none: once
    its SIGUSR1 handler (deferred to the step's end) has saved one, only the newest is
    kept, file or FSDP shard folder; other checkpoints are left alone."""
    import signal
    from types import SimpleNamespace

    from cofrgenet.training.callbacks import StopOnSignal

    (tmp_path / "hpc_ckpt_1.ckpt").write_bytes(b"older")
    (tmp_path / "hpc_ckpt_2.ckpt").mkdir()  # sharded: a folder
    (tmp_path / "hpc_ckpt_2.ckpt" / "__0_0.distcp").write_bytes(b"shard")
    (tmp_path / "hpc_ckpt_notes.txt").write_text("kept")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"kept")

    def lightning_requeue(signum, frame):  # saves hpc_ckpt_<max + 1>, then requeues
        (tmp_path / "hpc_ckpt_3.ckpt").write_bytes(b"newest")

    stop = StopOnSignal()
    stop._deferred[signal.SIGUSR1] = lightning_requeue
    stop._pending.add(signal.SIGUSR1)
    trainer = SimpleNamespace(
        world_size=1, is_global_zero=True, default_root_dir=str(tmp_path), loggers=[]
    )
    stop._act(trainer, None)
    names = sorted(p.name for p in tmp_path.glob("hpc_ckpt_*"))
    assert names == ["hpc_ckpt_3.ckpt", "hpc_ckpt_notes.txt"]
    assert (tmp_path / "checkpoints" / "last.ckpt").exists() and stop.signal is None


def test_a_stop_signal_after_the_last_step_is_kept_for_what_runs_the_fit():
    """SIGTERM or SIGUSR1 after the last step's end (during the final checkpoint's save)
    has no step end left to act at: noted until teardown, through Lightning's handlers
    put back at train end too (they call the one they found, StopOnSignal's), and kept in
    ``late_signals`` (a sweep worker then stops or requeues); the handler from before the
    fit is put back, not called inside Lightning's teardown."""
    import signal
    from types import SimpleNamespace

    from cofrgenet.training.callbacks import StopOnSignal

    got: list[int] = []
    kinds = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
    before = {s: signal.getsignal(s) for s in kinds}

    def worker(signum, frame):  # a sweep worker's handlers
        got.append(signum)

    try:
        for signum in kinds:
            signal.signal(signum, worker)
        stop = StopOnSignal()
        trainer = SimpleNamespace(world_size=1, loggers=[])
        stop.setup(trainer, None, "fit")
        found = signal.getsignal(signal.SIGTERM)  # StopOnSignal's, which Lightning keeps
        signal.signal(signal.SIGTERM, lambda signum, frame: found(signum, frame))
        stop.on_fit_start(trainer, None)
        stop.on_train_start(trainer, None)  # the handlers now only note signals
        os.kill(os.getpid(), signal.SIGUSR1)
        stop.on_train_end(trainer, None)  # Lightning's handlers are back, Ctrl-C's stays
        os.kill(os.getpid(), signal.SIGTERM)  # during the final save
        os.kill(os.getpid(), signal.SIGINT)  # noted: not a KeyboardInterrupt in the save
        signal.signal(signal.SIGTERM, found)  # Lightning's teardown puts back the one it found
        stop.teardown(trainer, None, "fit")
        assert got == []
        assert stop.late_signals == sorted(kinds)
        assert all(signal.getsignal(s) is worker for s in kinds)
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def test_a_sigusr1_that_nothing_handles_stops_the_fit_saved(tmp_path):
    """Outside SLURM's requeue no handler waits for SIGUSR1, whose default action ends the
    process unsaved: the fit notes it and stops at the step's end as for SIGTERM,
    saving last.ckpt, with status 128 + 10."""
    import signal
    from types import SimpleNamespace

    from cofrgenet.training.callbacks import StopOnSignal

    saved: list[Path] = []
    trainer = SimpleNamespace(
        world_size=1,
        is_global_zero=True,
        default_root_dir=str(tmp_path / "run"),
        loggers=[],
        global_step=7,
        save_checkpoint=lambda path, weights_only: saved.append(path),
    )
    lightning: list[int] = []  # Lightning's SIGTERM handler: it stops the fit
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        signal.signal(signal.SIGTERM, lambda signum, frame: lightning.append(signum))
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        stop = StopOnSignal()
        stop.on_train_start(trainer, None)
        assert signal.getsignal(signal.SIGUSR1) == stop._on_deferred  # else the kill ends us
        os.kill(os.getpid(), signal.SIGUSR1)
        stop._act(trainer, None)
        assert stop.signal == signal.SIGUSR1 and lightning == [signal.SIGTERM]
        assert saved == [tmp_path / "run" / "checkpoints" / "last.ckpt"]
        stop.teardown(trainer, None, "fit")
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def test_a_checkpoint_is_evaluated_on_other_data_of_its_tokenizer(tiny_data, tmp_path, caplog):
    """validate reads no training stream: another corpus of the model's tokenizer is
    scored; one of another tokenizer is refused, naming it (not 'cannot resume')."""
    from cofrgenet.data import prepare_data

    CofrCLI(args=fit_args(tmp_path, tiny_data, "--trainer.max_steps", "2", "--run.name", "a"))
    other = tmp_path / "other-byte"
    prepare_data(source="pydoc", tokenizer="byte", out=other, max_docs=8, num_workers=1)
    args = fit_args(tmp_path, other, "--run.name", "a")[1:]
    with caplog.at_level(logging.INFO):
        scored = float(CofrCLI(args=["validate", *args]).trainer.callback_metrics["val/loss"])
    assert scored > 0
    # Lightning's table says val/loss: where the score goes is said above it.
    assert "its scores go to MLflow as eval/val/other-byte/loss and .../ppl" in caplog.text
    # Onto the run, beside its own curves (its val/loss stays the training data's), under
    # the folder's name, with the folder's path as a tag.
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    run_id = (tmp_path / "runs" / "test" / "a" / "mlflow_run_id").read_text().strip()
    (logged,) = client.get_metric_history(run_id, "eval/val/other-byte/loss")
    assert (logged.step, logged.value) == (2, scored)
    assert all(m.value != scored for m in client.get_metric_history(run_id, "val/loss"))
    tags = client.get_run(run_id).data.tags
    assert tags["eval/val/other-byte/data_dir"] == str(other.resolve())
    # The training's own data keeps its keys: the same score as the training's validation.
    same = fit_args(tmp_path, tiny_data, "--run.name", "a")[1:]
    CofrCLI(args=["validate", *same])
    assert client.get_metric_history(run_id, "val/loss")[-1].step == 2
    assert len(client.get_metric_history(run_id, "eval/val/other-byte/loss")) == 1
    bpe = tmp_path / "other-bpe"
    prepare_data(
        source="pydoc", tokenizer="bpe", vocab_size=300, out=bpe, max_docs=8, num_workers=1
    )
    args = fit_args(tmp_path, bpe, "--run.name", "a")[1:]
    caplog.clear()
    with caplog.at_level(logging.INFO), pytest.raises(ConfigError, match=r"other-bpe was made "
                                                      r"with another tokenizer .*'bpe'"):  # fmt: skip
        CofrCLI(args=["validate", *args])
    assert "its scores go to MLflow" not in caplog.text  # said first: where they would go


def test_an_unregistered_mixer_of_the_checkpoint_is_one_line(tiny_data, tmp_path):
    """A run trained with a mixer of the user's own (registered by their script) and
    validated with plain `cofr validate` ended in 80 lines of jsonargparse traceback
    (Lightning parses the checkpoint's hyper-parameters after the command line)."""
    import subprocess
    import sys

    # The user's script: registers the mixer, then runs cofr (the options' choices are
    # the mixers registered when cofr's modules are imported).
    script = (
        "import sys\nfrom torch import nn\nfrom cofrgenet.models import FFN\n"
        "FFN.register('test_mine')(lambda c, i: nn.Linear(c.n_embd, c.n_embd))\n"
        "from cofrgenet.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    )
    words = fit_args(tmp_path, tiny_data, "--trainer.max_steps", "2", "--run.name", "mine")
    subprocess.run(
        [sys.executable, "-c", script, *words, "--model.config.ffn", "test_mine"], check=True
    )
    args = fit_args(tmp_path, tiny_data, "--run.name", "mine")[1:]
    with pytest.raises(ConfigError) as raised:
        CofrCLI(args=["validate", *args])
    message = str(raised.value)
    assert message.startswith("the checkpoint's settings: model.config.ffn: 'test_mine' is ")
    assert "registered by importing its module first" in message and "\n" not in message


def test_a_test_of_part_of_the_split_is_kept_off_the_runs_test_curve(tiny_data, tmp_path):
    """`cofr test --trainer.limit_test_batches 0.5` put its score on the run's test/
    curve, beside (and in place of, as the latest) the whole split's, with no word: test
    reads the whole split. It is said, and logged apart; the whole split's stays."""
    CofrCLI(args=fit_args(tmp_path, tiny_data, "--trainer.max_steps", "2", "--run.name", "a"))
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    run_id = (tmp_path / "runs" / "test" / "a" / "mlflow_run_id").read_text().strip()
    args = fit_args(tmp_path, tiny_data, "--run.name", "a")[1:]
    whole = CofrCLI(args=["test", *args]).trainer.callback_metrics["test/loss"]
    with pytest.warns(UserWarning, match=r"test/loss is not the run's test score.*"
                      r"limit_test_batches 0.5\); logged as eval/test/1x"):  # fmt: skip
        CofrCLI(args=["test", *args, "--trainer.limit_test_batches", "0.5"])
    assert [m.value for m in client.get_metric_history(run_id, "test/loss")] == [float(whole)]
    part = [k for k in client.get_run(run_id).data.metrics if k.startswith("eval/test/1x")]
    assert len(part) == 2  # loss and ppl


def test_a_resume_under_accumulation_leaves_the_periodic_checkpoints_be(tiny_data, tmp_path):
    """Resumed at step 4, a periodic step, with 2 micro-batches a step: the first one
    still reads global_step 4, and Lightning (its record of the saved step not restored)
    saved step 4's checkpoint again, half a step on (one micro-batch more read, the data
    position and tokens_seen past it), and counted it a new one: an older kept one went."""
    import hashlib

    words = ["--run.name", "acc", "--run.checkpoint_every_n_steps", "2",
             "--run.keep_checkpoints", "2", "--trainer.accumulate_grad_batches", "2"]  # fmt: skip
    CofrCLI(args=fit_args(tmp_path, tiny_data, *words, "--trainer.max_steps", "4"))
    folder = tmp_path / "runs" / "test" / "acc" / "checkpoints"

    def digests() -> dict[str, str]:
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.glob("step*")}

    before = digests()
    assert sorted(before) == ["step0000002.ckpt", "step0000004.ckpt"]
    CofrCLI(args=fit_args(tmp_path, tiny_data, *words, "--trainer.max_steps", "5",
                          "--ckpt_path", "last"))  # fmt: skip
    assert digests() == before  # step 5 is no periodic step: nothing new, nothing rewritten


def test_validate_keeps_other_blocks_and_other_data_off_the_runs_curve(tiny_data, tmp_path, caplog):
    """Two ways a validate put another score on the run's val/loss curve, its latest
    there (what cofr compare reads): another --data.block_size (checked were only the
    processes and blocks scored, equal by chance here), and the run's data folder
    prepared again in place (data was told apart by its path). A copy of the run's data
    elsewhere is the run's data: its score stays on the curve."""
    import shutil

    from cofrgenet.data import prepare_data

    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    CofrCLI(args=fit_args(tmp_path, data, "--trainer.max_steps", "2", "--run.name", "a"))
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    run_id = (tmp_path / "runs" / "test" / "a" / "mlflow_run_id").read_text().strip()

    def curve() -> list[float]:
        return [m.value for m in client.get_metric_history(run_id, "val/loss")]

    fitted = curve()  # [] (2 steps, validated every 10)
    # 16-token blocks: twice the blocks, each half as long; the recipe's limit_val_batches
    # (4 of 4) keeps their number the fit's (16).
    args = fit_args(tmp_path, data, "--run.name", "a", "--data.block_size", "16")[1:]
    with pytest.warns(UserWarning, match=r"tokens per block \(data.block_size\) 32 -> 16\)"):
        shorter = CofrCLI(args=["validate", *args]).trainer.callback_metrics["val/loss"]
    assert curve() == fitted
    keys = client.get_run(run_id).data.metrics
    assert [k for k in keys if k.endswith("-of-16/loss")], sorted(keys)
    assert float(shorter) in [keys[k] for k in keys if k.endswith("-of-16/loss")]
    # A copy elsewhere: the run's data, its score on the run's curve.
    moved = tmp_path / "moved"
    shutil.copytree(data, moved)
    with caplog.at_level(logging.INFO):
        CofrCLI(args=["validate", *fit_args(tmp_path, moved, "--run.name", "a")[1:]])
    assert "is not the data the run trained on" not in caplog.text
    assert not [k for k in client.get_run(run_id).data.metrics if "moved" in k]
    on_the_curve = curve()
    assert len(on_the_curve) == len(fitted) + 1
    # Prepared again in place, with another split: other data, scored apart.
    shutil.rmtree(data)
    prepare_data(
        source="pydoc", tokenizer="byte", out=data, max_docs=8, num_workers=1, val_fraction=0.3
    )
    with caplog.at_level(logging.INFO):
        CofrCLI(args=["validate", *fit_args(tmp_path, data, "--run.name", "a")[1:]])
    assert f"{data} is not the data the run trained on" in caplog.text
    assert curve() == on_the_curve
    assert len(client.get_metric_history(run_id, "eval/val/data/loss")) == 1


def test_a_start_refused_once_the_data_loaded_can_be_started_again(
    tiny_data, tmp_path, monkeypatch
):
    """A val_check_interval longer than an epoch is found when the loader exists (the run
    folder and its MLflow run are made by then): one line, and the folder, which holds
    nothing trained, goes, so the same command with the setting fixed starts the run;
    unless another start has taken the folder's lock meanwhile: it is then that one's."""
    from cofrgenet.training.runlock import RunLock

    run = ["--run.name", "r", "--trainer.max_steps", "2"]
    run += ["--trainer.check_val_every_n_epoch", "1"]  # the interval counted within epochs
    too_long = ["--trainer.val_check_interval", "100000"]
    with monkeypatch.context() as taken:
        taken.setattr(RunLock, "try_acquire", lambda self: False)
        with pytest.raises(ConfigError, match=r"^trainer.val_check_interval is 100000 batches"):
            CofrCLI(args=fit_args(tmp_path, tiny_data, *run, *too_long))
    folder = tmp_path / "runs" / "test" / "r"
    assert (folder / "config.yaml").exists() and (folder / ".lock").exists()
    shutil.rmtree(folder)  # that start's business; this test's next start is alone
    with pytest.raises(ConfigError, match=r"^trainer.val_check_interval is 100000 batches, but"):
        CofrCLI(args=fit_args(tmp_path, tiny_data, *run, *too_long))
    assert not folder.exists()
    cli = CofrCLI(args=fit_args(tmp_path, tiny_data, *run, "--trainer.val_check_interval", "2"))
    assert cli.trainer.global_step == 2
    # The refused starts' MLflow runs stay (FAILED, with their config), the new one trained.
    assert sorted(mlflow_runs(tmp_path / "runs").status) == ["FAILED", "FAILED", "FINISHED"]
    # A folder that was there before (the user's, with notes): what the refused start
    # wrote goes, the folder and its notes stay, and the fixed command starts the run
    # (it was refused: "belongs to MLflow run ..., which has no checkpoint left").
    mine = tmp_path / "runs" / "test" / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("lr sweep, take 2\n")
    run[1] = "mine"
    with pytest.raises(ConfigError, match=r"^trainer.val_check_interval is 100000 batches, but"):
        CofrCLI(args=fit_args(tmp_path, tiny_data, *run, *too_long))
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    cli = CofrCLI(args=fit_args(tmp_path, tiny_data, *run, "--trainer.val_check_interval", "2"))
    assert cli.trainer.global_step == 2 and (mine / "notes.txt").exists()


def test_a_fast_dev_run_leaves_no_run_behind(tiny_data, tmp_path):
    """Lightning's fast_dev_run says "Logging and checkpointing is suppressed", but the
    run's own last.ckpt was saved, and `--ckpt_path last` then resumed that debug folder
    as the experiment's newest run. Now it saves nothing, and its folder goes (a folder
    that was there keeps what it held)."""
    from cofrgenet.training.run_store import latest_run

    CofrCLI(args=fit_args(tmp_path, tiny_data, "--run.name", "real", "--trainer.max_steps", "1"))
    CofrCLI(
        args=fit_args(tmp_path, tiny_data, "--run.name", "debug", "--trainer.fast_dev_run", "1")
    )
    experiment = tmp_path / "runs" / "test"
    assert not (experiment / "debug").exists()
    assert latest_run(experiment) == experiment / "real"
    (experiment / "mine").mkdir()
    (experiment / "mine" / "notes.txt").write_text("try fast_dev_run first\n")
    CofrCLI(args=fit_args(tmp_path, tiny_data, "--run.name", "mine", "--trainer.fast_dev_run", "1"))
    assert sorted(p.name for p in (experiment / "mine").iterdir()) == ["notes.txt"]


def test_ckpt_path_last_passes_over_runs_without_a_checkpoint(tmp_path):
    from cofrgenet.training.run_store import latest_run

    saved, failed = tmp_path / "saved", tmp_path / "failed"
    (saved / "checkpoints").mkdir(parents=True)
    (saved / "checkpoints" / "last.ckpt").write_bytes(b"")
    failed.mkdir()  # newer, but a start that failed before its first save
    (failed / ".lock").write_text("{}")
    assert latest_run(tmp_path) == saved
    assert latest_run(tmp_path / "nowhere") is None


def test_checkpoints_keep_the_data_folder_as_an_absolute_path(tiny_data, tmp_path, monkeypatch):
    monkeypatch.chdir(tiny_data.parent)
    CofrCLI(args=fit_args(tmp_path, Path(tiny_data.name), "--trainer.max_steps", "1"))
    (last,) = (tmp_path / "runs" / "test").glob("*/checkpoints/last.ckpt")
    saved = torch.load(last, weights_only=True)["datamodule_hyper_parameters"]["data_dir"]
    assert saved == str(tiny_data.resolve())


def test_the_mlflow_client_splits_batches_at_mlflows_limits(tmp_path):
    """cofr logs params, tags and metrics in one log_batch call each (eval: a tag per
    task, over 100 with a large harness group): the pinned MLflow's client splits them."""
    import mlflow
    from mlflow.entities import Metric, Param, RunTag

    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("x")).info.run_id
    client.log_batch(
        run_id,
        metrics=[Metric(f"m{i}", float(i), 0, 0) for i in range(1001)],
        params=[Param(f"p{i}", "v") for i in range(101)],
        tags=[RunTag(f"t{i}", "v") for i in range(250)],
    )
    data = client.get_run(run_id).data
    assert (len(data.metrics), len(data.params)) == (1001, 101)
    assert len([k for k in data.tags if k.startswith("t")]) == 250


def test_a_fit_validates_every_interval_of_steps_across_epochs(tiny_data, tmp_path):
    """Lightning counts val_check_interval within an epoch unless
    check_val_every_n_epoch is null: with an epoch of 220 batches and an interval of
    100, the demo validated at 100, 200 and 320, never at its last step, 300."""
    from cofrgenet.data import TokenDataModule

    epoch = len(TokenDataModule(str(tiny_data), block_size=32, batch_size=16).train_dataloader())
    interval = next(k for k in range(epoch // 2, epoch) if epoch % k)  # not dividing an epoch
    steps = interval * (2 * epoch // interval + 1)  # past two epochs, on an interval
    args = ["--trainer.max_steps", str(steps), "--trainer.val_check_interval", str(interval)]
    args += ["--data.batch_size", "16", "--trainer.limit_val_batches", "1"]
    CofrCLI(args=fit_args(tmp_path, tiny_data, *args, "--run.name", "v"))
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    run_id = (tmp_path / "runs" / "test" / "v" / "mlflow_run_id").read_text().strip()
    validated = [m.step for m in client.get_metric_history(run_id, "val/loss")]
    assert validated == list(range(interval, steps + 1, interval))
    fraction = ["--trainer.val_check_interval", "0.5", "--run.name", "f"]
    with pytest.raises(ConfigError, match=r"add --trainer.check_val_every_n_epoch 1\)$"):
        CofrCLI(args=fit_args(tmp_path, tiny_data, *fraction))


def test_validate_without_a_config_scores_as_the_runs_fit_did(
    tiny_data, tmp_path, monkeypatch, caplog
):
    """`cofr validate --ckpt_path CKPT` read the default data folder (another tokenizer:
    refused) or every validation batch, and logged that score onto the run's val/loss
    beside the fit's own at the same step. It now takes the run's data folder (a
    relative one found above the run folder) and validation batches from its config."""
    import shutil

    shutil.copytree(tiny_data, tmp_path / "data" / "tiny")
    monkeypatch.chdir(tmp_path)
    args = fit_args(tmp_path, Path("data/tiny"), "--trainer.max_steps", "4", "--run.name", "a")
    args += ["--trainer.val_check_interval", "4", "--trainer.limit_val_batches", "2"]
    fit = float(CofrCLI(args=args).trainer.callback_metrics["val/loss"])
    ckpt = tmp_path / "runs" / "test" / "a" / "checkpoints" / "last.ckpt"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    cli = CofrCLI(
        args=["validate", "--ckpt_path", str(ckpt), "--trainer.enable_progress_bar", "false"]
    )
    assert float(cli.trainer.callback_metrics["val/loss"]) == fit
    assert Path(cli.datamodule.data_dir) == tmp_path / "data" / "tiny"
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    run_id = (ckpt.parent.parent / "mlflow_run_id").read_text().strip()
    # The fit's own score at that step, the same: kept once (it was logged twice).
    assert [m.value for m in client.get_metric_history(run_id, "val/loss")] == [fit]
    assert not (tmp_path / "elsewhere" / "runs").exists()
    # cofr test takes the fit's data, not its validation batches (it said it did).
    caplog.clear()
    with caplog.at_level(logging.INFO):
        tested = CofrCLI(args=["test", "--ckpt_path", str(ckpt)])
    (said,) = [r.getMessage() for r in caplog.records if "as the run's fit did" in r.getMessage()]
    assert "data.data_dir=" in said and "limit_val_batches" not in said
    assert tested.trainer.num_test_batches[0] > 2  # the whole split
    (tmp_path / "data" / "tiny").rename(tmp_path / "data" / "moved")
    with pytest.raises(ConfigError, match=r"trained on the data folder 'data/tiny', not found as "):
        CofrCLI(args=["validate", "--ckpt_path", str(ckpt)])
    # A ${VAR} in the saved folder is expanded; a fit that validated nothing (limit 0)
    # does not make this command score nothing; a smaller --data.batch_size counts.
    saved = ckpt.parent.parent / "config.yaml"
    text = saved.read_text().replace("data_dir: data/tiny", "data_dir: ${COFR_TEST_DATA}/moved")
    saved.write_text(text.replace("limit_val_batches: 2", "limit_val_batches: 0"))
    monkeypatch.setenv("COFR_TEST_DATA", str(tmp_path / "data"))
    quiet = ["--trainer.enable_progress_bar", "false"]
    cli = CofrCLI(args=["validate", "--ckpt_path", str(ckpt), "--data.batch_size", "2", *quiet])
    assert Path(cli.datamodule.data_dir) == tmp_path / "data" / "moved"
    assert cli.datamodule.val_batch_size == 2 and cli.trainer.num_val_batches[0] > 2
    # Asked for, 0 batches is refused: it scored nothing and exited 0.
    for command, limit in (("validate", "limit_val_batches"), ("test", "limit_test_batches")):
        with pytest.raises(ConfigError, match=rf"trainer.{limit} is 0: cofr {command} would "):
            CofrCLI(args=[command, "--ckpt_path", str(ckpt), f"--trainer.{limit}", "0"])


def test_validate_scores_the_model_as_it_trained_after_its_preset_changed(
    tiny_data, tmp_path, monkeypatch
):
    """Lightning builds the model from the checkpoint's model.preset as it reads today: a
    preset changed since (another cofr version) failed to load, or, with a changed
    default, scored another function under the run's val/loss."""
    from cofrgenet.models import presets

    args = fit_args(tmp_path, tiny_data, "--trainer.max_steps", "2", "--run.name", "a")
    args += ["--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "2"]
    fit = CofrCLI(args=args)
    trained, score = fit.model.model_config, float(fit.trainer.callback_metrics["val/loss"])
    changed = dict(presets.PRESETS["gpt2-tiny-f"], n_layer=3, ladder_floor=0.1)
    monkeypatch.setitem(presets.PRESETS, "gpt2-tiny-f", changed)
    ckpt = tmp_path / "runs" / "test" / "a" / "checkpoints" / "last.ckpt"
    quiet = ["--trainer.enable_progress_bar", "false", "--run.mlflow", "false"]
    cli = CofrCLI(args=["validate", "--ckpt_path", str(ckpt), *quiet])
    assert cli.model.model_config == trained
    assert float(cli.trainer.callback_metrics["val/loss"]) == score
    monkeypatch.delitem(presets.PRESETS, "gpt2-tiny-f")  # removed since: the record builds it
    cli = CofrCLI(args=["validate", "--ckpt_path", str(ckpt), *quiet])
    assert float(cli.trainer.callback_metrics["val/loss"]) == score


def test_model_fields_that_do_not_fit_together_are_model_configs_error(tiny_data, tmp_path):
    """Without --data.block_size the model's config is built before the model, for the
    data's block size: its error lacked the "model.config:" the model's own has."""
    args = fit_args(tmp_path, tiny_data, "--model.config.n_head", "3")
    at = args.index("--data.block_size")
    del args[at : at + 2]
    with pytest.raises(ConfigError, match=r"^model\.config: n_embd \(64\) must be a multiple"):
        CofrCLI(args=args)


def test_validate_logs_into_the_store_of_the_checkpoints_own_runs_folder(
    tiny_data, tmp_path, monkeypatch, caplog
):
    """A run of `--run.runs_dir runs` validated from another folder that holds a `runs/`
    of its own: the scores went to that folder's store (made empty on the way). They go
    to the run's own; with its store gone, they are scored and not logged."""
    monkeypatch.chdir(tmp_path)
    args = fit_args(tmp_path, tiny_data, "--trainer.max_steps", "2", "--run.name", "a")
    CofrCLI(args=[*args, "--run.runs_dir", "runs", "--trainer.limit_val_batches", "1"])
    ckpt = tmp_path / "runs" / "test" / "a" / "checkpoints" / "last.ckpt"
    other = tmp_path / "other"
    (other / "runs").mkdir(parents=True)
    monkeypatch.chdir(other)
    quiet = ["--trainer.enable_progress_bar", "false"]
    cli = CofrCLI(args=["validate", "--ckpt_path", str(ckpt), *quiet])
    score = float(cli.trainer.callback_metrics["val/loss"])
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    run_id = (ckpt.parent.parent / "mlflow_run_id").read_text().strip()
    assert client.get_metric_history(run_id, "val/loss")[-1].value == score
    assert list((other / "runs").iterdir()) == []
    (tmp_path / "runs" / "mlflow.db").rename(tmp_path / "moved.db")
    with caplog.at_level(logging.INFO):
        cli = CofrCLI(args=["validate", "--ckpt_path", str(ckpt), *quiet])
    assert float(cli.trainer.callback_metrics["val/loss"]) == score
    assert "not logged to MLflow: no MLflow store at" in caplog.text
    assert not (tmp_path / "runs" / "mlflow.db").exists()
    # A store that is no database (SQLAlchemy's traceback, exit 1, after the scores), or an
    # empty file (MLflow made its tables in it): scored, not logged, the file left as it is.
    for content, what in ((b"garbage\n", "file is not a database"), (b"", "an empty file")):
        (tmp_path / "runs" / "mlflow.db").write_bytes(content)
        caplog.clear()
        with caplog.at_level(logging.INFO):
            cli = CofrCLI(args=["validate", "--ckpt_path", str(ckpt), *quiet])
        assert float(cli.trainer.callback_metrics["val/loss"]) == score
        assert f"is not an MLflow database ({what}; was the run folder moved" in caplog.text
        assert (tmp_path / "runs" / "mlflow.db").read_bytes() == content


def test_a_checkpoint_copied_into_another_runs_folder_is_not_logged_as_that_runs(
    tiny_data, tmp_path, caplog
):
    """A copy of run a's checkpoint in run b's folder: its scores went onto b's MLflow run
    (at a's step, where cofr compare then read them as b's). Told by the run id the
    checkpoint records, or, for a checkpoint older than that, by its model."""
    from cofrgenet.training import pretrained

    for name, depth in (("a", "2"), ("b", "3")):
        args = fit_args(tmp_path, tiny_data, "--run.name", name, "--trainer.max_steps", "2")
        CofrCLI(args=[*args, "--model.config.depth", depth, "--trainer.limit_val_batches", "1"])
    runs = tmp_path / "runs" / "test"
    own = pretrained.load_checkpoint(runs / "a" / "checkpoints" / "last.ckpt")
    a_id = (runs / "a" / "mlflow_run_id").read_text().strip()
    assert own.mlflow_run_id == a_id and own.foreign is None
    copy = runs / "b" / "checkpoints" / "foreign.ckpt"
    shutil.copy(runs / "a" / "checkpoints" / "last.ckpt", copy)
    loaded = pretrained.load_checkpoint(copy)
    assert loaded.mlflow_run_id is None and f"was saved by MLflow run {a_id}, not by b's" in (
        loaded.foreign or ""
    )
    with caplog.at_level(logging.INFO):
        CofrCLI(
            args=["validate", "--ckpt_path", str(copy), "--trainer.enable_progress_bar", "false"]
        )
    assert f"not logged to MLflow: {copy} was saved by MLflow run {a_id}" in caplog.text
    b_id = (runs / "b" / "mlflow_run_id").read_text().strip()
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    assert client.get_metric_history(b_id, "val/loss") == []  # the fit validated nothing
    saved = torch.load(copy, weights_only=True)
    del saved["mlflow_run_id"]  # a checkpoint from before the id was recorded
    torch.save(saved, copy)
    assert "holds another model than b's config.yaml (depth differs)" in (
        pretrained.load_checkpoint(copy).foreign or ""
    )


def test_artifacts_lie_beside_the_sqlite_database_of_every_command(tmp_path, monkeypatch):
    """One rule for fit, sweeps, the UI and GLUE: ``mlartifacts/`` beside the store's
    database file, whatever folder the URI is relative to; a server chooses its own."""
    from cofrgenet.training.run_store import RunConfig, artifact_location

    monkeypatch.chdir(tmp_path)
    beside = (tmp_path / "store" / "mlartifacts").as_uri()
    assert artifact_location("sqlite:///store/mlflow.db") == beside  # relative: no ValueError
    assert artifact_location(f"sqlite:///{tmp_path}/store/mlflow.db?timeout=30") == beside
    assert artifact_location("http://localhost:5000") is None
    run = RunConfig(runs_dir="runs", tracking_uri="sqlite:///store/mlflow.db")
    assert artifact_location(run) == beside  # not the runs folder: where the store is
    default = RunConfig(runs_dir="runs", tracking_uri=None)
    assert artifact_location(default) == (tmp_path / "runs" / "mlartifacts").as_uri()


def test_a_sharded_checkpoint_is_scored_under_fsdp_only_and_with_its_own_model(
    tiny_data, tmp_path, monkeypatch
):
    """LightningCLI reads a checkpoint file's hyperparameters, not a sharded folder's:
    under FSDP the default preset was built ("size mismatch" per rank), and in one
    process the folder was opened as a file (IsADirectoryError). The same for the
    folder a run's name finds (no --ckpt_path)."""
    folder = tmp_path / "runs" / "exp" / "sharded" / "checkpoints" / "last.ckpt"
    folder.mkdir(parents=True)
    (folder / ".metadata").write_bytes(b"shards")
    hparams = {"preset": "gpt2-tiny-fa", "config": {"vocab_size": 320, "block_size": 32}}
    torch.save({"global_step": 2, "hyper_parameters": hparams}, folder / "meta.pt")
    evaluate = ["validate", "--config", str(CONF / "trainer" / "cpu-debug.yaml")]
    evaluate += ["--data.data_dir", str(tiny_data), "--ckpt_path", str(folder)]
    from cofrgenet.training.checkpoints import CheckpointError

    with pytest.raises(CheckpointError, match=r"is a sharded FSDP checkpoint .*score it with"):
        CofrCLI(args=evaluate)
    parsed = []

    class Parsed(Exception):
        pass

    def parsed_only(cli):  # an FSDP trainer is not built here: the parsed config is enough
        parsed.append(cli.config)
        raise Parsed

    monkeypatch.setattr(CofrCLI, "instantiate_classes", parsed_only)
    strategy = '{"class_path": "cofrgenet.training.strategies.LadderFSDPStrategy"}'
    with pytest.raises(Parsed):
        CofrCLI(args=[*evaluate, "--trainer.strategy", strategy])
    assert parsed[0].validate.model.preset == "gpt2-tiny-fa"
    by_name = [*evaluate[:-2], "--run.runs_dir", str(tmp_path / "runs"), "--run.experiment"]
    by_name += ["exp", "--run.name", "sharded"]
    with pytest.raises(CheckpointError, match=r"is a sharded FSDP checkpoint .*score it with"):
        CofrCLI(args=by_name)
    with pytest.raises(Parsed):
        CofrCLI(args=[*by_name, "--trainer.strategy", strategy])
    assert parsed[1].validate.model.preset == "gpt2-tiny-fa"
    assert parsed[1].validate.ckpt_path == str(folder)


def as_sharded(file: Path, folder: Path) -> None:
    """A one-file checkpoint ``file`` rewritten as FSDP's sharded folder ``folder``: the
    weights through torch's distributed checkpoint (its ``.metadata`` and shards, one
    process), the rest in ``meta.pt``, as ``FSDPStrategy.save_checkpoint`` lays them."""
    import torch.distributed.checkpoint as dcp

    saved = torch.load(file, weights_only=True)
    folder.mkdir()
    dcp.save({"model": saved.pop("state_dict")}, checkpoint_id=folder)
    saved.pop("optimizer_states", None)
    torch.save(saved, folder / "meta.pt")


FSDP_ONE_PROCESS = json.dumps(
    {
        "class_path": "cofrgenet.training.strategies.LadderFSDPStrategy",
        "init_args": {"state_dict_type": "sharded"},
    }
)


def test_a_sharded_checkpoint_gets_the_checks_of_a_file_before_anything_is_rewritten(
    tiny_data, tmp_path
):
    """--ckpt_path of a sharded FSDP folder ran none of a file's checks: other model
    settings failed in both ranks (a KeyError in torch's optimizer rekeying) after the
    run's config.yaml and MLflow record were rewritten (FAILED); an earlier checkpoint
    overwrote the later ones; max_steps at its step was not refused. Its meta.pt and the
    shards' metadata say what a file does."""
    CofrCLI(
        args=fit_args(
            tmp_path, tiny_data, "--run.name", "s", "--trainer.max_steps", "4",
            "--run.checkpoint_every_n_steps", "2",
        )
    )  # fmt: skip
    run = tmp_path / "runs" / "test" / "s"
    for file in sorted((run / "checkpoints").glob("*.ckpt")):
        as_sharded(file, file.with_suffix(".tmp"))
        file.unlink()
        file.with_suffix(".tmp").rename(file)
    config = (run / "config.yaml").read_text()
    run_id = (run / "mlflow_run_id").read_text().strip()

    def resume(*extra: str) -> list[str]:
        return fit_args(
            tmp_path, tiny_data, "--run.name", "s", "--trainer.strategy", FSDP_ONE_PROCESS,
            "--trainer.max_steps", "8", *extra,
        )  # fmt: skip

    last = ["--ckpt_path", "last"]
    depth = '{"vocab_size": 320, "block_size": 32, "depth": 2}'
    with pytest.raises(ConfigError, match=r"another network .*--model\.config\.depth 5"):
        CofrCLI(args=resume("--model.config", depth, *last))
    floor = '{"vocab_size": 320, "block_size": 32, "ladder_floor": 0.25}'
    with pytest.raises(ConfigError, match=r"other model settings .*ladder_floor 0\.5"):
        CofrCLI(args=resume("--model.config", floor, *last))
    with pytest.raises(
        ConfigError, match=r"cannot resume the data stream exactly: .*seed: 42 -> 7"
    ):
        CofrCLI(args=resume("--data.seed", "7", *last))
    with pytest.raises(ConfigError, match=r"\.ckpt is at step 4 already"):
        CofrCLI(args=resume(*last, "--trainer.max_steps", "4"))
    earlier = run / "checkpoints" / "step0000002.ckpt"
    with pytest.raises(RunExistsError, match=r"is at step 2, but run folder .* step 4"):
        CofrCLI(args=resume("--ckpt_path", str(earlier)))
    assert (run / "config.yaml").read_text() == config
    found = mlflow_runs(tmp_path / "runs")
    assert found["run_id"].tolist() == [run_id] and found["status"].tolist() == ["FINISHED"]


def test_validate_under_fsdp_logs_at_the_sharded_checkpoints_step(tiny_data, tmp_path, monkeypatch):
    """A sharded folder's step was None: cofr validate under FSDP logged its score at
    step 0 (validate's own global_step), not the checkpoint's."""
    CofrCLI(args=fit_args(tmp_path, tiny_data, "--run.name", "v", "--trainer.max_steps", "3"))
    last = tmp_path / "runs" / "test" / "v" / "checkpoints" / "last.ckpt"
    as_sharded(last, last.with_suffix(".tmp"))
    last.unlink()
    last.with_suffix(".tmp").rename(last)
    loggers = []

    class Built(Exception):
        pass

    def logger_only(cli, config, callbacks):  # an FSDP trainer is not built here
        loggers.append(config["logger"])
        raise Built

    monkeypatch.setattr(CofrCLI, "build_trainer", logger_only)
    evaluate = ["validate", "--ckpt_path", str(last), "--trainer.accelerator", "cpu"]
    with pytest.raises(Built):
        CofrCLI(args=[*evaluate, "--trainer.strategy", FSDP_ONE_PROCESS])
    assert loggers[0].eval_step == 3 and loggers[0].eval_data is None


def test_a_sharded_checkpoint_is_refused_by_a_fit_under_another_strategy(tiny_data, tmp_path):
    """fit --ckpt_path last of an FSDP run under another strategy opened the folder as
    a file (IsADirectoryError) after rewriting config.yaml (strategy auto) and marking
    the MLflow run FAILED: refused first, as validate refuses it."""
    from cofrgenet.training.checkpoints import CheckpointError

    CofrCLI(args=fit_args(tmp_path, tiny_data, "--run.name", "f", "--trainer.max_steps", "2"))
    run = tmp_path / "runs" / "test" / "f"
    last = run / "checkpoints" / "last.ckpt"
    as_sharded(last, last.with_suffix(".tmp"))
    last.unlink()
    last.with_suffix(".tmp").rename(last)
    config = (run / "config.yaml").read_text()
    resume = fit_args(tmp_path, tiny_data, "--run.name", "f", "--trainer.max_steps", "4")
    # The option that names it (a CPU machine runs it), not a GPU recipe.
    with pytest.raises(CheckpointError, match=r"sharded FSDP .*resume it with the FSDP strategy "
                       r"it trained with \(--trainer\.strategy\.class_path cofrgenet\.training\."
                       r"strategies\.LadderFSDPStrategy, or the run's own config\.yaml"):  # fmt: skip
        CofrCLI(args=[*resume, "--ckpt_path", "last"])
    assert (run / "config.yaml").read_text() == config
    assert mlflow_runs(tmp_path / "runs")["status"].tolist() == ["FINISHED"]
    # validate's advice keeps it scoring as the fit did: --config conf/trainer/fsdp.yaml
    # would replace the fit's data and batch settings with the command's.
    from cofrgenet.training.cli import FSDP_STRATEGY_OPTION

    evaluate = ["validate", "--run.runs_dir", str(tmp_path / "runs"), "--run.experiment"]
    evaluate += ["test", "--run.name", "f", "--trainer.accelerator", "cpu"]
    with pytest.raises(CheckpointError, match=re.escape(FSDP_STRATEGY_OPTION)):
        CofrCLI(args=evaluate)
    parsed = []

    class Parsed(Exception):
        pass

    def parsed_only(cli):  # an FSDP trainer is not built here: the parsed config is enough
        parsed.append(cli.config.validate)
        raise Parsed

    with mock.patch.object(CofrCLI, "instantiate_classes", parsed_only), pytest.raises(Parsed):
        CofrCLI(args=[*evaluate, *FSDP_STRATEGY_OPTION.split()])
    assert parsed[0].trainer.limit_val_batches == 4  # the fit's (conf/trainer/cpu-debug.yaml)
    assert parsed[0].data.data_dir == str(tiny_data)


def test_model_compile_under_fsdp_is_refused_once_before_the_ranks_start(
    tiny_data, tmp_path, monkeypatch
):
    """The refusal came from each rank's setup (one copy per rank, after the MLflow run
    was made) and told to set model.compile: false "as conf/trainer/fsdp.yaml does",
    which sets nothing of the model: said once, before the processes launch."""
    from cofrgenet.training.module import LanguageModel

    set_up = []
    monkeypatch.setattr(LanguageModel, "setup", lambda self, stage: set_up.append(stage))
    args = fit_args(tmp_path, tiny_data, "--run.name", "c", "--trainer.strategy")
    args += [FSDP_ONE_PROCESS, "--model.compile", "true"]
    with pytest.raises(ConfigError, match=r"model\.compile does not work under FSDP .*its default"):
        CofrCLI(args=args)
    assert set_up == [] and not (tmp_path / "runs" / "test" / "c").exists()
    assert not (tmp_path / "runs" / "mlflow.db").exists() or mlflow_runs(tmp_path / "runs").empty


def test_a_ddp_spawn_ranks_user_error_is_found_in_its_traceback_text():
    """torch passes a spawned rank's error on as text: a refused setting came out as
    a traceback from the launching process, not the one-line error plain ddp gives."""
    from torch.multiprocessing import ProcessRaisedException

    from cofrgenet.training.cli import user_error_of_rank

    def raised(last_line: str) -> ProcessRaisedException:
        text = (
            f"\n\n-- Process 0 terminated with the following error:\nTraceback ...\n{last_line}\n"
        )
        return ProcessRaisedException(text, 0, 1234)

    error = user_error_of_rank(raised("cofrgenet.errors.ConfigError: lower data.batch_size"))
    assert isinstance(error, UserError) and str(error) == "lower data.batch_size"
    assert user_error_of_rank(raised("RuntimeError: CUDA out of memory")) is None
    assert user_error_of_rank(raised("cofrgenet.nowhere.Error: x")) is None
    assert user_error_of_rank(raised("cofrgenet.training.cli.CofrCLI: not an error")) is None


def test_saved_settings_reads_a_file_or_a_sharded_folders_meta(tmp_path):
    """One reader for both kinds: a sharded folder's meta.pt that is not Lightning's
    dict is a CheckpointError naming the folder, not an AttributeError."""
    from cofrgenet.training import checkpoints

    file = tmp_path / "one.ckpt"
    torch.save({"state_dict": {}, "model_config": {"n_layer": 2}}, file)
    assert checkpoints.saved_settings(file)["model_config"] == {"n_layer": 2}
    folder = tmp_path / "sharded.ckpt"
    folder.mkdir()
    (folder / ".metadata").write_bytes(b"")
    torch.save({"hyper_parameters": {"preset": "gpt2-mini"}}, folder / "meta.pt")
    assert checkpoints.saved_settings(folder)["hyper_parameters"] == {"preset": "gpt2-mini"}
    torch.save(["not", "a", "dict"], folder / "meta.pt")
    with pytest.raises(checkpoints.CheckpointError, match=r"meta\.pt"):
        checkpoints.saved_settings(folder)


def test_a_sigterm_between_the_run_lock_and_the_fit_s_handler_exits_cleanly(tiny_data, tmp_path):
    """SIGTERM's default action, in the second between the run folder's lock and the
    fit's own handler, ended the process with its output unwritten (a 0-byte SLURM log)
    and the folder holding only its lock file."""
    script = (
        "import os, signal, sys\n"
        "from cofrgenet.training import checkpoints, cli\n"
        "def stopped_here(run_dir):\n"
        "    print('written before the signal')  # buffered: lost unless Python exits\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return []\n"
        "checkpoints.remove_unfinished_saves = stopped_here\n"
        "cli.main(sys.argv[1:])\n"
    )
    args = fit_args(tmp_path, tiny_data, "--trainer.max_steps", "2", "--run.name", "early")
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 143, done.stderr[-2000:]
    assert "written before the signal" in done.stdout
    assert not (tmp_path / "runs" / "test" / "early").exists()  # made here, nothing in it


def test_the_command_tag_reads_as_typed(monkeypatch):
    """Under `python -m cofrgenet` the tag read '/path/to/src/cofrgenet/__main__.py fit'."""
    from cofrgenet.training.run_store import code_tags

    for argv, shown in (
        (["/x/src/cofrgenet/__main__.py", "fit", "--run.name", "a b"], "cofr fit --run.name 'a b'"),
        (["/venv/bin/cofr", "fit"], "cofr fit"),
        (["/x/src/cofrgenet/cli.py", "fit"], "cofr fit"),  # cofr demo's fits
        (["train.py", "fit"], "train.py fit"),
        (["/x/cli.py", "fit"], "/x/cli.py fit"),
    ):
        monkeypatch.setattr(sys, "argv", argv)
        assert code_tags()["cofrgenet.command"] == shown


def test_a_sigterm_outside_the_fit_s_steps_marks_nothing_it_should_not(tmp_path):
    """cofr fit's SIGTERM raises from its start: one before the MLflow run exists made a
    run (asking the logger for its id) only to mark it KILLED, and one after the fit's
    teardown (trained and saved) marked the finished run KILLED, "before training began"."""
    from types import SimpleNamespace

    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from cofrgenet.training.callbacks import StopOnSignal
    from cofrgenet.training.tracking import CofrMLFlowLogger

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    logger = CofrMLFlowLogger(run_dir=tmp_path / "run", experiment_name="e", tracking_uri=uri)
    logger.mark_killed(0)
    client = mlflow.tracking.MlflowClient(uri)
    made = client.get_experiment_by_name("e")
    assert made is None or not client.search_runs([made.experiment_id])

    marked: list[int] = []
    trainer = SimpleNamespace(
        state=SimpleNamespace(fn="fit"), world_size=1, global_step=5,
        loggers=[SimpleNamespace(mark_killed=marked.append)], default_root_dir=str(tmp_path),
    )  # fmt: skip
    stop = StopOnSignal()
    stop._set_up = True  # set up, trained, torn down: "idle" again
    stop.on_exception(trainer, None, SIGTERMException(143))
    assert marked == [] and stop.saved is None
    stop = StopOnSignal()  # before its setup: the fit had not begun
    stop.on_exception(trainer, None, (stopped := SIGTERMException(143)))
    assert marked == [5] and stopped.code == 143


def test_init_from_starts_a_new_run_from_a_checkpoint_s_weights_on_other_data(
    tiny_data, tmp_path, monkeypatch, caplog
):
    """Continued pretraining on another corpus: ``--ckpt_path`` refuses other data (the
    stream cannot continue) and now names ``model.init_from``, which starts a new run at
    step 0 from the checkpoint's network weights alone, checked against the model and the
    data's tokenizer, and tagged with where it started (as a run branched off another
    run's checkpoint is)."""
    import lightning as L

    from cofrgenet.data import prepare_data

    other = tmp_path / "other-byte"
    prepare_data(source="pydoc", tokenizer="byte", out=other, max_docs=6, num_workers=1)
    CofrCLI(args=fit_args(tmp_path, tiny_data, "--run.name", "a", "--trainer.max_steps", "2"))
    runs = tmp_path / "runs" / "test"
    ckpt = runs / "a" / "checkpoints" / "last.ckpt"
    trained = torch.load(ckpt, weights_only=True)["state_dict"]
    on_other = ["--data.data_dir", str(other), "--run.name", "b", "--trainer.max_steps", "3"]
    with pytest.raises(
        ConfigError, match=rf"cannot resume the data stream.*--model.init_from {ckpt}"
    ):
        CofrCLI(args=fit_args(tmp_path, tiny_data, *on_other, "--ckpt_path", str(ckpt)))
    # Another reading of the same corpus (a seed) is no case for init_from: not named.
    with pytest.raises(ConfigError, match="cannot resume the data stream") as refused:
        reseeded = ["--run.name", "b", "--ckpt_path", str(ckpt), "--data.seed", "5"]
        CofrCLI(args=fit_args(tmp_path, tiny_data, *reseeded))
    assert "init_from" not in str(refused.value)

    class FirstWeights(L.Callback):
        def on_train_start(self, trainer, pl_module):
            self.weights = {k: v.clone() for k, v in pl_module.state_dict().items()}

    first = FirstWeights()
    monkeypatch.chdir(runs)  # a relative path, recorded absolute for a restart elsewhere
    init = ["--model.init_from", "a/checkpoints/last.ckpt", "--model.config.dropout", "0.1"]
    # --ckpt_path last as a SLURM job's first start gives it: nothing to resume yet.
    start = [*on_other, *init, "--ckpt_path", "last"]
    CofrCLI(args=fit_args(tmp_path, tiny_data, *start), extra_callbacks=[first])
    model_keys = [k for k in trained if k.startswith("model.")]
    assert model_keys and all(torch.equal(first.weights[k], trained[k]) for k in model_keys)
    own = torch.load(runs / "b" / "checkpoints" / "last.ckpt", weights_only=True)
    assert own["global_step"] == 3  # from 0
    # Its resume takes its own checkpoint's weights: init_from is not read again.
    resumed = FirstWeights()
    start[start.index("3")] = "4"
    with (
        mock.patch("cofrgenet.training.checkpoints.load_initial_weights") as load_initial,
        caplog.at_level(logging.INFO),
    ):
        CofrCLI(args=fit_args(tmp_path, tiny_data, *start), extra_callbacks=[resumed])
    load_initial.assert_not_called()
    assert "is not read" not in caplog.text  # its own resume: nothing to say
    assert all(torch.equal(resumed.weights[k], own["state_dict"][k]) for k in model_keys)
    monkeypatch.chdir(tmp_path)
    branch = ["--run.name", "c", "--ckpt_path", str(ckpt), "--trainer.max_steps", "3"]
    with caplog.at_level(logging.INFO):
        CofrCLI(args=fit_args(tmp_path, tiny_data, *branch, "--model.init_from", str(ckpt)))
    # LightningCLI builds a --ckpt_path file's model from its hyperparameters: said.
    assert "own model settings (its hyperparameters): --model.init_from not used" in caplog.text
    by_name = mlflow_runs(tmp_path / "runs").set_index("tags.mlflow.runName")
    assert by_name.loc["b", "tags.cofrgenet.started_from"] == str(ckpt.resolve())
    assert by_name.loc["c", "tags.cofrgenet.started_from"] == str(ckpt.resolve())
    assert Path(by_name.loc["b", "params.model.init_from"]).resolve() == ckpt.resolve()
    assert not isinstance(by_name.loc["a", "tags.cofrgenet.started_from"], str)  # NaN: none

    # Refused before anything is written: another network, another tokenizer.
    message = (
        r"^model.init_from: .* another network .* depth 5 \(here 2\): start from it with "
        r"--model.config.depth 5$"
    )
    refused = ["--run.name", "d", "--model.init_from", str(ckpt)]
    with pytest.raises(ConfigError, match=message):
        CofrCLI(args=fit_args(tmp_path, tiny_data, *refused, "--model.config.depth", "2"))
    saved = torch.load(ckpt, weights_only=True)
    saved["TokenDataModule"]["fingerprint"]["tokenizer_sha256"] = "0123456789abcdef"
    torch.save(saved, other_tokenizer := tmp_path / "other-tokenizer.ckpt")
    refused[-1] = str(other_tokenizer)
    with pytest.raises(ConfigError, match=r"another tokenizer .*--tokenizer-from .*pydoc-byte"):
        CofrCLI(args=fit_args(tmp_path, tiny_data, *refused))
    refused[-1] = str(tmp_path / "nowhere.ckpt")
    with pytest.raises(ConfigError, match=r"^model.init_from: .*nowhere.ckpt"):
        CofrCLI(args=fit_args(tmp_path, tiny_data, *refused))
    assert not (runs / "d").exists()


def test_a_resume_with_another_accumulation_says_its_steps_change_scale(tiny_data, tmp_path):
    """trainer.accumulate_grad_batches changed on a resume trained on without a word,
    while each optimizer step then took another number of sequences."""
    steps = ["--run.name", "acc", "--trainer.limit_val_batches", "0"]
    CofrCLI(args=fit_args(tmp_path, tiny_data, *steps, "--trainer.max_steps", "2"))
    resume = [*steps, "--ckpt_path", "last", "--trainer.max_steps", "3"]
    message = r"accumulate_grad_batches 1 -> 2 since the checkpoint: an optimizer step now takes 2x"
    with pytest.warns(UserWarning, match=message):
        CofrCLI(
            args=fit_args(tmp_path, tiny_data, *resume, "--trainer.accumulate_grad_batches", "2")
        )
    with warnings.catch_warnings():  # the same accumulation again: nothing to say
        warnings.filterwarnings("error", message=".*accumulate_grad_batches.*")
        more = [*steps, "--ckpt_path", "last", "--trainer.max_steps", "4"]
        CofrCLI(args=fit_args(tmp_path, tiny_data, *more, "--trainer.accumulate_grad_batches", "2"))


def test_a_resume_that_replans_the_schedule_says_the_rate_jumps(tiny_data, tmp_path, caplog):
    """The README's finished 20-step run trained on to 30: the cosine was re-planned over
    30 steps and the rate at step 20 rose 3.7x, unsaid (docs said the curves continue as
    if it had never stopped). A resume within its plan says nothing."""
    steps = ["--run.name", "more", "--trainer.limit_val_batches", "0"]
    steps += ["--model.optimizer.warmup_steps", "2", "--trainer.max_steps", "10"]
    stop = ["--trainer.callbacks+=helpers.StopAtStep", "--trainer.callbacks.step=4"]
    CofrCLI(args=fit_args(tmp_path, tiny_data, *steps, *stop))
    with caplog.at_level(logging.INFO):  # stopped at 4 of 10, resumed to 10: the same plan
        CofrCLI(args=fit_args(tmp_path, tiny_data, *steps, "--ckpt_path", "last"))
    assert not [r for r in caplog.records if "schedule spans" in r.getMessage()]
    caplog.clear()
    with caplog.at_level(logging.INFO):
        resumed = CofrCLI(args=fit_args(
            tmp_path, tiny_data, *steps, "--ckpt_path", "last", "--trainer.max_steps", "14"
        ))  # fmt: skip
    [said] = [r.getMessage() for r in caplog.records if "schedule spans" in r.getMessage()]
    before, now = re.search(r"step 10 goes (\S+) -> (\S+) ", said).groups()
    assert said.startswith("resume: the learning-rate schedule spans 14 steps now, not the ")
    assert float(now) > float(before)  # the old plan's end against 10 of 14: higher
    assert resumed.trainer.global_step == 14


def test_a_signal_in_the_validation_after_the_last_epoch_is_late():
    """A fit bounded by max_epochs (max_steps -1): a signal in its final validation
    stopped the finished run there, KILLED, as one bounded by max_steps did."""
    from types import SimpleNamespace

    from cofrgenet.training.callbacks import StopOnSignal

    stop = StopOnSignal()
    acted = []
    stop._act = lambda trainer, module: acted.append(trainer.current_epoch)

    def trainer(**state):
        settings = {"max_steps": -1, "max_epochs": 2, "global_step": 50, "is_last_batch": True}
        return SimpleNamespace(state=SimpleNamespace(fn="fit"), **{**settings, **state})

    stop.on_validation_end(trainer(current_epoch=1), None)  # the last epoch's last batch
    stop.on_validation_end(trainer(max_steps=50, max_epochs=None, current_epoch=0), None)
    assert acted == []
    stop.on_validation_end(trainer(current_epoch=0), None)  # an epoch is still to train
    stop.on_validation_end(trainer(current_epoch=1, is_last_batch=False), None)  # mid-epoch
    assert acted == [0, 1]  # acted on: a stop, as at any step's end


def test_a_ctrl_c_in_the_validation_after_the_last_step_says_the_run_finishes(capsys):
    """A first Ctrl-C in the final validation printed "stopping after this step", while
    the fit went on to end normally (the signal is late there)."""
    from types import SimpleNamespace

    from cofrgenet.training.callbacks import StopOnSignal

    def trainer(**state):
        settings = {"max_steps": 50, "max_epochs": None, "global_step": 50, "is_last_batch": False}
        return SimpleNamespace(state=SimpleNamespace(fn="fit"), **{**settings, **state})

    stop = StopOnSignal()
    stop._phase = "training"
    stop.on_validation_start(trainer(global_step=40), None)  # steps are still to train
    stop._on_sigint(signal.SIGINT, None)
    assert "stopping after this step" in capsys.readouterr().out

    stop = StopOnSignal()
    stop._phase = "training"
    stop.on_validation_start(trainer(), None)  # the last step is trained
    stop._on_sigint(signal.SIGINT, None)
    said = capsys.readouterr().out
    assert "training is over; finishing its final validation and save" in said
    assert "stopping" not in said
    with pytest.raises(KeyboardInterrupt):  # a second one aborts, as anywhere
        stop._on_sigint(signal.SIGINT, None)


def test_a_val_interval_inside_optimizer_steps_is_warned_of():
    """Lightning counts val_check_interval in batches: 10 under accumulate_grad_batches 3
    validated at steps 3, 6, 10, 13..., inside steps, unsaid."""
    from cofrgenet.training.cli import _check_trainer_counts

    settings = {"val_check_interval": 10, "accumulate_grad_batches": 3}
    with pytest.warns(UserWarning, match=r"val_check_interval 10 counts batches, and is not a "
                      r"multiple of trainer\.accumulate_grad_batches 3: .*; 30 validates every "
                      r"10 steps"):  # fmt: skip
        _check_trainer_counts(settings.get)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _check_trainer_counts({**settings, "val_check_interval": 30}.get)
        _check_trainer_counts({"val_check_interval": 10}.get)
