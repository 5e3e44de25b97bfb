"""Stopping a local job's processes (gpt2bench/local/processes.py) leaves nothing of its tree running, as real processes.

The shape is a fork server's (gpt2bench/local/forkserver.py): a group leader (the server), a child in its group (a
relay), and below that child a process in a session of its own (the program). The executor's replicas have the same
shape where mpirun puts a rank in a group of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import alive

from gpt2bench.local.processes import process_tree, stop_tree

# Each level starts the next (argv: the folder, how the bottom process takes SIGTERM: "ignores" or "default").
LEADER = """
import subprocess, sys, time
subprocess.Popen([sys.executable, sys.argv[1] + "/middle.py", *sys.argv[1:]])
time.sleep(300)
"""
MIDDLE = """
import subprocess, sys, time
subprocess.Popen([sys.executable, sys.argv[1] + "/bottom.py", *sys.argv[1:]], start_new_session=True)
time.sleep(300)
"""
BOTTOM = """
import json, os, signal, sys, time
if sys.argv[2] == "ignores":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
open(sys.argv[1] + "/pids.tmp", "w").write(json.dumps([os.getppid(), os.getpid()]))
os.rename(sys.argv[1] + "/pids.tmp", sys.argv[1] + "/pids.json")
time.sleep(300)
"""


def start_tree(tmp_path: Path, bottom_takes_sigterm: str) -> tuple[subprocess.Popen, int, int]:
    """The leader (a group of its own), the middle process's pid, the bottom one's (its own session)."""
    for name, script in (("leader", LEADER), ("middle", MIDDLE), ("bottom", BOTTOM)):
        (tmp_path / f"{name}.py").write_text(script)
    pids = tmp_path / "pids.json"
    leader = subprocess.Popen([sys.executable, str(tmp_path / "leader.py"), str(tmp_path), bottom_takes_sigterm],
                              start_new_session=True)
    deadline = time.monotonic() + 30
    while not pids.exists():
        assert time.monotonic() < deadline and leader.poll() is None, "the tree never started"
        time.sleep(0.02)
    middle, bottom = json.loads(pids.read_text())
    return leader, middle, bottom


@pytest.fixture
def tree(tmp_path, request):
    leader, middle, bottom = start_tree(tmp_path, request.param)
    yield leader, middle, bottom
    for pid in (leader.pid, middle, bottom):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    leader.wait()


@pytest.mark.parametrize("tree", ["default"], indirect=True)
def test_the_tree_holds_what_lies_below_a_member_of_the_leaders_group(tree):
    leader, middle, bottom = tree
    assert process_tree(leader.pid) == sorted([middle, bottom])


@pytest.mark.parametrize("stopped", [False, True], ids=["running", "stopped"])
@pytest.mark.parametrize("tree", ["ignores"], indirect=True)
def test_a_process_orphaned_while_the_tree_stops_is_killed_at_the_grace(tree, stopped):
    """The middle process ends at SIGTERM, its child ignores it (or is stopped and cannot take it): that child no
    longer lies below the leader, and must still be killed when the grace is over, not left running."""
    leader, middle, bottom = tree
    if stopped:
        os.kill(bottom, signal.SIGSTOP)
    assert stop_tree(leader.pid, lambda: leader.poll() is not None, grace=1.0) is True
    time.sleep(0.2)  # SIGKILL is delivered asynchronously
    assert not alive(middle) and not alive(bottom)
