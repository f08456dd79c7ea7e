"""Reporting: the console table, the markdown and JSON files, the target verdicts.

Files are ``ops-<device>-<date><suffix>.md`` and ``.json``; <device> is ``cpu`` or the
GPU's name as a slug (``ops-nvidia-h200-2026-12-01.md``). They are written atomically, and
rewritten after each workload (partial, until the run ends).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from cofrgenet.atomic import write_text_atomic
from cofrgenet.bench import timing
from cofrgenet.bench.files import free_stem, with_suffix
from cofrgenet.bench.machine import name_slug
from cofrgenet.bench.ops.config import BUSY_THRESHOLD, REFERENCE_IMPL
from cofrgenet.bench.ops.formatting import ms, percent, share, speedup
from cofrgenet.bench.ops.results import Report, Result
from cofrgenet.bench.ops.targets import TargetCheck
from cofrgenet.bench.ops.workloads import Workload
from cofrgenet.bench.timing import unreliable_note


def _groups(report: Report) -> dict[tuple[Workload, str], dict[str, Result]]:
    """(workload, mode) -> impl -> result, in run order."""
    groups: dict[tuple[Workload, str], dict[str, Result]] = {}
    for r in report.results:
        groups.setdefault((r.workload, r.mode), {})[r.impl] = r
    return groups


def _summary_cell(r: Result | None) -> str:
    if r is None:
        return "-"
    if r.skipped is not None:
        return "skipped"
    if r.summary is None:
        return "failed"
    if r.impl == REFERENCE_IMPL:
        return ms(r.summary.median)
    return f"{ms(r.summary.median)} ({speedup(r.speedup)})"


def _gbps(r: Result) -> str:
    if r.gbps is None:
        return "-"
    copy = "" if r.copy_fraction is None else f" ({percent(r.copy_fraction)} copy)"
    return f"{r.gbps:.3g} GB/s{copy}"


def _fastest_cell(by_impl: dict[str, Result]) -> str:
    """The fastest measured impl, with its bandwidth (ops) or the ladders' share (Cffn);
    auto stands for the impl it picked when that one was not timed itself."""
    ran = {r.impl for r in by_impl.values() if r.summary is not None}
    timed = [
        r
        for r in by_impl.values()
        if r.summary is not None and (r.impl != "auto" or r.resolved not in ran)
    ]
    if not timed:
        return "-"
    best = min(timed, key=lambda r: r.summary.median)
    name = f"auto ({best.resolved})" if best.impl == "auto" else best.impl
    if best.ladder_share is not None:
        return f"{name}: ladders {share(best.ladder_share)} of the layer"
    return f"{name}: {_gbps(best)}"


def _ratio_cell(by_impl: dict[str, Result], impl: str, versus: str) -> str:
    a, b = by_impl.get(impl), by_impl.get(versus)
    if a is None or b is None or a.summary is None or b.summary is None:
        return "-"
    return speedup(b.summary.median / a.summary.median)


def summary_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    """The one-table view: a row per (workload, mode), median ms (speedup) per impl.

    Then which impl "auto" ran, the fastest impl with its bandwidth (or, for Cffn layers,
    the ladders' share of the layer's time), triton's speedup over compiled, other load.
    """
    impls = list(report.meta["config"]["impls"])
    header = ["workload", "mode", *impls]
    if "auto" in impls:
        header.append("auto uses")
    header.append("fastest")
    with_ratio = "triton" in impls and "compiled" in impls
    if with_ratio:
        header.append("triton vs compiled")
    header.append("other load")
    rows = []
    for (w, mode), by_impl in _groups(report).items():
        row = [w.label, mode, *(_summary_cell(by_impl.get(i)) for i in impls)]
        if "auto" in impls:
            row.append(by_impl["auto"].resolved if "auto" in by_impl else "-")
        row.append(_fastest_cell(by_impl))
        if with_ratio:
            row.append(_ratio_cell(by_impl, "triton", "compiled"))
        row.append(percent(next(iter(by_impl.values())).background_load))
        rows.append(row)
    return header, rows


def detail_rows(report: Report) -> tuple[list[str], list[list[str]]]:
    """One row per (workload, mode, impl) with the spread and first-call time."""
    header = ["workload", "mode", "impl", "median ms", "IQR ms", "min-max ms"]
    header += ["first call ms", "speedup", "GB/s", "% copy", "ladders' share"]
    header += ["max abs diff", "page faults"]
    with_memory = any(r.peak_memory_bytes is not None for r in report.results)
    if with_memory:
        header.append("peak MiB")
    rows = []
    for r in report.results:
        s = r.summary
        impl = r.impl if r.resolved == r.impl else f"{r.impl} ({r.resolved})"
        row = [r.workload.label, r.mode, impl]
        if s is None:
            reason = f"skipped: {r.skipped}" if r.skipped else f"failed: {r.error}"
            row += [reason, "", "", ms(r.first_call_ms), "", "", "", "", "", ""]
        else:
            row += [
                ms(s.median),
                f"{ms(s.q1)}-{ms(s.q3)}",
                f"{ms(s.min)}-{ms(s.max)}",
                ms(r.first_call_ms),
                speedup(r.speedup),
                "-" if r.gbps is None else f"{r.gbps:.3g}",  # small workloads: 0.0114
                percent(r.copy_fraction),
                share(r.ladder_share),
                "-" if r.max_abs_diff is None else f"{r.max_abs_diff:.1e}",
                "-" if r.page_faults is None else str(r.page_faults),
            ]
        if with_memory:
            mib = r.peak_memory_bytes
            row.append("-" if mib is None else f"{mib / 2**20:.1f}")
        rows.append(row)
    return header, rows


def _target_line(check: TargetCheck) -> str:
    if check.not_in_run is not None:  # never asked for: not a skip, nor a failure
        return f"NOT IN THIS RUN ({check.not_in_run}): {check.target.describe()}"
    if check.met is None:
        return f"NOT TIMED (its workload was skipped or failed): {check.target.describe()}"
    verdict = "MET" if check.met else "MISSED"
    if check.target.min_copy_fraction is not None:
        measured = percent(check.speedup)
    else:
        measured = f"{check.speedup:.1f}x"
    line = f"{verdict}: {check.target.describe()} (measured {measured})"
    return line + unreliable_note(check.background_load)


def busy_warning(report: Report) -> str | None:
    """A warning when other processes used the CPU while workloads were being timed."""
    loads = {r.workload.label: r.background_load for r in report.results}
    return timing.busy_warning(loads, "workloads")


def print_report(report: Report, console: Console) -> None:
    """The summary table and the target verdicts, on the console."""
    header, rows = summary_rows(report)
    meta = report.meta
    table = Table(
        title=f"cofr bench ops: median ms (speedup vs literal), {meta['device_name']}, "
        f"{meta['threads']} threads, {meta['config']['dtype']}, "
        f"{meta['config']['repeats']} repeats{_calls(meta, ' of {} calls')}",
    )
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i < 2 else "right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for check in report.targets:
        style = {True: "green", False: "red", None: "yellow"}[check.met]
        style = "dim" if check.not_in_run is not None else style
        console.print(f"[{style}]{_target_line(check)}[/{style}]")
    if warning := busy_warning(report):
        console.print(f"[yellow]warning: {warning}[/yellow]")


def _markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _calls(meta: dict[str, Any], text: str) -> str:
    """``text`` with the calls a sample holds, when more than one (reports from before
    ``--calls-per-sample`` held one)."""
    calls = meta.get("calls_per_sample", 1)
    return text.format(calls) if calls > 1 else ""


def _copy(meta: dict[str, Any]) -> str:
    gbps = meta.get("copy_bandwidth_gbps")
    return "-" if gbps is None else f"{gbps:.3g} GB/s"


def to_markdown(report: Report) -> str:
    meta, config = report.meta, report.meta["config"]
    summary = _markdown_table(*summary_rows(report))
    details = _markdown_table(*detail_rows(report))
    targets = "\n".join(f"- {_target_line(c)}" for c in report.targets)
    warning = f"\n**Warning:** {text}\n" if (text := busy_warning(report)) else ""
    if meta.get("not_run"):
        warning += f"\nNot run (time budget spent): {', '.join(meta['not_run'])}.\n"
    partial = ""
    if meta.get("partial"):
        pending = meta.get("pending") or []
        measured = len({r.workload for r in report.results})
        counted = f"{measured} of {measured + len(pending)} workloads measured"
        partial = (
            f"**Stopped** by {meta['stopped']}: {counted}; not measured: {', '.join(pending)}.\n\n"
            if meta.get("stopped")
            else "**Partial report**, written while the run was going: "
            f"{counted}; still to run: {', '.join(pending)}. The finished run rewrites "
            "this file.\n\n"
        )
    return f"""# Ops benchmark: {meta["device"]} ({meta["date"]})

