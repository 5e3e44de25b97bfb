"""The sweep's states and transitions (docs/operator.md, "States and transitions"), each under an API error.

The real kopf operator (KopfRunner, the module's `operator` fixture) against the emulated API server; a placed
fault (tests/kube/faults.py) fails the very call a transition makes, and the test checks that the operator
still gets to the transition's next state: no state may be left for good because one call failed.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
from fault_figures import FIGURES
from kube.faults import OWN_CLIENT, FailCalls
from kube.fixtures import benchmark, run_entry, wait_for

pytestmark = pytest.mark.timeout(120)

# The operator's discovery of the job kinds (`backend: auto`): GET /apis/<group>/<version>.
DISCOVERY = r"^/apis/[^/]+/[^/]+$"
INVALID_LIMITS = {"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}}


def play_one(trainer, name: str, tokens_per_second: float = 10.0) -> dict:
    """Finish the next job of `name` (Running, then Succeeded); the job."""
    job = wait_for(lambda: next((j for j in trainer.jobs(name) if not (j.get("status") or {}).get("conditions")),
                                None), 30, what=f"a new job of {name}")
    trainer.start(job)
    trainer.succeed(job, tokens_per_second)
    return job


def reasons(benchmarks, name: str) -> list[str]:
    return [e["reason"] for e in benchmarks.events(name)]


@pytest.mark.parametrize("code", [503, 403])
def test_fixing_an_invalid_spec_starts_the_sweep_though_the_start_meets_an_api_error(
        cluster, benchmarks, trainer, code):
    """Before the fix: the edit's start met one error; its retry took the "change ignored" branch and the
    benchmark stayed Pending for ever, with the stale "invalid spec" message and a false SpecChangeIgnored."""
    name = f"fixed-{code}"
    benchmarks.create(benchmark(name, [{"name": "single"}], **INVALID_LIMITS))
    wait_for(lambda: benchmarks.status(name).get("phase") == "Invalid", what="Invalid")
    with FailCalls(code, times=1, method="GET", path=DISCOVERY, agents=OWN_CLIENT).install(cluster) as fault:
        benchmarks.patch_spec(name, {"resources": {"limits": {"cpu": "2"}}})
        play_one(trainer, name)
    assert fault.hits == 1, "the start met the error"
    status = wait_for(lambda: (s := benchmarks.status(name)).get("phase") == "Succeeded" and s, what="Succeeded")
    assert status["observedGeneration"] == 2 and "invalid" not in status["message"]
    assert "SpecChangeIgnored" not in reasons(benchmarks, name)
    benchmarks.delete(name)


def test_a_start_that_meets_errors_for_longer_than_any_retry_budget_starts_once_they_stop(cluster, benchmarks,
                                                                                         trainer):
    """Before the fix: ~45 s of API errors at creation (10 tries) left the sweep Failed for good. Now it waits
    Pending, saying why, and starts as soon as the API server answers."""
    from gpt2bench.controller.metrics import REGISTRY

    def errors() -> float:
        return REGISTRY.get_sample_value("gpt2bench_operator_reconcile_errors_total", {"namespace": "default"}) or 0

    name = "patient"
    phases: list[str | None] = []
    errors_before = errors()
    with FailCalls(503, times=12, method="GET", path=DISCOVERY, agents=OWN_CLIENT).install(cluster) as fault:
        benchmarks.create(benchmark(name, [{"name": "single"}]))
        pending = wait_for(lambda: (s := benchmarks.status(name)).get("phase") == "Pending" and s, what="Pending")
        assert "ServiceUnavailable" in pending["message"] or "503" in pending["message"], pending["message"]
        wait_for(lambda: phases.append(benchmarks.status(name).get("phase")) or fault.hits == 12, 60,
                 what="every injected error met")
    play_one(trainer, name)
    status = wait_for(lambda: (s := benchmarks.status(name)).get("phase") == "Succeeded" and s, what="Succeeded")
    assert "Failed" not in phases and status["runsSucceeded"] == 1
    assert errors() - errors_before >= 12, "each failed start counted (GPT2BenchmarkOperatorReconcileErrors)"
    assert reasons(benchmarks, name).count("SweepNotStarted") == 1, "one Event for one error, not one per try"
    benchmarks.delete(name)


def test_a_sweep_an_earlier_version_failed_to_start_starts_when_its_spec_is_edited(cluster, benchmarks, trainer):
    """What an earlier operator left after its start retries ran out (phase Failed, no runs, its creation
    handled): nothing ran, so an edit starts it, like an Invalid one; a false SpecChangeIgnored said "the sweep
    keeps running"."""
    name = "given-up"
    body = benchmark(name, [{"name": "single"}])
    handled = json.dumps({"spec": body["spec"]}, separators=(",", ":"))  # kopf's record: creation handled
    body["metadata"]["annotations"] = {"gpt2bench.io/last-handled-configuration": handled}
    benchmarks.create(body)
    benchmarks.api.patch_namespaced_custom_object_status(
        "gpt2bench.io", "v1alpha1", "default", "gpt2benchmarks", name,
        {"status": {"phase": "Failed", "runs": [], "message": "the operator could not start the sweep: "
                                                              "ApiException: (403)"}})
    assert trainer.jobs(name) == []
    benchmarks.patch_spec(name, {"training": {"steps": 5, "warmupSteps": 1, "seqLen": 32}})
    play_one(trainer, name)
    status = wait_for(lambda: (s := benchmarks.status(name)).get("phase") == "Succeeded" and s, what="Succeeded")
    assert status["observedGeneration"] == 2
    pinned = json.loads(benchmarks.get(name)["metadata"]["annotations"]["gpt2bench.io/sweep-spec"])
    assert pinned["training"]["steps"] == 5
    assert "SpecChangeIgnored" not in reasons(benchmarks, name)
    benchmarks.delete(name)


