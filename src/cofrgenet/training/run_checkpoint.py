"""The run's checkpoints: periodic ``step*.ckpt`` and ``last.ckpt``, the final one taken
where a periodic one is.

Lightning's ``ModelCheckpoint`` saves ``last.ckpt`` at the end of training when the last
step is not one of its periodic steps. That checkpoint holds the loops' state after the
epoch's end: a run resumed from it to train further (a larger ``max_steps``) starts a
new epoch and logs every metric one step later than a run that never stopped (the
weights are the same). :class:`RunCheckpoint` saves the final step at the end of its
batch instead, exactly where a periodic checkpoint is taken, and the end of training
then saves nothing more; nor does it when a callback saved ``last.ckpt`` during the last
step and stopped the fit (a sweep trial stopped for a requeue): the end-of-training save
would replace that checkpoint with one that resumes the same way, one step late.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint


class RunCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose ``last.ckpt`` at ``max_steps`` resumes like a periodic
    one (see the module's docstring)."""

    _final_saved: int | None = None  # the global step saved as the final one
    _step_began = 0.0  # when the running step's batch began (time.time())

    def __init__(self, *args: Any, every_n_train_steps: int | None = None, **kwargs: Any):
        # last.ckpt is replaced, never versioned: a signal's stop saves it outside this
        # callback, so after a resume Lightning would not know it as its own and would
        # write the later steps to last-v1.ckpt, leaving last.ckpt at the stop.
        kwargs.setdefault("enable_version_counter", False)
        super().__init__(*args, every_n_train_steps=every_n_train_steps, **kwargs)
        self.periodic = every_n_train_steps or 0

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        self._step_began = time.time()

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        step = trainer.global_step
        if self.save_last and 0 < trainer.max_steps <= step and self._final_saved != step:
            # Once per step: with gradient accumulation the step's last micro-batch has
            # moved global_step to max_steps, and the earlier ones have not.
            self._final_saved = step
            periodic = self.periodic > 0 and step % self.periodic == 0  # saved it just now
            last = self._last_path()
            if last is not None and not periodic:
                trainer.save_checkpoint(last, weights_only=self.save_weights_only)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._final_saved == trainer.global_step:
            return
        last = self._last_path()
        stopped = trainer.should_stop and last is not None and last.exists()
        if stopped and last.stat().st_mtime >= self._step_began:  # saved in the last step
            return
        super().on_train_end(trainer, pl_module)  # e.g. an epoch limit ended the fit

    def _last_path(self) -> Path | None:
        if self.dirpath is None:
            return None
        return Path(self.dirpath) / f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}"
