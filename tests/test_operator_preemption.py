"""A preempted run is named so and run again once: the real kopf operator against the emulator.

The test plays the training operator (tests/kube/training.py) and the scheduler's preemption as upstream words it
(tests/kube/kubelet.py `preempt`: the victim's DisruptionTarget condition, reason PreemptionByScheduler, and its
Preempted event). Not emulated: a real scheduler choosing the victim, and the pod's deletion after its grace period
(the emulator keeps the stopped pod; the training operator would re-create it, or fail the job as here).
"""

from __future__ import annotations

import pytest
from fault_figures import FIGURES
from kube.fixtures import benchmark, run_entry, wait_for

pytestmark = pytest.mark.timeout(120)

PREEMPTED = ("preempted (PreemptionByScheduler: default-scheduler: preempting to accommodate a higher priority pod)")


def two_nodes(name: str) -> dict:
    return benchmark(name, [{"name": "ddp"}], sweep={
        "strategies": [{"name": "ddp"}], "scales": [{"nodes": 2, "devicesPerNode": 0, "processesPerNode": 1}]})


def preempted_attempt(trainer, name: str, uid: str | None = None) -> dict:
    """The benchmark's job (another than `uid`), its pods running, then its worker preempted and the job Failed."""
    job = wait_for(lambda: next((j for j in trainer.jobs(name) if j["metadata"]["uid"] != uid), None),
                   what="a job of its own")
    for pod in trainer.create_pods(job):
        trainer.running(pod)
    trainer.start(job)
    trainer.preempt(f"{job['metadata']['name']}-worker-0")
    trainer.fail(job, "Worker")
    return job


@pytest.mark.faults
def test_a_preempted_run_is_named_so_and_run_again_once(benchmarks, trainer):
    name = "preempted"
    benchmarks.create(two_nodes(name))
    first = preempted_attempt(trainer, name)
    entry = wait_for(lambda: (r := run_entry(benchmarks.status(name), 0)).get("reason", "").startswith("preempted, ")
                     and r, what="the run to run again, saying why")
    worker = f"{first['metadata']['name']}-worker-0"
    assert entry["phase"] in ("Pending", "Running")  # its job created anew at once (its reason stays till it ends)
    assert entry["reason"].startswith(f"preempted, to run again once: pod {worker} {PREEMPTED}; PyTorchJobFailed: ")
    again = wait_for(lambda: next((j for j in trainer.jobs(name) if j["metadata"]["uid"] != first["metadata"]["uid"]),
                                  None), what="the run's job created anew")
    assert again["metadata"]["name"] == first["metadata"]["name"]
    trainer.start(again)
    trainer.succeed(again, 42.0)
    status = wait_for(lambda: (s := benchmarks.status(name)).get("phase") == "Succeeded" and s, what="Succeeded")
    run = status["runs"][0]
    assert run["results"]["tokensPerSecond"] == 42.0
    assert run["reason"].startswith(f"ran again after a preemption: pod {worker} {PREEMPTED}")
    events = benchmarks.posted(name, "RunPreempted")
    assert len(events) == 1 and events[0]["type"] == "Warning" and worker in events[0]["message"]
    FIGURES["run-preempted"] = {"injected": 1, "runs_run_again": 1, "runs_lost": 0, "final_phase": status["phase"],
                                "reason": run["reason"]}


def test_a_run_preempted_twice_fails_naming_both(benchmarks, trainer):
    name = "preempted-twice"
    benchmarks.create(two_nodes(name))
    first = preempted_attempt(trainer, name)
    preempted_attempt(trainer, name, uid=first["metadata"]["uid"])
    status = wait_for(lambda: (s := benchmarks.status(name)).get("phase") == "Failed" and s, what="Failed")
    reason = status["runs"][0]["reason"]
    worker = f"{first['metadata']['name']}-worker-0"
    assert reason.startswith(f"pod {worker} {PREEMPTED}; PyTorchJobFailed: ")
    assert f"; its first attempt was: pod {worker} {PREEMPTED}" in reason
