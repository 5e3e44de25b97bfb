"""Where a run really ran: the node of each rank, and the transport NCCL used between them.

Two answers a multi-node figure is worth nothing without (docs/clusters.md):

- **Nodes.** Each pod gets its node's name from the downward API (`GPT2BENCH_NODE_NAME`, render/pods.py;
  MPI ranks started over ssh from their pod's sshd); every rank puts it in its payload, and the summary
  says how many distinct nodes the run used (`nodes_used`), so a "2-node" run whose pods shared one machine
  is reported as such.
- **Transport.** On GPUs the trainer asks NCCL for its INFO log of the INIT and NET subsystems, one file per
  rank (`NCCL_DEBUG_FILE`, in the run's output folder), and reads it at the end: the network plugin NCCL
  picked (`Using network IB`), and how each channel connects to its peers (`via NET/IB/0/GDRDMA`,
  `via NET/Socket/1`, `via P2P/IPC`, `via SHM/direct/direct`). A run whose channels went through the network
  used that net (`NET/IB`, `NET/OFI` for libfabric/EFA, `NET/Socket`, or the plugin's name); one whose
  channels all stayed inside a node used P2P/SHM only.

The parser is tested on NCCL log lines published in NCCL's, nccl-tests' and aws-ofi-nccl's issue trackers
(tests/test_fabric.py); no GPU has run it here.

What the run expects of the fabric (`spec.fabric`, `FabricPolicy`): right after the process group is created,
a warm-up collective makes NCCL connect the ranks, every rank reads its log so far (`transport_problems`) and the
workers agree (a second collective) on whether to stop: a multi-node run whose NCCL reached the other nodes over
sockets (and, where GPUDirect RDMA is expected, one whose network channels moved no GPU memory directly) ends
with the reason and NCCL's own words on the cause (`fallback_reason`), before the model is built or compiled,
instead of measuring TCP for hours. A run of one node does none of this. Each rank also records the NCCL it
loaded (version, library file). Parameter-server strategies exchange their messages over gloo, which is TCP: across nodes
their transport is `gloo/TCP`, with a note like NCCL's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpt2bench.conventions import FABRIC_ENV, GPUDIRECT_RDMA_ENV, NCCL_ENV_SCRIPT_ENV, NODE_NAME_ENV

from .memlock import pinned_memory_summary

NCCL_LOG_FOLDER = "nccl"
# The net plugins NCCL and its plugins name, and the transport family each is (the names NCCL prints after
# "Using network" and in "via NET/<name>/<device>").
NET_FAMILIES = {
    "IB": "NET/IB",  # NCCL's own verbs transport: InfiniBand and RoCE
    "IBext": "NET/IB",  # NVIDIA's nccl-rdma-sharp-plugins (HPC-X), the same verbs
    "Socket": "NET/Socket",  # TCP over the pod network (or the host's, with hostNetwork)
    "Libfabric": "NET/OFI",  # aws-ofi-nccl (EFA), newer releases
    "AWS Libfabric": "NET/OFI",  # aws-ofi-nccl, older releases
    "OFI": "NET/OFI",
}
_USING_NETWORK = re.compile(r"NCCL INFO Using network (?P<name>.+?)\s*$")
_VIA = re.compile(r"NCCL INFO (?:Channel|Ring) \d+(?:/\d+)? : .*? via (?P<via>.+?)\s*$")
_OFI_PROVIDER = re.compile(r"NCCL INFO NET/OFI Selected Provider is (?P<provider>\S+)")
_VERSION = re.compile(r"NCCL INFO NCCL version (?P<version>\S+)")
# NCCL's own words for why a network or GPUDirect is not there, as it logs them (NCCL src/transport/net_ib,
# src/plugin/net.cc; aws-ofi-nccl): a device it did not find, a plugin that did not load, GPUDirect turned off.
_CAUSE = re.compile(r"NCCL (?:INFO|WARN) (?P<said>.*(?:No device found|Could not find|dlerror|Failed to open|"
                    r"failed to load|Unable to load|unable to find|No plugin found|GPU Direct RDMA Disabled|"
                    r"Failed to initialize|fi_getinfo).*?)\s*$", re.I)
_WARN = re.compile(r"NCCL WARN (?P<said>.+?)\s*$")
MAX_CAUSES = 8
_DMABUF = re.compile(r"NCCL INFO DMA-BUF is available")
# What lets an RDMA NIC read GPU memory: NVIDIA's peer-memory module (nvidia-peermem, the older nv_peer_mem) on
# the node, or the kernel's dma-buf (NCCL 2.19+ with the open driver says `DMA-BUF is available on GPU device`).
PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")
SYS_MODULE = Path("/sys/module")


def peermem_module(sys_module: Path = SYS_MODULE) -> str | None:
    """The peer-memory module loaded on this node (a pod sees the host's /sys/module), None when none is."""
    return next((name for name in PEERMEM_MODULES if (sys_module / name).is_dir()), None)


def net_family(name: str) -> str:
    """`IB` -> `NET/IB`; versioned plugin names (`IBext_v8`) by their base; an unknown plugin as `NET/<name>`."""
    base = re.sub(r"_v\d+$", "", name.strip())
    return NET_FAMILIES.get(base, f"NET/{base}")


@dataclass
class NcclTransport:
    """What one rank's NCCL log says."""

    network: str | None = None  # the net plugin NCCL loaded ("IB", "Socket", "Libfabric", ...)
    inter_node: set[str] = field(default_factory=set)  # families of the channels through the network
    intra_node: set[str] = field(default_factory=set)  # P2P, SHM, ... of the channels inside a node
    gpudirect_rdma: bool = False  # a network channel reads/writes GPU memory directly (GDRDMA)
    provider: str | None = None  # libfabric's provider (efa) under aws-ofi-nccl
    version: str | None = None  # the NCCL this rank loaded, as it says (`NCCL version 2.21.5+cuda12.4`)
    dmabuf: bool = False  # NCCL found dma-buf support on its GPU (a GPUDirect RDMA path without nvidia-peermem)
    causes: list[str] = field(default_factory=list)  # NCCL's own words on a network or GPUDirect it did not get

    @property
    def transport(self) -> str | None:
        """The run's transport as this rank saw it: the network's family when a channel crossed nodes (several
        joined with '+'), else the intra-node transports, else None (no channel was set up)."""
        if self.inter_node:
            return "+".join(sorted(self.inter_node))
        if self.intra_node:
            return "+".join(sorted(self.intra_node))
        return None

    def payload(self) -> dict[str, Any]:
        return {"transport": self.transport, "nccl_network": self.network, "crossed_nodes": bool(self.inter_node),
                "gpudirect_rdma": self.gpudirect_rdma if self.inter_node else None, "ofi_provider": self.provider,
                "nccl_version": self.version, "nccl_causes": self.causes or None, "dmabuf": self.dmabuf}


def parse_nccl_log(text: str) -> NcclTransport:
    """Read an NCCL INFO log (any subsystems; lines of other levels are ignored)."""
    found = NcclTransport()
    for line in text.splitlines():
        if "NCCL INFO" not in line:
            continue
        if (said := _CAUSE.search(line) or _WARN.search(line)) and len(found.causes) < MAX_CAUSES:
            text = said["said"].strip()
            if text not in found.causes:
                found.causes.append(text)
        if match := _USING_NETWORK.search(line):
            found.network = match["name"]
        elif match := _VERSION.search(line):
            found.version = match["version"]
        elif _DMABUF.search(line):
            found.dmabuf = True
        elif match := _OFI_PROVIDER.search(line):
            found.provider = match["provider"]
        elif match := _VIA.search(line):
            via = match["via"]
            if via.startswith("NET/"):
                name = via[len("NET/"):].split("/")[0]
                found.inter_node.add(net_family(name))
                found.gpudirect_rdma |= "/GDRDMA" in via
            else:
                found.intra_node.add(via.split("/")[0])
    return found


MAPS = Path("/proc/self/maps")


def loaded_nccl_library(maps: Path = MAPS) -> str | None:
    """The libnccl this process mapped (/proc/self/maps): the wheel's, the image's, or one a plugin ships first on
    LD_LIBRARY_PATH (GKE's gIB), which is what makes two clusters' figures comparable or not. None before NCCL
    is loaded, or outside Linux."""
    try:
        text = maps.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        path = line.split(maxsplit=5)[5].strip() if len(line.split(maxsplit=5)) == 6 else ""
        if Path(path).name.startswith("libnccl.so"):
            return path
    return None


def nccl_log_path(output: str, rank: int) -> Path:
    return Path(output) / NCCL_LOG_FOLDER / f"rank{rank}.log"


def ask_nccl_for_its_log(output: str, rank: int, environ: dict[str, str] | None = None) -> Path | None:
    """Before any process group exists: NCCL_DEBUG=INFO for its INIT and NET subsystems, into this rank's own
    file. A user's NCCL_DEBUG/NCCL_DEBUG_SUBSYS are kept (a quieter level hides the transport: the summary then
    says why it has none). Returns the file, None where NCCL would not write one."""
    environ = os.environ if environ is None else environ
    environ.setdefault("NCCL_DEBUG", "INFO")
    if environ["NCCL_DEBUG"].upper() not in ("INFO", "TRACE"):
        return None
    environ.setdefault("NCCL_DEBUG_SUBSYS", "INIT,NET")
    path = nccl_log_path(output, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    environ["NCCL_DEBUG_FILE"] = str(path)
    return path


def node_name(environ: dict[str, str] | None = None) -> str | None:
    """This pod's node (downward API); None outside a pod, or where the kubelet left `$(VAR)` unexpanded."""
    value = (os.environ if environ is None else environ).get(NODE_NAME_ENV, "").strip()
    return value if value and not value.startswith("$(") else None


def rank_payload(nccl_log: Path | None, uses_nccl: bool) -> dict[str, Any]:
    """This rank's node and, on NCCL, what its log says (or why there is nothing to read)."""
    payload: dict[str, Any] = {"node_name": node_name()}
    if not uses_nccl:
        return payload
    if nccl_log is None:
        payload["transport_reason"] = (f"NCCL_DEBUG={os.environ.get('NCCL_DEBUG')} is set: NCCL logs its "
                                       "transport at INFO only")
        return payload
    try:
        text = nccl_log.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        payload["transport_reason"] = f"no NCCL log at {nccl_log}: {exc.strerror or exc}"
        return payload
    payload.update(parse_nccl_log(text).payload(), nccl_library=loaded_nccl_library(), peermem=peermem_module())
    return payload


def fabric_summary(payloads: list[dict[str, Any]], nodes_asked: int, on_gpu: bool,
                   between_nodes: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """The run's nodes and transport from every rank's payload, and the notes they call for: a run of N nodes
    that used fewer, a multi-node run whose NCCL traffic went over sockets, ranks that could not lock the memory
    RDMA registers. `between_nodes`: the strategy's own transport between nodes where it does not use NCCL
    (parameter servers: gloo/TCP)."""
    ranked = sorted(payloads, key=lambda p: p.get("job_rank", 0))
    names = [p.get("node_name") for p in ranked]
    known = {name for name in names if name}
    nodes_used = len(known) if known and all(names) else None
    transports = sorted({p["transport"] for p in ranked if p.get("transport")})
    crossed = any(p.get("crossed_nodes") for p in ranked)
    summary = {
        "node_names": names if known else None,
        "nodes_used": nodes_used,
        "transport": "+".join(transports) if transports else None,
        "nccl_network": next((p["nccl_network"] for p in ranked if p.get("nccl_network")), None),
        "gpudirect_rdma": any(p.get("gpudirect_rdma") for p in ranked) if crossed else None,
        "ofi_provider": next((p["ofi_provider"] for p in ranked if p.get("ofi_provider")), None),
        "transport_reason": next((p["transport_reason"] for p in ranked if p.get("transport_reason")), None)
                            if on_gpu and not transports else None,
        "nccl_env_applied": next((p["nccl_env_applied"] for p in ranked if p.get("nccl_env_applied")), None),
        "fabric_require": FabricPolicy.from_env().require,
        "gpudirect_rdma_required": FabricPolicy.from_env().gpudirect_rdma,
        # the NCCL each rank loaded (by job rank): its version as it says, and the library file mapped
        "nccl_versions": [p.get("nccl_version") for p in ranked] if any(p.get("nccl_version") for p in ranked)
                         else None,
        "nccl_libraries": [p.get("nccl_library") for p in ranked] if any(p.get("nccl_library") for p in ranked)
                          else None,
        "nccl_causes": sorted({cause for p in ranked for cause in p.get("nccl_causes") or []}) or None,
        # what could give GPUDirect RDMA, per job rank: the node's peer-memory module, NCCL's dma-buf
        "gpudirect_support": [{"peermem": p.get("peermem"), "dmabuf": bool(p.get("dmabuf"))} for p in ranked]
                             if any("dmabuf" in p for p in ranked) else None,
    }
    summary.update(pinned_memory_summary(ranked))
    notes = []
    if between_nodes == GLOO_TCP:
        gloo, gloo_notes = gloo_transport(max(nodes_asked, nodes_used or 0), on_gpu)
        summary.update(gloo)
        notes += gloo_notes
    if summary["can_lock_memory"] is False and summary["rdma_devices"] and on_gpu:
        notes.append(f"a rank may lock only {summary['memlock_bytes'] / 2**20:g} MiB of memory (RLIMIT_MEMLOCK, no "
                     "CAP_IPC_LOCK in effect): RDMA registration may fail and NCCL fall back to sockets "
                     "(docs/clusters.md, Pinned memory)")
    builds = {(p.get("nccl_version"), p.get("nccl_library")) for p in ranked if p.get("nccl_version")}
    if len(builds) > 1:
        notes.append("the ranks loaded different NCCL builds (" + "; ".join(
            f"{version} from {library or 'an unknown file'}" for version, library in sorted(builds, key=str))
            + "): their figures mix two libraries (the summary's nccl_versions, nccl_libraries)")
    if nodes_used is not None and nodes_used < nodes_asked:
        notes.append(f"ran on {nodes_used} node(s), not the {nodes_asked} its scale asks for: its pods shared a "
                     "machine, so it measures fewer network hops than its scale says (spec.scheduling."
                     "spreadAcrossNodes)")
    if (nodes_asked > 1 or (nodes_used or 0) > 1) and "NET/Socket" in transports:
        notes.append("NCCL's traffic between nodes went over sockets (NET/Socket), not the cluster's fabric: "
                     "its figures measure the pod network (docs/clusters.md says what a fabric needs)")
    return summary, notes


# ------------------------------------------------------------------ what the run expects of the fabric
REQUIRE_CHOICES = ("auto", "rdma", "none")
GLOO_TCP = "gloo/TCP"  # what parameter-server strategies' messages between nodes travel over
SOCKET_FALLBACK, NO_GPUDIRECT = 0, 1  # indices of the flags the workers agree on after the first step


@dataclass(frozen=True)
class FabricPolicy:
    """spec.fabric, as the pod's environment carries it (render/pods.py)."""

    require: str = "auto"  # auto | rdma | none
    gpudirect_rdma: bool = False
    nccl_env_script: str | None = None

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> FabricPolicy:
        environ = os.environ if environ is None else environ
        require = environ.get(FABRIC_ENV) or "auto"
        if require not in REQUIRE_CHOICES:
            raise RuntimeError(f"{FABRIC_ENV}={require!r} is not one of {', '.join(REQUIRE_CHOICES)}")
        return cls(require, environ.get(GPUDIRECT_RDMA_ENV) == "1", environ.get(NCCL_ENV_SCRIPT_ENV) or None)

    def checks_transport(self, nodes: int) -> bool:
        """Whether the first step's transport may stop this run: a run of several nodes, not opted out."""
        return nodes > 1 and self.require != "none"


_PRINT_ENV = "import os, sys; sys.stdout.write('\\0'.join(f'{k}={v}' for k, v in os.environ.items()))"


def apply_nccl_env_script(path: str, environ: dict[str, str] | None = None) -> list[str]:
    """Source `path` (the node's set_nccl_env.sh) in a shell and take the NCCL_* variables it sets that this
    process does not already have (the spec's own env wins). Returns their names; raises RuntimeError with the
    shell's words when it cannot be sourced."""
    environ = os.environ if environ is None else environ
    try:
        # the environment after sourcing, printed by this Python (the script may change PATH)
        done = subprocess.run(["bash", "-c", '. "$0" >&2 && exec "$1" -c "$2"', path, sys.executable, _PRINT_ENV],
                              env=dict(environ), capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"spec.fabric.ncclEnvScript: cannot source {path}: {exc}") from None
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        raise RuntimeError(f"spec.fabric.ncclEnvScript: sourcing {path} failed (exit code {done.returncode})"
                           + (f": {said[-1]}" if said else ""))
    applied = []
    for entry in done.stdout.decode(errors="replace").split("\0"):
        name, _, value = entry.partition("=")
        if name.startswith("NCCL_") and name not in environ:
            environ[name] = value
            applied.append(name)
    return sorted(applied)


def transport_problems(found: NcclTransport, policy: FabricPolicy) -> list[float]:
    """This rank's flags after the first step ([SOCKET_FALLBACK, NO_GPUDIRECT], 1.0 where it saw the problem):
    a channel to another node over sockets, or network channels none of which moved GPU memory directly when
    the policy asks for GPUDirect RDMA."""
    flags = [0.0, 0.0]
    if "NET/Socket" in found.inter_node:
        flags[SOCKET_FALLBACK] = 1.0
    if policy.gpudirect_rdma and found.inter_node and not found.gpudirect_rdma:
        flags[NO_GPUDIRECT] = 1.0
    return flags


def gpudirect_hint(found: NcclTransport, peermem: str | None) -> str | None:
    """What this rank had for GPUDirect RDMA, when its channels moved no GPU memory directly."""
    if peermem or found.dmabuf:
        return None
    return (f"no peer-memory module on this node ({' or '.join(PEERMEM_MODULES)} not in {SYS_MODULE}) and NCCL "
            "found no dma-buf support: load nvidia-peermem (the GPU Operator's driver.rdma.enabled, or modprobe "
            "on the node image)")


def fallback_reason(mean_flags: list[float], workers: int, policy: FabricPolicy,
                    causes: list[str] = (), hint: str | None = None) -> str | None:
    """Why the run stops at start (every worker's flags averaged, after the warm-up collective), None when it goes
    on; `causes`: what this rank's NCCL said about it, quoted; `hint`: what this rank lacked (gpudirect_hint)."""
    socket, no_gdr = (round(flag * workers) for flag in mean_flags)
    parts = []
    if socket:
        parts.append(f"NCCL reached the other nodes over sockets (NET/Socket) on {socket} of {workers} ranks, not "
                     "over the cluster's fabric")
    if no_gdr:
        parts.append(f"NCCL's network channels moved no GPU memory directly (no GPUDirect RDMA) on {no_gdr} of "
                     f"{workers} ranks (spec.fabric.gpuDirectRdma)")
    if not parts:
        return None
    said = f" (NCCL said: {'; '.join(repr(cause) for cause in causes)})" if causes else ""
    said += f" ({hint})" if hint else ""
    return ("; ".join(parts) + f"{said}: stopped at start, after the warm-up collective, instead of measuring the "
            f"wrong network (spec.fabric.require {policy.require}; `none` runs a socket baseline on purpose). "
            "docs/clusters.md says what each cluster's fabric needs")


def gloo_transport(strategy_nodes: int, on_gpu: bool) -> tuple[dict[str, Any], list[str]]:
    """A parameter-server run's transport: its messages between nodes are gloo's, over TCP."""
    if strategy_nodes <= 1:
        return {}, []
    notes = ["the parameter servers' messages between nodes went over gloo (TCP), not the cluster's fabric: its "
             "figures measure the pod network"] if on_gpu else []
    return {"transport": GLOO_TCP}, notes
