"""What cofr fit shows: harmless dependency noise silenced, steps out of max_steps, a summary."""

from __future__ import annotations

import logging
import warnings

from cofrgenet.training.console import (
    HARMLESS,
    StepProgressBar,
    quiet_known_noise,
    summary_lines,
)


def test_known_noise_is_silenced_and_the_rest_is_not(caplog):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        quiet_known_noise()
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", stacklevel=1)
        warnings.warn("something new and worth reading", stacklevel=1)
        # val/* scores are synced MeanMetrics; another metric logged so would not be
        recommended = "It is recommended to use `self.log({!r}, ..., sync_dist=True)` when"
        warnings.warn(recommended.format("val/loss"), stacklevel=1)
        warnings.warn(recommended.format("train/other"), stacklevel=1)
        # validate of a checkpoint outside a run folder: no logger, as said above the table
        unlogged = "You called `self.log({!r}, ..., logger=True)` but have no logger configured."
        warnings.warn(unlogged.format("val/loss"), stacklevel=1)
        warnings.warn(unlogged.format("train/other"), stacklevel=1)
        # torch.distributed.checkpoint's, at every sharded FSDP save and load
        sharded = "Please use DTensor instead and we are deprecating ShardedTensor."
        warnings.warn(sharded, FutureWarning, stacklevel=1)
        # Lightning's, of an epoch shorter than log_every_n_steps: it logs across epochs.
        warnings.warn(
            "The number of training batches (9) is smaller than the logging interval "
            "Trainer(log_every_n_steps=20). Set a lower value ...",
            stacklevel=1,
        )
    assert [str(w.message) for w in caught] == [
        "something new and worth reading",
        recommended.format("train/other"),
        unlogged.format("train/other"),
    ]
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    with caplog.at_level(logging.INFO, logger="lightning.pytorch.utilities.rank_zero"):
        logger.info("💡 Tip: For seamless cloud logging and experiment tracking, try ...")
        logger.info("GPU available: False, used: False")
        logger.info("\nDetected KeyboardInterrupt, attempting graceful shutdown ...")
    assert [r.getMessage() for r in caplog.records] == ["GPU available: False, used: False"]
    caplog.clear()
    # Lightning's SLURM requeue saves without weights_only and logs so
    saving = "lightning.pytorch.trainer.connectors.checkpoint_connector"
    with caplog.at_level(logging.INFO, logger=saving):
        logging.getLogger(saving).info("`weights_only` was not set, defaulting to `False`.")
    assert not caplog.records
    caplog.clear()
    seed = logging.getLogger("lightning.fabric.utilities.seed")  # on every rank, prefixed
    with caplog.at_level(logging.INFO, logger="lightning.fabric.utilities.seed"):
        seed.info("[rank: 1] Seed set to 1337")
        seed.info("[rank: 1] something else")
    assert [r.getMessage() for r in caplog.records] == ["[rank: 1] something else"]
    assert all(reason for _, reason in HARMLESS)  # every silenced message says why
    caplog.clear()
    litdata = logging.getLogger("litdata.streaming.dataset")  # its own logger, filtered too
    with caplog.at_level(logging.WARNING, logger="litdata.streaming.dataset"):
        litdata.warning("Using state dict override, may lead to unexpected behavior if ...")
        litdata.warning("Overriding state input_dir_path /b/train to /b/train, this may ...")
        litdata.warning("a chunk is missing")
    assert [r.getMessage() for r in caplog.records] == ["a chunk is missing"]
    caplog.clear()
    store = logging.getLogger("mlflow.store.db.utils")  # a new run store: routine
    with caplog.at_level(logging.INFO, logger="mlflow.store.db.utils"):
        store.info("Creating initial MLflow database tables...")
        store.info("something else")
    assert [r.getMessage() for r in caplog.records] == ["something else"]


def test_progress_bar_metrics_have_short_names():
    from types import SimpleNamespace

    trainer = SimpleNamespace(
        progress_bar_metrics={"train/loss": 2.5, "perf/tokens_per_sec": 25123.4}, loggers=[]
    )
    items = StepProgressBar().get_metrics(trainer, None)
    assert items == {"loss": 2.5, "tok/s": "25,123"}


