"""The operator's watches meet errors: the real `gpt2bench operator` process against the
API emulator, the test playing the Kubeflow training operator.

kopf (1.45) ends the whole operator on one ERROR event other than 410 in a watch stream (`WatchingError`), and on
any API error of its list or watch of a kind (a 404 from an API server whose CRD informer has not synced, a 500
after its own retries): the process exited 1 about 5 s later, with nothing said on the benchmark. The operator now
retries such a watch with a backoff (`operator/controller/watchguard.py`), says so on its benchmarks when it lasts
(condition `ApiFailing`, reason `WatchFailing`), and steps every unfinished sweep at once after a watch gap.

What the emulator cannot play: a real API server's watch cache (the 504 "Too large resource version" is played
as kube-apiserver's cacher words it, tests/kube/faults.py WATCH_ERRORS) and a real CRD informer's sync.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from fault_figures import FIGURES, seconds_since
from kube import EmulatedCluster
from kube.faults import FailCalls, WatchError, WatchGap
from kube.fixtures import Benchmarks, api_client, benchmark, install_crds, wait_for
from kube.training import TrainingOperator
from test_operator_process import OperatorProcess

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.timeout(180)]

JOBS = r"/pytorchjobs$"
KOPF = ("kopf/",)


@pytest.fixture
def env(tmp_path):
    with EmulatedCluster(tmp_path / "kube") as cluster:
        install_crds(cluster)
        client = api_client(cluster)
        operator = OperatorProcess(cluster, poll_seconds=30)  # the poll never comes within a test's wait
        operator.start()
        try:
            yield cluster, Benchmarks(client), TrainingOperator(client, cluster=cluster), operator
        finally:
            code = operator.stop()
        assert code == 0, operator.log.read_text()[-3000:]


def cut_watches(cluster: EmulatedCluster) -> None:
    """Every open watch ends (an API server restarting, a load balancer): the resumed ones meet the fault."""
    cluster.call(lambda emulator: emulator.cut_watches())


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), {})


def first_job(benchmarks: Benchmarks, trainer: TrainingOperator, name: str) -> dict[str, Any]:
    benchmarks.create(benchmark(name, [{"name": "single"}, {"name": "ddp"}]))
    return wait_for(lambda: trainer.jobs(name), 30, what="the first job")[0]


@pytest.mark.parametrize("fault", ["504", "500", "404"])
def test_one_watch_error_neither_ends_the_operator_nor_delays_the_next_run(env, fault):
    """One ERROR event (504 Too large resource version, 500) in the PyTorchJob watch, or one 404 on kopf's
    watch of that served kind: the operator lives on, and the job that finishes right after is still seen at
    once (the poll is 30 s away), through the watch retried within seconds."""
    cluster, benchmarks, trainer, operator = env
    name = f"watch-{fault}"
    job = first_job(benchmarks, trainer, name)
    placed = (FailCalls(404, method="GET", path=JOBS, agents=KOPF) if fault == "404"
              else WatchError(int(fault), path=JOBS))
    with placed.install(cluster):
        cut_watches(cluster)
        wait_for(lambda: placed.hits, 10, what="the fault met")
        trainer.start(job)
        trainer.succeed(job, 100.0)
        finished = time.monotonic()
        second = wait_for(lambda: len(jobs := trainer.jobs(name)) == 2 and jobs[1], 15,
                          what=f"the next run's job, through the watch retried ({operator.log})")
        next_job = seconds_since(finished)
    time.sleep(6)  # kopf ended the process about 5 s after the error
    assert operator.proc.poll() is None, operator.log.read_text()[-3000:]
    trainer.start(second)
    trainer.succeed(second, 110.0)
    wait_for(lambda: benchmarks.status(name).get("phase") == "Succeeded", 15, what="Succeeded")
    assert "the PyTorchJob watch failed (1 in a row since" in operator.log.read_text()
    assert not condition(benchmarks.status(name), "ApiFailing"), "a blip is not said on the benchmark"
    FIGURES[f"watch-error-{fault}"] = {"injected": placed.hits, "operator_alive_after_seconds": 6,
                                       "next_job_after_seconds": next_job, "runs_lost": 0}


def test_a_watch_that_keeps_failing_is_said_on_the_benchmark_and_the_sweep_goes_on_meanwhile(env):
    """kopf's PyTorchJob watch answered 404 for ~20 s (an API server whose CRD informer has not synced): the
    operator lives, says so (ApiFailing=True, WatchFailing, since when, the API server's words), steps the sweep
    meanwhile (the next job is created without a job event), and says when the watch works again."""
    cluster, benchmarks, trainer, operator = env
    name = "watch-lasting"
    job = first_job(benchmarks, trainer, name)
    with FailCalls(404, times=10**6, method="GET", path=JOBS, agents=KOPF).install(cluster) as placed:
        cut_watches(cluster)
        wait_for(lambda: placed.hits, 10, what="the fault met")
        began = time.monotonic()
        trainer.start(job)
        trainer.succeed(job, 100.0)
        failing = wait_for(lambda: condition(benchmarks.status(name), "ApiFailing").get("status") == "True"
                           and condition(benchmarks.status(name), "ApiFailing"), 30, what="ApiFailing=True")
        said_after = seconds_since(began)
        assert failing["reason"] == "WatchFailing"
        assert "the operator's watch of PyTorchJob" in failing["message"], failing
        assert "404" in failing["message"] and "since 20" in failing["message"], failing
        second = wait_for(lambda: len(jobs := trainer.jobs(name)) == 2 and jobs[1], 10,
                          what="the next job, from the step the failure woke (no job event came)")
        events = [e for e in benchmarks.events(name) if e.get("type") == "Warning"]
        assert sum("watch of PyTorchJob" in e.get("message", "") for e in events) == 1, events
        released, failures = time.monotonic(), placed.hits
    answering = wait_for(lambda: condition(benchmarks.status(name), "ApiFailing").get("status") == "False"
                         and condition(benchmarks.status(name), "ApiFailing"), 45, what="ApiFailing=False")
    assert answering["reason"] == "ApiAnswering"
    FIGURES["watch-failing-lasting"] = {"failed_watch_calls": failures, "condition_true_after_seconds": said_after,
                                        "condition_false_after_seconds": seconds_since(released),
                                        "warning_events": 1, "runs_lost": 0}
    assert operator.proc.poll() is None, operator.log.read_text()[-3000:]
    trainer.start(second)
    trainer.succeed(second, 110.0)
    wait_for(lambda: benchmarks.status(name).get("phase") == "Succeeded", 15, what="Succeeded, through the watch")


def test_a_job_that_finishes_in_a_watch_gap_is_seen_at_the_listing_after_it_not_at_the_next_poll(env):
    """The resumed PyTorchJob watch is answered 410 Gone after 2 s, and the job finishes in those 2 s: its event
    is lost to the watch; kopf's listing after the 410 has the finished job (as an initial listing, which no
    handler acts on). The operator steps the sweep at that listing: the next job comes within seconds, not at the
    poll 30 s later."""
    cluster, benchmarks, trainer, operator = env
    name = "watch-gap"
    job = first_job(benchmarks, trainer, name)
    with WatchGap(delay=2.0, path=JOBS).install(cluster) as gap:
        cut_watches(cluster)
        wait_for(lambda: gap.hits, 10, what="the resumed watch held")
        trainer.start(job)
        trainer.succeed(job, 100.0)
        finished = time.monotonic()
        wait_for(lambda: len(trainer.jobs(name)) == 2, 10, what="the next job, at the listing after the gap")
        next_job = seconds_since(finished)
    assert next_job < 10
    FIGURES["watch-gap-job-finished"] = {"injected": gap.hits, "next_job_after_seconds": next_job,
                                         "poll_seconds": 30}


def test_a_410_storm_is_listed_again_with_a_backoff_not_hundreds_of_times(env):
    """Every resumed PyTorchJob watch answered 410 at once for 8 s: kopf listed again after each, 0.1 s apart
    (383 listings in 15 s). With the backoff: a few listings a second at first, then at most one every 5 s; the
    operator and its sweep go on."""
    cluster, benchmarks, trainer, operator = env
    name = "watch-storm"
    job = first_job(benchmarks, trainer, name)

    def listings() -> int:
        return cluster.call(lambda emulator: sum(
            1 for r in list(emulator._requests) if r.headers.get("User-Agent", "").startswith(KOPF)
            and r.resource is not None and r.resource.plural == "pytorchjobs" and r.params.get("watch") != "true"))

    before = listings()
    with WatchGap(times=None, path=JOBS).install(cluster) as storm:
        cut_watches(cluster)
        time.sleep(8)
    relisted = listings() - before
    assert storm.hits >= 3, "the storm was met"
    assert relisted <= 25, f"{relisted} listings in 8 s"
    FIGURES["watch-410-storm"] = {"gone": storm.hits, "listings": relisted, "seconds": 8}
    trainer.start(job)
    trainer.succeed(job, 100.0)
    wait_for(lambda: len(trainer.jobs(name)) == 2, 15, what="the next job, after the storm")
    assert operator.proc.poll() is None


def test_a_watch_error_that_follows_every_listing_is_retried_with_a_growing_backoff(env):
    """The listing works but every watch after it gets the 504 (a watch cache that stays behind): the streak goes
    on across the listings, so the re-lists slow down (0.5, 1, 2, 4 s ...) instead of coming every 0.5 s."""
    cluster, benchmarks, trainer, operator = env
    name = "watch-behind"
    job = first_job(benchmarks, trainer, name)

    def listings() -> int:
        return cluster.call(lambda emulator: sum(
            1 for r in list(emulator._requests) if r.headers.get("User-Agent", "").startswith(KOPF)
            and r.resource is not None and r.resource.plural == "pytorchjobs" and r.params.get("watch") != "true"))

    before = listings()
    with WatchError(504, times=10**6, path=JOBS).install(cluster) as fault:
        cut_watches(cluster)
        time.sleep(8)
    relisted = listings() - before
    assert fault.hits >= 3 and relisted <= 6, f"{relisted} listings, {fault.hits} watch errors in 8 s"
    FIGURES["watch-error-after-every-listing"] = {"watch_errors": fault.hits, "listings": relisted, "seconds": 8}
    trainer.start(job)
    trainer.succeed(job, 100.0)
    wait_for(lambda: len(trainer.jobs(name)) == 2, 40, what="the next job, once the watch works")
    assert operator.proc.poll() is None


def test_a_kubeflow_crd_removed_mid_sweep_fails_its_runs_and_the_operator_lives_on(env):
    """The PyTorchJob CRD deleted while its run's job exists (its objects go with it, then its watch is 404
    and kopf's observer drops the kind): the operator exited 1 in 1 run of 4 (the watch met the 404 before the
    observer stopped it). Now the operator lives on, the run fails saying the kind is not served and what to
    install, and the CRD created again serves the next sweep."""
    from kube.faults import remove_crd
    from kubeflow_crds import CRD_FILES, crd_dir

    cluster, benchmarks, trainer, operator = env
    name = "crd-removed"
    first_job(benchmarks, trainer, name)
    removed = time.monotonic()
    remove_crd(cluster, "pytorchjobs.kubeflow.org")
    status = wait_for(lambda: (s := benchmarks.status(name)).get("phase") == "Failed" and s, 30,
                      what=f"the sweep Failed, its runs saying why ({operator.log})")
    failed_after = seconds_since(removed)
    assert all("pytorchjobs.kubeflow.org" in r.get("reason", "") for r in status["runs"]), status["runs"]
    time.sleep(6)
    assert operator.proc.poll() is None, operator.log.read_text()[-3000:]
    cluster.kubectl("create", "-f", str(crd_dir() / CRD_FILES[("kubeflow.org/v1", "PyTorchJob")]))
    job = first_job(benchmarks, trainer, "crd-again")
    trainer.start(job)
    trainer.succeed(job, 100.0)
    wait_for(lambda: len(trainer.jobs("crd-again")) == 2, 15, what="the next job, through the watch")
    assert operator.proc.poll() is None
    FIGURES["crd-removed"] = {"injected": 1, "sweep_failed_after_seconds": failed_after, "operator_exits": 0}
