"""What ``cofr fit`` shows on the console: steps out of max_steps, readable metrics, a
summary at the end, and none of the dependencies' messages known to be harmless here.

Every silenced message is listed in :data:`HARMLESS` with why it is harmless for this
project, and :func:`quiet_known_noise` installs the filters (once per process).
"""

from __future__ import annotations

import logging
import math
import re
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelSummary, RichProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import (
    CustomTimeColumn,
    ProcessingSpeedColumn,
)
from lightning.pytorch.utilities import rank_zero_info
from rich.text import Text

from cofrgenet.training.run_store import ui_command_line
from cofrgenet.training.tracking import CofrMLFlowLogger

#: (start of the message, why it is harmless here). Warnings and log records alike.
HARMLESS: tuple[tuple[str, str], ...] = (
    ("`isinstance(treespec, LeafSpec)` is deprecated", "Lightning's own use of torch's pytree"),
    ("Your `IterableDataset` has `__len__` defined", "litdata shards the training stream "
     "per worker; the val share (ValidationShare) is read in the main process"),
    ("💡 Tip: For seamless cloud logging", "an advertisement; runs are tracked in MLflow"),
    ("Trainer already configured with model summary callbacks", "we add RichModelSummary"),
    ("You're operating within a distributed environment and have disabled the `drop_last`",
     "the val split's dataset only; cofr splits it evenly over the processes itself "
     "(data/datamodule.py ValidationShare), and training uses full batches"),
    ("LightningCLI's args parameter is intended to run from within Python",
     "cofr passes the command line itself, with an experiment's base: files expanded"),
    ("The `srun` command is available on your system but is not used",
     "a local run on a SLURM login or build node; slurm/*.sbatch start cofr under srun"),
    ("Checkpoint directory ",
     "a resume writes into its run's checkpoints; a fresh fit into a used run is refused"),
    ("Using state dict override, may lead to unexpected behavior",
     "data/datamodule.py asks for it: its own fingerprint check replaces litdata's path check"),
    ("Overriding state input_dir_path ",
     "a data folder moved or copied since the checkpoint (litdata names the new path twice): "
     "data/datamodule.py's fingerprint check says it holds the same data"),
    ("Experiment with name ", "a new MLflow experiment, made by its first run (a warning there)"),
    ("Creating initial MLflow database tables", "a new run store, made once"),
    ("Updating database tables", "MLflow bringing a new run store's schema up to date"),
    ("Seed set to ", "LightningCLI seeds before it builds anything; cofr says it once the "
     "model, data and trainer are built, not above an error in what was given"),
    ("It is recommended to use `self.log('val/", "the scores are torchmetrics MeanMetrics, "
     "weighted by tokens and synced across processes by their compute()"),
    ("It is recommended to use `self.log('test/", "as val/: synced by MeanMetric.compute()"),
    ("Please use DTensor instead and we are deprecating ShardedTensor",
     "torch.distributed.checkpoint inside Lightning's sharded FSDP save and load (a score "
     "of lines a checkpoint), not a call of ours"),
    ("`_get_pg_default_device` will be deprecated",
     "torch.distributed.checkpoint's own call, in Lightning's sharded FSDP save and load"),
    ("Received SIGTERM: ", "StopOnSignal says which signal stopped the run, after which "
     "step, and how to resume it (Lightning's line came last, below the resume command)"),
    ("You called `self.log('val/", "validate/test of a checkpoint outside a run folder, "
     "scored without MLflow as said; logger=True keeps its scores in Lightning's table"),
    ("You called `self.log('test/", "as val/: logger=True keeps them in the table"),
    ("Multiple backends are registered with this ProcessGroup",
     "FSDP's sharded state dict on CPU: gloo registers CPU and CUDA, and torch takes the "
     "CPU, where the weights are"),
    ("`load_state_dict` is deprecated and will be removed in future versions. Please use "
     "`load` instead", "torch.distributed.checkpoint's own call, as Lightning's sharded "
     "FSDP resume loads the optimizer state"),
    ("FSDP is switching to use `NO_SHARD`",
     "FSDP in one process (a sharded checkpoint validated on one device): nothing to shard"),
    ("When using ``NO_SHARD`` for ``ShardingStrategy``, full_state_dict will",
     "the same one-process FSDP: its state dict is whole, as a sharded one's would be"),
    ("The number of training batches (", "Lightning counts the steps it logs at across "
     "epochs: an epoch shorter than log_every_n_steps still logs train/ every that many "
     "steps"),
    ("`weights_only` was not set, defaulting to `False`.", "Lightning's SLURM requeue "
     "saves its checkpoint so; a whole one (optimizer, loops) is what the requeue resumes"),
    ("\nDetected KeyboardInterrupt, attempting graceful shutdown", "a second Ctrl-C: "
     "StopOnSignal says what it did (nothing saved) and cofr that it was interrupted; "
     "Lightning's line came between the two"),
)  # fmt: skip

