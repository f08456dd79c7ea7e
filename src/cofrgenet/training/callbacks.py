"""Callbacks: the dyadic unfreezing schedule, ladder health, and the non-finite loss guard."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shlex
import signal
import sys
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only, rank_zero_warn
from torch import nn

from cofrgenet.data.datamodule import STOP_SIGNALS
from cofrgenet.errors import ConfigError, UserError
from cofrgenet.nn.ladder import LadderLayer, resolve_ladder_bias
from cofrgenet.ops import NEAR_POLE
from cofrgenet.redact import hide_passwords
from cofrgenet.training import checkpoints
from cofrgenet.training.checkpoint_io import remove_requeue_checkpoints
from cofrgenet.training.checkpoints import NONFINITE_PREFIX
from cofrgenet.training.optim import planned_steps
from cofrgenet.training.strategies import grad_square_sum, summed_over_shards

SCHEDULES = ("paper", "early", "none")
#: How a released depth's learning rate is set (DyadicUnfreezing's ``lr``).
RELEASE_LR = ("global", "release")


def ladder_layers(module: nn.Module) -> Iterator[tuple[str, LadderLayer]]:
    """(name, layer) of every CoFrGeNet layer in ``module``."""
    for name, child in module.named_modules():
        if isinstance(child, LadderLayer):
            yield name, child


def release_step(depth: int, total_steps: int, schedule: str) -> int:
    """First optimizer step at which ladder parameters of ``depth`` (>= 1) are trained.

    * "paper": depth i trains during the last t / 2^i steps, from t (1 - 2^-i)
      (spec section 4: depth 1 from t/2, depth 2 from 3t/4, depth 3 from 7t/8).
    * "early": the one-line summary's reading, depth i starts after t / 2^i steps.
    * "none": everything trains from step 0.
    """
    if depth < 1:
        raise ValueError(f"ladder depths start at 1 (depth 0 is the linear term), got {depth}")
    if schedule == "paper":
        return math.ceil(total_steps * (1.0 - 2.0**-depth))
    if schedule == "early":
        return math.ceil(total_steps / 2.0**depth)
    if schedule == "none":
        return 0
    raise ValueError(f"unknown dyadic schedule {schedule!r}; choose one of {SCHEDULES}")


def never_trained(releases: dict[int, int], steps: int, schedule: str) -> str | None:
    """A warning naming the depths of ``releases`` ({depth: release step}) that a run of
    ``steps`` optimizer steps never trains (the paper's schedule gives depth i the last
    t / 2^i steps: none when t < 2^i), else None."""
    late = sorted(k for k, release in releases.items() if release >= steps)
    if not late:
        return None
    names = ", ".join(str(k) for k in late)
    needed = (
        f" (at least {2 ** max(late)} steps for depth {max(late)})" if schedule == "paper" else ""
    )
    return (
        f"DyadicUnfreezing: ladder depth{'s' if len(late) > 1 else ''} {names} "
        f"{'are' if len(late) > 1 else 'is'} released at or after the run's last step "
        f"({steps} steps): never trained, {'they stay' if len(late) > 1 else 'it stays'} at "
        f"initialisation. Raise trainer.max_steps{needed}, or lower model.config.depth"
    )


def check_frozen_parameters_allowed(wrapped: nn.Module | None) -> None:
    """Refuse a DDP-wrapped model that expects a gradient for every parameter.

    A frozen ladder depth gets none, and DDP without ``find_unused_parameters`` would
    then stop at the next step with an error naming no setting. ``wrapped`` is the
    strategy's model once it is set up (``DistributedDataParallel`` under DDP).
    """
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(wrapped, DistributedDataParallel) and not wrapped.find_unused_parameters:
        raise frozen_depths_need_unused_parameters(None)


def frozen_depths_need_unused_parameters(strategy: str | None) -> ConfigError:
    """The refusal of DyadicUnfreezing under ``strategy``, a DDP that expects a gradient
    for every parameter (None: a DDP strategy of unknown name; ``auto``: Lightning's
    choice on several devices, ddp)."""
    fix = (
        "ddp_find_unused_parameters_true (ddp_spawn_find_unused_parameters_true under ddp_spawn)"
        if strategy is None
        else f"{'ddp' if strategy == 'auto' else strategy}_find_unused_parameters_true"
    )
    named = {None: "DDP", "auto": "trainer.strategy auto (ddp on several devices)"}
    return ConfigError(
        f"DyadicUnfreezing freezes ladder depths, which then get no gradient; "
        f"{named.get(strategy, strategy)} must be told to expect that: set "
        f"trainer.strategy: {fix}"
    )


class DyadicUnfreezing(L.Callback):
    """Freeze depth-i ladder parameters until their release step (spec section 4).

    Linear (depth-0) parameters train from step 0. Frozen parameters still take part in
    the forward pass; they get ``requires_grad=False``, hence no gradient, so AdamW skips
    them (their moments stay at the zeros ``optim.materialise_adam_state`` made, and no
    weight decay applies), and they do not change by a single bit. All
    parameters are in the optimizer from the start (see ``training.optim``), so a released
    depth is updated from its release step on.

    The state is a function of ``trainer.global_step``: it is reapplied before every batch,
    so it holds across resume and requeue, and it uses no gradient hooks (works with DDP;
    with FSDP use ``use_orig_params=True``). The checkpoint keeps the plan and its step:
    a run resumed with a larger ``max_steps`` (a later plan) never freezes again a depth
    that was training already.

    Args:
        schedule: "paper" (default), "early" or "none"; see :func:`release_step`.
        total_steps: t; default: the steps the run will take: ``max_steps``, or fewer
            when an epoch limit ends it first (:func:`~cofrgenet.training.optim.planned_steps`).
        lr: "global" (the paper's: a released depth follows the run's learning-rate
            schedule, so under warmup + cosine the last depths train near the floor) or
            "release" (each depth gets the run's warmup + cosine restarted at its release
            step, warmup capped at a quarter of its window; LanguageModel reads this when
            it builds its optimizer and gives each depth a parameter group of its own).
    """

    def __init__(
        self, schedule: str = "paper", total_steps: int | None = None, lr: str = "global"
    ) -> None:
        if schedule not in SCHEDULES:
            raise ConfigError(f"unknown dyadic schedule {schedule!r}; choose one of {SCHEDULES}")
        if lr not in RELEASE_LR:
            raise ConfigError(f"unknown DyadicUnfreezing lr {lr!r}; choose one of {RELEASE_LR}")
        self.schedule = schedule
        self.total_steps = total_steps
        self.lr = lr
        self._releases: dict[int, int] = {}
        self._step = 0  # the step the latest batch trained (saved with the plan)
        #: (plan, step) of the checkpoint this run resumed from.
        self._resumed: tuple[dict[int, int], int] | None = None

    def plan(self, trainer: L.Trainer, module: nn.Module) -> dict[int, int]:
        """{depth: release step} of ``module``'s ladder depths in this trainer's run; a
        depth released before the checkpoint this run resumed from keeps its release."""
        plan = self.release_steps(module, self._total(trainer))
        if self._resumed is not None:
            before, step = self._resumed
            for depth, released in before.items():
                # Released by then: its release stands, wherever the new plan puts it (a
                # release it moves earlier too: the depth's lr schedule started there).
                if depth in plan and released <= step:
                    plan[depth] = released
                # Not released yet, and a shorter run's plan puts its release before the
                # resume: it is released at the resumed run's first step (the plan said
                # it trained from a step it was frozen at; lr="release" skipped warm-up).
                elif depth in plan:
                    plan[depth] = max(plan[depth], step + 1)
        return plan

    def state_dict(self) -> dict[str, Any]:
        # lr too: a resume must build the optimizer's parameter groups the run saved.
        return {"releases": dict(self._releases), "step": self._step, "lr": self.lr}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        releases = {int(depth): int(step) for depth, step in state_dict["releases"].items()}
        self._resumed = (releases, int(state_dict["step"]))

    def _total(self, trainer: L.Trainer) -> int:
        if self.total_steps is not None:
            return self.total_steps
        return planned_steps(trainer)

    def release_steps(self, module: nn.Module, total_steps: int) -> dict[int, int]:
        depths = {
            k for _, layer in ladder_layers(module) for k in layer.ladder_parameters_by_depth()
        }
        return {k: release_step(k, total_steps, self.schedule) for k in sorted(depths)}

    def apply(self, module: nn.Module, step: int) -> None:
        """Set ``requires_grad`` of every ladder parameter for optimizer step ``step``."""
        for _, layer in ladder_layers(module):
            for depth, params in layer.ladder_parameters_by_depth().items():
                trainable = step >= self._releases[depth]
                for param in params:
                    param.requires_grad_(trainable)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        check_frozen_parameters_allowed(trainer.strategy.model)
        self._releases = self.plan(trainer, pl_module)
        if self._releases:
            plan = ", ".join(f"depth {k} from step {s}" for k, s in self._releases.items())
            rank_zero_info(f"DyadicUnfreezing ({self.schedule}, lr {self.lr}): {plan}")
            if untrained := never_trained(self._releases, planned_steps(trainer), self.schedule):
                rank_zero_warn(untrained)
        self.apply(pl_module, trainer.global_step)

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._step = trainer.global_step
        self.apply(pl_module, trainer.global_step)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Leave the model fully trainable for whatever comes next (fine-tuning, export).
        for _, layer in ladder_layers(pl_module):
            for param in layer.ladder_parameters():
                param.requires_grad_(True)


class DisableLadders(L.Callback):
    """Ablation: switch the Cffn ladders off, leaving the gated linear path alone.

    At the start of fit every Cffn's ladder mix V is zeroed and frozen together with the
    ladder parameters, so the layer computes U x^ with x^ = sigmoid(G x) * x and nothing
    else: what the ladders add is then the difference to an ordinary run. The frozen
    parameters stay in the model (the parameter count is the same).
    """

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        from cofrgenet.nn import Cffn

        layers = [layer for _, layer in ladder_layers(pl_module) if isinstance(layer, Cffn)]
        if not layers:
            raise ValueError("DisableLadders switches off Cffn ladders, but the model has no Cffn")
        if any(isinstance(c, DyadicUnfreezing) for c in trainer.callbacks):
            # It would release the frozen ladders, which then weight-decay at zero gradient.
            raise ConfigError(
                "DisableLadders freezes the ladders that DyadicUnfreezing trains: drop one "
                "of the two callbacks (the ablation runs without DyadicUnfreezing)"
            )
        with torch.no_grad():
            for layer in layers:
                layer.mix.zero_()
                for param in (layer.mix, *layer.ladder_parameters()):
                    param.requires_grad_(False)


def _layer_kind(layer: LadderLayer) -> str:
    return type(layer).__name__.lower()


class StepBoundaries(L.Callback):
    """Hooks at optimizer-step boundaries: Lightning's batch hooks run per micro-batch,
    and under gradient accumulation several micro-batches make one step.

    :meth:`on_step_start` runs before a step's first micro-batch and :meth:`on_step_end`
    after its last (the optimizer has stepped: ``trainer.global_step`` has moved on).
    Subclasses that override the batch hooks call ``super()``'s.
    """

    _running_step = -1  # the optimizer step whose micro-batches are running

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step != self._running_step:
            self._running_step = trainer.global_step
            self.on_step_start(trainer, pl_module)

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if trainer.global_step != self._running_step:
            self.on_step_end(trainer, pl_module)

    def inside_step(self, trainer: L.Trainer) -> bool:
        """Whether an optimizer step has run some of its micro-batches and not all: a
        validation Lightning runs between them (it counts batches, not steps)."""
        return trainer.global_step == self._running_step

    def on_step_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Before the first micro-batch of optimizer step ``trainer.global_step``."""

    def on_step_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """After the last micro-batch of the step: ``trainer.global_step`` steps are done."""


