"""The operator's pure decisions, without a cluster: job phases, what starts next, the status patch."""

from __future__ import annotations

import json

import pytest

from gpt2bench import jobkinds as kinds
from gpt2bench.controller import decide, pods, sweepstatus
from gpt2bench.controller.followedkinds import JOB_KINDS, missing_kind_reason
from gpt2bench.plan import plan_runs
from gpt2bench.specification.model import Benchmark
from gpt2bench.specification.validation import validate_spec
from gpt2bench.status import BenchmarkStatus, RunStatus, overall_phase

NOW = "2026-11-22T00:00:00Z"


def _runs(strategies=("single", "ddp", "fsdp")):
    spec = validate_spec({"sweep": {"strategies": [{"name": s} for s in strategies],
                                    "scales": [{"nodes": 1, "processesPerNode": 2}]}})
    return plan_runs(Benchmark(name="b", spec=spec))


PYTORCHJOB, MPIJOB = JOB_KINDS["PyTorchJob"], JOB_KINDS["MPIJob"]


def _job(*conditions: tuple[str, str], message: str = "", kind: str = "PyTorchJob") -> dict:
    return {"kind": kind, "metadata": {"name": "j", "namespace": "ns"},
            "status": {"conditions": [{"type": t, "status": s, "message": message} for t, s in conditions]}}


@pytest.mark.parametrize("kind", [PYTORCHJOB, MPIJOB])
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
        # suspended (Kueue): mpi-operator adds Running=False; the training operator keeps Running as it was
        ((("Created", "True"), ("Suspended", "True"), ("Running", "False")), "Queued"),
        ((("Created", "True"), ("Running", "True"), ("Suspended", "True")), "Queued"),
        ((("Created", "True"), ("Suspended", "False"), ("Running", "True")), "Running"),  # resumed
        ((("Suspended", "True"), ("Succeeded", "True")), "Succeeded"),
    ],
)
def test_job_state_follows_the_kubeflow_conditions(kind, conditions, phase):
    assert decide.job_state(_job(*conditions, kind=kind.kind)).phase == phase


def test_a_job_kueue_suspended_at_creation_is_queued_before_any_condition():
    job = {"kind": "PyTorchJob", "spec": {"runPolicy": {"suspend": True}}}
    assert decide.job_state(job).phase == "Queued"
    assert decide.job_state({"kind": "PyTorchJob", "spec": {"runPolicy": {"suspend": False}}}).phase == "Pending"
    assert decide.job_state({"kind": "TrainJob", "spec": {"suspend": True}}).phase == "Queued"  # Trainer v2's flag


def test_job_state_carries_the_failure_message():
    state = decide.job_state(_job(("Failed", "True"), message="pod master-0 OOMKilled"))
    assert state == decide.JobState("Failed", "pod master-0 OOMKilled", "")


def test_the_operators_job_kinds_are_the_shared_tables():
    assert (PYTORCHJOB.resource, MPIJOB.resource) == (("kubeflow.org", "v1", "pytorchjobs"),
                                                      ("kubeflow.org", "v2beta1", "mpijobs"))
    assert all(followed.base is kinds.JOB_KINDS[name] for name, followed in JOB_KINDS.items())
    assert set(JOB_KINDS) == set(kinds.JOB_KINDS), "every kind a run can be rendered as is created and watched"
    assert kinds.result_pod_selector(_job(kind="MPIJob")) == \
        "training.kubeflow.org/job-name=j,training.kubeflow.org/job-role=launcher"


def test_a_missing_kind_names_its_crd_what_to_install_and_what_serves_the_other_version():
    reason = missing_kind_reason(MPIJOB, [])
    assert "mpijobs.kubeflow.org" in reason and "v2beta1" in reason and "mpi-operator" in reason
    assert "kubectl apply --server-side -f https://raw.githubusercontent.com/kubeflow/mpi-operator/" in reason
    legacy = missing_kind_reason(MPIJOB, ["v1"])
    assert "serves mpijobs.kubeflow.org at v1 only" in legacy and "--enable-scheme=pytorchjob" in legacy
    assert "training-operator" in missing_kind_reason(PYTORCHJOB, [])