#: Loggers whose records :data:`HARMLESS` filters (a filter acts on its own logger only).
FILTERED_LOGGERS = (
    "lightning.pytorch",
    "lightning.pytorch.utilities.rank_zero",
    "lightning.pytorch.trainer.connectors.signal_connector",
    "lightning.pytorch.trainer.connectors.checkpoint_connector",
    "lightning.fabric",
    "lightning.fabric.utilities.rank_zero",
    "lightning.fabric.utilities.seed",
    "litdata.streaming.dataset",
    "lightning.pytorch.loggers.mlflow",
    "mlflow.store.db.utils",
)


#: Lightning's prefix of a message logged on every rank ("[rank: 1] Seed set to 7").
_RANK_PREFIX = re.compile(r"^\[rank: \d+\] ")


class _DropHarmless(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = _RANK_PREFIX.sub("", record.getMessage())
        return not any(message.startswith(start) for start, _ in HARMLESS)


def quiet_known_noise() -> None:
    """Silence the messages of :data:`HARMLESS` (warnings and Lightning's info logs).

    Safe to call again: the warnings module keeps one copy of an identical filter, and a
    logger gets the log filter once.
    """
    for start, _ in HARMLESS:
        warnings.filterwarnings("ignore", message=re.escape(start))
    for name in FILTERED_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropHarmless) for f in logger.filters):
            logger.addFilter(_DropHarmless())


#: Progress-bar names of logged metrics (the full names stay in MLflow).
SHORT_NAMES = {
    "perf/tokens_per_sec": "tok/s",
    "perf/mfu": "mfu",
    "train/loss": "loss",
    "val/loss": "val",
}


class StepTimeColumn(CustomTimeColumn):
    """Elapsed and remaining time of the whole fit on the training bar (Lightning's
    column restarts at each epoch, and rich's estimate reads the steps' jumps)."""

    def render(self, task: Any) -> Text:
        if "elapsed_s" not in task.fields:  # the validation bar: rich's own clock
            return super().render(task)
        remaining = task.fields["remaining_s"]
        left = "-:--:--" if remaining is None else str(timedelta(seconds=int(remaining)))
        elapsed = timedelta(seconds=int(task.fields["elapsed_s"]))
        return Text(f"{elapsed} • {left}", style=self.style)


class StepSpeedColumn(ProcessingSpeedColumn):
    """Optimizer steps per second on the training bar (not batches: with gradient
    accumulation several batches make one step)."""

    def render(self, task: Any) -> Text:
        if "elapsed_s" not in task.fields:
            return super().render(task)
        rate = task.fields["steps_per_s"]
        return Text(f"{rate or 0:.2f} steps/s", style=self.style)


