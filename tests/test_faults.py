"""Fault injection, measured (docs/reliability.md): the real `gpt2bench operator` process against the API
emulator, the test playing the Kubeflow training operator (tests/kube/training.py) and the user.

One emulator and one operator process for the module (the SIGKILL test kills and restarts that process);
every fault is drawn from a fixed seed. Each test adds its figures to one JSON document, written at the end
of the session to $GPT2BENCH_FAULTS_JSON when set (docs/reliability.md's table comes from it) and printed
(tests/fault_figures.py).
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fault_figures
import kubernetes
import psutil
import pytest
import yaml
from kube import EmulatedCluster
from kube.faults import OWN_CLIENT, ApiFaults, FailCalls, Hang
from kube.fixtures import (
    GROUP,
    PLURAL,
    VERSION,
    Benchmarks,
    api_client,
    benchmark,
    install_crds,
    run_entry,
    wait_for,
)
from kube.training import TrainingOperator
from test_operator_process import OperatorProcess, job_creations

from gpt2bench.local import sweep as local_sweep
from gpt2bench.local.replicas import free_port
from gpt2bench.plan import plan_runs
from gpt2bench.render import render_job
from gpt2bench.specification.validation import load_benchmark_file

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.timeout(240)]

SEED = 20
KILLS = 20
POLL_SECONDS = 0.5
SIX_RUNS = {"strategies": [{"name": "single"}, {"name": "ddp"}, {"name": "fsdp"}],
            "precisions": ["fp32", "bf16"], "scales": [{"nodes": 1, "devicesPerNode": 0, "processesPerNode": 2}]}
REPO = Path(__file__).resolve().parents[1]
FIGURES = fault_figures.FIGURES  # written at the end of the session (tests/conftest.py)


@dataclass
class Env:
    cluster: EmulatedCluster
    benchmarks: Benchmarks
    trainer: TrainingOperator
    operator: OperatorProcess


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    with EmulatedCluster(tmp_path_factory.mktemp("faults") / "kube") as cluster:
        install_crds(cluster)
        client = api_client(cluster)
        operator = OperatorProcess(cluster, poll_seconds=POLL_SECONDS)
        operator.start()
        try:
            yield Env(cluster, Benchmarks(client), TrainingOperator(client, cluster=cluster), operator)
        finally:
            code = operator.stop()
        assert code == 0, operator.log.read_text()[-3000:]


def terminal(job: dict[str, Any]) -> bool:
    return any(c["type"] in ("Succeeded", "Failed") and c["status"] == "True"
               for c in (job.get("status") or {}).get("conditions") or [])


def finish_one(env: Env, name: str, tokens_per_second: dict[str, float]) -> bool:
    """Play the training operator for one unfinished job of `name`: Running, then Succeeded with its
    figure. False when no job waits."""
    for job in env.trainer.jobs(name):
        if not terminal(job):
            env.trainer.start(job)
            env.trainer.succeed(job, tokens_per_second[job["metadata"]["name"]])
            return True
    return False


def drive(env: Env, name: str, tokens_per_second: dict[str, float], timeout: float = 60) -> dict[str, Any]:
    """Finish every job the operator creates until the sweep has a final phase; its status."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = env.benchmarks.status(name)
        if status.get("phase") not in (None, "Pending", "Running"):
            return status
        if not finish_one(env, name, tokens_per_second):
            time.sleep(0.1)
    raise AssertionError(f"{name} did not finish in {timeout} s: {env.benchmarks.status(name).get('message')}")


def figures_of(name: str, runs: int) -> dict[str, float]:
    """A distinct tokens/s per run, so that a result read twice, lost or swapped shows."""
    plan = [f"{name}-{s}-{p}-{'1x1' if s == 'single' else '1x2'}" for s in ("single", "ddp", "fsdp")
            for p in ("fp32", "bf16")][:runs]
    return {run: 100.0 + 7 * i for i, run in enumerate(plan)}


def check_results(status: dict[str, Any], expected: dict[str, float]) -> None:
    got = {r["name"]: (r.get("results") or {}).get("tokensPerSecond") for r in status["runs"]}
    assert got == expected, "every finished result kept, as the trainer reported it"
    assert status["best"]["run"] == max(expected, key=expected.get)


def duplicates(env: Env, name: str) -> int:
    created = [job for job in job_creations(env.cluster) if job.startswith(f"{name}-")]
    return len(created) - len(set(created))


# --- 1. the operator process SIGKILLed at random points of a sweep --------------------------------------


