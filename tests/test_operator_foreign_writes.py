"""Another writer cannot strand a sweep: the real kopf operator against the emulator, the test writing
the benchmark's status as another client would (`patch --subresource=status`), mid-run.

- a finished `status.phase` written over runs that have not finished: the sweep goes on (its phase is its runs');
- a run renamed in `status.runs`: the plan's name is restored (before: held for ever as a "version skew");
- a Running run marked Failed by hand: the mark is kept and its job deleted, and the next run's job is created only
  once it is gone (before: the next job ran beside it).
Each is said in a Warning Event `ForeignStatusWrite`.
"""

from __future__ import annotations

import pytest
from fault_figures import FIGURES
from kube.fixtures import GROUP, PLURAL, VERSION, benchmark, wait_for

pytestmark = pytest.mark.timeout(120)


def write_status(benchmarks, name: str, status: dict) -> None:
    benchmarks.api.patch_namespaced_custom_object_status(GROUP, VERSION, benchmarks.namespace, PLURAL, name,
                                                         {"status": status})


def foreign_events(benchmarks, name: str) -> list[dict]:
    return [e for e in benchmarks.events(name) if e["reason"] == "ForeignStatusWrite"]


def first_running(benchmarks, trainer, name: str) -> tuple[dict, dict]:
    benchmarks.create(benchmark(name, [{"name": "single"}, {"name": "ddp"}]))
    job = wait_for(lambda: trainer.jobs(name), what="the first job")[0]
    status = wait_for(lambda: (s := benchmarks.status(name)) and (s.get("runs") or [{}])[0].get("phase") == "Running"
                      and s, what="the first run Running")
    trainer.start(job)
    return job, status


def finish_all(benchmarks, trainer, name: str, done: set[str]) -> dict:
    while len(done) < 2:
        job = wait_for(lambda: next((j for j in trainer.jobs(name) if j["metadata"]["name"] not in done), None),
                       what="the next job")
        trainer.start(job)
        trainer.succeed(job, 10.0 + len(done))
        done.add(job["metadata"]["name"])
    return wait_for(lambda: (s := benchmarks.status(name)).get("phase") in ("Succeeded", "PartiallySucceeded") and s,
                    what="the sweep finished")


@pytest.mark.faults
def test_a_finished_phase_written_mid_run_does_not_stop_the_sweep(benchmarks, trainer):
    name = "overwritten-phase"
    job, _ = first_running(benchmarks, trainer, name)
    write_status(benchmarks, name, {"phase": "Succeeded", "message": "done, says another writer"})
    trainer.succeed(job, 10.0)  # its job event: the step reads what the other writer left
    status = finish_all(benchmarks, trainer, name, {job["metadata"]["name"]})
    assert status["phase"] == "Succeeded" and [r["phase"] for r in status["runs"]] == ["Succeeded", "Succeeded"]
    assert status["runs"][0]["results"]["tokensPerSecond"] == 10.0
    events = foreign_events(benchmarks, name)
    assert events and events[0]["message"].startswith("status.phase Succeeded was written while runs ")
    FIGURES["foreign-phase-succeeded"] = {"injected": 1, "runs_lost": 0, "final_phase": status["phase"],
                                          "event": events[0]["message"]}


@pytest.mark.faults
def test_a_run_renamed_in_status_gets_its_planned_name_back(benchmarks, trainer):
    name = "renamed-run"
    job, status = first_running(benchmarks, trainer, name)
    runs = [dict(r) for r in status["runs"]]
    planned = runs[1]["name"]
    runs[1]["name"] = "renamed-by-hand"
    write_status(benchmarks, name, {"runs": runs})
    trainer.succeed(job, 10.0)
    status = finish_all(benchmarks, trainer, name, {job["metadata"]["name"]})
    assert status["phase"] == "Succeeded" and [r["name"] for r in status["runs"]][1] == planned
    assert not [c for c in status.get("conditions") or [] if c["type"] == "SpecUnreadable"]
    events = foreign_events(benchmarks, name)
    assert events and events[0]["message"] == ("run renamed-by-hand was renamed in status.runs: its planned name is "
                                               "restored")
    FIGURES["foreign-run-renamed"] = {"injected": 1, "runs_lost": 0, "final_phase": status["phase"],
                                      "event": events[0]["message"]}


@pytest.mark.faults
def test_a_running_run_marked_failed_by_hand_has_its_job_deleted_and_one_job_runs_at_a_time(benchmarks, trainer):
    name = "failed-by-hand"
    job, status = first_running(benchmarks, trainer, name)
    runs = [dict(r) for r in status["runs"]]
    runs[0].update(phase="Failed", reason="stopped by hand")
    write_status(benchmarks, name, {"runs": runs})
    gone = wait_for(lambda: job["metadata"]["name"] not in {j["metadata"]["name"] for j in trainer.jobs(name)},
                    what="the marked run's job deleted")
    second = wait_for(lambda: trainer.jobs(name), what="the next run's job")[0]
    assert gone and second["metadata"]["name"] == status["runs"][1]["jobName"]
    assert len(trainer.jobs(name)) == 1
    trainer.start(second)
    trainer.succeed(second, 20.0)
    status = wait_for(lambda: (s := benchmarks.status(name)).get("phase") == "PartiallySucceeded" and s,
                      what="PartiallySucceeded")
    assert (status["runs"][0]["phase"], status["runs"][0]["reason"]) == ("Failed", "stopped by hand")
    events = foreign_events(benchmarks, name)
    assert len(events) == 1 and "the mark is kept and the job deleted" in events[0]["message"]
    FIGURES["foreign-run-marked-failed"] = {"injected": 1, "jobs_at_once_max": 1, "final_phase": status["phase"],
                                            "event": events[0]["message"]}
