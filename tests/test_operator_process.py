"""`gpt2bench operator` as a separate process: restart mid-sweep without duplicates, /metrics, /healthz.

The operator is killed with SIGKILL (no graceful shutdown) while a sweep runs; a job finishes while it
is down; the new process resumes from status and the existing jobs and creates no job twice.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from kube import EmulatedCluster
from kube.fixtures import (
    REPO,
    Benchmarks,
    api_client,
    benchmark,
    env_for_subprocess,
    install_crds,
    operator_env,
    wait_for,
)
from kube.training import TrainingOperator

from gpt2bench.local.replicas import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


class OperatorProcess:
    """`gpt2bench operator` as a process; `extra_args` (e.g. ["--api-timeout", "1"]) and `env` (e.g. the
    worker count) apply from the next start. Its metrics and health ports are free ones, kept across restarts
    unless a restart finds one taken (see `start`)."""

    def __init__(self, cluster: EmulatedCluster, poll_seconds: float = 0.3, log: str = "operator.log"):
        self.cluster, self.metrics_port, self.health_port = cluster, free_port(), free_port()
        self.poll_seconds = poll_seconds
        self.extra_args: list[str] = []
        self.env: dict[str, str] = {}
        self.log = cluster.workdir / log
        self.proc: subprocess.Popen | None = None

    def start(self, attempts: int = 3) -> None:
        """Start it and wait for /healthz. A port freed by a killed operator is in the machine's ephemeral range
        (`free_port`), so any outgoing connection may take it before the restart binds it (kopf then exits with
        EADDRINUSE): that start is retried on fresh ports; any other exit fails at once with the log."""
        env = env_for_subprocess({**operator_env(self.cluster, poll_seconds=self.poll_seconds), **self.env})
        for attempt in range(attempts):
            args = [sys.executable, "-m", "gpt2bench", "operator", "--all-namespaces", "--poll-interval",
                    str(self.poll_seconds),
                    "--metrics-port", str(self.metrics_port),
                    "--liveness", f"http://127.0.0.1:{self.health_port}/healthz", *self.extra_args]
            logged = self.log.stat().st_size if self.log.exists() else 0
            with open(self.log, "a") as log:
                self.proc = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
            wait_for(lambda: self.proc.poll() is not None or
                     self.get(f"http://127.0.0.1:{self.health_port}/healthz") is not None, 60,
                     what=f"the operator's /healthz ({self.log})")
            if self.proc.poll() is None:
                return
            output = self.log.read_bytes()[logged:].decode(errors="replace")
            assert "address already in use" in output and attempt + 1 < attempts, \
                f"the operator exited {self.proc.returncode} before /healthz answered:\n{output[-3000:]}"
            self.metrics_port, self.health_port = free_port(), free_port()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            return self.proc.wait(30)
        return self.proc.returncode

    def health(self) -> tuple[int, str]:
        """/healthz's status code and body (kopf answers 500 when a probe fails; 0: no answer)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode(errors="replace")
        except OSError:
            return 0, ""

    @staticmethod
    def get(url: str) -> str | None:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.read().decode()
        except OSError:
            return None

    def metric(self, name: str) -> float:
        text = self.get(f"http://127.0.0.1:{self.metrics_port}/metrics") or ""
        values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                  if line.startswith(name) and not line.startswith("#")]
        return sum(values)


    def samples(self, name: str) -> list[dict[str, str]]:
        """The label sets of `name`'s samples whose value is 1 (info metrics)."""
        from prometheus_client.parser import text_string_to_metric_families

        text = self.get(f"http://127.0.0.1:{self.metrics_port}/metrics") or ""
        return [sample.labels for family in text_string_to_metric_families(text) for sample in family.samples
                if sample.name == name and sample.value == 1]


def job_creations(cluster: EmulatedCluster) -> list[str]:
    """Names of every job the emulator created (its ADDED watch events), duplicates kept."""
    def read(emulator):
        return sorted(event["object"]["metadata"]["name"]
                      for resource, history in emulator.watch_history.items()
                      if resource.plural in ("pytorchjobs", "mpijobs")
                      for _, event in history if event["type"] == "ADDED")
    return cluster.call(read)


