"""Dynamic resource allocation: EKS's EFA DRA driver (Kubernetes 1.34+) and GKE's managed RDMA
(`mrdma.google.com`) hand out the fabric's devices through resource claims, which the spec carries to every
training pod of a PyTorchJob or MPIJob, and of a TrainJob through a TrainingRuntime of the benchmark's own (Trainer
v2.3's runtimePatches cannot carry them, and resourcesPerNode's claims are dropped)."""

from __future__ import annotations

import copy

import pytest
from kube.trainer_v2 import build_jobset
from kubeflow_crds import validate_job
from test_render_fabric import pods_of, trains

from gpt2bench.plan import plan_runs
from gpt2bench.render import render_all, render_objects, render_run
from gpt2bench.render.runtimes import project_runtimes, with_claims
from gpt2bench.specification.validation import SpecError, load_benchmark

CLAIMS = [{"name": "efa", "resourceClaimTemplateName": "efa-all"},
          {"name": "rdma", "resourceClaimName": "shared-rdma"}]


def benchmark(claims, backend="pytorchjob"):
    return load_benchmark({"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark", "metadata": {"name": "d"},
                           "spec": {"backend": backend, "pods": {"resourceClaims": claims},
                                    "sweep": {"strategies": [{"name": "ddp"}, {"name": "horovod"}],
                                              "scales": [{"nodes": 2, "devicesPerNode": 4}]}}})


def test_every_training_pod_claims_the_devices_and_its_container_uses_them():
    jobs = render_all(benchmark(CLAIMS))
    assert {job["kind"] for job in jobs} == {"PyTorchJob", "MPIJob"}
    for job in jobs:
        validate_job(job)  # the upstream CRDs' pod template schema has resourceClaims
        for role, pod in pods_of(job).items():
            (container,) = pod["spec"]["containers"]
            if trains(job, role):
                assert pod["spec"]["resourceClaims"] == CLAIMS, role
                assert container["resources"]["claims"] == [{"name": "efa"}, {"name": "rdma"}], role
                assert container["resources"]["limits"]["nvidia.com/gpu"] == 4
            else:  # the MPI launcher runs mpirun and ssh: no fabric device
                assert "resourceClaims" not in pod["spec"] and "claims" not in container["resources"], role


@pytest.mark.parametrize("claims, path, words", [
    ([{"name": "efa"}], "spec.pods.resourceClaims[0]", "exactly one of resourceClaimTemplateName and resourceClaimName"),
    ([{"name": "efa", "resourceClaimName": "a", "resourceClaimTemplateName": "b"}], "spec.pods.resourceClaims[0]",
     "exactly one"),
    ([CLAIMS[0], {**CLAIMS[0]}], "spec.pods.resourceClaims[1].name", "given twice"),
    ([{"name": "EFA", "resourceClaimName": "a"}], "spec.pods.resourceClaims[0].name", ""),
])  # fmt: skip
def test_a_bad_claim_is_refused_naming_its_field(claims, path, words):
    with pytest.raises(SpecError) as refused:
        benchmark(claims)
    where, message = refused.value.errors[0]
    assert where.startswith(path) and words in message, refused.value.errors


def jobset_pods(trainjob: dict, runtime: dict) -> dict[str, dict]:
    """Replicated job -> pod template of the JobSet the (emulated) Trainer builds from a TrainJob and its runtime."""
    named = {**trainjob, "metadata": {**trainjob["metadata"], "uid": "uid"}}
    return {rjob["name"]: rjob["template"]["spec"]["template"]
            for rjob in build_jobset(named, runtime)["spec"]["replicatedJobs"]}


def test_a_trainjob_runs_on_the_benchmarks_own_runtime_whose_training_pods_claim_the_devices():
    objects = render_objects(benchmark(CLAIMS, backend="trainjob"))
    runtimes = {o["metadata"]["name"]: o for o in objects if o["kind"] == "TrainingRuntime"}
    trainjobs = [o for o in objects if o["kind"] == "TrainJob"]
    assert len(trainjobs) == 2 and len(runtimes) == 2  # ddp on the torch runtime, horovod on the CUDA MPI one
    for runtime in runtimes.values():
        validate_job(runtime)  # the upstream TrainingRuntime CRD
        assert runtime["metadata"]["namespace"] == "default"
        assert len(runtime["metadata"]["name"]) <= 52 and runtime["metadata"]["name"].startswith("d-gpt2bench-")
    for trainjob in trainjobs:
        ref = trainjob["spec"]["runtimeRef"]
        assert ref["kind"] == "TrainingRuntime" and ref["name"] in runtimes
        assert objects.index(runtimes[ref["name"]]) < objects.index(trainjob), "created before the job naming it"
        validate_job(trainjob, runtimes)  # the webhook's checks against the runtime it names
        assert "resourcesPerNode" not in trainjob["spec"]["trainer"], "its claims would be dropped (TR L199-233)"
        pods = jobset_pods(trainjob, runtimes[ref["name"]])
        assert pods and set(pods) <= {"node", "launcher"}
        for rjob, pod in pods.items():  # with runLauncherAsNode, the launcher runs ranks too: every pod trains
            (container,) = pod["spec"]["containers"]
            assert pod["spec"]["resourceClaims"] == CLAIMS, rjob
            assert container["resources"]["claims"] == [{"name": "efa"}, {"name": "rdma"}], rjob
            assert container["resources"]["limits"]["nvidia.com/gpu"] == 4, rjob


