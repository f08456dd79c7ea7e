"""``cofr eval --ckpt CKPT --tasks wikitext-2-v1,ptb,lambada``: the paper's evaluations of a checkpoint.

Results are printed as a table, written as JSON (``--json OUT``) and logged to MLflow as
metrics of the checkpoint's own training run (``eval/<task>/<metric>``, at the
checkpoint's step), so the MLflow UI and ``cofr compare`` put runs side by side by them.
``--harness TASKS`` runs lm-evaluation-harness tasks through the same checkpoint
(:mod:`cofrgenet.eval.harness`); their metrics are logged as ``eval/<task>/<metric>``.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import secrets
import signal
import sys
import time
from typing import Any

from cofrgenet import terminal
from cofrgenet.dataclass_options import (
    DEVICE_HELP,
    add_checkpoint_argument,
    at_least,
    checkpoint_given,
    device_arg,
    show_required,
)
from cofrgenet.errors import UserError
from cofrgenet.eval.paths import (
    check_data_dir,
    check_output_file,
    older_partial_note,
    partial_results_file,
    readable,
    results_json,
    write_results,
)
from cofrgenet.eval.tasks import DEFAULT_DATA_DIR, TASKS, get_task, read_rows
from cofrgenet.signals import stopped_by

#: The paper's four columns (docs/evaluation.md says why WikiText's are the -v1 releases).
DEFAULT_TASKS = "wikitext-2-v1,wikitext-103-v1,ptb,lambada"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    ckpt = add_checkpoint_argument(parser, positional=True)
    parser.add_argument(
        "--tasks",
        default=None,  # None: not given (--split valid then leaves LAMBADA out)
        help=f"comma-separated, from: {', '.join(TASKS)}; '' with --harness only "
        f"(default: {DEFAULT_TASKS})",
    )
    parser.add_argument(
        "--data-dir",
        default=None,
        help="folder of local copies of the sets in their original layouts "
        "(docs/evaluation.md); a set not found there is loaded from the Hugging Face hub "
        f"(default: {DEFAULT_DATA_DIR} where it exists; given, it must exist)",
    )
    parser.add_argument(
        "--split",
        choices=("test", "valid"),
        default=None,
        help="which split of each --tasks set to score; LAMBADA has test only (default: test)",
    )
    parser.add_argument(
        "--stride",
        type=at_least(int, 1),
        default=None,
        help="tokens between sliding windows (default: half the --window; the window: "
        "disjoint windows)",
    )
    parser.add_argument(
        "--window",
        type=at_least(int, 1),
        default=None,
        help="tokens of context a scored window holds, at most the model's block size "
        "(a recurrent model's: any) (default: the length the model trained at, data.block_size, else its block size)",
    )
    parser.add_argument(
        "--batch-size",
        type=at_least(int, 1),
        default=8,
        help="windows (LAMBADA: passages) per forward pass, and the harness's batch size "
        "(default: 8)",
    )
    parser.add_argument(
        "--limit",
        type=at_least(int, 1),
        default=None,
        help="only the first N LAMBADA passages / harness docs (a run that leaves part of "
        "a set unscored is not logged to MLflow)",
    )
    parser.add_argument("--json", default=None, metavar="OUT", help="write the results here")
    parser.add_argument(
        "--device", type=device_arg, default="auto", help=f"{DEVICE_HELP} (default: auto)"
    )
    parser.add_argument(
        "--tokenizer",
        default=None,
        metavar="DIR",
        help=(
            "prepared data folder whose tokenizer to use (default: the run's own copy, "
            "<run>/tokenizer, else its training data's)"
        ),
    )
    parser.add_argument(
        "--harness",
        default=None,
        metavar="TASKS",
        help="lm-evaluation-harness tasks to run too (comma-separated; needs lm_eval)",
    )
    parser.add_argument("--include-path", default=None, help="a folder of extra lm-eval task YAMLs")
    parser.add_argument(
        "--num-fewshot",
        type=at_least(int, 0),
        default=None,
        help="harness tasks' shots (default: each task's own)",
    )
    parser.add_argument(
        "--no-mlflow", action="store_true", help="do not log the results to the run's MLflow run"
    )
    show_required(parser, ckpt)


def _names(text: str | None) -> list[str]:
    """The comma-separated names of ``text``, each once (a repeat was scored twice)."""
    return list(dict.fromkeys(name.strip() for name in (text or "").split(",") if name.strip()))


def evaluate_tasks(
    loaded: Any,
    tasks: list[str],
    texts: dict[str, list[str]],
    stride: int | None,
    batch_size: int,
    device: str,
    limit: int | None = None,
    results: dict[str, dict[str, float]] | None = None,
    window: int | None = None,
    encoded: dict[str, list[tuple[list[int], list[int]]]] | None = None,
) -> dict[str, dict[str, float]]:
    """{task: metrics} of a :class:`~cofrgenet.training.pretrained.LoadedCheckpoint`,
    filled into ``results`` when given, one task at a time (so that an interrupted run
    still has the tasks it finished). ``window``: tokens of context a scored window
    holds (default: the length the model trained at, ``loaded.context_length``).
    ``encoded``: LAMBADA sets' (context, last word) ids, as :func:`encode_lambada_sets`
    returned them (else encoded here)."""
    from cofrgenet.eval.lambada import score_pairs
    from cofrgenet.eval.perplexity import text_perplexity

    tokenizer, block = loaded.tokenizer, window or loaded.context_length
    results = {} if results is None else results
    if encoded is None:
        encoded = encode_lambada_sets(loaded, tasks, texts, limit, block)
    for name in tasks:
        task = get_task(name)
        started = time.perf_counter()
        if task.kind == "lambada":
            metrics = score_pairs(
                loaded.model,
                encoded[name],
                block,
                batch_size,
                device,
                n_real=tokenizer.vocab_size,
            ).metrics()
        else:
            raw = texts[name][0]
            metrics = text_perplexity(
                loaded.model,
                tokenizer.encode,
                tokenizer.eos_id,
                task.detokenize(raw),
                block,
                stride,
                batch_size,
                device,
                original=raw,
            ).metrics()
        metrics["seconds"] = time.perf_counter() - started
        results[name] = metrics
    return results


def print_results(results: dict[str, dict[str, float]], title: str) -> None:
    from rich.table import Table

    # (column, metric, format): the perplexity sets' columns, then LAMBADA's, each shown
    # when a task of the table has them.
    columns = (
        ("tokens", "tokens", ",.0f"),
        ("token ppl", "token_ppl", ".2f"),
        ("word ppl", "word_ppl", ".2f"),
        ("+eos", "word_ppl_eos", ".2f"),
        ("bits/byte", "bits_per_byte", ".4f"),
        ("accuracy", "accuracy", ".4f"),
        ("target ppl", "ppl", ".2f"),  # LAMBADA's: of the last word, not of the text
    )
    shown = [c for c in columns if any(c[1] in metrics for metrics in results.values())]
    table = Table()
    table.add_column("task", no_wrap=True)
    for column, _, _ in shown:
        table.add_column(column, justify="right", no_wrap=True)
    for name, metrics in results.items():
        cells = [readable(metrics[key], fmt) if key in metrics else "" for _, key, fmt in shown]
        table.add_row(name, *cells)
    terminal.print_titled(table, title)


def score_warnings(results: dict[str, dict[str, float]]) -> list[str]:
    """What the scores of a broken model say, which a table of ``nan`` and an accuracy of
    0 do not: NaN (its outputs were not finite: NaN or inf weights, a fit that diverged),
    or a perplexity past the float range (inf). Both are null in the JSON."""
    warnings = []
    for task, metrics in results.items():
        nan = [key for key, value in metrics.items() if math.isnan(value)]
        # A harness task's single NaN (a stderr of one doc) is its own; all of them NaN
        # is run_harness's mark of outputs that were not finite.
        if task not in TASKS and len(nan) < len(metrics):
            continue
        inf = [key for key, value in metrics.items() if math.isinf(value)]
        if nan:
            warnings.append(
                f"{task}: {', '.join(nan)} NaN: the model's outputs are not finite (NaN or "
                f"inf weights? a fit that diverged), so none of {task}'s scores mean anything"
            )
        elif inf:
            warnings.append(
                f"{task}: {', '.join(inf)} past the float range (inf, null in --json): "
                "the model has diverged"
            )
    return warnings


def print_harness_results(results: dict[str, dict[str, float]], title: str) -> None:
    """Harness tasks have metrics of their own (acc, acc_norm, exact_match, ...)."""
    from rich.table import Table

    table = Table()
    for column in ("task", "metric", "value"):
        table.add_column(column, justify="right" if column == "value" else "left", no_wrap=True)
    for name, metrics in results.items():
        for key, value in metrics.items():
            table.add_row(name, key, readable(value, ".4f"))  # a diverged ppl: 1.069e+10
    terminal.print_titled(table, title)


def metric_prefix(task: str, split: str) -> str:
    """Where ``task``'s numbers go in MLflow: ``eval/<task>`` for the test split (the
    paper's, which ``cofr compare`` sets beside its rows), ``eval/valid/<task>`` for the
    validation split, so neither replaces the other. Harness tasks keep ``eval/<task>``:
    their split is the task's own."""
    return f"eval/{task}" if split == "test" or task not in TASKS else f"eval/{split}/{task}"


