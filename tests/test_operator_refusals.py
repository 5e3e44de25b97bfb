"""A run whose job cannot exist fails at once, saying why, and the sweep goes on.

The emulated cluster here serves PyTorchJob only (the training operator, no MPI operator), as a real
cluster may. The real kopf operator (KopfRunner) runs against it; the API server's refusals are real where
the emulator has them (ObjectMeta label validation, a kind that is not served) and injected as emulator faults
otherwise (422/403 on `create pytorchjobs`).
"""

from __future__ import annotations

from pathlib import Path

import kmock
import pytest
import yaml
from kube import EmulatedCluster
from kube.faults import Refuse
from kube.fixtures import CRD, benchmark, kopf_operator, operator_calls, wait_for
from kube.semantics import ApiError
from kubeflow_crds import CRD_FILES, crd_dir

pytestmark = pytest.mark.timeout(180)
# name fragment of a run -> the refusal the API server answers its job's create with
INJECTED = {
    "quota": (403, "Forbidden", 'pytorchjobs.kubeflow.org "x" is forbidden: exceeded quota: compute, requested: '
                                "requests.cpu=64, used: requests.cpu=0, limited: requests.cpu=8"),
    "webhook": (422, "Invalid", 'admission webhook "validator.pytorchjob.training-operator.kubeflow.org" denied the '
                                "request: spec.pytorchReplicaSpecs[Master].replicas: must be 1"),
}
# what a PyTorchJob CRD older or stricter than the one rendered for answers (the spec's own validation
# refuses everything the current upstream CRD would, so this can only come from a different cluster)
SCHEMA_REFUSAL = ('PyTorchJob.kubeflow.org "x" is invalid: spec.pytorchReplicaSpecs.Master.template.spec.'
                  'securityContext.seccompProfile: Invalid value: "object": field not declared in schema')


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with EmulatedCluster(tmp_path_factory.mktemp("kube")) as emulated:
        emulated.kubectl("apply", "-f", str(CRD))
        emulated.kubectl("create", "-f", str(crd_dir() / CRD_FILES[("kubeflow.org/v1", "PyTorchJob")]))  # no MPIJob CRD

        def refuse(request: kmock.Request) -> ApiError | None:
            name = ((request.data or {}).get("metadata") or {}).get("name", "")
            for fragment, (code, reason, message) in INJECTED.items():
                if name.startswith(f"no-{fragment}-ddp-"):
                    return ApiError(code, reason, message)
            if name.startswith("allrefused-"):  # every run of that benchmark
                return ApiError(422, "Invalid", SCHEMA_REFUSAL)
            return None  # the emulator's own handling

        Refuse(refuse, method="POST", path=r"/namespaces/default/pytorchjobs$").install(emulated)
        yield emulated


@pytest.fixture(scope="module")
def operator(cluster):
    with kopf_operator(cluster, poll_seconds=0.5) as runner:
        yield runner


def runs_by_strategy(status: dict) -> dict[str, dict]:
    return {r["strategy"]: r for r in status["runs"]}


def test_a_kind_the_cluster_does_not_serve_fails_only_its_runs_at_once(benchmarks, trainer):
    strategies = [{"name": "single"}, {"name": "horovod"}, {"name": "ddp"}]
    benchmarks.create(benchmark("partial", strategies, sweep={"strategies": strategies, "precisions": ["fp32", "bf16"],
                                                              "scales": [{"nodes": 1, "processesPerNode": 2}]}))
    first = wait_for(lambda: trainer.jobs("partial"), what="the first job")[0]
    status = wait_for(lambda: (s := benchmarks.status("partial")).get("runs") and all(
        r["phase"] == "Failed" for r in s["runs"] if r["strategy"] == "horovod") and s,
        what="every horovod run failed, while the first run still runs")
    assert [r["phase"] for r in status["runs"] if r["strategy"] != "horovod"] == ["Running", "Pending", "Pending",
                                                                                 "Pending"]
    reason = runs_by_strategy(status)["horovod"]["reason"]
    assert "MPIJob kubeflow.org/v2beta1 is not served by this cluster" in reason and "mpijobs.kubeflow.org" in reason
    assert "kubectl apply --server-side -f https://raw.githubusercontent.com/kubeflow/mpi-operator/" in reason
    done = set()
    job = first
    while True:  # the other runs go on, one at a time
        trainer.start(job)
        trainer.succeed(job, 10.0 + len(done))
        done.add(job["metadata"]["name"])
        if len(done) == 4:
            break
        job = wait_for(lambda: next((j for j in trainer.jobs("partial") if j["metadata"]["name"] not in done), None),
                       what="the next PyTorchJob")
    status = wait_for(lambda: (s := benchmarks.status("partial")).get("phase") == "PartiallySucceeded" and s,
                      what="PartiallySucceeded")
    assert status["runsSucceeded"] == 4 and status["runsFailed"] == 2
    assert all(j["kind"] == "PyTorchJob" for j in trainer.jobs("partial"))
    failures = benchmarks.posted("partial", "RunFailed", at_least=2)
    assert len(failures) == 2 and all("not served" in e["message"] and e["type"] == "Warning" for e in failures)


