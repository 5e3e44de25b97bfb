"""Policy: what every pod gpt2bench puts on a cluster must hold, checked on the jobs rendered from the
shipped examples for every job kind, and by a real policy scanner.

- Bounded memory: every container of every pod (PyTorchJob Master/Worker, MPIJob Launcher/Worker, TrainJob
  pods as the Trainer builds them from our runtimes) has a memory limit; every memory-backed emptyDir a
  sizeLimit. The jobs are valid against the upstream CRDs (../shared/crds/) and the NetworkPolicies against
  Kubernetes' schema.
- Each run's NetworkPolicy selects exactly its job's pods and lets in what docs/security.md says.
- checkov (PyPI, in its own venv at .tools/checkov: scripts/install.sh) scans the chart's default render,
  manifests/ and every job kind's pods (extracted as Pods: checkov skips custom kinds): no failed check but
  the exceptions docs/security.md lists, each still needed.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube.trainer_v2 import build_jobset
from kubeflow_crds import validate_job
from pod_security import pod_templates

from gpt2bench.plan import plan_runs
from gpt2bench.render import render_job, render_objects, render_run
from gpt2bench.render.mpijob import LAUNCHER_RESOURCES
from gpt2bench.render.runtimes import project_runtimes
from gpt2bench.specification.validation import load_benchmark, load_benchmark_file

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))
BACKENDS = ("pytorchjob", "trainjob")
CHECKOV = ROOT / ".tools" / "checkov" / "bin" / "checkov"
HELM = ROOT / ".tools" / "bin" / "helm"
SECURITY_DOC = ROOT / "docs" / "security.md"
NAMESPACE = "benchmarks"  # the examples name none; a run takes its benchmark's namespace
RUNTIMES = project_runtimes()


def example_objects() -> list[dict[str, Any]]:
    """Every object every shipped example renders to, for every backend (jobs and NetworkPolicies)."""
    objects = []
    for example in EXAMPLES:
        benchmark = load_benchmark_file(example).model_copy(update={"namespace": NAMESPACE})
        for backend in BACKENDS:
            objects += render_objects(benchmark, backend)
    return objects


def job_pods(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Role -> pod template of a job, TrainJobs' as the Trainer builds their JobSet from our runtimes."""
    if job["kind"] != "TrainJob":
        return pod_templates(job)
    owned = copy.deepcopy(job)
    owned["metadata"]["uid"] = "uid-0"  # the JobSet's owner reference needs one
    jobset = build_jobset(owned, RUNTIMES[job["spec"]["runtimeRef"]["name"]])
    return {rjob["name"]: rjob["template"]["spec"]["template"] for rjob in jobset["spec"]["replicatedJobs"]}


OBJECTS = example_objects()
JOBS = [o for o in OBJECTS if o["kind"] != "NetworkPolicy"]


def test_the_examples_render_every_job_kind_each_with_its_policy():
    assert {job["kind"] for job in JOBS} == {"PyTorchJob", "MPIJob", "TrainJob"}
    policies = {o["metadata"]["name"] for o in OBJECTS if o["kind"] == "NetworkPolicy"}
    assert policies == {job["metadata"]["name"] for job in JOBS}


@pytest.mark.parametrize("job", JOBS, ids=lambda j: f"{j['kind']}-{j['metadata']['name']}")
def test_every_container_has_bounded_memory_and_every_memory_volume_a_size(job):
    validate_job(job, RUNTIMES)
    for role, pod in job_pods(job).items():
        spec = pod["spec"]
        for container in spec.get("initContainers", []) + spec["containers"]:
            limits = (container.get("resources") or {}).get("limits") or {}
            assert "memory" in limits, f"{role}/{container['name']} has no memory limit"
        for volume in spec.get("volumes", []):
            if (volume.get("emptyDir") or {}).get("medium") == "Memory":
                assert volume["emptyDir"].get("sizeLimit"), f"{role}: volume {volume['name']} has no sizeLimit"
        for container in spec["containers"]:
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/tmp"}


