"""The pods of a run, read for its sweep: what a starting run waits for (and whether it has waited too long),
and why a failed one failed. The words are `gpt2bench.diagnosis`'s, which the local runner uses too.

- A queued run (its job suspended by Kueue) that its queue has not admitted within `runPolicy.queueSeconds`
  ends Failed; a run whose pods have not all started ends Failed after `runPolicy.capacitySeconds` of waiting
  for capacity that may still come (a scale-up, busy nodes, a gang, an image pulling), or after
  `runPolicy.startupSeconds` in a state that will not pass by waiting (gpt2bench.diagnosis.startup tells them apart
  from the pods' states and events); a pod the API server refused to create (the job controller's own
  `FailedCreatePod` Event: Pod Security, a LimitRange, a quota the pod exceeds alone) ends it at once, in the API
  server's words (a quota other pods use up is capacity). Its job is deleted (its pods with it) and the sweep goes on. Until then
  the run's `waiting` says what it waits for, in the scheduler's, kubelet's or autoscaler's words. Once every
  pod has started (`podsStartedTime`), a pod created later (re-created by its controller) is followed alike.
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
from gpt2bench.diagnosis import startup
from gpt2bench.plan import Run
from gpt2bench.specification.model import GPT2BenchmarkSpec
from gpt2bench.status import QUEUED, RUNNING, RunStatus

from . import decide, kube

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
    """A queued or running run's entry, updated from its job and pods: what it waits for (capacity that may come,
    or a start that will not: gpt2bench.diagnosis.startup), when its pods had all started, or Failed (its job deleted)
    when it waited longer than that kind's limit. A pod re-created after the run started is followed alike."""
    policy, at = spec.run_policy, _time(now)
    if entry.phase == QUEUED:
        since = queued_since(job)
        state = kinds.job_state(job)
        wait = f"job {entry.job_name} suspended, waiting for its queue" + (
            f" ({state.describe()})" if state.describe() else "")
        if since is not None and (at - since).total_seconds() > policy.queue_seconds:
            kube.delete_job(job)
            return decide.failed_entry(run, entry, diagnosis.queue_reason(wait, policy.queue_seconds), now)
        return entry.model_copy(update={"waiting": wait})
    if entry.phase != RUNNING:
        return entry
    pods = kube.job_pods(job)
    if entry.pods_started_time:  # started: only a pod created since then can be waiting
        late = recreated_pods(pods, _time(entry.pods_started_time))
        if not late:
            return entry if entry.waiting is None else entry.model_copy(update=NOT_WAITING)
        since = min(_time(pod["metadata"].get("creationTimestamp")) or at for pod in late)
        return _waited(run, entry, job, late, None, since, spec, now, prefix="re-created after the run started: ")
    expected = kinds.expected_pods(job)
    if diagnosis.pods_started(pods, expected):
        return entry.model_copy(update={"pods_started_time": now, **NOT_WAITING})
    return _waited(run, entry, job, pods, expected, starting_since(job) or at, spec, now)


NOT_WAITING = {"waiting": None, "waiting_kind": None, "waiting_since": None}


def recreated_pods(pods: list[dict[str, Any]], started: datetime.datetime | None) -> list[dict[str, Any]]:
    """Live pods created after the run's pods had all started that have not started themselves."""
    return [pod for pod in pods if not (pod.get("metadata") or {}).get("deletionTimestamp")
            and (created := _time((pod.get("metadata") or {}).get("creationTimestamp"))) is not None
            and started is not None and created > started and not diagnosis.pod_started(pod)]


def _waited(run: Run, entry: RunStatus, job: dict[str, Any], pods: list[dict[str, Any]], expected: int | None,
            since: datetime.datetime, spec: GPT2BenchmarkSpec, now: str, prefix: str = "") -> RunStatus:
    """The entry of a run whose pods wait (since `since`): waiting for capacity fails it once it has waited
    runPolicy.capacitySeconds in all; a start that will not come, once it has been so for startupSeconds."""
    policy, at = spec.run_policy, _time(now)
    live = [pod for pod in pods if not (pod.get("metadata") or {}).get("deletionTimestamp")]
    # a pod missing: its controller's own Events say whether the API server refused it (Pod Security, a quota ...)
    refused = startup.refused_creation(kube.pod_events(job)) if expected is None or len(live) < expected else None
    if refused is not None and refused.kind == startup.START:  # waiting will not change the answer: say it now
        kube.delete_job(job)
        return decide.failed_entry(run, entry, diagnosis.refused_reason(prefix + refused.words), now)
    events = {pod["metadata"]["name"]: kube.pod_events(pod) for pod in pods if not diagnosis.pod_started(pod)}
    wait = refused or startup.classify(pods, expected, events)
    words = prefix + wait.words
    same = entry.waiting_kind == wait.kind and entry.waiting_since
    kind_since = _time(entry.waiting_since) if same else (since if entry.waiting_kind is None else at)
    if wait.kind == startup.CAPACITY and (at - since).total_seconds() > policy.capacity_seconds:
        kube.delete_job(job)
        return decide.failed_entry(run, entry, startup.capacity_reason(words, policy.capacity_seconds), now)
    if wait.kind == startup.START and (at - kind_since).total_seconds() > policy.startup_seconds:
        kube.delete_job(job)
        return decide.failed_entry(run, entry, diagnosis.startup_reason(words, policy.startup_seconds), now)
    return entry.model_copy(update={"waiting": words, "waiting_kind": wait.kind,
                                    "waiting_since": rfc3339(kind_since)})


def rfc3339(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
