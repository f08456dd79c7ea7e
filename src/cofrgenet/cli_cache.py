"""What the Lightning-based commands can answer without importing Lightning.

Importing Lightning takes seconds, and ``cofr fit --help`` or a typo in a config key
should not wait for it. The first time such a command runs, what it learns is kept in a
small cache: the help text of that command line, and the dotted keys the ``fit``,
``validate``, ... parser accepts. Later calls answer from the cache: the help is printed
as it was, and an unknown key (``--trainer.max_stepz``, or ``max_stepz:`` under
``trainer:`` in a ``--config`` file) is reported at once, with the same message the
full parser gives. Entries are keyed by a fingerprint of the installed versions, of
this package's source files and of the program that runs it (``cofr``, or a user's
script that registers its own mixers first), so any change invalidates them. The cache lives in
``$COFR_CACHE_DIR`` (default ``~/.cache/cofrgenet/cli``); when it cannot be written,
everything works as without it. A file that does not parse (cut short, edited) is
removed and counts as missing; each write removes the files of all but the few most
recently written fingerprints, so edits and upgrades do not pile up old entries.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from cofrgenet import recipes
from cofrgenet.atomic import write_text_atomic
from cofrgenet.dotted import dotted_leaves, get_dotted
from cofrgenet.errors import ConfigError, did_you_mean, unknown_name

HELP_FLAGS = ("-h", "--help")


def cache_dir() -> Path:
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cofrgenet" / "cli"
    return Path(os.environ.get("COFR_CACHE_DIR", default))


@cache
def fingerprint() -> str:
    """The installed versions that shape the parser, and this package's source files."""
    digest = hashlib.sha1()
    for dist in ("cofrgenet", "lightning", "jsonargparse", "torch"):
        try:
            digest.update(f"{dist}={metadata.version(dist)};".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{dist}=none;".encode())
    # The program that runs the CLI: a user's script that registers its own mixers
    # before calling cofrgenet.cli.main has other choices in its help than `cofr`.
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    if main and Path(main).is_file():
        digest.update(f"main={Path(main).resolve()}:{Path(main).stat().st_mtime_ns};".encode())
    package = Path(__file__).resolve().parent
    for path in sorted(package.rglob("*.py")):
        stat = path.stat()
        digest.update(f"{path.relative_to(package)}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return digest.hexdigest()[:16]


def _path(kind: str, key: str) -> Path:
    return cache_dir() / f"{kind}-{key}-{fingerprint()}"


#: A cache file ``<kind>-<key>-<fingerprint>``, or the temporary file of its write
#: (:func:`cofrgenet.atomic.replacing`); group 1 is the fingerprint.
_ENTRY = re.compile(r"\.?(?:help|keys|choices)-.+-([0-9a-f]{16})(?:\.\d+\.tmp)?")

#: Fingerprints whose files a write keeps: its own and the most recently written others.
#: More than one, so that two checkouts (or `cofr` and a script of one's own) sharing the
#: cache do not wipe each other's entries at every call.
KEEP_FINGERPRINTS = 4


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _read_json(path: Path, valid: Callable[[Any], bool]) -> Any:
    """The JSON in ``path`` when ``valid(value)``, else None. A file that does not parse
    (a disk filled mid-write, an edit) is removed: the cache is optional, and the full
    parser writes it again."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        value = json.loads(data)
    except ValueError:  # JSONDecodeError, UnicodeDecodeError
        value = None
    if value is None or not valid(value):
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)
        return None
    return value


def _is_names(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _prune(folder: Path) -> None:
    """Remove the cache files of fingerprints other than the current one and the
    ``KEEP_FINGERPRINTS - 1`` most recently written. Another process may be reading or
    writing them: a file gone by then is a cache miss there, and every error is ignored."""
    newest: dict[str, float] = {}
    entries: list[tuple[str, Path]] = []
    try:
        for entry in os.scandir(folder):
            match = _ENTRY.fullmatch(entry.name)
            if match is None:
                continue  # not the cache's: COFR_CACHE_DIR may be a shared folder
            with contextlib.suppress(OSError):
                mtime = entry.stat(follow_symlinks=False).st_mtime
                newest[match[1]] = max(newest.get(match[1], mtime), mtime)
                entries.append((match[1], Path(entry.path)))
    except OSError:
        return
    current = fingerprint()
    others = sorted((fp for fp in newest if fp != current), key=newest.__getitem__, reverse=True)
    keep = {current, *others[: KEEP_FINGERPRINTS - 1]}
    for fp, path in entries:
        if fp not in keep:
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, text)
    except OSError:
        return  # a read-only home: no cache, nothing else changes
    _prune(path.parent)


def _help_key(words: Sequence[str]) -> str:
    """The command line, with the content of every --config file it names."""
    digest = hashlib.sha1("\0".join(words).encode())
    for path in config_files(words):
        with contextlib.suppress(OSError):  # bytes: not UTF-8 is the full parser's to report
            digest.update(Path(path).read_bytes())
    return digest.hexdigest()[:16]


def is_help(words: Sequence[str]) -> bool:
    return any(word in HELP_FLAGS for word in words)


def cached_help(words: Sequence[str]) -> str | None:
    return _read(_path("help", _help_key(words)))


def store_help(words: Sequence[str], text: str) -> None:
    _write(_path("help", _help_key(words)), text)


def store_keys(subcommand: str, keys: Iterable[str]) -> None:
    """The dotted keys ``subcommand``'s parser accepts (a key ends at a dict or object)."""
    _write(_path("keys", subcommand), json.dumps(sorted(keys)))


def cached_keys(subcommand: str) -> list[str] | None:
    return _read_json(_path("keys", subcommand), _is_names)


#: The key whose value is checked against the names the full parser accepts.
PRESET_KEY = "model.preset"


def store_presets(names: Iterable[str]) -> None:
    """The model presets ``model.preset`` accepts (besides none)."""
    _write(_path("choices", PRESET_KEY), json.dumps(list(names)))


def cached_presets() -> list[str] | None:
    return _read_json(_path("choices", PRESET_KEY), _is_names)


# ------------------------------------------------------------------ unknown keys


def config_files(words: Sequence[str]) -> list[str]:
    """The config files ``words`` read, in order: each ``--config``/``-c`` file after the
    ``base:`` files it names (:mod:`cofrgenet.recipes`), as ``cofr fit`` reads them."""
    return recipes.config_paths(recipes.expand(words))


def option_key(word: str) -> str:
    """The key of a command-line word ``--a.b``, ``--a.b=v`` or ``--a.b+=v`` (jsonargparse's
    append): ``a.b``."""
    return word[2:].split("=", 1)[0].rstrip("+")


def holds_key(path: str, dotted: str) -> bool:
    """Whether YAML file ``path`` has the nested key ``dotted`` (a.b.c)."""
    return _yaml_value(path, dotted) is not _MISSING


def dashed_option(key: str, valid: Iterable[str]) -> str | None:
    """The key a dashed option (``--run-name``, ``--trainer-max-steps``) was meant as,
    its dashes read as dots or underscores (``run.name``, ``trainer.max_steps``); None
    when no reading is a valid key."""
    parts = key.split("-")
    if len(parts) < 2 or len(parts) > 8:
        return None
    valid = set(valid)
    for seps in itertools.product("._", repeat=len(parts) - 1):
        meant = parts[0] + "".join(sep + part for sep, part in zip(seps, parts[1:], strict=True))
        if meant in valid:
            return meant
    return None


def unknown_key_message(
    subcommand: str, key: str, words: Sequence[str], valid: Iterable[str]
) -> str:
    """The one message for a key the parser does not know, with its file and a hint."""
    valid = list(valid)
    where = "".join(f" in {path}" for path in config_files(words) if holds_key(path, key))
    meant = dashed_option(key, valid)
    if meant is not None and where:  # a file's key, not an option
        return (
            f"unknown key {key!r}{where}: did you mean {meant!r}? (keys are words joined by "
            f"underscores); `cofr {subcommand} --help` lists every option"
        )
    if meant is not None:
        return (
            f"unknown option --{key}: did you mean --{meant}? (options are dotted keys, "
            f"words joined by underscores); `cofr {subcommand} --help` lists every option"
        )
    section = key.split(".", 1)[0]
    doubled = key in valid or key.startswith(f"{section}.{section}.")
    if doubled and f"--{section}" in words:  # `--trainer FILE` of a file `trainer: {...}`
        return (
            f"--{section} FILE takes a file of {section} keys alone, but its file holds a "
            f"top-level `{section}:`: give that file with --config"
        )
    return (
        f"unknown key {key!r}{where}{did_you_mean(key, list(valid))}; "
        f"`cofr {subcommand} --help` lists every option"
    )


def _known(key: str, valid: set[str]) -> bool:
    """A valid key, a key below one (a dict's entry), or a group holding valid keys."""
    parts = key.split(".")
    if any(".".join(parts[:n]) in valid for n in range(1, len(parts) + 1)):
        return True
    return any(v.startswith(f"{key}.") for v in valid)


def check_keys(subcommand: str, words: Sequence[str]) -> None:
    """Raise the parser's ConfigError for an unknown dotted key, if the keys are cached.

    Only dotted keys are checked (``--trainer.max_steps``, nested YAML keys); a key below
    one that takes a dict or an object (``model.config.*``) is left to the full parser.
    """
    keys = cached_keys(subcommand)
    if keys is None:
        return
    valid = set(keys)
    for word in words:  # --run-name: before the full parser, which blames a config file
        key = option_key(word) if word.startswith("--") else ""
        if "-" in key and key not in valid and dashed_option(key, valid) is not None:
            raise ConfigError(unknown_key_message(subcommand, key, words, valid))
    given = [option_key(w) for w in words if w.startswith("--") and "." in w]
    for path in config_files(words):
        import yaml

        try:
            given += list(dotted_leaves(yaml.safe_load(Path(path).read_text()) or {}))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            return  # the full parser says what is wrong with the file
    for key in given:
        if "." in key and not _known(key, valid):
            raise ConfigError(unknown_key_message(subcommand, key, words, valid))
    check_preset(words)


def given_preset(words: Sequence[str]) -> Any:
    """The ``model.preset`` that ``words`` give, as the parser reads them in order (a
    later ``--config`` file or ``--model.preset`` wins); None when none is given or it
    cannot be told without the parser (a whole ``--model`` section)."""
    value = None
    expanded = recipes.expand(words)
    flag = f"--{PRESET_KEY}"
    for i, word in enumerate(expanded):
        if word == "--model" or word.startswith("--model="):
            return None
        if word == "--config" and i + 1 < len(expanded):
            node = _yaml_value(expanded[i + 1], PRESET_KEY)
            value = node if node is not _MISSING else value
        elif word == flag and i + 1 < len(expanded):
            value = expanded[i + 1]
        elif word.startswith(f"{flag}="):
            value = word.split("=", 1)[1]
    return value


def check_preset(words: Sequence[str]) -> None:
    """Raise the full parser's ConfigError for a ``model.preset`` it does not know."""
    names = cached_presets()
    value = given_preset(words)
    if names is None or not isinstance(value, str) or value in names:
        return
    if value.lower() in ("null", "none", "~", ""):  # no preset: a full model.config
        return
    raise ConfigError(unknown_name("preset", value, names))


_MISSING = object()


def _yaml_value(path: str, dotted: str) -> Any:
    """The value at nested key ``dotted`` of YAML file ``path``, or ``_MISSING``."""
    import yaml

    try:
        node: Any = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return _MISSING  # the full parser says what is wrong with the file
    return get_dotted(node, dotted, _MISSING)
