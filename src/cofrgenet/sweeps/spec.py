"""Sweep files: the study, its base config, a search space over dotted config keys.

A sweep file (``sweeps/*.yaml``)::

    study: tiny-cpu                    # Optuna study name (and MLflow experiment by default)
    base:                              # config files, merged in order (later ones win)
      - conf/trainer/cpu-debug.yaml
      - conf/data/pydoc-byte.yaml
    overrides:                         # fixed dotted keys, applied after the base files
      model.preset: gpt2-tiny-f
      model.config.vocab_size: 320
    space:                             # one Optuna parameter per dotted key
      model.config.depth: int 1..8
      model.config.ladders: {choices: [1, 3, 5, 7]}
      model.optimizer.lr: float 1e-4..3e-3 log
    sampler: {name: tpe, seed: 0}      # tpe | random | grid (+ the sampler's own options)
    pruner: {name: median}             # median | percentile | hyperband | sha | none
    objective: {metric: val/loss, direction: minimize}
    budget: {steps: 2000}              # or {tokens: 1.0e8}; optional val_every: N steps
    n_trials: 40                       # the study's trial budget (none for grid: every point)
    storage: null                      # default: journal file runs/sweeps/<study>/optuna.journal

Keys are the keys of the full training config (``cofr fit --print_config`` shows them):
``model.config.*`` are ModelConfig fields, ``model.optimizer.*`` the optimizer's,
``data.*``, ``trainer.*``. A trial is ``cofr fit`` with ``--config`` for each base file,
then the dotted settings (overrides, ``--set``, sampled parameters, budget) as one more
config file and ``--KEY=VALUE`` words: they merge exactly as for ``cofr fit``, through
its own parser (:mod:`cofrgenet.sweeps.fitconfig`).
"""

from __future__ import annotations

import copy
import itertools
import logging
import math
import os
import re
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cofrgenet.config_variables import (
    VARIABLE,
    close_variable_hint,
    expand_variables,
    unset_variables,
)
from cofrgenet.devices import device_count, devices_used
from cofrgenet.dotted import get_dotted, set_dotted
from cofrgenet.errors import ConfigError, UserError, did_you_mean, not_valid_yaml
from cofrgenet.recipes import bundled, find_base, unique_key_loader
from cofrgenet.training.run_store import check_folder_name, folder_name

#: Optuna's class (``optuna.samplers.<name>``) of each sampler name. grid: every point is
#: queued when the study is created; a seeded random sampler stands by, never drawing.
SAMPLER_CLASSES = {"tpe": "TPESampler", "random": "RandomSampler", "grid": "RandomSampler"}
#: What a trial can report as its objective: the metrics LanguageModel logs at every
#: training step (``train/loss``) and validation (``val/loss``, ``val/ppl``); see
#: ``cofrgenet/training/module.py``.
OBJECTIVE_METRICS = ("val/loss", "val/ppl", "train/loss")
#: Optuna's class (``optuna.pruners.<name>``) of each pruner name.
PRUNER_CLASSES = {
    "median": "MedianPruner",
    "percentile": "PercentilePruner",
    "hyperband": "HyperbandPruner",
    "sha": "SuccessiveHalvingPruner",
    "none": "NopPruner",
}
PRUNERS = tuple(PRUNER_CLASSES)
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
# Exactly two dots between the ends: `1e-4...3e-3` read as 1e-4 to .3e-3 (3e-4).
_RANGE = re.compile(
    rf"^\s*(int|float)\s+({_NUMBER})\s*(?<!\.)\.\.(?!\.)\s*({_NUMBER})"
    rf"((?:\s+(?:log|step\s+{_NUMBER}))*)\s*$"
)


class SweepError(UserError, ValueError):
    """A sweep file that cannot be used, with what to change."""


# ----------------------------------------------------------------------- parameters


@dataclass(frozen=True)
class ParamSpec:
    """One searched config key: an int or float range, or a list of choices."""

    key: str
    kind: str  # "int" | "float" | "categorical"
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()
    #: Values a grid sampler visits for a float range (ints and choices enumerate).
    grid: tuple[Any, ...] = ()

    @property
    def short(self) -> str:
        """The last word of the key (``model.config.depth`` -> ``depth``)."""
        return self.key.rsplit(".", 1)[-1]

    def suggest(self, trial: Any) -> Any:
        with warnings.catch_warnings():
            # A range not a whole number of steps ends at its last step, as docs/sweeps.md
            # says: Optuna's warning of it came at every trial.
            warnings.filterwarnings("ignore", r".*It will be replaced with \[", UserWarning)
            if self.kind == "int":
                step = int(self.step or 1)
                return trial.suggest_int(
                    self.key, int(self.low), int(self.high), step=step, log=self.log
                )
            if self.kind == "float":
                return trial.suggest_float(
                    self.key, self.low, self.high, step=self.step, log=self.log
                )
        return trial.suggest_categorical(self.key, list(self.choices))

    def grid_values(self) -> list[Any]:
        return list(self._grid_values())

    def grid_count(self) -> int:
        """How many values :meth:`grid_values` holds, counted without making them."""
        return len(self._grid_values())

    def _grid_values(self) -> Sequence[Any]:
        if self.kind == "categorical":
            return self.choices
        if self.grid:
            return self.grid
        if self.kind == "int":  # a range object: its length costs nothing
            return range(int(self.low), int(self.high) + 1, int(self.step or 1))
        raise SweepError(
            f"space.{self.key}: a grid sampler needs the values of a float range: give "
            f"'{{type: float, low: {self.low}, high: {self.high}, grid: [...]}}' or choices"
        )

    def default(self) -> Any:
        """A valid value (for checking the config before any trial runs)."""
        if self.kind == "categorical":
            return self.choices[0]
        return int(self.low) if self.kind == "int" else float(self.low)


def counted(number: float, noun: str) -> str:
    """``1 trial``, ``2 trials``: a count with its noun in the number it takes."""
    shown = f"{int(number):,}" if float(number).is_integer() else f"{number:g}"  # not 1e+06
    return f"{shown} {noun}{'' if number == 1 else 's'}"


def _number(text: Any, key: str) -> float:
    try:
        number = float(text)
    except (TypeError, ValueError):
        raise SweepError(f"space.{key}: {text!r} is not a number") from None
    if not math.isfinite(number):  # .inf, .nan: no sampler draws from such a range
        raise SweepError(f"space.{key}: {text!r} is not a finite number")
    return number


