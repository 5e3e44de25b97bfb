"""`gpt2bench launch -- CMD ...`: run CMD (the MPIJob launcher's mpirun) and keep its result.

The trainer writes its summary to the termination-message file of the pod it runs in, but under an
MPIJob it runs in the Worker pods while the operator reads the Launcher's. So the launcher wraps
mpirun: it streams mpirun's output unchanged, remembers the last `GPT2BENCH_SUMMARY {json}` line,
writes that JSON to the launcher's termination-message file, and exits with mpirun's exit code.
When the command prints no summary line, a failed summary saying how it ended (its exit code, or the signal
that killed it) and the last meaningful line of its output is written instead, so that the operator always
learns why; the trainer's config dump and the launchers' banners are not such lines (gpt2bench.diagnosis).

`--wait-seconds N`: before running the command, wait up to N seconds until every other host of the MPI hostfile
(`$OMPI_MCA_orte_default_hostfile`, which mpi-operator and Trainer v2's MPI plugin mount) resolves and accepts
a connection on the sshd port: the launcher is created with the workers (so that a gang of all the job's pods
can be scheduled: render/mpijob.py), and mpirun would fail on a worker still waiting for its node or image.
A worker that does not come in time ends the launcher with a failed summary naming it.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

from gpt2bench.collect import summary_json
from gpt2bench.conventions import MAX_TERMINATION_MESSAGE, SSH_PORT, SUMMARY_PREFIX, TERMINATION_LOG_ENV
from gpt2bench.diagnosis import executable_not_found, exit_how, last_meaningful_line, rank_said
from gpt2bench.files import DEFAULT_TERMINATION_LOG, termination_log_path, write_termination_message

HOSTFILE_ENV = "OMPI_MCA_orte_default_hostfile"  # where mpi-operator and Trainer v2's MPI plugin put the hostfile
POLL_SECONDS, REPORT_EVERY_SECONDS = 2.0, 30.0


def failure_summary(reason: str, tail: list[str], killed: bool = False) -> str:
    """A compact failed summary. When a rank said why last (`rank 1: horovod: the all-reduce ... waited more than
    4 s ...`), that first and how the command ended after it, in brackets: the rank's reason is the run's, on the
    cluster (the launcher pod's termination message) as locally. Else, or when the command was `killed` (the
    launcher pod deleted: that is the cause), `reason` then the last meaningful line of the output's tail."""
    text = "\n".join(tail)
    rank = None if killed else rank_said(text)
    if rank:
        reason = f"{rank} ({reason})"
    else:
        said = last_meaningful_line(text)
        reason = reason + (f": {said}" if said else "")
    return json.dumps({"status": "failed", "reason": reason[: MAX_TERMINATION_MESSAGE - 64]}, separators=(",", ":"))


def no_summary_reason(program: str, code: int) -> str:
    """How the command ended without the trainer's summary: `mpirun was killed by SIGTERM (exit code 143)` (the
    launcher pod deleted, the node drained ...), `mpirun exited with code 1`."""
    how = exit_how(code)
    return f"{program} {'was ' + how if how.startswith('killed') else how} without a {SUMMARY_PREFIX.strip()} line"


