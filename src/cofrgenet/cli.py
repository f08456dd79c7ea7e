"""The ``cofr`` command line: ``cofr <group> <command> [options]``.

Commands live in a registry (:data:`COMMANDS`). Every command has one shape: a target
with ``add_arguments(parser)`` and ``run(args) -> int``, named ``"module"`` (the module
is the target) or ``"module:Class"`` (several commands in one module); it is imported
only when its command is on the command line, so ``cofr --help`` does not pay for
importing torch. A command with its own parser (LightningCLI's) is registered with
``passthrough=True``: its target's ``main(argv)`` gets every word after the command.
Adding a command is one registry entry, e.g. ``Command(("models", "list"), "list the
model presets", "cofrgenet.models.cli")``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import re
import shlex
import signal
import sys
import traceback
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from cofrgenet import package_version
from cofrgenet.environment import debug_requested
from cofrgenet.errors import (
    OneLineErrorParser,
    ParserError,
    UserError,
    did_you_mean,
    first_line,
    is_out_of_memory,
)


@dataclass(frozen=True)
class Command:
    """A leaf command: its words after ``cofr``, a one-line help and its target.

    target: ``"package.module"`` or ``"package.module:Class"``, an object with
    ``add_arguments(parser)`` and ``run(args) -> int``, or, with ``passthrough``,
    ``main(argv) -> int | None`` parsing its own arguments.
    """

    path: tuple[str, ...]
    help: str
    target: str
    passthrough: bool = False
    #: Pass the command's own words on too (LightningCLI wants its subcommand: fit, ...).
    keep_words: bool = False

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    def load(self) -> Any:
        """The target object (imports its module)."""
        module, _, name = self.target.partition(":")
        loaded = importlib.import_module(module)
        return getattr(loaded, name) if name else loaded


#: Help lines of command groups (the first word of multi-word commands).
GROUPS: dict[str, str] = {
    "bench": "benchmarks; ops, train and quality write their reports to runs/bench/ unless --out-dir says otherwise",
    "data": "corpora: tokenize and write them for streaming",
    "export": "write a checkpoint in another ecosystem's format",
    "finetune": "fine-tune a pretrained checkpoint on a downstream task",
    "models": "model presets: list them, count their parameters",
    "sweep": "Optuna sweeps: run workers, show trials, report, submit to SLURM",
}

_LIGHTNING = "cofrgenet.training.cli"

COMMANDS: tuple[Command, ...] = (
    Command(
        ("fit",),
        "train a model from YAML configs (LightningCLI)",
        _LIGHTNING,
        True,
        keep_words=True,
    ),
    Command(
        ("validate",),
        "evaluate a checkpoint on the data folder's held-out (val) split",
        _LIGHTNING,
        True,
        keep_words=True,
    ),
    Command(
        ("test",),
        "validate, logged as test/loss, test/ppl (the same val split; docs/training.md)",
        _LIGHTNING,
        True,
        keep_words=True,
    ),
    Command(
        ("eval",),
        "perplexity on WikiText / PTB / LAMBADA (and lm-eval-harness tasks) of a checkpoint",
        "cofrgenet.eval.cli",
    ),
    Command(
        ("compare",),
        "runs from MLflow beside the paper's rows, and their Pareto front",
        "cofrgenet.eval.compare",
    ),
    Command(
        ("finetune", "glue"),
        "fine-tune a checkpoint on a GLUE task (classification head, Lightning, MLflow)",
        "cofrgenet.eval.glue",
    ),
    Command(
        ("export", "hf"),
        "write a Hugging Face model folder (trust_remote_code) from a checkpoint",
        "cofrgenet.export.hf",
    ),
    Command(
        ("data", "prepare"),
        "tokenize a corpus into a streaming data folder",
        "cofrgenet.data.prepare",
    ),
    Command(
        ("generate",),
        "sample text from a checkpoint",
        "cofrgenet.training.generate",
    ),
    Command(("ui",), "open the MLflow UI on the project's run store", "cofrgenet.training.ui"),
    Command(
        ("demo",), "train CoFrGeNet-F and its GPT-2 baseline on CPU and compare", "cofrgenet.demo"
    ),
    Command(
        ("models", "list"), "list model presets with their parameter counts", "cofrgenet.models.cli"
    ),
    Command(
        ("sweep", "run"),
        "run a sweep worker: ask trials, train them, tell results",
        "cofrgenet.sweeps.cli:RunCommand",
    ),
    Command(
        ("sweep", "status"),
        "the trials of a study as a table",
        "cofrgenet.sweeps.cli:StatusCommand",
    ),
    Command(
        ("sweep", "report"),
        "plots and a markdown summary of a study (also to MLflow)",
        "cofrgenet.sweeps.cli:ReportCommand",
    ),
    Command(
        ("sweep", "submit"),
        "render slurm/sweep.sbatch for a sweep and submit K workers",
        "cofrgenet.sweeps.cli:SubmitCommand",
    ),
    Command(
        ("bench", "ops"),
        "time literal vs continuant continued-fraction ops (forward, forward+backward)",
        "cofrgenet.bench.ops",
    ),
    Command(
        ("bench", "train"),
        "training and generation speed, memory and MFU of each variant, eager and compiled",
        "cofrgenet.bench.train",
    ),
    Command(
        ("bench", "kernels"),
        "compile the Triton kernels for a GPU architecture without a GPU: registers, spills",
        "cofrgenet.bench.kernels",
    ),
    Command(
        ("bench", "quality"),
        "train CoFrGeNet variants and matched baselines over seeds; compare val loss",
        "cofrgenet.bench.quality",
    ),
)


def _epilog() -> str:
    width = max(len(" ".join(c.path)) for c in COMMANDS)
    lines = [f"  cofr {' '.join(c.path):<{width}}  {c.help}" for c in COMMANDS]
    return "commands:\n" + "\n".join(lines) + "\n\nRun `cofr <command> --help` for its options."


def _selected(argv: Sequence[str]) -> Command | None:
    """The command whose words start ``argv`` (top-level options are only -h/--version)."""
    for command in COMMANDS:
        if tuple(argv[: len(command.path)]) == command.path:
            return command
    return None


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The full parser; only the command selected by ``argv`` gets its options added."""
    return _build_parsers(argv)[0]


