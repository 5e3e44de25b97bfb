"""The test plays the Kubeflow training operator / mpi-operator, through the real `kubernetes` client.

What they do that the gpt2bench operator depends on: job `status.conditions` (Created, Running,
Succeeded/Failed) and the result pod — labelled `training.kubeflow.org/job-name` and `job-role`
(`master` for PyTorchJob, `launcher` for MPIJob) — whose container terminates with a message.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import kubernetes

GROUPS = {"PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs"), "MPIJob": ("kubeflow.org", "v2beta1", "mpijobs")}
ROLES = {"PyTorchJob": ("master", "Master", "pytorch"), "MPIJob": ("launcher", "Launcher", "launcher")}


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def trainer_summary(run: str, tokens_per_second: float, **extra: Any) -> dict[str, Any]:
    """A compact summary as the trainer writes it to the termination-message file."""
    return {
        "status": "ok", "run": run, "worldSize": 2, "tokensPerSecond": tokens_per_second,
        "tokensPerSecondPerDevice": tokens_per_second / 2, "stepTimeP50Seconds": 0.21, "stepTimeP95Seconds": 0.25,
        "peakMemoryBytes": 512 * 2**20, "trainSeconds": 9.5, "startupSeconds": 3.0, "finalLoss": 7.25,
        "gradNorm": 1.5, "mfu": 0.01, **extra,
    }  # fmt: skip


class TrainingOperator:
    def __init__(self, api_client: kubernetes.client.ApiClient, namespace: str = "default"):
        self.custom = kubernetes.client.CustomObjectsApi(api_client)
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.namespace = namespace

    def jobs(self, benchmark: str | None = None) -> list[dict[str, Any]]:
        selector = f"gpt2bench.io/benchmark={benchmark}" if benchmark else None
        items: list[dict[str, Any]] = []
        for group, version, plural in GROUPS.values():
            listed = self.custom.list_namespaced_custom_object(group, version, self.namespace, plural,
                                                               label_selector=selector)
            items += listed["items"]
        return sorted(items, key=lambda j: j["metadata"]["creationTimestamp"] + j["metadata"]["resourceVersion"])

    def _set_conditions(self, job: dict[str, Any], conditions: list[dict[str, Any]]) -> None:
        group, version, plural = GROUPS[job["kind"]]
        self.custom.patch_namespaced_custom_object_status(
            group, version, self.namespace, plural, job["metadata"]["name"], {"status": {"conditions": conditions}}
        )

    def start(self, job: dict[str, Any]) -> None:
        """Created → Running, as the operators report it once the pods run."""
        t = _now()
        self._set_conditions(job, [
            {"type": "Created", "status": "True", "reason": "JobCreated", "lastTransitionTime": t},
            {"type": "Running", "status": "True", "reason": "JobRunning", "lastTransitionTime": t},
        ])  # fmt: skip

    def finish(self, job: dict[str, Any], *, succeeded: bool, message: str | None,
               condition_message: str = "", exit_code: int | None = None) -> None:
        """The result pod terminates with `message`, then the job gets its terminal condition."""
        self._result_pod(job, message, exit_code if exit_code is not None else (0 if succeeded else 1))
        t = _now()
        final = "Succeeded" if succeeded else "Failed"
        self._set_conditions(job, [
            {"type": "Created", "status": "True", "reason": "JobCreated", "lastTransitionTime": t},
            {"type": "Running", "status": "False", "reason": "JobRunning", "lastTransitionTime": t},
            {"type": final, "status": "True", "reason": f"Job{final}", "message": condition_message,
             "lastTransitionTime": t},
        ])  # fmt: skip

    def succeed(self, job: dict[str, Any], tokens_per_second: float) -> None:
        summary = trainer_summary(job["metadata"]["name"], tokens_per_second)
        self.finish(job, succeeded=True, message=json.dumps(summary))

    def _result_pod(self, job: dict[str, Any], message: str | None, exit_code: int) -> None:
        name = job["metadata"]["name"]
        role, replica, container = ROLES[job["kind"]]
        labels = {"training.kubeflow.org/job-name": name, "training.kubeflow.org/job-role": role,
                  "training.kubeflow.org/operator-name": "pytorchjob-controller" if role == "master" else "mpi-operator"}
        if role == "master":  # mpi-operator sets no replica-type label on the launcher
            labels["training.kubeflow.org/replica-type"] = replica.lower()
        pod_name = f"{name}-{role}-0"
        self.core.create_namespaced_pod(self.namespace, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod_name, "labels": labels, "ownerReferences": [{
                "apiVersion": job["apiVersion"], "kind": job["kind"], "name": name,
                "uid": job["metadata"]["uid"], "controller": True}]},
            "spec": {"containers": [{"name": container, "image": "gpt2bench"}]},
        })  # fmt: skip
        reason = {0: "Completed", 137: "OOMKilled"}.get(exit_code, "Error")
        terminated = {"exitCode": exit_code, "reason": reason,
                      "startedAt": _now(), "finishedAt": _now()}
        if message is not None:
            terminated["message"] = message
        self.core.patch_namespaced_pod_status(pod_name, self.namespace, {"status": {
            "phase": "Succeeded" if exit_code == 0 else "Failed",
            "containerStatuses": [{"name": container, "ready": False, "restartCount": 0, "image": "gpt2bench",
                                   "imageID": "", "state": {"terminated": terminated}}],
        }})  # fmt: skip
