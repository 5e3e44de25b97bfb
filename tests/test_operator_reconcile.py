"""The operator's pure decisions, without a cluster: job phases, what starts next, the status patch."""

from __future__ import annotations

import json

import pytest

from gpt2bench.controller import kube
from gpt2bench.controller import reconcile as rc
from gpt2bench.plan import plan_runs
from gpt2bench.spec import Benchmark, validate_spec
from gpt2bench.status import BenchmarkStatus, RunStatus

NOW = "2026-11-22T00:00:00Z"


def _runs(strategies=("single", "ddp", "fsdp")):
    spec = validate_spec({"sweep": {"strategies": [{"name": s} for s in strategies],
                                    "scales": [{"nodes": 1, "processesPerNode": 2}]}})
    return plan_runs(Benchmark(name="b", spec=spec))


def _job(*conditions: tuple[str, str], message: str = "") -> dict:
    return {"status": {"conditions": [{"type": t, "status": s, "message": message} for t, s in conditions]}}


@pytest.mark.parametrize(
    ("conditions", "phase"),
    [
        ((), "Pending"),
        ((("Created", "True"),), "Pending"),
        ((("Created", "True"), ("Running", "True")), "Running"),
        ((("Created", "True"), ("Running", "True"), ("Restarting", "True")), "Running"),
        ((("Created", "True"), ("Running", "False"), ("Succeeded", "True")), "Succeeded"),
        ((("Created", "True"), ("Failed", "True"), ("Running", "True")), "Failed"),  # terminal wins
        ((("Created", "True"), ("Succeeded", "False")), "Pending"),
    ],
)
def test_job_state_follows_the_kubeflow_conditions(conditions, phase):
    assert rc.job_state(_job(*conditions)).phase == phase


def test_job_state_carries_the_failure_message():
    state = rc.job_state(_job(("Failed", "True"), message="pod master-0 OOMKilled"))
    assert state == rc.JobState("Failed", "pod master-0 OOMKilled", "")


def test_initial_status_lists_every_run_pending():
    runs = _runs()
    status = rc.initial_status(runs, 3, NOW)
    assert status.runs_total == 3 and status.observed_generation == 3 and status.phase == "Running"
    assert [r.phase for r in status.runs] == ["Pending"] * 3
    assert [r.job_name for r in status.runs] == [r.name for r in runs]


def test_sequential_by_default_and_parallel_up_to_concurrency():
    entries = rc.initial_status(_runs(), 1, NOW).runs
    assert rc.runs_to_start(entries, {}, 1) == [entries[0].name]
    assert rc.runs_to_start(entries, {}, 2) == [entries[0].name, entries[1].name]
    running = [rc.mark_running(entries[0], NOW)] + entries[1:]
    jobs = {entries[0].job_name: _job(("Running", "True"))}
    assert rc.runs_to_start(running, jobs, 1) == []
    assert rc.runs_to_start(running, jobs, 2) == [entries[1].name]


def test_a_job_left_by_a_previous_operator_counts_as_active_and_is_not_recreated():
    entries = rc.initial_status(_runs(), 1, NOW).runs
    jobs = {entries[0].job_name: _job(("Created", "True"))}  # created, status patch lost in a crash
    seen = rc.observe(entries, jobs)
    assert seen.started == [entries[0].name]
    assert rc.runs_to_start(entries, jobs, 1) == []


def test_observe_finished_and_vanished_jobs():
    entries = [rc.mark_running(e, NOW) for e in rc.initial_status(_runs(), 1, NOW).runs]
    jobs = {entries[0].job_name: _job(("Succeeded", "True")),
            entries[1].job_name: _job(("Failed", "True"))}
    seen = rc.observe(entries, jobs)
    assert [(f.name, f.job_succeeded) for f in seen.finished] == [(entries[0].name, True), (entries[1].name, False)]
    assert seen.unexplained == {entries[0].name, entries[1].name}
    assert seen.vanished == [entries[2].name]


def test_finish_entry_collects_the_summary_or_the_reason():
    run = _runs()[1]
    entry = rc.mark_running(rc.initial_status([run], 1, NOW).runs[0], NOW)
    ok = rc.finish_entry(run, entry, rc.Finished(run.name, True, ""),
                         json.dumps({"status": "ok", "tokensPerSecond": 1234.5, "worldSize": 2}), NOW)
    assert ok.phase == "Succeeded" and ok.results.tokens_per_second == 1234.5
    bad = rc.finish_entry(run, entry, rc.Finished(run.name, False, "OOMKilled (exit code 137)"), None, NOW)
    assert bad.phase == "Failed" and bad.reason == "OOMKilled (exit code 137)" and bad.results is None


