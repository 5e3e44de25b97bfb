"""End to end on a real cluster: kind, the Helm chart, the Kubeflow operators and the CPU example.

Two clusters, one per backend (docs/backends.md), each with only what that backend needs; the example
leaves `spec.backend` at `auto`, so the operator picks the backend from what the cluster serves.

`pytorchjob`: the Kubeflow operators installed serve exactly what gpt2bench renders: the training operator
v1.9 for PyTorchJob kubeflow.org/v1, run with `--enable-scheme=pytorchjob` and without its own mpijobs CRD
(which serves MPIJob at v1), and the MPI operator v0.8 for MPIJob kubeflow.org/v2beta1
(the upstream CRDs in tests/data/kubeflow-crds/).

`trainjob`: Kubeflow Trainer v2.3.0 (its `manifests/overlays/manager`, which brings JobSet v0.12.0) on
Kubernetes 1.32 (Trainer v2 needs 1.31 or later; 1.32 is what upstream's own e2e runs), no kubeflow.org
group, and gpt2bench's two ClusterTrainingRuntimes installed by the chart (`trainerRuntimes.install=true`)
with the trainer image loaded into kind (the chart's `trainerImage`: the MPI runtime's sshd pods, where
horovod's ranks run, use the runtime's image). Each check has an emulator counterpart that runs everywhere:
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

The cluster steps (create, build and load the images, install the operators at their pinned versions,
`helm install`, apply the example, `kubectl wait --for=condition=Finished`, the report, delete) are
scripts/e2e-kind.sh's, the one entry point that CI's e2e workflow and a person run (docs/ci.md); this file
holds the assertions. Run by that script, it checks the cluster the script made and named
(GPT2BENCH_KIND_KUBECONFIG, GPT2BENCH_KIND_BACKEND, GPT2BENCH_KIND_REPORT). Run by pytest alone, it drives
the script's steps itself (`up`, `example`, `down`):

    scripts/e2e-kind.sh                                   # what CI runs: both backends (make e2e-kind)
    pytest -m kind tests/test_kind.py                     # the same steps and checks, from pytest
    pytest -m kind tests/test_kind.py -k trainjob         # the Trainer v2 cluster only
    GPT2BENCH_KIND_IMAGE=gpt2bench:dev GPT2BENCH_KIND_OPERATOR_IMAGE=gpt2bench-operator:dev pytest -m kind ...

Needs Docker (a running engine), kind, kubectl and helm, plus network access for the operators' manifests;
it is skipped with the missing piece named otherwise. It cannot run on the development machines (no Docker
engine there). The environment variables the script reads (other operator versions, E2E_KEEP=1 to keep the
cluster, ...) are listed at its top.
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
from kube.tools import find_kubectl

from gpt2bench.conventions import MPIJOB_API, PYTORCHJOB_API, TRAINJOB_API
from gpt2bench.jobkinds import PYTORCHJOB, TRAINJOB, resolve_backend, served_job_kinds
from gpt2bench.render.runtimes import MPI_RUNTIME, TORCH_RUNTIME

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "e2e-kind.sh"
HELM = ROOT / ".tools" / "bin" / "helm"
EXAMPLE = ROOT / "manifests" / "examples" / "cpu-sweep.yaml"
BENCH_NAMESPACE = "bench"  # the script's: Pod Security "restricted" enforced
JOBSET_API = "jobset.x-k8s.io/v1alpha2"
# A cluster scripts/e2e-kind.sh made, installed and ran the example on, to check.
ATTACHED = os.environ.get("GPT2BENCH_KIND_KUBECONFIG")


def _missing() -> str | None:
    if find_kubectl() is None:
        return "kubectl is neither in .tools/bin nor on PATH"
    for tool in () if ATTACHED else ("docker", "kind"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if ATTACHED:
        return None
    if not HELM.exists() and shutil.which("helm") is None:
        return f"helm not installed at {HELM} nor on PATH"
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
    # the cluster fixture builds images, installs operators and runs the example: far beyond the 600 s default
    pytest.mark.timeout(3 * 3600),
]


def sh(*args: str, timeout: float = 600, **kwargs: Any) -> str:
    """Run a command; `kubectl` is the tests' (tests/kube/tools.py: .tools/bin, then PATH)."""
    args = (find_kubectl() or "kubectl", *args[1:]) if args[0] == "kubectl" else args
    proc = subprocess.run(list(args), check=False, capture_output=True, text=True, timeout=timeout, **kwargs)
    if proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return proc.stdout


def script(*args: str, env: dict[str, str], timeout: float) -> None:
    """A step of scripts/e2e-kind.sh, its output streamed (these steps take minutes)."""
    proc = subprocess.run(["bash", str(SCRIPT), *args], check=False, env=env, timeout=timeout)
    assert proc.returncode == 0, f"scripts/e2e-kind.sh {' '.join(args)} failed ({proc.returncode})"