def mlflow_metrics(results: dict[str, dict[str, float]], split: str = "test") -> dict[str, float]:
    """``<prefix>/<metric>`` for every number (counts and seconds included)."""
    return {
        f"{metric_prefix(task, split)}/{key}": value
        for task, metrics in results.items()
        for key, value in metrics.items()
    }


def protocol(task: str, step: int | None, report: dict[str, Any], default_window: int) -> str:
    """How ``task``'s numbers were made, in a few words (an MLflow tag beside them).

    ``default_window``: the window ``cofr eval`` takes without ``--window`` (the length
    the model trained at). LAMBADA's and the harness's tags name the window only when it
    is another (contexts cut shorter or kept longer change their scores), so a tag made
    at the default reads as before the window was named, and old runs still compare."""
    window = report.get("window", report["block_size"])
    chosen = window != default_window
    if task not in TASKS:
        made = f"step {step}, lm-evaluation-harness"
        if chosen:  # the harness's own name for it (docs/harness.md)
            made += f", max_length {window}"
        if report.get("include_path"):  # its YAMLs may replace lm_eval's task of that name
            made += f", tasks of {report['include_path']}"
        return made
    made = f"step {step}, {report['split']} split"
    if get_task(task).kind == "perplexity":
        block = report["block_size"]
        of = f"block {block}" if window == block else f"a {window}-token window (block {block})"
        made += f", stride {report['stride']} of {of}"
    elif chosen:  # LAMBADA: a context longer than the window keeps its last tokens
        made += f", {window}-token window"
    data = report.get("data", {}).get(task)
    if data:  # another copy of a set (another PTB preprocessing) must not pass for the same
        made += f", text sha256 {data['sha256']}"
    return made


