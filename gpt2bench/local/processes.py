"""A local job's processes die with the runner, and are stopped for good: the process, its group, every descendant.

Dying with the runner: each replica is started with a parent-death signal (Linux `prctl(PR_SET_PDEATHSIG)`, armed
in the child before it runs the replica's command), so when `gpt2bench run` ends in a way it cannot handle
(SIGKILL, a crash), torchrun and `gpt2bench launch` get SIGTERM and stop their own workers and mpirun. Their
children do not inherit that signal; every `gpt2bench train` also watches the runner's pid itself
(gpt2bench/trainer/lifeline.py).

Cleaning up: a job's processes get a TMPDIR of their own, removed once they are gone (`private_tmpdir`).

Stopping: process groups alone are not enough: mpirun puts each rank in a process group of its own, and a rank
left behind keeps a port and a CPU busy. Linux /proc is read directly; elsewhere only the group is
signalled. `kill_tree` stops a child of this process, `stop_tree` any process whose end its caller can tell (the
fork server's relays stop their children's trees with it: forkserver.py).
"""

from __future__ import annotations

import ctypes
import getpass
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` for Popen: the child gets `sig` when the process starting it ends (Linux; None elsewhere).

    The child checks its parent after arming: one that ended between the fork and the prctl would never send it."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it
    parent = os.getpid()

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return arm


def process_tree(pid: int) -> list[int]:
    """Every live process below `pid` or in its process group. mpirun puts its ranks in their own
    process groups; torchrun's workers stay in the group even when torchrun itself is gone."""
    children: dict[int, list[int]] = {}
    group: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        fields = _stat(entry)
        if fields is None or fields[0] == "Z":
            continue
        ppid, pgrp = fields[1:3]
        children.setdefault(int(ppid), []).append(int(entry))
        if int(pgrp) == pid and int(entry) != pid:
            group.append(int(entry))
    found, todo = set(group), [pid, *group]  # below the group's members too (a relay's child is below nothing else)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return sorted(found)


def _signal(pids: list[int], pgid: int | None, sig: int) -> None:
    if pgid is not None:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_tree(process: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM the process, its group and every descendant; SIGKILL what is left after `grace`."""
    if stop_tree(process.pid, lambda: process.poll() is not None, grace):
        process.wait()


def stop_tree(pid: int, ended: Callable[[], bool], grace: float = 5.0) -> bool:
    """SIGTERM the process `pid`, its group and every descendant; SIGKILL what is left after `grace`. `ended`: whether
    `pid` itself has ended (its parent knows). True when something had to be killed."""
    tree = process_tree(pid)
    if ended() and not tree:
        return False
    _signal(tree, pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        # the first tree too: a process whose parent ended meanwhile is no longer below `pid` (a fork server's
        # child whose relay went first), and would be left running
        if ended() and not process_tree(pid) and not _running(tree):
            return False
        time.sleep(0.1)
    _signal(tree + process_tree(pid), pid, signal.SIGKILL)
    return True


def _stat(pid: int | str) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state, ppid, pgrp, ...); None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields if len(fields) >= 3 else None


def _running(pids: list[int]) -> list[int]:
    """Those of `pids` that have not ended (a zombie has)."""
    return [pid for pid in pids if (fields := _stat(pid)) is not None and fields[0] != "Z"]


_TMPDIR_PREFIX = "gpt2bench-job-"  # + the runner's pid: a runner killed outright cannot remove its folder


def _remove_orphans(parent: Path) -> None:
    """Remove the job folders of runners that are gone (killed before they could)."""
    for folder in parent.glob(f"{_TMPDIR_PREFIX}*-*"):
        pid = folder.name[len(_TMPDIR_PREFIX):].split("-", 1)[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except PermissionError:  # another user's runner, alive
            pass


def private_tmpdir(env: dict[str, str]) -> str:
    """A fresh folder for one job's processes to use as TMPDIR, under the one in `env` (else the system's); the
    caller removes it once they are gone, so that torchrun's `torchelastic_*` folders and the trainer's Prometheus
    folder do not outlive the run (one that a killed runner left is removed by the next job started here).
    torch.compile's cache stays shared between runs: `torchinductor_<user>` in it links to the usual one (removing
    the folder removes the link, not the cache)."""
    parent = env.get("TMPDIR") or tempfile.gettempdir()
    _remove_orphans(Path(parent))
    folder = tempfile.mkdtemp(prefix=f"{_TMPDIR_PREFIX}{os.getpid()}-", dir=parent)
    try:
        cache = Path(parent) / f"torchinductor_{getpass.getuser()}"  # inductor's default cache folder
        cache.mkdir(exist_ok=True)
        (Path(folder) / cache.name).symlink_to(cache, target_is_directory=True)
    except (OSError, KeyError):  # no user name, or a file system without links: the cache is per run then
        pass
    return folder
