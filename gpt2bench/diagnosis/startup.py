"""A starting run's pods: waiting for capacity, or never going to start? (docs/operator.md, Starting runs.)

A GPU run's pods may wait a long time for capacity that is on its way: a node the cluster autoscaler (or
Karpenter) is adding (GPU nodes take 5-15 minutes), nodes busy with other pods, a gang scheduler holding the
group until every member fits, a 10+ GB image still pulling. Others will not start however long they wait: an
image that cannot be pulled, a bad config, a pod no node could ever take. The first kind is limited by
`runPolicy.capacitySeconds` (generous), the second by `runPolicy.startupSeconds`, and both reasons quote the
component that said so: the scheduler (the pod's PodScheduled condition), the kubelet (the container's waiting
state and its image events), the autoscaler (the pod's events).

Upstream's words, as they write them:
- cluster-autoscaler (processors/status/eventing_scale_up_processor.go): `TriggeredScaleUp` "pod triggered
  scale-up: [{<group> 1->3 (max: 4)}]"; `NotTriggerScaleUp` "pod didn't trigger scale-up: <n> <reason>, ...",
  where only the limits (core/scaleup/orchestrator/skippedreasons.go: "max node group size reached", "in backoff
  after failed scale-up", "not ready for scale-up", "max cluster <resources> limit reached", and "max total
  nodes in cluster reached") may pass; any other reason is a pod no node group can take.
- Karpenter (pkg/events): `Nominated` "Pod should schedule on: nodeclaim/<name>"; its `FailedScheduling`
  "Failed to schedule pod, <why>".
- kube-scheduler's FitError: "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes
  are available: 3 No preemption victims found for incoming pod." (busy: may come), or every node "Preemption
  is not helpful for scheduling" (a selector, a taint, a request larger than any node: kubernetes#131345).
- gang schedulers: scheduler-plugins' coscheduling "cannot find enough sibling pods", "rejected due to timeout
  after waiting"; Volcano "pod group is not ready".
- the kubelet (images/image_manager.go): `Pulling` "Pulling image \"<image>\"" while the container waits in
  ContainerCreating, then `Pulled` or `Failed`; a container still being created is on its way unless the
  kubelet's newest word about the pod is a Warning (`FailedMount`, `FailedCreatePodSandBox`, `Failed`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpt2bench.collect import clean_reason
from gpt2bench.diagnosis import STARTING, PodWait, pod_waits, waiting_for

CAPACITY, START = "capacity", "start"  # may come by waiting / will not: runPolicy.capacitySeconds / startupSeconds
AUTOSCALER_REASONS = ("TriggeredScaleUp", "NotTriggerScaleUp")
KARPENTER_NOMINATED = "Nominated"
KARPENTER_FAILED_PREFIX = "Failed to schedule pod, "
# cluster-autoscaler's reasons for not scaling up that say "not now", not "never"
_AUTOSCALER_LIMITS = re.compile(r"^(\d+ )?(max node group size reached|in backoff after failed scale-up|not ready for "
                                r"scale-up|max cluster .* limit reached|max total nodes in cluster reached)$")
_GANG_WAITS = ("cannot find enough sibling pods", "rejected due to timeout after waiting", "pod group is not ready",
               "tasks in gang unschedulable")
_UNRESOLVABLE = re.compile(r"preemption: 0/(\d+) nodes are available: (\d+) Preemption is not helpful for scheduling\.?$")
IMAGE_EVENTS = ("Pulling", "Pulled", "Failed", "BackOff")


@dataclass(frozen=True)
class StartWait:
    """What a run that has not started waits for: `kind` CAPACITY (may come: runPolicy.capacitySeconds) or START
    (will not come by waiting: runPolicy.startupSeconds), and `words`, the components' own."""

    kind: str
    words: str


def _when(event: dict[str, Any]) -> str:
    """An event's time as RFC 3339 text (sortable): its last occurrence, else its creation."""
    series = (event.get("series") or {}).get("lastObservedTime")
    return (event.get("lastTimestamp") or series or event.get("eventTime") or event.get("firstTimestamp")
            or (event.get("metadata") or {}).get("creationTimestamp") or "")


