"""One operator step decided on data alone (`decide.step`): what a step read in, what it does out. The same
decisions run against the emulated API in tests/test_operator_*.py; here each rule is checked without a cluster,
a clock or kopf."""

from __future__ import annotations

import copy

from gpt2bench.controller import decide, starting, sweepstatus
from gpt2bench.diagnosis import holds
from gpt2bench.plan import plan_runs
from gpt2bench.specification.model import Benchmark
from gpt2bench.specification.validation import validate_spec

NOW, LATER = "2026-11-22T00:00:00Z", "2026-11-22T00:00:30Z"
REFUSED = ('Error creating: pods "b-ddp-fp32-1x2-worker-0" is forbidden: violates PodSecurity "restricted:latest": '
           'allowPrivilegeEscalation != false (container "init-pytorch" must set '
           'securityContext.allowPrivilegeEscalation=false)')


def _benchmark(strategies=("ddp", "fsdp", "single"), nodes=2) -> Benchmark:
    spec = validate_spec({"backend": "pytorchjob", "concurrency": 1,
                          "sweep": {"strategies": [{"name": s} for s in strategies],
                                    "scales": [{"nodes": nodes, "processesPerNode": 1}]}})
    return Benchmark(name="b", namespace="ns", spec=spec)


def _job(entry, *conditions: str, deleting: bool = False) -> dict:
    metadata = {"name": entry.job_name, "namespace": "ns", "creationTimestamp": NOW}
    if deleting:
        metadata["deletionTimestamp"] = NOW
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": metadata,
            "status": {"conditions": [{"type": c, "status": "True", "lastTransitionTime": NOW} for c in conditions]}}


def _seen(benchmark: Benchmark, entries, jobs=(), **changes) -> decide.Observed:
    runs = plan_runs(benchmark)
    status = sweepstatus.initial_status(runs, 1, NOW).model_copy(update={"runs": list(entries)})
    observed = {"strays": {}, "missing": {}, "results": {}, "starts": {}, **changes}
    return decide.Observed(status=status, benchmark=benchmark, runs=runs,
                           jobs={job["metadata"]["name"]: job for job in jobs}, **observed)


def _entries(benchmark: Benchmark):
    return sweepstatus.initial_status(plan_runs(benchmark), 1, NOW).runs


def test_a_refused_worker_fails_its_run_at_once_deletes_its_job_and_holds_the_runs_that_share_the_cause():
    benchmark = _benchmark()
    first, *others = _entries(benchmark)
    first = decide.mark_running(first, NOW)
    job = _job(first, "Created")
    view = starting.StartView(pods=[], job_events=[{"type": "Warning", "reason": "FailedCreatePod", "message": REFUSED,
                                                    "lastTimestamp": NOW}])
    plan = decide.step(_seen(benchmark, [first, *others], [job], starts={first.name: view}), LATER)
    failed, *pending = plan.entries
    assert failed.phase == "Failed" and "violates PodSecurity" in failed.reason
    assert plan.delete == [job]
    # fsdp on 2 nodes would have the same Worker refused: held; single runs on one pod (no Worker): goes on
    assert [(entry.strategy, holds.held(entry)) for entry in pending] == [("fsdp", holds.ADMISSION), ("single", None)]
    assert not plan.again and plan.added is None


def test_a_run_keeps_waiting_until_its_start_limit_and_a_step_reads_no_clock_of_its_own():
    benchmark = _benchmark()
    first, *others = _entries(benchmark)
    first = decide.mark_running(first, NOW)
    pending_pod = {"metadata": {"name": "p", "creationTimestamp": NOW},
                   "status": {"phase": "Pending", "containerStatuses": [
                       {"name": "pytorch", "state": {"waiting": {"reason": "ErrImagePull", "message": "not found"}}}]}}
    seen = _seen(benchmark, [first, *others], [_job(first, "Created")],
                 starts={first.name: starting.StartView(pods=[pending_pod, copy.deepcopy(pending_pod)])})
    waiting = decide.step(seen, LATER).entries[0]
    assert waiting.phase == "Running" and "ErrImagePull" in waiting.waiting and waiting.waiting_since == NOW
    limit = benchmark.spec.run_policy.startup_seconds
    late = f"2026-11-22T00:{(limit + 1) // 60:02d}:{(limit + 1) % 60:02d}Z"
    plan = decide.step(_seen(benchmark, [waiting, *others], seen.jobs.values(), starts=seen.starts), late)
    assert plan.entries[0].phase == "Failed" and "ErrImagePull" in plan.entries[0].reason
    assert plan.delete == list(seen.jobs.values())


