"""Distributed strategies configured for CoFrGeNet models."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import FSDPStrategy
from torch.nn import Module

from cofrgenet.errors import ConfigError
from cofrgenet.models.transformer import Block
from cofrgenet.training.checkpoints import SHARDED_MARKERS

#: The private FSDPStrategy methods overridden below (tests check that they still exist:
#: were one renamed, the override would silently stop running).
PRIVATE_METHODS = ("_setup_model",)


def is_fsdp(strategy: Any) -> bool:
    """Whether a trainer's ``strategy`` (built, a name such as ``"fsdp"``, or a config's
    ``class_path``) shards the model with FSDP."""
    if isinstance(strategy, FSDPStrategy):
        return True
    return "fsdp" in str(getattr(strategy, "class_path", strategy) or "").lower()


class LadderFSDPStrategy(FSDPStrategy):
    """FSDP with ``use_orig_params=True`` and per-block wrapping as named, YAML-checkable
    arguments.

    Dyadic unfreezing toggles ``requires_grad`` per ladder depth; FSDP's flattened
    parameters allow mixed ``requires_grad`` only with ``use_orig_params=True``.
    (Lightning's FSDPStrategy forwards it through ``**kwargs``, which a config checker
    cannot see.)

    Args:
        use_orig_params: keep each parameter addressable: the optimizer's weight-decay
            groups (by each parameter's role) and dyadic unfreezing (per ladder depth)
            need it; false is refused.
        wrap_blocks: make each transformer block its own FSDP unit, gathered only for its
            own forward and backward, so a rank holds one block's full weights at a time
            beside its shards; false makes the whole model one unit (all its weights
            gathered for the whole step). A YAML file cannot name Lightning's
            ``auto_wrap_policy`` (a set of classes); one given in Python wins.

    Lightning's ``activation_checkpointing(_policy)`` is refused: the model's own
    (``model.activation_checkpointing``) recomputes the blocks under every strategy.
    """

    def __init__(
        self, use_orig_params: bool = True, wrap_blocks: bool = True, **kwargs: Any
    ) -> None:
        self.check_settings({"use_orig_params": use_orig_params, **kwargs})
        if wrap_blocks and kwargs.get("auto_wrap_policy") is None:
            kwargs["auto_wrap_policy"] = {Block}
        super().__init__(use_orig_params=use_orig_params, **kwargs)
        # Lightning's default: one file. A full save over a sharded folder replaces it.
        self.sharded_saves = kwargs.get("state_dict_type", "full") == "sharded"

    @staticmethod
    def check_settings(settings: dict[str, Any]) -> None:
        """ConfigError for the arguments this strategy refuses (``cofr fit`` checks the
        config's before building it: a refusal inside the build reads as a type error)."""
        if settings.get("use_orig_params") is False:
            # Flattened, the parameters lose the names their optimizer groups and the
            # ladders' freezing go by (a KeyError at the first step, on every rank).
            raise ConfigError(
                "trainer.strategy.init_args.use_orig_params: false is not supported: "
                "cofr's weight-decay groups and dyadic unfreezing address each parameter; "
                "leave it out (true), which shards the same"
            )
        for name in ("activation_checkpointing", "activation_checkpointing_policy"):
            if settings.get(name) is not None:
                # On CPU _setup_model below would not apply it; on GPU, beside the model's
                # own, each block would run three times.
                raise ConfigError(
                    f"trainer.strategy.init_args.{name}: set model.activation_checkpointing: "
                    "true instead (each block recomputes inside its FSDP unit, under every "
                    "strategy)"
                )

    @property
    def mixed_precision_config(self) -> Any:
        """Lightning's, with buffers kept in float32: ``bf16-mixed`` and ``bf16-true`` cast
        them to bf16, where the ladders' output ranges (the models' only buffers) drift by
        1% a step, a change that mostly rounds away (``OutputRange``). A
        ``mixed_precision`` given to the strategy is used as given."""
        config = super().mixed_precision_config
        if self.mixed_precision or config is None or config.buffer_dtype is None:
            return config
        if config.buffer_dtype.itemsize >= 4:
            return config
        return dataclasses.replace(config, buffer_dtype=torch.float32)

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None
    ) -> None:
        """Lightning's save, after rank 0 has removed the markers of a sharded checkpoint
        already at ``filepath`` (``last.ckpt`` is saved again each time).

        A sharded save rewrites the shards in place and writes the markers last; a save
        cut short (a kill in SLURM's grace period) left the old markers beside a mix of
        two steps' shards, which looked intact and was resumed from. Without markers
        the folder is refused and the resume takes the newest intact checkpoint. Rank 0
        removes them before the save's first collective (the path's broadcast), so no
        rank writes a shard before they are gone.
        """
        if self.sharded_saves and self.global_rank == 0 and Path(filepath).is_dir():
            for name in SHARDED_MARKERS:
                (Path(filepath) / name).unlink(missing_ok=True)
        super().save_checkpoint(checkpoint, filepath, storage_options)

    def lightning_module_state_dict(self) -> dict[str, Any]:
        """Lightning's, but on CPU a full state dict is gathered without
        ``offload_to_cpu``: there (torch 2.13, gloo) FSDP's offload segfaulted rank 0 as it
        cloned the gathered weights, at the first checkpoint of every run that kept
        Lightning's default ``state_dict_type: full``. The weights are in CPU memory
        already, so nothing is lost by not offloading them."""
        if self.sharded_saves or self.root_device.type != "cpu":
            return super().lightning_module_state_dict()
        from torch.distributed.fsdp import FullStateDictConfig, StateDictType
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        config = FullStateDictConfig(offload_to_cpu=False, rank0_only=True)
        with FSDP.state_dict_type(self.model, StateDictType.FULL_STATE_DICT, config):
            return self.model.state_dict()

    def _setup_model(self, model: Module) -> Module:
        """On CPU (gloo), wrap with an explicit CPU ``device_id``.

        Lightning passes ``device_id=root_device.index``, None on CPU, and FSDP (torch
        2.13) then looks for an accelerator and refuses ("FSDP needs a non-CPU
        accelerator device"); given the CPU device it shards and trains over gloo. This
        is what lets the FSDP test run on CI's CPUs. GPUs take Lightning's own path.
        """
        if self.root_device.type != "cpu":
            return super()._setup_model(model)
        from torch.distributed.fsdp import FullyShardedDataParallel

        if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
            return model
        return FullyShardedDataParallel(
            module=model,
            cpu_offload=self.cpu_offload,
            mixed_precision=self.mixed_precision_config,
            sharding_strategy=self.sharding_strategy,
            device_id=torch.device("cpu"),
            **self.kwargs,
        )


def sharded_gradients(trainer: Any) -> bool:
    """Whether each rank's ``.grad`` holds only its shard of the gradients (FSDP), so a
    gradient norm needs a sum over the ranks (DDP's gradients are whole on every rank)."""
    return isinstance(trainer.strategy, FSDPStrategy)


def grad_square_sum(params: Iterable[torch.nn.Parameter], device: torch.device) -> torch.Tensor:
    """Sum of the squared gradients of ``params`` (those that have one): 0-d float32 on
    ``device``, with no host sync."""
    total = torch.zeros((), device=device)
    for param in params:
        if param.grad is not None:
            total = total + param.grad.detach().float().square().sum().to(device)
    return total


def summed_over_shards(trainer: Any, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` summed over the ranks when they hold shards of the gradients (every rank
    must call it then, gradient or not, else the others wait for it), else as it is."""
    if not sharded_gradients(trainer):
        return tensor
    return trainer.strategy.reduce(tensor, reduce_op="sum")
