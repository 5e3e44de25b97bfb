"""The project's own Kubeflow Trainer v2 runtimes: what every rendered TrainJob points at.

Four ClusterTrainingRuntimes (cluster-scoped, so every namespace's TrainJobs can use them):

- `gpt2bench-torch` (every strategy but horovod): `mlPolicy.torch`, one replicated job `node` whose Job
  template carries `trainer.kubeflow.org/trainjob-ancestor-step: trainer`, so the TrainJob's image,
  command, env and resources land in its container `node`, and the torch plugin injects PET_* there
  (TR torch.go). Like upstream's `torch-distributed`, plus what upstream leaves out and a TrainJob
  cannot patch: restartPolicy Never with backoffLimit 0 (a failed trainer fails the run at once, the
  spec's default), the termination-message policy the collector relies on, the `metrics` port, and
  Pod Security "restricted".
- `gpt2bench-mpi` (horovod on CPUs, 2 nodes or more) and `gpt2bench-mpi-cuda` (on GPUs): `mlPolicy.mpi`
  with OpenMPI and a non-root sshd on port 2222, shaped like upstream's `deepspeed-distributed`: sshd
  `node`s, then the `launcher` (the trainer ancestor, container also named `node`, as the MPI plugin only
  touches containers of that name) once they are Ready. `runLauncherAsNode: true`, as upstream: only then
  do the `node` pods get `resourcesPerNode` (their GPUs) and `trainer.env` (TR trainingruntime.go
  L199-237, builder.go L142-155); the plugin then makes max(numNodes - 1, 1) `node` pods and lists the
  launcher in the hostfile too, so an N-node run is N pods that all train. The sshd pods run the runtime's
  image (a TrainJob cannot change it), hence one runtime per trainer image: the CPU one and the CUDA one.
- `gpt2bench-mpi-one-node` (horovod on one node): the launcher alone, as the node (`runLauncherAsNode`):
  with a `node` job too, the plugin would still make one `node` pod, and a 1 x 4 run would hold 8 GPUs
  with 4 of them idle. mpirun starts every rank in the launcher's own pod (the hostfile names it), whose
  image is the TrainJob's.

The image is ours (the one Dockerfile: gpt2bench, torchrun, mpirun, sshd with
/home/gpt2bench/.sshd_config on port 2222). Each runtime says which trainer image its pods run
(`IMAGE_LABEL`: cpu or gpu), so the Helm chart sets its `trainerImage` values there (templates/
trainer-runtimes.yaml), and a gang-scheduling `podGroupPolicy` (coscheduling or Volcano) when the chart's
`trainerRuntimes.podGroupPolicy` says so. These builders are the data the chart and manifests/ ship;
tests validate them against the upstream CRDs.

A benchmark with resource claims (spec.pods.resourceClaims) gets its own namespaced TrainingRuntime instead
(`with_claims`, rendered by render/trainjob.py's `claims_runtime`): a TrainJob can say neither the claims nor
its container's use of them (Trainer v2.3's runtimePatches have no resourceClaims, and resourcesPerNode's
claims are dropped), a runtime can.
"""

from __future__ import annotations

import copy
from typing import Any

from gpt2bench.conventions import GANG_ANNOTATION, SSH_PORT, TRAINJOB_API, TRAINJOB_CONTAINER, VOLCANO_QUEUE_ANNOTATION
from gpt2bench.jobkinds import LAUNCHER_JOB, NODE_JOB
from gpt2bench.render.mpijob import SSH_AUTH_MOUNT_PATH, SSHD_COMMAND
from gpt2bench.render.pods import container_security_context, pod_security_context
from gpt2bench.specification.model import DEFAULT_GPU_IMAGE, DEFAULT_IMAGE, MetricsSpec
from gpt2bench.strategies import traits

