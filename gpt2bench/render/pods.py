"""What every rendered pod shares: labels, the trainer container's env, volumes, ports, resources,
scheduling, security, and the run policy of the Kubeflow job around it. `run_pods` builds it once per run
(`RunPods`), and each renderer (pytorchjob, mpijob, trainjob) writes its job from it in one pass.

Every pod meets the Pod Security Standards' "restricted" profile: it runs as the image's non-root user
with the runtime's default seccomp profile, every container drops all capabilities and cannot escalate
privileges, and no service-account token is mounted (the trainer never talks to the API server). Beyond
"restricted": a read-only root filesystem, and bounded memory (docs/security.md).
"""

from __future__ import annotations

import copy
import hashlib
import math
from dataclasses import dataclass
from typing import Any

from gpt2bench.conventions import (
    BENCHMARK_LABEL,
    COMPONENT_LABEL,
    FABRIC_ENV,
    GPUDIRECT_RDMA_ENV,
    KUEUE_QUEUE_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NCCL_ENV_SCRIPT_ENV,
    NODE_NAME_ENV,
    OUTPUT_DIR,
    OUTPUT_ENV,
    POD_CPUS_ENV,
    PRECISION_LABEL,
    ROLE_LABEL,
    RUN_LABEL,
    STRATEGY_LABEL,
    TRAINER_HOME,
    TRAINER_ROLE,
)
from gpt2bench.plan import Run
from gpt2bench.specification.kubesyntax import quantity_value
from gpt2bench.specification.model import Benchmark
from gpt2bench.specification.pods import PodsSpec, VolumeSpec


def label_value(text: str) -> str:
    """Label values are <= 63 chars; long ones keep a prefix and a hash of the whole."""
    if len(text) <= 63:
        return text
    return f"{text[:54].rstrip('-._')}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def job_labels(benchmark: Benchmark, run: Run) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "gpt2bench",
        COMPONENT_LABEL: "run",
        MANAGED_BY_LABEL: MANAGED_BY,
        BENCHMARK_LABEL: label_value(benchmark.name),
        RUN_LABEL: run.name,
        STRATEGY_LABEL: run.strategy.name,
        PRECISION_LABEL: run.precision,
    }


def job_metadata(benchmark: Benchmark, run: Run) -> dict[str, Any]:
    """The job's metadata: the user's labels and annotations (spec.jobMetadata), then the run's labels."""
    extra = benchmark.spec.job_metadata
    labels = {**extra.labels, **job_labels(benchmark, run)}
    if benchmark.spec.scheduling.kueue_queue:
        labels[KUEUE_QUEUE_LABEL] = benchmark.spec.scheduling.kueue_queue
    # No ownerReferences: ownership is the operator's (kopf.adopt); a rendered job for GitOps has no owner.
    metadata: dict[str, Any] = {"name": run.name, "namespace": benchmark.namespace, "labels": labels}
    if extra.annotations:
        metadata["annotations"] = dict(extra.annotations)
    return metadata


def run_policy(benchmark: Benchmark, min_available: int) -> dict[str, Any]:
    spec = benchmark.spec
    policy: dict[str, Any] = {
        "backoffLimit": spec.run_policy.backoff_limit,
        # Keep finished pods (their termination message holds the results); stop stragglers.
        "cleanPodPolicy": "Running",
    }
    if spec.run_policy.active_deadline_seconds is not None:
        policy["activeDeadlineSeconds"] = spec.run_policy.active_deadline_seconds
    if spec.run_policy.ttl_seconds_after_finished is not None:
        policy["ttlSecondsAfterFinished"] = spec.run_policy.ttl_seconds_after_finished
    scheduling = spec.scheduling
    if scheduling.gang or scheduling.queue:
        gang: dict[str, Any] = {"minAvailable": min_available}
        if scheduling.queue:
            gang["queue"] = scheduling.queue
        if scheduling.priority_class_name:
            gang["priorityClass"] = scheduling.priority_class_name
        policy["schedulingPolicy"] = gang
    return policy