def test_sigkill_at_seeded_random_points_loses_no_result_and_creates_no_job_twice(env):
    rng = random.Random(SEED)
    name, kills, restart_seconds = "killed", 0, []
    expected = figures_of(name, 6)
    env.benchmarks.create(benchmark(name, sweep=SIX_RUNS))
    finished_while_up = finished_while_down = 0
    while kills < KILLS:
        if env.operator.proc is None or env.operator.proc.poll() is not None:
            started = time.monotonic()
            env.operator.start()
            restart_seconds.append(time.monotonic() - started)
        if rng.random() < 0.3:  # killed while it resumes: lists, reads status, starts its timers
            time.sleep(rng.uniform(0.0, 0.5))
        else:  # killed while it reacts to a job's end (collects, writes status, creates the next), or after
            waiting = wait_for(lambda: [j for j in env.trainer.jobs(name) if not terminal(j)] or
                               env.benchmarks.status(name).get("phase") != "Running", 10, what="a job to finish")
            if isinstance(waiting, list) and rng.random() < 0.5 and finish_one(env, name, expected):
                finished_while_up += 1
            time.sleep(rng.uniform(0.0, 0.5))
        env.operator.kill()
        kills += 1
        if rng.random() < 0.15 and finish_one(env, name, expected):  # a job ends while no operator runs
            finished_while_down += 1
    env.operator.start()
    status = drive(env, name, expected)

    assert status["phase"] == "Succeeded" and [r["phase"] for r in status["runs"]] == ["Succeeded"] * 6
    check_results(status, expected)
    assert duplicates(env, name) == 0, job_creations(env.cluster)
    FIGURES["sigkill"] = {"injected": kills, "runs": 6, "runs_lost": 6 - len([r for r in status["runs"]
                                                                             if r.get("results")]),
                          "runs_twice": duplicates(env, name), "final_phase": status["phase"],
                          "restart_to_healthz_seconds_max": round(max(restart_seconds), 2),
                          "restart_to_healthz_seconds_mean": round(sum(restart_seconds) / len(restart_seconds), 2),
                          "jobs_finished_while_operator_up": finished_while_up,
                          "jobs_finished_while_operator_down": finished_while_down}


# --- 2. an unreliable API server --------------------------------------------------------------------------


def test_api_errors_and_dropped_watches_leave_the_sweep_complete_with_every_status_patch(env):
    name, expected = "flaky", figures_of("flaky", 6)
    faults = ApiFaults(seed=SEED, share=0.15, watch_seconds=2.0, gone_share=0.5)
    faults.install(env.cluster)
    try:
        env.benchmarks.create(benchmark(name, sweep=SIX_RUNS))
        started = time.monotonic()
        status = drive(env, name, expected, timeout=90)
        took = time.monotonic() - started
    finally:
        faults.uninstall(env.cluster)

    assert status["phase"] == "Succeeded"
    check_results(status, expected)  # each run's entry, written by a status patch, is there
    assert status["runsDone"] == 6 and status["runsSucceeded"] == 6
    assert duplicates(env, name) == 0
    for code in ("429", "500", "503", "409", "watch-cut", "410"):
        assert faults.injected[code] > 0, f"{code} was never injected: {dict(faults.injected)}"
    longest = faults.longest_recovery()
    assert longest < 30, f"a failed call waited {longest:.1f} s for its next success"
    FIGURES["api-errors"] = {"injected": {k: faults.injected[k] for k in sorted(faults.injected)},
                             "operator_calls": len(faults.calls), "share": faults.share, "runs": 6,
                             "runs_lost": sum(1 for r in status["runs"] if not r.get("results")), "runs_twice": duplicates(env, name), "final_phase": status["phase"],
                             "longest_failure_to_success_seconds": round(longest, 2),
                             "sweep_seconds": round(took, 1)}


# --- 3./4. jobs and pods gone, evicted, stuck; a hanging rank on the cluster -----------------------------


