"""The local runner's fork server: torch and transformers imported once per sweep, not once per process.

Importing torch and transformers' GPT-2 takes seconds, and every run pays it once per process: torchrun itself,
then each of its workers (mpirun's ranks, `gpt2bench launch`). `gpt2bench run` starts this server before its first
run: a fresh process that imports them (`PRELOAD`), checks that nothing it imported started anything a fork would
break, and waits. Each of those programs, started as before by the executor, torchrun or mpirun, asks it for a
child that runs its command line instead (forkclient.py) and stays as that child's stand-in.

A child is a fresh process for every timing: the server forks a relay, the relay forks the child, and the child
takes on what a freshly started process would have (`become`): the stand-in's descriptors on the same numbers, its
command line, environment, working directory, umask, CPU affinity, signal mask and ignored signals, a session of
its own, standard streams buffered as its environment says, and its program run as `__main__`. Nothing runs in the
server while a run trains (it waits in accept), the child shares no thread (a fork copies only the calling one) and
no torch state (the server ran no torch operation; the thread pools of the BLAS libraries numpy and scipy load are
shut down at fork by their own handlers and started again on first use; any other thread started by the imports
keeps the server from serving), and the child's clocks start at its fork
(`startupSeconds` counts from there).

The server refuses (`admissible`), and the program then runs as a fresh process of its own, whenever the child
could differ from one: another interpreter, interpreter options or module search path; a resource limit or nice
value of its own; or an environment variable that differs from the server's and might be read while importing
(`READ_AT_RUN_TIME` lists those that are read only later, `reapply` applies the three that a fresh interpreter
reads at start: TMPDIR, PYTHONUNBUFFERED, OMP_NUM_THREADS). It serves only jobs that use no GPU (the executor does
not send others), and serves none when its imports loaded the CUDA driver (a forked child could not use it).

What is not a fresh process's: its parent is the server's relay (`gpt2bench.trainer.env.launcher_pid()` gives the
process that started the program, the stand-in's parent, as a fresh one's os.getppid() would); its
/proc/PID/cmdline is the server's (its name, /proc/PID/comm, is the program's), its string hashes share the
server's seed, and its memory pages are the server's until written (copy-on-write). `GPT2BENCH_FORKSERVER=off`
runs every process fresh (benchmarks/bench_startup.py compares both).

The relay passes the child's end to the stand-in, stops the child's process tree when the stand-in goes (killed
outright) or when the server goes (the runner gone: every process here has a parent-death signal), and stops what
the child left in its process group, as a pod's end would.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import fcntl
import importlib
import io
import os
import re
import runpy
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from gpt2bench.conventions import FORKSERVER_ENV, FORKSERVER_SWITCH_ENV, RUNNER_PID_ENV
from gpt2bench.local import forkclient
from gpt2bench.local.processes import die_with_parent, kill_tree, private_tmpdir, stop_tree
from gpt2bench.trainer import env as trainer_env

# What a training process imports before its first step, and what torchrun and `gpt2bench launch` import. Not
# horovod (it loads MPI, which must initialise in the process that uses it).
PRELOAD = (
    "torch",
    "transformers.models.gpt2.modeling_gpt2",
    "transformers.models.gpt2.tokenization_gpt2",
    "torch.distributed.run",
    "gpt2bench.launch",
    "gpt2bench.trainer.cli",
    "gpt2bench.trainer.loop",
    "gpt2bench.trainer.data",
    "gpt2bench.trainer.collective_probe",
    "gpt2bench.trainer.parallel.ddp",
    "gpt2bench.trainer.parallel.dataparallel",
    "gpt2bench.trainer.parallel.fsdp",
    "gpt2bench.trainer.parallel.ps",
)
# Environment variables a request may set differently from the server: what the runner, the Kubeflow operators,
# torchrun and mpirun set per process, read by the program at run time (nothing in PRELOAD reads them on import):
# the runner's and the trainer's own; the training operator's (PET_*, MASTER_*, WORLD_SIZE, RANK) and torchrun's
# (the ranks, TORCHELASTIC_*, NCCL's error handling); mpi-operator's launcher role, mpirun's for its ranks (OMPI_*,
# PMIX_*, OPAL_*, PRTE_*, and the Omni-Path libraries' *_NO_BACKTRACE, read when MPI loads them) and Horovod's
# (horovodrun sets NCCL_SOCKET_IFNAME: NCCL_* are read by libnccl when a communicator is made, never on import);
# the Job controller's JOB_COMPLETION_INDEX on an indexed Job's pods (a TrainJob's `node` pods, local ones too);
# and what a shell keeps for itself.
READ_AT_RUN_TIME = re.compile(
    r"(GPT2BENCH|PET|TORCHELASTIC|OMPI|PMIX|OPAL|PRTE|HOROVOD|NCCL)_\w+|MASTER_(ADDR|PORT)|(LOCAL_|GROUP_|ROLE_)?RANK"
    r"|(LOCAL_|GROUP_|ROLE_)?WORLD_SIZE|ROLE_NAME|TORCH_NCCL_ASYNC_ERROR_HANDLING|K_MPI_JOB_ROLE|JOB_COMPLETION_INDEX"
    r"|(HFI|IPATH)_NO_BACKTRACE|PWD|OLDPWD|SHLVL|_")
# Read by a fresh interpreter as it starts; the child applies them itself (`reapply`).
REAPPLIED = ("TMPDIR", "PYTHONUNBUFFERED", "OMP_NUM_THREADS")
# Set by the imports themselves (transformers asks torch's compile cache for its folder, under TMPDIR): each is set
# again in the child by what set it, from the child's environment, as the import would have in a fresh process.
SET_BY_IMPORTS = {"TORCHINDUCTOR_CACHE_DIR": "torch._inductor.runtime.cache_dir_utils:cache_dir"}
READY = "ready"
START_SECONDS = 180.0  # the server's imports, on a loaded machine
STOP_GRACE_SECONDS = 5.0  # as the executor's (executor.KILL_GRACE_SECONDS)


# ---------------------------------------------------------------- the runner's side
@contextlib.contextmanager
def serving(env: dict[str, str], log: Path, wanted: bool = True) -> Iterator[dict[str, str]]:
    """A fork server for the processes of the jobs run meanwhile: yields `env` with its socket's address (what
    the replicas inherit), or `env` without any server's address when it is off (GPT2BENCH_FORKSERVER=off, or not
    `wanted`) or could not start (`log` says why): its processes then start fresh, whatever server the runner
    itself runs under. It ends with the block. Under another server (`env` has its address), this one is that
    server's forked child (`server_command`)."""
    unserved = {key: value for key, value in env.items() if key != FORKSERVER_ENV}
    if not wanted or env.get(FORKSERVER_SWITCH_ENV, "on").lower() in ("off", "0", "false", "no"):
        yield unserved
        return
    folder = private_tmpdir(env)  # removed below; one a killed runner left goes with the next job's (processes.py)
    # A socket in Linux's abstract namespace: no file (a path under a long TMPDIR outgrows sun_path's 108 bytes),
    # gone with the server; the server serves its own user only (SO_PEERCRED, `admissible`).
    served = {**env, FORKSERVER_ENV: f"@gpt2bench-forkserver-{os.getpid()}-{os.path.basename(folder)}"}
    upstream = env.get(FORKSERVER_ENV)  # its stand-in asks that server (the new one's address is on its command line)
    process = None
    try:
        with open(log, "ab") as out:
            process = subprocess.Popen(  # the runner's pid in its environment, as every replica's: it is the sweep's
                server_command(folder, served[FORKSERVER_ENV], upstream),
                env={**served, RUNNER_PID_ENV: str(os.getpid()), **({FORKSERVER_ENV: upstream} if upstream else {})},
                cwd=folder, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=out, start_new_session=True,
                preexec_fn=die_with_parent())
        if not _wait_ready(process, START_SECONDS):  # its reason is in the log; every process runs fresh
            kill_tree(process, grace=1.0)
            yield unserved
            return
        yield served
    finally:
        if process is not None:
            kill_tree(process, grace=1.0)
            process.stdout.close()
        shutil.rmtree(folder, ignore_errors=True)


