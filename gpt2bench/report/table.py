"""The comparison tables: one row per run (every run, failed ones with their reason) and, with repeats, one row
per configuration (mean ± spread). The same cells in results.md and on the terminal."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from gpt2bench.report.measures import (
    Configuration,
    Metric,
    Stat,
    grad_norm,
    peak_memory,
    scale_of,
    tokens_per_second,
    tokens_per_second_per_device,
    train_seconds,
)
from gpt2bench.status import ResultsDocument, RunResults, RunStatus, status_label

NO_VALUE = "—"
MIB = 2**20


def number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return None if math.isnan(value) or math.isinf(value) else float(value)


def fmt(value: Any, spec: str, scale: float = 1.0) -> str:
    figure = number(value)
    return NO_VALUE if figure is None else format(figure * scale, spec)


def fmt_stat(stat: Stat | None, spec: str, scale: float = 1.0) -> str:
    """`mean ± sd`, or the mean alone when measured once."""
    if stat is None:
        return NO_VALUE
    text = fmt(stat.mean, spec, scale)
    return text if stat.spread is None else f"{text} ± {fmt(stat.spread, spec, scale)}"


def scale_label(entry: RunStatus) -> str:
    """`1×2 CPU` / `2×4 GPU`: nodes × devices per node (GPUs, or worker processes on CPU)."""
    return scale_of(entry).label


def _figures(entry: RunStatus) -> RunResults:
    return entry.results or RunResults()


# (header, cell of a run)
COLUMNS: list[tuple[str, Callable[[RunStatus], str]]] = [
    ("run", lambda e: e.name),
    ("strategy", lambda e: e.strategy),
    ("precision", lambda e: e.precision),
    ("scale", scale_label),
    ("tokens/s", lambda e: fmt(_figures(e).tokens_per_second, ",.0f")),
    ("per device", lambda e: fmt(_figures(e).tokens_per_second_per_device, ",.0f")),
    ("step p50 / p95 (ms)", lambda e: f"{fmt(_figures(e).step_time_p50_seconds, '.1f', 1e3)} / "
                                      f"{fmt(_figures(e).step_time_p95_seconds, '.1f', 1e3)}"),
    ("peak mem (MiB)", lambda e: fmt(_figures(e).peak_memory_bytes, ",.1f", 1 / MIB)),
    ("train s", lambda e: fmt(_figures(e).train_seconds, ".1f")),
    ("final loss", lambda e: fmt(_figures(e).final_loss, ".4f")),
    ("grad norm", lambda e: fmt(_figures(e).grad_norm, ".3f")),
    # each rank's intra-op threads / its share of the pod's cores: runs compare fairly only where these match
    ("threads / cores per rank", lambda e: f"{fmt(_figures(e).threads_per_rank, '.0f')} / "
                                           f"{fmt(_figures(e).cores_per_rank, '.3g')}"),
    ("status", status_label),
]
TEXT_COLUMNS = {"run", "strategy", "precision", "scale", "status"}


def table_rows(doc: ResultsDocument) -> list[list[str]]:
    """One row of cell texts per run, in the document's order."""
    return [[cell(entry) for _, cell in COLUMNS] for entry in doc.runs]


def md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table(headers: list[str], rows: list[list[str]], text_columns: set[str]) -> str:
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---" if h in text_columns else "---:" for h in headers) + "|"]
    lines += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def results_table_markdown(doc: ResultsDocument) -> str:
    """The runs table as GitHub markdown, one row per run (failed runs included, with reasons)."""
    return markdown_table([h for h, _ in COLUMNS], table_rows(doc), TEXT_COLUMNS)


# (header, figure, format, scale) of the configurations table
CONFIG_COLUMNS: list[tuple[str, Metric, str, float]] = [
    ("tokens/s", tokens_per_second, ",.0f", 1.0),
    ("per device", tokens_per_second_per_device, ",.0f", 1.0),
    ("peak mem (MiB)", peak_memory, ",.1f", 1 / MIB),
    ("train s", train_seconds, ".1f", 1.0),
    ("grad norm", grad_norm, ".3f", 1.0),
]


def fmt_geometric(values: list[float], spec: str, scale: float = 1.0) -> str:
    """`1,907 ± 8.7 %`: the geometric mean (the figure every decision, status field and metric uses) and the
    noise of one run (the sample standard deviation of ln x, as a share), or the value alone when measured once."""
    positive = [v for v in values if v > 0]
    if not positive:
        return NO_VALUE
    logs = [math.log(v) for v in positive]
    mean = sum(logs) / len(logs)
    text = format(math.exp(mean) * scale, spec)
    if len(logs) < 2:
        return text
    noise = math.sqrt(sum((x - mean) ** 2 for x in logs) / (len(logs) - 1))
    return f"{text} ± {noise:.1%}"


def configurations_markdown(configs: list[Configuration], race: dict[str, str] | None = None) -> str:
    """Per configuration over its succeeded decision rounds: the geometric mean ± the noise of one run (sd of ln x);
    with `race`, where each configuration stands in its scale's selection race."""
    headers = ["configuration", "scale", "succeeded"] + [h for h, *_ in CONFIG_COLUMNS]
    rows = [[c.name, c.scale.label, f"{len(c.succeeded)}/{len(c.runs)}"]
            + [fmt_geometric(c.values(metric), spec, scale) for _, metric, spec, scale in CONFIG_COLUMNS]
            for c in configs]
    if race is not None:
        headers.append("race")
        for row, config in zip(rows, configs):
            row.append(race.get(config.name, NO_VALUE))
    return markdown_table(headers, rows, {"configuration", "scale", "succeeded", "race"})


def repeated(doc: ResultsDocument) -> bool:
    return any(run.repeat for run in doc.runs)