def test_deleted_job_evicted_pod_lost_node_and_hanging_rank_fail_their_runs_with_the_reason(env):
    name = "hurt"
    expected = figures_of(name, 6)
    env.benchmarks.create(benchmark(name, sweep=SIX_RUNS, runPolicy={"activeDeadlineSeconds": 2}))

    seen: set[str] = set()

    def next_job(i: int) -> dict[str, Any]:
        job = wait_for(lambda: next((j for j in env.trainer.jobs(name) if j["metadata"]["name"] not in seen), None),
                       20, what=f"job {i}")
        seen.add(job["metadata"]["name"])
        return job

    def failed_run(i: int) -> dict[str, Any]:
        return wait_for(lambda: (r := run_entry(env.benchmarks.status(name), i)).get("phase") == "Failed" and r, 20,
                        what=f"run {i} Failed")

    job = next_job(0)  # deleted by someone else while it runs (its pods go with it: the garbage collector)
    env.trainer.start(job)
    env.trainer.running_pod(job)
    env.trainer.custom.delete_namespaced_custom_object("kubeflow.org", "v1", "default", "pytorchjobs",
                                                       job["metadata"]["name"])
    assert "was deleted before its results were read" in failed_run(0)["reason"]

    job = next_job(1)  # its pod evicted by the kubelet (node pressure)
    env.trainer.start(job)
    env.trainer.evict(job, "The node was low on resource: memory.")
    evicted = failed_run(1)["reason"]
    assert "Evicted: The node was low on resource: memory." in evicted and "1 Master replica(s) failed" in evicted

    job = next_job(2)  # its node gone: the pod stays Terminating; the job ends at its deadline
    env.trainer.start(job)
    pod = env.trainer.lose_node(job)
    wait_for(lambda: env.trainer.past_deadline(job), 5, what="the deadline")
    env.trainer.exceed_deadline(job)
    lost = failed_run(2)["reason"]
    assert "active longer than specified deadline" in lost and f"pod {pod} stuck Terminating" in lost

    job = next_job(3)  # a rank that hangs: alive, no progress, until the deadline
    env.trainer.start(job)
    env.trainer.running_pod(job)
    wait_for(lambda: env.trainer.past_deadline(job), 5, what="the deadline")
    env.trainer.exceed_deadline(job)
    assert "active longer than specified deadline" in failed_run(3)["reason"]

    status = drive(env, name, expected)  # the sweep went on: the last two runs
    assert status["phase"] == "PartiallySucceeded"
    assert [r["phase"] for r in status["runs"]] == ["Failed"] * 4 + ["Succeeded"] * 2
    assert duplicates(env, name) == 0
    env.trainer.core.patch_namespaced_pod(pod, "default", {"metadata": {"finalizers": None}})  # node back
    FIGURES["job-deleted"] = {"injected": 1, "runs_lost": 0, "runs_twice": 0, "final_phase": "Failed",
                              "reason": failed_run(0)["reason"]}
    FIGURES["pod-evicted"] = {"injected": 1, "runs_lost": 0, "runs_twice": 0, "final_phase": "Failed",
                              "reason": evicted}
    FIGURES["node-lost"] = {"injected": 1, "runs_lost": 0, "runs_twice": 0, "final_phase": "Failed",
                            "reason": lost}
    FIGURES["rank-hangs-cluster"] = {"injected": 1, "runs_lost": 0, "runs_twice": 0, "final_phase": "Failed",
                                     "reason": failed_run(3)["reason"], "activeDeadlineSeconds": 2}


def test_rendered_jobs_bound_the_process_group_timeout_below_the_deadline():
    """A rank that hangs holds its peers in a collective: the trainer's process group gives up after
    --timeout-seconds (passed to every rendered job), well before the default deadline."""
    bench = load_benchmark_file(str(REPO / "manifests" / "examples" / "cpu-sweep.yaml"))
    for run in plan_runs(bench):
        job = render_job(bench, run)
        text = json.dumps(job)
        command = _trainer_command(job)
        timeout = float(command[command.index("--timeout-seconds") + 1])
        deadline = json.loads(text)["spec"].get("runPolicy", {}).get("activeDeadlineSeconds")
        assert 0 < timeout < deadline, (run.name, timeout, deadline)


def _trainer_command(job: dict[str, Any]) -> list[str]:
    def containers(node: Any) -> list[list[str]]:
        if isinstance(node, dict):
            found = [node["command"]] if "command" in node and "gpt2bench" in node["command"] else []
            return found + [c for v in node.values() for c in containers(v)]
        if isinstance(node, list):
            return [c for v in node for c in containers(v)]
        return []
    return containers(job)[0]


# --- 4. a hanging rank, locally, with the real trainer ----------------------------------------------------


@pytest.mark.parametrize("deadline, timeout, expected", [
    (12, 300, "DeadlineExceeded: ran longer than activeDeadlineSeconds=12"),
    (120, 4, "Timed out waiting 4000ms"),
])
def test_a_hanging_rank_ends_its_local_run_at_the_deadline_or_the_process_group_timeout(
        tmp_path, deadline, timeout, expected, sweeps_forked):
    document = yaml.safe_load((REPO / "manifests" / "examples" / "cpu-sweep.yaml").read_text())
    document["spec"].setdefault("metrics", {})["port"] = free_port()
    document["spec"]["sweep"]["repeats"] = 1
    for key in ("maxRepeats", "minEffect", "budget"):  # one round, none added until decided
        document["spec"]["sweep"].pop(key, None)
    document["spec"]["runPolicy"] = {"activeDeadlineSeconds": deadline}
    path = tmp_path / "hang.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    bench = local_sweep.with_steps(load_benchmark_file(str(path)), 3)
    runs = local_sweep.select_runs(plan_runs(bench), r"-ddp-fp32-1x2$")
    job = render_job(bench, runs[0])
    command = _trainer_command(job)
    command[command.index("--timeout-seconds") + 1] = str(timeout)
    command += ["--hang-at-step", "2"]
    started = time.monotonic()
    doc = local_sweep.run_sweep(bench, runs[:1], tmp_path / "out", jobs=[job], live=False).doc.dump()
    took = time.monotonic() - started
    (run,) = doc["runs"]
    assert run["phase"] == "Failed" and expected.lower() in run["reason"].lower(), run["reason"]
    assert took < min(deadline, timeout) + 45, f"{took:.0f} s"
    FIGURES[f"rank-hangs-local-{'deadline' if deadline < timeout else 'pg-timeout'}"] = {
        "injected": 1, "runs_lost": 0, "runs_twice": 0, "final_phase": run["phase"],
        "activeDeadlineSeconds": deadline, "timeout_seconds": timeout, "run_seconds": round(took, 1),
        "reason": run["reason"][:200]}


