"""ModelConfig: the plain, serialisable description of a decoder-only language model."""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from cofrgenet.errors import ConfigError, did_you_mean
from cofrgenet.models.registry import ARCHITECTURES
from cofrgenet.nn.cffn import LADDER_KINDS
from cofrgenet.nn.ladder import DENOMINATORS
from cofrgenet.nn.norms import NORMS
from cofrgenet.nn.positional import POSITIONS, ROPE_SCALING_KEYS
from cofrgenet.ops.api import GRAD_MODES, IMPLS

#: One line per field: ``cofr fit --help`` shows these for ``--model.config.<field>``
#: (fields marked (*) default to None, "the architecture's default").
FIELD_DOCS: dict[str, str] = {
    "arch": 'architecture: "gpt" (GPT-2), "llama" (Llama 3), "rnn", "lstm" or "gru"',
    "vocab_size": "vocabulary size (a padded one is fine: ids past the tokenizer's are unused)",
    "block_size": "maximum sequence length (the training length of recurrent models)",
    "n_layer": "number of blocks (recurrent layers)",
    "n_embd": "embedding width",
    "n_head": "query heads",
    "n_kv_head": "key/value heads for grouped-query attention; None: n_head",
    "attention": "(*) attention mixer of every layer (registered names)",
    "ffn": "(*) feed-forward mixer of every layer (registered names)",
    "attention_pattern": "per-layer attention mixers, cycled over the layers; overrides attention",
    "ffn_pattern": "per-layer ffn mixers, cycled over the layers; overrides ffn",
    "ffn_hidden": "hidden width of mlp (None: 4 n_embd) and swiglu (None: Llama's 8/3 rule)",
    "sparse_stride": "l of the sparse patterns; None: round(sqrt(block_size))",
    "sparse_summary": "c of the fixed sparse pattern; None: max(1, l // 8)",
    "position": '(*) "learned", "sinusoidal", "rope", "alibi" or "none"',
    "rope_theta": "RoPE base",
    "rope_scaling": "None, or Llama 3's scaling: {factor, low_freq_factor, high_freq_factor, original_max_len}",
    "norm": '(*) "layernorm" or "rmsnorm"',
    "norm_eps": "epsilon of the norms",
    "rnn_hidden": "hidden size of each recurrent layer; None: n_embd",
    "ladders": "L, ladders in an ensemble (Cffn, CAttnM)",
    "depth": "d, partial denominators per ladder (the linear term not counted)",
    "cffn_ladder": '"scalar" (the paper\'s p-variate ladders) or "elementwise"',
    "ladder_bias": "biases on the partial denominators; None: same as bias",
    "ladder_denominators": '"positive" (floor + softplus: no poles) or "paper" (w . x + b)',
    "ladder_floor": "lower bound of positive partial denominators (|f~| <= 1 / floor)",
    "ladder_out_std": "init std of the ladder layers' output projections; None: GPT-2's residual scaling",
    "ladder_clip": "clip ladder outputs in eval mode to the range seen in training",
    "ladder_eps": "clamp on the final continuant, |K_d| >= eps",
    "ladder_grad": '"paper" (Proposition 1) or "exact"',
    "ladder_impl": '"auto", "literal", "continuant", "compiled" or "triton"',
    "dropout": "dropout on embeddings, attention probabilities and mixer outputs",
    "bias": "(*) biases in Linear layers, norms and recurrent layers",
    "tie_embeddings": "(*) share the token embedding with the output head",
}