def data_sources(
    tasks: list[str], texts: dict[str, list[str]], split: str, data_dir: str
) -> dict[str, dict[str, str]]:
    """Where each set's text came from (its local file, or the hub) and a digest of it."""
    sources = {}
    for name in tasks:
        task = get_task(name)
        path = task.local_path(data_dir, split)
        digest = hashlib.sha256("\0".join(texts[name]).encode()).hexdigest()[:12]
        source = str(path) if path.is_file() else f"hub:{task.hub_name}"
        sources[name] = {"source": source, "sha256": digest}
    return sources


def log_to_mlflow(
    loaded: Any, results: dict[str, dict[str, float]], report: dict[str, Any]
) -> tuple[str, int] | None:
    """Log onto the checkpoint's training run; returns where and how many metrics were
    new (0: the same scores were there at that step), or None if it has no run.

    Raises NotLogged when the run cannot be reached (a moved or copied run folder, a
    server down): the results are printed already, and no store is created on the way."""
    if loaded.mlflow_run_id is None:
        return None
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from cofrgenet.training.pretrained import log_onto_run

    split = report["split"]
    # How each number was made, beside it: the latest evaluation's (a later run with
    # another stride replaces it), and one per step (cofr compare shows the newest
    # checkpoint's numbers, which an older checkpoint evaluated later does not replace).
    tags = {}
    for task in results:
        made = protocol(task, loaded.step, report, default_window=loaded.context_length)
        prefix = metric_prefix(task, split)
        tags[f"{prefix}/protocol"] = tags[f"{prefix}/protocol/step-{loaded.step}"] = made
    uri = loaded.tracking_uri
    new = log_onto_run(uri, loaded.mlflow_run_id, mlflow_metrics(results, split), loaded.step, tags)
    client = MlflowClient(uri)
    # With a draw beside the time: two evaluations of one run in one second (parallel
    # SLURM jobs) kept one report, the other written over.
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    logged = {**report, "logged_to_mlflow": True}  # the run's own copy: logged, it says
    try:
        client.log_text(loaded.mlflow_run_id, results_json(logged), f"eval/eval-{stamp}.json")
    except (MlflowException, OSError) as error:  # the scores are logged: said, not lost
        print(f"warning: the report was not stored with the run ({error})", file=sys.stderr)
    return loaded.mlflow_run_id, new


