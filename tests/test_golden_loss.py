"""Golden losses: the first 20 training losses of a tiny CoFrGeNet-F, recorded on purpose.

A tiny gpt2-tiny-f (vocab 320, block 32, batch 4, seed 1337) trains 20 steps on CPU
through the real ``cofr fit`` path on ``tests/assets/golden_corpus.jsonl`` (12 topics of
Python 3.11's ``pydoc_data.topics``, PSF licence, shipped so that every Python trains on
the same text; byte tokenizer), and its ``train/loss`` at every step must reproduce the
losses recorded in
``tests/assets/golden_loss_gpt2-tiny-f.json`` to 1e-4. Any change that alters training
numerics (init, the ops, the optimizer, the data order, the loss) fails here; if the
change is meant, re-record the file on purpose::

    python scripts/record_golden_loss.py

and commit the new asset with the change that explains it.

The runs use one intra-op thread (``torch.set_num_threads(1)``, restored afterwards):
with more threads CPU reductions split differently and the losses move by ~1e-6 from
machine to machine. One thread makes the recorded losses bit-identical across runs and
processes on this machine; the 1e-4 tolerance absorbs other CPUs and libraries.
The asset also records a fingerprint of the prepared tokens: if they change (the corpus
file or the prepare path), the test fails and says so before training.
"""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path

import lightning as L
import pytest
import torch

from cofrgenet.training.cli import CofrCLI

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
ASSET = ROOT / "tests" / "assets" / "golden_loss_gpt2-tiny-f.json"
CORPUS = ROOT / "tests" / "assets" / "golden_corpus.jsonl"
RECORD_COMMAND = "python scripts/record_golden_loss.py"
PRESET = "gpt2-tiny-f"
MODEL_CONFIG = {"vocab_size": 320, "block_size": 32}
BATCH_SIZE = 4
STEPS = 20
SEED = 1337
MAX_DOCS = 12
TOLERANCE = 1e-4


class LossRecorder(L.Callback):
    """The training loss of every optimizer step, as ``training_step`` returned it."""

    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))


def prepare(out: Path) -> Path:
    """The shipped corpus, byte-tokenized, by the real prepare path."""
    from cofrgenet.data import make_source, prepare_data

    if not (out / "meta.json").is_file():
        source = make_source("jsonl", path=str(CORPUS))
        prepare_data(source, tokenizer="byte", out=out, max_docs=MAX_DOCS, num_workers=1)
    return out


def data_fingerprint(data: Path) -> str:
    """sha256 of the prepared training tokens (the chunk files, in name order)."""
    digest = hashlib.sha256()
    for chunk in sorted((data / "train").glob("*.bin")):
        digest.update(chunk.name.encode())
        digest.update(chunk.read_bytes())
    return digest.hexdigest()


def train_losses(data: Path, workdir: Path) -> list[float]:
    """``STEPS`` losses of ``PRESET`` trained by ``cofr fit`` on one CPU thread."""
    recorder = LossRecorder()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        CofrCLI(
            args=[
                "fit",
                "--config",
                str(CONF / "trainer" / "cpu-debug.yaml"),
                "--seed_everything",
                str(SEED),
                "--model.preset",
                PRESET,
                "--model.config",
                json.dumps(MODEL_CONFIG),
                "--data.data_dir",
                str(data),
                "--data.block_size",
                str(MODEL_CONFIG["block_size"]),
                "--data.batch_size",
                str(BATCH_SIZE),
                "--data.num_workers",
                "0",
                "--run.runs_dir",
                str(workdir / "runs"),
                "--run.experiment",
                "golden",
                "--run.name",
                "golden",
                "--trainer.max_steps",
                str(STEPS),
                "--trainer.log_every_n_steps",
                "1",
                "--trainer.val_check_interval",
                str(10 * STEPS),  # no validation: nothing but training between the steps
                "--trainer.enable_progress_bar",
                "false",
                "--trainer.enable_model_summary",
                "false",
            ],
            extra_callbacks=[recorder],
        )
    finally:
        torch.set_num_threads(threads)
    return recorder.losses


def record(workdir: Path, asset: Path = ASSET) -> dict:
    """Train, and write the losses with what they were recorded on to ``asset``."""
    data = prepare(workdir / "data")
    losses = train_losses(data, workdir / "first")
    again = train_losses(data, workdir / "second")
    if losses != again:
        raise RuntimeError(f"two runs in one process differ, nothing recorded:\n{losses}\n{again}")
    golden = {
        "what": f"train/loss of the first {STEPS} steps; see tests/test_golden_loss.py",
        "record_with": RECORD_COMMAND,
        "preset": PRESET,
        "model_config": MODEL_CONFIG,
        "batch_size": BATCH_SIZE,
        "seed": SEED,
        "trainer_config": "conf/trainer/cpu-debug.yaml",
        "data": {
            "source": str(CORPUS.relative_to(ROOT)),
            "tokenizer": "byte",
            "max_docs": MAX_DOCS,
            "train_sha256": data_fingerprint(data),
        },
        "recorded_on": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "machine": platform.machine(),
        },
        "tolerance": TOLERANCE,
        "losses": losses,
    }
    asset.parent.mkdir(parents=True, exist_ok=True)
    asset.write_text(json.dumps(golden, indent=2) + "\n")
    return golden


def test_first_losses_of_a_tiny_cofrgenet_f_reproduce(tmp_path):
    golden = json.loads(ASSET.read_text())
    data = prepare(tmp_path / "data")
    fingerprint = data_fingerprint(data)
    assert fingerprint == golden["data"]["train_sha256"], (
        f"the prepared tokens of {CORPUS.name} differ from the ones the losses were recorded "
        f"on: a change to the corpus or to prepare; if it is meant, `{RECORD_COMMAND}`"
    )
    losses = train_losses(data, tmp_path / "first")
    recorded = golden["losses"]
    off = [
        f"  step {step:2d}: got {got:.7f}, recorded {want:.7f} (diff {got - want:+.1e})"
        for step, (got, want) in enumerate(zip(losses, recorded, strict=False))
        if not abs(got - want) <= TOLERANCE
    ]
    if len(losses) != len(recorded):
        off.append(f"  {len(losses)} losses, {len(recorded)} recorded")
    if off:
        pytest.fail(
            f"training numerics changed: the first {STEPS} losses of {PRESET} moved by more "
            f"than {TOLERANCE:g} from {ASSET.relative_to(ROOT)}:\n"
            + "\n".join(off)
            + "\nIf the change is meant (init, ops, optimizer, data order or loss changed on "
            f"purpose), re-record the file with `{RECORD_COMMAND}` and commit it with the "
            "change.",
            pytrace=False,
        )
    # Deterministic within a process too: a second run gives the same bits.
    assert train_losses(data, tmp_path / "second") == losses
