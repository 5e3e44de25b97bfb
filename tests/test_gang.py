"""Gang sizes that can be met (docs/clusters.md, Gang scheduling with MPI launchers): for every Horovod run of the
GPU example with `gang: true`, the pods its controllers create before any pod is Ready must be at least the
PodGroup's minimum, or the gang scheduler waits for a pod that will never come (kubeflow/mpi-operator#608).

The controllers' rules, as their sources say (read for this test, not imported):
- mpi-operator v2 (pkg/controller/mpi_job_controller.go `syncHandler`): the worker pods at once; the launcher Job
  at once under `launcherCreationPolicy: AtStartup`, else only when every worker is Ready; both carry the
  PodGroup (`decoratePodTemplateSpec`). Its PodGroup's minMember (podgroup.go `calculateMinAvailable`):
  `runPolicy.schedulingPolicy.minAvailable`, else workers + 1.
- Kubeflow Trainer v2: the PodGroup's minMember is every pod of every replicated job (plugins/coscheduling and
  plugins/volcano `Build`: the sum of the PodSets' counts); JobSet creates a replicated job that `dependsOn`
  another only once that one is Ready (tests/kube/trainer_v2.py plays it).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from kube.trainer_v2 import pod_counts
from kubeflow_crds import validate_job

from gpt2bench.plan import plan_runs
from gpt2bench.render import render_job
from gpt2bench.render.runtimes import project_runtimes
from gpt2bench.specification.validation import load_benchmark

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = yaml.safe_load((REPO / "manifests" / "examples" / "gpu-papers.yaml").read_text())
COSCHEDULING = {"coscheduling": {"scheduleTimeoutSeconds": 60}}


def mpijob_gang(job: dict) -> tuple[int, int]:
    """(pods mpi-operator creates before any is Ready, the PodGroup's minMember)."""
    spec = job["spec"]
    workers = spec["mpiReplicaSpecs"]["Worker"]["replicas"]
    launcher_at_start = spec.get("launcherCreationPolicy", "AtStartup") == "AtStartup"
    policy = spec["runPolicy"].get("schedulingPolicy") or {}
    return workers + int(launcher_at_start), policy.get("minAvailable", workers + 1)


def trainjob_gang(job: dict, runtime: dict) -> tuple[int, int]:
    """(pods JobSet creates before any is Ready, the Trainer's PodGroup minMember)."""
    named = {**job, "metadata": {**job["metadata"], "uid": "uid"}}
    counts = pod_counts(named, runtime)
    jobs = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    at_start = sum(counts[rjob["name"]] for rjob in jobs if not rjob.get("dependsOn"))
    return at_start, sum(counts.values())


def gang_benchmark(backend: str):
    spec = {**EXAMPLE["spec"], "backend": backend, "scheduling": {**EXAMPLE["spec"].get("scheduling", {}),
                                                                   "gang": True}}
    spec["sweep"] = {**spec["sweep"], "strategies": [{"name": "horovod"}], "repeats": 1, "precisions": ["bf16"]}
    return load_benchmark({**EXAMPLE, "spec": spec})


def test_every_multi_node_mpijob_of_the_gpu_example_renders_a_gang_that_can_be_met():
    bench = gang_benchmark("pytorchjob")
    runs = [run for run in plan_runs(bench) if run.nodes > 1]
    assert runs
    for run in runs:
        job = render_job(bench, run)
        validate_job(job)
        assert (job["spec"]["launcherCreationPolicy"], job["spec"]["runPolicy"]["schedulingPolicy"]["minAvailable"]) \
            == ("AtStartup", run.nodes + 1)
        created, minimum = mpijob_gang(job)
        assert created >= minimum, run.name
        # the pair it replaced: the launcher only once the workers are Ready, and a gang that counts it
        old = copy.deepcopy(job)
        old["spec"]["launcherCreationPolicy"] = "WaitForWorkersReady"
        created, minimum = mpijob_gang(old)
        assert created < minimum  # the rule catches kubeflow/mpi-operator#608


@pytest.mark.parametrize("policy", [COSCHEDULING, {"volcano": {}}])
def test_every_multi_node_trainjob_of_the_gpu_example_renders_a_gang_its_runtime_can_meet(policy):
    runtimes = project_runtimes(pod_group_policy=policy)
    bench = gang_benchmark("trainjob")
    runs = [run for run in plan_runs(bench) if run.nodes > 1]
    assert runs
    for run in runs:
        job = render_job(bench, run)
        runtime = runtimes[job["spec"]["runtimeRef"]["name"]]
        validate_job(runtime)
        created, minimum = trainjob_gang(job, runtime)
        assert created >= minimum == run.nodes, run.name  # runLauncherAsNode: N pods, all of them train
        # the runtime it replaced: a gang with the launcher held back until the `node` pods are Ready
        held_back = copy.deepcopy(runtime)
        launcher = next(r for r in held_back["spec"]["template"]["spec"]["replicatedJobs"] if r["name"] == "launcher")
        launcher["dependsOn"] = [{"name": "node", "status": "Ready"}]
        created, minimum = trainjob_gang(job, held_back)
        assert created < minimum


def test_without_a_gang_the_mpi_runtimes_keep_starting_the_launcher_once_the_sshd_pods_are_ready():
    launcher = next(r for r in project_runtimes()["gpt2bench-mpi-cuda"]["spec"]["template"]["spec"]["replicatedJobs"]
                    if r["name"] == "launcher")
    assert launcher["dependsOn"] == [{"name": "node", "status": "Ready"}]


def test_the_launcher_waits_for_the_workers_sshd_as_long_as_the_run_may_wait_to_start():
    for backend in ("pytorchjob", "trainjob"):
        bench = gang_benchmark(backend)
        policy = bench.spec.run_policy
        for run in plan_runs(bench):
            job = render_job(bench, run)
            command = (job["spec"]["trainer"]["command"] if job["kind"] == "TrainJob" else
                       job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"])
            assert command[:5] == ["gpt2bench", "launch", "--wait-seconds",
                                   str(policy.capacity_seconds + policy.startup_seconds), "--"], command[:6]
