"""docs/clusters.md's per-cluster spec fragments, each merged into the GPU example and rendered for both backends:
valid jobs of every kind whose every training pod carries the fragment's fabric fields; and the GPU example's
own promises (schedules without a GPU Operator label, the GPUs and GPU-hours the README quotes)."""

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
from gpt2bench.spec.validation import load_benchmark

REPO = Path(__file__).resolve().parents[1]
DOC = (REPO / "docs" / "clusters.md").read_text(encoding="utf-8")
EXAMPLE = yaml.safe_load((REPO / "manifests" / "examples" / "gpu-papers.yaml").read_text())
FRAGMENTS = dict(re.findall(r"<!-- cluster: ([\w-]+) -->\s*```yaml\n(.*?)```", DOC, re.S))


def merged(base: dict, fragment: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in fragment.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def cluster_benchmark(name: str, backend: str):
    spec = merged(EXAMPLE["spec"], yaml.safe_load(FRAGMENTS[name])["spec"])
    spec["sweep"] = {**spec["sweep"], "repeats": 1, "precisions": ["bf16"]}  # every topology, fewer runs
    return load_benchmark({**EXAMPLE, "spec": {**spec, "backend": backend}})


def test_every_cluster_of_the_table_has_a_fragment():
    assert set(FRAGMENTS) == {"eks-efa", "gke-a3-ultra", "aks-nd", "onprem-ib", "air-gapped"}
    for row in ("EKS, p4d/p5 with EFA", "GKE A3 Ultra", "GKE A3 High / A3 Mega", "AKS, ND H100 v5",
                "on-prem InfiniBand", "on-prem RoCE", "any cluster, plain Ethernet"):
        assert f"| {row}" in DOC, row


@pytest.mark.parametrize("backend", ["pytorchjob", "trainjob"])
@pytest.mark.parametrize("name", sorted(FRAGMENTS))
def test_each_clusters_fields_reach_every_training_pod_of_every_job_kind(name, backend):
    bench = cluster_benchmark(name, backend)
    fragment = yaml.safe_load(FRAGMENTS[name])["spec"]
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


def test_what_the_readme_says_the_gpu_example_holds():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## The GPU example: what it holds")[1].split("\n## ")[0]
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
