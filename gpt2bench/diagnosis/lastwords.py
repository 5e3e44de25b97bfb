"""What a failed container said: the last meaningful line of its log or termination message (a launcher's
rank first, when one said it), the trainer's own reason from its summary, or its runtime's words when its command
never started. One reading for the operator (a pod's log) and the local runner (a process's output)."""

from __future__ import annotations

import re
from typing import Any

from gpt2bench.collect import CollectError, clean_reason, parse_termination_message, summary_failure
from gpt2bench.conventions import STEPS_PREFIX, SUMMARY_PREFIX

# Line length kept of a log line in a reason.
LINE_LIMIT = 300


# ------------------------------------------------------------------ a container the runtime could not start

# The reasons a container runtime gives a container whose command it could not start (containerd's CRI:
# StartError, exit code 128; dockershim: ContainerCannotRun), and the kubelet's while it retries.
START_FAILURES = ("StartError", "ContainerCannotRun", "RunContainerError")
# runc, crun and Go's os/exec word a missing command so: `exec: "x": executable file not found in $PATH`,
# `exec: "/x": stat /x: no such file or directory`, `executable file `x` not found in $PATH` (crun).
_EXEC_ERROR = re.compile(r'exec: "([^"]*)": (executable file not found in \$PATH|(?:stat [^:]*: )?no such file or '
                         r'directory|permission denied)')
_CRUN_NOT_FOUND = re.compile(r"executable file `([^`]*)` not found in \$PATH")


def executable_not_found(program: str) -> str:
    """A missing command, as runc reports it through containerd (and the local runner, finding it missing)."""
    if "/" in program:
        return f'exec: "{program}": stat {program}: no such file or directory'
    return f'exec: "{program}": executable file not found in $PATH'


def start_failure(message: str | None) -> str:
    """The essential part of a container runtime's message about a command it could not start (containerd
    wraps runc's words in four layers of its own: `failed to create containerd task: failed to create shim
    task: OCI runtime create failed: ...`): the command and why, in runc's words; else the whole message."""
    text = message or ""
    crun = _CRUN_NOT_FOUND.search(text)
    if crun:
        return executable_not_found(crun.group(1))
    found = _EXEC_ERROR.search(text)
    if found:
        return f'exec: "{found.group(1)}": {found.group(2)}'
    return clean_reason(text)[:LINE_LIMIT]



# ------------------------------------------------------------------ what a container printed

# Prefixes launchers add to their children's lines: horovodrun's `[1]<stderr>:` (its rank), mpirun's
# `[1,0]<stdout>:` (its job, then its rank)
_TAG = re.compile(r"^\[(?:\d+,)?(?P<rank>\d+)\]<(?:stdout|stderr)>:\s?")
# A Python logging header (the trainer's `2026-01-01 10:00:00,123 rank1 ERROR `)
_LOG_HEADER = re.compile(r"^\d{4}-\d\d-\d\d[ T][\d:.,]+\s+(?:rank(?P<rank>\d+)\s+)?"
                         r"(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+")
_ERROR = re.compile(r"(Error|Exception|error:|ERROR|not found|No module named|Killed|Aborted|terminate called|"
                    r"Timed out|timed out|waited more than|[Oo]ut of memory)")
# Lines that say nothing of the cause: tracebacks' frames, the launchers' own accounts of a child's failure.
_NOISE = re.compile(
    r"^(File |Traceback|raise |\^|~|During handling|The above exception)|ChildFailedError|elastic/multiprocessing|"
    r"torch\.distributed\.elastic|^Process \d+ exit with status code|^Terminating remaining workers|^Terminated$|"
    r"Horovod detected that one or more processes exited|^Process name:|^Exit code:|^-{5,}|"
    r"mpirun detected that one or more processes exited|^Primary job +terminated|^Child job \d+ terminated|"
    r"process rank \d+ with PID|^Exit status:|^warnings\.warn|UserWarning|resource_tracker|^time\s*:|^host\s*:|"
    r"^error_file\s*:|^traceback\s*:|^\[\d+\]:$|^Failures:|^<NO_OTHER_FAILURES>|^Root Cause|^=+$|"
    r"^rank\s*:|^exitcode\s*:"
)
_ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)[^\n]*?"
    r"(\((SIG\w+)\))?\n",
    re.DOTALL,
)


