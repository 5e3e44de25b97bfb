"""gpt2bench.diagnosis: how a pod (a local replica) ended or why it has not started, read from pod dicts as the
API returns them, in the words both the operator and the local runner use (tests/test_operator_pods.py runs
them against the emulated cluster and the local runner)."""

from __future__ import annotations

import dataclasses
import datetime

from gpt2bench import diagnosis

NOW = datetime.datetime(2026, 11, 25, 10, 5, tzinfo=datetime.UTC)


def terminated(code: int, reason: str = "Error", at: str = "2026-11-25T10:00:00Z", **extra) -> dict:
    return {"terminated": {"exitCode": code, "reason": reason, "finishedAt": at, **extra}}


def pod(name: str, *, state: dict | None = None, last: dict | None = None, restarts: int = 0, **status) -> dict:
    container = {"name": "pytorch", "state": state or {"running": {}}, "restartCount": restarts}
    if last:
        container["lastState"] = last
    return {"metadata": {"name": name}, "spec": {"nodeName": "n1"},
            "status": {"containerStatuses": [container], **status}}


def test_how_a_container_exited_reads_the_same_from_the_kubelet_and_from_a_local_process():
    assert diagnosis.exit_how(137, "OOMKilled") == "OOMKilled (exit code 137)"
    assert diagnosis.exit_how(137, "Error") == "killed by SIGKILL (exit code 137)"
    assert diagnosis.exit_how(-9) == "killed by SIGKILL (exit code 137)"  # a local Popen's return code
    assert diagnosis.exit_how(1) == diagnosis.exit_how(1, "Error") == "exited with code 1"
    assert diagnosis.exit_how(128, "StartError") == "StartError (exit code 128)"


def test_the_first_pod_that_failed_by_time_is_the_cause_whatever_the_order():
    worker = pod("j-worker-0", state=terminated(1, at="2026-11-25T10:00:01Z"))
    master = pod("j-master-0", state=terminated(1, at="2026-11-25T10:00:09Z"))
    first = diagnosis.first_failure(diagnosis.pod_ends([master, worker], NOW))
    assert first.pod == "j-worker-0" and first.how == "exited with code 1"


def test_within_one_second_how_a_pod_ended_decides_and_a_peers_failure_comes_last():
    """finishedAt has 1 s resolution: a job's pods that fail together usually share it. The victim (its peer's
    connection closed) is listed first here; the OOMKill, the signal or the real error is the cause."""
    same = "2026-11-25T10:00:01Z"
    master = diagnosis.PodEnd("j-master-0", "exited with code 1", "pytorch", same,
                              "RuntimeError: [gloo] Connection closed by peer [10.0.0.2]:29500")
    oom = diagnosis.PodEnd("j-worker-0", "OOMKilled (exit code 137)", "pytorch", same)
    killed = diagnosis.PodEnd("j-worker-1", "killed by SIGKILL (exit code 137)", "pytorch", same)
    crashed = diagnosis.PodEnd("j-worker-2", "exited with code 1", "pytorch", same, "ValueError: bad batch")
    evicted = diagnosis.PodEnd("j-worker-3", "Evicted: The node was low on resource: memory.", at=same)
    assert diagnosis.first_failure([master, crashed]) == crashed
    assert diagnosis.first_failure([master, crashed, killed]) == killed
    assert diagnosis.first_failure([master, crashed, killed, oom]) == oom
    assert diagnosis.first_failure([master, oom, evicted]) == evicted
    watchdog = diagnosis.PodEnd("j-master-0", "exited with code 1", "pytorch", same,
                                "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, "
                                "OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.")
    assert diagnosis.first_failure([watchdog, crashed]) == crashed
    earlier = diagnosis.PodEnd("j-master-0", "exited with code 1", "pytorch", "2026-11-25T10:00:00Z",
                               "Timed out waiting 4000ms for recv operation to complete")
    assert diagnosis.first_failure([crashed, earlier]) == earlier, "a second earlier: the cause (a peer that hung)"
    local = [dataclasses.replace(end, at=None) for end in (master, killed)]  # one local poll: no times
    assert diagnosis.first_failure(local) == local[1]
    torchrun = diagnosis.PodEnd("j-worker-0", "exited with code 1", "pytorch", same, "rank 1 killed by SIGKILL")
    assert diagnosis.first_failure([crashed, torchrun]) == torchrun, "torchrun's root cause: a rank's signal"
    stopped = diagnosis.PodEnd("j-worker-4", "killed by SIGTERM (exit code 143)", "pytorch", same)
    assert diagnosis.first_failure([stopped, master]) == master, "SIGTERM: its peers' teardown stopped it"


