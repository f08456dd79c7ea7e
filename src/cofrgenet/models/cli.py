"""``cofr models list``: the presets with their parameter counts."""

from __future__ import annotations

import argparse

from rich.table import Table

from cofrgenet import terminal
from cofrgenet.dataclass_options import at_least
from cofrgenet.errors import UserError, did_you_mean


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--filter", default="", help="only presets whose name contains this (any case)"
    )
    # The embeddings (and learned position tables) count at these sizes: a run on other
    # data has other counts (the demo's byte configs: --vocab-size 320 --block-size 128).
    parser.add_argument(
        "--vocab-size",
        type=at_least(int, 1),
        metavar="N",
        help="count every preset at this vocabulary size (default: each preset's own)",
    )
    parser.add_argument(
        "--block-size",
        type=at_least(int, 1),
        metavar="N",
        help="count every preset at this maximum sequence length (default: each preset's own)",
    )


def run(args: argparse.Namespace) -> int:
    from cofrgenet.models import ModelConfig, count_parameters, list_presets

    presets = list_presets()
    wanted = args.filter.lower()  # preset names are lower case
    names = [name for name in presets if wanted in name]
    if not names:
        # A filter is a part of names: its fix may be a family or a size ("gtp2": gpt2).
        parts = {part for name in presets for part in name.split("-")}
        hint = did_you_mean(wanted, [*presets, *sorted(parts)])
        raise UserError(
            f"no preset matches --filter {args.filter!r}{hint}; `cofr models list` lists them all"
        )
    sizes = {"vocab_size": args.vocab_size, "block_size": args.block_size}
    sizes = {key: value for key, value in sizes.items() if value is not None}
    rows = []
    for name in names:
        try:
            config = ModelConfig.from_preset(name, **sizes)
        except ValueError as error:  # a size the preset's layers cannot take
            raise UserError(f"preset {name}: {error}; give other sizes, or --filter") from None
        counts = count_parameters(config)
        rows.append(
            (
                name,
                config.arch,
                config.attention or "-",
                config.ffn or "-",
                config.position,
                str(config.n_layer),
                str(config.n_embd),
                f"{config.vocab_size:,}",
                f"{config.block_size:,}",
                f"{counts.total:,}",
                f"{counts.ladder:,}",
            )
        )
    # The embeddings count at the preset's vocabulary: a run on other data (the demo's
    # 320 byte ids) has fewer parameters.
    at = ", ".join(f"{k.replace('_size', '')} {v:,}" for k, v in sizes.items())
    title = f"model presets (counted on the meta device, at {at or 'their vocab and block'})"
    table = Table(title=title)
    columns = (
        "preset", "arch", "attention", "ffn", "position", "layers", "width", "vocab", "block",
    )  # fmt: skip
    for index, column in enumerate((*columns, "parameters", "ladder")):
        # Names and counts are never cut, even in a narrow terminal.
        whole = column in ("preset", "parameters")
        table.add_column(
            column,
            justify="left" if index < 5 else "right",
            no_wrap=whole,
            min_width=max(len(row[index]) for row in rows) if whole else None,
        )
    for row in rows:
        table.add_row(*row)
    terminal.console(fit=table).print(table)  # whole rows, however wide
    return 0
