"""Where this process sits in the job, from the launcher's environment.

Launchers and what they set:
- torchrun (PyTorchJob): RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT;
- horovodrun --gloo: HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK, HOROVOD_LOCAL_SIZE;
- mpirun (MPIJob, Open MPI): OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE;
- nothing: one plain process.
The first family found wins, in that order.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

_FAMILIES = (
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("horovod", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"),
    ("mpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
)


@dataclass(frozen=True)
class DistEnv:
    """This process's place in the whole job (servers included)."""

    launcher: str  # torchrun | horovod | mpi | none
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str | None = None
    master_port: str | None = None

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))

    @property
    def init_method(self) -> str:
        """c10d rendezvous URL. torchrun always sets MASTER_*; mpirun needs them from the job."""
        if self.master_addr and self.master_port:
            return f"tcp://{self.master_addr}:{self.master_port}"
        if self.world_size == 1:
            return "tcp://127.0.0.1:0"
        raise RuntimeError(
            f"{self.launcher} launched {self.world_size} processes but MASTER_ADDR/MASTER_PORT are not set; "
            "torch.distributed needs them to rendezvous"
        )


def _int(environ: dict[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except ValueError:
        raise RuntimeError(f"environment variable {name}={environ[name]!r} is not an integer") from None


def detect_env(environ: dict[str, str] | None = None) -> DistEnv:
    environ = dict(os.environ if environ is None else environ)
    master = (environ.get("MASTER_ADDR"), environ.get("MASTER_PORT"))
    for launcher, rank, size, local_rank, local_size in _FAMILIES:
        if rank in environ and size in environ:
            world = _int(environ, size)
            env = DistEnv(
                launcher=launcher,
                rank=_int(environ, rank),
                world_size=world,
                local_rank=_int(environ, local_rank) if local_rank in environ else 0,
                local_world_size=_int(environ, local_size) if local_size in environ else world,
                master_addr=master[0],
                master_port=master[1],
            )
            if not 0 <= env.rank < env.world_size:
                raise RuntimeError(f"{rank}={env.rank} is outside 0..{env.world_size - 1}")
            return env
    return DistEnv("none", 0, 1, 0, 1, *master)


# Set in a child of the local runner's fork server (gpt2bench/local/forkserver.py), whose parent is the server's relay:
# the parent of its stand-in, the process that started the program.
started_by: int | None = None


def launcher_pid() -> int:
    """The process that started this one (torchrun, mpirun's daemon, a pod's shell): its parent, as a fresh process
    has it, also when the fork server made it."""
    return os.getppid() if started_by is None else started_by


def process_start_time() -> float:
    """Wall-clock start of this process (Linux /proc), so startup includes interpreter and imports."""
    try:
        with open("/proc/self/stat") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])  # field 22: start time in clock ticks
        with open("/proc/stat") as system:
            boot = next(int(line.split()[1]) for line in system if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()
