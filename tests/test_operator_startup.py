"""Waiting for capacity is not failing to start (docs/operator.md, Starting runs): the real kopf operator against the
emulated API (tests/kube), the test playing the training operator, the scheduler, the kubelet and
cluster-autoscaler in their own words (tests/kube/kubelet.py; gpt2bench.diagnosis.startup quotes their sources).

- a pod waiting for a node the autoscaler is adding outlives runPolicy.startupSeconds and fails only at
  runPolicy.capacitySeconds, both times saying so in the autoscaler's words;
- a pod no node group can take fails at the startup limit, with the autoscaler's reason;
- an image still pulling is waited for, and the run starts once it is pulled;
- a pod re-created after the run started (its node lost, its controller making a new one) is followed: it
  fails the run at the startup limit when it can never start.
"""

from __future__ import annotations

import time

import pytest
from fault_figures import seconds_since
from kube.fixtures import benchmark, wait_for

from gpt2bench import diagnosis
from gpt2bench.diagnosis.startup import capacity_reason

pytestmark = pytest.mark.timeout(180)
STARTUP, CAPACITY = 3, 8
TWO_NODES = [{"nodes": 2, "devicesPerNode": 0, "processesPerNode": 1}]
BUSY = ("0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: 3 No preemption "
        "victims found for incoming pod.")
SCALE_UP = "[{eks-gpu-p5 1->2 (max: 4)}]"


def create(benchmarks, name: str, startup: int = STARTUP, capacity: int = CAPACITY) -> None:
    body = benchmark(name, [{"name": "ddp"}, {"name": "fsdp"}],
                     runPolicy={"startupSeconds": startup, "capacitySeconds": capacity})
    body["spec"]["sweep"]["scales"] = TWO_NODES
    benchmarks.create(body)


def first_run(benchmarks, name: str) -> dict:
    return (benchmarks.status(name).get("runs") or [{}])[0]


def started_job(benchmarks, trainer, name: str, worker_waits=None, **limits: int) -> tuple[dict, str, str, float]:
    """The run's job, its master running and its worker in the state `worker_waits(worker)` puts it in, at once."""
    create(benchmarks, name, **limits)
    job = wait_for(lambda: next(iter(trainer.jobs(name)), None), 30, what=f"the first job of {name}")
    seen = time.monotonic()
    trainer.start(job)
    master, worker = trainer.create_pods(job)
    trainer.running(master)
    if worker_waits is not None:
        worker_waits(worker)
    return job, master, worker, seen


def scale_up(trainer, triggered: bool, words: str):
    def waits(worker: str) -> None:
        trainer.unschedulable(worker, BUSY)
        trainer.autoscaler_event(worker, triggered, words)
    return waits


def test_a_pod_waiting_for_a_scale_up_outlives_the_startup_limit_and_fails_at_the_capacity_limit(benchmarks, trainer):
    name = "scaleup"
    _, _, worker, seen = started_job(benchmarks, trainer, name, scale_up(trainer, True, SCALE_UP))
    words = (f"pod {worker} Unschedulable: {BUSY}; cluster-autoscaler TriggeredScaleUp: pod triggered scale-up: "
             f"{SCALE_UP}")
    entry = wait_for(lambda: (r := first_run(benchmarks, name)).get("waiting") == words and r, 10, what=words)
    assert entry["waitingKind"] == "capacity"
    time.sleep(max(0.0, STARTUP + 2 - seconds_since(seen)))  # past the startup limit: still waiting
    assert first_run(benchmarks, name)["phase"] == "Running"
    failed = wait_for(lambda: (r := first_run(benchmarks, name)).get("phase") == "Failed" and r, 20, what="failed")
    assert failed["reason"] == capacity_reason(words, CAPACITY)
    # counted from the job's creation (whole seconds, before this test saw the job): near CAPACITY after `seen`
    assert seconds_since(seen) >= CAPACITY - 2