def _check_options(args: argparse.Namespace, tasks: list[str], harness_tasks: list[str]) -> None:
    """Refuse options that would be silently unused by the tasks asked for (they mislead),
    and an evaluation of nothing; ``--split`` defaults to test."""
    if not tasks and not harness_tasks:
        raise UserError("nothing to evaluate: give --tasks and/or --harness")
    if not harness_tasks:  # both only reach lm-eval
        for flag, value in (
            ("--include-path", args.include_path),
            ("--num-fewshot", args.num_fewshot),
        ):
            if value is not None:
                raise UserError(f"{flag} applies to lm-eval tasks only: give them with --harness")
    kinds = {get_task(name).kind for name in tasks}
    for flag, value, applies, to in (
        ("--split", args.split, kinds, "the sets of --tasks (not harness tasks)"),
        ("--data-dir", args.data_dir, kinds, "the sets of --tasks (not harness tasks)"),
        ("--stride", args.stride, kinds & {"perplexity"},
         "the perplexity sets of --tasks (not LAMBADA's passages or harness tasks)"),
    ):  # fmt: skip
        if value is not None and not applies:
            raise UserError(f"{flag} applies to {to} only: leave it out")
    args.split = args.split or "test"
    without = [name for name in tasks if args.split not in get_task(name).hub_splits]
    # --tasks not given: score what has the split. Given, even as the default list
    # written out, each task named is meant: one without it is refused.
    if without and args.tasks is None:
        print(f"cofr eval: --split {args.split}: leaving out {', '.join(without)} (test split "
              "only)", file=sys.stderr)  # fmt: skip
        tasks[:] = [name for name in tasks if name not in without]
    elif without:
        keep = [name for name in tasks if name not in without]
        fix = f"--tasks {','.join(keep)}" if keep else "--split test"
        raise UserError(
            f"--split {args.split}: {', '.join(without)} has no such split (test only): give {fix}"
        )
    kinds = {get_task(name).kind for name in tasks}
    if args.limit is not None and not harness_tasks and "lambada" not in kinds:
        if without:
            raise UserError(
                f"--limit applies to LAMBADA passages and harness docs only, and --split "
                f"{args.split} left LAMBADA out: leave --limit out"
            )
        raise UserError(
            "--limit applies to LAMBADA passages and harness docs only; perplexity sets are "
            "scored whole (leave it out)"
        )