def parse_param(key: str, value: Any) -> ParamSpec:
    """``int 1..8``, ``float 1e-4..3e-3 log``, ``int 2..16 step 2``, a list of choices,
    ``{choices: [...]}`` or ``{type: int|float, low, high, step, log, grid}``."""
    if isinstance(value, str):
        match = _RANGE.match(value)
        if not match:
            dots = "; its ends go apart by two dots, not three" if "..." in value else ""
            raise SweepError(
                f"space.{key}: cannot read {value!r}{dots}; write e.g. 'int 1..8', "
                "'float 1e-4..3e-3 log', 'int 2..16 step 2' or {choices: [1, 3, 5, 7]}"
            )
        kind, low, high, extra = match.groups()
        words = (extra or "").split()
        for word in ("step", "log"):
            if words.count(word) > 1:  # the first one was taken, unsaid
                raise SweepError(f"space.{key}: {value!r} gives {word} twice; give it once")
        step = re.search(rf"step\s+({_NUMBER})", extra or "")
        value = {
            "type": kind,
            "low": low,
            "high": high,
            "log": "log" in (extra or ""),
            "step": step.group(1) if step else None,
        }
    if isinstance(value, list):
        value = {"choices": value}
    if not isinstance(value, dict):
        fixed = (
            f"; a value every trial takes goes under overrides: ({key}: {value!r})"
            if isinstance(value, (int, float, bool)) or value is None
            else ""
        )
        raise SweepError(
            f"space.{key}: expected a range string, a list or a mapping, not {value!r}{fixed}"
        )
    fields = ("type", "low", "high", "step", "log", "choices", "grid")
    unknown = sorted(set(value) - set(fields))
    if unknown:
        hint = did_you_mean(str(unknown[0]), fields)
        raise SweepError(f"space.{key}: unknown field(s) {unknown}{hint}")
    if "choices" in value:
        given = value["choices"]
        if given is not None and not isinstance(given, list):  # "13" would be ('1', '3')
            raise SweepError(
                f"space.{key}: choices must be a list, e.g. {{choices: [1, 3]}}, got {given!r}"
            )
        choices = tuple(given or ())
        if not choices:
            raise SweepError(f"space.{key}: choices is empty")
        for choice in choices:
            if not (choice is None or isinstance(choice, (str, int, float, bool))):
                raise SweepError(f"space.{key}: choices must be plain values, got {choice!r}")
        seen = [(type(c), c) for c in choices]  # 1 and true are two choices
        repeated = [c for i, c in enumerate(choices) if (type(c), c) in seen[:i]]
        if repeated:  # a grid trains the point twice; the samplers draw it twice as often
            raise SweepError(f"space.{key}: choices repeat {repeated[0]!r}; give each value once")
        return ParamSpec(key, "categorical", choices=choices)
    kind = value.get("type")
    if kind not in ("int", "float"):
        raise SweepError(f"space.{key}: type must be int or float (or give choices)")
    missing = [end for end in ("low", "high") if value.get(end) is None]
    if missing:  # "None is not a number" named neither
        raise SweepError(
            f"space.{key}: {'an' if kind == 'int' else 'a'} {kind} range needs {' and '.join(missing)}, e.g. "
            f"{{type: {kind}, low: 1, high: 4}}"
        )
    low, high = _number(value.get("low"), key), _number(value.get("high"), key)
    if not low <= high:
        raise SweepError(f"space.{key}: low {low:g} > high {high:g}")
    log = value.get("log", False)
    if log in (None, 0, 1):  # an empty `log:`, or 0/1
        log = bool(log)
    if not isinstance(log, bool):  # YAML's true/false; bool("no") would be True
        raise SweepError(f"space.{key}: log must be true or false, got {log!r}")
    if log and low <= 0:
        raise SweepError(f"space.{key}: a log range needs low > 0")
    step = value.get("step")
    step = None if step is None else _number(step, key)
    if log and step is not None:
        raise SweepError(f"space.{key}: log and step cannot be combined")
    if step is not None and not step > 0:
        raise SweepError(f"space.{key}: step must be > 0, got {value.get('step')!r}")
    if kind == "int" and step is not None and step != int(step):
        raise SweepError(f"space.{key}: an int range needs a whole step, got {step}")
    if kind == "int" and (low != int(low) or high != int(high)):
        raise SweepError(f"space.{key}: int bounds must be whole numbers")
    grid = _grid(value.get("grid"), key, kind, low, high)
    return ParamSpec(key, kind, low=low, high=high, step=step, log=log, grid=grid)


def _grid(values: Any, key: str, kind: str, low: float, high: float) -> tuple[Any, ...]:
    """A range's ``grid:`` values, each a number (whole for int) within ``low..high``."""
    if values is None:
        return ()
    if not isinstance(values, list) or not values:
        raise SweepError(f"space.{key}: grid must be a list of values, e.g. [{low:g}, {high:g}]")
    points = []
    for value in values:
        number = math.nan if isinstance(value, bool) else _number(value, key)
        if not (low <= number <= high and (kind == "float" or number == int(number))):
            what = "a whole number" if kind == "int" else "a number"
            raise SweepError(
                f"space.{key}: grid value {value!r} is not {what} within {low:g}..{high:g}"
            )
        points.append(int(number) if kind == "int" else number)
    return tuple(points)


# ------------------------------------------------------------------------ the sweep


@dataclass
class Objective:
    metric: str = "val/loss"
    direction: str = "minimize"


@dataclass
class Budget:
    """A trial's training length: ``steps`` optimizer steps, or ``tokens`` training tokens."""

    steps: int | None = None
    tokens: float | None = None
    #: Validate (and report to the pruner) every N optimizer steps (N times the gradient
    #: accumulation in Lightning's ``val_check_interval``, which counts batches); default:
    #: the config's ``trainer.val_check_interval``.
    val_every: int | None = None


@dataclass
class StorageOptions:
    """Liveness of trials: heartbeats and how often a lost trial is retried.

    A worker on another host is lost after ``grace_period`` seconds without a heartbeat;
    heartbeats come every ``heartbeat_interval`` seconds, so the grace period must span
    more than two of them (a busy storage delays a beat).
    """

    heartbeat_interval: int = 60
    grace_period: int = 300
    max_retry: int = 3

    def check(self) -> None:
        """SweepError for values under which live workers would be declared lost."""
        for name in ("heartbeat_interval", "grace_period", "max_retry"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise SweepError(f"storage_options.{name} must be a whole number, got {value!r}")
        if self.heartbeat_interval < 1:
            raise SweepError(
                f"storage_options.heartbeat_interval must be >= 1 s, got {self.heartbeat_interval}"
            )
        if self.grace_period <= 2 * self.heartbeat_interval:
            raise SweepError(
                f"storage_options.grace_period {self.grace_period} s must exceed twice the "
                f"heartbeat_interval ({self.heartbeat_interval} s), or live workers on other "
                f"hosts are taken for lost: raise it above {2 * self.heartbeat_interval}"
            )
        if self.max_retry < 0:
            raise SweepError(f"storage_options.max_retry must be >= 0, got {self.max_retry}")


@dataclass
class SlurmOptions:
    """Defaults of ``cofr sweep submit`` (its flags win)."""

    partition: str | None = None
    time: str | int | None = "04:00:00"  # an int: minutes; None: the partition's limit
    cpus_per_worker: int | None = None
    gpus_per_worker: int | None = None  # None: the config's GPU devices (0 without)
    mem: str | int | None = None  # an int: megabytes
    extra: list[str] = field(default_factory=list)

    def check(self) -> None:
        """SweepError naming the field of a value submit cannot use (a string for a
        count gave a TypeError, a string for ``extra`` was read a letter at a time); the
        formats of the #SBATCH values are checked by submit, which writes them."""
        examples = {"partition": "gpu", "time": '"04:00:00" or 90 (minutes)', "mem": "64G"}
        for name, example in examples.items():
            value = getattr(self, name)
            # YAML reads time: 90 and mem: 16000 as numbers: SLURM's minutes, megabytes.
            ok = (str, int) if name != "partition" else str
            if value is not None and (isinstance(value, bool) or not isinstance(value, ok)):
                raise SweepError(f"slurm.{name} must be a string, e.g. {example}, got {value!r}")
        for name, least in (("cpus_per_worker", 1), ("gpus_per_worker", 0)):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise SweepError(f"slurm.{name} must be a whole number >= {least}, got {value!r}")
        if self.extra is None:  # `extra:` with nothing under it
            self.extra = []
        if not isinstance(self.extra, list):
            raise SweepError(
                f"slurm.extra must be a list of sbatch options, e.g. extra: [--account=abc], "
                f"got {self.extra!r}"
            )
        for i, option in enumerate(self.extra):
            if not isinstance(option, str):
                raise SweepError(
                    f"slurm.extra[{i}] must be an sbatch option as a string, e.g. "
                    f"--account=abc, got {option!r}"
                )


#: The most points a grid sweep may have. Every point is queued as a trial (a record in
#: the storage) when the study is made, and the points are held in memory to queue and
#: check them: a range of a hundred million ints ran the worker out of memory.
MAX_GRID_POINTS = 10_000


def grid_size(space: list[ParamSpec]) -> int:
    """The number of points of a grid over ``space``, counted without making them;
    SweepError above :data:`MAX_GRID_POINTS`, naming each key's count."""
    counts = [p.grid_count() for p in space]
    size = math.prod(counts)
    if size > MAX_GRID_POINTS:
        each = " x ".join(f"{p.key} {n:,}" for p, n in zip(space, counts, strict=True))
        raise SweepError(
            f"sampler grid: the space has {counted(size, 'point')} ({each}), more than the "
            f"{MAX_GRID_POINTS:,} a grid sweep may queue (each point is a trial): give its "
            "ranges a coarser step or fewer choices, or use a tpe or random sampler with "
            "n_trials"
        )
    return size


def grid_points(space: list[ParamSpec]) -> list[dict[str, Any]]:
    """Every point of a grid over ``space``, in a fixed order (the last key varies fastest)."""
    grid_size(space)  # refuses a grid too large to make, before making it
    keys = [p.key for p in space]
    values = [p.grid_values() for p in space]
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*values)]


