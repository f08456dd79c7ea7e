"""``cofr ui``: the MLflow UI on this project's run store."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from cofrgenet.training import tracking
from cofrgenet.training.tracking import RunConfig, artifact_location, tracking_uri


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs-dir", default="runs", help="the runs folder (default: runs)")
    parser.add_argument(
        "--tracking-uri", default=None, help="another MLflow store (default: runs/mlflow.db)"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=5000)


def ui_command(args: argparse.Namespace) -> list[str]:
    run = RunConfig(runs_dir=args.runs_dir, tracking_uri=args.tracking_uri)
    command = [
        sys.executable,
        "-m",
        "mlflow",
        "ui",
        "--backend-store-uri",
        tracking_uri(run),
        "--host",
        args.host,
        "--port",
        str(args.port),
    ]
    artifacts = artifact_location(run)
    if artifacts:
        command += ["--default-artifact-root", artifacts]
    return command


def run(args: argparse.Namespace) -> int:
    store = Path(args.runs_dir) / "mlflow.db"
    # The user's MLFLOW_TRACKING_URI, not what an earlier in-process run set.
    if args.tracking_uri is None and not tracking._USER_TRACKING_URI and not store.exists():
        print(
            f"no MLflow store at {store} yet: train something first (e.g. `make demo`)",
            file=sys.stderr,
        )
        return 1
    command = ui_command(args)
    print(f"MLflow UI on http://{args.host}:{args.port} (Ctrl-C stops it)")
    try:
        return subprocess.call(command)
    except KeyboardInterrupt:
        return 0
