"""Which checkpoint to resume from, whether a file is a checkpoint at all, and the model
it holds.

A checkpoint written by ``torch.save`` is a zip archive whose members carry CRC-32
checksums, so a truncated or overwritten file is found by reading it once, without
unpickling anything (:func:`is_intact`). ``--ckpt_path last`` then resumes from the
newest intact checkpoint of the run: ``last.ckpt``, Lightning's SLURM requeue
checkpoint ``hpc_ckpt_<n>.ckpt`` or a periodic ``step*.ckpt``, saying so when it had to
pass over a damaged newer one (:func:`newest_intact`). :func:`restore_model` builds the
network a checkpoint holds without Lightning (``cofr generate`` and evaluation start
~2.5 s sooner than through ``LanguageModel.load_from_checkpoint``).
"""

from __future__ import annotations

import glob
import math
import os
import re
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from cofrgenet.atomic import is_temporary
from cofrgenet.errors import ConfigError, UserError, did_you_mean, first_line
from cofrgenet.models import ModelConfig, build_model
from cofrgenet.models.config import unused_settings
from cofrgenet.nn import LadderLayer
from cofrgenet.training.model_options import model_config_of, overrides_dict


class CheckpointError(UserError, ValueError):
    """A file that is not an intact cofrgenet checkpoint."""


def damaged(path: Path) -> CheckpointError:
    """The error for a file that is not an intact checkpoint, naming an intact one beside
    it in a run's checkpoints folder (a run keeps ``last.ckpt`` and its newest
    ``step*.ckpt``) when there is one; elsewhere a ``.ckpt`` beside it may be anything."""
    path = Path(path)
    # A run's checkpoints/ folder, beside the config.yaml the run saved.
    in_run = path.parent.name == "checkpoints" and (path.parent.parent / "config.yaml").is_file()
    others = [p for p in checkpoint_files(path.parent) if p != path and is_intact(p)]
    if in_run and others:
        newest = max(others, key=newness)
        hint = f": {newest}, of the same run, is intact (give it instead)"
    else:
        hint = " (a save cut short, or another kind of file)"
    return CheckpointError(
        f"this checkpoint is damaged or not a cofrgenet checkpoint: {path}{hint}"
    )


def checkpoint_files(folder: Path, pattern: str = "*.ckpt") -> list[Path]:
    """The checkpoints in ``folder`` matching ``pattern``, without hidden files: the
    temporary files of saves under way or cut short (:func:`cofrgenet.atomic.is_temporary`)
    among them."""
    return [p for p in Path(folder).glob(pattern) if not p.name.startswith(".")]


def remove_unfinished_saves(run_dir: Path) -> list[Path]:
    """Remove the temporary files that saves of a killed process left in ``run_dir`` and
    its ``checkpoints/``; returns them. Call it only while holding the run's lock (no
    other process is saving there)."""
    found = [
        p for sub in (run_dir, run_dir / "checkpoints") for p in sub.glob(".*.ckpt")
        if is_temporary(p.name)
    ]  # fmt: skip
    for path in found:
        path.unlink(missing_ok=True)
    return found


#: Files of a sharded (FSDP ``state_dict_type: sharded``) checkpoint folder: the
#: torch.distributed.checkpoint metadata, written last, and Lightning's own entries.
SHARDED_MARKERS = (".metadata", "meta.pt")


def is_sharded(path: str | Path) -> bool:
    """Whether ``path`` is a sharded checkpoint: a folder of per-rank shards."""
    return Path(path).is_dir()


def has_shard_markers(path: str | Path) -> bool:
    """Whether folder ``path`` holds any file of a sharded checkpoint, complete or not (a
    folder without one, given as a checkpoint, is a run or checkpoints folder)."""
    return any((Path(path) / name).exists() for name in SHARDED_MARKERS)


