"""The test plays the scheduler and the kubelet on a job's pods, whichever controller created them (the
training operator: tests/kube/training.py; the Job controller under JobSet: tests/kube/trainer_v2.py), in
upstream's words (kubernetes/kubernetes: the scheduler's FitError, kubelet images/image_manager.go and
kuberuntime_manager.go; containerd's CRI, internal/cri/server/container_start.go):

- `unschedulable`: PodScheduled False/Unschedulable with the scheduler's message;
- `waiting`: scheduled, its container waiting (ErrImagePull, ImagePullBackOff, CreateContainerConfigError ...);
- `running`: its container running, the pod Ready (or not: a readiness probe that does not pass yet);
- `start_error`: containerd could not start the container's command (reason StartError, exit code 128, the
  runtime's message), terminated under restartPolicy Never, else restarted and backing off;
- `terminate`: its container ended with an exit code (OOMKilled ...), having printed a log; restarted
  (lastState) under restartPolicy OnFailure;
- `preempt`: the scheduler preempts it for a higher-priority pod (DisruptionTarget PreemptionByScheduler, the
  `Preempted` event), its container stopped;
- `pulling` / `pulled`: the kubelet pulls the container's image (the container waits in ContainerCreating; the
  kubelet's `Pulling` event, then `Pulled`: images/image_manager.go);
- `autoscaler_event`: the cluster autoscaler's word on an unschedulable pod (processors/status/
  eventing_scale_up_processor.go: `TriggeredScaleUp`, `NotTriggerScaleUp`).

A controller that follows its pods (the Job controller's counts) overrides `pod_changed`.
"""

from __future__ import annotations

import datetime
from typing import Any

