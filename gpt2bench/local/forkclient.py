"""Hand a program over to the local runner's fork server (forkserver.py), or run it here when that cannot be.

A process that the runner starts, directly or through torchrun or mpirun, and that would import torch and
transformers (`gpt2bench train`, `gpt2bench launch`, torchrun) asks the fork server, a process that has imported
them once for the whole sweep, for a child that runs its command line instead. The request carries everything a
fresh process would inherit: command line, environment, working directory, open descriptors, umask, CPU affinity,
signal mask and ignored signals (forkserver.py applies them, or refuses). This process then stays as the child's
stand-in for whoever started it: it passes on the signals it gets and ends as the child ended (its exit code, or
killed by the same signal). When the server refuses or is not there, `hand_over` returns why and the caller runs
the program itself, as it would have without a server.

Run as `python -m gpt2bench.local.forkclient PROGRAM ARGS...` (what the executor starts for a torchrun replica), it
hands PROGRAM over, else becomes PROGRAM (exec, same pid).

Messages are JSON objects on a Unix SOCK_SEQPACKET socket (one message per packet), descriptors passed with
SCM_RIGHTS. Only the standard library is imported here: this runs before every program it saves imports for.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
from typing import Any, NoReturn

from gpt2bench.conventions import FORKSERVER_ENV

MAX_MESSAGE = 1 << 20  # an environment is a few KiB
MAX_FDS = 250  # SCM_RIGHTS carries at most 253 descriptors a message
# Passed on to the child: what a launcher (torchrun, mpirun, the executor) or a terminal sends to stop a process.
FORWARDED = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM)
# Set in a child the fork server made: it runs its program itself, whatever its environment says.
forked_child = False


def send(sock: socket.socket, message: dict[str, Any], fds: list[int] | tuple[int, ...] = ()) -> None:
    data = json.dumps(message, separators=(",", ":")).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.sendall(data)


def receive(sock: socket.socket, max_fds: int = 0) -> tuple[dict[str, Any], list[int]]:
    """One message and the descriptors it carries; EOFError when the peer has closed."""
    data, fds, _flags, _address = socket.recv_fds(sock, MAX_MESSAGE, max_fds)
    if not data:
        for fd in fds:
            os.close(fd)
        raise EOFError("the peer closed the connection")
    return json.loads(data), fds


def socket_address(address: str) -> str:
    """The fork server's socket as `connect` and `bind` take it: `@name` is `name` in Linux's abstract namespace
    (an environment variable cannot hold its leading NUL), anything else a path."""
    return "\0" + address[1:] if address.startswith("@") else address


def python_script(program: str) -> str | None:
    """The interpreter of a Python script file run by its `#!` line (None for anything else, or a `#!` line with
    options: a server could not reproduce them)."""
    try:
        with open(program, "rb") as f:
            first = f.readline(4096)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    if len(words) != 1 or not os.path.basename(words[0]).startswith("python"):
        return None
    return words[0]


def open_fds() -> list[int]:
    """This process's open descriptors (what it inherited: Python keeps none of its own open at this point)."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        try:
            os.fstat(fd)  # the listing's own descriptor is closed by now
        except OSError:
            continue
        found.append(fd)
    return sorted(found)


def describe(argv: list[str], path: list[str], environ: dict[str, str], fds: list[int]) -> dict[str, Any]:
    """What a fresh process running `argv` here would start with (forkserver.py, `admissible` and `become`)."""
    import resource

    mask = os.umask(0)
    os.umask(mask)
    limits = {name: list(resource.getrlimit(getattr(resource, name)))
              for name in dir(resource) if name.startswith("RLIMIT_")}
    ignored = [int(s) for s in signal.valid_signals()
               if s not in (signal.SIGKILL, signal.SIGSTOP) and signal.getsignal(s) == signal.SIG_IGN]
    return {
        "argv": argv, "path": path, "env": environ, "cwd": os.getcwd(), "flags": list(sys.flags), "umask": mask,
        "affinity": sorted(os.sched_getaffinity(0)), "nice": os.getpriority(os.PRIO_PROCESS, 0), "rlimits": limits,
        "ignored": ignored, "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "fds": fds, "ppid": os.getppid(),
    }


def hand_over(argv: list[str], path: list[str] | None = None, environ: dict[str, str] | None = None) -> str:
    """Have the fork server run `argv` (argv[0]: the script's path) and end as it ends; returns only when it cannot
    be, saying why. `path`: the module search path the program would have (default: this process's)."""
    environ = dict(os.environ if environ is None else environ)
    address = environ.get(FORKSERVER_ENV)
    if forked_child or not address:
        return "no fork server"
    if len(fds := open_fds()) > MAX_FDS:
        return f"{len(fds)} open descriptors, more than one message carries"
    request = describe(argv, list(sys.path if path is None else path), environ, fds)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)  # until the child is there to get them
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(socket_address(address))
        send(sock, request, fds)
        reply, received = receive(sock, max_fds=1)
    except (OSError, EOFError, ValueError) as exc:
        sock.close()
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        return f"the fork server at {address} did not answer ({exc})"
    if "refused" in reply:
        sock.close()
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        return reply["refused"]
    stand_in(sock, received[0], before)


def stand_in(sock: socket.socket, pidfd: int, mask: set[int]) -> NoReturn:
    """Pass signals on to the child (`pidfd`) until the server says how it ended, then end the same way."""

    def forward(signum: int, _frame: Any) -> None:
        try:
            signal.pidfd_send_signal(pidfd, signum)
        except ProcessLookupError:  # it has just ended: its end is on its way
            pass

    for signum in FORWARDED:
        if signal.getsignal(signum) != signal.SIG_IGN:  # one ignored here is ignored by the child too
            signal.signal(signum, forward)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    try:
        ended, _ = receive(sock)
    except (OSError, EOFError, ValueError) as exc:
        ended = {"code": 1, "reason": f"the fork server's relay for pid {pidfd} is gone ({exc})"}
    end_like(ended)


def end_like(ended: dict[str, Any]) -> NoReturn:
    """Exit with the child's code, or die of the signal that killed it (what its parent would have seen)."""
    if ended.get("reason"):
        print(f"gpt2bench: {ended['reason']}", file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    if ended.get("signal"):
        signum = int(ended["signal"])
        if signum != signal.SIGKILL:  # whose disposition cannot be set (OSError), nor needs to be
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)  # a signal whose default is not to end a process
    os._exit(int(ended.get("code", 1)))


def main(argv: list[str] | None = None) -> NoReturn:
    """`python -m gpt2bench.local.forkclient PROGRAM ARGS...`: PROGRAM from the fork server, else PROGRAM itself."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: python -m gpt2bench.local.forkclient PROGRAM [ARGS...]", file=sys.stderr)
        os._exit(2)
    program = shutil.which(argv[0]) or argv[0]
    if python_script(program):  # its own search path: its folder first, then the interpreter's (this one's)
        hand_over([program, *argv[1:]], [os.path.dirname(os.path.realpath(program)), *sys.path[1:]])
    for signum in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; the program starts as it was started
        signal.signal(signum, signal.SIG_DFL)
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(f"gpt2bench: cannot run {argv[0]}: {exc}", file=sys.stderr)
        os._exit(127)


if __name__ == "__main__":
    main()
