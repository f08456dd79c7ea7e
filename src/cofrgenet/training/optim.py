"""AdamW with weight decay by role and a warmup + cosine learning-rate schedule.

Weight decay goes by what a parameter does, not by its rank: matrices and embeddings
decay; biases, norms, and what a module lists in ``no_weight_decay()`` do not (the ladder
layers list their ladder biases, which set the offset of the partial denominators, and
CAttnU its linear terms w0, which start at 1). Parameters can further be grouped by
ladder depth, so that each released depth of the dyadic schedule follows a learning-rate
schedule of its own (``DyadicUnfreezing(lr="release")``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from cofrgenet.errors import ConfigError


@dataclass
class OptimizerConfig:
    """AdamW and its schedule. Defaults follow the paper's pretraining (lr 6e-4, wd 0.1).

    Args:
        lr: peak learning rate, reached at the end of the warmup.
        weight_decay: AdamW's decoupled weight decay, of matrices and embeddings (not
            of what a module lists in ``no_weight_decay()``).
        betas: AdamW's (beta1, beta2), each in [0, 1).
        eps: AdamW's epsilon.
        warmup_steps: linear warmup from 0 to ``lr``; then cosine decay to
            ``lr * min_lr_ratio`` at the run's last step.
        min_lr_ratio: the learning rate at the run's last step, as a fraction of ``lr``.
        fused: torch's fused AdamW kernel (one pass over all parameters instead of a loop
            of small ops per tensor); None uses it where every parameter is a
            floating-point tensor on CPU or CUDA and no gradient scaler
            (``precision: 16-mixed``) is in use (the optimizer step about 5x faster on a
            2-core CPU at 1.8M parameters); false gives torch's unfused AdamW (foreach on
            CUDA, a loop over tensors on CPU). A resumed run keeps the choice of its
            config, not the checkpoint's.
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
            raise ConfigError(f"model.optimizer.lr must be positive, got {self.lr}")
        if self.warmup_steps < 0:
            raise ConfigError(f"model.optimizer.warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(
                f"model.optimizer.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}"
            )
        self.betas = tuple(self.betas)  # YAML gives a list
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(
                f"model.optimizer.betas must be two numbers in [0, 1), got {self.betas}"
            )
        for name in ("eps", "weight_decay"):  # the one that is wrong, with its file
            if getattr(self, name) < 0:
                raise ConfigError(f"model.optimizer.{name} must be >= 0, got {getattr(self, name)}")


#: Name segments that wrappers insert between a module and its submodules: FSDP's
#: per-block units, activation checkpointing, torch.compile.
WRAPPER_SEGMENTS = re.compile(
    r"(^|\.)(_fsdp_wrapped_module|_checkpoint_wrapped_module|_orig_mod)(?=\.|$)"
)


def unwrapped_name(name: str) -> str:
    """A parameter's or module's name as the model was built, whatever wraps its parts:
    ``transformer.h.0._fsdp_wrapped_module.mlp.weight`` -> ``transformer.h.0.mlp.weight``."""
    return WRAPPER_SEGMENTS.sub("", name).lstrip(".")


def no_weight_decay_names(model: nn.Module) -> set[str]:
    """Full names (as built, :func:`unwrapped_name`) of the parameters that modules exempt
    with ``no_weight_decay()``."""
    names: set[str] = set()
    for prefix, module in model.named_modules():
        exempt = getattr(module, "no_weight_decay", None)
        if callable(exempt):
            names.update(unwrapped_name(f"{prefix}.{name}") for name in exempt())
    return names


def decays(name: str, ndim: int, exempt: set[str]) -> bool:
    """Matrices and embeddings decay; vectors (biases, norm gains) and exempt names do not."""
    return ndim >= 2 and name not in exempt


def param_groups(
    model: nn.Module,
    weight_decay: float,
    depth_of: Callable[[nn.Parameter], int] | None = None,
    ndims: dict[str, int] | None = None,
) -> list[dict]:
    """AdamW parameter groups: decay by role, optionally split by ladder depth.

    Every parameter goes in from the start, frozen or not: a parameter left out of the
    optimizer is silently never updated once released (dyadic unfreezing relies on this).
    Each group carries ``name`` ("decay", "no_decay", "decay/depth_3", ...), ``depth``
    (0 for everything that is not a ladder parameter) and ``param_names``.
    ``depth_of(param)`` gives a parameter's ladder depth (default: 0 for all). ``ndims``
    gives parameters' dimensions as built, when the model has since been wrapped (FSDP
    with ``use_orig_params`` turns every parameter into a 1-D shard, which would make
    them all look like biases).
    """
    exempt = no_weight_decay_names(model)
    named = [(unwrapped_name(name), param) for name, param in model.named_parameters()]
    unknown = exempt - {name for name, _ in named}
    if unknown:
        raise ValueError(f"no_weight_decay() names parameters that do not exist: {unknown}")
    groups: dict[tuple[bool, int], dict] = {}
    for name, param in named:
        decay = decays(name, (ndims or {}).get(name, param.dim()), exempt)
        depth = 0 if depth_of is None else depth_of(param)
        key = (decay, depth)
        if key not in groups:
            label = "decay" if decay else "no_decay"
            groups[key] = {
                "params": [],
                "param_names": [],
                "weight_decay": weight_decay if decay else 0.0,
                "name": label if depth == 0 else f"{label}/depth_{depth}",
                "depth": depth,
            }
        groups[key]["params"].append(param)
        groups[key]["param_names"].append(name)
    # Stable order: depth 0 first, decay before no_decay.
    return [groups[key] for key in sorted(groups, key=lambda k: (k[1], not k[0]))]