# --- (none) → Running: every call of the start, failed once -------------------------------------------

START_CALLS = [  # (method, path, code): the calls a start makes, in order
    ("GET", DISCOVERY, 503),  # which job kinds the cluster serves (backend auto)
    ("PATCH", r"/gpt2benchmarks/{name}$", 503),  # the pinned spec (annotation)
    ("PATCH", r"/gpt2benchmarks/{name}/status$", 503),  # every run Pending: the sweep has started
    ("POST", r"/namespaces/default/pytorchjobs$", 503),  # the first run's job
    ("PATCH", r"/gpt2benchmarks/{name}/status$", 403),  # a write refused (RBAC being fixed...)
]


@pytest.mark.parametrize(("method", "path", "code"), START_CALLS,
                         ids=["discovery", "pin", "status", "job", "status-403"])
def test_a_new_sweep_starts_though_one_call_of_its_start_fails(cluster, benchmarks, trainer, method, path, code):
    name = f"start-{method.lower()}-{code}-{len(path)}"
    with FailCalls(code, times=1, method=method, path=path.format(name=name), agents=OWN_CLIENT).install(cluster) \
            as fault:
        benchmarks.create(benchmark(name, [{"name": "single"}, {"name": "ddp"}]))
        play_one(trainer, name, 10.0)
    assert fault.hits == 1
    play_one(trainer, name, 20.0)
    status = wait_for(lambda: (s := benchmarks.status(name)).get("phase") == "Succeeded" and s, what="Succeeded")
    assert [r["results"]["tokensPerSecond"] for r in status["runs"]] == [10.0, 20.0]
    assert len(trainer.jobs(name)) == 2, "each job created once"
    wait_for(lambda: "SweepSucceeded" in reasons(benchmarks, name), what="the Events")
    assert reasons(benchmarks, name).count("SweepPlanned") == 1
    benchmarks.delete(name)


