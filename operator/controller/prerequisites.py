"""What the cluster lacks for gpt2bench's runs, said once when the operator starts, in its log: which job kinds
are not served and what to install (warnings), whether gpt2bench's ClusterTrainingRuntimes are there next to
Kubeflow Trainer v2, and what `spec.backend: auto` resolves to today.

Nothing waits on it: a run of a kind the cluster does not serve still fails at once with the same advice
(`kube.create_job`), and a kind installed later is served as soon as it appears. This only says it before the
first benchmark fails, where an operator's user looks first (`kubectl logs deployment/...`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gpt2bench import jobkinds as kinds
from gpt2bench.render.runtimes import MPI_GPU_RUNTIME, MPI_ONE_NODE_RUNTIME, MPI_RUNTIME, TORCH_RUNTIME

from . import kube
from .followedkinds import JOB_KINDS, RUNTIMES_INSTALL, FollowedKind

RUNTIMES = [TORCH_RUNTIME, MPI_RUNTIME, MPI_GPU_RUNTIME, MPI_ONE_NODE_RUNTIME]
V1_KINDS = ("PyTorchJob", "MPIJob")


def findings(served: set[str], runtimes_missing: list[str],
             missing_reason: Callable[[FollowedKind], str]) -> tuple[str, list[str]]:
    """(what is served and what `auto` picks, the warnings): pure, given what the cluster serves, which
    runtimes it lacks (looked up only where TrainJob is served) and each missing kind's reason."""
    backend = kinds.resolve_backend(kinds.AUTO, served)
    summary = (f"job kinds served: {', '.join(sorted(served)) or 'none of TrainJob, PyTorchJob, MPIJob'}; "
               f"spec.backend auto resolves to {backend}")
    if not served:
        return summary, ["no Kubeflow job kind is served: every run fails until one backend is installed. "
                         f"Either {missing_reason(JOB_KINDS['TrainJob'])}; or, for the v1 jobs, "
                         f"{missing_reason(JOB_KINDS['PyTorchJob'])}, and for horovod "
                         f"{missing_reason(JOB_KINDS['MPIJob'])}"]
    warnings = []
    if "TrainJob" in served and runtimes_missing:
        warnings.append(f"Kubeflow Trainer v2 is installed but gpt2bench's ClusterTrainingRuntimes "
                        f"{', '.join(runtimes_missing)} are not: TrainJob runs on them fail until: {RUNTIMES_INSTALL}")
    if "TrainJob" not in served:
        warnings += [f"{missing_reason(JOB_KINDS[kind])} (runs of spec.backend pytorchjob that need it fail "
                     "until then)" for kind in V1_KINDS if kind not in served]
    return summary, warnings


def report(logger: logging.Logger) -> None:
    """Log what `findings` says about this cluster; an API that cannot be asked is a warning, not a crash."""
    try:
        served = kube.served_job_kinds()
        missing = kube.runtimes_missing(RUNTIMES) if "TrainJob" in served else []
        summary, warnings = findings(served, missing, kube.missing_reason)
    except Exception as exc:  # any API or network error: the runs will say what is missing, if anything
        logger.warning("could not check which Kubeflow job kinds this cluster serves: %s", exc)
        return
    logger.info("%s", summary)
    for warning in warnings:
        logger.warning("%s", warning)
