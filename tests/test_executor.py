"""The local executor: a rendered job's replicas become processes with the env the Kubeflow operators inject.

Hand-built job dicts whose container runs a small Python program, so every case runs real processes in
well under a second each, without torch.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from conftest import alive

from gpt2bench.local.executor import execute_job, job_replicas, unschedulable
from gpt2bench.local.replicas import JobSpecError, Replica, expand, share_machine

# Writes its env and argv to $(GPT2BENCH_OUTPUT_DIR)/seen.json.
DUMP_ENV = (
    "import json, os, sys; "
    "open(os.path.join(os.environ['GPT2BENCH_OUTPUT_DIR'], 'seen.json'), 'w')"
    ".write(json.dumps({'env': dict(os.environ), 'argv': sys.argv[1:]}))"
)


def container(command, args=(), env=None, name="pytorch", gpus=0):
    c = {
        "name": name,
        "image": "ignored:latest",
        "command": list(command),
        "args": list(args),
        "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
    }
    if gpus:
        c["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    return c


def pytorchjob(master, worker=None, workers=0, nproc="1", deadline=None):
    replicas = {"Master": {"replicas": 1, "restartPolicy": "Never", "template": {"spec": {"containers": [master]}}}}
    if workers:
        replicas["Worker"] = {
            "replicas": workers,
            "restartPolicy": "Never",
            "template": {"spec": {"containers": [worker or master]}},
        }
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "t-job"},
        "spec": {"nprocPerNode": nproc, "runPolicy": {"backoffLimit": 0}, "pytorchReplicaSpecs": replicas},
    }
    if deadline is not None:
        job["spec"]["runPolicy"]["activeDeadlineSeconds"] = deadline
    return job


def mpijob(launcher, workers=2, slots=2):
    worker = container(["/usr/sbin/sshd", "-De"], name="worker")
    return {
        "apiVersion": "kubeflow.org/v2beta1",
        "kind": "MPIJob",
        "metadata": {"name": "t-mpi"},
        "spec": {
            "slotsPerWorker": slots,
            "mpiImplementation": "OpenMPI",
            "runPolicy": {},
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": {"spec": {"containers": [launcher]}}},
                "Worker": {"replicas": workers, "template": {"spec": {"containers": [worker]}}},
            },
        },
    }


def seen(run_dir: Path, replica: str) -> dict:
    return json.loads((run_dir / replica / "seen.json").read_text())


def test_expand_follows_kubelet_rules():
    env = {"A": "1", "B": "two"}
    assert expand("$(A)-$(B)", env) == "1-two"
    assert expand("$$(A)", env) == "$(A)"  # escaped
    assert expand("$(MISSING)", env) == "$(MISSING)"  # unknown names stay as written
    assert expand("$A $(A", env) == "$A $(A"  # only $(NAME) is a reference
    assert expand("cost $$5", env) == "cost $5"


def test_pytorchjob_replicas_get_training_operator_env(tmp_path):
    master = container(
        [sys.executable, "-c", DUMP_ENV],
        args=["--output", "$(GPT2BENCH_OUTPUT_DIR)", "$(DERIVED)", "$$(MY_VAR)", "$(UNDEFINED)"],
        env={"MY_VAR": "hello", "DERIVED": "$(MY_VAR)-x", "GPT2BENCH_OUTPUT_DIR": "/var/run/in-cluster",
             "TORCHINDUCTOR_CACHE_DIR": "/home/gpt2bench/.cache/torchinductor"},
    )
    outcome = execute_job(pytorchjob(master, workers=2, nproc="2"), tmp_path, gpus=[])
    assert outcome.phase == "Succeeded", outcome.reason
    assert outcome.exit_codes == {"master-0": 0, "worker-0": 0, "worker-1": 0}

    views = {name: seen(tmp_path, name) for name in ("master-0", "worker-0", "worker-1")}
    ports = {v["env"]["MASTER_PORT"] for v in views.values()}
    assert len(ports) == 1 and ports.pop().isdigit()
    for rank, (name, view) in enumerate(views.items()):
        env = view["env"]
        assert env["RANK"] == env["PET_NODE_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == "6"  # 3 pods x nprocPerNode 2, as training-operator computes it
        assert env["PET_NNODES"] == "3"
        assert env["PET_NPROC_PER_NODE"] == "2"
        assert env["MASTER_ADDR"] == env["PET_MASTER_ADDR"] == "127.0.0.1"
        assert env["PET_MASTER_PORT"] == env["MASTER_PORT"]
        assert env["PYTHONUNBUFFERED"] == "0"
        assert env["DERIVED"] == "hello-x"  # env values expand earlier entries
        # the local runner replaces the pod's emptyDir path with a per-replica folder
        assert env["GPT2BENCH_OUTPUT_DIR"] == str(tmp_path / name)
        assert env["GPT2BENCH_TERMINATION_LOG"] == str(tmp_path / f"{name}.termination-log")
        # a path inside the image's home (the pods' compile cache) is not this machine's: the shell's stays
        assert env.get("TORCHINDUCTOR_CACHE_DIR") == os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        assert view["argv"] == ["--output", str(tmp_path / name), "hello-x", "$(MY_VAR)", "$(UNDEFINED)"]


def test_mpijob_runs_only_the_launcher_with_a_local_hostfile(tmp_path):
    script = DUMP_ENV + "; print(open(os.environ['OMPI_MCA_orte_default_hostfile']).read())"
    job = mpijob(container([sys.executable, "-c", script], name="launcher"), workers=2, slots=3)
    outcome = execute_job(job, tmp_path, gpus=[])
    assert outcome.phase == "Succeeded", outcome.reason
    assert list(outcome.exit_codes) == ["launcher-0"]
    assert not (tmp_path / "worker-0").exists()  # sshd workers are not started: mpirun runs the ranks here
    env = seen(tmp_path, "launcher-0")["env"]
    assert (tmp_path / "hostfile").read_text() == "localhost slots=6\n"
    assert env["OMPI_MCA_orte_default_hostfile"] == str(tmp_path / "hostfile")
    assert env["OMPI_MCA_orte_set_default_slots"] == "3"
    assert env["K_MPI_JOB_ROLE"] == "launcher"
    assert "localhost slots=6" in (tmp_path / "launcher-0.log").read_text()


def test_failing_replica_fails_the_job_and_stops_the_others(tmp_path):
    master = container([sys.executable, "-c", "import time; time.sleep(60)"])
    worker = container([sys.executable, "-c", "import sys; print('RuntimeError: boom'); sys.exit(3)"])
    t0 = time.monotonic()
    outcome = execute_job(pytorchjob(master, worker, workers=1), tmp_path, gpus=[], grace_seconds=2)
    assert time.monotonic() - t0 < 20
    assert outcome.phase == "Failed"
    assert outcome.reason == "pod t-job-worker-0 (container pytorch) exited with code 3: RuntimeError: boom"
    assert outcome.cause == outcome.reason
    assert outcome.exit_codes["master-0"] is not None  # stopped, not left running


def _grandchild_script(pid_file: Path) -> str:
    # A child in its own session (as mpirun's ranks are in their own process groups), then wait.
    return (
        "import subprocess, sys, time; "
        f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(120)"
    )


def test_deadline_kills_the_whole_process_tree(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    job = pytorchjob(container([sys.executable, "-c", _grandchild_script(pid_file)]), deadline=2)
    outcome = execute_job(job, tmp_path / "run", gpus=[], grace_seconds=2)
    assert outcome.phase == "Failed"
    assert "DeadlineExceeded" in outcome.reason and "activeDeadlineSeconds=2" in outcome.reason
    grandchild = int(pid_file.read_text())
    time.sleep(0.3)
    assert not alive(grandchild)


def test_interrupt_kills_replicas_and_propagates(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    job = pytorchjob(container([sys.executable, "-c", _grandchild_script(pid_file)]), workers=1)

    def interrupt(replica: Replica, elapsed: float) -> None:
        if pid_file.exists() and elapsed > 0.5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        execute_job(job, tmp_path / "run", gpus=[], on_tick=interrupt, grace_seconds=2)
    time.sleep(0.3)
    assert not alive(int(pid_file.read_text()))


def test_missing_tool_fails_with_a_clear_reason(tmp_path):
    job = pytorchjob(container(["gpt2bench-no-such-tool", "train"]))
    outcome = execute_job(job, tmp_path / "a", gpus=[])
    assert outcome.phase == "Failed"
    # containerd's words for a command missing from the image (tests/test_operator_pods.py: the same on a cluster)
    assert outcome.reason == ("cannot start on this machine: pod t-job-master-0 (container pytorch) StartError: "
                              'exec: "gpt2bench-no-such-tool": executable file not found in $PATH (install it or fix '
                              "the job's command)")
    # the program a wrapper runs after `--` (gpt2bench launch -- mpirun ...) is checked too
    job = mpijob(container(["gpt2bench", "launch", "--", "/opt/mpirun", "-np", "2"], name="launcher"))
    outcome = execute_job(job, tmp_path / "b", gpus=[])
    assert outcome.phase == "Failed" and outcome.reason.endswith(
        '(container launcher) StartError: exec: "/opt/mpirun": stat /opt/mpirun: no such file or directory (install '
        "Open MPI (Debian: apt-get install openmpi-bin libopenmpi-dev))")
    assert not (tmp_path / "b" / "launcher-0.log").exists()  # nothing was started


def test_termination_message_is_the_primary_replicas_file(tmp_path):
    script = (
        "import json, os, sys; "
        "open(os.environ['GPT2BENCH_TERMINATION_LOG'], 'w').write(json.dumps("
        "{'status': 'failed', 'reason': 'injected failure at step 2'})); sys.exit(1)"
    )
    outcome = execute_job(pytorchjob(container([sys.executable, "-c", script])), tmp_path, gpus=[])
    assert outcome.phase == "Failed"
    # the trainer's own reason, from its termination message, says what the replica failed of
    assert outcome.reason == "pod t-job-master-0 (container pytorch) exited with code 1: injected failure at step 2"
    assert json.loads(outcome.termination_message) == {"status": "failed", "reason": "injected failure at step 2"}


def test_termination_message_falls_back_to_the_log_tail_on_error(tmp_path):
    # FallbackToLogsOnError: an empty message file and a failed container -> the last lines of output
    script = "import sys; [print('line', i) for i in range(200)]; print('ValueError: bad'); sys.exit(2)"
    outcome = execute_job(pytorchjob(container([sys.executable, "-c", script])), tmp_path, gpus=[])
    assert outcome.phase == "Failed"
    assert outcome.reason == "pod t-job-master-0 (container pytorch) exited with code 2: ValueError: bad"
    lines = outcome.termination_message.splitlines()
    assert lines[-1] == "ValueError: bad" and len(lines) <= 80 and "line 0" not in lines
    # a succeeded container with no message file reports no message (as the kubelet does)
    outcome = execute_job(pytorchjob(container([sys.executable, "-c", "print('hi')"])), tmp_path / "ok", gpus=[])
    assert outcome.phase == "Succeeded" and outcome.termination_message == ""


def test_gpus_are_split_between_replicas_or_the_job_is_unschedulable(tmp_path):
    job = pytorchjob(container([sys.executable, "-c", "pass"], gpus=2), workers=1)
    replicas = job_replicas(job, tmp_path)
    assert unschedulable(replicas, ["0", "1", "2", "3"], "t-job") is None
    assert [r.env["CUDA_VISIBLE_DEVICES"] for r in replicas] == ["0,1", "2,3"]
    outcome = execute_job(job, tmp_path / "small", gpus=["0", "1", "2"])
    assert outcome.phase == "Failed"
    # the second pod finds one GPU left: unschedulable, in the scheduler's words for a one-node cluster
    assert outcome.reason == ("cannot start on this machine: pod t-job-worker-0 Unschedulable: 0/1 nodes are "
                              "available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are available: 1 "
                              "Preemption is not helpful for scheduling. (the job asks for 4 nvidia.com/gpu, this "
                              "machine offers 3)")


def test_unsupported_jobs_are_rejected(tmp_path):
    with pytest.raises(JobSpecError, match="TFJob"):
        job_replicas({"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "spec": {}}, tmp_path)
    no_command = pytorchjob({"name": "pytorch", "image": "x"})
    with pytest.raises(JobSpecError, match="no command"):
        job_replicas(no_command, tmp_path)


def test_pods_share_this_machines_cores_capped_by_their_rendered_budget(tmp_path, monkeypatch):
    """Three pods of a PyTorchJob on 6 cores: 2 each, or their rendered 1.5 if that is less; an MPI launcher
    stands for its worker pods together, since mpirun starts their ranks here."""
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: set(range(6)))
    monkeypatch.setattr("gpt2bench.trainer.cores.cgroup_cpu_quota", lambda: None)

    def replicas(rendered: str | None, count: int) -> list[Replica]:
        env = {} if rendered is None else {"GPT2BENCH_POD_CPUS": rendered}
        return [Replica("Worker", i, ["true"], dict(env), tmp_path, tmp_path / "t", tmp_path / "l") for i in range(count)]

    assert [r.env["GPT2BENCH_POD_CPUS"] for r in share_machine(replicas(None, 3))] == ["2"] * 3
    assert [r.env["GPT2BENCH_POD_CPUS"] for r in share_machine(replicas("1.5", 3))] == ["1.5"] * 3
    assert share_machine(replicas("2", 1), pods_each=2)[0].env["GPT2BENCH_POD_CPUS"] == "4"  # 2 workers' budget
    assert share_machine(replicas("8", 1), pods_each=2)[0].env["GPT2BENCH_POD_CPUS"] == "6"  # the machine's
    with pytest.raises(JobSpecError, match="GPT2BENCH_POD_CPUS='lots' is not a number of cores"):
        share_machine(replicas("lots", 1))
    # in a container limited to 1.5 CPUs (rounded up to 2 whole cores) the 6 cores it can see are not its own
    monkeypatch.setattr("gpt2bench.trainer.cores.cgroup_cpu_quota", lambda: 1.5)
    assert [r.env["GPT2BENCH_POD_CPUS"] for r in share_machine(replicas(None, 3))] == ["0.666667"] * 3


def test_the_job_ends_when_its_last_process_exits_not_at_the_next_poll(tmp_path):
    """The executor waits on each process's pidfd: a job whose process exits at once is over at once, however long
    the interval between its progress ticks; the job's time is measured (docs/local.md, Start-up per run)."""
    job = pytorchjob(container([sys.executable, "-c", "pass"]))
    started = time.monotonic()
    outcome = execute_job(job, tmp_path / "run", poll_seconds=60)
    took = time.monotonic() - started
    assert outcome.phase == "Succeeded" and took < 20
    assert 0 < outcome.seconds <= took