def test_operator_process_resumes_after_sigkill_without_duplicate_jobs_and_serves_metrics(tmp_path):
    with EmulatedCluster(tmp_path / "kube") as cluster:
        install_crds(cluster)
        client = api_client(cluster)
        benchmarks, trainer = Benchmarks(client), TrainingOperator(client)
        operator = OperatorProcess(cluster)
        operator.start()
        try:
            strategies = [{"name": "single"}, {"name": "ddp"}, {"name": "fsdp"}, {"name": "horovod"}]
            benchmarks.create(benchmark("restart", strategies))
            first = wait_for(lambda: trainer.jobs("restart"), what="the first job")[0]
            trainer.start(first)
            trainer.succeed(first, 100.0)
            second = wait_for(lambda: len(jobs := trainer.jobs("restart")) == 2 and jobs[1], what="the second job")
            wait_for(lambda: operator.metric("gpt2bench_operator_runs_succeeded_total") == 1, what="a metric")
            assert operator.metric("gpt2bench_operator_runs_started_total") == 2
            assert operator.metric("gpt2bench_operator_job_creation_latency_seconds_count") == 1

            operator.kill()  # mid-sweep, no goodbye
            trainer.start(second)
            trainer.succeed(second, 300.0)  # finishes while no operator runs
            freed = operator.health_port
            with socket.socket() as taker:  # as another process may take the freed port before the restart
                taker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the probes' TIME_WAIT
                taker.bind(("127.0.0.1", freed))
                taker.listen()
                operator.start()
            assert operator.health_port != freed and "address already in use" in operator.log.read_text()

            for i in (2, 3):
                job = wait_for(lambda i=i: len(jobs := trainer.jobs("restart")) == i + 1 and jobs[i], what=f"job {i}")
                trainer.start(job)
                trainer.succeed(job, 100.0 + i)
            status = wait_for(lambda: (s := benchmarks.status("restart")).get("phase") == "Succeeded" and s,
                              what="Succeeded")
            assert [r["phase"] for r in status["runs"]] == ["Succeeded"] * 4
            assert status["best"]["strategy"] == "ddp"
            names = [r["name"] for r in status["runs"]]
            assert job_creations(cluster) == sorted(names), "every job created exactly once"
            assert [j["metadata"]["name"] for j in trainer.jobs("restart")] == names
            # the restarted process counts from zero: it saw runs 2-4 finish and started 3-4
            assert operator.metric("gpt2bench_operator_runs_succeeded_total") == 3
            assert operator.metric("gpt2bench_operator_runs_started_total") == 2
            assert operator.metric("gpt2bench_operator_reconcile_errors_total") == 0
            def events() -> list[str]:
                return [e["reason"] for e in benchmarks.events("restart")]

            # kopf posts Events from a queue of its own, after the status write the test saw: wait for the last
            wait_for(lambda: events().count("RunSucceeded") == 4, what="four RunSucceeded Events")
            assert events().count("SweepSucceeded") == 1
            info = {"namespace": "default", "benchmark": "restart", "objective": "fastest", "scale": "1×2 CPU",
                    "winner": "", "run": "restart-ddp-fp32-1x2", "strategy": "ddp", "precision": "fp32",
                    "decision": "needs-repeats"}
            assert info in operator.samples("gpt2bench_operator_recommendation_info")
            operator.stop()  # a restarted operator serves the finished benchmark's recommendation again
            operator.start()
            wait_for(lambda: info in operator.samples("gpt2bench_operator_recommendation_info"),
                     what="the recommendation after a restart")
        finally:
            code = operator.stop()
        assert code == 0, operator.log.read_text()[-3000:]


