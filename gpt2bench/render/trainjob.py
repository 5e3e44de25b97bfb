"""A run as a Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1) on the project's runtimes.

What goes where (Trainer v2.3.0; notes §1.3):
- `spec.trainer`: image, command, env (our pods' env), numNodes, numProcPerNode, resourcesPerNode.
  The Trainer puts them into the container `node` of the runtime's trainer job; the torch plugin adds
  PET_NNODES/NPROC_PER_NODE/NODE_RANK/MASTER_ADDR/MASTER_PORT, which `torchrun` reads (the plugin does
  not wrap the command, so ours calls torchrun). The MPI plugin writes the hostfile and the OMPI_MCA_*
  env of the launcher, whose `gpt2bench launch -- mpirun ...` keeps the summary.
- `spec.runtimePatches` (one, manager `gpt2bench.io/render`): per replicated job, what our pods share
  (render/pods.py's pod template): labels, annotations, volumes and mounts, nodeSelector, affinity (the
  run's spread across nodes included), tolerations, imagePullSecrets, serviceAccountName, the security
  contexts (a fabric's capabilities included). Patches cannot set env on `node` (webhook: it goes in
  trainer.env), ports, resources, hostNetwork or priorityClassName (the spec refuses the last two with
  backend trainjob); the patch's own metadata carries the Volcano queue (`scheduling.volcano.sh/queue-name`).
- metadata: the user's job labels and annotations (spec.jobMetadata), the run's labels (and Kueue's queue
  label, which Kueue reads from the TrainJob); the annotation naming the replicated job whose pod 0 holds
  the results (gpt2bench.jobkinds), and `gpt2bench.io/gang-scheduling: required` when the spec asks for
  gang scheduling, which the runtime's podGroupPolicy does (runtimes.scheduling_problems: the operator
  refuses the run on a runtime without one).
- `spec.activeDeadlineSeconds`: the run's deadline.
- With resource claims (spec.pods.resourceClaims): `claims_runtime`, the project's runtime for the run as a
  namespaced TrainingRuntime whose training pods claim the devices and whose container `node` uses them, with
  the run's resources (runtimes.with_claims says why they move there); the TrainJob's runtimeRef names it
  (kind TrainingRuntime, resolved in the TrainJob's namespace: TR trainingruntime.go L95) and its trainer has
  no resourcesPerNode. One per benchmark, base runtime and pod shape (its name ends in a hash of its spec),
  shared by the runs that have them alike.

What a TrainJob cannot carry and does not change what is measured is reported by `trainjob_caveats`, not
silently dropped.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from gpt2bench.conventions import (
    BENCHMARK_LABEL,
    COMPONENT_LABEL,
    GANG_ANNOTATION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    RESULT_REPLICATED_JOB_ANNOTATION,
    TRAINJOB_API,
    TRAINJOB_CONTAINER,
    VOLCANO_QUEUE_ANNOTATION,
)
from gpt2bench.jobkinds import LAUNCHER_JOB, NODE_JOB, trainjob_pods
from gpt2bench.plan import MAX_NAME_LENGTH, Run, dns_label, fit_name
from gpt2bench.render.mpijob import launcher_command
from gpt2bench.render.pods import RunPods, container_security_context, label_value, pod_security_context
from gpt2bench.render.runtimes import (
    IMAGE_LABEL,
    MPI_GPU_RUNTIME,
    MPI_RUNTIME,
    NAMESPACED_RUNTIME_KIND,
    RUNTIME_IMAGE_PULL_POLICY,
    RUNTIME_KIND,
    RUNTIME_METRICS_PORT,
    project_runtimes,
    runtime_for,
    spec_pod_group_policy,
    with_claims,
)
from gpt2bench.specification.model import DEFAULT_GPU_IMAGE, DEFAULT_IMAGE, Benchmark
from gpt2bench.strategies import traits

PATCH_MANAGER = "gpt2bench.io/render"  # a runtimePatch's manager must be a domain-prefixed path (webhook)
# What a runtimePatch may set on a pod and on a container (the TrainJob CRD's PodSpecPatch/ContainerPatch).
POD_PATCH_FIELDS = ("serviceAccountName", "volumes", "initContainers", "imagePullSecrets", "securityContext",
                    "nodeSelector", "affinity", "tolerations", "schedulingGates", "terminationGracePeriodSeconds")
CONTAINER_PATCH_FIELDS = ("volumeMounts", "securityContext")
# What the project's runtimes set on every pod themselves (render/runtimes.py), where a patch could not.
POD_SET_BY_RUNTIME = ("automountServiceAccountToken",)  # env too, but not on `node` (webhook)
# Pod-template fields the TrainJob carries elsewhere: trainer.image/command/env/resourcesPerNode, or the
# runtime (image pull and termination-message policies, ports).
CARRIED_ELSEWHERE = {"name", "image", "imagePullPolicy", "command", "args", "env", "resources", "ports",
                     "terminationMessagePolicy"}  # fmt: skip


def torchrun_command(run: Run) -> list[str]:
    # torchrun reads the PET_* the torch plugin injects; "--" keeps `--run` from matching `--run-path`.
    return ["torchrun", "--no-python", "--", "gpt2bench", "train", *run.trainer_args()]


def pod_patch(template: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A pod template (render/pods.py) as a runtimePatch's pod template, and the fields it had that a
    patch cannot set and nothing else carries (for caveats). The restricted security contexts are
    added where the template has none."""
    spec, (container,) = template["spec"], template["spec"]["containers"]
    patch_spec = {key: spec[key] for key in POD_PATCH_FIELDS if key in spec}
    if "securityContext" not in patch_spec:
        patch_spec["securityContext"] = pod_security_context()
    container_patch = {key: container[key] for key in CONTAINER_PATCH_FIELDS if key in container}
    if "securityContext" not in container_patch:
        container_patch["securityContext"] = container_security_context()
    patch_spec["containers"] = [{"name": TRAINJOB_CONTAINER, **container_patch}]
    dropped = [f"pod.{key}" for key in spec if key not in POD_PATCH_FIELDS + POD_SET_BY_RUNTIME and key != "containers"]
    dropped += [f"container.{key}" for key in container if key not in CONTAINER_PATCH_FIELDS + tuple(CARRIED_ELSEWHERE)]
    return {"metadata": template["metadata"], "spec": patch_spec}, dropped


