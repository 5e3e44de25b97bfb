"""Why a run failed, or has not started: one wording for the operator and for the local runner.

The failure path, in the order it is read (a run's pods on a cluster; locally its replicas, the processes that
stand for those pods):

1. `pods.py`: how each pod ended badly (`PodEnd`: OOMKilled, killed by a signal, an exit code, evicted, stuck
   Terminating with its node) or why it has not started (`PodWait`: the scheduler's and the kubelet's words);
2. `lastwords.py`: what its failed container said last (its log's last meaningful line, a launcher's rank first; the
   trainer's own reason; the runtime's words for a command it could not start);
3. `pods.first_failure`: which pod is the cause: the first by time, within the same second by how it ended (a
   peer that failed because of it comes last), so the same fault reads the same on a laptop and on a cluster;
4. `pods.failure_reason`, `startup_reason`, `queue_reason`, `cannot_start_here`: the run's reason in words.

Everything is importable from here (`from gpt2bench import diagnosis; diagnosis.first_failure(...)`).
"""

from .lastwords import (
    LINE_LIMIT,
    START_FAILURES,
    container_said,
    executable_not_found,
    last_meaningful_line,
    rank_said,
    start_failure,
    terminated_said,
)
from .pods import (
    PEER_FAILURE,
    PREEMPTED,
    PREEMPTED_BY,
    STARTING,
    STOP_SIGNALS,
    STUCK_AFTER_SECONDS,
    PodEnd,
    PodWait,
    cannot_start_here,
    caused_by_another,
    end_rank,
    exit_how,
    failed_container,
    failure_reason,
    first_failure,
    first_seconds,
    pod_end,
    pod_ends,
    pod_started,
    pod_waits,
    pods_started,
    queue_reason,
    refused_reason,
    startup_reason,
    stuck_terminating,
    waiting_for,
)

__all__ = [
    "LINE_LIMIT", "PEER_FAILURE", "PREEMPTED", "PREEMPTED_BY", "STARTING", "START_FAILURES", "STOP_SIGNALS", "STUCK_AFTER_SECONDS", "PodEnd",
    "PodWait", "caused_by_another", "cannot_start_here", "container_said", "end_rank", "executable_not_found", "exit_how",
    "failed_container", "failure_reason", "first_failure", "first_seconds", "last_meaningful_line", "pod_end",
    "pod_ends", "pod_started", "pod_waits", "pods_started", "queue_reason", "rank_said", "refused_reason", "start_failure",
    "startup_reason", "stuck_terminating", "terminated_said", "waiting_for",
]
