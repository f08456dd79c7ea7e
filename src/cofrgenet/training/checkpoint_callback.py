"""The run's checkpoints: periodic ``step*.ckpt`` and ``last.ckpt``, the final one taken
where a periodic one is.

A ``last.ckpt`` saved at the end of training holds the loops' state after the epoch's
end: a run resumed from it to train further (a larger ``max_steps``) starts a new epoch
and logs every metric one step later than a run that never stopped (the weights are the
same). :class:`RunCheckpoint` saves the final step at the end of its batch instead,
exactly where a periodic checkpoint is taken, unless ``last.ckpt`` was written during
that step already (its periodic save, or a callback's that stopped the fit: a sweep
trial stopped for a requeue). "Written during the step" is told by the file's status
(mtime in ns, size, inode) against its status when the step began, not by comparing
its mtime with this node's clock: a shared filesystem stamps files with its server's
clock, which may run ahead of the node's. Every save is a new file renamed over the old
(:class:`~cofrgenet.training.checkpoint_io.AtomicCheckpointIO`), so its inode changes
even where mtimes are coarse. The end of training saves only a fit that ended
otherwise (an epoch limit, an early stop), and always then: Lightning's own end save
is skipped once any checkpoint was saved in the process, which left ``last.ckpt`` at
the last periodic step.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint

from cofrgenet.training.checkpoint_io import remove_requeue_checkpoints


class RunCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` whose ``last.ckpt`` at ``max_steps`` resumes like a periodic
    one (see the module's docstring)."""

    _final_saved: int | None = None  # the global step saved as the final one
    _started_at: int = 0  # the global step this fit started (resumed) at
    _last_at_step_start: tuple[int, int, int] | None = None  # last.ckpt's file status

    def __init__(self, *args: Any, **kwargs: Any):
        # last.ckpt is replaced, never versioned: a signal's stop saves it outside this
        # callback, so after a resume Lightning would not know it as its own and would
        # write the later steps to last-v1.ckpt, leaving last.ckpt at the stop.
        kwargs.setdefault("enable_version_counter", False)
        # The saves are step-counted. Unless told to save at an epoch's end, Lightning
        # puts a periodic save that falls on an epoch's last batch off to the next
        # validation's end, as if one followed every epoch: a step-counted validation
        # came steps later (the checkpoint then held a later state, part-way through a
        # step under gradient accumulation, under the earlier step's name) or never
        # (no checkpoint of that step). Saved at the epoch's end, it is that step's.
        # A monitored validation metric is there only after a validation: left to Lightning.
        if kwargs.get("monitor") in (None, "step"):
            kwargs.setdefault("save_on_train_epoch_end", True)
        super().__init__(*args, **kwargs)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Another folder's: its best/last paths name that folder's files. Lightning kept
        # best_model_path and warned of the rest ("The dirpath has changed"). A moved run
        # (its files here) takes them here: without its kept checkpoints the newest K
        # were counted afresh, and the older ones stayed on disk for good.
        if state_dict.get("dirpath", self.dirpath) != self.dirpath:
            moved = self._moved_here(state_dict)
            if moved is None:  # a run started from another run's checkpoint
                return
            state_dict = moved
        super().load_state_dict(state_dict)

    def _moved_here(self, state_dict: dict[str, Any]) -> dict[str, Any] | None:
        """``state_dict`` with its checkpoint paths in this callback's folder, when the
        periodic checkpoints it kept are there by name (the run folder was moved); None
        when none is (another run's state)."""
        if self.dirpath is None:
            return None
        here = Path(self.dirpath)

        def moved(path: Any) -> str:
            return str(here / Path(path).name) if path else path

        kept = {
            moved(path): score
            for path, score in (state_dict.get("best_k_models") or {}).items()
            if (here / Path(path).name).is_file()
        }
        if not kept:
            return None
        state = dict(state_dict, dirpath=self.dirpath, best_k_models=kept)
        for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
            state[key] = moved(state_dict.get(key))
        if state["kth_best_model_path"] not in kept:  # a file lost in the move
            worst = min if self.mode == "max" else max
            state["kth_best_model_path"] = worst(kept, key=kept.__getitem__)
            state["kth_value"] = kept[state["kth_best_model_path"]]
        if state["best_model_path"] not in kept:
            best = max if self.mode == "max" else min
            state["best_model_path"] = best(kept, key=kept.__getitem__)
            state["best_model_score"] = kept[state["best_model_path"]]
        return state

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._started_at = trainer.global_step

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        super().on_train_batch_start(trainer, pl_module, batch, batch_idx)
        self._last_at_step_start = _file_status(self._last_path())

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        step = trainer.global_step
        if 0 < step == self._started_at:
            # No optimizer step since the resume: under gradient accumulation the first
            # micro-batches of step k still read global_step k, and Lightning (whose
            # record of the step it saved is not restored) saved step k's checkpoint
            # again, half a step on, and counted it a new one (an older kept one went).
            return
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if self.save_last and 0 < trainer.max_steps <= step and self._final_saved != step:
            # Once per step: with gradient accumulation the step's last micro-batch has
            # moved global_step to max_steps, and the earlier ones have not. A periodic
            # save of this step may have been put off to a validation that never comes.
            self._final_saved = step
            self._save_last_unless_written(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning saves at the end only when this process saved no last.ckpt before:
        # an epoch limit (or an early stop) would leave last.ckpt at the last periodic
        # step. A last.ckpt written during the last step (the final save, a signal's
        # stop) is that step's and stays.
        if self.save_last:
            self._save_last_unless_written(trainer)
            last = self._last_path()
            if trainer.is_global_zero and last is not None and last.exists():
                # last.ckpt holds the last step: a requeue's checkpoint is an older copy
                # of weights and optimizer (gigabytes at xl), which no resume would take.
                remove_requeue_checkpoints(Path(trainer.default_root_dir), keep_newest=False)

    def _save_last_unless_written(self, trainer: L.Trainer) -> None:
        """Save ``last.ckpt`` unless it was written during the running step (every rank
        follows rank 0's view of the file: the save is collective)."""
        last = self._last_path()
        if last is None or trainer.fast_dev_run:  # a debug run saves nothing (Lightning's)
            return
        status = _file_status(last)
        written = status is not None and status != self._last_at_step_start
        if not trainer.strategy.broadcast(written):
            trainer.save_checkpoint(last, weights_only=self.save_weights_only)

    def _last_path(self) -> Path | None:
        if self.dirpath is None:
            return None
        return Path(self.dirpath) / f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}"


def _file_status(path: Path | None) -> tuple[int, int, int] | None:
    """(mtime in ns, size, inode) of a file; None when it does not exist."""
    try:
        stat = os.stat(path) if path is not None else None
    except FileNotFoundError:
        return None
    return None if stat is None else (stat.st_mtime_ns, stat.st_size, stat.st_ino)