def test_only_jobs_this_benchmark_controls_are_its_own():
    ours = {"metadata": {"ownerReferences": [{"kind": "GPT2Benchmark", "name": "b", "uid": "u1", "controller": True}]}}
    orphan = {"metadata": {}}  # left by a benchmark deleted with --cascade=orphan
    old = {"metadata": {"ownerReferences": [{"kind": "GPT2Benchmark", "name": "b", "uid": "u0", "controller": True}]}}
    assert decide.owned_jobs({"a": ours, "b": orphan, "c": old}, "u1") == {"a": ours}
    assert decide.owner_description(old) == "GPT2Benchmark b (uid u0)" and decide.owner_description(orphan) == "no owner"
    reason = decide.foreign_reason("b-ddp", "PyTorchJob", "ns", "no owner", "u1")
    assert "already exists in ns" in reason and "no owner" in reason and "Delete that job" in reason


def test_initial_status_lists_every_run_pending():
    runs = _runs()
    status = sweepstatus.initial_status(runs, 3, NOW)
    assert status.runs_total == 3 and status.observed_generation == 3 and status.phase == "Running"
    assert [r.phase for r in status.runs] == ["Pending"] * 3
    assert [r.job_name for r in status.runs] == [r.name for r in runs]


def test_sequential_by_default_and_parallel_up_to_concurrency():
    entries = sweepstatus.initial_status(_runs(), 1, NOW).runs
    assert decide.runs_to_start(entries, {}, 1) == [entries[0].name]
    assert decide.runs_to_start(entries, {}, 2) == [entries[0].name, entries[1].name]
    running = [decide.mark_running(entries[0], NOW)] + entries[1:]
    jobs = {entries[0].job_name: _job(("Running", "True"))}
    assert decide.runs_to_start(running, jobs, 1) == []
    assert decide.runs_to_start(running, jobs, 2) == [entries[1].name]


def test_a_job_left_by_a_previous_operator_counts_as_active_and_is_not_recreated():
    entries = sweepstatus.initial_status(_runs(), 1, NOW).runs
    jobs = {entries[0].job_name: _job(("Created", "True"))}  # created, status patch lost in a crash
    seen = decide.observe(entries, jobs)
    assert seen.started == [entries[0].name]
    assert decide.runs_to_start(entries, jobs, 1) == []


def test_observe_finished_and_vanished_jobs():
    entries = [decide.mark_running(e, NOW) for e in sweepstatus.initial_status(_runs(), 1, NOW).runs]
    jobs = {entries[0].job_name: _job(("Succeeded", "True")),
            entries[1].job_name: _job(("Failed", "True"), message="1 Master replica(s) failed")}
    seen = decide.observe(entries, jobs)
    assert [(f.name, f.job_succeeded, f.job_message) for f in seen.finished] == [
        (entries[0].name, True, ""), (entries[1].name, False, "1 Master replica(s) failed")]
    assert seen.vanished == [entries[2].name]


def test_a_suspended_job_queues_its_run_which_holds_its_slot_and_runs_when_admitted():
    entries = sweepstatus.initial_status(_runs(), 1, NOW).runs
    first = entries[0].job_name
    suspended = {first: {**_job(("Created", "True"), ("Suspended", "True")), "spec": {"runPolicy": {"suspend": True}}}}
    seen = decide.observe(entries, suspended)
    assert seen.queued == [entries[0].name] and seen.started == []
    queued = [decide.mark_queued(entries[0], NOW)] + entries[1:]
    assert decide.runs_to_start(queued, suspended, 1) == [], "a queued run keeps its place"
    admitted = {first: _job(("Created", "True"), ("Suspended", "False"), ("Running", "True"))}
    assert decide.observe(queued, admitted).started == [entries[0].name]
    summary = sweepstatus.summarize(BenchmarkStatus(observed_generation=4), queued, NOW)
    assert summary.phase == "Running" and "queued" in summary.message
    condition = next(c for c in summary.conditions if c.type == "Queued")
    assert (condition.status, condition.reason, condition.observed_generation) == ("True", "JobSuspended", 4)
    assert entries[0].name in condition.message


def test_runs_of_a_refused_job_fail_with_the_reason_and_status_keeps_reasons_short():
    run = _runs()[0]
    entry = sweepstatus.initial_status([run], 1, NOW).runs[0]
    reason = decide.refused_reason(run.name, "PyTorchJob", 422, "Invalid", "spec.x: Invalid value " + "y" * 2000)
    failed = decide.failed_entry(run, entry, reason, NOW)
    assert failed.phase == "Failed" and failed.reason.startswith(f"the API server refused PyTorchJob {run.name}: 422")
    assert len(failed.reason) == decide.STATUS_REASON_LIMIT and failed.reason.endswith("...")


