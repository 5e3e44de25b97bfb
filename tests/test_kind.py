"""End to end on a real cluster: kind, the Helm chart, the Kubeflow training operator and the CPU example.

Needs Docker (a running engine), kind, kubectl and helm, plus network access for the training operator's
manifests (or a local copy); it is skipped with the missing piece named otherwise. It cannot run on the
development machines (no Docker engine there), so it is written to be run by hand or in a CI job that has
them:

    GPT2BENCH_KIND_IMAGE=gpt2bench:dev pytest -m kind tests/test_kind.py     # reuse a built image
    pytest -m kind tests/test_kind.py                                         # builds the Dockerfile first

Environment:
    GPT2BENCH_KIND_IMAGE          image to load into kind (default: build ./Dockerfile as gpt2bench:kind-test)
    GPT2BENCH_TRAINING_OPERATOR   `kubectl apply -k` target of the Kubeflow training operator
    GPT2BENCH_KIND_KEEP=1         keep the cluster afterwards (debugging)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
HELM = ROOT / ".tools" / "bin" / "helm"
EXAMPLE = ROOT / "manifests" / "examples" / "cpu-sweep.yaml"
TRAINING_OPERATOR = os.environ.get(
    "GPT2BENCH_TRAINING_OPERATOR",
    "github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=v1.8.1")
FINISHED = {"Succeeded", "PartiallySucceeded", "Failed", "Invalid"}


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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> dict[str, str]:
    name = f"gpt2bench-{uuid.uuid4().hex[:6]}"
    kubeconfig = str(tmp_path_factory.mktemp("kind") / "kubeconfig")
    sh("kind", "create", "cluster", "--name", name, "--kubeconfig", kubeconfig, "--wait", "180s", timeout=600)
    env = {**os.environ, "KUBECONFIG": kubeconfig}
    try:
        image = os.environ.get("GPT2BENCH_KIND_IMAGE")
        if not image:
            image = "gpt2bench:kind-test"
            sh("docker", "build", "-t", image, str(ROOT), timeout=3600)
        sh("kind", "load", "docker-image", image, "--name", name, timeout=900)
        sh("kubectl", "apply", "--server-side", "-k", TRAINING_OPERATOR, env=env, timeout=300)
        sh("kubectl", "-n", "kubeflow", "rollout", "status", "deployment/training-operator", "--timeout=300s",
           env=env, timeout=360)
        yield {"name": name, "image": image, "KUBECONFIG": kubeconfig}
    finally:
        if not os.environ.get("GPT2BENCH_KIND_KEEP"):
            subprocess.run(["kind", "delete", "cluster", "--name", name], check=False, capture_output=True, timeout=300)


def test_chart_installs_and_the_cpu_example_finishes_with_results(cluster: dict[str, str], tmp_path: Path) -> None:
    env = {**os.environ, "KUBECONFIG": cluster["KUBECONFIG"]}
    repository, _, tag = cluster["image"].rpartition(":")
    sh(str(HELM), "install", "gpt2bench", str(ROOT / "helm" / "gpt2bench"), "--namespace", "gpt2bench-system",
       "--create-namespace", "--wait", "--timeout", "5m", "--set", f"image.repository={repository}",
       "--set", f"image.tag={tag}", "--set", "image.pullPolicy=Never", env=env, timeout=400)
    crd = json.loads(sh("kubectl", "get", "crd", "gpt2benchmarks.gpt2bench.io", "-o", "json", env=env))
    assert crd["spec"]["names"]["kind"] == "GPT2Benchmark"

    benchmark = yaml.safe_load(EXAMPLE.read_text())
    benchmark["spec"]["image"] = cluster["image"]
    benchmark["spec"]["imagePullPolicy"] = "Never"
    manifest = tmp_path / "cpu-sweep.yaml"
    manifest.write_text(yaml.safe_dump(benchmark))
    sh("kubectl", "apply", "-f", str(manifest), env=env)

    name = benchmark["metadata"]["name"]
    deadline = time.monotonic() + 45 * 60
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = json.loads(sh("kubectl", "get", "gpt2benchmark", name, "-o", "json", env=env)).get("status") or {}
        if status.get("phase") in FINISHED:
            break
        time.sleep(15)
    assert status.get("phase") in FINISHED, f"sweep did not finish: {status}"
    runs = status["runs"]
    pytorch_runs = [r for r in runs if r["jobKind"] == "PyTorchJob"]
    assert pytorch_runs and all(r["phase"] == "Succeeded" for r in pytorch_runs), json.dumps(runs, indent=1)
    for run in pytorch_runs:
        assert run["results"]["tokensPerSecond"] > 0 and run["results"]["finalLoss"] > 0
    # MPIJob runs need the MPI operator, which this test does not install: they fail with a reason.
    for run in runs:
        if run["phase"] == "Failed":
            assert run.get("reason"), run
    table = sh("kubectl", "get", "gpt2benchmark", name, env=env)
    assert name in table