TORCH_RUNTIME = "gpt2bench-torch"
MPI_RUNTIME = "gpt2bench-mpi"
MPI_GPU_RUNTIME = "gpt2bench-mpi-cuda"
MPI_ONE_NODE_RUNTIME = "gpt2bench-mpi-one-node"
IMAGE_LABEL = "gpt2bench.io/trainer-image"  # cpu | gpu: which of the chart's trainer images the runtime's pods run
RUNTIME_KIND = "ClusterTrainingRuntime"
RUNTIME_PLURAL = "clustertrainingruntimes"
# A benchmark's own runtime in its namespace (claims_runtime): what a TrainJob with resource claims names.
NAMESPACED_RUNTIME_KIND = "TrainingRuntime"
NAMESPACED_RUNTIME_PLURAL = "trainingruntimes"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"  # TR constants.go L36-41
FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"  # how upstream's runtimes say what they run
RUNTIME_IMAGE_PULL_POLICY = "IfNotPresent"
RUNTIME_METRICS_PORT = MetricsSpec.model_fields["port"].default  # the trainer's default, 9400
# Non-root sshd, as in the Dockerfile (and mpi-operator's base image, which Trainer's runtimes reuse).
# (SSH_PORT, SSH_AUTH_MOUNT_PATH and SSHD_COMMAND are the MPIJob's: gpt2bench.conventions, render/mpijob.py.)


def _container(image: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": TRAINJOB_CONTAINER,
        "image": image,
        "imagePullPolicy": RUNTIME_IMAGE_PULL_POLICY,
        **extra,
        # The collector reads the summary from the termination message, or the log tail when it is empty.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security_context(),
    }


def _metrics_port() -> dict[str, Any]:
    # A PodMonitor scrapes the port named `metrics` (local rank 0's); ports cannot be patched per TrainJob.
    return {"name": "metrics", "containerPort": RUNTIME_METRICS_PORT, "protocol": "TCP"}


def _replicated_job(name: str, container: dict[str, Any], *, trainer: bool, **extra: Any) -> dict[str, Any]:
    template: dict[str, Any] = {
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "securityContext": pod_security_context(),
                    "automountServiceAccountToken": False,  # a runtimePatch cannot say it: the runtime does
                    "containers": [container],
                }
            },
        }
    }
    if trainer:
        template["metadata"] = {"labels": {ANCESTOR_LABEL: "trainer"}}
    return {"name": name, **extra, "template": template}


# The scheduler that enforces each podGroupPolicy: Trainer v2.3 creates the PodGroup but leaves the pods'
# schedulerName alone, so without it the default scheduler binds them one by one and a gang is not one.
# scheduler-plugins installs coscheduling as a second scheduler of this name (its as-a-second-scheduler chart);
# Volcano's scheduler is `volcano`. The chart's trainerRuntimes.schedulerName overrides it.
GANG_SCHEDULERS = {"coscheduling": "scheduler-plugins-scheduler", "volcano": "volcano"}
DEFAULT_SCHEDULER = "default-scheduler"


def gang_scheduler_name(pod_group_policy: dict[str, Any] | None) -> str | None:
    """The scheduler a podGroupPolicy needs its pods to name (None without a policy)."""
    return next((GANG_SCHEDULERS[key] for key in (pod_group_policy or {}) if key in GANG_SCHEDULERS), None)


def _pod_specs(runtime: dict[str, Any]) -> list[dict[str, Any]]:
    return [job["template"]["spec"]["template"]["spec"] for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]]


def _runtime(name: str, framework: str, device: str, ml_policy: dict[str, Any], jobset_spec: dict[str, Any],
             pod_group_policy: dict[str, Any] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"mlPolicy": ml_policy}
    if pod_group_policy:
        spec["podGroupPolicy"] = pod_group_policy
        for job in jobset_spec["replicatedJobs"]:
            job["template"]["spec"]["template"]["spec"]["schedulerName"] = gang_scheduler_name(pod_group_policy)
    return {
        "apiVersion": TRAINJOB_API,
        "kind": RUNTIME_KIND,
        "metadata": {
            "name": name,
            "labels": {
                FRAMEWORK_LABEL: framework,
                "app.kubernetes.io/name": "gpt2bench",
                "app.kubernetes.io/component": "training-runtime",
                IMAGE_LABEL: device,
            },
        },
        "spec": {**spec, "template": {"spec": jobset_spec}},
    }