# `python -c`: the module search path without the working directory, as a script's has it without the script's
# folder (`admissible` compares the rest).
BOOTSTRAP = "import sys; del sys.path[0]; from gpt2bench.local.forkserver import main; sys.exit(main(sys.argv[1]))"


def server_command(folder: str, address: str, upstream: str | None) -> list[str]:
    """The command that starts a server listening at `address`: a fresh interpreter, or, where the runner itself
    runs under a fork server (`upstream`: the test suite's, a sweep started by another sweep's program), a
    program that server forks like any other (forkclient), so that the new server imports nothing again. It is
    then that server's child, admitted as a fresh process would be (`admissible`), and refused, hence started
    fresh, wherever it could differ from one."""
    if not upstream:
        return [sys.executable, "-c", BOOTSTRAP, address]
    script = os.path.join(folder, "forkserver-main.py")  # forkclient hands over scripts only (`python_script`)
    with open(script, "w", encoding="utf-8") as f:
        f.write(f"#!{sys.executable}\n{BOOTSTRAP}\n")
    return [sys.executable, "-m", forkclient.__name__, script, address]


def _wait_ready(process: subprocess.Popen, seconds: float) -> bool:
    ready, _, _ = select.select([process.stdout], [], [], seconds)
    return bool(ready) and process.stdout.readline().decode().strip() == READY


