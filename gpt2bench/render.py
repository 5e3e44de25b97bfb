"""Render each planned run as a Kubeflow job: PyTorchJob (kubeflow.org/v1) or, for horovod, MPIJob
(kubeflow.org/v2beta1). Pure functions: the operator creates what they return, the local runner executes
it, and `gpt2bench render FILE.yaml` prints it.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import sys
from typing import Any

import yaml

from gpt2bench.kubesyntax import dns1123_label_problem
from gpt2bench.plan import Run, plan_runs
from gpt2bench.protocol import (
    BENCHMARK_LABEL,
    KUEUE_QUEUE_LABEL,
    LAUNCHER_CONTAINER,
    MPIJOB_API,
    OUTPUT_DIR,
    OUTPUT_ENV,
    PRECISION_LABEL,
    PYTORCH_CONTAINER,
    PYTORCHJOB_API,
    RUN_LABEL,
    STRATEGY_LABEL,
    WORKER_CONTAINER,
)
from gpt2bench.spec import Benchmark, SpecError, load_benchmark_file

# The training operator's default rendezvous port; named so that it never guesses.
PYTORCHJOB_PORT = 23456
SSH_AUTH_MOUNT_PATH = "/root/.ssh"
# Forwarded from the launcher to every rank (an unset one only draws a warning from mpirun).
MPI_FORWARDED_ENV = ("PATH", "LD_LIBRARY_PATH", "PYTHONUNBUFFERED", OUTPUT_ENV)


def label_value(text: str) -> str:
    """Label values are <= 63 chars; long ones keep a prefix and a hash of the whole."""
    if len(text) <= 63:
        return text
    return f"{text[:54].rstrip('-._')}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def job_labels(benchmark: Benchmark, run: Run) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "gpt2bench",
        "app.kubernetes.io/component": "run",
        "app.kubernetes.io/managed-by": "gpt2bench-operator",
        BENCHMARK_LABEL: label_value(benchmark.name),
        RUN_LABEL: run.name,
        STRATEGY_LABEL: run.strategy.name,
        PRECISION_LABEL: run.precision,
    }


def _metadata(benchmark: Benchmark, run: Run) -> dict[str, Any]:
    labels = job_labels(benchmark, run)
    if benchmark.spec.scheduling.kueue_queue:
        labels[KUEUE_QUEUE_LABEL] = benchmark.spec.scheduling.kueue_queue
    # No ownerReferences: ownership is the operator's (kopf.adopt); a rendered job for GitOps has no owner.
    return {"name": run.name, "namespace": benchmark.namespace, "labels": labels}


def _run_policy(benchmark: Benchmark, min_available: int) -> dict[str, Any]:
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


def _resources(benchmark: Benchmark, gpus: int) -> dict[str, Any]:
    requests = dict(benchmark.spec.resources.requests)
    limits = dict(benchmark.spec.resources.limits)
    if gpus:
        # Extended resources: requests must equal limits; set both.
        requests["nvidia.com/gpu"] = gpus
        limits["nvidia.com/gpu"] = gpus
    resources: dict[str, Any] = {}
    if requests:
        resources["requests"] = requests
    if limits:
        resources["limits"] = limits
    return resources


def _env(extra: dict[str, str] | None = None) -> list[dict[str, str]]:
    env = {OUTPUT_ENV: OUTPUT_DIR, "PYTHONUNBUFFERED": "1", **(extra or {})}
    return [{"name": name, "value": value} for name, value in env.items()]


def _volumes(gpus: int) -> tuple[list[dict], list[dict]]:
    volumes = [{"name": "output", "emptyDir": {}}]
    mounts = [{"name": "output", "mountPath": OUTPUT_DIR}]
    if gpus:  # NCCL needs more shared memory than the container default of 64 MiB
        volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    return volumes, mounts


def metrics_ports(port: int, processes: int) -> list[dict[str, Any]]:
    """Named ports of a pod's trainer processes: local rank r serves on port + r (named for PodMonitors)."""
    last = min(port + processes - 1, 65535)
    return [
        {"name": "metrics" if p == port else f"metrics-{p - port}", "containerPort": p, "protocol": "TCP"}
        for p in range(port, last + 1)
    ]


def _pod_template(
    benchmark: Benchmark, run: Run, container: dict[str, Any], *, gpus: int, serves_metrics: bool
) -> dict[str, Any]:
    spec = benchmark.spec
    labels = {**spec.metrics.pod_labels, **job_labels(benchmark, run)}
    annotations = dict(spec.metrics.pod_annotations)
    volumes, mounts = _volumes(gpus)
    container = {
        "name": container["name"],
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": mounts,
        **container,
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
    resources = _resources(benchmark, gpus)
    if resources:
        container["resources"] = resources
    pod_spec: dict[str, Any] = {"containers": [container], "volumes": volumes}
    if spec.node_selector:
        pod_spec["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod_spec["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in spec.tolerations]
    if spec.scheduling.priority_class_name:
        pod_spec["priorityClassName"] = spec.scheduling.priority_class_name
    metadata: dict[str, Any] = {"labels": labels}
    if annotations:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "spec": pod_spec}