def test_events_a_crash_lost_are_posted_from_the_status_after_a_restart(tmp_path):
    """A run's Event is posted after the status write that records it; an operator killed between the two loses
    it (without recovery, 1 of 8 RunStarted/RunSucceeded went missing after 4 SIGKILLs). Here every Event POST fails
    while a run finishes, then the operator is killed: the restarted one posts what the status recorded and the
    benchmark's Events lack, once, saying so."""
    from kube.faults import FailCalls

    with EmulatedCluster(tmp_path / "kube") as cluster:
        install_crds(cluster)
        client = api_client(cluster)
        benchmarks, trainer = Benchmarks(client), TrainingOperator(client)
        operator = OperatorProcess(cluster)
        operator.start()
        try:
            benchmarks.create(benchmark("lost", [{"name": "single"}, {"name": "ddp"}]))
            first = wait_for(lambda: trainer.jobs("lost"), what="the first job")[0]
            wait_for(lambda: "RunStarted" in [e["reason"] for e in benchmarks.events("lost")], what="RunStarted")
            with FailCalls(503, times=10**6, method="POST", path=r"/namespaces/default/events$").install(cluster):
                trainer.start(first)
                trainer.succeed(first, 100.0)
                wait_for(lambda: len(trainer.jobs("lost")) == 2, what="the second job (the first recorded)")
                time.sleep(1.0)  # kopf tried to post the Events, and failed
                operator.kill()
            assert [e["reason"] for e in benchmarks.events("lost")].count("RunSucceeded") == 0, "lost"
            operator.start()
            second = trainer.jobs("lost")[1]
            trainer.start(second)
            trainer.succeed(second, 200.0)
            wait_for(lambda: benchmarks.status("lost").get("phase") == "Succeeded", what="Succeeded")
            # Events are posted from kopf's queue after the status write that records them: wait for the last one
            wait_for(lambda: (reasons := [e["reason"] for e in benchmarks.events("lost")]).count("RunSucceeded") == 2
                     and "SweepSucceeded" in reasons, what="both RunSucceeded and the SweepSucceeded")
            events = benchmarks.events("lost")
            reasons = [e["reason"] for e in events]
            assert reasons.count("RunStarted") == 2 and reasons.count("SweepSucceeded") == 1, reasons
            recovered = sorted(e["message"] for e in events if "posted after an operator restart" in e["message"])
            assert [m.split(" (posted")[0] for m in recovered] == [
                "lost-ddp-fp32-1x2: job lost-ddp-fp32-1x2 created", "lost-single-fp32-1x1: 100.0 tokens/s"], recovered
        finally:
            code = operator.stop()
        assert code == 0, operator.log.read_text()[-3000:]


