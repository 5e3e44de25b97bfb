"""The papers' figures as PNGs (matplotlib, Agg): per-run bars grouped by strategy and coloured by precision,
one panel per scale, mean with the repeats' spread as error bars and each repeat as a dot; loss per step and
per wall-clock second; scaling efficiency per strategy. Every title says what was measured and on what."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

from gpt2bench.report.measures import (
    BREAKDOWN_PARTS,
    Configuration,
    Metric,
    configurations,
    grad_norm,
    hardware,
    peak_memory,
    result,
    scales,
    tokens_per_second,
    train_seconds,
)
from gpt2bench.report.table import MIB, number
from gpt2bench.status import ResultsDocument, ScalingEfficiency

PRECISION_COLOURS = {"fp32": "#4C72B0", "fp16": "#DD8452", "bf16": "#55A868"}
PRECISION_DASHES = {"fp32": "-", "fp16": "--", "bf16": ":"}  # curves: colour is the strategy there

# file, figure of a run, scale, y label, title
BAR_PLOTS: list[tuple[str, Metric, float, str, str]] = [
    ("throughput.png", tokens_per_second, 1.0, "tokens / s (whole job)", "Training throughput"),
    ("peak_memory.png", peak_memory, 1 / MIB, "peak memory (MiB, largest rank)", "Peak memory per device"),
    ("train_time.png", train_seconds, 1.0, "training time (s, worker 0)", "Training time"),
    ("grad_norm.png", grad_norm, 1.0, "gradient norm, last step (before clipping)", "Final gradient norm"),
]
# file, keys a step record may carry, x axis, y label, title
CURVE_PLOTS: list[tuple[str, tuple[str, ...], str, str, str]] = [
    ("loss.png", ("loss",), "step", "training loss", "Loss per step"),
    ("loss_time.png", ("loss",), "seconds", "training loss", "Loss per wall-clock second"),
    ("grad_norm_steps.png", ("grad_norm", "gradNorm"), "step", "gradient norm (before clipping)",
     "Gradient norm per step"),
]
SCALING_PLOT = "scaling.png"
BREAKDOWN_PLOT = "breakdown.png"
ALL_PLOTS = [p[0] for p in BAR_PLOTS] + [p[0] for p in CURVE_PLOTS] + [SCALING_PLOT, BREAKDOWN_PLOT]
X_LABELS = {"step": "step", "seconds": "seconds of training (step times summed, warm-up included)"}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fig.savefig(tmp, format="png", dpi=110)
        os.replace(tmp, path)
    finally:
        _pyplot().close(fig)
        tmp.unlink(missing_ok=True)


def _short(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.3g}"


def _precisions(configs: list[Configuration]) -> list[str]:
    return list(dict.fromkeys(c.precision for c in configs))


def bar_chart(path: Path, configs: list[Configuration], metric: Metric, factor: float, ylabel: str,
              title: str) -> None:
    from matplotlib.patches import Patch

    plt = _pyplot()
    panels = scales(configs)
    precisions = _precisions(configs)
    groups = [list(dict.fromkeys(c.strategy for c in configs if c.scale == s)) for s in panels]
    width = min(20.0, max(6.5, 1.5 + sum(len(g) for g in groups) * (0.35 + 0.3 * len(precisions))))
    fig, axes = plt.subplots(1, len(panels), figsize=(width, 5.0), squeeze=False,
                             gridspec_kw={"width_ratios": [max(len(g), 1) for g in groups]})
    bar_width = 0.8 / len(precisions)
    for ax, scale, strategies in zip(axes[0], panels, groups):
        for (i, strategy), (j, precision) in itertools.product(enumerate(strategies), enumerate(precisions)):
            config = next((c for c in configs if (c.strategy, c.precision, c.scale) == (strategy, precision, scale)),
                          None)
            if config is None:
                continue
            x = i - 0.4 + bar_width * (j + 0.5)
            stat = config.stat(metric)
            if stat is None:  # planned but nothing to show: say why rather than leave a silent gap
                ax.text(x, 0, " failed" if not config.succeeded else " n/a", rotation=90, ha="center",
                        va="bottom", fontsize=7, color="0.35")
                continue
            bars = ax.bar(x, stat.mean * factor, bar_width, color=PRECISION_COLOURS.get(precision, "0.5"),
                          yerr=None if stat.spread is None else stat.spread * factor, capsize=3)
            ax.bar_label(bars, labels=[_short(stat.mean * factor)], fontsize=7, padding=2)
            if stat.n >= 2:
                values = [metric(run) * factor for run in config.succeeded if metric(run) is not None]
                ax.scatter([x] * len(values), values, s=9, color="black", zorder=3)
        ax.set_xticks(range(len(strategies)), strategies, rotation=20 if len(strategies) > 4 else 0)
        ax.set_title(scale.label, fontsize=10)
        ax.margins(y=0.15)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    handles = [Patch(color=PRECISION_COLOURS.get(p, "0.5"), label=p) for p in precisions]
    fig.legend(handles=handles, title="precision", loc="center right", fontsize=8)
    runs = [run for config in configs for run in config.runs]
    fig.suptitle(f"{title} per run, by strategy and precision\non {hardware(runs)}", fontsize=10)
    if any(len(c.succeeded) > 1 for c in configs):
        fig.text(0.01, 0.01, "bars: mean over repeats; whiskers: ± sample standard deviation; dots: each repeat",
                 fontsize=7, color="0.3")
    fig.tight_layout(rect=(0, 0.03, 0.88, 1))
    _save(fig, path)


def _curve(records: list[dict[str, Any]], keys: tuple[str, ...], x_axis: str) -> tuple[list[float], list[float]]:
    xs, ys, elapsed = [], [], 0.0
    for record in records:
        elapsed += number(record.get("step_seconds")) or 0.0
        value = next((v for k in keys if (v := number(record.get(k))) is not None), None)
        if value is None or not isinstance(record.get("step"), int):
            continue
        xs.append(float(record["step"]) if x_axis == "step" else elapsed)
        ys.append(value)
    return xs, ys


def curve_chart(path: Path, configs: list[Configuration], curves: dict[str, list[dict[str, Any]]],
                keys: tuple[str, ...], x_axis: str, ylabel: str, title: str) -> bool:
    """One panel per scale (global batch differs between scales); colour: strategy, dashes: precision. The
    first repeat of each configuration that wrote records. False when no configuration has such records."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    colours = {s: f"C{i}" for i, s in enumerate(dict.fromkeys(c.strategy for c in configs))}
    lines: dict[Any, list[tuple[Configuration, Any, list[float], list[float]]]] = {}
    for config in configs:
        for run in config.runs:
            xs, ys = _curve(curves.get(run.name) or [], keys, x_axis)
            if xs:
                lines.setdefault(config.scale, []).append((config, run, xs, ys))
                break
    if not lines:
        return False
    panels = sorted(lines)
    fig, axes = plt.subplots(1, len(panels), figsize=(max(8.0, 5.0 * len(panels)), 4.8), squeeze=False)
    for ax, scale in zip(axes[0], panels):
        for config, run, xs, ys in lines[scale]:
            label = config.label + ("" if run.phase == "Succeeded" else f" ({run.phase})")
            ax.plot(xs, ys, label=label, color=colours[config.strategy], linewidth=1.4,
                    linestyle=PRECISION_DASHES.get(config.precision, "-."),
                    marker="o" if len(xs) < 30 else None, markersize=3)
        ax.set_title(scale.label, fontsize=10)
        ax.set_xlabel(X_LABELS[x_axis])
        if x_axis == "step":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
    axes[0][0].set_ylabel(ylabel)
    fig.suptitle(f"{title} (colour: strategy, dashes: precision; first repeat)\n"
                 f"on {hardware(r for c in configs for r in c.runs)}", fontsize=10)
    fig.tight_layout()
    _save(fig, path)
    return True


