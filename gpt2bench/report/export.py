"""results.csv: one row per run with every summary figure, for spreadsheets and pandas (`csv` module).

Columns: the run's identity (results.json's camelCase names), every `RunResults` figure in its declared
order, then the derived figures of docs/analysis.md: `configuration`, `scale`, `scalingEfficiency` (this
run's tokens/s per device ÷ its strategy and precision's mean at their smallest scale), `hourlyPrice` and
`costPer1MTokens` (from spec.cost), its configuration's tokens/s mean, spread and measurements, and
`fastestAtScale`: where its configuration stands in the fastest recommendation of its scale under the report's
rules (winner, within-noise, not-decided, behind). Empty cells: not measured, or not applicable.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from gpt2bench.files import write_atomic
from gpt2bench.report.measures import (
    Configuration,
    Prices,
    configuration_name,
    configurations,
    run_devices,
    run_efficiency,
    scale_of,
    tokens_per_second,
)
from gpt2bench.status import Recommendation, ResultsDocument, RunResults

RESULTS_CSV = "results.csv"
RUN_COLUMNS = ["name", "configuration", "repeat", "profile", "strategy", "precision", "scale", "nodes", "devicesPerNode",
               "processesPerNode", "devices", "jobKind", "jobName", "phase", "reason", "startTime", "completionTime"]
RESULT_COLUMNS = [field.alias or name for name, field in RunResults.model_fields.items()]
DERIVED_COLUMNS = ["scalingEfficiency", "hourlyPrice", "currency", "costPer1MTokens", "configurationTokensPerSecond",
                   "configurationTokensPerSecondSpread", "configurationMeasurements", "fastestAtScale"]
COLUMNS = RUN_COLUMNS + RESULT_COLUMNS + DERIVED_COLUMNS


def csv_rows(doc: ResultsDocument) -> list[dict[str, Any]]:
    configs = configurations(doc.runs)
    by_run = {run.name: config for config in configs for run in [*config.runs, *config.profile_runs]}
    fastest = [rec for rec in (doc.analysis.recommendations if doc.analysis else []) if rec.objective == "fastest"]
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
        config = by_run[run.name]
        sample = config.sample(tokens_per_second)
        if sample.n:
            spread = math.sqrt(sample.log_squares() / (sample.n - 1)) if sample.n >= 2 else None
            row |= {"configurationTokensPerSecond": sample.geometric_mean,
                    "configurationTokensPerSecondSpread": spread, "configurationMeasurements": sample.n,
                    "fastestAtScale": standing(config.name, _group_of(config, fastest))}
        rows.append(row)
    return rows


def _group_of(config: Configuration, recs: list[Recommendation]) -> Recommendation | None:
    """The recommendation of its scale that ranked it (a scale's CPU configurations with other resources per rank
    are ranked in their own group, which `per_rank` names)."""
    here = [rec for rec in recs if rec.scale == config.scale.label]
    return next((rec for rec in here if rec.per_rank is None or rec.per_rank == config.per_rank), None)


def standing(configuration: str, rec: Recommendation | None) -> str | None:
    """Where a configuration stands in its scale's fastest decision: winner (the race's, or named beyond the noise),
    pick (the fastest or within sweep.minEffect of it), among-fastest (still in an undecided race, or a rival
    within minEffect of the pick), dropped-after-round-N (the race dropped it), not-decided (too few rounds),
    unstable (its runs fell into two speeds: not ranked), or behind (beaten, where the runs have no rounds)."""
    if rec is not None and any(u.configuration == configuration for u in rec.unstable or []):
        return "unstable"
    if rec is None or rec.run is None:
        return None
    if rec.winner == configuration:
        return "winner"
    if rec.decision == "equivalent" and rec.run == configuration:
        return "pick"
    if rec.decision == "needs-repeats":
        return "not-decided"
    dropped = next((d for d in rec.dropped or [] if d.configuration == configuration), None)
    if dropped is not None:
        return f"dropped-after-round-{dropped.round}"
    return "among-fastest" if configuration in (rec.candidates or []) else "behind"


def write_csv(doc: ResultsDocument, directory: Path) -> Path:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, extrasaction="raise", lineterminator="\n")
    writer.writeheader()
    writer.writerows(csv_rows(doc))
    path = directory / RESULTS_CSV
    write_atomic(path, buffer.getvalue())
    return path
