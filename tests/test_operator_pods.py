"""A run's pods, read by the real kopf operator against the emulated API (tests/kube), the test playing the
training operator's controller, the scheduler and the kubelet as upstream words them (tests/kube/training.py):

- a run whose pods never start (an image not pulled, no node fits, a queue that never admits it) says what it
  waits for, then ends Failed at runPolicy.startupSeconds / queueSeconds naming the pod, container, reason and
  message; its job is deleted, an Event posted, and the sweep goes on;
- a failed run names the first pod that failed (by time, workers included), how (OOMKilled kept in lastState
  across a restart) and the last meaningful line of its log;
- the same fault gets the same words on the cluster and from the local runner (`test_the_same_fault_reads_the_
  same_on_the_cluster_and_locally`: faults x both paths).
"""

from __future__ import annotations

import os
import sys
import time

import pytest
from fault_figures import FIGURES, seconds_since
from kube.fixtures import benchmark, kopf_operator, operator_calls, wait_for
from kube.training import TrainingOperator, kueue_webhook

from gpt2bench import diagnosis
from gpt2bench.collect import collect_run
from gpt2bench.local.executor import execute_job
from gpt2bench.plan import plan_runs
from gpt2bench.render import render_job
from gpt2bench.specification.validation import load_benchmark

pytestmark = pytest.mark.timeout(180)
STARTUP = 2  # runPolicy.startupSeconds and queueSeconds here: the operator polls every 0.3 s
TWO_NODES = [{"nodes": 2, "devicesPerNode": 0, "processesPerNode": 1}]
OOM_LOG = ("2026-11-26 10:00:00,000 rank1 INFO config {\"model\": {\"preset\": \"tiny\"}}\n"
           "Traceback (most recent call last):\n  File \"/app/train.py\", line 9, in step\n"
           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
           "79.1 GiB of which 1.2 GiB is free.\n")


@pytest.fixture(scope="module")
def operator(cluster):
    cluster.call(lambda emulator: emulator.admission.append(kueue_webhook))
    with kopf_operator(cluster, poll_seconds=0.3) as runner:
        yield runner


def spec(strategies: list[str], scales=TWO_NODES, **extra) -> dict:
    return {"strategies": [{"name": s} for s in strategies], "scales": scales, **extra}


def create(benchmarks, name: str, strategies: list[str], scales=TWO_NODES, **spec_fields) -> None:
    spec_fields.setdefault("runPolicy", {"startupSeconds": STARTUP, "queueSeconds": STARTUP})
    body = benchmark(name, [{"name": s} for s in strategies], **spec_fields)
    body["spec"]["sweep"]["scales"] = scales
    benchmarks.create(body)


def first_job(trainer: TrainingOperator, name: str) -> dict:
    return wait_for(lambda: next(iter(trainer.jobs(name)), None), 30, what=f"the first job of {name}")


def run_entry(benchmarks, name: str, index: int = 0, phase: str = "Failed") -> dict:
    return wait_for(lambda: (r := (benchmarks.status(name).get("runs") or [{}] * (index + 1))[index]).get("phase")
                    == phase and r, 30, what=f"run {index} of {name} {phase}")


def runs_lost(status: dict) -> int:
    """Runs of a finished sweep without an outcome (neither a result nor a reason)."""
    return sum(1 for r in status.get("runs") or [] if r.get("phase") not in ("Succeeded", "Failed", "Skipped"))