def _build_parsers(
    argv: Sequence[str],
) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser | None]:
    """(:func:`build_parser`'s parser, the parser of the command ``argv`` selects, None
    when it selects none)."""
    parser = OneLineErrorParser(
        prog="cofr",
        description="Continued-fraction language models (CoFrGeNet): tools.",
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"cofr {package_version()}")
    parser.add_argument(
        "--debug", action="store_true", help="show tracebacks of errors (also COFR_DEBUG=1)"
    )
    groups = {(): parser.add_subparsers(title="command groups", metavar="COMMAND")}
    selected = _selected(argv)
    selected_parser = None
    for command in COMMANDS:
        # Create the group parsers on the way down (cofr bench -> cofr bench ops).
        for depth in range(1, len(command.path)):
            prefix = command.path[:depth]
            if prefix not in groups:
                help_text = GROUPS.get(prefix[-1])
                group = groups[prefix[:-1]].add_parser(
                    prefix[-1], help=help_text, description=help_text
                )
                groups[prefix] = group.add_subparsers(
                    title="commands", metavar="COMMAND", required=True
                )
        leaf = groups[command.path[:-1]].add_parser(
            command.path[-1],
            help=command.help,
            description=command.help,
        )
        leaf.set_defaults(_command=command, _parser=leaf)
        if command is selected and not command.passthrough:
            command.load().add_arguments(leaf)
            selected_parser = leaf
    return parser, selected_parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``cofr``; returns the exit status.

    Errors in what the user gave (:class:`cofrgenet.errors.UserError`) print one line,
    ``cofr <command>: error: ...``, and return their status (2); ``--debug`` anywhere on the
    command line, or ``COFR_DEBUG=1``, shows their traceback above it (same status).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [word for word in argv if word != "--debug"]
    try:
        debug = debug_requested() or debug  # a bad COFR_DEBUG: one line
        with _own_warnings_in_one_line(debug):
            status = _run(argv)
            sys.stdout.flush()  # a reader gone raises here, not in the exit's own flush
            return status
    except KeyboardInterrupt:  # before a command's own handler (fit's) is in place
        print("cofr: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        if not _stdout_reader_gone():  # a worker's pipe, a socket: a failure to show
            raise
        # `cofr generate ... | head`: the reader has all it wanted.
        _stdout_to_devnull()  # else the exit's flush of stdout fails once more, loudly
        return 128 + 13  # as a process SIGPIPE ends (`yes | head`)
    except UserError as error:
        if debug:  # the traceback, and the status the error has without --debug
            traceback.print_exc()
        # A parser's error: its words (`cofr models` for `cofr models` alone).
        where = error.prog if isinstance(error, ParserError) else _command_words(argv)
        print(f"{where}: error: {error}", file=sys.stderr)
        return error.exit_status
    except Exception as error:
        if debug or not is_out_of_memory(error):
            raise
        words = _command_words(argv)
        lower = OUT_OF_MEMORY_FIX.get(words, OUT_OF_MEMORY_FIX["cofr"])
        print(
            f"{words}: error: out of memory ({first_line(error)[:300]}): {lower} (--debug "
            "shows where)",
            file=sys.stderr,
        )
        return 1


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll reports an error)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return False