def test_the_api_servers_retry_after_is_waited_for_before_the_call_is_made_again(cluster, benchmarks, trainer):
    """A 429 with Retry-After (API Priority and Fairness) on the step's list of jobs: the next list comes after
    the time the server asked for, not at the next job event or timer tick (0.3 s here)."""
    name = "throttled"
    benchmarks.create(benchmark(name, [{"name": "single"}, {"name": "ddp"}]))
    first = wait_for(lambda: trainer.jobs(name), what="the first job")[0]
    lists = r"/namespaces/default/pytorchjobs$"
    with FailCalls(429, times=1, retry_after=2, method="GET", path=lists, agents=OWN_CLIENT).install(cluster) \
            as fault:
        trainer.start(first)
        trainer.succeed(first, 10.0)
        play_one(trainer, name, 20.0)
    (failed_at, failed), (retried_at, retried_failed) = fault.calls[:2]
    assert failed and not retried_failed
    assert retried_at - failed_at >= 2.0, f"listed again after {retried_at - failed_at:.2f} s"
    wait_for(lambda: benchmarks.status(name).get("phase") == "Succeeded", what="Succeeded")
    benchmarks.delete(name)


def test_an_invalid_spec_is_said_once_though_writing_it_fails_once(cluster, benchmarks, trainer):
    name = "invalid-late"
    path = rf"/gpt2benchmarks/{name}/status$"
    with FailCalls(503, times=1, method="PATCH", path=path, agents=OWN_CLIENT).install(cluster) as fault:
        benchmarks.create(benchmark(name, [{"name": "single"}], **INVALID_LIMITS))
        status = wait_for(lambda: (s := benchmarks.status(name)).get("phase") == "Invalid" and s, what="Invalid")
    assert fault.hits == 1 and "spec.resources.limits.cpu" in status["message"]
    wait_for(lambda: "InvalidSpec" in reasons(benchmarks, name), what="the InvalidSpec Event")
    assert reasons(benchmarks, name).count("InvalidSpec") == 1 and trainer.jobs(name) == []
    benchmarks.delete(name)


# --- Running → Running → finished ----------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), [
    ("GET", r"/gpt2benchmarks/{name}$"),  # the step reads the benchmark fresh
    ("GET", r"/namespaces/default/pytorchjobs$"),  # ... lists its jobs
    ("GET", r"/namespaces/default/pods$"),  # ... reads the finished run's result pod
    ("PATCH", r"/gpt2benchmarks/{name}/status$"),  # ... writes the result and the next run
], ids=["read", "list", "pod", "status"])
def test_a_finished_run_is_recorded_and_the_next_started_though_one_call_of_the_step_fails(
        cluster, benchmarks, trainer, method, path):
    name = f"step-{method.lower()}-{len(path)}"
    benchmarks.create(benchmark(name, [{"name": "single"}, {"name": "ddp"}]))
    first = wait_for(lambda: trainer.jobs(name), what="the first job")[0]
    with FailCalls(503, times=1, method=method, path=path.format(name=name), agents=OWN_CLIENT).install(cluster) \
            as fault:
        trainer.start(first)
        trainer.succeed(first, 10.0)
        second = play_one(trainer, name, 20.0)
    assert fault.hits == 1 and second["metadata"]["name"] != first["metadata"]["name"]
    status = wait_for(lambda: (s := benchmarks.status(name)).get("phase") == "Succeeded" and s, what="Succeeded")
    assert [r["results"]["tokensPerSecond"] for r in status["runs"]] == [10.0, 20.0]
    # Events are posted after the status write: wait for them, then check none came twice
    wait_for(lambda: reasons(benchmarks, name).count("RunSucceeded") == 2, what="2 RunSucceeded")
    wait_for(lambda: "SweepSucceeded" in reasons(benchmarks, name), what="SweepSucceeded")
    assert reasons(benchmarks, name).count("SweepSucceeded") == 1
    benchmarks.delete(name)


