"""What a ``cofr fit`` (validate, test) command line and its config files say, read beside
LightningCLI's parser: one line for each parse error the parser reports at length, and
the checks of config files whose settings the parser would take silently otherwise.

* Parse errors (jsonargparse's reports: an unknown key, a value of the wrong type, a
  class path that is no callback): :func:`bad_choice`, :func:`bad_value`,
  :func:`bad_class_option`, :func:`bad_union`, :func:`bad_callback_class`,
  :func:`bad_nested_key`, each returning the line to say or None.
* Config files: a file that is no mapping of keys (:func:`bad_config_file`,
  :func:`bad_section_file`), settings a later file replaces or resets
  (:func:`replaced_by_later_files`, :func:`lists_replaced_by_later_files`,
  :func:`bases_undoing_earlier_files`).

Only text and YAML are read here: nothing is parsed into a config or built.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import difflib
import importlib
import inspect
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback

from cofrgenet import cli_cache, recipes
from cofrgenet.dotted import dotted_leaves, get_dotted
from cofrgenet.errors import did_you_mean, not_valid_yaml


def bad_choice(message: str, words: Sequence[str] = ()) -> str | None:
    """One line for jsonargparse's report of a value outside a Literal's choices, naming
    the config file of ``words`` (the command line) that gave it."""
    keys = re.findall(r'Parser key "([^"]+)"', message)
    given = re.search(r"Given value: (.*)", message)
    # Every Literal of the key's type (a Union may hold several, of ints and of strings).
    literals = re.findall(r"Literal\[([^\]]*)\]", message)
    if not (keys and given and literals):
        return None
    items = (item.strip().strip("'\"") for group in literals for item in group.split(","))
    names = list(dict.fromkeys(item for item in items if item))
    value = given.group(1).strip()
    key = f"{keys[-1]}{set_in(keys[-1], list(words), value)}"
    # A list's report names the whole list (`['mlp', 'cfn']`): the item outside the choices
    # is the one to name.
    with contextlib.suppress(Exception):  # not a literal (TypeError of `{[1]: 2}`, ...)
        items = ast.literal_eval(value)
        if isinstance(items, (list, tuple)):
            outside = [item for item in items if str(item) not in names]
            if outside:
                bad = str(outside[0])
                return (
                    f"{key}: {value}: {bad!r} is not one of {', '.join(names)}"
                    f"{did_you_mean(bad, names)}"
                )
    return f"{key}: {value!r} is not one of {', '.join(names)}{did_you_mean(value, names)}"


TYPE_NAMES = {
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "str": "text",
    "tuple": "a list in brackets ('[a, b]')",
}


#: The first words of options that a single dash turns into another one (``-config``).
SINGLE_DASH_SLIPS = ("config", "ckpt_path", "seed_everything", "print_config", "trainer", "model",
                     "data", "run")  # fmt: skip


#: Options that also take a file of their section's keys (``--trainer FILE``).
SECTION_FILE_OPTIONS = ("trainer", "model", "data", "run")


def option_value(words: Sequence[str], i: int) -> str:
    """The value given to the option ``words[i]``: after its ``=``, else the next word
    (``""`` at the end)."""
    word = words[i]
    return word.split("=", 1)[1] if "=" in word else " ".join(words[i + 1 : i + 2])


def file_word(words: list[str], i: int) -> tuple[str, str] | None:
    """(path, key prefix) when ``words[i]`` reads a file: ``--config F`` (prefix "") or
    ``--trainer F`` (prefix "trainer."; also with ``=``); else None."""
    word = words[i]
    option, _, value = word.partition("=")
    if not value:
        value = words[i + 1] if i + 1 < len(words) else ""
    if option in ("--config", "-c") and value:
        return value, ""
    if option[2:] in SECTION_FILE_OPTIONS and option.startswith("--") and Path(value).is_file():
        return value, f"{option[2:]}."
    return None


def file_values(path: Path) -> dict[str, Any]:
    import yaml

    try:
        return dotted_leaves(yaml.safe_load(path.read_text()))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}  # the parser reports the file


def file_keys(path: str, prefix: str) -> list[str]:
    return [prefix + key for key in file_values(Path(path))]


def replaced_by_later_files(words: list[str]) -> list[str]:
    """Command-line options (``--a.b v``, ``--ckpt_path v``, ``--trainer FILE``) that a
    file given after them (``--config F``, ``--trainer F``) sets again, and no later
    option restores: the later one wins, so the option given is silently lost. A mapping
    (``--model.config '{...}'``, a section file) is merged field by field: only the
    fields the file sets again count. ``words`` have their ``base:`` files expanded."""
    import yaml

    files = [  # (word index, path, the keys it sets), each file read once
        (i, read[0], file_keys(*read)) for i in range(len(words)) if (read := file_word(words, i))
    ]
    replaced = []
    for i, word in enumerate(words):
        if not word.startswith("--") or word.startswith("--config"):
            continue
        key, later = cli_cache.option_key(word), words[i + 1 :]
        if any(w.startswith("--") and cli_cache.option_key(w) == key for w in later):
            continue  # given again after the files: that value stands
        section_file = file_word(words, i)
        if section_file is not None:
            fields = file_keys(*section_file)
        else:
            value = option_value(words, i)
            try:
                given = yaml.safe_load(value) if value.startswith("{") else None
            except yaml.YAMLError:
                given = None
            fields = list(dotted_leaves(given, key)) if given else [key]
        lost, last = set(), None  # the last file that sets one again: its value stands
        for j, path, keys in files:
            hit = {f for f in fields for k in keys if j > i and (k == f or k.startswith(f"{f}."))}
            if hit:
                lost, last = lost | hit, path
        if last is None:
            continue
        if section_file is None:
            replaced.append(f"--{key} is replaced by {last}, given after it")
        else:
            names = ", ".join(sorted(lost))
            replaced.append(
                f"{names} of --{key} {section_file[0]} replaced by {last}, given after it"
            )
    return replaced


def bases_undoing_earlier_files(words: list[str]) -> list[str]:
    """A later ``--config`` file's base that sets keys back to other values after an
    earlier ``--config`` file set them (and neither that file nor its later bases sets
    them again): the base silently undoes the earlier file (``--config cpu-debug.yaml
    --config exp.yaml``, exp.yaml on ``cpu.yaml``). One message per such base."""
    said = []
    setter: dict[str, tuple[str, Any]] = {}  # key -> (earlier --config file, its value)
    for given, files in recipes.config_entries(words):
        values = [file_values(file) for file in files]
        for k, base in enumerate(files[:-1]):
            again = set().union(*values[k + 1 :])
            undone = sorted(
                key
                for key, value in values[k].items()
                if key in setter and setter[key][1] != value and key not in again
            )
            if not undone:
                continue
            earlier = sorted({setter[key][0] for key in undone})
            shown = ", ".join(undone[:3]) + (f" (+{len(undone) - 3} more)" if undone[3:] else "")
            files_named = ", ".join(earlier)
            said.append(
                f"{base}, a base of {given}, sets {shown} back after {files_named}: give "
                f"{files_named} after {given} to keep {'their' if earlier[1:] else 'its'} values"
            )
        for file, settings in zip(files, values, strict=True):
            setter.update({key: (str(file), value) for key, value in settings.items()})
    return said


#: List settings whose entries a later --config file means to add to, not replace: a
#: delta's LearningRateMonitor silently dropped a recipe's DyadicUnfreezing.
ADDED_TO_LISTS = ("trainer.callbacks", "trainer.plugins")


def entry_name(entry: Any) -> str:
    """A callback's name in a config list: its class (``DyadicUnfreezing``), or as given."""
    if isinstance(entry, dict) and "class_path" in entry:
        return str(entry["class_path"]).rsplit(".", 1)[-1]
    return str(entry).rsplit(".", 1)[-1]


