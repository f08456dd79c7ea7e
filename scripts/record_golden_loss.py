"""Re-record tests/assets/golden_loss_gpt2-tiny-f.json on purpose.

Run it when a change alters training numerics on purpose (init, the ops, the optimizer,
the data order, the loss), and commit the new asset with that change::

    python scripts/record_golden_loss.py

It trains the tiny CoFrGeNet-F of tests/test_golden_loss.py twice (20 steps each, one
CPU thread), refuses to write if the two runs differ, and prints the old and new losses.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(ROOT / "tests"))
    from test_golden_loss import ASSET, record

    old = json.loads(ASSET.read_text())["losses"] if ASSET.is_file() else None
    with tempfile.TemporaryDirectory(prefix="cofr-golden-") as workdir:
        new = record(Path(workdir))["losses"]
    print(f"wrote {ASSET.relative_to(ROOT)}")
    for step, loss in enumerate(new):
        before = "" if old is None or step >= len(old) else f"  (was {old[step]:.7f})"
        print(f"  step {step:2d}: {loss:.7f}{before}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