@pytest.mark.faults
def test_a_pod_whose_image_cannot_be_pulled_fails_its_run_at_the_startup_limit_and_the_sweep_goes_on(
        cluster, benchmarks, trainer):
    name = "pull"
    create(benchmarks, name, ["ddp", "fsdp"])
    job = first_job(trainer, name)
    seen = time.monotonic()
    job_name = job["metadata"]["name"]
    trainer.start(job)  # the controller says Running as soon as its master runs (training-operator)
    master, worker = trainer.create_pods(job)
    trainer.running(master)
    injected = time.monotonic()
    trainer.waiting(worker, "ImagePullBackOff", 'Back-off pulling image "registry.example/gpt2bench:nope"')
    said = f'pod {worker} (container pytorch) ImagePullBackOff: Back-off pulling image "registry.example/gpt2bench:nope"'
    wait_for(lambda: (benchmarks.status(name).get("runs") or [{}])[0].get("waiting") == said, 10, what=said)
    shown = seconds_since(injected)
    assert benchmarks.status(name)["waiting"] == f"{name}-ddp-fp32-2x1: {said}"
    assert said in cluster.kubectl("get", "gpt2benchmark", name).stdout, "kubectl get's Waiting column"
    failed = run_entry(benchmarks, name)
    failed_after = seconds_since(seen)
    assert failed["reason"] == diagnosis.startup_reason(said, STARTUP)
    wait_for(lambda: any(e["reason"] == "RunFailed" and said in e["message"] for e in benchmarks.events(name)), 10,
             what="its RunFailed Event")  # kopf posts Events from a queue of its own
    wait_for(lambda: job_name not in [j["metadata"]["name"] for j in trainer.jobs(name)], 10, what="its job deleted")
    second = wait_for(lambda: [j for j in trainer.jobs(name) if j["metadata"]["name"] != job_name], 10,
                      what="the next run's job")[0]  # the sweep went on
    trainer.start(second)
    for pod in trainer.create_pods(second):
        trainer.running(pod)
    started = wait_for(lambda: (r := benchmarks.status(name)["runs"][1]).get("podsStartedTime") and r, 10,
                       what="the second run's pods started")
    assert not started.get("waiting")
    trainer.succeed(second, 120.0)
    status = wait_for(lambda: (s := benchmarks.status(name))["phase"] != "Running" and s, 20, what="the end")
    assert status["phase"] == "PartiallySucceeded" and not status.get("waiting")
    FIGURES["image-pull-backoff"] = {
        "injected": 1, "startupSeconds": STARTUP, "waiting_shown_after_s": shown, "failed_after_job_seen_s": failed_after,
        "job_deleted": True, "next_run": status["runs"][1]["phase"], "runs_lost": runs_lost(status),
        "reason": failed["reason"]}


@pytest.mark.faults
def test_a_job_its_queue_never_admits_fails_at_the_queue_limit(benchmarks, trainer):
    name = "unadmitted"
    create(benchmarks, name, ["ddp"], scheduling={"kueueQueue": "team-a"})
    job = first_job(trainer, name)
    seen = time.monotonic()
    trainer.suspend(job)  # Kueue's webhook created it suspended; the controller says so
    wait_for(lambda: (benchmarks.status(name).get("runs") or [{}])[0].get("waiting", "").startswith(
        f"job {job['metadata']['name']} suspended, waiting for its queue"), 10, what="waiting for its queue")
    failed = run_entry(benchmarks, name)
    failed_after = seconds_since(seen)
    assert failed["reason"].startswith("not admitted within runPolicy.queueSeconds (2 s): job ")
    wait_for(lambda: not trainer.jobs(name), 10, what="its job deleted")
    status = wait_for(lambda: (s := benchmarks.status(name)).get("phase") not in (None, "Running") and s, 10,
                      what="the end")
    FIGURES["queue-never-admits"] = {"injected": 1, "queueSeconds": STARTUP, "failed_after_job_seen_s": failed_after,
                                     "job_deleted": True, "runs_lost": runs_lost(status), "reason": failed["reason"]}


