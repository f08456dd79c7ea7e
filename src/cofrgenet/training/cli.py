"""``cofr fit | validate | test``: LightningCLI over LanguageModel and TokenDataModule.

Configs compose: pass several ``--config`` files (later ones win), e.g.::

    cofr fit --config conf/trainer/cpu-debug.yaml --config conf/data/pydoc-byte.yaml \
             --model.preset gpt2-mini-f --run.experiment mine

or one experiment file from ``conf/experiment/``, which names its groups as ``base:``
(:mod:`cofrgenet.recipes`). Every run gets a folder under
``runs/<experiment>/<name>/`` with its checkpoints and config, and an MLflow run in
``runs/mlflow.db`` that a resume (``--ckpt_path last``) or a SLURM requeue continues.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import datetime
import difflib
import importlib
import os
import re
import shlex
import shutil
import signal
import sys
import traceback
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from jsonargparse import Namespace
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import (
    Callback,
    ModelCheckpoint,
    RichProgressBar,
)
from lightning.pytorch.cli import LightningArgumentParser, SaveConfigCallback
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only, rank_zero_warn
from lightning.pytorch.utilities.exceptions import MisconfigurationException, SIGTERMException
from torch.multiprocessing import ProcessRaisedException

from cofrgenet import cli_cache, recipes
from cofrgenet.atomic import missing_folders, remove_empty_folders, write_text_atomic
from cofrgenet.config_variables import expand_variables
from cofrgenet.data import TokenDataModule
from cofrgenet.data.meta import TOKENIZER_KEYS, copy_tokenizer
from cofrgenet.devices import device_count, devices_used
from cofrgenet.errors import (
    SEED_LIMIT,
    ConfigError,
    UserError,
    check_seed,
    did_you_mean,
    first_line,
    raised_from,
)
from cofrgenet.models import ModelConfig
from cofrgenet.models.presets import list_presets
from cofrgenet.ops.triton_interpreter import interpreted as triton_interpreted
from cofrgenet.signals import lightning_sigterm, sigterm_raises
from cofrgenet.training import checkpoints
from cofrgenet.training.callbacks import (
    DyadicUnfreezing,
    LadderHealthMonitor,
    NonFiniteLossGuard,
    StopOnSignal,
    frozen_depths_need_unused_parameters,
    ladder_layers,
    validates_at,
)
from cofrgenet.training.checkpoint_callback import RunCheckpoint
from cofrgenet.training.checkpoint_io import AtomicCheckpointIO
from cofrgenet.training.config_words import (
    SINGLE_DASH_SLIPS,
    TYPE_NAMES,
    bad_callback_class,
    bad_choice,
    bad_class_option,
    bad_config_file,
    bad_nested_key,
    bad_section_file,
    bad_union,
    bad_value,
    bases_undoing_earlier_files,
    close_file,
    file_keys,
    file_word,
    given_key,
    key_path,
    lists_replaced_by_later_files,
    naming_the_file,
    replaced_by_later_files,
)
from cofrgenet.training.console import (
    ModelReport,
    RunSummary,
    StepProgressBar,
    quiet_known_noise,
)
from cofrgenet.training.lightning_cli import LightningCLIAdapter, with_default_plugin
from cofrgenet.training.module import LanguageModel, check_compile_strategy
from cofrgenet.training.optim import OptimizerConfig
from cofrgenet.training.perf import peak_flops_from_env
from cofrgenet.training.run_store import (
    RUN_DIR_TAG,
    RUN_ID_FILE,
    RUN_TOKENIZER_DIR,
    STARTED_FROM_TAG,
    RunConfig,
    artifact_location,
    check_store_writable,
    check_tracking_uri,
    resolve_run_dir,
    slurm_run_name,
    sqlite_database,
    tracking_uri,
    unreachable_run,
)
from cofrgenet.training.runlock import LOCK_FILE, HoldRunLock, RunLock
from cofrgenet.training.strategies import LadderFSDPStrategy, is_fsdp
from cofrgenet.training.tracking import CofrMLFlowLogger, check_own_run, data_params

#: The class path a config names cofr's FSDP strategy by.
LADDER_FSDP = f"{LadderFSDPStrategy.__module__}.{LadderFSDPStrategy.__qualname__}"

#: The subcommands that evaluate a checkpoint (of the run named, or the latest run).
EVALUATIONS = ("validate", "test")

#: The help of ``--model``, ``--model.config``, ``--data``...: jsonargparse's says "Path to
#: a configuration file.", and the README gives ``--model.config`` a JSON mapping.
SECTION_HELP = "the fields below as one mapping: inline ('{field: value, ...}') or a YAML file"

#: The start of Lightning's warning that a checkpoint's callbacks are not all configured.
_CALLBACKS_NOT_GIVEN = "Be aware that when using `ckpt_path`, callbacks used to create"

#: ``--ckpt_path`` as cofr reads it (Lightning's own help names keywords cofr does not
#: take: any value but ``last`` is a path).
CKPT_PATH_HELP = {
    "fit": (
        "resume from this checkpoint file, or from `last`: the run's newest intact "
        "checkpoint (checkpoints/last.ckpt, checkpoints/step*.ckpt, a SLURM requeue's "
        "hpc_ckpt_*.ckpt), a damaged newer one passed over with a warning; without "
        "--run.name (outside SLURM), the run of --run.experiment with the newest "
        "checkpoint (an error if none has one); a named run with no folder starts "
        "fresh. Unset: a new run"
    ),
    **dict.fromkeys(
        EVALUATIONS,
        "the checkpoint file to evaluate, or `last` (also when unset): the newest intact "
        "checkpoint of the run named by --run.experiment and --run.name (without "
        "--run.name, outside SLURM: the experiment's run with the newest checkpoint)",
    ),
}

#: What ``cofr fit/validate/test --help`` say first, in place of Lightning's docstrings.
DESCRIPTIONS = {
    "fit": (
        "Train a model: a new run, or one resumed with --ckpt_path last. Model, data, "
        "trainer and run settings come from YAML files (--config, later files win) and "
        "options (docs/training.md)."
    ),
    "validate": (
        "Score a checkpoint on its data folder's held-out split, val: val/loss and val/ppl, "
        "logged to its run at the checkpoint's step."
    ),
    "test": (
        "Score a checkpoint like validate, logged as test/loss and test/ppl: a prepared data "
        "folder has one held-out split, val (docs/training.md)."
    ),
}


class RunExistsError(UserError, FileExistsError):
    """A fresh fit named a run folder that holds another run's checkpoints or MLflow run."""


