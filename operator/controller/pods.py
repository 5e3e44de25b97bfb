"""What a step reads of a run's pods: those of a starting run and their Events (`observe_start`; what they mean
is `starting.follow`'s), and why a failed one failed (`failure`): every pod is read, the first that failed (by
time; within the same second, by how it ended and whether its last line blames a peer) is named with how it
ended and the last meaningful line of its container's log (of the container before its restart, when it
restarted). The words are `gpt2bench.diagnosis`'s, which the local runner uses too.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpt2bench import diagnosis
from gpt2bench import jobkinds as kinds
from gpt2bench.clock import parse_rfc3339
from gpt2bench.status import RunStatus

from . import kube, starting

LOG_LINES, LOG_BYTES = 200, 64 * 1024  # of a failed container's log: its last meaningful line is in there
TIED_LOGS = 8  # logs read of the pods that failed in the same second (a 64-node job's peers all fail in one)


def observe_start(entry: RunStatus, job: dict[str, Any]) -> starting.StartView:
    """What `starting.follow` needs of a starting run: its pods, and the Events it will read (`starting.needs_events`)."""
    pods = job_pods(job)
    job_events, waiting = starting.needs_events(entry, job, pods)
    return starting.StartView(pods, pod_events(job) if job_events else None,
                              {pod["metadata"]["name"]: pod_events(pod) for pod in pods
                               if pod["metadata"]["name"] in waiting})


def result_pod(job: dict[str, Any]) -> dict[str, Any] | None:
    """The job's result pod (PyTorchJob master, MPIJob launcher, ...), found by the labels its controller
    sets and chosen as the shared table says (the newest attempt)."""
    return kinds.result_pod(job, _items(kube.PODS, job["metadata"]["namespace"],
                                        {"labelSelector": kinds.result_pod_selector(job)}))


def job_pods(job: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pod of a job, all replicas (workers too), as the API returns them."""
    return _items(kube.PODS, job["metadata"]["namespace"], {"labelSelector": kinds.job_pod_selector(job)})


def pod_events(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The events about one pod or job (by its uid: a re-created pod of the same name has its own), as the API
    returns them: the scheduler's, the kubelet's, the cluster autoscaler's about a pod; the job's controller's about
    a job. A TrainJob's pods are created by the Job controller of each Job of its JobSet, which records the pods the
    API server refused (`FailedCreate`) on that Job, not on the TrainJob: a TrainJob's events include its Jobs'.
    Events and Jobs the operator's Role may not list (one from before it read them) are none: the pods' own states
    still tell most waits, and a refused pod is then told by the start limit, as it was."""
    events = _events_about(obj.get("metadata") or {})
    # its Jobs exist once its JobSet has reported them (`status.jobsStatus`): no list before (one call a poll saved
    # while a TrainJob starts, on a busy API server)
    if obj.get("kind") == "TrainJob" and (obj.get("status") or {}).get("jobsStatus"):
        selector = f"{kinds.JOBSET_NAME_LABEL}={obj['metadata']['name']}"
        listed = _items(kube.JOBS, obj["metadata"]["namespace"], {"labelSelector": selector}, forbidden_is_none=True)
        for job in trainjob_jobs(obj, listed):
            events += _events_about(job["metadata"])
    return events


def _events_about(metadata: dict[str, Any]) -> list[dict[str, Any]]:
    if not metadata.get("uid"):
        return []
    return _items(kube.EVENTS, metadata["namespace"], {"fieldSelector": f"involvedObject.uid={metadata['uid']}"},
                  forbidden_is_none=True)


def _items(path: str, namespace: str, query: dict[str, Any], forbidden_is_none: bool = False) -> list[dict[str, Any]]:
    """The items of a namespaced list; with `forbidden_is_none`, none when the Role does not allow the list (403)."""
    try:
        response = kube.request("GET", path, {"namespace": namespace}, query)
    except ApiException as exc:
        if forbidden_is_none and exc.status == 403:
            return []
        raise
    return json.loads(response.data).get("items", [])


def trainjob_jobs(trainjob: dict[str, Any], jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Of `jobs`, those of the TrainJob's JobSet: JobSet labels each Job with its JobSet's name
    (`jobset.sigs.k8s.io/jobset-name`), and Trainer v2 names the JobSet after the TrainJob. A Job created before
    the TrainJob belongs to an earlier namesake (a benchmark deleted and created again) that the garbage collector
    has not removed yet: its refusals are not this run's."""
    name = trainjob["metadata"]["name"]
    created = trainjob["metadata"].get("creationTimestamp") or ""  # RFC 3339 in UTC, to the second: sorts as text
    return [job for job in jobs
            if ((job.get("metadata") or {}).get("labels") or {}).get(kinds.JOBSET_NAME_LABEL) == name
            and (job["metadata"].get("creationTimestamp") or "") >= created]


def pod_log_tail(namespace: str, pod: str, container: str, lines: int, limit_bytes: int,
                 previous: bool = False) -> str | None:
    """The last `lines` lines of a container's log (at most `limit_bytes`; `previous`: of the container before its
    last restart), or None when it cannot be read."""
    try:
        response = kube.request("GET", kube.PODS + "/{name}/log", {"namespace": namespace, "name": pod},
                                {"container": container, "tailLines": lines, "limitBytes": limit_bytes,
                                 "previous": previous or None})
    except ApiException:
        return None
    return response.data.decode("utf-8", errors="replace")


def termination_message(pod: dict[str, Any] | None, container: str | None = None) -> str | None:
    """The first non-empty termination message of the pod's containers (the named one first)."""
    if not pod:
        return None
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    statuses = sorted(statuses, key=lambda s: s.get("name") != container)
    for status in statuses:
        for state in ("state", "lastState"):
            terminated = (status.get(state) or {}).get("terminated") or {}
            if terminated.get("message"):
                return terminated["message"]
    return None


def failure(job: dict[str, Any], controller: str | None, now: str) -> tuple[str | None, str | None]:
    """(cause, reason) of a failed job: the first of its pods that failed, how and what its container said last;
    the reason adds the job controller's words. (None, controller) when no pod says anything. Pods that ended in
    the same second are told apart by how they ended and what they said (`diagnosis.first_failure`), so the logs
    of those (at most TIED_LOGS) are read."""
    pods = {pod["metadata"]["name"]: pod for pod in job_pods(job)}
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
    tail = None if terminated.get("reason") in diagnosis.START_FAILURES else pod_log_tail(
        job["metadata"]["namespace"], pod["metadata"]["name"], container, LOG_LINES, LOG_BYTES, previous=restarted)
    return diagnosis.terminated_said(terminated, tail)