def _stdout_to_devnull() -> None:
    """Point stdout's file descriptor at /dev/null (nothing more reaches a closed pipe)."""
    with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


#: What to lower when a command runs out of memory (by its words; "cofr": any other).
OUT_OF_MEMORY_FIX = {
    "cofr": "lower the batch size, the sequence length or the model's size",
    "cofr bench ops": "lower --sizes, --ladder-sizes, --ensemble-sizes or --cffn-sizes",
}


def _command_words(argv: list[str]) -> str:
    """``cofr data prepare``: the command ``argv`` names, for its error lines."""
    selected = _selected(argv)
    return " ".join(["cofr", *(selected.path if selected else ())])


#: cofrgenet's own source folder: warnings raised from it are ours, said in one line.
_PACKAGE = os.path.dirname(os.path.abspath(__file__))


@contextlib.contextmanager
def _own_warnings_in_one_line(debug: bool) -> Iterator[None]:
    """``warning: <message>`` for the warnings cofrgenet raises (Python's format adds our
    file, line and source line: noise to a user); others keep Python's format."""
    default = warnings.formatwarning

    def one_line(message: Any, category: Any, filename: str, lineno: int, line: Any = None) -> str:
        if debug or not os.path.abspath(filename).startswith(_PACKAGE + os.sep):
            return default(message, category, filename, lineno, line)
        return f"warning: {message}\n"

    warnings.formatwarning = one_line
    try:
        yield
    finally:
        warnings.formatwarning = default