def test_kopf_run_process_rejects_a_bad_spec_and_counts_no_reconcile_error(tmp_path):
    """The same handlers under plain `kopf run` (what `gpt2bench operator` wraps)."""
    with EmulatedCluster(tmp_path / "kube") as cluster:
        install_crds(cluster)
        port = free_port()
        env = env_for_subprocess(operator_env(cluster, poll_seconds=0.3, metrics_port=port))
        log = open(tmp_path / "kopf.log", "w")
        proc = subprocess.Popen([sys.executable, "-m", "kopf", "run", "--standalone", "-A", "-m",
                                 "gpt2bench.controller.handlers"], env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            benchmarks = Benchmarks(api_client(cluster))
            wait_for(lambda: OperatorProcess.get(f"http://127.0.0.1:{port}/metrics"), 60, what="/metrics")
            # a rule only the operator checks (the CRD states the others, and the API server refuses those)
            benchmarks.create(benchmark("bad", resources={"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}))
            status = wait_for(lambda: (s := benchmarks.status("bad")).get("phase") and s, what="a phase")
            assert status["phase"] == "Invalid" and "spec.resources.limits.cpu" in status["message"]
            time.sleep(1)  # a permanent error must not be retried or counted as ours
            text = OperatorProcess.get(f"http://127.0.0.1:{port}/metrics") or ""
            assert "gpt2bench_operator_reconcile_errors_total" not in text or \
                all(line.endswith(" 0.0") for line in text.splitlines()
                    if line.startswith("gpt2bench_operator_reconcile_errors_total"))
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(30)
            log.close()
        assert code == 0, (tmp_path / "kopf.log").read_text()[-3000:]


def test_a_failed_job_creation_is_counted_retried_and_the_sweep_goes_on(tmp_path):
    """An API error (injected with a kmock reaction) is a reconcile error: counted, retried by kopf."""
    import kmock

    with EmulatedCluster(tmp_path / "kube") as cluster:
        install_crds(cluster)
        attempts: list[object] = []

        def fail_once(request: kmock.Request) -> kmock.KubernetesError | None:
            attempts.append(request)
            if len(attempts) > 1:
                return None  # no answer: kmock goes on to the emulator's own handling
            # an exception, not a Response: kmock 0.8 keeps a returned Response's status for later calls
            return kmock.KubernetesError(status=500, reason="InternalError", message="injected")

        cluster.call(lambda emulator: emulator["post /apis/kubeflow.org/v1/namespaces/default/pytorchjobs"]
                     << fail_once)
        client = api_client(cluster)
        benchmarks, trainer = Benchmarks(client), TrainingOperator(client)
        operator = OperatorProcess(cluster)
        operator.start()
        try:
            benchmarks.create(benchmark("retried", [{"name": "single"}]))
            job = wait_for(lambda: trainer.jobs("retried"), 60, what="the job, after kopf's retry")[0]
            assert len(attempts) == 2
            assert operator.metric("gpt2bench_operator_reconcile_errors_total") == 1
            trainer.start(job)
            trainer.succeed(job, 5.0)
            wait_for(lambda: benchmarks.status("retried").get("phase") == "Succeeded", what="Succeeded")
        finally:
            assert operator.stop() == 0


def test_without_the_kubeflow_crds_every_run_fails_at_once_saying_what_to_install(tmp_path):
    with EmulatedCluster(tmp_path / "kube") as cluster:
        cluster.kubectl("apply", "-f", str(REPO / "manifests" / "crd.yaml"))  # no Kubeflow CRDs
        benchmarks = Benchmarks(api_client(cluster))
        operator = OperatorProcess(cluster)
        operator.start()
        try:
            # the v1 jobs asked for by name (`auto` would pick TrainJob here and say to install Trainer v2:
            # tests/test_operator_refusals.py)
            benchmarks.create(benchmark("early", [{"name": "single"}, {"name": "ddp"}, {"name": "horovod"}],
                                        backend="pytorchjob"))
            status = wait_for(lambda: (s := benchmarks.status("early")).get("phase") == "Failed" and s,
                              what="the sweep Failed, every run with its reason")
            reasons = {r["jobKind"]: r["reason"] for r in status["runs"]}
            assert "CRD pytorchjobs.kubeflow.org has no v1" in reasons["PyTorchJob"]
            assert "install the Kubeflow training operator" in reasons["PyTorchJob"]
            assert "install the Kubeflow MPI operator v0.8" in reasons["MPIJob"]
            # an Event per run (grouped only from 4 runs with one reason); posted after the status write
            events = wait_for(lambda: len(e := [e for e in benchmarks.events("early")
                                                 if e["reason"] == "RunFailed"]) >= 3 and e, what="3 RunFailed")
            assert len(events) == 3 and all("not served" in e["message"] for e in events)
            assert operator.metric("gpt2bench_operator_reconcile_errors_total") == 0, "the cluster's, not ours"
        finally:
            assert operator.stop() == 0


def test_job_events_start_the_next_run_within_a_second_of_the_previous_one_ending(tmp_path):
    """The timer is a safety net only (--poll-interval 60: it never fires here): each job's terminal
    condition, seen through the watch, creates the next job. Gap: the test's status write that finishes a
    job -> the emulator's creation of the next one."""
    import statistics

    with EmulatedCluster(tmp_path / "kube") as cluster:
        install_crds(cluster)
        client = api_client(cluster)
        benchmarks, trainer = Benchmarks(client), TrainingOperator(client)
        operator = OperatorProcess(cluster, poll_seconds=60)
        operator.start()
        try:
            strategies = [{"name": "single"}, {"name": "ddp"}, {"name": "fsdp"}, {"name": "horovod"}]
            benchmarks.create(benchmark("eager", strategies, sweep={
                "strategies": strategies, "precisions": ["fp32", "bf16"],
                "scales": [{"nodes": 1, "processesPerNode": 2}]}))
            gaps, finished = [], 0.0
            for i in range(8):
                job = wait_for(lambda i=i: len(jobs := trainer.jobs("eager")) == i + 1 and jobs[i], 30,
                               what=f"job {i} (the timer would take 60 s)")
                if i:
                    created = cluster.call(lambda e, job=job: e.created_at[(
                        next(r for r in e.resources if r.plural == job["kind"].lower() + "s"
                             and r.version == job["apiVersion"].split("/")[1]), "default", job["metadata"]["name"])])
                    gaps.append(created - finished)
                trainer.start(job)
                trainer.succeed(job, 100.0 + i)
                finished = time.time()
            wait_for(lambda: benchmarks.status("eager").get("phase") == "Succeeded", 30, what="Succeeded")
            assert statistics.median(gaps) < 1.0, gaps
            assert max(gaps) < 5.0, gaps  # generous: a shared 2-core machine
        finally:
            assert operator.stop() == 0
