"""The test plays the Kubeflow training operator / mpi-operator (and Kueue), through the real `kubernetes`
client, as upstream behaves (/work/notes/upstream-controllers.md §8-§10):

- job `status.conditions` with upstream's types, reasons and messages (`<Kind><Reason>`): Created, Running,
  Succeeded/Failed (which flip Running to False), Suspended/Resumed; mpi-operator adds Running=False when
  it suspends. Each condition carries `lastUpdateTime` and `lastTransitionTime` (not metav1.Condition);
- the result pod — labelled `training.kubeflow.org/job-name` and `job-role` (`master` for PyTorchJob,
  `launcher` for MPIJob; mpi-operator sets no replica-type on the launcher) — whose container terminates
  with a message, and whose log (served by the emulator) ends with what the trainer printed;
- Kueue: a mutating webhook that suspends a job carrying the queue label (`spec.runPolicy.suspend: true`),
  and the admission that unsuspends it.
"""

from __future__ import annotations

import datetime
import json
from typing import Any

import kubernetes

from .kubelet import Kubelet

GROUPS = {"PyTorchJob": ("kubeflow.org", "v1", "pytorchjobs"), "MPIJob": ("kubeflow.org", "v2beta1", "mpijobs")}
ROLES = {"PyTorchJob": ("master", "Master", "pytorch"), "MPIJob": ("launcher", "Launcher", "launcher")}
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


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


