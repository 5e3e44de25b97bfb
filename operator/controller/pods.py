"""The pods of a run, read for its sweep: what a starting run waits for (and whether it has waited too long),
and why a failed one failed. The words are `gpt2bench.diagnosis`'s, which the local runner uses too.

- A queued run (its job suspended by Kueue) that its queue has not admitted within `runPolicy.queueSeconds`,
  and a run whose pods have not all started within `runPolicy.startupSeconds` of its job's creation or
  admission, end Failed with what they waited for; their job is deleted (its pods with it) and the sweep goes
  on. Until then the run's `waiting` says what it waits for. Once every pod has started (`podsStartedTime`),
  its pods are no longer read.
- A failed job: every pod is read, the first that failed (by time; within the same second, by how it ended and
  whether its last line blames a peer) is named with how it ended and the last meaningful line of its
  container's log (of the container before its restart, when it restarted).
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from gpt2bench import diagnosis
from gpt2bench import jobkinds as kinds
from gpt2bench.plan import Run
from gpt2bench.spec.model import GPT2BenchmarkSpec
from gpt2bench.status import QUEUED, RUNNING, RunStatus

from . import kube
from . import reconcile as rc

LOG_LINES, LOG_BYTES = 200, 64 * 1024  # of a failed container's log: its last meaningful line is in there
TIED_LOGS = 8  # logs read of the pods that failed in the same second (a 64-node job's peers all fail in one)


def _time(text: str | None) -> datetime.datetime | None:
    if not text:
        return None
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def _suspended(job: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in (job.get("status") or {}).get("conditions") or [] if c.get("type") == "Suspended"), None)


def queued_since(job: dict[str, Any]) -> datetime.datetime | None:
    """When the job was suspended: its Suspended condition's transition, else its creation (Kueue's webhook
    suspends a job as it is created)."""
    suspended = _suspended(job)
    if suspended and str(suspended.get("status")) == "True":
        return _time(suspended.get("lastTransitionTime")) or _time(job["metadata"].get("creationTimestamp"))
    return _time(job["metadata"].get("creationTimestamp"))


def starting_since(job: dict[str, Any]) -> datetime.datetime | None:
    """When the job's pods could begin to start: its admission (Suspended turned False), else its creation."""
    suspended = _suspended(job)
    if suspended and str(suspended.get("status")) == "False":
        return _time(suspended.get("lastTransitionTime")) or _time(job["metadata"].get("creationTimestamp"))
    return _time(job["metadata"].get("creationTimestamp"))


def follow_start(run: Run, entry: RunStatus, job: dict[str, Any], spec: GPT2BenchmarkSpec, now: str) -> RunStatus:
    """A queued or running run's entry, updated from its job and pods: what it waits for, when its pods had all
    started, or Failed (its job deleted) when it waited longer than its limit."""
    policy, at = spec.run_policy, _time(now)
    if entry.phase == QUEUED:
        since = queued_since(job)
        state = kinds.job_state(job)
        wait = f"job {entry.job_name} suspended, waiting for its queue" + (
            f" ({state.describe()})" if state.describe() else "")
        if since is not None and (at - since).total_seconds() > policy.queue_seconds:
            kube.delete_job(job)
            return rc.failed_entry(run, entry, diagnosis.queue_reason(wait, policy.queue_seconds), now)
        return entry.model_copy(update={"waiting": wait})
    if entry.phase != RUNNING or entry.pods_started_time:
        return entry
    pods, expected = kube.job_pods(job), kinds.expected_pods(job)
    if diagnosis.pods_started(pods, expected):
        return entry.model_copy(update={"pods_started_time": now, "waiting": None})
    wait = diagnosis.waiting_for(pods, expected)
    since = starting_since(job)
    if since is not None and (at - since).total_seconds() > policy.startup_seconds:
        kube.delete_job(job)
        return rc.failed_entry(run, entry, diagnosis.startup_reason(wait, policy.startup_seconds), now)
    return entry.model_copy(update={"waiting": wait})


def failure(job: dict[str, Any], controller: str | None, now: str) -> tuple[str | None, str | None]:
    """(cause, reason) of a failed job: the first of its pods that failed, how and what its container said last;
    the reason adds the job controller's words. (None, controller) when no pod says anything. Pods that ended in
    the same second are told apart by how they ended and what they said (`diagnosis.first_failure`), so the logs
    of those (at most TIED_LOGS) are read."""
    pods = {pod["metadata"]["name"]: pod for pod in kube.job_pods(job)}
    ends = diagnosis.pod_ends(pods.values(), _time(now))
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
