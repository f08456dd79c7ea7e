"""The Lightning module that trains any model ``build_model`` makes, on next-token loss."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor
from torchmetrics import MeanMetric

from cofrgenet.data.datamodule import batch_to_xy
from cofrgenet.errors import ConfigError, UserError
from cofrgenet.models import build_model, estimate_flops_per_token
from cofrgenet.models.presets import DEFAULT_PRESET
from cofrgenet.nn import LadderLayer
from cofrgenet.training import checkpoints
from cofrgenet.training.callbacks import batches_trained
from cofrgenet.training.console import quiet_known_noise
from cofrgenet.training.model_options import ModelOverrides, fit_model_config, overrides_dict
from cofrgenet.training.optim import (
    ClipsGradients,
    OptimizerConfig,
    build_adamw,
    describe_groups,
    planned_steps,
    released_warmup_cosine,
    scales_loss,
    warmup_cosine,
)
from cofrgenet.training.perf import RunPeak
from cofrgenet.training.pretrained import run_id_of
from cofrgenet.training.strategies import (
    grad_square_sum,
    is_fsdp,
    sharded_gradients,
    summed_over_shards,
)

#: A step's pre-clip gradient norm is a spike above this many times the median of the
#: previous SPIKE_WINDOW steps.
SPIKE_FACTOR = 10.0
SPIKE_WINDOW = 20


def batch_seed(seed: int, rank: int, epoch: int, batch_idx: int) -> int:
    """The seed of one training batch's random draws (dropout) on one process.

    Drawn from the batch's place rather than carried over from the previous batch: a
    resume from any checkpoint draws the masks of an uninterrupted run without the
    random state in the checkpoint, and the processes of a DDP or FSDP run, which share
    one seed, draw masks of their own."""
    entropy = np.random.SeedSequence([seed, rank, epoch, batch_idx])
    return int(entropy.generate_state(1, np.uint64)[0])


#: What a fit logs through Lightning: the names a callback's ``monitor`` can watch
#: (``EarlyStopping``, ``ModelCheckpoint``), besides Lightning's ``step`` and ``epoch``.
FIT_METRICS = (
    "val/loss",
    "val/ppl",
    "train/loss",
    "opt/lr",
    "opt/grad_norm",
    "opt/grad_spikes",
    "data/tokens_seen",
    "perf/tokens_per_sec",
    "perf/flops_per_s",
    "perf/mfu",
)

#: Graphs a compiled model may need: one per state of its ladders' requires_grad (each
#: dyadic release changes it: d + 1 states), training and validation (grad mode), ladder
#: health recorded or not, and a partial last validation batch. Dynamo's default (8) was
#: passed within 20 steps of conf/trainer/ddp.yaml with dyadic unfreezing; past it the
#: later releases ran uncompiled.
RECOMPILE_LIMIT = 64


def allow_recompiles() -> None:
    """Raise dynamo's per-function recompile limit to :data:`RECOMPILE_LIMIT`."""
    config = torch.compiler.config
    config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)


def check_compile_strategy(compile_model: bool, strategy: Any) -> None:
    """Refuse ``model.compile`` under an FSDP ``strategy`` (a built one): configure_model
    compiles before FSDP flattens the parameters, and the compiled graph then assigns
    whole gradients to shards ("a gradient of size [n] to a tensor of size [2n]") at the
    first backward, after minutes of compiling. ``cofr fit`` checks before it launches
    the processes, so that one line says it, not one per rank."""
    if compile_model and is_fsdp(strategy):
        raise ConfigError(
            "model.compile does not work under FSDP here (the model is compiled before FSDP "
            "shards it): leave model.compile at false, its default (conf/trainer/fsdp.yaml "
            "does not set it)"
        )