def test_a_restarted_container_keeps_its_oomkilled_in_last_state():
    restarted = pod("j-worker-0", state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}},
                    last=terminated(137, "OOMKilled"), restarts=2)
    (end,) = diagnosis.pod_ends([restarted], NOW)
    assert end.describe() == "pod j-worker-0 (container pytorch) OOMKilled (exit code 137), restarted 2 times"
    assert diagnosis.failed_container(restarted)[2] is True, "its log is the previous container's"


def test_an_evicted_pod_says_so_in_the_kubelets_words():
    evicted = pod("p", state=terminated(137), phase="Failed", reason="Evicted",
                  message="The node was low on resource: memory.")
    (end,) = diagnosis.pod_ends([evicted], NOW)
    assert end.describe() == "pod p Evicted: The node was low on resource: memory."


def test_a_graceful_deletion_is_no_failure_until_its_grace_period_is_long_past():
    deleting = {"metadata": {"name": "p", "deletionTimestamp": "2026-11-25T10:05:20Z"}, "spec": {"nodeName": "n1"},
                "status": {"phase": "Running"}}
    assert diagnosis.pod_ends([deleting], NOW) == [], "grace period not over: a normal deletion"
    late = NOW + datetime.timedelta(seconds=20 + diagnosis.STUCK_AFTER_SECONDS + 1)
    (end,) = diagnosis.pod_ends([deleting], late)
    assert end.describe() == ("pod p stuck Terminating since 2026-11-25T10:05:20Z (61 s past its grace period: is its "
                              "node gone? `kubectl get node n1`)")
    finished = {**deleting, "status": {"phase": "Succeeded"}}
    assert diagnosis.pod_ends([finished], late) == [], "being deleted after it ended: nothing went wrong"


def test_a_pod_the_taint_manager_deleted_is_lost_with_its_node_at_once():
    lost = {"metadata": {"name": "p", "deletionTimestamp": "2026-11-25T10:05:30Z"}, "spec": {"nodeName": "gone"},
            "status": {"phase": "Running", "conditions": [
                {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
                 "message": "Taint manager: deleting due to NoExecute taint"}]}}
    (end,) = diagnosis.pod_ends([lost], NOW)
    assert end.describe() == ("pod p stuck Terminating since 2026-11-25T10:05:30Z: its node gone is gone "
                              "(DeletionByTaintManager: Taint manager: deleting due to NoExecute taint)")


def test_what_a_pod_waits_for_is_the_schedulers_or_the_kubelets_reason_and_message():
    unscheduled = {"metadata": {"name": "j-worker-0"}, "status": {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]}}
    pulling = pod("j-master-0", state={"waiting": {"reason": "ImagePullBackOff",
                                                    "message": 'Back-off pulling image "x:1"'}})
    creating = pod("j-a", state={"waiting": {"reason": "ContainerCreating"}})
    waits = diagnosis.pod_waits([creating, unscheduled, pulling])
    assert [w.describe() for w in waits] == [
        'pod j-master-0 (container pytorch) ImagePullBackOff: Back-off pulling image "x:1"',
        "pod j-worker-0 Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
        "pod j-a (container pytorch) ContainerCreating",  # on its way: named last
    ]
    started = pod("j-master-0")
    assert diagnosis.pods_started([started], 1) and not diagnosis.pods_started([started], 2)
    assert diagnosis.waiting_for([started], 2).startswith("1 of 2 pods created")
    assert diagnosis.waiting_for([], 2).startswith("no pod yet")