@pytest.mark.faults
def test_one_404_on_the_list_of_jobs_of_a_served_kind_fails_no_run(cluster, benchmarks, trainer):
    """Before the fix: one 404 on the step's list of PyTorchJobs (an API server instance whose CRD informer has
    not synced, CRDs re-applied during an upgrade) took the kind for "not served": every active run of it Failed
    with a false reason and the running job was orphaned. Discovery serves the kind, so the 404 is transient: the
    step is tried again, and every result is kept."""
    name = "list-404"
    benchmarks.create(benchmark(name, [{"name": "single"}, {"name": "ddp"}]))
    first = wait_for(lambda: trainer.jobs(name), what="the first job")[0]
    trainer.start(first)
    wait_for(lambda: run_entry(benchmarks.status(name), 0).get("phase") == "Running", what="Running")
    lists = r"/namespaces/default/pytorchjobs$"
    with FailCalls(404, times=1, method="GET", path=lists, agents=OWN_CLIENT).install(cluster) as fault:
        trainer.succeed(first, 10.0)
        wait_for(lambda: fault.hits == 1, what="the 404 met")
        play_one(trainer, name, 20.0)
    status = wait_for(lambda: (s := benchmarks.status(name)).get("phase") not in (None, "Pending", "Running") and s,
                      what="finished")
    assert [(r["phase"], (r.get("results") or {}).get("tokensPerSecond")) for r in status["runs"]] == [
        ("Succeeded", 10.0), ("Succeeded", 20.0)], [r.get("reason") for r in status["runs"]]
    assert status["phase"] == "Succeeded" and len(trainer.jobs(name)) == 2
    FIGURES["list-404"] = {"injected": fault.hits, "runs": 2, "runs_lost": 0, "runs_twice": 0,
                           "final_phase": status["phase"]}
    benchmarks.delete(name)


def test_a_sweep_finishes_once_though_writing_its_end_fails_once(cluster, benchmarks, trainer):
    """Running → Succeeded: the status write of the last run's result (and the analysis) fails once."""
    name = "ending"
    benchmarks.create(benchmark(name, [{"name": "single"}]))
    job = wait_for(lambda: trainer.jobs(name), what="the job")[0]
    trainer.start(job)
    wait_for(lambda: run_entry(benchmarks.status(name), 0).get("phase") == "Running", what="Running")
    path = rf"/gpt2benchmarks/{name}/status$"
    with FailCalls(503, times=1, method="PATCH", path=path, agents=OWN_CLIENT).install(cluster) as fault:
        trainer.succeed(job, 10.0)
        status = wait_for(lambda: (s := benchmarks.status(name)).get("phase") == "Succeeded" and s, what="Succeeded")
    assert fault.hits == 1 and status["runs"][0]["results"]["tokensPerSecond"] == 10.0 and status["analysis"]
    wait_for(lambda: "SweepSucceeded" in reasons(benchmarks, name), what="SweepSucceeded")
    assert reasons(benchmarks, name).count("RunSucceeded") == reasons(benchmarks, name).count("SweepSucceeded") == 1
    benchmarks.delete(name)


def test_the_finalizer_an_earlier_version_added_is_removed_while_the_sweep_runs(cluster, benchmarks, trainer):
    """Before the fix: kopf added `gpt2bench.io/finalizer` to every running benchmark (its timer needed it), so
    a benchmark could not be deleted while no operator ran. No handler needs it now, and kopf removes the one an
    earlier version added."""
    name = "old-finalizer"
    body = benchmark(name, [{"name": "single"}])
    body["metadata"]["finalizers"] = ["gpt2bench.io/finalizer"]
    benchmarks.create(body)
    trainer.start(wait_for(lambda: trainer.jobs(name), what="the first job")[0])
    wait_for(lambda: run_entry(benchmarks.status(name), 0).get("phase") == "Running", what="Running")
    finalizers = []
    for _ in range(10):  # kopf acts on each event of the benchmark within milliseconds: a second of them
        time.sleep(0.1)
        finalizers.append(benchmarks.get(name)["metadata"].get("finalizers") or [])
    assert finalizers == [[]] * 10, "no finalizer on a running sweep"
    benchmarks.delete(name)
    wait_for(lambda: not benchmarks.exists(name), what="deleted at once")