class LadderHealthMonitor(StepBoundaries):
    """Ladder health every ``every_n_steps`` optimizer steps, logged at the step measured.

    Once per optimizer step; with gradient accumulation, the forward statistics are
    those of the step's last micro-batch. Per layer type (cffn, cattnu, cattnm):
    ``ladder/<type>/near_pole_share`` (share of units with |K_d| < ``near``, mean over
    layers: their gradients are 1/K_d^2 times larger, so this is the alarm that matters),
    ``ladder/<type>/clamped_share`` (|K_d| < eps), ``ladder/<type>/min_abs_kd`` and
    ``ladder/<type>/max_abs_z`` (min and max over layers). From its backward, before
    clipping: ``ladder/grad_norm/depth_<k>`` (all ladder parameters of depth k; frozen
    depths have none) and ``ladder/grad_share`` (the ladder parameters' share of the
    gradient norm). Written straight to the loggers with the step they belong to.
    """

    def __init__(self, every_n_steps: int = 50, near: float = NEAR_POLE) -> None:
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self.near = near
        self._metrics: dict[str, float] = {}

    def _due(self, trainer: L.Trainer) -> bool:
        return trainer.global_step % self.every_n_steps == 0

    def _set_tracking(self, module: nn.Module, on: bool) -> None:
        for _, layer in ladder_layers(module):
            layer.track_health = on
            layer.health_near = self.near

    def on_step_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._metrics = {}
        self._set_tracking(pl_module, self._due(trainer))

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        if not self._due(trainer):
            return
        by_depth: dict[int, list[nn.Parameter]] = defaultdict(list)
        for _, layer in ladder_layers(pl_module):
            for depth, params in layer.ladder_parameters_by_depth().items():
                by_depth[depth].extend(params)
        depths = sorted(by_depth)  # the same on every rank: one collective below
        device = pl_module.device
        squares = [grad_square_sum(by_depth[d], device) for d in depths]
        squares.append(grad_square_sum(pl_module.parameters(), device))
        flags = [float(any(p.grad is not None for p in by_depth[d])) for d in depths]
        both = torch.cat([torch.stack(squares), torch.tensor(flags, device=device)])
        both = summed_over_shards(trainer, both).cpu()  # each rank holds a shard (FSDP)
        squares, flags = both[: len(depths) + 1], both[len(depths) + 1 :]
        trained = [d for d, flag in zip(depths, flags.tolist(), strict=True) if flag > 0]
        if not trained:  # every depth frozen: no ladder gradient this step
            return
        for i, depth in enumerate(depths):
            if depth in trained:
                self._metrics[f"ladder/grad_norm/depth_{depth}"] = squares[i].sqrt().item()
        ladder, total = squares[:-1].sum(), squares[-1]
        self._metrics["ladder/grad_share"] = (ladder / total.clamp_min(1e-30)).sqrt().item()

    def on_step_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        layers = list(ladder_layers(pl_module))
        if not layers or not any(layer.track_health for _, layer in layers):
            return
        by_kind: dict[str, list] = defaultdict(list)
        for _, layer in layers:
            health = layer.health()
            if health is not None:
                by_kind[_layer_kind(layer)].append(health)
        for kind, stats in by_kind.items():
            self._metrics[f"ladder/{kind}/near_pole_share"] = _mean(s.near_pole for s in stats)
            self._metrics[f"ladder/{kind}/clamped_share"] = _mean(s.clamped for s in stats)
            self._metrics[f"ladder/{kind}/min_abs_kd"] = min(s.min_abs_kd.item() for s in stats)
            self._metrics[f"ladder/{kind}/max_abs_z"] = max(s.max_abs_value.item() for s in stats)
        self._set_tracking(pl_module, False)
        # global_step has already moved past the step these numbers were measured at.
        step = trainer.global_step - 1
        for logger in trainer.loggers:
            logger.log_metrics(self._metrics, step=step)
        self._metrics = {}


