"""What Kubeflow Trainer v2.3.0 and JobSet v0.12.0 reject beyond their CRDs' OpenAPI schemas: the CEL
rules in the CRDs (`x-kubernetes-validations`, which jsonschema cannot evaluate) and the checks of
their admission webhooks. `kubeflow_crds.job_problems` adds these to the schema's for the Trainer v2
kinds; the Trainer v2 test double (tests/kube/trainer_v2.py) applies the JobSet webhook's rules to the
JobSets it builds. Sources (kubeflow/trainer v2.3.0, kubernetes-sigs/jobset v0.12.0):

- TrainJob CEL: metadata.name RFC 1035, <= 63; managedBy values (trainer.kubeflow.org_trainjobs.yaml).
- TrainJob webhook: the runtime must exist (pkg/webhooks/trainjob_webhook.go); runtimeRef kind/group must
  be registered (pkg/runtime/core/registry.go); reserved env names (torch.go Validate, mpi.go Validate;
  constants.go L299-306); runtimePatches (plugins/jobset/jobset.go L172-209): manager a domain-prefixed
  path, replicated jobs and containers that exist in the runtime, no env on `node` or the initializers;
  MPI with runLauncherAsNode and numNodes >= 2 needs both `launcher` and `node`.
- Runtime CEL: one mlPolicy source; InOrder startup excludes dependsOn. Runtime webhook
  (pkg/webhooks/trainingruntime_webhook.go): an ancestor-labelled job has replicas 1 and its container.
- JobSet webhook (pkg/webhooks/jobset_webhook.go ValidateCreate): no dependsOn on the first job, dependsOn
  only on earlier jobs, success-policy targets exist, job and pod names are DNS-1035 labels.
"""

from __future__ import annotations

import re
from typing import Any

RFC1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
PATH_CHARS = re.compile(r"^[A-Za-z0-9/\-._~%!$&'()*+,;=:]+$")
MANAGED_BY = {"trainer.kubeflow.org/trainjob-controller", "kueue.x-k8s.io/multikueue"}
RUNTIME_KINDS = {"ClusterTrainingRuntime", "TrainingRuntime"}
TORCH_RESERVED_ENV = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}
MPI_RESERVED_ENV = {"OMPI_MCA_orte_default_hostfile", "OMPI_MCA_plm_rsh_args", "OMPI_MCA_orte_keep_fqdn_hostnames",
                    "OMPI_MCA_orte_set_default_slots"}
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
ANCESTOR_CONTAINERS = {"trainer": "node", "dataset-initializer": "dataset-initializer",
                       "model-initializer": "model-initializer"}
NO_PATCHED_ENV = {"node", "dataset-initializer", "model-initializer"}
ML_POLICY_SOURCES = ("torch", "mpi", "jax", "xgboost", "flux")


def dns1035_label_problems(name: str, what: str) -> list[str]:
    problems = []
    if len(name) > 63:
        problems.append(f"{what} {name!r} is longer than 63 characters")
    if not RFC1035.fullmatch(name):
        problems.append(f"{what} {name!r} is not an RFC 1035 label")
    return problems


def domain_prefixed_path_problems(value: str, where: str) -> list[str]:
    """k8s.io/apimachinery validation.IsDomainPrefixedPath."""
    domain, _, path = value.partition("/")
    if not path:
        return [f"{where}: {value!r} must be a domain-prefixed path (such as \"acme.io/foo\")"]
    problems = []
    if len(domain) > 253 or not DNS1123_SUBDOMAIN.fullmatch(domain):
        problems.append(f"{where}: {domain!r} is not a DNS-1123 subdomain")
    if not PATH_CHARS.fullmatch(path):
        problems.append(f"{where}: {path!r} has characters a path may not have")
    return problems


