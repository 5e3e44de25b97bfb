"""How each pod of a run ended or why it has not started, which of them is the cause, and the words both drivers
use for it (the operator reads pods as the API returns them; the local runner builds the same facts from its
processes).

- `PodEnd`: a pod's container that ended badly (or the pod itself: evicted, lost with its node), when, and
  the last meaningful line it printed (`lastwords.py`). `first_failure` picks the first by time, and within the same
  second by how it ended (`end_rank`): the cause, not the peers that failed because of it.
- `PodWait`: a pod that has not started, and why (not scheduled, an image not pulled, a bad config ...), in
  the scheduler's and the kubelet's own words.

`pod_ends`, `pod_waits` and `pods_started` read pod dicts as the API returns them (pure: the operator lists
the pods and reads the logs). Upstream's strings are quoted from kubernetes/kubernetes (kubelet
images/image_manager.go, kuberuntime_manager.go; scheduler's FitError; the taint eviction controller).
"""

from __future__ import annotations

import datetime
import re
import signal
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpt2bench.clock import parse_rfc3339
from gpt2bench.collect import clean_reason

from .lastwords import START_FAILURES, start_failure

# A pod still Terminating this long after its grace period ended (metadata.deletionTimestamp is the time the
# grace period ends) is stuck: no kubelet confirms that its containers stopped, so its node is likely gone.
STUCK_AFTER_SECONDS = 60
# The scheduler's reason on a pod it preempted for a higher-priority one (its DisruptionTarget condition): the pod's
# end, whatever exit code its stopped container had (`PodEnd.how` then starts with PREEMPTED).
PREEMPTED_BY, PREEMPTED = "PreemptionByScheduler", "preempted"


# ------------------------------------------------------------------ words


@dataclass(frozen=True)
class PodEnd:
    """How one pod (one local replica) ended badly."""

    pod: str
    how: str  # "exited with code 1", "OOMKilled (exit code 137)", "killed by SIGKILL (exit code 137)", "Evicted: ..."
    container: str | None = None
    at: str | None = None  # RFC 3339: when (the container's finishedAt, the deletion ...), for the ordering
    line: str | None = None  # the last meaningful line it printed (or the trainer's own reason)

    def describe(self) -> str:
        where = f"pod {self.pod}" + (f" (container {self.container})" if self.container else "")
        return f"{where} {self.how}" + (f": {self.line}" if self.line else "")


@dataclass(frozen=True)
class PodWait:
    """Why one pod has not started: `reason` and `message` are the scheduler's or the kubelet's."""

    pod: str
    reason: str  # Unschedulable, ErrImagePull, ImagePullBackOff, CreateContainerConfigError, ...
    message: str = ""
    container: str | None = None

    def describe(self) -> str:
        where = f"pod {self.pod}" + (f" (container {self.container})" if self.container else "")
        return f"{where} {self.reason}" + (f": {self.message}" if self.message else "")


def exit_how(code: int, reason: str | None = None) -> str:
    """How a container (a process) exited: `OOMKilled (exit code 137)` (the kubelet's reason, when it says more
    than `Error`), `killed by SIGKILL (exit code 137)` (a signal: 128 + its number, as a shell and the kubelet
    report it; a local process's negative return code is turned into that), `exited with code 1`."""
    if code < 0:
        code = 128 - code
    if reason and reason not in ("Error", "Completed"):
        return f"{reason} (exit code {code})"
    if code > 128:
        try:
            return f"killed by {signal.Signals(code - 128).name} (exit code {code})"
        except ValueError:
            pass
    return f"exited with code {code}"


# What a rank prints when a peer failed first: its connection to the peer closed or reset, a collective that
# waited for the peer until its timeout (NCCL's watchdog, gloo's, Horovod's and the trainer's), NCCL's word for a
# peer gone. Never the cause while another pod ended in the same second (upstream's wordings: gloo
# transport/tcp/pair.cc, unbound_buffer.cc; torch ProcessGroupNCCL.cpp; NCCL's ncclRemoteError; horovod
# common/operations.cc; trainer/parallel/horovod.py).
PEER_FAILURE = re.compile(
    r"Connection (?:closed|reset) by peer|Broken pipe|[Ww]atchdog caught collective operation timeout|"
    r"ProcessGroupNCCL's watchdog|NCCL communicator was aborted|remote process exited or there was a network error|"
    r"Timed out waiting \d+ms for (?:recv|send) operation|Horovod has been shut down|"
    r"waited more than [\d.]+ s \(--timeout-seconds\) for the other ranks")
