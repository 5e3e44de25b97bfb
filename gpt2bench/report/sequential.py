"""Repeat until decided (`sweep.maxRepeats`): after each round, add one more, for the configurations still in a
race only, while some race is undecided and the budget allows. The same rule for the local runner and the
operator; pure. Definitions: docs/analysis.md, The selection race and Repeat until decided.

The races are the fastest decision of every scale and resource group (analysis.races). A configuration that a
surviving one beats is dropped and runs no more rounds; a decided race's configurations run no more either. The
error rate holds however many rounds are looked at: each race's boundary (boundary.py) accounts for every look up
to sweep.maxRepeats.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpt2bench.clock import parse_rfc3339
from gpt2bench.plan import Key, configuration_of, stopped_configurations
from gpt2bench.report.analysis import analyze
from gpt2bench.report.measures import configuration_name
from gpt2bench.report.verdicts import short
from gpt2bench.status import TERMINAL_RUN_PHASES, DroppedConfiguration, RunStatus


@dataclass(frozen=True)
class Next:
    """Whether to add a round (`add`) and for which configurations (`racing`), and why (or why the sweep stops:
    `reason`, for the status)."""

    add: bool
    reason: str
    rounds_done: int
    racing: list[str] = field(default_factory=list)
    dropped: list[DroppedConfiguration] = field(default_factory=list)  # every configuration a race dropped so far


def rounds_done(runs: list[RunStatus]) -> int:
    """Decision rounds whose every run has finished."""
    rounds = {run.repeat for run in runs if run.repeat}
    return sum(all(r.phase in TERMINAL_RUN_PHASES for r in runs if r.repeat == k) for k in rounds)


def next_round(runs: list[RunStatus], spec: dict[str, Any], start_time: str | None, now: datetime) -> Next:
    """After the last planned round has finished: add one more round of the configurations still racing, or stop
    and say why."""
    sweep = spec.get("sweep") or {}
    done = rounds_done(runs)
    planned = max((run.repeat or 0 for run in runs), default=0)
    if not sweep.get("maxRepeats"):
        return Next(False, f"{done} rounds: sweep.repeats", done)
    if done < planned or any(run.phase not in TERMINAL_RUN_PHASES for run in runs):
        return Next(False, "rounds still running", done)
    analysis = analyze(runs, spec, rounds_needed=False)
    fastest = [r for r in analysis.recommendations if r.objective == "fastest" and r.scale is not None]
    racing = analysis.racing or []
    dropped = [d for r in fastest for d in r.dropped or []]
    if not racing:
        decided = "; ".join(f"{r.scale}{_group(r)}: {r.verdict}" for r in fastest)
        return Next(False, f"decided after {done} rounds ({decided})", done, dropped=dropped)
    labels = {configuration_name(run): f"{run.strategy} {run.precision}" for run in runs}
    open_ = "; ".join(f"{r.scale}{_group(r)} ({', '.join(short(c, labels) for c in r.candidates or [])})"
                      for r in fastest if r.decision in ("no-clear-winner", "needs-repeats"))
    if done >= int(sweep["maxRepeats"]):
        return Next(False, f"max rounds: {done} rounds run, still racing at {open_}", done, dropped=dropped)
    spent = _over_budget(runs, racing, sweep.get("budget") or {}, start_time, now)
    if spent:
        return Next(False, f"budget spent: {spent}; still racing at {open_}", done, dropped=dropped)
    return Next(True, f"round {done + 1} added for the {len(racing)} configurations still racing at {open_}", done,
                racing, dropped)


def race_stops(entries: list[RunStatus], racing: list[str], planned: int) -> dict[Key, int]:
    """The configurations that run no more (plan_runs' `stopped`): those stopped before, and every one not racing
    now, stopped after the round before `planned`."""
    stopped = stopped_configurations(entries, planned - 1)
    # by configuration, not by name: a long name is shortened with a hash to fit its -r<k> (or -prof) suffix, so
    # one configuration's runs may strip to different names
    still = {configuration_of(entry) for entry in entries if configuration_name(entry) in racing}
    for entry in entries:
        if entry.repeat and configuration_of(entry) not in still:
            stopped.setdefault(configuration_of(entry), planned - 1)
    return stopped


def _group(rec: Any) -> str:
    return f" ({rec.per_rank})" if rec.per_rank else ""


def _over_budget(runs: list[RunStatus], racing: list[str], budget: dict[str, Any], start_time: str | None,
                 now: datetime) -> str | None:
    """Why one more round would not fit the budget, or None: the next round runs the configurations still racing,
    one after another, each expected to take its runs' mean wall time (start to completion) and GPU-hours."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for run in runs:
        if run.repeat and (seconds := run.wall_seconds()) is not None:
            spans.setdefault(configuration_name(run), []).append((seconds, run.nodes * run.devices_per_node))
    known = [spans[name] for name in racing if name in spans]
    if not known:
        return None
    wall = sum(statistics.fmean(s for s, _ in found) for found in known)
    gpu = sum(statistics.fmean(s * g / 3600 for s, g in found) for found in known)
    if budget.get("wallSeconds") and start_time:
        elapsed = (now - parse_rfc3339(start_time)).total_seconds()
        if elapsed + wall > budget["wallSeconds"]:
            return f"{elapsed:.0f} s of {budget['wallSeconds']} s used, the next round would take about {wall:.0f} s"
    if budget.get("gpuHours"):
        used = sum(run.nodes * run.devices_per_node * wall / 3600
                   for run in runs if (wall := run.wall_seconds()) is not None)
        if used + gpu > budget["gpuHours"]:
            return f"{used:.2f} of {budget['gpuHours']} GPU-hours used, the next round would take about {gpu:.2f}"
    return None
