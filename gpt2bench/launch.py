"""`gpt2bench launch -- CMD ...`: run CMD (the MPIJob launcher's mpirun) and keep its result.

The trainer writes its summary to the termination-message file of the pod it runs in, but under an
MPIJob it runs in the Worker pods while the operator reads the Launcher's. So the launcher wraps
mpirun: it streams mpirun's output unchanged, remembers the last `GPT2BENCH_SUMMARY {json}` line,
writes that JSON to the launcher's termination-message file, and exits with mpirun's exit code.
When the command prints no summary line, a failed summary saying how it ended (its exit code, or the signal
that killed it) and the last meaningful line of its output is written instead, so that the operator always
learns why; the trainer's config dump and the launchers' banners are not such lines (gpt2bench.diagnosis).
"""

from __future__ import annotations

import argparse
import collections
import json
import signal
import subprocess
import sys

from gpt2bench.collect import summary_json
from gpt2bench.diagnosis import executable_not_found, exit_how, last_meaningful_line, rank_said
from gpt2bench.files import DEFAULT_TERMINATION_LOG, termination_log_path, write_termination_message
from gpt2bench.protocol import MAX_TERMINATION_MESSAGE, SUMMARY_PREFIX, TERMINATION_LOG_ENV


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="gpt2bench launch",
        description="Run a command (the MPIJob launcher's mpirun) and copy the trainer's summary line to "
        f"the termination message (${TERMINATION_LOG_ENV}, else {DEFAULT_TERMINATION_LOG} when it exists).",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --, e.g. gpt2bench launch -- mpirun -np 2 gpt2bench train ...")
    path = termination_log_path()
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
    if path is not None:
        try:
            write_termination_message(path, message)
        except OSError as exc:
            print(f"gpt2bench launch: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
