"""One cause, one stop, on a cluster: the real kopf operator (KopfRunner) against the emulator.

The test plays the training operator (tests/kube/training.py) and the user (`kubectl annotate`); the API server's
403 on job creation is an emulator fault worded as RBAC's authorizer words it, switched off mid-sweep as a fixed Role
would be. The rule itself (`gpt2bench.diagnosis.holds`) is tested on data in tests/test_shared_cause.py.
"""

from __future__ import annotations

import json
import threading
import time

import kmock
import pytest
from fault_figures import FIGURES, seconds_since
from kube.faults import Refuse
from kube.fixtures import benchmark, kopf_operator, kubectl_table, run_entry, wait_for
from kube.semantics import ApiError

pytestmark = pytest.mark.timeout(180)

SOCKETS = ("NCCL reached the other nodes over sockets (NET/Socket) on 2 of 2 ranks, not over the cluster's fabric: "
           "stopped after the first step instead of measuring the wrong network (spec.fabric.require auto; `none` "
           "runs a socket baseline on purpose). docs/clusters.md says what each cluster's fabric needs")
RBAC = ('pytorchjobs.kubeflow.org is forbidden: User "system:serviceaccount:gpt2bench:gpt2bench-operator" cannot '
        'create resource "pytorchjobs" in API group "kubeflow.org" in the namespace "default"')
REFUSING = threading.Event()  # set: the API server refuses the `rbac-` benchmark's jobs (a Role without create)
REFUSED: list[str] = []
RBAC_POLICIES = ('networkpolicies.networking.k8s.io is forbidden: User "system:serviceaccount:gpt2bench:gpt2bench-'
                 'operator" cannot create resource "networkpolicies" in API group "networking.k8s.io" in the namespace '
                 '"default"')
REFUSING_POLICIES = threading.Event()  # set: the `netpol-` benchmark's NetworkPolicies are refused (a Role without)


@pytest.fixture(scope="module")
def operator(cluster):
    def refuse(request: kmock.Request) -> ApiError | None:
        name = ((request.data or {}).get("metadata") or {}).get("name", "")
        if name.startswith("rbac-") and REFUSING.is_set():
            REFUSED.append(name)
            return ApiError(403, "Forbidden", RBAC)
        return None  # the emulator's own handling

    def refuse_policy(request: kmock.Request) -> ApiError | None:
        name = ((request.data or {}).get("metadata") or {}).get("name", "")
        if name.startswith("netpol-") and REFUSING_POLICIES.is_set():
            return ApiError(403, "Forbidden", RBAC_POLICIES)
        return None

    Refuse(refuse, method="POST", path=r"/namespaces/default/pytorchjobs$").install(cluster)
    Refuse(refuse_policy, method="POST", path=r"/namespaces/default/networkpolicies$").install(cluster)
    with kopf_operator(cluster, poll_seconds=0.3) as runner:
        yield runner


def phases(status: dict) -> list[str]:
    return [run["phase"] for run in status.get("runs") or []]


def conditions(status: dict) -> dict[str, dict]:
    return {c["type"]: c for c in status.get("conditions") or []}


def events(benchmarks, name: str, reason: str) -> list[dict]:
    return [e for e in benchmarks.events(name) if e["reason"] == reason]


def job_of(trainer, name: str, run: dict) -> dict:
    return wait_for(lambda: next((j for j in trainer.jobs(name) if j["metadata"]["name"] == run["jobName"]), None),
                    what=f"the job of {run['name']}")