def test_summary_lines(tmp_path):
    from types import SimpleNamespace

    trainer = SimpleNamespace(
        default_root_dir=str(tmp_path), global_step=7, loggers=[], fast_dev_run=False
    )
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")
    assert summary_lines(trainer) == [
        f"run folder: {tmp_path}",
        f"checkpoint: {tmp_path / 'checkpoints' / 'last.ckpt'} (step 7)",
    ]
    trainer.fast_dev_run = 1  # its folder goes: not named as the run's
    assert summary_lines(trainer) == [
        f"fast_dev_run: nothing saved or logged; {tmp_path} is not kept as a run"
    ]


def test_the_model_report_replaces_lightnings_summary(caplog):
    import lightning as L

    from cofrgenet.training.console import ModelReport
    from cofrgenet.training.module import LanguageModel

    module = LanguageModel("gpt2-tiny-f")
    trainer = L.Trainer(
        max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        callbacks=[ModelReport()], accelerator="cpu",
    )  # fmt: skip
    assert sum(isinstance(c, L.pytorch.callbacks.ModelSummary) for c in trainer.callbacks) == 1
    with caplog.at_level(logging.INFO, logger="lightning.pytorch.utilities.rank_zero"):
        ModelReport().on_fit_start(trainer, module)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "ladder" in text and "FLOPs per token (analytic" in text and "training " in text
    # Counted from the config: FSDP has sharded and renamed the live module's parameters
    # by the fit's start (a 64k model was reported as 32k, its ladders as 0).
    import torch

    from cofrgenet.models import count_parameters

    total = count_parameters(module.model_config).total
    module.model = torch.nn.Linear(3, 3)  # as a flattened shard looks: other names, sizes
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lightning.pytorch.utilities.rank_zero"):
        ModelReport().on_fit_start(trainer, module)
    assert f"{total:,}" in "\n".join(r.getMessage() for r in caplog.records)


def test_the_model_report_counts_flops_at_the_length_trained(caplog):
    """data.block_size 16 on a model of block 32: the line said "sequence 32", while
    perf/mfu counted 16 tokens a sequence."""
    from types import SimpleNamespace

    import lightning as L

    from cofrgenet.training.console import ModelReport
    from cofrgenet.training.module import LanguageModel

    module = LanguageModel("gpt2-tiny-f")
    trainer = L.Trainer(logger=False, enable_progress_bar=False, accelerator="cpu")
    trainer.datamodule = SimpleNamespace(block_size=16)  # as Lightning sets it in fit
    with caplog.at_level(logging.INFO, logger="lightning.pytorch.utilities.rank_zero"):
        ModelReport().on_fit_start(trainer, module)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert module.model_config.block_size != 16
    assert "sequence 16): forward" in text


def test_the_training_bar_counts_optimizer_steps_over_the_whole_fit():
    """Two epochs, two batches a step: Lightning's bar restarts at each epoch and moves per
    batch, so rich's speed read thousands of it/s and a second left; ours reads steps over
    the fit, and the time left follows from it."""
    import time

    import lightning as L
    import torch
    from rich.text import Text
    from torch.utils.data import DataLoader

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            time.sleep(0.02)
            return self.layer(batch).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    seen = {}

    class Look(L.Callback):
        def on_train_end(self, trainer, pl_module):
            bar = trainer.progress_bar_callback
            task = bar.progress.tasks[bar.train_progress_bar_id]
            columns = bar.configure_columns(trainer)
            seen["text"] = " ".join(
                c.render(task).plain for c in columns if isinstance(c.render(task), Text)
            )
            seen["fields"] = dict(task.fields)

    bar = StepProgressBar()
    trainer = L.Trainer(
        max_steps=6, accumulate_grad_batches=2, logger=False, enable_checkpointing=False,
        callbacks=[bar, Look()], accelerator="cpu", enable_model_summary=False,
    )  # fmt: skip
    start = time.monotonic()
    trainer.fit(Tiny(), DataLoader(torch.randn(8, 2), batch_size=2))  # 4 batches an epoch
    wall = time.monotonic() - start
    rate = seen["fields"]["steps_per_s"]
    assert 6 / wall <= rate <= 6 / (6 * 2 * 0.02), seen  # steps over the fit, not batches
    assert f"{rate:.2f} steps/s" in seen["text"] and "6/6" in seen["text"]
    assert seen["fields"]["remaining_s"] == 0


