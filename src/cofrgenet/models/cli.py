"""``cofr models list``: the presets with their parameter counts."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--filter", default="", help="only presets whose name contains this")


def run(args: argparse.Namespace) -> int:
    from cofrgenet.models import ModelConfig, count_parameters, list_presets

    table = Table(title="model presets (counted on the meta device)")
    columns = ("preset", "arch", "attention", "ffn", "position", "layers", "width")
    for column in (*columns, "parameters", "ladder"):
        table.add_column(
            column,
            justify="right" if column in ("layers", "width", "parameters", "ladder") else "left",
        )
    for name in list_presets():
        if args.filter not in name:
            continue
        config = ModelConfig.from_preset(name)
        counts = count_parameters(config)
        table.add_row(
            name,
            config.arch,
            config.attention or "-",
            config.ffn or "-",
            config.position,
            str(config.n_layer),
            str(config.n_embd),
            f"{counts.total:,}",
            f"{counts.ladder:,}",
        )
    Console().print(table)
    return 0
