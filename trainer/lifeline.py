"""A trainer started by a local `gpt2bench run` stops when that runner is gone.

The runner starts each replica with a parent-death signal (gpt2bench/local/processes.py), but that reaches only its
own children (torchrun, `gpt2bench launch`): a signal armed with prctl is not passed on to their children, and a
launcher killed at the wrong moment leaves its ranks under PID 1, training on. So the runner also puts its pid in
every replica's environment (conventions.RUNNER_PID_ENV), which torchrun and mpirun hand down to every rank, and each
`gpt2bench train` watches that process from a daemon thread: once it has exited (or is a zombie, or its pid now
belongs to another process), the trainer says so on stderr and ends itself. In a pod the variable is not set and
nothing is watched: the kubelet ends a pod's processes.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Mapping

from gpt2bench.conventions import RUNNER_PID_ENV

POLL_SECONDS = 1.0
KILL_AFTER_SECONDS = 5.0  # SIGTERM first (its default action ends the process at once); SIGKILL if it was caught


def process_identity(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks) of a process from /proc, None when it does not exist or /proc is absent."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], fields[19]


def runner_alive(pid: int, start: str | None) -> bool:
    """The runner `pid` (started at `start` ticks; None: unknown) still runs: not gone, not a zombie, not a reused pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, as another user
    identity = process_identity(pid)
    if identity is None:
        return not os.path.isdir("/proc")  # no /proc: os.kill's answer is all there is
    state, started = identity
    return state not in ("Z", "X") and (start is None or started == start)


def watch_runner(environ: Mapping[str, str] = os.environ, poll_seconds: float = POLL_SECONDS) -> threading.Thread | None:
    """Start watching the runner named in `environ` (None: not started by one); a gone runner ends this process."""
    try:
        pid = int(environ.get(RUNNER_PID_ENV, ""))
    except ValueError:
        return None
    identity = process_identity(pid)
    start = identity[1] if identity else None

    def watch() -> None:
        while runner_alive(pid, start):
            time.sleep(poll_seconds)
        print(f"gpt2bench train: the gpt2bench run that started this process (pid {pid}) is gone: stopping",
              file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(KILL_AFTER_SECONDS)
        os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="gpt2bench-runner-watch", daemon=True)
    thread.start()
    return thread
