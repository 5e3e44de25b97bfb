"""`gpt2bench run` of a GPT2Benchmark with `backend: trainjob`: the TrainJobs the operator would create,
run here with real processes (torchrun over two "node" processes, mpirun for horovod).

Budget (2 shared cores): three runs of the tiny model for 3 steps, about a minute.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import free_port, narrowed, runner_environment

from gpt2bench.report.steps import read_steps

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "manifests" / "examples" / "cpu-sweep.yaml"


def run_locally(tmp_path: Path, document: dict, fork_server) -> tuple[subprocess.CompletedProcess, Path]:
    """`gpt2bench run FILE --steps 3` on `document`, as a user runs it (its own TMPDIR, one thread per rank);
    asserts it exited 0 and returns it with its results folder."""
    path = tmp_path / f"{document['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**runner_environment(fork_server), "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1"}
    out = tmp_path / "results"
    done = subprocess.run([sys.executable, "-m", "gpt2bench", "run", str(path), "--steps", "3", "--output", str(out)],
                          env=env, capture_output=True, text=True, timeout=600, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return done, out


@pytest.mark.slow
def test_a_trainjob_sweep_runs_locally_with_torchrun_nodes_and_mpirun(tmp_path, horovod_import_error, fork_server):
    document = narrowed(yaml.safe_load(EXAMPLE.read_text()))
    document["metadata"]["name"] = "tj-sweep"
    document["spec"]["backend"] = "trainjob"
    document["spec"]["metrics"] = {"port": free_port()}
    document["spec"]["sweep"]["strategies"] = [{"name": "single"}, {"name": "ddp"}, {"name": "horovod"}]
    document["spec"]["sweep"]["precisions"] = ["fp32"]
    document["spec"]["sweep"]["repeats"] = 1  # the launchers are under test here, not the noise
    for key in ("maxRepeats", "minEffect", "budget"):  # one round, none added until decided
        document["spec"]["sweep"].pop(key, None)
    document["spec"]["sweep"]["scales"] = [{"nodes": 2, "processesPerNode": 1}]  # ddp: 2 torchrun "nodes"
    document["spec"]["training"] |= {"seqLen": 32, "microBatchSize": 2}  # the launchers are under test
    document["spec"]["data"]["maxDocuments"] = 12
    done, out = run_locally(tmp_path, document, fork_server)

    doc = json.loads((out / "results.json").read_text())
    assert [r["name"] for r in doc["runs"]] == ["tj-sweep-single-fp32-1x1", "tj-sweep-ddp-fp32-2x1",
                                               "tj-sweep-horovod-fp32-2x1"]
    assert {r["jobKind"] for r in doc["runs"]} == {"TrainJob"}
    single, ddp, horovod = doc["runs"]
    for run in (single, ddp):
        assert run["phase"] == "Succeeded", run
        steps = read_steps(out / run["stepsFile"])
        assert [s["step"] for s in steps] == [1, 2, 3]
    assert ddp["results"]["worldSize"] == 2 and ddp["stepsFile"].endswith("node-0/steps.jsonl")
    # the second "node" joined through the PET_* rendezvous as node rank 1
    job = yaml.safe_load((out / ddp["runDir"] / "job.yaml").read_text())
    assert job["kind"] == "TrainJob" and job["spec"]["trainer"]["numNodes"] == 2
    assert (out / ddp["runDir"] / "node-1.log").exists()
    # every process was forked: a node's JOB_COMPLETION_INDEX once sent them all to a fresh start (9 s each here)
    log = (out / "forkserver.log").read_text()
    assert "refused" not in log and "forked" in log, log
    if horovod_import_error is None:
        assert horovod["phase"] == "Succeeded", horovod
        assert horovod["results"]["worldSize"] == 2
        assert (out / horovod["runDir"] / "hostfile").read_text() == "localhost slots=2\n"
    else:
        assert horovod["phase"] == "Failed"
        assert re.search(r"horovod", horovod["reason"], re.IGNORECASE), horovod["reason"]
