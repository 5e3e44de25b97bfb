"""A TrainJob's refused pods are read where the Job controller records them: on its JobSet's Jobs.

Trainer v2 makes a JobSet named after the TrainJob, JobSet one batch/v1 Job per replicated job (labelled
`jobset.sigs.k8s.io/jobset-name`), and the Job controller creates the pods; when the API server refuses one, the Job
controller's `FailedCreate` Event is on that Job, not on the TrainJob. `pods.pod_events` of a TrainJob adds its Jobs'
Events, chosen by that label (`pods.trainjob_jobs`). Here on data, then against the emulated API with the test
playing Trainer v2, JobSet, the Job controller (tests/kube/trainer_v2.py) and Pod Security (tests/kube/admission.py).
"""

from __future__ import annotations

import re

import kubernetes
import pytest
import yaml
from kube import EmulatedCluster
from kube.admission import restricted_volumes
from kube.fixtures import api_client, install_trainer_v2
from kube.trainer_v2 import TrainerV2

from gpt2bench.controller import kube, pods
from gpt2bench.diagnosis import startup
from gpt2bench.plan import plan_runs
from gpt2bench.render import dump_jobs, render_job
from gpt2bench.render.runtimes import project_runtimes
from gpt2bench.specification.validation import load_benchmark

JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
HOST_PATH = {"name": "datasets", "mountPath": "/datasets", "hostPath": {"path": "/mnt/datasets"}}


def job(name: str, jobset: str, created: str) -> dict:
    return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "creationTimestamp": created,
                         "labels": {JOBSET_NAME: jobset}}}


def test_a_trainjobs_jobs_are_its_jobsets_not_a_namesakes_prefix_or_an_earlier_namesake():
    trainjob = {"kind": "TrainJob", "metadata": {"name": "tj", "creationTimestamp": "2026-11-29T04:00:00Z"}}
    ours = [job("tj-node-0", "tj", "2026-11-29T04:00:01Z"), job("tj-launcher-0", "tj", "2026-11-29T04:00:09Z")]
    other = job("tj-node-node-0", "tj-node", "2026-11-29T04:00:02Z")  # TrainJob `tj-node`'s: its name starts with ours
    earlier = job("tj-node-0", "tj", "2026-11-29T03:59:58Z")  # a deleted namesake's, not yet garbage-collected
    assert pods.trainjob_jobs(trainjob, [*ours, other, earlier]) == ours


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Trainer v2 and JobSet, the project's runtimes, and Pod Security's restricted volume check on pods."""
    with EmulatedCluster(tmp_path_factory.mktemp("trainjob-refused")) as emulated:
        install_trainer_v2(emulated)
        emulated.kubectl("create", "-f", "-", input=dump_jobs(list(project_runtimes().values())))
        emulated.call(lambda e: e.faults.append(restricted_volumes))
        yield emulated


@pytest.fixture
def operator_client(cluster, monkeypatch):
    """The operator's `kube` module, configured as the operator configures it, against this cluster (and as it
    was again afterwards)."""
    monkeypatch.setattr(kube, "_client", None)
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    kube.configure()


def trainjob(cluster, client, name: str, **pods) -> dict:
    """A 2-node ddp TrainJob as the operator renders it (named `name`), built by the emulated Trainer and JobSet."""
    spec = {"model": {"preset": "tiny"}, "training": {"steps": 4, "warmupSteps": 1, "seqLen": 32}, "backend": "trainjob",
            "sweep": {"strategies": [{"name": "ddp"}], "scales": [{"nodes": 2, "processesPerNode": 1}]},
            **({"pods": pods} if pods else {})}
    bench = load_benchmark({"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark",
                            "metadata": {"name": "refused", "namespace": "default"}, "spec": spec})
    rendered = render_job(bench, plan_runs(bench)[0])
    rendered["metadata"]["name"] = name
    cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(rendered))
    trainer = TrainerV2(client)
    trainer.reconcile(name)
    return {**trainer.trainjob(name), "kind": "TrainJob"}


def job_events(client, job_name: str) -> list[dict]:
    return [e.to_dict() for e in kubernetes.client.CoreV1Api(client).list_namespaced_event(
        "default", field_selector=f"involvedObject.name={job_name}").items]


def test_a_trainjobs_events_hold_its_jobs_failedcreate_and_not_another_trainjobs(cluster, operator_client):
    client = api_client(cluster)
    clean = trainjob(cluster, client, "psa")
    refused = trainjob(cluster, client, "psa-node", volumes=[HOST_PATH])  # its Jobs' names start with `psa-node-`
    (failed_create,) = job_events(client, "psa-node-node-0")
    assert (failed_create["type"], failed_create["reason"], failed_create["source"]["component"]) == (
        "Warning", "FailedCreate", "job-controller")
    assert failed_create["involved_object"]["kind"] == "Job"
    assert re.fullmatch(r'Error creating: pods "psa-node-node-0-\d-\w{5}" is forbidden: violates PodSecurity '
                        r'"restricted:latest": restricted volume types \(volume "datasets" uses restricted volume '
                        r'type "hostPath"\)', failed_create["message"]), failed_create["message"]
    wait = startup.refused_creation(pods.pod_events(refused))
    assert wait == startup.StartWait(startup.START, f"job-controller FailedCreate: {failed_create['message']}")
    assert startup.refused_creation(pods.pod_events(clean)) is None, "psa-node's Job is not psa's"
    assert len(TrainerV2(client).pod_names("psa")) == 2 and TrainerV2(client).pod_names("psa-node") == []
