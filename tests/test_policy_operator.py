"""The per-run NetworkPolicy on a cluster: the real kopf operator (KopfRunner) against the emulated API.

The operator creates each run's policy before its job, both owned by the GPT2Benchmark, so the garbage
collector deletes them with it; `spec.networkPolicy.enabled: false` creates none; a policy the API server
refuses fails its run (no job runs without its policy) and the sweep goes on. The RBAC those calls need is
checked against manifests/operator.yaml by test_operator_kopf.py's replay (its module covers every call).
"""

from __future__ import annotations

import json

import kubernetes
import pytest
from kube.fixtures import benchmark, operator_calls, wait_for

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def networking(client):
    return kubernetes.client.NetworkingV1Api(client)


def policies(networking, name: str) -> list[dict]:
    listed = networking.list_namespaced_network_policy("default", _preload_content=False)
    return [p for p in json.loads(listed.data)["items"] if p["metadata"]["labels"]["gpt2bench.io/benchmark"] == name]


def test_each_run_gets_its_policy_before_its_job_owned_by_the_benchmark_and_collected_with_it(
        cluster, benchmarks, trainer, networking):
    benchmarks.create(benchmark("fenced", [{"name": "ddp"}]))
    job = wait_for(lambda: trainer.jobs("fenced"), what="the first job")[0]
    (policy,) = policies(networking, "fenced")
    assert policy["metadata"]["name"] == job["metadata"]["name"]
    # created first: the job's pods never run unfenced
    assert int(policy["metadata"]["resourceVersion"]) < int(job["metadata"]["resourceVersion"])
    uid = benchmarks.get("fenced")["metadata"]["uid"]
    assert [(r["kind"], r["uid"], r["controller"]) for r in policy["metadata"]["ownerReferences"]] == \
        [("GPT2Benchmark", uid, True)]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    pod_labels = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()  # it selects the run's pods
    assert policy["spec"]["ingress"][0] == {"from": [{"podSelector": {"matchLabels": selector}}]}
    assert ("networking.k8s.io", "networkpolicies", "create") in operator_calls(cluster)
    cluster.kubectl("delete", "gpt2benchmark", "fenced", "--wait=false")
    wait_for(lambda: not benchmarks.exists("fenced"), what="the benchmark to be deleted")
    wait_for(lambda: policies(networking, "fenced") == [] and trainer.jobs("fenced") == [],
             what="its policy and job to be collected")


def test_a_spec_without_policies_creates_none(benchmarks, trainer, networking):
    benchmarks.create(benchmark("open", [{"name": "single"}], networkPolicy={"enabled": False}))
    wait_for(lambda: trainer.jobs("open"), what="the job")
    assert policies(networking, "open") == []


def test_a_foreign_namesake_policy_fails_the_run_and_creates_no_job(benchmarks, trainer, networking):
    # the run's policy name is taken by an object the benchmark does not own: its pods would go unfenced
    name = "squat-single-fp32-1x1"
    networking.create_namespaced_network_policy("default", {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": name, "labels": {"gpt2bench.io/benchmark": "someone-else"}},
        "spec": {"podSelector": {}}})
    benchmarks.create(benchmark("squat", [{"name": "single"}]))
    status = wait_for(lambda: (s := benchmarks.status("squat")).get("phase") == "Failed" and s, what="Failed")
    assert "NetworkPolicy" in status["runs"][0]["reason"] and name in status["runs"][0]["reason"]
    assert trainer.jobs("squat") == []