def test_the_mpijob_launcher_is_small_and_guaranteed():
    (job,) = [j for j in JOBS if j["kind"] == "MPIJob"][:1]
    launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert launcher["resources"] == LAUNCHER_RESOURCES
    assert LAUNCHER_RESOURCES["requests"] == LAUNCHER_RESOURCES["limits"]


def _spec(**extra):
    return {"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark", "metadata": {"name": "mem"},
            "spec": {"sweep": {"strategies": [{"name": "ps-sharded", "psServers": 2}],
                               "scales": [{"nodes": 1, "devicesPerNode": 0, "processesPerNode": 2}]}, **extra}}


@pytest.mark.parametrize("resources, limit", [
    ({}, "16Gi"),                                          # 2 workers + 2 servers at the CPU default of 4 GiB
    ({"requests": {"memory": "20Gi"}}, "20Gi"),            # never below the request
    ({"requests": {"memory": "1Gi"}}, "16Gi"),
    ({"limits": {"memory": "3Gi"}}, "3Gi"),                # the spec's own limit wins
])
def test_the_memory_limit_is_the_specs_else_the_default_per_process(resources, limit):
    benchmark = load_benchmark(_spec(resources=resources))
    (run,) = plan_runs(benchmark)
    assert run.procs_per_node == 4
    for backend in BACKENDS:
        job = render_job(benchmark, run, backend)
        for pod in job_pods(job).values():
            assert pod["spec"]["containers"][0]["resources"]["limits"]["memory"] == limit


def test_gpu_pods_get_a_sized_shm_and_the_gpu_default():
    benchmark = load_benchmark({**_spec(), "spec": {"sweep": {"strategies": [{"name": "ddp"}],
                                                              "scales": [{"devicesPerNode": 4}]}}})
    (run,) = plan_runs(benchmark)
    pod = job_pods(render_job(benchmark, run, "pytorchjob"))["Master"]["spec"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "4Gi"}} in pod["volumes"]
    assert pod["containers"][0]["resources"]["limits"] == {"memory": "64Gi", "nvidia.com/gpu": 4}


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_runs_policy_selects_its_pods_and_admits_metrics_from_the_monitoring_namespaces(backend):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    benchmark = load_benchmark(_spec(networkPolicy={"metricsNamespaces": ["monitoring", "obs"]}))
    (run,) = plan_runs(benchmark, backend)
    policy, job = render_run(benchmark, run, backend)
    kubernetes_validate.validate(policy, "1.30.0", strict=True)
    selector = policy["spec"]["podSelector"]["matchLabels"]
    pods = job_pods(job)
    assert pods and all(selector.items() <= pod["metadata"]["labels"].items() for pod in pods.values())
    own, metrics = policy["spec"]["ingress"]
    assert own == {"from": [{"podSelector": {"matchLabels": selector}}]}  # every port, from the run's pods
    assert [f["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for f in metrics["from"]] == \
        ["monitoring", "obs"]
    assert metrics["ports"] == [{"protocol": "TCP", "port": 9400, "endPort": 9403}]  # 4 processes per pod
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]  # egress: what a run needs (test_render_netpol.py)


def test_a_spec_can_turn_the_policy_off_or_close_the_metrics_ports():
    benchmark = load_benchmark(_spec(networkPolicy={"enabled": False}))
    (run,) = plan_runs(benchmark)
    assert [o["kind"] for o in render_run(benchmark, run)] == ["PyTorchJob"]
    benchmark = load_benchmark(_spec(networkPolicy={"metricsNamespaces": []}))
    policy, _ = render_run(benchmark, plan_runs(benchmark)[0])
    assert len(policy["spec"]["ingress"]) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_digests_pin_every_image_of_the_run(backend):
    digest = "sha256:" + "ab" * 32
    benchmark = load_benchmark(_spec(image="registry.example:5000/ml/gpt2bench:0.1.0", imageDigest=digest))
    job = render_job(benchmark, plan_runs(benchmark, backend)[0], backend)
    images = {c["image"] for pod in job_pods(job).values() for c in pod["spec"]["containers"]}
    assert images == {f"registry.example:5000/ml/gpt2bench@{digest}"}


# ------------------------------------------------------------------------------------------------- checkov


def documented_exceptions() -> dict[str, str]:
    """check id -> what it applies to (`trainer pods`, `operator`, `both`), from docs/security.md's table."""
    rows = re.findall(r"^\| `(CKV_K8S_\d+)` \| [^|]+ \| (trainer pods|operator|both) \| [^|]+\|$",
                      SECURITY_DOC.read_text(), re.M)
    return dict(rows)


def _as_pod(job: dict[str, Any], role: str, template: dict[str, Any]) -> dict[str, Any]:
    metadata = {k: v for k, v in (template.get("metadata") or {}).items() if k in ("labels", "annotations")}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{job['metadata']['name']}-{role.lower()}", "namespace": NAMESPACE, **metadata},
            "spec": template["spec"]}