def build_adamw(
    model: nn.Module,
    config: OptimizerConfig,
    depth_of: Callable[[nn.Parameter], int] | None = None,
    ndims: dict[str, int] | None = None,
    grad_scaler: bool = False,
) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups`, with the state of every parameter made up front
    (:func:`materialise_adam_state`).

    ``grad_scaler``: the run scales its loss (fp16 mixed precision). A fused AdamW
    unscales the gradients inside its step, after gradient clipping and the logged
    gradient norms have seen them scaled (Lightning then refuses to clip), so the
    default is unfused there and ``fused: true`` is an error.
    """
    groups = param_groups(model, config.weight_decay, depth_of, ndims)
    fused = config.fused
    if fused and grad_scaler:
        raise ConfigError(
            "optimizer.fused: true cannot be combined with a gradient scaler (precision "
            "16-mixed): the fused step unscales gradients only after they are clipped and "
            "logged; set optimizer.fused to null or false, or use bf16-mixed"
        )
    if fused is None:
        params = (p for group in groups for p in group["params"])
        fused = not grad_scaler and fused_adamw_supported(params)
    optimizer = torch.optim.AdamW(
        # fused=None, not False, leaves torch its own choice (foreach on CUDA): False
        # would also turn foreach off.
        groups,
        lr=config.lr,
        betas=config.betas,
        eps=config.eps,
        fused=True if fused else None,
    )
    materialise_adam_state(optimizer)
    optimizer.register_load_state_dict_pre_hook(keep_built_settings)
    return optimizer


def scales_loss(trainer: Any) -> bool:
    """Whether a Lightning trainer's precision plugin has a gradient scaler (16-mixed,
    also under FSDP), for :func:`build_adamw`'s ``grad_scaler``."""
    return getattr(getattr(trainer, "precision_plugin", None), "scaler", None) is not None


def clip_gradients(
    module: Any,
    optimizer: torch.optim.Optimizer,
    clip_val: float | None,
    algorithm: str | None,
) -> None:
    """A LightningModule's ``configure_gradient_clipping``: by the global norm; under FSDP
    through the wrapper's own ``clip_grad_norm_`` (the norm of the sharded gradients
    across ranks), since Lightning's FSDP precision plugin refuses norm clipping and would
    stop the first step.

    Without a gradient scaler the gradients are clipped here too (by norm or by value): Lightning's
    mixed-precision plugin refuses any optimizer that could unscale in its step (fused
    AdamW says so on every device), even under bf16-mixed, where nothing is scaled, so
    every bf16 config with clipping stopped at its first step."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    by_norm = algorithm in (None, "norm")
    if clip_val and by_norm and isinstance(module.trainer.model, FullyShardedDataParallel):
        module.trainer.model.clip_grad_norm_(clip_val)
    elif clip_val and not scales_loss(module.trainer):
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        if by_norm:
            torch.nn.utils.clip_grad_norm_(params, clip_val)
        else:
            torch.nn.utils.clip_grad_value_(params, clip_val)
    else:
        module.clip_gradients(optimizer, clip_val, algorithm)


class ClipsGradients:
    """A LightningModule mixin (list it first): ``configure_gradient_clipping`` by
    :func:`clip_gradients`."""

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        clip_gradients(self, optimizer, gradient_clip_val, gradient_clip_algorithm)


#: Group settings a resume takes from the optimizer built from the run's config, not
#: from the checkpoint (``lr``, the scheduled value, is rescaled apart).
BUILT_SETTINGS = ("fused", "foreach", "weight_decay", "betas", "eps", "initial_lr")


def keep_built_settings(
    optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]
) -> dict[str, Any]:
    """A load_state_dict pre-hook: the built optimizer's group settings win over the
    checkpoint's; its moments and step counters are kept.

    ``Optimizer.load_state_dict`` takes every group setting from the checkpoint, so a
    resume with ``--model.optimizer.lr 1e-5`` (or another weight decay, betas, eps) went
    on with the old values while the config and MLflow said the new ones. The learning
    rate the schedule had reached is rescaled to the new base (``initial_lr``, which the
    LR scheduler sets). The fused / foreach choice matters the same way: whether
    GradScaler lets the step unscale is fixed when the optimizer is built, so a run saved
    unfused and resumed fused would crash in its first scaled step. The step counters
    move where the built kernel keeps them (torch moves them to the device for a fused
    one; the unfused kernels keep them on the CPU). The caller's dict is not changed.
    """
    state = dict(state_dict["state"])
    groups = []
    for saved, built in zip(state_dict["param_groups"], optimizer.param_groups, strict=False):
        base, new_base = saved.get("initial_lr"), built.get("initial_lr")
        same = not (base and new_base) or new_base == base  # a plain resume stays bit-exact
        lr = saved["lr"] if same else saved["lr"] * new_base / base
        saved = {**saved, **{k: built[k] for k in BUILT_SETTINGS if k in built}, "lr": lr}
        if not (saved["fused"] or built.get("capturable")):
            for param_id in saved["params"]:
                entry = state.get(param_id)
                if entry is not None and isinstance(entry.get("step"), torch.Tensor):
                    state[param_id] = {**entry, "step": entry["step"].cpu()}
        groups.append(saved)
    # Group counts that differ are left to load_state_dict, which names the mismatch.
    groups.extend(state_dict["param_groups"][len(groups) :])
    return {**state_dict, "state": state, "param_groups": groups}


#: Devices with a fused AdamW kernel in every torch this project supports (CPU since 2.4).
FUSED_ADAMW_DEVICES = ("cpu", "cuda")


def fused_adamw_supported(params: Iterable[torch.Tensor]) -> bool:
    """Whether torch's fused AdamW takes these parameters: floating point, on CPU or CUDA."""
    params = list(params)
    return bool(params) and all(
        p.is_floating_point() and p.device.type in FUSED_ADAMW_DEVICES for p in params
    )


def materialise_adam_state(optimizer: torch.optim.AdamW) -> None:
    """Give every parameter AdamW's initial state now (step 0, zero moments).

    AdamW makes a parameter's state at its first gradient, so a depth frozen by dyadic
    unfreezing has none until released, and FSDP's optimizer state dict, which expects
    every parameter, then fails to save a checkpoint. The state made here is exactly the
    one AdamW would make at release: the updates do not change by a bit.
    """
    for group in optimizer.param_groups:
        on_device = group.get("fused") or group.get("capturable")
        for param in group["params"]:
            if optimizer.state.get(param):
                continue
            step = (
                torch.zeros((), dtype=torch.float32, device=param.device)
                if on_device
                else torch.tensor(0.0, dtype=torch.float32)
            )
            optimizer.state[param] = {
                "step": step,
                "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
            }


def describe_groups(groups: list[dict], numels: dict[str, int] | None = None) -> list[str]:
    """One line per optimizer group for the run log: name, decay, size, parameter names.

    Layer indices are folded (``transformer.h.*.mlp.linear.weight``) so a 48-layer model
    reads as easily as a 2-layer one. ``numels`` gives parameters' sizes as built, when
    the model has since been sharded (FSDP: each rank holds a part of each parameter).
    """
    lines = []
    for group in groups:
        names = group.get("param_names") or []
        folded = sorted({re.sub(r"\.\d+(?=\.|$)", ".*", n) for n in names})
        if numels is not None and names:
            count = sum(numels[name] for name in names)
        else:
            count = sum(p.numel() for p in group["params"])
        lines.append(
            f"{group.get('name', '?')}: weight_decay {group['weight_decay']}, "
            f"{len(group['params'])} tensors, {count:,} parameters: {', '.join(folded)}"
        )
    return lines


def warmup_cosine(step: int, total_steps: int, warmup_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of the base lr at ``step`` (0-based): linear warmup, then cosine decay.

    As transformers' ``get_cosine_schedule_with_warmup``: the floor ``min_lr_ratio`` is
    reached at ``step == total_steps``, one past the last step taken."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if total_steps <= warmup_steps:
        return 1.0
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_linear(step: int, total_steps: int, warmup_steps: int) -> float:
    """Multiplier of the base lr at ``step`` (0-based): linear 0 -> 1 over ``warmup_steps``,
    then 1 -> 0 at ``total_steps`` (BERT's and RoBERTa's fine-tuning schedule, GLUE's)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))


def released_warmup_cosine(
    step: int, release: int, total_steps: int, warmup_steps: int, min_lr_ratio: float
) -> float:
    """:func:`warmup_cosine` restarted at ``release``: the schedule of a depth that starts
    training there (0 before). Its warmup is at most a quarter of its window."""
    if step < release:
        return 0.0
    window = max(1, total_steps - release)
    return warmup_cosine(step - release, window, min(warmup_steps, window // 4), min_lr_ratio)


def planned_steps(trainer: Any) -> int:
    """t, the optimizer steps this run will take, for the cosine schedule and the dyadic
    release steps: ``max_steps``, or fewer when an epoch limit (``max_epochs``,
    ``limit_train_batches``) ends the run first. Lightning's estimate, which counts
    gradient accumulation; ConfigError when the run has no end."""
    steps = trainer.estimated_stepping_batches
    if not math.isfinite(steps):
        raise ConfigError(
            "set trainer.max_steps (or max_epochs): the cosine schedule and the dyadic "
            "release steps need the run's length"
        )
    return int(steps)
