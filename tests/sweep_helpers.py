"""Callbacks the sweep tests put in trial configs by class path (tests/ is on sys.path)."""

from __future__ import annotations

import os
import subprocess
import time

import lightning as L
import torch


class SleepPerStep(L.Callback):
    """Sleep ``$env`` seconds after every training batch (0 when unset): a slow trial to
    kill or requeue in the middle."""

    def __init__(self, env: str = "COFR_TEST_SLEEP") -> None:
        self.env = env

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        seconds = float(os.environ.get(self.env, "0") or 0)
        if seconds > 0:
            time.sleep(seconds)


class PoisonWeights(L.Callback):
    """Fill the weights with NaN before step 1 when the learning rate is above ``lr_above``,
    so the trainer's NonFiniteLossGuard meets a real NaN loss."""

    def __init__(self, lr_above: float) -> None:
        self.lr_above = lr_above

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == 1 and pl_module.optimizer_config.lr > self.lr_above:
            with torch.no_grad():
                for param in pl_module.parameters():
                    param.fill_(float("nan"))


class RecordStartStep(L.Callback):
    """Write the global step at which training (re)starts to ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_train_start(self, trainer, pl_module) -> None:
        with open(self.path, "w") as handle:
            handle.write(str(trainer.global_step))


class SignalAtStep(L.Callback):
    """Send this process ``signum`` once, at the start of training step ``step`` (or, with
    ``during="validation"``, of the second batch of the validation after that step; with
    ``during="start"``, at the fit's start, before any step; ``during="sanity"``, in the
    sanity check's validation; ``during="end"``, at training's end whatever ``step``,
    after the last step, as the final checkpoint is saved): a kill or a Ctrl-C that
    lands mid-step, mid-validation or while starting, deterministically. ``times=2``
    sends it twice in a row (an impatient second Ctrl-C). ``group=True`` sends it to the
    whole process group, data loader workers included, as SLURM and a terminal do (the
    process must lead its own group: ``start_new_session``). ``parent=True``: rank 0 sends it
    to its parent alone (ddp_spawn's launching process), as ``kill PID`` does; ``rank=R``:
    only rank R sends it, to itself (a signal to one rank's process)."""

    def __init__(
        self, step: int, signum: int, during: str = "training", times: int = 1,
        group: bool = False, parent: bool = False, rank: int | None = None,
    ) -> None:  # fmt: skip
        self.step, self.signum, self.during, self.times = step, signum, during, times
        self.group, self.parent, self.rank = group, parent, rank
        self.sent = False

    def _send(self, trainer) -> None:
        if self.rank is not None and trainer.global_rank != self.rank:
            return
        if (trainer.global_step == self.step or self.during == "end") and not self.sent:
            self.sent = True
            for _ in range(self.times):
                if self.parent:
                    if trainer.global_rank == 0:
                        os.kill(os.getppid(), self.signum)
                elif self.group:  # sent by another process, as SLURM's slurmstepd does
                    assert os.getpgid(0) == os.getpid(), "not a group of its own"
                    kill = ["kill", f"-{self.signum}", "--", f"-{os.getpgid(0)}"]
                    subprocess.run(kill, check=True, start_new_session=True)
                else:
                    os.kill(os.getpid(), self.signum)

    def on_fit_start(self, trainer, pl_module) -> None:
        if self.during == "start":  # the MLflow run exists, no step has run
            self._send(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.during == "end":
            self._send(trainer)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.during == "training":
            self._send(trainer)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, *args) -> None:
        if self.during == "validation" and batch_idx == 1 and not trainer.sanity_checking:
            self._send(trainer)
        if self.during == "sanity" and trainer.sanity_checking:  # the fit's first validation
            self._send(trainer)


class LastCheckpointFromTheFuture(L.Callback):
    """A shared filesystem whose server clock runs an hour ahead of this node's: at the
    start of every step, the run's ``last.ckpt`` (if any) is stamped an hour on."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        last = os.path.join(trainer.checkpoint_callback.dirpath, "last.ckpt")
        if os.path.exists(last):
            ahead = time.time() + 3600
            os.utime(last, (ahead, ahead))