def test_the_last_meaningful_line_skips_config_dumps_summaries_tracebacks_and_launcher_banners():
    log = "\n".join([
        "[1]<stderr>:2026-11-26 10:00:00,000 rank1 INFO config {\"model\": {\"preset\": \"tiny\"}}",
        "Traceback (most recent call last):",
        '  File "/x/train.py", line 3, in <module>',
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        'GPT2BENCH_SUMMARY {"status": "failed"}',
        "Process 1 exit with status code 1.",
        "Terminating remaining workers after failure of Process 1.",
    ])
    assert diagnosis.last_meaningful_line(log) == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert diagnosis.last_meaningful_line('{"data": 1}\n2026-11-26 10:00:00,000 rank0 INFO step 3') is None
    assert diagnosis.container_said('{"status": "failed", "reason": "loss is NaN at step 3"}', log) == \
        "loss is NaN at step 3", "the trainer's own reason first"


RUNC = ('failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: '
        'unable to start container process: error during container init: exec: "torchrun": executable file not found '
        'in $PATH: unknown')


def test_a_command_its_runtime_could_not_start_is_named_in_runcs_words_and_never_counts_as_started():
    never = pod("j-master-0", state=terminated(128, "StartError", message=RUNC))  # restartPolicy Never
    (end,) = diagnosis.pod_ends([never], NOW)
    assert end.describe() == ('pod j-master-0 (container pytorch) StartError: exec: "torchrun": executable file not '
                              'found in $PATH')
    backing_off = pod("j-master-0", state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}},
                      last=terminated(128, "StartError", message=RUNC), restarts=3)  # OnFailure
    for stuck in (never, backing_off):
        assert not diagnosis.pod_started(stuck), "it never ran"
        (wait,) = diagnosis.pod_waits([stuck])
        assert wait.describe() == end.describe()
    crashed = pod("j-master-0", state={"waiting": {"reason": "CrashLoopBackOff"}}, last=terminated(1), restarts=1)
    assert diagnosis.pod_started(crashed), "it ran, then failed: a failure, not a start"
    # the local runner's words for the same missing command; crun's own words are read as runc's
    assert diagnosis.start_failure(RUNC) == diagnosis.executable_not_found("torchrun")
    assert diagnosis.start_failure("crun: executable file `torchrun` not found in $PATH: No such file or directory: "
                                   "OCI runtime attempted to invoke a command that was not found") == \
        diagnosis.executable_not_found("torchrun")
    assert diagnosis.executable_not_found("/opt/x") == 'exec: "/opt/x": stat /opt/x: no such file or directory'
    assert diagnosis.start_failure(RUNC.replace('exec: "torchrun": executable file not found in $PATH',
                                                'exec: "/opt/x": stat /opt/x: no such file or directory')) == \
        diagnosis.executable_not_found("/opt/x")


def test_fewer_pods_than_expected_names_the_one_not_ready_that_the_others_wait_for():
    sshd = pod("tj-node-0-0-abcde")
    sshd["status"]["conditions"] = [{"type": "Ready", "status": "False", "reason": "ContainersNotReady",
                                     "message": "containers with unready status: [node]"}]
    assert not diagnosis.pods_started([sshd], 2), "the launcher pod does not exist yet"
    assert diagnosis.waiting_for([sshd], 2) == (
        "1 of 2 pods created; pod tj-node-0-0-abcde is not Ready (ContainersNotReady: containers with unready "
        "status: [node]), and the job's controller may create the others only once it is")
