"""``cofr export hf --ckpt CKPT OUT_DIR``: a checkpoint as a Hugging Face ``transformers`` folder.

The folder loads with ``AutoModelForCausalLM.from_pretrained(OUT_DIR,
trust_remote_code=True)`` on a machine with torch and transformers but without
cofrgenet: the model code (:mod:`cofrgenet.export.hf_modeling`, copied as
``modeling_cofrgenet.py``) imports nothing else. Written files:

* ``config.json``: cofrgenet's ModelConfig under ``cofr``, Hugging Face names, auto_map;
* ``model.safetensors``: the weights (float32; a tied head is stored once, as the
  embedding), including the ladder layers' clipping ranges;
* ``modeling_cofrgenet.py``, ``generation_config.json``, ``README.md``;
* ``tokenizer.json`` + ``tokenizer_config.json`` when the run's tokenizer is found
  (byte, bpe and gpt2 tokenizers all export; ``AutoTokenizer`` loads them).

After writing, the export is loaded back through transformers and its logits compared
with the checkpoint's (max abs difference <= ``tolerance`` times the largest |logit|, or
1 when smaller; 1e-5 by default); a mismatch
raises :class:`ExportMismatch`. The files are written into a hidden temporary folder
beside ``OUT_DIR`` and moved into it only once checked: a failed export (a mismatch, an
interrupt) leaves ``OUT_DIR`` as it was, an earlier export in it included. Models the modeling file does not
re-implement (a custom architecture or mixer registered by the user) are refused with
:class:`UnsupportedModel` before anything is written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cofrgenet.atomic import missing_folders, remove_empty_folders, why_no_folder
from cofrgenet.dataclass_options import (
    add_checkpoint_argument,
    at_least,
    checkpoint_given,
    show_required,
)
from cofrgenet.errors import UserError
from cofrgenet.signals import Terminated, sigterm_raises

if TYPE_CHECKING:
    import torch
    from torch import nn

    from cofrgenet.data.tokenizer import Tokenizer
    from cofrgenet.models import ModelConfig

MODELING_FILE = "modeling_cofrgenet.py"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
#: Every file an export may write (removed first by ``overwrite``).
EXPORT_FILES = (
    "config.json",
    "generation_config.json",
    WEIGHTS_FILE,
    MODELING_FILE,
    "README.md",
    *TOKENIZER_FILES,
)
#: The architectures hf_modeling.py re-implements (its own TRANSFORMER_ARCHS, which a test
#: holds equal: the modeling file is standalone and imports nothing of cofrgenet).
TRANSFORMER_ARCHS = ("gpt", "llama")
SUPPORTED_ARCHS = (*TRANSFORMER_ARCHS, "rnn", "lstm", "gru")
DEFAULT_TOLERANCE = 1e-5
#: The first lines of an export's README.md, and its record of the weights it wrote.
README_MARK = "# CoFrGeNet export\n\nExported by `cofr export hf`"
WEIGHTS_HASH = re.compile(rf"`{re.escape(WEIGHTS_FILE)}`, sha256 `([0-9a-f]{{64}})`")
#: The export check's batch: two sequences of this many tokens (the block when shorter),
#: then one of the whole block (learned positions, CAttn's per-position parameters).
VERIFY_LENGTH = 128
AUTO_MAP = {
    "AutoConfig": "modeling_cofrgenet.CofrGeNetConfig",
    "AutoModelForCausalLM": "modeling_cofrgenet.CofrGeNetForCausalLM",
}


class ExportError(UserError):
    """An export that cannot be written; the message says why and what to do."""


class UnsupportedModel(ExportError, ValueError):
    """The checkpoint's architecture or a mixer has no Hugging Face re-implementation."""


class ExportMismatch(ExportError):
    """The exported model's logits differ from the checkpoint's by more than the tolerance."""


class OutputExists(ExportError, FileExistsError):
    """OUT_DIR already holds files (pass --overwrite to replace an earlier export)."""


class CheckpointNotFound(ExportError, FileNotFoundError):
    """CKPT is not a file."""


class TokenizerMismatch(ExportError, ValueError):
    """The tokenizer to export has more tokens than the model's vocabulary."""


class TransformersMissing(ExportError, ImportError):
    """The export needs the ``transformers`` package, which is not installed."""