@pytest.mark.faults
def test_a_command_missing_from_the_image_restarted_under_on_failure_is_a_run_that_never_started(
        benchmarks, trainer):
    """With restarts allowed (backoffLimit 2: restartPolicy OnFailure) the kubelet keeps restarting a container
    whose command containerd cannot start; its StartError stays in lastState. That container never ran: the run
    has not started, says why, and fails at the startup limit (a terminated lastState alone counted as started)."""
    name = "nocmd"
    create(benchmarks, name, ["single"], [{"nodes": 1, "devicesPerNode": 0, "processesPerNode": 1}],
           runPolicy={"startupSeconds": STARTUP, "backoffLimit": 2})
    job = first_job(trainer, name)
    trainer.start(job)
    (master,) = trainer.create_pods(job)
    injected = time.monotonic()
    trainer.start_error(master)
    said = f'pod {master} (container pytorch) StartError: exec: "torchrun": executable file not found in $PATH'
    wait_for(lambda: (benchmarks.status(name).get("runs") or [{}])[0].get("waiting") == said, 10, what=said)
    shown = seconds_since(injected)
    failed = run_entry(benchmarks, name)
    assert failed["reason"] == diagnosis.startup_reason(said, STARTUP) and not failed.get("podsStartedTime")
    FIGURES["command-missing-restarting"] = {
        "injected": 1, "startupSeconds": STARTUP, "waiting_shown_after_s": shown,
        "failed_after_injection_s": seconds_since(injected), "runs_lost": 0, "reason": failed["reason"]}


@pytest.mark.faults
@pytest.mark.parametrize("reason,message", [
    ("CreateContainerConfigError", 'secret "hf-token" not found'),  # an env var from a Secret that is not there
    ("InvalidImageName", 'Failed to apply default image tag "Registry.example/GPT2bench": couldn\'t parse image name '
                         '"Registry.example/GPT2bench": invalid reference format'),
])
def test_a_container_the_kubelet_cannot_create_fails_its_run_at_the_startup_limit(benchmarks, trainer, reason, message):
    name = f"nocreate-{reason.lower()}"
    create(benchmarks, name, ["single"], [{"nodes": 1, "devicesPerNode": 0, "processesPerNode": 1}])
    job = first_job(trainer, name)
    trainer.start(job)
    (master,) = trainer.create_pods(job)
    injected = time.monotonic()
    trainer.waiting(master, reason, message)
    said = f"pod {master} (container pytorch) {reason}: {message}"
    failed = run_entry(benchmarks, name)
    assert failed["reason"] == diagnosis.startup_reason(said, STARTUP)
    wait_for(lambda: not trainer.jobs(name), 10, what="its job deleted")
    FIGURES[reason] = {"injected": 1, "startupSeconds": STARTUP, "failed_after_injection_s": seconds_since(injected),
                       "job_deleted": True, "runs_lost": 0, "reason": failed["reason"]}


@pytest.mark.faults
def test_a_workers_oomkilled_restart_is_the_reason_not_the_masters_failure_in_the_same_second(benchmarks, trainer):
    """The worker is OOMKilled (restarted under OnFailure: lastState keeps it) and the master fails because its
    peer went, in the same second (finishedAt has 1 s resolution: the usual case), the master listed first. The
    reason names the worker, how, and what it printed last (before the fix, the tie went to list order, naming
    the master's "Connection closed by peer")."""
    name = "oom"
    create(benchmarks, name, ["ddp"])
    job = first_job(trainer, name)
    trainer.start(job)
    master, worker = trainer.create_pods(job)
    trainer.running(master)
    trainer.running(worker)
    trainer.terminate(master, 1, log="RuntimeError: [gloo] Connection closed by peer [10.0.0.2]:29500\n",
                      finished_at="2026-11-26T10:00:01Z")
    trainer.terminate(worker, 137, reason="OOMKilled", log=OOM_LOG, finished_at="2026-11-26T10:00:01Z",
                      restarted=True)
    failed_at = time.monotonic()
    trainer.fail(job, "Worker")
    reason = run_entry(benchmarks, name)["reason"]
    assert reason == (f"pod {worker} (container pytorch) OOMKilled (exit code 137), restarted 1 time: "
                      f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                      f"capacity of 79.1 GiB of which 1.2 GiB is free.; PyTorchJobFailed: PyTorchJob "
                      f"{job['metadata']['name']} is failed because 1 Worker replica(s) failed.")
    FIGURES["worker-oomkilled-same-second"] = {"injected": 1, "failed_after_job_failed_s": seconds_since(failed_at),
                                               "runs_lost": 0, "reason": reason}


