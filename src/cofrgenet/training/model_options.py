"""``--model.config``: ModelConfig's fields as typed, documented command-line options.

A run names a preset and overrides some of its fields (``--model.preset gpt2-mini-f
--model.config.depth 3``). :data:`ModelOverrides` has every ModelConfig field, each
optional (unset: the preset's value), with the choices of the string fields as
``Literal`` types (mixer and architecture names as registered when this module is
imported), so ``cofr fit --help`` lists them with their docs and a typo or a bad
choice fails when the command line is parsed, before anything is built.

A field cannot be overridden *to* None here (None means "unset"); the fields where None
means something (``n_kv_head``, ``ffn_hidden``, ...) have an explicit equivalent.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import types
import typing
from typing import Any, Literal

from cofrgenet.models.config import FIELD_DOCS, ModelConfig
from cofrgenet.models.registry import ATTENTION, FFN, arch_names
from cofrgenet.nn.cffn import LADDER_KINDS
from cofrgenet.nn.ladder import DENOMINATORS
from cofrgenet.nn.norms import NORMS
from cofrgenet.nn.positional import POSITIONS
from cofrgenet.ops.api import GRAD_MODES, IMPLS


def _choices(names: list[str] | tuple[str, ...]) -> Any:
    return Literal[tuple(names)]


def _without_none(kind: Any) -> Any:
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        return functools.reduce(operator.or_, args)
    return kind


def _overrides_class() -> type:
    hints = typing.get_type_hints(ModelConfig)
    attention, ffn = _choices(ATTENTION.names()), _choices(FFN.names())
    typed: dict[str, Any] = {
        "arch": _choices(arch_names()),
        "attention": attention,
        "ffn": ffn,
        "attention_pattern": list[attention],
        "ffn_pattern": list[ffn],
        "position": _choices(POSITIONS),
        "norm": _choices(NORMS),
        "cffn_ladder": _choices(LADDER_KINDS),
        "ladder_denominators": _choices(DENOMINATORS),
        "ladder_grad": _choices(GRAD_MODES),
        "ladder_impl": _choices(IMPLS),
    }
    fields = [
        (name, typed.get(name, _without_none(hints[name])) | None, dataclasses.field(default=None))
        for name in ModelConfig.field_names()
    ]
    cls = dataclasses.make_dataclass("ModelOverrides", fields)
    cls.__module__ = __name__
    cls.__doc__ = (
        "Overrides of the preset's ModelConfig fields (unset: the preset's value).\n\nArgs:\n"
        + "".join(f"    {name}: {FIELD_DOCS[name]}\n" for name in ModelConfig.field_names())
    )
    return cls


ModelOverrides = _overrides_class()


def overrides_dict(config: Any) -> dict[str, Any]:
    """The fields set in ``config`` (a ModelOverrides, a plain dict or None) as a dict.

    None means unset in both (a checkpoint written through the CLI keeps every field of
    its ModelOverrides, the unset ones as None)."""
    if config is None:
        return {}
    if dataclasses.is_dataclass(config):
        config = dataclasses.asdict(config)
    return {k: v for k, v in dict(config).items() if v is not None}


def model_config_of(model: dict[str, Any] | None, recorded: bool = True) -> ModelConfig:
    """The ModelConfig a run's ``model:`` section (``preset`` and ``config``, as a saved
    ``config.yaml`` or a resolved sweep config holds it) describes, as ``cofr fit``
    builds it: a missing preset is the default one. ``recorded``: a section a run saved,
    whose settings its architecture never read (refused in new configs since, an
    ``lstm`` with ``attention``) are dropped; False: a new one, refused."""
    from cofrgenet.models.config import resolve_model_config, unused_settings
    from cofrgenet.models.presets import DEFAULT_PRESET, preset_dict

    model = model or {}
    preset = model.get("preset", DEFAULT_PRESET)
    overrides = overrides_dict(model.get("config"))
    if recorded:
        try:
            base = {} if preset is None else preset_dict(preset)
        except ValueError:  # an unknown preset: resolve_model_config names it
            base = {}
        overrides |= dict.fromkeys(unused_settings({**base, **overrides}))
    return resolve_model_config(preset, overrides)


#: Fields only a continued-fraction ladder reads (Cffn, CAttnU, CAttnM).
LADDER_ONLY = (
    "ladders", "depth", "cffn_ladder", "ladder_bias", "ladder_denominators", "ladder_floor",
    "ladder_out_std", "ladder_clip", "ladder_eps", "ladder_grad", "ladder_impl",
)  # fmt: skip


def settings_changing_nothing(model: dict[str, Any] | None) -> str | None:
    """What a ``model:`` section's ``config`` sets that its network never reads, as a
    warning (a depth sweep of a model without ladders looks like one): ladder settings
    of a model without a ladder mixer, ``ladder_floor`` beside ``paper`` denominators.
    A warning, not an error: runs recorded with them still resume. None: nothing."""
    from cofrgenet.errors import ConfigError

    given = overrides_dict((model or {}).get("config"))
    try:
        config = fit_model_config(model)
    except ConfigError:  # said where the model is built, as it was
        return None
    said = [_ladder_settings_changing_nothing(config, given)]
    said.append(_sparse_settings_changing_nothing(config, given))
    said.append(_heads_changing_nothing(config, given))
    return "; ".join(line for line in said if line) or None


def _ladder_settings_changing_nothing(config: ModelConfig, given: dict[str, Any]) -> str | None:
    """Ladder settings of a model without a ladder, ``ladder_floor`` beside denominators
    it does not bound."""
    from cofrgenet.models import count_parameters

    if count_parameters(config).ladder == 0:
        unread = [f"{name}={given[name]!r}" for name in LADDER_ONLY if name in given]
        if unread:
            mixers = (
                f"attention {config.attention!r}, ffn {config.ffn!r}"
                if config.attention is not None
                else f"arch {config.arch!r}"  # a recurrent model: no mixers
            )
            return (
                f"model.config: {', '.join(unread)} change{'s' if len(unread) == 1 else ''} "
                f"nothing: this model ({mixers}) has no continued-fraction ladder (ffn cffn, "
                "attention cattn_u or cattn_m have them); leave them out"
            )
    elif "ladder_floor" in given and config.ladder_denominators != "positive":
        return (
            f"model.config: ladder_floor={given['ladder_floor']!r} changes nothing: it bounds "
            f"'positive' denominators, and these are {config.ladder_denominators!r}"
        )
    return None


#: Fields only attention that splits the width into heads reads (softmax, sparse, ...).
HEADS_ONLY = ("n_head", "n_kv_head")


def reads_heads(config: ModelConfig) -> bool:
    """Whether a layer of ``config`` has attention that splits the width into heads
    (cattn_u and cattn_m read it whole; a recurrent model has none)."""
    return any(ATTENTION.entry(name).uses_heads for name in config.attention_names())


def _heads_changing_nothing(config: ModelConfig, given: dict[str, Any]) -> str | None:
    """n_head and n_kv_head where no layer's attention splits the width into heads: a
    head count that divides nothing is taken silently there, and refused beside softmax
    attention."""
    names = config.attention_names()
    if not names or reads_heads(config):  # a recurrent model's: unused_settings refuses them
        return None
    unread = [f"{k}={given[k]!r}" for k in HEADS_ONLY if k in given]
    if not unread:
        return None
    them = "them" if len(unread) > 1 else "it"
    return (
        f"model.config: {', '.join(unread)} change{'s' if len(unread) == 1 else ''} nothing: "
        f"this model's attention ({', '.join(sorted(names))}) reads the whole width, not "
        f"heads; leave {them} out"
    )


def _sparse_settings_changing_nothing(config: ModelConfig, given: dict[str, Any]) -> str | None:
    """sparse_stride and sparse_summary where no layer's attention reads them (the
    summary: only the fixed pattern's)."""
    names = config.attention_names()
    readers = {
        "sparse_stride": {"sparse_strided", "sparse_fixed"},
        "sparse_summary": {"sparse_fixed"},
    }
    unread = [f"{k}={given[k]!r}" for k, read in readers.items() if k in given and not names & read]
    if not unread:
        return None
    return (
        f"model.config: {', '.join(unread)} change{'s' if len(unread) == 1 else ''} nothing: "
        f"this model's attention ({', '.join(sorted(names)) or 'none'}) does not read "
        f"{'them' if len(unread) > 1 else 'it'} (sparse_stride: sparse_strided and "
        f"sparse_fixed; sparse_summary: sparse_fixed); leave {'them' if len(unread) > 1 else 'it'} out"
    )