def lists_replaced_by_later_files(words: list[str]) -> list[str]:
    """A later ``--config`` file (or its bases) whose ``trainer.callbacks`` (or plugins)
    list leaves out entries an earlier ``--config`` file gave: lists are replaced, not
    merged, so those entries are silently gone. One message per such file and key."""
    import yaml

    said = []
    # Entries appended after the last --config (`--trainer.callbacks+ DyadicUnfreezing`,
    # as the message advises) are in the list the run gets.
    last = max((i for i, w in enumerate(words) if w.split("=", 1)[0] in ("--config", "-c")),
               default=-1)  # fmt: skip
    appended: dict[str, set[str]] = {}
    for i, word in enumerate(words[last + 1 :], start=last + 1):
        if word.startswith("--") and word.split("=", 1)[0].endswith("+"):
            text = option_value(words, i)
            with contextlib.suppress(yaml.YAMLError):
                entry = yaml.safe_load(text)
                entries = entry if isinstance(entry, list) else [entry]
                appended.setdefault(cli_cache.option_key(word), set()).update(
                    entry_name(e) for e in entries
                )
    setter: dict[str, tuple[str, list[Any]]] = {}  # key -> (the --config, its list)
    for given, files in recipes.config_entries(words):
        values = [file_values(file) for file in files]
        for key in ADDED_TO_LISTS:
            own = next((v[key] for v in reversed(values) if key in v), None)
            if not isinstance(own, list):
                continue
            if key in setter:
                earlier, entries = setter[key]
                kept = {entry_name(entry) for entry in own} | appended.get(key, set())
                dropped = [n for n in map(entry_name, entries) if n not in kept]
                if dropped:
                    said.append(
                        f"{given} gives {key} as a list, which replaces {earlier}'s: "
                        f"{', '.join(dropped)} {'is' if len(dropped) == 1 else 'are'} not "
                        f"in it, and will not run; list {'it' if len(dropped) == 1 else 'them'} "
                        f"in {given} too, or add entries with --{key}+ CLASS"
                    )
            setter[key] = (given, own)
    return said