def scaling_chart(path: Path, rows: list[ScalingEfficiency], device_label: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.8))
    strategies = list(dict.fromkeys(r.strategy for r in rows))
    groups: dict[tuple[str, str], list[ScalingEfficiency]] = {}
    for row in rows:
        groups.setdefault((row.strategy, row.precision), []).append(row)
    for (strategy, precision), group in groups.items():
        ax.errorbar([r.devices for r in group], [r.efficiency for r in group],
                    yerr=[r.spread or 0.0 for r in group], label=f"{strategy}-{precision}", capsize=3, marker="o",
                    color=f"C{strategies.index(strategy)}", linestyle=PRECISION_DASHES.get(precision, "-."))
    ax.axhline(1.0, color="0.5", linestyle="--", linewidth=1, label="linear scaling")
    ax.set_xticks(sorted({r.devices for r in rows}))
    ax.set_xlabel("devices (GPUs, or worker processes on CPU)")
    ax.set_ylabel("scaling efficiency")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    ax.set_title(f"Scaling efficiency: tokens/s per device ÷ at the strategy's smallest scale\non {device_label}",
                 fontsize=10)
    fig.tight_layout()
    _save(fig, path)


def breakdown_chart(path: Path, configs: list[Configuration]) -> bool:
    """One stacked bar per configuration: the mean step split into data, forward, backward, optimizer, other and
    exposed communication (hidden communication overlaps the others, so it is not a part); False if no run
    has a breakdown."""
    rows = []
    for config in configs:
        parts = [config.breakdown_stat(result(field)) for _, field in BREAKDOWN_PARTS]  # the breakdown round's
        if all(stat is not None for stat in parts):
            rows.append((f"{config.label}\n{config.scale.label}", [stat.mean * 1e3 for stat in parts]))
    if not rows:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(min(20.0, max(6.5, 1.2 + 0.9 * len(rows))), 5.0))
    bottoms = [0.0] * len(rows)
    colours = plt.get_cmap("tab10").colors
    for k, (part, _) in enumerate(BREAKDOWN_PARTS):
        heights = [values[k] for _, values in rows]
        colour = "firebrick" if part == "exposed communication" else colours[k]
        ax.bar(range(len(rows)), heights, 0.7, bottom=bottoms, label=part, color=colour)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax.set_xticks(range(len(rows)), [label for label, _ in rows], fontsize=7, rotation=20 if len(rows) > 6 else 0)
    ax.set_ylabel("mean step time (ms, worker 0, measured steps)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    runs = [run for config in configs for run in config.runs]
    ax.set_title(f"Where a step's time goes, per configuration (mean over repeats)\non {hardware(runs)}",
                 fontsize=10)
    fig.tight_layout()
    _save(fig, path)
    return True


def write_plots(doc: ResultsDocument, curves: dict[str, list[dict[str, Any]]],
                directory: Path) -> tuple[list[str], list[str]]:
    """Write the PNGs; return (file names written, notes on plots that could not be drawn)."""
    written, notes = [], []
    configs = configurations(doc.runs)
    for filename, metric, factor, ylabel, title in BAR_PLOTS:
        measured = [c for c in configs if c.stat(metric) is not None]
        if measured:
            bar_chart(directory / filename, configs, metric, factor, ylabel, title)
            written.append(filename)
        else:
            notes.append(f"No {title.lower()} plot: no succeeded run reports it.")
    local = any(run.run_dir for run in doc.runs)
    for filename, keys, x_axis, ylabel, title in CURVE_PLOTS:
        if curve_chart(directory / filename, configs, curves, keys, x_axis, ylabel, title):
            written.append(filename)
        elif local:
            notes.append(f"No {title.lower()} curves: no run wrote such step records (steps.jsonl).")
        elif not curves:
            notes.append(f"No {title.lower()} curves: per-step records (steps.jsonl) are not part of this "
                         "results document (a cluster's status keeps summaries only; see the trainer's "
                         "Prometheus metrics for per-step values).")
        else:
            notes.append(f"No {title.lower()} curves: the runs' steps.jsonl files have no such records.")
    if breakdown_chart(directory / BREAKDOWN_PLOT, configs):
        written.append(BREAKDOWN_PLOT)
    else:
        notes.append("No breakdown plot: no succeeded run has a step breakdown (sweep.breakdown).")
    rows = doc.analysis.scaling if doc.analysis else []
    if rows:
        scaling_chart(directory / SCALING_PLOT, rows, hardware(doc.runs))
        written.append(SCALING_PLOT)
    else:
        notes.append("No scaling plot: every strategy and precision ran at one scale only.")
    return written, notes
