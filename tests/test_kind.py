"""End to end on a real cluster: kind, the Helm chart, the Kubeflow operators and the CPU example.

The Kubeflow operators installed serve exactly what gpt2bench renders: the training operator v1.9 for
PyTorchJob kubeflow.org/v1, run with `--enable-scheme=pytorchjob` and without its own mpijobs CRD (which
serves MPIJob at v1), and the MPI operator v0.8 for MPIJob kubeflow.org/v2beta1 (/work/shared/crds/README.md).
The benchmark runs in a namespace that enforces Pod Security "restricted", and must finish Complete with
every run, horovod included, Succeeded; the cluster report then draws the per-step curves.

Needs Docker (a running engine), kind, kubectl and helm, plus network access for the operators' manifests;
it is skipped with the missing piece named otherwise. It cannot run on the development machines (no Docker
engine there), so it is written to be run by hand or in a CI job that has them:

    pytest -m kind tests/test_kind.py                     # builds the trainer and operator images first
    GPT2BENCH_KIND_IMAGE=gpt2bench:dev GPT2BENCH_KIND_OPERATOR_IMAGE=gpt2bench-operator:dev pytest -m kind ...

Environment:
    GPT2BENCH_KIND_IMAGE            trainer image to load into kind (default: build ./Dockerfile's `trainer`)
    GPT2BENCH_KIND_OPERATOR_IMAGE   operator image (default: build ./Dockerfile's `operator` target)
    GPT2BENCH_TRAINING_OPERATOR     kustomize target of the Kubeflow training operator
    GPT2BENCH_MPI_OPERATOR          manifest URL of the MPI operator
    GPT2BENCH_KIND_KEEP=1           keep the cluster afterwards (debugging)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpt2bench.protocol import MPIJOB_API, PYTORCHJOB_API

ROOT = Path(__file__).resolve().parent.parent
HELM = ROOT / ".tools" / "bin" / "helm"
EXAMPLE = ROOT / "manifests" / "examples" / "cpu-sweep.yaml"
TRAINING_OPERATOR = os.environ.get(
    "GPT2BENCH_TRAINING_OPERATOR",
    "github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=v1.9.0")
MPI_OPERATOR = os.environ.get(
    "GPT2BENCH_MPI_OPERATOR",
    "https://raw.githubusercontent.com/kubeflow/mpi-operator/v0.8.2/deploy/v2beta1/mpi-operator.yaml")
# The training operator without its MPIJob: its mpijobs.kubeflow.org CRD (v1) has the name of the MPI
# operator's (v2beta1), so a cluster can serve only one of them.
TRAINING_OPERATOR_KUSTOMIZATION = {
    "apiVersion": "kustomize.config.k8s.io/v1beta1",
    "kind": "Kustomization",
    "resources": [TRAINING_OPERATOR],
    "patches": [
        {"target": {"kind": "CustomResourceDefinition", "name": "mpijobs.kubeflow.org"},
         "patch": "$patch: delete\napiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\n"
                  "metadata:\n  name: mpijobs.kubeflow.org\n"},
        {"target": {"kind": "Deployment", "name": "training-operator"},
         "patch": json.dumps([{"op": "add", "path": "/spec/template/spec/containers/0/args",
                               "value": ["--enable-scheme=pytorchjob"]}])},
    ],
}


def _missing() -> str | None:
    for tool in ("docker", "kind", "kubectl"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not HELM.exists():
        return f"helm not installed at {HELM}"
    try:
        probe = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], check=False,
                               capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "the Docker engine does not answer (docker info timed out)"
    if probe.returncode != 0 or not probe.stdout.strip():
        return "no Docker engine is reachable (docker info failed)"
    return None


MISSING = _missing()
pytestmark = [
    pytest.mark.kind,
    pytest.mark.slow,
    pytest.mark.skipif(MISSING is not None, reason=f"kind e2e needs Docker + kind: {MISSING}"),
]


def sh(*args: str, timeout: float = 600, **kwargs: Any) -> str:
    proc = subprocess.run(list(args), check=False, capture_output=True, text=True, timeout=timeout, **kwargs)
    if proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return proc.stdout


def served(env: dict[str, str], group_version: str) -> set[str]:
    listing = json.loads(sh("kubectl", "get", "--raw", f"/apis/{group_version}", env=env))
    return {r["name"] for r in listing["resources"] if "/" not in r["name"]}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> dict[str, str]:
    name = f"gpt2bench-{uuid.uuid4().hex[:6]}"
    work = tmp_path_factory.mktemp("kind")
    kubeconfig = str(work / "kubeconfig")
    sh("kind", "create", "cluster", "--name", name, "--kubeconfig", kubeconfig, "--wait", "180s", timeout=600)
    env = {**os.environ, "KUBECONFIG": kubeconfig}
    try:
        images = {"trainer": os.environ.get("GPT2BENCH_KIND_IMAGE"),
                  "operator": os.environ.get("GPT2BENCH_KIND_OPERATOR_IMAGE")}
        for target, image in images.items():
            if not image:
                images[target] = image = f"gpt2bench-{target}:kind-test"
                sh("docker", "build", "--target", target, "-t", image, str(ROOT), timeout=3600)
            sh("kind", "load", "docker-image", image, "--name", name, timeout=900)
        (work / "training-operator").mkdir()
        (work / "training-operator" / "kustomization.yaml").write_text(yaml.safe_dump(TRAINING_OPERATOR_KUSTOMIZATION))
        sh("kubectl", "apply", "--server-side", "-k", str(work / "training-operator"), env=env, timeout=300)
        sh("kubectl", "apply", "--server-side", "-f", MPI_OPERATOR, env=env, timeout=300)
        for namespace, deployment in (("kubeflow", "training-operator"), ("mpi-operator", "mpi-operator")):
            sh("kubectl", "-n", namespace, "rollout", "status", f"deployment/{deployment}", "--timeout=300s",
               env=env, timeout=360)
        yield {"name": name, "KUBECONFIG": kubeconfig, **images}
    finally:
        if not os.environ.get("GPT2BENCH_KIND_KEEP"):
            subprocess.run(["kind", "delete", "cluster", "--name", name], check=False, capture_output=True, timeout=300)


def test_the_operators_serve_exactly_the_versions_rendered(cluster: dict[str, str]) -> None:
    env = {**os.environ, "KUBECONFIG": cluster["KUBECONFIG"]}
    assert "pytorchjobs" in served(env, PYTORCHJOB_API) and "mpijobs" not in served(env, PYTORCHJOB_API)
    assert "mpijobs" in served(env, MPIJOB_API)


def test_the_cpu_example_completes_under_restricted_pod_security_with_curves(cluster: dict[str, str],
                                                                           tmp_path: Path) -> None:
    env = {**os.environ, "KUBECONFIG": cluster["KUBECONFIG"]}
    operator_repo, _, operator_tag = cluster["operator"].rpartition(":")
    trainer_repo, _, trainer_tag = cluster["trainer"].rpartition(":")
    sh(str(HELM), "install", "gpt2bench", str(ROOT / "helm" / "gpt2bench"), "--namespace", "gpt2bench-system",
       "--create-namespace", "--wait", "--timeout", "5m", "--set", f"image.repository={operator_repo}",
       "--set", f"image.tag={operator_tag}", "--set", "image.pullPolicy=Never",
       "--set", f"trainerImage.repository={trainer_repo}", "--set", f"trainerImage.tag={trainer_tag}",
       env=env, timeout=400)
    crd = json.loads(sh("kubectl", "get", "crd", "gpt2benchmarks.gpt2bench.io", "-o", "json", env=env))
    assert crd["spec"]["names"]["kind"] == "GPT2Benchmark"

    sh("kubectl", "create", "namespace", "bench", env=env)
    sh("kubectl", "label", "namespace", "bench", "pod-security.kubernetes.io/enforce=restricted", env=env)
    benchmark = yaml.safe_load(EXAMPLE.read_text())
    benchmark["spec"]["imagePullPolicy"] = "Never"  # the image the chart names, loaded into kind
    manifest = tmp_path / "cpu-sweep.yaml"
    manifest.write_text(yaml.safe_dump(benchmark))
    sh("kubectl", "apply", "-n", "bench", "-f", str(manifest), env=env)

    name = benchmark["metadata"]["name"]
    sh("kubectl", "wait", "-n", "bench", "--for=condition=Complete", f"gpt2benchmark/{name}", "--timeout=45m",
       env=env, timeout=46 * 60)
    status = json.loads(sh("kubectl", "get", "-n", "bench", "gpt2benchmark", name, "-o", "json", env=env))["status"]
    assert status["phase"] == "Succeeded", json.dumps(status["runs"], indent=1)
    assert {r["jobKind"] for r in status["runs"]} == {"PyTorchJob", "MPIJob"}
    for run in status["runs"]:
        assert run["results"]["tokensPerSecond"] > 0 and run["results"]["finalLoss"] > 0
    maps = json.loads(sh("kubectl", "get", "configmaps", "-n", "bench", "-l", "app.kubernetes.io/component=steps",
                         "-o", "json", env=env))["items"]
    assert len(maps) == len(status["runs"]), "every run's curves kept"
    out = tmp_path / "report"
    sh(sys.executable, "-m", "gpt2bench", "report", "--cluster", name, "-n", "bench", "--output", str(out),
       "--quiet", env=env, timeout=300)
    assert (out / "loss.png").stat().st_size > 1000
