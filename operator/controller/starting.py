"""What a starting run waits for, and whether it has waited too long: pure, from its job and what `pods.observe_start`
read (its pods, their events, the job controller's). The words are `gpt2bench.diagnosis`'s, which the local
runner uses too.

A queued run (its job suspended by Kueue) that its queue has not admitted within `runPolicy.queueSeconds` ends
Failed; a run whose pods have not all started ends Failed after `runPolicy.capacitySeconds` of waiting for
capacity that may still come (a scale-up, busy nodes, a gang, an image pulling), or after
`runPolicy.startupSeconds` in a state that will not pass by waiting (gpt2bench.diagnosis.startup tells them apart
from the pods' states and events); a pod the API server refused to create (the job controller's own
`FailedCreatePod` Event: Pod Security, a LimitRange, a quota the pod exceeds alone) ends it at once, in the API
server's words (a quota other pods use up is capacity). Its job is then deleted (its pods with it) and the sweep
goes on. Until then the run's `waiting` says what it waits for, in the scheduler's, kubelet's or autoscaler's
words. Once every pod has started (`podsStartedTime`), a pod created later (re-created by its controller) is
followed alike.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

from gpt2bench import diagnosis
from gpt2bench import jobkinds as kinds
from gpt2bench.clock import parse_rfc3339, rfc3339
from gpt2bench.diagnosis import startup
from gpt2bench.specification.model import GPT2BenchmarkSpec
from gpt2bench.status import QUEUED, RUNNING, RunStatus

NOT_WAITING = {"waiting": None, "waiting_kind": None, "waiting_since": None}


@dataclass
class StartView:
    """What was read of a starting run's job: its pods, the Events of its controllers (None: not read, every
    expected pod exists) and of each pod that has not started."""

    pods: list[dict[str, Any]] = field(default_factory=list)
    job_events: list[dict[str, Any]] | None = None
    pod_events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


@dataclass(frozen=True)
class Followed:
    """A starting run's entry after a look (`entry`), or, when it has waited too long or will never start, why it
    fails (`failed`: its job is deleted)."""

    entry: RunStatus
    failed: str | None = None


def _suspended(job: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in (job.get("status") or {}).get("conditions") or [] if c.get("type") == "Suspended"), None)


def queued_since(job: dict[str, Any]) -> datetime.datetime | None:
    """When the job was suspended: its Suspended condition's transition, else its creation (Kueue's webhook
    suspends a job as it is created)."""
    suspended = _suspended(job)
    if suspended and str(suspended.get("status")) == "True":
        return parse_rfc3339(suspended.get("lastTransitionTime")) or parse_rfc3339(job["metadata"].get("creationTimestamp"))
    return parse_rfc3339(job["metadata"].get("creationTimestamp"))


def starting_since(job: dict[str, Any]) -> datetime.datetime | None:
    """When the job's pods could begin to start: its admission (Suspended turned False), else its creation."""
    suspended = _suspended(job)
    if suspended and str(suspended.get("status")) == "False":
        return parse_rfc3339(suspended.get("lastTransitionTime")) or parse_rfc3339(job["metadata"].get("creationTimestamp"))
    return parse_rfc3339(job["metadata"].get("creationTimestamp"))


def recreated_pods(pods: list[dict[str, Any]], started: datetime.datetime | None) -> list[dict[str, Any]]:
    """Live pods created after the run's pods had all started that have not started themselves."""
    return [pod for pod in pods if not (pod.get("metadata") or {}).get("deletionTimestamp")
            and (created := parse_rfc3339((pod.get("metadata") or {}).get("creationTimestamp"))) is not None
            and started is not None and created > started and not diagnosis.pod_started(pod)]


@dataclass(frozen=True)
class Waiting:
    """What a running run still waits on: the pods its start depends on (`pods`, of which those not started are
    looked at), the count its job expects (None: re-created pods, or a job kind whose count is not known), whether
    one is missing (its controllers' Events may say the API server refused it) and since when it waits (None: the
    job's own start)."""

    pods: list[dict[str, Any]]
    expected: int | None
    missing: bool
    since: datetime.datetime | None = None
    prefix: str = ""


