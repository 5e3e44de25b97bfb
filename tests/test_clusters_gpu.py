"""Cluster findings on the rendered objects of the fabric profiles (manifests/examples/fabrics/, merged into the GPU
example by tests/test_clusters.py): placeholders refused, AKS's GPU pool taint tolerated, RoCE's secondary network,
and docs/clusters.md's memlock node fix."""

from __future__ import annotations

import re

import pytest
import yaml
from test_clusters import EXAMPLE, PROFILES, cluster_benchmark, merged, placeholders
from test_render_fabric import pods_of, trains

from gpt2bench.render import render_all
from gpt2bench.specification.validation import SpecError, load_benchmark


def tolerates(pod_spec: dict, taint: dict) -> bool:
    """Whether a pod tolerates a taint, as the scheduler's TaintToleration plugin decides (k8s.io/api
    core/v1 toleration.go ToleratesTaint): same effect or none, same key or none with Exists, and Exists or an
    equal value."""
    for toleration in pod_spec.get("tolerations") or []:
        if toleration.get("effect") and toleration["effect"] != taint["effect"]:
            continue
        if toleration.get("key") and toleration["key"] != taint["key"]:
            continue
        if not toleration.get("key") and toleration.get("operator") != "Exists":
            continue
        if toleration.get("operator", "Equal") == "Exists" or toleration.get("value", "") == taint.get("value", ""):
            return True
    return False


def value_at(document: dict, path: str):
    """The value a SpecError's field path names: `spec.pods.env[1].value`, `spec.nodeSelector[a.b/c]`."""
    value = document
    for key, index in re.findall(r"([^.\[\]]+)|\[([^\]]+)\]", path):
        value = value[int(index)] if index.isdigit() else value[key or index]
    return value


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_a_profiles_placeholders_are_each_refused_naming_their_field(name):
    """A profile merged as it is written: every value in angle brackets (RoCE's `NCCL_IB_TC: "<106>"`, which NCCL
    reads as 0; the HCAs; AKS's pool; EKS's image) is refused, naming the field that holds it, instead of reaching
    NCCL or the scheduler; a profile without one loads as it is."""
    document = {**EXAMPLE, "spec": merged(EXAMPLE["spec"], yaml.safe_load(PROFILES[name])["spec"])}
    left = placeholders(document["spec"])
    if not left:
        load_benchmark(document)
        return
    with pytest.raises(SpecError) as refused:
        load_benchmark(document)
    flagged = {path: message for path, message in refused.value.errors if "is a placeholder" in message}
    assert sorted(value_at(document, path) for path in flagged) == sorted(left)
    for path, message in flagged.items():
        assert message.startswith(f"{value_at(document, path)!r} is a placeholder"), (path, message)


def test_a_placeholder_is_refused_anywhere_in_the_spec_beside_the_models_own_errors():
    spec = {**EXAMPLE["spec"], "nodeSelector": {"kubernetes.azure.com/agentpool": "<your pool>"},
            "training": {**EXAMPLE["spec"].get("training", {}), "steps": -1}}
    with pytest.raises(SpecError) as refused:
        load_benchmark({**EXAMPLE, "spec": spec})
    errors = refused.value.errors
    assert errors[0] == ("spec.nodeSelector[kubernetes.azure.com/agentpool]", errors[0][1])
    assert "is a placeholder" in errors[0][1] and ("spec.training.steps", errors[1][1]) == errors[1]
    # a value with angle brackets inside, not a placeholder as a whole, is the user's
    load_benchmark({**EXAMPLE, "spec": {**EXAMPLE["spec"], "pods": {"env": [{"name": "X", "value": "a<b>c"}]}}})


AKS_GPU_TAINT = {"key": "sku", "value": "gpu", "effect": "NoSchedule"}


@pytest.mark.parametrize("backend", ["pytorchjob", "trainjob"])
def test_aks_training_pods_tolerate_azures_gpu_pool_taint(backend):
    """Azure's GPU node pools are created with `--node-taints sku=gpu:NoSchedule` (AKS GPU docs): a pod without the
    toleration stays Pending on them until its deadline."""
    for job in render_all(cluster_benchmark("aks-nd", backend)):
        for role, pod in pods_of(job).items():
            if trains(job, role):
                assert tolerates(pod["spec"], AKS_GPU_TAINT), (job["metadata"]["name"], role)
    example = load_benchmark({**EXAMPLE, "spec": {**EXAMPLE["spec"], "backend": "pytorchjob"}})
    assert not any(tolerates(pod["spec"], AKS_GPU_TAINT) for job in render_all(example)
                   for pod in pods_of(job).values())  # the check tells a pod without it apart


def test_the_roce_fragment_attaches_its_secondary_network_as_the_infiniband_one_does():
    for name in ("onprem-ib", "onprem-roce"):
        for job in render_all(cluster_benchmark(name, "pytorchjob")):
            for role, pod in pods_of(job).items():
                annotations = pod["metadata"].get("annotations") or {}
                assert (annotations.get("k8s.v1.cni.cncf.io/networks") == "rdma-net-ipam") == trains(job, role), role


def test_the_documented_memlock_node_fix_is_a_valid_daemonset_on_the_gpu_pools():
    """docs/clusters.md's DaemonSet for nodes that cannot be configured before they join (AKS): valid against
    Kubernetes' schema, on the tainted GPU pools, writing the limit the start-up check names (memlock.NODE_FIX)."""
    from test_clusters import DOC

    from gpt2bench.trainer.memlock import NODE_FIX

    (text,) = re.findall(r"<!-- node-fix: containerd-memlock -->\s*```yaml\n(.*?)```", DOC, re.S)
    daemonset = yaml.safe_load(text)
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    kubernetes_validate.validate(daemonset, "1.30.0", strict=True)
    pod = daemonset["spec"]["template"]["spec"]
    assert tolerates(pod, AKS_GPU_TAINT) and tolerates(pod, {"key": "nvidia.com/gpu", "value": "present",
                                                               "effect": "NoSchedule"})
    script = pod["containers"][0]["command"][-1]
    assert "LimitMEMLOCK=infinity" in NODE_FIX and "LimitMEMLOCK=infinity" in script
    assert "containerd.service.d" in script and "systemctl restart containerd" in script
    assert "Pinned memory" in NODE_FIX  # the check's reason points at the section that holds this fix
