"""Small wrappers over the `kubernetes` client: the few calls the operator makes.

kopf watches and patches the GPT2Benchmarks; these functions create and read their children.
"""

from __future__ import annotations

import json
import os
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

from gpt2bench import __version__
from gpt2bench.protocol import BENCHMARK_LABEL, MPIJOB_API, PYTORCHJOB_API
from gpt2bench.render import label_value
from gpt2bench.spec import API_GROUP, API_VERSION, PLURAL

JOB_NAME_LABEL = "training.kubeflow.org/job-name"
JOB_ROLE_LABEL = "training.kubeflow.org/job-role"
# Which pod holds the results: the training operator labels the PyTorchJob master `job-role=master`;
# mpi-operator sets no replica-type label on the launcher, only `job-role=launcher`.
RESULT_ROLE = {"PyTorchJob": "master", "MPIJob": "launcher"}
JOB_RESOURCES = {  # kind -> (group, version, plural)
    "PyTorchJob": (*PYTORCHJOB_API.split("/"), "pytorchjobs"),
    "MPIJob": (*MPIJOB_API.split("/"), "mpijobs"),
}

_client: kubernetes.client.ApiClient | None = None


def configure(pool_size: int = 16) -> None:
    """In-cluster credentials when running in a pod, else $KUBECONFIG (read now) or ~/.kube/config.

    One ApiClient for the process: its connection pool is shared by the handler threads (a client per
    call would open a TCP connection per request)."""
    global _client
    config = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=config)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None,
                                           client_configuration=config)
    config.connection_pool_maxsize = pool_size
    _client = kubernetes.client.ApiClient(config)
    _client.user_agent = f"gpt2bench-operator/{__version__}"  # tells our calls apart in API audit logs


def _api() -> kubernetes.client.ApiClient:
    if _client is None:
        configure()
    return _client


def _custom() -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(_api())


class JobKindMissing(Exception):
    """The API server does not serve PyTorchJob/MPIJob: the Kubeflow operator is not installed (yet)."""


def _missing(kind: str) -> JobKindMissing:
    group, version, plural = JOB_RESOURCES[kind]
    operator = "the Kubeflow training operator" if kind == "PyTorchJob" else "the Kubeflow MPI operator (v2)"
    return JobKindMissing(f"{kind} ({plural}.{group}/{version}) is not served by this cluster: install {operator}")


def create_job(job: dict[str, Any]) -> bool:
    """Create a rendered job. False when it already exists (409): the name is the run's, so it is ours."""
    group, version, plural = JOB_RESOURCES[job["kind"]]
    try:
        _custom().create_namespaced_custom_object(group, version, job["metadata"]["namespace"], plural, job)
    except ApiException as exc:
        if exc.status == 409:
            return False
        if exc.status == 404:
            raise _missing(job["kind"]) from None
        raise
    return True


def list_jobs(namespace: str, benchmark: str, kinds: set[str]) -> dict[str, dict[str, Any]]:
    """The jobs of a benchmark by name (label selector), across the job kinds its runs use."""
    jobs: dict[str, dict[str, Any]] = {}
    for kind in sorted(kinds):
        group, version, plural = JOB_RESOURCES[kind]
        try:
            listed = _custom().list_namespaced_custom_object(
                group, version, namespace, plural, label_selector=f"{BENCHMARK_LABEL}={label_value(benchmark)}"
            )
        except ApiException as exc:
            if exc.status == 404:
                raise _missing(kind) from None
            raise
        jobs.update({item["metadata"]["name"]: item for item in listed.get("items", [])})
    return jobs


def get_benchmark(namespace: str, name: str) -> dict[str, Any] | None:
    """The GPT2Benchmark as stored now (a timer's body can trail the last status patch)."""
    try:
        return _custom().get_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def result_pod(namespace: str, job_kind: str, job_name: str) -> dict[str, Any] | None:
    """The job's master (PyTorchJob) or launcher (MPIJob) pod, by the labels the Kubeflow operators set."""
    selector = f"{JOB_NAME_LABEL}={job_name},{JOB_ROLE_LABEL}={RESULT_ROLE[job_kind]}"
    response = kubernetes.client.CoreV1Api(_api()).list_namespaced_pod(
        namespace, label_selector=selector, _preload_content=False
    )
    pods = json.loads(response.data).get("items", [])
    # several after restarts: the newest one holds the last attempt's message
    pods.sort(key=lambda p: p.get("metadata", {}).get("creationTimestamp") or "")
    return pods[-1] if pods else None


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


def termination_reason(pod: dict[str, Any] | None) -> str | None:
    """`OOMKilled`, `Error (exit code 1)`...: the why when there is no message."""
    for status in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated") or {}
        if terminated:
            return f"{terminated.get('reason') or 'terminated'} (exit code {terminated.get('exitCode')})"
    return None
