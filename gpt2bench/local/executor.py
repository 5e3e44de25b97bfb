"""Execute ONE rendered Kubeflow job (PyTorchJob v1, MPIJob v2beta1, or a Trainer v2 TrainJob: see
gpt2bench/local/trainjob.py) as local processes.

There is no separate "local" code path: the job dict that `gpt2bench.render` returns (and the operator
creates in a cluster) is read here, and each replica that would be a pod becomes a process started with
the container's command + args and env, plus what the Kubeflow operators inject into those pods:

- PyTorchJob (training-operator, pytorch/envvar.go): one process per replica, Master index 0 then
  Workers 1..n-1, each with PYTHONUNBUFFERED, MASTER_ADDR/MASTER_PORT, PET_MASTER_ADDR/PET_MASTER_PORT,
  WORLD_SIZE (= replicas x nprocPerNode), RANK and PET_NODE_RANK (= node rank), PET_NPROC_PER_NODE,
  PET_NNODES. The master address is 127.0.0.1 and the port a free local one (the cluster uses the
  master pod's Service and the `pytorchjob-port`).
- MPIJob (mpi-operator v2beta1): only the Launcher runs, with OMPI_MCA_orte_default_hostfile pointing at
  a local hostfile `localhost slots=<workers x slotsPerWorker>` and the rest of mpi-operator's launcher
  env; mpirun then starts every rank on this machine, so the Worker (sshd) replicas are not started.

`$(VAR)` references in env values, command and args are expanded like the kubelet does. Each replica
gets its own GPT2BENCH_OUTPUT_DIR and GPT2BENCH_TERMINATION_LOG under the run's folder (in a cluster:
its pod's emptyDir and /dev/termination-log). Replicas asking for `nvidia.com/gpu` get disjoint
CUDA_VISIBLE_DEVICES, as the device plugin would give each pod its own GPUs.

Under `gpt2bench run`, whose fork server has imported torch and transformers once for the sweep (forkserver.py),
a replica whose program is a Python script of this interpreter (torchrun) starts through the stand-in
forkclient.py, and `gpt2bench train|launch` ask the server themselves: the same processes, started without their
imports. Replicas that use GPUs never do.

Job outcome: Succeeded when every started replica exits 0; the first failure (or the job's
runPolicy.activeDeadlineSeconds) kills the remaining replicas' process trees. backoffLimit restarts are
not reproduced: a failed run is reported, not retried. Each replica's exit is seen at once (the loop waits on
their pidfds), and the job's time is measured from its first start to its last exit (`JobOutcome.seconds`).
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from gpt2bench import diagnosis
from gpt2bench import jobkinds as kinds
from gpt2bench.clock import SYSTEM_CLOCK
from gpt2bench.conventions import FORKED_COMMANDS, FORKSERVER_ENV, TRAINJOB_CONTAINER
from gpt2bench.local import forkclient
from gpt2bench.local.processes import die_with_parent, kill_tree, private_tmpdir
from gpt2bench.local.replicas import (
    JobSpecError,
    Replica,
    container_named,
    free_port,
    gpus_of,
    make_replica,
    share_machine,
)
from gpt2bench.local.trainjob import trainjob_replicas

KILL_GRACE_SECONDS = 5.0

_INSTALL_HINTS = {
    "mpirun": "install Open MPI (Debian: apt-get install openmpi-bin libopenmpi-dev)",
    "horovodrun": "install Horovod (scripts/install.sh builds it against torch)",
    "torchrun": "install PyTorch (pip install torch)",
    "gpt2bench": "install this project (pip install -e .)",
}


_WRAPPERS = {"gpt2bench", "torchrun"}  # run the program named after `--`


@dataclass
class JobOutcome:
    phase: str  # Succeeded | Failed
    reason: str | None
    termination_message: str  # of the primary replica, as the operator would read it from its pod
    start_time: datetime
    completion_time: datetime
    primary: Replica  # the replica whose output dir holds steps.jsonl (Master-0 / Launcher-0)
    exit_codes: dict[str, int | None]
    cause: str | None = None  # the first replica that failed, how and what it said (gpt2bench.diagnosis)
    seconds: float | None = None  # first replica started -> last one's exit seen (monotonic); None: none started


# How long the runner waits for the cause of an end another replica caused (diagnosis.caused_by_another) to end
# too: the operator ranks pods that ended in the same second alike.
TIE_SECONDS = 1.0


def exit_fd(pid: int) -> int | None:
    """A pidfd that becomes readable when `pid` ends; None on a kernel without pidfd_open (before Linux 5.3), where
    the loop polls every poll_seconds instead."""
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def _settle(exits: list[int | None], codes: list[int | None], seconds: float) -> None:
    """Wait until every replica still running has ended, or `seconds` have passed."""
    if any(fd is None and code is None for fd, code in zip(exits, codes)):
        time.sleep(seconds)  # no pidfd to wait on: the whole tie
        return
    waiting = [fd for fd, code in zip(exits, codes) if code is None]
    deadline = time.monotonic() + seconds
    while waiting and (left := deadline - time.monotonic()) > 0:
        ended = select.select(waiting, [], [], left)[0]
        waiting = [fd for fd in waiting if fd not in ended]


def pytorchjob_replicas(job: dict[str, Any], run_dir: Path, runtimes: dict[str, dict] | None = None) -> list[Replica]:
    """Master then Workers, one process per replica, with the training operator's env (`runtimes`: unused,
    a PyTorchJob names none)."""
    spec = job.get("spec") or {}
    replica_specs, roles = kinds.replica_specs(job), kinds.replica_types(job)  # Master, then Workers
    if "Master" not in replica_specs:
        raise JobSpecError("PyTorchJob without a Master replica is not supported locally")
    unknown = set(replica_specs) - set(roles)
    if unknown:
        raise JobSpecError(f"PyTorchJob replica types {sorted(unknown)} are not supported locally")
    if spec.get("elasticPolicy"):
        raise JobSpecError("PyTorchJob elasticPolicy is not supported locally")
    nproc_raw = str(spec.get("nprocPerNode", "1"))
    nproc = int(nproc_raw) if nproc_raw.isdigit() else 1  # training-operator: non-integer ("auto") counts 1
    counts = {role: int(replica_specs[role].get("replicas", 1)) for role in roles if role in replica_specs}
    total = sum(counts.values())
    port = str(free_port())
    replicas = []
    for role in roles:
        for index in range(counts.get(role, 0)):
            node_rank = index if role == "Master" else index + 1
            injected = {
                "PYTHONUNBUFFERED": "0",
                "MASTER_PORT": port,
                "MASTER_ADDR": "127.0.0.1",
                "PET_MASTER_PORT": port,
                "PET_MASTER_ADDR": "127.0.0.1",
                "WORLD_SIZE": str(total * nproc),
                "RANK": str(node_rank),
                "PET_NPROC_PER_NODE": nproc_raw,
                "PET_NODE_RANK": str(node_rank),
                "PET_NNODES": str(total),
            }
            container = container_named(replica_specs[role]["template"], kinds.replica_container(job, role))
            replicas.append(
                make_replica(role, index, container, injected, run_dir, job["metadata"]["name"], gpus_of(container))
            )
    return share_machine(replicas)


def mpijob_replicas(job: dict[str, Any], run_dir: Path, runtimes: dict[str, dict] | None = None) -> list[Replica]:
    """The Launcher alone, with mpi-operator's env and a local hostfile of every Worker's slots (`runtimes`:
    unused, an MPIJob names none)."""
    spec = job.get("spec") or {}
    replica_specs = kinds.replica_specs(job)
    if "Launcher" not in replica_specs:
        raise JobSpecError("MPIJob without a Launcher replica")
    slots = int(spec.get("slotsPerWorker", 1))
    workers = int((replica_specs.get("Worker") or {}).get("replicas", 0))
    total_slots = max(workers, 1) * slots
    hostfile = run_dir / "hostfile"
    run_dir.mkdir(parents=True, exist_ok=True)
    hostfile.write_text(f"localhost slots={total_slots}\n", encoding="utf-8")
    implementation = spec.get("mpiImplementation", "OpenMPI")
    if implementation == "OpenMPI":
        injected = {
            "K_MPI_JOB_ROLE": "launcher",
            "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
            "OMPI_MCA_orte_default_hostfile": str(hostfile),
            "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_orte_set_default_slots": str(slots),
        }
    elif implementation == "Intel":
        injected = {"K_MPI_JOB_ROLE": "launcher", "I_MPI_HYDRA_HOST_FILE": str(hostfile)}
    elif implementation == "MPICH":
        injected = {"K_MPI_JOB_ROLE": "launcher", "HYDRA_HOST_FILE": str(hostfile)}
    else:
        raise JobSpecError(f"MPIJob mpiImplementation {implementation!r} is not supported locally")
    container = container_named(replica_specs["Launcher"]["template"], kinds.replica_container(job, "Launcher"))
    # The ranks run here, under mpirun: they need the GPUs the Worker pods would have had.
    worker = kinds.replica_container(job, "Worker")
    worker_gpus = gpus_of(container_named(replica_specs["Worker"]["template"], worker)) if workers else 0
    launcher = make_replica("Launcher", 0, container, injected, run_dir, job["metadata"]["name"], worker_gpus * workers)
    return share_machine([launcher], pods_each=max(workers, 1))


# What each kind of the shared table (gpt2bench.jobkinds, which says where a job keeps its replicas, containers,
# runtime and deadline) becomes here: its pods as processes, with what its operator would inject into them.
LOCAL_REPLICAS: dict[str, Callable[[dict[str, Any], Path, dict[str, dict] | None], list[Replica]]] = {
    "PyTorchJob": pytorchjob_replicas,
    "MPIJob": mpijob_replicas,
    "TrainJob": trainjob_replicas,
}


def job_replicas(job: dict[str, Any], run_dir: Path, runtimes: dict[str, dict] | None = None) -> list[Replica]:
    """The processes a rendered job becomes on this machine (not started). `runtimes`: the Trainer v2
    runtimes a TrainJob may name (default: the project's)."""
    kind = kinds.kind_of(job)
    if kind is None:
        known = ", ".join(f"{k.kind} {k.api_version}" for k in kinds.JOB_KINDS.values())
        raise JobSpecError(f"cannot run {job.get('apiVersion')}/{job.get('kind')} locally (only {known})")
    return LOCAL_REPLICAS[kind.kind](job, run_dir, runtimes)


# ---------------------------------------------------------------- GPUs


def visible_gpus() -> list[str]:
    """GPU ids this machine offers (CUDA_VISIBLE_DEVICES, else `nvidia-smi -L`)."""
    declared = os.environ.get("CUDA_VISIBLE_DEVICES")
    if declared is not None:
        return [d for d in declared.split(",") if d.strip() and d.strip() != "-1"]
    if not shutil.which("nvidia-smi"):
        return []
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(listing.stdout.splitlines()) if line.startswith("GPU ")]