def latest(events: Iterable[dict[str, Any]], reasons: Iterable[str]) -> dict[str, Any] | None:
    wanted = set(reasons)
    chosen = [event for event in events if event.get("reason") in wanted]
    return max(chosen, key=_when, default=None)


def said(event: dict[str, Any]) -> str:
    """`<reason>: <message>` with who said it (the event's reporting component)."""
    who = (event.get("source") or {}).get("component") or event.get("reportingComponent") or ""
    return f"{who + ' ' if who else ''}{event.get('reason')}: {clean_reason(event.get('message') or '')}"


def _provisioner(events: list[dict[str, Any]]) -> tuple[str, dict[str, Any]] | None:
    """The newest word of a node provisioner about this pod: (kind, event)."""
    karpenter_failed = [e for e in events if e.get("reason") == "FailedScheduling"
                        and str(e.get("message") or "").startswith(KARPENTER_FAILED_PREFIX)]
    event = max([*(e for e in events if e.get("reason") in (*AUTOSCALER_REASONS, KARPENTER_NOMINATED)),
                 *karpenter_failed], key=_when, default=None)
    if event is None:
        return None
    if event.get("reason") in ("TriggeredScaleUp", KARPENTER_NOMINATED):
        return CAPACITY, event
    if event.get("reason") == "NotTriggerScaleUp":
        reasons = (event.get("message") or "").removeprefix("pod didn't trigger scale-up:").strip()
        limits_only = reasons and all(_AUTOSCALER_LIMITS.match(part.strip()) for part in reasons.split(","))
        return (CAPACITY if limits_only else START), event
    return START, event  # Karpenter found no node pool for it


def unschedulable_kind(pod: dict[str, Any], wait: PodWait, events: list[dict[str, Any]]) -> tuple[str, str]:
    """An unscheduled pod: (kind, the words to add to the scheduler's)."""
    provisioner = _provisioner(events)
    if provisioner is not None:
        return provisioner[0], said(provisioner[1])
    if any(words in wait.message for words in _GANG_WAITS):
        return CAPACITY, ""  # the gang scheduler's words are the pod's condition already
    scheduler = latest(events, ["FailedScheduling"])
    if scheduler is not None and any(words in (scheduler.get("message") or "") for words in _GANG_WAITS):
        return CAPACITY, said(scheduler)
    nominated = (pod.get("status") or {}).get("nominatedNodeName")
    if nominated:
        return CAPACITY, f"preempting lower-priority pods on node {nominated}"
    unresolvable = _UNRESOLVABLE.search(wait.message)
    if unresolvable and unresolvable.group(1) == unresolvable.group(2):
        return START, ""  # no node could take it, even emptied, and no autoscaler offers one
    return CAPACITY, ""  # nodes that could take it are busy


def pod_kind(pod: dict[str, Any], wait: PodWait, events: list[dict[str, Any]]) -> tuple[str, str]:
    """(kind, words beyond the wait's own) of one pod that has not started."""
    if wait.reason == "Unschedulable":
        return unschedulable_kind(pod, wait, events)
    if wait.reason == "Pending":  # created, not yet looked at by its scheduler (a busy one, a gang's backlog)
        return CAPACITY, ""
    if wait.reason in STARTING:  # on its way: an image pulling, volumes mounting, unless the kubelet warns
        warning = max((e for e in events if e.get("type") == "Warning"), key=_when, default=None)
        newest = max(events, key=_when, default=None)
        if warning is not None and warning is newest:  # FailedMount, FailedCreatePodSandBox, Failed (a pull) ...
            return START, said(warning)
        image = latest(events, IMAGE_EVENTS)
        return CAPACITY, said(image) if image is not None and image.get("reason") == "Pulling" else ""
    return START, ""


