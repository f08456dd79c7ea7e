"""Config recipes: a config file may name the group files it builds on (``base:``).

An experiment is a delta over the groups in ``conf/trainer`` and ``conf/data``::

    # conf/experiment/paper-gpt2-xl-owt.yaml
    base: [conf/trainer/ddp.yaml, conf/data/openwebtext-gpt2.yaml]
    model:
      preset: gpt2-xl
    trainer:
      num_nodes: 2          # only what differs from the groups

``cofr fit --config conf/experiment/paper-gpt2-xl-owt.yaml`` then reads as
``--config conf/trainer/ddp.yaml --config conf/data/openwebtext-gpt2.yaml --config
conf/experiment/paper-gpt2-xl-owt.yaml``: the bases first, in order, so the file's own
values win, and a base's own bases before it; a base that an earlier ``--config`` of
the line already read is not read again. A path is looked up from the working
directory, then from the folder of the file that names it. jsonargparse merges the files
as for any ``--config`` list; ``base`` itself is an otherwise unused option, given in
files only, and left out of the config a run saves (that one is whole: it needs no base).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cofrgenet.config_variables import expand_variables
from cofrgenet.errors import ConfigError

KEY = "base"


#: The checkout cofrgenet runs from (an editable install): conf/, sweeps/ are there.
CHECKOUT = Path(__file__).resolve().parents[2]


def bundled(path: str | Path) -> Path:
    """``path`` from the working directory when it is there, else from the checkout
    cofrgenet runs from: the project's own ``conf/...`` files found from any folder (as
    given when neither has it, for the caller to report)."""
    path = Path(path)
    if path.exists() or path.is_absolute() or not (CHECKOUT / path).exists():
        return path
    return CHECKOUT / path


def load_yaml(path: Path) -> Any:
    """What the YAML file ``path`` holds; None when it cannot be read or parsed (the
    config parser reports what is wrong with the file itself)."""
    import yaml

    try:
        return yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None


@functools.cache
def unique_key_loader() -> type:
    """A YAML SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the
    last, so a second ``trainer:`` block silently dropped the first): the one reading of
    the files a user writes, ``cofr fit`` configs and sweep files alike."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> dict:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: keys beside it win
                    continue
                key = self.construct_object(key_node, deep=deep)
                if isinstance(key, str | int | float | bool) and key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"the key {key!r} is given twice: keep one", key_node.start_mark
                    )
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    # YAML 1.1's base-60 numbers: `time: 12:00:00` read as the integer 43200 (minutes to
    # sbatch: 30 days). Read as the strings they look like, as YAML 1.2 does.
    UniqueKeyLoader.yaml_implicit_resolvers = {
        first: [(tag, _without_base_60(tag, regexp)) for tag, regexp in resolvers]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    return UniqueKeyLoader


def _without_base_60(tag: str, regexp: re.Pattern) -> re.Pattern:
    """YAML 1.1's int and float patterns, less their base-60 forms (``1:30``: 90)."""
    if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float"):
        return regexp
    return re.compile(r"(?!.*:)" + regexp.pattern, regexp.flags)


def find_base(entry: str, naming: Path | None, naming_first: bool = False) -> Path:
    """The file a ``base:`` entry of the file ``naming`` names (fit configs and sweep
    files alike): ``${VAR}`` and ``~`` expanded, then looked up from the working
    directory, else from ``naming``'s folder and its parents (conf/trainer/x.yaml named
    in conf/experiment/y.yaml, run from anywhere), else from the checkout (the bundled
    recipes, and a config.yaml saved by a run before bases were left out).

    ``naming_first``: ``naming``'s folders before the working directory (a sweep file's
    bases: its workers, started from any directory, read the same files)."""
    where = f"{naming}: `{KEY}:`" if naming is not None else f"`{KEY}:`"
    name = Path(expand_variables(entry, where)).expanduser()
    here = naming.resolve().parent if naming is not None else Path.cwd()
    folders = [Path(), here, *here.parents, CHECKOUT]
    if naming_first and naming is not None:
        folders = [here, *here.parents, Path(), CHECKOUT]
    for folder in folders:
        if (folder / name).is_file():  # an absolute name stays itself
            return folder / name
    held = f"the folders holding {naming.name}" if naming is not None else "the checkout"
    raise ConfigError(
        f"{where} names {entry}, which is neither under the working directory nor under {held}"
    )


def bases_of(path: str | Path) -> list[Path]:
    """The files ``path``'s ``base:`` names, resolved (empty when it names none)."""
    path = Path(path)
    data = load_yaml(path)
    if not isinstance(data, dict) or data.get(KEY) is None:
        return []
    entries = data[KEY]
    if isinstance(entries, str):
        entries = [entries]
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        raise ConfigError(f"{path}: `{KEY}:` must be a list of config files, got {entries!r}")
    return [find_base(entry, path) for entry in entries]


def _with_bases(path: Path, chain: tuple[Path, ...]) -> list[Path]:
    key = path.resolve()
    if key in chain:
        loop = " -> ".join(str(p) for p in (*chain, key))
        raise ConfigError(f"config files name each other as `{KEY}:` in a loop: {loop}")
    files: list[Path] = []
    for base in bases_of(path):
        files += _with_bases(base, (*chain, key))
    return [*files, path]


def config_paths(words: Sequence[str]) -> list[str]:
    """The files of ``words``' ``--config F``, ``-c F`` and ``--config=F``, in order."""
    paths = []
    i = 0
    while i < len(words):
        word = words[i]
        if word in ("--config", "-c") and i + 1 < len(words):
            paths.append(words[i + 1])
            i += 2
            continue
        if word.startswith("--config="):
            paths.append(word.split("=", 1)[1])
        i += 1
    return paths


def config_entries(words: Sequence[str]) -> list[tuple[str, list[Path]]]:
    """Each ``--config F`` of ``words`` (F as given) with the files it reads, in order:
    F's ``base:`` files, then F. A base that an earlier ``--config`` already read is not
    read again: it would undo what the files between gave (``--config exp.yaml --config
    delta.yaml``, both on ``conf/trainer/cpu.yaml``, would lose exp.yaml's changes to
    it). F is looked up as :func:`bundled` does; a missing F reads as itself (the parser
    reports it)."""
    entries: list[tuple[str, list[Path]]] = []
    read: set[Path] = set()  # files that earlier entries read
    for path in config_paths(words):
        found = bundled(path)  # conf/... of the checkout, from any folder
        if not found.is_file():
            entries.append((path, [Path(path)]))
            continue
        *bases, own = _with_bases(found, ())
        files = [base for base in bases if base.resolve() not in read] + [own]
        entries.append((path, files))
        read.update(file.resolve() for file in files)
    return entries


def expand(words: Sequence[str]) -> list[str]:
    """``words`` with every ``--config F`` preceded by ``--config`` for F's bases (those
    not read for an earlier ``--config``: :func:`config_entries`)."""
    entries = iter(config_entries(words))
    out: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word in ("--config", "-c") and i + 1 < len(words):
            i += 2
        elif word.startswith("--config="):
            i += 1
        else:
            out.append(word)
            i += 1
            continue
        given, files = next(entries)
        if not files[-1].is_file():
            out += ["--config", given]  # as given: the parser says the file is missing
            continue
        for file in files:
            out += ["--config", str(file)]
    return out