@pytest.mark.faults
def test_a_fabric_failure_holds_the_multi_node_runs_the_single_node_ones_go_on_and_a_resume_releases_them(
        cluster, benchmarks, trainer):
    name = "fabric"
    body = benchmark(name, [{"name": "ddp"}], sweep={
        "strategies": [{"name": "ddp"}], "precisions": ["fp32", "bf16"],
        "scales": [{"nodes": 2, "devicesPerNode": 0, "processesPerNode": 1},
                   {"nodes": 1, "devicesPerNode": 0, "processesPerNode": 2}]})
    benchmarks.create(body)
    first = wait_for(lambda: trainer.jobs(name), what="the first job")[0]
    assert first["metadata"]["name"].endswith("-2x1")
    trainer.start(first)
    trainer.finish(first, succeeded=False, message=json.dumps({"status": "failed", "reason": SOCKETS}))
    status = wait_for(lambda: (s := benchmarks.status(name)) and phases(s)[:1] == ["Failed"]
                      and "Running" in phases(s) and s, what="the first run failed, a single-node run started")
    two_bf16, one_fp32, one_bf16 = status["runs"][1:]
    assert (two_bf16["nodes"], two_bf16["phase"]) == (2, "Pending")
    assert two_bf16["reason"].startswith(f"held (fabric): {status['runs'][0]['name']} failed for a cause every run on "
                                         "2+ nodes shares (once fixed: kubectl annotate gpt2benchmark fabric -n default "
                                         "gpt2bench.io/resume=1 --overwrite): ")
    assert "over sockets (NET/Socket)" in two_bf16["reason"]
    assert (one_fp32["phase"], one_bf16["phase"], one_bf16.get("reason")) == ("Running", "Pending", None)
    held = conditions(status)["RunsHeld"]
    assert (held["status"], held["reason"]) == ("True", "SharedCause") and "1 run held (fabric)" in held["message"]
    row = kubectl_table(cluster.kubectl("get", "gpt2benchmark", name).stdout)[0]
    assert row["PHASE"] == "Running" and row["WAITING"].startswith("1 run held (fabric): ")
    for index in (2, 3):  # the single-node runs go on, one at a time
        job = job_of(trainer, name, benchmarks.status(name)["runs"][index])
        trainer.start(job)
        trainer.succeed(job, 100.0 + index)
        wait_for(lambda i=index: phases(benchmarks.status(name))[i] == "Succeeded", what=f"run {index} succeeded")
    status = benchmarks.status(name)
    assert phases(status) == ["Failed", "Pending", "Succeeded", "Succeeded"] and status["phase"] == "Running"
    assert [j["metadata"]["name"] for j in trainer.jobs(name) if j["metadata"]["name"] == two_bf16["jobName"]] == []
    held_events = benchmarks.posted(name, "RunsHeld")
    assert len(held_events) == 1 and held_events[0]["type"] == "Warning"

    cluster.kubectl("annotate", "gpt2benchmark", name, "gpt2bench.io/resume=1", "--overwrite")  # the user: fixed
    job = job_of(trainer, name, two_bf16)
    status = wait_for(lambda: (s := benchmarks.status(name)) and conditions(s)["RunsHeld"]["status"] == "False" and s,
                      what="RunsHeld False")
    assert status["runs"][1]["phase"] == "Running" and status["runs"][1].get("reason") is None
    wait_for(lambda: "gpt2bench.io/resume" not in (benchmarks.get(name)["metadata"].get("annotations") or {}),
             what="the resume annotation removed")
    trainer.start(job)
    trainer.succeed(job, 90.0)
    status = wait_for(lambda: (s := benchmarks.status(name)).get("phase") == "PartiallySucceeded" and s,
                      what="PartiallySucceeded")
    assert phases(status) == ["Failed", "Succeeded", "Succeeded", "Succeeded"]
    resumed = benchmarks.posted(name, "RunsResumed")
    assert len(resumed) == 1 and two_bf16["name"] in resumed[0]["message"]
    FIGURES["shared-cause-fabric"] = {"injected": 1, "runs_held": 1, "single_node_runs_went_on": 2,
                                      "runs_held_events": 1, "runs_resumed_events": 1, "runs_lost": 0,
                                      "final_phase": status["phase"], "held_reason": two_bf16["reason"]}


@pytest.mark.faults
def test_a_403_on_job_creation_holds_the_sweep_and_it_goes_on_once_creation_works(cluster, benchmarks, trainer):
    name = "rbac-denied"
    REFUSING.set()
    benchmarks.create(benchmark(name, [{"name": "single"}, {"name": "ddp"}]))
    status = wait_for(lambda: (s := benchmarks.status(name)) and "RunsHeld" in conditions(s) and s,
                      what="the sweep held")
    wait_for(lambda: len(REFUSED) >= 3, what="creation tried again at later steps")
    status = benchmarks.status(name)
    assert phases(status) == ["Pending", "Pending"] and status["phase"] == "Running" and trainer.jobs(name) == []
    first = status["runs"][0]
    assert first["reason"].startswith(f"held (forbidden): {first['name']} was refused for a cause every PyTorchJob run "
                                      "shares (its creation is tried again at every step; the others wait until it "
                                      "works): the API server refused PyTorchJob ")
    assert "403 Forbidden" in first["reason"] and 'cannot create resource "pytorchjobs"' in first["reason"]
    assert status["runs"][1]["reason"] == first["reason"]
    assert conditions(status)["RunsHeld"]["message"].startswith("2 runs held (forbidden): ")
    assert len(benchmarks.posted(name, "RunsHeld")) == 1 and not events(benchmarks, name, "RunFailed")

    REFUSING.clear()  # the Role is fixed
    fixed, refusals = time.monotonic(), len(REFUSED)
    job = wait_for(lambda: trainer.jobs(name), what="the first job, once creation works")[0]
    created_after = seconds_since(fixed)
    assert job["metadata"]["name"] == first["jobName"]
    status = wait_for(lambda: (s := benchmarks.status(name)) and conditions(s)["RunsHeld"]["status"] == "False" and s,
                      what="RunsHeld False")
    assert status["runs"][1]["phase"] == "Pending" and status["runs"][1].get("reason") is None
    done = set()
    while len(done) < 2:
        job = wait_for(lambda: next((j for j in trainer.jobs(name) if j["metadata"]["name"] not in done), None),
                       what="the next job")
        trainer.start(job)
        trainer.succeed(job, 50.0 + len(done))
        done.add(job["metadata"]["name"])
    wait_for(lambda: benchmarks.status(name).get("phase") == "Succeeded", what="Succeeded")
    assert len(benchmarks.posted(name, "RunsHeld")) == 1 and len(benchmarks.posted(name, "RunsResumed")) == 1
    FIGURES["shared-cause-job-create-403"] = {"injected": refusals, "code": 403, "runs_held": 2, "runs_failed": 0,
                                              "runs_lost": 0, "first_job_after_fix_seconds": created_after,
                                              "final_phase": "Succeeded", "held_reason": first["reason"]}


