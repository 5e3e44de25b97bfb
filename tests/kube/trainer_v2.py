"""The test plays Kubeflow Trainer v2.3.0, JobSet v0.12.0 and the Job controller, through the real
`kubernetes` client against the emulator, as upstream behaves (notes: /work/notes/upstream-controllers.md,
§13's checklist; citation keys TR = kubeflow/trainer v2.3.0, JS = kubernetes-sigs/jobset v0.12.0, K8S =
the Job controller):

- `reconcile(name)`: TrainJob + its (Cluster)TrainingRuntime → ConfigMap `<tj>-runtime-snapshot`
  (TR runtime/core/snapshot.go); MPI: Secret `<tj>-mpi-ssh-auth` and ConfigMap `<tj>-mpi-hostfile` (TR
  mpi.go); the JobSet `<tj>` (`build_jobset`: runtime patched by runtimePatches, the trainer applied (resourcesPerNode's
  limits and requests become the `node` container's resources, its claims lost: TR trainingruntime.go
  L199-233), the plugin's env/volumes, JobSet's webhook defaults), rejected as JobSet's webhook would (a Warning Event
  `TrainJobResourcesCreationFailed`, no condition: TR trainjob_controller.go L107-120); the headless
  Service `<tj>`; one Job `<tj>-<rjob>-<i>` per replica (a replicated job with `dependsOn` only once the one
  it depends on is Ready: the MPI launcher after its sshd `node` pods) and, unless suspended, its Indexed pods
  `<job>-<index>-<5 random>` with hostname `<job>-<index>`, subdomain `<tj>`, JobSet's labels and
  annotations (JS jobset_controller.go L1014-1078) and the Job controller's completion-index annotation.
  Pods are Running and Ready as they are created; with `start_pods=False` they stay Pending and the test
  plays the scheduler and the kubelet on them (tests/kube/kubelet.py: Unschedulable, ImagePullBackOff, not
  Ready ...), `sync` recounting them as the Job controller and JobSet do. A pod the API server refuses (a test's
  admission: tests/kube/admission.py) is not created; the Job controller records its Warning Event on the Job
  (`FailedCreate` "Error creating: <the API server's message>", K8S controller_utils.go). The TrainJob gets `jobsStatus`
  (JobSet's replicatedJobsStatus, sorted by name descending) and, when `spec.suspend`,
  Suspended=True/Suspended "TrainJob is suspended" (TR L213-234).
- `finish(name, succeeded=..., message=..., log=...)`: the result pod (torch `node` index 0, MPI `launcher`)
  terminates with `message` as its termination message (and, given the EmulatedCluster, `log` as what
  its container `node` printed), the Jobs and the JobSet get their conditions
  (Completed/AllJobsCompleted "jobset completed successfully", or Failed/FailedJobs "jobset failed due to
  one or more job failures (first failed job: <job>)"; JS constants.go), JobSet deletes the Jobs still
  active (the MPI sshd `node` Job), and the TrainJob gets the JobSet's condition renamed Complete/Failed
  with its reason and message (TR jobset.go L449-457).
- `exceed_deadline(name)`: Failed/DeadlineExceeded "TrainJob exceeded its active deadline", JobSet deleted.
- `resume(name)`: after `spec.suspend: false`, Suspended=False/Resumed "TrainJob is resumed".

Not played: admission webhooks (a TrainJob naming a missing runtime is created anyway; `reconcile`
then records the Event), Kueue, the Job controller's restarts of failed pods (the runtimes' Jobs have
backoffLimit 0 and restartPolicy Never).
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import json
import time
from typing import Any

import kmock
import kubernetes

from .kubelet import Kubelet

TRAINER = ("trainer.kubeflow.org", "v1alpha1")
JOBSET = ("jobset.x-k8s.io", "v1alpha2")
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
JS = "jobset.sigs.k8s.io/"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
TORCH_PORT = 29500  # TR constants.go L72
MPI_ENV = {  # TR mpi.go L208-224, in the launcher's container `node` only
    "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
    "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
    "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
}
# Kinds the Trainer and JobSet create that the emulator does not serve by itself.
BUILTINS = {
    "v1/configmaps": dict(kind="ConfigMap", singular="configmap", namespaced=True, shortnames={"cm"}),
    "v1/secrets": dict(kind="Secret", singular="secret", namespaced=True),
    "v1/services": dict(kind="Service", singular="service", namespaced=True, shortnames={"svc"},
                        subresources={"status"}),
    "batch/v1/jobs": dict(kind="Job", singular="job", namespaced=True, subresources={"status"}),
}
VERBS = {"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}


def serve_builtins(emulator: Any) -> None:
    """Run with `cluster.call(serve_builtins)`: ConfigMaps, Secrets, Services and Jobs become servable."""
    for key, info in BUILTINS.items():
        emulator.resources[kmock.resource(key)] = kmock.ResourceInfo(verbs=VERBS, **info)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------ strategic merge (core/v1 keys)

MERGE_KEYS = {"containers": "name", "initContainers": "name", "volumes": "name", "env": "name",
              "volumeMounts": "mountPath", "imagePullSecrets": "name", "schedulingGates": "name",
              "ports": "containerPort", "replicatedJobs": "name"}


def strategic_merge(base: Any, patch: Any, key: str | None = None) -> Any:
    """Kubernetes strategic merge for the fields a runtimePatch can hold: lists with a merge key merge by
    it (replicatedJobs by name, JS jobset_types.go L124-127; containers, volumes, env ... as core/v1);
    lists without one (tolerations) are replaced; maps merge (nodeSelector, labels)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for name, value in patch.items():
            merged[name] = strategic_merge(base.get(name), value, name) if name in base else copy.deepcopy(value)
        return merged
    if isinstance(base, list) and isinstance(patch, list) and key in MERGE_KEYS:
        field = MERGE_KEYS[key]
        merged = [copy.deepcopy(item) for item in base]
        for item in patch:
            at = next((i for i, old in enumerate(merged) if old.get(field) == item.get(field)), None)
            if at is None:
                merged.append(copy.deepcopy(item))
            else:
                merged[at] = strategic_merge(merged[at], item)
        return merged
    return copy.deepcopy(patch)