class LanguageModel(ClipsGradients, L.LightningModule):
    """Next-token language modelling for every model variant.

    Args:
        preset: a name from ``cofrgenet.models.list_presets()`` (e.g. "gpt2-mini-f"), or
            null (None) to give every ModelConfig field in ``config``. The default, gpt2-mini
            (vocabulary 512, block 256), fits the default data (bytes, 257 ids), so a bare
            ``cofr fit`` trains once ``cofr data prepare`` has made it.
        config: ModelConfig fields overriding the preset (e.g. {depth: 3, ladders: 5}),
            as a dict or a ModelOverrides; (*) marks fields whose default, null, means
            the architecture's (e.g. attention softmax and norm layernorm for gpt).
        optimizer: AdamW + warmup/cosine settings (OptimizerConfig), e.g.
            ``--model.optimizer.lr 3e-4``: lr, weight_decay, betas, eps, warmup_steps,
            min_lr_ratio, fused (``cofr fit --model.optimizer.help`` describes them);
            None: their defaults.
        compile: compile the model's forward with torch.compile (checkpoints keep plain
            parameter names, so they load whether or not either side compiled).
        activation_checkpointing: each transformer block keeps only its input for
            backward and recomputes its activations there (about a third more compute a
            step, for the activation memory of one block instead of all): for a batch or
            model whose activations do not fit. Checkpoints do not depend on it. Recurrent
            models have no blocks: refused there.
        init_from: a ``cofr fit`` checkpoint whose network weights a new run starts
            from, and nothing else of it (not its optimizer state, step, learning-rate
            schedule or data position): continued pretraining on another corpus, or a
            new schedule from trained weights. The model settings must build the
            checkpoint's network; the data folder must hold its tokenizer. ``cofr fit``
            loads them (:meth:`load_initial_weights`) on a fresh start only: a resumed
            run (``--ckpt_path``) takes its checkpoint's weights instead.

    Batches are (B, T + 1) token ids: inputs are the first T, targets the last T.
    Metrics: train/loss, val/loss, val/ppl, test/loss, test/ppl, opt/lr, opt/grad_norm
    (before clipping), opt/grad_spikes (steps so far whose grad norm exceeded
    SPIKE_FACTOR x the median of the previous SPIKE_WINDOW), perf/tokens_per_sec,
    perf/flops_per_s (analytic training FLOPs per device), perf/mfu (against the data
    sheet's peak on known GPUs, a measured matmul peak on CPUs), data/tokens_seen.
    """

    def __init__(
        self,
        preset: str | None = DEFAULT_PRESET,
        config: ModelOverrides = ModelOverrides(),  # noqa: B008 (read-only, every field None)
        optimizer: OptimizerConfig | None = None,
        compile: bool = False,
        activation_checkpointing: bool = False,
        init_from: str | None = None,
    ) -> None:
        super().__init__()
        # A plain dict in the checkpoint (weights_only loading unpickles no classes).
        config = overrides_dict(config)
        if preset is None and not config:  # ModelConfig's defaults are no model of ours
            raise ConfigError(
                "model.preset is null but model.config gives no field: name a preset "
                "(`cofr models list`), or give the model's fields in model.config"
            )
        self.save_hyperparameters()
        self.model_config = fit_model_config({"preset": preset, "config": config})
        self.model = build_model(self.model_config)
        if activation_checkpointing:
            if not hasattr(self.model, "recompute_blocks"):
                raise ConfigError(
                    "model.activation_checkpointing recomputes transformer blocks; "
                    f"{type(self.model).__name__} ({self.model_config.arch}) has none: "
                    "leave it false"
                )
            self.model.recompute_blocks()
        self.optimizer_config = optimizer or OptimizerConfig()
        self.init_from = None if init_from is None else str(init_from)
        self.compile_model = compile
        self._model_compiled = False  # configure_model runs once per fit/validate/test
        self._flops_per_token: dict[int, int] = {}  # sequence length -> training FLOPs
        self.val_loss = MeanMetric()
        self.test_loss = MeanMetric()
        self.tokens_seen = 0
        self._spike_count = torch.zeros((), dtype=torch.long)
        self._grad_norms = torch.full((SPIKE_WINDOW,), float("nan"))  # ring of recent norms
        self._grad_norm_count = 0
        self._grad_norm_max = torch.zeros(())  # the largest pre-clip norm so far
        self._step_losses: list[Tensor] = []  # this optimizer step's micro-batch losses
        self._last_batch_end: float | None = None
        self._stepped_at: float | None = None  # when the running batch's optimizer step ended
        self._after_validation = False  # time the next batch from the validation's end
        self._peak: RunPeak | None = None
        #: Seeds every training batch's random draws (dropout) with the process's rank,
        #: epoch and batch: the global seed when the module is built (seed_everything's),
        #: or a resumed checkpoint's.
        self.dropout_seed = torch.initial_seed()
        #: {depth: release step} the learning-rate schedule follows (lr="release").
        self._lr_releases: dict[int, int] = {}

    # ---------------------------------------------------------------- set-up and checks

    def setup(self, stage: str) -> None:
        # Again in each process: a ddp_spawn rank does not inherit the CLI's filters.
        quiet_known_noise()
        trainer = self._attached_trainer()
        datamodule = getattr(trainer, "datamodule", None)
        if datamodule is not None:
            self.check_data(datamodule, evaluating=stage != "fit")
        check_compile_strategy(self.compile_model, getattr(trainer, "strategy", None))

    def load_initial_weights(self, datamodule: Any | None = None) -> None:
        """Load :attr:`init_from`'s network weights (nothing when it is None), checked
        first against this model's network and ``datamodule``'s tokenizer; say which
        model settings differ from the checkpoint's where the shapes allow it (dropout,
        a ladder floor). A Trainer used without ``cofr fit`` calls it before ``fit``."""
        if self.init_from is None:
            return
        try:
            saved = checkpoints.load(self.init_from)
            check_tokenizer = getattr(datamodule, "check_same_tokenizer", None)
            state = saved.get(type(datamodule).__qualname__)
            if callable(check_tokenizer) and isinstance(state, dict):
                trained_on = (saved.get("datamodule_hyper_parameters") or {}).get("data_dir")
                check_tokenizer(
                    state,
                    "train on data prepared with the checkpoint's tokenizer (`cofr data "
                    f"prepare --tokenizer-from {trained_on or 'ITS_DATA_DIR'} ...`)",
                )
            changed = checkpoints.load_initial_weights(self.init_from, self, saved)
        except UserError as error:  # the errors name the file, not the option that gave it
            raise ConfigError(f"model.init_from: {error}") from None
        rank_zero_info(f"model.init_from: network weights of {self.init_from}")
        if changed:
            rank_zero_info(
                "note: model.init_from: this run's model settings differ from the "
                f"checkpoint's: {', '.join(changed)}"
            )

    def _attached_trainer(self) -> L.Trainer | None:
        """The Trainer, or None when the module is not attached to one (the public
        property raises then)."""
        try:
            return self.trainer
        except RuntimeError:
            return None

    def check_data(self, datamodule: Any, evaluating: bool = False, resuming: bool = False) -> None:
        """Raise a clear error when the data does not fit the model (vocabulary, block
        size). ``cofr fit`` calls it before it creates a run folder or an MLflow run;
        ``evaluating``: the model is a checkpoint's (validate/test), so only the data can
        change; ``resuming``: a fit resumes a checkpoint, whose model it keeps, so the
        data is what changed since."""
        data_vocab = getattr(datamodule, "vocab_size", None)
        if data_vocab is not None and data_vocab > self.model_config.vocab_size and resuming:
            folder = getattr(datamodule, "data_dir", "the data folder")
            raise ConfigError(
                f"the data's tokenizer has {data_vocab} token ids but the resumed checkpoint's "
                f"model only {self.model_config.vocab_size}: {folder} is not tokenized as the "
                "data the run trained on (prepared again with another tokenizer?). Resume on "
                "that data (--data.data_dir), or start a new run"
            )
        if data_vocab is not None and data_vocab > self.model_config.vocab_size and evaluating:
            raise ConfigError(
                f"the data's tokenizer has {data_vocab} token ids but the checkpoint's model "
                f"only {self.model_config.vocab_size}: evaluate on data prepared with the "
                "model's tokenizer (--data.data_dir)"
            )
        if data_vocab is not None and data_vocab > self.model_config.vocab_size:
            raise ConfigError(
                f"the data's tokenizer has {data_vocab} token ids but the model's vocab_size is "
                f"{self.model_config.vocab_size}: set model.config.vocab_size: {data_vocab} (or "
                "more), or prepare the data with the tokenizer the model was made for"
            )
        block = getattr(datamodule, "block_size", None)
        if block is not None and block > self.model_config.block_size:
            fix = "" if evaluating or resuming else " or raise model.config.block_size"
            model = "the checkpoint's model" if evaluating or resuming else "the model"
            raise ConfigError(
                f"data.block_size={block} exceeds {model}'s block_size="
                f"{self.model_config.block_size}: lower data.block_size{fix}"
            )

    def configure_model(self) -> None:
        # Shapes as built: a strategy may wrap the model before the optimizer is made (FSDP
        # flattens and shards parameters); weight decay is decided by the dimensions, and
        # the optimizer groups' sizes in the log are those of whole parameters.
        self._built_shapes = {name: p.shape for name, p in self.model.named_parameters()}
        if self.compile_model and not self._model_compiled:
            allow_recompiles()
            self.model.compile()  # in place: state_dict keys stay free of "_orig_mod."
            self._model_compiled = True

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoints.check_denominators(checkpoint, self.model)
        checkpoint["state_dict"] = checkpoints.uncompiled(checkpoint.get("state_dict", {}))
        self.tokens_seen = int(checkpoint.get("tokens_seen", 0))
        self._spike_count = torch.tensor(int(checkpoint.get("grad_spikes", 0)))
        # The recent norms the spike test compares with: without them a resumed run
        # would count no spike for its first SPIKE_WINDOW steps.
        window = checkpoint.get("grad_norm_window")
        if window is not None and len(window) == SPIKE_WINDOW:
            self._grad_norms = torch.tensor(window, dtype=torch.float32)
            self._grad_norm_count = int(checkpoint.get("grad_norm_count", 0))
        self._grad_norm_max = torch.tensor(float(checkpoint.get("grad_norm_max", 0.0)))
        # Each batch's dropout masks follow from this seed and the batch's place alone,
        # so a resume draws the masks an uninterrupted run draws.
        self.dropout_seed = int(checkpoint.get("dropout_seed", self.dropout_seed))
        self._use_configured_learning_rate(checkpoint)
        self._say_other_accumulation(checkpoint.get("accumulate_grad_batches"))
        self._saved_plan = checkpoint.get("planned_steps")

    def _say_other_accumulation(self, saved: Any) -> None:
        """A resumed fit whose ``trainer.accumulate_grad_batches`` differs from the
        checkpoint's (``saved``; None for checkpoints from before it was kept) goes on, but
        its steps take another number of sequences: its curves by step change scale."""
        trainer = self._attached_trainer()
        if trainer is None or trainer.state.fn != "fit" or not isinstance(saved, int):
            return
        now = trainer.accumulate_grad_batches
        if now != saved:
            rank_zero_warn(
                f"trainer.accumulate_grad_batches {saved} -> {now} since the checkpoint: an "
                f"optimizer step now takes {now / saved:g}x the sequences, and the learning-"
                "rate schedule goes on by optimizer steps; curves by step are not comparable "
                "across this resume (plot them against data/tokens_seen)"
            )

    def _use_configured_learning_rate(self, checkpoint: dict[str, Any]) -> None:
        """The LR schedule's base is the config's ``lr``, not the checkpoint's: a resume
        with another ``--model.optimizer.lr`` applies it (every group starts from the one
        ``lr``; the optimizer's own groups follow in ``optim.keep_built_settings``)."""
        lr = self.optimizer_config.lr
        for scheduler in checkpoint.get("lr_schedulers") or []:
            old = scheduler.get("base_lrs")
            if not old:
                continue
            if any(base != lr for base in old):
                rank_zero_info(f"resume: learning rate {old[0]:g} -> {lr:g} (the config's)")
            last = scheduler.get("_last_lr") or []
            rescaled = [v * lr / b if b and b != lr else v for v, b in zip(last, old, strict=False)]
            scheduler["_last_lr"] = rescaled
            scheduler["base_lrs"] = [lr] * len(old)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["tokens_seen"] = self.tokens_seen
        checkpoint["grad_spikes"] = self.grad_spikes
        checkpoint["grad_norm_window"] = self._grad_norms.cpu().tolist()
        checkpoint["grad_norm_count"] = self._grad_norm_count
        checkpoint["grad_norm_max"] = self.grad_norm_max
        checkpoint["model_config"] = self.model_config.to_dict()
        checkpoint["dropout_seed"] = self.dropout_seed
        trainer = self._attached_trainer()
        if trainer is not None:  # a resume with another accumulation is said
            checkpoint["accumulate_grad_batches"] = trainer.accumulate_grad_batches
            # which validation was due at the checkpoint's step (cofr fit's resume note)
            checkpoint["batches_trained"] = batches_trained(trainer)
            if trainer.state.fn == "fit":  # the schedule's span, said if a resume changes it
                checkpoint["planned_steps"] = self.total_steps()
        # Whose checkpoint it is: a copy in another run's folder must not be scored as
        # that run's (pretrained.foreign_checkpoint).
        try:
            run_id = run_id_of(Path(self.trainer.default_root_dir))
        except RuntimeError:  # saved by hand, outside a fit
            return
        if run_id is not None:
            checkpoint["mlflow_run_id"] = run_id

    # ------------------------------------------------------------------------ steps

    def forward(self, idx: Tensor) -> Tensor:
        return self.model(idx)

    def _loss(self, batch: Tensor) -> tuple[Tensor, int]:
        inputs, targets = batch_to_xy(batch)
        logits = self.model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        return loss, targets.numel()

    def on_train_batch_start(self, batch: Tensor, batch_idx: int) -> None:
        torch.manual_seed(
            batch_seed(self.dropout_seed, self.global_rank, self.current_epoch, batch_idx)
        )

    def training_step(self, batch: Tensor, batch_idx: int) -> Tensor:
        loss, tokens = self._loss(batch)
        self.tokens_seen += tokens * self.trainer.world_size
        self._step_losses.append(loss.detach())  # train/loss: see on_before_optimizer_step
        self.log("data/tokens_seen", float(self.tokens_seen))
        self.log("opt/lr", self.optimizers().param_groups[0]["lr"])
        return loss * self._short_step_factor(batch_idx)

    def _short_step_factor(self, batch_idx: int) -> float:
        """accumulate / micro-batches for the micro-batches of an epoch's last step when it
        holds fewer than ``accumulate_grad_batches`` (else 1): Lightning divides each loss
        by the full count, so that step's gradient (its norm, the callbacks' ladder norms,
        its clipping and update) would shrink by micro-batches / accumulate."""
        accumulate, batches = (
            self.trainer.accumulate_grad_batches,
            self.trainer.num_training_batches,
        )
        if accumulate == 1 or not math.isfinite(batches):
            return 1.0
        micro_batches = min(accumulate, int(batches) - (batch_idx - batch_idx % accumulate))
        return accumulate / micro_batches

    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        super().optimizer_step(*args, **kwargs)
        # The step's compute ends here, before the callbacks' batch-end work (a periodic
        # checkpoint save), which is not training time.
        self._stepped_at = time.perf_counter()

    def on_train_batch_end(self, outputs: Any, batch: Tensor, batch_idx: int) -> None:
        # Wall time from the previous batch's end (its callbacks done) to this batch's
        # optimizer step: data loading included, checkpoint saves not, and the first
        # batch (warm-up, compilation) left out; the batch after a validation is timed from
        # that validation's end (on_validation_end).
        now = time.perf_counter()
        end, self._stepped_at = self._stepped_at or now, None
        previous, self._last_batch_end = self._last_batch_end, now
        if previous is None:
            return
        elapsed = end - previous
        tokens = (batch.shape[1] - 1) * batch.shape[0] * self.trainer.world_size
        rate = tokens / max(elapsed, 1e-9)
        self.log("perf/tokens_per_sec", rate, prog_bar=True)
        # Per device: the analytic training FLOPs of the tokens each device processed, at
        # the length trained (data.block_size may be shorter than the model's block).
        flops = self.flops_per_token(batch.shape[1] - 1)
        self.log("perf/flops_per_s", flops * rate / self.trainer.world_size)
        if self._peak is None:
            self._peak = RunPeak(self.device, self.trainer.precision)
        warned = self._peak.too_low
        step = self.trainer.global_step
        utilisation = self._peak.mfu(flops, rate, self.trainer.world_size, step)
        if self._peak.checked_at == step:  # measured again (~0.1 s): not the next step's time
            self._last_batch_end = time.perf_counter()
        if self._peak.too_low and not warned:
            rank_zero_warn(
                f"perf/mfu is {utilisation:.0%} at step {step}: this CPU's matmul peak, "
                "measured again, is below the rate the model's FLOPs count implies (other "
                "processes may hold its cores at times); read perf/mfu as approximate"
            )
        if utilisation is not None:
            self.log("perf/mfu", utilisation, prog_bar=True)

    def flops_per_token(self, seq_len: int) -> int:
        """Analytic training FLOPs per token of sequences of ``seq_len`` tokens (attention
        grows with the length)."""
        if seq_len not in self._flops_per_token:
            estimate = estimate_flops_per_token(self.model_config, seq_len)
            self._flops_per_token[seq_len] = estimate.training
        return self._flops_per_token[seq_len]

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self._step_losses:
            # The step's loss: the mean over its micro-batches (gradient accumulation) and
            # over the ranks, as its gradient is (each micro-batch's mean loss, scaled).
            mean = torch.stack(self._step_losses).mean()
            self._step_losses = []
            self.log("train/loss", mean, prog_bar=True, sync_dist=True)
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if sharded_gradients(self.trainer):  # every rank joins, with a shard or none
            square = grad_square_sum(self.parameters(), self.device)
            norm = summed_over_shards(self.trainer, square).sqrt()
        elif grads:
            norm = torch.nn.utils.get_total_norm(grads).detach()
        else:
            return
        self.log("opt/grad_norm", norm)
        self.log("opt/grad_spikes", self._record_grad_norm(norm).float())

    def _record_grad_norm(self, norm: Tensor) -> Tensor:
        """Take this step's pre-clip ``norm`` into the spike count and the largest norm;
        the spikes so far (0-d, on norm's device: no host sync per step)."""
        # fmax: a NaN norm (its step is skipped or stops the run) does not hide the others.
        self._grad_norm_max = torch.fmax(self._grad_norm_max.to(norm.device), norm.float())
        history = self._grad_norms.to(norm.device)
        if self._grad_norm_count >= SPIKE_WINDOW:
            spike = norm > SPIKE_FACTOR * history.nanmedian()
            self._spike_count = self._spike_count.to(norm.device) + spike
        history[self._grad_norm_count % SPIKE_WINDOW] = norm.float()
        self._grad_norms = history
        self._grad_norm_count += 1
        return self._spike_count

    @property
    def grad_spikes(self) -> int:
        """Gradient-norm spikes counted so far in this run (resumes included)."""
        return int(self._spike_count.item())

    @property
    def grad_norm_max(self) -> float:
        """The largest pre-clip gradient norm of this run so far (resumes included; 0
        before its first step)."""
        return float(self._grad_norm_max.item())

    def on_validation_start(self) -> None:
        # Validation time is no training time. Not before the first batch (the sanity
        # check): that batch's warm-up stays untimed.
        self._after_validation = self._last_batch_end is not None
        self._last_batch_end = None

    def validation_step(self, batch: Tensor, batch_idx: int) -> None:
        loss, tokens = self._loss(batch)
        self.val_loss.update(loss, weight=tokens)

    def on_validation_end(self) -> None:
        # After the callbacks' (a checkpoint saved on the score): the next batch is timed
        # from here, its data fetch in, as every other batch's is.
        if self._after_validation:
            self._last_batch_end, self._after_validation = time.perf_counter(), False

    def on_validation_epoch_end(self) -> None:
        value = self.val_loss.compute()  # summed over ranks already
        self._log_scores({"val/loss": value, "val/ppl": torch.exp(value)}, prog_bar="val/loss")
        self.val_loss.reset()

    def _log_scores(self, scores: dict[str, Tensor], prog_bar: str | None = None) -> None:
        """Scores of the weights after ``global_step`` optimizer steps, logged at that step:
        the checkpoint's and the sweep pruner's step, where Lightning would log them one
        step earlier, at the step of the last training loss. During a fit they go to the
        loggers directly: Lightning's ``step`` key would do it too, but would stay in the
        callback metrics, where ModelCheckpoint reads it as the step of every periodic
        checkpoint until the next validation (names and top-k order then lag behind).
        validate/test log through Lightning at the checkpoint's step."""
        fitting = self.trainer.state.fn == "fit"
        for name, value in scores.items():
            self.log(name, value, prog_bar=name == prog_bar, logger=not fitting)
        if fitting and self.trainer.is_global_zero and not self.trainer.sanity_checking:
            values = {name: float(value) for name, value in scores.items()}
            for logger in self.loggers:
                logger.log_metrics(values, step=self.global_step)

    def test_step(self, batch: Tensor, batch_idx: int) -> None:
        loss, tokens = self._loss(batch)
        self.test_loss.update(loss, weight=tokens)

    def on_test_epoch_end(self) -> None:
        value = self.test_loss.compute()
        self._log_scores({"test/loss": value, "test/ppl": torch.exp(value)})
        self.test_loss.reset()

    # -------------------------------------------------------------------- optimizer

    def total_steps(self) -> int:
        """The run's optimizer steps (:func:`cofrgenet.training.optim.planned_steps`)."""
        return planned_steps(self.trainer)

    def _release_plan(self) -> dict[int, int]:
        """{depth: release step} when a DyadicUnfreezing(lr="release") is on the trainer."""
        from cofrgenet.training.callbacks import DyadicUnfreezing

        trainer = self._attached_trainer()
        for callback in trainer.callbacks if trainer is not None else ():
            if isinstance(callback, DyadicUnfreezing) and callback.lr == "release":
                return callback.plan(self.trainer, self)
        return {}

    def on_train_start(self) -> None:
        """Set every group's learning rate for the step the run starts at.

        A resume with a larger ``max_steps`` took the checkpoint's rates, which followed
        the old schedule until the first scheduler step. Under FSDP the optimizer is built
        before the checkpoint restores DyadicUnfreezing's kept releases, so the depth
        groups followed the new plan's later ones: released depths trained at rate 0.
        This sets the rates a resume starts with; the rescales on load
        (``optim.keep_built_settings``, ``_use_configured_learning_rate``) agree on a plain
        resume and serve optimizers without this hook."""
        self._lr_releases = self._release_plan()
        for config in self.trainer.lr_scheduler_configs:
            scheduler = config.scheduler
            if isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
                before = [group["lr"] for group in scheduler.optimizer.param_groups]
                for group, base, factor in zip(
                    scheduler.optimizer.param_groups,
                    scheduler.base_lrs,
                    scheduler.lr_lambdas,
                    strict=True,
                ):
                    group["lr"] = base * factor(scheduler.last_epoch)
                self._say_other_plan(before[0], scheduler.optimizer.param_groups[0]["lr"])

    _saved_plan: int | None = None  # the steps the resumed checkpoint's schedule spanned

    def _say_other_plan(self, before: float, now: float) -> None:
        """A resume whose schedule spans other steps than its checkpoint's (a finished run
        trained further with a larger ``max_steps``) follows the new plan from here: its
        rate jumps, and its curves part from those of a run planned so from the start."""
        total, saved = self.total_steps(), self._saved_plan
        self._saved_plan = None  # said once (the first scheduler's rate)
        if saved is None or saved == total or total <= 0 or math.isclose(before, now):
            return  # within warm-up a longer plan changes no rate
        rank_zero_info(
            f"resume: the learning-rate schedule spans {total} steps now, not the "
            f"checkpoint's {saved}: the rate at step {self.trainer.global_step} goes "
            f"{before:.3g} -> {now:.3g} (steps so far followed the old plan, so the run "
            f"differs from one planned over {total} steps from its start)"
        )

    def configure_optimizers(self) -> dict[str, Any]:
        cfg = self.optimizer_config
        total = self.total_steps()
        releases = self._release_plan()
        depth_of = None
        if releases:
            depths = {
                id(p): k
                for layer in self.model.modules()
                if isinstance(layer, LadderLayer)
                for k, params in layer.ladder_parameters_by_depth().items()
                for p in params
            }
            depth_of = lambda p: depths.get(id(p), 0)  # noqa: E731
        if 0 < total < cfg.warmup_steps:
            # The debug trainer's 20 steps under the default 100-step warm-up: a run that
            # ends below its peak rate looks untrained, however good the model.
            rank_zero_warn(
                f"model.optimizer.warmup_steps ({cfg.warmup_steps}) is longer than the run's "
                f"{total} optimizer steps: the learning rate never reaches "
                f"model.optimizer.lr ({cfg.lr:g}) nor decays. Set "
                + (
                    f"model.optimizer.warmup_steps well below {total}"
                    if total > 4
                    else "model.optimizer.warmup_steps to 0"
                )
            )
        shapes = getattr(self, "_built_shapes", {})
        optimizer = build_adamw(
            self.model,
            cfg,
            depth_of,
            {name: len(shape) for name, shape in shapes.items()} or None,
            grad_scaler=scales_loss(self.trainer),
        )
        numels = {name: shape.numel() for name, shape in shapes.items()}
        rank_zero_info(
            "optimizer groups:\n  "
            + "\n  ".join(describe_groups(optimizer.param_groups, numels or None))
        )

        self._lr_releases = releases  # read at every step: on_train_start renews it

        def schedule_of(group: dict) -> Any:
            depth = group["depth"]

            def factor(step: int) -> float:
                release = self._lr_releases.get(depth, 0)
                if release == 0:
                    return warmup_cosine(step, total, cfg.warmup_steps, cfg.min_lr_ratio)
                return released_warmup_cosine(
                    step, release, total, cfg.warmup_steps, cfg.min_lr_ratio
                )

            return factor

        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, [schedule_of(group) for group in optimizer.param_groups]
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