def test_a_pod_no_node_group_can_take_fails_at_the_startup_limit_with_the_autoscalers_reason(benchmarks, trainer):
    name = "noscaleup"
    _, _, worker, seen = started_job(benchmarks, trainer, name, scale_up(
        trainer, False, "2 Insufficient nvidia.com/gpu, 1 node(s) didn't match Pod's node affinity/selector"),
        capacity=60)
    failed = wait_for(lambda: (r := first_run(benchmarks, name)).get("phase") == "Failed" and r, 20, what="failed")
    words = (f"pod {worker} Unschedulable: {BUSY}; cluster-autoscaler NotTriggerScaleUp: pod didn't trigger "
             "scale-up: 2 Insufficient nvidia.com/gpu, 1 node(s) didn't match Pod's node affinity/selector")
    assert failed["reason"] == diagnosis.startup_reason(words, STARTUP)
    assert seconds_since(seen) < 60  # not the capacity limit


def test_an_image_still_pulling_is_waited_for_and_the_run_starts_once_it_is_pulled(benchmarks, trainer):
    name = "pulling"
    job, master, worker, seen = started_job(benchmarks, trainer, name, trainer.pulling)
    words = (f"pod {worker} (container pytorch) ContainerCreating; kubelet Pulling: Pulling image "
             f"\"{trainer._container(worker)['image']}\"")
    entry = wait_for(lambda: (r := first_run(benchmarks, name)).get("waiting") == words and r, 10, what=words)
    assert entry["waitingKind"] == "capacity"
    time.sleep(max(0.0, STARTUP + 2 - seconds_since(seen)))
    assert first_run(benchmarks, name)["phase"] == "Running"
    trainer.pulled(worker)
    trainer.running(worker)
    started = wait_for(lambda: (r := first_run(benchmarks, name)).get("podsStartedTime") and r, 10, what="started")
    assert not started.get("waiting") and not started.get("waitingKind")
    trainer.succeed(job, 100.0)
    wait_for(lambda: first_run(benchmarks, name).get("phase") == "Succeeded", 20, what="succeeded")


def test_a_pod_recreated_after_the_run_started_is_followed_and_fails_the_run_when_it_cannot_start(benchmarks, trainer):
    name = "recreated"
    startup = 4  # room for the first start too: this test starts both pods before re-creating one
    _, _, worker, _ = started_job(benchmarks, trainer, name, trainer.running, startup=startup, capacity=30)
    wait_for(lambda: first_run(benchmarks, name).get("podsStartedTime"), 10, what="started")
    time.sleep(1.1)  # creation times have a resolution of one second
    old = trainer._pod(worker)
    trainer.core.delete_namespaced_pod(worker, trainer.namespace)  # its node was lost; the controller makes another
    wait_for(lambda: worker not in [p.metadata.name for p in trainer.core.list_namespaced_pod(trainer.namespace).items],
             10, what="the old pod gone")
    trainer.core.create_namespaced_pod(trainer.namespace, {
        "apiVersion": "v1", "kind": "Pod", "spec": old["spec"] | {"nodeName": None}, "status": {"phase": "Pending"},
        "metadata": {key: old["metadata"][key] for key in ("name", "labels", "ownerReferences")}})
    recreated_at = time.monotonic()
    trainer.unschedulable(worker, BUSY)
    trainer.autoscaler_event(worker, False, "1 Insufficient nvidia.com/gpu")
    failed = wait_for(lambda: (r := first_run(benchmarks, name)).get("phase") == "Failed" and r, 20, what="failed")
    words = (f"re-created after the run started: pod {worker} Unschedulable: {BUSY}; cluster-autoscaler "
             "NotTriggerScaleUp: pod didn't trigger scale-up: 1 Insufficient nvidia.com/gpu")
    assert failed["reason"] == diagnosis.startup_reason(words, startup)
    assert seconds_since(recreated_at) < 30


def test_rbac_covers_reading_the_pods_events(cluster, benchmarks):
    """The events the operator lists are granted by the roles bound to it in manifests/operator.yaml."""
    from kube.fixtures import operator_calls
    from test_operator_manifests import allowed, cluster_role_rules

    made = operator_calls(cluster)
    assert ("", "events", "list") in made
    assert [call for call in sorted(made) if not allowed(cluster_role_rules(), *call)] == []