# ---------------------------------------------------------------- the server
def main(address: str) -> int:
    """Import, check, serve. Returns only in a child (what its program returns), or when the server cannot serve."""
    environ = dict(os.environ)  # what the imports saw, hence what a request's environment is compared with
    pools = blas_threads()
    for name in PRELOAD:
        importlib.import_module(name)
    refusal = unforkable(environ, pools)
    if refusal:
        log(f"not serving: {refusal}")
        return 1
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(forkclient.socket_address(address))
    listener.listen(64)
    server = Server(listener, environ, own_fds=set(forkclient.open_fds()) - {0, 1, 2, listener.fileno()},
                    resident=resident_file_pages())
    print(READY, flush=True)
    null = os.open(os.devnull, os.O_WRONLY)  # the runner reads one line: the pipe is not kept
    os.dup2(null, 1)
    os.close(null)
    child = server.serve()  # in a forked child from here on
    become(child)
    run_program(child.request["argv"])


def unforkable(environ: dict[str, str], pools: set[str]) -> str | None:
    """Why a child of this process would not be like a fresh one (None: it would). `environ`: before the imports;
    `pools`: the BLAS libraries' threads (`blas_threads`)."""
    if changed := [k for k in set(environ) | set(os.environ) if environ.get(k) != os.environ.get(k)
                   and k not in SET_BY_IMPORTS]:
        return f"the imports changed environment variables {sorted(changed)}"
    with open("/proc/self/maps", encoding="utf-8") as maps:
        if any(re.search(r"/libcuda\.so", line) for line in maps):
            return "the CUDA driver is loaded: a forked child could not use it"
    try:  # each relay waits on its child's pidfd
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return "no pidfd_open on this kernel (Linux 5.3 or later)"
    others = set(os.listdir("/proc/self/task")) - pools - {str(os.getpid())}
    if others:
        return f"{len(others)} threads started while importing: a fork would copy none of them"
    return None


def blas_threads() -> set[str]:
    """The threads numpy's and scipy's OpenBLAS start as they load (imported first, alone, to tell them apart): each
    library stops its pool before a fork with its own pthread_atfork handler, and the child starts it again when it
    first needs it. Any other thread keeps the server from serving (`unforkable`)."""
    import numpy  # noqa: F401
    import scipy.linalg  # noqa: F401

    return set(os.listdir("/proc/self/task")) - {str(os.getpid())}


def log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} forkserver[{os.getpid()}] {message}", file=sys.stderr, flush=True)


@dataclass
class Child:
    """What a forked child gets from the server: its request, the stand-in's descriptors, the connection to close,
    the server's own descriptors to keep, and its parent-death signal to arm."""

    request: dict[str, Any]
    fds: list[int]
    conn: socket.socket
    own_fds: set[int]
    resident: list[tuple[int, int]]
    arm: Callable[[], None]