{partial}- date: {meta["timestamp"]}
- device: {meta["device_name"]} ({meta["device"]})
- torch {meta["torch"]}, Python {meta["python"]}, {meta["threads"]} threads
- copy bandwidth (`dst.copy_(src)`, bytes read + written): {_copy(meta)}
- dtype {config["dtype"]}, grad="{config["grad"]}", eps {config["eps"]}
- repeats {config["repeats"]} (interleaved across impls){_calls(meta, ", each the mean of {} calls back to back between two synchronizations")}, warm-up {config["warmup"]} after the first call
- load average (1, 5, 15 min): {meta["load_average_start"]} at start, {meta["load_average_end"]} at end
- command: `{meta["command"]}`

Median wall-clock ms per call; in brackets the speedup over `literal` (literal median /
impl median, same workload and mode). `fwd` runs under `torch.no_grad()`; `fwd+bwd` adds
`backward` of a fixed random upstream gradient. `cf N d=D` is `continued_fraction` on
a (N, D); `ladder RxN d=D` is `univariate_ladder` on x (R, N) with weight and bias (D, N);
`ensemble RxP L=L d=D` is `ladder_ensemble` (the elementwise Cffn's ladders) on x (R, P)
with weight and bias (D, L, P) and mix (P, L); `Cffn-scalar` / `Cffn-elementwise` time a
whole `Cffn` layer (gate, U and ladders) on x (R, P). "fastest" names the fastest impl
(auto only when the impl it picked was not timed itself) with its bandwidth: the minimum bytes the op must move (inputs read and
outputs written once; fwd+bwd adds the backward's reads and gradient writes) over its
median time, and that as a share of the copy bandwidth above; for Cffn layers, the
ladders' share of the layer's time (1 - time of its matmuls alone / time of the layer;
"<0% (noise)" where the layer timed faster than its matmuls alone).
"skipped": triton on a CPU, where only Triton's interpreter could run it.
"other load" is the share of the machine's CPU that other processes used while that
workload was timed (from /proc/stat); above {percent(BUSY_THRESHOLD)} its numbers are unreliable.

{summary}
{warning}
## Targets

{targets}

## Details

"first call" is the first call of each (impl, mode) on that workload: `torch.compile`
compiles there (`auto` reuses `compiled`'s kernels when it picks them, and kernels
compiled for one workload are dropped before the next). "max abs diff" compares the
forward output with `literal`'s. "page faults" counts the minor page faults of one more
call after timing (getrusage): on CPU, tensors of 32 MiB and more come fresh from the OS
on every call and fault on first touch, which can cost more than the arithmetic.

{details}
"""


def device_label(meta: dict[str, Any]) -> str:
    """``cpu``, or the CUDA device's name as a file-name slug (``nvidia-h200``)."""
    if meta["device"] == "cpu":
        return "cpu"
    return name_slug(meta["device_name"]) or meta["device"]


def report_stem(report: Report, out_dir: Path, suffix: str = "") -> Path:
    """``out_dir/ops-<device>-<date><suffix>``, numbered when taken (:func:`free_stem`).

    <device> is ``cpu`` or the GPU's name (``ops-nvidia-h200-2026-12-01``).
    """
    return free_stem(out_dir, f"ops-{device_label(report.meta)}-{report.meta['date']}{suffix}")


def write_report(report: Report, out_dir: Path, stem: Path | None = None) -> tuple[Path, Path]:
    """Write ``<stem>.md`` and ``.json`` (default: a new :func:`report_stem`); a run passes
    its stem to rewrite its own report as it goes."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = report_stem(report, out_dir) if stem is None else stem
    md_path, json_path = with_suffix(stem, ".md"), with_suffix(stem, ".json")
    write_text_atomic(md_path, to_markdown(report))
    write_text_atomic(json_path, json.dumps(report.to_dict(), indent=2) + "\n")
    return md_path, json_path