def _run(argv: list[str]) -> int:
    selected = _selected(argv)
    if selected is not None and selected.passthrough:
        words = argv if selected.keep_words else argv[len(selected.path) :]
        if selected.module == _LIGHTNING:
            return _run_lightning(selected, words)
        return int(selected.load().main(words) or 0)
    parser, leaf = _build_parsers(argv)
    try:
        args, extra = parser.parse_known_args(argv)
    except ParserError:
        # argparse checks required options before it returns the words it did not know:
        # `--taks sst2` was "required: --task". The mistyped option is the error to show.
        unknown = _unknown_options(argv[len(selected.path) :], leaf) if selected and leaf else []
        if not unknown:
            raise
        assert selected is not None
        raise _unrecognized(unknown, argv, selected.path, leaf, parser) from None
    command: Command | None = getattr(args, "_command", None)
    if extra:  # argparse would name the root parser's help, not the command's
        raise _unrecognized(extra, argv, command.path if command else (), leaf, parser)
    if command is None:
        parser.print_help()
        return 2
    args.command_line = shlex.join(["cofr", *argv])
    return int(command.load().run(args))


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every option ``parser`` takes (``--ckpt``, ``-h``, aliases), as its help lists them
    (an option its help text names beside is taken as one too: a rarer did-you-mean)."""
    return sorted(set(re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", parser.format_help())))


def _takes_value(parser: argparse.ArgumentParser, option: str) -> bool:
    """Whether ``option`` (``--prompt``) is one of ``parser``'s that takes a value, as its
    usage shows it (``[--prompt PROMPT]``, not ``[--past-eos]``)."""
    if not option.startswith("--") or "=" in option:
        return False
    usage = " ".join(parser.format_usage().split())
    names = set(re.findall(r"(?<![\w-])--[\w-]+", usage))
    # argparse takes an unambiguous prefix (`--prom` for --prompt)
    found = [n for n in names if n == option] or [n for n in names if n.startswith(option)]
    if len(found) != 1:
        return False
    return re.search(rf"(?<![\w-]){re.escape(found[0])} (?![-\[|])[^\s\]|]", usage) is not None


def _unknown_options(words: Sequence[str], parser: argparse.ArgumentParser) -> list[str]:
    """The words of ``words`` (a command's, after its name) that look like options
    ``parser`` does not take, as argparse reads them: an unambiguous prefix is taken, a
    negative number is a value, ``--`` ends the options."""
    known = _option_strings(parser)
    unknown = []
    for word in words:
        if word == "--":
            break
        name = word.split("=", 1)[0]
        if not name.startswith("-") or re.fullmatch(r"-\d[\d.e-]*", name) or name == "-":
            continue
        if not any(option.startswith(name) for option in known):
            unknown.append(word)
    return unknown


def _unrecognized(
    extra: Sequence[str],
    argv: list[str],
    path: Sequence[str],
    leaf: argparse.ArgumentParser | None,
    root: argparse.ArgumentParser,
) -> UserError:
    """The error of words no parser took, with the closest option to the first flag:
    the command's (``leaf``), or cofr's own (``root``) for a word before any command."""
    # A word before the command (`cofr --verbose fit`) is cofr's own option.
    before = bool(path) and argv.index(extra[0]) < argv.index(path[0])
    where = " ".join(["cofr", *([] if before else path)])
    hint = ""
    word = next((word for word in extra if word.startswith("-")), None)
    flag = None if word is None else word.split("=", 1)[0]
    owner = root if before or not path else leaf
    given_to = argv[argv.index(word) - 1] if word is not None and argv.index(word) else ""
    if owner is not None and word is not None and _takes_value(owner, given_to):
        # `--prompt "- item"`: argparse takes a value starting with '-' for an option
        hint = f" (a value that starts with '-' goes after '=': {given_to}={shlex.quote(word)})"
    elif flag is not None and owner is not None:
        options = sorted({o for o in _option_strings(owner) if o.startswith("--")})
        # `-ckpt`: one dash short of --ckpt
        hint = did_you_mean("--" + flag.lstrip("-"), options, prefix="--")
    return UserError(
        f"unrecognized arguments: {' '.join(extra)}{hint} (`{where} --help` lists the options)"
    )


def _run_lightning(command: Command, words: list[str]) -> int:
    """fit / validate / test: answered from :mod:`cofrgenet.cli_cache` when it
    can (help, an unknown key) before Lightning is imported, and teaching it otherwise."""
    from cofrgenet import cli_cache

    if cli_cache.is_help(words):
        text = cli_cache.cached_help(words)
        if text is None:
            buffer = io.StringIO()
            try:
                with contextlib.redirect_stdout(buffer):
                    command.load().main(words)
            except SystemExit as exit_:
                if exit_.code not in (None, 0):
                    sys.stdout.write(buffer.getvalue())
                    raise
            text = buffer.getvalue()
            cli_cache.store_help(words, text)
        sys.stdout.write(text)
        return 0
    cli_cache.check_keys(command.path[0], words[1:] if command.keep_words else words)
    return int(command.load().main(words) or 0)


def entry() -> None:
    """The ``cofr`` program: :func:`main`'s status as the process's. Once the command has
    ended, a Ctrl-C or SIGTERM while the interpreter exits (torch's exit hooks, threads
    joined: seconds) ends the process at once with the command's status: it was 130
    after a complete report, or a traceback under ``cofr: interrupted``."""
    status = main()

    def end_now(signum: int, frame: Any) -> None:
        import logging
        import multiprocessing

        with contextlib.suppress(Exception):
            # What the skipped exit hooks would do that matters: child processes (data
            # loader workers, which hold the data folder's reader locks) ended, not left
            # to torch's watchdog; the logs and the output flushed.
            for child in multiprocessing.active_children():
                child.terminate()
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(status)  # the command's work is done and written; only the exit is left

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, end_now)
    sys.exit(status)


if __name__ == "__main__":
    entry()