def test_a_vanished_job_names_the_ttl_when_one_is_set():
    run = _runs()[0]
    entry = decide.mark_running(sweepstatus.initial_status([run], 1, NOW).runs[0], NOW)
    assert "ttlSecondsAfterFinished is 60 s" in decide.vanished_entry(run, entry, NOW, ttl_seconds=60).reason
    assert "ttl" not in decide.vanished_entry(run, entry, NOW).reason


def test_finish_entry_collects_the_summary_or_the_reason():
    run = _runs()[1]
    entry = decide.mark_running(sweepstatus.initial_status([run], 1, NOW).runs[0], NOW)
    ok = decide.finish_entry(run, entry, decide.Finished(run.name, True, ""),
                         json.dumps({"status": "ok", "tokensPerSecond": 1234.5, "worldSize": 2}), NOW)
    assert ok.phase == "Succeeded" and ok.results.tokens_per_second == 1234.5
    bad = decide.finish_entry(run, entry, decide.Finished(run.name, False, "OOMKilled (exit code 137)"), None, NOW)
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
    entries = sweepstatus.initial_status(_runs(("single", "ddp")), 1, NOW).runs
    assert overall_phase([e.model_copy(update={"phase": p}) for e, p in zip(entries, phases)]) == overall


def test_summarize_picks_the_fastest_run_and_completes_once():
    common = {"nodes": 1, "devicesPerNode": 0, "processesPerNode": 2, "jobKind": "PyTorchJob"}
    runs = [RunStatus.model_validate({**common, **run}) for run in [
        {"name": "a", "jobName": "a", "strategy": "ddp", "precision": "fp32", "phase": "Succeeded",
         "results": {"tokensPerSecond": 10}},
        {"name": "b", "jobName": "b", "strategy": "fsdp", "precision": "bf16", "phase": "Succeeded",
         "results": {"tokensPerSecond": 30}},
        {"name": "c", "jobName": "c", "strategy": "ps", "precision": "fp32", "phase": "Failed", "reason": "x"},
    ]]
    patch = sweepstatus.summarize(BenchmarkStatus(conditions=[]), runs, NOW).dump()
    assert patch["best"] == {"run": "b", "strategy": "fsdp", "precision": "bf16", "tokensPerSecond": 30}
    assert (patch["phase"], patch["runsDone"], patch["runsSucceeded"], patch["runsFailed"]) == (
        "PartiallySucceeded", 3, 2, 1)
    assert patch["completionTime"] == NOW
    again = sweepstatus.summarize(BenchmarkStatus.read({**patch, "completionTime": "earlier"}), runs, "later").dump()
    assert "completionTime" not in again  # set once, never moved
    by_type = {c["type"]: c for c in patch["conditions"]}
    assert (by_type["Ready"]["status"], by_type["Ready"]["reason"]) == ("True", "PartiallySucceeded")
    assert (by_type["Complete"]["status"], by_type["Failed"]["status"], by_type["Queued"]["status"]) == (
        "True", "False", "False")


@pytest.mark.parametrize(("phases", "ready", "complete", "failed", "finished", "reason"), [
    (["Succeeded", "Succeeded"], "True", "True", "False", "True", "Succeeded"),
    (["Succeeded", "Failed"], "True", "True", "False", "True", "PartiallySucceeded"),
    (["Failed", "Failed"], "False", "False", "True", "True", "NoRunSucceeded"),
    (["Succeeded", "Running"], "False", "False", "False", "False", "Running"),
])
def test_conditions_are_those_of_a_batch_job_each_with_the_generation(phases, ready, complete, failed, finished,
                                                                      reason):
    """Finished ends either way (what `kubectl wait` is told to wait for): Complete alone never comes when no
    run succeeded."""
    entries = sweepstatus.initial_status(_runs(("single", "ddp")), 3, NOW).runs
    runs = [e.model_copy(update={"phase": p}) for e, p in zip(entries, phases)]
    status = sweepstatus.summarize(BenchmarkStatus(observed_generation=3), runs, NOW)
    conditions = {c.type: c for c in status.conditions}
    assert [conditions[t].status for t in ("Ready", "Complete", "Failed", "Finished")] == [
        ready, complete, failed, finished]
    assert reason in (conditions["Ready"].reason, conditions["Failed"].reason)
    assert conditions["Finished"].reason == status.phase
    assert {c.observed_generation for c in conditions.values()} == {3}