class StepProgressBar(RichProgressBar):
    """Training progress as optimizer steps out of ``max_steps`` (not batches of an
    epoch, which read ``Epoch 0/-2`` or ``30/9`` after a resume), metrics by short names.

    Speed and time left are steps over this process's fit: the bar Lightning resets at
    each epoch and moves per batch would show thousands of it/s and a second left."""

    _clock: tuple[float, int] | None = None  # (when, global step) at this fit's start

    def configure_columns(self, trainer: L.Trainer) -> list:
        swap = {CustomTimeColumn: StepTimeColumn, ProcessingSpeedColumn: StepSpeedColumn}
        columns = []
        for column in super().configure_columns(trainer):
            ours = swap.get(type(column))
            columns.append(column if ours is None else ours(style=column.style))
        return columns

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._clock = (time.monotonic(), trainer.global_step)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        self._show_steps(trainer)

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self._show_steps(trainer)

    def _show_steps(self, trainer: L.Trainer) -> None:
        if self.progress is None or self.train_progress_bar_id is None:
            return
        total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        if total is None:  # an epoch limit ends the fit; -1: Lightning cannot count them
            planned = trainer.estimated_stepping_batches
            total = int(planned) if math.isfinite(planned) and planned > 0 else None
        step = trainer.global_step
        started, first = self._clock or (time.monotonic(), step)
        elapsed = time.monotonic() - started
        rate = (step - first) / elapsed if step > first and elapsed > 0 else None
        self.progress.update(
            self.train_progress_bar_id,
            completed=step,
            total=total or float("inf"),  # Lightning's unknown total: reads "N/--"
            description="step",
            elapsed_s=elapsed,
            steps_per_s=rate,
            remaining_s=(total - step) / rate if rate and total else None,
        )

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        out: dict[str, Any] = {}
        for name, value in items.items():
            short = SHORT_NAMES.get(name, name)
            if short == "tok/s" and isinstance(value, float):
                value = f"{value:,.0f}"
            elif short == "mfu" and isinstance(value, float):
                value = f"{value:.1%}"
            out[short] = value
        return out


class ModelReport(ModelSummary):
    """At the start of a fit: the model's parameters by component (ladders apart) and its
    analytic FLOPs per token, in place of Lightning's summary (whose FLOPs column needs an
    example input and reads 0 without one). A ModelSummary, so Lightning adds no other."""

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        from cofrgenet.models import count_parameters, estimate_flops_per_token

        config = getattr(pl_module, "model_config", None)
        # From the config, as MLflow's model/n_params: FSDP has sharded and renamed the
        # live module's parameters by now (a 64k model read as 32k, its ladders as 0).
        lines = [count_parameters(config or getattr(pl_module, "model", pl_module)).table()]
        if config is not None:
            # At the length trained (data.block_size), as perf/mfu counts them.
            trained = getattr(trainer.datamodule, "block_size", None)
            flops = estimate_flops_per_token(config, trained if isinstance(trained, int) else None)
            lines.append(
                f"FLOPs per token (analytic, sequence {flops.seq_len}): forward "
                f"{flops.forward:,}, training {flops.training:,}"
            )
        rank_zero_info("\n".join(lines))


class RunSummary(L.Callback):
    """Three lines at the end of a fit: the run folder, its checkpoints, its MLflow run;
    then ``notes``, what the start warned of that must not scroll away (the list may
    grow until the fit ends)."""

    def __init__(self, notes: list[str] | None = None):
        self.notes = notes if notes is not None else []

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        bar = trainer.progress_bar_callback
        if isinstance(bar, RichProgressBar):  # its last redraw would land below the lines
            bar.teardown(trainer, pl_module, "fit")
        rank_zero_info("\n".join([*summary_lines(trainer), *self.notes]))


def summary_lines(trainer: L.Trainer) -> list[str]:
    run_dir = Path(trainer.default_root_dir)
    if trainer.fast_dev_run:
        return [f"fast_dev_run: nothing saved or logged; {run_dir} is not kept as a run"]
    last = run_dir / "checkpoints" / "last.ckpt"
    lines = [f"run folder: {run_dir}"]
    lines.append(
        f"checkpoint: {last} (step {trainer.global_step})" if last.exists() else "checkpoint: none"
    )
    for logger in trainer.loggers:
        if not isinstance(logger, CofrMLFlowLogger) or logger.run_id is None:
            continue
        uri = logger.store_uri or ""
        if uri.startswith(("http://", "https://")):
            where = f"{uri.rstrip('/')}/#/experiments/{logger.experiment_id}/runs/{logger.run_id}"
        else:  # with the store: a bare `cofr ui` serves runs/mlflow.db only
            where = f"browse it with `{ui_command_line(uri) if uri else 'cofr ui'}`"
        lines.append(
            f"MLflow run: {logger.run_id} (experiment {logger.experiment_name!r}), {where}"
        )
    return lines