# --- 5. the GPT2Benchmark deleted mid-run, its spec edited mid-sweep -------------------------------------


def test_a_benchmark_deleted_mid_run_takes_its_jobs_and_pods_with_it(env):
    name = "dropped"
    env.benchmarks.create(benchmark(name, sweep=SIX_RUNS))
    job = wait_for(lambda: env.trainer.jobs(name), 20, what="the first job")[0]
    env.trainer.start(job)
    pod = env.trainer.running_pod(job)["name"]
    env.benchmarks.delete(name)
    wait_for(lambda: not env.benchmarks.exists(name), 20, what="the benchmark gone (kopf's finalizer removed)")
    assert env.trainer.jobs(name) == [], "no orphan job"
    with pytest.raises(kubernetes.client.ApiException) as gone:
        env.trainer.core.read_namespaced_pod(pod, "default")
    assert gone.value.status == 404, "the job's pod went with it"
    time.sleep(2 * POLL_SECONDS)
    assert env.trainer.jobs(name) == [], "and nothing was created after"
    FIGURES["benchmark-deleted"] = {"injected": 1, "runs_lost": 0, "runs_twice": duplicates(env, name),
                                    "final_phase": "deleted", "orphan_jobs": 0}


def test_a_benchmark_is_deleted_while_no_operator_runs_and_its_jobs_go_with_it(env):
    """Before the fix: kopf held a finalizer on every running benchmark (for its per-benchmark timer), so with
    no operator (`operator.replicas: 0`, a crash loop, after `helm uninstall`) `kubectl delete` hung, the jobs kept
    their GPUs and the namespace stayed Terminating. Now no handler needs a finalizer: the API server deletes the
    benchmark at once and its garbage collector the jobs it owns."""
    name = "no-operator"
    env.benchmarks.create(benchmark(name, sweep=SIX_RUNS))
    job = wait_for(lambda: env.trainer.jobs(name), 20, what="the first job")[0]
    env.trainer.start(job)
    wait_for(lambda: run_entry(env.benchmarks.status(name), 0).get("phase") == "Running", 20, what="Running")
    time.sleep(1.0)  # kopf acts on the Running status's event within milliseconds (an earlier one added a finalizer)
    assert not env.benchmarks.get(name)["metadata"].get("finalizers"), "no finalizer while it runs"
    env.operator.stop()
    try:
        started = time.monotonic()
        deleted = env.cluster.kubectl("delete", "gpt2benchmark", name, "--timeout=20s", check=False)
        took = time.monotonic() - started
        assert deleted.returncode == 0, deleted.stderr
        assert not env.benchmarks.exists(name) and env.trainer.jobs(name) == [], "its jobs went with it (GC)"
    finally:
        env.operator.start()
    FIGURES["benchmark-deleted-no-operator"] = {"injected": 1, "runs_lost": 0, "runs_twice": 0,
                                                "final_phase": "deleted", "kubectl_delete_seconds": round(took, 1),
                                                "orphan_jobs": 0}


def test_a_benchmark_deleted_while_its_poll_runs_is_gone_within_seconds(env):
    """kopf keeps its finalizer until the benchmark's timer has stopped. A poll (the timer's handler, in a
    thread) still running at deletion is re-checked only every `cancellation_polling` seconds (kopf's default:
    60 s, so `kubectl delete` hung that long); the operator re-checks every second."""
    from kube.faults import is_operator

    name, slow = "dropped-mid-poll", 2.0
    env.benchmarks.create(benchmark(name, sweep=SIX_RUNS))
    job = wait_for(lambda: env.trainer.jobs(name), 20, what="the first job")[0]
    env.trainer.start(job)
    time.sleep(1.0)  # the job's own events handled: the next list of jobs is the timer's poll
    polling = threading.Event()

    def slow_job_lists(request) -> float | None:
        method = getattr(request.method, "name", str(request.method))
        if is_operator(request) and request.resource is not None and request.resource.plural == "pytorchjobs" \
                and method == "GET":
            polling.set()
            return slow
        return None

    env.cluster.call(lambda emulator: emulator.faults.append(slow_job_lists))
    try:
        assert polling.wait(10), "the timer did not poll"
        env.benchmarks.delete(name)  # while the poll waits for its answer
        deleted = time.monotonic()
        wait_for(lambda: not env.benchmarks.exists(name), 15, what="the benchmark gone")
        took = time.monotonic() - deleted
    finally:
        env.cluster.call(lambda emulator: emulator.faults.remove(slow_job_lists))
    assert took < slow + 5, f"{took:.1f} s"
    assert env.trainer.jobs(name) == [], "no orphan job"
    FIGURES["benchmark-deleted-mid-poll"] = {"injected": 1, "runs_lost": 0, "runs_twice": duplicates(env, name),
                                             "final_phase": "deleted", "seconds_to_gone": round(took, 1)}


