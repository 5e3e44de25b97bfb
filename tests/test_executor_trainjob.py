"""The local executor runs TrainJobs: the runtime's pods as processes with the env Trainer v2's plugins inject.

TrainJobs on the project's runtimes whose trainer command is a small Python program (no torch), so every
case runs real processes in about a second.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from test_executor import DUMP_ENV, seen

from gpt2bench.local.executor import JobSpecError, execute_job, job_replicas
from gpt2bench.plan import plan_runs
from gpt2bench.render import render_job
from gpt2bench.render.runtimes import project_runtimes
from gpt2bench.specification.validation import load_benchmark


def trainjob(strategy: str, nodes: int, procs: int, command: list[str], **spec) -> dict:
    bench = load_benchmark({"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark", "metadata": {"name": "t"},
                            "spec": {"sweep": {"strategies": [{"name": strategy}],
                                               "scales": [{"nodes": nodes, "processesPerNode": procs}]},
                                     "backend": "trainjob", **spec}})  # fmt: skip
    (run,) = plan_runs(bench)
    job = render_job(bench, run)
    job["spec"]["trainer"]["command"] = command
    return job


def test_torch_trainjob_runs_a_process_per_node_with_the_torch_plugins_env(tmp_path):
    job = trainjob("ddp", 3, 2, [sys.executable, "-c", DUMP_ENV, "--output", "$(GPT2BENCH_OUTPUT_DIR)"])
    job["spec"]["trainer"]["env"].append({"name": "DERIVED", "value": "$(PYTHONUNBUFFERED)-x"})
    outcome = execute_job(job, tmp_path, gpus=[])
    assert outcome.phase == "Succeeded", outcome.reason
    assert list(outcome.exit_codes) == ["node-0", "node-1", "node-2"]
    views = [seen(tmp_path, f"node-{rank}") for rank in range(3)]
    ports = {view["env"]["PET_MASTER_PORT"] for view in views}
    assert len(ports) == 1 and ports.pop().isdigit()
    for rank, view in enumerate(views):
        env = view["env"]
        assert env["PET_NNODES"] == "3" and env["PET_NPROC_PER_NODE"] == "2"
        assert env["PET_NODE_RANK"] == env["JOB_COMPLETION_INDEX"] == str(rank)
        assert env["PET_MASTER_ADDR"] == "127.0.0.1"  # in a cluster: <trainjob>-node-0-0.<trainjob>
        assert "MASTER_ADDR" not in env and "WORLD_SIZE" not in env  # training-operator's, not Trainer v2's
        assert env["DERIVED"] == "1-x"  # trainer.env expands like the kubelet does
        assert env["GPT2BENCH_OUTPUT_DIR"] == str(tmp_path / f"node-{rank}")
        assert view["argv"] == ["--output", str(tmp_path / f"node-{rank}")]
    assert outcome.primary.name == "node-0"


def test_mpi_trainjob_runs_the_launcher_with_the_mpi_plugins_hostfile(tmp_path):
    script = DUMP_ENV + "; print(open(os.environ['OMPI_MCA_orte_default_hostfile']).read())"
    job = trainjob("horovod", 3, 2, [sys.executable, "-c", script])
    outcome = execute_job(job, tmp_path, gpus=[])
    assert outcome.phase == "Succeeded", outcome.reason
    assert list(outcome.exit_codes) == ["launcher-0"]  # mpirun starts the ranks here: no sshd
    env = seen(tmp_path, "launcher-0")["env"]
    # runLauncherAsNode: max(3 - 1, 1) sshd hosts plus the launcher, 2 slots each
    assert (tmp_path / "hostfile").read_text() == "localhost slots=6\n"
    assert env["OMPI_MCA_orte_default_hostfile"] == str(tmp_path / "hostfile")
    assert env["OMPI_MCA_orte_set_default_slots"] == "2"
    assert env["OMPI_MCA_orte_keep_fqdn_hostnames"] == "true"
    assert env["OMPI_MCA_plm_rsh_args"] == "-o ConnectionAttempts=10"
    assert not [name for name in env if name.startswith("PET_")]


def test_trainjob_gpus_and_deadline(tmp_path):
    job = trainjob("ddp", 2, 2, [sys.executable, "-c", "pass"], sweep={
        "strategies": [{"name": "ddp"}], "scales": [{"nodes": 2, "devicesPerNode": 2}]})
    replicas = job_replicas(job, tmp_path)
    assert [r.gpus for r in replicas] == [2, 2]  # resourcesPerNode on every node pod
    outcome = execute_job(job, tmp_path / "small", gpus=["0", "1", "2"])
    assert outcome.phase == "Failed" and "Unschedulable: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu." in outcome.reason
    mpi = trainjob("horovod", 2, 2, [sys.executable, "-c", "pass"], sweep={
        "strategies": [{"name": "horovod"}], "scales": [{"nodes": 2, "devicesPerNode": 2}]})
    (launcher,) = job_replicas(mpi, tmp_path / "mpi")
    assert launcher.gpus == 4  # the ranks of both hosts run under this mpirun
    slow = trainjob("single", 1, 1, [sys.executable, "-c", "import time; time.sleep(60)"],
                    runPolicy={"activeDeadlineSeconds": 1})
    outcome = execute_job(slow, tmp_path / "slow", gpus=[], grace_seconds=2)
    assert outcome.phase == "Failed" and "activeDeadlineSeconds=1" in outcome.reason


def test_termination_message_comes_from_the_result_pod(tmp_path):
    script = ("import json, os, sys; open(os.environ['GPT2BENCH_TERMINATION_LOG'], 'w').write(json.dumps("
              "{'status': 'failed', 'reason': 'rank %s' % os.environ['PET_NODE_RANK']})); sys.exit(1)")
    outcome = execute_job(trainjob("ddp", 2, 1, [sys.executable, "-c", script]), tmp_path, gpus=[])
    assert outcome.phase == "Failed"
    assert json.loads(outcome.termination_message) == {"status": "failed", "reason": "rank 0"}


def test_unknown_runtimes_are_refused(tmp_path: Path):
    job = trainjob("ddp", 1, 1, [sys.executable, "-c", "pass"])
    job["spec"]["runtimeRef"]["name"] = "torch-distributed"
    with pytest.raises(JobSpecError, match="torch-distributed.*not known here"):
        job_replicas(job, tmp_path)
    runtimes = project_runtimes()
    runtimes["torch-distributed"] = runtimes.pop("gpt2bench-torch")  # a runtime given by the caller
    assert len(job_replicas(job, tmp_path, runtimes)) == 1
