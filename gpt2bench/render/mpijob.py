"""A run as an MPIJob (kubeflow.org/v2beta1, mpi-operator): a Launcher running mpirun, sshd Workers."""

from __future__ import annotations

from typing import Any

from gpt2bench.plan import Run
from gpt2bench.protocol import LAUNCHER_CONTAINER, MPIJOB_API, OUTPUT_ENV, WORKER_CONTAINER
from gpt2bench.render.pods import container_env, job_metadata, pod_template, restart_policy, run_policy
from gpt2bench.spec import Benchmark

SSH_AUTH_MOUNT_PATH = "/root/.ssh"
# Forwarded from the launcher to every rank (an unset one only draws a warning from mpirun).
MPI_FORWARDED_ENV = ("PATH", "LD_LIBRARY_PATH", "PYTHONUNBUFFERED", OUTPUT_ENV)


def mpirun_command(run: Run) -> list[str]:
    """The launcher's command: mpirun over the hostfile mpi-operator mounts, wrapped by `gpt2bench launch`."""
    forward = [arg for name in MPI_FORWARDED_ENV for arg in ("-x", name)]
    return [
        "gpt2bench", "launch", "--",
        "mpirun", "--allow-run-as-root", "-np", str(run.world_size),
        "-bind-to", "none", "-map-by", "slot", *forward,
        "gpt2bench", "train", *run.trainer_args(),
    ]  # fmt: skip


def render_mpijob(benchmark: Benchmark, run: Run) -> dict[str, Any]:
    launcher = pod_template(
        benchmark,
        run,
        {"name": LAUNCHER_CONTAINER, "command": mpirun_command(run), "env": container_env()},
        gpus=0,
        serves_metrics=False,
    )
    launcher["spec"]["containers"][0].pop("resources", None)  # mpirun alone needs little; no GPU
    worker = pod_template(
        benchmark,
        run,
        {"name": WORKER_CONTAINER, "command": ["/usr/sbin/sshd", "-De"], "env": container_env()},
        gpus=run.devices_per_node,
        serves_metrics=True,
    )
    # The image runs as uid 1000; mpi-operator's root mode (sshAuthMountPath /root/.ssh, `sshd -De` on
    # port 22) needs uid 0 in both pods, as mpi-operator's own examples run.
    for template in (launcher, worker):
        template["spec"]["securityContext"] = {"runAsUser": 0}
    restart = restart_policy(benchmark)
    return {
        "apiVersion": MPIJOB_API,
        "kind": "MPIJob",
        "metadata": job_metadata(benchmark, run),
        "spec": {
            "slotsPerWorker": run.procs_per_node,
            "launcherCreationPolicy": "WaitForWorkersReady",
            "mpiImplementation": "OpenMPI",
            "sshAuthMountPath": SSH_AUTH_MOUNT_PATH,
            "runPolicy": run_policy(benchmark, min_available=run.nodes + 1),
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "restartPolicy": restart, "template": launcher},
                "Worker": {"replicas": run.nodes, "restartPolicy": restart, "template": worker},
            },
        },
    }
