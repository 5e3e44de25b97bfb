"""A pod of a rendered job as a local process (`Replica`): its container's env expanded as the kubelet does,
its command, its folder, its share of this machine's cores. The executor (executor.py) and the Trainer v2
reader (trainjob.py) both build on it.
"""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpt2bench.conventions import (
    METRICS_ADDRESS_ENV,
    OUTPUT_ENV,
    POD_CPUS_ENV,
    RUNNER_PID_ENV,
    TERMINATION_LOG_ENV,
    TRAINER_HOME,
)
from gpt2bench.specification.expansion import expand
from gpt2bench.trainer.cores import available_cpus


class JobSpecError(ValueError):
    """The job dict cannot be executed locally (unsupported kind, no command, ...)."""


@dataclass
class Replica:
    """One pod of the job, as a local process."""

    role: str  # Master | Worker | Launcher
    index: int
    argv: list[str]
    env: dict[str, str]  # container env after injection and expansion (os.environ is added at start)
    output_dir: Path
    termination_log: Path
    log_path: Path
    gpus: int = 0  # nvidia.com/gpu this replica's processes need on this machine
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return f"{self.role.lower()}-{self.index}"


def container_env(container: dict[str, Any], injected: dict[str, str], pod: dict[str, str]) -> dict[str, str]:
    """The container's env in order, each value expanded against the ones before it (the kubelet's rules,
    `gpt2bench.specification.expansion`), then the operator-injected variables, which override same-named entries."""
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        name = item["name"]
        if "valueFrom" in item and {"secretKeyRef", "configMapKeyRef"} & set(item["valueFrom"] or {}):
            continue  # no Secret here: the process inherits this shell's variable (local/preflight.py checks it)
        if "valueFrom" in item:
            field_path = ((item["valueFrom"] or {}).get("fieldRef") or {}).get("fieldPath")
            if field_path not in pod:
                raise JobSpecError(f"env {name}: valueFrom {item['valueFrom']} is not supported locally")
            env[name] = pod[field_path]
        else:
            env[name] = expand(str(item.get("value", "")), env)
    env.update(injected)
    return env


# ---------------------------------------------------------------- replicas from a job


def share_machine(replicas: list[Replica], pods_each: int = 1) -> list[Replica]:
    """Pods that would each have a node's CPUs share this machine's: each replica gets cores ÷ replicas as its
    pod's budget (conventions.POD_CPUS_ENV), capped by the budget the job rendered. An MPI launcher stands for the
    `pods_each` worker pods whose ranks it starts here, so its cap is theirs together."""
    share = available_cpus() / max(1, len(replicas))  # a container's CPU quota counts, as in the trainer
    for replica in replicas:
        rendered = replica.env.get(POD_CPUS_ENV)
        try:
            budget = share if rendered is None else min(share, float(rendered) * pods_each)
        except ValueError:
            raise JobSpecError(f"env {POD_CPUS_ENV}={rendered!r} is not a number of cores") from None
        replica.env[POD_CPUS_ENV] = f"{budget:g}"
    return replicas



def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def container_named(template: dict[str, Any], preferred: str) -> dict[str, Any]:
    containers = (template.get("spec") or {}).get("containers") or []
    if not containers:
        raise JobSpecError("replica template has no containers")
    return next((c for c in containers if c.get("name") == preferred), containers[0])


def gpus_of(container: dict[str, Any]) -> int:
    limits = (container.get("resources") or {}).get("limits") or {}
    return int(limits.get("nvidia.com/gpu", 0) or 0)


def _argv(container: dict[str, Any], env: dict[str, str], where: str) -> list[str]:
    words = list(container.get("command") or []) + list(container.get("args") or [])
    if not container.get("command"):
        raise JobSpecError(f"{where}: the container has no command (a local run cannot use the image entrypoint)")
    return [expand(str(word), env) for word in words]


def make_replica(
    role: str, index: int, container: dict, injected: dict, run_dir: Path, job_name: str, gpus: int
) -> Replica:
    name = f"{role.lower()}-{index}"
    output_dir = run_dir / name
    local = {  # what differs from a pod: files in the run's folder, metrics on loopback, the runner to die with
        OUTPUT_ENV: str(output_dir),
        TERMINATION_LOG_ENV: str(run_dir / f"{name}.termination-log"),
        METRICS_ADDRESS_ENV: "127.0.0.1",
        RUNNER_PID_ENV: str(os.getpid()),
    }
    pod = {
        "metadata.name": f"{job_name}-{name}",
        "metadata.namespace": "default",
        "status.podIP": "127.0.0.1",
        "spec.nodeName": socket.gethostname(),
    }
    env = container_env(container, {**injected, **local}, pod)
    # paths inside the image user's home (the pods' compile cache) mean nothing here: the shell's, or the default
    env = {key: value for key, value in env.items() if not value.startswith(f"{TRAINER_HOME}/")}
    return Replica(
        role=role,
        index=index,
        argv=_argv(container, env, f"{role}[{index}]"),
        env=env,
        output_dir=output_dir,
        termination_log=Path(local[TERMINATION_LOG_ENV]),
        log_path=run_dir / f"{name}.log",
        gpus=gpus,
    )