def served(env: dict[str, str], group_version: str) -> set[str]:
    listing = json.loads(sh("kubectl", "get", "--raw", f"/apis/{group_version}", env=env))
    return {r["name"] for r in listing["resources"] if "/" not in r["name"]}


# What the example's runs become per backend.
JOB_KINDS = {PYTORCHJOB: {"PyTorchJob", "MPIJob"}, TRAINJOB: {"TrainJob"}}


@pytest.fixture(scope="session")
def images() -> dict[str, str]:
    """The trainer and operator images, built once for both clusters (the script's `build`)."""
    if ATTACHED:
        return {}
    env = {**os.environ, "PYTHON": sys.executable}
    if not (env.get("GPT2BENCH_KIND_IMAGE") and env.get("GPT2BENCH_KIND_OPERATOR_IMAGE")):
        script("build", env=env, timeout=3600)
    return {"GPT2BENCH_KIND_IMAGE": env.get("GPT2BENCH_KIND_IMAGE", "gpt2bench-trainer:e2e"),
            "GPT2BENCH_KIND_OPERATOR_IMAGE": env.get("GPT2BENCH_KIND_OPERATOR_IMAGE", "gpt2bench-operator:e2e")}


# One cluster per backend, the tests grouped by it (a module-scoped parameter): never two at once.
@pytest.fixture(scope="module", params=[PYTORCHJOB, TRAINJOB])
def cluster(request, tmp_path_factory, images: dict[str, str]) -> dict[str, Any]:
    """A kind cluster with the operators of one backend and nothing of the other, the chart installed and
    the CPU example run on it to Complete."""
    backend = request.param
    if ATTACHED:
        if os.environ.get("GPT2BENCH_KIND_BACKEND") != backend:
            pytest.skip(f"the cluster scripts/e2e-kind.sh made is for {os.environ.get('GPT2BENCH_KIND_BACKEND')}")
        yield {"KUBECONFIG": ATTACHED, "backend": backend, "report": Path(os.environ["GPT2BENCH_KIND_REPORT"])}
        return
    work = tmp_path_factory.mktemp(f"kind-{backend}")
    env = {**os.environ, **images, "PYTHON": sys.executable, "E2E_CLUSTER": f"gpt2bench-{uuid.uuid4().hex[:6]}",
           "E2E_WORKDIR": str(work)}
    try:
        try:
            script("up", backend, env=env, timeout=3600)
            script("example", env=env, timeout=47 * 60)
        except BaseException:
            script("diagnostics", env=env, timeout=600)
            raise
        yield {"KUBECONFIG": str(work / "kubeconfig"), "backend": backend, "report": work / "report"}
    finally:
        script("down", env=env, timeout=300)


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


def test_the_cpu_example_completes_under_restricted_pod_security_with_curves(cluster: dict[str, Any]) -> None:
    env = {**os.environ, "KUBECONFIG": cluster["KUBECONFIG"]}
    backend = cluster["backend"]
    crd = json.loads(sh("kubectl", "get", "crd", "gpt2benchmarks.gpt2bench.io", "-o", "json", env=env))
    assert crd["spec"]["names"]["kind"] == "GPT2Benchmark"
    namespace = json.loads(sh("kubectl", "get", "namespace", BENCH_NAMESPACE, "-o", "json", env=env))
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"

    name = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]
    status = json.loads(sh("kubectl", "get", "-n", BENCH_NAMESPACE, "gpt2benchmark", name, "-o", "json",
                           env=env))["status"]
    assert status["phase"] == "Succeeded", json.dumps(status["runs"], indent=1)
    assert {r["jobKind"] for r in status["runs"]} == JOB_KINDS[backend]
    if backend == TRAINJOB:  # auto, resolved from what the cluster serves, and shown
        assert status["backend"] == TRAINJOB
        header, row = (line.split() for line in sh("kubectl", "get", "-n", BENCH_NAMESPACE, "gpt2benchmark", name,
                                                  "-o", "wide", env=env).splitlines())
        assert dict(zip(header, row, strict=False))["BACKEND"] == TRAINJOB
        trainjobs = json.loads(sh("kubectl", "get", "trainjobs", "-n", BENCH_NAMESPACE, "-o", "json",
                                  env=env))["items"]
        assert {t["spec"]["runtimeRef"]["name"] for t in trainjobs} == {TORCH_RUNTIME, MPI_RUNTIME}
    for run in status["runs"]:
        assert run["results"]["tokensPerSecond"] > 0 and run["results"]["finalLoss"] > 0
    maps = json.loads(sh("kubectl", "get", "configmaps", "-n", BENCH_NAMESPACE, "-l",
                         "app.kubernetes.io/component=steps", "-o", "json", env=env))["items"]
    assert len(maps) == len(status["runs"]), "every run's curves kept"
    # the script's `gpt2bench report --cluster`: the table and the curves drawn from the cluster
    assert (cluster["report"] / "loss.png").stat().st_size > 1000
    assert name in (cluster["report"] / "results.md").read_text()
