"""``cofr bench quality``: CoFrGeNet variants against matched baselines, equal tokens, seeds.

Every run is a real ``cofr fit`` (the same CLI, configs and Lightning module), in this
process, from the recipe ``conf/experiment/quality-cpu.yaml`` plus each variant's delta;
runs are tracked in MLflow like any other (experiment ``bench-quality``). Variants:

* ``gpt2``: the recipe's GPT-2 (the gpt2-mini shape by default);
* ``gpt2-matched``: the same with its MLP's hidden width chosen so that the whole model
  has cofrgenet-f's parameter count (the baseline at equal size);
* ``cofrgenet-f`` (scalar ladders) and ``cofrgenet-f-elementwise``;
* ``cofrgenet-f-ladders-off``: cofrgenet-f with V = 0 and every ladder parameter frozen
  (:class:`~cofrgenet.training.callbacks.DisableLadders`): what the gated linear path
  does alone, so the difference to cofrgenet-f is what the ladders add (never with
  ``--dyadic``: it has no ladders to release);
* ``cofrgenet-a`` (CAttnM), ``cofrgenet-a-u`` (CAttnU), ``cofrgenet`` (CAttnM + Cffn);
* ablations, by name only: ``cofrgenet-f-paper`` (the paper's denominators, poles and
  all), ``cofrgenet-f-unscaled`` (U and V at std 0.02), ``cofrgenet-f-dyadic`` (the
  paper's dyadic schedule, released depths on the run's lr schedule) and
  ``cofrgenet-f-dyadic-release`` (each released depth with its own warmup + cosine).

Per run: the final validation loss over the whole val split (and, for ladder models,
the same without eval clipping of ladder outputs), median tokens/s after warm-up, the
largest pre-clip gradient norm, the share of steps that were gradient-norm spikes (> 10x
the median of the 20 before), and whether the loss went non-finite. The report (markdown
+ JSON, with the command) goes to ``<out-dir>/quality-<device>-<date>.{md,json}``: ``runs/bench``
unless ``--out-dir`` names another folder (``docs/benchmarks`` for the project's records).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import functools
import io
import itertools
import json
import logging
import math
import shlex
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from cofrgenet import terminal
from cofrgenet.atomic import strict_json, write_text_atomic
from cofrgenet.bench import variants
from cofrgenet.bench.files import (
    check_file_name_part,
    free_stem,
    make_out_dir,
    stem_once,
    with_suffix,
)
from cofrgenet.bench.machine import device_slug, machine_summary
from cofrgenet.dataclass_options import add_dataclass_arguments, dataclass_from_args
from cofrgenet.errors import ConfigError, UserError, did_you_mean, not_valid_yaml
from cofrgenet.recipes import bundled
from cofrgenet.signals import lightning_sigterm, signal_name, sigterm_raises, stopped_by

if TYPE_CHECKING:
    from lightning.pytorch import LightningModule, Trainer

RECIPE = "conf/experiment/quality-cpu.yaml"
EXPERIMENT = "bench-quality"
#: Steps left out of the tokens/s median (start-up, first-call compilation).
WARMUP_STEPS = 5


@dataclass(frozen=True)
class Variant:
    """A model variant: a preset, ModelConfig overrides and how it is trained."""

    name: str
    preset: str
    config: dict[str, Any] = field(default_factory=dict)
    ladders_off: bool = False
    dyadic: str | None = None  # None: the benchmark's --dyadic; else "none", "paper", "release"
    matched: bool = False  # gpt2 with ffn_hidden matched to cofrgenet-f's count
    about: str = ""


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("gpt2", *variants.model("gpt2"), about="GPT-2 baseline"),
        Variant("gpt2-matched", "gpt2-mini", matched=True, about="GPT-2, MLP sized to -f"),
        Variant("cofrgenet-f", *variants.model("cofrgenet-f"), about="Cffn, scalar ladders"),
        Variant(
            "cofrgenet-f-elementwise",
            *variants.model("cofrgenet-f-elementwise"),
            about="Cffn, elementwise ladders",
        ),
        Variant(
            "cofrgenet-f-ladders-off", "gpt2-mini-f", ladders_off=True, about="Cffn, V = 0 frozen"
        ),
        Variant("cofrgenet-a", *variants.model("cofrgenet-a"), about="CAttnM"),
        Variant("cofrgenet-a-u", *variants.model("cofrgenet-a-u"), about="CAttnU"),
        Variant("cofrgenet", *variants.model("cofrgenet"), about="CAttnM + Cffn"),
        # Ablations and other baselines (run by name).
        Variant(
            "synthesizer-d", *variants.model("synthesizer-d"), about="Dense Synthesizer attention"
        ),
        Variant(
            "cofrgenet-f-paper",
            "gpt2-mini-f",
            {"ladder_denominators": "paper"},
            about="the paper's denominators",
        ),
        Variant(
            "cofrgenet-f-unscaled",
            "gpt2-mini-f",
            {"ladder_out_std": 0.02},
            about="U, V at std 0.02",
        ),
        Variant("cofrgenet-f-dyadic", "gpt2-mini-f", dyadic="paper", about="dyadic, global lr"),
        Variant(
            "cofrgenet-f-dyadic-release",
            "gpt2-mini-f",
            dyadic="release",
            about="dyadic, lr from release",
        ),
    )
}
DEFAULT_VARIANTS = (
    "gpt2",
    "gpt2-matched",
    "cofrgenet-f",
    "cofrgenet-f-elementwise",
    "cofrgenet-f-ladders-off",
    "cofrgenet-a",
    "cofrgenet-a-u",
    "cofrgenet",
)
DYADIC = ("none", "paper", "release")
#: The largest seed Lightning's ``seed_everything`` takes (numpy's uint32 range).
MAX_SEED = 2**32 - 1


#: The ModelConfig fields the bench's shape options set (--block-size the data's too).
SHAPE_OPTIONS = ("block_size", "n_layer", "n_embd", "n_head")

#: What an unset shape or run-length field of QualityBenchConfig means.
RECIPES = " (default: the recipe's)"


@dataclass
class QualityBenchConfig:
    """Settings of ``cofr bench quality``; unset shape and run-length fields keep the recipe's."""

    variants: tuple[str, ...] = field(
        default=DEFAULT_VARIANTS,
        metadata={"help": f"variants to train; known: {', '.join(VARIANTS)}"},
    )
    seeds: tuple[int, ...] = field(
        default=(0, 1, 2), metadata={"help": f"seeds, one run each, 0 to {MAX_SEED}"}
    )
    steps: int | None = field(default=None, metadata={"help": "optimizer steps per run" + RECIPES})
    batch_size: int | None = field(default=None, metadata={"help": "sequences per step" + RECIPES})
    block_size: int | None = field(default=None, metadata={"help": "tokens per sequence" + RECIPES})
    n_layer: int | None = field(default=None, metadata={"help": "transformer blocks" + RECIPES})
    n_embd: int | None = field(default=None, metadata={"help": "width" + RECIPES})
    n_head: int | None = field(default=None, metadata={"help": "attention heads" + RECIPES})
    lr: float | None = field(default=None, metadata={"help": "peak learning rate" + RECIPES})
    val_batches: int | None = field(
        default=None, metadata={"help": "validation batches (default: the whole val split)"}
    )
    dyadic: str = field(
        default="none",
        metadata={
            "help": "dyadic unfreezing of ladder variants: none; paper, the paper's "
            "schedule with released depths on the run's lr schedule; release, the same "
            "with each released depth on its own warmup + cosine",
        },
    )
    model_config: str | None = field(
        default=None,
        metadata={
            "help": "ModelConfig fields for every variant, as JSON, e.g. '{\"ladders\": 8}' "
            "(default: none; the shape is the options above)"
        },
    )
    tag: str | None = field(default=None, metadata={"help": "appended to the report's file name"})
    data_dir: str = field(
        default="data/pydoc-bpe-quality",
        metadata={
            "help": "prepared data; the default folder is made from the bundled pydoc text "
            "(BPE) when missing"
        },
    )
    recipe: str = field(default=RECIPE, metadata={"help": "the cofr fit config every run uses"})
    runs_dir: str = field(default="runs", metadata={"help": "run folders and MLflow store"})
    out_dir: str = field(
        default="runs/bench",
        metadata={"help": "where reports go; docs/benchmarks for the project's records"},
    )
    quick: bool = field(
        default=False, metadata={"help": "a tiny model and a few steps: checks the pipeline"}
    )

    def __post_init__(self) -> None:
        self.variants, self.seeds = tuple(self.variants), tuple(self.seeds)
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown:
            hint = did_you_mean(unknown[0], VARIANTS)
            raise ConfigError(
                f"--variants: unknown variant {unknown[0]!r}{hint}; known: {', '.join(VARIANTS)}"
            )
        if not self.variants or not self.seeds:
            raise ConfigError("give at least one variant (--variants) and one seed (--seeds)")
        bad_seed = next((s for s in self.seeds if not 0 <= s <= MAX_SEED), None)
        if bad_seed is not None:  # else Lightning's seed_everything names its own option
            raise ConfigError(f"--seeds must be in [0, {MAX_SEED}], got {bad_seed}")
        for flag, values in (("--variants", self.variants), ("--seeds", self.seeds)):
            repeated = sorted({str(v) for v in values if values.count(v) > 1})
            if repeated:  # the second run would find the first one's run folder taken
                raise ConfigError(f"{flag}: {', '.join(repeated)} given twice; give each once")
        if self.dyadic not in DYADIC:
            raise ConfigError(
                f"--dyadic must be one of {', '.join(DYADIC)}, got {self.dyadic!r}"
                f"{did_you_mean(self.dyadic, DYADIC)}"
            )
        for name in ("steps", "batch_size", "block_size", "n_layer", "n_embd", "n_head",
                     "val_batches"):  # fmt: skip
            value = getattr(self, name)
            if value is not None and value < 1:  # else a recipe key's error names the wrong flag
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        if self.lr is not None and not (math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError(f"--lr must be a finite number > 0, got {self.lr}")
        self.model_overrides()  # fails early on bad JSON
        check_file_name_part("--tag", self.tag)
        if self.quick:  # a pipeline check, not a measurement
            for name, value in QUICK.items():
                if getattr(self, name) is None:
                    setattr(self, name, value)

    def model_overrides(self) -> dict[str, Any]:
        if not self.model_config:
            return {}
        try:
            value = json.loads(self.model_config)
        except json.JSONDecodeError as error:
            raise ConfigError(
                f"--model-config {self.model_config!r} is not JSON ({error}); give an object, "
                "e.g. '{\"ladders\": 8}'"
            ) from None
        if not isinstance(value, dict):
            raise ConfigError(
                f"--model-config must be a JSON object, e.g. '{{\"ladders\": 8}}', "
                f"got {self.model_config!r}"
            )
        from cofrgenet.models import ModelConfig

        # A typo fails here, not after the data is prepared and the first run started.
        valid = ModelConfig.field_names()
        for key in value:
            if key not in valid:
                raise ConfigError(
                    f"--model-config: unknown ModelConfig field {key!r}"
                    f"{did_you_mean(key, valid)}; the fields are listed in docs/models.md"
                )
        # The shape options set these (and --block-size the data's blocks too): two ways
        # to one field, the JSON's taken silently while the report named the option's.
        owned = [key for key in SHAPE_OPTIONS if key in value]
        if owned:
            flag = f"--{owned[0].replace('_', '-')}"
            raise ConfigError(
                f"--model-config sets {owned[0]}, which {flag} sets: give it as "
                f"{flag} {value[owned[0]]}"
            )
        return value


#: What --quick sets (unless given explicitly).
QUICK = {"steps": 8, "batch_size": 4, "block_size": 32, "n_layer": 2, "n_embd": 32, "n_head": 2}


# ----------------------------------------------------------------------------- one run


@dataclass
class RunResult:
    variant: str
    seed: int
    parameters: int
    val_loss: float
    val_loss_unclipped: float | None
    tokens_per_sec: float
    max_grad_norm: float
    spikes: int
    steps: int
    nonfinite: bool
    seconds: float
    run_dir: str
    #: What it trained on: "cpu", or the GPU's name as a slug ("nvidia-h200"); "" when the
    #: run stopped before it could say (a non-finite loss).
    device: str = ""
    #: How it trained, as the fit resolved it (recipe, deltas and flags): ``schedule_of``.
    schedule: dict[str, Any] = field(default_factory=dict)
    #: The step a ``--resume`` went on from (the stopped run's checkpoint); 0: one go.
    #: Its tokens/s and seconds are of the steps after it.
    resumed_at: int = 0
    #: A signal stopped the validation without clipping that measures its clip effect
    #: (the run had trained and been scored, so it is in the report without one).
    clip_unmeasured: bool = False


def step_recorder() -> Any:
    """A Lightning callback keeping each step's end time, the step it started at (a
    resumed fit's checkpoint's), the module and the trainer (what a run that stopped on
    a non-finite loss trained, whose fit returns nothing).

    Made on demand so that ``cofr bench quality --help`` does not import Lightning.
    """
    import lightning as L

    class StepRecorder(L.Callback):
        def __init__(self) -> None:
            self.step_ends: list[float] = []
            self.tokens_per_step = 0
            self.start_step = 0
            self.module: Any = None
            self.trainer: Any = None

        def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
            self.start_step, self.module = trainer.global_step, pl_module
            self.trainer = trainer

        @property
        def steps(self) -> int:
            """The run's steps so far (those before its resume included)."""
            return self.start_step + len(self.step_ends)

        def max_grad_norm(self) -> float:
            """The run's largest pre-clip gradient norm (NaN before its first step)."""
            if self.module is None or self.steps == 0:
                return math.nan
            return float(self.module.grad_norm_max)

        def on_train_batch_end(
            self,
            trainer: Trainer,
            pl_module: LightningModule,
            outputs: Any,
            batch: Any,
            batch_idx: int,
        ) -> None:
            self.step_ends.append(time.perf_counter())
            self.tokens_per_step = (batch.shape[1] - 1) * batch.shape[0]

        def tokens_per_sec(self) -> float:
            """Median per-step rate, without the first WARMUP_STEPS when there are more."""
            ends = self.step_ends
            if len(ends) > WARMUP_STEPS + 2:
                ends = ends[WARMUP_STEPS:]
            intervals = [b - a for a, b in itertools.pairwise(ends)]
            return self.tokens_per_step / statistics.median(intervals) if intervals else math.nan

    return StepRecorder()


def variant_model_config(cfg: QualityBenchConfig, variant: Variant) -> dict[str, Any]:
    """The ``--model.config`` of ``variant``'s runs: the recipe's, the shape options',
    ``--model-config``'s and the variant's own settings."""
    model: dict[str, Any] = {}
    for key in ("block_size", "n_layer", "n_embd", "n_head"):
        if getattr(cfg, key) is not None:
            model[key] = getattr(cfg, key)
    model.update(cfg.model_overrides())
    model.update(variant.config)
    if variant.matched:
        model["ffn_hidden"] = matched_ffn_hidden({**recipe_model_config(cfg), **model})
    return _without_unread({**recipe_model_config(cfg), **model}, variant.preset)


def check_models(cfg: QualityBenchConfig) -> None:
    """Every variant's model builds from the settings given (``--n-head 3`` of a 32-wide
    model): refused by the first run's fit, the bench had begun a report and offered a
    ``--resume`` that refused it again."""
    from cofrgenet.training.model_options import fit_model_config

    recipe_model_config(cfg)  # its own errors name --recipe, not a variant
    for name in cfg.variants:
        variant = VARIANTS[name]
        try:
            fit_model_config(
                {"preset": variant.preset, "config": variant_model_config(cfg, variant)}
            )
        except ConfigError as error:
            raise ConfigError(f"{name}: {error}") from None


def fit_arguments(cfg: QualityBenchConfig, variant: Variant, seed: int, name: str) -> list[str]:
    """The ``cofr fit`` arguments of one run."""
    args = ["fit", "--config", cfg.recipe, "--model.preset", variant.preset]
    args += ["--model.config", json.dumps(variant_model_config(cfg, variant))]
    args += ["--seed_everything", str(seed), "--data.data_dir", cfg.data_dir]
    args += ["--run.experiment", EXPERIMENT, "--run.name", name, "--run.runs_dir", cfg.runs_dir]
    if cfg.steps is not None:
        args += [
            "--trainer.max_steps",
            str(cfg.steps),
            "--trainer.val_check_interval",
            str(cfg.steps),
        ]
    if cfg.batch_size is not None:
        args += ["--data.batch_size", str(cfg.batch_size)]
    if cfg.block_size is not None:
        args += ["--data.block_size", str(cfg.block_size)]
    if cfg.lr is not None:
        args += ["--model.optimizer.lr", str(cfg.lr)]
    if cfg.val_batches is not None:
        args += ["--trainer.limit_val_batches", str(cfg.val_batches)]
    if cfg.quick:
        args += ["--model.optimizer.warmup_steps", "2"]
    return args


def _without_unread(config: dict[str, Any], preset: str) -> dict[str, Any]:
    """``config`` without the ladder settings when ``preset`` with it has no ladder, and
    without the head counts when its attention reads no heads: the recipe's and the
    bench's fields are for the variants that read them, and would change nothing of the
    others (whose fits would warn of each)."""
    from cofrgenet.errors import ConfigError
    from cofrgenet.models import count_parameters
    from cofrgenet.models.config import resolve_model_config
    from cofrgenet.training.model_options import HEADS_ONLY, LADDER_ONLY, reads_heads

    try:
        built = resolve_model_config(preset, config)
        unread = set() if count_parameters(built).ladder > 0 else set(LADDER_ONLY)
        unread |= set() if reads_heads(built) else set(HEADS_ONLY)
    except (ConfigError, ValueError):  # the fit says what is wrong with it
        return config
    return {key: value for key, value in config.items() if key not in unread}


def recipe_model_config(cfg: QualityBenchConfig) -> dict[str, Any]:
    """``model.config`` of the recipe (a CLI ``--model.config`` replaces it whole)."""
    path = Path(cfg.recipe)
    if not path.is_file():
        what = "a folder, not a file" if path.is_dir() else "no such file"
        # No "run from the repository root": bundled() finds conf/... from any folder.
        raise ConfigError(f"--recipe {path}: {what}; give a cofr fit config (default: {RECIPE})")
    try:
        recipe = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise ConfigError(f"--recipe {not_valid_yaml(path, error)}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"--recipe {path}: cannot read it ({error})") from None
    model = (recipe or {}).get("model") or {} if isinstance(recipe or {}, dict) else None
    config = model.get("config") or {} if isinstance(model, dict) else None
    if not isinstance(config, dict):
        raise ConfigError(
            f"--recipe {path}: expected a cofr fit config (a mapping, its model and "
            "model.config mappings when given)"
        )
    return dict(_resolved_model_config(str(path), path.stat().st_mtime_ns))


@functools.cache
def _resolved_recipe(path: str, mtime_ns: int) -> str:
    """The recipe as ``cofr fit --config path`` resolves it with its ``base:`` files (YAML)."""
    from cofrgenet.training.cli import resolve_fit_config

    try:
        return resolve_fit_config(["--config", path])
    except ConfigError as error:
        raise ConfigError(f"--recipe {path}: {error}") from None


def _resolved_model_config(path: str, mtime_ns: int) -> tuple[tuple[str, Any], ...]:
    """``model.config`` as ``cofr fit --config path`` merges it with its ``base:`` files
    (a run's ``--model.config`` replaces the section whole: a base's keys must be in it)."""
    resolved = yaml.safe_load(_resolved_recipe(path, mtime_ns))
    config = (resolved.get("model") or {}).get("config") or {}
    return tuple((key, value) for key, value in config.items() if value is not None)


def expected_device(cfg: QualityBenchConfig) -> str:
    """Where the runs will train, before one has said (the report written before the
    first run is named by it): the CPU where the recipe's trainer asks for it or no GPU
    is here, else this machine's GPU (Lightning's ``auto``)."""
    import torch

    path = Path(cfg.recipe)
    resolved = yaml.safe_load(_resolved_recipe(str(path), path.stat().st_mtime_ns))
    accelerator = str((resolved.get("trainer") or {}).get("accelerator") or "auto")
    if accelerator == "cpu" or not torch.cuda.is_available():
        return "cpu"
    return device_slug("cuda")


def matched_ffn_hidden(gpt2_fields: dict[str, Any]) -> int:
    """The MLP hidden width giving gpt2 the parameter count of cofrgenet-f (same shape)."""
    from cofrgenet.models import ModelConfig
    from cofrgenet.models.build import build_shapes
    from cofrgenet.models.presets import preset_dict

    shape = {k: v for k, v in gpt2_fields.items() if k != "ffn_hidden"}
    f_variant = VARIANTS["cofrgenet-f"]

    def count(preset: str, fields: dict[str, Any]) -> int:
        model = build_shapes(ModelConfig.from_dict({**preset_dict(preset), **fields}))
        return sum(p.numel() for p in model.parameters())

    target = count(f_variant.preset, {**shape, **f_variant.config})
    one = count("gpt2-mini", {**shape, "ffn_hidden": 1})
    two = count("gpt2-mini", {**shape, "ffn_hidden": 2})
    # The count is linear in the hidden width: one more unit adds (two - one) parameters.
    return max(1, 1 + round((target - one) / (two - one)))


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Lightning's start-up chatter and warnings off while a run trains."""
    import warnings

    names = ("lightning", "lightning.pytorch", "lightning.fabric", "litdata")
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


@contextlib.contextmanager
def clipping_disabled(model: Any) -> Iterator[None]:
    """Ladder layers without their eval clip (their recorded ranges kept aside)."""
    from cofrgenet.nn import LadderLayer

    saved = [(m, m.output_range) for m in model.modules() if isinstance(m, LadderLayer)]
    for m, _ in saved:
        m.output_range = None
    try:
        yield
    finally:
        for m, output_range in saved:
            m.output_range = output_range


class RunStopped(SystemExit):
    """A signal stopped the run of ``what`` (``gpt2 seed 1``) after ``steps`` steps; the
    bench exits with ``code``, the status ``cofr fit`` would (130 Ctrl-C, 143 SIGTERM).
    ``finished``: the run's result, where the signal came after its last step (while its
    final checkpoint was saved): it goes into the report, and the bench stops there."""

    def __init__(
        self, code: int, what: str, steps: int, run_dir: str, finished: RunResult | None = None
    ) -> None:
        super().__init__(code)
        self.what, self.steps, self.run_dir, self.finished = what, steps, run_dir, finished

    def how(self) -> str:
        """``Ctrl-C``, ``SIGTERM``: what stopped it, as the fit says it."""
        return signal_name(int(self.code or 0))


def run_variant(
    cfg: QualityBenchConfig, variant: Variant, seed: int, stamp: str, resume: bool = False
) -> RunResult:
    """Train one variant with one seed through ``cofr fit``; never raises for a NaN loss.
    A Ctrl-C or SIGTERM that stops the fit raises :class:`RunStopped`. ``resume``: a
    stopped bench's run (``stamp`` its) whose folder is there goes on from its newest
    checkpoint (``--ckpt_path last``: bit for bit where one go would be, docs/training.md)."""
    from cofrgenet.training.callbacks import (
        DisableLadders,
        DyadicUnfreezing,
        NonFiniteLossError,
        late_stop,
    )
    from cofrgenet.training.cli import CofrCLI, stop_status

    name = f"{stamp}-{variant.name}-s{seed}"
    recorder = step_recorder()
    extra: list[Any] = [recorder]
    if variant.ladders_off:
        extra.append(DisableLadders())
    dyadic = variant.dyadic or cfg.dyadic
    if dyadic != "none" and not variant.ladders_off:  # a no-op for models without ladders
        extra.append(DyadicUnfreezing("paper", lr="release" if dyadic == "release" else "global"))
    args = fit_arguments(cfg, variant, seed, name)
    run_dir = str(Path(cfg.runs_dir) / EXPERIMENT / name)
    if resume and Path(run_dir).is_dir():
        args += ["--ckpt_path", "last"]
    start = time.perf_counter()
    nonfinite = False
    cli = None
    with _quiet():
        try:
            cli = CofrCLI(args=args, extra_callbacks=extra)
        except NonFiniteLossError:
            nonfinite = True
        except (SystemExit, KeyboardInterrupt) as stopped:
            # Read as `cofr fit` reads it (Lightning ends a fit a second Ctrl-C reached
            # with sys.exit(1)); the fit's own "stopped by" lines went to _quiet's buffer.
            status = stop_status(stopped)
            if status is None:
                raise
            what = f"{variant.name} seed {seed}"
            raise RunStopped(status, what, recorder.steps, run_dir) from None
    seconds = time.perf_counter() - start
    result = RunResult(
        variant=variant.name,
        seed=seed,
        parameters=0,
        val_loss=math.nan,
        val_loss_unclipped=None,
        tokens_per_sec=recorder.tokens_per_sec(),
        max_grad_norm=recorder.max_grad_norm(),
        spikes=0,
        steps=recorder.steps,
        nonfinite=nonfinite,
        seconds=seconds,
        run_dir=run_dir,
        resumed_at=recorder.start_step,
    )
    module, trainer = (
        (cli.model, cli.trainer) if cli is not None else (recorder.module, recorder.trainer)
    )
    if module is not None:  # a NaN run's too: what it trained, not zeros
        result.device = device_slug(trainer.strategy.root_device)
        result.schedule = schedule_of(module, trainer, trainer.datamodule)
        result.parameters = sum(p.numel() for p in module.model.parameters())
        result.spikes = module.grad_spikes
    if cli is None:
        return result
    late = late_stop(
        signum for callback in trainer.callbacks for signum in getattr(callback, "late_signals", ())
    )
    result.val_loss = float(trainer.callback_metrics["val/loss"])
    what = f"{variant.name} seed {seed}"
    if any(getattr(m, "output_range", None) is not None for m in module.modules()):
        try:
            with _quiet(), clipping_disabled(module.model), _unlogged(trainer):
                metrics = trainer.validate(module, datamodule=cli.datamodule, verbose=False)
        except (SystemExit, KeyboardInterrupt) as stopped:
            # The run has trained and been scored: it goes into the report (without its
            # clip effect), and the bench stops, as after a signal at its last step.
            status = stop_status(stopped)
            if status is None:
                raise
            result.clip_unmeasured = True
            raise RunStopped(status, what, result.steps, run_dir, finished=result) from None
        result.val_loss_unclipped = float(metrics[0]["val/loss"])
    if late is not None:  # its StopOnSignal kept it for what runs it, as a sweep worker reads it
        raise RunStopped(128 + late, what, result.steps, run_dir, finished=result)
    return result


@contextlib.contextmanager
def _unlogged(trainer: Any) -> Iterator[None]:
    """No logger for a validation only the report reads (the clip effect's): its val/loss,
    logged at the run's last step after the run's own, was the one `cofr compare` and the
    MLflow UI showed."""
    loggers = trainer.loggers
    trainer.loggers = []
    try:
        yield
    finally:
        trainer.loggers = loggers


def schedule_of(module: Any, trainer: Any, datamodule: Any) -> dict[str, Any]:
    """The settings a run trained with, whichever file or flag set them."""
    optimizer = module.optimizer_config
    return {
        "steps": trainer.max_steps,
        "batch_size": datamodule.batch_size,
        "block_size": datamodule.block_size,
        "lr": optimizer.lr,
        "warmup_steps": optimizer.warmup_steps,
        "min_lr_ratio": optimizer.min_lr_ratio,
        "weight_decay": optimizer.weight_decay,
    }


def describe_schedule(schedule: dict[str, Any]) -> str:
    """``200 steps of 16 x 128 tokens, lr 0.001 (warm-up 20, cosine to 0.1x), weight
    decay 0.1``."""
    return (
        f"{schedule['steps']} steps of {schedule['batch_size']} x {schedule['block_size']} "
        f"tokens, lr {schedule['lr']:g} (warm-up {schedule['warmup_steps']}, cosine to "
        f"{schedule['min_lr_ratio']:g}x), weight decay {schedule['weight_decay']:g}"
    )


def trained_with(results: Sequence[RunResult]) -> str:
    """The finished runs' schedules: one, or each variant's where they differ."""
    described = {r.variant: describe_schedule(r.schedule) for r in results if r.schedule}
    if len(set(described.values())) <= 1:
        return next(iter(described.values()), "")
    return "; ".join(f"{variant}: {text}" for variant, text in described.items())


# -------------------------------------------------------------------------- the report


@dataclass
class Row:
    variant: str
    about: str
    parameters: int
    val_mean: float
    val_std: float | None  # None from fewer than two finished seeds
    delta_gpt2: float | None
    delta_matched: float | None
    clip_effect: float | None  # mean of (clipped - unclipped) val loss
    clip_seeds: int  # the seeds it is the mean of
    clip_unmeasured: int  # seeds a signal stopped before their unclipped validation
    tokens_per_sec: float
    spike_share: float | None  # None: no run had a step with a full window before it
    max_grad_norm: float
    nonfinite: int
    seeds: int


def _mean_std(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample std of the finite values; std None from fewer than two (one seed
    has no spread to show: it read "± 0.0000")."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return math.nan, None
    return statistics.fmean(finite), statistics.stdev(finite) if len(finite) > 1 else None


def _mean_and_spread(mean: float, std: float | None) -> str:
    if not math.isfinite(mean):
        return "n/a"
    return f"{mean:.4f} ± {std:.4f}" if std is not None else f"{mean:.4f} (one seed)"


def _delta(runs: list[RunResult], baseline: list[RunResult] | None) -> float | None:
    """Mean val-loss difference to ``baseline`` over the seeds both finished (a NaN run
    dropped from one mean only would compare different seeds); None without a pair."""
    theirs = {r.seed: r.val_loss for r in baseline or [] if math.isfinite(r.val_loss)}
    pairs = [
        r.val_loss - theirs[r.seed] for r in runs if math.isfinite(r.val_loss) and r.seed in theirs
    ]
    return statistics.fmean(pairs) if pairs else None


def _finite_median(values: list[float]) -> float:
    """The median of the finite ``values`` (NaN when none is: a run of one step)."""
    finite = [v for v in values if math.isfinite(v)]
    return statistics.median(finite) if finite else math.nan


def summarize(results: list[RunResult]) -> list[Row]:
    from cofrgenet.training.module import SPIKE_WINDOW

    by_variant: dict[str, list[RunResult]] = {}
    for r in results:
        by_variant.setdefault(r.variant, []).append(r)
    rows = []
    for name, runs in by_variant.items():
        mean, std = _mean_std([r.val_loss for r in runs])
        clip = [r.val_loss - r.val_loss_unclipped for r in runs if r.val_loss_unclipped is not None]
        # Only a step with SPIKE_WINDOW norms before it can be a spike.
        tested = sum(max(0, r.steps - SPIKE_WINDOW) for r in runs)
        norms = [r.max_grad_norm for r in runs if not math.isnan(r.max_grad_norm)]  # inf: shown
        rows.append(
            Row(
                variant=name,
                about=VARIANTS[name].about,
                parameters=max(r.parameters for r in runs),
                val_mean=mean,
                val_std=std,
                delta_gpt2=_delta(runs, by_variant.get("gpt2")),
                delta_matched=_delta(runs, by_variant.get("gpt2-matched")),
                clip_effect=statistics.fmean(clip) if clip else None,
                clip_seeds=len(clip),
                clip_unmeasured=sum(r.clip_unmeasured for r in runs),
                tokens_per_sec=_finite_median([r.tokens_per_sec for r in runs]),
                spike_share=sum(r.spikes for r in runs) / tested if tested else None,
                max_grad_norm=max(norms) if norms else math.nan,
                nonfinite=sum(r.nonfinite for r in runs),
                seeds=len(runs),
            )
        )
    return rows


HEADER = [
    "variant",
    "what",
    "params",
    "val loss (mean ± std)",
    "Δ gpt2",
    "Δ matched",
    "clip effect",
    "tokens/s",
    "spike share",
    "max grad norm",
    "NaN runs",
]


def _signed(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return ""
    text = f"{value:+.4f}"
    return "0.0000" if float(text) == 0 else text  # not "-0.0000" for a tiny negative


def _clip_cell(row: Row) -> str:
    """The clip effect, with the seeds it is the mean of where a stop left some out."""
    if not row.clip_unmeasured:
        return _signed(row.clip_effect)
    of = f"{row.clip_seeds} of {row.clip_seeds + row.clip_unmeasured} seeds"
    return f"{_signed(row.clip_effect)} ({of})" if row.clip_seeds else f"n/a ({of})"


def table_rows(rows: list[Row]) -> list[list[str]]:
    return [
        [
            r.variant,
            r.about,
            f"{r.parameters:,}",
            _mean_and_spread(r.val_mean, r.val_std),
            _signed(r.delta_gpt2),
            _signed(r.delta_matched),
            _clip_cell(r),
            f"{r.tokens_per_sec:,.0f}" if math.isfinite(r.tokens_per_sec) else "n/a",
            f"{100 * r.spike_share:.1f}%" if r.spike_share is not None else "n/a",
            f"{r.max_grad_norm:.1f}" if math.isfinite(r.max_grad_norm) else "n/a",
            f"{r.nonfinite}/{r.seeds}",
        ]
        for r in rows
    ]


def to_markdown(report: dict[str, Any], rows: list[Row]) -> str:
    lines = [
        f"# Quality benchmark ({report['device']}, {report['date']})",
        "",
        f"Command: `{report['command']}`",
        "",
        f"Machine: {report['machine']}. Recipe: `{report['recipe']}` "
        f"({report['settings']}). Seeds: {report['seeds']}. Started {report['started']}, "
        f"took {report['minutes']:.1f} min.",
        "",
    ]
    if report.get("trained_with"):
        lines += [f"Trained with: {report['trained_with']}.", ""]
    if report.get("stopped") and report.get("pending"):
        lines += [
            f"**Stopped** by {report['stopped']}: {len(report['runs'])} runs finished; not "
            f"run: {', '.join(report['pending'])}. The command with `--resume` and this "
            "file trains those and completes it.",
            "",
        ]
    elif report.get("partial"):
        lines += [
            f"**Partial**: {len(report['runs'])} runs finished; still to run: "
            f"{', '.join(report['pending'])}. The finished benchmark rewrites this file.",
            "",
        ]
    lines += [
        "| " + " | ".join(HEADER) + " |",
        "|" + "|".join("---" if i < 2 else "---:" for i in range(len(HEADER))) + "|",
    ]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(rows)]
    lines += [
        "",
        "Val loss: nats per token on the validation split (all of it unless val_batches is "
        "set) after the last step, with "
        "ladder outputs clipped to their training range (the default in eval); clip effect: "
        "mean of (clipped - unclipped). Δ: mean difference over the seeds both runs finished. Spike share: steps whose "
        "pre-clip gradient norm exceeded 10x the median of the 20 before, over the steps of "
        "all seeds that have 20 before them (n/a for runs of 20 steps or fewer). Tokens/s: "
        "median per-step rate after warm-up (a shared machine: noisy; n/a: too few steps).",
    ]
    resumed = [r for r in report["runs"] if r.get("resumed_at")]
    if resumed:
        which = ", ".join(
            f"{r['variant']} seed {r['seed']} at step {r['resumed_at']}" for r in resumed
        )
        lines += [
            "",
            f"Resumed from their checkpoints after the stop: {which}. A resume trains on as "
            "one go would (docs/training.md); its tokens/s are of the steps after it.",
        ]
    unmeasured = [r for r in report["runs"] if r.get("clip_unmeasured")]
    if unmeasured:
        which = ", ".join(f"{r['variant']} seed {r['seed']}" for r in unmeasured)
        lines += [
            "",
            f"No clip effect for {which}: a stop came during the validation without "
            "clipping that measures it, after the run had trained and been scored.",
        ]
    return "\n".join(lines) + "\n"


def print_table(rows: list[Row]) -> None:
    from rich.table import Table

    table = Table(title="cofr bench quality")
    for i, name in enumerate(HEADER):
        table.add_column(name, justify="left" if i < 2 else "right")
    for cells in table_rows(rows):
        table.add_row(*cells)
    terminal.console(fit=table).print(table)


def ensure_data(cfg: QualityBenchConfig) -> None:
    """Make the default data folder from the bundled pydoc text when it is missing; one
    found there must hold the benchmark's tokens (a byte folder under that name would be
    benchmarked silently): DataFolderError otherwise."""
    from cofrgenet.data.meta import SPLIT_METHOD, DataFolderError, read_meta
    from cofrgenet.data.sources import nested_pydoc_topics

    folder = Path(cfg.data_dir)
    prepared = (folder / "meta.json").exists()
    if cfg.data_dir != QualityBenchConfig.data_dir:
        if prepared:
            return
        raise DataFolderError(
            f"--data-dir {cfg.data_dir}: no prepared data there (no meta.json); make it with "
            f"`cofr data prepare --out {cfg.data_dir}`, or leave --data-dir out to use "
            f"{QualityBenchConfig.data_dir} (made on first use)"
        )
    if prepared:
        meta = read_meta(folder)
        # What the numbers depend on; not the Python version pydoc's text came from.
        made = {
            "source": meta.source,
            "tokenizer": meta.tokenizer,
            "vocab_size": meta.tokenizer_args.get("requested_vocab_size"),
            "val_fraction": meta.split_args.get("val_fraction"),
            # Before 2026-12-06, "random documents": another validation set (the last
            # topics, for the default seed).
            "split": meta.split_args.get("method"),
            # Folders from before 2026-12-05 hold the topics that others contain: their
            # held-out topics were partly training text.
            "topics": (
                "nested ones too"
                if nested_pydoc_topics(meta.source, meta.source_args)
                else "distinct"
            ),
        }
        wanted = {"source": "pydoc", **BENCH_DATA, "split": SPLIT_METHOD, "topics": "distinct"}
        if made != wanted:
            raise DataFolderError(
                f"{folder} holds other tokens than the benchmark's ({made}; the benchmark's: "
                f"pydoc, {BENCH_DATA}, {SPLIT_METHOD}, distinct topics): move it away (`rm -r {folder}`: the next run makes it "
                "anew), or give --data-dir"
            )
        return
    from cofrgenet.data.prepare import prepare_data

    print(  # tens of seconds of tokenizing and BPE training, else unsaid
        f"making {folder} from the bundled pydoc text (BPE of {BENCH_DATA['vocab_size']} "
        f"ids, {BENCH_DATA['val_fraction']:.0%} held out): once, for every later run",
        file=sys.stderr,
    )
    prepare_data("pydoc", cfg.data_dir, num_workers=1, **BENCH_DATA)


def check_vocab_fits(cfg: QualityBenchConfig) -> None:
    """Every variant's vocabulary holds the data's token ids: ``cofr fit``'s own check
    would say "set model.config.vocab_size", which this command sets with --model-config."""
    from cofrgenet.data.meta import DataFolderError, read_meta
    from cofrgenet.models.presets import preset_dict

    try:
        data_vocab = read_meta(cfg.data_dir).vocab_size
    except DataFolderError:  # the first run's fit says what is wrong with the folder
        return
    overrides = cfg.model_overrides()
    for name in cfg.variants:
        variant = VARIANTS[name]
        fields = {**preset_dict(variant.preset), **recipe_model_config(cfg), **overrides}
        model_vocab = {**fields, **variant.config}.get("vocab_size")
        if model_vocab is not None and model_vocab < data_vocab:
            fix = json.dumps({**overrides, "vocab_size": data_vocab})
            raise ConfigError(
                f"--data-dir {cfg.data_dir}: its tokenizer has {data_vocab} token ids but "
                f"{name}'s vocab_size is {model_vocab}: give --model-config '{fix}' (or more), "
                "or data prepared with the recipe's tokenizer"
            )


#: How the benchmark's default data folder is made (conf/experiment/quality-cpu.yaml's).
BENCH_DATA = {"tokenizer": "bpe", "vocab_size": 2048, "val_fraction": 0.15}


def run_benchmark(
    cfg: QualityBenchConfig,
    command: str,
    on_update: Callable[[dict[str, Any], list[Row]], None] | None = None,
    earlier: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], list[Row]]:
    """Train every variant for every seed; the report and its rows. ``on_update`` gets
    the partial report after each run (marked ``partial``, with the runs ``pending``).
    ``earlier``: the report of a stopped bench of the same settings (``--resume``), whose
    finished runs are kept and not trained again. ``cfg`` has passed :func:`check_models`
    (``run`` checks it before any folder is made)."""
    cfg = replace(cfg, recipe=str(bundled(cfg.recipe)))  # conf/... from any folder
    results = [] if earlier is None else finished_runs(earlier, cfg)
    ensure_data(cfg)
    check_vocab_fits(cfg)
    now = dt.datetime.now(dt.timezone.utc)
    # A resumed bench keeps its start (its date and file); its minutes count trained time.
    started = now if earlier is None else dt.datetime.fromisoformat(earlier["started"])
    # ... and its runs' names (the stamp of its start), so that the run it stopped in
    # goes on from that run's checkpoint.
    stamp = started.strftime("%Y%m%d-%H%M%S")
    before = 0.0 if earlier is None else float(earlier["minutes"])
    command = command if earlier is None else earlier["command"]
    # Seed-major: a drifting machine load hits every variant alike.
    order = [(seed, name) for seed in cfg.seeds for name in cfg.variants]
    done = {(r.seed, r.variant) for r in results}

    def report(pending: list[str]) -> tuple[dict[str, Any], list[Row]]:
        minutes = before + (dt.datetime.now(dt.timezone.utc) - now).total_seconds() / 60
        return _report(cfg, command, started, results, pending, minutes)

    if on_update is not None:
        # Before the first run: a stop in it (hours, at full size) leaves a report whose
        # --resume goes on with that run from its checkpoint.
        on_update(*report(_pending(order, done)))
    for index, (seed, name) in enumerate(order):
        if (seed, name) in done:
            continue
        try:
            result = run_variant(cfg, VARIANTS[name], seed, stamp, resume=earlier is not None)
        except RunStopped as stopped:  # after its last step: in the report, then stop
            if stopped.finished is not None and on_update is not None:
                results.append(stopped.finished)
                on_update(*report(_pending(order[index + 1 :], done)))
            raise
        results.append(result)
        resumed = f" (resumed at step {result.resumed_at})" if result.resumed_at else ""
        print(
            f"{name} seed {seed}{resumed}: val loss {result.val_loss:.4f}, "
            f"{result.tokens_per_sec:,.0f} tokens/s, {result.seconds:.0f} s",
            file=sys.stderr,
        )
        pending = _pending(order[index + 1 :], done)
        if on_update is not None and pending:
            on_update(*report(pending))
    return report([])


def _pending(order: list[tuple[int, str]], done: set[tuple[int, str]]) -> list[str]:
    """The runs of ``order`` still to train, as the report names them."""
    return [f"{name} seed {seed}" for seed, name in order if (seed, name) not in done]


def finished_runs(earlier: dict[str, Any], cfg: QualityBenchConfig) -> list[RunResult]:
    """The finished runs of a stopped bench's report ``earlier``, refused unless it ran
    with ``cfg``'s settings (its numbers would stand beside others of other settings)."""
    theirs = asdict(config_of(earlier))
    ours = asdict(cfg)
    differ = [
        f"{key}: {_shown(theirs.get(key))} there, {_shown(value)} here"
        for key, value in ours.items()
        if key not in ("out_dir", "runs_dir") and _shown(theirs.get(key)) != _shown(value)
    ]
    if differ:
        raise ConfigError(
            f"--resume: that bench ran with other settings ({'; '.join(differ)}): resume it "
            f"with its own command, {earlier.get('command')!r}"
        )
    # The report's JSON holds a NaN as null (strict JSON).
    nan_as_null = ("val_loss", "tokens_per_sec", "max_grad_norm")
    return [
        RunResult(**{k: math.nan if k in nan_as_null and v is None else v for k, v in run.items()})
        for run in earlier.get("runs") or []
    ]


def config_of(report: dict[str, Any]) -> QualityBenchConfig:
    """The settings a report's bench ran with (its ``config``). A shape field in its
    --model-config (taken before the shape options owned them) moves to its option."""
    names = {f.name for f in fields(QualityBenchConfig)}
    config = {k: v for k, v in report["config"].items() if k in names}
    with contextlib.suppress(ValueError, TypeError):
        model = json.loads(config.get("model_config") or "{}")
        for key in SHAPE_OPTIONS:
            if key in model and config.get(key) in (None, model[key]):
                config[key] = model.pop(key)
        config["model_config"] = json.dumps(model) if model else None
    return QualityBenchConfig(**config)


def _shown(value: Any) -> Any:
    """A config value as its report's JSON holds it (tuples as lists)."""
    return json.loads(json.dumps(value, default=str))


def read_resumed(path: str) -> dict[str, Any]:
    """The report ``--resume`` names (its .json; the .md beside it is taken for it)."""
    file = Path(path)
    file = file.with_suffix(".json") if file.suffix == ".md" else file
    try:
        earlier = json.loads(file.read_text())
    except FileNotFoundError:
        beside = (
            f" ({file.name}, the report's data beside it, is missing)" if file != Path(path) else ""
        )
        raise ConfigError(f"--resume {path}: no such report{beside}") from None
    except (OSError, ValueError) as error:
        raise ConfigError(
            f"--resume {path}: not a report of cofr bench quality ({error})"
        ) from None
    if not isinstance(earlier, dict) or not {"config", "runs", "started"} <= set(earlier):
        raise ConfigError(f"--resume {path}: not a report of cofr bench quality")
    if not earlier.get("partial"):
        raise ConfigError(f"--resume {path}: that bench finished; nothing is left to run")
    return earlier


def _report(
    cfg: QualityBenchConfig,
    command: str,
    started: dt.datetime,
    results: list[RunResult],
    pending: list[str],
    minutes: float,
) -> tuple[dict[str, Any], list[Row]]:
    """The report of the runs finished so far (``partial`` while runs are ``pending``),
    ``minutes`` of training in (a resumed bench's earlier minutes included)."""
    settings = {k: getattr(cfg, k) for k in QUICK}
    settings |= {"lr": cfg.lr, "val_batches": cfg.val_batches, "dyadic": cfg.dyadic}
    settings |= {"model config": cfg.model_config}
    # The recipe's trainer decides where the runs train (quality-cpu.yaml: the CPU).
    devices = sorted({r.device for r in results if r.device}) or [expected_device(cfg)]
    report = {
        "command": command,
        "date": started.date().isoformat(),
        "started": started.isoformat(timespec="seconds"),
        "minutes": minutes,
        "device": "+".join(devices),
        "machine": machine_summary("cpu" if devices == ["cpu"] else "cuda"),
        "recipe": cfg.recipe,
        "settings": ", ".join(f"{k} {v}" for k, v in settings.items() if v is not None)
        or "as in the recipe",
        "trained_with": trained_with(results),
        "seeds": list(cfg.seeds),
        "config": asdict(cfg),
        "runs": [asdict(r) for r in results],
    }
    if pending:
        report |= {"partial": True, "pending": pending}
    rows = summarize(results)
    report["rows"] = [asdict(r) for r in rows]
    return report, rows


def report_stem(report: dict[str, Any], out_dir: Path) -> Path:
    """The free ``quality-<device>-<date>[-quick][-tag]`` stem in ``out_dir``."""
    suffix = "-quick" if report["config"]["quick"] else ""
    if report["config"]["tag"]:
        suffix += f"-{report['config']['tag']}"
    return free_stem(out_dir, f"quality-{report['device']}-{report['date']}{suffix}")


def write_report(report: dict[str, Any], rows: list[Row], stem: Path) -> tuple[Path, Path]:
    stem.parent.mkdir(parents=True, exist_ok=True)
    md, js = with_suffix(stem, ".md"), with_suffix(stem, ".json")
    write_text_atomic(md, to_markdown(report, rows))
    write_text_atomic(js, strict_json(_shown(report)))  # NaN as null
    return md, js


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Options stay out of the namespace unless given: --resume lays them over the report's.
    add_dataclass_arguments(parser, QualityBenchConfig, given_only=True)
    parser.add_argument(
        "--resume",
        metavar="REPORT",
        default=None,
        help="a stopped bench's partial report (.json or .md): train only the runs it "
        "lacks, with its settings (an option given must agree with them; the run it "
        "stopped in goes on from its newest checkpoint), and complete that report",
    )


def resume_command(command: str, report: Path) -> str:
    """``command`` (a bench's own) with ``--resume`` naming its partial ``report``."""
    words = shlex.split(command)
    kept: list[str] = []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word == "--resume":
            skip = True
        elif not word.startswith("--resume="):
            kept.append(word)
    return shlex.join([*kept, "--resume", str(report.with_suffix(".json"))])


def _stopped_by(error: BaseException) -> str:
    """What ended the bench early, as its report says it."""
    return error.how() if isinstance(error, RunStopped) else stopped_by(error)


def run(args: argparse.Namespace) -> int:
    resume = getattr(args, "resume", None)
    earlier = read_resumed(resume) if resume else None
    # A resumed bench's settings are its report's; the options given go over them (and
    # one that differs is refused by finished_runs, naming it).
    base = None if earlier is None else config_of(earlier)
    cfg = dataclass_from_args(QualityBenchConfig, args, base=base)
    check_models(replace(cfg, recipe=str(bundled(cfg.recipe))))  # before any folder is made
    out_dir = make_out_dir(cfg.out_dir)  # now: a folder it cannot write fails before training
    # The runs' folders too, named by this command's option (the fit's says --run.runs_dir).
    make_out_dir(cfg.runs_dir, "--runs-dir")
    # A resumed bench completes the stopped one's own files.
    stem = stem_once(
        lambda report: Path(resume).with_suffix("") if resume else report_stem(report, out_dir)
    )
    command = getattr(args, "command_line", "cofr bench quality")
    # The latest partial report written: (report, rows, its .md).
    written: list[tuple[dict[str, Any], list[Row], Path]] = []

    def save_partial(report: dict[str, Any], rows: list[Row]) -> None:
        written[:] = [(report, rows, write_report(report, rows, stem(report))[0])]

    try:
        # SIGTERM raises between and inside the runs as in `cofr fit` (its default action
        # ended the bench unsaid); each fit's StopOnSignal takes it over while it trains.
        with sigterm_raises(lightning_sigterm):
            report, rows = run_benchmark(cfg, command, save_partial, earlier)
    except BaseException as error:  # Ctrl-C, a failed run: say where the finished runs are
        if isinstance(error, RunStopped) and error.finished is not None:
            print(
                f"stopped by {error.how()} after the run of {error.what} had trained "
                f"({error.run_dir}): it is in the report",
                file=sys.stderr,
            )
        elif isinstance(error, RunStopped) and not error.steps:  # its folder is gone too
            print(
                f"stopped by {error.how()} in the run of {error.what} before its first step"
                + ("; --resume trains it" if written else ""),
                file=sys.stderr,
            )
        elif isinstance(error, RunStopped):
            print(
                f"stopped by {error.how()} in the run of {error.what} after step "
                f"{error.steps} ({error.run_dir}): it is not in the report"
                + ("; --resume goes on with it from its newest checkpoint" if written else ""),
                file=sys.stderr,
            )
        if written:
            report, rows, md = written[0]
        if written and isinstance(error, UserError) and not report["runs"] and not resume:
            # A setting refused before any run finished (a block the data cannot fill): the
            # error says what to fix; a partial report and a --resume would only repeat it.
            for ext in (".md", ".json"):
                with_suffix(stem(report), ext).unlink(missing_ok=True)
        elif written and not report.get("pending"):  # stopped after the last run: whole
            print(f"stopped after the last run: the report {md} is complete", file=sys.stderr)
        elif written:
            # "The finished benchmark rewrites this file": not this one any more. A failed
            # write must not hide what stopped the bench.
            with contextlib.suppress(OSError):
                write_report({**report, "stopped": _stopped_by(error)}, rows, stem(report))
            what = (
                "the runs finished so far are"
                if report["runs"]
                else "no run had finished; the runs to train are"
            )
            print(
                f"stopped: {what} in {md} (partial); to train the rest into it: "
                f"{resume_command(command, md)}",
                file=sys.stderr,
            )
        if isinstance(error, RunStopped) and error.code == 128 + signal.SIGINT:
            raise KeyboardInterrupt from None  # `cofr: interrupted`, status 130, as elsewhere
        raise
    print_table(rows)
    md, js = write_report(report, rows, stem(report))
    print(f"wrote {md} and {js}")
    return 0