# What kube-scheduler says of a pod that a one-node cluster (this machine) can never take: too few GPUs in all,
# not busy ones, so preemption cannot help (NodeResourcesFit's UnschedulableAndUnresolvable, kubernetes#131345).
# The operator reads these words as a start that will not come (gpt2bench.diagnosis.startup), as the local runner does.
NO_ROOM_FOR_GPUS = ("0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are available: "
                    "1 Preemption is not helpful for scheduling.")


def unschedulable(replicas: list[Replica], available: list[str], job_name: str) -> diagnosis.PodWait | None:
    """Give each replica its own GPUs, in order; the first replica that finds too few left is Unschedulable,
    worded as the scheduler words it for a one-node cluster (this machine is that node)."""
    start = 0
    for replica in replicas:
        if replica.gpus > len(available) - start:
            return diagnosis.PodWait(pod_name(job_name, replica), "Unschedulable", NO_ROOM_FOR_GPUS)
        if replica.gpus:
            replica.env["CUDA_VISIBLE_DEVICES"] = ",".join(available[start : start + replica.gpus])
            start += replica.gpus
    return None


def pod_name(job_name: str, replica: Replica) -> str:
    """The name of the pod a replica stands for (the training operator's `<job>-<replica type>-<index>`)."""
    return f"{job_name}-{replica.name}" if job_name else replica.name