def runtime_patch(pods: RunPods) -> dict[str, Any]:
    """The run's pod template, as a patch of each replicated job's pods (all alike: one pod template; with
    runLauncherAsNode every pod of an MPI runtime trains)."""
    pod, _ = pod_patch(pods.template({"name": TRAINJOB_CONTAINER, "env": pods.env}))
    replicated_jobs = [{"name": name, "template": {"spec": {"template": copy.deepcopy(pod)}}}
                       for name in trainjob_pods(pods.run.strategy.name, pods.run.nodes)]
    # onto the JobSet, and what the plugins read (TR trainingruntime.go L144-161)
    metadata: dict[str, Any] = {"labels": pods.labels}
    if queue := pods.benchmark.spec.scheduling.queue:
        metadata["annotations"] = {VOLCANO_QUEUE_ANNOTATION: queue}  # Trainer's Volcano plugin (volcano.go L180)
    return {
        "manager": PATCH_MANAGER,
        "trainingRuntimeSpec": {"template": {"metadata": metadata, "spec": {"replicatedJobs": replicated_jobs}}},
    }


RUNTIME_HASH_LENGTH = 8


def claims_runtime(pods: RunPods) -> dict[str, Any] | None:
    """The run's runtime with its resource claims (spec.pods.resourceClaims), as a TrainingRuntime in the
    benchmark's namespace; None without claims (the TrainJob names the project's ClusterTrainingRuntime). Built
    from the project's runtime for the run (runtimes.runtime_for) with the run's image (an MPI runtime's sshd
    pods then run the TrainJob's, as runtime_problems asks) and the spec's gang scheduling
    (runtimes.spec_pod_group_policy)."""
    benchmark, run = pods.benchmark, pods.run
    claims = benchmark.spec.pods.resource_claims
    if not claims:
        return None
    base_name = runtime_for(run.strategy.name, run.nodes, run.devices_per_node > 0)
    scheduling = benchmark.spec.scheduling
    base = project_runtimes(pods.image, pods.image, spec_pod_group_policy(scheduling.gang, scheduling.queue))[base_name]
    runtime = with_claims(base, pods.resources, [claim.pod_claim() for claim in claims])
    digest = hashlib.sha256(json.dumps(runtime["spec"], sort_keys=True).encode()).hexdigest()[:RUNTIME_HASH_LENGTH]
    name = fit_name(dns_label(f"{benchmark.name}-{base_name}"), MAX_NAME_LENGTH - RUNTIME_HASH_LENGTH - 1)
    labels = {**base["metadata"]["labels"], MANAGED_BY_LABEL: MANAGED_BY, BENCHMARK_LABEL: label_value(benchmark.name),
              COMPONENT_LABEL: "training-runtime", IMAGE_LABEL: "gpu" if run.devices_per_node else "cpu"}
    return {"apiVersion": TRAINJOB_API, "kind": NAMESPACED_RUNTIME_KIND,
            "metadata": {"name": f"{name}-{digest}", "namespace": benchmark.namespace, "labels": labels},
            "spec": runtime["spec"]}