# Memory bounds (docs/security.md): a container without a memory limit can take a node's memory. Where the
# spec sets no `resources.limits.memory`, a pod's limit is this much per process it runs (workers and
# parameter servers), or its memory request where that is more. CPU: a gpt2-size model's fp32 weights,
# AdamW state and activations per process, with room; GPU: the host side of a CUDA process (context,
# pinned buffers, the data pipeline). The tiny model takes under 1 GiB per process (README).
DEFAULT_MEMORY_PER_PROCESS = {"cpu": 4, "gpu": 16}  # GiB
# /dev/shm of GPU pods (NCCL's intra-node buffers): a memory-backed emptyDir, bounded per GPU. Its pages
# count against the pod's memory limit.
SHM_PER_GPU = 1  # GiB


def memory_limit(benchmark: Benchmark, gpus: int, processes: int) -> str:
    """The pod's memory limit: the spec's, else the default per process (at least the request)."""
    resources = benchmark.spec.resources
    if "memory" in resources.limits:
        return resources.limits["memory"]
    default = f"{DEFAULT_MEMORY_PER_PROCESS['gpu' if gpus else 'cpu'] * max(processes, 1)}Gi"
    request = resources.requests.get("memory")
    if request is not None and quantity_value(request) > quantity_value(default):
        return request
    return default


def container_resources(benchmark: Benchmark, gpus: int, processes: int) -> dict[str, Any]:
    """A training container's resources: the spec's, its GPUs, and a memory limit always."""
    requests = dict(benchmark.spec.resources.requests)
    limits = {**benchmark.spec.resources.limits, "memory": memory_limit(benchmark, gpus, processes)}
    if gpus:
        # Extended resources: requests must equal limits; set both.
        requests["nvidia.com/gpu"] = gpus
        limits["nvidia.com/gpu"] = gpus
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = requests
    resources["limits"] = limits
    return resources


def budget_env(benchmark: Benchmark) -> dict[str, str]:
    """A training pod's CPU budget in cores (conventions.POD_CPUS_ENV): its CPU limit, else its request, else
    nothing (the trainer then divides what it can see). Every container of the job gets the training pods'
    value, so that an MPI launcher forwards the workers' budget, not its own."""
    resources = benchmark.spec.resources
    cpu = resources.limits.get("cpu", resources.requests.get("cpu"))
    return {} if cpu is None else {POD_CPUS_ENV: format(quantity_value(cpu).normalize(), "f")}


# The output folder (an emptyDir) grows with the steps: worker 0's steps.jsonl record of each step (about 920 B
# measured; at most STEP_RECORD_BYTES: tests/test_trainer_metrics.py) and its step time, spilled for the
# percentiles (8 B), plus what does not grow (the summary, an NCCL log): OUTPUT_BASE_MIB. Its sizeLimit keeps a
# long run (up to 1,000,000 steps: 2 GiB) from filling the node's disk; past it the kubelet evicts the pod,
# which the run's reason then says.
STEP_RECORD_BYTES = 2048
STEP_TIME_BYTES = 8
OUTPUT_BASE_MIB = 256


def output_size_limit(steps: int) -> str:
    """The output emptyDir's sizeLimit for a run of `steps` steps (MiB)."""
    return f"{OUTPUT_BASE_MIB + math.ceil(steps * (STEP_RECORD_BYTES + STEP_TIME_BYTES) / 2**20)}Mi"


# torch.compile's caches (inductor's FX graphs and Triton kernels, which it keeps under its own folder) under
# ~/.cache with the Hugging Face downloads: a volume mounted there (spec.pods.volumes) shares them all.
COMPILE_CACHE_DIR = f"{TRAINER_HOME}/.cache/torchinductor"


def fabric_env(benchmark: Benchmark) -> dict[str, str]:
    """What the run expects of its fabric (spec.fabric), for the trainer (trainer/fabric.py); nothing where the
    spec keeps the defaults."""
    fabric = benchmark.spec.fabric
    env = {FABRIC_ENV: fabric.require} if fabric.require != "auto" else {}
    if fabric.expects_gpudirect({item.name: item.value for item in benchmark.spec.pods.env}):
        env[GPUDIRECT_RDMA_ENV] = "1"
    if fabric.nccl_env_script:
        env[NCCL_ENV_SCRIPT_ENV] = fabric.nccl_env_script
    return env