def classify(pods: list[dict[str, Any]], expected: int | None,
             events_by_pod: dict[str, list[dict[str, Any]]] | None = None) -> StartWait:
    """What a run whose pods have not all started waits for (`events_by_pod`: pod name -> its events). One pod that
    will not start makes the run's wait a START one, whatever the others wait for; else any pod waiting for
    capacity makes it a CAPACITY one (a pod its scheduler has not looked at yet too); no pod at all is START (its
    controller made none: waiting_for says where to look)."""
    by_name = {(pod.get("metadata") or {}).get("name", ""): pod for pod in pods}
    kinds = []
    for wait in pod_waits(pods):
        kind, extra = pod_kind(by_name.get(wait.pod, {}), wait, (events_by_pod or {}).get(wait.pod, []))
        kinds.append((kind, wait.describe() + (f"; {extra}" if extra else "")))
    never = [words for kind, words in kinds if kind == START]
    if never:
        return StartWait(START, never[0])
    if kinds:
        return StartWait(CAPACITY, kinds[0][1])
    return StartWait(START, waiting_for(pods, expected))


def capacity_reason(wait: str, limit: int) -> str:
    """A run that waited for capacity longer than runPolicy.capacitySeconds."""
    return f"waited for capacity longer than runPolicy.capacitySeconds ({limit} s): {wait}"


# The job's controller could not create a pod: its own Event on the job (training-operator common/pod_control.go and
# mpi-operator: `FailedCreatePod` "Error creating: <the API server's answer>"). A TrainJob's pods are the Job
# controller's (one Job per replicated job of its JobSet), whose Event is on that Job (kubernetes
# pkg/controller/controller_utils.go RealPodControl.createPods: `FailedCreate`, the same message, from
# `job-controller`). The API server's answer is an admission's: Pod Security (`violates PodSecurity
# "restricted:latest": ...`), a LimitRange (`maximum cpu usage per Container is 4, but limit is 8`), a ResourceQuota
# (`exceeded quota: compute, requested: requests.nvidia.com/gpu=8, used: requests.nvidia.com/gpu=8, limited:
# ...=8`), a webhook.
CREATE_REFUSED = ("FailedCreatePod", "FailedCreate")
_QUOTA = re.compile(r"exceeded quota: [^,]+, requested: (?P<requested>[^ ]+(?:,[^ ]+)*), used: (?P<used>[^ ]+(?:,"
                    r"[^ ]+)*), limited: (?P<limited>[^ ]+(?:,[^ ]+)*)")


def _amounts(text: str) -> dict[str, float | None]:
    found = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        found[name.strip()] = _quantity(value.strip())
    return found


def _quantity(text: str) -> float | None:
    """A Kubernetes quantity as a number (enough to compare two of one resource); None when it is not one."""
    units = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    number = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", text)
    if not number or (number.group(2) and number.group(2) not in units):
        return None
    return float(number.group(1)) * units.get(number.group(2), 1)


def quota_may_pass(message: str) -> bool:
    """A quota refusal that may pass once other pods end: what the pod asks fits the quota's limit; one that asks
    more than the limit never passes."""
    found = _QUOTA.search(message)
    if not found:
        return False
    requested, limited = _amounts(found.group("requested")), _amounts(found.group("limited"))
    return all(limit is None or (asked := requested.get(name)) is None or asked <= limit
               for name, limit in limited.items())


def refused_creation(events: Iterable[dict[str, Any]]) -> StartWait | None:
    """The newest word of a job's controller that the API server refused one of its pods (the job's own events; a
    TrainJob's, its JobSet's Jobs'), quoted: START when waiting will not change the answer (Pod Security, a
    LimitRange, a quota the pod exceeds on its own, a webhook), CAPACITY for a quota other pods use up; None when
    nothing was refused."""
    event = latest((e for e in events if e.get("type") == "Warning"), CREATE_REFUSED)
    if event is None:
        return None
    words = said(event)
    return StartWait(CAPACITY if quota_may_pass(event.get("message") or "") else START, words)