def messages(job: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Condition type -> (reason, message) as the job's upstream controller words them."""
    name, ns, kind = job["metadata"]["name"], job["metadata"]["namespace"], job["kind"]
    if kind == "PyTorchJob":  # training-operator pkg/util/status.go, pytorchjob_controller.go (with a Master)
        return {
            "Created": ("PyTorchJobCreated", f"PyTorchJob {name} is created."),
            "Running": ("PyTorchJobRunning", f"PyTorchJob {name} is running."),
            "Succeeded": ("PyTorchJobSucceeded", f"PyTorchJob {name} is successfully completed."),
            "Failed": ("PyTorchJobFailed", f"PyTorchJob {name} is failed because 1 Master replica(s) failed."),
            "Suspended": ("PyTorchJobSuspended", f"PyTorchJob {name} is suspended."),
            "Resumed": ("PyTorchJobResumed", f"PyTorchJob {name} is resumed."),
        }
    return {  # mpi-operator pkg/controller/mpi_job_controller_status.go
        "Created": ("MPIJobCreated", f"MPIJob {ns}/{name} is created."),
        "Running": ("MPIJobRunning", f"MPIJob {ns}/{name} is running."),
        "Succeeded": ("MPIJobSucceeded", f"MPIJob {ns}/{name} successfully completed."),
        "Failed": ("MPIJobFailed", f"MPIJob {ns}/{name} has failed"),
        "Suspended": ("MPIJobSuspended", "MPIJob suspended"),
        "Resumed": ("MPIJobResumed", "MPIJob resumed"),
        "RunningSuspended": ("MPIJobSuspended", f"MPIJob {ns}/{name} is suspended."),
    }


def set_condition(conditions: list[dict[str, Any]], type_: str, status: str, reason: str, message: str,
                  ) -> list[dict[str, Any]]:
    """Upstream's setCondition: replace the same type (transition time kept when the status holds);
    Running and Restarting replace each other; Succeeded/Failed turn Running False."""
    now = _now()
    new = {"type": type_, "status": status, "reason": reason, "message": message, "lastUpdateTime": now,
           "lastTransitionTime": now}
    result = []
    for old in conditions:
        if old["type"] == type_ and old["status"] == status:
            new["lastTransitionTime"] = old.get("lastTransitionTime", now)
        if old["type"] == type_ or (type_ in ("Running", "Restarting") and old["type"] in ("Running", "Restarting")):
            continue
        if type_ in ("Succeeded", "Failed") and status == "True" and old["type"] == "Running":
            old = {**old, "status": "False", "lastUpdateTime": now, "lastTransitionTime": now}
        result.append(old)
    return result + [new]


def kueue_webhook(resource: Any, obj: dict[str, Any]) -> None:
    """Kueue's mutating webhook for Kubeflow jobs (kueue pkg/controller/jobs/kubeflow/.../kubeflowjob_controller.go,
    mpijob_controller.go): a job with a queue label is created suspended, until its workload is admitted."""
    if obj.get("kind") in GROUPS and KUEUE_QUEUE_LABEL in ((obj.get("metadata") or {}).get("labels") or {}):
        obj.setdefault("spec", {}).setdefault("runPolicy", {})["suspend"] = True


class TrainingOperator(Kubelet):
    """The training operator and mpi-operator; the scheduler and the kubelet on their pods (Kubelet)."""

    def __init__(self, api_client: kubernetes.client.ApiClient, namespace: str = "default", cluster: Any = None):
        self.custom = kubernetes.client.CustomObjectsApi(api_client)
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.namespace = namespace
        self.cluster = cluster  # the EmulatedCluster, to say what containers printed (their logs)

    def jobs(self, benchmark: str | None = None) -> list[dict[str, Any]]:
        selector = f"gpt2bench.io/benchmark={benchmark}" if benchmark else None
        items: list[dict[str, Any]] = []
        for group, version, plural in GROUPS.values():
            try:
                listed = self.custom.list_namespaced_custom_object(group, version, self.namespace, plural,
                                                                   label_selector=selector)
            except kubernetes.client.ApiException as exc:
                if exc.status == 404:  # the kind is not served here
                    continue
                raise
            items += listed["items"]
        return sorted(items, key=lambda j: j["metadata"]["creationTimestamp"] + j["metadata"]["resourceVersion"])

    def get(self, job: dict[str, Any]) -> dict[str, Any]:
        group, version, plural = GROUPS[job["kind"]]
        return self.custom.get_namespaced_custom_object(group, version, self.namespace, plural,
                                                        job["metadata"]["name"])

    def _condition(self, job: dict[str, Any], *changes: tuple[str, str, str]) -> None:
        """Apply (type, status, wording key) changes as the controller does, then write status."""
        current = self.get(job)
        conditions = list((current.get("status") or {}).get("conditions") or [])
        words = messages(current)
        for type_, status, key in changes:
            reason, message = words[key]
            conditions = set_condition(conditions, type_, status, reason, message)
        group, version, plural = GROUPS[job["kind"]]
        self.custom.patch_namespaced_custom_object_status(
            group, version, self.namespace, plural, job["metadata"]["name"], {"status": {"conditions": conditions}}
        )

    def start(self, job: dict[str, Any]) -> None:
        """Created → Running, as the operators report it once the pods run."""
        self._condition(job, ("Created", "True", "Created"), ("Running", "True", "Running"))

    def suspend(self, job: dict[str, Any]) -> None:
        """The controller sees runPolicy.suspend: Suspended=True (mpi-operator also Running=False, even if it
        never ran; the training operator only when it was running)."""
        current = self.get(job)
        assert (current["spec"].get("runPolicy") or {}).get("suspend") is True, "only a suspended job is"
        changes = [("Created", "True", "Created"), ("Suspended", "True", "Suspended")]
        was_running = any(c["type"] == "Running" and c["status"] == "True"
                          for c in (current.get("status") or {}).get("conditions") or [])
        if job["kind"] == "MPIJob":
            changes.append(("Running", "False", "RunningSuspended"))
        elif was_running:
            changes.append(("Running", "False", "Suspended"))
        self._condition(job, *changes)

    def admit(self, job: dict[str, Any]) -> None:
        """Kueue admits the workload (runPolicy.suspend → false); the controller says Resumed, then Running."""
        group, version, plural = GROUPS[job["kind"]]
        self.custom.patch_namespaced_custom_object(group, version, self.namespace, plural, job["metadata"]["name"],
                                                   {"spec": {"runPolicy": {"suspend": False}}})
        self._condition(job, ("Suspended", "False", "Resumed"), ("Running", "True", "Running"))

    def finish(self, job: dict[str, Any], *, succeeded: bool, message: str | None,
               condition_message: str | None = None, exit_code: int | None = None, log: str = "") -> None:
        """The result pod terminates with `message` (its log: `log`), then the job gets its terminal condition
        (worded as upstream does, unless `condition_message` says otherwise; "" means none)."""
        self._result_pod(job, message, exit_code if exit_code is not None else (0 if succeeded else 1), log)
        final = "Succeeded" if succeeded else "Failed"
        if condition_message is None:
            self._condition(job, ("Created", "True", "Created"), (final, "True", final))
            return
        current = self.get(job)
        conditions = set_condition(list((current.get("status") or {}).get("conditions") or []), final, "True",
                                   messages(current)[final][0], condition_message)
        group, version, plural = GROUPS[job["kind"]]
        self.custom.patch_namespaced_custom_object_status(
            group, version, self.namespace, plural, job["metadata"]["name"], {"status": {"conditions": conditions}})

    def succeed(self, job: dict[str, Any], tokens_per_second: float, log: str = "") -> None:
        summary = trainer_summary(job["metadata"]["name"], tokens_per_second)
        self.finish(job, succeeded=True, message=json.dumps(summary), log=log)

    def _result_pod(self, job: dict[str, Any], message: str | None, exit_code: int, log: str) -> None:
        name = job["metadata"]["name"]
        role, replica, container = ROLES[job["kind"]]
        labels = {"training.kubeflow.org/job-name": name, "training.kubeflow.org/job-role": role,
                  "training.kubeflow.org/operator-name": "pytorchjob-controller" if role == "master" else "mpi-operator"}
        if role == "master":  # mpi-operator sets no replica-type label on the launcher
            labels["training.kubeflow.org/replica-type"] = replica.lower()
        pod_name = f"{name}-{role}-0"
        try:
            self.core.create_namespaced_pod(self.namespace, {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod_name, "labels": labels, "ownerReferences": [{
                    "apiVersion": job["apiVersion"], "kind": job["kind"], "name": name,
                    "uid": job["metadata"]["uid"], "controller": True}]},
                "spec": {"containers": [{"name": container, "image": "gpt2bench"}]},
            })  # fmt: skip
        except kubernetes.client.ApiException as exc:
            if exc.status != 409:  # created already (create_pods): it terminates now
                raise
        if log and self.cluster is not None:
            key = (self.namespace, pod_name, container)
            self.cluster.call(lambda emulator: emulator.pod_logs.__setitem__(key, log))
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

    # --- every pod of a job, as the controller, the scheduler and the kubelet play them ------------

    def create_pods(self, job: dict[str, Any], replicas: tuple[str, ...] = ("Master", "Launcher", "Worker")
                    ) -> list[str]:
        """The controller's pods of every replica (training-operator common/pod.go: `<job>-<type>-<index>`,
        labelled with the job name, role, replica type and index), Pending and not yet scheduled. Their names,
        result pod first. `replicas`: only those replica types' (the others refused: `refuse_pod`)."""
        name, kind = job["metadata"]["name"], job["kind"]
        specs = job["spec"]["pytorchReplicaSpecs" if kind == "PyTorchJob" else "mpiReplicaSpecs"]
        names = []
        for replica in replicas:
            for index in range(int((specs.get(replica) or {}).get("replicas", 0))):
                role = "worker" if replica == "Worker" else ROLES[kind][0]
                labels = {"training.kubeflow.org/job-name": name, "training.kubeflow.org/job-role": role,
                          "training.kubeflow.org/replica-type": replica.lower(),
                          "training.kubeflow.org/replica-index": str(index)}
                container = specs[replica]["template"]["spec"]["containers"][0]
                pod = f"{name}-{replica.lower()}-{index}"
                # the replica's restartPolicy on its pods (training-operator common/pod.go setRestartPolicy)
                spec = {"restartPolicy": specs[replica].get("restartPolicy", "Never"), "containers": [
                    {key: container[key] for key in ("name", "image", "command", "args") if key in container}]}
                self.core.create_namespaced_pod(self.namespace, {
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": pod, "labels": labels, "ownerReferences": [{
                        "apiVersion": job["apiVersion"], "kind": kind, "name": name, "uid": job["metadata"]["uid"],
                        "controller": True}]},
                    "spec": spec, "status": {"phase": "Pending"}})  # fmt: skip
                names.append(pod)
        return names

    def refuse_pod(self, job: dict[str, Any], pod: str, answer: str) -> None:
        """The API server refused a pod the controller created (an admission: Pod Security, a LimitRange, a quota):
        the controller's Warning Event on the job, as training-operator's pod control words it
        (common/pod_control.go: `FailedCreatePod`, "Error creating: <the API server's answer>")."""
        stamp = _now()
        self.core.create_namespaced_event(self.namespace, {
            "metadata": {"generateName": f"{job['metadata']['name']}."}, "type": "Warning",
            "reason": "FailedCreatePod", "message": f'Error creating: pods "{pod}" is forbidden: {answer}',
            "involvedObject": {"apiVersion": job["apiVersion"], "kind": job["kind"], "name": job["metadata"]["name"],
                               "namespace": self.namespace, "uid": job["metadata"]["uid"]},
            "source": {"component": "pytorchjob-controller"}, "firstTimestamp": stamp, "lastTimestamp": stamp,
            "count": 1})  # fmt: skip

    def fail(self, job: dict[str, Any], replica_type: str = "Master") -> None:
        """The job's controller gives up (backoffLimit reached): Failed, worded as upstream with the replica type
        that failed (`... is failed because 1 Worker replica(s) failed.`)."""
        name = job["metadata"]["name"]
        current = self.get(job)
        reason, message = messages(current)["Failed"]
        message = message.replace("Master", replica_type)
        conditions = set_condition(list((current.get("status") or {}).get("conditions") or []), "Failed", "True",
                                   reason, message)
        group, version, plural = GROUPS[job["kind"]]
        self.custom.patch_namespaced_custom_object_status(group, version, self.namespace, plural, name,
                                                          {"status": {"conditions": conditions}})

    # --- faults (tests/test_faults.py) -----------------------------------------------------------

    def past_deadline(self, job: dict[str, Any]) -> bool:
        """Upstream's pastActiveDeadline: runPolicy.activeDeadlineSeconds (a TrainJob's spec's) counted
        from the job's start (here: its creation, when the controller first saw it)."""
        current = self.get(job)
        spec = current.get("spec") or {}
        deadline = spec.get("activeDeadlineSeconds", (spec.get("runPolicy") or {}).get("activeDeadlineSeconds"))
        created = datetime.datetime.strptime(current["metadata"]["creationTimestamp"], "%Y-%m-%dT%H:%M:%SZ")
        started = created.replace(tzinfo=datetime.UTC)
        return deadline is not None and datetime.datetime.now(datetime.UTC) - started > datetime.timedelta(
            seconds=deadline)

    def exceed_deadline(self, job: dict[str, Any]) -> None:
        """The job ran past its deadline: Failed, worded as the training operator's common job controller
        (`Job <name> has failed because it was active longer than specified deadline`; mpi-operator's
        reason is DeadlineExceeded). Its still running pods are deleted (cleanPodPolicy Running)."""
        name = job["metadata"]["name"]
        reason = "DeadlineExceeded" if job["kind"] == "MPIJob" else messages(job)["Failed"][0]
        current = self.get(job)
        conditions = set_condition(list((current.get("status") or {}).get("conditions") or []), "Failed", "True",
                                   reason, f"Job {name} has failed because it was active longer than specified "
                                           f"deadline")
        group, version, plural = GROUPS[job["kind"]]
        self.custom.patch_namespaced_custom_object_status(group, version, self.namespace, plural, name,
                                                          {"status": {"conditions": conditions}})

    def running_pod(self, job: dict[str, Any], node: str = "node-1") -> dict[str, Any]:
        """The job's master/launcher pod, running on `node` (no termination yet)."""
        name = job["metadata"]["name"]
        role, replica, container = ROLES[job["kind"]]
        labels = {"training.kubeflow.org/job-name": name, "training.kubeflow.org/job-role": role}
        if role == "master":
            labels["training.kubeflow.org/replica-type"] = replica.lower()
        pod = self.core.create_namespaced_pod(self.namespace, {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{name}-{role}-0", "labels": labels, "ownerReferences": [{
                "apiVersion": job["apiVersion"], "kind": job["kind"], "name": name,
                "uid": job["metadata"]["uid"], "controller": True}]},
            "spec": {"nodeName": node, "containers": [{"name": container, "image": "gpt2bench"}]},
        })  # fmt: skip
        self.core.patch_namespaced_pod_status(pod.metadata.name, self.namespace, {"status": {
            "phase": "Running", "containerStatuses": [{"name": container, "ready": True, "restartCount": 0,
                                                       "image": "gpt2bench", "imageID": "",
                                                       "state": {"running": {"startedAt": _now()}}}]}})
        return {"name": pod.metadata.name, "container": container}

    def evict(self, job: dict[str, Any], message: str) -> None:
        """The kubelet evicts the running pod (node pressure): phase Failed, reason Evicted, the container
        killed; the job controller then fails the job (backoffLimit 0) with its usual words."""
        pod = self.running_pod(job)
        self.core.patch_namespaced_pod_status(pod["name"], self.namespace, {"status": {
            "phase": "Failed", "reason": "Evicted", "message": message,
            "containerStatuses": [{"name": pod["container"], "ready": False, "restartCount": 0, "image": "gpt2bench",
                                   "imageID": "", "state": {"terminated": {
                                       "exitCode": 137, "reason": "Error", "startedAt": _now(),
                                       "finishedAt": _now()}}}]}})  # fmt: skip
        self._condition(job, ("Created", "True", "Created"), ("Failed", "True", "Failed"))

    def lose_node(self, job: dict[str, Any]) -> str:
        """The pod's node is gone: the node lifecycle controller marks the pod not Ready (MarkPodsNotReady), the
        taint manager, once the pod's toleration of the NoExecute taint is over, marks it DisruptionTarget
        (`DeletionByTaintManager`: `Taint manager: deleting due to NoExecute taint`) and deletes it; no kubelet
        confirms that its containers stopped, so it stays Terminating (held here by a finalizer, as the
        missing kubelet holds it). Returns the pod's name."""
        pod = self.running_pod(job, node="node-gone")
        self.core.patch_namespaced_pod_status(pod["name"], self.namespace, {"status": {"conditions": [
            {"type": "Ready", "status": "False", "lastTransitionTime": _now()},
            {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
             "message": "Taint manager: deleting due to NoExecute taint", "lastTransitionTime": _now()}]}})
        self.core.patch_namespaced_pod(pod["name"], self.namespace,
                                       {"metadata": {"finalizers": ["test.gpt2bench.io/kubelet-gone"]}})
        self.core.delete_namespaced_pod(pod["name"], self.namespace)
        return pod["name"]