def forwarded_env(benchmark: Benchmark) -> list[str]:
    """The names mpirun forwards to every rank beyond the project's own: the fabric's settings, then the user's
    (spec.pods.env), which NCCL and libfabric read in the ranks."""
    return [*fabric_env(benchmark), *benchmark.spec.pods.env_names]


def container_env(benchmark: Benchmark) -> list[dict[str, Any]]:
    """Every container's env: the output folder, unbuffered output, the node the pod runs on (downward API),
    the compile cache's place, the fabric's expectations, then the user's variables (spec.pods.env) in their
    order."""
    env: list[dict[str, Any]] = [
        {"name": OUTPUT_ENV, "value": OUTPUT_DIR},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": NODE_NAME_ENV, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "TORCHINDUCTOR_CACHE_DIR", "value": COMPILE_CACHE_DIR},
        *({"name": name, "value": value} for name, value in fabric_env(benchmark).items()),
    ]
    return env + [item.model_dump(by_alias=True, exclude_none=True) for item in benchmark.spec.pods.env]


# The root filesystem is read-only (container_security_context); what the trainer, torchrun, mpirun and
# sshd write goes to emptyDirs: /tmp (torchrun's and Open MPI's session files, torch.compile's TMPDIR, sshd's
# pid file) and the image user's caches (Hugging Face, torch inductor under ~/.cache; Triton's ~/.triton).
WRITABLE_PATHS = {"tmp": "/tmp", "cache": f"{TRAINER_HOME}/.cache", "triton": f"{TRAINER_HOME}/.triton"}


def pod_volumes(gpus: int, user: list[VolumeSpec] = (), steps: int = 0) -> tuple[list[dict], list[dict]]:
    """The pod's volumes and the training container's mounts: the output folder (bounded for a run of `steps`
    steps), the writable paths, /dev/shm on GPUs, then the user's (spec.pods.volumes). A user's volume at a cache
    path replaces that emptyDir."""
    replaced = {volume.mount_path.rstrip("/") for volume in user}
    volumes = [{"name": "output", "emptyDir": {"sizeLimit": output_size_limit(steps)}}]
    mounts = [{"name": "output", "mountPath": OUTPUT_DIR}]
    for name, path in WRITABLE_PATHS.items():
        if path in replaced:
            continue
        volumes.append({"name": name, "emptyDir": {}})
        mounts.append({"name": name, "mountPath": path})
    if gpus:  # NCCL needs more shared memory than the container default of 64 MiB
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{SHM_PER_GPU * gpus}Gi"}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    volumes += [volume.volume() for volume in user]
    mounts += [volume.mount() for volume in user]
    return volumes, mounts


def metrics_ports(port: int, processes: int) -> list[dict[str, Any]]:
    """Named ports of a pod's trainer processes: local rank r serves on port + r (named for PodMonitors)."""
    last = min(port + processes - 1, 65535)
    return [
        {"name": "metrics" if p == port else f"metrics-{p - port}", "containerPort": p, "protocol": "TCP"}
        for p in range(port, last + 1)
    ]


def pod_security_context(pods: PodsSpec | None = None) -> dict[str, Any]:
    """Pod level of "restricted": non-root (the image's user, numerically, so the kubelet can check it
    before start), RuntimeDefault seccomp; fsGroup makes mounted volumes writable by that user. The spec may
    leave the ids to the platform (spec.pods.runAsUser: null, as OpenShift's restricted SCC assigns them);
    without a spec (the Trainer v2 runtimes, which each TrainJob's patch completes) none is set."""
    ids = {} if pods is None else {"runAsUser": pods.run_as_user, "runAsGroup": pods.run_as_group,
                                   "fsGroup": pods.fs_group}
    return {"runAsNonRoot": True, **{key: value for key, value in ids.items() if value is not None},
            "seccompProfile": {"type": "RuntimeDefault"}}


