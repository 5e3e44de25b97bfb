"""The Events a sweep posts: a run's new phase, a round added, configurations dropped, runs held and
resumed, the sweep's end. What they say is decided here from the entries before and after a step; posting
is the only side effect."""

from __future__ import annotations

from typing import Any

import kopf

from gpt2bench.diagnosis import holds
from gpt2bench.status import (
    FAILED,
    PENDING,
    QUEUED,
    RUNNING,
    SKIPPED,
    SUCCEEDED,
    BenchmarkStatus,
    RunStatus,
    fabric_warnings,
)

from . import decide, metrics


def post(body: dict[str, Any], type_: str, reason: str, message: str) -> None:
    # kopf.event, not kopf.info/warn: those obey settings.posting.level, which is for kopf's own logs
    kopf.event(body, type=type_, reason=reason, message=message)


def post_drops(owner: dict[str, Any], before: list[Any] | None, now: list[Any] | None) -> None:
    """One Event per configuration the race dropped since the status was last written: which, after which round,
    and why (posted after the write that records it, so a retried step does not post it twice)."""
    known = {d.configuration for d in before or []}
    for dropped in now or []:
        if dropped.configuration not in known:
            post(owner, "Normal", "ConfigurationDropped",
                 f"{dropped.configuration} dropped after round {dropped.round}: {dropped.behind} is "
                 f"{dropped.ratio - 1:+.1%} faster (at least {dropped.low - 1:+.1%} at the race's level); it runs no "
                 "more rounds")


# More runs than this failing for the same reason in one step (a kind that is not served, a quota) get one
# Event between them, not one each: a 1000-run sweep must not post 1000 Events at once.
GROUPED_EVENTS_FROM = 4


def post_transitions(body: dict[str, Any], old_runs: list[RunStatus], new_runs: list[RunStatus],
                     summary: BenchmarkStatus, phase_before: str | None) -> None:
    namespace = body["metadata"].get("namespace") or "default"
    changed = decide.transitions(old_runs, new_runs)
    failures: dict[str, list[str]] = {}
    for entry, _ in changed:
        if entry.phase == FAILED:
            failures.setdefault(entry.reason or "", []).append(entry.name)
    for reason, names in failures.items():
        if len(names) >= GROUPED_EVENTS_FROM:
            listed = ", ".join(names[:3]) + f" and {len(names) - 3} more"
            post(body, "Warning", "RunFailed", f"{len(names)} runs ({listed}): {reason}")
    for entry, before in changed:
        if entry.phase == SUCCEEDED:
            metrics.RUNS_SUCCEEDED.labels(namespace).inc()
        elif entry.phase == FAILED:
            metrics.RUNS_FAILED.labels(namespace).inc()
            if len(failures[entry.reason or ""]) >= GROUPED_EVENTS_FROM:
                continue  # said by the grouped Event
        for type_, reason, message in run_events(entry, before):
            post(body, type_, reason, message)
    for type_, reason, message in held_events(old_runs, new_runs):
        post(body, type_, reason, message)
    if summary.phase != RUNNING and phase_before in (RUNNING, PENDING):
        post(body, *sweep_event(summary))


def held_events(old_runs: list[RunStatus], new_runs: list[RunStatus]) -> list[tuple[str, str, str]]:
    """One Warning Event per cause that holds runs now and did not before, one Normal Event when held runs go on."""
    before, after = holds.held_reasons(old_runs), holds.held_reasons(new_runs)
    events = [("Warning", "RunsHeld", f"{len(names)} run{'s' * (len(names) > 1)} {reason}")
              for reason, names in after.items() if reason not in before]
    released = [name for names in before.values() for name in names
                if name not in {n for names in after.values() for n in names}]
    if released:
        events.append(("Normal", "RunsResumed", f"{len(released)} held run{'s' * (len(released) > 1)} go on: "
                                                f"{', '.join(released[:5])}{' ...' if len(released) > 5 else ''}"))
    return events


def run_events(entry: RunStatus, before: str | None) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the Events a run's new phase posts (`before`: its phase before)."""
    if entry.phase == RUNNING and before == QUEUED:
        return [("Normal", "RunAdmitted", f"{entry.name}: job {entry.job_name} resumed")]
    if entry.phase == RUNNING:
        return [("Normal", "RunStarted", f"{entry.name}: job {entry.job_name} created")]
    if entry.phase == QUEUED:
        return [("Normal", "RunQueued", f"{entry.name}: job {entry.job_name} is suspended, waiting for its queue")]
    if entry.phase == SUCCEEDED:
        tps = entry.results.tokens_per_second if entry.results else None
        # a figure that is not what its scale says (docs/clusters.md)
        return [("Normal", "RunSucceeded", f"{entry.name}: {tps} tokens/s"),
                *(("Warning", "RunOffItsFabric", warning) for warning in fabric_warnings(entry))]
    if entry.phase == FAILED:
        return [("Warning", "RunFailed", f"{entry.name}: {entry.reason}")]
    if entry.phase == PENDING and (entry.reason or "").startswith(decide.RERUN):
        return [("Warning", "RunPreempted", f"{entry.name}: {entry.reason}")]
    if entry.phase == SKIPPED:  # the trainer chose not to train (e.g. emulated bf16): not a failure
        return [("Normal", "RunSkipped", f"{entry.name}: {entry.reason}")]
    return []


def sweep_event(summary: BenchmarkStatus) -> tuple[str, str, str]:
    """(type, reason, message) of a finished sweep's Event."""
    best = summary.best
    text = f"{summary.message}; best: {best.run if best else None} ({best.tokens_per_second if best else None} tokens/s)"
    return "Normal" if summary.phase == SUCCEEDED else "Warning", f"Sweep{summary.phase}", text
