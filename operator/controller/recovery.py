"""Events a crash lost, posted again from the status when the operator resumes a benchmark.

A run's Event is posted after the status write that records its transition, so that a step tried again never
posts it twice; an operator killed between the two loses it (kopf queues Events and posts them from its event
loop: a SIGKILL drops the queue, and a failed POST is not tried again). When the operator resumes a benchmark
(kopf's resume handler, before it acts), it compares what the status recorded with the benchmark's Events and
posts the missing ones: `RunStarted` of a run still running, `RunSucceeded`, `RunFailed`, `RunSkipped` (and
`RunOffItsFabric`), the sweep's end. Only for transitions within EVENT_TTL_SECONDS: older Events are gone anyway
(the API server's --event-ttl) and must not come back. Such an Event says it was posted after a restart.

Events are what a person reads in `kubectl describe`; alerts and dashboards read the operator's metrics and
the status, never Events (docs/monitoring.md).
"""

from __future__ import annotations

import datetime
import logging
import re
from typing import Any

import kopf

from gpt2bench.clock import parse_rfc3339
from gpt2bench.status import FINISHED_PHASES, RUNNING, TERMINAL_RUN_PHASES, BenchmarkStatus

from . import kube, sweepstatus
from .events import run_events, sweep_event
from .state import OperatorState

# kube-apiserver's default --event-ttl: an Event older than this is deleted by the API server.
EVENT_TTL_SECONDS = 3600
_GROUPED = re.compile(r"^\d+ runs \(")
# A run now Running said so with one of these (RunStarted, or RunQueued then RunAdmitted under Kueue).
SAID_BY = {"RunStarted": ("RunStarted", "RunQueued", "RunAdmitted")}
RESTART_NOTE = " (posted after an operator restart: the status recorded it at {at}, its Event was lost)"


def expected_events(status: BenchmarkStatus, now: datetime.datetime) -> list[tuple[str | None, str, str, str, str]]:
    """(run name or None for the sweep, type, reason, message, when) of the Events the status says were posted
    within EVENT_TTL_SECONDS of `now`."""
    since = now - datetime.timedelta(seconds=EVENT_TTL_SECONDS)
    expected = []
    for entry in status.runs or []:
        at = entry.completion_time if entry.phase in TERMINAL_RUN_PHASES else entry.start_time
        if entry.phase not in (*TERMINAL_RUN_PHASES, RUNNING) or not at or parse_rfc3339(at) < since:
            continue
        expected += [(entry.name, type_, reason, message, at) for type_, reason, message in run_events(entry, None)]
    if status.phase in FINISHED_PHASES and status.completion_time and \
            parse_rfc3339(status.completion_time) >= since:
        expected.append((None, *sweep_event(status), status.completion_time))
    return expected


def posted(run: str | None, reason: str, message: str, events: list[dict[str, Any]]) -> bool:
    """Whether `events` hold the Event of `run` (its name starts the message; a RunFailed grouping several runs
    failing for the same reason counts for each) or, for the sweep's, one of that reason."""
    for event in events:
        if event.get("reason") not in SAID_BY.get(reason, (reason,)):
            continue
        said = event.get("message") or ""
        if run is None or said.startswith(f"{run}:") or (
                reason == "RunFailed" and _GROUPED.match(said) and said.endswith(message.split(": ", 1)[-1])):
            return True
    return False


def post_missing(state: OperatorState, namespace: str, name: str, logger: logging.Logger) -> int:
    """Post the Events the stored status recorded and the benchmark lacks; how many. Once per benchmark and
    process (a resume handler tried again must not post them twice). Best effort: a benchmark whose status this
    version cannot read, or whose Events cannot be listed, gets none."""
    try:
        owner = kube.get_benchmark(namespace, name)
        if owner is None or not sweepstatus.sweep_started(owner.get("status") or {}):
            return 0
        key = (namespace, owner["metadata"].get("uid"))
        if key in state.recovered:
            return 0
        status = BenchmarkStatus.read(owner["status"])
        events = kube.benchmark_events(namespace, key[1])
        state.recovered.add(key)
    except Exception as exc:  # noqa: BLE001 (what was lost stays lost; the sweep is not held for it)
        logger.info("lost Events not looked for: %s: %s", type(exc).__name__, exc)
        return 0
    now = state.clock.now()
    missing = [(type_, reason, message + RESTART_NOTE.format(at=at))
               for run, type_, reason, message, at in expected_events(status, now)
               if not posted(run, reason, message, events)]
    for type_, reason, message in missing:
        kopf.event(owner, type=type_, reason=reason, message=message)
    if missing:
        logger.info("posted %d Events the status recorded and a restart lost", len(missing))
    return len(missing)
