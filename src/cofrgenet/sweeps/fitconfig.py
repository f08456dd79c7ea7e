"""A trial's ``cofr fit`` words, and the config ``cofr fit`` makes of them (no training).

A trial trains with ``cofr fit --config BASE ... --config SETTINGS [--KEY=VALUE ...]``:

* ``--config`` for each base file of the sweep; LightningCLI's parser (jsonargparse)
  merges them as for ``cofr fit``: later files win, options merge one by one, a whole
  value (a list, a dict-valued option) from a later file replaces the earlier one, and
  a file's ``base:`` files come before it (:mod:`cofrgenet.recipes`).
* ``sweep-settings.yaml``: the dotted settings (overrides, ``--set``, sampled params,
  budget, ``run.*``) that name options of the parser, as one more config file. A file,
  not ``--KEY=VALUE`` words: the parser reads a word by the option's type, and for
  ``trainer.devices`` (``list[int] | str | int``) it keeps ``2`` as the string ``"2"``;
  from a file the value keeps its YAML type, as the sweep file wrote it. A mapping to a
  group of options (``model: {preset: x}``) is spread option by option first, as the
  parser merges a config file's mappings (:func:`option_settings`).
* ``--KEY=VALUE`` for the settings *inside* an option's value (an entry of a dict-valued
  option, a subclass's ``init_args``): only the command line sets one entry and keeps the
  others. Unknown keys go there too, so the parser names them with a did-you-mean.

The sweep parses the same words before training: to check a sweep (``cofr sweep run``),
to size a ``tokens`` budget and to derive ``#SBATCH`` resources (``cofr sweep submit``).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import io
import itertools
import math
import re
import tempfile
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from cofrgenet.data import TokenDataModule
from cofrgenet.dotted import get_dotted, set_dotted
from cofrgenet.errors import ConfigError, did_you_mean
from cofrgenet.models.config import ModelConfig
from cofrgenet.models.presets import preset_dict
from cofrgenet.sweeps.spec import (
    Sweep,
    SweepError,
    budget_settings,
    config_settings,
    encode_value,
    needs_config,
)
from cofrgenet.training.cli import ParseOnlyCLI, given_args, resolve_fit_config
from cofrgenet.training.model_options import model_config_of
from cofrgenet.training.module import LanguageModel


def resolve(args: Sequence[str]) -> str:
    """The config ``cofr fit ARGS`` trains with, as the YAML its run saves (``config.yaml``).

    Raises SweepError with the parser's message when the words do not parse.
    """
    try:
        return resolve_fit_config(args)
    except ConfigError as error:
        raise SweepError(str(error)) from None


@functools.cache
def option_keys() -> frozenset[str]:
    """The dotted names of ``cofr fit``'s options (``trainer.devices``, ``model.preset``)."""
    with contextlib.redirect_stdout(io.StringIO()), given_args():
        cli = ParseOnlyCLI(args=["fit"])
    return frozenset(cli.config["fit"].keys())


def _is_under(key: str, prefix: str) -> bool:
    return key.startswith(prefix + ".")


def _known(key: str, options: frozenset[str]) -> bool:
    """An option, a key inside one (a dict's entry, ``init_args.*``) or a group of them."""
    return (
        key in options
        or any(_is_under(key, option) for option in options)
        or any(_is_under(option, key) for option in options)
    )


def _is_group(key: str, options: frozenset[str]) -> bool:
    """A key above options (``model``, ``model.config``), neither an option nor inside one."""
    return (
        key not in options
        and not any(_is_under(key, option) for option in options)
        and any(_is_under(option, key) for option in options)
    )


def _replaces(later: str, key: str) -> bool:
    """Whether a setting of ``later`` replaces one of ``key``: the same key, or one above."""
    return later == key or _is_under(key, later)


