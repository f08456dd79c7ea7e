"""``cofr models list``: the presets with their parameter counts."""

from __future__ import annotations

import argparse
import difflib

from rich.table import Table

from cofrgenet import terminal
from cofrgenet.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--filter", default="", help="only presets whose name contains this (any case)"
    )


def run(args: argparse.Namespace) -> int:
    from cofrgenet.models import ModelConfig, count_parameters, list_presets

    presets = list_presets()
    wanted = args.filter.lower()  # preset names are lower case
    names = [name for name in presets if wanted in name]
    if not names:
        close = difflib.get_close_matches(wanted, presets, n=3, cutoff=0.0)
        raise UserError(
            f"no preset matches {args.filter!r}; closest: {', '.join(close)} "
            "(`cofr models list` lists them all)"
        )
    rows = []
    for name in names:
        config = ModelConfig.from_preset(name)
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
                f"{counts.total:,}",
                f"{counts.ladder:,}",
            )
        )
    # The embeddings count at the preset's vocabulary: a run on other data (the demo's
    # 320 byte ids) has fewer parameters.
    table = Table(title="model presets (counted on the meta device, at their vocab)")
    columns = ("preset", "arch", "attention", "ffn", "position", "layers", "width", "vocab")
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
