"""The kinds of Kubeflow job a run can become, described once: their API, which backend they belong to,
which pod holds a run's results, and what their conditions mean for the run's phase.

Pure functions over job and pod dicts as the API returns them; the operator and the local runner do the reading
and read every kind through this table.

| backend | kinds | served by |
|---|---|---|
| `trainjob` | TrainJob (trainer.kubeflow.org/v1alpha1) for every strategy | Kubeflow Trainer v2 (with JobSet) |
| `pytorchjob` | PyTorchJob (kubeflow.org/v1), MPIJob (kubeflow.org/v2beta1) for horovod | training operator v1, mpi-operator |

Upstream behaviour is quoted from the controllers' own source; the citation keys name the repositories at the
versions the project pins: TR = kubeflow/trainer v2.3.0, JS = kubernetes-sigs/jobset v0.12.0, TO =
kubeflow/training-operator v1.9.0, MPI = kubeflow/mpi-operator v0.8.2.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpt2bench.conventions import (
    LAUNCHER_CONTAINER,
    MPIJOB_API,
    PYTORCH_CONTAINER,
    PYTORCHJOB_API,
    RESULT_REPLICATED_JOB_ANNOTATION,
    TRAINJOB_API,
    TRAINJOB_CONTAINER,
    WORKER_CONTAINER,
)
from gpt2bench.status import FAILED, PENDING, QUEUED, RUNNING, SUCCEEDED
from gpt2bench.strategies import traits

# ------------------------------------------------------------------ backends

TRAINJOB, PYTORCHJOB, AUTO = "trainjob", "pytorchjob", "auto"
BACKENDS = (TRAINJOB, PYTORCHJOB)  # what `auto` resolves to
# Without an API to ask (`gpt2bench render`/`run` with no --backend), `auto` keeps the v1 jobs the
# operator created before Trainer v2 support; the operator resolves `auto` from discovery instead.
OFFLINE_BACKEND = PYTORCHJOB


@dataclass(frozen=True)
class JobKind:
    kind: str
    api_version: str  # group/version
    plural: str
    backend: str
    result_container: str  # the container whose termination message holds the trainer's summary
    # The spec flag Kueue's webhook sets on a job it queues (KQ kubeflowjob_controller.go L50-59,
    # mpijob_controller.go L88-102, trainjob webhook): seen before the controller's Suspended condition.
    suspend_path: tuple[str, ...] = ("spec", "runPolicy", "suspend")
    deadline_path: tuple[str, ...] = ("spec", "runPolicy", "activeDeadlineSeconds")
    # v1 kinds: the spec field of their replica specs (replica type -> {replicas, restartPolicy, template}),
    # and each replica type with the container of its pod template that runs the job's command, in start order.
    # A TrainJob has none: its pods are its runtime's replicated jobs (`runtime_ref_path`), with its trainer.
    replica_specs_key: str | None = None
    replica_containers: tuple[tuple[str, str], ...] = ()
    runtime_ref_path: tuple[str, ...] | None = None

    @property
    def group(self) -> str:
        return self.api_version.split("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.split("/")[1]


JOB_KINDS: dict[str, JobKind] = {
    kind.kind: kind
    for kind in (
        JobKind("TrainJob", TRAINJOB_API, "trainjobs", TRAINJOB, TRAINJOB_CONTAINER,
                suspend_path=("spec", "suspend"), deadline_path=("spec", "activeDeadlineSeconds"),
                runtime_ref_path=("spec", "runtimeRef")),
        JobKind("PyTorchJob", PYTORCHJOB_API, "pytorchjobs", PYTORCHJOB, PYTORCH_CONTAINER,
                replica_specs_key="pytorchReplicaSpecs",
                replica_containers=(("Master", PYTORCH_CONTAINER), ("Worker", PYTORCH_CONTAINER))),
        JobKind("MPIJob", MPIJOB_API, "mpijobs", PYTORCHJOB, LAUNCHER_CONTAINER,
                replica_specs_key="mpiReplicaSpecs",
                replica_containers=(("Launcher", LAUNCHER_CONTAINER), ("Worker", WORKER_CONTAINER))),
    )
}  # fmt: skip


# The training-operator-era kind of each launcher (gpt2bench.strategies): mpi-operator's MPIJob runs mpirun.
V1_KINDS: dict[str, str] = {"torchrun": "PyTorchJob", "mpirun": "MPIJob"}


def job_kind_for(strategy: str, backend: str) -> str:
    """The kind a strategy's run becomes under a resolved backend."""
    if backend == TRAINJOB:
        return "TrainJob"
    if backend == PYTORCHJOB:
        return V1_KINDS[traits(strategy).launcher]
    raise ValueError(f"backend {backend!r} is not resolved: one of {', '.join(BACKENDS)}")