_RANK_KILLED = re.compile(r"^rank \d+ killed by SIG")
# Signals that ask a process to stop: what a job's controller, JobSet, torchrun or mpirun send the peers of a
# failed process (and the kubelet a deleted pod) before killing them. A pod stopped so was stopped, not the cause.
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")
PEER_FAILED, STOPPED = 5, 6  # the ranks of ends that another's caused (`end_rank`)


def end_rank(end: PodEnd) -> int:
    """How telling an end is among those of the same second (lower: more likely the cause): the pod's own end
    (evicted, lost with its node: its containers were killed for it) 0, OOMKilled 1, killed by another signal
    than a stop (SIGKILL, SIGSEGV, SIGABRT...; or torchrun's root cause: a rank killed by one) 2, another reason
    of the runtime's (StartError ...) 3, a plain exit 4, a plain exit whose last line says a peer failed first
    (PEER_FAILURE) 5, stopped by a STOP_SIGNALS signal (its peers' teardown) 6."""
    if end.container is None:
        return 0
    if end.how.startswith("OOMKilled"):
        return 1
    if end.how.startswith("killed by"):
        return STOPPED if end.how.split()[2] in STOP_SIGNALS else 2
    if _RANK_KILLED.match(end.line or "") and end.line.split()[3] not in STOP_SIGNALS:
        return 2
    if not end.how.startswith("exited with"):
        return 3
    return PEER_FAILED if PEER_FAILURE.search(end.line or "") else 4


def caused_by_another(end: PodEnd) -> bool:
    """A peer's failure or a stop: an end whose cause is another pod's (which may end a moment later)."""
    return end_rank(end) >= PEER_FAILED


def _second(end: PodEnd) -> datetime.datetime:
    """When the end came, to the second (a container's finishedAt has 1 s resolution); no time: last."""
    at = parse_rfc3339(end.at)
    return at.replace(microsecond=0) if at else datetime.datetime.max.replace(tzinfo=datetime.UTC)


def first_seconds(ends: Iterable[PodEnd]) -> list[PodEnd]:
    """The ends of the earliest second (all of them when none has a time): the candidates for the cause."""
    listed = list(ends)
    earliest = min(map(_second, listed), default=None)
    return [end for end in listed if _second(end) == earliest]


def first_failure(ends: Iterable[PodEnd]) -> PodEnd | None:
    """The pod that failed first: by the second it ended (those without a time last); within one second, and
    among the ends a local runner saw within its tie (local/executor.py, TIE_SECONDS), by how it ended
    (`end_rank`: an OOMKill or a signal before a plain exit, a peer's failure reported last), then in the order
    given. Two pods of a job that fails usually
    end in the same second: the victim's "Connection closed by peer" must not be named over the cause."""
    listed = list(ends)
    return min(listed, key=lambda end: (_second(end), end_rank(end)), default=None)


def failure_reason(first: PodEnd | None, controller: str | None = None) -> str | None:
    """A failed run's reason: the first pod that failed, how and what it said; then the job controller's words."""
    return "; ".join(part for part in (first.describe() if first else None, controller) if part) or None


def startup_reason(wait: str, limit: int) -> str:
    """A run whose pods did not all start within runPolicy.startupSeconds."""
    return f"not started within runPolicy.startupSeconds ({limit} s): {wait}"


def queue_reason(wait: str, limit: int) -> str:
    """A run whose job its queue did not admit within runPolicy.queueSeconds."""
    return f"not admitted within runPolicy.queueSeconds ({limit} s): {wait}"


def refused_reason(words: str) -> str:
    """A run whose job's controller could not create its pods: the API server refused them (an admission)."""
    return f"its pods were refused: {words}"


def cannot_start_here(wait: PodWait, detail: str = "") -> str:
    """A local run that cannot start on this machine (the local runner has no scheduler to wait for)."""
    return f"cannot start on this machine: {wait.describe()}" + (f" ({detail})" if detail else "")



# ------------------------------------------------------------------ pods, as the API returns them


def _statuses(pod: dict[str, Any]) -> list[dict[str, Any]]:
    status = pod.get("status") or {}
    return [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]


def _condition(pod: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == type_), None)