def _restart_policy(benchmark: Benchmark) -> str:
    # backoffLimit counts container restarts; with none allowed, a failed pod fails the job at once.
    return "OnFailure" if benchmark.spec.run_policy.backoff_limit else "Never"


def render_pytorchjob(benchmark: Benchmark, run: Run) -> dict[str, Any]:
    # "--" ends torchrun's own options: without it argparse's prefix matching takes the trainer's
    # `--run NAME` for torchrun's `--run-path` and fails as ambiguous.
    command = ["torchrun", "--no-python", "--", "gpt2bench", "train", *run.trainer_args()]
    container = {
        "name": PYTORCH_CONTAINER,
        "command": command,
        "env": _env(),
        "ports": [{"name": "pytorchjob-port", "containerPort": PYTORCHJOB_PORT, "protocol": "TCP"}],
    }
    template = _pod_template(benchmark, run, container, gpus=run.devices_per_node, serves_metrics=True)
    replica = {"restartPolicy": _restart_policy(benchmark), "template": template}
    replicas = {"Master": {"replicas": 1, **copy.deepcopy(replica)}}
    if run.nodes > 1:
        replicas["Worker"] = {"replicas": run.nodes - 1, **copy.deepcopy(replica)}
    return {
        "apiVersion": PYTORCHJOB_API,
        "kind": "PyTorchJob",
        "metadata": _metadata(benchmark, run),
        "spec": {
            # Without it the operator's WORLD_SIZE counts pods, not processes.
            "nprocPerNode": str(run.procs_per_node),
            "runPolicy": _run_policy(benchmark, min_available=run.nodes),
            "pytorchReplicaSpecs": replicas,
        },
    }


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
    launcher = _pod_template(
        benchmark,
        run,
        {"name": LAUNCHER_CONTAINER, "command": mpirun_command(run), "env": _env()},
        gpus=0,
        serves_metrics=False,
    )
    launcher["spec"]["containers"][0].pop("resources", None)  # mpirun alone needs little; no GPU
    worker = _pod_template(
        benchmark,
        run,
        {"name": WORKER_CONTAINER, "command": ["/usr/sbin/sshd", "-De"], "env": _env()},
        gpus=run.devices_per_node,
        serves_metrics=True,
    )
    # The image runs as uid 1000; mpi-operator's root mode (sshAuthMountPath /root/.ssh, `sshd -De` on
    # port 22) needs uid 0 in both pods, as mpi-operator's own examples run.
    for template in (launcher, worker):
        template["spec"]["securityContext"] = {"runAsUser": 0}
    restart = _restart_policy(benchmark)
    return {
        "apiVersion": MPIJOB_API,
        "kind": "MPIJob",
        "metadata": _metadata(benchmark, run),
        "spec": {
            "slotsPerWorker": run.procs_per_node,
            "launcherCreationPolicy": "WaitForWorkersReady",
            "mpiImplementation": "OpenMPI",
            "sshAuthMountPath": SSH_AUTH_MOUNT_PATH,
            "runPolicy": _run_policy(benchmark, min_available=run.nodes + 1),
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "restartPolicy": restart, "template": launcher},
                "Worker": {"replicas": run.nodes, "restartPolicy": restart, "template": worker},
            },
        },
    }


def render_job(benchmark: Benchmark, run: Run) -> dict[str, Any]:
    if run.job_kind == "MPIJob":
        return render_mpijob(benchmark, run)
    return render_pytorchjob(benchmark, run)


def render_all(benchmark: Benchmark) -> list[dict[str, Any]]:
    return [render_job(benchmark, run) for run in plan_runs(benchmark)]


class _NoAliasDumper(yaml.SafeDumper):
    """Print repeated structures in full: `&id001` anchors confuse readers and some GitOps tools."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_jobs(jobs: list[dict[str, Any]]) -> str:
    """Jobs as a multi-document YAML stream."""
    return yaml.dump_all(jobs, Dumper=_NoAliasDumper, sort_keys=False, explicit_start=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpt2bench render", description=__doc__.split("\n\n")[0])
    parser.add_argument("file", help="GPT2Benchmark YAML")
    parser.add_argument("-n", "--namespace", help="namespace of the jobs (default: the resource's, else default)")
    args = parser.parse_args(argv)
    try:
        benchmark = load_benchmark_file(args.file)
    except OSError as exc:
        print(f"gpt2bench render: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except SpecError as exc:
        for line in exc.lines():
            print(f"gpt2bench render: {line}", file=sys.stderr)
        return 2
    if args.namespace:
        if problem := dns1123_label_problem(args.namespace):
            print(f"gpt2bench render: --namespace: {problem}", file=sys.stderr)
            return 2
        benchmark = benchmark.model_copy(update={"namespace": args.namespace})
    sys.stdout.write(dump_jobs(render_all(benchmark)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