class Server:
    def __init__(self, listener: socket.socket, environ: dict[str, str], own_fds: set[int],
                 resident: list[tuple[int, int]]):
        self.listener, self.environ, self.own_fds, self.resident = listener, environ, own_fds, resident
        self.limits = forkclient.describe([], [], {}, [])

    def serve(self) -> Child:
        """Accept requests for ever; returns only in a forked child."""
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # relays are reaped by the kernel
        while True:
            conn, _ = self.listener.accept()
            fds: list[int] = []
            try:
                request, fds = forkclient.receive(conn, forkclient.MAX_FDS)
                refusal = self.admissible(request, conn) if len(fds) == len(request.get("fds", ())) else \
                    "descriptors lost in transit"
            except (OSError, EOFError, ValueError, KeyError, TypeError) as exc:
                request, refusal = {}, f"unreadable request ({exc!r})"
            if refusal:
                log(f"refused {request.get('argv', [])[:3]}: {refusal}")
                with contextlib.suppress(OSError):
                    forkclient.send(conn, {"refused": refusal})
            else:
                arm_relay = die_with_parent()  # the server's end (the runner's) is the relay's
                if os.fork() == 0:
                    self.listener.close()
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    arm_child = die_with_parent()
                    child = os.fork()
                    if child == 0:
                        return Child(request, fds, conn, self.own_fds, self.resident, arm_child)
                    os._exit(relay(conn, child, fds, arm_relay))
                log(f"forked {request['argv'][:3]}")
            conn.close()
            for fd in fds:
                os.close(fd)

    def admissible(self, request: dict[str, Any], conn: socket.socket) -> str | None:
        """Why a child for `request` would differ from the fresh process it stands for (None: it would not)."""
        uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
        if uid != os.getuid():
            return f"uid {uid} is not the server's"
        program = request["argv"][0]
        interpreter = forkclient.python_script(program)
        if interpreter is None:
            return f"{program} is not a Python script"
        if not _same_interpreter(interpreter, sys.executable):
            return f"{program} runs on {interpreter}, the server on {sys.executable}"
        if request["flags"] != list(sys.flags):
            return "other interpreter options"
        if request["path"][1:] != sys.path:
            return "another module search path"
        for key in ("rlimits", "nice"):
            if request[key] != self.limits[key]:
                return f"its {key} differ from the server's"
        if clash := set(request["fds"]) & self.own_fds:
            return f"descriptors {sorted(clash)} are the server's"
        return env_difference(self.environ, request["env"])



def _same_interpreter(a: str, b: str) -> bool:
    """The same file in the same folder (a virtual environment's python and python3 are one interpreter, the system
    python its links point to is another: its own prefix)."""
    try:
        return os.path.dirname(a) == os.path.dirname(b) and os.path.samefile(a, b)
    except OSError:
        return False


def env_difference(server: dict[str, str], wanted: dict[str, str]) -> str | None:
    """The first variable that differs and may have been read while importing (None: none does)."""
    for name in sorted(set(server) | set(wanted)):
        if server.get(name) != wanted.get(name) and name not in (*REAPPLIED, *SET_BY_IMPORTS) \
                and not READ_AT_RUN_TIME.fullmatch(name):
            return f"environment variable {name} differs from the server's ({_shown(server.get(name))} there)"
    omp = wanted.get("OMP_NUM_THREADS")
    if omp is not None and omp != server.get("OMP_NUM_THREADS") and not omp.strip().isdigit():
        return f"OMP_NUM_THREADS={omp!r} is not one number"
    return None


def _shown(value: str | None) -> str:
    return "unset" if value is None else repr(value if len(value) <= 60 else value[:57] + "...")


# ---------------------------------------------------------------- the relay
class _Abandoned(Exception):
    pass


