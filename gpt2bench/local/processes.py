"""Stopping a local job for good: its process, its process group, and every descendant.

Process groups alone are not enough: mpirun puts each rank in a process group of its own, and a rank
left behind keeps a port and a CPU busy. Linux /proc is read directly; elsewhere only the group is
signalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time


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
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as f:
                state, ppid, pgrp = f.read().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if state == "Z":
            continue
        children.setdefault(int(ppid), []).append(int(entry))
        if int(pgrp) == pid and int(entry) != pid:
            group.append(int(entry))
    found, todo = set(group), [pid]
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
    tree = process_tree(process.pid)
    if process.poll() is not None and not tree:
        return
    _signal(tree, process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if process.poll() is not None and not process_tree(process.pid):
            return
        time.sleep(0.1)
    _signal(tree + process_tree(process.pid), process.pid, signal.SIGKILL)
    process.wait()
