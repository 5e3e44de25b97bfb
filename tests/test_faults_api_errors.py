"""The API server failing a sweep's steps for a while, and a results folder `--resume` cannot read.

The operator rows run the real `gpt2bench operator` process against the API emulator (tests/kube/faults.py
`FailCalls`: the operator's own client's list of PyTorchJobs answered 500 for ~15 s, as an API server whose etcd is
failing answers). Before: one Warning Event ("Logging", kopf's posting of the poll's log line) per poll, the status
stale and silent about it. Now: the first error of a streak is one Warning Event, the condition `ApiFailing`
(True, `RequestsFailing`, since when, the API server's words) says it while it lasts, and `ApiAnswering` once the
steps work again.
"""

from __future__ import annotations

import json

import pytest
from fault_figures import FIGURES
from kube import EmulatedCluster
from kube.faults import OWN_CLIENT, FailCalls
from kube.fixtures import Benchmarks, api_client, benchmark, install_crds, wait_for
from kube.training import TrainingOperator
from test_local_lifecycle import earlier_sweep
from test_operator_process import OperatorProcess

JOBS = r"/pytorchjobs$"


def condition(status: dict, type_: str) -> dict:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), {})


@pytest.mark.slow
@pytest.mark.faults
@pytest.mark.timeout(180)
def test_steps_the_api_server_keeps_failing_are_said_once_and_as_a_condition_with_since_when(tmp_path):
    with EmulatedCluster(tmp_path / "kube") as cluster:
        install_crds(cluster)
        client = api_client(cluster)
        benchmarks, trainer = Benchmarks(client), TrainingOperator(client, cluster=cluster)
        operator = OperatorProcess(cluster, poll_seconds=1)
        operator.start()
        try:
            name = "api-failing"
            benchmarks.create(benchmark(name, [{"name": "single"}, {"name": "ddp"}]))
            job = wait_for(lambda: trainer.jobs(name), 30, what="the first job")[0]
            with FailCalls(500, times=10**6, method="GET", path=JOBS, agents=OWN_CLIENT).install(cluster) as fault:
                wait_for(lambda: fault.hits >= 2, 15, what="the steps failing")
                failing = wait_for(lambda: condition(benchmarks.status(name), "ApiFailing").get("status") == "True"
                                   and condition(benchmarks.status(name), "ApiFailing"), 30, what="ApiFailing=True")
                hits = fault.hits
            assert failing["reason"] == "RequestsFailing", failing
            assert failing["message"].startswith("since 20") and "500" in failing["message"], failing
            assert hits >= 10, "a poll a second for 10 s"
            polls = [e for e in benchmarks.events(name) if "poll failed" in e.get("message", "")]
            assert len(polls) == 1, [e["message"] for e in polls]  # one Event for the streak, not one per poll
            answering = wait_for(lambda: condition(benchmarks.status(name), "ApiFailing").get("status") == "False"
                                 and condition(benchmarks.status(name), "ApiFailing"), 15, what="ApiFailing=False")
            assert answering["reason"] == "ApiAnswering"
            FIGURES["api-steps-failing"] = {"failed_calls": hits, "poll_warning_events": len(polls),
                                            "runs_lost": 0}
            trainer.start(job)
            trainer.succeed(job, 100.0)
            wait_for(lambda: len(trainer.jobs(name)) == 2, 15, what="the sweep going on")
        finally:
            assert operator.stop() == 0


def test_resume_of_a_results_file_of_another_shape_names_the_field_not_pydantics_dump(tmp_path, capsys):
    from gpt2bench.local.cli import main

    directory = earlier_sweep(tmp_path, ["Succeeded", "Running", "Pending"])
    doc = json.loads((directory / "results.json").read_text())
    doc["runs"][0]["phase"] = "Finished"
    (directory / "results.json").write_text(json.dumps(doc))
    spec = tmp_path / "sweep.yaml"
    import yaml

    spec.write_text(yaml.safe_dump({"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark",
                                    "metadata": {"name": doc["benchmark"]}, "spec": doc["spec"]}))
    assert main([str(spec), "--output", str(directory), "--resume"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "is not a results document: runs.0" in err and "phase" in err, err
    assert "--overwrite starts again" in err
    assert "validation error" not in err and "errors.pydantic.dev" not in err, err


def test_the_api_condition_says_a_failure_once_it_lasts_and_only_of_the_kinds_a_sweep_uses():
    from gpt2bench.controller.poll import LASTING_SECONDS, Streak, api_condition
    from gpt2bench.controller.watchguard import Failure

    mpi = Failure("MPIJob", "2026-11-29T01:00:00Z", 100.0, 3, "504 Timeout: Too large resource version", 2.0)
    assert api_condition(None, [mpi], 30, 100.0 + LASTING_SECONDS - 1, ["PyTorchJob"]) is None, "a blip"
    assert api_condition(None, [mpi], 30, 200.0, ["PyTorchJob"]) is None, "not a kind this sweep uses"
    status, reason, message = api_condition(None, [mpi], 30, 200.0, ["MPIJob"])
    assert (status, reason) == ("True", "WatchFailing")
    assert message.startswith("since 2026-11-29T01:00:00Z the API server fails the operator's watch of MPIJob "
                              "(last: 504 Timeout: Too large resource version)")
    steps = Streak("2026-11-29T01:02:00Z", 150.0, "500 Internal Server Error: etcdserver: leader changed")
    assert api_condition(steps, [mpi], 30, 170.0, ["MPIJob"])[1] == "RequestsFailing", "a sweep's own steps first"