def naming_the_file(message: str, words: list[str]) -> str:
    """A refusal of a built class's setting (``data.batch_size must be >= 1, got -4``)
    with `` (in FILE)`` after its key where a config file of ``words`` gave that value
    (:func:`set_in`); ``message`` as it is otherwise."""
    value = re.search(r", got '?([^',]+?)'?$", message)
    # `data.batch_size must ...`, or a section's `model.config: n_layer must ...`.
    keyed = re.match(r"([a-z_]+(?:\.[A-Za-z_]\w*)+)((?:: ([a-z_]\w*))?)\b", message)
    if value is None or keyed is None:
        return message
    section, field = keyed[1], keyed[3]
    key = f"{section}.{field}" if field else section
    at = keyed.end()
    return f"{message[:at]}{set_in(key, words, value[1])}{message[at:]}"


def _same_value(given: Any, value: str) -> bool:
    """Whether ``given`` (a file's value, or a command line's text) is the ``value`` an
    error wrote: ``-1`` and ``-1.0``, ``[mlp, cfn]`` and ``['mlp', 'cfn']``."""
    import yaml

    def read(text: Any) -> Any:
        if not isinstance(text, str):
            return text
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError:
            return text

    return str(given) == value or read(given) == read(value)


def set_in(key: str, words: list[str], value: str) -> str:
    """`` (in FILE)``: the first config file (in the order they load, where the parser
    stops) that gives ``key`` the bad ``value``; ``""`` when an option on the command line
    gives the key that value, itself or in a mapping above it (``--model.config '{...}'``;
    ``--trainer FILE`` or a mapping that cannot be read: the value may be theirs), or no
    file holds that value."""
    import yaml

    missing = object()
    for i, word in enumerate(words):
        given = cli_cache.option_key(word) if word.startswith("--") else ""
        text = option_value(words, i)
        if given == key:
            if _same_value(text, value):
                return ""
            continue  # `--data.batch_size 4` before a file's -4: the bad value is a file's
        if given and key.startswith(f"{given}."):  # a mapping, as text or in a file
            try:
                mapping = yaml.safe_load(text)
            except yaml.YAMLError:
                return ""
            if isinstance(mapping, str):  # --trainer FILE
                mapping = recipes.load_yaml(Path(mapping))
            if not isinstance(mapping, dict):
                return ""
            found = get_dotted(mapping, key[len(given) + 1 :], missing)
            if found is not missing and _same_value(found, value):
                return ""
    for path in cli_cache.config_files(words):
        found = get_dotted(recipes.load_yaml(Path(path)), key, missing)
        if found is not missing and _same_value(found, value):
            return f" (in {path})"
    return ""


