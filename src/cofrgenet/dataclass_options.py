"""Command-line options generated from a config dataclass (benchmarks, GLUE fine-tuning).

Each field becomes ``--field-name`` with the field's default and the ``help`` of its
metadata; bools become ``--x / --no-x``, tuples comma-separated lists (``''``: an empty
one). Integers may be written ``65536``, ``2^16``, ``2**16`` or ``1<<16``; a fixed-size
tuple of them (an item of ``tuple[tuple[int, int], ...]``) is written ``8192x768``. The
dataclass stays the one description of the benchmark's settings: nothing is copied by
hand.

Field metadata read here, all optional:

* ``help``: the option's help (plain text: ``%`` needs no escaping);
* ``cli``: False leaves the field off the command line;
* ``metavar``: the placeholder in the help (default: the field name, or ``A,B,...``);
* ``choices``: the values a scalar field accepts;
* ``format``: a callable showing one default value in the help (e.g. ``2^20``);
* ``aliases``: other flags for the same option (an older name kept working).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


def parse_int(text: str) -> int:
    """An integer written as 65536, 2^16, 2**16 or 1<<16."""
    text = text.strip()
    if match := re.fullmatch(r"(\d+)\s*(?:\^|\*\*)\s*(\d+)", text):
        return int(match[1]) ** int(match[2])
    if match := re.fullmatch(r"(\d+)\s*<<\s*(\d+)", text):
        return int(match[1]) << int(match[2])
    return int(text)


def _number(kind: type, text: str) -> Any:
    """``text`` as a ``kind`` (int, written as :func:`parse_int` reads it, or float), else
    argparse's one-line ``expected ...`` error."""
    try:
        return parse_int(text) if kind is int else kind(text)
    except ValueError:
        expected = "an int" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None


def integer(text: str) -> int:
    """argparse ``type``: an int (also ``2^16`` or ``1<<16``), else the one line every
    option of ours says (``expected an int, got 'x'``; argparse's own: "invalid int
    value")."""
    return _number(int, text)


def at_least(kind: type, low: float, note: str = "") -> Callable[[str], Any]:
    """argparse ``type``: a ``kind`` (int, also written ``2^16`` or ``1<<16``, or float)
    >= ``low``, else one line at parse time (``argument --x: must be >= 1, got 0``; NaN
    refused too, and infinity: no option of ours means "none" by it). ``note`` follows
    the bound."""

    def parse(text: str) -> Any:
        value = _number(kind, text)
        if not value >= low:
            raise argparse.ArgumentTypeError(f"must be >= {low:g}{note}, got {text}")
        if not math.isfinite(value):  # --temperature inf sampled uniformly, unsaid
            raise argparse.ArgumentTypeError(
                f"must be a finite number >= {low:g}{note}, got {text}"
            )
        return value

    parse.__name__ = kind.__name__
    return parse