def test_strays_and_jobs_finished_by_another_writer_are_deleted_and_said():
    benchmark = _benchmark(nodes=1)
    first, second, third = _entries(benchmark)
    marked = first.model_copy(update={"phase": "Succeeded"})  # by hand, while its job runs
    running_job = _job(first, "Created", "Running")
    stray = {**_job(third, "Created"), "metadata": {"name": "b-old", "namespace": "ns", "creationTimestamp": NOW}}
    seen = _seen(benchmark, [marked, second, third], [running_job])
    seen.strays = {"b-old": stray}
    plan = decide.step(seen, NOW)
    assert plan.delete == [stray, running_job]
    assert plan.foreign == [f"run {first.name} was marked Succeeded while its job {first.job_name} was still "
                            "running: the mark is kept and the job deleted, so that one job runs at a time"]
    assert plan.entries[0].phase == "Succeeded"


def test_a_preempted_run_is_pending_again_its_job_deleted_and_the_step_goes_round_once_more():
    benchmark = _benchmark(nodes=1)
    first, *others = _entries(benchmark)
    first = decide.mark_running(first, NOW)
    job = _job(first, "Created", "Failed")
    why = f"pod {first.job_name}-master-0 {decide.diagnosis.PREEMPTED} ({decide.diagnosis.PREEMPTED_BY}: ...)"
    seen = _seen(benchmark, [first, *others], [job],
                 results={first.name: decide.Result(pod=None, message=None, cause=why, why=why)})
    plan = decide.step(seen, LATER)
    assert plan.entries[0].phase == "Pending" and plan.entries[0].reason.startswith(decide.RERUN)
    assert plan.delete == [job] and plan.again and plan.collected == []


def test_the_same_observation_gives_the_same_plan():
    benchmark = _benchmark(nodes=1)
    entries = _entries(benchmark)
    job = _job(entries[0], "Created", "Running")
    one, two = (decide.step(_seen(benchmark, entries, [job]), LATER) for _ in range(2))
    assert one == two
    assert one.entries[0].phase == "Running" and one.entries[0].start_time == LATER


def _pod(name: str, created: str = NOW, started: bool = False) -> dict:
    state = {"running": {}} if started else {"waiting": {"reason": "ErrImagePull", "message": "not found"}}
    return {"metadata": {"name": name, "creationTimestamp": created},
            "status": {"phase": "Running" if started else "Pending",
                       "containerStatuses": [{"name": "pytorch", "state": state}]}}


def test_a_step_reads_the_events_of_what_a_run_waits_on_and_follow_judges_the_same_wait():
    """`needs_events` (what observe reads) and `follow` (what decide judges) ask one `waiting_on`: a pod missing
    reads its controllers' Events (a refusal fails the run at once), pods present read only the Events of those not
    started, a started run reads nothing until a pod is re-created, and then that pod's and its controllers'."""
    benchmark = _benchmark()
    entry = decide.mark_running(_entries(benchmark)[0], NOW)
    job = _job(entry, "Created")
    job["spec"] = {"pytorchReplicaSpecs": {"Master": {"replicas": 1}, "Worker": {"replicas": 1}}}
    master, worker = _pod("m", started=True), _pod("w")
    refusal = [{"type": "Warning", "reason": "FailedCreatePod", "message": REFUSED, "lastTimestamp": NOW}]

    def followed(pods, events_wanted, names):
        view = starting.StartView(pods=pods, job_events=refusal if events_wanted else None,
                                  pod_events={name: [] for name in names})
        return starting.follow(entry, job, view, benchmark.spec, LATER)

    assert starting.needs_events(entry, job, [master]) == (True, [])  # the Worker missing
    assert "violates PodSecurity" in followed([master], *starting.needs_events(entry, job, [master])).failed
    assert starting.needs_events(entry, job, [master, worker]) == (False, ["w"])  # both there: an old refusal is moot
    waiting = followed([master, worker], *starting.needs_events(entry, job, [master, worker]))
    assert waiting.failed is None and "ErrImagePull" in waiting.entry.waiting
    both = [master, _pod("w", started=True)]
    assert starting.needs_events(entry, job, both) == (False, [])
    started = followed(both, False, []).entry
    assert started.pods_started_time == LATER and started.waiting is None
    assert starting.needs_events(started, job, both) == (False, [])
    again = [master, _pod("w2", created="2026-11-22T00:01:00Z")]  # the Worker re-created after the start
    assert starting.needs_events(started, job, again) == (True, ["w2"])
    view = starting.StartView(pods=again, job_events=[], pod_events={"w2": []})
    rewaiting = starting.follow(started, job, view, benchmark.spec, "2026-11-22T00:01:10Z").entry
    assert rewaiting.waiting.startswith("re-created after the run started: ") and \
        rewaiting.waiting_since == "2026-11-22T00:01:00Z"