@dataclass
class Sweep:
    path: Path | None
    study: str
    base: list[Path]
    overrides: dict[str, Any]
    space: list[ParamSpec]
    sampler: dict[str, Any]
    pruner: dict[str, Any]
    objective: Objective
    budget: Budget
    n_trials: int | None
    storage: str | None
    storage_options: StorageOptions
    experiment: str
    runs_dir: str
    tracking_uri: str | None
    slurm: SlurmOptions
    #: The two keys of the report's heat map (default: the *.depth and *.ladders keys).
    heatmap: tuple[str, str] | None = None
    raw: dict[str, Any] = field(default_factory=dict)
    #: Why ``storage`` cannot be used (an unset variable inside its URL): raised where the
    #: sweep's own storage is needed, not when a ``--storage`` replaces it.
    storage_error: str | None = None

    @property
    def grid(self) -> list[dict[str, Any]]:
        """Every point of the grid (grid sampler), in a fixed order."""
        return grid_points(self.space)

    @property
    def grid_size(self) -> int:
        """The number of points of the grid (grid sampler), without making them."""
        return grid_size(self.space)

    @property
    def is_grid(self) -> bool:
        return self.sampler.get("name") == "grid"

    @property
    def total_trials(self) -> int:
        """The study's trial budget: the grid's size, or ``n_trials``."""
        if self.is_grid:
            return self.grid_size
        if self.n_trials is not None:
            return self.n_trials
        raise SweepError("n_trials is required unless the sampler is grid")

    def param(self, key: str) -> ParamSpec | None:
        return next((p for p in self.space if p.key == key), None)

    def heatmap_keys(self) -> tuple[str, str] | None:
        if self.heatmap:
            return self.heatmap
        depth = next((p.key for p in self.space if p.short == "depth"), None)
        ladders = next((p.key for p in self.space if p.short == "ladders"), None)
        return (depth, ladders) if depth and ladders else None


_TOP_KEYS = {
    "study",
    "experiment",
    "base",
    "overrides",
    "space",
    "sampler",
    "pruner",
    "objective",
    "budget",
    "n_trials",
    "storage",
    "storage_options",
    "runs_dir",
    "tracking_uri",
    "slurm",
    "heatmap",
    "description",
}


log = logging.getLogger("cofrgenet.sweeps")


def _expand(value: Any, where: str) -> str | None:
    """``${VAR}`` references replaced from the environment (a bare ``$`` is literal: a
    password may hold one). A value that is one unset variable is None (the default),
    unless a set variable has a close name (a typo: on many hosts each worker would run
    a study of its own on its local default); an unset variable inside a longer value is
    a SweepError."""
    if value is None:
        return None
    text = str(value)
    for name in unset_variables(text):
        hint = close_variable_hint(name)
        if VARIABLE.fullmatch(text.strip()) is None or hint:
            raise SweepError(f"{where}: ${{{name}}} is not set in the environment{hint}")
        return None  # the whole value is one unset variable: the default
    expanded = expand_variables(text, where)
    return expanded if expanded.strip() else None


def _mapping(value: Any, where: str) -> dict[str, Any]:
    """A sweep file section that holds options: a mapping ({} when absent)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        # `sampler: tpe` names the kind: the example is the mapping that says so.
        example = f"{{name: {value}}}" if isinstance(value, str) and value else "{key: value}"
        raise SweepError(
            f"{where}: a mapping of options is expected (e.g. `{where}: {example}`), got {value!r}"
        )
    return dict(value)


def _options(cls: type, value: Any, where: str) -> Any:
    value = _mapping(value, where)
    names = set(cls.__dataclass_fields__)
    unknown = set(value) - names
    if unknown:
        first = sorted(unknown)[0]
        hint = did_you_mean(str(first), names)
        raise SweepError(
            f"{where}: unknown field(s) {sorted(unknown)}{hint}; known: {sorted(names)}"
        )
    return cls(**value)


def resolve_base(entry: str, sweep_file: Path | None) -> Path:
    """A base config path, found as a fit config's ``base:`` entries are
    (:func:`cofrgenet.recipes.find_base`) but from the sweep file's folder and its parents
    before the working directory, so that workers started from anywhere read the same
    files; made absolute for the trial workers."""
    try:
        return find_base(entry, sweep_file, naming_first=True).resolve()
    except ConfigError as error:
        raise SweepError(str(error)) from None


def _whole(value: Any, where: str) -> int:
    """``value`` as a whole number >= 1, or SweepError naming ``where``."""
    try:
        number = None if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        number = None
    if number is None or not math.isfinite(number) or number != int(number) or number < 1:
        raise SweepError(f"{where} must be a whole number >= 1, got {value!r}")
    return int(number)


def _check_values(objective: Objective, budget: Budget, n_trials: Any) -> None:
    """The values a trial would only fail on (or, for ``steps: 0``, train nothing with)."""
    if objective.metric not in OBJECTIVE_METRICS:
        hint = did_you_mean(str(objective.metric), OBJECTIVE_METRICS)
        raise SweepError(
            f"objective.metric {objective.metric!r} is not a metric a trial reports{hint}; "
            f"use one of {', '.join(OBJECTIVE_METRICS)}"
        )
    if objective.direction == "maximize":  # the search would seek the worst model
        raise SweepError(
            f"objective.direction maximize: {objective.metric} is lower-is-better, as is "
            f"every metric a trial reports; use minimize (the default){_STUDY_MADE_SO}"
        )
    if budget.steps is not None:
        budget.steps = _whole(budget.steps, "budget.steps")
    if budget.tokens is not None:
        try:
            tokens = None if isinstance(budget.tokens, bool) else float(budget.tokens)
        except (TypeError, ValueError):
            tokens = None
        if tokens is None or not math.isfinite(tokens) or tokens <= 0:
            raise SweepError(f"budget.tokens must be a number > 0, got {budget.tokens!r}")
    if budget.val_every is not None:
        budget.val_every = _whole(budget.val_every, "budget.val_every")
    if n_trials is not None:
        _whole(n_trials, "n_trials")


def sampler_class(name: str) -> type:
    """Optuna's sampler class of a sweep's ``sampler.name``."""
    import optuna

    return getattr(optuna.samplers, SAMPLER_CLASSES[name])


def build_sampler(sampler: dict[str, Any], seed: int | None) -> Any:
    """The ``optuna.samplers`` object of a sweep's ``sampler`` mapping, with ``seed`` (the
    file's, offset per worker) in place of its own."""
    options = {k: v for k, v in sampler.items() if k not in ("name", "seed")}
    return sampler_class(sampler["name"])(seed=seed, **options)