def test_a_status_write_another_writer_came_before_is_made_again_on_what_is_stored(cluster, benchmarks, trainer):
    """Before the fix: status patches carried no resourceVersion, so a write made on a stale read replaced what
    another writer (a second operator) had written meanwhile. Now the write is conditional: the API server answers
    409 and the step runs again on the stored status, keeping the other writer's change."""
    from kube.faults import is_operator

    name = "two-writers"
    benchmarks.create(benchmark(name, [{"name": "single"}, {"name": "ddp"}]))
    first = wait_for(lambda: trainer.jobs(name), what="the first job")[0]
    trainer.start(first)
    wait_for(lambda: run_entry(benchmarks.status(name), 0).get("phase") == "Running", what="Running")
    listing = threading.Event()

    def slow_job_lists(request) -> float | None:  # the step reads the benchmark, then waits for its jobs
        method = getattr(request.method, "name", str(request.method))
        if is_operator(request, OWN_CLIENT) and request.resource is not None and \
                request.resource.plural == "pytorchjobs" and method == "GET" and request.name is None:
            listing.set()
            return 1.5
        return None

    cluster.call(lambda emulator: emulator.faults.append(slow_job_lists))
    try:
        listing.clear()
        trainer.succeed(first, 10.0)
        assert listing.wait(10), "the step listed the jobs"
        runs = benchmarks.status(name)["runs"]
        runs[1]["reason"] = "written by another writer"
        benchmarks.api.patch_namespaced_custom_object_status("gpt2bench.io", "v1alpha1", "default",
                                                             "gpt2benchmarks", name, {"status": {"runs": runs}})
        status = wait_for(lambda: (s := benchmarks.status(name)) and run_entry(s, 0).get("phase") == "Succeeded"
                          and s, what="the first run recorded")
    finally:
        cluster.call(lambda emulator: emulator.faults.remove(slow_job_lists))
    assert status["runs"][1].get("reason") == "written by another writer", "the other writer's change kept"
    play_one(trainer, name, 20.0)
    wait_for(lambda: benchmarks.status(name).get("phase") == "Succeeded", what="Succeeded")
    benchmarks.delete(name)


# --- Running → Running: a round added until decided ----------------------------------------------------

UNDECIDED = {"strategies": [{"name": "ddp"}, {"name": "fsdp"}], "repeats": 2, "maxRepeats": 3, "breakdown": "off",
             "scales": [{"nodes": 1, "devicesPerNode": 0, "processesPerNode": 2}]}


def jobs_created_before_their_run_was_recorded(cluster, name: str) -> list[str]:
    """The jobs of `name` whose creation came before any status write listing their run (resourceVersions are
    one counter across the emulator's kinds, so they order the two)."""
    def check(emulator):
        recorded: dict[str, int] = {}
        for (resource, events) in emulator.watch_history.items():
            if resource.plural != "gpt2benchmarks":
                continue
            for rv, event in events:
                if event["object"]["metadata"]["name"] == name:
                    for run in (event["object"].get("status") or {}).get("runs") or []:
                        recorded.setdefault(run.get("jobName"), rv)
        early = []
        for (resource, events) in emulator.watch_history.items():
            if resource.plural != "pytorchjobs":
                continue
            for rv, event in events:
                job = event["object"]["metadata"]["name"]
                if event["type"] == "ADDED" and job.startswith(f"{name}-") and recorded.get(job, rv + 1) > rv:
                    early.append(job)
        return early
    return cluster.call(check)


