"""What OpenShift must grant the benchmark's pods (gpt2bench render --openshift, docs/clusters.md, OpenShift): the SCC
is valid against OpenShift's CRD, admits every rendered pod of every job kind, and OpenShift's own restricted-v2
and nonroot-v2 refuse exactly the pods the docs' table says. Admission is played here as OpenShift's SCC admission
reads a pod (openshift/apiserver-library-go, pkg/securitycontextconstraints: capabilities, volumes, user and
group strategies, host namespaces, privilege); no OpenShift API server was available."""

from __future__ import annotations

import subprocess
from pathlib import Path

import jsonschema
import yaml
from kubeflow_crds import strict
from test_render_fabric import FABRIC, every_kind, pods_of

from gpt2bench.render.openshift import openshift_objects
from gpt2bench.specification.validation import load_benchmark

DATA = Path(__file__).resolve().parent / "data" / "openshift"
DEFAULT_SCCS = yaml.safe_load((DATA / "default-sccs.yaml").read_text())
NAMESPACE_UIDS = range(1000700000, 1000710000)  # openshift.io/sa.scc.uid-range of a namespace: 1000700000/10000
VOLUME_TYPES = ("configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "hostPath", "persistentVolumeClaim",
                "projected", "secret")


def scc_validator() -> jsonschema.Draft4Validator:
    crd = yaml.safe_load((DATA / "security.openshift.io_securitycontextconstraints.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return jsonschema.Draft4Validator(strict(version["schema"]["openAPIV3Schema"]))


def admission_problems(scc: dict, pod: dict) -> list[str]:
    """Why `scc` would not admit the pod template (empty: it would)."""
    spec, problems = pod["spec"], []
    context = spec.get("securityContext") or {}
    if spec.get("hostNetwork") and not scc.get("allowHostNetwork"):
        problems.append("host network")
    for volume in spec.get("volumes", []):
        kind = next(key for key in VOLUME_TYPES if key in volume)
        if kind not in scc["volumes"] and "*" not in scc["volumes"]:
            problems.append(f"volume {volume['name']}: {kind}")
        if kind == "hostPath" and not scc.get("allowHostDirVolumePlugin"):
            problems.append(f"volume {volume['name']}: host directories")
    user, group = context.get("runAsUser"), context.get("fsGroup")
    strategy = scc["runAsUser"]["type"]
    if strategy == "MustRunAsRange" and user is not None and user not in NAMESPACE_UIDS:
        problems.append(f"runAsUser {user} outside the namespace's range")
    if strategy == "MustRunAsNonRoot" and (user == 0 or user is None and not context.get("runAsNonRoot")):
        problems.append("may run as root")
    if scc["fsGroup"]["type"] == "MustRunAs" and group is not None and group not in NAMESPACE_UIDS:
        problems.append(f"fsGroup {group} outside the namespace's range")
    allowed = set(scc.get("allowedCapabilities") or []) | set(scc.get("defaultAddCapabilities") or [])
    for container in spec.get("containers", []) + spec.get("initContainers", []):
        security = container.get("securityContext") or {}
        if security.get("privileged") and not scc.get("allowPrivilegedContainer"):
            problems.append(f"{container['name']}: privileged")
        if security.get("allowPrivilegeEscalation", True) and not scc.get("allowPrivilegeEscalation", True):
            problems.append(f"{container['name']}: privilege escalation")
        capabilities = security.get("capabilities") or {}
        for cap in capabilities.get("add", []):
            if cap not in allowed and "*" not in allowed:
                problems.append(f"{container['name']}: capability {cap}")
        if "ALL" in (scc.get("requiredDropCapabilities") or []) and "ALL" not in capabilities.get("drop", []):
            problems.append(f"{container['name']}: does not drop ALL")
    return problems


def benchmark(pods: dict, strategies=("ddp", "horovod")):
    return load_benchmark({"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark",
                           "metadata": {"name": "fab", "namespace": "perf"},
                           "spec": {"sweep": {"strategies": [{"name": s} for s in strategies],
                                              "scales": [{"nodes": 2, "devicesPerNode": 2}]}, "pods": pods}})


def templates(pods: dict) -> list[dict]:
    return [pod for job in every_kind({"pods": pods}) for pod in pods_of(job).values()]


GIB = [{"name": "gib", "mountPath": "/usr/local/gib", "readOnly": True, "hostPath": {"path": "/home/kubernetes/bin/gib"}}]


def test_a_fabrics_pods_get_an_scc_of_their_own_that_admits_every_pod_and_nonroot_v2_refuses_them():
    pods = {**FABRIC, "volumes": [*FABRIC["volumes"], *GIB], "capabilities": ["IPC_LOCK"]}
    scc, role, binding = openshift_objects(benchmark(pods))
    assert list(scc_validator().iter_errors(scc)) == []
    assert scc["allowedCapabilities"] == ["IPC_LOCK", "NET_BIND_SERVICE"] and scc["allowHostDirVolumePlugin"] is True
    assert "hostPath" in scc["volumes"] and scc["runAsUser"] == {"type": "MustRunAsNonRoot"}
    assert role["rules"] == [{"apiGroups": ["security.openshift.io"], "resources": ["securitycontextconstraints"],
                              "resourceNames": [scc["metadata"]["name"]], "verbs": ["use"]}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"] and binding["metadata"]["namespace"] == "perf"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "bench-runner", "namespace": "perf"}]
    every = templates(pods)
    assert len(every) >= 5  # PyTorchJob master and worker, MPIJob launcher and worker, TrainJob's pods
    for pod in every:
        assert admission_problems(scc, pod) == []
    refused = [admission_problems(DEFAULT_SCCS["nonroot-v2"], pod) for pod in every]
    assert all(refused) and any("capability IPC_LOCK" in " ".join(p) for p in refused)
    assert any("host directories" in " ".join(p) for p in refused)


def test_the_image_user_needs_nonroot_v2_which_is_granted_and_restricted_v2_refuses():
    objects = openshift_objects(benchmark({}))
    assert [o["kind"] for o in objects] == ["RoleBinding"]
    assert objects[0]["roleRef"]["name"] == "system:openshift:scc:nonroot-v2"
    assert objects[0]["subjects"][0]["name"] == "default"
    for pod in templates({}):  # Horovod's sshd workers among them
        assert admission_problems(DEFAULT_SCCS["nonroot-v2"], pod) == []
        assert "runAsUser 1000 outside the namespace's range" in admission_problems(DEFAULT_SCCS["restricted-v2"], pod)


def test_ids_left_to_the_platform_need_nothing_beyond_restricted_v2():
    unset = {"runAsUser": None, "runAsGroup": None, "fsGroup": None}
    assert openshift_objects(benchmark(unset, strategies=("ddp",))) == []
    for pod in templates(unset):
        assert admission_problems(DEFAULT_SCCS["restricted-v2"], pod) == []


def test_render_prints_them(tmp_path):
    spec = tmp_path / "b.yaml"
    spec.write_text(yaml.safe_dump({"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark",
                                    "metadata": {"name": "fab", "namespace": "perf"},
                                    "spec": {"sweep": {"strategies": [{"name": "horovod"}]},
                                             "pods": {"capabilities": ["IPC_LOCK"]}}}))
    printed = subprocess.run(["gpt2bench", "render", "--openshift", str(spec)], capture_output=True, text=True,
                             check=True, timeout=60).stdout
    kinds = [doc["kind"] for doc in yaml.safe_load_all(printed)]
    assert kinds == ["SecurityContextConstraints", "ClusterRole", "RoleBinding"]


def test_the_host_network_is_granted_with_its_ports():
    scc, _, _ = openshift_objects(benchmark({"hostNetwork": True}, strategies=("ddp",)))
    assert scc["allowHostNetwork"] is True and scc["allowHostPorts"] is True
    assert list(scc_validator().iter_errors(scc)) == []