def relay(conn: socket.socket, child: int, fds: list[int], arm: Callable[[], None]) -> int:
    """Between the stand-in and the child: the child's pidfd to the stand-in, then the child's end; the child's tree
    stopped when the stand-in goes (killed outright) or the server does (`arm`: the runner gone); what the child
    left in its process group stopped once it has ended."""
    for fd in fds:
        os.close(fd)
    pidfd = os.pidfd_open(child)

    def abandon(_signum: int, _frame: Any) -> None:
        # once: a second SIGTERM (the parent-death signal and whoever stops the server's tree or group both send
        # one) would cut the stop below short and leave the child running
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise _Abandoned

    try:
        signal.signal(signal.SIGTERM, abandon)
        arm()
        forkclient.send(conn, {"pid": child}, [pidfd])
        while pidfd not in select.select([conn, pidfd], [], [])[0]:
            if not conn.recv(1024):
                raise _Abandoned
    except (_Abandoned, OSError):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # abandoned by its stand-in too: a SIGTERM now would end the stop
        stop_tree(child, lambda: bool(select.select([pidfd], [], [], 0)[0]), STOP_GRACE_SECONDS)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    ended = _ended(os.waitid(os.P_PID, child, os.WEXITED | os.WNOWAIT))  # not reaped: its group id stays its own
    with contextlib.suppress(OSError):
        forkclient.send(conn, ended)
    stop_tree(child, lambda: True, STOP_GRACE_SECONDS)  # what it left in its group
    os.waitpid(child, 0)
    return 0


def _ended(status: os.waitid_result) -> dict[str, Any]:
    if status.si_code == os.CLD_EXITED:
        return {"code": status.si_status}
    return {"signal": status.si_status}


# ---------------------------------------------------------------- the child
def become(child: Child) -> None:
    """Turn this forked child into the fresh process its request describes."""
    request = child.request
    forkclient.forked_child = True
    trainer_env.started_by = request["ppid"]  # what os.getppid() gives a fresh process: its starter, not the relay
    os.setsid()  # as the executor, torchrun and mpirun start theirs: a process group of its own
    child.arm()
    child.conn.close()
    _descriptors(request["fds"], child.fds, child.own_fds)
    _signals(request["ignored"], request["blocked"])
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    os.sched_setaffinity(0, request["affinity"])
    server_env = dict(os.environ)
    os.environ.clear()
    os.environ.update(request["env"])
    reapply(server_env, request["env"])
    for name, where in SET_BY_IMPORTS.items():
        if name in server_env:  # the server's imports set it: the child's would have, from its environment
            module, function = where.split(":")
            getattr(importlib.import_module(module), function)()
    sys.argv = list(request["argv"])
    sys.orig_argv = [sys.executable, *request["argv"]]
    sys.path[:] = request["path"]
    _name(os.path.basename(request["argv"][0]))
    populate(child.resident)
    import numpy

    numpy.random.seed()  # numpy's global generator is seeded once per process (`random` reseeds itself at fork)


FD_FLOOR = 1024  # received descriptors wait above this while the numbers below are cleared


def _descriptors(targets: list[int], received: list[int], own: set[int]) -> None:
    """The stand-in's descriptors on their own numbers, the server's own kept (what its imports opened), every
    other descriptor of the server's closed (its standard streams, the request's originals)."""
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, FD_FLOOR) for fd in received]
    for fd in forkclient.open_fds():
        if fd not in moved and fd not in own:
            os.close(fd)
    for target, fd in zip(targets, moved):
        os.dup2(fd, target, inheritable=True)
        os.close(fd)