def _pod_spec(replicated_job: dict[str, Any]) -> dict[str, Any]:
    return (((replicated_job.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec") or {}


def _ancestor(replicated_job: dict[str, Any]) -> str | None:
    return (((replicated_job.get("template") or {}).get("metadata") or {}).get("labels") or {}).get(ANCESTOR_LABEL)


def runtime_problems(runtime: dict[str, Any]) -> list[str]:
    spec = runtime.get("spec") or {}
    problems = []
    sources = [s for s in ML_POLICY_SOURCES if s in (spec.get("mlPolicy") or {})]
    if len(sources) > 1:
        problems.append(f"spec.mlPolicy: only one of the policy can be configured, got {sources}")
    jobset = (spec.get("template") or {}).get("spec") or {}
    order = (jobset.get("startupPolicy") or {}).get("startupPolicyOrder")
    if order == "InOrder" and any(j.get("dependsOn") for j in jobset.get("replicatedJobs") or []):
        problems.append("spec.template.spec: StartupPolicy and DependsOn APIs are mutually exclusive")
    for i, job in enumerate(jobset.get("replicatedJobs") or []):
        ancestor = _ancestor(job)
        if ancestor in ANCESTOR_CONTAINERS:
            if job.get("replicas", 1) != 1:
                problems.append(f"spec.template.spec.replicatedJobs[{i}].replicas: always must be 1")
            names = {c.get("name") for c in _pod_spec(job).get("containers") or []}
            if ANCESTOR_CONTAINERS[ancestor] not in names:
                problems.append(f"spec.template.spec.replicatedJobs[{i}]: must contain the required container "
                                f"for the ancestor: {ancestor}")
    if not any(_ancestor(j) == "trainer" for j in jobset.get("replicatedJobs") or []):
        problems.append("spec.template.spec.replicatedJobs: no job is the trainer ancestor (TrainJob.spec.trainer "
                        "would go nowhere)")
    return problems + jobset_spec_problems(jobset, name=None)


def jobset_spec_problems(spec: dict[str, Any], name: str | None) -> list[str]:
    """The JobSet webhook's create checks; the name ones only when the JobSet's `name` is known."""
    problems = []
    jobs = spec.get("replicatedJobs") or []
    if jobs and jobs[0].get("dependsOn"):
        problems.append("DependsOn can't be set for the first ReplicatedJob")
    seen: set[str] = set()
    for job in jobs:
        seen.add(job["name"])
        for dependency in job.get("dependsOn") or []:
            if dependency["name"] not in seen:
                problems.append(f"replicatedJob: {job['name']} cannot depend on replicatedJob: {dependency['name']}")
        if name is None:
            continue
        replicas = job.get("replicas", 1)
        problems += dns1035_label_problems(f"{name}-{job['name']}-{replicas - 1}", "job name")
        job_spec = (job.get("template") or {}).get("spec") or {}
        if job_spec.get("completionMode") == "Indexed" and job_spec.get("completions") is not None:
            pod = f"{name}-{job['name']}-{replicas - 1}-{job_spec['completions'] - 1}-abcde"
            if len(pod) > 63 or not RFC1035.fullmatch(pod):
                problems.append("JobSet name is too long, pod names generated for this JobSet will exceed 63 characters")
    for target in (spec.get("successPolicy") or {}).get("targetReplicatedJobs") or []:
        if target not in seen:
            problems.append(f"invalid replicatedJob name '{target}' does not appear in .spec.ReplicatedJobs")
    return problems


def trainjob_node_counts(job: dict[str, Any], runtime: dict[str, Any]) -> dict[str, int]:
    """Pods per replicated job of the JobSet the Trainer builds (TR torch.go/mpi.go EnforceMLPolicy,
    trainingruntime.go L186-196)."""
    policy = runtime["spec"].get("mlPolicy") or {}
    trainer = job["spec"].get("trainer") or {}
    num_nodes = trainer.get("numNodes", policy.get("numNodes", 1))
    counts = {}
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        count = ((rjob.get("template") or {}).get("spec") or {}).get("parallelism", 1)
        if _ancestor(rjob) == "trainer":
            count = num_nodes if "torch" in policy else policy.get("numNodes", 1)
        if "mpi" in policy and rjob["name"] == "node":
            count = max(num_nodes - 1, 1) if policy["mpi"].get("runLauncherAsNode") else num_nodes
        counts[rjob["name"]] = count
    return counts


def trainjob_problems(job: dict[str, Any], runtimes: dict[str, dict[str, Any]]) -> list[str]:
    metadata, spec = job.get("metadata") or {}, job.get("spec") or {}
    name = metadata.get("name", "")
    problems = dns1035_label_problems(name, "metadata.name")
    if "managedBy" in spec and spec["managedBy"] not in MANAGED_BY:
        problems.append(f"spec.managedBy: {spec['managedBy']!r} is not one of {sorted(MANAGED_BY)}")
    ref = spec.get("runtimeRef") or {}
    kind = ref.get("kind", "ClusterTrainingRuntime")
    if kind not in RUNTIME_KINDS or ref.get("apiGroup", "trainer.kubeflow.org") != "trainer.kubeflow.org":
        return problems + [f"spec.runtimeRef: unsupported runtime: {kind}.{ref.get('apiGroup')}"]
    runtime = runtimes.get(ref.get("name"))
    if runtime is None or runtime.get("kind") != kind:
        return problems + [f"spec.runtimeRef: {kind} {ref.get('name')!r} must be created before the TrainJob"]
    policy = runtime["spec"].get("mlPolicy") or {}
    trainer = spec.get("trainer") or {}
    reserved = (TORCH_RESERVED_ENV if "torch" in policy else set()) | (MPI_RESERVED_ENV if "mpi" in policy else set())
    bad_env = sorted({e["name"] for e in trainer.get("env") or []} & reserved)
    if bad_env:
        problems.append(f"spec.trainer.env: must not have reserved envs, invalid envs configured: {bad_env}")
    for key in ("numNodes", "numProcPerNode"):
        if isinstance(trainer.get(key), int) and trainer[key] < 1:  # a string is the schema's to report
            problems.append(f"spec.trainer.{key}: {trainer[key]} must be at least 1")
    runtime_jobs = {j["name"]: j for j in runtime["spec"]["template"]["spec"]["replicatedJobs"]}
    if "mpi" in policy and policy["mpi"].get("runLauncherAsNode") and trainer.get("numNodes", 1) >= 2:
        if not {"launcher", "node"} <= set(runtime_jobs):
            problems.append("spec.trainer.numNodes: must have 1 when MPI trainingRuntime with enabled runLauncherAsNode "
                            "does not have either launcher and node")
    patches = spec.get("runtimePatches") or []
    if len({p.get("manager") for p in patches}) != len(patches):
        problems.append("spec.runtimePatches: managers must be unique (a list map keyed by manager)")
    for patch in patches:
        problems += domain_prefixed_path_problems(patch.get("manager", ""), "spec.runtimePatches[].manager")
        template = ((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}
        for rjob in template.get("replicatedJobs") or []:
            if rjob["name"] not in runtime_jobs:
                problems.append(f"spec.runtimePatches: must not have replicated job {rjob['name']!r} that doesn't "
                                "exist in the runtime job template")
                continue
            containers = {c["name"] for c in _pod_spec(runtime_jobs[rjob["name"]]).get("containers") or []}
            init = {c["name"] for c in _pod_spec(runtime_jobs[rjob["name"]]).get("initContainers") or []}
            pod = _pod_spec(rjob)
            for container in pod.get("containers") or []:
                if container["name"] not in containers:
                    problems.append(f"spec.runtimePatches: must not have container {container['name']!r} that "
                                    f"doesn't exist in the runtime job {rjob['name']}")
                elif container.get("env") and container["name"] in NO_PATCHED_ENV:
                    problems.append("spec.runtimePatches: must not have envs for the dataset-initializer, "
                                    "model-initializer, node containers")
            for container in pod.get("initContainers") or []:
                if container["name"] not in init:
                    problems.append(f"spec.runtimePatches: must not have initContainer {container['name']!r} that "
                                    f"doesn't exist in the runtime job {rjob['name']}")
    # The JobSet it becomes (named like the TrainJob) must pass JobSet's webhook, or reconciling fails.
    counts = trainjob_node_counts(job, runtime)
    for rjob_name, count in counts.items():
        longest = f"{name}-{rjob_name}-0-{count - 1}-abcde"
        if len(longest) > 63:
            problems.append(f"metadata.name: the JobSet's pod {longest!r} would be longer than 63 characters")
    return problems


def trainer_v2_problems(obj: dict[str, Any], runtimes: dict[str, dict[str, Any]] | None = None) -> list[str]:
    kind = obj.get("kind")
    if kind == "TrainJob":
        if runtimes is None:
            from gpt2bench.render.runtimes import project_runtimes

            runtimes = project_runtimes()
        return trainjob_problems(obj, runtimes)
    if kind in RUNTIME_KINDS:
        return runtime_problems(obj)
    if kind == "JobSet":
        return jobset_spec_problems(obj.get("spec") or {}, (obj.get("metadata") or {}).get("name", ""))
    return [f"not a Trainer v2 kind: {kind}"]


# Pod Security Standards "restricted" (PSA v0.36.2 policy/check_*.go; notes §12), on a pod's spec.
RESTRICTED_VOLUMES = {"configMap", "downwardAPI", "emptyDir", "projected", "secret", "csi", "persistentVolumeClaim",
                      "ephemeral", "image"}


def restricted_problems(pod: dict[str, Any]) -> list[str]:
    """Why the pod would be rejected by a namespace enforcing Pod Security "restricted"."""
    problems = []
    pod_context = pod.get("securityContext") or {}
    containers = [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(flag):
            problems.append(f"{flag} is set")
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            problems.append(f"volume {volume['name']} uses {sorted(kinds - RESTRICTED_VOLUMES)}")
    if pod_context.get("runAsUser") == 0:
        problems.append("pod runAsUser is 0")
    pod_non_root = pod_context.get("runAsNonRoot") is True
    pod_seccomp = (pod_context.get("seccompProfile") or {}).get("type")
    if pod_seccomp == "Unconfined":
        problems.append("pod seccompProfile is Unconfined")
    for container in containers:
        where = f"container {container['name']}"
        context = container.get("securityContext") or {}
        if context.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}: allowPrivilegeEscalation must be false")
        capabilities = context.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            problems.append(f"{where}: capabilities must drop ALL")
        if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            problems.append(f"{where}: adds capabilities {capabilities['add']}")
        if context.get("privileged"):
            problems.append(f"{where}: privileged")
        if context.get("runAsNonRoot") is False or not (pod_non_root or context.get("runAsNonRoot") is True):
            problems.append(f"{where}: runAsNonRoot must be true (pod or container)")
        if context.get("runAsUser") == 0:
            problems.append(f"{where}: runAsUser is 0")
        seccomp = (context.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{where}: seccompProfile must be RuntimeDefault or Localhost (pod or container)")
        if any(port.get("hostPort") for port in container.get("ports") or []):
            problems.append(f"{where}: hostPort")
    return problems