def container_of(job: dict[str, Any], replica: Replica) -> str:
    """The name of the container a replica runs (the kind's container for its replica type)."""
    if job.get("kind") == "TrainJob":
        return TRAINJOB_CONTAINER
    return kinds.replica_container(job, replica.role) if replica.role in kinds.replica_types(job) else replica.role


# ---------------------------------------------------------------- processes


def missing_tool(replica: Replica, path: str | None) -> tuple[str, str] | None:
    """(program, what to install) when the replica's program cannot start: its executable is not on PATH, or
    the one a wrapper (`gpt2bench launch -- mpirun ...`, `torchrun --no-python -- gpt2bench ...`) runs after
    `--`."""
    programs = [replica.argv[0]]
    if Path(replica.argv[0]).name in _WRAPPERS and "--" in replica.argv[:-1]:
        programs.append(replica.argv[replica.argv.index("--") + 1])
    for program in programs:
        if shutil.which(program, path=path) is None:
            return program, _INSTALL_HINTS.get(Path(program).name, "install it or fix the job's command")
    return None


def start(replica: Replica, base_env: dict[str, str], cwd: str | None = None) -> None:
    replica.output_dir.mkdir(parents=True, exist_ok=True)
    replica.termination_log.unlink(missing_ok=True)
    env = {**base_env, **replica.env}
    argv = replica.argv
    if replica.gpus:  # a forked child could not use a GPU the server's imports had touched: fresh processes only
        env.pop(FORKSERVER_ENV, None)
    elif FORKSERVER_ENV in env and not _hands_over_itself(argv):
        argv = forked_argv(argv, env)
    with open(replica.log_path, "wb") as log:
        # A new session: the terminal's Ctrl-C reaches only `gpt2bench run`, which then stops the
        # replicas itself, in order, instead of every process dying half-way through a write. A
        # parent-death signal: a runner killed outright takes the replica with it (processes.py).
        replica.process = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )


def forked_argv(argv: list[str], env: dict[str, str]) -> list[str]:
    """The command that runs `argv` as a child of the fork server when its program is a Python script of this
    interpreter (torchrun), through the stand-in forkclient.py (which runs the program itself if the server
    refuses); any other program as it is."""
    program = shutil.which(argv[0], path=env.get("PATH"))
    interpreter = forkclient.python_script(program) if program else None
    if interpreter is None or not os.path.samefile(interpreter, sys.executable):
        return argv
    return [sys.executable, "-m", forkclient.__name__, *argv]


def _hands_over_itself(argv: list[str]) -> bool:
    """`gpt2bench train|launch` asks the fork server itself (gpt2bench.cli)."""
    return Path(argv[0]).name == "gpt2bench" and len(argv) > 1 and argv[1] in FORKED_COMMANDS


# ---------------------------------------------------------------- outcome


def termination_message(replica: Replica) -> str:
    """What the kubelet would report as the container's termination message: the file's content, or
    under `FallbackToLogsOnError` (what render sets), when the file is empty and the container failed,
    the tail of its output (at most 80 lines / 2 KiB)."""
    try:
        message = replica.termination_log.read_text(encoding="utf-8", errors="replace")[:4096]
    except OSError:
        message = ""
    failed = replica.process is None or replica.process.returncode not in (0, None)
    if message.strip() or not failed:
        return message
    try:
        with open(replica.log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 2048))
            tail = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(tail.splitlines()[-80:])