def probability(text: str) -> float:
    """argparse ``type``: a number in (0, 1], else one line at parse time."""
    value = _number(float, text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def device_problem(text: str) -> str | None:
    """Why torch cannot run on device ``text`` here (``foo``, ``cuda`` without CUDA,
    ``cuda:3`` on a one-GPU machine), or None when it can."""
    import torch

    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        return f"unknown device {text!r}; use cpu, cuda, cuda:N or auto"
    if device.type == "cpu":
        return None
    backends = (getattr(torch, device.type, None), getattr(torch.backends, device.type, None))
    available = next((b.is_available for b in backends if hasattr(b, "is_available")), None)
    if available is None or not available():
        return (
            f"device {text!r}: torch sees no {device.type} device on this machine; use cpu or auto"
        )
    count = getattr(backends[0], "device_count", None)
    if device.index is not None and count is not None and device.index >= count():
        return f"device {text!r}: this machine has {count()} {device.type} device(s)"
    return None


#: What a ``--device`` option's help says of the names it takes.
DEVICE_HELP = "cpu, cuda, cuda:N or auto: cuda where torch sees a CUDA GPU, else cpu"


def resolved_device(text: str) -> str:
    """The device ``--device text`` runs on: ``auto`` is ``cuda`` where torch sees a CUDA GPU,
    else ``cpu``; any other name as given."""
    if text != "auto":
        return text
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def device_arg(text: str) -> str:
    """argparse ``type`` of a ``--device`` option: ``auto`` resolved (:func:`resolved_device`),
    a device torch cannot use here refused at parse time, in one line (``cpu`` without
    importing torch: ``--help`` stays quick)."""
    if text == "cpu":
        return text
    text = resolved_device(text)
    problem = device_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


class GivenOnce(argparse.Action):
    """An option given at most once: argparse keeps the last of two, unsaid (``--ckpt a
    --ckpt b`` read b)."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
        option_string: str | None = None,
    ) -> None:  # fmt: skip
        before = getattr(namespace, self.dest, None)
        if before is not None and before != self.default and before != values:
            parser.error(f"{option_string} given twice ({before} and {values}): give one")
        setattr(namespace, self.dest, values)


def add_checkpoint_argument(
    parser: argparse.ArgumentParser, positional: bool = False
) -> argparse.Action:
    """``--ckpt PATH``, every command's name for the checkpoint it reads (``cofr fit``'s
    ``--ckpt_path`` takes ``--ckpt`` too). ``positional``: a first positional word is
    taken as well, as older versions of the command took it; :func:`checkpoint_given`
    reads the one given, and :func:`show_required` makes the synopsis say ``--ckpt PATH``
    is needed once the command's other options are added."""
    action = parser.add_argument(
        "--ckpt",
        metavar="PATH",
        action=GivenOnce,
        help="the checkpoint, e.g. runs/<experiment>/<run>/checkpoints/last.ckpt",
        required=not positional,
    )
    if positional:
        parser.add_argument("ckpt_word", nargs="?", help=argparse.SUPPRESS)
    return action


def show_required(parser: argparse.ArgumentParser, action: argparse.Action) -> None:
    """Make the synopsis of ``parser``, all of whose options are added, show ``action``
    as required (``--ckpt PATH``, not ``[--ckpt PATH]``): it is, though argparse cannot
    require it where an older positional form stands in for it."""
    action.required = True
    try:
        parser.usage = parser.format_usage().removeprefix("usage: ").rstrip().replace("%", "%%")
    finally:
        action.required = False


def checkpoint_given(args: argparse.Namespace, usage: str = "") -> str:
    """The checkpoint of :func:`add_checkpoint_argument`: ``--ckpt`` or the positional
    word, exactly one of them. ``usage``: the command's shape, said when neither is given
    (a command with another positional word read the only word given as that one)."""
    from cofrgenet.errors import UserError

    word, option = getattr(args, "ckpt_word", None), args.ckpt
    if word is not None and option is not None:
        if str(word).endswith(".ckpt") or Path(word).is_file():
            raise UserError(f"two checkpoints given ({word} and --ckpt {option}): give --ckpt only")
        # Not a checkpoint: a word too many (two output folders, a value without its flag).
        raise UserError(f"one word too many, {word!r}, beside --ckpt {option}")
    if word is None and option is None:
        raise UserError(
            "the following arguments are required: --ckpt (e.g. "
            f"runs/<experiment>/<run>/checkpoints/last.ckpt){usage and f'; usage: {usage}'}"
        )
    return option if option is not None else word


def _int(text: str) -> int:
    return parse_int(text)


# argparse names the type in its errors ("invalid int value: 'x'"), as for plain int.
_int.__name__ = "int"