def run_shape(objects: list[dict[str, Any]], run: str) -> str:
    """What checkov's Kubernetes checks can see of a run's pods and NetworkPolicy, less what only names the run:
    labels, the containers' command lines and env values (each run's flags), the run's name wherever it appears.
    Runs of one shape pass and fail the same checks (graph checks such as CKV2_K8S_6 pair each pod with its own
    run's policy); the examples' 440 runs have 30 shapes."""
    shaped = copy.deepcopy(objects)
    for obj in shaped:
        obj["metadata"].pop("labels", None)
        for container in [*obj["spec"].get("containers", []), *obj["spec"].get("initContainers", [])]:
            container.pop("command", None)
            container.pop("args", None)
            for variable in container.get("env", []):
                variable.pop("value", None)
    return json.dumps(shaped, sort_keys=True).replace(run, "RUN")


@pytest.mark.slow
@pytest.mark.skipif(not CHECKOV.exists(), reason=f"checkov not installed at {CHECKOV} (scripts/install.sh "
                                                  "creates its venv: python3 -m venv .tools/checkov && "
                                                  ".tools/checkov/bin/pip install checkov)")
@pytest.mark.skipif(not HELM.exists(), reason=f"helm not installed at {HELM} (run scripts/install.sh)")
def test_checkov_finds_nothing_but_the_documented_exceptions(tmp_path):
    chart = subprocess.run([str(HELM), "template", "gpt2bench", str(ROOT / "helm" / "gpt2bench"), "--namespace",
                            "gpt2bench-system"], check=True, capture_output=True, text=True, timeout=60).stdout
    (tmp_path / "chart.yaml").write_text(chart)
    for manifest in (ROOT / "manifests").glob("*.yaml"):
        (tmp_path / f"manifests-{manifest.name}").write_text(manifest.read_text())
    policies = {o["metadata"]["name"]: o for o in OBJECTS if o["kind"] == "NetworkPolicy"}
    shapes: dict[str, list[dict[str, Any]]] = {}  # one run of each shape: checkov's time is per object
    for job in JOBS:
        run = job["metadata"]["name"]
        objects = [*(_as_pod(job, role, template) for role, template in job_pods(job).items()), policies[run]]
        shapes.setdefault(run_shape(objects, run), objects)
    scanned = [obj for objects in shapes.values() for obj in objects]
    (tmp_path / "runs.yaml").write_text(yaml.safe_dump_all(scanned))
    proc = subprocess.run([str(CHECKOV), "--directory", str(tmp_path), "--framework", "kubernetes", "--output",
                           "json", "--quiet", "--skip-download"], capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    reports = json.loads(proc.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    assert sum(r["summary"]["resource_count"] for r in reports) >= len(scanned)  # it did scan them
    assert not any(r["summary"]["parsing_errors"] for r in reports)
    exceptions = documented_exceptions()
    assert {"CKV_K8S_11", "CKV_K8S_38"} <= set(exceptions), "docs/security.md's table was not read"
    failed = [(f["check_id"], f["resource"]) for r in reports for f in r["results"]["failed_checks"]]

    def excused(check: str, resource: str) -> bool:
        whose = "operator" if resource.startswith("Deployment.") else "trainer pods"
        return exceptions.get(check) in (whose, "both")

    assert [f for f in failed if not excused(*f)] == []
    assert set(exceptions) <= {check for check, _ in failed}, "an exception nothing needs any more"