def build_pruner(pruner: dict[str, Any], steps: int | None = None) -> Any:
    """The ``optuna.pruners`` object of a sweep's ``pruner`` mapping; Hyperband's
    ``max_resource`` defaults to the budget's ``steps``. ``none`` ignores its options."""
    import optuna

    name = pruner["name"]
    if name == "none":
        return optuna.pruners.NopPruner()
    options = {k: v for k, v in pruner.items() if k != "name"}
    if name == "hyperband" and steps is not None:
        options.setdefault("max_resource", int(steps))
    return getattr(optuna.pruners, PRUNER_CLASSES[name])(**options)


def _pruner_problem(pruner: dict[str, Any], steps: int | None) -> Exception | None:
    """What building ``pruner`` and running it on one report raises, or None."""
    import optuna

    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "A new study created" line
    try:
        built = build_pruner(pruner, steps)
        if pruner["name"] == "hyperband":
            # Hyperband builds its brackets (one SuccessiveHalvingPruner each) at the first
            # report, where a bad min_resource is "math domain error": check them here.
            shared = ("min_resource", "reduction_factor", "bootstrap_count")
            optuna.pruners.SuccessiveHalvingPruner(
                **{k: v for k, v in pruner.items() if k in shared}
            )
        # Some options are only used once a trial reports: one report, in memory.
        trial = optuna.create_study(pruner=built).ask()
        trial.report(1.0, 1)
        trial.should_prune()
    except Exception as error:  # whatever it is, every trial would fail with it
        return error
    finally:
        optuna.logging.set_verbosity(verbosity)
    return None


def _check_pruner(pruner: dict[str, Any], budget: Budget) -> None:
    """SweepError naming the ``pruner`` key whose value the pruner rejects (built once
    here, where a bad value would otherwise fail every trial)."""
    import inspect

    import optuna

    name = pruner["name"]
    if name == "none":
        return
    cls = getattr(optuna.pruners, PRUNER_CLASSES[name])
    accepted = [k for k in inspect.signature(cls.__init__).parameters if k != "self"]
    options = [k for k in pruner if k != "name"]
    for key in options:
        if key not in accepted:
            raise SweepError(
                f"pruner.{key}: not an option of the {name} pruner (Optuna's "
                f"{cls.__name__}){did_you_mean(str(key), accepted)}; its options: "
                f"{', '.join(accepted)}"
            )
    steps = budget.steps
    high = pruner.get("max_resource", steps)
    where = "max_resource" if "max_resource" in pruner else "budget.steps"
    _check_first_rung(pruner, high, f"the {where} {high}", "lower min_resource")
    error = _pruner_problem(pruner, steps)
    if error is None:
        return
    # The option at fault: the one the message names, else the first that fails alone.
    key = next((k for k in options if re.search(rf"\b{re.escape(str(k))}\b", str(error))), None)
    if key is None:
        key = next(
            (k for k in options if _pruner_problem({"name": name, k: pruner[k]}, steps)), None
        )
    where = f"pruner.{key}: {pruner[key]!r}" if key else f"pruner {pruner!r}"
    raise SweepError(f"{where} is refused by the {name} pruner (Optuna's {cls.__name__}): {error}")


def _number_option(pruner: dict[str, Any], key: str, default: Any) -> float | None:
    """A pruner option's value as a number (``default`` when unset); None when it is no
    number (Optuna's own check names that)."""
    value = pruner.get(key, default)
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def pruner_idle_in_budget(sweep: Sweep, config: dict[str, Any]) -> str | None:
    """Why the sweep's pruner could prune no trial of ``config`` (a trial's config: the
    worker's probe at the space's first values) before its last step, or None. Said, not
    refused: a smoke run's copy with a smaller budget is no error, and where a searched
    key sets the steps (``trainer.max_steps``, the batch size under a tokens budget)
    other trials may train longer."""
    steps = budget_steps(sweep, config)
    if steps is None:
        return None
    if sweep.budget.steps is not None:
        made = ""
    elif sweep.budget.tokens is not None:
        made = f" (what budget.tokens {float(sweep.budget.tokens):g} makes at the space's first values)"
    else:
        made = " (trainer.max_steps at the space's first values)"
    said = [
        never_prunes_before_end(sweep.pruner, steps, made),
        _validates_once(sweep, config, steps, made),
    ]
    return "; ".join(s for s in said if s) or None


#: Keys that, searched, give trials other numbers of steps than the probe's.
STEP_KEYS = ("trainer.max_steps", "data.batch_size", "data.block_size",
             "model.config.block_size", "trainer.accumulate_grad_batches")  # fmt: skip


def _validates_once(sweep: Sweep, config: dict[str, Any], steps: int, made: str) -> str | None:
    """Why a trial of ``config`` would validate only at its end, its pruner judging
    nothing before: ``trainer.val_check_interval`` (the GPU sweeps' form of
    ``budget.val_every``, which is refused so: :func:`check_budget`) past its ``steps``
    optimizer steps, in batches of the gradient accumulation; or None."""
    interval = get_dotted(config, "trainer.val_check_interval")
    accumulate = get_dotted(config, "trainer.accumulate_grad_batches", 1)
    searched = sweep.param("trainer.val_check_interval") or sweep.param(
        "trainer.accumulate_grad_batches"
    )
    numbers = all(isinstance(v, int) and not isinstance(v, bool) for v in (interval, accumulate))
    name = sweep.pruner.get("name", "none")
    if sweep.budget.val_every is not None or name == "none" or searched or not numbers:
        return None
    if interval <= steps * max(accumulate, 1):
        return None
    batches = f" ({steps * accumulate} batches of {accumulate})" if accumulate > 1 else ""
    return (
        f"trainer.val_check_interval: {interval} batches is above the budget's {steps} "
        f"steps{made}{batches}: a trial would validate once, at its end, and the {name} "
        "pruner see nothing before; lower it, or set budget.val_every (in optimizer steps)"
    )