def test_a_benchmark_deleted_while_a_job_event_is_handled_gets_no_job_after(env):
    """A job's event starts a step; the benchmark is deleted while the step waits for its list of jobs (answered
    2 s late, after the garbage collector took the job). The step then saw its run's job gone and started the
    next run: a job owned by nothing (a real garbage collector deletes it; the emulator's only collects at the
    owner's deletion). The timer is off (60 s), so no poll holds kopf's finalizer meanwhile."""
    from kube.faults import is_operator

    env.operator.stop()
    env.operator.poll_seconds = 60.0
    env.operator.start()
    name, slow = "dropped-mid-event", 2.0
    listing = threading.Event()

    def slow_job_lists(request) -> float | None:
        method = getattr(request.method, "name", str(request.method))
        if is_operator(request) and request.resource is not None and request.resource.plural == "pytorchjobs" \
                and method == "GET" and request.name is None:
            listing.set()
            return slow
        return None

    try:
        env.benchmarks.create(benchmark(name))
        job = wait_for(lambda: env.trainer.jobs(name), 20, what="the first job")[0]
        env.cluster.call(lambda emulator: emulator.faults.append(slow_job_lists))
        env.trainer.start(job)  # its event: a step, whose list of jobs is answered late
        assert listing.wait(10), "the job event's step did not list the jobs"
        env.benchmarks.delete(name)
        wait_for(lambda: not env.benchmarks.exists(name), 15, what="the benchmark gone")
        time.sleep(slow + 1)
        created = [j for j in job_creations(env.cluster) if j.startswith(f"{name}-")]
    finally:
        env.cluster.call(lambda emulator: slow_job_lists in emulator.faults and emulator.faults.remove(slow_job_lists))
        env.operator.stop()
        env.operator.poll_seconds = POLL_SECONDS
        env.operator.start()
    assert created == [job["metadata"]["name"]], f"jobs created: {created}"
    assert env.trainer.jobs(name) == []
    FIGURES["benchmark-deleted-mid-event"] = {"injected": 1, "runs_lost": 0, "runs_twice": 0,
                                              "final_phase": "deleted", "jobs_created_after": len(created) - 1}


def test_a_spec_edited_mid_sweep_is_ignored_for_that_sweep_as_documented(env):
    """docs/operator.md: a started sweep keeps the spec pinned at start; SpecChangeIgnored says so."""
    name, expected = "edited", figures_of("edited", 6)
    env.benchmarks.create(benchmark(name, sweep=SIX_RUNS))
    finish_one_when = wait_for(lambda: env.trainer.jobs(name), 20, what="the first job")
    assert finish_one_when
    finish_one(env, name, expected)
    env.benchmarks.patch_spec(name, {"sweep": {**SIX_RUNS, "strategies": [{"name": "single"}]},
                                     "training": {"steps": 8, "warmupSteps": 1, "seqLen": 32}})
    status = drive(env, name, expected)
    assert status["phase"] == "Succeeded" and len(status["runs"]) == 6, "the pinned spec's six runs"
    check_results(status, expected)
    assert status["observedGeneration"] == 1
    ignored = next(c for c in status["conditions"] if c["type"] == "SpecChangeIgnored")
    assert ignored["status"] == "True" and "generation 2" in ignored["message"]
    FIGURES["spec-edited"] = {"injected": 1, "runs_lost": sum(1 for r in status["runs"] if not r.get("results")), "runs_twice": duplicates(env, name),
                              "final_phase": status["phase"], "rule": "ignored for the started sweep"}


# --- 6. fifty GPT2Benchmarks at once ----------------------------------------------------------------------