def _name(pod: dict[str, Any]) -> str:
    return (pod.get("metadata") or {}).get("name", "")


def failed_container(pod: dict[str, Any]) -> tuple[str, dict[str, Any], bool] | None:
    """(container, its terminated state, whether it is the last state of a restarted container) of the pod's
    first container that ended with a non-zero code: the current state, else the previous one (a container
    restarted under OnFailure keeps its OOMKilled there)."""
    for status in _statuses(pod):
        terminated = (status.get("state") or {}).get("terminated") or {}
        if terminated and terminated.get("exitCode", 0) != 0:
            return status.get("name", ""), terminated, False
    for status in _statuses(pod):
        terminated = (status.get("lastState") or {}).get("terminated") or {}
        if terminated and terminated.get("exitCode", 0) != 0:
            return status.get("name", ""), terminated, True
    return None


def pod_end(pod: dict[str, Any], now: datetime.datetime, said: str | None = None) -> PodEnd | None:
    """How the pod ended badly, if it did (`said`: what its failed container printed, read by the caller).
    A pod's own end comes first (preempted, Evicted, NodeLost: its containers were killed for it), then a container's
    exit, then a deletion stuck past its grace period. A pod being deleted within its grace period is not a
    failure (a normal, graceful deletion)."""
    status, metadata = pod.get("status") or {}, pod.get("metadata") or {}
    name = _name(pod)
    failed = failed_container(pod)
    finished_at = failed[1].get("finishedAt") if failed else None
    disruption = _condition(pod, "DisruptionTarget") or {}
    if disruption.get("reason") == PREEMPTED_BY and str(disruption.get("status")) == "True":  # stopped for it
        how = f"{PREEMPTED} ({PREEMPTED_BY}: {disruption.get('message', '')})"
        return PodEnd(name, clean_reason(how), at=disruption.get("lastTransitionTime") or finished_at)
    if status.get("reason"):  # the pod's own end: Evicted, NodeLost, DeadlineExceeded, Shutdown ...
        how = status["reason"] + (f": {status['message']}" if status.get("message") else "")
        return PodEnd(name, clean_reason(how), at=finished_at or disruption.get("lastTransitionTime"))
    if failed:
        container, terminated, restarted = failed
        if terminated.get("reason") in START_FAILURES:  # it never ran: its exit code is the runtime's placeholder
            how, said = terminated["reason"], start_failure(terminated.get("message"))
        else:
            how = exit_how(int(terminated.get("exitCode", 1)), terminated.get("reason"))
        if restarted:
            restarts = max((s.get("restartCount", 0) for s in _statuses(pod) if s.get("name") == container), default=0)
            how += f", restarted {restarts} time{'s' if restarts != 1 else ''}"
        return PodEnd(name, how, container=container, at=finished_at, line=said)
    stuck = stuck_terminating(pod, now)
    if stuck:
        return PodEnd(name, stuck, at=metadata.get("deletionTimestamp"))
    return None


def stuck_terminating(pod: dict[str, Any], now: datetime.datetime) -> str | None:
    """Why a deleted pod is stuck Terminating, or None while its deletion may still be a normal one: its node
    is gone (the taint manager deleted it for a NoExecute taint: the node has been NotReady for its toleration,
    300 s by default), or its grace period ended more than STUCK_AFTER_SECONDS ago."""
    metadata, status = pod.get("metadata") or {}, pod.get("status") or {}
    ends = parse_rfc3339(metadata.get("deletionTimestamp"))
    if ends is None or status.get("phase") in ("Succeeded", "Failed"):
        return None
    node = (pod.get("spec") or {}).get("nodeName") or "<node>"
    disruption = _condition(pod, "DisruptionTarget") or {}
    if disruption.get("reason") == "DeletionByTaintManager" and str(disruption.get("status")) == "True":
        return (f"stuck Terminating since {metadata['deletionTimestamp']}: its node {node} is gone "
                f"({disruption.get('reason')}: {disruption.get('message', '')})")
    late = (now - ends).total_seconds()
    if late > STUCK_AFTER_SECONDS:
        return (f"stuck Terminating since {metadata['deletionTimestamp']} ({late:.0f} s past its grace period: "
                f"is its node gone? `kubectl get node {node}`)")
    return None


def pod_ends(pods: Iterable[dict[str, Any]], now: datetime.datetime,
             said: dict[str, str | None] | None = None) -> list[PodEnd]:
    """Every pod that ended badly (`said`: pod name -> what its failed container printed)."""
    return [end for pod in pods if (end := pod_end(pod, now, (said or {}).get(_name(pod))))]