def never_prunes_before_end(pruner: dict[str, Any], steps: int, made: str = "") -> str | None:
    """Why ``pruner`` could prune no trial of ``steps`` steps before its last one (its
    warm-up or first rung not below ``steps``: a prune at the last step saves nothing and
    throws a trained trial's value away), or None. ``made``: where ``steps`` came from."""
    name = pruner.get("name")
    if name in ("median", "percentile"):
        # Optuna judges from step == n_warmup_steps on.
        warmup = _number_option(pruner, "n_warmup_steps", 0)
        if warmup is not None and warmup >= steps:
            return (
                f"pruner.n_warmup_steps: {warmup:g} is not below the budget's {steps} "
                f"steps{made}, so the {name} pruner could prune no trial before its last "
                "step; lower n_warmup_steps"
            )
    if name == "sha":
        # Its first rung: min_resource x reduction_factor ^ min_early_stopping_rate.
        low = _number_option(pruner, "min_resource", None)  # "auto": its own to pick
        factor = _number_option(pruner, "reduction_factor", 4)
        rate = _number_option(pruner, "min_early_stopping_rate", 0)
        if None not in (low, factor, rate) and 0 <= rate < 64 and low * factor**rate >= steps:
            key = "min_early_stopping_rate" if rate else "min_resource"
            rung = f" (min_resource {low:g} x reduction_factor {factor:g}^{rate:g})" if rate else ""
            return (
                f"pruner.{key}: {pruner[key]} puts the sha pruner's first rung at step "
                f"{low * factor**rate:g}{rung}, not below the budget's {steps} steps{made}, "
                f"so it could prune no trial before its last step; lower {key}"
            )
    return None


def pruner_waits_past_budget(sweep: Sweep) -> str | None:
    """Why the median or percentile pruner would never prune: it waits for more complete
    trials than the study's budget holds while a trial runs (at most ``total_trials -
    1``; workers racing for the last trials may overshoot by a few), or None. Said, not
    refused: a copy of a sweep file with a smaller n_trials for a smoke run is no
    error. Only an option the sweep gives (Optuna's default n_startup_trials, 5, is not
    the sweep's to answer for)."""
    pruner = sweep.pruner
    if pruner.get("name") not in ("median", "percentile"):
        return None
    total = sweep.total_trials
    budget = f"the grid's {counted(total, 'point')}" if sweep.is_grid else f"n_trials {total}"
    needs = {"n_startup_trials": "", "n_min_trials": " that reported the step"}
    for key, which in needs.items():
        value = _number_option(pruner, key, None)
        if value is not None and value >= total:
            return (
                f"pruner.{key}: {value:g} is not below {budget}: the {pruner['name']} "
                f"pruner waits for {counted(value, 'complete trial')}{which}, but at most "
                f"{total - 1} can be complete while a trial runs, so it will prune nothing "
                f"(lower {key} to prune)"
            )
    return None


def parse_sweep(raw: dict[str, Any], path: Path | None = None, resolve: bool = True) -> Sweep:
    """A Sweep from its YAML mapping; ``resolve=False`` leaves base paths and values
    unchecked (a study's stored copy, read for status and reports)."""
    if not isinstance(raw, dict):
        raise SweepError("a sweep file is a YAML mapping")
    unknown = sorted(set(raw) - _TOP_KEYS, key=str)
    if unknown:
        where = f" in {path}" if path is not None else ""
        hint = did_you_mean(str(unknown[0]), sorted(_TOP_KEYS))
        raise SweepError(f"unknown sweep key(s) {unknown}{where}{hint}; known: {sorted(_TOP_KEYS)}")
    study = raw.get("study")
    if study is None:
        where = f"{path} has" if path is not None else "the sweep has"
        raise SweepError(f"{where} no study: key: name the study (study: my-sweep)")
    # As a folder keeps it: the study's runs go to runs/sweeps/<study>/ and its experiment.
    if not study or folder_name(str(study), "") != str(study):
        raise SweepError(
            f"study {study!r}: a name of letters, digits, '.', '_' or '-' is required, not "
            "starting with '.' or '-'"
        )
    base = raw.get("base") or []
    base = [base] if isinstance(base, str) else base
    if not isinstance(base, list) or not all(isinstance(b, str) for b in base):
        raise SweepError(f"base: a config file or a list of them, got {raw.get('base')!r}")
    overrides = _mapping(raw.get("overrides"), "overrides")
    space_raw = raw.get("space") or {}
    if not isinstance(space_raw, dict) or not space_raw:
        raise SweepError("space: at least one dotted config key to search")
    space = [parse_param(str(k), v) for k, v in space_raw.items()]
    sampler = _mapping(raw.get("sampler"), "sampler") or {"name": "tpe"}
    sampler.setdefault("name", "tpe")
    if sampler["name"] not in SAMPLER_CLASSES:
        names = tuple(SAMPLER_CLASSES)
        hint = did_you_mean(str(sampler["name"]), names)
        raise SweepError(f"sampler.name must be one of {names}, got {sampler['name']!r}{hint}")
    pruner = _mapping(raw.get("pruner"), "pruner") or {"name": "none"}
    pruner.setdefault("name", "none")
    if pruner["name"] not in PRUNERS:
        hint = did_you_mean(str(pruner["name"]), PRUNERS)
        raise SweepError(f"pruner.name must be one of {PRUNERS}, got {pruner['name']!r}{hint}")
    objective = _options(Objective, raw.get("objective"), "objective")
    if objective.direction not in ("minimize", "maximize"):
        hint = did_you_mean(str(objective.direction), ("minimize", "maximize"))
        raise SweepError(
            f"objective.direction must be minimize or maximize, got {objective.direction!r}{hint}"
        )
    budget = _options(Budget, raw.get("budget"), "budget")
    if budget.steps is not None and budget.tokens is not None:
        raise SweepError("budget: give steps or tokens, not both")
    n_trials = raw.get("n_trials")
    if resolve:  # a study's stored copy is read as an older cofr wrote it
        _check_values(objective, budget, n_trials)
        _check_pruner(pruner, budget)
    experiment = str(raw.get("experiment") or study)
    if resolve:  # the trials' run.experiment: their folder runs/<experiment>/
        try:
            check_folder_name("experiment", experiment)
        except ConfigError as error:
            raise SweepError(str(error)) from None
    heatmap = raw.get("heatmap")
    if heatmap is not None and not isinstance(heatmap, list):  # a string is not its letters
        raise SweepError(f"heatmap: a list of two keys of the space, got {heatmap!r}")
    storage, storage_error = None, None
    try:
        storage = _expand(raw.get("storage"), "storage")
    except SweepError as error:  # a --storage may replace it: refused where it is used
        storage_error = str(error) if resolve else None
    try:
        tracking_uri = _expand(raw.get("tracking_uri"), "tracking_uri")
    except SweepError:
        if resolve:
            raise
        tracking_uri = None  # a study's stored copy: the tracking URI comes from elsewhere
    sweep = Sweep(
        path=path,
        study=str(study),
        base=[resolve_base(str(b), path) if resolve else Path(str(b)) for b in base],
        overrides=overrides,
        space=space,
        sampler=sampler,
        pruner=pruner,
        objective=objective,
        budget=budget,
        n_trials=None if n_trials is None else int(float(n_trials)),
        storage=storage,
        storage_options=_options(StorageOptions, raw.get("storage_options"), "storage_options"),
        experiment=experiment,
        runs_dir=str(raw.get("runs_dir") or "runs"),
        tracking_uri=tracking_uri,
        slurm=_options(SlurmOptions, raw.get("slurm"), "slurm"),
        heatmap=tuple(heatmap) if heatmap else None,
        raw=copy.deepcopy(raw),
        storage_error=storage_error,
    )
    if sweep.is_grid:
        points = sweep.grid_size  # raises for float ranges without grid values, or too many
        if resolve and sweep.n_trials is not None and sweep.n_trials != points:
            raise SweepError(
                f"n_trials {sweep.n_trials}: a grid sweep trains each of its points once "
                f"({counted(points, 'point')}); drop n_trials (or use a tpe or random sampler)"
            )
    elif resolve and (gridded := next((p.key for p in sweep.space if p.grid), None)):
        raise SweepError(
            f"space.{gridded}: grid values apply to the grid sampler only (sampler: "
            f"{{name: grid}}); the {sweep.sampler['name']} sampler draws from the range"
        )
    sweep.total_trials  # noqa: B018 - raises when n_trials is missing
    if resolve:
        # An override of a key the sweep sets in every trial would be silently replaced.
        fixed = sweep_keys(sweep)
        _check_not_set_again(fixed, overrides, "overrides: {key}", "remove it from the overrides")
        _check_space_not_set_again(sweep)
        sweep.storage_options.check()
        sweep.slurm.check()
        _check_sampler(sweep.sampler, sweep.space)
        _check_heatmap(sweep)
    return sweep