def encode_lambada_sets(
    loaded: Any, tasks: list[str], texts: dict[str, list[str]], limit: int | None, window: int
) -> dict[str, list[tuple[list[int], list[int]]]]:
    """{LAMBADA set: its passages' (context, last word) ids}, all encoded before any set
    is scored: a last word longer than the window is refused then (found while scoring,
    it threw away the sets scored before it)."""
    from cofrgenet.eval.lambada import continuation_pairs

    tokenizer, encoded = loaded.tokenizer, {}
    for name in tasks:
        task = get_task(name)
        if task.kind == "lambada":
            passages = [task.detokenize(p) for p in texts[name][:limit]]
            encoded[name] = continuation_pairs(tokenizer.encode, tokenizer.eos_id, passages, window)
    return encoded


def _read_sets(tasks: list[str], split: str, data_dir: str) -> dict[str, list[str]]:
    """Each set's rows; one error for those that cannot be read, the first in full and
    the others named (all are fixed before a second try, not one a run)."""
    texts, failed = {}, []
    for name in tasks:
        try:
            texts[name] = read_rows(get_task(name), split, data_dir)
        except UserError as error:
            failed.append((name, error))
    if len(failed) == 1:
        raise failed[0][1]
    if failed:
        others = ", ".join(name for name, _ in failed[1:])
        raise UserError(f"{failed[0][1]} ({others}: cannot be read either)")
    return texts