# Waiting reasons of a container that is on its way: not a problem yet.
STARTING = ("ContainerCreating", "PodInitializing")


def pod_waits(pods: Iterable[dict[str, Any]]) -> list[PodWait]:
    """Every pod that has not started and why: not scheduled (the scheduler's condition message), or a
    container waiting (ErrImagePull, ImagePullBackOff, InvalidImageName, CreateContainerConfigError,
    CrashLoopBackOff ...: the kubelet's reason and message; ContainerCreating last, it says the least)."""
    waits: list[PodWait] = []
    for pod in sorted(pods, key=_name):
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        scheduled = _condition(pod, "PodScheduled")
        if scheduled and str(scheduled.get("status")) == "False":
            waits.append(PodWait(_name(pod), scheduled.get("reason") or "Unschedulable",
                                 clean_reason(scheduled.get("message") or "")))
            continue
        for status in _statuses(pod):
            never_ran = _start_failure(status)
            if never_ran is not None:  # the runtime could not start its command (retried, or not under Never)
                waits.append(PodWait(_name(pod), never_ran["reason"], start_failure(never_ran.get("message")),
                                     status.get("name")))
                break
            waiting = (status.get("state") or {}).get("waiting")
            if waiting is not None:
                waits.append(PodWait(_name(pod), waiting.get("reason") or "Waiting",
                                     clean_reason(waiting.get("message") or ""), status.get("name")))
                break
        else:
            if not _statuses(pod) and (pod.get("status") or {}).get("phase", "Pending") == "Pending":
                waits.append(PodWait(_name(pod), "Pending", "no container status yet"))
    return sorted(waits, key=lambda wait: wait.reason in STARTING)


def _start_failure(status: dict[str, Any]) -> dict[str, Any] | None:
    """The container's terminated state (now, else before its restart) when its runtime could not start it
    and it has not run since: StartError ... (a waiting RunContainerError says the same)."""
    state = status.get("state") or {}
    if "running" in state:
        return None
    for ended in (state.get("terminated"), (status.get("lastState") or {}).get("terminated"), state.get("waiting")):
        if ended:
            return ended if ended.get("reason") in START_FAILURES else None
    return None


def pod_started(pod: dict[str, Any]) -> bool:
    """Every container of the pod has started (running, or already terminated), now or before a restart; one
    whose command its runtime could not start (StartError) has not."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return bool(statuses) and all(
        ({"running", "terminated"} & set(s.get("state") or {}) or "terminated" in (s.get("lastState") or {}))
        and _start_failure(s) is None for s in statuses)


def _not_ready(pod: dict[str, Any]) -> str | None:
    ready = _condition(pod, "Ready")
    if ready is None or str(ready.get("status")) == "True":
        return None
    return ": ".join(part for part in (ready.get("reason"), ready.get("message")) if part) or "not Ready"


def pods_started(pods: list[dict[str, Any]], expected: int | None) -> bool:
    """Every pod of the run exists (`expected` of them, when known) and has started."""
    live = [pod for pod in pods if not (pod.get("metadata") or {}).get("deletionTimestamp")]
    return bool(live) and (expected is None or len(live) >= expected) and all(map(pod_started, live))


def waiting_for(pods: list[dict[str, Any]], expected: int | None) -> str:
    """What a run that has not started waits for, in words: its first pod's problem, else how many pods exist."""
    waits = pod_waits(pods)
    if waits:
        return waits[0].describe()
    live = [pod for pod in pods if not (pod.get("metadata") or {}).get("deletionTimestamp")]
    if not live:
        return "no pod yet (its controller has created none: `kubectl describe` the job for its events)"
    if expected is not None and len(live) < expected:
        unready = next(((_name(pod), why) for pod in sorted(live, key=_name) if (why := _not_ready(pod))), None)
        if unready:  # a controller that starts the rest once these are Ready (JobSet's dependsOn: the MPI launcher)
            return (f"{len(live)} of {expected} pods created; pod {unready[0]} is not Ready ({unready[1]}), and "
                    f"the job's controller may create the others only once it is")
        return (f"{len(live)} of {expected} pods created (the job's controller has not created the others: "
                f"`kubectl describe` the job for its events)")
    return "its pods to start"