def _require_transformers() -> None:
    import importlib.util

    for package in ("transformers", "safetensors"):
        if importlib.util.find_spec(package) is None:
            raise TransformersMissing(
                f"cofr export hf needs the {package} package (to write and check the "
                "export): pip install transformers"
            )


@dataclass
class ExportReport:
    """What an export wrote.

    tokenizer: the kind exported ("byte", "bpe", "gpt2"), or None with ``tokenizer_note``
    saying why not. max_abs_diff: the logits check's result (None when skipped).
    """

    out_dir: Path
    files: list[str] = field(default_factory=list)
    tokenizer: str | None = None
    tokenizer_note: str | None = None
    max_abs_diff: float | None = None


# The command ---------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    ckpt = add_checkpoint_argument(parser, positional=True)
    parser.add_argument("out_dir", help="folder to write (created; must be empty or an export)")
    tokenizer = parser.add_mutually_exclusive_group()
    tokenizer.add_argument(
        "--tokenizer",
        default=None,
        metavar="DIR",
        help="prepared data folder whose tokenizer to export (default: the run's own)",
    )
    tokenizer.add_argument(
        "--no-tokenizer", action="store_true", help="write the model only, no tokenizer files"
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace the files of an earlier export"
    )
    parser.add_argument(
        "--no-verify",
        action="store_true",
        help="skip loading the export back and comparing its logits with the checkpoint's",
    )
    parser.add_argument(
        "--tolerance",
        type=at_least(float, 0, " (a max abs difference)"),
        default=None,
        help="max abs logit difference the check accepts, relative to the largest |logit| "
        f"when above 1 (default: {DEFAULT_TOLERANCE:g})",
    )
    show_required(parser, ckpt)


def run(args: argparse.Namespace) -> int:
    usage = f"cofr export hf --ckpt CKPT OUT_DIR (the one word given, {args.out_dir}, is OUT_DIR)"
    if args.out_dir is not None and not str(args.out_dir).strip():  # Path("") is the cwd
        raise ExportError("OUT_DIR is empty: name the folder to write the export into")
    if args.no_verify and args.tolerance is not None:
        raise ExportError("--tolerance sets the check that --no-verify skips: drop one of them")
    tolerance = DEFAULT_TOLERANCE if args.tolerance is None else args.tolerance
    ckpt = checkpoint_given(args, usage)
    if not Path(ckpt).exists() and args.out_dir and Path(args.out_dir).is_file():
        raise ExportError(
            f"no checkpoint file at {ckpt}, and OUT_DIR {args.out_dir} is a file: the other "
            f"way round? cofr export hf --ckpt {args.out_dir} {ckpt}"
        )
    try:
        # SLURM's time limit or scancel: the work folder beside OUT_DIR is removed and an
        # earlier export put back, as for Ctrl-C, not left with the weights in it.
        with sigterm_raises():
            report = export_hf(
                ckpt,
                args.out_dir,
                tokenizer_dir=args.tokenizer,
                with_tokenizer=not args.no_tokenizer,
                overwrite=args.overwrite,
                verify=not args.no_verify,
                tolerance=tolerance,
            )
    except Terminated:
        print(f"cofr export hf: stopped by SIGTERM: {args.out_dir} as it was", file=sys.stderr)
        raise
    print(f"wrote {report.out_dir}: {', '.join(report.files)}")
    if report.tokenizer is not None:
        print(
            f"tokenizer: {report.tokenizer} (AutoTokenizer.from_pretrained(FOLDER, "
            "trust_remote_code=True) loads it, as AutoModelForCausalLM does the model)"
        )
    else:
        print(f"tokenizer: not exported ({report.tokenizer_note})")
    if report.max_abs_diff is not None:
        print(
            f"checked: logits match the checkpoint's (max abs difference {report.max_abs_diff:.2e})"
        )
    print(
        "load it with transformers.AutoModelForCausalLM.from_pretrained("
        f"{str(report.out_dir)!r}, trust_remote_code=True)"
    )
    return 0


# Python API ----------------------------------------------------------------------------


