"""Named model presets: GPT-2 and Llama 3 shapes, their CoFrGeNet variants, and RNNs.

Transformer bases (tiny/mini ones for CPU tests; the tiny ones' vocabulary of 320 holds
the byte tokenizer's 257 ids, as the default ``cofr data prepare`` makes) each also give:

* ``B-f``:  CoFrGeNet-F, the feed-forward network (MLP or SwiGLU) replaced by Cffn;
* ``B-a``:  CoFrGeNet-A, attention replaced by CAttnM (the paper's default for -A);
* ``B-fa``: CoFrGeNet, both replaced.

Ladder defaults for every transformer preset: L = 3 ladders, depth d = 5, scalar Cffn
ladders, and ModelConfig's ladder defaults (positive, pole-free partial denominators,
GPT-2's residual init, eval clipping; docs/layers.md). Llama presets keep biases on the
partial denominators though Llama has no other biases: they set each ladder's offset
(and, with ``ladder_denominators="paper"``, keep the init off poles).

Llama's -a / -fa variants have position "none": RoPE acts on q.k, which CAttnM does not
compute; CAttnM sees key positions through its position map. CAttnM (and CAttnU, the
Dense Synthesizer) have parameters tied to block_size, so the Llama 3.2 presets use
block_size 2048 (the published models reach 131,072 with RoPE alone).

Recurrent presets ``{rnn,lstm,gru}-{tiny,mini}`` are the small CPU baselines.
"""

from __future__ import annotations

from typing import Any

from cofrgenet.errors import ConfigError, unknown_name

# Shared by every transformer preset; a preset's own entries take precedence.
_LADDERS: dict[str, Any] = {"ladders": 3, "depth": 5, "cffn_ladder": "scalar", "dropout": 0.0}

_GPT2_COMMON: dict[str, Any] = {**_LADDERS, "arch": "gpt", "bias": True, "tie_embeddings": True}
_GPT2 = {"vocab_size": 50257, "block_size": 1024}

_LLAMA_COMMON: dict[str, Any] = {
    **_LADDERS,
    "arch": "llama",
    "norm": "rmsnorm",
    "norm_eps": 1e-5,
    "position": "rope",
    "bias": False,
    "ladder_bias": True,
}
# Llama 3.2 1B / 3B: tied embeddings, 128k vocabulary, rope theta 500000 with the
# "llama3" frequency scaling (HF config.json of meta-llama/Llama-3.2-1B and -3B).
_LLAMA32 = {
    "vocab_size": 128256,
    "block_size": 2048,
    "tie_embeddings": True,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_len": 8192,
    },
}

#: Base shapes: name -> (fields, variant table).
GPT2_BASES: dict[str, dict[str, Any]] = {
    "gpt2-tiny": {"vocab_size": 320, "block_size": 128, "n_layer": 2, "n_embd": 64, "n_head": 4},
    "gpt2-mini": {"vocab_size": 512, "block_size": 256, "n_layer": 4, "n_embd": 128, "n_head": 4},
    "gpt2-small": {**_GPT2, "n_layer": 12, "n_embd": 768, "n_head": 12},
    "gpt2-medium": {**_GPT2, "n_layer": 24, "n_embd": 1024, "n_head": 16},
    "gpt2-large": {**_GPT2, "n_layer": 36, "n_embd": 1280, "n_head": 20},
    "gpt2-xl": {**_GPT2, "n_layer": 48, "n_embd": 1600, "n_head": 25},
}
LLAMA_BASES: dict[str, dict[str, Any]] = {
    "llama3-tiny": {
        "vocab_size": 320,
        "block_size": 128,
        "n_layer": 2,
        "n_embd": 64,
        "n_head": 4,
        "n_kv_head": 2,
        "ffn_hidden": 176,
        "tie_embeddings": True,
    },
    "llama3-mini": {
        "vocab_size": 512,
        "block_size": 256,
        "n_layer": 4,
        "n_embd": 128,
        "n_head": 4,
        "n_kv_head": 2,
        "ffn_hidden": 352,
        "tie_embeddings": True,
    },
    "llama3.2-1b": {
        **_LLAMA32,
        "n_layer": 16,
        "n_embd": 2048,
        "n_head": 32,
        "n_kv_head": 8,
        "ffn_hidden": 8192,
    },
    "llama3.2-3b": {
        **_LLAMA32,
        "n_layer": 28,
        "n_embd": 3072,
        "n_head": 24,
        "n_kv_head": 8,
        "ffn_hidden": 8192,
    },
}
RECURRENT_BASES: dict[str, dict[str, Any]] = {
    "tiny": {"vocab_size": 320, "block_size": 128, "n_layer": 2, "n_embd": 64},
    "mini": {"vocab_size": 512, "block_size": 256, "n_layer": 2, "n_embd": 128},
}

#: Variant suffix -> mixer choice.
VARIANTS: dict[str, dict[str, str]] = {
    "": {"attention": "softmax", "ffn": "mlp"},
    "-f": {"attention": "softmax", "ffn": "cffn"},
    "-a": {"attention": "cattn_m", "ffn": "mlp"},
    "-fa": {"attention": "cattn_m", "ffn": "cffn"},
}
LLAMA_VARIANTS: dict[str, dict[str, str]] = {
    "": {"attention": "softmax", "ffn": "swiglu"},
    "-f": {"attention": "softmax", "ffn": "cffn"},
    "-a": {"attention": "cattn_m", "ffn": "swiglu", "position": "none"},
    "-fa": {"attention": "cattn_m", "ffn": "cffn", "position": "none"},
}

#: The preset ``cofr fit`` trains when none is given (``model.preset``).
DEFAULT_PRESET = "gpt2-mini"

PRESETS: dict[str, dict[str, Any]] = {
    **{
        base + suffix: {**_GPT2_COMMON, **shape, **mixers}
        for base, shape in GPT2_BASES.items()
        for suffix, mixers in VARIANTS.items()
    },
    **{
        base + suffix: {**_LLAMA_COMMON, **shape, **mixers}
        for base, shape in LLAMA_BASES.items()
        for suffix, mixers in LLAMA_VARIANTS.items()
    },
    **{
        f"{arch}-{size}": {
            "arch": arch,
            "dropout": 0.0,
            "bias": True,
            "tie_embeddings": True,
            **shape,
        }
        for size, shape in RECURRENT_BASES.items()
        for arch in ("rnn", "lstm", "gru")
    },
}


def list_presets() -> list[str]:
    """Names accepted by ``ModelConfig.from_preset``: GPT-2, Llama, then recurrent ones."""
    return list(PRESETS)


def preset_dict(name: str) -> dict[str, Any]:
    """A copy of preset ``name``'s config fields; unknown names raise ValueError."""
    if name not in PRESETS:
        if str(name).lower() in ("none", "~"):  # `--model.preset None`: a string there
            raise ConfigError(
                f"unknown preset {name!r}: for no preset give null (`--model.preset null`), "
                "with the model's fields in model.config"
            )
        raise ConfigError(unknown_name("preset", str(name), list(PRESETS)))
    return {k: dict(v) if isinstance(v, dict) else v for k, v in PRESETS[name].items()}