def _check_sampler(sampler: dict[str, Any], space: list[ParamSpec] | None = None) -> None:
    """SweepError naming a ``sampler`` option Optuna's sampler does not take, or whose
    value it fails on. The sampler is built once here and draws ``space`` in memory past
    its startup trials (no training): a typo or a value of the wrong type (``gamma:
    0.5``, ``n_startup_trials: "x"``) would otherwise fail every trial, or stop every
    worker with a traceback, at trial 0 or once TPE takes over from its random start."""
    import inspect

    name = sampler["name"]
    cls = sampler_class(name)
    accepted = [k for k in inspect.signature(cls.__init__).parameters if k != "self"]
    options = {k: v for k, v in sampler.items() if k not in ("name", "seed")}
    for key in options:
        if key not in accepted:
            raise SweepError(
                f"sampler.{key}: not an option of the {name} sampler (Optuna's "
                f"{cls.__name__}){did_you_mean(str(key), accepted)}"
            )
    seed = sampler.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise SweepError(f"sampler.seed must be a whole number, got {seed!r}")
    error = _sampler_problem(cls, seed, options, space or [])
    if error is None:
        return
    # The option at fault: the one the message names, else the first that fails alone.
    key = next((k for k in options if re.search(rf"\b{re.escape(str(k))}\b", str(error))), None)
    if key is None:
        key = next(
            (k for k in options if _sampler_problem(cls, seed, {k: options[k]}, space or [])),
            None,
        )
    where = f"sampler.{key}: {options[key]!r}" if key else f"sampler {sampler!r}"
    message = str(error).strip().splitlines()[0] if str(error).strip() else ""
    raise SweepError(
        f"{where} is refused by Optuna's {cls.__name__}: {type(error).__name__}"
        f"{': ' + message if message else ''}"
    )


def _sampler_problem(
    cls: type, seed: int | None, options: dict[str, Any], space: list[ParamSpec]
) -> Exception | None:
    """What building the sampler and running it on ``space`` raises, or None: an
    in-memory study of its startup trials (at most 10 of them here) and one more, with
    made-up objective values."""
    import optuna

    startup = options.get("n_startup_trials", 10)
    trials = 1
    if isinstance(startup, int) and not isinstance(startup, bool):
        trials = max(0, min(startup, 10)) + 1
        if "n_startup_trials" in options:  # the first trial past the startup ones is TPE's
            options = {**options, "n_startup_trials": trials - 1}
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # no "A new study created" lines
    try:
        with warnings.catch_warnings():  # experimental options (multivariate, ...) warn
            warnings.simplefilter("ignore")
            study = optuna.create_study(sampler=cls(seed=seed, **options))
            for number in range(trials if space else 0):
                trial = study.ask()
                for param in space:
                    param.suggest(trial)
                study.tell(trial, float(number))
    except Exception as error:  # whatever it is, every trial would fail with it
        return error
    finally:
        optuna.logging.set_verbosity(verbosity)
    return None


def _check_heatmap(sweep: Sweep) -> None:
    if sweep.heatmap is None:
        return
    keys = [p.key for p in sweep.space]
    if len(sweep.heatmap) != 2:
        raise SweepError(f"heatmap: two keys of the space, got {list(sweep.heatmap)}")
    for key in sweep.heatmap:
        if key not in keys:
            raise SweepError(
                f"heatmap: {key!r} is not a key of the space{did_you_mean(str(key), keys)}"
            )


def load_sweep(path: str | os.PathLike[str], overrides: dict[str, Any] | None = None) -> Sweep:
    """Read a sweep file; ``overrides`` (dotted sweep keys, e.g. ``{"storage": ...}``) win.
    A path not under the working directory is looked up in the checkout, as ``cofr fit
    --config`` does (:func:`cofrgenet.recipes.bundled`): ``sweeps/tiny-cpu.yaml`` from
    any folder."""
    path = bundled(path)
    if path.is_dir():
        names = sorted(p.name for p in path.glob("*.yaml"))[:4]
        inside = f" (its sweep files: {', '.join(names)})" if names else ""
        raise SweepError(f"{path} is a folder, not a sweep file{inside}")
    if not path.is_file():
        raise SweepError(f"no sweep file at {path}")
    try:
        raw = yaml.load(path.read_text(), Loader=unique_key_loader())  # as cofr fit's files
    except yaml.YAMLError as error:
        raise SweepError(not_valid_yaml(path, error)) from None
    except (OSError, UnicodeDecodeError) as error:
        raise SweepError(f"cannot read the sweep file {path}: {error}") from None
    if raw is None:
        raise SweepError(f"{path} holds no settings: a sweep file names a study and a space")
    if not isinstance(raw, dict):
        raise SweepError(
            f"{path} is not a sweep file: it holds a YAML {type(raw).__name__}, not a "
            "mapping of sweep keys (study, space, ...)"
        )
    for key, value in (overrides or {}).items():
        set_dotted(raw, key, value, SweepError)
    return parse_sweep(raw, path.resolve())


# ------------------------------------------------------------- building the config