def test_fifty_benchmarks_at_once_all_complete_one_run_at_a_time_with_bounded_memory(env):
    count, names = 50, [f"many-{i:02d}" for i in range(50)]
    two_runs = {"strategies": [{"name": "single"}, {"name": "ddp"}],
                "scales": [{"nodes": 1, "devicesPerNode": 0, "processesPerNode": 2}]}
    env.operator.stop()  # job events drive the sweeps; a slower safety-net timer keeps 50 sweeps from
    env.operator.poll_seconds = 5.0  # polling the emulator 100 times a second (the test's own load)
    env.operator.start()
    process = psutil.Process(env.operator.proc.pid)
    peak, stop = [process.memory_info().rss], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                peak.append(process.memory_info().rss)
            except psutil.Error:
                return
            stop.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.monotonic()
    for name in names:
        env.benchmarks.create(benchmark(name, sweep=two_runs))
    most_at_once, deadline = 0, time.monotonic() + 120
    while time.monotonic() < deadline:
        jobs = env.trainer.jobs()
        active: dict[str, int] = {}
        for job in jobs:
            owner = job["metadata"]["labels"]["gpt2bench.io/benchmark"]
            if owner in names and not terminal(job):
                active[owner] = active.get(owner, 0) + 1
        most_at_once = max([most_at_once, *active.values()])
        for job in jobs:
            owner = job["metadata"]["labels"]["gpt2bench.io/benchmark"]
            if owner in names and not terminal(job):
                env.trainer.start(job)
                env.trainer.succeed(job, 100.0)
        if all(p == "Succeeded" for p in phases_of(env, names)):
            break
        time.sleep(0.2)
    took = time.monotonic() - started
    cpu = process.cpu_times()
    print(f"fifty: operator cpu {cpu.user + cpu.system:.1f} s, test process cpu "
          f"{sum(psutil.Process().cpu_times()[:2]):.1f} s, wall {took:.1f} s")
    stop.set()
    sampler.join(5)
    env.operator.stop()
    env.operator.poll_seconds = POLL_SECONDS
    env.operator.start()
    phases = phases_of(env, names)
    assert phases.count("Succeeded") == count, phases
    assert most_at_once == 1, "concurrency 1 (the default): one run at a time per benchmark"
    assert sum(duplicates(env, n) for n in names) == 0
    peak_mib = max(peak) / 2**20
    limit_mib = chart_memory_limit_mib()
    assert peak_mib < limit_mib, f"operator RSS peak {peak_mib:.0f} MiB, over the chart's limit {limit_mib:g} MiB"
    FIGURES["fifty-benchmarks"] = {"injected": count, "runs": 2 * count, "runs_lost": 0, "runs_twice": 0,
                                   "final_phase": "Succeeded", "most_runs_at_once_per_benchmark": most_at_once,
                                   "operator_rss_peak_mib": round(peak_mib, 1), "chart_limit_mib": limit_mib,
                                   "operator_rss_start_mib": round(peak[0] / 2**20, 1),
                                   "seconds": round(took, 1)}


def chart_memory_limit_mib() -> float:
    """The operator's memory limit as the Helm chart sets it (values.yaml: operator.resources.limits.memory), in
    MiB: what the kubelet would OOM-kill it at, so what the memory tests hold it to (they
    allowed 400 MiB against a 256 MiB limit)."""
    from gpt2bench.specification.kubesyntax import quantity_value

    values = yaml.safe_load((REPO / "helm" / "gpt2bench" / "values.yaml").read_text())
    return float(quantity_value(values["operator"]["resources"]["limits"]["memory"])) / 2**20


def phases_of(env: Env, names: list[str]) -> list[str | None]:
    """The phases of these benchmarks, in one list call (50 GETs a loop would load the emulator more than
    the operator does)."""
    listed = env.benchmarks.api.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)
    phases = {item["metadata"]["name"]: (item.get("status") or {}).get("phase") for item in listed["items"]}
    return [phases.get(name) for name in names]


# --- 7. a start that meets API errors, through an operator restart ----------------------------------------

DISCOVERY = r"^/apis/[^/]+/[^/]+$"  # the operator's discovery of the job kinds (backend auto)


def two_runs(name: str) -> dict[str, float]:
    return {f"{name}-single-fp32-1x1": 100.0, f"{name}-ddp-fp32-1x2": 107.0}


