"""Two `gpt2bench operator --leader-elect` processes on one emulated API server: one acts, the other stands by.

Before the fix: with two live operators every Event and counter doubled. The Lease (coordination.k8s.io/v1,
operator/controller/leader.py) makes one active: the standby answers /healthz, creates nothing and posts
nothing, and takes over when the leader dies (after the lease, 3 s here) or at once when it stops cleanly (it
releases the Lease).
"""

from __future__ import annotations

import time

import kubernetes
import pytest
from fault_figures import FIGURES
from kube import EmulatedCluster
from kube.fixtures import Benchmarks, api_client, benchmark, install_crds, wait_for
from kube.training import TrainingOperator
from test_operator_process import OperatorProcess, job_creations

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.timeout(240)]

LEASE = ["--leader-elect", "--leader-election-namespace", "default", "--leader-election-id", "gpt2bench-test",
         "--lease-seconds", "3"]


def candidate(cluster: EmulatedCluster, log: str) -> OperatorProcess:
    operator = OperatorProcess(cluster, log=log)
    operator.extra_args = LEASE
    return operator


def holder(client: kubernetes.client.ApiClient) -> str | None:
    """The Lease's holder; None before the first operator has made the Lease (a slow start: it is not there yet)."""
    try:
        lease = kubernetes.client.CoordinationV1Api(client).read_namespaced_lease("gpt2bench-test", "default")
    except kubernetes.client.exceptions.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return lease.spec.holder_identity


def sweep(benchmarks: Benchmarks, trainer: TrainingOperator, name: str) -> dict:
    benchmarks.create(benchmark(name, [{"name": "single"}, {"name": "ddp"}]))
    for i in range(2):
        job = wait_for(lambda i=i: len(jobs := trainer.jobs(name)) == i + 1 and jobs[i], 30, what=f"job {i}")
        trainer.start(job)
        trainer.succeed(job, 100.0 + i)
    return wait_for(lambda: (s := benchmarks.status(name)).get("phase") == "Succeeded" and s, 30, what="Succeeded")


def test_of_two_operators_one_acts_and_the_other_takes_over_when_it_dies(tmp_path):
    with EmulatedCluster(tmp_path / "kube") as cluster:
        install_crds(cluster)
        client = api_client(cluster)
        benchmarks, trainer = Benchmarks(client), TrainingOperator(client)
        first, second = candidate(cluster, "first.log"), candidate(cluster, "second.log")
        first.start()
        wait_for(lambda: holder(client), 30, what="the first operator leading")
        leader = holder(client)
        second.start()  # its /healthz answers while it stands by
        assert second.health()[0] == 200 and "standby" in second.health()[1]
        try:
            sweep(benchmarks, trainer, "pair")
            wait_for(lambda: "SweepSucceeded" in [e["reason"] for e in benchmarks.events("pair")], what="the Events")
            time.sleep(1.0)  # a second operator acting would have posted its own by now
            reasons = [e["reason"] for e in benchmarks.events("pair")]
            assert (reasons.count("SweepPlanned"), reasons.count("RunStarted"), reasons.count("RunSucceeded"),
                    reasons.count("SweepSucceeded")) == (1, 2, 2, 1), reasons
            assert job_creations(cluster) == ["pair-ddp-fp32-1x2", "pair-single-fp32-1x1"]
            assert first.metric("gpt2bench_operator_runs_started_total") == 2
            assert second.metric("gpt2bench_operator_runs_started_total") == 0, "the standby serves no metrics"
            assert holder(client) == leader

            first.kill()  # no goodbye: the Lease expires
            killed = time.monotonic()
            wait_for(lambda: holder(client) != leader, 30, what="the standby taking the Lease")
            took_over = time.monotonic() - killed
            status = sweep(benchmarks, trainer, "after")
            assert [r["phase"] for r in status["runs"]] == ["Succeeded"] * 2

            new_leader = holder(client)
            assert second.stop() == 0
            assert holder(client) is None, "a clean stop releases the Lease"
            first.start()  # takes the released Lease at its first try
            wait_for(lambda: holder(client) not in (None, new_leader), 10, what="the restarted operator leading")
        finally:
            first.stop()
            second.stop()
    # the lease runs from the last renewal the standby saw, not from the kill: the leader renews every second
    # (retry, client-go's 2/15 of the lease, at least 1 s), so the standby may take it 1 s before 3 s pass
    assert 3 - 1 <= took_over < 3 + 5, f"took over {took_over:.1f} s after the leader died (lease 3 s, retry 1 s)"
    FIGURES["two-operators"] = {"injected": 1, "runs": 4, "runs_lost": 0, "runs_twice": 0, "events_twice": 0,
                                "final_phase": "Succeeded", "lease_seconds": 3,
                                "takeover_after_kill_seconds": round(took_over, 1)}


def test_a_leader_that_cannot_renew_stops_within_the_renew_deadline():
    """Below the API (a client whose every call fails, as behind a partition): the watch ends the leader within
    its renew deadline (2/3 of the lease), before another candidate may take the Lease (after the lease)."""
    import threading

    from gpt2bench.controller import leader

    class Unreachable:
        def __getattr__(self, name):
            def call(*args, **kwargs):
                raise kubernetes.client.ApiException(status=503, reason="ServiceUnavailable")
            return call

    timing = leader.Timing.of(3)
    elector = leader.Elector(Unreachable(), "default", "l", "me", timing)
    elector.renewed_at = time.monotonic()
    lost = threading.Event()
    elector.keep(lost=lost.set)
    started = time.monotonic()
    assert lost.wait(10)
    assert timing.renew <= time.monotonic() - started < timing.lease, "lost between the renew deadline and the lease"
    elector.release()