def peer_failure_then_kill_job(name: str) -> dict:
    """A two-node ddp job whose master fails with gloo's "Connection closed by peer" after 0.3 s and whose worker is
    SIGKILLed 0.3 s later: the peer's failure comes first, its cause second."""
    peer_gone = [sys.executable, "-c", "import sys, time; time.sleep(0.3); "
                 "sys.stderr.write('RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:29500\\n'); sys.exit(1)"]
    killed = [sys.executable, "-c", "import os, signal, time; time.sleep(0.6); os.kill(os.getpid(), signal.SIGKILL)"]
    document = benchmark(name, [{"name": "ddp"}])
    document["spec"]["sweep"]["scales"] = TWO_NODES
    bench = load_benchmark(document)
    job = render_job(bench, plan_runs(bench)[0])
    for replica, command in (("Master", peer_gone), ("Worker", killed)):
        job["spec"]["pytorchReplicaSpecs"][replica]["template"]["spec"]["containers"][0]["command"] = command
    return job


@pytest.mark.faults
def test_a_local_replica_killed_in_the_poll_its_peer_failed_in_is_the_reason(tmp_path):
    """Locally the runner sees each replica's end at once (it waits on their pidfds): the master's "Connection closed
    by peer" first, the worker's SIGKILL 0.3 s later. A peer's failure seen alone waits for its cause as long as the
    operator's tie lasts (one second), and the two are told apart by the same rule as on the cluster."""
    started = time.monotonic()
    job = peer_failure_then_kill_job("tie")
    outcome = execute_job(job, tmp_path, gpus=[], grace_seconds=2)
    assert outcome.reason == "pod tie-ddp-fp32-2x1-worker-0 (container pytorch) killed by SIGKILL (exit code 137)"
    FIGURES["local-replicas-same-poll"] = {"injected": 1, "runs_lost": 0, "run_seconds": seconds_since(started),
                                           "reason": outcome.reason}


# --- the same fault, the same words: the cluster (the operator) and the local runner ------------------------

CRASH = [sys.executable, "-c", f"import sys; sys.stderr.write({OOM_LOG!r}); sys.exit(1)"]
KILLED = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
WAIT = [sys.executable, "-c", "import time; time.sleep(60)"]
# kube-scheduler's words for a pod no node can ever take (since kubernetes#131345: every node "Preemption is not
# helpful"); the local runner says the same of this machine (local/executor.py NO_ROOM_FOR_GPUS)
NO_GPU = ("0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are available: 1 Preemption "
          "is not helpful for scheduling.")


def _local(name: str, strategies: list[str], scales: list[dict], tmp_path, commands: dict[str, list[str]],
           path: str | None = None):
    """The run's job as the operator renders it, run by the local runner, each replica's command replaced
    (`path`: the PATH it runs with)."""
    document = benchmark(name, [{"name": s} for s in strategies])
    document["spec"]["sweep"]["scales"] = scales
    bench = load_benchmark(document)
    job = render_job(bench, plan_runs(bench)[0])
    for replica, command in commands.items():
        job["spec"]["pytorchReplicaSpecs"][replica]["template"]["spec"]["containers"][0]["command"] = command
    env = None if path is None else {**os.environ, "PATH": path}
    return execute_job(job, tmp_path, gpus=[], grace_seconds=2, base_env=env)


