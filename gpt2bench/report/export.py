"""results.csv: one row per run with every summary figure, for spreadsheets and pandas (`csv` module).

Columns: the run's identity (results.json's camelCase names), every `RunResults` figure in its declared
order, then the derived figures of docs/analysis.md: `configuration`, `scale`, `scalingEfficiency` (this
run's tokens/s per device ÷ its strategy and precision's mean at their smallest scale), `hourlyPrice` and
`costPer1MTokens` (from spec.cost). Empty cells: not measured, or not applicable.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from gpt2bench.files import write_atomic
from gpt2bench.report.measures import (
    Prices,
    configuration_name,
    configurations,
    run_devices,
    run_efficiency,
    scale_of,
)
from gpt2bench.status import ResultsDocument, RunResults

RESULTS_CSV = "results.csv"
RUN_COLUMNS = ["name", "configuration", "repeat", "strategy", "precision", "scale", "nodes", "devicesPerNode",
               "processesPerNode", "devices", "jobKind", "jobName", "phase", "reason", "startTime", "completionTime"]
RESULT_COLUMNS = [field.alias or name for name, field in RunResults.model_fields.items()]
DERIVED_COLUMNS = ["scalingEfficiency", "hourlyPrice", "currency", "costPer1MTokens"]
COLUMNS = RUN_COLUMNS + RESULT_COLUMNS + DERIVED_COLUMNS


def csv_rows(doc: ResultsDocument) -> list[dict[str, Any]]:
    configs = configurations(doc.runs)
    prices = Prices.from_spec(doc.spec)
    rows = []
    for run in doc.runs:
        entry = run.dump()
        row: dict[str, Any] = {key: entry.get(key) for key in RUN_COLUMNS}
        row |= {"configuration": configuration_name(run), "scale": scale_of(run).label, "devices": run_devices(run)}
        row |= (run.results.dump() if run.results else {})
        row["scalingEfficiency"] = run_efficiency(run, configs)
        if prices is not None:
            row |= {"hourlyPrice": prices.hourly(run), "currency": prices.currency,
                    "costPer1MTokens": prices.per_million_tokens(run)}
        rows.append(row)
    return rows


def write_csv(doc: ResultsDocument, directory: Path) -> Path:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, extrasaction="raise", lineterminator="\n")
    writer.writeheader()
    writer.writerows(csv_rows(doc))
    path = directory / RESULTS_CSV
    write_atomic(path, buffer.getvalue())
    return path