def container_security_context(capabilities: list[str] = ()) -> dict[str, Any]:
    """Container level of "restricted": no privilege escalation, every capability dropped; and a read-only
    root filesystem (the writable paths are emptyDirs: pod_volumes). A fabric's capabilities (spec.pods.
    capabilities, e.g. IPC_LOCK) are added back on request, which leaves "restricted" (docs/security.md)."""
    dropped: dict[str, Any] = {"drop": ["ALL"]}
    if capabilities:
        dropped["add"] = list(capabilities)
    return {"allowPrivilegeEscalation": False, "privileged": False, "readOnlyRootFilesystem": True,
            "capabilities": dropped}


# The pod annotations that attach the fabric's networks (Multus; GKE's multi-networking): a pod that trains nothing
# (an MPIJob's launcher, which only runs mpirun and ssh over the pod network) does not take them, nor the fabric's
# capabilities and the GPU nodes' selector: it would hold a fabric interface, need a privileged namespace for
# IPC_LOCK, and wait for room on a GPU node for nothing.
FABRIC_NETWORK_ANNOTATIONS = ("k8s.v1.cni.cncf.io/networks", "networking.gke.io/interfaces",
                              "networking.gke.io/default-interface")

# Where a run's training pods must not meet: one node each, so that an N-node run measures N machines.
HOSTNAME_TOPOLOGY = "kubernetes.io/hostname"


def pod_affinity(benchmark: Benchmark, run: Run, trains: bool) -> dict[str, Any] | None:
    """The user's affinity (spec.affinity), plus, for a training pod of a run of several nodes, a required
    anti-affinity to the run's other training pods on kubernetes.io/hostname (spec.scheduling.
    spreadAcrossNodes). Required, not preferred: a "2-node" run on one node answers another question; a
    pod anti-affinity, not a topology spread constraint: a TrainJob's runtimePatch can carry affinity only.
    A pod that trains nothing (an MPIJob's launcher) does not take the node affinity, which picks GPU nodes."""
    spec = benchmark.spec
    affinity = spec.affinity.rendered() if spec.affinity else {}
    if not trains:
        affinity.pop("nodeAffinity", None)
    if trains and run.nodes > 1 and spec.scheduling.spread_across_nodes:
        term = {"labelSelector": {"matchLabels": {BENCHMARK_LABEL: label_value(benchmark.name), RUN_LABEL: run.name,
                                                  ROLE_LABEL: TRAINER_ROLE}},
                "topologyKey": HOSTNAME_TOPOLOGY}
        anti = affinity.setdefault("podAntiAffinity", {})
        anti.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(term)
    return affinity or None


def restart_policy(benchmark: Benchmark) -> str:
    # backoffLimit counts container restarts; with none allowed, a failed pod fails the job at once.
    return "OnFailure" if benchmark.spec.run_policy.backoff_limit else "Never"


def run_pods(benchmark: Benchmark, run: Run) -> RunPods:
    """What every pod of the run shares, built once: a renderer (pytorchjob, mpijob, trainjob) takes it and
    writes its job in one pass, adding only its kind's parts."""
    return RunPods(
        benchmark=benchmark,
        run=run,
        metadata=job_metadata(benchmark, run),
        labels=job_labels(benchmark, run),
        image=benchmark.spec.trainer_image(gpus=run.devices_per_node > 0),
        env=container_env(benchmark),
        budget=[{"name": name, "value": value} for name, value in budget_env(benchmark).items()],
        resources=container_resources(benchmark, run.devices_per_node, run.procs_per_node),
        restart_policy=restart_policy(benchmark),
    )


