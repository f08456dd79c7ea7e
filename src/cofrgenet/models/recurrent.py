"""Recurrent language models: Elman RNN, LSTM and GRU (the "rnn", "lstm", "gru" archs).

Token embedding -> dropout -> an n-layer torch ``nn.RNN`` / ``nn.LSTM`` / ``nn.GRU``
(cuDNN kernels on GPUs; dropout between layers) -> dropout -> linear head, as in the
word-level models of Zaremba et al. (2014) and Merity et al. (2018). The head is tied to
the embedding when ``tie_embeddings`` and the sizes allow (rnn_hidden == n_embd).

The forward contract is the transformers': ids (B, T) -> logits (B, T, vocab_size), each
sequence starting from a zero state, so the same Lightning module trains every model
(``block_size`` is then the training length; nothing here is tied to it). ``generate``
carries the hidden state from token to token instead of re-reading the context.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from cofrgenet.errors import ConfigError
from cofrgenet.models.config import ModelConfig, unused_settings
from cofrgenet.models.registry import ARCHITECTURES
from cofrgenet.nn.decoding import TokenSink, sample_tokens

#: torch module and gates per hidden unit (the FLOPs of one step scale with the gates).
CELLS: dict[str, tuple[type[nn.RNNBase], int]] = {
    "rnn": (nn.RNN, 1),
    "lstm": (nn.LSTM, 4),
    "gru": (nn.GRU, 3),
}

#: Hidden state of the recurrent stack: h (n_layer, B, H), or (h, c) for an LSTM.
State = Tensor | tuple[Tensor, Tensor]


class RecurrentLM(nn.Module):
    """Recurrent language model over ``config.arch`` in ("rnn", "lstm", "gru").

    Parameter names: ``wte`` (embedding), ``rnn`` (the torch recurrent stack, names
    ``weight_ih_l{k}`` etc.) and ``lm_head``.
    """

    #: Per-layer components of ``count_parameters(...).per_layer``.
    LAYER_COMPONENTS = ("recurrent",)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.arch not in CELLS:
            raise ValueError(f"RecurrentLM needs arch in {tuple(CELLS)}, got {config.arch!r}")
        self.config = config
        cell, _ = CELLS[config.arch]
        C, H = config.n_embd, config.rnn_hidden or config.n_embd
        self.hidden_size = H
        # Inputs are wte * sqrt(C): unit-variance features for the recurrent stack (torch's
        # U(-1/sqrt(H), 1/sqrt(H)) init assumes them) while the table itself, which a tied
        # head shares, stays at std 1/sqrt(C) so the first logits are near uniform.
        self.embedding_scale = math.sqrt(C)
        self.wte = nn.Embedding(config.vocab_size, C)
        self.drop = nn.Dropout(config.dropout)
        self.rnn = cell(
            C,
            H,
            num_layers=config.n_layer,
            bias=config.bias,
            batch_first=True,
            dropout=config.dropout if config.n_layer > 1 else 0.0,  # between layers only
        )
        self.lm_head = nn.Linear(H, config.vocab_size, bias=False)
        self.tied = bool(config.tie_embeddings) and H == C
        if self.tied:
            self.wte.weight = self.lm_head.weight
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Embedding ~ N(0, 1/C), an untied head ~ N(0, 1/H) (logits of order 1 either way);
        the recurrent stack keeps torch's U(-1/sqrt(H), 1/sqrt(H)).

        With small embeddings fed unscaled (U(-0.1, 0.1), as in Zaremba et al.) a 64-unit
        LSTM barely leaves the unigram loss in 60 Adam steps; scaled as here it memorises
        the batch (tests/test_baselines.py).
        """
        if self.lm_head.weight.is_meta:  # shapes only: nothing to initialise
            return
        nn.init.normal_(self.wte.weight, std=1 / math.sqrt(self.config.n_embd))
        if not self.tied:
            nn.init.normal_(self.lm_head.weight, std=1 / math.sqrt(self.hidden_size))
        self.rnn.reset_parameters()

    def step(self, idx: Tensor, state: State | None = None) -> tuple[Tensor, State]:
        """idx (B, T) continuing from ``state`` (None: zeros) -> logits (B, T, V), new state."""
        if idx.dim() != 2:
            raise ValueError(f"idx must have shape (B, T), got {tuple(idx.shape)}")
        x = self.drop(self.wte(idx) * self.embedding_scale)  # (B, T, C)
        out, state = self.rnn(x, state)  # (B, T, H)
        return self.lm_head(self.drop(out)), state

    def forward(self, idx: Tensor) -> Tensor:
        """idx: (B, T) int64 token ids -> logits (B, T, vocab_size), from a zero state."""
        return self.step(idx)[0]

    @torch.no_grad()
    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        top_p: float | None = None,
        vocab: int | None = None,
        stop_id: int | None = None,
        on_token: TokenSink | None = None,
    ) -> Tensor:
        """Extend idx (B, T) by up to ``max_new_tokens`` sampled tokens -> (B, T + new).

        Reads the prompt once, then feeds one token per step with the hidden state carried
        over (O(1) per token). temperature 0 is greedy; ``top_k`` keeps the k likeliest,
        ``top_p`` then the smallest set holding that much probability (nucleus), among
        the first ``vocab`` ids. Ends early once every row has produced ``stop_id``.
        ``on_token(ids)`` gets each step's ids (B, 1).
        """
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if max_new_tokens <= 0:
            return idx
        state: State | None = None

        def logits_after(out: Tensor, new: Tensor) -> Tensor:
            nonlocal state
            logits, state = self.step(new, state)
            return logits[:, -1, :]

        return sample_tokens(
            logits_after, idx, max_new_tokens, temperature, top_k, generator, top_p, vocab,
            stop_id, on_token,
        )  # fmt: skip

    @staticmethod
    def parameter_component(name: str) -> tuple[str, int | None]:
        """(component, layer index or None) of parameter ``name``, for ``count_parameters``."""
        parts = name.split(".")
        if parts[0] == "wte":
            return "embedding", None
        if parts[0] == "lm_head":
            return "head", None
        if parts[0] == "rnn":
            # weight_ih_l0, bias_hh_l1, ... : the layer is the number after "_l".
            return "recurrent", int(parts[1].rsplit("_l", 1)[1])
        return "other", None


