"""A run as an MPIJob (kubeflow.org/v2beta1, mpi-operator): a Launcher running mpirun, sshd Workers.

Non-root, as mpi-operator's `examples/v2beta1/pi` runs: mpi-operator mounts the job's key pair at
`sshAuthMountPath` (the image user's ~/.ssh), the Workers run `sshd -De -f ~/.sshd_config` as that user on
port 2222 (the image's config: `Port 2222`, its PidFile and HostKey in the home folder), and mpirun reaches
them there (`plm_rsh_args -p 2222`; mpi-operator's own `-o ConnectionAttempts=10` is kept).

The launcher is created with the workers (`launcherCreationPolicy: AtStartup`, mpi-operator's default) and
waits for their sshd itself (`gpt2bench launch --wait-seconds`): mpi-operator puts the launcher in the job's
PodGroup too, and its default gang size is workers + 1, so with `WaitForWorkersReady` a gang scheduler would
wait for a launcher that mpi-operator creates only once the workers run (kubeflow/mpi-operator#608). Every pod
exists from the start, and `schedulingPolicy.minAvailable` is all of them.
"""

from __future__ import annotations

from typing import Any

from gpt2bench.conventions import (
    LAUNCHER_CONTAINER,
    MPIJOB_API,
    NODE_NAME_ENV,
    OUTPUT_ENV,
    POD_CPUS_ENV,
    SSH_PORT,
    TRAINER_HOME,
    WORKER_CONTAINER,
)
from gpt2bench.plan import Run
from gpt2bench.render.pods import RunPods, forwarded_env

SSH_AUTH_MOUNT_PATH = f"{TRAINER_HOME}/.ssh"
# Ranks that mpirun starts over ssh do not inherit their pod's env: sshd hands each session the node the pod
# runs on (the kubelet expands $(VAR) from the container's env), so that every rank records its own node.
SSHD_COMMAND = ["/usr/sbin/sshd", "-De", "-f", f"{TRAINER_HOME}/.sshd_config",
                "-o", f"SetEnv={NODE_NAME_ENV}=$({NODE_NAME_ENV})"]
# mpirun's ssh options: the command line wins over the OMPI_MCA_plm_rsh_args mpi-operator injects, so its
# ConnectionAttempts is repeated here.
RSH_ARGS = f"-p {SSH_PORT} -o ConnectionAttempts=10"
# Forwarded from the launcher to every rank (an unset one only draws a warning from mpirun), then the user's
# own (spec.pods.env): the fabric's NCCL_*/FI_* settings must reach the ranks on every node. Not the node's name:
# each rank's own comes from its pod's sshd (SSHD_COMMAND).
MPI_FORWARDED_ENV = ("PATH", "LD_LIBRARY_PATH", "PYTHONUNBUFFERED", OUTPUT_ENV, POD_CPUS_ENV,
                     "TORCHINDUCTOR_CACHE_DIR")
# On CPU a rank has a core or less (its share of the pod's CPUs), and Open MPI's ranks busy-poll while they wait,
# taking the core a neighbour computes on: yielding brought Horovod from 0.73x ddp's tokens/s to 1.02x at equal
# threads (benchmarks/bench_horovod_cpu.py; docs/performance.md). GPU ranks keep Open MPI's default (not measured
# there: no GPU was lent to this work).
CPU_MCA = ("-mca", "mpi_yield_when_idle", "1")
# The launcher runs `gpt2bench launch`, mpirun and one ssh client per worker, and trains nothing: small,
# bounded, requests = limits (Guaranteed, never the first evicted). Not timed, so a CPU limit costs nothing.
# The launcher is created with the workers, so that a gang of every pod can be met (module docstring).
# Open MPI's own transport, pinned (Horovod's control messages; its data goes over NCCL on GPUs): the ob1 PML
# over TCP, as AWS's reference MPIJob does (aws-samples/awsome-distributed-training, nccl-tests.yaml: `pml ^ucx`,
# `btl tcp,self`). Unpinned, Ubuntu's Open MPI picks UCX (or libfabric's btl/mtl) where a node has InfiniBand or
# EFA, which then probes devices the pod may not own and can hang in MPI_Init. GPU ranks take exactly AWS's pair;
# CPU ranks keep the shared-memory btl (vader) their single-node figures were measured with.
TRANSPORT_MCA = ("-mca", "pml", "ob1")
GPU_BTL_MCA = ("-mca", "btl", "tcp,self")
CPU_BTL_MCA = ("-mca", "btl", "self,vader,tcp")
# The interface Open MPI keeps to when NCCL_SOCKET_IFNAME does not say: GKE's multi-network pods name theirs
# (networking.gke.io/default-interface: eth0, beside gvnic-1 and rdma-0..7), a Multus pod's own network is eth0.
GKE_DEFAULT_INTERFACE = "networking.gke.io/default-interface"
MULTUS_NETWORKS = "k8s.v1.cni.cncf.io/networks"
POD_NETWORK_INTERFACE = "eth0"
LAUNCHER_CREATION_POLICY = "AtStartup"
LAUNCHER_RESOURCES = {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"cpu": "500m", "memory": "512Mi"}}