def is_intact(path: str | Path) -> bool:
    """Whether ``path`` is a complete torch.save archive (its pickle there, every member's
    CRC checks out), or a sharded checkpoint folder with its metadata and Lightning's
    entries."""
    if is_sharded(path):  # torch's metadata (written whole), then Lightning's archive
        folder = Path(path)
        return (folder / ".metadata").is_file() and is_intact(folder / "meta.pt")
    try:
        status = os.stat(path)
        key = (str(Path(path).resolve()), status.st_mtime_ns, status.st_size, status.st_ino)
        if key in _INTACT_ARCHIVES:
            return True
        with zipfile.ZipFile(path) as archive:
            pickled = any(name.endswith("data.pkl") for name in archive.namelist())
            intact = pickled and archive.testzip() is None
    except (OSError, zipfile.BadZipFile, EOFError):
        return False
    if intact:
        _INTACT_ARCHIVES.add(key)
    return intact


#: Archives this process found intact, by path and file status (saves are renames: a new
#: save is a new inode). A fit checks its checkpoint up to three times (the command line,
#: the resume's choice, the load) and each check reads every byte: 18 GB at gpt2-xl, on
#: every rank.
_INTACT_ARCHIVES: set[tuple[str, int, int, int]] = set()


#: Where ``cofr fit`` keeps a run's checkpoints, for the messages.
RUN_CHECKPOINTS = "runs/<experiment>/<run>/checkpoints/"


def checkpoint_in(folder: Path) -> Path | None:
    """The checkpoint a user pointing at a run or checkpoints folder most likely meant."""
    for candidate in (folder / "checkpoints" / "last.ckpt", folder / "last.ckpt"):
        if candidate.is_file():
            return candidate
    found = [p for sub in (folder / "checkpoints", folder) for p in checkpoint_files(sub)]
    found = [p for p in found if p.is_file()]
    return max(found, key=newness) if found else None


def folder_hint(path: Path) -> str:
    """The message for a folder given where a checkpoint file was expected."""
    inside = checkpoint_in(path)
    hint = f"did you mean {inside}?" if inside else f"e.g. {RUN_CHECKPOINTS}last.ckpt"
    return f"{path} is a folder, not a checkpoint file: {hint}"


def missing(path: Path) -> str:
    """The message for a checkpoint path with nothing there: the closest checkpoint name
    of its folder, else the ones there, else where runs keep theirs. A bare word is taken
    for a run's name (``cofr compare`` takes those): its checkpoint is named instead, the
    one under ``runs/`` when there is one (the files of the current folder are not it)."""
    if len(path.parts) == 1 and not path.suffix:
        found = sorted(Path("runs").glob(f"*/{glob.escape(path.name)}/checkpoints/last.ckpt"))
        fix = (
            f"did you mean {' or '.join(map(str, found[:3]))}?"
            if found
            else f"give its checkpoint, {RUN_CHECKPOINTS.replace('<run>', path.name)}last.ckpt"
        )
        return f"no checkpoint file at {path}: a run's name? {fix}"
    meant = _checkpoint_meant(path)
    if meant is not None:
        return f"no checkpoint file at {path}: did you mean {meant}?"
    names = [p.name for p in checkpoint_files(path.parent)] if path.parent.is_dir() else []
    hint = did_you_mean(path.name, names) or (
        f" (checkpoints there: {', '.join(sorted(names)[:4])})"
        if names
        else f"; runs keep theirs in {RUN_CHECKPOINTS}"
    )
    return f"no checkpoint file at {path}{hint}"


def _checkpoint_meant(path: Path) -> Path | None:
    """The checkpoint file a missing ``path`` probably means: the same name in the
    folder's ``checkpoints/`` (``runs/e/r/last.ckpt``), or with the first folder that does
    not exist replaced by the closest one beside it (a mistyped run name)."""
    import difflib

    inside = path.parent / "checkpoints" / path.name
    if inside.is_file():
        return inside
    parts = path.parts
    for depth in range(1, len(parts)):
        if not Path(*parts[:depth]).is_dir():
            break
    else:
        return None
    parent = Path(*parts[: depth - 1]) if depth > 1 else Path(".")
    try:
        folders = [p.name for p in parent.iterdir() if p.is_dir()]
    except OSError:
        return None
    for close in difflib.get_close_matches(parts[depth - 1], folders, n=3):
        candidate = parent.joinpath(close, *parts[depth:])
        if candidate.is_file():
            return candidate
    return None