def test_claims_in_a_runtime_would_not_survive_a_trainjobs_resources_per_node():
    """Why the resources move into the runtime: the Trainer rebuilds the trainer's resources from
    resourcesPerNode's limits and requests, so a runtime's claims reach no container when the TrainJob has it."""
    objects = render_objects(benchmark(CLAIMS, backend="trainjob"))
    runtime = next(o for o in objects if o["kind"] == "TrainingRuntime")
    trainjob = next(o for o in objects if o["kind"] == "TrainJob" and o["spec"]["runtimeRef"]["name"]
                    == runtime["metadata"]["name"])
    with_resources = copy.deepcopy(trainjob)
    with_resources["spec"]["trainer"]["resourcesPerNode"] = {"limits": {"nvidia.com/gpu": 4}}
    (pod,) = jobset_pods(with_resources, runtime).values()
    assert "claims" not in pod["spec"]["containers"][0]["resources"]


def test_the_runtime_is_shared_by_the_runs_alike_and_named_apart_from_another_shape():
    spec = benchmark(CLAIMS, backend="trainjob")
    spec = spec.model_copy(update={"spec": spec.spec.model_copy(update={"sweep": spec.spec.sweep.model_copy(
        update={"precisions": ["fp32", "bf16"]})})})
    names = {run.name: [o["metadata"]["name"] for o in render_run(spec, run) if o["kind"] == "TrainingRuntime"]
             for run in plan_runs(spec)}
    ddp = {tuple(v) for k, v in names.items() if "-ddp-" in k}
    assert len(ddp) == 1, "both precisions' ddp runs share one runtime"
    assert render_run(spec, plan_runs(spec)[0]) == render_run(spec, plan_runs(spec)[0]), "deterministic"
    objects = render_objects(spec)
    assert len([o for o in objects if o["kind"] == "TrainingRuntime"]) == 2, "printed once each"
    other = benchmark(CLAIMS[:1], backend="trainjob")  # another pod shape (one claim): another runtime
    assert not {o["metadata"]["name"] for o in render_objects(other) if o["kind"] == "TrainingRuntime"} & {
        n for v in names.values() for n in v}


def test_a_launcher_that_is_no_node_claims_nothing():
    """An MPI runtime without runLauncherAsNode starts no rank in its launcher: like an MPIJob's, it claims nothing."""
    runtime = copy.deepcopy(project_runtimes()["gpt2bench-mpi"])
    runtime["spec"]["mlPolicy"]["mpi"]["runLauncherAsNode"] = False
    claimed = with_claims(runtime, {"limits": {"memory": "4Gi"}}, CLAIMS)
    pods = {j["name"]: j["template"]["spec"]["template"]["spec"]
            for j in claimed["spec"]["template"]["spec"]["replicatedJobs"]}
    assert pods["node"]["resourceClaims"] == CLAIMS
    assert "resourceClaims" not in pods["launcher"] and "claims" not in pods["launcher"]["containers"][0].get(
        "resources", {})


def test_without_claims_a_trainjob_names_the_projects_cluster_runtime():
    (trainjob, *_), = [[o for o in render_objects(benchmark([], backend="trainjob")) if o["kind"] == "TrainJob"]]
    assert trainjob["spec"]["runtimeRef"]["kind"] == "ClusterTrainingRuntime"
    assert "resourcesPerNode" in trainjob["spec"]["trainer"]
    assert not [o for o in render_objects(benchmark([], backend="trainjob")) if o["kind"] == "TrainingRuntime"]


def test_the_crd_takes_claims_with_any_backend_and_refuses_a_claim_without_a_source():
    from kube.semantics import ApiError, validate_custom_resource
    from test_validation_rules import VERSION

    def document(claims, backend):
        return {"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark", "metadata": {"name": "d"},
                "spec": {"backend": backend, "pods": {"resourceClaims": claims},
                         "sweep": {"strategies": [{"name": "ddp"}]}}}

    validate_custom_resource(document(CLAIMS, "pytorchjob"), VERSION, strict=True)
    validate_custom_resource(document(CLAIMS, "trainjob"), VERSION, strict=True)
    with pytest.raises(ApiError, match="exactly one of resourceClaimTemplateName and resourceClaimName"):
        validate_custom_resource(document([{"name": "efa"}], "pytorchjob"), VERSION, strict=True)