def torch_runtime(image: str = DEFAULT_IMAGE, pod_group_policy: dict[str, Any] | None = None) -> dict[str, Any]:
    """`gpt2bench-torch`: the trainer's image/command come from each TrainJob; `image` is a placeholder
    the Trainer replaces (builder.go L113-141)."""
    node = _replicated_job(NODE_JOB, _container(image, ports=[_metrics_port()]), trainer=True)
    return _runtime(TORCH_RUNTIME, "torch", "cpu", {"numNodes": 1, "torch": {}}, {"replicatedJobs": [node]},
                    pod_group_policy)


def _mpi_policy() -> dict[str, Any]:
    return {
        "numNodes": 1,
        "mpi": {
            "numProcPerNode": 1,
            "mpiImplementation": "OpenMPI",
            "sshAuthMountPath": SSH_AUTH_MOUNT_PATH,
            "runLauncherAsNode": True,
        },
    }


def mpi_runtime(image: str = DEFAULT_IMAGE, name: str = MPI_RUNTIME, device: str = "cpu",
                pod_group_policy: dict[str, Any] | None = None) -> dict[str, Any]:
    """`gpt2bench-mpi` (`gpt2bench-mpi-cuda` with the GPU image): `image` runs the sshd `node` pods, where
    horovod's ranks run; a TrainJob cannot change it, so it must be the image the TrainJobs name
    (runtime_problems checks)."""
    sshd = _container(
        image,
        command=SSHD_COMMAND[:1],
        args=SSHD_COMMAND[1:],
        ports=[{"name": "ssh", "containerPort": SSH_PORT, "protocol": "TCP"}, _metrics_port()],
        readinessProbe={"tcpSocket": {"port": SSH_PORT}, "initialDelaySeconds": 1, "periodSeconds": 2},
    )
    nodes = _replicated_job(NODE_JOB, sshd, trainer=False)
    # mpirun needs every sshd listening: without a gang, JobSet starts the launcher once the `node` pods are Ready.
    # With one, the launcher must exist from the start: the Trainer's PodGroup counts every pod (minMember, TR
    # coscheduling.go / volcano.go Build), and a launcher held back by dependsOn would never join the gang that
    # waits for it; the launcher then waits for the sshd pods itself (`gpt2bench launch --wait-seconds`).
    waits = {} if pod_group_policy else {"dependsOn": [{"name": NODE_JOB, "status": "Ready"}]}
    launcher = _replicated_job(LAUNCHER_JOB, _container(image, ports=[_metrics_port()]), trainer=True, **waits)
    jobset = {
        # Ranks resolve every host in the hostfile, the launcher's own too, before any pod is Ready.
        "network": {"publishNotReadyAddresses": True},
        # Done when mpirun is; the sshd `node` Job is then deleted by JobSet (JS jobset_controller.go L162-176).
        "successPolicy": {"operator": "All", "targetReplicatedJobs": [LAUNCHER_JOB]},
        "replicatedJobs": [nodes, launcher],
    }
    return _runtime(name, "horovod", device, _mpi_policy(), jobset, pod_group_policy)


def mpi_one_node_runtime(image: str = DEFAULT_IMAGE, pod_group_policy: dict[str, Any] | None = None
                         ) -> dict[str, Any]:
    """`gpt2bench-mpi-one-node`: the launcher alone runs mpirun and every rank (its image is the TrainJob's,
    `image` a placeholder); no sshd pod, so no GPU is held by a pod that trains nothing."""
    launcher = _replicated_job(LAUNCHER_JOB, _container(image, ports=[_metrics_port()]), trainer=True)
    jobset = {"network": {"publishNotReadyAddresses": True}, "replicatedJobs": [launcher]}
    return _runtime(MPI_ONE_NODE_RUNTIME, "horovod", "cpu", _mpi_policy(), jobset, pod_group_policy)