def check(path: str | Path) -> Path:
    """``path`` if it is an intact checkpoint file, else a CheckpointError naming it."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(missing(path))
    if path.is_dir() and not has_shard_markers(path):
        raise CheckpointError(folder_hint(path))
    if not is_intact(path):
        raise damaged(path)
    return path


#: How the checkpoint a NaN/Inf loss stops a fit with is named (``NonFiniteLossGuard``):
#: the weights from before that step, no checkpoint to resume from.
NONFINITE_PREFIX = "nonfinite-"


def nonfinite_checkpoints(run_dir: Path) -> list[Path]:
    """The checkpoints of NaN/Inf stops in ``run_dir``'s ``checkpoints/``."""
    return checkpoint_files(run_dir / "checkpoints", f"{NONFINITE_PREFIX}*.ckpt")


def candidates(run_dir: Path) -> list[Path]:
    """The run's checkpoints a resume may use, newest first (:func:`newness`)."""
    found = [
        *checkpoint_files(run_dir, "hpc_ckpt_*.ckpt"),
        *checkpoint_files(run_dir / "checkpoints"),
    ]
    found = [p for p in found if not p.name.startswith(NONFINITE_PREFIX)]
    return sorted(found, key=newness, reverse=True)


def newness(path: Path) -> tuple[float, float]:
    """How new a checkpoint of a run is, as a sort key: the step it holds, then its
    modification time. Times alone order a copied run folder wrongly (``cp -r``, ``scp``,
    ``rsync`` without ``-t`` give its files new times, in any order), and a resume or an
    evaluation then took an older step. One whose step cannot be read (a damaged
    ``last.ckpt``) counts as the newest: it is tried first, and passed over with a word."""
    step = _named_step(path)
    if step is None:
        step = _recorded_step(path)
    return (math.inf if step is None else step, path.stat().st_mtime)


def _named_step(path: Path) -> int | None:
    named = re.fullmatch(r"step(\d+)(?:-v\d+)?\.ckpt", path.name)
    return int(named.group(1)) if named else None


def _recorded_step(path: Path) -> int | None:
    """The ``global_step`` in ``path``'s pickle (a sharded checkpoint's ``meta.pt``), its
    tensors memory-mapped and the archive not checked (:func:`is_intact` reads every
    byte); None if it does not read."""
    file = path / "meta.pt" if path.is_dir() else path
    try:
        status = os.stat(file)
    except OSError:
        return None
    # A fit start orders the run's checkpoints several times: each file is unpickled once.
    key = (str(file.resolve()), status.st_mtime_ns, status.st_size, status.st_ino)
    if key not in _RECORDED_STEPS:
        try:
            saved = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except Exception:
            saved = None
        step = saved.get("global_step") if isinstance(saved, dict) else None
        _RECORDED_STEPS[key] = (
            step if isinstance(step, int) and not isinstance(step, bool) else None
        )
    return _RECORDED_STEPS[key]


#: :func:`_recorded_step`'s answers, by path and file status (a new save is a new inode).
_RECORDED_STEPS: dict[tuple[str, int, int, int], int | None] = {}


def step_of(path: Path) -> int | None:
    """The global step a checkpoint holds: from its name (``step0000030.ckpt``), else read
    from the file (memory-mapped) or a sharded folder's ``meta.pt``; None for one that
    cannot be read."""
    named = _named_step(path)
    if named is not None:
        return named
    try:
        step = saved_settings(path).get("global_step")
    except CheckpointError:
        return None
    return step if isinstance(step, int) else None


def newest_intact(run_dir: Path) -> tuple[Path | None, list[Path]]:
    """(the newest intact checkpoint of ``run_dir`` or None, the damaged newer ones)."""
    skipped: list[Path] = []
    for path in candidates(run_dir):
        if is_intact(path):
            return path, skipped
        skipped.append(path)
    return None, skipped