def upsert_env(container: dict[str, Any], env: list[dict[str, Any]]) -> None:
    container["env"] = strategic_merge(container.get("env") or [], env, "env")


# ------------------------------------------------------------------ the JobSet the Trainer builds


def _pod_spec(rjob: dict[str, Any]) -> dict[str, Any]:
    return rjob["template"]["spec"]["template"]["spec"]


def _node_container(rjob: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in _pod_spec(rjob)["containers"] if c["name"] == "node"), None)


def _is_trainer(rjob: dict[str, Any]) -> bool:
    return ((rjob["template"].get("metadata") or {}).get("labels") or {}).get(ANCESTOR_LABEL) == "trainer"


def pod_counts(trainjob: dict[str, Any], runtime: dict[str, Any]) -> dict[str, int]:
    """TR trainingruntime.go L186-196, torch.go/mpi.go EnforceMLPolicy."""
    policy = runtime["spec"].get("mlPolicy") or {}
    num_nodes = (trainjob["spec"].get("trainer") or {}).get("numNodes", policy.get("numNodes", 1))
    counts = {}
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        count = rjob["template"]["spec"].get("parallelism", 1)
        if _is_trainer(rjob):
            count = num_nodes if "torch" in policy else policy.get("numNodes", 1)
        if "mpi" in policy and rjob["name"] == "node":
            count = max(num_nodes - 1, 1) if policy["mpi"].get("runLauncherAsNode") else num_nodes
        counts[rjob["name"]] = count
    return counts


def hostfile(trainjob: dict[str, Any], runtime: dict[str, Any]) -> str:
    """TR mpi.go L316-342: `<tj>-<rjob>-0-<i>.<tj> slots=N` for every node pod, in runtime order."""
    name, policy = trainjob["metadata"]["name"], runtime["spec"]["mlPolicy"]["mpi"]
    slots = (trainjob["spec"].get("trainer") or {}).get("numProcPerNode", policy.get("numProcPerNode", 1))
    lines = []
    for rjob, count in pod_counts(trainjob, runtime).items():
        if rjob == "node" or (rjob == "launcher" and policy.get("runLauncherAsNode")):
            lines += [f"{name}-{rjob}-0-{i}.{name} slots={slots}\n" for i in range(count)]
    return "".join(lines)