def _mean(values: Iterator[torch.Tensor]) -> float:
    return torch.stack(list(values)).float().mean().item()


def _trained_out(trainer: L.Trainer) -> bool:
    """Whether the fit has trained its last step: ``max_steps`` reached, or the last
    batch of the last of ``max_epochs`` trained."""
    steps_done = trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps
    epochs = trainer.max_epochs
    last_epoch = epochs is not None and epochs > 0 and trainer.current_epoch >= epochs - 1
    return steps_done or (last_epoch and bool(trainer.is_last_batch))


def _spawn_launcher(trainer: L.Trainer) -> bool:
    """Whether this is ddp_spawn's launching process (several ranks, no process group
    here: its ranks train, make the MLflow run and say what happened)."""
    return trainer.world_size > 1 and not torch.distributed.is_initialized()


def late_stop(late_signals: Iterable[int]) -> int | None:
    """The first of a fit's ``late_signals`` (:class:`StopOnSignal`'s, sorted) that stops
    what runs the fit: Ctrl-C or SIGTERM (a late SIGUSR1 asks for a requeue); None if
    none did."""
    return next((s for s in late_signals if s in (signal.SIGINT, signal.SIGTERM)), None)


def validates_at(batches: int, every: Any, limit_val_batches: Any, every_n_epoch: Any) -> bool:
    """Whether a fit validates once it has trained ``batches`` training batches (micro-
    batches, counted across epochs as Lightning counts them): every ``every`` batches (a
    step-counted ``val_check_interval``: ``check_val_every_n_epoch`` = ``every_n_epoch``
    null, as every conf/trainer file sets), unless ``limit_val_batches`` is 0.
    Epoch-counted validation is not foreseen (False)."""
    if every_n_epoch is not None or limit_val_batches == 0:
        return False
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        return False
    return batches % every == 0