class ConfigToRun(SaveConfigCallback):
    """Save the resolved config in the run folder and in the run's MLflow record."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, save_to_log_dir=False, **kwargs)

    def save_config(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":  # an evaluation keeps the config the run was trained with
            return
        # Whole as it is: the bases it was built on are in it already, and their paths
        # (relative to where the run started) would not resolve from elsewhere.
        config = self.config.clone()
        config[recipes.KEY] = None
        if config.get("model") is not None and config.model.get("optimizer") is None:
            # `optimizer: null` would reset the section (refused when the file is read).
            config.model.optimizer = Namespace(**dataclasses.asdict(OptimizerConfig()))
        yaml_text = self.parser.dump(config, skip_none=False)
        run_dir = Path(trainer.default_root_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(run_dir / "config.yaml", yaml_text)
        data_dir = getattr(trainer.datamodule, "data_dir", None)
        if data_dir is not None:  # kept by a resume: the data it checked is the same
            copy_tokenizer(data_dir, run_dir / RUN_TOKENIZER_DIR)
        for logger in trainer.loggers:
            if isinstance(logger, CofrMLFlowLogger):
                logger.remember_run()
                model_config = getattr(pl_module, "model_config", None)
                data = data_params(trainer.datamodule)
                logger.log_config(self.config.clone().as_dict(), yaml_text, model_config, data)


def _recorded_seed(settings: Any) -> int | None:
    """The seed a resumed run (its folder holds its ``config.yaml``) drew when it started
    with ``seed_everything: true``: its resume, a sweep trial's retry, keep it (a new
    draw would rewrite the record of what seeded its initial weights). None: a new run."""
    try:
        run = _run_config(settings.get("run") or {})
        run_dir = resolve_run_dir(run, resume_last=settings.get("ckpt_path") == "last")
        import yaml

        recorded = yaml.safe_load((run_dir / "config.yaml").read_text())
    except Exception:  # no folder, a config.yaml of another kind: a new draw
        return None
    seed = recorded.get("seed_everything") if isinstance(recorded, dict) else None
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def drawn_seed() -> int:
    """``seed_everything: true``'s seed: a random one (recorded in the run's config.yaml
    as given), or the launcher's where Lightning started this process as a rank of it
    (a ``LOCAL_RANK`` above 0 and its ``PL_GLOBAL_SEED``; in a process that fits again,
    the variable an earlier fit left is not a launcher's). Ranks that srun or torchrun
    started would each draw their own: refused, with the fix."""
    import secrets

    inherited = os.environ.get("PL_GLOBAL_SEED")
    # Lightning's launcher sets LOCAL_RANK=0 in its own process too: a later fit there
    # must not take the earlier one's seed.
    if inherited is not None and os.environ.get("LOCAL_RANK", "0") not in ("", "0"):
        return int(inherited)
    launched = {
        "srun": os.environ.get("SLURM_STEP_NUM_TASKS"), "torchrun": os.environ.get("WORLD_SIZE")
    }  # fmt: skip
    for launcher, ranks in launched.items():
        if ranks is not None and ranks.isdigit() and int(ranks) > 1:
            raise ConfigError(
                f"seed_everything: true draws a seed in each process, and the {ranks} ranks "
                f"{launcher} started would train with different ones: give the seed, e.g. "
                "--seed_everything 1234"
            )
    return secrets.randbelow(SEED_LIMIT)


def _run_config(value: Any) -> RunConfig:
    """The ``run`` settings, parsed (a Namespace) or instantiated."""
    if isinstance(value, RunConfig):
        return value
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    return RunConfig(**{k: v for k, v in dict(value).items() if k in fields})


def _newest_intact_checkpoint(run_dir: Path, doing: str) -> Path | None:
    """The run's newest intact checkpoint (None: it has none), with a warning that names
    a damaged newer one passed over (``doing`` that one instead); only damaged ones: an
    error."""
    chosen, skipped = checkpoints.newest_intact(run_dir)
    if chosen is None and skipped:
        raise checkpoints.damaged(skipped[0])
    if chosen is not None and skipped:
        rank_zero_warn(f"{skipped[0]} is damaged (a save cut short?): {doing} {chosen} instead")
    return chosen


def _check_not_stopped_on_nonfinite(run_dir: Path) -> None:
    """``--ckpt_path last`` of a run that stopped on a NaN/Inf loss before any other
    checkpoint: from step 0, with the settings changed to avoid it (a lower learning
    rate), it would log a second history into the run's MLflow run, whose first steps keep
    the diverged values (a resume drops the steps the run has logged)."""
    stopped = checkpoints.nonfinite_checkpoints(run_dir)
    if not stopped:
        return
    newest = max(stopped, key=lambda p: p.name)
    raise RunExistsError(
        f"run folder {run_dir} stopped on a non-finite loss and holds no checkpoint to resume "
        "from: start a new run with another --run.name, from scratch or from the weights "
        f"before that step (--ckpt_path {newest})"
    )


def _close_to_last(word: str) -> list[str]:
    """[word] when ``word`` is a mistyped ``last`` (``lats``, ``Last``), else []."""
    import difflib

    return [word] if difflib.get_close_matches(word.lower(), ["last"], cutoff=0.7) else []


def _nothing_to_evaluate(run: RunConfig, run_dir: Path) -> str:
    """Why validate/test found no checkpoint: the run named has none, or (no name given)
    no run of the experiment has one; with the runs there are, for a typo."""
    fix = "name a trained run with --run.experiment and --run.name, or a file with --ckpt_path"
    experiment_dir = run_dir.parent
    if not experiment_dir.is_dir():  # a mistyped experiment: the ones with runs
        runs_dir = experiment_dir.parent
        experiments = [
            p.name
            for p in (sorted(runs_dir.iterdir()) if runs_dir.is_dir() else [])
            if p.is_dir() and any(p.glob("*/config.yaml"))
        ]
        hint = did_you_mean(experiment_dir.name, experiments)
        listed = f" (experiments there: {', '.join(experiments[:8])})" if experiments else ""
        return f"no experiment {run.experiment!r} in {runs_dir}{hint or listed}: {fix}"
    runs = sorted(p.name for p in experiment_dir.iterdir() if p.is_dir())
    if run.name is not None or slurm_run_name() is not None:
        others = [name for name in runs if name != run_dir.name]  # not itself, if it is there
        # A name that starts dated ones (`gpt2` of `gpt2-20261204-103816`): the newest.
        stamp = re.compile(rf"{re.escape(run_dir.name)}-\d{{8}}-\d{{6}}(-\d+)?")
        dated = [name for name in others if stamp.fullmatch(name)]
        hint = did_you_mean(run_dir.name, others) or (
            f" (did you mean {dated[-1]!r}, the newest run named so?)" if dated else ""
        )
        return f"{run_dir} holds no checkpoint to evaluate{hint}: {fix}"
    if not runs:
        return f"experiment {run.experiment!r} has no run in {experiment_dir}: {fix}"
    return f"no run of experiment {run.experiment!r} in {experiment_dir} has a checkpoint: {fix}"


def _in_another_experiment(run_dir: Path) -> str:
    """`` (did you mean --run.experiment 'mine'? runs/mine/first exists)`` when a run of
    ``run_dir``'s name is in another experiment's folder (the closest to the one given,
    ``run_dir``'s parent), else ``""``: a typo in the experiment, not a first start."""
    experiment = run_dir.parent
    try:
        others = [p for p in experiment.parent.iterdir() if p != experiment and p.is_dir()]
    except OSError:  # no runs folder yet
        return ""
    holding = {p.name: p for p in others if (p / run_dir.name).is_dir()}
    if not holding:
        return ""
    close = difflib.get_close_matches(experiment.name, list(holding), n=1, cutoff=0.0)
    name = close[0] if close else sorted(holding)[0]
    return f" (did you mean --run.experiment {name!r}? {holding[name] / run_dir.name} exists)"


def _holds_only_lock(run_dir: Path) -> bool:
    return run_dir.is_dir() and [p.name for p in run_dir.iterdir()] == [LOCK_FILE]


class CofrCLI(LightningCLIAdapter):
    """LightningCLI with run folders, MLflow tracking and the project's default callbacks.

    ``extra_callbacks``: callbacks added to whatever the configs ask for (a sweep's pruner,
    a benchmark's recorder); one of a default callback's type replaces that default (a
    sweep's StopOnSignal, which names the sweep's command).
    """

    #: True where the caller wrote the run folder's MLflow run id before a fresh fit (a
    #: sweep's trial logs into the child run it made); a fresh ``cofr fit`` refuses a
    #: folder that holds one.
    run_id_from_caller = False
    #: Whether this start said already that its --ckpt_path last run folder is missing.
    _said_no_run_folder = False
    #: fit --ckpt_path FILE: the --model options given, as parsed before LightningCLI laid
    #: the file's hyperparameters over them ({"--model.optimizer.lr": 0.1}).
    _given_model: dict[str, Any] = {}  # noqa: RUF012 (replaced, never changed in place)

    def __init__(
        self,
        args: list[str] | None = None,
        run: bool = True,
        extra_callbacks: list[Callback] | None = None,
        **kwargs: Any,
    ) -> None:
        self.extra_callbacks = list(extra_callbacks or [])
        self.with_subcommands = run  # LightningCLI adds fit, validate, ... only to run one
        #: Said again below the fit's summary lines (a start-up warning scrolls away).
        self.summary_notes: list[str] = []
        quiet_known_noise()
        try:
            super().__init__(
                LanguageModel,
                TokenDataModule,
                save_config_callback=ConfigToRun,
                save_config_kwargs={"overwrite": True},
                seed_everything_default=1337,
                auto_configure_optimizers=False,
                # Parse errors raise (ArgumentError) instead of printing the whole usage
                # text: parse_arguments turns them into one line with a did-you-mean.
                parser_kwargs={"prog": "cofr", "exit_on_error": False},
                args=args,
                run=run,
                **kwargs,
            )
        except argparse.ArgumentError as error:
            # After the command line, Lightning parses the hyper-parameters of the
            # checkpoint an evaluation or resume reads: a mixer of the user's own that
            # this process has not registered (its module not imported) fails there.
            registered = re.search(r'Parser key "model\.config\.(arch|attention|ffn)', str(error))
            hint = (
                " (a mixer of your own is registered by importing its module first: run "
                "the command through your script, docs/architecture.md)"
                if registered
                else ""
            )
            raise ConfigError(
                f"the checkpoint's settings: {self._explain(str(error), args)}{hint}"
            ) from None

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        if self.with_subcommands:
            for subcommand, text in CKPT_PATH_HELP.items():
                self.set_help(subcommand, "--ckpt_path", text)
                self.set_description(subcommand, DESCRIPTIONS[subcommand], "checkpoint")
                for option in self.section_options(subcommand):
                    self.set_help(subcommand, option, SECTION_HELP)
        words = list(sys.argv[1:] if args is None else args)
        self._words = words  # for the errors of the classes built from them
        expanded = recipes.expand(words)
        if expanded != words:  # else leave args as given (Lightning warns about argv + args)
            args = expanded
        if words and words[0] in self.subcommands():
            # What the next `cofr <subcommand>` checks before importing us; stored before
            # parsing, so that `--help` (which exits inside the parse) stores them too.
            keys = self.subcommand_parser(words[0]).get_defaults().keys()
            cli_cache.store_keys(words[0], keys)
            cli_cache.store_presets(list_presets())
        for word in words:  # `-config x`: argparse would read `-c onfig`
            key = word[1:].split("=", 1)[0].rstrip("+")
            if word[:2] != "--" and word[:1] == "-" and key.split(".")[0] in SINGLE_DASH_SLIPS:
                raise ConfigError(f"-{key}: options take two dashes (--{key})")
        # --base+ too: jsonargparse's append form, which it would take and then ignore.
        if any(w.split("=", 1)[0].rstrip("+") == f"--{recipes.KEY}" for w in words):
            raise ConfigError(
                f"--{recipes.KEY} is read in config files only; on the command line give "
                "each file with --config, bases first"
            )
        # before jsonargparse resets a section for it
        bad_file = bad_config_file(expanded) or bad_section_file(expanded)
        if bad_file is not None:
            raise ConfigError(bad_file)
        for replaced in replaced_by_later_files(expanded):
            rank_zero_warn(f"{replaced}: put options after the --config files they change")
        for dropped in lists_replaced_by_later_files(words):
            rank_zero_warn(dropped)
        for undone in bases_undoing_earlier_files(words):
            rank_zero_warn(undone)
        try:
            super().parse_arguments(parser, args)
        except argparse.ArgumentError as error:
            raise ConfigError(self._explain(str(error), args)) from None
        subcommand = self.config.get("subcommand")
        settings = self.config[subcommand] if subcommand else self.config
        seed = settings.get("seed_everything")
        if seed is True:  # drawn here: Lightning's "random" seed is 0 whenever it draws
            seed = _recorded_seed(settings) if subcommand == "fit" else None
            settings["seed_everything"] = seed = drawn_seed() if seed is None else seed
        if not isinstance(seed, bool) and isinstance(seed, int):
            check_seed(seed, "seed_everything")
        # LightningCLI reads a --ckpt_path file's hyperparameters right after parsing:
        # check the file before anything unpickles it.
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if ckpt_path not in (None, "last"):
            if not Path(ckpt_path).exists() and ckpt_path in ("best", *_close_to_last(ckpt_path)):
                raise checkpoints.CheckpointError(
                    f"--ckpt_path {ckpt_path}: no such file (--ckpt_path last takes the run's "
                    "newest checkpoint; any other value is a checkpoint file's path)"
                )
            checkpoints.check(ckpt_path)
            if subcommand in EVALUATIONS and checkpoints.is_sharded(ckpt_path):
                self._use_sharded_hyperparameters(subcommand, Path(ckpt_path))
        elif subcommand in EVALUATIONS:
            self._evaluate_newest_checkpoint(subcommand)
        if subcommand in EVALUATIONS and not recipes.config_paths(words):
            self._score_as_the_fit_did(subcommand, words)
        given = sorted({w.split("=", 1)[0] for w in words[1:] if w.startswith("--model")})
        if subcommand in EVALUATIONS and given:  # the checkpoint's hyperparameters build it
            rank_zero_info(
                f"cofr {subcommand} scores the checkpoint's own model: {', '.join(given)} not used"
            )
        elif subcommand == "fit" and ckpt_path not in (None, "last"):
            # LightningCLI lays a --ckpt_path file's hyperparameters over these next:
            # before_instantiate_classes says which it replaced.
            config = self.config[subcommand]
            self._given_model = {key: copy.deepcopy(config.get(key[2:])) for key in given}

    def _use_sharded_hyperparameters(self, subcommand: str, folder: Path) -> None:
        """The model of a sharded FSDP checkpoint (its ``meta.pt``), as LightningCLI
        takes a checkpoint file's: it reads files only, and the default preset was built
        and failed to load the shards ("size mismatch"). Scored under FSDP only: another
        strategy reads one file."""
        strategy = self.config[subcommand].get("trainer", {}).get("strategy")
        check_sharded_strategy(subcommand, folder, strategy)
        hparams = dict(checkpoints.saved_settings(folder).get("hyper_parameters") or {})
        hparams.pop("_instantiator", None)
        if hparams:
            self.config = self.parser.parse_object({subcommand: {"model": hparams}}, self.config)

    def _score_as_the_fit_did(self, subcommand: str, words: list[str]) -> None:
        """``cofr validate``/``test`` without ``--config``: the data and batches the run's
        own validations scored (its ``config.yaml``), for what the command does not give.
        The scores go onto the run's curves at the checkpoint's step: scored otherwise
        (the default data folder, every batch), they stood beside the fit's as its own."""
        from cofrgenet.training.pretrained import run_dir_of

        ckpt = self.config[subcommand].get("ckpt_path")
        run_dir = run_dir_of(Path(ckpt)) if ckpt not in (None, "last") else None
        saved = run_dir / "config.yaml" if run_dir is not None else None
        if saved is None or not saved.is_file():
            return
        import yaml

        try:
            fit = yaml.safe_load(saved.read_text()) or {}
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            return  # a damaged config.yaml: the command's own settings
        given = {cli_cache.option_key(w) for w in words if w.startswith("--")}

        def is_given(key: str) -> bool:  # itself, or its whole section (--data FILE)
            return key in given or key.split(".")[0] in given

        taken = []
        for key in SCORING_KEYS:
            section, field = key.split(".")
            value = (fit.get(section) or {}).get(field) if isinstance(fit, dict) else None
            if is_given(key) or value is None:
                continue
            if key == "data.val_batch_size" and is_given("data.batch_size"):
                continue  # a smaller --data.batch_size (out of memory) shrinks both
            if key.startswith("trainer.limit_") and key != _OWN_LIMIT[subcommand]:
                continue  # the other command's batches
            if key.startswith("trainer.limit_") and value == 0:
                continue  # a fit that skipped validation: this command scores all
            if key == "data.data_dir":
                value = self._trained_data_dir(str(value), Path(ckpt), run_dir)
            self.config[subcommand][key] = value
            taken.append(f"{key}={value}")
        if taken:
            rank_zero_info(
                f"cofr {subcommand} scores as the run's fit did ({saved}): {', '.join(taken)}"
            )

    @staticmethod
    def _trained_data_dir(stored: str, ckpt: Path, run_dir: Path | None) -> str:
        """The run's data folder on this machine: the checkpoint's own absolute path when
        it is here, else the run's config.yaml value (``${VAR}`` expanded) looked for
        from here and above the run folder; or a one-line error naming where it looked."""
        from cofrgenet.training.pretrained import data_dir_candidates

        tried: list[Path] = []
        with contextlib.suppress(Exception):  # unreadable: checked, and said, later
            hparams = checkpoints.saved_settings(ckpt).get("datamodule_hyper_parameters") or {}
            if hparams.get("data_dir"):
                tried.append(Path(str(hparams["data_dir"])))
        stored = expand_variables(stored, "data.data_dir (the run's config.yaml)")
        tried += [p for p in data_dir_candidates(stored, ckpt, run_dir) if p not in tried]
        for folder in tried:
            if (folder / "meta.json").is_file():
                return str(folder)
        raise ConfigError(
            f"the run trained on the data folder {stored!r}, not found as "
            f"{', '.join(map(str, tried))}: run from the folder it was trained in, or pass "
            "--data.data_dir DIR"
        )

    def _evaluate_newest_checkpoint(self, subcommand: str) -> None:
        """``cofr validate``/``test`` without a file: name the run's newest intact
        checkpoint now, so that Lightning builds the model from its hyperparameters (as it
        does for a ``--ckpt_path`` file) instead of the command's model settings.
        Without one, what is missing is said here: a mistyped run name must not wait for
        the data module, which would fail first on a default data folder."""
        config = self.config[subcommand]
        run = _run_config(config.get("run"))
        run_dir = resolve_run_dir(run, resume_last=True)
        chosen = _newest_intact_checkpoint(run_dir, "evaluating")
        if chosen is None:
            raise ConfigError(_nothing_to_evaluate(run, run_dir))
        config.ckpt_path = str(chosen)
        if checkpoints.is_sharded(chosen):  # as one given by path
            self._use_sharded_hyperparameters(subcommand, Path(chosen))

    def instantiate_classes(self) -> None:
        """Build model, data and trainer; an error in what the user gave stays one line.

        jsonargparse wraps errors of the classes it builds (e.g. OptimizerConfig's) in a
        ValueError of its own, and Lightning reports trainer settings it refuses as
        MisconfigurationException: both are bad input, not bugs."""
        try:
            super().instantiate_classes()
        except MisconfigurationException as error:
            strategy = self.config_value(self.config, "trainer.strategy")
            raise ConfigError(trainer_refusal(error, strategy)) from None
        except ValueError as error:
            cause = raised_from(error, UserError)
            if cause is None:
                raise
            # `data.batch_size must be >= 1, got -4`: with the file that gave the -4 (the
            # error kept as it is: callers tell a VocabMismatchError from others).
            cause.args = (naming_the_file(str(cause), getattr(self, "_words", [])),)
            raise cause from None
        seed = self.config_value(self.config, "seed_everything")
        if seed is not False:  # seeded before the build (console.HARMLESS), said now
            rank_zero_info(f"seed_everything: {seed}")

    def _explain(self, message: str, args: Any) -> str:
        """A parse error with the file that holds the bad key and the closest valid key."""
        words = list(sys.argv[1:] if args is None else args)
        choice = bad_choice(message, words)
        if choice is not None:
            return choice
        wrong_type = re.search(
            r'Parser key "([^"]+)":\s+Expected a (?:<class \'(\w+)\'>|tuple with (\d+) '
            r"elements)\. Got value: (.*)",
            message,
        )
        if wrong_type is not None:
            key, expected, count, value = wrong_type.groups()
            # A field of an option given as JSON (--model.optimizer '{"lr": "fast"}') is
            # reported by its name alone, inside the option's report.
            outer = re.findall(r'Parser key "([^"]+)"', message[: wrong_type.start()])
            key = key_path([*outer, key])
            kind = (
                f"a list of {count} values in brackets"
                if count
                else TYPE_NAMES.get(expected, expected)
            )
            return bad_value(given_key(key, words), kind, value.strip(), words)
        callback = bad_callback_class(message)
        if callback is not None:
            return callback
        union = bad_union(message)
        if union is not None:  # a class's option beside a text choice: the option named
            return bad_class_option(message, words[0] if words else "fit") or bad_value(
                *union, words
            )
        missing = re.search(r'Parser key "config": File does not exist: \'([^\']+)\'', message)
        if missing is not None:
            reported = Path(missing.group(1))  # jsonargparse's: made absolute
            given = next(
                (w for w in recipes.config_paths(words) if Path(w).absolute() == reported),
                str(reported),
            )
            return f"--config {given}: no such file{close_file(given)}"
        unloadable = re.match(
            r'Parser key "([^"]+)":\s*Unable to load config (\'.*?\')\s', message, re.S
        )
        if unloadable is not None:  # a YAML/JSON value that does not parse: its problem
            key, value = unloadable.groups()
            path = value.strip("'\"")
            if path.endswith((".yaml", ".yml", ".json")) and not Path(path).exists():
                return f"{given_key(key, words)} {path}: no such file"
            problems = [line.strip(" -") for line in message.splitlines() if 'in "<' not in line]
            problem = "; ".join(p for p in problems[2:] if p) or "cannot be read"
            return f"{given_key(key, words)} {value}: not valid YAML or JSON ({problem})"
        subcommand = words[0] if words and words[0] in self.subcommands() else None
        match = re.search(r"(?:option|key) '([^']+)'|unrecognized arguments: --([\w.-]+)", message)
        if subcommand is None:
            return f"{message} (`cofr --help` lists the commands)"
        nested = bad_nested_key(message)
        if nested is not None:
            key, fields = nested
            class_path = re.search(r"given class_path '([\w.]+)'", message)
            if key.startswith("trainer.callbacks.") and class_path is not None:
                # Not `cofr fit --help`: it does not list a callback's arguments.
                return (
                    f"unknown key {key!r}{did_you_mean(key, fields)}; the arguments of "
                    f"{class_path.group(1)}: `cofr {subcommand} --trainer.callbacks.help "
                    f"{class_path.group(1)}`"
                )
            return cli_cache.unknown_key_message(subcommand, key, words[1:], fields)
        if match is None:
            return f"{message} (`cofr {subcommand} --help` lists every option)"
        defaults = self.subcommand_parser(subcommand).get_defaults()  # a jsonargparse Namespace
        valid = [k for k in defaults.keys() if k != "config"]  # noqa: SIM118
        cli_cache.store_keys(subcommand, valid)
        key = match.group(1) or match.group(2)
        for i in range(len(words)):  # a key of a --trainer FILE: named in full, with its file
            read = file_word(words, i)
            if read is None or not read[1]:
                continue
            dotted = key if key.startswith(read[1]) else read[1] + key
            # `trainer.trainer.x`: a whole config given as the section: said by cli_cache
            if dotted in file_keys(*read) and not dotted.startswith(read[1] * 2):
                return (
                    f"unknown key {dotted!r} in {read[0]}{did_you_mean(dotted, valid)}; "
                    f"`cofr {subcommand} --help` lists every option"
                )
        return cli_cache.unknown_key_message(subcommand, key, words[1:], valid)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_class_arguments(RunConfig, "run")
        parser.add_argument(
            f"--{recipes.KEY}",
            type=list[str] | str | None,  # one file may be named without a list
            default=None,
            help="in a config file: the files it builds on, read before it "
            "(cofrgenet/recipes.py); on the command line give each with --config",
        )

    def run_config(self) -> RunConfig:
        return _run_config(self.config_value(self.config_init, "run"))

    def _run_and_folder(self) -> tuple[RunConfig, Path]:
        """The run settings and folder this command acts on. validate/test of a checkpoint
        file act on the run it was saved in, whatever ``--run.*`` say: its metrics go to
        that run's MLflow run, in that run's store; a file outside any run folder is
        evaluated without MLflow."""
        run = self.run_config()
        ckpt_path = self.config_value(self.config, "ckpt_path")
        if self.subcommand not in EVALUATIONS or ckpt_path in (None, "last"):
            return run, resolve_run_dir(run, resume_last=self._resuming_last())
        from cofrgenet.training.pretrained import (
            foreign_checkpoint,
            run_dir_of,
            run_id_of,
            tracking_uri_of,
        )

        ckpt = Path(ckpt_path).absolute()
        run_dir = run_dir_of(ckpt)
        if run_dir is None:
            rank_zero_info(f"not logged to MLflow: {ckpt} is not in a cofr fit run folder")
            return dataclasses.replace(run, mlflow=False), ckpt.parent
        uri, run_id = tracking_uri_of(run_dir), run_id_of(run_dir)
        problem = None
        if run.mlflow and run_id:
            saved = checkpoints.saved_settings(ckpt)  # memory-mapped, or a folder's meta.pt
            problem = foreign_checkpoint(ckpt, saved, run_dir, run_id)
            if problem is None:
                if sqlite_database(uri) is None:  # a server that is down: refused in seconds
                    check_tracking_uri(uri)
                problem = unreachable_run(uri, run_id)  # a local store moved or damaged: said
        if problem is not None:  # scored all the same; no stray store is made
            rank_zero_info(f"not logged to MLflow: {problem}")
            return dataclasses.replace(run, mlflow=False), run_dir
        return dataclasses.replace(run, tracking_uri=uri), run_dir

    def _resumes_a_checkpoint(self, run_dir: Path) -> bool:
        """Whether this is a fit from a checkpoint (``--ckpt_path last`` of a run that has
        one): its model is the checkpoint's, whatever the data says."""
        ckpt_path = self.config_value(self.config, "ckpt_path")
        if self.subcommand != "fit" or ckpt_path is None:
            return False
        return ckpt_path != "last" or bool(checkpoints.candidates(run_dir))  # none read

    def _resuming_last(self) -> bool:
        """fit --ckpt_path last, and every evaluation, act on the latest run by default."""
        if self.subcommand in EVALUATIONS:
            return True
        return self.config_value(self.config, "ckpt_path") == "last"

    #: Whether the trainer is always given a cluster environment of this CLI's own (a
    #: sweep worker's LightningEnvironment), which Lightning takes over any it detects.
    own_cluster_environment = False

    def check_launched_by_srun(self) -> None:
        """Refuse a distributed fit that a SLURM batch script of several tasks runs itself,
        without srun: Lightning takes the job's tasks for its ranks (the cluster
        environment it detects; none given as a plugin, not under torchrun) and waits for
        ranks nothing starts. A one-device fit there (several runs packed in one job)
        reads no ranks and goes on."""
        from lightning.fabric.plugins.environments import ClusterEnvironment

        def value(key: str) -> Any:
            return self.config_value(self.config_init, f"trainer.{key}")

        plugins = value("plugins")
        plugins = plugins if isinstance(plugins, list) else [plugins]
        if self.own_cluster_environment or any(isinstance(p, ClusterEnvironment) for p in plugins):
            return
        nodes = value("num_nodes")
        devices = devices_used(value("devices"), value("accelerator"))
        several_nodes = isinstance(nodes, int) and not isinstance(nodes, bool) and nodes > 1
        if devices <= 1 and not several_nodes:
            return
        tasks = slurm_tasks_without_srun()
        if tasks is not None:
            raise ConfigError(
                f"this process runs in a SLURM batch script itself, whose job has {tasks} "
                f"tasks (SLURM_NTASKS): Lightning takes them for its ranks and would wait "
                f"for the other {tasks - 1} forever. Start it with srun (`srun cofr fit "
                "...`, as slurm/train.sbatch does), or give the job one task "
                "(--ntasks-per-node=1)"
            )

    def check_scores_something(self) -> None:
        """Refuse a validate or test limited to 0 batches: it scored nothing, said it had
        logged a score, and exited 0."""
        limit_key = _OWN_LIMIT.get(self.subcommand or "")
        limit = None if limit_key is None else self.config_value(self.config, limit_key)
        if _is_zero(limit):
            raise ConfigError(
                f"{limit_key} is 0: cofr {self.subcommand} would score nothing; give a "
                "number of batches or a fraction up to 1.0 (null: all)"
            )

    def check_data_sizes(self) -> None:
        """Refuse data too small for one batch or block of the splits this command reads
        (:meth:`TokenDataModule.check_sizes`): it came once the fit had begun, and left a
        FAILED MLflow run."""
        check_sizes = getattr(getattr(self, "datamodule", None), "check_sizes", None)
        if not callable(check_sizes):
            return
        fitting = self.subcommand == "fit"
        validates = not _is_zero(self.config_value(self.config, "trainer.limit_val_batches"))
        check_sizes(train=fitting, val=self.subcommand in EVALUATIONS or validates)

    def check_fit_settings(self, run: RunConfig, run_dir: Path) -> None:
        """Refuse a fit that would end at once with exit status 0 and nothing done: no
        step to take, or ``--ckpt_path last`` with nothing to resume and no run named."""
        if self.subcommand != "fit":
            return
        max_steps = self.config_value(self.config, "trainer.max_steps")
        if max_steps == 0:
            raise ConfigError("trainer.max_steps must be >= 1, or -1 for max_epochs to decide")
        _check_trainer_counts(lambda key: self.config_value(self.config, f"trainer.{key}"))
        self.check_launched_by_srun()
        if self.config_value(self.config, "ckpt_path") != "last" or checkpoints.candidates(run_dir):
            return
        if run.name is None and slurm_run_name() is None:
            raise ConfigError(
                f"--ckpt_path last: no run of experiment {run.experiment!r} in "
                f"{run_dir.parent} has a checkpoint to resume; name one with --run.name, or "
                "start a new run without --ckpt_path"
            )
        if not run_dir.exists():  # a first start under SLURM or a sweep, or a typo
            parent = run_dir.parent
            names = [p.name for p in parent.iterdir() if p.is_dir()] if parent.is_dir() else []
            # A name of SLURM's (slurm-<job id>) is near its siblings' by nature: no hint.
            hint = ""
            if run.name is not None:
                hint = did_you_mean(run_dir.name, names) or _in_another_experiment(run_dir)
            rank_zero_warn(
                f"--ckpt_path last: {run_dir} does not exist, so this run starts from scratch{hint}"
            )
            self._said_no_run_folder = True
            if hint:  # a close name: more likely a typo than a first start
                self.summary_notes.append(
                    f"note: this run started from scratch: --ckpt_path last found no "
                    f"{run_dir}{hint}"
                )

    def check_not_overwriting(self, run_dir: Path) -> None:
        """A fresh fit must not overwrite the checkpoints of an earlier run, nor log into
        its MLflow run (whose history would keep the earlier values of every step)."""
        if self.subcommand != "fit" or self.config_value(self.config, "ckpt_path") is not None:
            return
        existing = sorted(checkpoints.checkpoint_files(run_dir / "checkpoints"))
        if existing and not checkpoints.candidates(run_dir):  # only a NaN stop's: no resume
            _check_not_stopped_on_nonfinite(run_dir)
        if existing:
            raise RunExistsError(
                f"run folder {run_dir} already holds checkpoints ({existing[-1].name}, ...): "
                "resume it with --ckpt_path last, or start a new run with another --run.name"
            )
        id_file = run_dir / RUN_ID_FILE
        if id_file.exists() and not self.run_id_from_caller:
            raise RunExistsError(
                f"run folder {run_dir} belongs to MLflow run {id_file.read_text().strip()}, "
                "which has no checkpoint left: start a new run with another --run.name "
                "(--ckpt_path last would train this one again from step 0 into that MLflow "
                "run, whose history keeps the earlier values of the steps it logged)"
            )

    def check_not_forking(self, run_dir: Path, checkpoint: str, step: int | None) -> None:
        """``--ckpt_path FILE`` into a run folder that holds other checkpoints must go on
        from its newest: from an earlier one (a rollback), or from another run's, two
        histories would share the folder (``last-v1.ckpt`` beside a stale ``last.ckpt``)
        and the MLflow run (two values at a step)."""
        if self.subcommand != "fit" or step is None:
            return
        chosen = Path(checkpoint).resolve()
        others = [p for p in checkpoints.candidates(run_dir) if p.resolve() != chosen]
        if not others:
            return
        if run_dir.resolve() not in chosen.parents:
            raise RunExistsError(
                f"--ckpt_path {checkpoint} is another run's checkpoint, and run folder "
                f"{run_dir} holds its own ({others[0].name}, ...): to go on from it, start a "
                "new run with another --run.name"
            )
        later = [(p, s) for p in others if (s := checkpoints.step_of(p)) is not None and s > step]
        if later:
            path, at = later[0]
            raise RunExistsError(
                f"--ckpt_path {checkpoint} is at step {step}, but run folder {run_dir} goes "
                f"on to step {at} ({path.name}): to go on from the earlier one, start a new "
                "run from it with another --run.name (or resume with --ckpt_path last)"
            )

    def check_steps_left(
        self, checkpoint: str, step: int | None, saved: dict[str, Any] | None = None
    ) -> None:
        """A resumed fit must have steps and time left: Lightning would stop at once, exit
        0 and leave the run's config rewritten with the lower max_steps; its Timer goes on
        from the training time the checkpoint ``saved`` records, so a run that
        ``trainer.max_time`` stopped trained nothing when started again with it."""
        if self.subcommand != "fit" or step is None:
            return
        max_steps = self.config_value(self.config, "trainer.max_steps")
        if max_steps is not None and max_steps >= 0 and step >= max_steps:
            raise ConfigError(
                f"{checkpoint} is at step {step} already: raise --trainer.max_steps above "
                f"{step} to train on (it is {max_steps})"
            )
        max_time = self.config_value(self.config, "trainer.max_time")
        timer = ((saved or {}).get("callbacks") or {}).get("Timer") or {}
        elapsed = (timer.get("time_elapsed") or {}).get("train")
        limit = duration_seconds(max_time)
        if limit is not None and isinstance(elapsed, int | float) and elapsed >= limit:
            raise ConfigError(
                f"{checkpoint} has trained for {clock(elapsed)} already, and "
                f"trainer.max_time ({clock(limit)}) counts the training time of every start "
                f"of the run: raise --trainer.max_time above {clock(elapsed)} to train on"
            )

    def check_same_data(self, saved: dict[str, Any] | None, chosen: str) -> None:
        """A resumed fit must read the data stream the checkpoint ``saved`` (at
        ``chosen``) left (the datamodule's check at restore comes after the run's
        config.yaml and MLflow record are rewritten); the refusal names the way to train
        its weights on other data (a sharded checkpoint's state is in its meta.pt)."""
        datamodule = getattr(self, "datamodule", None)
        check = getattr(datamodule, "check_resumable", None)
        if self.subcommand != "fit" or check is None or saved is None:
            return
        state = self._saved_datamodule_state(saved)
        if not state:
            return
        try:
            check(state)
        except ConfigError as error:
            changes = getattr(datamodule, "changes_since", lambda _: {})(state)
            if not (set(changes) & _OTHER_CORPUS) or set(changes) & set(TOKENIZER_KEYS):
                raise  # a setting of this corpus's stream, or ids that mean other text
            raise ConfigError(
                f"{error} To train its weights on this data instead, start a new run from "
                f"them: --model.init_from {chosen} with another --run.name (no --ckpt_path)"
            ) from None

    def choose_checkpoint(self, run_dir: Path) -> None:
        """Check ``--ckpt_path``; for ``last``, take the run's newest intact checkpoint.

        ``last`` weighs ``checkpoints/last.ckpt``, the periodic ``step*.ckpt`` and, on SIGUSR1
        under SLURM (``slurm/train.sbatch``), Lightning's requeue checkpoint
        ``hpc_ckpt_<n>.ckpt`` in the run folder; a damaged newer one (a job killed while
        writing it) is passed over with a warning naming both.
        """
        ckpt_path = self.config_value(self.config, "ckpt_path")
        if ckpt_path is None and self.subcommand in EVALUATIONS:
            ckpt_path = "last"  # evaluate the run's newest checkpoint, never a fresh model
        if ckpt_path is None:
            return
        if ckpt_path != "last":
            checkpoints.check(ckpt_path)
            return
        chosen = _newest_intact_checkpoint(run_dir, "resuming from")
        if chosen is None:
            if self.subcommand in EVALUATIONS:
                raise ConfigError(_nothing_to_evaluate(self.run_config(), run_dir))
            _check_not_stopped_on_nonfinite(run_dir)
            if not self._said_no_run_folder:  # said once is enough
                rank_zero_info(f"--ckpt_path last: {run_dir} holds no checkpoint yet: from step 0")
        # Lightning gets the file, or None to start from scratch: its own `last` would
        # find nothing and warn with a hint to set ModelCheckpoint(save_last=True).
        self.config_init[self.subcommand]["ckpt_path"] = None if chosen is None else str(chosen)

    _start_dir: Path | None = None  # the run folder of this start (fit's)
    #: The names the run folder held before this start; None when the start made it.
    _found_at_start: frozenset[str] | None = None
    #: The folders above it that this start made (the experiment's, the runs folder).
    _made_above: tuple[Path, ...] = ()

    def _written_by_this_start(self, name: str) -> bool:
        return self._found_at_start is None or name not in self._found_at_start

    def run_subcommand(self, subcommand: str) -> None:
        with warnings.catch_warnings():
            if subcommand in EVALUATIONS:
                # Lightning asks for the callbacks that saved the checkpoint, to restore
                # their state (ModelCheckpoint's count): an evaluation saves nothing.
                warnings.filterwarnings("ignore", message=re.escape(_CALLBACKS_NOT_GIVEN))
            try:
                super().run_subcommand(subcommand)
                if subcommand == "fit" and self.trainer.fast_dev_run:
                    # Lightning saves and logs nothing then: the folder is no run to resume.
                    self._forget_refused_start(trained=True)
            except UserError:
                self._forget_refused_start()
                raise
            except MisconfigurationException as error:
                if not raised_by_a_callback(error):  # the module's: a bug, its traceback
                    raise
                # A callback's refusal of the settings (LearningRateMonitor without a
                # logger, as it sets up): bad input, one line (--debug shows where).
                self._forget_refused_start()
                strategy = self.config_value(self.config, "trainer.strategy")
                raise ConfigError(trainer_refusal(error, strategy)) from error
            except ProcessRaisedException as error:  # ddp_spawn: a rank's own error
                refused = user_error_of_rank(error)
                if refused is None:
                    raise
                self._fail_spawned_run()
                self._forget_refused_start()
                raise refused from None

    def _fail_spawned_run(self) -> None:
        """End as FAILED the MLflow run a ddp_spawn rank made and left RUNNING when it
        refused a setting (the ranks die without finalizing their logger)."""
        run_dir = self._start_dir
        id_file = None if run_dir is None else run_dir / RUN_ID_FILE
        if id_file is None or not id_file.is_file() or rank_zero_only.rank != 0:
            return
        if not self._written_by_this_start(RUN_ID_FILE):  # a resume's run: not made here
            return
        run = self.run_config()
        if not run.mlflow:
            return
        import mlflow

        client = mlflow.MlflowClient(tracking_uri=tracking_uri(run))
        with contextlib.suppress(Exception):  # the store is the rank's; nothing to lose
            client.set_terminated(id_file.read_text().strip(), status="FAILED")

    def _forget_refused_start(self, trained: bool = False) -> None:
        """A fit refused once the data loaded (a setting the loader shows wrong) trained
        nothing: what it wrote in the run folder goes (the folder too, when it made it),
        so that the same command with the setting fixed starts that run (its MLflow run
        stays, FAILED, with its config). A folder's own files (a user's notes, an earlier
        run's) stay. ``trained``: a ``fast_dev_run``, whose steps count for nothing."""
        run_dir = self._start_dir
        if self.subcommand != "fit" or run_dir is None or rank_zero_only.rank != 0:
            return
        found = self._found_at_start or frozenset()
        written = ("config.yaml", RUN_ID_FILE, RUN_TOKENIZER_DIR, LOCK_FILE)
        others = [p for p in run_dir.iterdir() if p.name not in (*written, *found)]
        if (self.trainer.global_step > 0 and not trained) or others:  # (a checkpoint) keeps it
            return
        if not any(self._written_by_this_start(name) for name in written[:2]):
            return  # a resume that wrote nothing new
        lock = RunLock(run_dir)  # the fit let its lock go: taken again to empty the folder
        try:
            if not lock.try_acquire():  # another start has the folder now: it is its own
                return
        except OSError:  # the folder is gone: nothing to forget
            return
        if [p for p in run_dir.iterdir() if p.name not in (*written, *found)]:  # another's
            lock.release()
            return
        for name in ("config.yaml", RUN_ID_FILE):
            if self._written_by_this_start(name):
                (run_dir / name).unlink(missing_ok=True)
        if self._written_by_this_start(RUN_TOKENIZER_DIR):
            shutil.rmtree(run_dir / RUN_TOKENIZER_DIR, ignore_errors=True)
        lock.release(remove=self._written_by_this_start(LOCK_FILE))
        if self._found_at_start is None:
            remove_empty_folders([run_dir, *self._made_above])

    def default_callbacks(
        self, run_dir: Path, run: RunConfig, configured: list[Callback]
    ) -> list[Callback]:
        kinds = {type(c) for c in configured}
        callbacks: list[Callback] = []
        if not any(issubclass(k, ModelCheckpoint) for k in kinds):
            callbacks.append(
                RunCheckpoint(
                    dirpath=run_dir / "checkpoints",
                    filename="step{step:07d}",
                    auto_insert_metric_name=False,
                    every_n_train_steps=run.checkpoint_every_n_steps,
                    save_last=True,
                    # the newest K periodic checkpoints ("step" is always a candidate)
                    save_top_k=run.keep_checkpoints,
                    monitor="step",
                    mode="max",
                )
            )
        if NonFiniteLossGuard not in kinds:
            callbacks.append(NonFiniteLossGuard())
        if StopOnSignal not in kinds:
            callbacks.append(StopOnSignal())
        if LadderHealthMonitor not in kinds:
            callbacks.append(LadderHealthMonitor())
        if not any(issubclass(k, RichProgressBar) for k in kinds):
            callbacks += [StepProgressBar(leave=True), ModelReport()]
        if self.subcommand == "fit" and RunSummary not in kinds:
            callbacks.append(RunSummary(self.summary_notes))
        return callbacks

    def before_instantiate_classes(self) -> None:
        """``data.block_size`` left unset is the model's block size: the two agree unless
        a run asks for shorter training sequences (a longer one is refused by
        ``LanguageModel.check_data``)."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        strategy = config.get("trainer.strategy")
        if isinstance(strategy, Namespace) and strategy.get("class_path") == LADDER_FSDP:
            # Raised while jsonargparse builds it, the refusal came as a type error.
            LadderFSDPStrategy.check_settings(dict(strategy.get("init_args") or {}))
        if self.subcommand in EVALUATIONS:
            self._build_as_trained(config)
        replaced = [k for k, v in self._given_model.items() if config.get(k[2:]) != v]
        if replaced:
            rank_zero_info(
                "note: cofr fit --ckpt_path FILE trains with the checkpoint's own model "
                f"settings (its hyperparameters): {', '.join(replaced)} not used"
            )
        # Not of a resume: it trains with its checkpoint's settings, whatever they were.
        if (
            self.subcommand == "fit"
            and config.get("model") is not None
            and not config.get("ckpt_path")
        ):
            from cofrgenet.training.model_options import (
                settings_changing_nothing,
                shape_defaults_taken,
            )

            section = _model_section(config)
            for said in (settings_changing_nothing(section), shape_defaults_taken(section)):
                if said is not None:
                    rank_zero_warn(said)
                    self.summary_notes.append(f"note: {said}")
        init_from = config.get("model.init_from") if config.get("model") is not None else None
        if self.subcommand == "fit" and init_from:
            # As the run's config.yaml and MLflow param: a restart from another folder
            # (a SLURM first start that saved nothing) finds the same file.
            config.model.init_from = str(Path(str(init_from)).expanduser().absolute())
        if config.get("data") is None or config.data.get("block_size") is not None:
            return
        config.data.block_size = _model_config(config).block_size

    def _build_as_trained(self, config: Namespace) -> None:
        """validate/test: the model as the checkpoint trained, from the ``model_config``
        it recorded (:func:`~cofrgenet.training.checkpoints.trained_model_config`), where
        its preset or a default has changed since: Lightning builds it from the
        checkpoint's ``model.preset`` and ``model.config``, as they read today."""
        ckpt = config.get("ckpt_path")
        if not ckpt:
            return
        if not (checkpoints.is_sharded(ckpt) or Path(ckpt).is_file()):
            return
        saved = checkpoints.saved_settings(ckpt)
        trained = checkpoints.trained_model_config(saved, _model_section(config), ckpt)
        try:
            built = _model_config(config)
        except ConfigError:  # a preset removed since: the record builds the model
            built = None
        if trained != built:
            config.model.preset = None
            config.model.config = Namespace(**trained.to_dict())

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        # Config against data first: a mismatch must leave no run folder and no MLflow run.
        run, run_dir = self._run_and_folder()
        check_data = getattr(self.model, "check_data", None)
        if callable(check_data) and getattr(self, "datamodule", None) is not None:
            check_data(
                self.datamodule,
                evaluating=self.subcommand in EVALUATIONS,
                resuming=self._resumes_a_checkpoint(run_dir),
            )
        _check_trainer_settings(lambda key: self.config_value(self.config, f"trainer.{key}"))
        if self.subcommand == "fit":
            _check_monitors(self.config_value(self.config_init, "trainer.callbacks"))
        _check_unused_parameters_allowed(
            lambda key: self.config_value(self.config_init, f"trainer.{key}")
        )
        peak_flops_from_env()  # read at the first step: a bad value fails here, not there
        _check_ladder_device(
            getattr(self.model, "model_config", None),
            self.config_value(self.config, "trainer.accelerator"),
        )
        self.check_fit_settings(run, run_dir)  # before the lock: an error leaves no folder
        self.check_scores_something()
        self.check_data_sizes()
        check_compile_strategy(  # before the processes launch: one line, not one per rank
            bool(getattr(self.model, "compile_model", False)),
            self.config_value(self.config_init, "trainer.strategy"),
        )
        logger = self.config_value(self.config, "trainer.logger")
        if run.mlflow and logger in (None, True):
            uri = tracking_uri(run)
            if rank_zero_only.rank == 0:
                check_tracking_uri(uri)
                check_store_writable(
                    uri, "choose another with --run.tracking_uri or --run.runs_dir"
                )
            if self.subcommand == "fit":  # on every rank: srun's would wait for rank 0's
                check_own_run(run_dir, uri)
        lock = RunLock(run_dir)
        new_folder = not run_dir.exists()
        self._start_dir = run_dir
        self._found_at_start = None if new_folder else frozenset(p.name for p in run_dir.iterdir())
        made_above = self._made_above = tuple(missing_folders(run_dir.parent))
        try:
            if self.subcommand == "fit" and rank_zero_only.rank == 0:
                lock.acquire()  # before anything is written: a second fit stops here
                saves = run_dir / "checkpoints"  # refused at the first save, steps later
                if saves.is_dir() and not os.access(saves, os.W_OK | os.X_OK):
                    raise UserError(
                        f"cannot write in {saves} (read-only): the run's checkpoints could "
                        "not be saved; make it writable, or choose another --run.runs_dir"
                    )
                for path in checkpoints.remove_unfinished_saves(run_dir):
                    rank_zero_info(f"removed {path.name}: a save that a killed run left unfinished")
            return self._instantiate_run(run, run_dir, lock, kwargs)
        except BaseException:
            # A folder this start made and wrote nothing into goes, its lock file removed
            # while held.
            empty = new_folder and lock.held and _holds_only_lock(run_dir)
            lock.release(remove=empty)
            if empty:
                remove_empty_folders([run_dir, *made_above])
            raise

    def _instantiate_run(
        self, run: RunConfig, run_dir: Path, lock: RunLock, kwargs: dict
    ) -> Trainer:
        held: list[Callback] = [HoldRunLock(lock)] if lock.held else []
        self.check_not_overwriting(run_dir)
        asked = self.config_value(self.config_init, "ckpt_path")  # before "last" is resolved
        self.choose_checkpoint(run_dir)
        chosen = self.config_value(self.config_init, "ckpt_path")
        if chosen not in (None, "last") and checkpoints.is_sharded(chosen):
            strategy = self.config_value(self.config_init, "trainer.strategy")
            check_sharded_strategy(self.subcommand, Path(chosen), strategy)
        started_from = self._started_from(asked, run_dir)  # the MLflow tag, if any
        step = None
        # What the chosen checkpoint records, read once: a file's contents (memory-mapped)
        # or a sharded FSDP folder's meta.pt; the same checks for both.
        saved = None
        if chosen not in (None, "last"):  # before config.yaml and MLflow are rewritten
            saved = checkpoints.saved_settings(chosen)
            step = checkpoints.check_same_network(chosen, self.model, saved)
            if asked != "last":  # the run's own choice: a SLURM requeue's may be older
                self.check_not_forking(run_dir, chosen, step)
            if self.subcommand == "fit":
                checkpoints.check_same_settings(chosen, saved, self.model.model_config, self.model)
            self.check_steps_left(chosen, step, saved)
            self.check_same_data(saved, chosen)
            init_from = getattr(self.model, "init_from", None)
            branched = asked not in (None, "last") and started_from
            if self.subcommand == "fit" and init_from and branched:
                rank_zero_info(
                    f"note: model.init_from {init_from} is not read: the weights, step and "
                    f"data position come from --ckpt_path {asked}"
                )
        elif self.subcommand == "fit":  # a fresh start, from model.init_from's weights if set
            load_initial_weights = getattr(self.model, "load_initial_weights", None)
            if callable(load_initial_weights):
                load_initial_weights(getattr(self, "datamodule", None))
        given = self.config_value(self.config_init, "trainer", default={})
        if not hasattr(given, "keys"):  # jsonargparse lets `trainer: 5` through
            raise ConfigError(f"trainer must be a mapping of Trainer settings, got {given!r}")
        trainer_config = {**given, **kwargs}
        trainer_config["default_root_dir"] = str(run_dir)
        configured = trainer_config.get("callbacks") or []
        configured = configured if isinstance(configured, list) else [configured]
        extra = [
            self.config_value(self.config_init, c)
            for c in self.subcommand_parser(self.subcommand).callback_keys
        ]
        extra += self.default_callbacks(run_dir, run, [*configured, *extra, *self.extra_callbacks])
        extra += self.extra_callbacks + held
        if self.subcommand == "fit" and saved is not None:
            check_schedule_kept(chosen, saved, step, [*configured, *extra], self.model)
        if trainer_config.get("enable_progress_bar") is False:
            extra = [c for c in extra if not isinstance(c, RichProgressBar)]
        if trainer_config.get("enable_model_summary") is False:
            extra = [c for c in extra if not isinstance(c, ModelReport)]
        logger = trainer_config.get("logger")
        if run.mlflow and logger in (None, True):
            other = None if self.subcommand == "fit" else self._other_data(saved, chosen)
            if other is not None:  # the table below names them as the fit's
                # Data of another tokenizer is refused (at restore): before saying where
                # its scores would go.
                datamodule = getattr(self, "datamodule", None)
                state = self._saved_datamodule_state(saved)
                if state and hasattr(datamodule, "check_same_tokenizer"):
                    datamodule.check_same_tokenizer(state)
                split = "test" if self.subcommand == "test" else "val"
                rank_zero_info(
                    f"{other} is not the data the run trained on (not the val split it "
                    f"validated on): its scores go to MLflow as "
                    f"eval/{split}/{other.name}/loss and .../ppl, beside the run's {split}/ curves"
                )
            trainer_config["logger"] = CofrMLFlowLogger(
                run_dir=run_dir,
                experiment_name=run.experiment,
                run_name=run_dir.name,
                tracking_uri=tracking_uri(run),
                artifact_location=artifact_location(run),
                tags={RUN_DIR_TAG: str(run_dir.resolve()), **started_from},
                # validate/test log at the checkpoint's step, which the run has passed
                evaluation=self.subcommand != "fit",
                eval_step=None if self.subcommand == "fit" else step,
                eval_data=other,
            )
            resumed = (run_dir / RUN_ID_FILE).exists() and not started_from
            if self.subcommand == "fit" and step and resumed and rank_zero_only.rank == 0:
                note = unscored_validation(trainer_config, step, saved, run, run_dir, chosen)
                if note:
                    rank_zero_warn(note)
            elif self.subcommand == "fit" and step and not started_from:
                rank_zero_info(
                    f"note: {run_dir} has no {RUN_ID_FILE}: this fit logs to a new MLflow "
                    f"run, whose curves begin at step {step}"
                )
        elif logger is None:
            trainer_config["logger"] = False
        try:
            return self.build_trainer(trainer_config, extra)
        except UserError:
            raise
        # A Trainer setting Lightning refuses: a strategy name (ValueError), devices: abc
        # or -2 on CPU (TypeError).
        except (ValueError, TypeError) as error:
            strategy = trainer_config.get("strategy")
            raise ConfigError(trainer_refusal(error, strategy)) from None

    def _started_from(self, asked: Any, run_dir: Path) -> dict[str, str]:
        """:data:`STARTED_FROM_TAG` of a fit whose weights start from a checkpoint of
        another run: ``--ckpt_path`` (``asked``) naming one, or ``model.init_from``."""
        from cofrgenet.training.pretrained import run_dir_of

        if self.subcommand != "fit":
            return {}
        if asked in (None, "last"):
            init_from = getattr(self.model, "init_from", None)
            return {STARTED_FROM_TAG: str(Path(init_from).resolve())} if init_from else {}
        ckpt = Path(str(asked)).resolve()
        own = run_dir_of(ckpt)
        if own is not None and own == run_dir.resolve():
            return {}
        return {STARTED_FROM_TAG: str(ckpt)}

    def _saved_datamodule_state(self, saved: dict[str, Any] | None) -> dict[str, Any] | None:
        """This command's datamodule's state in checkpoint ``saved`` (Lightning keeps it
        under the class's name); None where there is none."""
        datamodule = getattr(self, "datamodule", None)
        return (saved or {}).get(type(datamodule).__qualname__) or None

    def _other_data(self, saved: dict[str, Any] | None, chosen: Any) -> Path | None:
        """The data folder validate/test score when it is not the one the checkpoint
        ``saved`` (at ``chosen``) trained on (None when it is, or either is not known):
        by its val split's record (tokens, chunks, how it was split), so that a folder
        prepared again in place is other data and one moved is not; for checkpoints
        from before that record, by where it is (a relative training folder is where
        the run's data is found from here or above the run folder:
        :func:`~cofrgenet.training.pretrained.data_dir_candidates`)."""
        from cofrgenet.training.pretrained import data_dir_candidates, run_dir_of

        datamodule = getattr(self, "datamodule", None)
        folder = getattr(datamodule, "data_dir", None)
        if folder is None or saved is None:
            return None
        validates_as = getattr(datamodule, "validates_as", None)
        state = self._saved_datamodule_state(saved)
        same = validates_as(state) if callable(validates_as) and state else None
        if same is not None:
            return None if same else Path(folder)
        hparams = saved.get("datamodule_hyper_parameters") or {}
        trained = hparams.get("data_dir")
        if trained is not None:
            ckpt = Path(str(chosen))
            places = data_dir_candidates(str(trained), ckpt, run_dir_of(ckpt))
            if any(place.resolve() == Path(folder).resolve() for place in places):
                return None
        return Path(folder)

    def build_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Trainer:
        # Checkpoints written beside themselves, unless the config names a writer.
        config["plugins"] = with_default_plugin(
            config.get("plugins"), CheckpointIO, AtomicCheckpointIO
        )
        return super().build_trainer(config, callbacks)


def trainer_refusal(error: BaseException, strategy: Any) -> str:
    """The one-line message of a Trainer setting Lightning refuses (``error``), with the
    fix where Lightning's own does not give it; ``strategy``: the one given."""
    from lightning.pytorch.strategies import StrategyRegistry

    message = first_line(error)
    if "invalid strategy name" in message:  # Lightning: "It must be either a string ..."
        names = StrategyRegistry.available_strategies()
        return (
            f"trainer.strategy: no strategy {strategy!r}{did_you_mean(str(strategy), names)}: "
            f"give auto, one of Lightning's ({', '.join(names[:3])}, fsdp, ...) or a class "
            f"path ({LADDER_FSDP})"
        )
    hint = ""
    if "backend found" in message or "not available" in message:
        hint = " (this machine has none: --trainer.accelerator cpu, or a conf/trainer/cpu*.yaml)"
    elif "check_val_every_n_epoch=None" in message:  # conf/trainer files' setting
        hint = " (a fraction of an epoch: add --trainer.check_val_every_n_epoch 1)"
    elif "strategy `fsdp` requires a GPU" in message:
        hint = f" (cofr's FSDP runs on CPU too: --trainer.strategy {LADDER_FSDP})"
    return f"trainer: {message}{hint}"


def raised_by_a_callback(error: BaseException) -> bool:
    """Whether ``error`` was raised inside a Lightning callback's method."""
    return any(
        isinstance(frame.f_locals.get("self"), Callback)
        for frame, _ in traceback.walk_tb(error.__traceback__)
    )


def _check_monitors(callbacks: Any) -> None:
    """Refuse a callback that watches a metric no fit logs (``EarlyStopping(monitor=
    "val_loss")``): Lightning says so at the first validation, a training interval in.
    Not beside a callback of the user's own, which may log metrics of its own, nor one
    that allows its metric to be missing (``strict: false``)."""
    from cofrgenet.training.module import FIT_METRICS

    given = [c for c in (callbacks if isinstance(callbacks, list) else [callbacks]) if c]
    if any(not type(c).__module__.startswith(("lightning.", "cofrgenet.")) for c in given):
        return
    watchable = (*FIT_METRICS, "step", "epoch")
    for callback in given:
        monitor = getattr(callback, "monitor", None)
        if getattr(callback, "strict", True) is False:
            continue
        if isinstance(monitor, str) and monitor not in watchable:
            raise ConfigError(
                f"trainer.callbacks: {type(callback).__name__} monitors {monitor!r}, which a "
                f"fit does not log{did_you_mean(monitor, watchable)}; it logs "
                f"{', '.join(FIT_METRICS)}"
            )


def _check_trainer_settings(value: Any) -> None:
    """Refuse Trainer settings that the run's own machinery replaces: taken, they would be
    ignored (the run folder) or fail against the run's checkpoint callback. ``value(key)``:
    the setting of ``trainer.<key>``."""
    if value("default_root_dir") is not None:
        raise ConfigError(
            "trainer.default_root_dir is the run folder, <run.runs_dir>/<run.experiment>/"
            "<run.name>: give --run.runs_dir (and --run.experiment, --run.name) instead"
        )
    if value("enable_checkpointing") is False:
        raise ConfigError(
            "trainer.enable_checkpointing: false is not supported (runs keep checkpoints to "
            "resume); save fewer with --run.checkpoint_every_n_steps and --run.keep_checkpoints"
        )


def user_error_of_rank(error: ProcessRaisedException) -> UserError | None:
    """The UserError a spawned rank raised, from the traceback text torch passes on
    (``cofrgenet.errors.ConfigError: <message>`` on its last line), or None."""
    last = str(error).strip().splitlines()[-1] if str(error).strip() else ""
    name, _, message = last.partition(": ")
    module, _, cls_name = name.rpartition(".")
    if not module.startswith("cofrgenet.") or not message:
        return None
    try:
        cls = getattr(importlib.import_module(module), cls_name)
    except (ImportError, AttributeError):
        return None
    return UserError(message) if isinstance(cls, type) and issubclass(cls, UserError) else None


#: DDP strategies that expect a gradient for every parameter, by name.
_ALL_GRADIENTS_DDP = ("ddp", "ddp_spawn", "ddp_fork", "ddp_notebook")


def _check_unused_parameters_allowed(value: Any) -> None:
    """DyadicUnfreezing under a DDP that expects every gradient, refused before the
    processes start (each rank refused it once its model was wrapped: twice, and under
    ddp_spawn as a traceback, leaving the run RUNNING). ``value(key)``: the instantiated
    ``trainer.<key>``."""
    strategy, devices = value("strategy"), value("devices")
    if not any(isinstance(c, DyadicUnfreezing) for c in value("callbacks") or ()):
        return
    several = (device_count(devices) or 1) > 1 or (value("num_nodes") or 1) > 1
    if several and (strategy in _ALL_GRADIENTS_DDP or strategy == "auto"):
        raise frozen_depths_need_unused_parameters(strategy)


def _check_ladder_device(config: Any, accelerator: Any) -> None:
    """Refuse ``ladder_impl: triton`` on a run that trains on CPU before anything is
    written: the kernels would raise at the first step, after the run folder was made."""
    if getattr(config, "ladder_impl", None) != "triton":
        return
    if triton_interpreted():  # the kernels run on CPU, interpreted
        return
    on_gpu = accelerator in ("gpu", "cuda") or (
        accelerator in (None, "auto") and torch.cuda.is_available()
    )
    if not on_gpu:
        raise ConfigError(
            f"model.config.ladder_impl: triton needs a CUDA device, and this run trains on "
            f"{'CPU' if accelerator in (None, 'auto', 'cpu') else accelerator}: use "
            "ladder_impl: auto (the Triton kernels wherever there is a GPU) or continuant "
            "(or TRITON_INTERPRET=1 in the environment, to run the kernels on CPU in Triton's "
            "interpreter, slowly: for testing them)"
        )


def _is_zero(setting: Any) -> bool:
    """Whether a trainer setting is 0 or 0.0 (``False`` is not: it equals 0 in Python)."""
    return setting == 0 and not isinstance(setting, bool)


def _check_trainer_counts(value: Any) -> None:
    """Refuse trainer counts that Lightning takes and then divides by (a traceback after
    the run folder exists) or that train nothing and exit 0. ``value(key)``: the
    setting of ``trainer.<key>``."""
    accumulate = value("accumulate_grad_batches")
    if accumulate is not None and (isinstance(accumulate, bool) or not accumulate >= 1):
        raise ConfigError(
            f"trainer.accumulate_grad_batches must be >= 1 (1: no accumulation), got {accumulate}"
        )
    interval = value("val_check_interval")
    if interval is not None and not interval > 0:
        raise ConfigError(
            f"trainer.val_check_interval must be > 0 (batches; a fraction of an epoch with "
            f"trainer.check_val_every_n_epoch set), got {interval}; to validate less, raise "
            "it, or set trainer.limit_val_batches: 0"
        )
    whole = [v for v in (interval, accumulate) if isinstance(v, int) and not isinstance(v, bool)]
    if len(whole) == 2 and accumulate > 1 and interval % accumulate:
        # Lightning counts the interval in batches: it validated mid-step (steps 3, 6, 10).
        rank_zero_warn(
            f"trainer.val_check_interval {interval} counts batches, and is not a multiple of "
            f"trainer.accumulate_grad_batches {accumulate}: validation falls inside optimizer "
            f"steps; {interval * accumulate} validates every {interval} steps"
        )
    clip = value("gradient_clip_val")
    if clip is not None and not isinstance(clip, bool) and clip < 0:  # Lightning: no clipping
        raise ConfigError(
            f"trainer.gradient_clip_val must be >= 0 (null or 0: no clipping), got {clip}"
        )
    nodes = value("num_nodes")
    several = isinstance(nodes, int) and not isinstance(nodes, bool) and nodes > 1
    if several and not launched_across_nodes():
        raise ConfigError(
            f"trainer.num_nodes is {nodes}, but this process was started alone (not by "
            "srun, torchrun --nnodes or with NODE_RANK set): it would wait for the other "
            f"nodes forever. Launch one per node (sbatch --nodes {nodes} "
            "slurm/train.sbatch CONFIG), or set trainer.num_nodes 1"
        )
    for key in ("limit_train_batches", "max_epochs"):
        if _is_zero(value(key)):
            raise ConfigError(f"trainer.{key} is 0: nothing would train; give at least 1")
    for key in ("limit_train_batches", "limit_val_batches", "limit_test_batches"):
        limit = value(key)  # Lightning's "[0.0, 1.0] or an int" read -1 as neither
        if isinstance(limit, int | float) and not isinstance(limit, bool) and limit < 0:
            raise ConfigError(
                f"trainer.{key} must be >= 0 (a fraction of the batches up to 1.0, or a "
                f"number of batches; null: all), got {limit:g}"
            )


def duration_seconds(max_time: Any) -> float | None:
    """``trainer.max_time`` in seconds, as Lightning's Timer reads it (``DD:HH:MM:SS``, a
    mapping of timedelta's fields, a timedelta); None when unset or not one of those."""
    if isinstance(max_time, str):
        match = re.fullmatch(r"(\d+):(\d\d):(\d\d):(\d\d)", max_time.strip())
        if match is None:
            return None
        days, hours, minutes, seconds = (int(part) for part in match.groups())
        return ((days * 24 + hours) * 60 + minutes) * 60.0 + seconds
    if isinstance(max_time, dict):
        try:
            return datetime.timedelta(**max_time).total_seconds()
        except TypeError:
            return None
    if isinstance(max_time, datetime.timedelta):
        return max_time.total_seconds()
    return None


def clock(seconds: float) -> str:
    """``seconds`` as ``trainer.max_time`` is written: ``DD:HH:MM:SS``."""
    minutes, second = divmod(int(seconds), 60)
    hours, minute = divmod(minutes, 60)
    day, hour = divmod(hours, 24)
    return f"{day:02d}:{hour:02d}:{minute:02d}:{second:02d}"


def launched_across_nodes() -> bool:
    """Whether a launcher that starts processes on several nodes started this one (the
    cluster environments Lightning detects, or a manual launch's ``NODE_RANK``): a
    ``trainer.num_nodes`` above 1 without one waits for ranks that never come."""
    from lightning.fabric.plugins.environments import (
        LSFEnvironment,
        MPIEnvironment,
        SLURMEnvironment,
        TorchElasticEnvironment,
    )

    given = os.environ.keys()
    if {"NODE_RANK", "GROUP_RANK"} & given or {"RANK", "WORLD_SIZE"} <= given:  # Kubeflow's too
        return True
    if SLURMEnvironment.detect() and "SLURM_STEP_ID" in given:  # srun's, not the batch script's
        return True
    environments = (TorchElasticEnvironment, LSFEnvironment, MPIEnvironment)
    return any(environment.detect() for environment in environments)


def slurm_tasks_without_srun() -> int | None:
    """SLURM_NTASKS when this process is a SLURM batch script's own (no ``SLURM_STEP_ID``:
    not a job step started by srun) in a job of several tasks, which Lightning's SLURM
    environment takes for its ranks though nothing starts the others; else None."""
    from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    if not SLURMEnvironment.detect() or "SLURM_STEP_ID" in os.environ:
        return None
    if TorchElasticEnvironment.detect():  # torchrun's ranks: Lightning takes them first
        return None
    try:
        tasks = int(os.environ["SLURM_NTASKS"])
    except ValueError:
        return None
    return tasks if tasks > 1 else None


#: Data settings that differ when a resume is given another corpus (not another reading
#: of the same one: a seed, the order, the block size).
_OTHER_CORPUS = frozenset({"source", "train_tokens", "train_chunks", "train_chunk_layout"})

#: The trainer setting that limits each evaluation's batches.
_OWN_LIMIT = {"validate": "trainer.limit_val_batches", "test": "trainer.limit_test_batches"}

#: What decides a validation's or test's score: ``cofr validate``/``test`` take these
#: from the run's config.yaml when the command gives neither them nor a ``--config``.
SCORING_KEYS = (
    "data.data_dir",
    "data.block_size",
    "data.batch_size",
    "data.val_batch_size",
    "trainer.limit_val_batches",
    "trainer.limit_test_batches",
)


#: The option that scores a sharded checkpoint under FSDP and keeps the scoring settings
#: taken from the run's fit (any ``--config`` turns that off).
FSDP_STRATEGY_OPTION = f"--trainer.strategy.class_path {LADDER_FSDP}"


def validation_due(trainer_config: dict[str, Any], step: int, saved: dict[str, Any]) -> bool:
    """Whether the fit of ``trainer_config`` (its Trainer settings) validates at the end
    of optimizer step ``step``, which checkpoint ``saved`` holds."""
    return validates_at(
        saved_batches(saved, step, trainer_config.get("accumulate_grad_batches") or 1),
        trainer_config.get("val_check_interval"),
        trainer_config.get("limit_val_batches"),
        trainer_config.get("check_val_every_n_epoch", 1),
    )


def saved_batches(saved: dict[str, Any], step: int, accumulate: int) -> int:
    """The training batches checkpoint ``saved`` (at optimizer step ``step``) had run: its
    ``batches_trained``, else Lightning's loop state (checkpoints from before that key),
    else ``step x accumulate`` (no loop state: saved by hand)."""
    if "batches_trained" in saved:
        return int(saved["batches_trained"])
    try:
        progress = saved["loops"]["fit_loop"]["epoch_loop.batch_progress"]
        return int(progress["total"]["ready"])
    except (KeyError, TypeError, ValueError):
        return step * accumulate


def unscored_validation(
    trainer_config: dict[str, Any],
    step: int,
    saved: dict[str, Any],
    run: RunConfig,
    run_dir: Path,
    chosen: str,
) -> str | None:
    """A note for a resume from checkpoint ``saved``, saved before the validation due at
    its step, when the run's MLflow history has no ``val/loss`` there: a hard kill during that
    validation, which Lightning takes as done on resume. None otherwise (or when the
    history cannot be read: the fit says why soon enough)."""
    from mlflow.tracking import MlflowClient

    if not validation_due(trainer_config, step, saved):
        return None
    try:
        run_id = (run_dir / RUN_ID_FILE).read_text().strip()
        history = MlflowClient(tracking_uri(run)).get_metric_history(run_id, "val/loss")
    except Exception:
        return None
    if any(metric.step == step for metric in history):
        return None
    periodic = run_dir / "checkpoints" / f"step{step:07d}.ckpt"
    path = periodic if periodic.is_file() else Path(chosen)
    command = shlex.join(
        ["cofr", "validate", "--run.runs_dir", run.runs_dir, "--run.experiment",
         run.experiment, "--run.name", run_dir.name, "--ckpt_path", str(path)]
    )  # fmt: skip
    return (
        f"the validation due at step {step} did not finish before the run stopped (its "
        f"MLflow run has no val/loss at step {step}), and a resume from {Path(chosen).name} "
        f"does not run it again: `{command}` scores it onto the run's curve, while that "
        "checkpoint is kept"
    )


def check_schedule_kept(
    checkpoint: str,
    saved: dict[str, Any],
    step: int | None,
    callbacks: list[Any],
    module: torch.nn.Module,
) -> None:
    """Refuse to resume a run whose DyadicUnfreezing (its state in checkpoint ``saved``)
    has depths still frozen at ``step`` without one among ``callbacks``: they would all
    train from the resumed step on, with a Lightning warning about callbacks as the only
    sign. Refuse too a resume whose optimizer would not have the checkpoint's parameter
    groups (DyadicUnfreezing's ``lr: release`` gives each ladder depth one of its own):
    Lightning's traceback came once the run's config.yaml was rewritten."""
    state = (saved.get("callbacks") or {}).get(DyadicUnfreezing.__qualname__)
    dyadic = next((c for c in callbacks if isinstance(c, DyadicUnfreezing)), None)
    check_same_optimizer_groups(checkpoint, saved, state, dyadic, module)
    if not state or step is None or dyadic is not None:
        return
    releases = {int(depth): int(at) for depth, at in (state.get("releases") or {}).items()}
    frozen = {depth: at for depth, at in sorted(releases.items()) if at > step}
    if not frozen:
        return
    plan = ", ".join(f"depth {depth} at step {at}" for depth, at in frozen.items())
    raise ConfigError(
        f"{checkpoint} trained under DyadicUnfreezing, which releases {plan}, and this fit "
        f"has no DyadicUnfreezing callback: those depths would train from step {step} on. "
        "Give it again as the run did (its config.yaml: trainer.callbacks), or with "
        "schedule: none to release them all now"
    )


def check_same_optimizer_groups(
    checkpoint: str,
    saved: dict[str, Any],
    state: dict[str, Any] | None,
    dyadic: DyadicUnfreezing | None,
    module: torch.nn.Module,
) -> None:
    """Refuse a resume that would split the optimizer by ladder depth where checkpoint
    ``saved`` did not, or the other way round (``state``: its DyadicUnfreezing's)."""
    has_ladders = next(ladder_layers(module), None) is not None
    split_now = has_ladders and dyadic is not None and dyadic.lr == "release"
    optimizers = saved.get("optimizer_states") or []
    groups = optimizers[0].get("param_groups") if optimizers else None
    if groups and all("name" in group for group in groups):  # cofr's groups are named
        split_then = any("/depth_" in str(group["name"]) for group in groups)
    elif state and "lr" in state:  # a sharded FSDP checkpoint keeps its groups in shards
        split_then = has_ladders and state["lr"] == "release"
    else:
        return
    if split_then == split_now:
        return
    if split_then:
        now = "has no DyadicUnfreezing callback" if dyadic is None else "gives it lr: global"
        raise ConfigError(
            f"{checkpoint} trained under DyadicUnfreezing with lr: release, which gives each "
            f"ladder depth a parameter group of its own, and this fit {now}: the "
            "checkpoint's optimizer state does not fit its groups. Give the callback again "
            "as the run did (its config.yaml: trainer.callbacks), with lr: release"
        )
    raise ConfigError(
        f"{checkpoint} trained with one parameter group for every ladder depth, and this "
        "fit's DyadicUnfreezing has lr: release, which gives each depth a group of its own: "
        "the checkpoint's optimizer state does not fit them. Resume with lr: global (the "
        "default), or start a new run for lr: release"
    )


def check_sharded_strategy(subcommand: str, folder: Path, strategy: Any) -> None:
    """Refuse a sharded FSDP checkpoint ``folder`` under another ``strategy`` (parsed or
    built) than FSDP, which alone reads its shards: Lightning would open the folder as a
    file (IsADirectoryError) after a fit had rewritten the run's config.yaml and marked
    its MLflow run FAILED."""
    if is_fsdp(strategy):
        return
    one_file = (
        f"make it one file with `python -m lightning.pytorch.utilities.consolidate_checkpoint "
        f"{folder}` and use {folder}.consolidated"
    )
    if subcommand == "fit":
        name = strategy if isinstance(strategy, str) else type(strategy).__name__
        name = getattr(strategy, "class_path", name)
        raise checkpoints.CheckpointError(
            f"{folder} is a sharded FSDP checkpoint (one shard per rank) and this fit's "
            f"strategy is {name!r}: resume it with the "
            f"FSDP strategy it trained with ({FSDP_STRATEGY_OPTION}, or the run's own "
            f"config.yaml as --config), or {one_file}"
        )
    raise checkpoints.CheckpointError(
        f"{folder} is a sharded FSDP checkpoint (one shard per rank): score it with the FSDP "
        f"strategy it trained with, {FSDP_STRATEGY_OPTION} (a --config file would stop "
        f"cofr {subcommand} taking the run's data and batch settings), or {one_file}"
    )


class ParseOnlyCLI(CofrCLI):
    """``cofr fit``'s parsing and type checks, nothing built or run: checks a config
    (every conf/ file in the tests, a sweep's fixed settings before its study)."""

    def instantiate_classes(self) -> None:
        pass

    def run_subcommand(self, subcommand: str) -> None:
        pass


def _model_section(config: Namespace) -> dict[str, Any]:
    """A parsed command's ``model`` section as ``preset`` and ``config`` (a dict)."""
    given = config.model.get("config")
    return {"preset": config.model.preset, "config": None if given is None else vars(given)}


def _model_config(config: Namespace) -> ModelConfig:
    """The ModelConfig a parsed command's ``model`` section builds."""
    from cofrgenet.training.model_options import fit_model_config

    return fit_model_config(_model_section(config))


@contextlib.contextmanager
def given_args() -> Iterator[None]:
    """Around a LightningCLI made with ``args=``: its warning that the process's own argv
    (``cofr sweep run ...``, pytest's) is not those words says nothing here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        yield


def resolve_fit_config(args: Sequence[str]) -> str:
    """The config ``cofr fit ARGS`` trains with, as the YAML its run saves (``config.yaml``):
    every ``--config`` with its ``base:`` files, merged as ``cofr fit`` merges them.

    Raises ConfigError with the parser's message when the words do not parse.
    """
    import io

    import yaml

    err = io.StringIO()
    try:
        with (
            contextlib.redirect_stderr(err),
            contextlib.redirect_stdout(io.StringIO()),
            given_args(),
        ):
            cli = ParseOnlyCLI(args=["fit", *args])
    except SIGTERMException:  # a SystemExit too: the process is told to stop, not the parse
        raise
    except SystemExit:
        lines = [line for line in err.getvalue().strip().splitlines() if line.strip()]
        raise ConfigError(
            "the config does not parse: " + (" ".join(lines[-3:]) or "unknown error")
        ) from None
    except Exception as error:
        raise ConfigError(f"the config does not parse: {error}") from None
    # The fit part of the dump: what ConfigToRun writes as the run's config.yaml.
    full = yaml.safe_load(cli.parser.dump(cli.config, skip_none=False))
    return yaml.safe_dump(full["fit"], sort_keys=False)


def stop_status(stopped: BaseException) -> int | None:
    """The exit status of a fit that a signal stopped, from what ended it: 130 for
    Ctrl-C, 143 for SIGTERM (or the status StopOnSignal gave it); None for any other
    exit (a failure, a --help), which is not a signal's.

    ``cofr fit`` exits with it, and so does what runs fits in its own process (``cofr
    bench quality``): one reading of Lightning's ways of ending a stopped fit.
    """
    if isinstance(stopped, SIGTERMException):  # Lightning's, a SystemExit: it was killed
        # StopOnSignal sets the status (130 for Ctrl-C); Lightning's alone leaves none.
        code = stopped.code if isinstance(stopped.code, int) and stopped.code else None
        return code or 128 + signal.SIGTERM
    if isinstance(stopped, KeyboardInterrupt):  # one outside Lightning's fit loop
        return 128 + signal.SIGINT
    # Lightning ends a fit that a KeyboardInterrupt reached (a second Ctrl-C, or one
    # while starting) with sys.exit(1) inside its handler: Ctrl-C's status is 130.
    if (
        isinstance(stopped, SystemExit)
        and stopped.code == 1
        and isinstance(stopped.__context__, KeyboardInterrupt)
    ):
        return 128 + signal.SIGINT
    return None


def main(args: list[str] | None = None) -> None:
    if args is not None and list(args) == sys.argv[1:]:
        args = None  # the same words: say so, or Lightning warns that both were given
    words = sys.argv[1:] if args is None else list(args)
    fits = next((w for w in words if not w.startswith("-")), None) == "fit"
    try:
        # SIGTERM raises from the start, as in the fit before its first step: its default
        # action, between the run's lock and the fit's own handler, ended the process
        # with its output unwritten and the run folder holding only a lock file.
        with sigterm_raises(lightning_sigterm) if fits else contextlib.nullcontext():
            CofrCLI(args=args)
    except SystemExit as stopped:  # a KeyboardInterrupt outside a fit goes on as it is
        status = stop_status(stopped)
        if status is None:
            raise
        raise SystemExit(status) from None


if __name__ == "__main__":
    main()