def build_jobset(trainjob: dict[str, Any], runtime: dict[str, Any]) -> dict[str, Any]:
    """The JobSet Trainer v2 applies for a TrainJob on a runtime (TR plugins/jobset/jobset.go L325-436,
    builder.go; runtime/core/trainingruntime.go L141-290), after JobSet's defaulting webhook (JS
    jobset_webhook.go L111-161)."""
    name, spec = trainjob["metadata"]["name"], trainjob["spec"]
    template = copy.deepcopy(runtime["spec"]["template"])
    labels = dict((template.get("metadata") or {}).get("labels") or {})
    js_spec = template["spec"]
    order = [rjob["name"] for rjob in js_spec["replicatedJobs"]]
    for patch in spec.get("runtimePatches") or []:
        patch_template = (patch.get("trainingRuntimeSpec") or {}).get("template") or {}
        labels.update((patch_template.get("metadata") or {}).get("labels") or {})
        js_spec = strategic_merge(js_spec, patch_template.get("spec") or {})
    js_spec["replicatedJobs"].sort(key=lambda rjob: order.index(rjob["name"]))  # runtime order (L283-287)
    policy = runtime["spec"].get("mlPolicy") or {}
    trainer = spec.get("trainer") or {}
    counts = pod_counts(trainjob, runtime)
    launcher_as_node = bool((policy.get("mpi") or {}).get("runLauncherAsNode"))
    for rjob in js_spec["replicatedJobs"]:
        node = _node_container(rjob)
        if _is_trainer(rjob):
            rjob["replicas"] = 1
            if node is not None:
                node.update({k: copy.deepcopy(trainer[k]) for k in ("image", "command", "args") if k in trainer})
        if node is not None and (_is_trainer(rjob) or launcher_as_node and rjob["name"] == "node"):
            upsert_env(node, trainer.get("env") or [])
            if trainer.get("resourcesPerNode"):  # limits and requests merged; claims dropped (TR L199-233)
                merged = strategic_merge(node.get("resources") or {}, trainer["resourcesPerNode"])
                node["resources"] = {key: merged[key] for key in ("limits", "requests") if merged.get(key)}
        rjob["template"]["spec"]["parallelism"] = rjob["template"]["spec"]["completions"] = counts[rjob["name"]]
        pod = _pod_spec(rjob)
        if "torch" in policy and _is_trainer(rjob) and node is not None:  # TR torch.go L138-204
            upsert_env(node, [
                {"name": "PET_NNODES", "value": str(counts[rjob["name"]])},
                {"name": "PET_NPROC_PER_NODE", "value": str(trainer.get("numProcPerNode", "auto"))},
                {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {
                    "fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}},
                {"name": "PET_MASTER_ADDR", "value": f"{name}-node-0-0.{name}"},
                {"name": "PET_MASTER_PORT", "value": str(TORCH_PORT)},
            ])  # fmt: skip
            node["ports"] = strategic_merge(node.get("ports") or [], [{"containerPort": TORCH_PORT}], "ports")
        if "mpi" in policy and rjob["name"] in ("node", "launcher") and node is not None:  # TR mpi.go L146-224
            pod["volumes"] = strategic_merge(pod.get("volumes") or [], [{"name": "mpi-ssh-auth", "secret": {
                "secretName": f"{name}-mpi-ssh-auth", "defaultMode": 0o400, "items": [
                    {"key": "ssh-privatekey", "path": "id_rsa", "mode": 0o640},
                    {"key": "ssh-publickey", "path": "id_rsa.pub", "mode": 0o644},
                    {"key": "ssh-publickey", "path": "authorized_keys", "mode": 0o644}]}}], "volumes")
            mount = {"name": "mpi-ssh-auth", "mountPath": policy["mpi"].get("sshAuthMountPath", "/root/.ssh")}
            node["volumeMounts"] = strategic_merge(node.get("volumeMounts") or [], [mount], "volumeMounts")
            if rjob["name"] == "launcher":
                pod["volumes"].append({"name": "mpi-hostfile", "configMap": {
                    "name": f"{name}-mpi-hostfile", "items": [{"key": "hostfile", "path": "hostfile", "mode": 0o444}]}})
                node["volumeMounts"].append({"name": "mpi-hostfile", "mountPath": "/etc/mpi"})
                slots = trainer.get("numProcPerNode", policy["mpi"].get("numProcPerNode", 1))
                upsert_env(node, [{"name": k, "value": v} for k, v in
                                  {**MPI_ENV, "OMPI_MCA_orte_set_default_slots": str(slots)}.items()])
        # JobSet's defaulting webhook
        rjob["template"]["spec"]["completionMode"] = "Indexed"
        pod.setdefault("restartPolicy", "OnFailure")
        rjob.setdefault("groupName", "default")
    js_spec.setdefault("successPolicy", {"operator": "All"})
    js_spec.setdefault("startupPolicy", {"startupPolicyOrder": "AnyOrder"})
    network = js_spec.setdefault("network", {})
    network.setdefault("enableDNSHostnames", True)
    network.setdefault("publishNotReadyAddresses", True)
    js_spec["suspend"] = bool(spec.get("suspend", False))
    metadata = {"name": name, "namespace": trainjob["metadata"]["namespace"], "ownerReferences": [_owner(trainjob)]}
    if labels:
        metadata["labels"] = labels
    return {"apiVersion": "/".join(JOBSET), "kind": "JobSet", "metadata": metadata, "spec": js_spec}


def _owner(obj: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}


def jobset_keys(jobset: dict[str, Any], rjob: dict[str, Any], index: int) -> dict[str, str]:
    """The labels JobSet sets (and repeats as annotations) on its Jobs and their pods (JS L1014-1078)."""
    name, namespace = jobset["metadata"]["name"], jobset["metadata"]["namespace"]
    jobs = jobset["spec"]["replicatedJobs"]
    before = sum(j.get("replicas", 1) for j in jobs[: jobs.index(rjob)])
    group = [j for j in jobs if j.get("groupName", "default") == rjob.get("groupName", "default")]
    job_name = f"{name}-{rjob['name']}-{index}"
    return {
        JS + "jobset-name": name,
        JS + "jobset-uid": jobset["metadata"]["uid"],
        JS + "replicatedjob-name": rjob["name"],
        JS + "restart-attempt": str((jobset.get("status") or {}).get("restarts", 0)),
        JS + "replicatedjob-replicas": str(rjob.get("replicas", 1)),
        JS + "global-replicas": str(sum(j.get("replicas", 1) for j in jobs)),
        JS + "job-index": str(index),
        JS + "job-key": hashlib.sha1(f"{namespace}/{job_name}".encode()).hexdigest(),
        JS + "job-global-index": str(before + index),
        JS + "group-name": rjob.get("groupName", "default"),
        JS + "group-replicas": str(sum(j.get("replicas", 1) for j in group)),
        JS + "job-group-index": str(sum(j.get("replicas", 1) for j in group[: group.index(rjob)]) + index),
    }


# ------------------------------------------------------------------ the controllers, through the client


class TrainerV2(Kubelet):
    """Plays Trainer v2 + JobSet + the Job controller for TrainJobs in `namespace`; the scheduler and the
    kubelet on their pods (Kubelet: with `start_pods`, every pod runs and is Ready as it is created, else it
    stays Pending until the test plays it, each change recounted by the Job controller and JobSet)."""

    def __init__(self, api_client: kubernetes.client.ApiClient, namespace: str = "default", cluster: Any = None,
                 start_pods: bool = True):
        self.custom = kubernetes.client.CustomObjectsApi(api_client)
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.namespace = namespace
        self.cluster = cluster  # the EmulatedCluster, to say what containers printed (their logs)
        self.start_pods = start_pods

    # --- reading
    def trainjob(self, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(*TRAINER, self.namespace, "trainjobs", name)

    def runtime(self, trainjob: dict[str, Any]) -> dict[str, Any] | None:
        ref = trainjob["spec"]["runtimeRef"]
        try:
            if ref.get("kind", "ClusterTrainingRuntime") == "ClusterTrainingRuntime":
                return self.custom.get_cluster_custom_object(*TRAINER, "clustertrainingruntimes", ref["name"])
            return self.custom.get_namespaced_custom_object(*TRAINER, self.namespace, "trainingruntimes", ref["name"])
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def jobs(self, trainjob: str) -> list[dict[str, Any]]:
        return self.custom.list_namespaced_custom_object("batch", "v1", self.namespace, "jobs",
                                                         label_selector=f"{JS}jobset-name={trainjob}")["items"]

    def pods(self, label_selector: str) -> list[dict[str, Any]]:
        response = self.core.list_namespaced_pod(self.namespace, label_selector=label_selector, _preload_content=False)
        return json.loads(response.data)["items"]

    def pod_names(self, trainjob: str, rjob: str | None = None) -> list[str]:
        """The TrainJob's pods (of one replicated job), in job and completion-index order."""
        selector = f"{JS}jobset-name={trainjob}" + (f",{JS}replicatedjob-name={rjob}" if rjob else "")
        pods = self.pods(selector)
        order = {rjob: i for i, rjob in enumerate(self.jobset_order(trainjob))}
        pods.sort(key=lambda p: (order.get(p["metadata"]["labels"][JS + "replicatedjob-name"], 0),
                                 int(p["metadata"]["labels"][JS + "job-index"]),
                                 int(p["metadata"]["annotations"][COMPLETION_INDEX])))
        return [p["metadata"]["name"] for p in pods]

    def jobset_order(self, name: str) -> list[str]:
        jobset = self._jobset(name)
        return [rjob["name"] for rjob in jobset["spec"]["replicatedJobs"]] if jobset else []

    def _jobset(self, name: str) -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(*JOBSET, self.namespace, "jobsets", name)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    # --- reconciling
    def reconcile(self, name: str) -> dict[str, Any] | None:
        """Build everything for a TrainJob; the JobSet, or None when building failed (Event recorded)."""
        trainjob = self.trainjob(name)
        runtime = self.runtime(trainjob)
        if runtime is None:
            ref = trainjob["spec"]["runtimeRef"]
            return self._event(trainjob, f"{ref.get('kind', 'ClusterTrainingRuntime')} {ref['name']} not found")
        self._create_core("config_map", {"metadata": {"name": f"{name}-runtime-snapshot", "ownerReferences": [
            _owner(trainjob)]}, "data": {"runtime": json.dumps(runtime["spec"])}})
        if "mpi" in runtime["spec"].get("mlPolicy", {}):
            self._create_core("secret", {"metadata": {"name": f"{name}-mpi-ssh-auth", "ownerReferences": [
                _owner(trainjob)]}, "type": "kubernetes.io/ssh-auth", "immutable": True,
                "stringData": {"ssh-privatekey": "(ECDSA P-521, not generated here)", "ssh-publickey": "ecdsa"}})
            self._create_core("config_map", {"metadata": {"name": f"{name}-mpi-hostfile", "ownerReferences": [
                _owner(trainjob)]}, "data": {"hostfile": hostfile(trainjob, runtime)}})
        jobset = build_jobset(trainjob, runtime)
        from trainer_v2_rules import jobset_spec_problems  # JobSet's validating webhook

        problems = jobset_spec_problems(jobset["spec"], name)
        if problems:
            return self._event(trainjob, f"admission webhook \"vjobset.kb.io\" denied the request: {'; '.join(problems)}")
        jobset = self.custom.create_namespaced_custom_object(*JOBSET, self.namespace, "jobsets", jobset,
                                                             field_validation="Strict")
        self._create_core("service", {"metadata": {"name": name, "ownerReferences": [_owner(jobset)]}, "spec": {
            "clusterIP": "None", "selector": {JS + "jobset-name": name}, "publishNotReadyAddresses": True}})
        self.sync(name)
        return jobset

    def _create_core(self, kind: str, body: dict[str, Any]) -> None:
        getattr(self.core, f"create_namespaced_{kind}")(self.namespace, body)

    def _event(self, trainjob: dict[str, Any], why: str) -> None:
        self.core.create_namespaced_event(self.namespace, {
            "metadata": {"generateName": f"{trainjob['metadata']['name']}."}, "type": "Warning",
            "reason": "TrainJobResourcesCreationFailed", "message": f"TrainJob resources reconciliation failed: {why}",
            "involvedObject": {"apiVersion": trainjob["apiVersion"], "kind": "TrainJob",
                               "name": trainjob["metadata"]["name"], "uid": trainjob["metadata"]["uid"]},
        })  # fmt: skip
        return None

    def _create_job(self, jobset: dict[str, Any], rjob: dict[str, Any], index: int) -> None:
        keys = jobset_keys(jobset, rjob, index)
        job_name = f"{jobset['metadata']['name']}-{rjob['name']}-{index}"
        template = copy.deepcopy(rjob["template"])
        pod_template = template["spec"]["template"]
        meta = pod_template.setdefault("metadata", {})
        meta["labels"] = {**(meta.get("labels") or {}), **keys}
        meta["annotations"] = {**(meta.get("annotations") or {}), **keys}
        suspended = jobset["spec"].get("suspend", False)
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {
            "name": job_name, "labels": {**((template.get("metadata") or {}).get("labels") or {}), **keys},
            "annotations": dict(keys), "ownerReferences": [_owner(jobset)]},
            "spec": {**template["spec"], "suspend": suspended}}
        job = self.custom.create_namespaced_custom_object("batch", "v1", self.namespace, "jobs", job)
        if suspended:
            return
        self._create_pods(jobset, job)

    def _create_pods(self, jobset: dict[str, Any], job: dict[str, Any]) -> None:
        """The Job controller's pods of one Job, one completion index after another (K8S job_controller.go
        manageJob: slowStartBatch from a batch of 1, so a refused pod ends the sync: the others are not tried)."""
        for completion in range(job["spec"]["completions"]):
            if not self._create_pod(jobset, job, completion):
                return

    def _create_pod(self, jobset: dict[str, Any], job: dict[str, Any], index: int) -> bool:
        """The Job controller's pod for one completion index (K8S indexed_job_utils.go); False when the API server
        refused it."""
        pod_template = copy.deepcopy(job["spec"]["template"])
        job_name = job["metadata"]["name"]
        labels = {**pod_template["metadata"]["labels"], "batch.kubernetes.io/job-name": job_name,
                  "job-name": job_name, "batch.kubernetes.io/controller-uid": job["metadata"]["uid"],
                  "controller-uid": job["metadata"]["uid"], COMPLETION_INDEX: str(index)}
        annotations = {**pod_template["metadata"]["annotations"], COMPLETION_INDEX: str(index)}
        spec = pod_template["spec"]
        for container in spec["containers"]:
            upsert_env(container, [{"name": "JOB_COMPLETION_INDEX", "value": str(index)}])
        spec.update(hostname=f"{job_name}-{index}", subdomain=jobset["metadata"]["name"])
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "generateName": f"{job_name}-{index}-", "labels": labels, "annotations": annotations,
            "ownerReferences": [_owner(job)]}, "spec": spec}
        try:
            created = json.loads(self.core.create_namespaced_pod(self.namespace, body, _preload_content=False).data)
        except kubernetes.client.ApiException as exc:
            self._failed_create(job, exc)
            return False
        if not self.start_pods:  # Pending, not yet scheduled: the test plays the scheduler and the kubelet
            return True
        self.core.patch_namespaced_pod_status(created["metadata"]["name"], self.namespace, {"status": {
            "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": c["name"], "ready": True, "restartCount": 0, "image": c["image"],
                                   "imageID": "", "state": {"running": {"startedAt": _now()}}}
                                  for c in spec["containers"]]}})
        return True

    def _failed_create(self, job: dict[str, Any], exc: kubernetes.client.ApiException) -> None:
        """The API server refused a pod (an admission: Pod Security, a LimitRange, a quota): the Job controller's
        Warning Event on its Job, as its pod control records it (K8S pkg/controller/controller_utils.go
        RealPodControl.createPods: `FailedCreate`, "Error creating: <the API server's Status message>", recorder
        source `job-controller`; client-go's recorder names it `<job>.<hex of the time>`). Its retries after a
        backoff (another Event each, a new pod name in its message) are not played."""
        status = json.loads(exc.body or "{}")
        stamp, job_meta = _now(), job["metadata"]
        self.core.create_namespaced_event(self.namespace, {
            "metadata": {"name": f"{job_meta['name']}.{time.time_ns():x}"}, "type": "Warning",
            "reason": "FailedCreate", "message": f"Error creating: {status.get('message') or exc.reason}",
            "involvedObject": {"apiVersion": "batch/v1", "kind": "Job", "name": job_meta["name"],
                               "namespace": self.namespace, "uid": job_meta["uid"],
                               "resourceVersion": job_meta.get("resourceVersion")},
            "source": {"component": "job-controller"}, "reportingComponent": "job-controller",
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1})  # fmt: skip

    # --- status: the Job controller counts pods, JobSet counts Jobs and creates the ones due, the Trainer copies
    def pod_changed(self, pod: str) -> None:
        labels = self._pod(pod)["metadata"].get("labels") or {}
        if JS + "jobset-name" in labels:
            self.sync(labels[JS + "jobset-name"])

    def sync(self, name: str, condition: dict[str, Any] | None = None) -> None:
        """`_sync`; a TrainJob deleted meanwhile (its JobSet, Jobs and pods with it: the operator gave up on a run
        whose pods were refused) is dropped, as upstream's reconcilers drop an object they get NotFound for."""
        try:
            self._sync(name, condition)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise

    def _sync(self, name: str, condition: dict[str, Any] | None = None) -> None:
        """What the controllers do after a change: each Job's counts from its pods (K8S job_controller.go:
        active = pods not finished, ready = those with Ready True); JobSet's replicatedJobsStatus from its Jobs
        (JS calculateReplicatedJobStatuses: a Job is ready when its succeeded + ready pods reach its parallelism)
        and, unless it has finished, the Jobs of each replicated job whose dependsOn is reached (JS
        depends_on.go: Ready when the ready + failed + succeeded Jobs of the one it depends on are all its
        replicas; so the MPI launcher's Job only once every sshd `node` pod is Ready); the TrainJob's
        jobsStatus and conditions from those (TR jobset.go L449-470)."""
        while True:
            jobset = self._jobset(name)
            jobs = [self._count_pods(job) for job in self.jobs(name)]
            statuses = replicated_job_statuses(jobset, jobs) if jobset else []
            if jobset is None or (jobset.get("status") or {}).get("terminalState"):
                break
            failed = next((job["metadata"]["name"] for job in jobs if past_backoff_limit(job)), None)
            if failed is not None:  # the Job controller fails it, then JobSet fails (no failure policy)
                self._end_job(failed, succeeded=False)
                condition = self._end_jobset(jobset, False, failed)
                continue
            if not self._create_due_jobs(jobset, jobs, statuses):
                break
        if jobset is not None:
            self.custom.patch_namespaced_custom_object_status(*JOBSET, self.namespace, "jobsets", name,
                                                              {"status": {"replicatedJobsStatus": statuses}})
        self._sync_status(name, statuses, condition)

    def _count_pods(self, job: dict[str, Any]) -> dict[str, Any]:
        pods = [p for p in self.pods(f"batch.kubernetes.io/job-name={job['metadata']['name']}")
                if not p["metadata"].get("deletionTimestamp")]
        phases = [(p.get("status") or {}).get("phase", "Pending") for p in pods]
        ready = sum(phase not in ("Succeeded", "Failed") and any(
            c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions") or [])
            for p, phase in zip(pods, phases))
        counts = {"active": sum(phase not in ("Succeeded", "Failed") for phase in phases), "ready": ready,
                  "succeeded": phases.count("Succeeded"), "failed": phases.count("Failed")}
        return self.custom.patch_namespaced_custom_object_status("batch", "v1", self.namespace, "jobs",
                                                                 job["metadata"]["name"], {"status": counts})

    def _create_due_jobs(self, jobset: dict[str, Any], jobs: list[dict[str, Any]],
                         statuses: list[dict[str, Any]]) -> bool:
        existing = {job["metadata"]["name"] for job in jobs}
        replicas = {rjob["name"]: rjob.get("replicas", 1) for rjob in jobset["spec"]["replicatedJobs"]}
        by_name = {status["name"]: status for status in statuses}
        created = False
        for rjob in jobset["spec"]["replicatedJobs"]:
            if not all(dependency_reached(dep, replicas[dep["name"]], by_name.get(dep["name"]))
                       for dep in rjob.get("dependsOn") or []):
                continue
            for index in range(rjob.get("replicas", 1)):
                if f"{jobset['metadata']['name']}-{rjob['name']}-{index}" not in existing:
                    self._create_job(jobset, rjob, index)
                    created = True
        return created

    def _sync_status(self, name: str, statuses: list[dict[str, Any]], condition: dict[str, Any] | None) -> None:
        """JobSet replicatedJobsStatus → TrainJob jobsStatus; conditions."""
        trainjob = self.trainjob(name)
        conditions = [c for c in (trainjob.get("status") or {}).get("conditions") or []]
        if trainjob["spec"].get("suspend"):
            conditions = _set(conditions, "Suspended", "True", "Suspended", "TrainJob is suspended")
        elif any(c["type"] == "Suspended" and c["status"] == "True" for c in conditions):
            conditions = _set(conditions, "Suspended", "False", "Resumed", "TrainJob is resumed")
        if condition is not None:
            conditions = [c for c in conditions if c["type"] != condition["type"]] + [condition]
        status: dict[str, Any] = {"jobsStatus": statuses}
        if conditions:
            status["conditions"] = conditions
        self.custom.patch_namespaced_custom_object_status(*TRAINER, self.namespace, "trainjobs", name,
                                                          {"status": status})

    def resume(self, name: str) -> None:
        """`spec.suspend` became false (Kueue admitted it, or a user): the JobSet is applied again with the
        runtimePatches as they are now (TR jobset.go L330-342), and JobSet unsuspends its Jobs with their
        pod templates updated (JS resumeJobsIfNecessary), whose pods the Job controller then creates."""
        trainjob = self.trainjob(name)
        jobset = build_jobset(trainjob, self.runtime(trainjob))
        jobset = self.custom.patch_namespaced_custom_object(*JOBSET, self.namespace, "jobsets", name,
                                                            {"spec": jobset["spec"]})
        templates = {rjob["name"]: rjob["template"]["spec"]["template"] for rjob in jobset["spec"]["replicatedJobs"]}
        for job in self.jobs(name):
            template = strategic_merge(job["spec"]["template"], templates[job["metadata"]["labels"][JS + "replicatedjob-name"]])
            job = self.custom.patch_namespaced_custom_object("batch", "v1", self.namespace, "jobs",
                                                             job["metadata"]["name"],
                                                             {"spec": {"suspend": False, "template": template}})
            self._create_pods(jobset, job)
        self.sync(name)

    def finish(self, name: str, *, succeeded: bool, message: str | None, exit_code: int | None = None,
               log: str = "") -> None:
        """The result pod terminates with `message` (its container `node` printed `log`); Jobs, JobSet and
        TrainJob finish as upstream's do."""
        jobset = self.custom.get_namespaced_custom_object(*JOBSET, self.namespace, "jobsets", name)
        result_rjob = "launcher" if any(j["name"] == "launcher" for j in jobset["spec"]["replicatedJobs"]) else "node"
        code = exit_code if exit_code is not None else (0 if succeeded else 1)
        result_job = f"{name}-{result_rjob}-0"
        for pod in self.pods(f"{JS}jobset-name={name},{JS}replicatedjob-name={result_rjob}"):
            first = pod["metadata"]["annotations"][COMPLETION_INDEX] == "0"
            if first and log and self.cluster is not None:
                key = (self.namespace, pod["metadata"]["name"], "node")
                self.cluster.call(lambda emulator, key=key: emulator.pod_logs.__setitem__(key, log))
            self._terminate(pod, code if first or succeeded else 143, message if first else None)
        self._end_job(result_job, succeeded)
        self.sync(name, self._end_jobset(jobset, succeeded, result_job))

    def _end_job(self, job: str, succeeded: bool) -> None:
        """The Job controller: Complete, or Failed once its failed pods exceed its backoffLimit (0 in the
        project's runtimes: the first)."""
        condition = ({"type": "Complete", "status": "True", "reason": "CompletionsReached",
                      "message": "Reached expected number of succeeded pods", "lastTransitionTime": _now()}
                     if succeeded else
                     {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                      "message": "Job has reached the specified backoff limit", "lastTransitionTime": _now()})
        self.custom.patch_namespaced_custom_object_status("batch", "v1", self.namespace, "jobs", job,
                                                          {"status": {"conditions": [condition]}})

    def _end_jobset(self, jobset: dict[str, Any], succeeded: bool, job: str) -> dict[str, Any]:
        """JobSet ends (its success policy met, or a Job failed: no failure policy restarts it), deletes its Jobs
        still active (JS L162-176: the MPI sshd `node` Job), and the Trainer copies its condition, renamed
        (TR jobset.go L449-457). Returns that TrainJob condition."""
        name = jobset["metadata"]["name"]
        condition = ({"type": "Completed", "status": "True", "reason": "AllJobsCompleted",
                      "message": "jobset completed successfully"}
                     if succeeded else
                     {"type": "Failed", "status": "True", "reason": "FailedJobs",
                      "message": f"jobset failed due to one or more job failures (first failed job: {job})"})
        condition.update(lastTransitionTime=_now(), observedGeneration=jobset["metadata"].get("generation", 1))
        self.custom.patch_namespaced_custom_object_status(*JOBSET, self.namespace, "jobsets", name, {"status": {
            "conditions": [condition], "terminalState": condition["type"]}})
        for other in self.jobs(name):
            if other["metadata"]["name"] != job:
                self.custom.delete_namespaced_custom_object("batch", "v1", self.namespace, "jobs",
                                                            other["metadata"]["name"])
        return {**condition, "type": "Complete" if succeeded else "Failed"}

    def _terminate(self, pod: dict[str, Any], code: int, message: str | None) -> None:
        terminated = {"exitCode": code, "reason": {0: "Completed", 137: "OOMKilled"}.get(code, "Error"),
                      "startedAt": _now(), "finishedAt": _now()}
        if message is not None:
            terminated["message"] = message
        self.core.patch_namespaced_pod_status(pod["metadata"]["name"], self.namespace, {"status": {
            "phase": "Succeeded" if code == 0 else "Failed", "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [{"name": c["name"], "ready": False, "restartCount": 0, "image": c["image"],
                                   "imageID": "", "state": {"terminated": terminated}}
                                  for c in pod["spec"]["containers"]]}})

    def exceed_deadline(self, name: str) -> None:
        """TR trainjob_controller.go L155-191: Failed/DeadlineExceeded, and the JobSet is deleted."""
        self.custom.delete_namespaced_custom_object(*JOBSET, self.namespace, "jobsets", name)
        condition = {"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
                     "message": "TrainJob exceeded its active deadline", "lastTransitionTime": _now()}
        self.sync(name, condition)


