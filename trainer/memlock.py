"""Can this process register memory for RDMA? Read at start, before any process group (docs/clusters.md,
Pinned memory).

RDMA (NCCL's InfiniBand/RoCE transport, EFA through libfabric, UCX) pins the buffers it registers, and the
kernel lets a process lock at most RLIMIT_MEMLOCK bytes unless CAP_IPC_LOCK is in its *effective* set. The
rendered pods run as uid 1000 with `allowPrivilegeEscalation: false`: Kubernetes puts an added capability in
the bounding and inheritable sets only, never the ambient one, so a non-root process starts with CapEff 0
(kubernetes/kubernetes#56374) and `capabilities.add: [IPC_LOCK]` changes nothing for it. What it may lock is
then the limit its container runtime hands every container (8 MiB or 64 KiB by default): the fix is on the
nodes, not in the pod.

Three facts, all read from the process itself:
- `memlock_bytes`: its soft RLIMIT_MEMLOCK (None: unlimited);
- `ipc_lock`: CAP_IPC_LOCK in its effective capabilities (`CapEff` of /proc/self/status), which lifts the limit;
- `rdma_devices`: the verbs devices it can open (/dev/infiniband/uverbs*, which the RDMA and EFA device plugins
  mount into a pod they grant a resource), by their device name (mlx5_0, rdmap0s6 ...).
"""

from __future__ import annotations

import resource
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CAP_IPC_LOCK = 14  # linux/capability.h
# What a process should be able to lock: AWS's GPU cluster health check warns below 16 GiB (aws-samples/
# awsome-distributed-training, 4.validation_and_observability/2.gpu-cluster-healthcheck, 2-efa-enumeration.sh);
# every provider's node image sets unlimited.
ENOUGH_BYTES = 16 * 2**30
UVERBS = Path("/dev/infiniband")
VERBS_SYSFS = Path("/sys/class/infiniband_verbs")
STATUS = Path("/proc/self/status")
NODE_FIX = ("raise the container runtime's memlock limit on the nodes (a non-root process never gets CAP_IPC_LOCK "
            "from capabilities.add: kubernetes/kubernetes#56374): containerd, a systemd drop-in "
            "`[Service] LimitMEMLOCK=infinity` for containerd.service; CRI-O, `default_ulimits = "
            "[\"memlock=-1:-1\"]` in crio.conf (OpenShift: a MachineConfig writing it); docs/clusters.md, "
            "Pinned memory, says it per cluster")


def _bytes(value: int) -> int | None:
    return None if value == resource.RLIM_INFINITY else int(value)


def effective_capabilities(status_text: str) -> int:
    """The CapEff mask of a /proc/<pid>/status text (0 when absent)."""
    for line in status_text.splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def rdma_devices(uverbs: Path = UVERBS, sysfs: Path = VERBS_SYSFS) -> list[str]:
    """The verbs devices this process can open, by name (`ibdev` of each /dev/infiniband/uverbsN)."""
    names = []
    for node in sorted(uverbs.glob("uverbs*")):
        try:
            names.append((sysfs / node.name / "ibdev").read_text().strip() or node.name)
        except OSError:
            names.append(node.name)
    return names


@dataclass(frozen=True)
class PinnedMemory:
    """What this process may lock, and the RDMA devices it sees."""

    memlock_bytes: int | None  # soft RLIMIT_MEMLOCK; None: unlimited
    ipc_lock: bool  # CAP_IPC_LOCK effective: the limit does not apply
    rdma_devices: list[str] = field(default_factory=list)

    @property
    def can_lock_enough(self) -> bool:
        return self.ipc_lock or self.memlock_bytes is None or self.memlock_bytes >= ENOUGH_BYTES

    def describe(self) -> str:
        limit = "unlimited" if self.memlock_bytes is None else f"{self.memlock_bytes / 2**20:g} MiB"
        return f"RLIMIT_MEMLOCK {limit}, CAP_IPC_LOCK {'effective' if self.ipc_lock else 'not effective'}"

    def problems(self) -> list[str]:
        """Why RDMA cannot work in this process, each with its fix (empty: it can)."""
        found = []
        if not self.can_lock_enough:
            found.append(f"this process may lock only {self.describe()} (RDMA registers the buffers it sends "
                         f"from; at least {ENOUGH_BYTES // 2**30} GiB or unlimited is needed): {NODE_FIX}")
        if not self.rdma_devices:
            found.append(f"no RDMA device in {UVERBS} (the pod got none: request the fabric's device-plugin "
                         "resource in spec.resources, e.g. rdma/shared_ib or vpc.amazonaws.com/efa)")
        return found

    def payload(self) -> dict[str, Any]:
        return {"memlock_bytes": self.memlock_bytes, "ipc_lock": self.ipc_lock, "rdma_devices": self.rdma_devices}


def read_pinned_memory(status: Path = STATUS, uverbs: Path = UVERBS, sysfs: Path = VERBS_SYSFS) -> PinnedMemory:
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    try:
        caps = effective_capabilities(status.read_text())
    except OSError:
        caps = 0
    return PinnedMemory(_bytes(soft), bool(caps >> CAP_IPC_LOCK & 1), rdma_devices(uverbs, sysfs))


def pinned_memory_summary(payloads: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's view: the lowest limit of any rank (null when every rank is unlimited), whether every rank can
    lock enough, and every RDMA device any rank saw."""
    ranks = [p for p in payloads if "ipc_lock" in p]
    if not ranks:
        return {"memlock_bytes": None, "can_lock_memory": None, "rdma_devices": None}
    limits = [p["memlock_bytes"] for p in ranks if p.get("memlock_bytes") is not None]
    can = all(PinnedMemory(p.get("memlock_bytes"), bool(p.get("ipc_lock"))).can_lock_enough for p in ranks)
    return {"memlock_bytes": min(limits) if limits else None, "can_lock_memory": can,
            "rdma_devices": sorted({name for p in ranks for name in p.get("rdma_devices") or []})}