def run(args: argparse.Namespace) -> int:
    args.ckpt = checkpoint_given(args)
    tasks = _names(DEFAULT_TASKS if args.tasks is None else args.tasks)
    harness_tasks = _names(args.harness)
    _check_options(args, tasks, harness_tasks)
    # What the user gave is checked first, before the network or the model: the
    # checkpoint, the data folder, where the results go.
    from cofrgenet.models.generation import is_recurrent
    from cofrgenet.training.pretrained import checkpoint_file, load_checkpoint

    checkpoint_file(args.ckpt)
    data_dir = DEFAULT_DATA_DIR if args.data_dir is None else args.data_dir
    check_data_dir(
        args.data_dir,
        "the folder holding the sets (docs/evaluation.md)",
        "the Hugging Face datasets",
    )
    out = check_output_file(args.json) if args.json else None
    # Every set is found before the model is loaded: a missing file fails at once.
    texts = _read_sets(tasks, args.split, data_dir)
    resolved = None
    if harness_tasks:  # names too: a typo must not wait for the other tasks' scores
        from cofrgenet.eval.harness import resolve_tasks

        resolved = resolve_tasks(harness_tasks, args.include_path, reserved=list(TASKS))

    loaded = load_checkpoint(args.ckpt, device=args.device, tokenizer_dir=args.tokenizer)
    # A recurrent model has no positions: its block size is the length it trained at.
    if (
        args.window is not None
        and args.window > loaded.block_size
        and not is_recurrent(loaded.model)
    ):
        raise UserError(
            f"--window {args.window} exceeds the model's block size {loaded.block_size}: "
            f"give at most {loaded.block_size} (a window holds positions the model has)"
        )
    window = args.window or loaded.context_length
    if args.window is None and window < loaded.block_size:
        # Positions past it never trained: scored there, runs that differ only in
        # data.block_size would not compare.
        print(
            f"note: scoring {window}-token windows, the length {args.ckpt} trained at (its "
            f"block size: {loaded.block_size}; --window {loaded.block_size} for the whole block)",
            file=sys.stderr,
        )
    if args.stride is not None and args.stride > window:
        raise UserError(
            f"--stride {args.stride} exceeds the {window}-token window"
            + ("" if args.window else " (the length the model trained at; see --window)")
        )
    encoded = encode_lambada_sets(loaded, tasks, texts, args.limit, window)
    title = f"{args.ckpt} (step {loaded.step}, {args.split})"
    results: dict[str, dict[str, float]] = {}
    harness: dict[str, dict[str, float]] = {}
    failed: Exception | None = None  # the harness's error, once cofr's own sets scored
    stop = _StopOnSigterm()
    with stop:
        try:
            evaluate_tasks(
                loaded, tasks, texts, args.stride, args.batch_size, args.device, args.limit,
                results, window, encoded,
            )  # fmt: skip
            if resolved is not None:
                from cofrgenet.eval.harness import run_harness

                try:
                    harness = run_harness(
                        loaded,
                        resolved,
                        limit=args.limit,
                        batch_size=args.batch_size,
                        device=args.device,
                        num_fewshot=args.num_fewshot,
                        max_length=window,
                    )
                except Exception as error:
                    if not results:
                        raise
                    # The sets scored (hours, on real sets) are reported and logged as
                    # an interrupted run's are, then the error is raised.
                    failed = error
                results.update(harness)
        except KeyboardInterrupt:
            stop.signum = signal.SIGINT
        except Stopped:
            pass
        # From here SIGTERM is only noted: the sets scored are reported, then cofr exits.
        stop.scoring = False
        report = _report(args, loaded, results, data_dir, tasks, harness_tasks, texts, window)
        partial = stop.signum is not None or failed is not None
        if partial:
            # Hours of scores are not thrown away with the set under way: each set
            # finished is a whole set's score, reported as a full run's are.
            name = (
                "the harness's error" if stop.signum is None else signal.Signals(stop.signum).name
            )
            not_scored = [task for task in [*tasks, *harness_tasks] if task not in results]
            report["partial"] = {
                "stopped_by": name if failed is None else stopped_by(failed),
                "not_scored": not_scored,
            }
            print(
                f"cofr eval: stopped by {name}: "
                + (f"not scored: {', '.join(not_scored)}" if results else "no set was scored"),
                file=sys.stderr,
            )
            if not results and stop.signum is not None:  # an earlier --json is kept
                return 128 + stop.signum
            what = "the interrupt" if stop.signum == signal.SIGINT else name
            title += f", the tasks finished before {what}"
        if any(task in results for task in tasks):
            print_results({k: v for k, v in results.items() if k in tasks}, title)
        if harness:
            print_harness_results(harness, f"{args.ckpt}: lm-evaluation-harness")
        for warning in report["warnings"]:
            print(f"warning: {warning}", file=sys.stderr)
        if out is not None:
            kept = ""
            if partial and (partial_file := partial_results_file(out)) != out:
                kept = f"; {out} keeps an earlier run's complete results"
                try:
                    out = check_output_file(partial_file)
                except UserError as error:
                    # Something else holds that name: the sets scored still go to MLflow
                    # below, and to stdout here, not nowhere.
                    print(f"warning: {error}; the partial results follow", file=sys.stderr)
                    sys.stdout.write(results_json(report))
                    out = None
            if out is not None:
                write_results(out, report)
                print(
                    f"results: {out}"
                    + (
                        f" (partial: the sets finished{kept})"
                        if partial
                        else older_partial_note(out)
                    )
                )
        scored = [task for task in tasks if task in results]
        cut = limit_cuts(args.limit, scored, texts, list(harness))  # harness: those scored
        if not args.no_mlflow and _log_and_say(args, loaded, results, report, cut):
            report["logged_to_mlflow"] = True
            if out is not None:  # written before: the results are kept if logging fails
                write_results(out, report)
        if failed is not None:  # the sets scored are kept: now the error, as it is
            raise failed
    return 0 if stop.signum is None else 128 + stop.signum


class Stopped(BaseException):
    """SIGTERM while scoring (SLURM's time limit, scancel): raised where the scoring is,
    as Ctrl-C raises KeyboardInterrupt (a BaseException too, so that no ``except
    Exception`` on the way takes it for an error)."""


class _StopOnSigterm:
    """While scoring, SIGTERM raises :class:`Stopped`, so that the sets finished are
    reported; after it (``scoring`` False), it is only noted, and the reporting finishes.
    Its handler from before is put back on leaving. ``signum``: the signal that stopped
    the evaluation, if one did."""

    def __init__(self) -> None:
        self.scoring = True
        self.signum: int | None = None
        self._before: Any = None

    def __enter__(self) -> _StopOnSigterm:
        try:
            self._before = signal.signal(signal.SIGTERM, self._on_sigterm)
        except ValueError:  # not the main thread (an embedding): SIGTERM keeps its way
            self._before = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._before is not None:
            signal.signal(signal.SIGTERM, self._before)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
        if self.scoring:
            self.scoring = False  # one raise: a second SIGTERM must not cut the report
            raise Stopped