def batches_trained(trainer: L.Trainer) -> int:
    """The training batches (micro-batches) a fit has run, across epochs and resumes:
    Lightning's own count, which its step-counted validation follows. Not optimizer steps
    x ``accumulate_grad_batches``: an epoch whose batches the accumulation does not divide
    ends on a shorter step."""
    return trainer.fit_loop.epoch_loop.total_batch_idx + 1


def validates_after_this_step(trainer: L.Trainer) -> bool:
    """Whether Lightning validates after the optimizer step that has just ended."""
    return validates_at(
        batches_trained(trainer),
        trainer.val_check_batch,
        trainer.limit_val_batches,
        trainer.check_val_every_n_epoch,
    )


class StopOnSignal(StepBoundaries):
    """SIGTERM, Ctrl-C or a SIGUSR1 that nothing handles (outside SLURM): finish the
    running optimizer step, save it, mark the MLflow run KILLED, say how to resume, and
    exit with status 128 + the signal's number.

    The handlers only note a signal. At the end of each optimizer step (all of its
    micro-batches: a checkpoint taken inside a gradient accumulation would resume past
    micro-batches whose gradients it does not hold) the ranks agree whether any rank got
    one; a signal that comes while validation runs, or in a step that a validation
    follows, is acted on when that validation ends (its score is not lost), or at the
    end of the step it ran inside (Lightning counts batches, not steps). Then
    Lightning's own SIGTERM handler is called, so Lightning stops every rank
    together once the step's metrics are written (``SIGTERMException``), and this
    callback saves ``checkpoints/last.ckpt``. A second Ctrl-C aborts at once. A SIGUSR1
    handler already in place (Lightning's SLURM requeue, which saves
    ``hpc_ckpt_<n>.ckpt``; a sweep worker's) is deferred to the step's end the same way.
    ``cofr fit`` exits with the status the exception carries (143, 130 or 138).

    Before training begins (data, model and checkpoint set up, the sanity check's
    validation, a compile), after the MLflow run exists, SIGTERM or Ctrl-C stops the fit
    at once: nothing new to save, the MLflow run ends KILLED, not RUNNING for ever. One
    that comes after the last step (the final checkpoint's save) has no step left to stop:
    it is kept in ``late_signals`` for what runs the fit (a sweep worker then stops).
    """

    def __init__(self, resume_hint: Callable[[str], str | None] | None = None) -> None:
        """``resume_hint(run name)``: the command said to resume (default:
        :func:`resume_command`, this ``cofr fit`` made to resume its run); None says none
        (what runs the fit says it once it knows: a sweep worker)."""
        self.resume_hint = resume_hint or resume_command
        self.signal: int | None = None
        self.saved: Path | None = None
        self._pending: set[int] = set()
        self._deferred: dict[int, Any] = {}  # signal -> the handler it stood in for
        self._previous_sigint: Any = None
        self._sigint_before: Any = None  # the SIGINT handler before the fit, kept
        self._pid = os.getpid()  # the trainer's process
        # "starting" (setup to the first training step: SIGTERM stops at once), "training"
        # (Lightning's handler and ours note it), "idle" (before setup, after the fit)
        self._phase = "idle"
        self._left_to_finish = "save"  # in "ending": what a Ctrl-C lets finish
        self._before_start: Any = None  # the SIGTERM handler before setup
        #: Signals that came after the last step and were not acted on (see teardown).
        self.late_signals: list[int] = []

    _set_up = False  # setup has run for a fit: "idle" after it is after the teardown

    _waiting_for_validation = False  # the step just ended validates: act after it

    _ended = False  # a fit with this callback has ended: its handlers are given back

    @property
    def fit_ended(self) -> bool:
        """Whether a fit with this callback has ended (torn down, or stopped by an
        exception) and given the signal handlers back."""
        return self._ended

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or threading.current_thread() is not threading.main_thread():
            return
        self._pid, self._phase, self._set_up = os.getpid(), "starting", True
        self._ended, self._waiting_for_validation = False, False
        self._before_start = signal.signal(signal.SIGTERM, self._on_sigterm_while_starting)

    def _on_sigterm_while_starting(self, signum: int, frame: Any) -> None:
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        if os.getpid() == self._pid and self._phase == "starting":
            self.signal = signal.SIGTERM
            raise SIGTERMException(128 + signum)
        if os.getpid() == self._pid and self._phase == "training":
            return  # called by Lightning's handler, which keeps the ones it found
        if os.getpid() == self._pid and self._phase == "ending":
            self._pending.add(signum)  # after the last step: kept in late_signals
            return
        # Lightning may put this handler back after the fit: act as the one it replaced.
        previous = self._before_start
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._pid = os.getpid()
        if threading.current_thread() is threading.main_thread():
            self._previous_sigint = signal.signal(signal.SIGINT, self._on_sigint)
            self._sigint_before = self._previous_sigint

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._phase = "training"
        # After Lightning has put its SIGTERM (and SLURM SIGUSR1) handlers in place.
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, getattr(signal, "SIGUSR1", None)):
            if signum is None:
                continue
            handler = signal.getsignal(signum)
            # Without a handler SIGUSR1 would end the process unsaved: it stops as
            # SIGTERM does (a scheduler's warning outside SLURM's requeue).
            if callable(handler) or handler == signal.SIG_DFL or signum == signal.SIGTERM:
                self._deferred[signum] = handler
                signal.signal(signum, self._on_deferred)

    def _on_sigint(self, signum: int, frame: Any) -> None:
        if os.getpid() != self._pid:
            return  # a data loader worker (forked with this handler): the trainer decides
        if self._phase == "idle":
            # Lightning puts the handlers it found at fit start back after the fit, this
            # one among them: act as the one it replaced (a Ctrl-C between two fits of
            # one process, a benchmark's or a sweep's, was swallowed).
            before = self._sigint_before
            if before is None or before == signal.SIG_DFL:
                before = signal.default_int_handler
            signal.signal(signal.SIGINT, before)
            if callable(before):
                before(signum, frame)
            return
        if self._phase == "starting":  # no step to finish: a step-0 save resumes nothing
            raise KeyboardInterrupt
        if self.saved is not None:  # the stop is saved and on its way out: let it end
            return
        if self._phase == "ending":  # trained: the final save finishes, then it stops
            if signal.SIGINT in self._pending:  # the second Ctrl-C
                raise KeyboardInterrupt
            self._pending.add(signal.SIGINT)  # kept in late_signals
            if rank_zero_only.rank == 0:  # every rank gets the terminal's Ctrl-C
                print(
                    f"\nCtrl-C: training is over; finishing its {self._left_to_finish}"
                    " (press it again to abort)"
                )
            return
        if self.signal is not None or signal.SIGINT in self._pending:  # the second Ctrl-C
            raise KeyboardInterrupt
        self._pending.add(signal.SIGINT)
        if rank_zero_only.rank == 0:  # every rank gets the terminal's Ctrl-C: said once
            print("\nCtrl-C: stopping after this step (press it again to abort without saving)")

    def _on_deferred(self, signum: int, frame: Any) -> None:
        self._pending.add(signum)

    def on_step_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == "fit" and self._phase == "training" and _trained_out(trainer):
            # No step is left: a signal noted in the last one is late, as one in the
            # final validation is (that validation and the final save finish; the signal
            # goes to late_signals). A stop saved here left a checkpoint at max_steps,
            # never scored, that no resume could train on (no step left to take).
            self._phase, self._left_to_finish = "ending", "final validation and save"
            if signal.SIGINT in self._pending and rank_zero_only.rank == 0:
                print("\nCtrl-C: that was the last step; finishing its final validation and save")
            return
        if not self._waiting_for_validation and validates_after_this_step(trainer):
            # Acted on now, a stop would save before this step's validation, which
            # Lightning then aborts and, resuming, takes as done: its val/loss (a sweep
            # trial's report to the pruner) lost. on_validation_end acts (and exchanges)
            # once it has scored, or the next step's end, had none run. Every rank skips
            # this exchange alike, whatever signals it holds: the step is the same on each.
            self._waiting_for_validation = True
            if signal.SIGINT in self._pending and rank_zero_only.rank == 0:
                print("\nCtrl-C: this step validates; stopping once its validation ends")
            return
        self._act(trainer, pl_module)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The validation after the last step scores a finished run: a Ctrl-C in it is
        # late (see on_validation_end), and says so rather than "stopping after this step".
        if trainer.state.fn == "fit" and self._phase == "training" and _trained_out(trainer):
            self._phase, self._left_to_finish = "ending", "final validation and save"

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A signal that came during validation inside fit is acted on once it has ended,
        # not per batch: ranks may hold different numbers of validation batches (an
        # exchange per batch would then pair with another collective and hang), and a
        # checkpoint saved mid-validation would resume to a score of part of the set.
        # The validation after the last step has scored the finished run: a signal then is
        # late (kept in late_signals), not a stop that would mark a finished run KILLED
        # and keep it out of a benchmark's table.
        # One that ran inside an optimizer step (Lightning counts batches: an interval
        # that is not a multiple of accumulate_grad_batches, an epoch that ended on a
        # shorter step) waits for the step's end: saved here, a checkpoint would resume
        # past micro-batches whose gradients it does not hold.
        if (
            trainer.state.fn == "fit"
            and not _trained_out(trainer)
            and not self.inside_step(trainer)
        ):
            self._act(trainer, pl_module)

    def _act(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """At a step boundary: act on the signals any rank has noted, on every rank."""
        self._waiting_for_validation = False
        if trainer.world_size == 1:  # nothing to agree on: no tensor, no device sync
            arrived = set(self._pending)
        else:
            # Exchanged in STOP_SIGNALS' order, the same on every rank.
            got = [float(signum in self._pending) for signum in STOP_SIGNALS]
            agreed = trainer.strategy.reduce(
                torch.tensor(got, device=pl_module.device), reduce_op="sum"
            )
            arrived = {s for s, n in zip(STOP_SIGNALS, agreed.tolist(), strict=True) if n > 0}
        self._pending.clear()
        usr1 = getattr(signal, "SIGUSR1", None)
        if usr1 in arrived and callable(self._deferred.get(usr1)):
            # Lightning's ends the loggers as "finished" before SLURM kills the job for
            # its requeue: the run is KILLED at this step, awaiting the requeued job.
            self._mark_killed(trainer)
            self._deferred[usr1](usr1, None)  # e.g. Lightning's: save hpc_ckpt, requeue
            if trainer.is_global_zero:  # the new one is written: the older ones go
                remove_requeue_checkpoints(Path(trainer.default_root_dir))
        stop = arrived & {signal.SIGTERM, signal.SIGINT}
        if usr1 in arrived and not callable(self._deferred.get(usr1)):
            stop.add(usr1)  # no requeue handler: a stop
        if stop and self.signal is None:
            self.signal = next(s for s in (signal.SIGINT, signal.SIGTERM, usr1) if s in stop)
            # Saved here, where a periodic checkpoint is (a step's end) or ModelCheckpoint's
            # save after a validation: Lightning resumes either with its step counter
            # right. Saved later, when Lightning raises, every metric of the resumed run
            # was logged one step late.
            self._stop(trainer)
            lightning = self._deferred.get(signal.SIGTERM)
            if callable(lightning):
                # Lightning stops after this step's logs. Its handler logs "Received
                # SIGTERM", which a Ctrl-C or SIGUSR1 is not: _stop names the one that came.
                quiet = (
                    _drop_log_records(_LIGHTNING_SIGNAL_LOGGER, "Received SIGTERM")
                    if self.signal != signal.SIGTERM
                    else contextlib.nullcontext()
                )
                with quiet:
                    lightning(signal.SIGTERM, None)
            else:
                trainer.should_stop = True

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        if isinstance(exception, (SIGTERMException, KeyboardInterrupt)):
            _stop_spawned_ranks(trainer)
        if isinstance(exception, SIGTERMException) and self._phase in ("starting", "idle"):
            # "idle" in a fit before this callback's setup (cofr fit's SIGTERM raises then
            # too), not after its teardown (trained and saved: nothing to stop or mark);
            # ddp_spawn's launcher leaves the saying to its ranks.
            if self._starting(trainer) and not _spawn_launcher(trainer):
                self._mark_killed(trainer)
                hint = self.resume_hint(Path(trainer.default_root_dir).name)
                rank_zero_info(
                    "stopped by SIGTERM before training began: nothing new to save"
                    + (f"; to start again: {hint}" if hint else "")
                )
            exception.code = 128 + signal.SIGTERM
        elif isinstance(exception, SIGTERMException):
            self.signal = self.signal or signal.SIGTERM
            if self.saved is None:  # a SIGTERM Lightning's handler noted before ours
                self._stop(trainer)
            exception.code = 128 + self.signal  # the status cofr fit exits with
        elif isinstance(exception, KeyboardInterrupt):  # a second Ctrl-C, or one while starting
            self._mark_killed(trainer)
            if not _spawn_launcher(trainer):  # ddp_spawn's launcher leaves it to its ranks
                self._say_aborted(trainer)
        self._phase, self._ended = "idle", True
        self._restore_handlers()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.signal is not None and self.saved is None:  # stopped without Lightning's help
            self._stop(trainer)
        elif self.signal is None:
            # Trained to its end after all: a requeue that failed (scontrol refused), or
            # came too late to stop it. The run finished; it is not awaiting a requeue.
            for logger in trainer.loggers:
                if hasattr(logger, "mark_going_on"):
                    logger.mark_going_on()
        if self._phase in ("training", "ending"):
            self._phase, self._left_to_finish = "ending", "save"
        self._restore_handlers(keep_sigint=True)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self._phase == "ending":
            # Noted after the last step's end (while the final checkpoint was saved, say):
            # no step end was left to act at. The fit is over and saved; what runs it
            # decides (a sweep worker stops or requeues after telling the trial's result).
            self.late_signals = sorted(self._pending)
        self._pending.clear()
        self._phase, self._ended = "idle", True
        self._restore_handlers()

    def _restore_handlers(self, keep_sigint: bool = False) -> None:
        """Put back the handlers from before; ``keep_sigint``: Ctrl-C's stays this
        callback's (at train end: the final save and Lightning's teardown are to come)."""
        if signal.getsignal(signal.SIGTERM) == self._on_sigterm_while_starting:
            signal.signal(signal.SIGTERM, self._before_start or signal.SIG_DFL)
        if self._previous_sigint is not None and not keep_sigint:
            signal.signal(signal.SIGINT, self._previous_sigint)
            self._previous_sigint = None
        for signum, handler in self._deferred.items():
            if signal.getsignal(signum) == self._on_deferred:
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._deferred = {}

    def _stop(self, trainer: L.Trainer) -> None:
        path = Path(trainer.default_root_dir) / "checkpoints" / "last.ckpt"
        trainer.save_checkpoint(path, weights_only=False)  # Lightning logs a line if unset
        self.saved = path
        self._mark_killed(trainer)
        name = signal.Signals(self.signal).name
        hint = self.resume_hint(Path(trainer.default_root_dir).name)
        rank_zero_info(
            f"stopped by {name} after step {trainer.global_step}: saved {path}"
            + (f"\nresume with: {hint}" if hint else "")
        )

    def _starting(self, trainer: L.Trainer) -> bool:
        """Whether the fit has not begun training: setting up, or before this callback's
        setup (the MLflow run and the data are made first)."""
        return self._phase == "starting" or (
            self._phase == "idle" and not self._set_up and trainer.state.fn == "fit"
        )

    def _say_aborted(self, trainer: L.Trainer) -> None:
        """What a Ctrl-C that aborts leaves: the newest checkpoint and how to resume from
        it, or that there is none (Lightning's "attempting graceful shutdown" was all)."""
        run_dir = Path(trainer.default_root_dir)
        hint = self.resume_hint(run_dir.name)  # None: what runs the fit says it
        if self._starting(trainer):
            said = "stopped by Ctrl-C before training began: nothing new to save"
            rank_zero_info(said + (f"; to start again: {hint}" if hint else ""))
            return
        if self._phase == "ending":
            said = (
                f"aborted by a second Ctrl-C after the last step, {trainer.global_step}: "
                f"its {self._left_to_finish} did not finish"
            )
        else:
            said = f"aborted by a second Ctrl-C in step {trainer.global_step + 1}: not saved"
        newest = next(iter(checkpoints.candidates(run_dir)), None)  # what a resume takes
        if newest is not None:
            said += f"; the newest checkpoint is {newest.relative_to(run_dir)}"
            rank_zero_info(said + (f"\nresume with: {hint}" if hint else ""))
        elif hint is None:
            rank_zero_info(f"{said}, and no checkpoint was saved before it")
        else:
            rank_zero_info(
                f"{said}, and no checkpoint was saved before it: start again with another "
                f"--run.name (or remove {run_dir})"
            )

    @staticmethod
    def _mark_killed(trainer: L.Trainer) -> None:
        if _spawn_launcher(trainer):
            # ddp_spawn's launching process: its ranks made the run and mark it; here
            # the logger has no run, and asking for its id made a second, empty one.
            return
        for logger in trainer.loggers:
            if hasattr(logger, "mark_killed"):
                logger.mark_killed(trainer.global_step)


def _stop_spawned_ranks(trainer: L.Trainer) -> None:
    """In ddp_spawn's launching process, stopped by a signal to it alone (``kill PID``, a
    supervisor's, a sweep worker's stop): pass SIGTERM on to the ranks it spawned, which
    stop as on a signal of their own (at their step's end, saved, the run KILLED), and
    wait for them. Lightning passes nothing on: the ranks trained to their end while
    the launcher waited to exit. SIGTERM for a Ctrl-C too: a terminal's Ctrl-C reaches
    the ranks as well, and a second SIGINT would abort them unsaved."""
    import multiprocessing

    if trainer.world_size == 1 or torch.distributed.is_initialized():
        return  # no ranks of its own, or a rank: its own callback acts
    launcher = trainer.strategy.launcher
    spawned = [
        process
        for process in getattr(launcher, "procs", None) or ()
        if isinstance(process, multiprocessing.process.BaseProcess)
    ]
    if not spawned:
        return
    launcher.kill(signal.SIGTERM)
    for process in spawned:
        process.join()


#: Where Lightning's SIGTERM handler logs (the module's logger, by logging's convention).
_LIGHTNING_SIGNAL_LOGGER = "lightning.pytorch.trainer.connectors.signal_connector"


@contextlib.contextmanager
def _drop_log_records(logger_name: str, containing: str) -> Iterator[None]:
    """Drop the records of logger ``logger_name`` whose message contains ``containing``."""

    def keep(record: logging.LogRecord) -> bool:
        return containing not in record.getMessage()

    logger = logging.getLogger(logger_name)
    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


def resume_command(run_name: str) -> str:
    """This process's ``cofr fit`` command line, made to resume run ``run_name``."""
    words, skip = [], False
    for word in sys.argv[1:]:
        if skip:
            skip = False
            continue
        if word in ("--ckpt_path", "--run.name"):
            skip = True
            continue
        if word.startswith(("--ckpt_path=", "--run.name=")):
            continue
        words.append(word)
    if not words or words[0] != "fit":
        words = ["fit", "..."]
    return hide_passwords(
        shlex.join(["cofr", *words, "--run.name", run_name, "--ckpt_path", "last"])
    )


class NonFiniteLossError(UserError, RuntimeError):
    """The training loss became NaN or Inf."""

    exit_status = 1


class NonFiniteLossGuard(L.Callback):
    """Stop on a NaN/Inf training loss, after saving the weights from before that step.

    Checked before backward, so the saved checkpoint holds the last finite parameters.
    Under DDP the decision is reduced across ranks, so every rank stops together.
    """

    def __init__(self, restart_hint: bool = True) -> None:
        """``restart_hint``: end the error with how to start again (a sweep's trial is
        not started again by hand)."""
        self.restart_hint = restart_hint

    def on_before_backward(
        self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor
    ) -> None:
        bad = not bool(torch.isfinite(loss.detach()).all())
        if not trainer.strategy.reduce_boolean_decision(bad, all=False):
            return
        step = trainer.global_step
        folder = Path(trainer.default_root_dir) / "checkpoints"
        path = folder / f"{NONFINITE_PREFIX}step{step:07d}.ckpt"
        trainer.save_checkpoint(path, weights_only=False)  # Lightning logs a line if unset
        message = (
            f"the training loss became {loss.item()} at step {step}; the weights from before "
            f"this step are saved in {path}. {nonfinite_advice(trainer, pl_module)}"
        )
        if self.restart_hint:
            message += (
                " Then start a new run (another --run.name), from scratch or from "
                f"--ckpt_path {path}."
            )
        raise NonFiniteLossError(message)


def nonfinite_advice(trainer: L.Trainer, pl_module: L.LightningModule) -> str:
    """What to look at and change after a NaN/Inf loss, for this run: ladder health
    where the model has ladders (and a logger kept it), the ladder settings not already
    taken, the learning rate, clipping where it is off."""
    config = getattr(pl_module, "model_config", None)
    remedies = []
    look = ""
    if any(True for _ in ladder_layers(pl_module)):
        if trainer.loggers:
            look = (
                "Look at ladder health first: ladder/*/near_pole_share and "
                "ladder/*/min_abs_kd (LadderHealthMonitor, in the run's logged metrics) show "
                "whether ladders sit on poles. "
            )
        if getattr(config, "ladder_denominators", None) == "paper":
            remedies.append("model.config.ladder_denominators: positive (no poles)")
        # None follows bias: a llama's ladders (bias false) have no biases either.
        bias = getattr(config, "bias", True)
        if config is not None and not resolve_ladder_bias(bool(bias), config.ladder_bias):
            remedies.append("model.config.ladder_bias: true")
    remedies.append("a lower model.optimizer.lr or more model.optimizer.warmup_steps")
    if not trainer.gradient_clip_val:
        remedies.append("gradient clipping (trainer.gradient_clip_val: 1.0)")
    return f"{look}Remedies: {', '.join(remedies)}."