def served_job_kinds(discovery: Mapping[str, Iterable[str]]) -> set[str]:
    """The job kinds an API server serves, from its discovery: groupVersion -> resource plurals
    (`GET /apis/<group>/<version>` `resources[].name`)."""
    return {
        kind.kind for kind in JOB_KINDS.values() if kind.plural in set(discovery.get(kind.api_version, ()))
    }


def resolve_backend(requested: str, served_kinds: Collection[str] | None = None) -> str:
    """`trainjob`/`pytorchjob` stay as asked (a kind the cluster lacks then fails the runs that need it).
    `auto`: TrainJob when the cluster serves it, else the v1 jobs when it serves either of them; when it
    serves none, TrainJob, so that the runs say to install Trainer v2 (where Kubeflow's docs lead).
    `served_kinds=None` means no API to ask: OFFLINE_BACKEND."""
    if requested in BACKENDS:
        return requested
    if requested != AUTO:
        raise ValueError(f"unknown backend {requested!r}: auto, {', '.join(BACKENDS)}")
    if served_kinds is None:
        return OFFLINE_BACKEND
    if "TrainJob" in served_kinds:
        return TRAINJOB
    if {"PyTorchJob", "MPIJob"} & set(served_kinds):
        return PYTORCHJOB
    return TRAINJOB


# ------------------------------------------------------------------ reading a job


def kind_of(job: Mapping[str, Any]) -> JobKind | None:
    """The table's entry for a job dict: its kind at the table's apiVersion; None for any other."""
    kind = JOB_KINDS.get(job.get("kind") or "")
    return kind if kind is not None and job.get("apiVersion") == kind.api_version else None


