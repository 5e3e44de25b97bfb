"""Waiting for capacity told apart from never starting (gpt2bench.diagnosis.startup), on pods and events as the scheduler,
the kubelet, cluster-autoscaler, Karpenter and the gang schedulers write them (their sources are quoted in the
module). The operator's use of it, against the emulated API: tests/test_operator_startup.py."""

from __future__ import annotations

import pytest

from gpt2bench.diagnosis.startup import CAPACITY, START, classify

BUSY = ("0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: 3 No preemption "
        "victims found for incoming pod.")
NEVER_FITS = ("0/3 nodes are available: 1 node(s) had untolerated taint {nvidia.com/gpu: present}, 2 Insufficient "
              "nvidia.com/gpu. preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling.")
PARTLY = ("0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, 2 Insufficient nvidia.com/gpu. "
          "preemption: 0/3 nodes are available: 1 Preemption is not helpful for scheduling, 2 No preemption victims "
          "found for incoming pod.")
COSCHEDULING = ("0/3 nodes are available: pre-filter pod b-node-0-0 cannot find enough sibling pods, current pods "
                "number: 2, minMember of group: 3.")


def pod(name: str, *, unschedulable: str | None = None, waiting: tuple[str, str] | None = None,
        nominated: str | None = None) -> dict:
    status: dict = {"phase": "Pending"}
    if unschedulable is not None:
        status["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                 "message": unschedulable}]
    if waiting is not None:
        status["conditions"] = [{"type": "PodScheduled", "status": "True"}]
        status["containerStatuses"] = [{"name": "node", "state": {"waiting": {"reason": waiting[0],
                                                                              "message": waiting[1]}}}]
    if nominated:
        status["nominatedNodeName"] = nominated
    return {"metadata": {"name": name, "uid": f"uid-{name}"}, "status": status}


def event(reason: str, message: str, component: str, at: str = "2026-11-27T10:00:00Z") -> dict:
    return {"reason": reason, "message": message, "source": {"component": component}, "lastTimestamp": at}


TRIGGERED = event("TriggeredScaleUp", "pod triggered scale-up: [{eks-gpu-p5 0->2 (max: 4)}]", "cluster-autoscaler")


@pytest.mark.parametrize("case, pods, events, kind, words", [
    ("autoscaler adds a node", [pod("p", unschedulable=NEVER_FITS)], {"p": [TRIGGERED]}, CAPACITY,
     "cluster-autoscaler TriggeredScaleUp: pod triggered scale-up: [{eks-gpu-p5 0->2 (max: 4)}]"),
    ("no node group can take it", [pod("p", unschedulable=BUSY)],
     {"p": [event("NotTriggerScaleUp", "pod didn't trigger scale-up: 2 Insufficient nvidia.com/gpu, 1 node(s) "
                  "didn't match Pod's node affinity/selector", "cluster-autoscaler")]}, START,
     "NotTriggerScaleUp: pod didn't trigger scale-up: 2 Insufficient nvidia.com/gpu"),
    ("node groups at their limits", [pod("p", unschedulable=BUSY)],
     {"p": [event("NotTriggerScaleUp", "pod didn't trigger scale-up: 1 max node group size reached, 1 in backoff after "
                  "failed scale-up", "cluster-autoscaler")]}, CAPACITY, "max node group size reached"),
    ("the cluster at its limit", [pod("p", unschedulable=BUSY)],
     {"p": [event("NotTriggerScaleUp", "pod didn't trigger scale-up: max total nodes in cluster reached",
                  "cluster-autoscaler")]}, CAPACITY, "max total nodes in cluster reached"),
    ("the newest autoscaler word counts", [pod("p", unschedulable=BUSY)],
     {"p": [event("NotTriggerScaleUp", "pod didn't trigger scale-up: 2 Insufficient nvidia.com/gpu",
                  "cluster-autoscaler", at="2026-11-27T10:00:00Z"),
            {**TRIGGERED, "lastTimestamp": "2026-11-27T10:01:00Z"}]}, CAPACITY, "TriggeredScaleUp"),
    ("Karpenter launches a node", [pod("p", unschedulable=NEVER_FITS)],
     {"p": [event("Nominated", "Pod should schedule on: nodeclaim/gpu-x7k2p", "karpenter")]}, CAPACITY,
     "karpenter Nominated: Pod should schedule on: nodeclaim/gpu-x7k2p"),
    ("Karpenter has no node pool for it", [pod("p", unschedulable=NEVER_FITS)],
     {"p": [event("FailedScheduling", "Failed to schedule pod, incompatible with nodepool \"gpu\", no instance type "
                  "satisfied resources", "karpenter")]}, START,
     "karpenter FailedScheduling: Failed to schedule pod, incompatible with nodepool"),
    ("busy nodes, no autoscaler", [pod("p", unschedulable=BUSY)], {}, CAPACITY, "No preemption victims"),
    ("some nodes could take it once free", [pod("p", unschedulable=PARTLY)], {}, CAPACITY, "didn't match"),
    ("no node could ever take it", [pod("p", unschedulable=NEVER_FITS)], {}, START, "Preemption is not helpful"),
    ("preempting for it", [pod("p", unschedulable=NEVER_FITS, nominated="gpu-3")], {}, CAPACITY,
     "preempting lower-priority pods on node gpu-3"),
    ("a gang waiting for its members", [pod("p", unschedulable=COSCHEDULING)], {}, CAPACITY,
     "cannot find enough sibling pods"),
    ("Volcano's gang, in an event", [pod("p", unschedulable="0/3 nodes are available")],
     {"p": [event("FailedScheduling", "3/2 tasks in gang unschedulable: pod group is not ready, 2 Pending, 3 "
                  "minAvailable", "volcano")]}, CAPACITY, "volcano FailedScheduling"),
    ("an image still pulling", [pod("p", waiting=("ContainerCreating", ""))],
     {"p": [event("Pulling", 'Pulling image "registry.example/gpt2bench:0.1.0-cuda"', "kubelet")]}, CAPACITY,
     'kubelet Pulling: Pulling image "registry.example/gpt2bench:0.1.0-cuda"'),
    ("pulled, now creating", [pod("p", waiting=("ContainerCreating", ""))],
     {"p": [event("Pulling", 'Pulling image "x"', "kubelet", at="2026-11-27T10:00:00Z"),
            event("Pulled", 'Successfully pulled image "x" in 2m (2m including waiting)', "kubelet",
                  at="2026-11-27T10:02:00Z")]}, CAPACITY, "ContainerCreating"),
    ("a volume that will not mount", [pod("p", waiting=("ContainerCreating", ""))],
     {"p": [event("Pulled", 'Container image "x" already present on machine', "kubelet", at="2026-11-27T10:00:00Z"),
            {**event("FailedMount", 'MountVolume.SetUp failed for volume "data" : persistentvolumeclaim "corpus" '
                     'not found', "kubelet", at="2026-11-27T10:01:00Z"), "type": "Warning"}]}, START,
     'kubelet FailedMount: MountVolume.SetUp failed for volume "data"'),
    ("an image that cannot be pulled", [pod("p", waiting=("ErrImagePull", 'failed to pull image "x": not found'))],
     {"p": [event("Pulling", 'Pulling image "x"', "kubelet")]}, START, "ErrImagePull"),
    ("a bad config", [pod("p", waiting=("CreateContainerConfigError", 'secret "hf" not found'))], {}, START,
     'secret "hf" not found'),
    ("not looked at yet", [{"metadata": {"name": "p"}, "status": {"phase": "Pending"}}], {}, CAPACITY,
     "no container status yet"),
    ("no pod yet", [], {}, START, "no pod yet"),
])  # fmt: skip
def test_each_wait_is_told_as_capacity_or_a_start_that_will_not_come(case, pods, events, kind, words):
    wait = classify(pods, len(pods) or 1, events)
    assert wait.kind == kind, (case, wait)
    assert words in wait.words, (case, wait.words)


def test_one_pod_that_will_never_start_makes_the_run_a_start_wait_whatever_the_others_wait_for():
    pods = [pod("a-launcher", unschedulable=BUSY), pod("a-worker-0", waiting=("ErrImagePull", "not found")),
            pod("a-worker-1", unschedulable=NEVER_FITS)]
    wait = classify(pods, 3, {"a-worker-1": [TRIGGERED]})
    assert wait.kind == START and wait.words == "pod a-worker-0 (container node) ErrImagePull: not found"
    only_capacity = classify([pods[0], pods[2]], 3, {"a-worker-1": [TRIGGERED]})
    assert only_capacity.kind == CAPACITY


def test_the_local_runners_no_gpu_words_read_as_a_start_that_will_not_come():
    """The local runner refuses at once a run this machine cannot hold, in the words a scheduler uses for a node
    that can never take the pod; the operator reads the same words as never starting (not as busy GPUs)."""
    from gpt2bench.local.executor import NO_ROOM_FOR_GPUS

    assert classify([pod("p", unschedulable=NO_ROOM_FOR_GPUS)], 1, {}).kind == START