#: The shape fields a ``model.preset: null`` config means to give (their defaults are
#: GPT-2 small's: a model far larger than a user leaving them out expects).
SHAPE_FIELDS = ("vocab_size", "block_size", "n_layer", "n_embd", "n_head")


def shape_defaults_taken(model: dict[str, Any] | None) -> str | None:
    """A warning for a ``model:`` section without a preset whose ``config`` leaves shape
    fields out: ModelConfig's defaults fill them (GPT-2 small's 12 x 768, block 1024),
    unsaid. None: a preset is named, or every shape field is given."""
    model = model or {}
    if "preset" not in model or model.get("preset") is not None:
        return None
    given = overrides_dict(model.get("config"))
    from cofrgenet.models.registry import ARCHITECTURES

    try:
        ARCHITECTURES.entry(given.get("arch") or "gpt")
        # A recurrent model, or one of cattn_u / cattn_m alone, reads no heads.
        headless = not reads_heads(model_config_of(model))
    except ValueError:  # an unknown arch or a bad field (a ConfigError): the build says so
        return None
    missing = [n for n in SHAPE_FIELDS if n not in given and not (headless and n == "n_head")]
    if not missing:
        return None
    defaults = ModelConfig()
    taken = ", ".join(f"{name}={getattr(defaults, name)}" for name in missing)
    return (
        f"model.preset null and model.config without {', '.join(missing)}: ModelConfig's "
        f"defaults are used ({taken}, GPT-2 small's); give them, or name a preset and "
        "change what differs"
    )


def fit_model_config(model: dict[str, Any] | None) -> ModelConfig:
    """:func:`model_config_of` for ``cofr fit``'s own options: an error of fields that do
    not fit together (``n_embd`` and ``n_head``) names ``model.config``, as an error of
    one field does; an unknown preset stays ``model.preset``'s."""
    from cofrgenet.errors import ConfigError
    from cofrgenet.models.presets import DEFAULT_PRESET, preset_dict

    preset = (model or {}).get("preset", DEFAULT_PRESET)
    if preset is not None:
        preset_dict(preset)
    try:
        return model_config_of(model, recorded=False)
    except ConfigError as error:
        raise ConfigError(f"model.config: {error}") from None
