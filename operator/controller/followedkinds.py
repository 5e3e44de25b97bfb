"""The job kinds the operator creates and follows: the shared table (`gpt2bench.jobkinds`: API, plural,
backend, result pod and container, what conditions mean, where Kueue suspends) plus what the operator
tells a cluster that does not serve one: how to install what serves it, and what to do when another
version is served instead.

Everything kind-specific in the operator reads these two tables (the watch handlers, the client calls,
the decisions in `reconcile`), so a kind is one more entry, not a branch.
Sources, the controllers' own code at the pinned versions: kubeflow/trainer v2.3.0 with kubernetes-sigs/jobset
v0.12.0, kubeflow/mpi-operator v0.8.2, kubeflow/training-operator v1.9.0, kubernetes-sigs/kueue.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpt2bench import jobkinds as kinds


@dataclass(frozen=True)
class FollowedKind:
    base: kinds.JobKind
    served_by: str
    install: str  # the command that installs what serves it (a failed run's reason says it)
    # When the CRD exists but at other versions only: what serves those, and what to do about it.
    other_versions_hint: str = ""

    @property
    def kind(self) -> str:
        return self.base.kind

    @property
    def api_version(self) -> str:
        return self.base.api_version

    @property
    def group(self) -> str:
        return self.base.group

    @property
    def version(self) -> str:
        return self.base.version

    @property
    def plural(self) -> str:
        return self.base.plural

    @property
    def resource(self) -> tuple[str, str, str]:
        return self.group, self.version, self.plural

    @property
    def crd(self) -> str:
        return f"{self.plural}.{self.group}"


# The commands the README's prerequisites paste (scripts/e2e-kind.sh runs them; tests/test_versions.py).
TRAINING_OPERATOR_OVERLAY = "github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=v1.9.0"
TRAINING_OPERATOR_INSTALL = ("kubectl apply --server-side -k manifests/kubeflow/training-operator (in a gpt2bench "
                             f"checkout: {TRAINING_OPERATOR_OVERLAY} without its own MPIJob)")
MPI_OPERATOR_INSTALL = ("kubectl apply --server-side -f "
                        "https://raw.githubusercontent.com/kubeflow/mpi-operator/v0.8.2/deploy/v2beta1/mpi-operator.yaml")

TRAINER_V2_INSTALL = ('kubectl apply --server-side -k '
                      '"https://github.com/kubeflow/trainer.git/manifests/overlays/manager?ref=v2.3.0"')
RUNTIMES_INSTALL = "kubectl apply -f manifests/runtimes.yaml (Helm: --set trainerRuntimes.install=true)"

JOB_KINDS: dict[str, FollowedKind] = {
    followed.kind: followed
    for followed in (
        FollowedKind(kinds.JOB_KINDS["TrainJob"], "Kubeflow Trainer v2 (v2.2 or later, with JobSet)",
                     f"{TRAINER_V2_INSTALL}, then the gpt2bench runtimes: {RUNTIMES_INSTALL}"),
        FollowedKind(kinds.JOB_KINDS["PyTorchJob"], "the Kubeflow training operator (v1.8 or later)",
                     TRAINING_OPERATOR_INSTALL),
        FollowedKind(kinds.JOB_KINDS["MPIJob"], "the Kubeflow MPI operator v0.8", MPI_OPERATOR_INSTALL,
                     other_versions_hint=("the training operator's own MPIJob: run that operator with "
                                          "--enable-scheme=pytorchjob and without that CRD, then install the MPI "
                                          "operator (docs/operator.md)")),
    )
}  # fmt: skip

def missing_kind_reason(kind: FollowedKind, other_versions: list[str]) -> str:
    """Why a run of a kind the cluster does not serve failed, and how to fix it."""
    reason = (f"{kind.kind} {kind.api_version} is not served by this cluster (CRD {kind.crd} has no {kind.version}): "
              f"install {kind.served_by}: {kind.install}")
    if other_versions:
        reason += f". It serves {kind.crd} at {', '.join(other_versions)} only"
        reason += f": {kind.other_versions_hint}" if kind.other_versions_hint else ""
    return reason


def missing_runtime_reason(kind: str, name: str) -> str:
    """Why a TrainJob on a runtime the cluster lacks cannot run (Trainer's webhook would refuse it too)."""
    return f"{kind} {name} is not installed: the gpt2bench runtimes are: {RUNTIMES_INSTALL}"