def _plain(line: str) -> str:
    return _TAG.sub("", line.rstrip("\r\n")).strip()


def _says_nothing(line: str) -> bool:
    header = _LOG_HEADER.match(line)
    if header and header.group(2) in ("DEBUG", "INFO"):  # progress, the resolved config: never a cause
        return True
    body = line[header.end():] if header else line
    return (not body or body.startswith((SUMMARY_PREFIX.strip(), STEPS_PREFIX.strip())) or body[:1] in "{["
            or bool(_NOISE.search(body)))


def last_meaningful_line(text: str | None) -> str | None:
    """What a failed container last said about its failure: torchrun's root cause (which rank, which exit code
    or signal) and the last error-looking line that is not a launcher's or a traceback's frame, without the
    launcher's tags and the log header; else the last line that is not noise (JSON dumps such as the trainer's
    config, summary lines, INFO lines, the launchers' banners); None when nothing is left."""
    if not text:
        return None
    parts = []
    root = _ROOT_CAUSE.search(text)
    if root:
        rank, code, signame = root.group(1), root.group(2), root.group(4)
        parts.append(f"rank {rank} " + (f"killed by {signame}" if signame else f"exited with code {code}"))
    line = _last_said(text)
    if line is not None:
        header = _LOG_HEADER.match(_plain(line))
        parts.append(_plain(line)[header.end():] if header else _plain(line))
    return clean_reason("; ".join(parts))[:LINE_LIMIT] or None


def _last_said(text: str) -> str | None:
    """The line (as printed) `last_meaningful_line` reads: the last error-looking one, else the last not noise."""
    lines = [line for line in text.splitlines()[-300:] if _plain(line) and not _says_nothing(_plain(line))]
    errors = [line for line in lines if _ERROR.search(_plain(line))]
    return (errors or lines or [None])[-1]


def rank_said(text: str | None) -> str | None:
    """`rank N: <its last meaningful line>` when that line of a launcher's output (mpirun, horovodrun) came from
    one of its ranks (the launcher's tag, else the trainer's log header names it); None when it is the launcher's
    own (`ORTE was unable to reach daemon ...`) or nothing was said."""
    line = _last_said(text or "")
    if line is None:
        return None
    tag, header = _TAG.match(line), _LOG_HEADER.match(_plain(line))
    rank = (tag and tag.group("rank")) or (header and header.group("rank"))
    said = _plain(line)[header.end():] if header else _plain(line)
    return clean_reason(f"rank {rank}: {said}")[:LINE_LIMIT] if rank is not None else None


def container_said(termination_message: str | None, log_tail: str | None = None) -> str | None:
    """A failed container's own account: the trainer's reason when its termination message is a failed summary;
    else the last meaningful line of its log (the log tail, else the message, which under
    FallbackToLogsOnError is the log's tail)."""
    try:
        said = summary_failure(parse_termination_message(termination_message))
    except CollectError:
        said = None
    if said:
        return clean_reason(said)[:LINE_LIMIT]
    return last_meaningful_line(log_tail) or last_meaningful_line(termination_message)


def terminated_said(terminated: dict[str, Any], log_tail: str | None = None) -> str | None:
    """What a container that ended badly said: the runtime's words when it never ran (StartError ...: its
    message is the runtime's, it has no log), else `container_said`."""
    if terminated.get("reason") in START_FAILURES:
        return start_failure(terminated.get("message"))
    return container_said(terminated.get("message"), log_tail)
