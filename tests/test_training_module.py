"""The Lightning module, optimizer, schedule and callbacks, on in-memory token batches."""

from __future__ import annotations

import copy
import itertools
import math
import subprocess
import sys
import warnings
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import Logger
from lightning.pytorch.strategies import SingleDeviceStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from cofrgenet.errors import ConfigError
from cofrgenet.models import estimate_flops_per_token
from cofrgenet.training import checkpoints
from cofrgenet.training.callbacks import (
    DyadicUnfreezing,
    LadderHealthMonitor,
    NonFiniteLossError,
    NonFiniteLossGuard,
    StopOnSignal,
    ladder_layers,
    release_step,
)
from cofrgenet.training.model_options import ModelOverrides
from cofrgenet.training.module import FIT_METRICS, SPIKE_WINDOW, LanguageModel, batch_seed
from cofrgenet.training.optim import (
    OptimizerConfig,
    describe_groups,
    param_groups,
    released_warmup_cosine,
    unwrapped_name,
    warmup_cosine,
)


def token_loader(
    n_batches: int = 64, batch: int = 4, length: int = 17, vocab: int = 256, seed: int = 0
):
    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, vocab, (n_batches * batch, length), generator=g)
    return DataLoader(
        TensorDataset(data),
        batch_size=batch,
        collate_fn=lambda rows: torch.stack([r[0] for r in rows]),
    )


def tiny_trainer(max_steps: int, callbacks=(), logger=False, **kwargs) -> L.Trainer:
    return L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=list(callbacks),
        **kwargs,
    )


def test_release_steps_of_both_schedules():
    assert [release_step(i, 800, "paper") for i in (1, 2, 3)] == [400, 600, 700]
    assert [release_step(i, 800, "early") for i in (1, 2, 3)] == [400, 200, 100]
    assert release_step(4, 800, "none") == 0
    with pytest.raises(ValueError, match="unknown dyadic schedule"):
        release_step(1, 10, "linear")