def project_runtimes(image: str = DEFAULT_IMAGE, gpu_image: str = DEFAULT_GPU_IMAGE,
                     pod_group_policy: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Every runtime the project ships, by name: `image` (CPU) and `gpu_image` (CUDA) are what their pods run
    where a TrainJob cannot say (the MPI runtimes' sshd pods); `pod_group_policy` gang-schedules them all."""
    runtimes = (
        torch_runtime(image, pod_group_policy),
        mpi_runtime(image, pod_group_policy=pod_group_policy),
        mpi_runtime(gpu_image, MPI_GPU_RUNTIME, "gpu", pod_group_policy),
        mpi_one_node_runtime(image, pod_group_policy),
    )
    return {runtime["metadata"]["name"]: runtime for runtime in runtimes}


def runtime_for(strategy: str, nodes: int, gpus: bool) -> str:
    """The runtime a run's TrainJob names: torch for every strategy but horovod; horovod on one node runs in
    its launcher alone, on several in sshd pods of the run's image (CPU or CUDA)."""
    if traits(strategy).launcher != "mpirun":
        return TORCH_RUNTIME
    if nodes == 1:
        return MPI_ONE_NODE_RUNTIME
    return MPI_GPU_RUNTIME if gpus else MPI_RUNTIME


def spec_pod_group_policy(gang: bool, queue: str | None, schedule_timeout_seconds: int = 60
                          ) -> dict[str, Any] | None:
    """The podGroupPolicy a benchmark's own runtime takes from its spec (spec.scheduling): Volcano for a queue
    (what reads it), coscheduling for a gang, none otherwise; as the chart writes them (templates/
    trainer-runtimes.yaml, scheduleTimeoutSeconds its default)."""
    if queue:
        return {"volcano": {}}
    if gang:
        return {"coscheduling": {"scheduleTimeoutSeconds": schedule_timeout_seconds}}
    return None


def training_replicated_jobs(runtime: dict[str, Any]) -> list[str]:
    """The runtime's replicated jobs whose pods run ranks: every one of a torch runtime; of an MPI runtime the sshd
    `node` pods, and the launcher too with runLauncherAsNode (its hostfile names it: mpirun starts ranks there,
    as in every MPI runtime of the project). A launcher that is no node trains nothing, like an MPIJob's."""
    jobs = [job["name"] for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]]
    mpi = (runtime["spec"].get("mlPolicy") or {}).get("mpi")
    if mpi is not None and not mpi.get("runLauncherAsNode"):
        return [name for name in jobs if name != LAUNCHER_JOB]
    return jobs


def with_claims(runtime: dict[str, Any], resources: dict[str, Any], claims: list[dict[str, Any]]) -> dict[str, Any]:
    """A copy of `runtime` whose training pods (training_replicated_jobs) claim `claims` (pod resourceClaims) and
    whose training container `node` has `resources`, with every claim in its resources.claims.

    The resources are the runtime's, not the TrainJob's: Trainer v2.3 rebuilds the `node` container's resources
    of a trainer job (and of an MPI `node` job with runLauncherAsNode) from limits and requests alone when the
    TrainJob has trainer.resourcesPerNode (TR trainingruntime.go L199-233), which would drop the claims; so a
    TrainJob on this runtime sets none, and the container keeps what the runtime says."""
    runtime = copy.deepcopy(runtime)
    trains = set(training_replicated_jobs(runtime))
    for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        if job["name"] not in trains:
            continue
        pod = job["template"]["spec"]["template"]["spec"]
        pod["resourceClaims"] = copy.deepcopy(claims)
        for container in pod["containers"]:
            if container["name"] == TRAINJOB_CONTAINER:
                container["resources"] = {**copy.deepcopy(resources), "claims": [{"name": c["name"]} for c in claims]}
    return runtime


def replicated_job_containers(runtime: dict[str, Any]) -> dict[str, set[str]]:
    """The runtime's replicated jobs and the containers each has (what a runtimePatch may name)."""
    jobs = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    return {
        job["name"]: {c["name"] for c in job["template"]["spec"]["template"]["spec"].get("containers", [])}
        for job in jobs
    }


def runtime_problems(trainjob: dict[str, Any], runtime: dict[str, Any]) -> list[str]:
    """Why `trainjob` would not work on `runtime` (the installed one, as read from the API): what the
    Trainer's webhook rejects (TR jobset.go L172-209: patched replicated jobs and containers must exist
    in the runtime) and, for MPI, an sshd image other than the trainer's (the ranks run in it)."""
    problems = []
    ref = trainjob["spec"]["runtimeRef"]
    if ref["name"] != runtime["metadata"]["name"]:
        problems.append(f"runtime {runtime['metadata']['name']!r} is not the TrainJob's {ref['name']!r}")
    containers = replicated_job_containers(runtime)
    for patch in trainjob["spec"].get("runtimePatches") or []:
        for job in ((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec", {}).get(
            "replicatedJobs", []
        ):
            if job["name"] not in containers:
                problems.append(f"runtime {ref['name']} has no replicated job {job['name']!r}")
                continue
            pod = ((job.get("template") or {}).get("spec") or {}).get("template", {}).get("spec") or {}
            for container in pod.get("containers", []) + pod.get("initContainers", []):
                if container["name"] not in containers[job["name"]]:
                    problems.append(f"runtime {ref['name']} job {job['name']} has no container {container['name']!r}")
    if "mpi" in runtime["spec"].get("mlPolicy", {}):
        image = trainjob["spec"].get("trainer", {}).get("image")
        for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
            labels = (job["template"].get("metadata") or {}).get("labels") or {}
            for container in job["template"]["spec"]["template"]["spec"]["containers"]:
                if labels.get(ANCESTOR_LABEL) != "trainer" and image and container.get("image") != image:
                    problems.append(
                        f"runtime {ref['name']} runs its {job['name']!r} pods (where the ranks run) from image "
                        f"{container.get('image')!r}, not the TrainJob's {image!r}: install the runtimes with "
                        f"that image (the chart's trainerImage values), or leave spec.image unset"
                    )
    problems += scheduling_problems(trainjob, runtime)
    return problems


def scheduling_problems(trainjob: dict[str, Any], runtime: dict[str, Any]) -> list[str]:
    """What a TrainJob asks of its runtime's gang scheduling (the annotations render/trainjob.py writes) that
    the runtime does not do: gang scheduling needs a podGroupPolicy, a Volcano queue a Volcano one."""
    name = runtime["metadata"]["name"]
    policy = runtime["spec"].get("podGroupPolicy") or {}
    wants_gang = (trainjob["metadata"].get("annotations") or {}).get(GANG_ANNOTATION) == "required"
    queues = [((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("metadata", {}).get(
        "annotations", {}).get(VOLCANO_QUEUE_ANNOTATION) for patch in trainjob["spec"].get("runtimePatches") or []]
    schedulers = {pod.get("schedulerName") or DEFAULT_SCHEDULER for pod in _pod_specs(runtime)}
    problems = []
    if wants_gang and policy and DEFAULT_SCHEDULER in schedulers:
        problems.append(f"spec.scheduling.gang: runtime {name} has a podGroupPolicy ({', '.join(sorted(policy))}) but "
                        f"its pods name no gang scheduler (schedulerName), so the default scheduler would bind them "
                        f"one by one and no gang would be in force: set the pods' schedulerName in the runtime "
                        f"(Helm: trainerRuntimes.schedulerName; {gang_scheduler_name(policy) or 'your scheduler'})")
    if wants_gang and not policy:
        problems.append(f"spec.scheduling.gang: runtime {name} has no podGroupPolicy, so its pods would start one "
                        f"by one: install the runtimes with one (Helm: --set trainerRuntimes.podGroupPolicy=coscheduling "
                        f"or volcano), or set gang: false and let Kueue admit each job whole (spec.scheduling."
                        f"kueueQueue)")
    if any(queues) and "volcano" not in policy:
        problems.append(f"spec.scheduling.queue: runtime {name} does not gang-schedule with Volcano (its "
                        f"podGroupPolicy: {sorted(policy) or 'none'}), which is what reads the queue: install the "
                        f"runtimes with --set trainerRuntimes.podGroupPolicy=volcano, or leave queue unset")
    return problems