@dataclass(frozen=True)
class RunPods:
    """The shared pod template of one run (run_pods): the job's metadata, the run's labels, the trainer image,
    the env every container starts with and the pods' CPU budget, a training container's resources, the
    restart policy; `template` gives each kind of pod from it, `run_policy` the Kubeflow v1 run policy."""

    benchmark: Benchmark
    run: Run
    metadata: dict[str, Any]  # the job's: name, namespace, the run's labels (and Kueue's queue label)
    labels: dict[str, str]  # the run's (job_labels)
    image: str
    env: list[dict[str, Any]]  # what every container's env starts with (container_env)
    budget: list[dict[str, str]]  # the pods' CPU budget (budget_env), after each container's own env
    resources: dict[str, Any]  # a training container's: on the run's GPUs per node, for its processes
    restart_policy: str

    def run_policy(self, min_available: int) -> dict[str, Any]:
        return run_policy(self.benchmark, min_available)

    def template(
        self,
        container: dict[str, Any],
        *,
        gpus: int | None = None,
        serves_metrics: bool = True,
        resources: dict[str, Any] | None = None,
        trains: bool = True,
    ) -> dict[str, Any]:
        """A pod template around `container` (its name and own fields: command, env, ports, probes); `gpus`:
        the pod's (default: the run's per node); `resources`: instead of a training container's; `trains`:
        False for a pod that runs no rank (an MPIJob's launcher: not spread, not labelled a trainer)."""
        spec, run, pods = self.benchmark.spec, self.run, self.benchmark.spec.pods
        gpus = run.devices_per_node if gpus is None else gpus
        labels = {**spec.metrics.pod_labels, **pods.labels, **self.labels}
        if trains:
            labels[ROLE_LABEL] = TRAINER_ROLE
        annotations = {**spec.metrics.pod_annotations, **pods.annotations}
        if not trains:
            annotations = {key: value for key, value in annotations.items() if key not in FABRIC_NETWORK_ANNOTATIONS}
        volumes, mounts = pod_volumes(gpus, pods.volumes, spec.training.steps)
        container = {
            "name": container["name"],
            "image": self.image,
            "imagePullPolicy": spec.image_pull_policy,
            "securityContext": container_security_context(pods.capabilities if trains else ()),
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "volumeMounts": mounts,
            **copy.deepcopy(container),
        }
        if serves_metrics:
            container.setdefault("ports", []).extend(metrics_ports(spec.metrics.port, run.procs_per_node))
            if spec.metrics.scrape_annotations:
                annotations.update(
                    {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(spec.metrics.port),
                        "prometheus.io/path": "/metrics",
                    }
                )
        if self.budget:
            container["env"] = [*container.get("env", []), *copy.deepcopy(self.budget)]
        container["resources"] = (
            container_resources(self.benchmark, gpus, run.procs_per_node) if resources is None else resources
        )
        claims = pods.resource_claims if trains else []  # dynamic resource allocation: the fabric's devices
        if claims:
            container["resources"] = {**container["resources"], "claims": [{"name": c.name} for c in claims]}
        pod_spec: dict[str, Any] = {
            "containers": [container],
            "volumes": volumes,
            "securityContext": pod_security_context(pods),
            "automountServiceAccountToken": False,
        }
        if claims:
            pod_spec["resourceClaims"] = [claim.pod_claim() for claim in claims]
        if pods.service_account_name:
            pod_spec["serviceAccountName"] = pods.service_account_name
        if pods.image_pull_secrets:
            pod_spec["imagePullSecrets"] = [{"name": name} for name in pods.image_pull_secrets]
        if pods.host_network:
            # the cluster's DNS still resolves the job's Services (rendezvous, MPI hosts)
            pod_spec.update(hostNetwork=True, dnsPolicy="ClusterFirstWithHostNet")
        if spec.node_selector and trains:
            pod_spec["nodeSelector"] = dict(spec.node_selector)
        if affinity := pod_affinity(self.benchmark, run, trains):
            pod_spec["affinity"] = affinity
        if spec.tolerations:
            pod_spec["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in spec.tolerations]
        if spec.scheduling.priority_class_name:
            pod_spec["priorityClassName"] = spec.scheduling.priority_class_name
        metadata: dict[str, Any] = {"labels": labels}
        if annotations:
            metadata["annotations"] = annotations
        return {"metadata": metadata, "spec": pod_spec}