def load(path: str | Path, map_location: Any = "cpu") -> dict[str, Any]:
    """A checkpoint's contents, checked first and unpickled with ``weights_only=True``
    (tensors and plain containers only: nothing in the file can run code). Tensors are
    memory-mapped, not read: callers that want the metadata (step, data folder) before
    Lightning loads the weights do not read a large file twice."""
    path = check(path)
    if is_sharded(path):
        raise CheckpointError(
            f"{path} is a sharded FSDP checkpoint (one shard per rank): make it one file with "
            f"`python -m lightning.pytorch.utilities.consolidate_checkpoint {path}` and use "
            f"{path}.consolidated"
        )
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True, mmap=True)
    except Exception:
        raise damaged(path) from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        # It read whole, so not damaged: another program's file (a bare state_dict).
        raise not_fit_checkpoint(path, checkpoint)
    return checkpoint


def saved_settings(path: str | Path) -> dict[str, Any]:
    """What a checkpoint records beside its weights (``hyper_parameters``,
    ``model_config``, ...): a file's contents (:func:`load`, tensors memory-mapped) or a
    sharded FSDP checkpoint's ``meta.pt``, Lightning's entries beside the shards."""
    if not is_sharded(path):
        return load(path)
    meta = Path(path) / "meta.pt"
    try:
        saved = torch.load(meta, map_location="cpu", weights_only=True)
    except Exception:
        raise damaged(Path(path)) from None
    if not isinstance(saved, dict):
        raise not_fit_checkpoint(meta, saved)
    return saved


