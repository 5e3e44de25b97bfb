"""The rules that move a sweep, written once for both drivers: `gpt2bench run` (local/sweep.py) and the operator
(controller/sweep.py) ask this module and do what it answers; it never calls back into either. Pure: the
benchmark, its runs' entries and the clock in, entries and decisions out; phases come from the status schema.

- `add_round`: repeat until decided (`sweep.maxRepeats`): once every planned run has finished, one more round of
  the configurations still racing (report.sequential, the selection race), or why the sweep stops;
- `tally`: what a sweep's entries say of it: counts, the overall phase, the best configuration, rounds done;
- `spec_document`: the spec as results.json and the status keep it (camelCase), which every rule reads.

docs/design.md, The sweep core.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpt2bench import collect
from gpt2bench.plan import Run, plan_runs
from gpt2bench.report.sequential import next_round, race_stops, rounds_done
from gpt2bench.specification.model import Benchmark, GPT2BenchmarkSpec
from gpt2bench.status import (
    FAILED,
    PENDING,
    SKIPPED,
    SUCCEEDED,
    TERMINAL_RUN_PHASES,
    BestRun,
    DroppedConfiguration,
    RunStatus,
    best_run,
    overall_phase,
)


def spec_document(spec: GPT2BenchmarkSpec) -> dict[str, Any]:
    """The spec in camelCase without unset fields: results.json's `spec`, and what the race's rules read."""
    return spec.model_dump(by_alias=True, exclude_none=True, mode="json")


@dataclass(frozen=True)
class Rounds:
    """What a sweep's document (results.json, the status) keeps of its rounds."""

    planned: int | None = None
    done: int | None = None
    stop_reason: str | None = None
    racing: int | None = None
    dropped: list[DroppedConfiguration] | None = None


@dataclass(frozen=True)
class RoundStep:
    """The answer of `add_round`: the rounds' new record; the new round's runs and their Pending entries (none
    when the sweep stops: `rounds.stop_reason` says why); `added`: why a round was added."""

    rounds: Rounds
    runs: list[Run]
    entries: list[RunStatus]
    added: str | None = None


def add_round(benchmark: Benchmark, entries: list[RunStatus], rounds: Rounds, start_time: str | None,
              now: datetime, backend: str | None = None,
              chosen: Callable[[Run], bool] | None = None) -> RoundStep | None:
    """After the last planned run: one more round of the configurations still racing (those `chosen` admits: a
    local sweep of some configurations only), in the round's own shuffled order, or why no round is added.
    None: nothing to decide yet (no sweep.maxRepeats, or a run has not finished)."""
    if benchmark.spec.sweep.max_repeats is None or any(e.phase not in TERMINAL_RUN_PHASES for e in entries):
        return None
    step = next_round(entries, spec_document(benchmark.spec), start_time, now)
    if not step.add:
        return RoundStep(Rounds(rounds.planned, step.rounds_done, step.reason, 0, step.dropped or None), [], [])
    planned = (rounds.planned or 0) + 1
    new = [run for run in plan_runs(benchmark, backend, rounds=planned,
                                    stopped=race_stops(entries, step.racing, planned))
           if run.repeat == planned and (chosen is None or chosen(run))]
    return RoundStep(Rounds(planned, step.rounds_done, None, len(step.racing), step.dropped or None), new,
                     [collect.run_entry(run, phase=PENDING) for run in new], step.reason)


def newly_dropped(before: list[DroppedConfiguration] | None,
                  after: list[DroppedConfiguration] | None) -> list[DroppedConfiguration]:
    """The configurations a race dropped since `before` (each said once: an Event, a progress line)."""
    known = {d.configuration for d in before or []}
    return [d for d in after or [] if d.configuration not in known]


@dataclass(frozen=True)
class Tally:
    """What a sweep's entries say of it."""

    phase: str
    total: int
    done: int
    succeeded: int
    failed: int
    skipped: int
    best: BestRun | None
    rounds_done: int | None


def tally(entries: list[RunStatus], rounds: bool) -> Tally:
    """Counts, the overall phase (Running until every run is done), the best configuration and, for a sweep in
    rounds, the rounds whose every run has finished."""
    return Tally(phase=overall_phase(entries), total=len(entries),
                 done=sum(e.phase in TERMINAL_RUN_PHASES for e in entries),
                 succeeded=sum(e.phase == SUCCEEDED for e in entries),
                 failed=sum(e.phase == FAILED for e in entries), skipped=sum(e.phase == SKIPPED for e in entries),
                 best=best_run(entries), rounds_done=rounds_done(entries) if rounds else None)