def bad_value(key: str, expected: str, value: str, words: list[str]) -> str:
    """The one line for a value of the wrong kind, with the file that gave it."""
    return f"{key}{set_in(key, words, value)}: expected {expected}, got {value!r}"


def given_key(key: str, words: list[str]) -> str:
    """The dotted key as the command line gave it: jsonargparse names a dataclass field
    by its own name alone (``betas`` for ``--model.optimizer.betas``)."""
    for word in words:
        given = cli_cache.option_key(word) if word.startswith("--") else ""
        if given.endswith(f".{key}"):
            return given
    return key


def bad_class_option(message: str, command: str = "fit") -> str | None:
    """One line for an ``init_args`` key the class (``trainer.strategy``'s, a callback's)
    does not take: jsonargparse's report names it among every Union subtype's errors.
    ``command``: the subcommand whose help lists the options."""
    key = re.search(r'Parser key "([^"]+)"', message)
    bad = re.search(
        r"Problem with given class_path '([\w.]+)':\s+(?:Option|Key) '(\w+)' is not "
        r"(?:accepted|expected)",
        message,
    )
    if not (key and bad):
        return None
    class_path, option = bad.groups()
    options = init_options(class_path)
    return (
        f"{key.group(1)}: {class_path.rsplit('.', 1)[-1]} takes no option {option!r}"
        f"{did_you_mean(option, options)} (`cofr {command} --{key.group(1)}.help {class_path}` "
        "lists them)"
    )