def waiting_on(entry: RunStatus, job: dict[str, Any], pods: list[dict[str, Any]]) -> Waiting | None:
    """A running run's wait, or None once every pod it needs has started (before podsStartedTime: all its job
    expects; after: none re-created since)."""
    if entry.pods_started_time:  # started: only a pod created since then can be waiting
        late = recreated_pods(pods, parse_rfc3339(entry.pods_started_time))
        if not late:
            return None
        since = min(parse_rfc3339(pod["metadata"].get("creationTimestamp")) for pod in late)
        return Waiting(late, None, True, since, prefix="re-created after the run started: ")
    expected = kinds.expected_pods(job)
    if diagnosis.pods_started(pods, expected):
        return None
    live = [pod for pod in pods if not (pod.get("metadata") or {}).get("deletionTimestamp")]
    return Waiting(pods, expected, expected is None or len(live) < expected)


def needs_events(entry: RunStatus, job: dict[str, Any], pods: list[dict[str, Any]]) -> tuple[bool, list[str]]:
    """What `follow` will read of a starting run besides its pods (`waiting_on`): whether its controllers' Events
    (a pod missing), and the names of the pods whose Events (those not started)."""
    waiting = waiting_on(entry, job, pods)
    if waiting is None:
        return False, []
    return waiting.missing, [pod["metadata"]["name"] for pod in waiting.pods if not diagnosis.pod_started(pod)]


def follow(entry: RunStatus, job: dict[str, Any], view: StartView, spec: GPT2BenchmarkSpec, now: str) -> Followed:
    """A queued or running run's entry, updated from its job and pods (module docstring)."""
    policy, at = spec.run_policy, parse_rfc3339(now)
    if entry.phase == QUEUED:
        since = queued_since(job)
        state = kinds.job_state(job)
        wait = f"job {entry.job_name} suspended, waiting for its queue" + (
            f" ({state.describe()})" if state.describe() else "")
        if since is not None and (at - since).total_seconds() > policy.queue_seconds:
            return Followed(entry, diagnosis.queue_reason(wait, policy.queue_seconds))
        return Followed(entry.model_copy(update={"waiting": wait}))
    if entry.phase != RUNNING:
        return Followed(entry)
    waiting = waiting_on(entry, job, view.pods)
    if waiting is None:
        if entry.pods_started_time:
            return Followed(entry if entry.waiting is None else entry.model_copy(update=NOT_WAITING))
        return Followed(entry.model_copy(update={"pods_started_time": now, **NOT_WAITING}))
    return _waited(entry, waiting.pods, waiting.expected, view, waiting.since or starting_since(job) or at, spec, now,
                   prefix=waiting.prefix)


def _waited(entry: RunStatus, pods: list[dict[str, Any]], expected: int | None, view: StartView,
            since: datetime.datetime, spec: GPT2BenchmarkSpec, now: str, prefix: str = "") -> Followed:
    """A run whose pods wait (since `since`): waiting for capacity fails it once it has waited
    runPolicy.capacitySeconds in all; a start that will not come, once it has been so for startupSeconds."""
    policy, at = spec.run_policy, parse_rfc3339(now)
    # a pod missing: its controller's own Events say whether the API server refused it (Pod Security, a quota ...)
    refused = startup.refused_creation(view.job_events) if view.job_events is not None else None
    if refused is not None and refused.kind == startup.START:  # waiting will not change the answer: say it now
        return Followed(entry, diagnosis.refused_reason(prefix + refused.words))
    events = {name: view.pod_events.get(name, []) for name in
              (pod["metadata"]["name"] for pod in pods if not diagnosis.pod_started(pod))}
    wait = refused or startup.classify(pods, expected, events)
    words = prefix + wait.words
    same = entry.waiting_kind == wait.kind and entry.waiting_since
    kind_since = parse_rfc3339(entry.waiting_since) if same else (since if entry.waiting_kind is None else at)
    if wait.kind == startup.CAPACITY and (at - since).total_seconds() > policy.capacity_seconds:
        return Followed(entry, startup.capacity_reason(words, policy.capacity_seconds))
    if wait.kind == startup.START and (at - kind_since).total_seconds() > policy.startup_seconds:
        return Followed(entry, diagnosis.startup_reason(words, policy.startup_seconds))
    return Followed(entry.model_copy(update={"waiting": words, "waiting_kind": wait.kind,
                                             "waiting_since": rfc3339(kind_since)}))