def test_warmup_cosine_shape():
    lrs = [warmup_cosine(s, 100, 10, 0.1) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[10] == pytest.approx(1.0) and lrs[-1] == pytest.approx(0.1, abs=1e-3)
    assert all(a >= b for a, b in itertools.pairwise(lrs[10:]))


def test_param_groups_decay_by_role():
    module = LanguageModel("gpt2-tiny-fa", config={"cffn_ladder": "elementwise"})
    groups = param_groups(module.model, 0.1)
    by_name = {g["name"]: g for g in groups}
    assert set(by_name) == {"decay", "no_decay"}
    decayed = set(by_name["decay"]["param_names"])
    kept = set(by_name["no_decay"]["param_names"])
    assert by_name["decay"]["weight_decay"] == 0.1 and by_name["no_decay"]["weight_decay"] == 0
    # Matrices decay; the elementwise Cffn's (L, p) ladder biases are matrices but must not.
    assert "transformer.h.0.mlp.linear.weight" in decayed
    assert "transformer.h.0.mlp.denominators.weight.0" in decayed
    assert "transformer.h.0.mlp.denominators.bias.0" in kept
    assert "transformer.h.0.attn.denominators.bias.0" in kept
    assert "transformer.h.0.ln_1.weight" in kept and "transformer.h.0.mlp.linear.bias" in kept
    assert all(p.dim() >= 2 for p in by_name["decay"]["params"])
    n_all = sum(1 for _ in module.model.parameters())
    assert len(decayed) + len(kept) == n_all
    lines = describe_groups(groups)
    assert lines[0].startswith("decay: weight_decay 0.1, ")
    assert "transformer.h.*.mlp.denominators.bias.*" in lines[1]
    # CAttnU's linear terms w0 (they start at 1) do not decay either.
    cattn_u = LanguageModel("gpt2-tiny-a", config={"attention": "cattn_u"})
    kept = next(g for g in param_groups(cattn_u.model, 0.1) if g["name"] == "no_decay")
    assert "transformer.h.0.attn.linear" in kept["param_names"]


def _touched(state: dict) -> bool:
    """Whether AdamW has stepped a parameter: its state (made up front at step 0 with zero
    moments, see ``materialise_adam_state``) moved."""
    if not state:
        return False
    return float(state["step"]) > 0 or bool(state["exp_avg"].abs().sum() > 0)


class Snapshots(L.Callback):
    """Ladder parameters (by depth) and the optimizer's state for them, after every step."""

    def __init__(self) -> None:
        self.values: list[dict[int, list[torch.Tensor]]] = []
        self.has_state: list[dict[int, bool]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        by_depth: dict[int, list[torch.Tensor]] = {}
        state: dict[int, bool] = {}
        optimizer = trainer.optimizers[0]
        for _, layer in ladder_layers(pl_module):
            for depth, params in layer.ladder_parameters_by_depth().items():
                by_depth.setdefault(depth, []).extend(p.detach().clone() for p in params)
                state[depth] = state.get(depth, False) or any(
                    _touched(optimizer.state.get(p, {})) for p in params
                )
        self.values.append(by_depth)
        self.has_state.append(state)


@pytest.mark.parametrize("schedule", ["paper", "early"])
def test_dyadic_unfreezing_freezes_bit_for_bit(schedule):
    torch.manual_seed(0)
    total = 16
    module = LanguageModel(
        "gpt2-tiny-f", config={"depth": 3}, optimizer=OptimizerConfig(lr=1e-2, warmup_steps=0)
    )
    initial = {d: [p.detach().clone() for p in ps] for d, ps in _by_depth(module).items()}
    snaps = Snapshots()
    tiny_trainer(total, [DyadicUnfreezing(schedule), snaps]).fit(module, token_loader())
    releases = {d: release_step(d, total, schedule) for d in (1, 2, 3)}
    for depth, release in releases.items():
        for step, values in enumerate(snaps.values):  # values after optimizer step `step`
            same = all(
                torch.equal(a, b) for a, b in zip(values[depth], initial[depth], strict=True)
            )
            if step < release:
                assert same, f"depth {depth} moved at step {step}, before its release {release}"
                assert not snaps.has_state[step][depth], "AdamW moved a frozen depth's moments"
            else:
                assert not same, f"depth {depth} did not train after its release {release}"
    # Linear (depth-0) parameters train from the start.
    assert not torch.equal(module.model.transformer.h[0].mlp.linear.weight, _fresh_linear())


def test_a_depth_released_at_the_runs_end_is_said_never_to_train():
    """4 steps and depth 3: the paper's schedule releases depth 3 at step ceil(4 * 7/8) =
    4, after the last step (3): it stayed at initialisation, unsaid."""
    from cofrgenet.training.callbacks import never_trained

    assert never_trained({1: 2, 2: 3, 3: 4}, 4, "paper") == (
        "DyadicUnfreezing: ladder depth 3 is released at or after the run's last step "
        "(4 steps): never trained, it stays at initialisation. Raise trainer.max_steps "
        "(at least 8 steps for depth 3), or lower model.config.depth"
    )
    assert never_trained({1: 4, 2: 6, 3: 7}, 8, "paper") is None
    module = LanguageModel("gpt2-tiny-f", config={"depth": 3})
    with pytest.warns(UserWarning, match=r"ladder depth 3 is released at or after"):
        tiny_trainer(4, [DyadicUnfreezing("paper")]).fit(module, token_loader())


def _by_depth(module: LanguageModel) -> dict[int, list[torch.nn.Parameter]]:
    out: dict[int, list] = {}
    for _, layer in ladder_layers(module):
        for depth, params in layer.ladder_parameters_by_depth().items():
            out.setdefault(depth, []).extend(params)
    return out


def _fresh_linear() -> torch.Tensor:
    torch.manual_seed(0)
    return (
        LanguageModel("gpt2-tiny-f", config={"depth": 3}).model.transformer.h[0].mlp.linear.weight
    )


def test_an_epoch_limit_before_max_steps_sets_the_schedules_length():
    """max_steps 100, but one epoch of 10 batches with accumulation 2 ends the run after 5
    optimizer steps: the depths are released and the learning rate reaches its floor
    within those 5, not on a 100-step plan the run never reaches."""
    torch.manual_seed(0)
    config = OptimizerConfig(lr=1e-2, warmup_steps=0, min_lr_ratio=0.1)
    module = LanguageModel("gpt2-tiny-f", config={"depth": 2}, optimizer=config)
    dyadic = DyadicUnfreezing("paper")
    lrs = []

    class LearningRates(L.Callback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
            lrs.append(optimizer.param_groups[0]["lr"])

    trainer = tiny_trainer(
        100, [dyadic, LearningRates()], max_epochs=1, limit_train_batches=10,
        accumulate_grad_batches=2,
    )  # fmt: skip
    trainer.fit(module, token_loader())
    assert trainer.global_step == 5 and module.total_steps() == 5
    assert dyadic._releases == {1: release_step(1, 5, "paper"), 2: release_step(2, 5, "paper")}
    assert lrs[0] == pytest.approx(1e-2) and lrs[-1] < 0.2e-2  # near the 1e-3 floor


def test_a_warm_up_as_long_as_the_run_is_warned_of():
    """cpu-debug's 20 steps under the default 100-step warm-up never reach the peak rate:
    said once at the start, and not for a warm-up shorter than the run."""
    module = LanguageModel("gpt2-tiny", optimizer=OptimizerConfig(warmup_steps=100))
    # A key to set (a --flag in cofr fit, a YAML key or a sweep override), and for a run of a
    # few steps a value that can be (it said "N well below 1" for a 1-step sweep trial).
    with pytest.warns(UserWarning, match=r"warmup_steps \(100\) is longer than the run's 4 "
                      r".*Set model\.optimizer\.warmup_steps to 0$"):  # fmt: skip
        tiny_trainer(4).fit(module, token_loader())
    module = LanguageModel("gpt2-tiny", optimizer=OptimizerConfig(warmup_steps=100))
    with pytest.warns(UserWarning, match=r"Set model\.optimizer\.warmup_steps well below 6$"):
        tiny_trainer(6).fit(module, token_loader())
    module = LanguageModel("gpt2-tiny", optimizer=OptimizerConfig(warmup_steps=4))  # peaks last
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*warmup_steps")
        tiny_trainer(4).fit(module, token_loader())


def test_dyadic_unfreezing_is_a_function_of_the_global_step():
    module = LanguageModel("gpt2-tiny-f", config={"depth": 2})
    callback = DyadicUnfreezing("paper", total_steps=100)
    callback._releases = callback.release_steps(module, 100)
    callback.apply(module, 60)
    by_depth = _by_depth(module)
    assert all(p.requires_grad for p in by_depth[1]) and not any(
        p.requires_grad for p in by_depth[2]
    )
    callback.apply(module, 75)
    assert all(p.requires_grad for p in by_depth[2])


def test_a_resume_with_more_steps_never_freezes_a_released_depth_again(tmp_path):
    """8 steps release depth 1 at 4 and depth 2 at 6; resumed to 16 steps, whose plan
    would release them at 8 and 12, both keep training from where they were."""
    torch.manual_seed(0)
    module = LanguageModel("gpt2-tiny-f", config={"depth": 2})
    first = DyadicUnfreezing("paper")
    trainer = tiny_trainer(8, [first])
    trainer.fit(module, token_loader())
    assert first._releases == {1: 4, 2: 6}
    trainer.save_checkpoint(tmp_path / "step8.ckpt")

    seen: list[bool] = []

    class Depth2Trains(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            seen.append(all(p.requires_grad for p in _by_depth(pl_module)[2]))

    resumed = DyadicUnfreezing("paper")
    module = LanguageModel("gpt2-tiny-f", config={"depth": 2})
    tiny_trainer(16, [resumed, Depth2Trains()]).fit(
        module, token_loader(), ckpt_path=tmp_path / "step8.ckpt"
    )
    assert resumed._releases == {1: 4, 2: 6} and seen == [True] * 8
    # A fresh run of 16 steps still follows its own plan.
    fresh = DyadicUnfreezing("paper")
    tiny_trainer(16, [fresh]).fit(LanguageModel("gpt2-tiny-f", config={"depth": 2}), token_loader())
    assert fresh._releases == {1: 8, 2: 12}


def test_a_depth_released_before_the_resume_keeps_its_release_in_any_new_plan():
    """16 steps released depth 1 at 8 and depth 2 at 12; resumed at 16 to 24 steps,
    whose plan says 12 and 18. Depth 2 kept its 12, but depth 1 took the new 12, the
    step its lr group's schedule then restarted at (lr="release"), though it had
    trained since 8: a kept release was kept only where the new one lay ahead."""
    module = LanguageModel("gpt2-tiny-f", config={"depth": 2}).model
    unfreezing = DyadicUnfreezing("paper", total_steps=24)
    assert unfreezing.release_steps(module, 24) == {1: 12, 2: 18}
    unfreezing.load_state_dict({"releases": {1: 8, 2: 12}, "step": 16})
    assert unfreezing.plan(None, module) == {1: 8, 2: 12}
    # Not released by the checkpoint: the new plan's.
    unfreezing.load_state_dict({"releases": {1: 8, 2: 12}, "step": 10})
    assert unfreezing.plan(None, module) == {1: 8, 2: 18}
    # Unless a shorter run's plan puts it before the resume (12 steps: depth 2 at 9, with
    # the checkpoint's last step 9): it is released at the first step trained, 10, not
    # said to have trained from 9, where it was frozen.
    shorter = DyadicUnfreezing("paper", total_steps=12)
    assert shorter.release_steps(module, 12) == {1: 6, 2: 9}
    shorter.load_state_dict({"releases": {1: 8, 2: 12}, "step": 9})
    assert shorter.plan(None, module) == {1: 8, 2: 10}


class RestoredAfterSetup(SingleDeviceStrategy):
    """FSDP's order on one CPU: the optimizer is built before the checkpoint is restored."""

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        return True


@pytest.mark.parametrize("strategy", ["auto", "restored-after-setup"])
def test_a_resume_with_more_steps_keeps_the_released_depths_learning_rates(tmp_path, strategy):
    """lr="release", 8 steps: depth 1 released at 4, depth 2 at 6. Resumed to 16 steps,
    whose own plan says 8 and 12, every group follows the kept releases and the 16-step
    schedule from the first resumed step on (under FSDP's restore order too)."""
    optimizer = OptimizerConfig(lr=1e-3, warmup_steps=2, min_lr_ratio=0.1)

    def module() -> LanguageModel:
        return LanguageModel("gpt2-tiny-f", config={"depth": 2}, optimizer=optimizer)

    torch.manual_seed(0)
    trainer = tiny_trainer(8, [DyadicUnfreezing("paper", lr="release")])
    trainer.fit(module(), token_loader())
    trainer.save_checkpoint(tmp_path / "step8.ckpt")

    lrs: dict[int, dict[str, float]] = {}

    class Lrs(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            groups = trainer.optimizers[0].param_groups
            lrs[trainer.global_step] = {g["name"]: g["lr"] for g in groups}

    resumed = tiny_trainer(
        16,
        [DyadicUnfreezing("paper", lr="release"), Lrs()],
        strategy="auto" if strategy == "auto" else RestoredAfterSetup(torch.device("cpu")),
    )
    # Lightning loads weights_only after setup whatever fit is told; the config is a class.
    with torch.serialization.safe_globals([OptimizerConfig]):
        resumed.fit(module(), token_loader(), ckpt_path=tmp_path / "step8.ckpt")
    assert sorted(lrs) == list(range(8, 16))
    for step, rates in lrs.items():
        run = warmup_cosine(step, 16, 2, 0.1)
        assert rates["decay"] == pytest.approx(1e-3 * run), step
        for depth, release in ((1, 4), (2, 6)):
            expected = 1e-3 * released_warmup_cosine(step, release, 16, 2, 0.1)
            assert rates[f"decay/depth_{depth}"] == pytest.approx(expected), (step, depth)


class Recorder(L.Callback):
    def __init__(self) -> None:
        self.metrics: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.metrics.append({k: float(v) for k, v in trainer.callback_metrics.items()})


class RecordingLogger(Logger):
    """What a logger receives: (step, metrics) pairs."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.records.append((step, dict(metrics)))

    def steps_of(self, key: str) -> list[int]:
        return [step for step, metrics in self.records if key in metrics]


def test_flops_and_mfu_count_the_sequence_length_trained():
    """Sequences of 16 tokens on a model of block 64: attention FLOPs at 16, not 64."""
    torch.manual_seed(0)
    module = LanguageModel("gpt2-tiny", config={"block_size": 64})
    recorder = Recorder()
    tiny_trainer(4, [recorder], log_every_n_steps=1).fit(module, token_loader(length=17))
    logged = [m for m in recorder.metrics if "perf/flops_per_s" in m]
    assert logged
    at_16 = estimate_flops_per_token(module.model_config, 16).training
    assert at_16 < estimate_flops_per_token(module.model_config, 64).training
    for metrics in logged:
        per_token = metrics["perf/flops_per_s"] / metrics["perf/tokens_per_sec"]
        assert per_token == pytest.approx(at_16)


def test_throughput_is_measured_at_every_step_but_the_first_and_scores_at_their_step():
    """A validation breaks the batch-to-batch timing: the next batch is timed from the
    validation's end (else Lightning would log the previous rate again). val/* are logged at the
    step their weights reached: after 2 steps at 2."""
    torch.manual_seed(0)
    logger = RecordingLogger()
    trainer = tiny_trainer(6, logger=logger, log_every_n_steps=1, val_check_interval=2)
    trainer.fit(LanguageModel("gpt2-tiny"), token_loader(), token_loader(n_batches=2))
    assert logger.steps_of("perf/tokens_per_sec") == [1, 2, 3, 4, 5]
    rates = [m["perf/tokens_per_sec"] for _, m in logger.records if "perf/tokens_per_sec" in m]
    assert len(set(rates)) == len(rates), rates  # each step's own
    assert logger.steps_of("val/loss") == [2, 4, 6]


def test_a_checkpoint_save_is_not_counted_as_training_time(monkeypatch):
    """A callback's batch-end work (a periodic save: 13k against 21k tok/s at every
    checkpoint step) ran inside the timed interval; on a fake clock a 100 s "save" at one
    step leaves every rate at the clock's pace."""
    import cofrgenet.training.module as module_file

    clock = [0.0]

    def perf_counter() -> float:
        clock[0] += 0.001
        return clock[0]

    class SlowSave(L.Callback):
        def on_train_batch_end(self, trainer, *args) -> None:
            if trainer.global_step == 3:
                clock[0] += 100.0

    monkeypatch.setattr(module_file, "time", SimpleNamespace(perf_counter=perf_counter))
    torch.manual_seed(0)
    logger = RecordingLogger()
    trainer = tiny_trainer(6, [SlowSave()], logger=logger, log_every_n_steps=1)
    trainer.fit(LanguageModel("gpt2-tiny"), token_loader())
    rates = [m["perf/tokens_per_sec"] for _, m in logger.records if "perf/tokens_per_sec" in m]
    assert len(rates) == 5 and min(rates) > 4 * 16 / 1.0, rates  # no 100 s step


def test_the_step_after_a_validation_is_timed_as_the_others(monkeypatch):
    """It was timed from its own start, its data fetch (and the work after the previous
    step) left out: about twice the others' rate at every validation. On a fake clock
    where each batch's fetch takes 1 s, every rate is the fetch's pace."""
    import cofrgenet.training.module as module_file

    clock = [0.0]

    def perf_counter() -> float:
        clock[0] += 0.001
        return clock[0]

    class SlowFetch(torch.utils.data.IterableDataset):
        def __iter__(self):
            for batch in token_loader():
                clock[0] += 1.0
                yield batch

    monkeypatch.setattr(module_file, "time", SimpleNamespace(perf_counter=perf_counter))
    torch.manual_seed(0)
    logger = RecordingLogger()
    trainer = tiny_trainer(6, logger=logger, log_every_n_steps=1, val_check_interval=2)
    train = DataLoader(SlowFetch(), batch_size=None)
    trainer.fit(LanguageModel("gpt2-tiny"), train, token_loader(n_batches=2))
    rates = [m["perf/tokens_per_sec"] for _, m in logger.records if "perf/tokens_per_sec" in m]
    assert len(rates) == 5 and max(rates) < 4 * 16 / 1.0, rates  # 64 tokens a fetch


def test_training_logs_and_health_at_the_steps_measured():
    torch.manual_seed(0)
    module = LanguageModel("gpt2-tiny-fa", optimizer=OptimizerConfig(warmup_steps=2))
    recorder, logger = Recorder(), RecordingLogger()
    tiny_trainer(7, [LadderHealthMonitor(every_n_steps=3), recorder], log_every_n_steps=1).fit(
        module, token_loader()
    )
    # the Lightning-logged metrics
    keys = set().union(*recorder.metrics)
    for key in ("train/loss", "opt/lr", "opt/grad_norm", "opt/grad_spikes", "data/tokens_seen"):
        assert key in keys, key
    # What a callback may monitor (cofr fit refuses other names at start): all of them.
    assert keys <= set(FIT_METRICS), keys - set(FIT_METRICS)
    assert module.tokens_seen == 7 * 4 * 16
    # ladder health: written for steps 0, 3, 6 only, every key each time
    trainer = tiny_trainer(
        7, [LadderHealthMonitor(every_n_steps=3)], log_every_n_steps=1, logger=logger
    )
    torch.manual_seed(0)
    trainer.fit(LanguageModel("gpt2-tiny-fa"), token_loader())
    for key in (
        "ladder/cffn/near_pole_share",
        "ladder/cffn/clamped_share",
        "ladder/cffn/min_abs_kd",
        "ladder/cffn/max_abs_z",
        "ladder/cattnm/near_pole_share",
        "ladder/grad_norm/depth_1",
        "ladder/grad_share",
    ):
        assert logger.steps_of(key) == [0, 3, 6], key
    assert logger.steps_of("train/loss") == list(range(7))
    health = [m for _, m in logger.records if "ladder/grad_share" in m]
    assert all(0 < m["ladder/grad_share"] < 1 for m in health)
    assert all(m["ladder/cffn/near_pole_share"] == 0.0 for m in health)  # positive: no poles
    assert all(0 < m["ladder/cffn/max_abs_z"] <= 2.0 for m in health)


def test_with_accumulation_each_step_logs_once_its_mean_loss_and_health():
    """accumulate_grad_batches 2: train/loss is the mean of the step's two micro-batch
    losses (not the last one's), and the ladder health is written once per due step, at
    that step (not also at the previous step, from the first micro-batch)."""
    torch.manual_seed(0)
    losses: list[float] = []

    class MicroLosses(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            losses.append(float(outputs["loss"]) * 2)  # Lightning scales it by 1/accumulation

    logger = RecordingLogger()
    trainer = tiny_trainer(
        4, [LadderHealthMonitor(every_n_steps=2), MicroLosses()], log_every_n_steps=1,
        logger=logger, accumulate_grad_batches=2,
    )  # fmt: skip
    trainer.fit(LanguageModel("gpt2-tiny-fa"), token_loader())
    assert logger.steps_of("train/loss") == [0, 1, 2, 3]
    logged = [m["train/loss"] for _, m in logger.records if "train/loss" in m]
    means = [(a + b) / 2 for a, b in zip(losses[::2], losses[1::2], strict=True)]
    assert logged == pytest.approx(means, rel=1e-6)
    for key in ("ladder/cffn/min_abs_kd", "ladder/grad_share"):
        assert logger.steps_of(key) == [0, 2], key


def test_an_epochs_short_last_step_gets_the_mean_loss_gradient():
    """15 batches with accumulation 2: the epoch's 8th step has one micro-batch, whose
    loss Lightning still divides by 2. Its gradient is the mean loss's all the same."""
    torch.manual_seed(0)
    module = LanguageModel("gpt2-tiny-f", config={"vocab_size": 256, "block_size": 16})
    loader = token_loader(n_batches=15)
    last_batch = list(loader)[-1]
    before: list[LanguageModel] = []
    grads: list[list[torch.Tensor]] = []

    class LastStep(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            if batch_idx == 14:
                before.append(copy.deepcopy(pl_module))

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            if batch_idx == 14:  # the step's gradients are zeroed only before the next one
                grads.append([p.grad.clone() for p in pl_module.parameters()])

    trainer = tiny_trainer(100, [LastStep()], max_epochs=1, accumulate_grad_batches=2)
    trainer.fit(module, loader)
    assert trainer.global_step == 8
    reference = before[0]
    reference._loss(last_batch)[0].backward()
    for ours, theirs in zip(grads[0], reference.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs.grad)


def test_gradient_spikes_are_counted_against_the_recent_median():
    module = LanguageModel("gpt2-tiny")
    norms = [1.0] * SPIKE_WINDOW + [9.0, 11.0, 1.0, 30.0]
    counts = [int(module._record_grad_norm(torch.tensor(n))) for n in norms]
    assert counts[: SPIKE_WINDOW + 1] == [0] * (
        SPIKE_WINDOW + 1
    )  # full window first; 9x is no spike
    assert counts[SPIKE_WINDOW + 1 :] == [1, 1, 2]
    assert module.grad_spikes == 2 and module.grad_norm_max == 30.0
    checkpoint: dict = {}
    module.on_save_checkpoint(checkpoint)
    resumed = LanguageModel("gpt2-tiny")
    resumed.on_load_checkpoint(checkpoint)
    assert resumed.grad_spikes == 2
    # So does the largest norm (a resumed bench run reports its whole run's).
    assert resumed.grad_norm_max == 30.0
    resumed._record_grad_norm(torch.tensor(float("nan")))
    assert resumed.grad_norm_max == 30.0
    # The window of recent norms resumes too: the next spike counts at once.
    assert int(resumed._record_grad_norm(torch.tensor(50.0))) == 3


def test_released_depths_get_a_schedule_of_their_own():
    assert released_warmup_cosine(59, 60, 100, 20, 0.1) == 0.0
    # warmup capped at a quarter of the 40-step window: 10 steps, then cosine to the floor
    assert released_warmup_cosine(60, 60, 100, 20, 0.1) == pytest.approx(0.1)
    assert released_warmup_cosine(69, 60, 100, 20, 0.1) == pytest.approx(1.0)
    assert released_warmup_cosine(99, 60, 100, 20, 0.1) == pytest.approx(0.1, abs=0.01)

    class Lrs(L.Callback):
        def __init__(self) -> None:
            self.lrs: list[dict[str, float]] = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            groups = trainer.optimizers[0].param_groups
            self.lrs.append({g["name"]: g["lr"] for g in groups})

    torch.manual_seed(0)
    module = LanguageModel(
        "gpt2-tiny-f", config={"depth": 2}, optimizer=OptimizerConfig(lr=1e-3, warmup_steps=4)
    )
    lrs = Lrs()
    tiny_trainer(16, [DyadicUnfreezing("paper", lr="release"), lrs]).fit(module, token_loader())
    names = set(lrs.lrs[0])
    assert {"decay", "no_decay", "decay/depth_1", "no_decay/depth_1", "decay/depth_2"} <= names
    depth_1 = [step["decay/depth_1"] for step in lrs.lrs]  # released at step 8
    assert depth_1[:8] == [0.0] * 8
    assert depth_1[8] == pytest.approx(1e-3 / 2) and depth_1[9] == pytest.approx(1e-3)
    assert lrs.lrs[9]["decay"] < 1e-3  # the run's own schedule is already decaying
    # With lr="global" there is no depth group: every depth follows the run's schedule.
    module = LanguageModel("gpt2-tiny-f", config={"depth": 2})
    lrs = Lrs()
    tiny_trainer(4, [DyadicUnfreezing("paper"), lrs]).fit(module, token_loader())
    assert set(lrs.lrs[0]) == {"decay", "no_decay"}


def test_loss_falls_on_a_single_batch():
    torch.manual_seed(0)
    batch = next(iter(token_loader(1)))
    loader = DataLoader([batch] * 40, batch_size=None)
    module = LanguageModel(
        "gpt2-tiny-f", optimizer=OptimizerConfig(lr=3e-3, warmup_steps=0, min_lr_ratio=1.0)
    )
    start = module._loss(batch)[0].item()
    tiny_trainer(40).fit(module, loader)
    assert module._loss(batch)[0].item() < 0.6 * start


def test_non_finite_loss_saves_then_stops(tmp_path):
    module = LanguageModel("gpt2-tiny")

    class Poison(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step == 2:
                with torch.no_grad():
                    pl_module.model.lm_head.weight.fill_(math.nan)

    trainer = tiny_trainer(10, [Poison(), NonFiniteLossGuard()], default_root_dir=tmp_path)
    with pytest.raises(NonFiniteLossError) as raised:
        trainer.fit(module, token_loader())
    saved = list((tmp_path / "checkpoints").glob("nonfinite-step*.ckpt"))
    assert len(saved) == 1 and "step0000002" in saved[0].name
    # Advice for this run: no ladders, no logger, no clipping here.
    assert str(raised.value).endswith(
        f"Remedies: a lower model.optimizer.lr or more model.optimizer.warmup_steps, gradient "
        f"clipping (trainer.gradient_clip_val: 1.0). Then start a new run (another --run.name), "
        f"from scratch or from --ckpt_path {saved[0]}."
    )


def test_non_finite_loss_advice_fits_the_run():
    """It advised ladder health in MLflow, positive denominators, clipping and
    ladder_bias to every run: one without ladders, without MLflow, clipping already,
    positive by default."""
    from types import SimpleNamespace

    from cofrgenet.training.callbacks import nonfinite_advice

    logged_and_clipped = SimpleNamespace(loggers=[object()], gradient_clip_val=1.0)
    ladders = LanguageModel("gpt2-tiny-f")  # positive denominators, ladder biases
    assert nonfinite_advice(logged_and_clipped, ladders) == (
        "Look at ladder health first: ladder/*/near_pole_share and ladder/*/min_abs_kd "
        "(LadderHealthMonitor, in the run's logged metrics) show whether ladders sit on "
        "poles. Remedies: a lower model.optimizer.lr or more model.optimizer.warmup_steps."
    )
    paper = LanguageModel(
        "gpt2-tiny-f", config=ModelOverrides(ladder_denominators="paper", ladder_bias=False)
    )
    unlogged = SimpleNamespace(loggers=[], gradient_clip_val=None)
    # ladder_bias unset follows bias: no biases there either.
    unbiased = LanguageModel("gpt2-tiny-f", config=ModelOverrides(bias=False))
    assert "model.config.ladder_bias: true" in nonfinite_advice(unlogged, unbiased)
    assert nonfinite_advice(unlogged, paper) == (
        "Remedies: model.config.ladder_denominators: positive (no poles), "
        "model.config.ladder_bias: true, a lower model.optimizer.lr or more "
        "model.optimizer.warmup_steps, gradient clipping (trainer.gradient_clip_val: 1.0)."
    )


def test_vocab_mismatch_fails_fast():
    class Data(L.LightningDataModule):
        vocab_size = 50257
        block_size = 16

        def train_dataloader(self):
            return token_loader()

    with pytest.raises(ValueError, match="vocab_size"):
        tiny_trainer(1).fit(LanguageModel("gpt2-tiny"), datamodule=Data())


def test_checkpoints_load_whether_or_not_compiled(tmp_path):
    """Through Lightning and through restore_model (cofr generate, evaluation), alike."""
    # A CLI run's checkpoint keeps every ModelOverrides field, the unset ones as None.
    config = {name: None for name in ModelOverrides.__dataclass_fields__} | {"vocab_size": 256}
    module = LanguageModel("gpt2-tiny-f", config=config)
    trainer = tiny_trainer(1, default_root_dir=tmp_path)
    trainer.fit(module, token_loader(1))
    path = tmp_path / "plain.ckpt"
    trainer.save_checkpoint(path)
    ckpt = torch.load(path, weights_only=False)
    # A checkpoint written by a wrapped (torch.compile'd) model carries "_orig_mod." keys.
    ckpt["state_dict"] = {
        k.replace("model.", "model._orig_mod.", 1): v for k, v in ckpt["state_dict"].items()
    }
    wrapped = tmp_path / "wrapped.ckpt"
    torch.save(ckpt, wrapped)
    module.eval()
    ids = torch.randint(0, 256, (2, 16))
    for p in (path, wrapped):
        loaded = LanguageModel.load_from_checkpoint(p)
        restored, restored_config = checkpoints.restore_model(checkpoints.load(p))
        assert restored_config == module.model_config
        for model in (loaded.model, restored):
            state = model.state_dict()
            assert state.keys() == module.model.state_dict().keys()
            for key, value in module.model.state_dict().items():  # output ranges included
                assert torch.equal(state[key], value), key
        assert torch.equal(restored.eval()(ids), module(ids))
    compiled = LanguageModel("gpt2-tiny-f", config=config, compile=True)
    compiled.configure_model()
    assert set(compiled.state_dict()) == set(module.state_dict())


def test_a_compiled_model_may_recompile_for_each_ladder_state(monkeypatch):
    """Dynamo's default limit (8 graphs) was passed within 20 steps of ddp.yaml with
    dyadic unfreezing (a graph per requires_grad state, grad mode, health recording):
    the later releases then ran uncompiled."""
    import torch._dynamo

    monkeypatch.setattr(torch.compiler.config, "recompile_limit", 8)
    LanguageModel("gpt2-tiny-f", compile=True).configure_model()
    assert torch.compiler.config.recompile_limit >= 2 * 2 * 6 + 4  # d = 5: 6 states


def test_each_process_silences_the_known_noise_at_setup(monkeypatch):
    """A ddp_spawn rank does not inherit the CLI's warning filters: every known-harmless
    warning printed again, once per rank."""
    module = LanguageModel("gpt2-tiny-f")
    monkeypatch.setattr(module, "_attached_trainer", lambda: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # a fresh process's filters
        module.setup("fit")
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated", stacklevel=1)
    assert not caught


def test_model_compile_under_fsdp_is_refused_before_it_compiles(monkeypatch):
    """Compiled before FSDP shards it, the model failed at its first backward
    ("a gradient of size [n] to a tensor of size [2n]"), minutes of compiling in."""
    from cofrgenet.training.strategies import LadderFSDPStrategy

    module = LanguageModel("gpt2-tiny-f", compile=False)
    trainer = SimpleNamespace(strategy=LadderFSDPStrategy(), datamodule=None)
    monkeypatch.setattr(module, "_attached_trainer", lambda: trainer)
    module.setup("fit")  # not compiled: nothing to refuse
    module = LanguageModel("gpt2-tiny-f", compile=True)
    monkeypatch.setattr(module, "_attached_trainer", lambda: trainer)
    with pytest.raises(ConfigError, match=r"model\.compile does not work under FSDP"):
        module.setup("fit")


@pytest.mark.parametrize(
    "preset", ["lstm-tiny", "gru-tiny", "rnn-tiny", "llama3-tiny-fa", "gpt2-tiny-a"]
)
def test_every_architecture_trains_through_the_module(preset):
    """Baselines go through the same Lightning module: a few steps, a finite, falling loss."""
    torch.manual_seed(0)
    batch = next(iter(token_loader(1)))
    loader = DataLoader([batch] * 8, batch_size=None)
    module = LanguageModel(
        preset, config={"vocab_size": 256}, optimizer=OptimizerConfig(lr=3e-3, warmup_steps=0)
    )
    start = module._loss(batch)[0].item()
    tiny_trainer(8).fit(module, loader)
    end = module._loss(batch)[0].item()
    assert math.isfinite(end) and end < start


def test_dyadic_unfreezing_refuses_ddp_that_expects_every_gradient(tmp_path):
    """Checked on the model as the DDP strategy wrapped it (one gloo process)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    def start(wrapped: nn.Module) -> None:
        trainer = SimpleNamespace(
            strategy=SimpleNamespace(model=wrapped),
            max_steps=10,
            estimated_stepping_batches=10,
            global_step=0,
        )
        DyadicUnfreezing().on_train_start(trainer, wrapped)

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        with pytest.raises(ConfigError, match="ddp_find_unused_parameters_true"):
            start(DistributedDataParallel(nn.Linear(2, 2)))
        start(DistributedDataParallel(nn.Linear(2, 2), find_unused_parameters=True))
    finally:
        dist.destroy_process_group()
    start(nn.Linear(2, 2))  # no DDP: nothing to check


def test_restore_model_says_what_is_wrong_with_a_checkpoint():
    module = LanguageModel("gpt2-tiny-f")
    checkpoint: dict = {
        "state_dict": {"model." + k: v for k, v in module.model.state_dict().items()}
    }
    with pytest.raises(checkpoints.CheckpointError, match="not written by cofr fit"):
        checkpoints.restore_model(checkpoint)
    checkpoint["hyper_parameters"] = {"preset": "gpt2-tiny-f", "config": None}
    module.on_save_checkpoint(checkpoint)
    checkpoints.restore_model(checkpoint)
    del checkpoint["model_config"]["ladder_denominators"]  # before positive denominators
    with pytest.raises(ConfigError, match="ladder_denominators: paper"):
        checkpoints.restore_model(checkpoint)
    checkpoint["state_dict"]["model.extra"] = torch.zeros(1)
    checkpoint["model_config"]["ladder_denominators"] = "positive"
    with pytest.raises(checkpoints.CheckpointError, match=r"do not fit .*Unexpected key"):
        checkpoints.restore_model(checkpoint)  # strict, as Lightning loads; one line


def test_a_checkpoint_is_rebuilt_as_it_trained_after_its_preset_changed(monkeypatch):
    """cofr generate, eval and export rebuilt a checkpoint from its preset as it reads
    today: a preset with another layer count failed with a page of state_dict keys, a
    changed default (ladder_floor) loaded and computed another function without a word."""
    from cofrgenet.models import presets

    module = LanguageModel("gpt2-tiny-f", config={"ladder_floor": 0.25})
    checkpoint: dict = {
        "state_dict": {"model." + k: v for k, v in module.model.state_dict().items()},
        "hyper_parameters": {"preset": "gpt2-tiny-f", "config": None},
    }
    module.on_save_checkpoint(checkpoint)
    checkpoint["hyper_parameters"]["config"] = {"ladder_floor": None}  # as if the default
    changed = dict(presets.PRESETS["gpt2-tiny-f"], n_layer=3)
    monkeypatch.setitem(presets.PRESETS, "gpt2-tiny-f", changed)
    restored, config = checkpoints.restore_model(checkpoint)
    assert config == module.model_config
    ids = torch.randint(0, module.model_config.vocab_size, (2, 8))
    assert torch.equal(restored.eval()(ids), module.eval()(ids))
    # How to compute is chosen where it runs: the recorded ladder_impl is not imposed.
    checkpoint["model_config"]["ladder_impl"] = "triton"
    assert checkpoints.restore_model(checkpoint)[1].ladder_impl != "triton"
    # A preset removed since: the record alone builds it.
    monkeypatch.delitem(presets.PRESETS, "gpt2-tiny-f")
    restored, config = checkpoints.restore_model(checkpoint)
    assert config.replace(ladder_impl=module.model_config.ladder_impl) == module.model_config
    assert torch.equal(restored.eval()(ids), module(ids))
    # A recorded value this version no longer takes, where the preset builds: named as
    # the record's (where neither builds, the preset's own error is raised).
    monkeypatch.setitem(presets.PRESETS, "gpt2-tiny-f", changed)
    checkpoint["model_config"]["cffn_ladder"] = "an-old-name"
    with pytest.raises(checkpoints.CheckpointError, match=r"the model_config recorded in the "):
        checkpoints.restore_model(checkpoint)
    monkeypatch.delitem(presets.PRESETS, "gpt2-tiny-f")
    with pytest.raises(ConfigError, match=r"unknown preset 'gpt2-tiny-f'"):
        checkpoints.restore_model(checkpoint)


def test_load_checkpoint_does_not_import_lightning(tmp_path):
    """cofr generate starts ~2.5 s sooner without it."""
    module = LanguageModel("gpt2-tiny", config={"vocab_size": 256})
    trainer = tiny_trainer(1, default_root_dir=tmp_path)
    trainer.fit(module, token_loader(1))
    path = tmp_path / "last.ckpt"
    trainer.save_checkpoint(path)
    code = (
        "import sys, torch\n"
        "from cofrgenet.training.pretrained import load_checkpoint\n"
        f"loaded = load_checkpoint({str(path)!r})\n"
        "loaded.model(torch.zeros(1, 4, dtype=torch.long))\n"
        "assert loaded.tracking_uri is None and not loaded.model.training\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'torchmetrics')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_checkpoints_from_before_positive_denominators_ask_for_the_papers():
    module = LanguageModel("gpt2-tiny-f")
    checkpoint: dict = {}
    module.on_save_checkpoint(checkpoint)
    old = {k: v for k, v in checkpoint["model_config"].items() if k != "ladder_denominators"}
    module.on_load_checkpoint({"model_config": dict(checkpoint["model_config"])})  # current: fine
    with pytest.raises(ValueError, match="ladder_denominators: paper"):
        LanguageModel("gpt2-tiny-f").on_load_checkpoint({"model_config": dict(old)})
    paper = LanguageModel("gpt2-tiny-f", config={"ladder_denominators": "paper"})
    paper.on_load_checkpoint({"model_config": dict(old)})  # what it was trained with
    LanguageModel("gpt2-tiny").on_load_checkpoint({"model_config": dict(old)})  # no ladders


def test_weight_decay_follows_the_built_shapes_when_the_model_is_flattened():
    """Under FSDP (use_orig_params) every parameter is a 1-D shard by the time the
    optimizer is made; decay is decided by the dimensions recorded at build, and the
    log counts the parameters as built."""
    module = LanguageModel("gpt2-tiny-f")
    ndims = {name: p.dim() for name, p in module.model.named_parameters()}
    numels = {name: p.numel() for name, p in module.model.named_parameters()}
    whole = describe_groups(param_groups(module.model, 0.1))
    with torch.no_grad():
        for param in module.model.parameters():
            # What FSDP's flat views look like on one rank of two: half of each parameter.
            param.data = param.data.flatten()[: (param.numel() + 1) // 2]
    flat = {g["name"]: set(g["param_names"]) for g in param_groups(module.model, 0.1)}
    assert "decay" not in flat  # judged by the flat shapes: nothing would decay
    built = param_groups(module.model, 0.1, None, ndims)
    groups = {g["name"]: set(g["param_names"]) for g in built}
    assert "transformer.h.0.mlp.linear.weight" in groups["decay"]
    assert "transformer.h.0.mlp.linear.bias" in groups["no_decay"]
    # The log counts whole parameters, not this rank's shards.
    assert describe_groups(built, numels) == whole
    assert describe_groups(built) != whole


def test_fsdp_wraps_each_block_and_the_optimizer_groups_keep_their_names(tmp_path):
    """LadderFSDPStrategy makes each block an FSDP unit (wrap_blocks) or the model one
    unit. Parameter names then hold ``_fsdp_wrapped_module`` segments; the optimizer
    groups (decay by the built shapes, the exempt names) are those of the unwrapped
    model, or every block matrix would go undecayed, and a sharded checkpoint's optimizer
    state would not load into the other wrapping."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel

    from cofrgenet.training.strategies import LadderFSDPStrategy

    def groups_of(model: nn.Module, ndims: dict[str, int] | None) -> dict[str, list[str]]:
        return {g["name"]: g["param_names"] for g in param_groups(model, 0.1, None, ndims)}

    built = LanguageModel("gpt2-tiny-f", config={"ladder_denominators": "paper"}).model
    want = groups_of(built, None)
    assert want["decay"] and want["no_decay"]
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        for wrap_blocks, units in ((True, 1 + len(built.transformer.h)), (False, 1)):
            model = copy.deepcopy(built)
            ndims = {name: p.dim() for name, p in model.named_parameters()}
            strategy = LadderFSDPStrategy(
                wrap_blocks=wrap_blocks, parallel_devices=[torch.device("cpu")]
            )
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # FSDP: NO_SHARD in a world of one
                wrapped = strategy._setup_model(model)
            assert sum(isinstance(m, FullyShardedDataParallel) for m in wrapped.modules()) == (
                units
            )
            assert groups_of(wrapped, ndims) == want, wrap_blocks
    finally:
        dist.destroy_process_group()
    # Lightning's own activation checkpointing: not applied on CPU, doubled with the
    # model's on GPU; the model's is named instead.
    for name in ("activation_checkpointing_policy", "activation_checkpointing"):
        with pytest.raises(ConfigError, match=f"{name}: set model.activation_checkpointing"):
            LadderFSDPStrategy(**{name: {torch.nn.Linear}})
    # Flat parameters: a KeyError on every rank at the optimizer's groups.
    with pytest.raises(ConfigError, match=r"use_orig_params: false is not supported"):
        LadderFSDPStrategy(use_orig_params=False)
    assert unwrapped_name("_fsdp_wrapped_module.h.0._fsdp_wrapped_module.mlp.w") == "h.0.mlp.w"
    assert unwrapped_name("h.0._checkpoint_wrapped_module._orig_mod.w") == "h.0.w"
    assert unwrapped_name("my_orig_mod.w") == "my_orig_mod.w"


def test_activation_checkpointing_recomputes_transformer_blocks_and_refuses_recurrent():
    module = LanguageModel("gpt2-tiny-f", activation_checkpointing=True)
    assert all(block.recompute for block in module.model.transformer.h)
    assert not any(b.recompute for b in LanguageModel("gpt2-tiny-f").model.transformer.h)
    with pytest.raises(ConfigError, match=r"activation_checkpointing.*RecurrentLM"):
        LanguageModel("lstm-tiny", activation_checkpointing=True)


def test_adamw_is_fused_where_torch_can_and_unfused_when_asked():
    from cofrgenet.training.optim import build_adamw, fused_adamw_supported

    model = torch.nn.Linear(4, 3)
    assert build_adamw(model, OptimizerConfig()).defaults["fused"] is True  # CPU: fused
    unfused = build_adamw(model, OptimizerConfig(fused=False)).defaults
    assert not unfused["fused"] and unfused["foreach"] is None  # torch's own unfused choice
    assert not fused_adamw_supported([torch.zeros(2, device="meta")])
    assert not fused_adamw_supported([])


def test_a_gradient_scaler_keeps_adamw_unfused():
    """Fused AdamW unscales inside its step, after clipping and the logged gradient norms
    saw scaled gradients (Lightning refuses to clip then): 16-mixed stays unfused."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    from cofrgenet.training.optim import build_adamw, scales_loss

    fp16 = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu"))
    bf16 = MixedPrecision("bf16-mixed", "cpu")
    assert scales_loss(SimpleNamespace(precision_plugin=fp16))
    assert not scales_loss(SimpleNamespace(precision_plugin=bf16))
    model = torch.nn.Linear(4, 3)
    optimizer = build_adamw(model, OptimizerConfig(), grad_scaler=True)
    assert not optimizer.defaults["fused"]
    model(torch.randn(2, 4)).sum().backward()
    fp16.clip_gradients(optimizer, clip_val=1.0)  # raises for a fused optimizer
    with pytest.raises(ConfigError, match="fused: true cannot be combined"):
        build_adamw(model, OptimizerConfig(fused=True), grad_scaler=True)


def test_bf16_mixed_clips_gradients_with_the_fused_adamw():
    """Lightning's mixed-precision plugin refuses to clip for a fused optimizer even under
    bf16, where nothing is scaled: every bf16 config with clipping stopped at step 1."""

    class ClippedNorms(L.Callback):
        def __init__(self) -> None:
            self.norms: list[torch.Tensor] = []

        def on_train_batch_end(self, trainer, pl_module, *args) -> None:
            # The step's gradients are still there (zeroed before the next backward).
            grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
            self.norms.append(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))

    module = LanguageModel("gpt2-tiny-f", config={"vocab_size": 256, "block_size": 16})
    norms = ClippedNorms()
    trainer = tiny_trainer(2, [norms], precision="bf16-mixed", gradient_clip_val=1e-3)
    trainer.fit(module, token_loader(n_batches=2))
    assert trainer.optimizers[0].defaults["fused"] is True
    assert len(norms.norms) == 2 and all(n <= 1e-3 * 1.001 for n in norms.norms)


@pytest.mark.parametrize("saved_fused", [False, True], ids=["unfused-to-fused", "fused-to-unfused"])
def test_a_resumed_optimizer_keeps_its_own_kernel_choice(saved_fused):
    """load_state_dict would take fused/foreach from the checkpoint: a run saved unfused
    and resumed fused then crashed in its first scaled step. The built choice wins, and
    the step counters sit where that kernel keeps them."""
    from cofrgenet.training.optim import build_adamw

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x = torch.randn(5, 4)
    saved = build_adamw(model, OptimizerConfig(fused=saved_fused))
    model(x).sum().backward()
    saved.step()
    state_dict = saved.state_dict()
    groups_before = [dict(g) for g in state_dict["param_groups"]]
    resumed = build_adamw(model, OptimizerConfig(fused=not saved_fused))
    resumed.load_state_dict(state_dict)
    assert state_dict["param_groups"] == groups_before  # the caller's dict is untouched
    assert all(bool(g["fused"]) is not saved_fused for g in resumed.param_groups)
    assert all(resumed.state[p]["step"].item() == 1.0 for p in model.parameters())
    scaler = torch.amp.GradScaler("cpu")
    resumed.zero_grad()
    scaler.scale(model(x).sum()).backward()
    scaler.step(resumed)  # unfused-to-fused asserted on found_inf here before
    scaler.update()
    assert all(resumed.state[p]["step"].item() == 2.0 for p in model.parameters())


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "unfused"])
def test_adam_state_is_made_up_front_and_equals_adams_own(fused):
    from cofrgenet.training.optim import build_adamw

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    reference = torch.nn.Linear(4, 3)
    reference.load_state_dict(model.state_dict())
    config = OptimizerConfig(lr=1e-2, fused=fused)
    ours = build_adamw(model, config)
    assert all(len(ours.state[p]) == 3 for p in model.parameters())  # before any step
    theirs = torch.optim.AdamW(  # the same groups, state made lazily by AdamW itself
        param_groups(reference, config.weight_decay),
        lr=1e-2,
        betas=config.betas,
        eps=config.eps,
        fused=fused or None,
    )
    x = torch.randn(5, 4)
    for _ in range(3):
        for net, opt in ((model, ours), (reference, theirs)):
            opt.zero_grad()
            net(x).square().sum().backward()
            opt.step()
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        assert torch.equal(a, b)


def test_no_preset_and_no_model_fields_is_refused():
    """ModelConfig's own defaults (GPT-2 small's shape, vocab 50257) are no model a run asked for."""
    with pytest.raises(
        ConfigError, match=r"model\.preset is null but model\.config gives no field"
    ):
        LanguageModel(preset=None)
    assert LanguageModel(preset=None, config={"n_layer": 1, "n_embd": 32, "n_head": 2}).model


def test_every_batch_and_process_gets_its_own_dropout_seed():
    """Seeds follow from (seed, rank, epoch, batch) alone: DDP processes sharing one seed
    draw different masks, and a resume draws the ones an uninterrupted run draws."""
    places = [(rank, epoch, batch) for rank in (0, 1) for epoch in (0, 1) for batch in (0, 1, 7)]
    seeds = [batch_seed(1337, *place) for place in places]
    assert len(set(seeds)) == len(places)
    assert seeds == [batch_seed(1337, *place) for place in places]
    assert batch_seed(1338, 0, 0, 0) != batch_seed(1337, 0, 0, 0)
    torch.manual_seed(batch_seed(2**64 - 1, 3, 0, 5))  # torch takes any seed it returns


def test_a_checkpoint_keeps_the_dropout_seed_of_its_run():
    """A resume under another (or no) seed_everything draws the original run's masks."""
    torch.manual_seed(11)
    saved = {}
    LanguageModel("gpt2-tiny").on_save_checkpoint(saved)
    torch.manual_seed(12)
    resumed = LanguageModel("gpt2-tiny")
    resumed.on_load_checkpoint(saved)
    assert resumed.dropout_seed == 11


def test_the_ddp_spawn_launcher_leaves_the_ranks_run_alone():
    """Under ddp_spawn Ctrl-C reaches the launching process too: its logger, which has no
    run (the ranks made it), was asked to mark one KILLED and made a second, empty run."""
    marked = []
    logger = SimpleNamespace(mark_killed=marked.append)
    launcher = SimpleNamespace(world_size=2, loggers=[logger], global_step=88)
    StopOnSignal._mark_killed(launcher)  # torch.distributed is not initialized here
    assert marked == []
    StopOnSignal._mark_killed(SimpleNamespace(world_size=1, loggers=[logger], global_step=88))
    assert marked == [88]


def test_fsdp_is_recognised_by_name_and_by_class():
    """`--trainer.strategy fsdp` (a name) passed the compile check that a built
    FSDPStrategy failed; one helper reads all the forms."""
    from lightning.pytorch.strategies import FSDPStrategy

    from cofrgenet.training.module import check_compile_strategy
    from cofrgenet.training.strategies import is_fsdp

    assert is_fsdp("fsdp") and is_fsdp(FSDPStrategy()) and not is_fsdp("ddp")
    assert not is_fsdp(None) and not is_fsdp("auto")
    with pytest.raises(ConfigError, match=r"model\.compile does not work under FSDP"):
        check_compile_strategy(True, "fsdp")
    check_compile_strategy(False, "fsdp")


def test_a_bad_optimizer_setting_names_that_setting_alone():
    """`weight_decay: -1` said "eps and weight_decay must be >= 0, got 1e-08, -1.0"."""
    from cofrgenet.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^model.optimizer.weight_decay must be >= 0, got -1.0$"):
        OptimizerConfig(weight_decay=-1.0)
    with pytest.raises(ConfigError, match=r"^model.optimizer.eps must be >= 0, got -1e-08$"):
        OptimizerConfig(eps=-1e-8)
