"""Command-line options generated from a benchmark's config dataclass.

Each field becomes ``--field-name`` with the field's default and the ``help`` of its
metadata; bools become ``--x / --no-x``, tuples comma-separated lists. The dataclass
stays the one description of the benchmark's settings: nothing is copied by hand.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def _scalar(kind: Any) -> Any:
    """The parser for one value of type ``kind`` (Optional unwrapped)."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        return _scalar(args[0])
    return kind


def _comma_list(item: Any):
    def parse(text: str) -> tuple:
        return tuple(item(part.strip()) for part in text.split(",") if part.strip())

    parse.__name__ = f"comma-separated {getattr(item, '__name__', 'value')}s"
    return parse


def add_dataclass_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """One option per field of dataclass ``cls`` (with ``from __future__`` annotations)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init or f.metadata.get("cli") is False:
            continue
        kind = hints[f.name]
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        help_text = f.metadata.get("help", "")
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        help_text = f"{help_text} (default: {shown})" if help_text else f"default: {shown}"
        base = _scalar(kind)
        if base is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=default,
                                help=help_text)  # fmt: skip
        elif typing.get_origin(base) is tuple:
            item = typing.get_args(base)[0]
            parser.add_argument(flag, type=_comma_list(item), default=default, help=help_text,
                                metavar="A,B,...")  # fmt: skip
        else:
            parser.add_argument(flag, type=base, default=default, help=help_text,
                                metavar=f.name.upper())  # fmt: skip


def dataclass_from_args(cls: type[T], args: argparse.Namespace) -> T:
    """An instance of ``cls`` from the options :func:`add_dataclass_arguments` added."""
    values = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(cls)
        if f.init and hasattr(args, f.name)
    }
    return cls(**values)
