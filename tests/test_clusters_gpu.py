"""Issue 47's cluster findings, each on the rendered objects of docs/clusters.md's fragments (tests/test_clusters.py
merges them into the GPU example): placeholders refused, AKS's GPU pool taint tolerated, RoCE's secondary network."""

from __future__ import annotations

import pytest
import yaml
from test_clusters import EXAMPLE, FRAGMENTS, cluster_benchmark, merged
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


def test_a_placeholder_copied_from_the_docs_is_refused_naming_its_field():
    """The RoCE fragment as written (`NCCL_IB_TC: "<106>"`): refused, naming the env entry, instead of reaching
    NCCL, which reads it as 0."""
    document = {**EXAMPLE, "spec": merged(EXAMPLE["spec"], yaml.safe_load(FRAGMENTS["onprem-roce"])["spec"])}
    with pytest.raises(SpecError) as refused:
        load_benchmark(document)
    (path, message), = refused.value.errors
    assert path == "spec.pods.env[1].value" and message.startswith("'<106>' is a placeholder")
    assert document["spec"]["pods"]["env"][1]["name"] == "NCCL_IB_TC"
    # anywhere in the spec, and together with the model's own errors
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
    import re as regex

    from test_clusters import DOC

    from gpt2bench.trainer.memlock import NODE_FIX

    (text,) = regex.findall(r"<!-- node-fix: containerd-memlock -->\s*```yaml\n(.*?)```", DOC, regex.S)
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
