"""Sampling from a trained checkpoint: ``cofr generate --ckpt ... --prompt ...``."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from cofrgenet.dataclass_options import add_checkpoint_argument, at_least, device_arg, probability
from cofrgenet.errors import UserError, check_seed

if TYPE_CHECKING:  # imported where used: `cofr generate --help` needs no torch
    import torch
    from torch import Tensor, nn

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
    Anything else recomputes the context for every token.
    """
    import torch

    from cofrgenet.nn.decoding import sample_tokens

    with torch.no_grad():
        if hasattr(model, "generate"):
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
                **window,
            )
        return sample_tokens(
            lambda out, new: model(out[:, -block_size:])[:, -1, :],
            idx, max_new_tokens, temperature, top_k, generator, top_p, vocab, stop_id,
        )  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_checkpoint_argument(parser)
    parser.add_argument(
        "--prompt",
        default="",
        help="text to continue (default: none; sampling starts from the end-of-text token)",
    )
    parser.add_argument(
        "--tokenizer",
        "--data",  # its first name, kept for older scripts
        default=None,
        metavar="DIR",
        help="prepared data folder whose tokenizer to use (default: the run's training data)",
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
        "--seed", type=int, default=1337, help="seed of the sampling (default: %(default)s)"
    )
    parser.add_argument(
        "--device",
        type=device_arg,
        default="cpu",
        help="cpu, cuda or cuda:N (default: %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    import torch

    from cofrgenet.training.pretrained import load_checkpoint

    # Before the checkpoint is loaded: torch refuses a seed past 64 bits with a traceback.
    check_seed(args.seed, "--seed")
    if args.temperature == 0:
        given = [
            flag for flag, v in (("--top-k", args.top_k), ("--top-p", args.top_p)) if v is not None
        ]
        if given:  # the user meant to sample, or not: say so rather than guess
            raise UserError(
                f"--temperature 0 decodes greedily, so {' and '.join(given)} would not "
                "apply: drop them, or give a temperature > 0 to sample"
            )
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
    )
    for row in out.tolist():
        new = row[len(ids) :]
        ended = not args.past_eos and tokenizer.eos_id in new  # the document ended there
        if ended:
            new = new[: new.index(tokenizer.eos_id)]
        shown = row[: len(ids)] if args.prompt else []  # not the EOS that starts a document
        print(tokenizer.decode(shown + new))
        if ended:  # fewer tokens than asked: say why
            print(f"[end of text after {len(new)} tokens; --past-eos samples on]")
        print("-" * 40)
    return 0
