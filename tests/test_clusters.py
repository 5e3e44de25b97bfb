"""docs/clusters.md's per-cluster spec fragments, each merged into the GPU example and rendered for both backends:
valid jobs of every kind whose every training pod carries the fragment's fabric fields; and the GPU example's
own promises (schedules without a GPU Operator label, the GPUs and GPU-hours docs/quickstart.md quotes)."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import yaml
from kubeflow_crds import validate_job
from pod_security import violations
from test_render_fabric import pods_of, trains

from gpt2bench.plan import gpu_hours, plan_runs
from gpt2bench.render import render_all
from gpt2bench.specification.validation import load_benchmark

REPO = Path(__file__).resolve().parents[1]
DOC = (REPO / "docs" / "clusters.md").read_text(encoding="utf-8")
EXAMPLE = yaml.safe_load((REPO / "manifests" / "examples" / "gpu-papers.yaml").read_text())
FRAGMENTS = dict(re.findall(r"<!-- cluster: ([\w-]+) -->\s*```yaml\n(.*?)```", DOC, re.S))


def merged(base: dict, fragment: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in fragment.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


PLACEHOLDER = re.compile(r'"<([^<>"]+)>"')


def filled_in(fragment: str) -> str:
    """A fragment as a user fills it in: each quoted `"<value>"` placeholder becomes the value (`"106"`)."""
    return PLACEHOLDER.sub(r'"\1"', fragment)


def cluster_benchmark(name: str, backend: str):
    spec = merged(EXAMPLE["spec"], yaml.safe_load(filled_in(FRAGMENTS[name]))["spec"])
    spec["sweep"] = {**spec["sweep"], "repeats": 1, "precisions": ["bf16"]}  # every topology, fewer runs
    return load_benchmark({**EXAMPLE, "spec": {**spec, "backend": backend}})


REFUSED = dict(re.findall(r"<!-- refused: ([\w-]+) -->\s*```yaml\n(.*?)```", DOC, re.S))


def test_every_cluster_of_the_table_has_a_fragment():
    assert set(FRAGMENTS) == {"eks-efa", "gke-a3-ultra", "aks-nd", "onprem-ib", "onprem-roce", "air-gapped"}
    assert set(REFUSED) == {"gke-a3-mega"}
    for row in ("EKS, p4d/p5 with EFA", "GKE A3 Ultra", "GKE A3 High / A3 Mega", "AKS, ND H100 v5",
                "on-prem InfiniBand", "on-prem RoCE", "OpenShift", "any cluster, plain Ethernet"):
        assert f"| {row}" in DOC, row


@pytest.mark.parametrize("backend", ["pytorchjob", "trainjob"])
@pytest.mark.parametrize("name", sorted(FRAGMENTS))
def test_each_clusters_fields_reach_every_training_pod_of_every_job_kind(name, backend):
    bench = cluster_benchmark(name, backend)
    fragment = yaml.safe_load(filled_in(FRAGMENTS[name]))["spec"]
    pods = fragment.get("pods", {})
    jobs = render_all(bench)
    assert {job["kind"] for job in jobs} == ({"TrainJob"} if backend == "trainjob" else {"PyTorchJob", "MPIJob"})
    for job in jobs:
        validate_job(job)
        for role, pod in pods_of(job).items():
            if not trains(job, role):
                continue
            where = f"{name} {job['metadata']['name']} {role}"
            (container,) = pod["spec"]["containers"]
            env = {item["name"]: item for item in container.get("env", [])}
            for item in pods.get("env", []):
                assert env[item["name"]] == item, where
            for volume in pods.get("volumes", []):
                assert volume["name"] in {v["name"] for v in pod["spec"]["volumes"]}, where
                assert volume["mountPath"] in {m["mountPath"] for m in container["volumeMounts"]}, where
            for key, value in pods.get("annotations", {}).items():
                assert pod["metadata"]["annotations"][key] == value, where
            assert container["securityContext"]["capabilities"].get("add", []) == pods.get("capabilities", []), where
            limits = container.get("resources", {}).get("limits", {})
            for resource, amount in fragment.get("resources", {}).get("limits", {}).items():
                assert limits[resource] == amount, where
            for key, value in fragment.get("nodeSelector", {}).items():
                assert pod["spec"]["nodeSelector"][key] == value, where
            if fragment.get("fabric", {}).get("require"):
                assert env["GPT2BENCH_FABRIC"]["value"] == fragment["fabric"]["require"], where
            # only what the row says leaves "restricted" does
            expected = ({"capabilities"} if pods.get("capabilities") else set()) | (
                {"hostPathVolumes", "restrictedVolumes"} if any("hostPath" in v for v in pods.get("volumes", []))
                else set())
            assert {v.split(":")[0] for v in violations(pod)} == expected, where


def test_the_gpu_example_needs_no_gpu_operator_label_and_requests_its_gpus():
    """nvidia.com/gpu.present exists only where the GPU Operator's feature discovery runs: the example schedules
    by the resource it requests, which every GPU device plugin offers."""
    bench = load_benchmark({**EXAMPLE, "spec": {**EXAMPLE["spec"], "backend": "pytorchjob"}})
    assert bench.spec.node_selector == {} and not bench.spec.scheduling.gang
    for job in render_all(bench):
        for role, pod in pods_of(job).items():
            limits = pod["spec"]["containers"][0]["resources"]["limits"]
            assert "nodeSelector" not in pod["spec"]
            assert limits.get("nvidia.com/gpu", 0) >= (1 if trains(job, role) else 0)
            assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]


def test_what_the_quick_start_says_the_gpu_example_holds():
    page = (REPO / "docs" / "quickstart.md").read_text(encoding="utf-8")
    section = page.split("## The GPU example: what it holds")[1].split("\n## ")[0]
    bench = load_benchmark(EXAMPLE)
    runs = plan_runs(bench)
    by_gpus = {gpus: sum(run.gpus_held == gpus for run in runs) for gpus in (1, 4, 8)}
    assert by_gpus == {1: 12, 4: 60, 8: 60} and len(runs) == 132  # a breakdown round and 3 decision rounds
    deadline = bench.spec.run_policy.active_deadline_seconds
    quoted = {
        "runs": len(runs), "GPU-runs": sum(run.gpus_held for run in runs),
        "GPU-hours at most": gpu_hours(runs, deadline), "GPU-hours at 3 minutes a run": gpu_hours(runs, 180),
        "hours of wall time at 3 minutes a run": len(runs) * 180 / 3600,
        "USD at 2.50 per GPU-hour": gpu_hours(runs, 180) * 2.5,
    }
    for what, value in quoted.items():
        text = f"{value:,.2f}".rstrip("0").rstrip(".")
        assert f"{text} {what}" in section, (what, text)


def env_of(bench) -> dict[str, str]:
    return {item.name: item.value for item in bench.spec.pods.env}


def test_each_fragment_carries_the_values_its_provider_publishes():
    """The values docs/clusters.md cites (and the ones issue 36 found wrong): AKS excludes its Ethernet mlx5 device
    instead of naming a device no AKS node has; on-prem names its HCAs exactly (a bare `mlx5` prefix also matches a
    management NIC); RoCE sets a traffic class and leaves the GID to NCCL; gIB sources the node's script and
    attaches gvnic-1; no fragment adds IPC_LOCK, which never reaches the non-root trainer."""
    aks = env_of(cluster_benchmark("aks-nd", "pytorchjob"))
    assert aks["NCCL_IB_HCA"] == "^mlx5_8" and aks["NCCL_TOPO_FILE"] == "/opt/nvidia-topology/topo.xml"
    assert "kubernetes.azure.com/agentpool" in cluster_benchmark("aks-nd", "pytorchjob").spec.node_selector
    for name in ("onprem-ib", "onprem-roce"):
        hcas = env_of(cluster_benchmark(name, "pytorchjob"))["NCCL_IB_HCA"]
        assert hcas.startswith("=") and all(part.startswith("mlx5_") for part in hcas[1:].split(","))
    roce = env_of(cluster_benchmark("onprem-roce", "pytorchjob"))
    assert "NCCL_IB_TC" in roce and "NCCL_IB_GID_INDEX" not in roce
    gke = cluster_benchmark("gke-a3-ultra", "pytorchjob")
    assert gke.spec.fabric.nccl_env_script == "/usr/local/gib/scripts/set_nccl_env.sh"
    assert '"network":"gvnic-1"' in gke.spec.pods.annotations["networking.gke.io/interfaces"]
    eks = env_of(cluster_benchmark("eks-efa", "pytorchjob"))
    assert eks["FI_PROVIDER"] == "efa" and eks["FI_EFA_FORK_SAFE"] == "1"
    for name in FRAGMENTS:
        bench = cluster_benchmark(name, "pytorchjob")
        assert bench.spec.pods.capabilities == [], name
        if name != "air-gapped":
            assert bench.spec.fabric.require == "rdma", name


def test_the_tcpxo_fragment_is_refused_at_admission_with_the_reason():
    from kube.semantics import ApiError, validate_custom_resource
    from test_validation_rules import VERSION

    from gpt2bench.specification.validation import SpecError

    fragment = yaml.safe_load(REFUSED["gke-a3-mega"])["spec"]
    document = {**EXAMPLE, "spec": merged(EXAMPLE["spec"], fragment)}
    with pytest.raises(SpecError) as refused:
        load_benchmark(document)
    (path, message), = refused.value.errors
    assert path == "spec.pods.env[0].name" and "RxDM daemon as a second container" in message
    with pytest.raises(ApiError, match="RxDM daemon as a second container"):
        validate_custom_resource(document, VERSION, strict=True)


@pytest.mark.parametrize("name", sorted(set(FRAGMENTS) - {"air-gapped"}))
def test_the_mpi_launcher_takes_none_of_the_fabric_and_open_mpi_follows_nccls_interfaces(name):
    bench = cluster_benchmark(name, "pytorchjob")
    launcher_pod = next(pods_of(job)["Launcher"] for job in render_all(bench)
                        if job["kind"] == "MPIJob" and job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] > 1)
    annotations = launcher_pod["metadata"].get("annotations") or {}
    assert not {"k8s.v1.cni.cncf.io/networks", "networking.gke.io/interfaces"} & set(annotations)
    assert "nodeSelector" not in launcher_pod["spec"]
    (container,) = launcher_pod["spec"]["containers"]
    assert "add" not in container["securityContext"]["capabilities"]
    command = container["command"]
    ifname = env_of(bench).get("NCCL_SOCKET_IFNAME")
    mca = {command[i + 1]: command[i + 2] for i, word in enumerate(command) if word == "-mca"}
    if ifname and ifname.startswith("^"):
        assert mca["btl_tcp_if_exclude"] == mca["oob_tcp_if_exclude"] == "127.0.0.1/8," + ifname[1:]
    elif ifname:
        assert mca["btl_tcp_if_include"] == mca["oob_tcp_if_include"] == ifname.lstrip("=")