def test_the_run_summary_ends_with_its_notes(caplog, tmp_path):
    """What the start warned of that must not scroll away (a --ckpt_path last typo) is
    printed again below the summary lines."""
    import logging
    from types import SimpleNamespace

    from cofrgenet.training.console import RunSummary

    notes: list[str] = []
    summary = RunSummary(notes)
    notes.append("note: this run started from scratch")  # added after the callback was made
    trainer = SimpleNamespace(
        default_root_dir=str(tmp_path), global_step=3, loggers=[], progress_bar_callback=None,
        fast_dev_run=False,
    )  # fmt: skip
    with caplog.at_level(logging.INFO):
        summary.on_fit_end(trainer, None)
    lines = caplog.text.strip().splitlines()
    assert any(f"run folder: {tmp_path}" in line for line in lines)
    assert lines[-1].endswith("note: this run started from scratch")


def test_the_summary_names_the_store_cofr_ui_must_serve(tmp_path, monkeypatch):
    """A run kept in another store (`--run.runs_dir "my runs"`) ended on "browse it with
    `cofr ui`", which serves runs/mlflow.db, where the run is not."""
    from types import SimpleNamespace

    from cofrgenet.training import run_store
    from cofrgenet.training.run_store import RunConfig, tracking_uri, ui_command_line
    from cofrgenet.training.tracking import CofrMLFlowLogger

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(run_store, "USER_TRACKING_URI", None)
    elsewhere = tmp_path.parent / "other place"
    for runs_dir, command in (
        ("runs", "cofr ui"),
        ("my runs", "cofr ui --runs-dir 'my runs'"),
        (str(elsewhere), f"cofr ui --runs-dir '{elsewhere}'"),
    ):
        uri = tracking_uri(RunConfig(runs_dir=runs_dir))
        assert ui_command_line(uri) == command
        assert ui_command_line(f"{uri}?timeout=30") == command  # the same database
    assert ui_command_line(f"sqlite:///{tmp_path}/runs/mlflow.db") == "cofr ui"
    other = f"sqlite:///{tmp_path}/my store.db"
    assert ui_command_line(other) == f"cofr ui --tracking-uri 'sqlite:///{tmp_path}/my store.db'"
    # MLFLOW_TRACKING_URI wins over --runs-dir in cofr ui: its store is the bare one's,
    # and another is named whole.
    monkeypatch.setattr(run_store, "USER_TRACKING_URI", "sqlite:////x/mlflow.db")
    assert ui_command_line("sqlite:////x/mlflow.db") == "cofr ui"
    mine = tracking_uri(
        RunConfig(runs_dir="my runs", tracking_uri=f"sqlite:///{tmp_path}/r/mlflow.db")
    )
    assert ui_command_line(mine) == f"cofr ui --tracking-uri sqlite:///{tmp_path}/r/mlflow.db"
    monkeypatch.setattr(run_store, "USER_TRACKING_URI", None)

    class Logged(CofrMLFlowLogger):  # a logger's answers, without a store
        run_id, experiment_id, experiment_name = "abc", "1", "exp"
        store_uri = tracking_uri(RunConfig(runs_dir="my runs"))

    trainer = SimpleNamespace(
        default_root_dir=str(tmp_path), global_step=0, loggers=[object.__new__(Logged)],
        fast_dev_run=False,
    )  # fmt: skip
    assert summary_lines(trainer)[-1] == (
        "MLflow run: abc (experiment 'exp'), browse it with `cofr ui --runs-dir 'my runs'`"
    )