# containerd's CRI: a container whose task cannot be started ends at once with this reason and exit code,
# the runtime's error as its message (errorStartReason / errorStartExitCode: "128 is the same with Docker's").
START_ERROR_REASON, START_ERROR_EXIT_CODE = "StartError", 128
# The message runc's error reaches the pod with, through containerd (seen in `kubectl describe pod`).
RUNC_NOT_FOUND = ('failed to create containerd task: failed to create shim task: OCI runtime create failed: runc '
                  'create failed: unable to start container process: error during container init: exec: "{program}": '
                  'executable file not found in $PATH: unknown')


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Kubelet:
    """The scheduler and the kubelet, through the real client (`core`, `namespace`, `cluster` set by the
    controller class that mixes this in)."""

    core: Any
    namespace: str
    cluster: Any

    def pod_changed(self, pod: str) -> None:
        """Called after every pod status change (the Job controller recounts its pods here)."""

    def _pod_status(self, pod: str, status: dict[str, Any]) -> None:
        self.core.patch_namespaced_pod_status(pod, self.namespace, {"status": status})
        self.pod_changed(pod)

    def _pod(self, pod: str) -> dict[str, Any]:
        return self.core.api_client.sanitize_for_serialization(self.core.read_namespaced_pod(pod, self.namespace))

    def _container(self, pod: str) -> dict[str, Any]:
        return self._pod(pod)["spec"]["containers"][0]

    def _schedule(self, pod: str, node: str) -> None:
        self.core.patch_namespaced_pod(pod, self.namespace, {"spec": {"nodeName": node}})

    def _log(self, pod: str, container: str, log: str, previous: bool = False) -> None:
        if log and self.cluster is not None:
            key = (self.namespace, pod, container, "previous") if previous else (self.namespace, pod, container)
            self.cluster.call(lambda emulator: emulator.pod_logs.__setitem__(key, log))

    def event(self, pod: str, reason: str, message: str, component: str, type_: str = "Normal") -> None:
        """An Event about `pod` as a component's recorder writes it (core/v1: involvedObject with the pod's uid,
        source.component, first/lastTimestamp, count)."""
        meta = self._pod(pod)["metadata"]
        self.core.create_namespaced_event(self.namespace, {
            "metadata": {"generateName": f"{pod}."}, "type": type_, "reason": reason, "message": message,
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod, "namespace": self.namespace,
                               "uid": meta["uid"]},
            "source": {"component": component}, "firstTimestamp": now(), "lastTimestamp": now(), "count": 1})

    def autoscaler_event(self, pod: str, triggered: bool, words: str) -> None:
        """cluster-autoscaler's event: `pod triggered scale-up: <scale-up infos>` (each `{<group> 1->3 (max: 4)}`),
        or `pod didn't trigger scale-up: <n> <reason>, ...`."""
        if triggered:
            self.event(pod, "TriggeredScaleUp", f"pod triggered scale-up: {words}", "cluster-autoscaler")
        else:
            self.event(pod, "NotTriggerScaleUp", f"pod didn't trigger scale-up: {words}", "cluster-autoscaler")

    def pulling(self, pod: str, node: str = "node-1") -> None:
        """Scheduled on `node`; the kubelet pulls the image: the container waits in ContainerCreating (no
        message) and the kubelet posts `Pulling image "<image>"`."""
        container = self._container(pod)
        self.waiting(pod, "ContainerCreating", "", node)
        self.event(pod, "Pulling", f'Pulling image "{container.get("image", "")}"', "kubelet")

    def pulled(self, pod: str, seconds: float = 312.5) -> None:
        """The pull finished: `Successfully pulled image "<image>" in <d> (<d> including waiting). Image size: ...`."""
        image = self._container(pod).get("image", "")
        self.event(pod, "Pulled", f'Successfully pulled image "{image}" in {seconds}s ({seconds}s including '
                                  f'waiting). Image size: 10737418240 bytes.', "kubelet")

    def unschedulable(self, pod: str, message: str) -> None:
        """The scheduler found no node (its FitError): PodScheduled False/Unschedulable with its message, e.g.
        `0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available: 3 No
        preemption victims found for incoming pod.`"""
        self._pod_status(pod, {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
             "lastTransitionTime": now()}]})

    def waiting(self, pod: str, reason: str, message: str, node: str = "node-1") -> None:
        """Scheduled on `node`; the kubelet cannot start its container: ErrImagePull, ImagePullBackOff (`Back-off
        pulling image "<image>"`: kubelet images/image_manager.go), InvalidImageName, CreateContainerConfigError
        (`secret "x" not found`) ..."""
        container = self._container(pod)
        self._schedule(pod, node)
        self._pod_status(pod, {"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now()},
            {"type": "Ready", "status": "False", "reason": "ContainersNotReady",
             "message": f"containers with unready status: [{container['name']}]", "lastTransitionTime": now()}],
            "containerStatuses": [{"name": container["name"], "ready": False, "restartCount": 0,
                                   "image": container.get("image", ""), "imageID": "",
                                   "state": {"waiting": {"reason": reason, "message": message}}}]})

    def running(self, pod: str, node: str = "node-1", ready: bool = True) -> None:
        """Scheduled, its container started; Ready, or not yet (its readiness probe has not passed: the kubelet's
        `containers with unready status: [<c>]`)."""
        container = self._container(pod)
        self._schedule(pod, node)
        readiness = ({"type": "Ready", "status": "True", "lastTransitionTime": now()} if ready else
                     {"type": "Ready", "status": "False", "reason": "ContainersNotReady",
                      "message": f"containers with unready status: [{container['name']}]", "lastTransitionTime": now()})
        self._pod_status(pod, {"phase": "Running", "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now()}, readiness],
            "containerStatuses": [{"name": container["name"], "ready": ready, "restartCount": 0,
                                   "image": container.get("image", ""), "imageID": "", "started": True,
                                   "state": {"running": {"startedAt": now()}}}]})

    def start_error(self, pod: str, node: str = "node-1") -> str:
        """The container's command is not in its image: containerd ends the container at once (StartError, exit
        code 128, runc's `exec: "<program>": executable file not found in $PATH` in its message; it never ran,
        its startedAt is the zero time). Under restartPolicy Never the pod fails; else the kubelet restarts it,
        the end kept as lastState and the new container backing off. Returns the message."""
        spec = self._pod(pod)["spec"]
        container = spec["containers"][0]
        program = (container.get("command") or container.get("args") or ["<image entrypoint>"])[0]
        message = RUNC_NOT_FOUND.format(program=program)
        terminated = {"exitCode": START_ERROR_EXIT_CODE, "reason": START_ERROR_REASON, "message": message,
                      "startedAt": "1970-01-01T00:00:00Z", "finishedAt": now()}
        self._schedule(pod, node)
        self._end(pod, container, terminated, restarted=spec.get("restartPolicy", "Always") != "Never")
        return message

    def terminate(self, pod: str, exit_code: int, *, log: str = "", reason: str | None = None,
                  finished_at: str | None = None, message: str | None = None, restarted: bool = False) -> None:
        """Its container ended with `exit_code` (the kubelet's reason: OOMKilled when the cgroup's OOM killer
        did it, else Error/Completed), having printed `log`. `restarted`: the kubelet restarted it
        (restartPolicy OnFailure) and that end is now its lastState, the new container waiting in
        CrashLoopBackOff (`back-off 10s restarting failed container=<c> pod=<pod>_<ns>(<uid>)`) and its log the
        previous container's."""
        container = self._container(pod)
        terminated = {"exitCode": exit_code, "reason": reason or ("Completed" if exit_code == 0 else "Error"),
                      "startedAt": now(), "finishedAt": finished_at or now()}
        if message is not None:
            terminated["message"] = message
        self._log(pod, container["name"], log, previous=restarted)
        self._end(pod, container, terminated, restarted)

    def preempt(self, pod: str, node: str = "node-1", by: str = "a2b4c6d8-0000-4000-8000-000000000001") -> None:
        """The scheduler preempts the pod for a higher-priority one (pkg/scheduler/framework/preemption: the victim's
        `DisruptionTarget` condition, reason `PreemptionByScheduler`, message `<scheduler>: preempting to
        accommodate a higher priority pod`; its `Preempted` event, `Preempted by pod <uid> on node <node>`), and
        the kubelet stops its container (SIGTERM: exit code 143). The emulator keeps the pod (a real API server
        deletes it after its grace period; the training operator may then re-create it)."""
        container = self._container(pod)
        self._schedule(pod, node)
        self.event(pod, "Preempted", f"Preempted by pod {by} on node {node}", "default-scheduler")
        terminated = {"exitCode": 143, "reason": "Error", "startedAt": now(), "finishedAt": now()}
        self._pod_status(pod, {"phase": "Failed", "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now()},
            {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
             "message": "default-scheduler: preempting to accommodate a higher priority pod",
             "lastTransitionTime": now()},
            {"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now()}],
            "containerStatuses": [{"name": container["name"], "ready": False, "restartCount": 0,
                                   "image": container.get("image", ""), "imageID": "", "started": False,
                                   "state": {"terminated": terminated}}]})

    def _end(self, pod: str, container: dict[str, Any], terminated: dict[str, Any], restarted: bool) -> None:
        name = container["name"]
        status = {"name": name, "ready": False, "restartCount": 1 if restarted else 0,
                  "image": container.get("image", ""), "imageID": "", "started": False}
        if restarted:
            uid = self._pod(pod)["metadata"]["uid"]
            status.update(lastState={"terminated": terminated}, state={"waiting": {
                "reason": "CrashLoopBackOff",
                "message": f"back-off 10s restarting failed container={name} pod={pod}_{self.namespace}({uid})"}})
            phase = "Running"  # kubelet getPhase: a restartable container that stopped keeps the pod Running
        else:
            status["state"] = {"terminated": terminated}
            phase = "Succeeded" if terminated["exitCode"] == 0 else "Failed"
        self._pod_status(pod, {"phase": phase, "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now()},
            {"type": "Ready", "status": "False", "reason": "PodCompleted" if phase != "Running" else "ContainersNotReady",
             "lastTransitionTime": now()}],
            "containerStatuses": [status]})