def _signals(ignored: list[int], blocked: list[int]) -> None:
    """Dispositions as a fresh interpreter has them: what its starter ignored stays ignored, SIGINT raises
    KeyboardInterrupt, the rest default; the starter's signal mask."""
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        if signum in ignored:
            handler = signal.SIG_IGN
        elif signum == signal.SIGINT:
            handler = signal.default_int_handler
        else:
            handler = signal.SIG_DFL
        with contextlib.suppress(OSError, ValueError):
            signal.signal(signum, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def reapply(server: dict[str, str], wanted: dict[str, str]) -> None:
    """What a fresh interpreter takes from REAPPLIED as it starts, taken from the request's environment."""
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    unbuffered = bool(wanted.get("PYTHONUNBUFFERED"))
    for name, fd in (("stdin", 0), ("stdout", 1), ("stderr", 2)):
        stream = _stream(fd, unbuffered, getattr(sys, f"__{name}__"))
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    threads = wanted.get("OMP_NUM_THREADS")
    if threads != server.get("OMP_NUM_THREADS"):  # OpenMP and MKL read it when torch loads them
        import torch

        torch.set_num_threads(int(threads) if threads else len(os.sched_getaffinity(0)))


def _stream(fd: int, unbuffered: bool, like: io.TextIOWrapper | None) -> io.TextIOWrapper | None:
    """Standard stream `fd` as CPython makes it at start (Python/pylifecycle.c, create_stdio); encoding and errors
    as the server's (the same locale variables)."""
    try:
        os.fstat(fd)
    except OSError:
        return None
    write = fd != 0
    raw = io.FileIO(fd, "wb" if write else "rb", closefd=False)
    raw.name = f"<{('stdin', 'stdout', 'stderr')[fd]}>"
    buffered = not (unbuffered and write)
    buffer = (io.BufferedWriter(raw) if write else io.BufferedReader(raw)) if buffered else raw
    return io.TextIOWrapper(buffer, encoding=like.encoding if like else None,
                            errors=like.errors if like else None, newline="\n",
                            line_buffering=buffered and (raw.isatty() or fd == 2), write_through=not buffered)


# ---------------------------------------------------------------- resident memory
PAGE = os.sysconf("SC_PAGE_SIZE")
MADV_POPULATE_READ = 22  # Linux 5.14


def resident_file_pages() -> list[tuple[int, int]]:
    """(address, length) of the runs of file-backed pages (shared libraries, memory-mapped files) that this process
    has in its page tables: what its imports read. A fork copies no such page-table entry, so a child's resident
    set would miss them, and its memory peak (docs/metrics.md) would read lower than a fresh process's."""
    import numpy

    runs: list[tuple[int, int]] = []
    with open("/proc/self/maps", encoding="utf-8") as maps, open("/proc/self/pagemap", "rb") as pagemap:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or not fields[5].startswith("/") or fields[1][0] != "r":
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            pagemap.seek(start // PAGE * 8)
            present = (numpy.frombuffer(pagemap.read((end - start) // PAGE * 8), dtype=numpy.uint64) >> 63) == 1
            edges = numpy.flatnonzero(numpy.diff(numpy.concatenate(([0], present.view(numpy.int8), [0]))))
            runs += [(start + int(a) * PAGE, int(b - a) * PAGE) for a, b in zip(edges[::2], edges[1::2])]
    return runs


def populate(runs: list[tuple[int, int]]) -> None:
    """Map `runs` into this process's page tables (from the page cache: nothing is read from disk), so that its
    resident set starts where a fresh process's would after the same imports. Older kernels: left as it is."""
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    for address, length in runs:
        if madvise(address, length, MADV_POPULATE_READ) != 0:
            return


def _name(name: str) -> None:
    """/proc/self/comm, what `ps` and `pgrep` show: the program's name, as exec gives it."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME


def run_program(argv: list[str]) -> NoReturn:
    """The script as `__main__`, as the interpreter runs a script, and its end as the interpreter's (`finish`)."""
    code, interrupted = 0, False
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException as exc:  # noqa: BLE001 (what the interpreter does with an uncaught exception)
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != argv[0]:  # from the script's frame, as fresh
            tb = tb.tb_next
        exc = exc.with_traceback(tb or exc.__traceback__)
        sys.excepthook(type(exc), exc, exc.__traceback__)
        code, interrupted = 1, isinstance(exc, KeyboardInterrupt)
    finish(code, interrupted)


def _exit_code(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def finish(code: int, interrupted: bool = False) -> NoReturn:
    """End as the interpreter ends a program (non-daemon threads joined, atexit functions run, which flush and close
    `logging`'s handlers, standard streams flushed; killed by SIGINT after an uncaught KeyboardInterrupt), without
    its teardown of every module and object: in a child holding the server's imports that takes seconds (each object
    written to is a page copied) and serves nothing a program relies on, but a file it left open and unflushed (none
    of this project's: `gpt2bench train` itself ends with os._exit, trainer/cli.py)."""
    threading._shutdown()  # what Py_FinalizeEx does first (the threading module's own hook)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)
