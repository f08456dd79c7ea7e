"""``cofr sweep report``: plots and a markdown summary of a study, on disk and in MLflow.

Files (``runs/sweeps/<study>/report/`` by default): ``optimization_history.png``,
``param_importances.png``, ``heatmap.png`` (the objective over depth x ladders, best
value per cell), ``intermediate_values.png`` (the pruner's view: objective per global
step), ``trials.csv`` and ``summary.md``. The same files go to the study's parent MLflow
run under ``report/``, with the best value as a metric and the best params as tags.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from cofrgenet.atomic import replacing, write_text_atomic
from cofrgenet.sweeps import storage as st
from cofrgenet.sweeps.objective import RUN_DIR_ATTR, trial_run_dir
from cofrgenet.sweeps.spec import ParamSpec, Sweep, counted
from cofrgenet.sweeps.status import note, retried_as


def _savefig(figure: Any, path: Path) -> None:
    with replacing(path) as tmp:  # workers that finish together each write the report
        figure.savefig(tmp, dpi=110, bbox_inches="tight")


def _axis_order(value: Any) -> tuple[int, Any]:
    """Sort key of a categorical choice (None, a number or a string: Optuna's kinds): None
    first, then numbers, then strings, so a choice list mixing them still sorts."""
    if value is None:
        return (0, 0)
    return (1, value) if isinstance(value, int | float) else (2, str(value))


#: An axis lists every value of its searched range up to this many (else those drawn).
MAX_AXIS_VALUES = 12


def axis_values(spec: ParamSpec | None) -> list[Any]:
    """The values a heat-map axis shows whether drawn or not: a choice list's, or an int
    range's (or a float range's grid) of at most :data:`MAX_AXIS_VALUES`; [] otherwise."""
    if spec is None or (spec.kind == "float" and not spec.grid):
        return []
    # Counted first: a TPE sweep's int range of a billion values is not made to be dropped.
    return spec.grid_values() if spec.grid_count() <= MAX_AXIS_VALUES else []


def heatmap_table(
    trials: list[FrozenTrial],
    x_key: str,
    y_key: str,
    maximize: bool,
    x_values: Sequence[Any] = (),
    y_values: Sequence[Any] = (),
) -> tuple[list[Any], list[Any], list[list[float]]]:
    """(x values, y values, best objective per cell, NaN where no trial completed).

    The axes hold every value a trial drew, so that a row or column whose trials were all
    pruned or failed shows as such instead of vanishing, and ``x_values``/``y_values``
    (the searched ranges, :func:`axis_values`), so that the cells not yet tried show too;
    both empty when no trial drew both keys."""
    drawn = [t for t in trials if x_key in t.params and y_key in t.params]
    if not drawn:
        return [], [], []
    xs = sorted({t.params[x_key] for t in drawn} | set(x_values), key=_axis_order)
    ys = sorted({t.params[y_key] for t in drawn} | set(y_values), key=_axis_order)
    cells = [[math.nan] * len(xs) for _ in ys]
    for t in drawn:
        if t.state != TrialState.COMPLETE or t.value is None:
            continue
        i, j = ys.index(t.params[y_key]), xs.index(t.params[x_key])
        old = cells[i][j]
        better = t.value > old if maximize else t.value < old
        if math.isnan(old) or better:
            cells[i][j] = t.value
    return xs, ys, cells


def plot_heatmap(
    xs: list[Any],
    ys: list[Any],
    cells: list[list[float]],
    x_key: str,
    y_key: str,
    metric: str,
    path: Path,
) -> None:
    import matplotlib.pyplot as plt
    import numpy as np

    data = np.array(cells, dtype=float)
    figure, ax = plt.subplots(figsize=(1.2 * max(len(xs), 3) + 2, 1.0 * max(len(ys), 3) + 1))
    masked = np.ma.masked_invalid(data)
    image = ax.imshow(masked, cmap="viridis_r", origin="lower", aspect="auto")
    ax.set_xticks(range(len(xs)), [str(x) for x in xs])
    ax.set_yticks(range(len(ys)), [str(y) for y in ys])
    ax.set_xlabel(x_key)
    ax.set_ylabel(y_key)
    for i in range(len(ys)):
        for j in range(len(xs)):
            text = "-" if math.isnan(data[i, j]) else f"{data[i, j]:.3f}"
            ax.text(
                j, i, text, ha="center", va="center", fontsize=9,
                bbox={"facecolor": "white", "alpha": 0.7, "edgecolor": "none"},
            )  # fmt: skip
    ax.grid(False)
    if not masked.mask.all():  # a colour bar without any value is an empty strip
        figure.colorbar(image, ax=ax, label=metric)
    ax.set_title(f"{metric} (best per cell)")
    _savefig(figure, path)
    plt.close(figure)


#: Parameter importances from fewer complete trials than this carry a warning.
MIN_TRIALS_FOR_IMPORTANCE = 10


def _optuna_plot(
    name: str, study: optuna.Study, path: Path, caveat: str | None = None, **kwargs: Any
) -> str | None:
    """Save one optuna.visualization.matplotlib plot (``caveat`` under its title); the
    error text if it cannot."""
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as ovm

    verbosity = optuna.logging.get_verbosity()
    try:
        # Optuna logs (not warns) "There are no complete trials." and the like: the
        # summary says what a plot lacks.
        optuna.logging.set_verbosity(optuna.logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ax = getattr(ovm, name)(study, **kwargs)
        figure = ax.figure if hasattr(ax, "figure") else ax.flat[0].figure
        if caveat and hasattr(ax, "set_title"):
            # Under the axis label: a second title line ran into optuna's own title.
            ax.set_xlabel(f"{ax.get_xlabel()}\n({caveat})")
        _savefig(figure, path)
        plt.close(figure)
        return None
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    finally:
        optuna.logging.set_verbosity(verbosity)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    # A Markdown table row is one line: a newline in a cell ends the table.
    return "" if value is None else " ".join(str(value).split()).replace("|", "/")


def summary_markdown(
    study: optuna.Study,
    sweep: Sweep,
    images: dict[str, str],
    skipped: dict[str, str],
    heat: tuple | None,
    caveats: dict[str, str] | None = None,
) -> str:
    caveats = caveats or {}
    trials = study.get_trials(deepcopy=False)
    keys = [p.key for p in sweep.space]
    lines = [
        f"# Sweep report: {study.study_name}",
        "",
        f"Objective: {sweep.objective.direction} `{sweep.objective.metric}`; "
        f"sampler {sweep.sampler.get('name')}, pruner {sweep.pruner.get('name')}; "
        f"{counted(len(trials), 'trial')}: {st.state_counts(trials)}.",
        "",
    ]
    try:
        best = study.best_trial
    except ValueError:
        best = None
    if best is None:
        lines += ["No trial completed.", ""]
    else:
        folder = best.user_attrs.get(RUN_DIR_ATTR) or trial_run_dir(
            sweep, sweep.runs_dir, st.root_number(best)
        )
        lines += [
            f"## Best trial: #{best.number}, {sweep.objective.metric} = {best.value:.6g}",
            "",
            *[f"* `{k}`: {best.params.get(k)}" for k in keys],
            f"* run folder: `{folder}`",
            "",
        ]
    if heat is not None:
        xs, ys, cells, x_key, y_key = heat
        lines += [
            f"## {sweep.objective.metric} by {y_key} (rows) x {x_key} (columns)",
            "",
            "| " + y_key.rsplit(".", 1)[-1] + " \\ " + x_key.rsplit(".", 1)[-1] + " | "
            + " | ".join(str(x) for x in xs) + " |",
            "|---" * (len(xs) + 1) + "|",
        ]  # fmt: skip
        for y, row in zip(ys, cells, strict=True):
            lines.append(
                f"| {y} | " + " | ".join("-" if math.isnan(v) else f"{v:.4f}" for v in row) + " |"
            )
        lines += ["", "-: no completed trial there (pruned, failed, or none drawn yet).", ""]
    lines += ["## Plots", ""]
    for title, file in images.items():
        lines.append(f"![{title}]({file})")
        if title in caveats:
            lines += ["", f"*{title.capitalize()}: {caveats[title]}.*", ""]
    lines += [f"* {title}: not drawn ({why})" for title, why in skipped.items()]
    lines += [
        "",
        "## Trials",
        "",
        "| # | state | " + " | ".join(k.rsplit(".", 1)[-1] for k in keys) + " | value | note |",
        "|---" * (len(keys) + 4) + "|",
    ]
    retried = retried_as(trials)
    for t in trials:
        why = note(t, retried, lost={})  # as cofr sweep status says it (retries too)
        if len(why) > 160:
            why = why[:157] + "..."
        lines.append(
            f"| {t.number} | {t.state.name} | "
            + " | ".join(_cell(t.params.get(k)) for k in keys)
            + f" | {_cell(t.value)} | {_cell(why)} |"
        )
    return "\n".join(lines) + "\n"


def write_report(
    study: optuna.Study,
    sweep: Sweep,
    out: Path,
    client: Any = None,
    parent_run_id: str | None = None,
) -> dict[str, Path]:
    """Write the report files to ``out`` (and the parent MLflow run); returns them.

    Writers of one folder take turns (an flock on ``.<out>.lock`` beside it): the workers
    that finish a sweep together each write the report, and one must not delete a plot
    the other has just written.
    """
    from cofrgenet.folder_lock import waiting_for

    out.mkdir(parents=True, exist_ok=True)
    with waiting_for(
        out.parent / f".{out.name}.lock",
        f"writing {out} (workers finishing together may mix their files)",
    ):
        return _write_report(study, sweep, out, client, parent_run_id)


def _write_report(
    study: optuna.Study,
    sweep: Sweep,
    out: Path,
    client: Any,
    parent_run_id: str | None,
) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    images: dict[str, str] = {}
    skipped: dict[str, str] = {}
    complete = sum(t.state == TrialState.COMPLETE for t in study.get_trials(deepcopy=False))
    caveats: dict[str, str] = {}
    if complete < MIN_TRIALS_FOR_IMPORTANCE:
        caveats["parameter importances"] = (
            f"from {counted(complete, 'complete trial')} only: not reliable below "
            f"{MIN_TRIALS_FOR_IMPORTANCE}"
        )
    plots = {
        "optimization history": ("plot_optimization_history", "optimization_history.png", {}),
        "parameter importances": ("plot_param_importances", "param_importances.png", {}),
        "intermediate values": ("plot_intermediate_values", "intermediate_values.png", {}),
    }
    if complete < 2:  # one trial has no spread to apportion: equal bars that mean nothing
        del plots["parameter importances"]
        skipped["parameter importances"] = (
            f"{counted(complete, 'complete trial')}: at least 2 needed"
        )
        (out / "param_importances.png").unlink(missing_ok=True)
    for title, (name, file, kwargs) in plots.items():
        error = _optuna_plot(name, study, out / file, caveats.get(title), **kwargs)
        if error is None:
            images[title] = file
        else:
            skipped[title] = error
            (out / file).unlink(missing_ok=True)
    heat = None
    keys = sweep.heatmap_keys()
    if keys is not None:
        x_key, y_key = keys
        specs = {p.key: p for p in sweep.space}
        xs, ys, cells = heatmap_table(
            study.get_trials(deepcopy=False),
            x_key,
            y_key,
            sweep.objective.direction == "maximize",
            axis_values(specs.get(x_key)),
            axis_values(specs.get(y_key)),
        )
        if xs and ys:
            plot_heatmap(xs, ys, cells, x_key, y_key, sweep.objective.metric, out / "heatmap.png")
            images[f"{y_key} x {x_key}"] = "heatmap.png"
            heat = (xs, ys, cells, x_key, y_key)
        else:
            skipped["heat map"] = "no completed trial"
    try:
        frame = study.trials_dataframe()
        with replacing(out / "trials.csv") as tmp:
            frame.to_csv(tmp, index=False)
    except Exception as error:
        skipped["trials.csv"] = f"{type(error).__name__}: {error}"
    text = summary_markdown(study, sweep, images, skipped, heat, caveats)
    write_text_atomic(out / "summary.md", text)
    if client is not None and parent_run_id:
        client.log_artifacts(parent_run_id, str(out), "report")
        try:
            best = study.best_trial
            client.log_metric(parent_run_id, "best_value", float(best.value))
            client.set_tag(parent_run_id, "best.trial_number", str(best.number))
            for key, value in best.params.items():
                client.set_tag(parent_run_id, f"best.{key}", str(value))
        except ValueError:
            pass
    return {p.name: p for p in out.iterdir() if p.is_file() and not p.name.startswith(".")}
