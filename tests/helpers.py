"""Callbacks the CLI tests load by class path (tests/ is on sys.path under pytest)."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch


class StopAtStep(L.Callback):
    """Stop training after optimizer step ``step``, as a preemption would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step >= self.step:
            trainer.should_stop = True


class KillInValidation(L.Callback):
    """End the process at once (as SIGKILL or an out-of-memory kill would) when the
    validation due after optimizer step ``step`` starts."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_validation_start(self, trainer, pl_module) -> None:
        if trainer.global_step == self.step and not trainer.sanity_checking:
            import os

            os._exit(9)


class DumpBatchSeeds(L.Callback):
    """Save the seed each training batch's random draws started from (the module seeds
    every batch) to ``folder/rank<r>-seeds.pt``, one per batch."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)
        self.seeds: list[int] = []

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self.seeds.append(torch.initial_seed())

    def on_train_end(self, trainer, pl_module) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        torch.save(self.seeds, self.folder / f"rank{trainer.global_rank}-seeds.pt")


class DumpWeights(L.Callback):
    """Save each rank's parameters at the start and the end of training to
    ``folder/rank<r>-start.pt`` and ``folder/rank<r>.pt`` (full tensors, buffers included,
    also under FSDP: every rank takes part in the gathering)."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def _dump(self, trainer, pl_module, suffix: str) -> None:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        from cofrgenet.training.optim import unwrapped_name

        self.folder.mkdir(parents=True, exist_ok=True)
        if isinstance(trainer.model, FSDP):  # the whole tensors, gathered from the shards
            with FSDP.summon_full_params(trainer.model, writeback=False):
                named = [*pl_module.named_parameters(), *pl_module.named_buffers()]
                state = {unwrapped_name(k): v.detach().clone() for k, v in named}
        else:
            state = {k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()}
        torch.save(state, self.folder / f"rank{trainer.global_rank}{suffix}.pt")

    def on_train_start(self, trainer, pl_module) -> None:
        self._dump(trainer, pl_module, "-start")

    def on_train_end(self, trainer, pl_module) -> None:
        self._dump(trainer, pl_module, "")


class DumpGradNorms(L.Callback):
    """Write the ``opt/grad_norm`` each rank logged, one per step, to
    ``folder/rank<r>-grad-norms.pt`` at the end of training."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)
        self.norms: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.norms.append(float(trainer.callback_metrics["opt/grad_norm"]))

    def on_train_end(self, trainer, pl_module) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        torch.save(self.norms, self.folder / f"rank{trainer.global_rank}-grad-norms.pt")