def render_trainjob(pods: RunPods) -> dict[str, Any]:
    spec, run = pods.benchmark.spec, pods.run
    own_runtime = claims_runtime(pods)
    mpi = traits(run.strategy.name).launcher == "mpirun"
    trainer: dict[str, Any] = {
        "image": pods.image,
        # MPI: mpirun as in the MPIJob (render/mpijob.py), reaching the non-root sshd on port 2222 with
        # `-mca plm_rsh_args` on the command line, which Open MPI ranks above the MPI plugin's own
        # OMPI_MCA_plm_rsh_args (its `-o ConnectionAttempts=10` is kept in ours)
        "command": launcher_command(pods) if mpi else torchrun_command(run),
        "env": copy.deepcopy([*pods.env, *pods.budget]),
        "numNodes": run.nodes,
        # torch: PET_NPROC_PER_NODE (never "auto": the CPU count of a request would be guessed);
        # MPI: slots per host in the hostfile.
        "numProcPerNode": run.procs_per_node,
    }
    if own_runtime is None:  # else the runtime holds them, with the claims (runtimes.with_claims)
        trainer["resourcesPerNode"] = copy.deepcopy(pods.resources)
    annotations = {**pods.metadata.get("annotations", {}),
                   RESULT_REPLICATED_JOB_ANNOTATION: LAUNCHER_JOB if mpi else NODE_JOB}
    if spec.scheduling.gang:
        annotations[GANG_ANNOTATION] = "required"
    metadata = {
        **pods.metadata,
        "name": run.job_name,  # shorter than the run's name where JobSet's pod names need room
        "annotations": annotations,
    }
    job_spec: dict[str, Any] = {
        "runtimeRef": {
            "apiGroup": TRAINJOB_API.split("/")[0],
            "kind": RUNTIME_KIND if own_runtime is None else NAMESPACED_RUNTIME_KIND,
            "name": (runtime_for(run.strategy.name, run.nodes, run.devices_per_node > 0) if own_runtime is None
                     else own_runtime["metadata"]["name"]),
        },
        "trainer": trainer,
        "runtimePatches": [runtime_patch(pods)],
    }
    if spec.run_policy.active_deadline_seconds is not None:
        job_spec["activeDeadlineSeconds"] = spec.run_policy.active_deadline_seconds
    return {"apiVersion": TRAINJOB_API, "kind": "TrainJob", "metadata": metadata, "spec": job_spec}


def trainjob_caveats(benchmark: Benchmark) -> list[str]:
    """`field: why` for each spec setting a TrainJob on the project's runtimes does not apply, or applies only
    where the installed runtimes allow. Runs still go (none of these changes what is measured; a runtime
    that cannot do what the spec asks fails the run, saying so: runtimes.runtime_problems); `gpt2bench
    render` prints them. What a TrainJob cannot carry and would change the runs (hostNetwork,
    priorityClassName) the spec refuses instead."""
    spec = benchmark.spec
    caveats = []
    if spec.run_policy.backoff_limit:
        caveats.append(f"spec.runPolicy.backoffLimit: {spec.run_policy.backoff_limit} is not applied: the runtimes' "
                       "Jobs have backoffLimit 0 and a TrainJob cannot change it, so a failed pod fails its run")
    if spec.run_policy.ttl_seconds_after_finished is not None:
        caveats.append("spec.runPolicy.ttlSecondsAfterFinished is not applied: a TrainJob has no TTL; finished "
                       "TrainJobs stay until their GPT2Benchmark (their owner) is deleted")
    if spec.scheduling.gang or spec.scheduling.queue:
        caveats.append("spec.scheduling.gang/queue: a TrainJob is gang-scheduled by its runtime's podGroupPolicy "
                       "(the chart's trainerRuntimes.podGroupPolicy: coscheduling, or volcano for a queue); a run "
                       "whose installed runtime has none fails, saying so")
    if spec.metrics.port != RUNTIME_METRICS_PORT:
        caveats.append(f"spec.metrics.port: the trainers serve {spec.metrics.port} (the pods' prometheus.io/port "
                       f"says so), but the runtimes' container port `metrics`, which PodMonitors scrape, is "
                       f"{RUNTIME_METRICS_PORT}")
    if spec.image_pull_policy != RUNTIME_IMAGE_PULL_POLICY:
        caveats.append(f"spec.imagePullPolicy: {spec.image_pull_policy} is not applied: the runtimes set "
                       f"{RUNTIME_IMAGE_PULL_POLICY}")
    mpi = [s.name for s in spec.sweep.strategies if traits(s.name).launcher == "mpirun"]
    foreign = {spec.trainer_image(gpus=scale.devices_per_node > 0) for scale in spec.sweep.scales
               if mpi and scale.nodes > 1} - {DEFAULT_IMAGE, DEFAULT_GPU_IMAGE}
    if foreign:
        caveats.append(f"spec.image: {'/'.join(mpi)}'s ranks on several nodes run in the {MPI_RUNTIME}/{MPI_GPU_RUNTIME} "
                       f"runtimes' sshd pods, whose image is the runtime's, not {', '.join(sorted(foreign))}: "
                       f"install the runtimes with that image (the chart's trainerImage values)")
    return caveats