def recurrent_flops(config: ModelConfig, seq_len: int) -> dict[str, int]:
    """Forward FLOPs per token: g gates x (input + recurrent) matmuls per layer, and the head.

    g = 1 (RNN), 3 (GRU), 4 (LSTM); layer 0 reads n_embd inputs, the others rnn_hidden.
    Nonlinearities and gate products are not counted. Independent of seq_len.
    """
    _, gates = CELLS[config.arch]
    C, H = config.n_embd, config.rnn_hidden or config.n_embd
    recurrent = sum(2 * gates * H * ((C if k == 0 else H) + H) for k in range(config.n_layer))
    return {"recurrent": recurrent, "lm_head": 2 * H * config.vocab_size}


def _validate_recurrent(config: ModelConfig) -> None:
    ignored = [f"{name}={getattr(config, name)!r}" for name in unused_settings(config.to_dict())]
    if ignored:
        raise ConfigError(
            f"arch {config.arch!r} has no attention, feed-forward mixers or norms: "
            f"{', '.join(ignored)} would change nothing (leave it out, or pick a "
            f"transformer arch: gpt, llama)"
        )
    if config.position not in (None, "none"):
        raise ConfigError(
            f"arch {config.arch!r} reads tokens in order and takes no position encoding; "
            f"got position={config.position!r} (use 'none')"
        )


for _arch in CELLS:
    ARCHITECTURES.register(
        _arch,
        flops=recurrent_flops,
        kind="recurrent",
        defaults={"position": "none", "bias": True, "tie_embeddings": True},
        validate=_validate_recurrent,
    )(RecurrentLM)