# Pod Security admission's answer for the training operator's `init-pytorch` container (kubernetes
# staging/src/k8s.io/pod-security-admission/policy: each check's forbidden reason and detail)
PODSECURITY = ('violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false (container "init-pytorch" '
               'must set securityContext.allowPrivilegeEscalation=false), unrestricted capabilities (container '
               '"init-pytorch" must set securityContext.capabilities.drop=["ALL"]), runAsNonRoot != true (pod or '
               'container "init-pytorch" must set securityContext.runAsNonRoot=true)')
QUOTA_BUSY = ("exceeded quota: compute, requested: requests.cpu=1, used: requests.cpu=8, limited: requests.cpu=8")


def two_scales(name: str, **spec) -> dict:
    return benchmark(name, [{"name": "ddp"}], runPolicy={"startupSeconds": 600, "capacitySeconds": 600}, sweep={
        "strategies": [{"name": "ddp"}], "precisions": ["fp32", "bf16"],
        "scales": [{"nodes": 2, "devicesPerNode": 0, "processesPerNode": 1},
                   {"nodes": 1, "devicesPerNode": 0, "processesPerNode": 2}]}, **spec)


@pytest.mark.faults
def test_a_worker_pod_security_refuses_fails_its_run_within_seconds_in_its_words_and_holds_the_multi_node_runs(
        benchmarks, trainer):
    """The Master runs, the Worker is refused (the training operator's init container in a restricted
    namespace); before, the run waited for the 600 s start limit and said `1 of 2 pods created`."""
    name = "restricted"
    benchmarks.create(two_scales(name))
    first = wait_for(lambda: trainer.jobs(name), what="the first job")[0]
    trainer.create_pods(first, replicas=("Master",))
    worker = f"{first['metadata']['name']}-worker-0"
    started = time.monotonic()
    trainer.refuse_pod(first, worker, PODSECURITY)
    status = wait_for(lambda: (s := benchmarks.status(name)) and phases(s)[:1] == ["Failed"] and s, timeout=20,
                      what="the refused run failed")
    detected = seconds_since(started)
    assert detected < 10  # the start limit is 600 s
    reason = status["runs"][0]["reason"]
    assert reason.startswith(f'its pods were refused: pytorchjob-controller FailedCreatePod: Error creating: pods '
                             f'"{worker}" is forbidden: violates PodSecurity "restricted:latest": '), reason
    wait_for(lambda: not [j for j in trainer.jobs(name) if j["metadata"]["name"] == first["metadata"]["name"]],
             what="the refused run's job deleted")
    status = wait_for(lambda: (s := benchmarks.status(name)) and "Running" in phases(s) and s,
                      what="a single-node run started")
    assert phases(status) == ["Failed", "Pending", "Running", "Pending"]
    assert status["runs"][1]["reason"].startswith(f"held (admission): {status['runs'][0]['name']} failed for a cause "
                                                  "every PyTorchJob run on 2+ nodes shares (")
    assert status["runs"][3].get("reason") is None
    FIGURES["pod-security-refuses-worker"] = {"injected": 1, "detected_within_seconds": detected,
                                              "startup_limit_seconds": 600, "runs_held": 1, "runs_lost": 0,
                                              "reason": reason}
    benchmarks.delete(name)  # held for good: nothing fixes this test's namespace