@pytest.mark.faults
@pytest.mark.parametrize("fault", ["worker-crashes", "worker-killed", "no-gpu", "missing-executable"])
def test_the_same_fault_reads_the_same_on_the_cluster_and_locally(benchmarks, trainer, tmp_path, fault):
    name = f"same-{fault}"
    scales = [{"nodes": 1, "devicesPerNode": 1, "processesPerNode": 1}] if fault == "no-gpu" else TWO_NODES
    strategies = ["single"] if fault == "no-gpu" else ["ddp"]
    worker_command = {"worker-crashes": CRASH, "worker-killed": KILLED}.get(fault)
    empty = tmp_path / "bin"  # an image without torch: its command, torchrun, is nowhere on PATH
    empty.mkdir()
    started = time.monotonic()
    local = _local(name, strategies, scales, tmp_path,
                   {"Master": WAIT, "Worker": worker_command} if worker_command else {},
                   path=str(empty) if fault == "missing-executable" else None)
    local_seconds = seconds_since(started)

    def record(cluster_reason: str, injected: float) -> None:
        FIGURES[f"same-words-{fault}"] = {
            "injected": 2, "paths": ["cluster", "local"], "local_ended_after_s": local_seconds,
            "cluster_failed_after_injection_s": seconds_since(injected), "runs_lost": 0,
            "cluster_reason": cluster_reason, "local_reason": local.reason}

    create(benchmarks, name, strategies, scales)
    job = first_job(trainer, name)
    trainer.start(job)
    pods = trainer.create_pods(job)
    injected = time.monotonic()
    if fault == "missing-executable":  # containerd: StartError (exit code 128) and runc's words; restartPolicy Never
        for pod in pods:
            trainer.start_error(pod)
        trainer.fail(job, "Master")
        words = f'pod {pods[0]} (container pytorch) StartError: exec: "torchrun": executable file not found in $PATH'
        cluster_reason = run_entry(benchmarks, name)["reason"]
        assert cluster_reason == (
            f"{words}; PyTorchJobFailed: PyTorchJob {job['metadata']['name']} is failed because 1 Master replica(s) "
            f"failed.")
        assert local.reason == f"cannot start on this machine: {words} (install PyTorch (pip install torch))"
        record(cluster_reason, injected)
        return
    if fault == "no-gpu":
        trainer.unschedulable(pods[0], NO_GPU)
        words = f"pod {pods[0]} Unschedulable: {NO_GPU}"
        cluster_reason = run_entry(benchmarks, name)["reason"]
        assert cluster_reason == diagnosis.startup_reason(words, STARTUP)
        assert local.reason.startswith(f"cannot start on this machine: {words} (")
        record(cluster_reason, injected)
        return
    master, worker = pods
    trainer.running(master)
    trainer.running(worker)
    printed = (tmp_path / "worker-0.log").read_text()  # what the local worker printed: its pod's log here
    code = 137 if fault == "worker-killed" else 1
    trainer.terminate(worker, code, log=printed, finished_at="2026-11-26T10:00:01Z")
    trainer.terminate(master, 1, log="RuntimeError: [gloo] Connection closed by peer\n",
                      finished_at="2026-11-26T10:00:03Z")
    trainer.fail(job, "Worker")
    cluster_reason = run_entry(benchmarks, name)["reason"]
    expected = {"worker-crashes": f"pod {worker} (container pytorch) exited with code 1: torch.OutOfMemoryError: "
                                  f"CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
                                  f"79.1 GiB of which 1.2 GiB is free.",
                "worker-killed": f"pod {worker} (container pytorch) killed by SIGKILL (exit code 137)"}[fault]
    assert local.phase == "Failed" and local.reason == expected
    assert cluster_reason == f"{expected}; PyTorchJobFailed: PyTorchJob {job['metadata']['name']} is failed " \
                             f"because 1 Worker replica(s) failed."
    record(cluster_reason, injected)


HOROVOD_RANK_FAILS = (  # what mpirun prints when rank 1 gives up on its all-reduce (trainer/parallel/horovod.py)
    "echo '[1,0]<stderr>:2026-11-26 10:00:00,000 rank0 INFO config {\"model\": {}}'; "
    "echo '[1,1]<stderr>:2026-11-26 10:00:09,000 rank1 ERROR horovod: the all-reduce of the gradients waited more "
    "than 4 s (--timeout-seconds) for the other ranks: a rank stopped making progress or is gone'; "
    "echo 'Primary job  terminated normally, but 1 process returned a non-zero exit code.'; "
    "echo 'mpirun detected that one or more processes exited with non-zero status, thus causing the job to be "
    "terminated.'; exit 1")