def test_a_fixed_spec_whose_start_meets_errors_through_an_operator_restart_starts_once_they_stop(env):
    """As reported: an Invalid spec is fixed, the start meets 403s (discovery), the operator
    is restarted meanwhile. It was Pending for ever (a false SpecChangeIgnored, no job); now it waits Pending,
    saying why, and starts when the API server answers."""
    name, expected = "refixed", two_runs("refixed")
    env.benchmarks.create(benchmark(name, resources={"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}))
    wait_for(lambda: env.benchmarks.status(name).get("phase") == "Invalid", 20, what="Invalid")
    forbidden = FailCalls(403, times=10**6, method="GET", path=DISCOVERY, agents=OWN_CLIENT).install(env.cluster)
    try:
        env.benchmarks.patch_spec(name, {"resources": {"limits": {"cpu": "2"}}})
        pending = wait_for(lambda: (s := env.benchmarks.status(name)).get("phase") == "Pending" and s, 20,
                           what="Pending")
        # kopf posts Events from a queue after the status is written: killed before it drains, the Event is
        # lost (Events are best effort; the status says why). This test is about the restart, so it waits.
        wait_for(lambda: "SweepNotStarted" in [e["reason"] for e in env.benchmarks.events(name)], 20,
                 what="the SweepNotStarted Event")
        env.operator.kill()
        env.operator.start()
        tried = forbidden.hits
        wait_for(lambda: forbidden.hits > tried, 20, what="the restarted operator trying again")
        assert env.benchmarks.status(name).get("phase") == "Pending" and env.trainer.jobs(name) == []
    finally:
        forbidden.uninstall()
    healed = time.monotonic()
    status = drive(env, name, expected)
    assert status["phase"] == "Succeeded" and status["observedGeneration"] == 2
    check_results(status, expected)
    events = [e["reason"] for e in env.benchmarks.events(name)]
    assert "SpecChangeIgnored" not in events and events.count("SweepNotStarted") == 1, events
    FIGURES["start-meets-errors-restart"] = {
        "injected": forbidden.hits, "operator_restarts": 1, "runs_lost": 0, "runs_twice": duplicates(env, name),
        "final_phase": status["phase"], "pending_message": pending["message"][:160],
        "healed_to_succeeded_seconds": round(time.monotonic() - healed, 1)}


# --- 8. an API server that never answers, or never stops answering ----------------------------------------


# How long a test waits for a sweep's first job from an operator restarted with `--api-timeout 1`: on a loaded
# machine its calls time out and are retried, and a CI run with the machine shared saw 20 s pass (the wait is not
# what those tests check; an idle machine creates it in about a second).
FIRST_JOB_SECONDS_UNDER_1S_API_TIMEOUT = 60


def restart_operator(env: Env, api_timeout: float | None, workers: int | None = None) -> None:
    env.operator.stop()
    env.operator.extra_args = ["--api-timeout", str(api_timeout)] if api_timeout else []
    env.operator.env = {"GPT2BENCH_OPERATOR_WORKERS": str(workers)} if workers else {}
    env.operator.start()


def test_requests_the_api_server_never_answers_hold_no_sweep_and_no_worker(env):
    """The API server accepts the operator's connection and reads its request, and never answers (a half-open
    connection): six of one benchmark's reads. Each ends at the read timeout (1 s here), the sweep goes on
    while they are still held, the other benchmark is not delayed (2 worker threads only), and /healthz stays
    green (the calls end within their bound). Without timeouts the first one held its sweep for ever."""
    restart_operator(env, api_timeout=1, workers=2)
    held, other = "unanswered", "bystander"
    hang = Hang(times=6, method="GET", path=rf"/gpt2benchmarks/{held}$", agents=OWN_CLIENT)
    codes: set[int] = set()
    try:
        for name in (held, other):
            env.benchmarks.create(benchmark(name))
            wait_for(lambda name=name: env.trainer.jobs(name), FIRST_JOB_SECONDS_UNDER_1S_API_TIMEOUT,
                     what=f"the first job of {name}")
        hang.install(env.cluster)
        started = time.monotonic()
        deadline, done = started + 60, {}
        while len(done) < 2 and time.monotonic() < deadline:
            codes.add(env.operator.health()[0])
            for name in (held, other):
                if name not in done and env.benchmarks.status(name).get("phase") == "Succeeded":
                    done[name] = time.monotonic() - started
                if name not in done:
                    finish_one(env, name, two_runs(name))
            time.sleep(0.2)
        assert set(done) == {held, other}, f"finished: {done}; held calls: {hang.hits}"
        assert hang.hits == 6, "every never-answered call was met, and the sweep went on past them"
    finally:
        hang.release()
        restart_operator(env, api_timeout=None)
    assert 500 not in codes and 200 in codes, f"/healthz answered {codes} (0: not within 5 s, the machine's load)"
    for name in (held, other):
        check_results(env.benchmarks.status(name), two_runs(name))
        assert duplicates(env, name) == 0
    FIGURES["api-never-answers"] = {"injected": hang.hits, "api_timeout_seconds": 1, "workers": 2, "runs_lost": 0,
                                    "runs_twice": 0, "final_phase": "Succeeded",
                                    "held_sweep_seconds": round(done[held], 1),
                                    "other_sweep_seconds": round(done[other], 1), "healthz": sorted(codes)}


def test_an_answer_that_never_ends_fails_the_liveness_probe_until_it_ends(env):
    """An answer that trickles in (a byte every 0.2 s) passes every read timeout: the call never ends, and its
    benchmark waits. /healthz fails once the call has outlived its bound (apiclient.Timeouts.call_limit), so
    the kubelet restarts the operator; it is green again once the call ends, and the sweep goes on."""
    from gpt2bench.controller.apiclient import Timeouts

    restart_operator(env, api_timeout=1)
    name, expected = "trickled", two_runs("trickled")
    limit = Timeouts.of(1).call_limit
    trickle = Hang(times=1, trickle=True, method="GET", path=rf"/gpt2benchmarks/{name}$", agents=OWN_CLIENT)
    try:
        env.benchmarks.create(benchmark(name))
        job = wait_for(lambda: env.trainer.jobs(name), FIRST_JOB_SECONDS_UNDER_1S_API_TIMEOUT, what="the first job")[0]
        trickle.install(env.cluster)
        env.trainer.start(job)  # its event: a step, whose first read trickles
        env.trainer.succeed(job, expected[job["metadata"]["name"]])
        wait_for(lambda: trickle.hits, 10, what="the trickled read")
        held_at = trickle.calls[0][0]
        wait_for(lambda: env.operator.health()[0] == 500, limit + 20, interval=0.5, what="/healthz failing")
        detected = time.monotonic() - held_at
        assert detected >= limit - 1, f"failed after {detected:.1f} s, before the call's bound {limit:.0f} s"
        assert f"no progress: API GET /apis/gpt2bench.io/v1alpha1/namespaces/default/gpt2benchmarks/{name}" in \
            env.operator.log.read_text()
        trickle.release()
        wait_for(lambda: env.operator.health()[0] == 200, 15, what="/healthz green again")
        status = drive(env, name, expected)
    finally:
        trickle.release()
        restart_operator(env, api_timeout=None)
    assert status["phase"] == "Succeeded"
    check_results(status, expected)
    FIGURES["api-answer-never-ends"] = {"injected": 1, "api_timeout_seconds": 1, "call_limit_seconds": limit,
                                        "healthz_failed_after_seconds": round(detected, 1), "runs_lost": 0,
                                        "runs_twice": duplicates(env, name), "final_phase": status["phase"]}


# --- 9. an operator upgrade or rollback: a pinned spec this version cannot read ---------------------------


def test_a_sweep_pinned_by_a_version_that_reads_more_is_held_then_goes_on_under_one_that_reads_it(env):
    """docs/operator.md, "Upgrades and rollbacks": a version that cannot read a sweep's pinned spec holds it
    (SpecUnreadable, one Warning Event naming the field and the version that pinned it), creates and
    collects nothing, raises nothing; an operator that reads it carries on where it stopped. Before, every
    poll raised and posted a Warning, and the sweep looked Running."""
    from gpt2bench import __version__

    name, expected = "pinned-later", two_runs("pinned-later")
    env.benchmarks.create(benchmark(name))
    job = wait_for(lambda: env.trainer.jobs(name), 20, what="the first job")[0]
    env.trainer.start(job)
    annotations = env.benchmarks.get(name)["metadata"]["annotations"]
    pinned = annotations["gpt2bench.io/sweep-spec"]
    later = json.dumps({**json.loads(pinned), "addedInALaterVersion": {"enabled": True}})
    errors_before = env.operator.metric("gpt2bench_operator_reconcile_errors_total")
    env.benchmarks.api.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name, {"metadata": {
        "annotations": {"gpt2bench.io/sweep-spec": later, "gpt2bench.io/sweep-spec-version": "9.9.0"}}})
    env.trainer.succeed(job, expected[job["metadata"]["name"]])  # a job event, then the timer's polls

    def held() -> dict[str, Any] | None:
        status = env.benchmarks.status(name)
        found = [c for c in status.get("conditions") or [] if c["type"] == "SpecUnreadable" and c["status"] == "True"]
        return found[0] if found else None

    condition = wait_for(held, 20, what="SpecUnreadable")
    assert "spec.addedInALaterVersion" in condition["message"] and "operator 9.9.0" in condition["message"]
    assert f"this operator ({__version__})" in condition["message"]
    time.sleep(6 * POLL_SECONDS)  # six more polls
    warnings = [e["reason"] for e in env.benchmarks.events(name) if e["type"] == "Warning"]
    assert warnings == ["SpecUnreadable"], warnings
    assert len(env.trainer.jobs(name)) == 1 and env.benchmarks.status(name)["runs"][0]["phase"] == "Running"
    assert env.operator.metric("gpt2bench_operator_reconcile_errors_total") == errors_before
    # an operator that reads it runs again (here: the spec this version pinned is back)
    env.benchmarks.api.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name, {"metadata": {
        "annotations": {"gpt2bench.io/sweep-spec": pinned, "gpt2bench.io/sweep-spec-version": __version__}}})
    status = drive(env, name, expected)
    assert status["phase"] == "Succeeded"
    check_results(status, expected)
    unreadable = next(c for c in status["conditions"] if c["type"] == "SpecUnreadable")
    assert unreadable["status"] == "False"
    FIGURES["pinned-spec-unreadable"] = {"injected": 1, "warning_events": len(warnings), "polls_held": 6,
                                         "runs_lost": 0, "runs_twice": duplicates(env, name),
                                         "final_phase": status["phase"], "reason": condition["message"][:200]}