def _scalar(kind: Any) -> Any:
    """The type of one value of type ``kind`` (Optional unwrapped)."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        return _scalar(args[0])
    return kind


def _is_list(kind: Any) -> bool:
    """``tuple[X, ...]``: a variable-length list, written comma-separated."""
    args = typing.get_args(kind)
    return typing.get_origin(kind) is tuple and len(args) == 2 and args[1] is Ellipsis


def _item_parser(kind: Any) -> Callable[[str], Any]:
    """The parser of one value: ints with powers, fixed tuples as ``AxB``, else ``kind``."""
    if kind is int:
        return _int
    if typing.get_origin(kind) is tuple and not _is_list(kind):
        parsers = [_item_parser(k) for k in typing.get_args(kind)]
        shape = "x".join("N" * len(parsers))

        def parse(text: str) -> tuple:
            words = text.strip().lower().split("x")
            try:
                if len(words) != len(parsers):
                    raise ValueError(text)
                return tuple(p(w) for p, w in zip(parsers, words, strict=True))
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"expected {shape} (e.g. 8192x768), got {text!r}"
                ) from None

        parse.__name__ = shape
        return parse
    return kind


def _comma_list(item: Any) -> Callable[[str], tuple]:
    parse_item = _item_parser(item)
    name = f"comma-separated {getattr(parse_item, '__name__', 'value')}s"

    forms = " (each as 65536, 2^16 or 1<<16)" if parse_item is _int else ""

    def parse(text: str) -> tuple:
        items = []
        for part in (part.strip() for part in text.split(",")):
            if not part:
                continue
            try:
                items.append(parse_item(part))  # AxB items say their own errors
            except ValueError:  # name the bad item, not Python's message about it
                raise argparse.ArgumentTypeError(
                    f"expected {name}{forms}: {part!r} is not one"
                ) from None
        return tuple(items)

    parse.__name__ = name
    return parse


def _show(value: Any, fmt: Callable[[Any], str] | None) -> str:
    """A default as it is written on the command line: ``2^16,2^20``, ``256x256,8x8``."""
    if isinstance(value, tuple):
        if not value:
            return "none"
        return ",".join(_show_item(v, fmt) for v in value)
    return _show_item(value, fmt)


def _show_item(value: Any, fmt: Callable[[Any], str] | None) -> str:
    if isinstance(value, tuple):  # a fixed-size item such as (rows, n)
        return "x".join(_show_item(v, fmt) for v in value)
    if value == "":
        return "''"
    if value is None:
        return "none"
    return fmt(value) if fmt is not None and value is not None else str(value)


class AddsArguments(Protocol):
    """An argparse parser or argument group: what takes ``add_argument``."""

    def add_argument(self, *flags: str, **options: Any) -> argparse.Action: ...


def add_dataclass_arguments(parser: AddsArguments, cls: type, *, given_only: bool = False) -> None:
    """One option per field of dataclass ``cls`` (with ``from __future__`` annotations).

    ``parser`` may be a parser or an argument group. With ``given_only``, options not on
    the command line are left out of the namespace (the help still shows the dataclass
    default), so :func:`dataclass_from_args` can lay the given ones over a preset.
    """
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init or f.metadata.get("cli") is False:
            continue
        flags = ("--" + f.name.replace("_", "-"), *f.metadata.get("aliases", ()))
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        shown = _show(default, f.metadata.get("format"))
        help_text = f.metadata.get("help", "")
        if "(default: " not in help_text:  # a help may say what an unset value means
            help_text = f"{help_text} (default: {shown})" if help_text else f"default: {shown}"
        options: dict[str, Any] = {
            "default": argparse.SUPPRESS if given_only else default,
            "help": help_text.replace("%", "%%"),  # argparse %-formats help strings
        }
        base = _scalar(hints[f.name])
        if base is bool:
            parser.add_argument(*flags, action=argparse.BooleanOptionalAction, **options)
            continue
        if _is_list(base):
            item = typing.get_args(base)[0]
            options["type"] = _comma_list(item)
            listed = "AxB" if typing.get_origin(item) is tuple else "A,B"
            options["metavar"] = f.metadata.get("metavar", f"{listed},...")
        else:
            options["type"] = f.metadata.get("type") or _item_parser(base)
            options["metavar"] = f.metadata.get("metavar", f.name.upper())
            if "choices" in f.metadata:
                options["choices"] = tuple(f.metadata["choices"])
                del options["metavar"]  # argparse then shows {a,b,c}
        parser.add_argument(*flags, dest=f.name, **options)


def dataclass_from_args(cls: type[T], args: argparse.Namespace, base: T | None = None) -> T:
    """An instance of ``cls`` from the options :func:`add_dataclass_arguments` added.

    With ``base``, the options in ``args`` replace its fields and the rest keep its
    values (with ``given_only``, those are the options given on the command line).
    """
    values = {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(cls)
        if f.init and hasattr(args, f.name)
    }
    if base is not None:
        return dataclasses.replace(base, **values)
    return cls(**values)