@functools.cache
def field_merged_options() -> frozenset[str]:
    """The options whose value is a dataclass (``model.optimizer``: OptimizerConfig |
    None): ``cofr fit`` merges a config file's mapping to one field by field into the
    earlier files' (``{weight_decay: 0.1}`` keeps an earlier ``lr``), as a group's."""
    sections = {"model": LanguageModel.__init__, "data": TokenDataModule.__init__}
    merged = set()
    for section, init in sections.items():
        for name, hint in typing.get_type_hints(init).items():
            kinds = typing.get_args(hint) if _is_union(hint) else (hint,)
            if any(dataclasses.is_dataclass(kind) for kind in kinds):
                merged.add(f"{section}.{name}")
    return frozenset(merged)


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _spread(
    key: str, value: Any, options: frozenset[str], merged: frozenset[str] | None = None
) -> list[tuple[str, Any]]:
    """``key: value`` as one setting per option it sets: a mapping to a group of options,
    or to an option in ``merged`` (default :func:`field_merged_options`), is spread."""
    merged = field_merged_options() if merged is None else merged
    if isinstance(value, dict) and (_is_group(key, options) or key in merged):
        return [s for k, v in value.items() for s in _spread(f"{key}.{k}", v, options, merged)]
    return [(key, value)]


def option_settings(settings: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``settings`` with each mapping given to a group of options (``model: {preset: x}``,
    ``model.config: {...}``) or to a dataclass option (``model.optimizer: {lr: 0.1}``)
    spread into one setting per option or field it names, so that it sets those and
    leaves the others given beside it: ``cofr fit`` merges a config file's mappings so.
    Another option's own value (a list, a dict-valued option's mapping) stays whole, as
    in ``cofr fit``."""
    options = option_keys()
    return [s for key, value in settings for s in _spread(key, value, options)]


#: A number YAML 1.1 reads as text (``1e-7``: no dot), as ``cofr fit`` reads it into a
#: float option.
_NUMBER_TEXT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _as_read(value: Any) -> Any:
    if isinstance(value, str) and _NUMBER_TEXT.fullmatch(value.strip()):
        return float(value)
    if isinstance(value, list):
        return [_as_read(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_read(v) for k, v in value.items()}
    return value


def effective_settings(settings: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """What ``settings`` set, one value per option or field: mappings spread as
    :func:`option_settings` spreads them, a later setting replacing the earlier ones at
    or below its key, and numbers that YAML reads as text (``1e-7``) as numbers. Two
    lists of settings that ``cofr fit`` reads alike give equal dicts."""
    leaves: dict[str, Any] = {}
    for key, value in option_settings(settings):
        for replaced in [k for k in leaves if _replaces(key, k)]:
            del leaves[replaced]
        leaves[key] = _as_read(value)
    return leaves


#: What :func:`option_settings` spreads, by the version of cofr that made a study: 0
#: spread nothing (a mapping to ``model`` replaced every ``model.*`` given before it), 1
#: spread mappings to groups of options but not to ``model.optimizer``, 2 spreads both.
MERGING_VERSION = 2


def kept_since_merging(settings: Sequence[tuple[str, Any]], version: int = 0) -> list[str]:
    """The settings that a cofr of merging ``version`` dropped and this one keeps: those
    given before a mapping above them (``model.config.vocab_size: 320``, then ``model:
    {preset: x}``; ``model.optimizer.lr``, then ``model.optimizer: {...}``), which that
    cofr let replace them whole."""
    options = option_keys()

    def then(key: str, value: Any) -> list[tuple[str, Any]]:
        if version == 0:
            return [(key, value)]
        return _spread(key, value, options, frozenset() if version == 1 else None)

    kept = []
    for i, (key, value) in enumerate(settings):
        later = settings[i + 1 :]
        later_now = [k for s in later for k, _ in _spread(*s, options)]
        later_then = [k for s in later for k, _ in then(*s)]
        for leaf, _ in _spread(key, value, options):
            dropped_then = any(_replaces(other, leaf) for other in later_then)
            if dropped_then and not any(_replaces(other, leaf) for other in later_now):
                kept.append(leaf)
    return kept


def check_keys(sweep: Sweep, extra: dict[str, Any] | None = None) -> None:
    """SweepError for a dotted key of ``--set``, the overrides or the space that is not a
    ``cofr fit`` key (inside a mapping to a group of options too). Checked here because
    the parser would read a ``--KEY=VALUE`` word with an abbreviated key
    (``data.batch_siz``) as the option it abbreviates."""
    options = option_keys()
    where = str(sweep.path) if sweep.path is not None else f"sweep {sweep.study}"
    sources = [
        ("--set", [key for key, _ in option_settings(list((extra or {}).items()))]),
        (f"{where}: overrides", [key for key, _ in option_settings(list(sweep.overrides.items()))]),
        (f"{where}: space", [p.key for p in sweep.space]),
    ]
    for source, keys in sources:
        for key in keys:
            if not _known(key, options):
                hint = did_you_mean(key, sorted(options))
                raise SweepError(
                    f"{source}: unknown key {key!r}{hint}; `cofr fit --help` lists the keys"
                )


def split_settings(
    settings: Sequence[tuple[str, Any]],
) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    """(the settings file's mapping, the settings left for ``--KEY=VALUE`` words).

    Mappings to groups of options are spread option by option (:func:`option_settings`);
    then a setting that a later one replaces (same key, or a key above it) is dropped, so
    the file can go before the words and later settings still win.
    """
    spread = option_settings(settings)
    kept = [
        (key, value)
        for i, (key, value) in enumerate(spread)
        if not any(_replaces(later, key) for later, _ in spread[i + 1 :])
    ]
    options = option_keys()
    layer: dict[str, Any] = {}
    words: list[tuple[str, Any]] = []
    for key, value in kept:
        inside = any(_is_under(key, option) for option in options)
        named = key in options or any(_is_under(option, key) for option in options)
        if named and not inside:
            set_dotted(layer, key, value, SweepError)
        else:
            words.append((key, value))
    return layer, words


def fit_words(
    base: Sequence[Path], settings: Sequence[tuple[str, Any]], settings_file: Path
) -> list[str]:
    """``cofr fit`` words for the base files and dotted settings (the settings file is
    written to ``settings_file`` when there is one)."""
    words: list[str] = []
    for path in base:
        words += ["--config", str(path)]
    layer, rest = split_settings(settings)
    if layer:
        settings_file.write_text(yaml.safe_dump(layer, sort_keys=False))
        words += ["--config", str(settings_file)]
    return words + [f"--{key}={encode_value(value)}" for key, value in rest]


def trial_words(
    sweep: Sweep,
    params: dict[str, Any],
    extra: dict[str, Any] | None,
    settings_file: Path,
    more: Sequence[tuple[str, Any]] = (),
) -> list[str]:
    """One trial's ``cofr fit`` words: base files, then overrides, ``extra``, sampled
    ``params``, the budget, ``more`` (``run.*``). A ``tokens`` budget or ``val_every``
    parses the words once without it, for the batch geometry and gradient accumulation."""
    settings = config_settings(sweep, params, extra)
    config = None
    if needs_config(sweep):
        config = resolve_config(fit_words(sweep.base, settings, settings_file))
    settings += [*budget_settings(sweep, config), *more]
    return fit_words(sweep.base, settings, settings_file)


def resolve_settings(base: Sequence[Path], settings: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """The config of ``cofr fit`` words for these base files and settings."""
    with tempfile.TemporaryDirectory() as folder:
        return resolve_config(fit_words(base, settings, Path(folder) / "sweep-settings.yaml"))


def resolve_config(args: Sequence[str]) -> dict[str, Any]:
    """:func:`resolve` as a nested dict."""
    return yaml.safe_load(resolve(args))


def checked_config(args: Sequence[str]) -> tuple[dict[str, Any], str]:
    """(config, its YAML) of ``cofr fit ARGS``; SweepError unless it parses, every
    ``model.config`` key is a ModelConfig field and ``model.preset`` is a preset (a plain
    dict and a plain string to the parser: a typo there would otherwise fail every trial)."""
    text = resolve(args)
    config = yaml.safe_load(text)
    preset = (config.get("model") or {}).get("preset")
    if preset is not None:
        try:
            preset_dict(str(preset))
        except ConfigError as error:
            raise SweepError(f"model.preset: {error}") from None
    model_config = (config.get("model") or {}).get("config") or {}
    valid = ModelConfig.field_names()
    unknown = [key for key in model_config if key not in valid]
    if unknown:
        hints = "".join(did_you_mean(key, valid) for key in unknown)
        raise SweepError(f"unknown model.config key(s) {unknown}{hints}")
    return config, text


#: At most this many points of the space are tried by :func:`check_model_values`.
MODEL_PROBES = 32


def _model_config(config: dict[str, Any]) -> ModelConfig:
    """The ModelConfig of ``config``'s ``model.preset`` and ``model.config``."""
    return model_config_of(config.get("model"), recorded=False)


def model_problem(config: dict[str, Any]) -> str | None:
    """Why ``config``'s ``model.preset`` and ``model.config`` make no ModelConfig, or None."""
    try:
        _model_config(config)
    except (ConfigError, TypeError, ValueError) as error:
        return str(error).splitlines()[0] if str(error) else type(error).__name__
    return None


def model_setting(config: dict[str, Any], name: str) -> Any:
    """The ModelConfig field ``name`` (``vocab_size``, ``depth``, ``block_size``) of
    ``config``'s model (its preset's unless ``model.config`` sets it); None when no model
    can be made of it (:func:`check_model_values` says why)."""
    try:
        return getattr(_model_config(config), name)
    except (ConfigError, TypeError, ValueError):
        return None


def drawn_ends(param: Any) -> list[Any]:
    """The choices of a categorical key; the lowest and highest values a range draws
    (with a step, the last one on it: ``int 2..5 step 2`` draws 2 and 4; ints as ints)."""
    if param.kind == "categorical":
        return list(param.choices)
    high = param.high
    if param.step:
        high = param.low + math.floor((param.high - param.low) / param.step) * param.step
    ends = [param.low, high] if param.kind == "float" else [int(param.low), int(high)]
    return list(dict.fromkeys(ends))


def _builds_without(probe: dict[str, Any], keys: list[Any]) -> bool:
    """Whether ``probe`` builds a model with the space's model ``keys`` left to the preset
    (``model.preset`` to the default one)."""
    config = copy.deepcopy(probe)
    for param in keys:
        if param.key == "model.preset":
            (config.get("model") or {}).pop("preset", None)
        else:
            set_dotted(config, param.key, None, SweepError)  # unset: the preset's value
    return model_problem(config) is None


def _at(
    probe: dict[str, Any], keys: list[Any], values: tuple[Any, ...], skip: int = -1
) -> dict[str, Any]:
    """``probe`` with the space's model ``keys`` set to ``values`` (but the ``skip``-th)."""
    config = copy.deepcopy(probe)
    for i, (param, value) in enumerate(zip(keys, values, strict=True)):
        if i != skip:
            set_dotted(config, param.key, value, SweepError)
    return config


#: How many values inward from a range's end that builds no model are tried, to name
#: the first one that does.
INWARD_PROBES = 64


def _first_that_builds(
    probe: dict[str, Any],
    keys: list[Any],
    index: int,
    end: Any,
    problems: dict[tuple[Any, ...], str | None],
) -> int | None:
    """The value nearest ``end`` (an int range's end) of the ``index``-th key inside its
    range that builds a model beside one of the other keys' values tried; None if none
    within :data:`INWARD_PROBES` steps, or for a float range."""
    param = keys[index]
    if not isinstance(end, int) or isinstance(end, bool):
        return None
    step = int(param.step or 1) * (1 if end == param.low else -1)
    others = [values for values in problems if values[index] == end]
    candidate = end + step
    for _ in range(INWARD_PROBES):
        if not param.low <= candidate <= param.high:
            return None
        for values in others:
            config = _at(probe, keys, values)
            set_dotted(config, param.key, candidate, SweepError)
            if model_problem(config) is None:
                return candidate
        candidate += step
    return None


def check_model_values(sweep: Sweep, probe: dict[str, Any]) -> None:
    """SweepError when no point of the space builds a model: a fixed ``model.config``
    value that is invalid whatever is sampled (``n_head: 5`` with a width of 64) would
    otherwise fail every trial; the parse already refused wrong types and choices.

    ``probe`` is one trial's resolved config. The space's model keys are set to each
    combination of their ends (``low``, ``high``) or choices, at most
    :data:`MODEL_PROBES` of them; one valid combination is enough, since a value that
    is only invalid beside some sampled ones fails just those trials. A value invalid
    beside every value of the other keys (all tried, all lists of choices) is refused.
    """
    keys = [p for p in sweep.space if p.key == "model.preset" or p.key.startswith("model.config.")]
    ends = [drawn_ends(p) for p in keys]
    problems: dict[tuple[Any, ...], str | None] = {}
    for values in itertools.islice(itertools.product(*ends), MODEL_PROBES):
        problems[values] = model_problem(_at(probe, keys, values))
    if all(problems.values()):
        first = next(iter(problems.values()))
        tried = f" (at each of the {len(problems)} points of the space tried)" if keys else ""
        fix = "fix the sweep's overrides or --set"
        if keys and _builds_without(probe, keys):  # the space's values are the trouble
            # Those at fault: some point builds with them left to the preset.
            blamed = [
                p
                for i, p in enumerate(keys)
                if any(
                    _builds_without(_at(probe, keys, values, skip=i), [p]) for values in problems
                )
            ]
            fix = "fix the values of " + ", ".join(f"space.{p.key}" for p in blamed or keys)
        raise SweepError(f"no trial could build its model{tried}: {first}; {fix}")
    # A choice or range end that builds no model beside every value of the other keys (a
    # wrong type, a depth of 0) would fail every trial that draws it. Judged only where
    # all those values were tried (the others are lists of choices, none left out), or
    # where the reason is the same at each end of the others' ranges: it does not depend
    # on them (`n_head 8` fails beside n_embd 60 and 70 for reasons naming each, and
    # builds beside 64).
    if len(problems) < math.prod(len(e) for e in ends):
        return
    for index, param in enumerate(keys):
        others_are_choices = all(p.kind == "categorical" for p in keys if p is not param)
        for value in ends[index]:
            tried = [why for values, why in problems.items() if values[index] == value]
            if tried and all(tried) and (others_are_choices or len(set(tried)) == 1):
                fix = "remove it from the space"
                if param.kind != "categorical":  # a range's end: the range is what to move
                    end = "low" if value == param.low else "high"
                    fix = f"move the range's {end} end ({param.low:g}..{param.high:g}) past it"
                    first = _first_that_builds(probe, keys, index, value, problems)
                    if first is not None:
                        fix += f" ({first} is the {'lowest' if end == 'low' else 'highest'} "
                        fix += "that builds)"
                raise SweepError(f"space.{param.key}: {value!r} builds no model: {tried[0]}; {fix}")


#: The optimizer's settings in a trial's config.
OPTIMIZER = "model.optimizer"


def optimizer_problem(config: dict[str, Any]) -> str | None:
    """Why ``config``'s ``model.optimizer`` makes no OptimizerConfig, or None."""
    import dataclasses

    from cofrgenet.training.optim import OptimizerConfig

    given = dict(get_dotted(config, OPTIMIZER) or {})
    for field in dataclasses.fields(OptimizerConfig):
        # YAML reads 6e-4 (no dot) as a string; cofr fit's parser makes it the float
        # the field is, and so does this check, or it refused a learning rate that trains.
        if field.type in (float, "float") and isinstance(given.get(field.name), str):
            with contextlib.suppress(ValueError):
                given[field.name] = float(given[field.name])
    try:
        OptimizerConfig(**given)
    except (ConfigError, TypeError, ValueError) as error:
        return str(error).splitlines()[0] if str(error) else type(error).__name__
    return None


def check_optimizer_values(sweep: Sweep, probe: dict[str, Any]) -> None:
    """SweepError when the trials' optimizer settings are ones ``cofr fit`` refuses
    (``model.optimizer.lr: -0.001``): every trial would fail on them, each using up the
    study's budget. The fixed settings first (the space's keys left to the optimizer's
    defaults), then each choice and range end of the space's optimizer keys: each
    setting is checked on its own, so an end refused is refused whatever else is drawn."""
    keys = [p for p in sweep.space if p.key.startswith(OPTIMIZER + ".")]
    fixed = copy.deepcopy(probe)
    for param in keys:
        (get_dotted(fixed, OPTIMIZER) or {}).pop(param.key[len(OPTIMIZER) + 1 :], None)
    if (why := optimizer_problem(fixed)) is not None:
        raise SweepError(f"no trial could train: {why}; fix the sweep's overrides or --set")
    for param in keys:
        for value in drawn_ends(param):
            config = copy.deepcopy(probe)
            set_dotted(config, param.key, value, SweepError)
            if (why := optimizer_problem(config)) is not None:
                fix = "remove it from the space" if param.kind == "categorical" else (
                    "keep the range within the values allowed"
                )  # fmt: skip
                raise SweepError(f"space.{param.key}: {value!r} trains no trial: {why}; {fix}")