@pytest.mark.faults
def test_a_quota_other_pods_use_up_is_quoted_as_a_wait_for_capacity_within_seconds(benchmarks, trainer):
    name = "quota-busy"
    benchmarks.create(benchmark(name, [{"name": "ddp"}], runPolicy={"startupSeconds": 600, "capacitySeconds": 600},
                                sweep={"strategies": [{"name": "ddp"}],
                                       "scales": [{"nodes": 2, "devicesPerNode": 0, "processesPerNode": 1}]}))
    job = wait_for(lambda: trainer.jobs(name), what="the job")[0]
    trainer.create_pods(job, replicas=("Master",))
    started = time.monotonic()
    trainer.refuse_pod(job, f"{job['metadata']['name']}-worker-0", QUOTA_BUSY)
    run = wait_for(lambda: "exceeded quota" in (r := run_entry(benchmarks.status(name), 0)).get("waiting", "") and r,
                   timeout=20, what="the quota quoted in waiting")
    assert (run["phase"], run["waitingKind"]) == ("Running", "capacity")
    assert "requested: requests.cpu=1, used: requests.cpu=8, limited: requests.cpu=8" in run["waiting"]
    FIGURES["quota-used-up-quoted"] = {"injected": 1, "quoted_within_seconds": seconds_since(started), "runs_lost": 0,
                                       "waiting": run["waiting"]}
    trainer.create_pods(job, replicas=("Worker",))  # the quota freed up: the controller's retry creates it
    trainer.start(job)
    trainer.succeed(job, 10.0)
    wait_for(lambda: benchmarks.status(name).get("phase") == "Succeeded", what="Succeeded")


def test_a_403_on_the_runs_network_policy_holds_every_run_until_the_role_allows_it(benchmarks, trainer):
    """A Role without `networkpolicies create` (spec.networkPolicy is on by default) refuses every run alike: held,
    no job without its policy, and the sweep goes on once the policy can be created."""
    name = "netpol-denied"
    REFUSING_POLICIES.set()
    benchmarks.create(benchmark(name, [{"name": "single"}, {"name": "ddp"}]))
    status = wait_for(lambda: (s := benchmarks.status(name)) and "RunsHeld" in conditions(s) and s,
                      what="the sweep held")
    assert phases(status) == ["Pending", "Pending"] and trainer.jobs(name) == []
    assert all(r["reason"].startswith("held (forbidden): ") and "every run shares" in r["reason"]
               and "refused NetworkPolicy" in r["reason"] for r in status["runs"])
    REFUSING_POLICIES.clear()
    done = set()
    while len(done) < 2:
        job = wait_for(lambda: next((j for j in trainer.jobs(name) if j["metadata"]["name"] not in done), None),
                       what="the next job")
        trainer.start(job)
        trainer.succeed(job, 30.0 + len(done))
        done.add(job["metadata"]["name"])
    status = wait_for(lambda: (s := benchmarks.status(name)).get("phase") == "Succeeded" and s, what="Succeeded")
    assert conditions(status)["RunsHeld"]["status"] == "False"


# kube-scheduler's FitError for a pod no node tolerates (AKS GPU pools' documented sku=gpu:NoSchedule taint)
TAINTED = ("0/3 nodes are available: 3 node(s) had untolerated taint {sku: gpu}. preemption: 0/3 nodes are available: "
           "3 Preemption is not helpful for scheduling.")


def test_a_taint_no_gpu_pod_tolerates_holds_the_gpu_runs_and_the_cpu_runs_go_on(benchmarks, trainer):
    name = "tainted"
    benchmarks.create(benchmark(name, [{"name": "ddp"}], runPolicy={"startupSeconds": 2}, sweep={
        "strategies": [{"name": "ddp"}], "precisions": ["fp32", "bf16"],
        "scales": [{"nodes": 1, "devicesPerNode": 1, "processesPerNode": 1},
                   {"nodes": 1, "devicesPerNode": 0, "processesPerNode": 2}]}))
    first = wait_for(lambda: trainer.jobs(name), what="the first job")[0]
    assert first["metadata"]["name"].endswith("-1x1g")
    (pod,) = trainer.create_pods(first)
    trainer.unschedulable(pod, TAINTED)
    status = wait_for(lambda: (s := benchmarks.status(name)) and phases(s)[:1] == ["Failed"]
                      and "Running" in phases(s) and s, timeout=20, what="the GPU run failed at its start limit")
    assert status["runs"][0]["reason"].startswith("not started within runPolicy.startupSeconds (2 s): ")
    assert phases(status) == ["Failed", "Pending", "Running", "Pending"]
    assert status["runs"][1]["reason"].startswith(f"held (taint): {status['runs'][0]['name']} failed for a cause every "
                                                  "GPU run shares (")
    assert status["runs"][3].get("reason") is None  # a CPU run: not on the tainted GPU nodes
    benchmarks.delete(name)