@pytest.mark.faults
def test_a_round_is_recorded_before_its_first_job_though_recording_it_fails_once(cluster, benchmarks, trainer):
    """Before the fix: the step that added a round created the round's first job before its status write; one
    503 on that write with a wall-clock budget ended the sweep Succeeded while the job, listed nowhere, ran on.
    Now the round is written first and its jobs created by the next step: no job exists before its run is in
    status, whatever call fails."""
    name = "round-added"
    swapped = {"ddp-fp32-1x2-r1": 1001.0, "fsdp-fp32-1x2-r1": 1000.0,  # each ahead in one round: undecided
               "ddp-fp32-1x2-r2": 1000.0, "fsdp-fp32-1x2-r2": 1001.0}
    benchmarks.create(benchmark(name, sweep=UNDECIDED))
    for _ in range(3):
        job = wait_for(lambda: next((j for j in trainer.jobs(name) if not (j.get("status") or {}).get("conditions")),
                                    None), what="a job of rounds 1 and 2")
        trainer.start(job)
        trainer.succeed(job, swapped[job["metadata"]["name"].removeprefix(f"{name}-")])
    last = wait_for(lambda: next((j for j in trainer.jobs(name) if not (j.get("status") or {}).get("conditions")),
                                 None), what="round 2's last job")
    trainer.start(last)
    wait_for(lambda: run_entry(benchmarks.status(name), 3).get("phase") == "Running", what="Running")
    path = rf"/gpt2benchmarks/{name}/status$"
    with FailCalls(503, times=1, method="PATCH", path=path, agents=OWN_CLIENT).install(cluster) as fault:
        # the step that records it adds round 3: that write fails
        trainer.succeed(last, swapped[last["metadata"]["name"].removeprefix(f"{name}-")])
        wait_for(lambda: fault.hits == 1, what="the round's write failed")
        wait_for(lambda: benchmarks.status(name).get("roundsPlanned") == 3, what="round 3 recorded")
    for i in range(2):
        play_one(trainer, name, 1000.0 + i)
    status = wait_for(lambda: (s := benchmarks.status(name)).get("phase") == "Succeeded" and s, what="Succeeded")
    assert [r["repeat"] for r in status["runs"]] == [1, 1, 2, 2, 3, 3]
    assert jobs_created_before_their_run_was_recorded(cluster, name) == []
    assert len(trainer.jobs(name)) == 6 and reasons(benchmarks, name).count("RoundAdded") == 1
    FIGURES["round-added-write-fails"] = {"injected": fault.hits, "runs": 6, "runs_lost": 0, "runs_twice": 0,
                                          "jobs_before_their_run_recorded": 0, "final_phase": status["phase"]}
    benchmarks.delete(name)


