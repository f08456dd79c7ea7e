"""Tiny trained checkpoints for the evaluation tests (eval, GLUE, harness, export).

``trained_checkpoint`` trains a few steps through the real ``cofr fit`` path, so the
checkpoint has a run folder, a tokenizer folder and an MLflow run like a user's.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from cofrgenet.training.cli import CofrCLI

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"


def tiny_byte_data(out: Path) -> Path:
    """A small byte-tokenized corpus made by the real prepare path."""
    from cofrgenet.data import prepare_data

    if not (out / "meta.json").is_file():
        prepare_data(source="pydoc", tokenizer="byte", out=out, max_docs=12, num_workers=1)
    return out


def unloadable_checkpoint(path: Path) -> Path:
    """An empty zip archive at ``path``: it passes the first look every command takes at
    a checkpoint (a readable archive) and fails only if loaded, so a test using it shows
    that its error comes before the model is loaded."""
    zipfile.ZipFile(path, "w").close()
    return path


def trained_checkpoint(
    root: Path,
    data: Path,
    preset: str = "gpt2-tiny-f",
    config: dict | None = None,
    steps: int = 2,
    name: str = "run",
    experiment: str = "test",
    trained_length: int | None = None,
) -> Path:
    """Train ``steps`` steps of ``preset`` (block 32, vocab 320 unless ``config`` says
    otherwise) on sequences of ``trained_length`` (default: the block) under
    ``root/runs`` and return ``.../checkpoints/last.ckpt``."""
    model_config = {"vocab_size": 320, "block_size": 32, **(config or {})}
    CofrCLI(
        args=[
            "fit",
            "--config",
            str(CONF / "trainer" / "cpu-debug.yaml"),
            "--model.preset",
            preset,
            "--model.config",
            json.dumps(model_config),
            "--data.data_dir",
            str(data),
            "--data.block_size",
            str(trained_length or model_config["block_size"]),
            "--data.batch_size",
            "4",
            "--data.num_workers",
            "0",
            "--run.runs_dir",
            str(root / "runs"),
            "--run.experiment",
            experiment,
            "--run.name",
            name,
            "--trainer.max_steps",
            str(steps),
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.enable_model_summary",
            "false",
        ]
    )
    return root / "runs" / experiment / name / "checkpoints" / "last.ckpt"