def _report(
    args: argparse.Namespace,
    loaded: Any,
    results: dict[str, dict[str, float]],
    data_dir: str,
    tasks: list[str],
    harness_tasks: list[str],
    texts: dict[str, list[str]],
    window: int,
) -> dict[str, Any]:
    """The JSON report (and MLflow artifact) of ``results``: the sets of ``tasks`` scored
    and those of ``harness_tasks``."""
    import datetime as dt

    from cofrgenet.eval.perplexity import default_stride
    from cofrgenet.redact import hide_passwords
    from cofrgenet.training.run_store import code_description

    return {
        # What reproduces the figures: the command, when, the code and the device.
        "command": hide_passwords(getattr(args, "command_line", None) or "cofr eval"),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "code": code_description(),
        "device": str(args.device),
        "checkpoint": str(args.ckpt),
        "step": loaded.step,
        # Of cofr's own sets (the harness's tasks have their own splits and windows).
        "split": args.split if tasks else None,
        "stride": (
            args.stride or default_stride(window)
            if any(get_task(t).kind == "perplexity" for t in tasks)
            else None
        ),
        "window": window,
        "block_size": loaded.block_size,
        "tokenizer": getattr(loaded.tokenizer, "kind", None),  # the harness's too
        "data": data_sources([t for t in tasks if t in results], texts, args.split, data_dir),
        **(
            {"num_fewshot": args.num_fewshot, "include_path": args.include_path}
            if harness_tasks
            else {}
        ),
        "limit": args.limit,
        "mlflow_run_id": loaded.mlflow_run_id,  # the checkpoint's run
        "logged_to_mlflow": False,  # set once the scores are in that run (_log_and_say)
        "results": results,
        "warnings": score_warnings(results),
    }


def limit_cuts(
    limit: int | None, tasks: list[str], texts: dict[str, list[str]], harness_tasks: list[str]
) -> bool:
    """Whether ``--limit`` leaves part of a set unscored: a LAMBADA set longer than it,
    or any harness task (whose size is the harness's to know)."""
    if limit is None:
        return False
    lambada = [t for t in tasks if get_task(t).kind == "lambada"]
    return bool(harness_tasks) or any(len(texts[t]) > limit for t in lambada)


def _log_and_say(
    args: argparse.Namespace,
    loaded: Any,
    results: dict[str, dict[str, float]],
    report: dict[str, Any],
    limit_cut: bool,
) -> bool:
    """Log the results onto the checkpoint's run (not those of a ``--limit`` that cut a
    set, ``limit_cut``: part of a set would stand beside full scores under the same
    names) and say where, or why not; whether they were logged."""
    from cofrgenet.training.pretrained import NotLogged

    if limit_cut:
        print(
            f"not logged to MLflow: --limit {args.limit} scored part of a set, which would "
            "stand beside full scores under the same names; run without --limit to log"
        )
        return False
    try:
        logged = log_to_mlflow(loaded, results, report)
    except NotLogged as error:  # the results are printed and written already
        print(f"not logged to MLflow: {error}", file=sys.stderr)
        return False
    if logged is None:
        why = loaded.foreign or "the checkpoint is not in a tracked run folder"
        print(f"not logged to MLflow: {why}")
        return False
    run_id, new = logged
    where = "eval/<task>/<metric>" if args.split == "test" else "eval/valid/<task>/<metric>"
    if new:
        print(f"logged to MLflow run {run_id} as {where} ({loaded.tracking_uri})")
    else:  # the same checkpoint scored again the same way
        print(
            f"already in MLflow run {run_id} as {where} ({loaded.tracking_uri}): the same "
            f"scores at step {loaded.step}, not logged again (this report is stored with it)"
        )
    return True