def test_a_job_of_the_benchmark_that_no_run_holds_is_deleted_saying_so(cluster, benchmarks, trainer):
    """A job labelled and owned by the benchmark, but listed by no run in its status (what an earlier version's
    failed round write left), is deleted, not left to run to its deadline; a Warning Event names it."""
    name = "stray"
    created = benchmarks.create(benchmark(name, [{"name": "single"}, {"name": "ddp"}]))
    first = wait_for(lambda: trainer.jobs(name), what="the first job")[0]
    stray = {**first, "metadata": {"name": f"{name}-single-fp32-1x1-r9", "namespace": "default",
                                   "labels": first["metadata"]["labels"],
                                   "ownerReferences": first["metadata"]["ownerReferences"]}}
    stray.pop("status", None)
    assert stray["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
    trainer.custom.create_namespaced_custom_object("kubeflow.org", "v1", "default", "pytorchjobs", stray)
    trainer.start(first)  # its event: a step
    wait_for(lambda: stray["metadata"]["name"] not in [j["metadata"]["name"] for j in trainer.jobs(name)],
             what="the stray job deleted")
    wait_for(lambda: "StrayJobDeleted" in reasons(benchmarks, name), what="the Event")
    trainer.succeed(first, 10.0)
    play_one(trainer, name, 20.0)
    status = wait_for(lambda: (s := benchmarks.status(name)).get("phase") == "Succeeded" and s, what="Succeeded")
    assert [r["results"]["tokensPerSecond"] for r in status["runs"]] == [10.0, 20.0]
    benchmarks.delete(name)


# --- edits of started sweeps ---------------------------------------------------------------------------


@pytest.mark.parametrize("finished", [False, True], ids=["running", "finished"])
def test_an_edit_of_a_started_sweep_is_ignored_once_though_a_call_fails(cluster, benchmarks, trainer, finished):
    name = f"edited-{'done' if finished else 'running'}"
    benchmarks.create(benchmark(name, [{"name": "single"}]))
    if finished:
        play_one(trainer, name)
        wait_for(lambda: benchmarks.status(name).get("phase") == "Succeeded", what="Succeeded")
    else:
        wait_for(lambda: trainer.jobs(name), what="the job")
    calls = ("PATCH", rf"/gpt2benchmarks/{name}/status$") if finished else ("GET", rf"/gpt2benchmarks/{name}$")
    with FailCalls(503, times=1, method=calls[0], path=calls[1], agents=OWN_CLIENT).install(cluster) as fault:
        benchmarks.patch_spec(name, {"training": {"steps": 9, "warmupSteps": 1, "seqLen": 32}})
        status = wait_for(lambda: (s := benchmarks.status(name)) and any(
            c["type"] == "SpecChangeIgnored" and c["status"] == "True" for c in s.get("conditions") or []) and s,
            what="SpecChangeIgnored")
        wait_for(lambda: "SpecChangeIgnored" in reasons(benchmarks, name), what="the Event")
    assert fault.hits == 1 and status["observedGeneration"] == 1
    if not finished:
        play_one(trainer, name)
        wait_for(lambda: benchmarks.status(name).get("phase") == "Succeeded", what="Succeeded")
    assert reasons(benchmarks, name).count("SpecChangeIgnored") == 1
    assert len(trainer.jobs(name)) == 1, "the pinned spec's one run"
    benchmarks.delete(name)


# --- Running, held: what this version cannot read (pure: no cluster) ----------------------------------


def pinned_benchmark(spec_changes: dict | None = None, pinned_by: str = "9.9.0") -> dict:
    """A started sweep as stored: its pinned spec (with `spec_changes`, as a later version may pin it), the
    version that pinned it, and status as initial_status writes it."""
    from gpt2bench.clock import SYSTEM_CLOCK
    from gpt2bench.controller import pinning, sweepstatus
    from gpt2bench.plan import plan_runs

    body = benchmark("held", [{"name": "single"}, {"name": "ddp"}], backend="pytorchjob")
    body["metadata"].update(namespace="default", uid="u-1", generation=1)
    runs = plan_runs(pinning.benchmark_of(body, body["spec"]))
    body["status"] = sweepstatus.initial_status(runs, 1, SYSTEM_CLOCK.stamp()).dump()
    body["metadata"]["annotations"] = {pinning.SWEEP_SPEC_ANNOTATION: json.dumps({**body["spec"], **(spec_changes or {})}),
                                       pinning.SWEEP_SPEC_VERSION_ANNOTATION: pinned_by}
    return body


def test_a_pinned_state_this_version_reads_is_read_as_pinned():
    from gpt2bench.controller import pinning

    status, bench, runs = pinning.pinned(pinned_benchmark())
    assert [r.name for r in runs] == [r.name for r in status.runs] == ["held-single-fp32-1x1", "held-ddp-fp32-1x2"]
    assert bench.spec.backend == "pytorchjob"


@pytest.mark.parametrize(("change", "said"), [
    ({"spec": {"addedLater": True}}, "spec.addedLater"),  # a field a later version added
    ({"spec": {"training": {"steps": 4, "warmupSteps": 1, "seqLen": 32, "optimizer": "lion"}}}, "spec.training"),
    ({"status": "Preempted"}, "Preempted"),  # a run phase a later version writes
    ({"status": "renamed"}, "it plans other runs than the sweep's (held-ddp-fp32-1x2"),  # another naming scheme
    ({"annotation": "{not json"}, "Expecting property name"),
], ids=["field", "value", "run-phase", "plan", "json"])
def test_a_pinned_state_this_version_cannot_read_is_unreadable_naming_what_and_who_pinned_it(change, said):
    from gpt2bench import __version__
    from gpt2bench.controller import pinning

    body = pinned_benchmark(change.get("spec"))
    if change.get("status") == "Preempted":
        body["status"]["runs"][0]["phase"] = "Preempted"
    if change.get("status") == "renamed":
        body["status"]["runs"][1]["name"] = "held-ddp-fp32-1x2-v2"
    if "annotation" in change:
        body["metadata"]["annotations"][pinning.SWEEP_SPEC_ANNOTATION] = change["annotation"]
    with pytest.raises(pinning.Unreadable) as unreadable:
        pinning.pinned(body)
    text = str(unreadable.value)
    assert said in text and "pinned by operator 9.9.0" in text and f"this operator ({__version__})" in text
    assert "delete the GPT2Benchmark" in text
