"""Repeat until decided (`sweep.maxRepeats`): after each round, add one more only while a top decision is
unresolved and the budget allows. The same rule for the local runner and the operator; pure. Definitions:
docs/analysis.md, Repeat until decided.

The top decisions are the fastest recommendation of every scale (its main resources group). One is resolved
when it is clear, equivalent (within sweep.minEffect), only-candidate or not-measurable. The error rate stays
controlled despite looking after every round: each of the K possible looks (maxRepeats − repeats + 1, counting
from round 2) decides at α / K (Bonferroni across looks: the chance that any look names a false winner is at
most α), which `analyze` applies whenever the spec has maxRepeats.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpt2bench.report.analysis import APART, analyze, parse_time
from gpt2bench.status import TERMINAL_RUN_PHASES, Recommendation, RunStatus

RESOLVED = ("clear", "equivalent", "only-candidate", "not-measurable")


@dataclass(frozen=True)
class Next:
    """Whether to add a round (`add`), and why (or why the sweep stops: `reason`, for the status)."""

    add: bool
    reason: str
    rounds_done: int


def rounds_done(runs: list[RunStatus]) -> int:
    """Decision rounds whose every run has finished."""
    rounds = {run.repeat for run in runs if run.repeat}
    return sum(all(r.phase in TERMINAL_RUN_PHASES for r in runs if r.repeat == k) for k in rounds)


def top_decisions(recommendations: list[Recommendation]) -> list[Recommendation]:
    return [r for r in recommendations if r.objective == "fastest" and r.scale is not None
            and not (r.note or "").startswith(APART)]


def next_round(runs: list[RunStatus], spec: dict[str, Any], start_time: str | None, now: datetime) -> Next:
    """After the last planned round has finished: add one more round, or stop and say why."""
    sweep = spec.get("sweep") or {}
    done = rounds_done(runs)
    planned = max((run.repeat or 0 for run in runs), default=0)
    if not sweep.get("maxRepeats"):
        return Next(False, f"{done} rounds: sweep.repeats", done)
    if done < planned or any(run.phase not in TERMINAL_RUN_PHASES for run in runs):
        return Next(False, "rounds still running", done)
    analysis = analyze(runs, spec)
    open_ = [r for r in top_decisions(analysis.recommendations) if r.decision not in RESOLVED]
    if not open_:
        decided = ", ".join(f"{r.scale} {r.decision}" for r in top_decisions(analysis.recommendations))
        return Next(False, f"decided after {done} rounds ({decided})", done)
    undecided = ", ".join(f"{r.scale} ({r.decision})" for r in open_)
    if done >= int(sweep["maxRepeats"]):
        return Next(False, f"max rounds: {done} rounds run, still undecided at {undecided}", done)
    spent = _over_budget(runs, sweep.get("budget") or {}, start_time, now)
    if spent:
        return Next(False, f"budget spent: {spent}; still undecided at {undecided}", done)
    return Next(True, f"round {done + 1} added: undecided at {undecided}", done)


def _over_budget(runs: list[RunStatus], budget: dict[str, Any], start_time: str | None, now: datetime) -> str | None:
    """Why one more round would not fit the budget, or None: a round is expected to take what the rounds so far
    took on average (wall time from the first start to the last completion, GPU-hours of its runs)."""
    rounds = {}
    for run in runs:
        if run.repeat and run.start_time and run.completion_time:
            start, end = parse_time(run.start_time), parse_time(run.completion_time)
            rounds.setdefault(run.repeat, []).append((start, end, run))
    if not rounds:
        return None
    wall = statistics.fmean((max(e for _, e, _ in r) - min(s for s, _, _ in r)).total_seconds() for r in rounds.values())
    gpu = [sum(run.nodes * run.devices_per_node * (e - s).total_seconds() / 3600 for s, e, run in r)
           for r in rounds.values()]
    if budget.get("wallSeconds") and start_time:
        elapsed = (now - parse_time(start_time)).total_seconds()
        if elapsed + wall > budget["wallSeconds"]:
            return (f"{elapsed:.0f} s of {budget['wallSeconds']} s used, a round takes about {wall:.0f} s")
    if budget.get("gpuHours"):
        used = sum(run.nodes * run.devices_per_node * (parse_time(run.completion_time) - parse_time(run.start_time))
                   .total_seconds() / 3600 for run in runs if run.start_time and run.completion_time)
        if used + statistics.fmean(gpu) > budget["gpuHours"]:
            return f"{used:.2f} of {budget['gpuHours']} GPU-hours used, a round takes about {statistics.fmean(gpu):.2f}"
    return None
