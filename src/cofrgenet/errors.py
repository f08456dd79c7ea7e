"""Errors in what the user gave: ``cofr`` shows their message alone, without a traceback.

A config key or value, a data folder, a checkpoint, a sweep file: when one of these is
wrong, the traceback says nothing the message does not, and it buries the message. Such
errors derive from :class:`UserError`; ``cofr`` prints ``cofr <command>: error: <message>``
and exits with ``exit_status`` (2). ``cofr --debug ...`` or ``COFR_DEBUG=1`` shows the
traceback. Running out of memory is one line too (with what to lower). Every other
exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import difflib
import re
from collections.abc import Iterable, Sequence
from typing import NoReturn, TypeVar

E = TypeVar("E", bound=BaseException)


class UserError(Exception):
    """Something the user gave is wrong; the message says what and how to fix it."""

    exit_status = 2


class ConfigError(UserError, ValueError):
    """A configuration key or value that is not valid."""


class ParserError(UserError):
    """An error argparse found; ``prog`` is the parser's (``cofr models`` for ``cofr
    models`` without its command), the words ``cofr`` puts before the message."""

    def __init__(self, message: str, prog: str) -> None:
        super().__init__(message)
        self.prog = prog


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse whose errors are :class:`ParserError`: the message and where help is, not
    the usage text (the command prints it as one line); a word not among a choice's
    (a command's, an option's) gets the closest one."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        raise ParserError(
            f"{_with_closest_choice(message)} (`{self.prog} --help` lists the options)", self.prog
        )


#: argparse's message for a word outside a choice list (a command's, an option's); its
#: choices are quoted up to Python 3.12.7, bare after.
_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<value>.*?)' \(choose from (?P<choices>.*)\)$")


def _with_closest_choice(message: str) -> str:
    """argparse's ``invalid choice`` message with the closest choice named, and its
    choices unquoted (`cofr comapre` listed every command, and no more); any other
    message as it is."""
    found = _INVALID_CHOICE.search(message)
    if found is None:
        return message
    names = [name.strip().strip("'") for name in found["choices"].split(",")]
    value = found["value"]
    return (
        f"{message[: found.start()]}invalid choice: {value!r}{did_you_mean(value, names)}; "
        f"choose from {', '.join(names)}"
    )


def did_you_mean(
    word: str, candidates: Iterable[str], prefix: str = "", cutoff: float = 0.6
) -> str:
    """`` (did you mean 'x'?)`` for the closest candidate, or ``""``. ``prefix``, which
    every candidate shares (``--`` of options), is left out of the comparison; ``cutoff``:
    difflib's least similarity (0.5 finds ``f1`` for ``f2``, two-character names)."""
    names = [c.removeprefix(prefix) for c in candidates]
    by_lower = {name.lower(): name for name in reversed(names)}  # "PTB" finds "ptb"
    typed = word.removeprefix(prefix).lower()
    # Two neighbours swapped first: difflib's ratio put "gpt2-mini-f" before
    # "gpt2-mini-fa" for "gpt2-mini-af".
    close = [n for n in by_lower if _swapped_neighbours(typed, n)][:1]
    close = close or difflib.get_close_matches(typed, list(by_lower), n=1, cutoff=cutoff)
    return f" (did you mean {prefix + by_lower[close[0]]!r}?)" if close else ""


def _swapped_neighbours(typed: str, name: str) -> bool:
    """Whether ``name`` is ``typed`` with two neighbouring characters swapped."""
    differ = [i for i, (a, b) in enumerate(zip(typed, name, strict=False)) if a != b]
    return (
        len(typed) == len(name)
        and len(differ) == 2
        and differ[1] == differ[0] + 1
        and typed[differ[0]] == name[differ[1]]
        and typed[differ[1]] == name[differ[0]]
    )


def unknown_name(kind: str, name: str, names: Sequence[str]) -> str:
    """The one message for a name not among ``names`` (a preset, a registered mixer):
    the closest name and every name."""
    return f"unknown {kind} {name!r}{did_you_mean(name, names)}; available: {', '.join(names)}"


def raised_from(error: BaseException, kind: type[E]) -> E | None:
    """The exception of type ``kind`` that ``error`` is, or was raised from or while
    handling (following ``__cause__`` and ``__context__``); None if there is none."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def first_line(error: BaseException) -> str:
    """The first non-blank line of ``error``'s message, stripped ("" for none): one
    line for an error message that names a dependency's exception."""
    return next((line.strip() for line in str(error).splitlines() if line.strip()), "")


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is a device or host running out of memory: CUDA's
    ``OutOfMemoryError``, the CPU allocator's "can't allocate memory", a MemoryError."""
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        return True
    text = str(error).lower()
    return "out of memory" in text or "can't allocate memory" in text


def not_valid_yaml(source: object, error: Exception) -> str:
    """``<source>, line L, column C: not valid YAML: <problem>`` for a YAML parse error
    (without its position when it has none)."""
    mark = getattr(error, "problem_mark", None)
    where = f"{source}, line {mark.line + 1}, column {mark.column + 1}" if mark else f"{source}"
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    return f"{where}: not valid YAML: {problem}"


#: Seeds numpy (hence litdata and Lightning's seed_everything) takes: [0, 2**32).
SEED_LIMIT = 2**32


def check_seed(seed: int, option: str) -> None:
    """Refuse a seed numpy would refuse deep inside a run, with a traceback."""
    if not 0 <= seed < SEED_LIMIT:
        raise ConfigError(f"{option} must be in [0, {SEED_LIMIT - 1}], got {seed}")