def parse_assignment(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` with a YAML value (``trainer.devices=2`` -> ("trainer.devices", 2))."""
    if "=" not in text or not text.split("=", 1)[0].strip():
        raise SweepError(f"--set: expected KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    try:
        return key.strip(), yaml.safe_load(value)
    except yaml.YAMLError as error:
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise SweepError(f"--set {text}: the value is not valid YAML: {problem}") from None


def encode_value(value: Any) -> str:
    """A config value as the word after ``--KEY=`` on ``cofr fit``'s command line.

    Strings go as they are (the parser reads a ``str`` option's word verbatim); anything
    else as flow YAML, which the parser reads back to the same value.
    """
    return value if isinstance(value, str) else flow_yaml(value)


def flow_yaml(value: Any) -> str:
    """``value`` as one line of YAML that reads back to it (``null``; ``'true'`` for the
    string): the VALUE of a ``--set KEY=VALUE`` (:func:`parse_assignment`)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=math.inf, sort_keys=False)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def config_settings(
    sweep: Sweep, params: dict[str, Any] | None = None, extra: dict[str, Any] | None = None
) -> list[tuple[str, Any]]:
    """The dotted settings over the base files, in order (later ones win): the sweep's
    overrides, ``extra`` (``--set``), sampled ``params``."""
    return [*sweep.overrides.items(), *(extra or {}).items(), *(params or {}).items()]


def sweep_keys(sweep: Sweep, mlflow: bool = True) -> dict[str, str]:
    """The config keys a sweep sets in every trial after its overrides and ``--set`` (so
    either of one would be ignored), each with what to do instead (``{target}``: the key,
    ``{drop}``: how to drop the other setting)."""
    searched = {
        p.key: "the sweep searches {target}; remove it from the space or {drop}"
        for p in sweep.space
    }
    return {**searched, **_keys_set_apart_from_the_space(sweep, mlflow)}


def _keys_set_apart_from_the_space(sweep: Sweep, mlflow: bool = True) -> dict[str, str]:
    """:func:`sweep_keys` but the space's: the budget's and the run's."""
    fixed = {}
    if sweep.budget.steps is not None or sweep.budget.tokens is not None:
        fixed["trainer.max_steps"] = "the sweep's budget sets {target}; change the budget"
    if sweep.budget.val_every is not None:
        fixed["trainer.val_check_interval"] = (
            "the sweep's budget.val_every sets {target}; change budget.val_every"
        )
    fixed["run.experiment"] = "the sweep's experiment sets {target}; change it there"
    fixed["run.name"] = "the sweep names each trial's run trial-<number>; {drop}"
    fixed["run.runs_dir"] = "the sweep sets {target}; use its runs_dir: key or --runs-dir"
    if sweep.tracking_uri:
        fixed["run.tracking_uri"] = "the sweep's tracking_uri sets {target}; change it there"
    if not mlflow:
        fixed["run.mlflow"] = "--no-mlflow sets {target} to false; drop one of the two"
    return fixed


#: Said where a sweep file is refused for what older versions took: its study, if made
#: so, is still read by name.
_STUDY_MADE_SO = (
    ". A study made from this file before cofr refused it: `cofr sweep status` or "
    "`report` with the study's name reads its stored sweep"
)


def _check_space_not_set_again(sweep: Sweep) -> None:
    """SweepError for a searched key that the sweep itself sets in every trial (the
    budget's ``trainer.max_steps``, ``run.name``...): the trial would train with the
    sweep's value and the study record the drawn one, never trained."""
    fixed = _keys_set_apart_from_the_space(sweep)
    for param in sweep.space:
        for target, why in fixed.items():
            key = param.key
            if key == target or key.startswith(target + ".") or target.startswith(key + "."):
                reason = why.format(target=target, drop="remove it from the space")
                if "{drop}" not in why:
                    reason += ", or remove it from the space"
                raise SweepError(
                    f"space.{param.key}: {reason} (each trial would train with the sweep's "
                    f"value, and the study record the drawn one){_STUDY_MADE_SO}"
                )
        if param.key.split(".")[0] == "run":  # e.g. run.mlflow, run.keep_checkpoints
            raise SweepError(
                f"space.{param.key}: run.* says where and how a trial is recorded, not what "
                "it trains, so there is nothing to search; set it in overrides instead"
                f"{_STUDY_MADE_SO}"
            )


def check_extra(sweep: Sweep, extra: dict[str, Any] | None, mlflow: bool = True) -> None:
    """SweepError for a ``--set`` key that the sweep sets again in every trial (a searched
    key, the budget's ``trainer.max_steps``, ``run.name``...), or a key above one."""
    _check_not_set_again(sweep_keys(sweep, mlflow), extra or {}, "--set {key}", "drop the --set")


def _check_not_set_again(
    fixed: dict[str, str], given: dict[str, Any], where: str, drop: str
) -> None:
    missing = object()
    for key, value in given.items():
        for target, why in fixed.items():
            inside = target.startswith(key + ".")
            if inside and get_dotted(value, target[len(key) + 1 :], missing) is missing:
                continue  # `model.config: {dropout: 0.1}` beside a searched model.config.depth
            if target == key or inside:
                name = "this key" if target == key else target
                raise SweepError(f"{where.format(key=key)}: {why.format(target=name, drop=drop)}")


def base_config(sweep: Sweep, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The full config (defaults included) of the base files, overrides and ``extra``, as
    ``cofr fit`` parses them (:mod:`cofrgenet.sweeps.fitconfig`).

    Imports LightningCLI (seconds, once per process); SweepError when it does not parse.
    """
    from cofrgenet.sweeps.fitconfig import check_keys, resolve_settings

    check_keys(sweep, extra)
    return resolve_settings(sweep.base, config_settings(sweep, extra=extra))


def steps_for_tokens(config: dict[str, Any], tokens: float) -> int:
    """Optimizer steps that train on ``tokens`` tokens with this config's batch geometry."""
    batch = int(get_dotted(config, "data.batch_size", 16))
    block = int(get_dotted(config, "data.block_size", 256))
    accumulate = int(get_dotted(config, "trainer.accumulate_grad_batches", 1) or 1)
    devices = get_dotted(config, "trainer.devices", 1)
    count = device_count(devices)
    if count is None:  # auto and -1 count the devices of the host that trains, not this one
        raise SweepError(
            "budget.tokens needs an integer trainer.devices (got "
            f"{devices!r}) to turn tokens into steps: set it in the sweep's overrides "
            "(cofr sweep submit sets it from --gpus-per-worker)"
        )
    nodes = int(get_dotted(config, "trainer.num_nodes", 1) or 1)
    per_step = batch * block * accumulate * count * nodes
    return max(1, math.ceil(float(tokens) / per_step))


def data_parallel_width(config: dict[str, Any]) -> int:
    """How many processes train one trial side by side, ``trainer.devices`` x
    ``trainer.num_nodes``, with the devices as Lightning reads them (``"2"`` and ``[0, 1]``
    are 2; ``auto`` and ``-1`` every device of the accelerator on this host). It scales
    the global batch, and so a ``tokens`` budget's steps and the ladders' release steps."""
    count = devices_used(
        get_dotted(config, "trainer.devices", "auto"),
        get_dotted(config, "trainer.accelerator", "auto"),
    )
    nodes = get_dotted(config, "trainer.num_nodes", 1)
    nodes = int(nodes) if isinstance(nodes, int | str) and str(nodes).strip().isdigit() else 1
    return max(1, count) * max(1, nodes)


def needs_config(sweep: Sweep) -> bool:
    """Whether :func:`budget_settings` needs the trial's config: a tokens budget (its batch
    geometry) or ``val_every`` (its gradient accumulation)."""
    tokens = sweep.budget.tokens is not None and sweep.budget.steps is None
    return tokens or sweep.budget.val_every is not None


def budget_settings(sweep: Sweep, config: dict[str, Any] | None) -> list[tuple[str, Any]]:
    """``trainer.max_steps`` (and ``val_check_interval``) of the sweep's budget, for the
    trial's ``config`` when :func:`needs_config`."""
    out: list[tuple[str, Any]] = []
    if config is None and needs_config(sweep):
        raise ValueError("a tokens budget or val_every needs the config")
    if sweep.budget.steps is not None:
        out.append(("trainer.max_steps", int(sweep.budget.steps)))
    elif sweep.budget.tokens is not None:
        out.append(("trainer.max_steps", steps_for_tokens(config, sweep.budget.tokens)))
    if sweep.budget.val_every is not None:
        # Lightning counts val_check_interval in batches: N optimizer steps are N x the
        # accumulation's batches.
        accumulate = (
            1 if config is None else get_dotted(config, "trainer.accumulate_grad_batches", 1)
        )
        interval = int(sweep.budget.val_every) * int(accumulate or 1)
        out.append(("trainer.val_check_interval", interval))
    return out


def _check_first_rung(pruner: dict[str, Any], last: Any, last_said: str, fix: str) -> None:
    """SweepError when a Hyperband ``pruner``'s ``min_resource`` is above ``last``, the
    last step a trial reports (``last_said``: how to name it): it would never prune."""
    low = pruner.get("min_resource", 1)
    numbers = all(isinstance(v, int) and not isinstance(v, bool) for v in (low, last))
    if pruner.get("name") == "hyperband" and numbers and low > last:
        raise SweepError(
            f"pruner.min_resource: {low} is above {last_said}, so Hyperband would never "
            f"prune; {fix}"
        )


def budget_steps(sweep: Sweep, config: dict[str, Any]) -> int | None:
    """The optimizer steps a trial of ``config`` trains: the budget's, else the config's
    ``trainer.max_steps``; None for an epoch-limited fit (its steps are the data's)."""
    settings = dict(budget_settings(sweep, config))
    steps = settings.get("trainer.max_steps", get_dotted(config, "trainer.max_steps", -1))
    return steps if isinstance(steps, int) and steps >= 1 else None


def check_budget(sweep: Sweep, config: dict[str, Any]) -> None:
    """SweepError when the budget, in steps for a trial's ``config``, leaves the pruner
    nothing to do: a tokens budget below Hyperband's ``min_resource`` (the steps budget
    is checked when the sweep is read), or ``val_every`` past the last step (the pruner
    would see the final validation alone)."""
    steps = budget_steps(sweep, config)
    if steps is None:
        return
    made = ""
    if sweep.budget.steps is None and sweep.budget.tokens is not None:
        made = f" (what budget.tokens {float(sweep.budget.tokens):g} makes)"
    _check_first_rung(
        sweep.pruner,
        steps,
        f"the budget's {steps} steps{made}",
        "lower min_resource or raise the budget",
    )
    if sweep.budget.val_every is not None and sweep.budget.val_every > steps:
        raise SweepError(
            f"budget.val_every: {sweep.budget.val_every} is above the budget's {steps} "
            f"steps{made}: a trial would validate once, at its end, and the pruner see "
            "nothing before; lower val_every"
        )
    # The trainer's interval alike, where every trial trains these steps (a searched
    # max_steps or batch may train others longer: pruner_idle_in_budget says it then).
    once = _validates_once(sweep, config, steps, made)
    if once is not None and not any(sweep.param(key) for key in STEP_KEYS):
        raise SweepError(once)


def check_validates(sweep: Sweep, config: dict[str, Any]) -> None:
    """SweepError when a trial's ``config`` never validates (``trainer.limit_val_batches:
    0``) while the objective is a validation metric: every trial would fail at its end,
    its metric never logged, after training in full."""
    if not sweep.objective.metric.startswith("val/") or sweep.param("trainer.limit_val_batches"):
        return  # searched: a value without validation fails its trial alone
    limit = get_dotted(config, "trainer.limit_val_batches", None)
    if isinstance(limit, (int, float)) and not isinstance(limit, bool) and limit == 0:
        raise SweepError(
            f"trainer.limit_val_batches: {limit:g} turns validation off, but objective.metric "
            f"{sweep.objective.metric} is logged by validation: every trial would end with "
            "no value; remove limit_val_batches or raise it above 0, or rank by train/loss"
        )


def deepest_depth(sweep: Sweep, config: dict[str, Any]) -> int | None:
    """The deepest ladder depth the sweep's trials train: the highest value of a searched
    ``model.config.depth``, else the depth of ``config``'s model; None if unknown."""
    from cofrgenet.sweeps.fitconfig import drawn_ends, model_setting

    param = sweep.param("model.config.depth")
    if param is None:
        return model_setting(config, "depth")
    if param.kind == "categorical":
        values = [c for c in param.choices if isinstance(c, int) and not isinstance(c, bool)]
    elif sweep.is_grid or param.grid:
        values = [int(v) for v in param.grid_values()]
    else:  # the range's ends: with a step, the last value on it
        values = [int(v) for v in drawn_ends(param)]
    return max(values, default=None)


def pruning_before_ladders(sweep: Sweep, config: dict[str, Any]) -> str | None:
    """A warning when the pruner judges trials before the dyadic schedule has released
    every ladder depth they train (with the paper's schedule the deepest comes last:
    depth d from t (1 - 2^-d)): a prune then compares models whose deepest ladders are
    still at their initial values, blind to the d axis. None when it does not."""
    from cofrgenet.training.callbacks import release_step

    steps = budget_steps(sweep, config)
    callbacks = get_dotted(config, "trainer.callbacks", None) or []
    dyadic = [
        c.get("init_args") or {}
        for c in callbacks
        if isinstance(c, dict) and str(c.get("class_path", "")).endswith("DyadicUnfreezing")
    ]
    name = sweep.pruner.get("name")
    first = {"hyperband": "min_resource", "sha": "min_resource"}.get(name, "n_warmup_steps")
    judged = sweep.pruner.get(first, 1 if first == "min_resource" else 0)
    if name == "none" or not isinstance(judged, int) or steps is None or not dyadic:
        return None  # no pruner, its first step its own to pick ("auto"), no steps or schedule
    schedule = dyadic[0].get("schedule", "paper")
    total = dyadic[0].get("total_steps")
    total = total if isinstance(total, int) and not isinstance(total, bool) else steps
    if schedule not in ("paper", "early"):  # none: every depth trains from step 0
        return None
    deepest = deepest_depth(sweep, config) or 1  # unknown: depth 1, there is one at least
    releases = {depth: release_step(depth, total, schedule) for depth in range(1, deepest + 1)}
    depth = max(releases, key=lambda d: (releases[d], d))  # the last released
    if judged >= releases[depth]:
        return None
    return (
        f"the {name} pruner judges trials from step {judged} ({first}), but with the "
        f"{schedule} dyadic schedule ladder depth {depth} (of the depths up to {deepest} "
        f"that the trials train) trains only from step {releases[depth]} of {steps}: "
        f"earlier prunes compare untrained ladders. Raise {first} past "
        f"{releases[depth]}, or search without the schedule (DyadicUnfreezing schedule: none)"
    )


def trial_config(
    sweep: Sweep, params: dict[str, Any], extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The full training config of one trial: what ``cofr fit`` makes of its words
    (:func:`cofrgenet.sweeps.fitconfig.trial_words`); SweepError when the worker would
    reject it."""
    from cofrgenet.sweeps.fitconfig import check_keys, checked_config, trial_words

    check_keys(sweep, extra)
    with tempfile.TemporaryDirectory() as folder:
        settings = Path(folder) / "sweep-settings.yaml"
        words = trial_words(sweep, params, extra, settings)
        try:
            return checked_config(words)[0]
        except SweepError as error:  # named by where it came from, not the temporary file
            message = str(error)
            for key, value in params.items():
                message = message.replace(
                    f"{key} (in {settings})", f"{key} (space.{key} drew {value!r})"
                )
            origin = "the sweep's overrides or --set"
            raise SweepError(message.replace(f"(in {settings})", f"({origin})")) from None


def check_same_objective(study: Any, sweep: Sweep, fix: str) -> None:
    """Refuse a sweep whose objective (metric, direction) is not the stored study's: its
    values would be ranked, labelled and mapped as another metric's. ``fix``: what to
    do instead, for the message."""
    direction = study.direction.name.lower()
    if direction != sweep.objective.direction:
        raise SweepError(
            f"study {sweep.study!r} exists with direction {direction}, the sweep says "
            f"{sweep.objective.direction}: {fix}"
        )
    stored = (study.user_attrs.get("cofr.sweep") or {}).get("objective") or {}
    metric = stored.get("metric", Objective().metric) if isinstance(stored, dict) else None
    if metric is not None and metric != sweep.objective.metric:
        raise SweepError(
            f"study {sweep.study!r} ranks trials by {metric}, the sweep says "
            f"{sweep.objective.metric}: its values would be ranked against the other's; {fix}"
        )
