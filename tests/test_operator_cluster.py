"""What a real cluster adds, against the emulated API with the real kopf operator (KopfRunner):

- conditions as batch Jobs have them, and `kubectl wait --for=condition=Complete|Finished` on a benchmark;
- Kueue: a job its webhook creates suspended makes the run Queued until the queue admits it;
- ownership by uid: a job left by a deleted namesake (`--cascade=orphan`) is not adopted;
- a job deleted before its results were read (ttlSecondsAfterFinished) fails its run, saying so;
- per-step curves: kept in a ConfigMap from the result pod's log, drawn by `gpt2bench report --cluster`.

The test plays the Kubeflow operators as upstream does (tests/kube/training.py) and Kueue's webhook (an
admission function of the emulator).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import kubernetes
import pytest
from kube.fixtures import benchmark, kopf_operator, operator_calls, run_entry, wait_for
from kube.tools import kubectl
from kube.training import TrainingOperator, kueue_webhook

from gpt2bench.trainer.summary import steps_line

pytestmark = pytest.mark.timeout(180)
CONDITIONS = ("Ready", "Complete", "Failed", "Finished", "Queued")


@pytest.fixture(scope="module")
def operator(cluster):
    cluster.call(lambda emulator: emulator.admission.append(kueue_webhook))
    with kopf_operator(cluster, poll_seconds=0.5) as runner:
        yield runner


def next_job(trainer: TrainingOperator, name: str, done: set[str]) -> dict:
    return wait_for(lambda: next((j for j in trainer.jobs(name) if j["metadata"]["name"] not in done), None), 30,
                    what=f"the next job of {name}")


def conditions(status: dict) -> dict[str, dict]:
    return {c["type"]: c for c in status.get("conditions") or []}


def test_kubectl_wait_for_complete_and_conditions_as_a_batch_job_has_them(cluster, benchmarks, trainer):
    benchmarks.create(benchmark("waited", [{"name": "single"}, {"name": "ddp"}]))
    status = wait_for(lambda: (s := benchmarks.status("waited")).get("phase") and s, what="a phase")
    running = conditions(status)
    assert set(CONDITIONS) <= set(running)
    assert [running[t]["status"] for t in CONDITIONS] == ["False"] * len(CONDITIONS)
    assert {running[t]["observedGeneration"] for t in CONDITIONS} == {1}
    waiter = subprocess.Popen(  # the real kubectl waits on the real watch
        [kubectl(), "wait", "--for=condition=Complete", "gpt2benchmark/waited", "--timeout=90s"],
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "HOME": str(cluster.workdir)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        done: set[str] = set()
        for i in range(2):
            job = next_job(trainer, "waited", done)
            assert waiter.poll() is None, "Complete is not True before every run finished"
            trainer.start(job)
            trainer.succeed(job, 100.0 + i)
            done.add(job["metadata"]["name"])
        out, err = waiter.communicate(timeout=90)
    finally:
        waiter.kill()
    assert waiter.returncode == 0, err
    assert "gpt2benchmark.gpt2bench.io/waited condition met" in out
    final = conditions(benchmarks.status("waited"))
    assert (final["Ready"]["status"], final["Ready"]["reason"]) == ("True", "Succeeded")
    assert (final["Complete"]["status"], final["Failed"]["status"]) == ("True", "False")
    assert (final["Finished"]["status"], final["Finished"]["reason"]) == ("True", "Succeeded")
    assert all(c["lastTransitionTime"] and c["message"] for c in final.values())


def test_kubectl_wait_for_finished_comes_back_when_no_run_succeeds(cluster, benchmarks, trainer):
    """The README's and NOTES' wait: `--for=condition=Complete` hung the full hour when the sweep failed (the
    normal failure path); Finished ends either way, its reason the phase."""
    benchmarks.create(benchmark("doomed-wait", [{"name": "single"}]))
    job = next_job(trainer, "doomed-wait", set())
    trainer.start(job)
    trainer.finish(job, succeeded=False, message=None, exit_code=1)
    waited = cluster.kubectl("wait", "--for=condition=Finished", "gpt2benchmark/doomed-wait", "--timeout=30s",
                             check=False)
    assert waited.returncode == 0 and "condition met" in waited.stdout, waited.stderr
    final = conditions(benchmarks.status("doomed-wait"))
    assert (final["Finished"]["reason"], final["Failed"]["reason"], final["Ready"]["status"],
            final["Complete"]["status"]) == ("Failed", "NoRunSucceeded", "False", "False")


def test_a_kueue_suspended_job_queues_its_run_until_admitted(cluster, benchmarks, trainer):
    strategies = [{"name": "single"}, {"name": "horovod"}]
    benchmarks.create(benchmark("queued", strategies, scheduling={"kueueQueue": "team-a"}))
    done: set[str] = set()
    for i, kind in enumerate(("PyTorchJob", "MPIJob")):
        job = next_job(trainer, "queued", done)
        assert job["kind"] == kind and job["spec"]["runPolicy"]["suspend"] is True, "Kueue's webhook suspended it"
        status = wait_for(lambda: run_entry(s := benchmarks.status("queued"), i).get("phase") == "Queued" and s,
                          what="the run Queued (from the job's spec, before any condition)")
        trainer.suspend(job)  # the Kubeflow operator's word for it
        queued = conditions(status)["Queued"]
        assert (queued["status"], queued["reason"]) == ("True", "JobSuspended")
        assert job["metadata"]["name"] in queued["message"] and "queued" in status["message"]
        assert status["phase"] == "Running" and len(trainer.jobs("queued")) == i + 1, "a queued run holds its slot"
        trainer.admit(job)  # Kueue admits the workload: unsuspended, resumed, running
        wait_for(lambda: run_entry(benchmarks.status("queued"), i).get("phase") == "Running",
                 what="Running once admitted")
        trainer.succeed(job, 10.0 + i)
        done.add(job["metadata"]["name"])
    status = wait_for(lambda: (s := benchmarks.status("queued")).get("phase") == "Succeeded" and s, what="Succeeded")
    assert conditions(status)["Queued"]["status"] == "False"
    reasons = [e["reason"] for e in benchmarks.events("queued")]
    assert reasons.count("RunQueued") == 2 and reasons.count("RunAdmitted") == 2


def test_a_job_left_by_a_deleted_namesake_is_not_adopted(cluster, benchmarks, trainer):
    benchmarks.create(benchmark("reborn", [{"name": "single"}, {"name": "ddp"}]))
    old = next_job(trainer, "reborn", set())
    cluster.kubectl("delete", "gpt2benchmark", "reborn", "--cascade=orphan")
    wait_for(lambda: not benchmarks.exists("reborn"), what="the benchmark gone")
    orphan = wait_for(lambda: not (j := trainer.get(old))["metadata"].get("ownerReferences") and j,
                      what="the orphaned job without its owner")
    trainer.start(orphan)
    trainer.succeed(orphan, 99999.0)  # the old sweep's result: must not become the new one's
    # its NetworkPolicy, orphaned alike, would fail the run first (tests/test_policy_operator.py): the job here
    kubernetes.client.NetworkingV1Api(trainer.custom.api_client).delete_namespaced_network_policy(
        old["metadata"]["name"], "default")

    created = benchmarks.create(benchmark("reborn", [{"name": "single"}, {"name": "ddp"}]))
    status = wait_for(lambda: (s := benchmarks.status("reborn")).get("runs") and s["runs"][0]["phase"] == "Failed"
                      and s, what="the first run failed")
    reason = status["runs"][0]["reason"]
    assert f"a PyTorchJob named {old['metadata']['name']} already exists in default" in reason
    assert "no owner" in reason and created["metadata"]["uid"] in reason
    job = next_job(trainer, "reborn", {old["metadata"]["name"]})  # the sweep goes on with the next run
    assert job["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]
    trainer.start(job)
    trainer.succeed(job, 5.0)
    status = wait_for(lambda: (s := benchmarks.status("reborn")).get("phase") == "PartiallySucceeded" and s,
                      what="PartiallySucceeded")
    assert status["best"]["tokensPerSecond"] == 5.0 and "results" not in status["runs"][0]
    assert any("already exists" in e["message"] for e in benchmarks.posted("reborn", "RunFailed"))


def test_a_job_deleted_before_its_results_were_read_fails_its_run_naming_the_ttl(benchmarks, trainer):
    benchmarks.create(benchmark("ttl", [{"name": "single"}, {"name": "ddp"}],
                                runPolicy={"ttlSecondsAfterFinished": 60}))
    job = next_job(trainer, "ttl", set())
    assert job["spec"]["runPolicy"]["ttlSecondsAfterFinished"] == 60
    trainer.start(job)
    group, version, plural = "kubeflow.org", "v1", "pytorchjobs"
    trainer.custom.delete_namespaced_custom_object(group, version, "default", plural, job["metadata"]["name"])
    status = wait_for(lambda: run_entry(s := benchmarks.status("ttl"), 0).get("phase") == "Failed" and s,
                      what="Failed")
    assert "was deleted before its results were read" in status["runs"][0]["reason"]
    assert "ttlSecondsAfterFinished is 60 s" in status["runs"][0]["reason"]
    second = next_job(trainer, "ttl", {job["metadata"]["name"]})  # and the sweep goes on
    trainer.start(second)
    trainer.succeed(second, 1.0)
    wait_for(lambda: benchmarks.status("ttl").get("phase") == "PartiallySucceeded", what="PartiallySucceeded")


def test_a_ttl_shorter_than_the_operator_may_need_is_refused_naming_the_field(benchmarks, trainer):
    with pytest.raises(kubernetes.client.ApiException) as refused:
        benchmarks.create(benchmark("hasty", [{"name": "single"}], runPolicy={"ttlSecondsAfterFinished": 5}))
    assert refused.value.status == 422
    assert "spec.runPolicy" in refused.value.body and "ttlSecondsAfterFinished must be at least 60" in refused.value.body
    assert not benchmarks.exists("hasty") and trainer.jobs("hasty") == []


def test_per_step_curves_outlive_the_pods_and_the_cluster_report_draws_them(cluster, benchmarks, trainer, tmp_path):
    benchmarks.create(benchmark("curves", [{"name": "single"}, {"name": "horovod"}]))
    done: set[str] = set()
    for i in range(2):
        job = next_job(trainer, "curves", done)
        records = [{"step": s, "warmup": s <= 1, "loss": 10.0 - s / 10 - i, "grad_norm": 2.0 - s / 100,
                    "lr": 3e-4, "step_seconds": 0.2, "tokens_per_second": 1000.0} for s in range(1, 41)]
        # what the result container printed: the trainer's log lines, its steps line, its summary line
        log = "".join(f"rank0 INFO step {s} loss 9.0\n" for s in range(1, 41)) + steps_line(records) + "\n"
        log += "GPT2BENCH_SUMMARY {}\n"
        trainer.start(job)
        trainer.succeed(job, 100.0 + i, log=("[1,0]<stdout>:" if job["kind"] == "MPIJob" else "") + log)
        done.add(job["metadata"]["name"])
    status = wait_for(lambda: (s := benchmarks.status("curves")).get("phase") == "Succeeded" and s, what="Succeeded")
    uid = benchmarks.get("curves")["metadata"]["uid"]
    for run in status["runs"]:
        cm = wait_for(lambda run=run: benchmarks.config_map(f"{run['name']}-steps"), what="the steps ConfigMap")
        assert [o["uid"] for o in cm["metadata"]["ownerReferences"]] == [uid], "deleted with its benchmark"
        lines = [json.loads(line) for line in cm["data"]["steps.jsonl"].splitlines()]
        assert [r["step"] for r in lines] == list(range(1, 41)) and lines[0]["warmup"] is True
    # the pods (and their logs) go; the curves stay
    for pod in benchmarks.core.list_namespaced_pod("default", label_selector="training.kubeflow.org/job-name").items:
        if pod.metadata.name.startswith("curves-"):
            benchmarks.core.delete_namespaced_pod(pod.metadata.name, "default")
    out = tmp_path / "report"
    report = subprocess.run([sys.executable, "-m", "gpt2bench", "report", "--cluster", "curves", "-n", "default",
                             "--output", str(out), "--quiet"], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)})
    assert report.returncode == 0, report.stderr
    assert (out / "loss.png").stat().st_size > 1000 and (out / "grad_norm.png").stat().st_size > 1000
    written = json.loads((out / "results.json").read_text())
    assert sorted(r["stepsFile"] for r in written["runs"]) == sorted(f"steps/{r['name']}.jsonl" for r in status["runs"])
    assert "No loss" not in (out / "results.md").read_text()


def test_rbac_covers_every_call_made_here(cluster, benchmarks):
    """This module's paths (a namesake's job read on 409, Kueue, per-step ConfigMaps, pod logs) checked against the roles bound to the operator
    in manifests/operator.yaml."""
    from test_operator_manifests import allowed, cluster_role_rules

    made = operator_calls(cluster)
    assert {("kubeflow.org", "pytorchjobs", "get"), ("", "configmaps", "create"), ("", "pods/log", "get")} <= made
    assert [call for call in sorted(made) if not allowed(cluster_role_rules(), *call)] == []
