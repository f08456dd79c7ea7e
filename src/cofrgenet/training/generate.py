"""Sampling from a trained checkpoint: ``cofr generate --ckpt ... --prompt ...``."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import TYPE_CHECKING, Any

from cofrgenet.dataclass_options import (
    DEVICE_HELP,
    add_checkpoint_argument,
    at_least,
    device_arg,
    integer,
    probability,
)
from cofrgenet.errors import UserError, check_seed
from cofrgenet.signals import Terminated, sigterm_raises

if TYPE_CHECKING:  # imported where used: `cofr generate --help` needs no torch
    import torch
    from torch import Tensor, nn

    from cofrgenet.data import Tokenizer
    from cofrgenet.nn.decoding import TokenSink

#: Sampled ids are drawn among the k likeliest unless --top-k says otherwise.
DEFAULT_TOP_K = 50


def crops_context(model: nn.Module) -> bool:
    """Whether :func:`sample` reads ``model`` through a window of the last tokens: a
    transformer (its cache) or a model without ``generate``; a recurrent model carries
    its state over the whole sequence."""
    return hasattr(model, "new_cache") or not hasattr(model, "generate")


def sample(
    model: nn.Module,
    idx: Tensor,
    max_new_tokens: int,
    block_size: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    top_p: float | None = None,
    vocab: int | None = None,
    stop_id: int | None = None,
    on_token: TokenSink | None = None,
) -> Tensor:
    """Extend token ids idx (B, T) by up to ``max_new_tokens`` sampled tokens -> (B, T + new).

    temperature 0 is greedy decoding; otherwise the ``top_k`` likeliest ids, then the
    smallest set of them holding ``top_p`` of the probability (nucleus sampling), among
    the first ``vocab`` ids (the tokenizer's: a padded vocabulary's extra ids are no
    token). Sampling ends early once every row has produced ``stop_id``. The context is
    cropped to the last ``block_size`` tokens (the length the model trained at, which
    may be shorter than its block). Models with their own ``generate`` are asked to do
    it themselves: transformers decode incrementally through their mixers' caches (and
    crop the same way), recurrent ones carry a hidden state over the whole sequence.
    Anything else recomputes the context for every token. ``on_token(ids)`` gets each
    step's ids (B, 1) as they are sampled.
    """
    import torch

    from cofrgenet.nn.decoding import sample_tokens
    from cofrgenet.nn.ladder import recording_paused

    with torch.no_grad():
        if hasattr(model, "generate"):  # which records no ladder range (generate_cached)
            window = {"context": block_size} if crops_context(model) else {}
            return model.generate(
                idx,
                max_new_tokens,
                temperature=temperature,
                top_k=top_k,
                generator=generator,
                top_p=top_p,
                vocab=vocab,
                stop_id=stop_id,
                on_token=on_token,
                **window,
            )
        with recording_paused(model):  # sampling records no ladder range
            return sample_tokens(
                lambda out, new: model(out[:, -block_size:])[:, -1, :],
                idx, max_new_tokens, temperature, top_k, generator, top_p, vocab, stop_id,
                on_token,
            )  # fmt: skip


class StreamedText:
    """Writes one sample's text to ``out`` as its ids come (:meth:`add`, from
    :func:`sample`'s ``on_token``), so that a long sample shows while it is drawn and
    what was drawn before a Ctrl-C stays written. Ids are held back while their text ends
    in a part of a character (a byte-level token may hold some of its UTF-8 bytes); the
    end-of-text id ends the text unless ``past_eos``. ``prompt`` is written before the
    first text: nothing is, if no id comes (an error, a Ctrl-C at once)."""

    #: Ids held back at most: a character's UTF-8 bytes (<= 4) span no more ids.
    HOLD = 8

    def __init__(self, tokenizer: Tokenizer, out: Any, past_eos: bool, prompt: str = "") -> None:
        self.tokenizer, self.out, self.past_eos = tokenizer, out, past_eos
        self.unwritten: str | None = prompt  # None once written
        self.held: list[int] = []
        self.ended = False  # at the end-of-text id

    def add(self, ids: Tensor) -> None:
        """Take the next id of the (only) row: ``ids`` (1, 1)."""
        token = int(ids[0, 0])
        if self.ended:
            return
        if token == self.tokenizer.eos_id and not self.past_eos:
            self.ended = True
            self.close()
            return
        self.held.append(token)
        if len(self.held) >= self.HOLD or not self.tokenizer.decode(self.held).endswith("\ufffd"):
            self._write()

    def close(self) -> None:
        """Write what is held back, and end the line if anything was written."""
        if self.held:
            self._write()
        if self.unwritten is None:
            self.out.write("\n")
            self.out.flush()
            self.unwritten = ""  # closed: a second close writes nothing

    def _write(self) -> None:
        self.out.write((self.unwritten or "") + self.tokenizer.decode(self.held))
        self.out.flush()
        self.unwritten, self.held = None, []


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_checkpoint_argument(parser)
    parser.add_argument(
        "--prompt",
        action="append",  # a second --prompt replaced the first, unsaid: refused in run()
        default=None,
        help="text to continue (default: none; sampling starts from the end-of-text token)",
    )
    parser.add_argument(
        "--tokenizer",
        "--data",  # its first name, kept for older scripts
        default=None,
        metavar="DIR",
        help=(
            "prepared data folder whose tokenizer to use (default: the run's own copy, "
            "<run>/tokenizer, else its training data's)"
        ),
    )
    parser.add_argument(
        "--max-new-tokens",
        type=at_least(int, 1),
        default=200,
        help="tokens to sample, >= 1 (default: %(default)s)",
    )
    parser.add_argument(
        "--temperature",
        type=at_least(float, 0),
        default=0.8,
        help=">= 0; 0: greedy (default: %(default)s)",
    )
    parser.add_argument(
        "--top-k",
        type=at_least(int, 0),
        default=None,  # None: not given (greedy decoding refuses it); 50 when sampling
        help=f"sample the k likeliest ids; 0: all (default: {DEFAULT_TOP_K})",
    )
    parser.add_argument(
        "--top-p",
        type=probability,
        default=None,
        help="then the smallest set of ids holding this much probability (nucleus); 1: all "
        "(default: 1.0)",
    )
    parser.add_argument(
        "--past-eos",
        action="store_true",
        help="sample on past the end-of-text token into new documents (default: stop there)",
    )
    parser.add_argument(
        "--num-samples",
        type=at_least(int, 1),
        default=1,
        help="samples of the prompt, drawn as one batch, >= 1 (default: %(default)s)",
    )
    parser.add_argument(
        "--seed", type=integer, default=1337, help="seed of the sampling (default: %(default)s)"
    )
    parser.add_argument(
        "--device",
        type=device_arg,
        default="auto",
        help=f"{DEVICE_HELP} (default: %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    import torch

    from cofrgenet.nn.decoding import NonFiniteLogits
    from cofrgenet.training.pretrained import load_checkpoint

    # Before the checkpoint is loaded: one seed range across cofr (numpy's; torch refused
    # a seed past 64 bits with a traceback).
    check_seed(args.seed, "--seed")
    prompts = args.prompt if isinstance(args.prompt, list) else [args.prompt or ""]
    if len(prompts) > 1:
        raise UserError(
            f"--prompt given {len(prompts)} times: give one prompt per command "
            "(--num-samples N draws N continuations of it)"
        )
    args.prompt = prompts[0]
    if args.temperature == 0:
        given = [
            flag for flag, v in (("--top-k", args.top_k), ("--top-p", args.top_p)) if v is not None
        ]
        if args.num_samples > 1:  # greedy decoding: the same continuation each time
            given.append(f"--num-samples {args.num_samples}")
        if given:  # the user meant to sample, or not: say so rather than guess
            raise UserError(
                f"--temperature 0 decodes greedily, so {' and '.join(given)} would not "
                f"apply: drop {'them' if len(given) > 1 else 'it'}, or give a temperature > 0 "
                "to sample"
            )
    try:  # argv's bytes that are no UTF-8 came as lone surrogates; no tokenizer takes them
        args.prompt.encode("utf-8")
    except UnicodeEncodeError as error:
        raise UserError(
            f"--prompt is not UTF-8 text (a byte that is none at character {error.start + 1}): "
            "give the prompt in UTF-8 (a terminal or file in another encoding: convert it, "
            "e.g. with iconv)"
        ) from None
    top_k = DEFAULT_TOP_K if args.top_k is None else args.top_k
    top_p = 1.0 if args.top_p is None else args.top_p
    loaded = load_checkpoint(args.ckpt, args.device, tokenizer_dir=args.tokenizer)
    tokenizer = loaded.tokenizer
    ids = tokenizer.encode(args.prompt) if args.prompt else [tokenizer.eos_id]
    idx = torch.tensor([ids] * args.num_samples, dtype=torch.long, device=args.device)
    generator = torch.Generator(device=args.device).manual_seed(args.seed)
    top_k = top_k or None  # 0: all
    context = loaded.context_length
    if (
        crops_context(loaded.model)
        and context < loaded.block_size
        and len(ids) + args.max_new_tokens > context
    ):
        print(
            f"note: reading at most the last {context} tokens, the length {args.ckpt} "
            f"trained at (its block is {loaded.block_size}; later positions never trained)",
            file=sys.stderr,
        )
    elif crops_context(loaded.model) and len(ids) > context:
        print(
            f"note: the prompt is {len(ids)} tokens; the model reads its last {context}",
            file=sys.stderr,
        )
    # One sample is written as it is drawn; several, each whole once all are (or a stop
    # came: what each had then).
    stream = None
    drawn: list[Tensor] = []  # several samples' ids, step by step
    if args.num_samples == 1:
        stream = StreamedText(tokenizer, sys.stdout, args.past_eos, prompt=args.prompt)
    # `auto` ladders compile on CPU past a size, a warm-up of seconds at the first long
    # window (5.5 s of a CAttnU model's 10.7 s run) that one generation never earns back.
    eager = contextlib.nullcontext()
    if idx.device.type == "cpu":
        from cofrgenet.nn.ladder import ladders_running

        eager = ladders_running(loaded.model, "continuant", only="auto")
    try:
        with sigterm_raises(), eager:
            out = sample(
                loaded.model,
                idx,
                args.max_new_tokens,
                context,
                temperature=args.temperature,
                top_k=top_k,
                generator=generator,
                top_p=top_p if top_p < 1 else None,
                vocab=tokenizer.vocab_size,
                stop_id=None if args.past_eos else tokenizer.eos_id,
                on_token=drawn.append if stream is None else stream.add,
            )
    except NonFiniteLogits as error:
        raise UserError(f"{args.ckpt}: {error}{_non_finite_weights(loaded.model)}") from None
    except (KeyboardInterrupt, Terminated) as stop:
        if stream is None and drawn:
            _write_samples(torch.cat([idx, *drawn], dim=1), len(ids), tokenizer, args)
            print(f"[stopped after {len(drawn)} tokens]", file=sys.stderr)
        if isinstance(stop, Terminated):
            print("cofr: terminated", file=sys.stderr)
        raise
    finally:
        if stream is not None:  # also what a Ctrl-C or SIGTERM interrupted
            stream.close()
    _write_samples(out, len(ids), tokenizer, args, streamed=stream is not None)
    return 0


def _write_samples(
    out: Tensor,
    prompt_len: int,
    tokenizer: Tokenizer,
    args: argparse.Namespace,
    streamed: bool = False,
) -> None:
    """Write each row of ``out`` (N, prompt_len + new) to stdout, the prompt first, each
    under a line of dashes; ``streamed``: the text is out already, only where a document
    ended is said (stderr)."""
    for row in out.tolist():
        new = row[prompt_len:]
        ended = not args.past_eos and tokenizer.eos_id in new  # the document ended there
        if ended:
            new = new[: new.index(tokenizer.eos_id)]
        if not streamed:
            shown = row[:prompt_len] if args.prompt else []  # not the EOS that starts a document
            print(tokenizer.decode(shown + new))
        if ended:  # fewer tokens than asked: say why, apart from the text
            print(f"[end of text after {len(new)} tokens; --past-eos samples on]", file=sys.stderr)
        if not streamed:
            print("-" * 40)


def _non_finite_weights(model: nn.Module) -> str:
    """What a NaN output's cause most likely is, said after it: weights that are NaN/Inf."""
    import torch

    bad = [name for name, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
    if not bad:
        return " (its weights are finite: the numbers overflowed on the way)"
    return (
        f": {len(bad)} of its weight tensors hold NaN or Inf ({bad[0]}, ...), as a run that "
        "diverged saves them; sample from an earlier checkpoint of the run"
    )