def init_options(class_path: str) -> list[str]:
    """The keyword arguments ``class_path``'s constructor takes, those it passes on
    through ``**kwargs`` to its bases' included ([] if it does not import)."""
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return []
    options: list[str] = []
    for klass in cls.__mro__:
        if "__init__" not in vars(klass):
            continue
        parameters = inspect.signature(klass.__init__).parameters.values()
        options += [p.name for p in parameters if p.name != "self" and p.kind in (
            p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]  # fmt: skip
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            break
    return list(dict.fromkeys(options))


def bad_union(message: str) -> tuple[str, str, str] | None:
    """(the key, the kinds expected, the value given) of jsonargparse's report of a value
    none of a Union's types takes (``int | None`` given 1.5, ``bool | int`` given abc)."""
    # A field of a dataclass option (model.optimizer's fused) is reported inside the
    # option's own Union: the innermost report is the value's, its key the path to it.
    unions = list(
        re.finditer(r'Parser key "([^"]+)":\s+Does not validate against any of the Union', message)
    )
    if not unions:
        return None
    inner = message[unions[-1].end() :]
    subtypes = re.search(r"Subtypes: \[([^\]]*)\]", inner)
    given = re.search(r"Given value: (.*?)(?: \(`|$)", inner, re.MULTILINE)
    if not (subtypes and given):
        return None
    names = re.findall(r"<class '(\w+)'>", subtypes.group(1))
    kinds = [TYPE_NAMES.get(n, n) for n in names if n != "NoneType"]
    if not kinds:
        return None
    # Every key on the way in (`- Expected a path` lines may come between them).
    key = key_path(re.findall(r'Parser key "([^"]+)"', message[: unions[-1].end()]))
    return key, " or ".join(kinds), given.group(1).strip()


def key_path(keys: Sequence[str]) -> str:
    """The dotted key of the innermost of jsonargparse's nested ``Parser key`` reports:
    a dataclass field's is its own name (``model.optimizer``, then ``fused``), a value
    given as JSON's the whole path again (``model.config``, then ``model.config.depth``)."""
    path = ""
    for key in keys:
        path = key if not path or key == path or key.startswith(f"{path}.") else f"{path}.{key}"
    return path


def bad_callback_class(message: str) -> str | None:
    """One line for a ``trainer.callbacks`` entry that names no class (jsonargparse's
    report lists every Union subtype), with the closest of the callbacks we know."""
    key = re.search(r'Parser key "(trainer\.callbacks)"', message)
    given = re.search(r"Expected a dot import path string: (\S+)", message)  # a bare name
    if given is None and re.search(r"has no attribute|No module named", message):
        given = re.search(r"Problem with given class_path '([\w.]+)'", message)  # a path to nothing
    if not (key and given):
        return None
    import lightning.pytorch.callbacks as lightning_callbacks

    from cofrgenet.training import callbacks as ours

    known = [
        f"{module.__name__}.{name}"
        for module in (ours, lightning_callbacks)
        for name, value in vars(module).items()
        if isinstance(value, type) and issubclass(value, Callback) and not name.startswith("_")
    ]
    name = given.group(1)
    by_name = {path.rpartition(".")[2]: path for path in known}
    close = difflib.get_close_matches(name.rpartition(".")[2], list(by_name), n=1, cutoff=0.6)
    hint = f" (did you mean {by_name[close[0]]!r}?)" if close else ""
    return (
        f"trainer.callbacks: {name!r} is no callback class{hint}; give its import path, "
        "e.g. cofrgenet.training.callbacks.DyadicUnfreezing (its arguments: `cofr fit "
        "--trainer.callbacks.help CLASS`)"
    )


def close_file(given: str) -> str:
    """`` (did you mean 'conf/trainer/cpu-debug.yaml'?)`` for a config file path with a
    slip in its name: the closest YAML file beside where it would be (here, or in the
    checkout's ``conf/``, as ``--config`` finds bundled files), or ``""``."""
    path = Path(given)
    for folder in (path.parent, recipes.bundled(path.parent)):
        if folder.is_dir():
            names = sorted(p.name for p in folder.iterdir() if p.suffix in (".yaml", ".yml"))
            close = difflib.get_close_matches(path.name, names, n=1, cutoff=0.6)
            if close:
                return f" (did you mean {str(path.parent / close[0])!r}?)"
    return ""


def bad_nested_key(message: str) -> tuple[str, list[str]] | None:
    """(the dotted key, the valid keys beside it) of jsonargparse's report of an unknown
    field of a dataclass-typed option (``--model.optimizer.lrr``, in a Union with None)."""
    key = re.search(r'Parser key "([^"]+)"', message)
    option = re.search(r"Option '([^']+)' is not accepted", message)
    class_path = re.search(r"given class_path '([\w.]+)'", message)
    if not (key and option):
        return None
    fields: list[str] = []
    if class_path is not None:
        module, _, name = class_path.group(1).rpartition(".")
        with contextlib.suppress(Exception):
            kind = getattr(importlib.import_module(module), name)
            if dataclasses.is_dataclass(kind):
                fields = [f.name for f in dataclasses.fields(kind)]
            else:  # a callback: its __init__'s named arguments
                fields = [
                    p.name
                    for p in inspect.signature(kind).parameters.values()
                    if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                ]
    prefix = key.group(1)
    return f"{prefix}.{option.group(1)}", [f"{prefix}.{field}" for field in fields]


#: Config sections that hold keys: jsonargparse reads an empty one (all keys commented
#: out) or a list there as "reset every earlier setting of it to its default".
MAPPING_SECTIONS = ("trainer", "model", "data", "run", "model.config", "model.optimizer")
YAML_KINDS = {
    list: "a list",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
}


def yaml_mapping(path: str, label: str, keys: str = "keys") -> dict | str | None:
    """The mapping that YAML file ``path`` holds; or, as one line, what is wrong with it
    (``label`` names the file: ``config file``, ``--trainer``); None when it cannot be
    read (a missing file has the parser's own message)."""
    import yaml

    try:
        content = yaml.load(Path(path).read_text(), Loader=recipes.unique_key_loader())
    except OSError:
        return None
    except UnicodeDecodeError as error:
        return f"{label} {path} is not UTF-8 text (byte {error.start}): save it as UTF-8"
    except yaml.YAMLError as error:
        return f"{label} {not_valid_yaml(path, error)}"
    if content is None:
        return f"{label} {path} holds no settings (empty or only comments): drop it"
    if not isinstance(content, dict):
        what = YAML_KINDS.get(type(content), type(content).__name__)
        return f"{label} {path} must hold a mapping of {keys}, not {what}"
    return content


def dotted_beside_its_group(mapping: dict, where: str = "") -> tuple[str, str] | None:
    """(a dotted key, the key of its group) that stand side by side in one of
    ``mapping``'s mappings (``model.config.vocab_size: 320`` beside ``model:``), whose
    merge drops one of them, by order (the preset of ``model:`` reset, or the size lost);
    None if none do. ``where``: the keys above ``mapping``, for the names said."""
    keys = [k for k in mapping if isinstance(k, str)]
    for key in keys:
        parts = key.split(".")
        for cut in range(1, len(parts)):
            group = ".".join(parts[:cut])
            if group in mapping:
                return f"{where}{key}", f"{where}{group}"
    for key in keys:
        value = mapping[key]
        if isinstance(value, dict):
            found = dotted_beside_its_group(value, f"{where}{key}.")
            if found is not None:
                return found
    return None


def bad_config_file(words: list[str]) -> str | None:
    """What is wrong with the first ``--config`` file that is not a YAML mapping, has a
    key twice, or holds something else than keys in one of :data:`MAPPING_SECTIONS`."""
    for path in recipes.config_paths(words):
        content = yaml_mapping(path, "config file")
        if not isinstance(content, dict):
            if content is None:
                continue
            return content
        if (both := dotted_beside_its_group(content)) is not None:
            dotted, group = both
            return (
                f"config file {path}: `{dotted}` beside `{group}:` in one mapping (one of the "
                f"two would be dropped): write it inside `{group}:`, or in its own --config file"
            )
        for dotted in MAPPING_SECTIONS:
            parent, _, key = dotted.rpartition(".")
            holder = content.get(parent) if parent else content
            if not isinstance(holder, dict) or key not in holder:
                continue
            value = holder[key]
            if not isinstance(value, dict):
                what = "nothing" if value is None else YAML_KINDS.get(type(value), "a value")
                return (
                    f"config file {path}: `{dotted}:` holds {what}, not its keys (it would "
                    "reset every earlier setting of it): give its keys, or drop it"
                )
    return None


def bad_section_file(words: list[str]) -> str | None:
    """What is wrong with the first ``--trainer FILE`` (any section's) that is not UTF-8
    YAML holding a mapping of the section's keys."""
    for i in range(len(words)):
        read = file_word(words, i)
        if read is not None and read[1]:  # a section file
            section = read[1].rstrip(".")
            content = yaml_mapping(read[0], f"--{section}", f"{section} keys")
            if isinstance(content, str):
                return content
    return None
