"""AdamW with decay/no-decay groups and a warmup + cosine learning-rate schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class OptimizerConfig:
    """AdamW and its schedule. Defaults follow the paper's pretraining (lr 6e-4, wd 0.1).

    warmup_steps: linear warmup from 0 to ``lr``; then cosine decay to
    ``lr * min_lr_ratio`` at the run's last step.
    """

    lr: float = 6e-4
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    fused: bool | None = None

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError(f"optimizer.lr must be positive, got {self.lr}")
        if self.warmup_steps < 0:
            raise ValueError(f"optimizer.warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"optimizer.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        self.betas = tuple(self.betas)  # YAML gives a list


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices and embeddings (dim >= 2); never biases, norms or other vectors.

    Every parameter goes in from the start, frozen or not: a parameter left out of the
    optimizer is silently never updated once released (dyadic unfreezing relies on this).
    """
    decay, no_decay = [], []
    for param in model.parameters():
        (decay if param.dim() >= 2 else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_adamw(model: nn.Module, config: OptimizerConfig) -> torch.optim.AdamW:
    kwargs = {}
    if config.fused is not None:
        kwargs["fused"] = config.fused
    return torch.optim.AdamW(
        param_groups(model, config.weight_decay),
        lr=config.lr,
        betas=config.betas,
        eps=config.eps,
        **kwargs,
    )


def warmup_cosine(step: int, total_steps: int, warmup_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the base lr at ``step`` (0-based): linear warmup, then cosine decay."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if total_steps <= warmup_steps:
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