def _set(conditions: list[dict[str, Any]], type_: str, status: str, reason: str, message: str) -> list[dict]:
    """meta.SetStatusCondition: lastTransitionTime changes only with the status (AM conditions.go L31-69)."""
    old = next((c for c in conditions if c["type"] == type_), None)
    when = old["lastTransitionTime"] if old and old["status"] == status else _now()
    new = {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": when}
    return [new if c["type"] == type_ else c for c in conditions] if old else [*conditions, new]


def replicated_job_statuses(jobset: dict[str, Any], jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """JS calculateReplicatedJobStatuses (v0.12.0 L458-538): every replicated job of the spec, its finished Jobs
    counted as succeeded/failed, the others as ready (succeeded + ready pods >= min(parallelism, completions)),
    active (an active pod) and suspended; sorted by name, descending (as the Trainer's copy reads)."""
    counts = {rjob["name"]: dict(ready=0, succeeded=0, failed=0, active=0, suspended=0)
              for rjob in jobset["spec"]["replicatedJobs"]}
    for job in jobs:
        rjob = counts.get(job["metadata"]["labels"][JS + "replicatedjob-name"])
        if rjob is None:
            continue
        state = job.get("status") or {}
        finished = {c["type"] for c in state.get("conditions") or [] if c["status"] == "True"}
        if "Complete" in finished:
            rjob["succeeded"] += 1
        elif "Failed" in finished:
            rjob["failed"] += 1
        else:
            pods = min(job["spec"].get("parallelism", 1), job["spec"].get("completions") or 1 << 31)
            rjob["ready"] += state.get("succeeded", 0) + state.get("ready", 0) >= pods
            rjob["active"] += state.get("active", 0) > 0
            rjob["suspended"] += bool(job["spec"].get("suspend"))
    return [{"name": name, **count} for name, count in sorted(counts.items(), reverse=True)]


def dependency_reached(depends_on: dict[str, Any], replicas: int, status: dict[str, Any] | None) -> bool:
    """JS dependencyReachedStatus: Ready when the ready, failed and succeeded Jobs are all its replicas;
    Complete when they all succeeded."""
    if status is None:
        return False
    if depends_on.get("status") == "Complete":
        return status["succeeded"] == replicas
    return status["ready"] + status["failed"] + status["succeeded"] == replicas


def past_backoff_limit(job: dict[str, Any]) -> bool:
    """An unfinished Job whose failed pods exceed its backoffLimit (K8S: 6 by default)."""
    state = job.get("status") or {}
    if any(c["status"] == "True" and c["type"] in ("Complete", "Failed") for c in state.get("conditions") or []):
        return False
    return state.get("failed", 0) > job["spec"].get("backoffLimit", 6)