def test_an_invalid_spec_is_failed_and_finished_not_ready_not_complete():
    conditions = {c.type: c for c in sweepstatus.invalid_status([("spec.x", "bad")], 2, NOW).conditions}
    assert (conditions["Failed"].status, conditions["Failed"].reason) == ("True", "InvalidSpec")
    assert (conditions["Finished"].status, conditions["Finished"].reason) == ("True", "Invalid")
    assert conditions["Ready"].status == conditions["Complete"].status == "False"
    assert conditions["Failed"].observed_generation == 2


def test_summarize_adds_the_analysis_once_every_run_is_done():
    common = {"nodes": 1, "devicesPerNode": 1, "processesPerNode": 1, "jobKind": "PyTorchJob", "devices": 1}
    done = {"name": "a", "jobName": "a", "strategy": "ddp", "precision": "fp32", "phase": "Succeeded",
            "results": {"tokensPerSecond": 1000.0}}
    running = {"name": "b", "jobName": "b", "strategy": "fsdp", "precision": "fp32", "phase": "Running"}
    runs = [RunStatus.model_validate({**common, **run}) for run in (done, running)]
    spec = validate_spec({"sweep": {"strategies": [{"name": "ddp"}]}, "cost": {"gpuHour": 3.6}})
    assert "analysis" not in sweepstatus.summarize(BenchmarkStatus(), runs, NOW, spec).dump()  # no half-sweep verdicts
    runs[1] = runs[1].model_copy(update={"phase": "Failed", "reason": "x"})
    analysis = sweepstatus.summarize(BenchmarkStatus(), runs, NOW, spec).dump()["analysis"]
    assert analysis["recommended"]["run"] == "a" and analysis["recommended"]["excluded"] == ["b (Failed)"]
    cheapest = next(r for r in analysis["recommendations"] if r["objective"] == "cheapest" and "scale" not in r)
    assert cheapest["value"] == pytest.approx(1.0)  # 3.6 per GPU-hour at 1000 tokens/s: 1 per 1M tokens
    assert len(analysis["findings"]) == 6 and len(analysis["checks"]) == 1


def test_set_condition_keeps_the_transition_time_when_the_status_holds():
    first = sweepstatus.condition("Ready", "False", "Running", "0/2", "t1")
    same = sweepstatus.set_condition([first], sweepstatus.condition("Ready", "False", "Running", "1/2", "t2"))
    assert same == [first.model_copy(update={"message": "1/2"})]
    flipped = sweepstatus.set_condition(same, sweepstatus.condition("Ready", "True", "Succeeded", "2/2", "t3"))
    assert flipped[0].last_transition_time == "t3"
    added = sweepstatus.set_condition(flipped, sweepstatus.condition("Queued", "False", "NotQueued", "", "t4"))
    assert [c.type for c in added] == ["Ready", "Queued"], "a map keyed by type: one entry per type, order kept"


def test_invalid_status_names_every_field():
    status = sweepstatus.invalid_status([("spec.sweep.scales[0].nodes", "must be 1"), ("spec.training.seqLen", "too long")],
                               2, NOW)
    assert status.phase == "Invalid" and status.runs == []
    assert "spec.sweep.scales[0].nodes" in status.message and "spec.training.seqLen" in status.message


def test_termination_message_prefers_the_named_container_and_falls_back_to_last_state():
    pod = {"status": {"containerStatuses": [
        {"name": "sidecar", "state": {"terminated": {"message": "not me"}}},
        {"name": "pytorch", "state": {"running": {}}, "lastState": {"terminated": {"message": '{"a": 1}'}}},
    ]}}
    assert pods.termination_message(pod, container="pytorch") == '{"a": 1}'
    assert pods.termination_message(None) is None


def test_only_job_events_that_can_change_a_sweep_wake_it():
    created = {"kind": "PyTorchJob", "metadata": {"name": "j"}, "spec": {"runPolicy": {}}}
    assert not decide.job_event_matters(None, created), "the listing at startup"
    assert not decide.job_event_matters("ADDED", created), "just created by the operator itself"
    assert decide.job_event_matters("ADDED", {"kind": "MPIJob", "spec": {"runPolicy": {"suspend": True}}}), "Kueue queued it"
    assert decide.job_event_matters("ADDED", _job(("Succeeded", "True"), kind="MPIJob")), "seen after a restart"
    assert decide.job_event_matters("MODIFIED", created) and decide.job_event_matters("DELETED", created)