@pytest.mark.parametrize(
    ("phases", "overall"),
    [
        (["Succeeded", "Succeeded"], "Succeeded"),
        (["Succeeded", "Failed"], "PartiallySucceeded"),
        (["Failed", "Failed"], "Failed"),
        (["Succeeded", "Running"], "Running"),
        (["Pending", "Pending"], "Running"),
    ],
)
def test_overall_phase(phases, overall):
    entries = rc.initial_status(_runs(("single", "ddp")), 1, NOW).runs
    assert rc.overall_phase([e.model_copy(update={"phase": p}) for e, p in zip(entries, phases)]) == overall


def test_summarize_picks_the_fastest_run_and_completes_once():
    common = {"nodes": 1, "devicesPerNode": 0, "processesPerNode": 2, "jobKind": "PyTorchJob"}
    runs = [RunStatus.model_validate({**common, **run}) for run in [
        {"name": "a", "jobName": "a", "strategy": "ddp", "precision": "fp32", "phase": "Succeeded",
         "results": {"tokensPerSecond": 10}},
        {"name": "b", "jobName": "b", "strategy": "fsdp", "precision": "bf16", "phase": "Succeeded",
         "results": {"tokensPerSecond": 30}},
        {"name": "c", "jobName": "c", "strategy": "ps", "precision": "fp32", "phase": "Failed", "reason": "x"},
    ]]
    patch = rc.summarize(BenchmarkStatus(conditions=[]), runs, NOW).dump()
    assert patch["best"] == {"run": "b", "strategy": "fsdp", "precision": "bf16", "tokensPerSecond": 30}
    assert (patch["phase"], patch["runsDone"], patch["runsSucceeded"], patch["runsFailed"]) == (
        "PartiallySucceeded", 3, 2, 1)
    assert patch["completionTime"] == NOW
    again = rc.summarize(BenchmarkStatus.read({**patch, "completionTime": "earlier"}), runs, "later").dump()
    assert "completionTime" not in again  # set once, never moved
    ready = [c for c in patch["conditions"] if c["type"] == "Ready"]
    assert ready[0]["status"] == "True" and ready[0]["reason"] == "PartiallySucceeded"


def test_summarize_adds_the_analysis_once_every_run_is_done():
    common = {"nodes": 1, "devicesPerNode": 1, "processesPerNode": 1, "jobKind": "PyTorchJob", "devices": 1}
    done = {"name": "a", "jobName": "a", "strategy": "ddp", "precision": "fp32", "phase": "Succeeded",
            "results": {"tokensPerSecond": 1000.0}}
    running = {"name": "b", "jobName": "b", "strategy": "fsdp", "precision": "fp32", "phase": "Running"}
    runs = [RunStatus.model_validate({**common, **run}) for run in (done, running)]
    spec = validate_spec({"sweep": {"strategies": [{"name": "ddp"}]}, "cost": {"gpuHour": 3.6}})
    assert "analysis" not in rc.summarize(BenchmarkStatus(), runs, NOW, spec).dump()  # no half-sweep verdicts
    runs[1] = runs[1].model_copy(update={"phase": "Failed", "reason": "x"})
    analysis = rc.summarize(BenchmarkStatus(), runs, NOW, spec).dump()["analysis"]
    assert analysis["recommended"]["run"] == "a" and analysis["recommended"]["excluded"] == ["b (Failed)"]
    cheapest = next(r for r in analysis["recommendations"] if r["objective"] == "cheapest" and "scale" not in r)
    assert cheapest["value"] == pytest.approx(1.0)  # 3.6 per GPU-hour at 1000 tokens/s: 1 per 1M tokens
    assert len(analysis["findings"]) == 6


def test_set_condition_keeps_the_transition_time_when_the_status_holds():
    first = rc.condition("Ready", "False", "Running", "0/2", "t1")
    same = rc.set_condition([first], rc.condition("Ready", "False", "Running", "1/2", "t2"))
    assert same == [first.model_copy(update={"message": "1/2"})]
    flipped = rc.set_condition(same, rc.condition("Ready", "True", "Succeeded", "2/2", "t3"))
    assert flipped[0].last_transition_time == "t3"


def test_invalid_status_names_every_field():
    status = rc.invalid_status([("spec.sweep.scales[0].nodes", "must be 1"), ("spec.training.seqLen", "too long")],
                               2, NOW)
    assert status.phase == "Invalid" and status.runs == []
    assert "spec.sweep.scales[0].nodes" in status.message and "spec.training.seqLen" in status.message


def test_termination_message_prefers_the_named_container_and_falls_back_to_last_state():
    pod = {"status": {"containerStatuses": [
        {"name": "sidecar", "state": {"terminated": {"message": "not me"}}},
        {"name": "pytorch", "state": {"running": {}}, "lastState": {"terminated": {"message": '{"a": 1}'}}},
    ]}}
    assert kube.termination_message(pod, container="pytorch") == '{"a": 1}'
    assert kube.termination_message(None) is None
    assert kube.termination_reason({"status": {"containerStatuses": [
        {"state": {"terminated": {"reason": "OOMKilled", "exitCode": 137}}}]}}) == "OOMKilled (exit code 137)"