@dataclass
class ModelConfig:
    """Architecture, shape and mixer choice of a language model.

    Every field is a plain Python value so a config round-trips through
    ``to_dict()``/``from_dict()`` (and JSON/YAML). The architecture and the mixers are
    chosen by *name*; the names resolve through ``cofrgenet.models.ARCHITECTURES`` /
    ``ATTENTION`` / ``FFN`` when the model is built, so new ones need no change here.

    Architecture:
        arch: "gpt" (GPT-2 decoder), "llama" (Llama 3 decoder), "rnn", "lstm" or "gru".
        Fields marked (*) default to None, meaning "the architecture's default"; they are
        filled when the config is made (gpt: softmax, mlp, learned, layernorm, bias, tied;
        llama: softmax, swiglu, rope, rmsnorm, no bias, untied). Recurrent architectures
        leave the transformer-only ones None and refuse them set (as transformers refuse
        ``rnn_hidden``): a setting that would change nothing is an error.
    Shape:
        vocab_size, block_size (maximum sequence length; the training length of recurrent
        models), n_layer, n_embd, n_head (query heads), n_kv_head (key/value heads for
        grouped-query attention; None means n_head).
    Mixers (transformers):
        attention (*): attention mixer of every layer ("softmax", "sparse_strided",
            "sparse_fixed", "synthesizer_dense", "cattn_u", "cattn_m").
        ffn (*): feed-forward mixer of every layer ("mlp", "swiglu", "cffn").
        attention_pattern / ffn_pattern: optional per-layer names; when set they cycle
            over the layers (layer i uses ``pattern[i % len(pattern)]``) and override
            ``attention`` / ``ffn``.
        ffn_hidden: hidden width of "mlp" (None: 4 n_embd) and "swiglu" (None: 8/3 n_embd
            rounded up to a multiple of 256, Llama's rule).
        sparse_stride / sparse_summary: l and c of the sparse patterns; None means
            round(sqrt(block_size)) and max(1, l // 8).
    Positions and norms (transformers):
        position (*): "learned", "sinusoidal" (added to the token embeddings), "rope",
            "alibi" (inside q.k attention) or "none".
        rope_theta: RoPE base. rope_scaling: None, or Llama 3's frequency scaling as a dict
            with keys factor, low_freq_factor, high_freq_factor, original_max_len.
        norm (*): "layernorm" or "rmsnorm". norm_eps: its epsilon.
    Recurrent models:
        rnn_hidden: hidden size of each recurrent layer; None means n_embd.
    CoFrGeNet ladders (used by the ladder mixers only):
        ladders: L, number of ladders in an ensemble (Cffn, CAttnM).
        depth: d, number of partial denominators per ladder (linear term not counted).
        cffn_ladder: "scalar" (paper reading, p-variate ladders) or "elementwise".
        ladder_bias: biases on the partial denominators; None means "same as ``bias``".
        ladder_denominators: "positive" (default: a_k = ladder_floor + softplus(w . x + b),
            no poles) or "paper" (a_k = w . x + b, the paper's exact formulation).
        ladder_floor: lower bound of positive partial denominators (|f~| <= 1 / floor).
        ladder_out_std: init std of the ladder layers' output projections (Cffn's U and V,
            CAttnM's W^v, CAttnU's second mixing); None: GPT-2's residual scaling,
            0.02 / sqrt(2 n_layer).
        ladder_clip: clip ladder outputs in eval mode to the range seen in training.
        ladder_eps: clamp on the final continuant, |K_d| >= eps (inactive for positive
            denominators whenever eps < min(1, ladder_floor)).
        ladder_grad: "paper" (Proposition 1) or "exact".
        ladder_impl: "auto", "literal", "continuant", "compiled" or "triton".
    Other:
        dropout: dropout on embeddings, attention probabilities and mixer outputs (between
            layers and before the head for recurrent models).
        bias (*): biases in Linear layers, LayerNorms and recurrent layers.
        tie_embeddings (*): share the token embedding with the output head (recurrent
            models: only when rnn_hidden == n_embd; otherwise the head is separate).
    """

    arch: str = "gpt"
    vocab_size: int = 50257
    block_size: int = 1024
    n_layer: int = 12
    n_embd: int = 768
    n_head: int = 12
    n_kv_head: int | None = None
    attention: str | None = None
    ffn: str | None = None
    attention_pattern: list[str] | None = None
    ffn_pattern: list[str] | None = None
    ffn_hidden: int | None = None
    sparse_stride: int | None = None
    sparse_summary: int | None = None
    position: str | None = None
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    norm: str | None = None
    norm_eps: float = 1e-5
    rnn_hidden: int | None = None
    ladders: int = 3
    depth: int = 5
    cffn_ladder: str = "scalar"
    ladder_bias: bool | None = None
    ladder_denominators: str = "positive"
    ladder_floor: float = 0.5
    ladder_out_std: float | None = None
    ladder_clip: bool = True
    ladder_eps: float = 0.01
    ladder_grad: str = "paper"
    ladder_impl: str = "auto"
    dropout: float = 0.0
    bias: bool | None = None
    tie_embeddings: bool | None = None

    def __post_init__(self) -> None:
        self._store_patterns_as_lists()
        self._check_types()
        # Fields left at None take the architecture's defaults.
        arch = ARCHITECTURES.entry(self.arch)
        for name, value in arch.defaults.items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        self._check_sizes()
        self._check_choices()
        self._check_numbers()
        if self.rope_scaling is not None:
            self.rope_scaling = _check_rope_scaling(self.rope_scaling)
        if arch.validate is not None:
            arch.validate(self)

    def _store_patterns_as_lists(self) -> None:
        """Patterns read from YAML/JSON may arrive as tuples: store lists (plain types)."""
        for name in ("attention_pattern", "ffn_pattern"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{name} must be a list of mixer names, got {value!r}")
            if len(value) == 0:
                raise ConfigError(f"{name} must not be empty (use None for 'no pattern')")
            setattr(self, name, list(value))

    def _check_types(self) -> None:
        """Each field of its annotated kind: a JSON or command-line string such as "false"
        for a bool was kept, and read as true (biases, clipping on)."""
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            kinds = _FIELD_KINDS.get(str(field.type).replace(" ", ""))
            if kinds is not None and not any(_is_kind(value, kind) for kind in kinds):
                names = " or ".join(_KIND_NAMES[kind] for kind in kinds)
                raise ConfigError(f"{field.name} must be {names}, got {value!r}")

    def _check_sizes(self) -> None:
        """Whole numbers >= 1 (None allowed where the field has a meaning for it)."""
        optional = ("n_kv_head", "ffn_hidden", "sparse_stride", "sparse_summary", "rnn_hidden")
        for name in ("vocab_size", "block_size", "n_layer", "n_embd", "n_head", "ladders", "depth"):
            if not _is_positive_int(getattr(self, name)):
                raise ConfigError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        for name in optional:
            value = getattr(self, name)
            if value is not None and not _is_positive_int(value):
                raise ConfigError(f"{name} must be a positive integer or None, got {value!r}")
        if self.n_kv_head is not None and self.n_head % self.n_kv_head:
            raise ConfigError(
                f"n_head ({self.n_head}) must be a multiple of n_kv_head ({self.n_kv_head})"
            )

    def _check_choices(self) -> None:
        """Names from fixed sets, with a did-you-mean (position and norm may be None)."""
        for name, choices in (
            ("cffn_ladder", LADDER_KINDS),
            ("ladder_grad", GRAD_MODES),
            ("ladder_impl", IMPLS),
            ("ladder_denominators", DENOMINATORS),
            ("position", POSITIONS),
            ("norm", NORMS),
        ):
            value = getattr(self, name)
            if value not in choices and not (value is None and name in ("position", "norm")):
                raise ConfigError(
                    f"{name} must be one of {choices}, got {value!r}"
                    + did_you_mean(str(value), choices)
                )

    def _check_numbers(self) -> None:
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout!r}")
        # Checked here, not at the first forward (eps, floor) or by a NaN loss (norm_eps).
        for name in ("ladder_floor", "ladder_eps"):
            value = getattr(self, name)
            if not (_is_finite_number(value) and value > 0):
                raise ConfigError(f"{name} must be a finite positive number, got {value!r}")
        if not (_is_finite_number(self.norm_eps) and self.norm_eps >= 0):
            raise ConfigError(f"norm_eps must be a finite number >= 0, got {self.norm_eps!r}")
        if self.ladder_out_std is not None and not (
            _is_finite_number(self.ladder_out_std) and self.ladder_out_std > 0
        ):
            raise ConfigError(
                f"ladder_out_std must be a finite positive number or None, got "
                f"{self.ladder_out_std!r}"
            )
        if not self.rope_theta > 0:
            raise ConfigError(f"rope_theta must be positive, got {self.rope_theta!r}")

    # Per-layer choice -------------------------------------------------------------

    @property
    def kv_heads(self) -> int:
        """Key/value heads: ``n_kv_head`` with None resolved to ``n_head``."""
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    def attention_for(self, layer_idx: int) -> str:
        """Attention mixer name of layer ``layer_idx``."""
        if self.attention_pattern:
            return self.attention_pattern[layer_idx % len(self.attention_pattern)]
        return self.attention

    def attention_names(self) -> set[str]:
        """The attention mixers of all layers (empty for a recurrent model)."""
        if self.attention is None:
            return set()
        return {self.attention_for(i) for i in range(self.n_layer)}

    def ffn_for(self, layer_idx: int) -> str:
        """Feed-forward mixer name of layer ``layer_idx``."""
        if self.ffn_pattern:
            return self.ffn_pattern[layer_idx % len(self.ffn_pattern)]
        return self.ffn

    # Serialisation ----------------------------------------------------------------

    @classmethod
    def field_names(cls) -> list[str]:
        """The names a config dict may hold."""
        return [f.name for f in dataclasses.fields(cls)]

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of every field (lists and dicts copied), suitable for JSON/YAML."""
        return {
            name: copy.deepcopy(value) if isinstance(value, list | dict) else value
            for name, value in ((n, getattr(self, n)) for n in self.field_names())
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Inverse of :meth:`to_dict`; an unknown key raises ValueError naming it."""
        _check_keys(data, "ModelConfig.from_dict")
        return cls(**data)

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with ``changes`` applied (unknown names raise ValueError)."""
        _check_keys(changes, "ModelConfig.replace")
        return dataclasses.replace(self, **changes)

    # Presets ----------------------------------------------------------------------

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> ModelConfig:
        """The named preset (see :func:`cofrgenet.models.list_presets`) with ``overrides``.

        Example: ``ModelConfig.from_preset("gpt2-small-f", depth=3, dropout=0.1)``.
        """
        from cofrgenet.models.presets import preset_dict

        _check_keys(overrides, f"ModelConfig.from_preset({name!r})")
        return cls.from_dict({**preset_dict(name), **overrides})


def resolve_model_config(preset: str | None, config: dict[str, Any] | None) -> ModelConfig:
    """A preset with overrides, or a full config dict when ``preset`` is None (how a run's
    ``model.preset`` and ``model.config`` become one ModelConfig)."""
    overrides = dict(config or {})
    if preset is None:
        return ModelConfig.from_dict(overrides)
    return ModelConfig.from_preset(preset, **overrides)


#: The kinds a field's annotation admits (the annotations are strings here); fields of
#: other annotations (the patterns, rope_scaling) have checks of their own.
_FIELD_KINDS = {
    "bool": ("bool",),
    "bool|None": ("bool", "None"),
    "int": ("int",),
    "int|None": ("int", "None"),
    "float": ("number",),
    "float|None": ("number", "None"),
    "str": ("str",),
    "str|None": ("str", "None"),
}
_KIND_NAMES = {
    "bool": "true or false",
    "int": "an integer",
    "number": "a number",
    "str": "a name",
    "None": "null",
}


def _is_kind(value: Any, kind: str) -> bool:
    if kind == "None":
        return value is None
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, str)


def _is_finite_number(value: Any) -> bool:
    return _is_kind(value, "number") and math.isfinite(value)


def _is_positive_int(value: Any) -> bool:
    return _is_kind(value, "int") and value >= 1


#: ModelConfig fields only a transformer reads: set on a recurrent model they change
#: nothing (an LSTM asked for ``attention: cattn_m`` trained as a plain LSTM, unsaid).
TRANSFORMER_ONLY = (
    "attention",
    "ffn",
    "attention_pattern",
    "ffn_pattern",
    "ffn_hidden",
    "n_kv_head",
    "sparse_stride",
    "sparse_summary",
    "norm",
    "rope_scaling",
)
#: Fields only a recurrent model reads.
RECURRENT_ONLY = ("rnn_hidden",)


def unused_settings(data: dict[str, Any]) -> list[str]:
    """The fields set in config dict ``data`` that its architecture never reads (refused
    in a new config; a checkpoint recorded before they were refused drops them: they
    changed nothing of its network)."""
    try:
        kind = ARCHITECTURES.entry(data.get("arch") or "gpt").kind
    except ValueError:  # an unknown arch: its own error comes when the config is made
        return []
    unread = TRANSFORMER_ONLY if kind == "recurrent" else RECURRENT_ONLY
    return [name for name in unread if data.get(name) is not None]


#: Hugging Face's names in a Llama 3 config.json's rope_scaling -> ours.
HF_ROPE_SCALING_KEYS = {"original_max_position_embeddings": "original_max_len"}


def _check_rope_scaling(scaling: Any) -> dict[str, Any]:
    if not isinstance(scaling, dict) or set(scaling) != set(ROPE_SCALING_KEYS):
        given = set(scaling) if isinstance(scaling, dict) else set()
        # A Llama 3 config.json's block copied in: its names, and the rope_type we imply.
        names = [f"{ours} for {theirs}" for theirs, ours in HF_ROPE_SCALING_KEYS.items()
                 if theirs in given]  # fmt: skip
        kind = next((scaling[k] for k in ("rope_type", "type") if k in given), None)
        if kind == "llama3":
            names.append("no rope_type (Llama 3's is the one scaling there is)")
        hint = f" (Hugging Face's names: write {'; '.join(names)})" if names else ""
        if kind == "default":  # Hugging Face's "no scaling"
            hint += "; Hugging Face's rope_type default is rope_scaling: null here"
        elif kind not in (None, "llama3"):
            hint += f"; {kind!r} scaling is not supported, only Llama 3's"
        raise ConfigError(
            f"rope_scaling must be None or a dict with exactly the keys {ROPE_SCALING_KEYS}, "
            f"got {scaling!r}{hint}"
        )
    out: dict[str, Any] = {key: float(scaling[key]) for key in ROPE_SCALING_KEYS}
    out["original_max_len"] = int(scaling["original_max_len"])
    if out["factor"] < 1 or not 0 < out["low_freq_factor"] < out["high_freq_factor"]:
        raise ConfigError(f"rope_scaling needs factor >= 1 and 0 < low < high factors, got {out}")
    if out["original_max_len"] < 1:
        raise ConfigError(f"rope_scaling original_max_len must be >= 1, got {out}")
    return out


def _check_keys(data: dict[str, Any], where: str) -> None:
    valid = ModelConfig.field_names()
    unknown = [key for key in data if key not in valid]
    if unknown:
        hints = "".join(did_you_mean(key, valid) for key in unknown)
        raise ConfigError(
            f"{where}: unknown config key(s) {unknown}{hints}; valid keys are: {', '.join(valid)}"
        )


_missing_docs = set(ModelConfig.field_names()) ^ set(FIELD_DOCS)
assert not _missing_docs, f"FIELD_DOCS and ModelConfig fields differ: {_missing_docs}"
