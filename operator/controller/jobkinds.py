"""The Kubeflow job kinds a run can become, as data: where the API serves them, which pod holds the
results, what their conditions mean, where Kueue suspends them, and how to install what serves them.

Everything kind-specific in the operator reads this table (the watch handlers, the client calls, the
decisions in `reconcile`), so a new backend (e.g. Trainer v2's TrainJob) is one more entry, not a branch.
Sources: /work/notes/upstream-controllers.md §8 (mpi-operator v0.8), §9 (training-operator v1.9), §10 (Kueue).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpt2bench.protocol import (
    JOB_NAME_LABEL,
    JOB_ROLE_LABEL,
    LAUNCHER_CONTAINER,
    MPIJOB_API,
    PYTORCH_CONTAINER,
    PYTORCHJOB_API,
)


@dataclass(frozen=True)
class JobKind:
    kind: str
    api_version: str  # group/version
    plural: str
    # The pod whose termination message holds the trainer's summary: its labels ("{job}": the job's name)
    # and its container.
    result_pod_labels: tuple[tuple[str, str], ...]
    result_container: str
    # Condition types (status True) and what they mean; terminal ones win, then suspension.
    succeeded: frozenset[str]
    failed: frozenset[str]
    running: frozenset[str]
    suspended: frozenset[str]
    # The spec flag Kueue's webhook sets on a job it queues (seen before the controller's condition).
    suspend_field: tuple[str, ...]
    # What serves the kind, and how to install it (the failure reason of a run on a cluster without it).
    served_by: str
    install: str
    # When the CRD exists but at other versions only: what serves those, and what to do about it.
    other_versions_hint: str = ""

    @property
    def group(self) -> str:
        return self.api_version.split("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.split("/")[1]

    @property
    def resource(self) -> tuple[str, str, str]:
        return self.group, self.version, self.plural

    @property
    def crd(self) -> str:
        return f"{self.plural}.{self.group}"

    def result_pod_selector(self, job_name: str) -> str:
        return ",".join(f"{key}={value.format(job=job_name)}" for key, value in self.result_pod_labels)

    def suspended_in_spec(self, job: dict[str, Any]) -> bool:
        value: Any = job
        for key in self.suspend_field:
            value = value.get(key) if isinstance(value, dict) else None
        return value is True


TRAINING_OPERATOR_INSTALL = ('kubectl apply --server-side -k '
                             '"github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=v1.9.0"')
MPI_OPERATOR_INSTALL = ("kubectl apply --server-side -f "
                        "https://raw.githubusercontent.com/kubeflow/mpi-operator/v0.8.2/deploy/v2beta1/mpi-operator.yaml")

PYTORCHJOB = JobKind(
    kind="PyTorchJob",
    api_version=PYTORCHJOB_API,
    plural="pytorchjobs",
    # training-operator labels the Master pod job-role=master (pkg/controller.v1/common/pod.go)
    result_pod_labels=((JOB_NAME_LABEL, "{job}"), (JOB_ROLE_LABEL, "master")),
    result_container=PYTORCH_CONTAINER,
    succeeded=frozenset({"Succeeded"}),
    failed=frozenset({"Failed"}),
    running=frozenset({"Running", "Restarting"}),
    suspended=frozenset({"Suspended"}),
    suspend_field=("spec", "runPolicy", "suspend"),
    served_by="the Kubeflow training operator (v1.8 or later)",
    install=TRAINING_OPERATOR_INSTALL,
)

MPIJOB = JobKind(
    kind="MPIJob",
    api_version=MPIJOB_API,
    plural="mpijobs",
    # mpi-operator sets no replica-type label on the launcher, only job-role=launcher (v2beta1 constants.go)
    result_pod_labels=((JOB_NAME_LABEL, "{job}"), (JOB_ROLE_LABEL, "launcher")),
    result_container=LAUNCHER_CONTAINER,
    succeeded=frozenset({"Succeeded"}),
    failed=frozenset({"Failed"}),
    running=frozenset({"Running", "Restarting"}),
    suspended=frozenset({"Suspended"}),
    suspend_field=("spec", "runPolicy", "suspend"),
    served_by="the Kubeflow MPI operator v0.8",
    install=MPI_OPERATOR_INSTALL,
    other_versions_hint=("the training operator's own MPIJob: run that operator with --enable-scheme=pytorchjob "
                         "and without that CRD, then install the MPI operator (docs/operator.md)"),
)

JOB_KINDS: dict[str, JobKind] = {k.kind: k for k in (PYTORCHJOB, MPIJOB)}


def missing_kind_reason(kind: JobKind, other_versions: list[str]) -> str:
    """Why a run of a kind the cluster does not serve failed, and how to fix it."""
    reason = (f"{kind.kind} {kind.api_version} is not served by this cluster (CRD {kind.crd} has no {kind.version}): "
              f"install {kind.served_by}: {kind.install}")
    if other_versions:
        reason += f". It serves {kind.crd} at {', '.join(other_versions)} only"
        reason += f": {kind.other_versions_hint}" if kind.other_versions_hint else ""
    return reason
