"""What a step reads of a run's pods: those of a starting run and their Events (`observe_start`; what they mean
is `starting.follow`'s), and why a failed one failed (`failure`): every pod is read, the first that failed (by
time; within the same second, by how it ended and whether its last line blames a peer) is named with how it
ended and the last meaningful line of its container's log (of the container before its restart, when it
restarted). The words are `gpt2bench.diagnosis`'s, which the local runner uses too.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gpt2bench import diagnosis
from gpt2bench.clock import parse_rfc3339
from gpt2bench.status import RunStatus

from . import kube, starting

LOG_LINES, LOG_BYTES = 200, 64 * 1024  # of a failed container's log: its last meaningful line is in there
TIED_LOGS = 8  # logs read of the pods that failed in the same second (a 64-node job's peers all fail in one)


def observe_start(entry: RunStatus, job: dict[str, Any]) -> starting.StartView:
    """What `starting.follow` needs of a starting run: its pods, and the Events it will read (`starting.needs_events`)."""
    pods = kube.job_pods(job)
    job_events, waiting = starting.needs_events(entry, job, pods)
    return starting.StartView(pods, kube.pod_events(job) if job_events else None,
                              {pod["metadata"]["name"]: kube.pod_events(pod) for pod in pods
                               if pod["metadata"]["name"] in waiting})


def failure(job: dict[str, Any], controller: str | None, now: str) -> tuple[str | None, str | None]:
    """(cause, reason) of a failed job: the first of its pods that failed, how and what its container said last;
    the reason adds the job controller's words. (None, controller) when no pod says anything. Pods that ended in
    the same second are told apart by how they ended and what they said (`diagnosis.first_failure`), so the logs
    of those (at most TIED_LOGS) are read."""
    pods = {pod["metadata"]["name"]: pod for pod in kube.job_pods(job)}
    ends = diagnosis.pod_ends(pods.values(), parse_rfc3339(now))
    candidates = [end for end in diagnosis.first_seconds(ends) if end.container is not None][:TIED_LOGS]
    said = {end.pod: _said(job, pods[end.pod]) for end in candidates}
    first = diagnosis.first_failure(dataclasses.replace(end, line=said[end.pod]) if end.pod in said else end
                                    for end in ends)
    return (first.describe() if first else None), diagnosis.failure_reason(first, controller)


def _said(job: dict[str, Any], pod: dict[str, Any]) -> str | None:
    """What a failed pod's container said: its termination message or the tail of its log (of the container
    before its restart, when it restarted); the runtime's words when it never ran."""
    container, terminated, restarted = diagnosis.failed_container(pod)
    tail = None if terminated.get("reason") in diagnosis.START_FAILURES else kube.pod_log_tail(
        job["metadata"]["namespace"], pod["metadata"]["name"], container, LOG_LINES, LOG_BYTES, previous=restarted)
    return diagnosis.terminated_said(terminated, tail)
