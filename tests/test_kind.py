"""End to end on a real cluster: kind, the Helm chart, the Kubeflow operators and the CPU example.

Two clusters, one per backend (docs/backends.md), each with only what that backend needs; the example
leaves `spec.backend` at `auto`, so the operator picks the backend from what the cluster serves.

`pytorchjob`: the Kubeflow operators installed serve exactly what gpt2bench renders: the training operator
v1.9 for PyTorchJob kubeflow.org/v1, run with `--enable-scheme=pytorchjob` and without its own mpijobs CRD
(which serves MPIJob at v1), and the MPI operator v0.8 for MPIJob kubeflow.org/v2beta1
(/work/shared/crds/README.md).

`trainjob`: Kubeflow Trainer v2.3.0 (its `manifests/overlays/manager`, which brings JobSet v0.12.0) on
Kubernetes 1.32 (Trainer v2 needs 1.31 or later; 1.32 is what upstream's own e2e runs), no kubeflow.org
group, and gpt2bench's two ClusterTrainingRuntimes rendered with the trainer image loaded into kind
(`gpt2bench render --runtimes --image`: the MPI runtime's sshd pods, where horovod's ranks run, use the
runtime's image; the chart's copy names the released image, so the chart goes in with
`trainerRuntimes.install=false`). Each check has an emulator counterpart that runs everywhere:
    - only TrainJob (trainer.kubeflow.org/v1alpha1) and JobSet are served, and `auto` resolves to trainjob:
      tests/test_trainer_v2_emulator.py::test_only_trainer_v2_is_served_and_auto_resolves_to_trainjob;
    - every run a TrainJob on gpt2bench-torch or gpt2bench-mpi, horovod included, with its results in
      status, status.backend and the `-o wide` BACKEND column `trainjob`: tests/test_operator_trainer_v2.py::
      test_auto_sweeps_as_trainjobs_with_a_failure_and_horovod_every_result_in_status;
    - the pods Trainer v2 and JobSet make from the runtimes pass Pod Security "restricted":
      tests/test_trainer_v2_emulator.py::test_a_sweep_of_trainjobs_runs_to_results_with_a_failure_and_horovod;
    - every run's per-step curves kept in a ConfigMap, drawn by the cluster report: tests/
      test_operator_trainer_v2.py::test_per_step_curves_of_trainjob_runs_outlive_the_pods_and_the_cluster_report_draws_them.

Either way the benchmark runs in a namespace that enforces Pod Security "restricted", and must finish
Complete with every run, horovod included, Succeeded; the cluster report then draws the per-step curves.

Needs Docker (a running engine), kind, kubectl and helm, plus network access for the operators' manifests;
it is skipped with the missing piece named otherwise. It cannot run on the development machines (no Docker
engine there), so it is written to be run by hand or in a CI job that has them:

    pytest -m kind tests/test_kind.py                     # builds the trainer and operator images first
    pytest -m kind tests/test_kind.py -k trainjob         # the Trainer v2 cluster only
    GPT2BENCH_KIND_IMAGE=gpt2bench:dev GPT2BENCH_KIND_OPERATOR_IMAGE=gpt2bench-operator:dev pytest -m kind ...

Environment:
    GPT2BENCH_KIND_IMAGE            trainer image to load into kind (default: build ./Dockerfile's `trainer`)
    GPT2BENCH_KIND_OPERATOR_IMAGE   operator image (default: build ./Dockerfile's `operator` target)
    GPT2BENCH_TRAINING_OPERATOR     kustomize target of the Kubeflow training operator
    GPT2BENCH_MPI_OPERATOR          manifest URL of the MPI operator
    GPT2BENCH_TRAINER_V2            kustomize target of Kubeflow Trainer v2 (with JobSet)
    GPT2BENCH_TRAINER_V2_NODE_IMAGE kind node image of the Trainer v2 cluster (Kubernetes >= 1.31)
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

from gpt2bench.jobkinds import PYTORCHJOB, TRAINJOB, resolve_backend, served_job_kinds
from gpt2bench.protocol import MPIJOB_API, PYTORCHJOB_API, TRAINJOB_API
from gpt2bench.render.runtimes import MPI_RUNTIME, TORCH_RUNTIME

ROOT = Path(__file__).resolve().parent.parent
HELM = ROOT / ".tools" / "bin" / "helm"
EXAMPLE = ROOT / "manifests" / "examples" / "cpu-sweep.yaml"
TRAINING_OPERATOR = os.environ.get(
    "GPT2BENCH_TRAINING_OPERATOR",
    "github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=v1.9.0")
MPI_OPERATOR = os.environ.get(
    "GPT2BENCH_MPI_OPERATOR",
    "https://raw.githubusercontent.com/kubeflow/mpi-operator/v0.8.2/deploy/v2beta1/mpi-operator.yaml")
TRAINER_V2 = os.environ.get(
    "GPT2BENCH_TRAINER_V2", "https://github.com/kubeflow/trainer.git/manifests/overlays/manager?ref=v2.3.0")
TRAINER_V2_NODE_IMAGE = os.environ.get("GPT2BENCH_TRAINER_V2_NODE_IMAGE", "kindest/node:v1.32.0")
TRAINER_V2_NAMESPACE = "kubeflow-system"  # the overlay's namespace: the Trainer's and JobSet's controllers
JOBSET_API = "jobset.x-k8s.io/v1alpha2"
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


def install_v1_operators(env: dict[str, str], work: Path, images: dict[str, str]) -> None:
    (work / "training-operator").mkdir()
    (work / "training-operator" / "kustomization.yaml").write_text(yaml.safe_dump(TRAINING_OPERATOR_KUSTOMIZATION))
    sh("kubectl", "apply", "--server-side", "-k", str(work / "training-operator"), env=env, timeout=300)
    sh("kubectl", "apply", "--server-side", "-f", MPI_OPERATOR, env=env, timeout=300)
    for namespace, deployment in (("kubeflow", "training-operator"), ("mpi-operator", "mpi-operator")):
        sh("kubectl", "-n", namespace, "rollout", "status", f"deployment/{deployment}", "--timeout=300s",
           env=env, timeout=360)


def install_trainer_v2(env: dict[str, str], work: Path, images: dict[str, str]) -> None:
    """Trainer v2 as its installation guide says, ready as its own e2e waits; then gpt2bench's runtimes
    with the trainer image (through Trainer's validating webhook, hence after the wait)."""
    sh("kubectl", "apply", "--server-side", "-k", TRAINER_V2, env=env, timeout=300)
    sh("kubectl", "-n", TRAINER_V2_NAMESPACE, "wait", "deployment/kubeflow-trainer-controller-manager",
       "--for=condition=Available", "--timeout=300s", env=env, timeout=360)
    sh("kubectl", "-n", TRAINER_V2_NAMESPACE, "wait", "pods", "--all", "--for=condition=Ready", "--timeout=300s",
       env=env, timeout=360)
    runtimes = work / "runtimes.yaml"
    runtimes.write_text(sh(sys.executable, "-m", "gpt2bench", "render", "--runtimes", "--image", images["trainer"]))
    sh("kubectl", "apply", "--server-side", "-f", str(runtimes), env=env, timeout=120)


INSTALL = {PYTORCHJOB: install_v1_operators, TRAINJOB: install_trainer_v2}
NODE_IMAGE = {PYTORCHJOB: None, TRAINJOB: TRAINER_V2_NODE_IMAGE}
# What the example's runs become, and the chart's values, per backend.
JOB_KINDS = {PYTORCHJOB: {"PyTorchJob", "MPIJob"}, TRAINJOB: {"TrainJob"}}
CHART_VALUES = {PYTORCHJOB: [], TRAINJOB: ["--set", "trainerRuntimes.install=false"]}  # installed above


# One cluster per backend, the tests grouped by it (a module-scoped parameter): never two at once.
@pytest.fixture(scope="module", params=[PYTORCHJOB, TRAINJOB])
def cluster(request, tmp_path_factory) -> dict[str, str]:
    """A kind cluster with the operators of one backend, and nothing of the other."""
    backend = request.param
    name = f"gpt2bench-{uuid.uuid4().hex[:6]}"
    work = tmp_path_factory.mktemp(f"kind-{backend}")
    kubeconfig = str(work / "kubeconfig")
    node_image = ["--image", NODE_IMAGE[backend]] if NODE_IMAGE[backend] else []
    sh("kind", "create", "cluster", "--name", name, "--kubeconfig", kubeconfig, *node_image, "--wait", "180s",
       timeout=600)
    env = {**os.environ, "KUBECONFIG": kubeconfig}
    try:
        images = {"trainer": os.environ.get("GPT2BENCH_KIND_IMAGE"),
                  "operator": os.environ.get("GPT2BENCH_KIND_OPERATOR_IMAGE")}
        for target, image in images.items():
            if not image:
                images[target] = image = f"gpt2bench-{target}:kind-test"
                sh("docker", "build", "--target", target, "-t", image, str(ROOT), timeout=3600)
            sh("kind", "load", "docker-image", image, "--name", name, timeout=900)
        INSTALL[backend](env, work, images)
        yield {"name": name, "KUBECONFIG": kubeconfig, "backend": backend, **images}
    finally:
        if not os.environ.get("GPT2BENCH_KIND_KEEP"):
            subprocess.run(["kind", "delete", "cluster", "--name", name], check=False, capture_output=True, timeout=300)


def test_the_operators_serve_exactly_the_kinds_rendered_so_auto_picks_the_backend(cluster: dict[str, str]) -> None:
    env = {**os.environ, "KUBECONFIG": cluster["KUBECONFIG"]}
    listed = json.loads(sh("kubectl", "get", "--raw", "/apis", env=env))["groups"]
    group_versions = {version["groupVersion"] for group in listed for version in group["versions"]}
    discovery = {api: served(env, api) for api in (PYTORCHJOB_API, MPIJOB_API, TRAINJOB_API, JOBSET_API)
                 if api in group_versions}
    if cluster["backend"] == PYTORCHJOB:
        assert "mpijobs" not in discovery[PYTORCHJOB_API], "the training operator's MPIJob v1 is left out"
        assert TRAINJOB_API not in discovery
    else:
        assert not [api for api in group_versions if api.startswith("kubeflow.org/")], "Trainer v2 only"
        assert "clustertrainingruntimes" in discovery[TRAINJOB_API] and "jobsets" in discovery[JOBSET_API]
    assert served_job_kinds(discovery) == JOB_KINDS[cluster["backend"]]
    assert resolve_backend("auto", served_job_kinds(discovery)) == cluster["backend"]


def test_the_cpu_example_completes_under_restricted_pod_security_with_curves(cluster: dict[str, str],
                                                                           tmp_path: Path) -> None:
    env = {**os.environ, "KUBECONFIG": cluster["KUBECONFIG"]}
    backend = cluster["backend"]
    operator_repo, _, operator_tag = cluster["operator"].rpartition(":")
    trainer_repo, _, trainer_tag = cluster["trainer"].rpartition(":")
    sh(str(HELM), "install", "gpt2bench", str(ROOT / "helm" / "gpt2bench"), "--namespace", "gpt2bench-system",
       "--create-namespace", "--wait", "--timeout", "5m", "--set", f"image.repository={operator_repo}",
       "--set", f"image.tag={operator_tag}", "--set", "image.pullPolicy=Never",
       "--set", f"trainerImage.repository={trainer_repo}", "--set", f"trainerImage.tag={trainer_tag}",
       *CHART_VALUES[backend], env=env, timeout=400)
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
    assert {r["jobKind"] for r in status["runs"]} == JOB_KINDS[backend]
    if backend == TRAINJOB:  # auto, resolved from what the cluster serves, and shown
        assert status["backend"] == TRAINJOB
        header, row = (line.split() for line in sh("kubectl", "get", "-n", "bench", "gpt2benchmark", name, "-o",
                                                  "wide", env=env).splitlines())
        assert dict(zip(header, row, strict=False))["BACKEND"] == TRAINJOB
        trainjobs = json.loads(sh("kubectl", "get", "trainjobs", "-n", "bench", "-o", "json", env=env))["items"]
        assert {t["spec"]["runtimeRef"]["name"] for t in trainjobs} == {TORCH_RUNTIME, MPI_RUNTIME}
    for run in status["runs"]:
        assert run["results"]["tokensPerSecond"] > 0 and run["results"]["finalLoss"] > 0
    maps = json.loads(sh("kubectl", "get", "configmaps", "-n", "bench", "-l", "app.kubernetes.io/component=steps",
                         "-o", "json", env=env))["items"]
    assert len(maps) == len(status["runs"]), "every run's curves kept"
    out = tmp_path / "report"
    sh(sys.executable, "-m", "gpt2bench", "report", "--cluster", name, "-n", "bench", "--output", str(out),
       "--quiet", env=env, timeout=300)
    assert (out / "loss.png").stat().st_size > 1000