def export_hf(
    ckpt_path: str | Path,
    out_dir: str | Path,
    *,
    tokenizer_dir: str | Path | None = None,
    with_tokenizer: bool = True,
    overwrite: bool = False,
    verify: bool = True,
    tolerance: float = DEFAULT_TOLERANCE,
) -> ExportReport:
    """Write checkpoint ``ckpt_path`` as a Hugging Face folder ``out_dir``; returns what
    was written (``out_dir``, ``files``, the tokenizer exported or why not, the check's
    largest logit difference).

    tokenizer_dir: a prepared data folder whose tokenizer to export instead of the run's.
    Without it, a run's data folder that is not on this machine is skipped (the model is
    still written); one that is there but holds another tokenizer, or is damaged, is an
    error, as in ``cofr generate``.
    """
    from cofrgenet.training import pretrained
    from cofrgenet.training.pretrained import load_checkpoint

    _require_transformers()
    try:
        ckpt = pretrained.checkpoint_file(ckpt_path)
    except pretrained.CheckpointNotFound as error:
        raise CheckpointNotFound(str(error)) from None
    # Refuse early, before loading weights, when the output folder is taken.
    _check_out_dir(Path(out_dir), overwrite)
    loaded = load_checkpoint(
        ckpt, device="cpu", tokenizer_dir=None if tokenizer_dir is None else str(tokenizer_dir)
    )
    tokenizer, note = None, "--no-tokenizer"
    if with_tokenizer:
        try:
            tokenizer = loaded.tokenizer
        except pretrained.TokenizerNotFound as error:
            if tokenizer_dir is not None:  # asked for explicitly: an error, not a note
                raise
            # Only a folder not found is a note: one prepared again with another
            # tokenizer (TokenizerMismatch) or damaged (TokenizerUnreadable) is refused,
            # as cofr generate does.
            note = str(error)
        except pretrained.TokenizerMismatch as error:  # export has one more way out
            raise pretrained.TokenizerMismatch(
                f"{error}, or --no-tokenizer to write the model alone"
            ) from None
    return export_model(
        loaded.model,
        loaded.config,
        out_dir,
        tokenizer=tokenizer,
        tokenizer_note=note,
        overwrite=overwrite,
        verify=verify,
        tolerance=tolerance,
        source=str(ckpt),
        n_real=loaded.trained_with.get("vocab_size"),
        eos_id=trained_eos_id(loaded.trained_with),
        trained_length=loaded.trained_length,
    )


#: The end-of-text id of cofrgenet's bpe: train_bpe's only special token, trained first.
BPE_EOS_ID = 0


def trained_eos_id(trained_with: dict[str, Any]) -> int | None:
    """The end-of-text id of the tokenizer a checkpoint records (``trained_with``: its kind
    and size; no id is stored, but every kind fixes it), None for a checkpoint naming none."""
    from cofrgenet.data.tokenizer import GPT2_EOS_ID, ByteTokenizer

    return {"byte": ByteTokenizer().eos_id, "gpt2": GPT2_EOS_ID, "bpe": BPE_EOS_ID}.get(
        trained_with.get("tokenizer", "")
    )


