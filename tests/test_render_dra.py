"""Dynamic resource allocation: EKS's EFA DRA driver (Kubernetes 1.34+) and GKE's managed RDMA
(`mrdma.google.com`) hand out the fabric's devices through resource claims, which the spec carries to every
training pod of a PyTorchJob or MPIJob. Trainer v2.3's runtimePatches cannot carry them: refused, naming the
field."""

from __future__ import annotations

import pytest
from kubeflow_crds import validate_job
from test_render_fabric import pods_of, trains

from gpt2bench.render import render_all
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


def test_a_trainjob_cannot_carry_claims_and_says_so():
    with pytest.raises(SpecError) as refused:
        benchmark(CLAIMS, backend="trainjob")
    (where, message), = refused.value.errors
    assert where == "spec.pods.resourceClaims" and "runtimePatches have no resourceClaims" in message
    assert render_all(benchmark([], backend="trainjob"))  # without claims it renders


def test_the_crd_refuses_a_trainjob_with_claims_and_a_claim_without_a_source():
    from kube.semantics import ApiError, validate_custom_resource
    from test_validation_rules import VERSION

    def document(claims, backend):
        return {"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark", "metadata": {"name": "d"},
                "spec": {"backend": backend, "pods": {"resourceClaims": claims},
                         "sweep": {"strategies": [{"name": "ddp"}]}}}

    validate_custom_resource(document(CLAIMS, "pytorchjob"), VERSION, strict=True)
    with pytest.raises(ApiError, match="runtimePatches have no resourceClaims"):
        validate_custom_resource(document(CLAIMS, "trainjob"), VERSION, strict=True)
    with pytest.raises(ApiError, match="exactly one of resourceClaimTemplateName and resourceClaimName"):
        validate_custom_resource(document([{"name": "efa"}], "pytorchjob"), VERSION, strict=True)