def log_tail(replica: Replica, lines: int = 300) -> str:
    """The last lines a replica printed (what the operator reads of a pod's log)."""
    try:
        with open(replica.log_path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def replica_end(job: dict[str, Any], replica: Replica) -> diagnosis.PodEnd:
    """How a failed replica ended, in the words the operator uses for a failed pod."""
    said = diagnosis.container_said(termination_message(replica), log_tail(replica))
    return diagnosis.PodEnd(pod_name(job["metadata"]["name"], replica), diagnosis.exit_how(replica.process.returncode),
                            container=container_of(job, replica), line=said)


def execute_job(
    job: dict[str, Any],
    run_dir: str | os.PathLike,
    *,
    base_env: dict[str, str] | None = None,
    on_tick: Callable[[Replica, float], None] | None = None,
    poll_seconds: float = 0.25,
    grace_seconds: float = KILL_GRACE_SECONDS,
    gpus: list[str] | None = None,
    runtimes: dict[str, dict] | None = None,
) -> JobOutcome:
    """Run a rendered job to completion on this machine and say how it ended.

    `on_tick(primary_replica, elapsed_seconds)` is called while it runs (progress display). Any
    exception raised meanwhile (KeyboardInterrupt included) kills every replica's process tree first.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    started = SYSTEM_CLOCK.now()
    replicas = job_replicas(job, run_dir, runtimes)
    primary = replicas[0]
    base_env = dict(os.environ if base_env is None else base_env)

    t0: float | None = None  # when the first replica starts

    def finished(phase: str, reason: str | None, cause: str | None = None) -> JobOutcome:
        seconds = time.monotonic() - t0 if t0 is not None else None
        codes = {r.name: (r.process.returncode if r.process else None) for r in replicas}
        return JobOutcome(phase, reason, termination_message(primary), started, SYSTEM_CLOCK.now(), primary, codes,
                          cause, seconds)

    available = visible_gpus() if gpus is None else gpus
    blocked = unschedulable(replicas, available, job["metadata"]["name"])
    if blocked:
        asked = sum(r.gpus for r in replicas)
        return finished("Failed", diagnosis.cannot_start_here(
            blocked, f"the job asks for {asked} nvidia.com/gpu, this machine offers {len(available)}"))
    for replica in replicas:
        missing = missing_tool(replica, {**base_env, **replica.env}.get("PATH"))
        if missing:  # what containerd reports of a command not in the image (StartError), and what to install
            program, hint = missing
            wait = diagnosis.PodWait(pod_name(job["metadata"]["name"], replica), diagnosis.START_FAILURES[0],
                                     diagnosis.executable_not_found(program), container_of(job, replica))
            return finished("Failed", diagnosis.cannot_start_here(wait, hint))

    deadline_s = kinds.active_deadline(job)
    tmpdir = private_tmpdir(base_env)  # removed below, once every process is gone
    base_env = {**base_env, "TMPDIR": tmpdir}
    exits: list[int | None] = []  # a pidfd per replica: its exit wakes the loop at once
    try:
        t0 = time.monotonic()
        for replica in replicas:
            start(replica, base_env)
            exits.append(exit_fd(replica.process.pid))
        while True:
            codes = [r.process.poll() for r in replicas]
            failed = [r for r, c in zip(replicas, codes) if c not in (None, 0)]
            if failed and all(diagnosis.caused_by_another(replica_end(job, r)) for r in failed):
                # a peer's failure or a stop, seen at once: its cause may end a moment later (a killed rank's
                # sockets close as it dies); wait for it as long as the operator's tie lasts (pods of one second)
                _settle(exits, codes, TIE_SECONDS)
                codes = [r.process.poll() for r in replicas]
                failed = [r for r, c in zip(replicas, codes) if c not in (None, 0)]
            if failed:  # the first to fail (its peers, stopped now, would fail because of it); those that
                # ended within the tie are told apart as the operator tells apart pods of the same second
                _stop_all(replicas, grace_seconds)
                cause = diagnosis.first_failure(replica_end(job, replica) for replica in failed).describe()
                return finished("Failed", cause, cause)
            if all(c == 0 for c in codes):
                return finished("Succeeded", None)
            elapsed = time.monotonic() - t0
            if deadline_s is not None and elapsed > deadline_s:
                _stop_all(replicas, grace_seconds)
                return finished("Failed", f"DeadlineExceeded: ran longer than activeDeadlineSeconds={deadline_s:g}")
            if on_tick is not None:
                on_tick(primary, elapsed)
            select.select([fd for fd, code in zip(exits, codes) if code is None and fd is not None], [], [],
                          poll_seconds)
    finally:
        _stop_all(replicas, grace_seconds)
        for fd in exits:
            if fd is not None:
                os.close(fd)
        shutil.rmtree(tmpdir, ignore_errors=True)  # its link to torch.compile's cache, not the cache


def _stop_all(replicas: list[Replica], grace: float) -> None:
    for replica in replicas:
        if replica.process is not None:
            kill_tree(replica.process, grace)