def test_a_cluster_serving_the_training_operators_own_mpijob_is_told_what_to_change(cluster, benchmarks, trainer):
    """The training operator alone serves mpijobs.kubeflow.org at v1: our v2beta1 MPIJob is still not served."""
    legacy = yaml.safe_load((crd_dir() / CRD_FILES[("kubeflow.org/v2beta1", "MPIJob")]).read_text())
    version = legacy["spec"]["versions"][0]
    version.update(name="v1", schema={"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}})
    legacy["spec"]["versions"] = [version]
    path = Path(cluster.workdir) / "legacy-mpijobs.yaml"
    path.write_text(yaml.safe_dump(legacy))
    cluster.kubectl("create", "-f", str(path))
    benchmarks.create(benchmark("legacy", [{"name": "horovod"}]))
    status = wait_for(lambda: (s := benchmarks.status("legacy")).get("phase") == "Failed" and s, what="Failed")
    reason = status["runs"][0]["reason"]
    assert "serves mpijobs.kubeflow.org at v1 only" in reason and "--enable-scheme=pytorchjob" in reason
    assert {c["type"]: c["status"] for c in status["conditions"]}["Failed"] == "True"


@pytest.mark.parametrize("fragment", sorted(INJECTED))
def test_a_job_the_api_server_refuses_fails_its_run_with_the_servers_message(benchmarks, trainer, fragment):
    code, reason, message = INJECTED[fragment]
    name = f"no-{fragment}"
    benchmarks.create(benchmark(name, [{"name": "ddp"}, {"name": "single"}]))
    # only the ddp job of this benchmark is refused (`no-<fragment>-ddp-...`): the single run's job is not
    status = wait_for(lambda: (s := benchmarks.status(name)).get("runs") and s["runs"][0]["phase"] == "Failed" and s,
                      what="the refused run failed")
    refused = status["runs"][0]
    assert refused["reason"].startswith(f"the API server refused PyTorchJob {refused['jobName']}: {code} {reason}: ")
    assert message[:60] in refused["reason"]
    job = wait_for(lambda: trainer.jobs(name), what="the next run's job: the sweep goes on")[0]
    assert job["metadata"]["name"] == status["runs"][1]["jobName"]
    trainer.start(job)
    trainer.succeed(job, 7.0)
    wait_for(lambda: benchmarks.status(name).get("phase") == "PartiallySucceeded", what="PartiallySucceeded")
    events = benchmarks.posted(name, "RunFailed")
    assert events[0]["type"] == "Warning" and str(code) in events[0]["message"]


def test_a_refusal_of_every_job_fails_every_run_and_the_benchmark_still_has_a_phase(benchmarks, trainer):
    benchmarks.create(benchmark("allrefused", [{"name": "single"}, {"name": "ddp"}]))
    status = wait_for(lambda: (s := benchmarks.status("allrefused")).get("phase") not in (None, "Running") and s,
                      what="a final phase")
    assert status["phase"] == "Failed" and status["runsFailed"] == 2
    for run in status["runs"]:
        assert "422 Invalid" in run["reason"] and "field not declared in schema" in run["reason"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert (conditions["Failed"]["status"], conditions["Failed"]["reason"]) == ("True", "NoRunSucceeded")
    assert trainer.jobs("allrefused") == []
    assert benchmarks.posted("allrefused", "SweepFailed")


def test_auto_picks_the_v1_jobs_served_here_and_trainjob_asked_for_fails_saying_what_to_install(benchmarks, trainer):
    """No Trainer v2 here: `auto` resolves to the PyTorchJobs this cluster serves; a sweep that insists on
    TrainJobs ends at once, its runs naming what to install, instead of stalling."""
    benchmarks.create(benchmark("v1auto", [{"name": "single"}]))
    assert wait_for(lambda: benchmarks.status("v1auto").get("backend"), what="backend") == "pytorchjob"
    assert [j["kind"] for j in wait_for(lambda: trainer.jobs("v1auto"), what="a job")] == ["PyTorchJob"]
    benchmarks.create(benchmark("v2", [{"name": "single"}, {"name": "ddp"}], backend="trainjob"))
    status = wait_for(lambda: (s := benchmarks.status("v2")).get("phase") == "Failed" and s, what="Failed")
    assert status["backend"] == "trainjob"
    assert all(r["reason"].startswith("TrainJob trainer.kubeflow.org/v1alpha1 is not served by this cluster")
               and "install Kubeflow Trainer v2" in r["reason"] for r in status["runs"])
    assert trainer.jobs("v2") == []


def test_rbac_covers_every_call_made_here(cluster, benchmarks):
    """This module's paths (unserved kinds, refused jobs) checked against the roles bound to the operator
    in manifests/operator.yaml."""
    from test_operator_manifests import allowed, cluster_role_rules

    made = operator_calls(cluster)
    assert {("kubeflow.org", "pytorchjobs", "create"), ("kubeflow.org", "mpijobs", "list")} <= made
    assert [call for call in sorted(made) if not allowed(cluster_role_rules(), *call)] == []