@pytest.mark.faults
def test_a_horovod_ranks_reason_comes_first_on_the_cluster_and_locally(benchmarks, trainer, tmp_path):
    """Before the fix: a Horovod run whose rank fails ends without the trainer's summary; its reason read
    "mpirun exited with code 1 without a GPT2BENCH_SUMMARY line: ...". Now the rank's own words come first, the
    same on both paths (the launcher's termination message, written by `gpt2bench launch`)."""
    name = "same-horovod-rank"
    document = benchmark(name, [{"name": "horovod"}])
    document["spec"]["sweep"]["scales"] = TWO_NODES
    bench = load_benchmark(document)
    run = plan_runs(bench)[0]
    job = render_job(bench, run)
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    launcher["command"] = [sys.executable, "-m", "gpt2bench", "launch", "--", "sh", "-c", HOROVOD_RANK_FAILS]
    launcher.pop("args", None)
    local = execute_job(job, tmp_path, gpus=[], grace_seconds=2)
    words = ("rank 1: horovod: the all-reduce of the gradients waited more than 4 s (--timeout-seconds) for the other "
             "ranks: a rank stopped making progress or is gone (sh exited with code 1 without a GPT2BENCH_SUMMARY line)")
    assert local.phase == "Failed"
    assert local.reason == f"pod {job['metadata']['name']}-launcher-0 (container {launcher['name']}) exited with code " \
                           f"1: {words}"
    entry = collect_run(run, job_succeeded=False, termination_message=local.termination_message,
                        job_reason=local.reason, cause=local.cause)  # as the local sweep records it (results.json)
    assert entry.reason == words

    create(benchmarks, name, ["horovod"])
    cluster_job = first_job(trainer, name)
    assert cluster_job["kind"] == "MPIJob" and cluster_job["metadata"]["name"] == job["metadata"]["name"]
    trainer.start(cluster_job)
    pods = trainer.create_pods(cluster_job)
    for pod in pods:
        trainer.running(pod)
    printed = (tmp_path / "launcher-0.log").read_text()
    trainer.terminate(pods[0], 1, log=printed, message=local.termination_message)
    trainer.fail(cluster_job, "Launcher")
    cluster_reason = run_entry(benchmarks, name)["reason"]
    assert cluster_reason == words
    FIGURES["same-words-horovod-rank-fails"] = {"injected": 2, "paths": ["cluster", "local"], "runs_lost": 0,
                                                "cluster_reason": cluster_reason, "local_reason": entry.reason}


def test_rbac_covers_every_call_made_here(cluster, benchmarks):
    """Every pod listed, previous log read and job deleted here is granted by the roles bound to the operator in
    manifests/operator.yaml."""
    from test_operator_manifests import allowed, cluster_role_rules

    made = operator_calls(cluster)
    assert {("kubeflow.org", "pytorchjobs", "delete"), ("", "pods", "list"), ("", "pods/log", "get")} <= made
    assert [call for call in sorted(made) if not allowed(cluster_role_rules(), *call)] == []


def test_without_pidfds_the_runner_polls_and_still_ranks_the_tie(tmp_path, monkeypatch):
    """A kernel before Linux 5.3 has no pidfd_open: the local runner polls instead, and a peer's failure still waits
    out the tie for its cause (the same pair as above)."""
    def no_pidfd(_pid: int) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    job = peer_failure_then_kill_job("nofd")
    outcome = execute_job(job, tmp_path, gpus=[], grace_seconds=2)
    assert outcome.reason == "pod nofd-ddp-fp32-2x1-worker-0 (container pytorch) killed by SIGKILL (exit code 137)"
    assert outcome.seconds is not None