def _at(job: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = job
    for key in path:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value


def replica_specs(job: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A v1 job's replica type -> replica spec (`replicas`, `restartPolicy`, `template`), as written; {} for a
    TrainJob (its pods come from its runtime: `runtime_ref`)."""
    key = JOB_KINDS[job["kind"]].replica_specs_key
    return dict(_at(job, ("spec", key)) or {}) if key else {}


def replica_types(job: Mapping[str, Any]) -> tuple[str, ...]:
    """The replica types a v1 job's kind has, in the order its operator starts them (Master then Workers)."""
    return tuple(role for role, _ in JOB_KINDS[job["kind"]].replica_containers)


def replica_container(job: Mapping[str, Any], replica_type: str) -> str:
    """The name of the container that runs a v1 replica type's command (the operator's default container)."""
    return dict(JOB_KINDS[job["kind"]].replica_containers)[replica_type]


def runtime_ref(job: Mapping[str, Any]) -> dict[str, Any] | None:
    """A TrainJob's `runtimeRef` ({kind, name, apiGroup}); None for kinds that name no runtime, or when unset."""
    path = JOB_KINDS[job["kind"]].runtime_ref_path
    return (_at(job, path) or None) if path else None


def active_deadline(job: Mapping[str, Any]) -> float | None:
    """activeDeadlineSeconds: the v1 jobs' runPolicy's, a TrainJob's spec's; None when unset."""
    deadline = _at(job, JOB_KINDS[job["kind"]].deadline_path)
    return None if deadline is None else float(deadline)


# ------------------------------------------------------------------ names

MAX_NAME = 63  # DNS-1035 label: job, pod and Service names
_RANDOM_SUFFIX = "-abcde"  # the 5 characters the Job controller's generateName adds to a pod name

# The replicated jobs of the project's runtimes (gpt2bench.render.runtimes): torch runs `node` only;
# MPI on several nodes runs sshd `node`s then the `launcher`, and with runLauncherAsNode the plugin gives
# `node` max(numNodes - 1, 1) pods (TR mpi.go EnforceMLPolicy); MPI on one node runs the `launcher` alone.
NODE_JOB, LAUNCHER_JOB = "node", "launcher"


def trainjob_pods(strategy: str, nodes: int) -> dict[str, int]:
    """Pods per replicated job of a run's TrainJob, in runtime order."""
    return launcher_pods(traits(strategy).launcher, nodes)


def launcher_pods(launcher: str, nodes: int) -> dict[str, int]:
    """Pods per replicated job of a TrainJob on the project's runtime for `launcher`, in runtime order."""
    if launcher == "mpirun":
        return {NODE_JOB: nodes - 1, LAUNCHER_JOB: 1} if nodes > 1 else {LAUNCHER_JOB: 1}
    return {NODE_JOB: nodes}


def max_job_name_length(kind: str, strategy: str, nodes: int) -> int:
    """The longest job name whose pods' names stay DNS labels.

    TrainJob: the JobSet (named like it) is rejected when its longest pod name
    `<jobset>-<rjob>-<replicas-1>-<completions-1>-<5 random>` exceeds 63 characters (JS
    jobset_webhook.go L234-255): 48 for torch up to 10 nodes, 44 for MPI (`-launcher-0-0-abcde`).
    v1 kinds: run names (<= 52, gpt2bench.plan) already leave room for `-worker-N`, `-launcher`.
    """
    if kind != "TrainJob":
        return MAX_NAME
    suffixes = [f"-{rjob}-0-{pods - 1}{_RANDOM_SUFFIX}" for rjob, pods in trainjob_pods(strategy, nodes).items()]
    return MAX_NAME - max(map(len, suffixes))


# ------------------------------------------------------------------ where the results are

# Labels the training operator and mpi-operator put on pods (TO common/pod.go, MPI defaultLabels).
V1_JOB_NAME_LABEL = "training.kubeflow.org/job-name"
V1_JOB_ROLE_LABEL = "training.kubeflow.org/job-role"
V1_RESULT_ROLE = {"PyTorchJob": "master", "MPIJob": "launcher"}
# Labels (and same-named annotations) JobSet puts on its Jobs and their pods (JS jobset_controller.go
# labelAndAnnotateObject L1014-1078). Trainer v2 adds no trainer.kubeflow.org label to pods.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"
# The Job controller's annotation on Indexed Job pods; the label of the same key only exists behind the
# PodIndexLabel feature gate, so the annotation is what is checked.
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"


def result_replicated_job(job: dict[str, Any]) -> str:
    """The TrainJob's replicated job whose pod 0 holds the results: `node` (torch rank 0, whose
    PET_NODE_RANK is its completion index 0) or `launcher` (MPI: mpirun's `gpt2bench launch`).
    The renderer names it in an annotation (torch's `node` when absent)."""
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    return annotations.get(RESULT_REPLICATED_JOB_ANNOTATION, NODE_JOB)


def result_pod_labels(job: dict[str, Any]) -> dict[str, str]:
    """The labels the result pod of `job` carries, set by the Kubeflow (or JobSet) controllers."""
    kind, name = job["kind"], job["metadata"]["name"]
    if kind == "TrainJob":
        # JobSet name == TrainJob name (TR jobset.go L413-433); one Job per replicated job (replicas 1)
        return {JOBSET_NAME_LABEL: name, REPLICATED_JOB_LABEL: result_replicated_job(job), JOB_INDEX_LABEL: "0"}
    return {V1_JOB_NAME_LABEL: name, V1_JOB_ROLE_LABEL: V1_RESULT_ROLE[kind]}


def result_pod_selector(job: dict[str, Any]) -> str:
    """A label selector for listing the result pod's candidates: `list_namespaced_pod(label_selector=...)`."""
    return ",".join(f"{key}={value}" for key, value in result_pod_labels(job).items())


def result_pod(job: dict[str, Any], pods: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """Among listed pods, the one whose termination message holds the run's results: the selector's
    pods (TrainJob: completion index 0 only), the latest JobSet restart, then the newest (a restarted
    pod's replacement holds the last attempt)."""
    labels = result_pod_labels(job)
    candidates = []
    for pod in pods:
        metadata = pod.get("metadata") or {}
        if any((metadata.get("labels") or {}).get(key) != value for key, value in labels.items()):
            continue
        if job["kind"] == "TrainJob" and (metadata.get("annotations") or {}).get(COMPLETION_INDEX_ANNOTATION) != "0":
            continue
        candidates.append(pod)

    def age(pod: dict[str, Any]) -> tuple[int, str]:
        metadata = pod.get("metadata") or {}
        attempt = (metadata.get("labels") or {}).get(RESTART_ATTEMPT_LABEL, "0")
        return int(attempt) if attempt.isdigit() else 0, metadata.get("creationTimestamp") or ""

    return max(candidates, key=age, default=None)


def job_pod_selector(job: dict[str, Any]) -> str:
    """A label selector for every pod of a job, all replicas (the controllers' job-name labels)."""
    if job["kind"] == "TrainJob":
        return f"{JOBSET_NAME_LABEL}={job['metadata']['name']}"
    return f"{V1_JOB_NAME_LABEL}={job['metadata']['name']}"


def expected_pods(job: dict[str, Any]) -> int | None:
    """How many pods a job runs: a v1 job's replica specs' replicas; a TrainJob rendered for the project's
    runtimes (its result replicated job annotated), `trainjob_pods` of its numNodes (the MPI runtime's
    launcher and sshd `node`s, torch's `node`s); None for another TrainJob (its runtime decides)."""
    specs = replica_specs(job)
    if specs:
        return sum(int(spec.get("replicas", 1)) for spec in specs.values())
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    nodes = _at(job, ("spec", "trainer", "numNodes"))
    if job.get("kind") != "TrainJob" or RESULT_REPLICATED_JOB_ANNOTATION not in annotations or nodes is None:
        return None
    # the MPI runtimes' result is their launcher's, torch's a `node`'s (gpt2bench.render.trainjob)
    launcher = "mpirun" if annotations[RESULT_REPLICATED_JOB_ANNOTATION] == LAUNCHER_JOB else "torchrun"
    return sum(launcher_pods(launcher, int(nodes)).values())


def result_container(job: dict[str, Any]) -> str:
    return JOB_KINDS[job["kind"]].result_container


# ------------------------------------------------------------------ conditions -> run phase


@dataclass(frozen=True)
class JobState:
    """What a job's status says for its run: Pending (created, nothing yet), Queued (suspended: Kueue has
    not admitted it), Running, Succeeded, Failed; `reason`/`message` are the deciding condition's."""

    phase: str
    message: str = ""
    reason: str = ""

    def describe(self) -> str:
        """`Reason: message` (either alone when the other is empty): a failed run's reason."""
        return ": ".join(part for part in (self.reason, self.message) if part)


def _true_conditions(job: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in (job.get("status") or {}).get("conditions") or [] if str(c.get("status")) == "True"]


def _state(phase: str, condition: dict[str, Any] | None = None) -> JobState:
    condition = condition or {}
    return JobState(phase, condition.get("message") or "", condition.get("reason") or "")


def suspended_in_spec(job: dict[str, Any]) -> bool:
    """Whether the job's spec says suspended (Kueue's webhook sets it at creation, before any condition)."""
    kind = JOB_KINDS.get(job.get("kind") or "")
    return kind is not None and _at(job, kind.suspend_path) is True


def v1_job_state(job: dict[str, Any]) -> JobState:
    """PyTorchJob/MPIJob: terminal conditions win whatever their order; then suspension (a True Suspended
    condition, or `runPolicy.suspend`: Kueue's queue) → Queued, with the condition's reason and message;
    otherwise the newest True one (Running/Restarting → Running; Created → Pending)."""
    conditions = _true_conditions(job)
    by_type = {c.get("type"): c for c in conditions}
    for terminal in (FAILED, SUCCEEDED):
        if terminal in by_type:
            return _state(terminal, by_type[terminal])
    if "Suspended" in by_type:
        return _state(QUEUED, by_type["Suspended"])
    if suspended_in_spec(job):
        return JobState(QUEUED)
    if conditions and conditions[-1].get("type") in ("Running", "Restarting"):
        return JobState(RUNNING, conditions[-1].get("message") or "")
    return JobState(PENDING)


def trainjob_state(job: dict[str, Any]) -> JobState:
    """TrainJob: its only condition types are Suspended, Complete and Failed (TR trainjob_types.go
    L56-84). Complete/Failed are the JobSet's Completed/Failed copied with their reason and message
    (`AllJobsCompleted`; `FailedJobs` "... (first failed job: <job>)"), or Failed/`DeadlineExceeded`
    (TR jobset.go L449-457, trainjob_controller.go L155-191). There is no Running condition: the run is
    Running once a replicated job has pods (status.jobsStatus[].active/ready/succeeded/failed)."""
    by_type = {c.get("type"): c for c in _true_conditions(job)}
    if "Failed" in by_type:
        return _state(FAILED, by_type["Failed"])
    if "Complete" in by_type:
        return _state(SUCCEEDED, by_type["Complete"])
    if "Suspended" in by_type:  # Kueue holds it in its queue, or someone suspended it
        return _state(QUEUED, by_type["Suspended"])
    if suspended_in_spec(job):
        return JobState(QUEUED)
    jobs = (job.get("status") or {}).get("jobsStatus") or []
    if any(entry.get(count) for entry in jobs for count in ("active", "ready", "succeeded", "failed")):
        return JobState(RUNNING)
    return JobState(PENDING)


def job_state(job: dict[str, Any]) -> JobState:
    """The run phase a job's status says, for any kind in JOB_KINDS."""
    if job.get("kind") == "TrainJob":
        return trainjob_state(job)
    return v1_job_state(job)