def saved_shapes(path: str | Path, saved: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The shapes of the tensors in the ``state_dict`` of checkpoint ``path`` (``saved``:
    :func:`saved_settings`'s reading of it): a file's own, or those torch's
    distributed-checkpoint metadata (``.metadata``) records for a sharded folder's
    shards, where FSDP saves the state_dict under ``model``."""
    if not is_sharded(path):
        state = uncompiled(saved.get("state_dict") or {})
        return {
            key: tuple(value.shape) for key, value in state.items() if isinstance(value, Tensor)
        }
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    try:
        entries = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    except Exception:
        raise damaged(Path(path)) from None
    shapes = {
        key.removeprefix("model."): tuple(entry.size)
        for key, entry in entries.items()
        if key.startswith("model.") and isinstance(entry, TensorStorageMetadata)
    }
    return uncompiled(shapes)


def not_fit_checkpoint(path: Path, contents: Any) -> CheckpointError:
    """The error for a torch file that loads but is not what ``cofr fit`` saves."""
    if isinstance(contents, dict) and contents:
        tensors = all(isinstance(value, Tensor) for value in contents.values())
        held = "a bare state_dict" if tensors else "a dict without state_dict"
    else:
        held = f"a {type(contents).__name__}"
    return CheckpointError(
        f"{path} is not a cofr fit checkpoint: it holds {held}, no hyper-parameters; give "
        "a checkpoint cofr fit wrote (runs/<experiment>/<run>/checkpoints/last.ckpt)"
    )


#: Key prefix of the parameters of a model compiled by wrapping (``torch.compile(model)``).
COMPILED_PREFIX = "_orig_mod."
#: LanguageModel keeps the network as ``self.model``: its checkpoint keys start so.
MODEL_PREFIX = "model."


def uncompiled(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """A state dict without torch.compile's wrapper prefix in its keys (checkpoints written
    before models compiled in place)."""
    if not any(COMPILED_PREFIX in key for key in state):
        return state
    return {key.replace(COMPILED_PREFIX, ""): value for key, value in state.items()}


def check_denominators(checkpoint: dict[str, Any], model: nn.Module) -> None:
    """Checkpoints from before positive denominators became the default were trained with
    the paper's: their weights mean something else in a positive-denominator model."""
    saved = checkpoint.get("model_config")
    if saved is None or "ladder_denominators" in saved:
        return
    if any(
        isinstance(layer, LadderLayer) and layer.denominator_kind != "paper"
        for layer in model.modules()
    ):
        raise ConfigError(
            "this checkpoint's ladders were trained with the paper's partial denominators "
            "(it predates positive ones, now the default): load it with "
            "model.config.ladder_denominators: paper"
        )


def check_same_network(
    path: str | Path,
    module: nn.Module,
    saved: dict[str, Any] | None = None,
    starting: bool = False,
) -> int | None:
    """Refuse a checkpoint whose parameters do not fit ``module`` (a LanguageModel);
    return its global step (None if it records none). ``saved``: what it records, if
    the caller has read it (:func:`saved_settings`: a file's contents, or a sharded FSDP
    folder's ``meta.pt``, whose shapes come from the shards' metadata). ``starting``: the
    checkpoint starts a new run's weights (``model.init_from``) rather than resuming one,
    which the fix names.

    Resuming with other model settings would fail only after the run's config.yaml and
    MLflow record had been rewritten, in a loading error that names tensors, not
    settings. Parameters must match by name and shape; buffers that Lightning's restore
    tolerates (the output ranges of older checkpoints) are not compared.
    """
    saved = saved_settings(path) if saved is None else saved
    step = saved.get("global_step")
    step = step if isinstance(step, int) else None
    theirs = saved_shapes(path, saved)
    ours = {name: tuple(p.shape) for name, p in module.named_parameters()}
    known = set(module.state_dict())
    differ = [n for n, shape in ours.items() if theirs.get(n) != shape]
    differ += [key for key in theirs if key not in known]
    if not differ:
        return step
    first = differ[0]
    new_run = "" if starting else ", or start a new run with another --run.name"
    ours_config = getattr(module, "model_config", None)
    theirs_config = saved.get("model_config")
    if isinstance(ours_config, ModelConfig) and isinstance(theirs_config, dict):
        built = ours_config.to_dict()
        settings = changed_settings(theirs_config, built)
        if settings:  # the record names them: the options that rebuild its network
            raise ConfigError(
                f"{path} holds another network than this run builds ({len(differ)} "
                f"parameter(s) differ, e.g. {first}); it was trained with "
                f"{_as_trained(theirs_config, built, settings, starting, saved, module)}"
                f"{new_run}"
            )
    hparams = saved.get("hyper_parameters") or {}
    given = overrides_dict(hparams.get("config"))
    trained = f"model.preset {hparams.get('preset')!r}" + (
        f", model.config {given}" if given else ""
    )
    folders = (Path(path).parent, Path(path).parent.parent)  # hpc_ckpt or checkpoints/
    config = next((f / "config.yaml" for f in folders if (f / "config.yaml").is_file()), None)
    where = f" (all of the run's settings: --config {config})" if config else ""
    raise ConfigError(
        f"{path} holds another network than this run builds ({len(differ)} parameter(s) "
        f"differ, e.g. {first}: {theirs.get(first, 'absent')} in the checkpoint, "
        f"{ours.get(first, 'absent')} here); it was trained with {trained}: give those "
        f"model settings{where}{new_run}"
    )


#: Model settings that choose how a function is computed, not which: a resume may change
#: them (a CPU run resumed on a GPU with the Triton kernels).
EXECUTION_SETTINGS = frozenset({"ladder_impl"})


def changed_settings(theirs: dict[str, Any], ours: dict[str, Any]) -> list[str]:
    """The model settings (ModelConfig fields) whose values differ, sorted; a setting one
    side lacks (newer than a checkpoint) and :data:`EXECUTION_SETTINGS` are not compared."""
    unread = unused_settings(theirs)  # recorded before they were refused: no difference
    return [
        key
        for key in sorted(theirs)
        if key in ours
        and key not in EXECUTION_SETTINGS
        and key not in unread
        and theirs[key] != ours[key]
    ]


def check_same_settings(
    path: str | Path, saved: dict[str, Any], config: ModelConfig, module: nn.Module | None = None
) -> None:
    """Refuse to resume a checkpoint whose model was trained with other settings of the
    same shapes (``ladder_floor``, ``ladder_grad``, ``dropout``...): the weights would go
    on training as another function, while the run's MLflow params keep the first ones.
    Checkpoints without a recorded ``model_config`` are not compared. ``module``: the
    LanguageModel built, whose preset and overrides the fix starts from."""
    theirs = saved.get("model_config")
    if not isinstance(theirs, dict):
        return
    ours = config.to_dict()
    differ = changed_settings(theirs, ours)
    if not differ:
        return
    raise ConfigError(
        f"{path} was trained with other model settings than this resume builds: "
        f"{_as_trained(theirs, ours, differ, False, saved, module)}, or start a new run with "
        "another --run.name"
    )


def _as_trained(
    theirs: dict[str, Any],
    ours: dict[str, Any],
    differ: list[str],
    starting: bool = False,
    saved: dict[str, Any] | None = None,
    module: nn.Module | None = None,
) -> str:
    """The settings ``differ`` as trained and as built, and the options that give the
    trained ones (also where the preset itself has changed since, so that the run's
    config.yaml builds today's); ``starting``: for a new run's start (``model.init_from``)
    rather than a resume.

    A setting the checkpoint left unset (None: "the architecture's default") has no
    ``--model.config`` option (None there means "the preset's value"): the fix names the
    checkpoint's preset, ``saved``'s, in place of the one ``module`` was built from, or
    the override to drop."""
    shown = differ[:4]
    more = f" and {len(differ) - len(shown)} more" if len(differ) > len(shown) else ""
    changes = ", ".join(f"{k} {theirs[k]!r} (here {ours[k]!r})" for k in shown)
    verb = "start from it with" if starting else "resume with"
    options, unset = _trained_options(theirs, differ, saved, module)
    fix = f"{verb} {' '.join(options)}" if options else verb.removesuffix(" with")
    if unset:
        dropped = " ".join(f"--model.config.{k}" for k in unset)
        fix += f" and without {dropped}" if options else f" without {dropped}"
    return f"{changes}{more}: {fix}"


def _trained_options(
    theirs: dict[str, Any],
    differ: list[str],
    saved: dict[str, Any] | None,
    module: nn.Module | None,
) -> tuple[list[str], list[str]]:
    """(the options that rebuild the trained settings, the overrides to drop): the
    checkpoint's preset first where the run now names another one and a trained setting
    is unset, then ``--model.config.KEY VALUE`` for what still differs."""
    import json
    import shlex

    trained = (saved or {}).get("hyper_parameters") or {}
    built = getattr(module, "hparams", None) or {}
    their_preset, our_preset = trained.get("preset"), built.get("preset")
    given = overrides_dict(built.get("config"))
    options: list[str] = []
    still, in_effect = differ, our_preset
    unset_here = any(theirs[k] is None and k not in given for k in differ)
    if "preset" in trained and their_preset != our_preset and unset_here:
        try:  # the run's own overrides on the checkpoint's preset
            rebuilt = model_config_of({"preset": their_preset, "config": given}, False).to_dict()
        except (ConfigError, ValueError, KeyError, TypeError):
            rebuilt = None
        if rebuilt is not None:
            options.append(f"--model.preset {'null' if their_preset is None else their_preset}")
            still, in_effect = changed_settings(theirs, rebuilt), their_preset
    unset = [k for k in still if theirs[k] is None and k in given]
    for key in still:
        if theirs[key] is not None:
            value = theirs[key]
            text = value if isinstance(value, str) else json.dumps(value)
            options.append(f"--model.config.{key} {shlex.quote(text)}")
        elif key not in given:  # the preset gives it now: no option leaves it unset
            options.append(
                f"--model.preset null --model.config <the checkpoint's model_config> "
                f"({key} is set by model.preset {in_effect!r} now)"
            )
            break
    return options, unset


def restore_model(checkpoint: dict[str, Any]) -> tuple[nn.Module, ModelConfig]:
    """(the network, its ModelConfig) of a ``cofr fit`` checkpoint, weights loaded, on CPU.

    Built as the checkpoint trained (:func:`trained_model_config`) and loaded strictly,
    as ``LanguageModel.load_from_checkpoint`` does (compiled and pre-output-clipping
    checkpoints included), without importing Lightning.
    """
    hparams = checkpoint.get("hyper_parameters")
    if not isinstance(hparams, dict) or "preset" not in hparams:
        raise CheckpointError(
            "this checkpoint has no model hyperparameters (model.preset, model.config): "
            "it was not written by cofr fit"
        )
    config = trained_model_config(checkpoint, hparams)
    model = build_model(config)
    check_denominators(checkpoint, model)
    state = uncompiled(checkpoint["state_dict"])
    try:
        model.load_state_dict({key.removeprefix(MODEL_PREFIX): v for key, v in state.items()})
    except RuntimeError as error:  # "Error(s) in loading state_dict", a page of key names
        raise CheckpointError(
            f"the checkpoint's weights do not fit the model its settings build: "
            f"{first_line(error).rstrip(':. ')} ({_first_key_problem(error)}); was it "
            "written by another version of cofr? Load it with that one"
        ) from None
    return model, config


def load_initial_weights(
    path: str | Path, module: nn.Module, saved: dict[str, Any] | None = None
) -> list[str]:
    """Copy the network weights of the ``cofr fit`` checkpoint ``path`` into ``module`` (a
    LanguageModel, its network as ``module.model``) to start a new run from them
    (``model.init_from``): the network's parameters and buffers only, not the
    optimizer's moments, the step, the schedule or the data position.

    The network must be the one the checkpoint trained, by parameter name and shape;
    settings that keep the shapes may differ (dropout, a ladder floor, the gradient
    rule): they are returned, as "key trained (here now)" texts, for the caller to say.
    ``saved``: its contents, if the caller has read them (:func:`load`).
    """
    saved = load(path) if saved is None else saved
    check_same_network(path, module, saved, starting=True)
    network = getattr(module, "model", module)
    check_denominators(saved, network)
    state = uncompiled(saved["state_dict"])
    weights = {
        k.removeprefix(MODEL_PREFIX): v for k, v in state.items() if k.startswith(MODEL_PREFIX)
    }
    try:
        network.load_state_dict(weights)
    except RuntimeError as error:  # buffers, which check_same_network does not compare
        raise CheckpointError(
            f"{path}: its weights do not fit this run's network: "
            f"{first_line(error).rstrip(':. ')} ({_first_key_problem(error)})"
        ) from None
    theirs = saved.get("model_config")
    ours = getattr(module, "model_config", None)
    if not isinstance(theirs, dict) or not isinstance(ours, ModelConfig):
        return []
    built = ours.to_dict()
    return [f"{k} {theirs[k]!r} (here {built[k]!r})" for k in changed_settings(theirs, built)]


def _first_key_problem(error: RuntimeError) -> str:
    lines = [line.strip() for line in str(error).splitlines()[1:] if line.strip()]
    return lines[0][:200] if lines else "no detail"


def trained_model_config(
    checkpoint: dict[str, Any], model: dict[str, Any] | None, where: str = "the checkpoint"
) -> ModelConfig:
    """The ModelConfig ``checkpoint`` trained with: the ``model_config`` it recorded, laid
    over what its ``model`` section (``preset``, ``config``) builds today.

    A preset or a default changed since the training (a layer count, a ladder floor)
    would otherwise rebuild another model under the trained weights: one that fails to
    load, or one that loads and computes another function. Fields newer than the
    checkpoint keep the section's values, and so do :data:`EXECUTION_SETTINGS` (how to
    compute, chosen where the model runs). A section that builds nothing today (a preset
    removed since) leaves the record alone, with ModelConfig's defaults for newer fields;
    where neither builds, the section's error is raised. Without a record: the section's
    model. ``where`` names the checkpoint in errors.
    """
    saved = checkpoint.get("model_config")
    if not isinstance(saved, dict):
        return model_config_of(model)
    unbuilt: ConfigError | None = None
    try:
        built: ModelConfig | None = model_config_of(model)
    except ConfigError as error:
        built, unbuilt = None, error
    ours = built.to_dict() if built is not None else {}
    fields = ModelConfig.field_names()
    recorded = {k: v for k, v in saved.items() if k in fields and k not in EXECUTION_SETTINGS}
    # Settings its architecture never read, recorded before they were refused: dropped.
    recorded |= dict.fromkeys(unused_settings(recorded))
    if built is not None and not changed_settings(recorded, ours):
        return built
    try:
        return ModelConfig.from_dict({**ours, **recorded})
    except ConfigError as error:
        if unbuilt is not None:  # neither builds: the section's own error (a mixer of
            raise unbuilt from None  # one's own that is not registered, say)
        raise CheckpointError(
            f"the model_config recorded in {where} is not one this version of cofr builds "
            f"({error}): was it written by another version? Load it with that one"
        ) from None