def export_model(
    model: nn.Module,
    config: ModelConfig,
    out_dir: str | Path,
    *,
    tokenizer: Tokenizer | None = None,
    tokenizer_note: str | None = None,
    overwrite: bool = False,
    verify: bool = True,
    tolerance: float = DEFAULT_TOLERANCE,
    source: str | None = None,
    n_real: int | None = None,
    eos_id: int | None = None,
    trained_length: int | None = None,
) -> ExportReport:
    """Write ``model`` (built from ``config``) as a Hugging Face folder ``out_dir``.

    The model is read, never changed (its ladder ``impl`` is switched to the eager
    continuant for the check and restored). ``n_real``: without a ``tokenizer``, the size
    of the one the model trained with, so that generation never picks the padded ids
    beyond it (as with a tokenizer); ``eos_id``: likewise its end-of-text id, where
    ``generate`` stops (as ``cofr generate``); ``trained_length``: the sequence length the
    model trained at, when shorter than its block: ``generate`` reads at most that many
    tokens (as ``cofr generate``: later positions never trained).
    """
    _require_transformers()
    check_exportable(model, config)
    if tokenizer is not None and tokenizer.vocab_size > config.vocab_size:
        raise TokenizerMismatch(
            f"the {tokenizer.kind} tokenizer has {tokenizer.vocab_size} tokens but the model "
            f"only {config.vocab_size}: it is not the model's tokenizer; pass the data folder "
            "the model trained on (--tokenizer DIR) or --no-tokenizer"
        )
    out = Path(out_dir)
    _check_out_dir(out, overwrite)
    if out.is_symlink():  # the folder it names is replaced, not the link
        out = out.resolve()
    state = export_state_dict(model)
    _check_state_dict(state, config)
    _check_finite(model)
    created = missing_folders(out.parent)
    # Written and checked beside OUT_DIR, then moved in: a failure leaves OUT_DIR as it was.
    work = out.parent / f".{out.name}.export-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        work.mkdir()  # not mkdtemp: the folder keeps the usual permissions once moved
    except OSError as error:
        raise ExportError(
            f"cannot write the export to {out}: {why_no_folder(work, error)}; choose another folder"
        ) from None
    try:
        report = ExportReport(
            out_dir=Path(out_dir), tokenizer_note=None if tokenizer is not None else tokenizer_note
        )
        # Without a tokenizer, the end-of-text id the checkpoint records: HF generate
        # would otherwise never stop where cofr generate does.
        eos = eos_id if tokenizer is None else tokenizer.eos_id
        n_ids = n_real if tokenizer is None else tokenizer.vocab_size
        _write_config(work, config, eos, n_ids, trained_length)
        _write_weights(work, state)
        shutil.copyfile(Path(__file__).with_name("hf_modeling.py"), work / MODELING_FILE)
        if tokenizer is not None:
            export_tokenizer(tokenizer, work, model_max_length=_max_length(config))
            report.tokenizer = tokenizer.kind
        if verify:
            report.max_abs_diff = verify_export(model, config, work, tolerance)
        _write_readme(
            work, config, report, source, out.resolve().name, _clips_ladders(model), eos,
            trained_length,
        )  # fmt: skip
        report.files = sorted(p.name for p in work.iterdir() if p.name in EXPORT_FILES)
        _move_into_place(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        remove_empty_folders(created)  # the parents this call made, if still empty
        raise
    return report


def _move_into_place(work: Path, out: Path) -> None:
    """Make the checked export in ``work`` (a sibling of ``out``) the contents of ``out``:
    one rename for a new folder. Into an existing one (empty, or an earlier export with
    ``--overwrite``), file by file, the folder kept (it may be the working directory):
    the earlier export's files go aside first and come back if the move fails or is
    interrupted, so ``out`` never ends as a mix of two exports."""
    if not out.exists():
        os.replace(work, out)
        return
    aside = work.with_name(f"{work.name}.replaced")
    aside.mkdir()
    old = sorted(p.name for p in out.iterdir() if p.name in EXPORT_FILES)
    new = sorted(p.name for p in work.iterdir())
    try:
        for name in old:
            os.replace(out / name, aside / name)
        for name in new:  # only once every old file is aside
            os.replace(work / name, out / name)
    except BaseException:
        # Undone by where the files are, not by lists of those moved: a signal between a
        # rename and its entry in a list left that file out of the rollback.
        for name in new:  # back into work, which the caller removes
            if not (work / name).exists() and (out / name).exists():
                os.replace(out / name, work / name)
        for path in aside.iterdir():
            os.replace(path, out / path.name)
        with contextlib.suppress(OSError):
            aside.rmdir()
        raise
    shutil.rmtree(aside, ignore_errors=True)
    work.rmdir()


# Checks --------------------------------------------------------------------------------


def check_exportable(model: nn.Module, config: ModelConfig) -> None:
    """Raise :class:`UnsupportedModel` unless every part of ``model`` is re-implemented in
    ``hf_modeling.py`` (the built-in architectures and mixers, built by the built-in
    builders)."""
    from cofrgenet.models import GPT, RecurrentLM
    from cofrgenet.nn import (
        MLP,
        CAttnM,
        CAttnU,
        CausalSelfAttention,
        Cffn,
        DenseSynthesizer,
        SparseCausalSelfAttention,
        SwiGLU,
    )

    hint = (
        "the Hugging Face export re-implements only the built-in ones (cofr models list); "
        "add it to src/cofrgenet/export/hf_modeling.py or train a built-in model"
    )
    if config.arch not in SUPPORTED_ARCHS:
        raise UnsupportedModel(f"cannot export architecture {config.arch!r}: {hint}")
    expected_model = GPT if config.arch in TRANSFORMER_ARCHS else RecurrentLM
    if type(model) is not expected_model:
        raise UnsupportedModel(
            f"cannot export a {type(model).__name__} as arch {config.arch!r} (its builder was "
            f"replaced; expected {expected_model.__name__}): {hint}"
        )
    if expected_model is RecurrentLM:
        return
    attention_types: dict[str, type] = {
        "softmax": CausalSelfAttention,
        "sparse_strided": SparseCausalSelfAttention,
        "sparse_fixed": SparseCausalSelfAttention,
        "synthesizer_dense": DenseSynthesizer,
        "cattn_u": CAttnU,
        "cattn_m": CAttnM,
    }
    ffn_types: dict[str, type] = {"mlp": MLP, "swiglu": SwiGLU, "cffn": Cffn}
    for i, block in enumerate(model.transformer.h):
        for kind, name, module, types in (
            ("attention", config.attention_for(i), block.attn, attention_types),
            ("ffn", config.ffn_for(i), block.mlp, ffn_types),
        ):
            if name not in types:
                raise UnsupportedModel(f"cannot export {kind} mixer {name!r} (layer {i}): {hint}")
            if type(module) is not types[name]:
                other = [n for n, t in types.items() if t is type(module)]
                if other:  # a built-in layer, of another name: the config is another model's
                    raise UnsupportedModel(
                        f"the config does not describe this model: its {kind} of layer {i} "
                        f"is {name!r}, the model's is a {type(module).__name__} (the "
                        f"built-in {' / '.join(repr(n) for n in other)}); pass the config "
                        "the model was built from"
                    )
                raise UnsupportedModel(
                    f"cannot export {kind} mixer {name!r} of layer {i}: it is a "
                    f"{type(module).__name__}, not the built-in {types[name].__name__} "
                    f"(a custom builder replaced it): {hint}"
                )
        if isinstance(block.attn, SparseCausalSelfAttention):
            _check_sparse(block.attn, config, i)


def _check_sparse(attn: Any, config: ModelConfig, layer: int) -> None:
    """The exported sparse mask is rebuilt from the config: it must say the same."""
    from cofrgenet.nn.sparse_attention import default_stride, default_summary

    stride = config.sparse_stride or default_stride(config.block_size)
    summary = config.sparse_summary or default_summary(stride)
    if (attn.stride, attn.summary) != (stride, summary):
        raise UnsupportedModel(
            f"layer {layer}'s sparse attention has stride {attn.stride}, summary "
            f"{attn.summary} but its config says {stride}, {summary}; rebuild the model from "
            "its config before exporting"
        )


def _check_out_dir(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise OutputExists(f"{out} is a file; give a folder to write the export into")
    if not out.is_dir():
        return
    present = sorted(p.name for p in out.iterdir())
    if not present:
        return
    if not overwrite:
        raise OutputExists(
            f"{out} is not empty ({', '.join(present[:5])}{'...' if len(present) > 5 else ''}); "
            "choose a new folder, or pass --overwrite to replace an earlier export"
        )
    foreign = [name for name in present if name not in EXPORT_FILES]
    if foreign:
        raise OutputExists(
            f"--overwrite replaces an earlier export only, but {out} also holds "
            f"{', '.join(foreign[:5])}; choose a new or empty folder"
        )
    if MODELING_FILE not in present:  # a user's own README.md / config.json, not an export
        raise OutputExists(
            f"--overwrite replaces an earlier export only, and {out} holds none (no "
            f"{MODELING_FILE}): its {', '.join(present[:5])} stay; choose a new or empty folder"
        )
    # transformers' save_pretrained writes the same names (modeling file included): a model
    # fine-tuned from an export is told by its README (none) or its weights (not the hash
    # the export's README records).
    readme = out / "README.md"
    text = readme.read_text(errors="replace") if readme.is_file() else ""
    if README_MARK not in text:
        raise OutputExists(
            f"--overwrite replaces an earlier export only, and {out} has no export's "
            "README.md (a model saved by transformers' save_pretrained, fine-tuned?): its "
            "files stay; choose a new or empty folder"
        )
    recorded = WEIGHTS_HASH.search(text)
    weights = out / WEIGHTS_FILE
    if recorded and weights.is_file() and file_sha256(weights) != recorded.group(1):
        raise OutputExists(
            f"--overwrite replaces an earlier export only, and {weights} is not the one the "
            "export wrote (changed since: fine-tuned?); choose a new or empty folder"
        )


def file_sha256(path: Path) -> str:
    """The hex SHA-256 of a file, read in 1 MiB pieces."""
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as file:
        while piece := file.read(1 << 20):
            digest.update(piece)
    return digest.hexdigest()


def _tied(model: nn.Module) -> bool:
    """Whether the head's weight is another parameter of the model (the embedding)."""
    head = model.get_parameter("lm_head.weight")
    shared = model.named_parameters(remove_duplicate=False)
    return any(p is head for name, p in shared if name != "lm_head.weight")


def export_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict as the export stores it: float32, contiguous, detached
    copies; a tied head's ``lm_head.weight`` left out (it is the embedding)."""
    import torch

    state = {}
    tied = _tied(model)
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and tied:
            continue
        value = tensor.detach().to("cpu")
        if value.is_floating_point():
            value = value.to(torch.float32)
        state[name] = value.contiguous().clone()
    return state


def _hf_model_on_meta(config: ModelConfig, eos: int | None = None) -> nn.Module:
    """The exported model class built for ``config`` on the meta device (shapes only)."""
    import torch

    from cofrgenet.export import hf_modeling

    with torch.device("meta"):
        return hf_modeling.CofrGeNetForCausalLM(_hf_config(config, eos))


def _check_state_dict(state: dict[str, torch.Tensor], config: ModelConfig) -> None:
    """The exported model must hold exactly these tensors, with these shapes."""
    expected = {k: tuple(v.shape) for k, v in _hf_model_on_meta(config).state_dict().items()}
    ours = {k: tuple(v.shape) for k, v in state.items()}
    if expected != ours:
        missing = sorted(set(expected) - set(ours))
        extra = sorted(set(ours) - set(expected))
        shapes = sorted(k for k in set(ours) & set(expected) if ours[k] != expected[k])
        raise UnsupportedModel(
            "the checkpoint's tensors do not match the exported model's (missing "
            f"{missing[:3]}, unexpected {extra[:3]}, shapes differ {shapes[:3]}); the model "
            "has parts the Hugging Face export does not re-implement"
        )


def _check_finite(model: nn.Module) -> None:
    """Weights that are NaN or Inf (a run that diverged saves them) export a model that
    computes nothing: refused, with or without the logits check. (Buffers may be
    infinite: a ladder's output range before it has seen any.)"""
    import torch

    bad = [k for k, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
    if bad:
        raise ExportError(
            f"{len(bad)} of the model's weight tensors hold NaN or Inf ({bad[0]}, ...), as a "
            "run that diverged saves them; nothing was written: export an earlier checkpoint "
            "of the run"
        )


# Writing -------------------------------------------------------------------------------


def _crops_to_trained_length(config: ModelConfig, trained_length: int | None) -> bool:
    """Whether ``generate`` reads only the last ``trained_length`` tokens: a transformer
    trained on sequences shorter than its block (recurrent models read any length from a
    zero state: nothing to crop)."""
    return (
        config.arch in TRANSFORMER_ARCHS
        and trained_length is not None
        and trained_length < config.block_size
    )


def _hf_config(config: ModelConfig, eos: int | None, trained_length: int | None = None) -> Any:
    from cofrgenet.export import hf_modeling

    shorter = _crops_to_trained_length(config, trained_length)
    return hf_modeling.CofrGeNetConfig(
        cofr=config.to_dict(),
        architectures=["CofrGeNetForCausalLM"],
        auto_map=dict(AUTO_MAP),
        bos_token_id=eos,
        eos_token_id=eos,
        dtype="float32",
        **({"trained_length": trained_length} if shorter else {}),
    )


def _write_config(
    out: Path,
    config: ModelConfig,
    eos: int | None,
    n_real: int | None,
    trained_length: int | None = None,
) -> None:
    """config.json and generation_config.json; ``n_real``: the tokenizer's size, whose
    padded ids beyond it generation never picks (as ``cofr generate``);
    ``trained_length``: the sequence length the run trained at, when shorter than its
    block (generate crops the context there, as ``cofr generate`` does)."""
    from transformers import GenerationConfig

    _hf_config(config, eos, trained_length).save_pretrained(out)
    padding = [] if n_real is None else list(range(n_real, config.vocab_size))
    # No KV cache: generation re-reads the context at every step.
    generation = GenerationConfig(
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
        use_cache=False,
        suppress_tokens=padding or None,
    )
    generation.save_pretrained(out)


def _write_weights(out: Path, state: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    path = out / WEIGHTS_FILE
    save_file(state, str(path), metadata={"format": "pt"})
    # safetensors writes through a private temporary file (mode 0600): readable as the
    # export's other files are, by the group that shares a model folder.
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o666 & ~umask)


def _max_length(config: ModelConfig) -> int | None:
    """The tokenizer's model_max_length: block_size for transformers, none for recurrent."""
    return config.block_size if config.arch in TRANSFORMER_ARCHS else None


def byte_tokenizer_backend() -> Any:
    """cofrgenet's byte tokenizer as a ``tokenizers.Tokenizer``: id = UTF-8 byte, EOS 256.

    A byte-level BPE with no merges: GPT-2's byte-to-unicode alphabet, each byte's
    character mapped to the byte's value, and ``<|endoftext|>`` added as id 256.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from cofrgenet.data.tokenizer import EOS_TEXT

    characters = _bytes_to_unicode()
    vocab = {characters[b]: b for b in range(256)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    # No regex split: every byte is its own token anyway.
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(EOS_TEXT, special=True)])
    if backend.token_to_id(EOS_TEXT) != 256:
        raise RuntimeError("the byte tokenizer's EOS did not get id 256")
    return backend


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map of the 256 bytes to printable characters."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    codes = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, codes, strict=True)}


def export_tokenizer(
    tokenizer: Tokenizer, out_dir: str | Path, model_max_length: int | None = None
) -> None:
    """Write ``tokenizer`` (byte, bpe or gpt2) as ``tokenizer.json`` + ``tokenizer_config.json``.

    ``AutoTokenizer.from_pretrained(out_dir)`` then encodes text to the same ids (literal
    ``<|endoftext|>`` text aside: it becomes EOS there, as in cofrgenet's bpe) and adds no
    special tokens.
    """
    from transformers import PreTrainedTokenizerFast

    from cofrgenet.data.tokenizer import EOS_TEXT

    if tokenizer.kind == "byte":
        backend = byte_tokenizer_backend()
    elif tokenizer.kind in ("bpe", "gpt2"):
        backend = tokenizer.backend
    else:
        raise UnsupportedModel(
            f"cannot export a {tokenizer.kind!r} tokenizer (byte, bpe and gpt2 export); "
            "pass --no-tokenizer"
        )
    # Padding is the end-of-text token, as GPT-2's users set it: batches pad for scoring.
    kwargs: dict[str, Any] = {"eos_token": EOS_TEXT, "bos_token": EOS_TEXT, "pad_token": EOS_TEXT}
    if model_max_length is not None:
        kwargs["model_max_length"] = model_max_length
    fast = PreTrainedTokenizerFast(tokenizer_object=backend, **kwargs)
    fast.save_pretrained(str(out_dir))
    # The class name every transformers version knows (v5 writes its own alias).
    config_file = Path(out_dir) / "tokenizer_config.json"
    settings = json.loads(config_file.read_text())
    settings["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_file.write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")


def _clips_ladders(model: nn.Module) -> bool:
    """Whether the model has ladders whose outputs eval mode clips (``ladder_clip``)."""
    from cofrgenet.nn import LadderLayer

    return any(isinstance(m, LadderLayer) and m.clip_outputs for m in model.modules())


def _write_readme(
    out: Path,
    config: ModelConfig,
    report: ExportReport,
    source: str | None,
    name: str,
    clips_ladders: bool,
    eos: int | None = None,
    trained_length: int | None = None,
) -> None:
    mixers = (
        f"attention {config.attention_pattern or config.attention}, "
        f"ffn {config.ffn_pattern or config.ffn}, position {config.position}"
        if config.arch in TRANSFORMER_ARCHS
        else "recurrent"
    )
    check = (
        "not checked (--no-verify)"
        if report.max_abs_diff is None
        else f"max abs difference {report.max_abs_diff:.2e} from cofrgenet's logits"
    )
    # The console said why in full; its advice (copy a folder, --tokenizer) is the
    # exporter's, not for the model's readers.
    why = "--no-tokenizer" if report.tokenizer_note == "--no-tokenizer" else "it was not found"
    tokenizer = report.tokenizer or f"not exported ({why})"
    clipped = ": ladder outputs are clipped to their training range" if clips_ladders else ""
    if report.tokenizer is not None:
        usage = f"""from transformers import AutoModelForCausalLM, AutoTokenizer

# from the folder that holds {name}/ (or give this folder's full path)
model = AutoModelForCausalLM.from_pretrained("./{name}", trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained("./{name}", trust_remote_code=True)
ids = tokenizer("Hello", return_tensors="pt").input_ids
print(tokenizer.decode(model.generate(ids, max_new_tokens=20, do_sample=False)[0]))"""
    else:  # AutoTokenizer would fail on this folder: the model takes token ids
        ids = (
            "torch.tensor([[0]])  # your prompt's token ids"
            if eos is None
            else f"torch.tensor([[{eos}]])  # end-of-text: a new document"
        )
        usage = f"""import torch
from transformers import AutoModelForCausalLM

# from the folder that holds {name}/ (or give this folder's full path)
model = AutoModelForCausalLM.from_pretrained("./{name}", trust_remote_code=True)
# No tokenizer here: ids of the tokenizer the model trained with.
ids = {ids}
print(model.generate(ids, max_new_tokens=20, do_sample=False)[0].tolist())"""
    trained = (
        f", trained at {trained_length} tokens (generate reads the last {trained_length}: "
        "later positions never trained)"
        if _crops_to_trained_length(config, trained_length)
        else ""
    )
    text = f"""# CoFrGeNet export

Exported by `cofr export hf` from `{source or "a model in memory"}`.

* architecture: {config.arch} ({mixers}), {config.n_layer} layers, width {config.n_embd},
  vocabulary {config.vocab_size}, block size {config.block_size}{trained}
* tokenizer: {tokenizer}
* logits check: {check}
* weights: `{WEIGHTS_FILE}`, sha256 `{file_sha256(out / WEIGHTS_FILE)}`

```python
{usage}
```

`modeling_cofrgenet.py` needs only torch and transformers. It is an inference
re-implementation{clipped}, and there is no key/value cache (generation re-reads the
context at every step).
"""
    (out / "README.md").write_text(text)


# The logits check ----------------------------------------------------------------------


def verify_export(
    model: nn.Module, config: ModelConfig, out_dir: str | Path, tolerance: float
) -> float:
    """Load ``out_dir`` through transformers and compare its logits with ``model``'s on
    random token ids (2, min(block_size, 128)); returns the max abs difference.

    Raises :class:`ExportMismatch` above ``tolerance`` times the largest |logit| of
    ``model`` (at least 1: absolute for small logits). ``model`` runs in eval mode with
    its ladders on the eager continuant path (the one cofrgenet uses on CPU), in float32
    on CPU as the export loads (a copy of a model held in another dtype or on a GPU).
    """
    import copy
    import math

    import torch
    from transformers.utils import logging as hf_logging

    from cofrgenet.export import hf_modeling
    from cofrgenet.nn.ladder import ladders_running

    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # no "Loading weights" bar inside cofr's output
    try:
        exported = hf_modeling.CofrGeNetForCausalLM.from_pretrained(str(out_dir))
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    exported.eval()
    length = min(config.block_size, VERIFY_LENGTH)
    generator = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, config.vocab_size, (2, length), generator=generator)]
    if config.block_size > length:
        batches.append(
            torch.randint(0, config.vocab_size, (1, config.block_size), generator=generator)
        )
    if any(p.dtype != torch.float32 or p.device.type != "cpu" for p in model.parameters()):
        model = copy.deepcopy(model).float().cpu()
    was_training = model.training
    try:
        model.eval()
        gaps, scale = [], 1.0
        with torch.no_grad(), ladders_running(model, "continuant"):
            for ids in batches:
                ours = model(ids).float()
                gaps.append((ours - exported(input_ids=ids).logits.float()).abs().max().item())
                scale = max(scale, ours.abs().max().item())  # a NaN logit leaves it
        difference = math.nan if any(math.isnan(gap) for gap in gaps) else max(gaps)
    finally:
        model.train(was_training)
    # float32 rounding grows with the logits (the two graphs sum in other orders), so the
    # tolerance is relative to the largest |logit|, and absolute below 1.
    if not difference <= tolerance * scale:
        # Below the default, float32's rounding differs between the two graphs: a
        # tolerance set tighter than that asks for it, no fault to report.
        fault = (
            "Please report this with the checkpoint's config, or pass --tolerance / "
            "--no-verify to keep it anyway"
            if not difference <= DEFAULT_TOLERANCE * scale  # NaN too: nothing passes it
            else "float32 rounding is up to about 1e-6 of the largest |logit|; pass "
            f"--tolerance {DEFAULT_TOLERANCE:g} (the default) or more"
        )
        raise ExportMismatch(
            f"the exported model's logits differ from the checkpoint's by {difference:.3g} "
            f"(> tolerance {tolerance:g} x largest |logit| {scale:.3g}); nothing was "
            f"written. {fault}"
        )
    return difference