def interface_mca(socket_ifname: str | None) -> list[str]:
    """Open MPI's TCP interfaces (its out-of-band channel from the launcher, and the ranks' messages) from the
    spec's NCCL_SOCKET_IFNAME, so that mpirun does not try a fabric or container interface the other pod cannot
    reach and hang there. NCCL's syntax (docs.nvidia.com, NCCL env: NCCL_SOCKET_IFNAME): `eth0,eth1` interfaces
    (NCCL matches prefixes, Open MPI whole names), `=eth0` exactly, `^docker,lo` all but these (Open MPI's
    exclude list, loopback kept out)."""
    value = (socket_ifname or "").strip()
    if not value:
        return []
    exclude = value.startswith("^")
    names = ",".join(part for part in value.lstrip("^").lstrip("=").split(",") if part.strip())
    if not names:
        return []
    if exclude:
        names = ",".join(dict.fromkeys(["127.0.0.1/8", *names.split(",")]))
    verb = "exclude" if exclude else "include"
    return ["-mca", f"btl_tcp_if_{verb}", names, "-mca", f"oob_tcp_if_{verb}", names]


def mpirun_command(run: Run, user_env: list[str] = (), socket_ifname: str | None = None,
                   wait_seconds: int = 0) -> list[str]:
    """The launcher's command: mpirun over the hostfile mpi-operator mounts, wrapped by `gpt2bench launch`, which
    first waits up to `wait_seconds` for every worker's sshd; `user_env`: the names forwarded after the project's
    own (render.pods.forwarded_env); `socket_ifname`: the spec's NCCL_SOCKET_IFNAME, for Open MPI's interfaces."""
    names = list(dict.fromkeys([*MPI_FORWARDED_ENV, *user_env]))
    forward = [arg for name in names for arg in ("-x", name)]
    wait = ["--wait-seconds", str(wait_seconds)] if wait_seconds else []
    return [
        "gpt2bench", "launch", *wait, "--",
        "mpirun", "-np", str(run.world_size), "-mca", "plm_rsh_args", RSH_ARGS,
        "-bind-to", "none", "-map-by", "slot", *TRANSPORT_MCA, *(GPU_BTL_MCA if run.devices_per_node else CPU_BTL_MCA),
        *(() if run.devices_per_node else CPU_MCA),
        *interface_mca(socket_ifname), *forward,
        "gpt2bench", "train", *run.trainer_args(),
    ]  # fmt: skip


def launcher_command(pods: RunPods) -> list[str]:
    """The MPI launcher's command for this run (an MPIJob's, a Trainer v2 MPI runtime's): the fabric's and the
    user's variables forwarded, Open MPI on NCCL's interfaces, the launcher waiting for the workers' sshd as
    long as the run may wait to start."""
    spec = pods.benchmark.spec
    socket_ifname = next((item.value for item in spec.pods.env if item.name == "NCCL_SOCKET_IFNAME"), None)
    if not socket_ifname:  # pods with a fabric's extra interfaces: the pod network's own, which the launcher has
        annotations = spec.pods.annotations
        socket_ifname = annotations.get(GKE_DEFAULT_INTERFACE) or (
            POD_NETWORK_INTERFACE if MULTUS_NETWORKS in annotations else None)
    policy = spec.run_policy
    return mpirun_command(pods.run, forwarded_env(pods.benchmark), socket_ifname,
                          wait_seconds=policy.capacity_seconds + policy.startup_seconds)


def render_mpijob(pods: RunPods) -> dict[str, Any]:
    run = pods.run
    launcher = pods.template(
        {"name": LAUNCHER_CONTAINER, "command": launcher_command(pods), "env": pods.env},
        gpus=0,
        serves_metrics=False,
        resources=LAUNCHER_RESOURCES,
        trains=False,
    )
    worker = pods.template(
        {
            "name": WORKER_CONTAINER,
            "command": SSHD_COMMAND,
            "env": pods.env,
            "ports": [{"name": "ssh", "containerPort": SSH_PORT, "protocol": "TCP"}],
            # Ready once sshd listens: mpi-operator's Service then publishes the worker's address.
            "readinessProbe": {"tcpSocket": {"port": SSH_PORT}, "initialDelaySeconds": 1, "periodSeconds": 2},
        },
    )
    restart = pods.restart_policy
    return {
        "apiVersion": MPIJOB_API,
        "kind": "MPIJob",
        "metadata": pods.metadata,
        "spec": {
            "slotsPerWorker": run.procs_per_node,
            "launcherCreationPolicy": LAUNCHER_CREATION_POLICY,
            "mpiImplementation": "OpenMPI",
            "sshAuthMountPath": SSH_AUTH_MOUNT_PATH,
            "runPolicy": pods.run_policy(min_available=run.nodes + 1),  # every pod: they all exist from the start
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "restartPolicy": restart, "template": launcher},
                "Worker": {"replicas": run.nodes, "restartPolicy": restart, "template": worker},
            },
        },
    }
