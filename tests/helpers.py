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


class DumpWeights(L.Callback):
    """Save each rank's final parameters to ``folder/rank<r>.pt``."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def on_train_end(self, trainer, pl_module) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()}
        torch.save(state, self.folder / f"rank{trainer.global_rank}.pt")
