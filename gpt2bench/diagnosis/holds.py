"""One cause, one stop: a failure whose cause is the environment holds the runs that share it (issues 47.1, 50.4).

Pure (entries in, entries out), and the one rule both drivers call: the operator (`controller/sweep.py`) and
`gpt2bench run` (`local/sweep.py`). A run that failed because of its configuration (a NaN, an OOM, a bad flag)
says nothing of the next run; one that failed because of the cluster or the node (NCCL over sockets, a memlock
limit, a driver below the image's floor, pods a namespace's Pod Security refuses, a taint no pod tolerates, the
operator not allowed to create jobs) will fail every run that meets the same cluster the same way, each after its
own start-up. So after the first such failure, the Pending runs that share it are held: they stay Pending with a
reason that starts with `held (<cause>): `, nothing is started for them, and the runs that do not share it go on.

Who shares a cause (`Scope`), precisely:

| cause | recognised by (the run's reason) | held |
|---|---|---|
| `fabric`: NCCL between nodes off the fabric | the trainer's fabric check (`trainer/fabric.py`, `fallback_reason`: `NET/Socket`, no GPUDirect RDMA; NCCL's `No device found`) | every run on 2+ nodes |
| `rdma`: memory RDMA cannot register, no RDMA device | `spec.fabric.require rdma, but ...` (`trainer/cli.py`, `prepare_fabric`) | every run (they all carry `spec.fabric.require: rdma` and land on the same nodes) |
| `driver`: no usable GPU in the pod, a driver below the image's CUDA | `no CUDA device is visible`, CUDA's `driver version is insufficient`, torch's `NVIDIA driver on your system is too old` | every GPU run (one image per device type, the same GPU nodes) |
| `admission`: a pod refused by Pod Security | the job controller's `FailedCreatePod` quoted in the reason: `violates PodSecurity` | a Worker of a PyTorchJob (the training operator's `init-pytorch`): every PyTorchJob run on 2+ nodes; else every run of that job kind |
| `disk`: the disk a run writes to is full | `No space left on device` (ENOSPC) in the run's reason: a trainer that could not write its records | every run (they write to the same folder, or the same node's disk) |
| `taint`: no node tolerates the pods | a start that timed out with the scheduler's `untolerated taint` | every run of the same device type (GPU runs share the GPU nodes' taints) |
| `forbidden`: the operator may not create the job | `the API server refused <Kind> ...: 403 Forbidden: ... cannot create resource` (RBAC's words) | every run of that kind (a NetworkPolicy's: every run); the refused run too, which never existed. The driver tries its creation again at each step and releases the hold once it works |

A held run goes on when the user says the cause is fixed (the operator: the annotation `gpt2bench.io/resume`;
locally: `gpt2bench run FILE --resume --output DIR`), or, for `forbidden`, when creating the job works again. The
run that met the cause keeps its Failed entry (its reason is the evidence); a run that met it again after a resume
holds the others again: one cause, one stop, each time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from gpt2bench.status import FAILED, PENDING, RunStatus

RUNS_HELD = "RunsHeld"  # the benchmark's condition: True while runs are held, its message the causes
HELD = re.compile(r"^held \((?P<cause>[a-z]+)\): ")
FABRIC, RDMA, DRIVER, ADMISSION, TAINT, FORBIDDEN = "fabric", "rdma", "driver", "admission", "taint", "forbidden"
DISK = "disk"
RETRIED = (FORBIDDEN,)  # causes the driver can see go away by itself: it tries the refused call again
QUOTED = 240  # characters of the failed run's reason a held run quotes (its own reason stays below 512)

_FABRIC = re.compile(r"over sockets \(NET/Socket\)|\(no GPUDirect RDMA\)|instead of measuring the wrong network|"
                     r"NET/\w+ ?: No device found|NCCL (?:net )?plugin .*(?:not|failed to) load")
_RDMA = re.compile(r"spec\.fabric\.require rdma, but ")
_DRIVER = re.compile(r"no CUDA device is visible to this process|CUDA driver version is insufficient|"
                     r"NVIDIA driver on your system is too old|cudaErrorInsufficientDriver")
_ADMISSION = re.compile(r'pods? "?(?P<pod>[\w.-]+)"? is forbidden: violates PodSecurity|'
                        r"violates PodSecurity")
_TAINT = re.compile(r"untolerated taint")
_DISK = re.compile(r"No space left on device|ENOSPC")
_STARTUP = "not started within runPolicy.startupSeconds"
_FORBIDDEN = re.compile(r"the API server refused (?P<kind>\w+) \S+: 403 Forbidden: .*cannot create resource")


@dataclass(frozen=True)
class Scope:
    """Which runs share a cause: those on at least `min_nodes` nodes, of `devices` ("gpu"/"cpu", None: either),
    of `job_kind` (None: any)."""

    min_nodes: int = 1
    devices: str | None = None
    job_kind: str | None = None

    def covers(self, entry: RunStatus) -> bool:
        return (entry.nodes >= self.min_nodes
                and (self.devices is None or (entry.devices_per_node > 0) == (self.devices == "gpu"))
                and (self.job_kind is None or entry.job_kind == self.job_kind))

    def describe(self) -> str:
        kind = f"{self.job_kind} " if self.job_kind else ""
        devices = f"{self.devices.upper()} " if self.devices else ""
        nodes = " on 2+ nodes" if self.min_nodes > 1 else ""
        return f"every {devices}{kind}run{nodes}"


@dataclass(frozen=True)
class Cause:
    """An environment's cause of a run's failure: `kind` (the table above), who shares it, and the words."""

    kind: str
    scope: Scope
    words: str

    def held_reason(self, source: str, resume: str) -> str:
        """The reason of a run it holds: the cause, the run that met it, how to go on."""
        met = "was refused" if self.kind == FORBIDDEN else "failed"
        return f"held ({self.kind}): {source} {met} for a cause {self.scope.describe()} shares ({resume}): {self.words}"


def environment_cause(entry: RunStatus) -> Cause | None:
    """Of a Failed run: the environment's cause its reason names, or None (a failure of its own configuration,
    or one that says nothing of the next run)."""
    if entry.phase != FAILED or not entry.reason:
        return None
    reason = entry.reason
    if _RDMA.search(reason):
        return Cause(RDMA, Scope(), _quote(reason, _RDMA))
    if _FABRIC.search(reason):
        return Cause(FABRIC, Scope(min_nodes=2), _quote(reason, _FABRIC))
    if _DRIVER.search(reason):
        return Cause(DRIVER, Scope(devices="gpu"), _quote(reason, _DRIVER))
    if admission := _ADMISSION.search(reason):
        pod = admission.group("pod") or ""
        worker = entry.job_kind == "PyTorchJob" and "-worker-" in pod
        return Cause(ADMISSION, Scope(min_nodes=2 if worker else 1, job_kind=entry.job_kind),
                     _quote(reason, _ADMISSION))
    if _DISK.search(reason):
        return Cause(DISK, Scope(), _quote(reason, _DISK))
    if _TAINT.search(reason) and reason.startswith(_STARTUP):
        return Cause(TAINT, Scope(devices="gpu" if entry.devices_per_node else "cpu"), _quote(reason, _TAINT))
    return None


def refusal_cause(reason: str) -> Cause | None:
    """Of a job (or NetworkPolicy) the API server refused: a 403 of the operator's authorization, which refuses
    every run of that kind until someone changes it; None for any other refusal (the run fails, as before)."""
    found = _FORBIDDEN.search(reason)
    if not found:
        return None
    kind = found.group("kind")
    return Cause(FORBIDDEN, Scope(job_kind=None if kind == "NetworkPolicy" else kind), _quote(reason, _FORBIDDEN))


def _quote(reason: str, pattern: re.Pattern[str]) -> str:
    """The reason around the words that name the cause (a failed run's reason begins with its pod)."""
    if len(reason) <= QUOTED:
        return reason
    start = max(0, pattern.search(reason).start() - QUOTED // 2)
    return ("... " if start else "") + reason[start:start + QUOTED] + " ..."


def held(entry: RunStatus) -> str | None:
    """The cause (kind) holding a Pending run, or None."""
    found = HELD.match(entry.reason or "") if entry.phase == PENDING else None
    return found.group("cause") if found else None


def hold(entries: list[RunStatus], cause: Cause, source: str, resume: str) -> list[RunStatus]:
    """The Pending runs the cause covers, held (a run held already keeps its first cause); `source`: the run that
    met it (held too when it is Pending: a refused creation)."""
    reason = cause.held_reason(source, resume)
    return [entry.model_copy(update={"reason": reason})
            if entry.phase == PENDING and not held(entry) and (cause.scope.covers(entry) or entry.name == source)
            else entry for entry in entries]


def release(entries: list[RunStatus], kinds: Iterable[str] | None = None,
            reason: str | None = None) -> list[RunStatus]:
    """Held runs back to plain Pending: all of them, those of the cause `kinds`, or those held with `reason`."""
    wanted = set(kinds) if kinds is not None else None
    return [entry.model_copy(update={"reason": None})
            if (cause := held(entry)) and (wanted is None or cause in wanted)
            and (reason is None or entry.reason == reason) else entry for entry in entries]


def apply(before: Iterable[RunStatus], after: list[RunStatus], resume: str) -> tuple[list[RunStatus], list[str]]:
    """The rule: every run Failed in `after` that was not in `before` whose cause is the environment's holds the
    Pending runs that share it. Returns the entries and the held reasons that are new (one Event each)."""
    failed_before = {entry.name for entry in before if entry.phase == FAILED}
    known = set(held_reasons(after))
    for entry in after:
        if entry.name in failed_before or (cause := environment_cause(entry)) is None:
            continue
        after = hold(after, cause, entry.name, resume)
    return after, [reason for reason in held_reasons(after) if reason not in known]


def held_reasons(entries: Iterable[RunStatus]) -> dict[str, list[str]]:
    """Each distinct held reason and its runs, in order."""
    found: dict[str, list[str]] = {}
    for entry in entries:
        if held(entry):
            found.setdefault(entry.reason or "", []).append(entry.name)
    return found


def summary(entries: Iterable[RunStatus]) -> str | None:
    """One line for the benchmark (`kubectl get`'s Waiting column, the RunsHeld condition): how many runs are
    held and why; None when none is."""
    reasons = held_reasons(entries)
    if not reasons:
        return None
    return "; ".join(f"{len(names)} run{'s' * (len(names) > 1)} {reason}" for reason, names in reasons.items())


def retry_candidate(entries: Iterable[RunStatus]) -> RunStatus | None:
    """The first run held by a cause the driver may see go away (a refused creation): the one to try again."""
    return next((entry for entry in entries if held(entry) in RETRIED), None)
