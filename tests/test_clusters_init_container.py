"""The training operator's init container for PyTorchJob Workers, in a Pod Security "restricted" namespace, where
its built-in template (no securityContext) gets every Worker refused: manifests/kubeflow/training-operator ships a
template (init-container.yaml) with a restricted securityContext, mounted where
`--pytorch-init-container-template-file` names it. Checked as the operator uses it (training-operator v1.9.0
pkg/controller.v1/pytorch/initcontainer.go: the file's Go template filled with the image, the tries and the
Master's name, parsed as a list of containers, appended to every Worker's initContainers) on the PyTorchJob
gpt2bench renders."""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path

import yaml
from kube.tools import kubectl
from pod_security import violations

from gpt2bench.plan import plan_runs
from gpt2bench.render import render_job
from gpt2bench.specification.validation import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
KUSTOMIZATION = ROOT / "manifests" / "kubeflow" / "training-operator"
SCRIPT = ROOT / "scripts" / "e2e-kind.sh"


def fill(template: str, image: str = "alpine:3.10", tries: int = 100, master: str = "run-master-0") -> list[dict]:
    """The operator's substitution of its three fields, then the YAML list it unmarshals."""
    values = {"InitContainerImage": image, "MaxTries": str(tries), "MasterAddr": master}
    filled = re.sub(r"\{\{\s*\.(\w+)\s*\}\}", lambda m: values[m.group(1)], template)
    return yaml.safe_load(filled)


def worker_with(init_containers: list[dict]) -> dict:
    bench = load_benchmark({"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark", "metadata": {"name": "r"},
                            "spec": {"backend": "pytorchjob", "sweep": {"strategies": [{"name": "ddp"}],
                                                                        "scales": [{"nodes": 2, "devicesPerNode": 1}]}}})
    (run,) = plan_runs(bench)
    worker = copy.deepcopy(render_job(bench, run)["spec"]["pytorchReplicaSpecs"]["Worker"]["template"])
    worker["spec"].setdefault("initContainers", []).extend(init_containers)
    return worker


def test_the_shipped_template_gives_workers_an_init_container_restricted_admits():
    (init,) = fill((KUSTOMIZATION / "init-container.yaml").read_text())
    assert init["name"] == "init-pytorch" and init["image"] == "alpine:3.10"
    assert "nslookup run-master-0" in init["command"][2] and "seq 100" in init["command"][2]
    assert violations(worker_with([init])) == []
    # the same container without its securityContext, as the operator's built-in template makes it, is refused
    bare = {key: value for key, value in init.items() if key != "securityContext"}
    refused = violations(worker_with([bare]))
    assert any("allowPrivilegeEscalation" in line for line in refused), refused
    assert any("capabilities" in line for line in refused), refused


def test_the_kustomization_mounts_the_template_where_the_operators_flag_names_it(tmp_path):
    """Built with kubectl's kustomize over a stand-in of the upstream overlay (tests/test_workflows.py's way)."""
    base = tmp_path / "upstream"
    base.mkdir()
    (base / "kustomization.yaml").write_text("resources: [deployment.yaml]\n")
    (base / "deployment.yaml").write_text(yaml.safe_dump({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "training-operator", "namespace": "kubeflow"},
        "spec": {"template": {"spec": {
            "containers": [{"name": "training-operator", "image": "upstream",
                            "volumeMounts": [{"name": "cert", "mountPath": "/tmp/k8s-webhook-server/serving-certs"}]}],
            "volumes": [{"name": "cert", "secret": {"secretName": "training-operator-webhook-cert"}}]}}}}))
    overlay = tmp_path / "overlay"
    env = {"PATH": "/usr/bin:/bin", "GPT2BENCH_TRAINING_OPERATOR": "../upstream"}
    subprocess.run(["bash", str(SCRIPT), "kustomization", str(overlay)], check=True, env=env, timeout=30)
    built = subprocess.run([kubectl(), "kustomize", str(overlay)], capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, built.stderr
    docs = list(yaml.safe_load_all(built.stdout))
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap"]
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    flags = dict(arg.split("=", 1) for arg in container["args"])
    template_file = Path(flags["--pytorch-init-container-template-file"])
    assert flags["--pytorch-init-container-image"] == "alpine:3.10"
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(template_file.parent)]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]  # the generator's hashed name, followed
    assert config_map["data"][template_file.name] == (KUSTOMIZATION / "init-container.yaml").read_text()
    assert {m["name"] for m in container["volumeMounts"]} == {"cert", mount["name"]}  # upstream's kept


def test_the_air_gapped_path_lists_the_init_containers_image():
    doc = (ROOT / "docs" / "clusters.md").read_text(encoding="utf-8")
    section = doc.split("## Data and weights; one air-gapped path end to end")[1].split("\n## ")[0]
    assert "alpine:3.10" in section and "--pytorch-init-container-image" in section