def run(command: list[str], out=None) -> tuple[int, str | None, list[str]]:
    """Run `command`, copy its output to `out`; return (exit code, last summary JSON, last lines)."""
    out = out or sys.stdout.buffer
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    forwarded = {}

    def forward(signum, _frame):  # let mpirun stop its ranks itself
        process.send_signal(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        forwarded[signum] = signal.signal(signum, forward)
    summary: str | None = None
    tail: collections.deque[str] = collections.deque(maxlen=100)
    try:
        assert process.stdout is not None
        for raw in process.stdout:
            out.write(raw)
            out.flush()
            line = raw.decode(errors="replace").rstrip("\r\n")
            found = summary_json(line)
            if found is not None:
                summary = found
            elif line.strip():
                tail.append(line)
        code = process.wait()
    finally:
        for signum, handler in forwarded.items():
            signal.signal(signum, handler)
    return code, summary, list(tail)


def hostfile_hosts(path: str) -> list[str]:
    """The hosts of an MPI hostfile (`<host> slots=N` lines), in order, each once."""
    hosts = []
    with open(path, encoding="utf-8") as text:
        for line in text:
            words = line.split("#", 1)[0].split()
            if words and words[0] not in hosts:
                hosts.append(words[0])
    return hosts


def is_this_pod(host: str) -> bool:
    """A hostfile entry that is the launcher itself (runLauncherAsNode) or this machine (a local run)."""
    own = socket.gethostname().split(".")[0]
    return host in ("localhost", "::1") or host.startswith("127.") or host.split(".")[0] == own


def reachable(host: str, port: int) -> str | None:
    """None when `host:port` accepts a connection, else why not (resolution or connection error)."""
    try:
        with socket.create_connection((host, port), timeout=3):
            return None
    except OSError as exc:
        return exc.strerror or str(exc) or type(exc).__name__


def wait_for_workers(hosts: list[str], port: int, seconds: float, *, check: Callable[[str, int], str | None] = reachable,
                     clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                     say: Callable[[str], None] = lambda text: print(text, file=sys.stderr, flush=True),
                     ) -> dict[str, str]:
    """Wait until every host accepts connections on `port`, at most `seconds`: the hosts that still did not, with
    their last error (empty when all did)."""
    pending = {host: "not tried" for host in hosts}
    start = last_report = clock()
    while pending:
        for host in list(pending):
            problem = check(host, port)
            if problem is None:
                del pending[host]
            else:
                pending[host] = problem
        elapsed = clock() - start
        if not pending or elapsed >= seconds:
            break
        if clock() - last_report >= REPORT_EVERY_SECONDS:
            say(f"gpt2bench launch: waiting {elapsed:.0f} s for sshd on {len(pending)} of {len(hosts)} workers "
                f"({', '.join(f'{h}:{port}' for h in sorted(pending))})")
            last_report = clock()
        sleep(POLL_SECONDS)
    return pending


def workers_missing_reason(missing: dict[str, str], port: int, seconds: float) -> str:
    host, why = sorted(missing.items())[0]
    more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
    return (f"the workers' sshd did not answer within {seconds:g} s: {host}:{port} ({why}){more}: their pods have "
            "not started (the operator's waiting reason says why)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpt2bench launch",
        description="Run a command (the MPIJob launcher's mpirun) and copy the trainer's summary line to "
        f"the termination message (${TERMINATION_LOG_ENV}, else {DEFAULT_TERMINATION_LOG} when it exists).",
    )
    parser.add_argument("--wait-seconds", type=float, default=0, metavar="N",
                        help=f"first wait up to N seconds for every other host of ${HOSTFILE_ENV} to accept "
                             "connections on --ssh-port (0: do not wait)")
    parser.add_argument("--ssh-port", type=int, default=SSH_PORT, help="the workers' sshd port (default %(default)s)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --, e.g. gpt2bench launch -- mpirun -np 2 gpt2bench train ...")
    path = termination_log_path()
    hostfile = os.environ.get(HOSTFILE_ENV)
    if args.wait_seconds > 0 and hostfile:
        try:
            hosts = [host for host in hostfile_hosts(hostfile) if not is_this_pod(host)]
        except OSError as exc:
            hosts, missing = [], {hostfile: exc.strerror or str(exc)}
        else:
            missing = wait_for_workers(hosts, args.ssh_port, args.wait_seconds)
        if missing:
            reason = (workers_missing_reason(missing, args.ssh_port, args.wait_seconds) if hosts else
                      f"cannot read the MPI hostfile {hostfile}: {missing[hostfile]}")
            print(f"gpt2bench launch: {reason}", file=sys.stderr)
            leave_message(path, json.dumps({"status": "failed", "reason": reason}, separators=(",", ":")))
            return 1
    try:
        code, summary, tail = run(command)
    except OSError as exc:  # not found / not executable: in the words runc uses for a container's own command
        why = executable_not_found(command[0]) if isinstance(exc, FileNotFoundError) else \
            f'exec: "{command[0]}": {exc.strerror or exc}'
        print(f"gpt2bench launch: cannot run {command[0]!r}: {why}", file=sys.stderr)
        code, tail = (127 if isinstance(exc, FileNotFoundError) else 126), []  # as a shell exits
        summary = json.dumps({"status": "failed", "reason": why}, separators=(",", ":"))
    if code < 0:  # killed by a signal: report it the way a shell does
        code = 128 - code
    if summary is None:
        message = failure_summary(no_summary_reason(command[0], code), tail, killed=code > 128)
    else:
        message = summary
    leave_message(path, message)
    return code


def leave_message(path, message: str) -> None:
    """The termination message, where the operator reads the run's result (a failure to write it is said)."""
    if path is None:
        return
    try:
        write_termination_message(path, message)
    except OSError as exc:
        print(f"gpt2bench launch: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
