"""The Helm chart, rendered by the real helm binary (.tools/bin/helm, installed by scripts/install.sh).

Built-in kinds are validated against the Kubernetes OpenAPI schemas (kubernetes-validate, offline);
the Prometheus Operator kinds are checked against what they must select and contain; the generated
PrometheusRule and dashboards must equal the monitoring/ sources.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
HELM = ROOT / ".tools" / "bin" / "helm"
CHART = ROOT / "helm" / "gpt2bench"
SCENARIOS = sorted(p.name for p in (CHART / "ci").glob("*-values.yaml"))
CUSTOM_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

sys.path.insert(0, str(ROOT))  # monitoring/ is a repository tool, not part of the installed package

pytestmark = pytest.mark.skipif(not HELM.exists(), reason=f"helm not installed at {HELM} (run scripts/install.sh)")


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(HELM), *args], check=False, capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def render(*args: str, release: str = "bench", namespace: str = "gpt2bench-system") -> list[dict[str, Any]]:
    out = helm("template", release, str(CHART), "--namespace", namespace, *args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def one(docs: list[dict[str, Any]], kind: str, name_part: str = "") -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and name_part in d["metadata"]["name"]]
    assert len(found) == 1, f"expected one {kind} named *{name_part}*, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def all_monitoring(*extra: str) -> list[str]:
    flags = ("serviceMonitor.enabled=true,podMonitor.enabled=true,prometheusRule.enabled=true,"
             "grafanaDashboards.enabled=true")
    return ["--set", flags, *extra]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    """Scenario file name → rendered objects."""
    return {name: render("-f", str(CHART / "ci" / name)) for name in SCENARIOS}


def test_ci_scenarios_exist() -> None:
    assert {"default-values.yaml", "monitoring-values.yaml", "namespaced-values.yaml",
            "all-namespaces-values.yaml"} <= set(SCENARIOS)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_lint_strict(scenario: str) -> None:
    proc = helm("lint", str(CHART), "--strict", "-f", str(CHART / "ci" / scenario))
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_builtin_kinds_valid_against_kubernetes_schemas(rendered, scenario: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")
    for doc in rendered[scenario]:
        if doc["kind"] in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(doc, "1.30.0", strict=True)
        except kubernetes_validate.ValidationError as exc:
            raise AssertionError(f"{doc['kind']}/{doc['metadata']['name']}: {exc.message} at {list(exc.path)}")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_object_has_standard_labels_and_dns_names(rendered, scenario: str) -> None:
    for doc in rendered[scenario]:
        meta = doc["metadata"]
        labels = meta.get("labels", {})
        for key in ("helm.sh/chart", "app.kubernetes.io/name", "app.kubernetes.io/instance",
                    "app.kubernetes.io/managed-by", "app.kubernetes.io/version"):
            assert key in labels, f"{doc['kind']}/{meta['name']} lacks label {key}"
        assert len(meta["name"]) <= 63 and DNS_LABEL.fullmatch(meta["name"]), meta["name"]


def test_long_names_are_truncated_to_63() -> None:
    docs = render("--set", "nameOverride=" + "n" * 60, *all_monitoring(), release="r" * 53)
    for doc in docs:
        assert len(doc["metadata"]["name"]) <= 63, doc["metadata"]["name"]
        assert DNS_LABEL.fullmatch(doc["metadata"]["name"]), doc["metadata"]["name"]


def test_defaults_watch_the_release_namespace_with_a_role(rendered) -> None:
    docs = rendered["default-values.yaml"]
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ClusterRole"] * 3 + ["ClusterRoleBinding", "Deployment", "NetworkPolicy", "Role", "Role",
                                           "RoleBinding", "RoleBinding", "Service", "ServiceAccount"], \
        "monitoring objects must be off by default"
    container = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:2] == ["operator", "--namespace=gpt2bench-system"]
    assert "--liveness=http://0.0.0.0:8080/healthz" in container["args"]
    assert "--metrics-port=9090" in container["args"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {"metrics": 9090, "health": 8080}
    assert container["image"] == "ghcr.io/gpt2bench/gpt2bench-operator:0.1.0"  # tag defaults to appVersion
    assert "--trainer-image-cpu=ghcr.io/gpt2bench/gpt2bench:0.1.0" in container["args"]
    assert "--trainer-image-gpu=ghcr.io/gpt2bench/gpt2bench:0.1.0-cuda" in container["args"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    assert set(roles) == {"bench-gpt2bench-framework", "bench-gpt2bench-edit", "bench-gpt2bench-view"}
    role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "bench-gpt2bench")
    assert role["metadata"]["namespace"] == "gpt2bench-system"
    lease = one(docs, "Role", "-leader")  # the Lease that makes one operator active: in its own namespace only
    assert lease["metadata"]["namespace"] == "gpt2bench-system"
    assert lease["rules"][1] == {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                                 "resourceNames": ["bench-gpt2bench-leader"], "verbs": ["get", "update"]}
    assert "--leader-elect" in container["args"] and "--leader-election-id=bench-gpt2bench-leader" in container["args"]
    assert "--leader-election-namespace=gpt2bench-system" in container["args"]
    app_rules = role["rules"]
    assert any("gpt2benchmarks/status" in r["resources"] for r in app_rules)
    assert any({"pytorchjobs", "mpijobs"} <= set(r["resources"]) and "create" in r["verbs"] for r in app_rules)
    assert any("gpt2benchmarks/finalizers" in r["resources"] and r["verbs"] == ["update"] for r in app_rules)
    assert any(r["resources"] == ["networkpolicies"] and r["verbs"] == ["get", "create"] for r in app_rules)
    # nothing that reads pods, logs or ConfigMaps is granted cluster-wide
    framework = roles["bench-gpt2bench-framework"]["rules"]
    assert not any({"pods", "pods/log", "configmaps"} & set(r["resources"]) for r in framework)


def test_all_namespaces_uses_cluster_roles_and_digests_pin_the_images(rendered) -> None:
    docs = rendered["all-namespaces-values.yaml"]
    assert not [d for d in docs if d["kind"] in ("Role", "RoleBinding", "NetworkPolicy")
                and not d["metadata"]["name"].endswith("-leader")], "only the leader election's Lease is namespaced"
    app = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "bench-gpt2bench")
    assert any("pods/log" in r["resources"] for r in app["rules"])
    container = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:2] == ["operator", "--all-namespaces"]
    assert container["image"] == "ghcr.io/gpt2bench/gpt2bench-operator@sha256:" + "1" * 64  # the tag is not used
    assert "--trainer-image-cpu=ghcr.io/gpt2bench/gpt2bench@sha256:" + "2" * 64 in container["args"]
    assert "--trainer-image-gpu=ghcr.io/gpt2bench/gpt2bench@sha256:" + "3" * 64 in container["args"]
    # the operator accepts what the chart passes, and a run takes it as its image
    from gpt2bench.controller import main
    from gpt2bench.specification.validation import validate_spec

    args = main.parse_args(container["args"][1:])
    spec = validate_spec({"sweep": {"strategies": [{"name": "single"}]}, "images": {"cpu": args.trainer_image_cpu}})
    assert spec.trainer_image(gpus=False) == args.trainer_image_cpu


def test_the_operators_network_policy_admits_only_the_metrics_port_from_the_monitoring_namespaces(rendered) -> None:
    docs = rendered["default-values.yaml"]
    policy = one(docs, "NetworkPolicy")
    deployment = one(docs, "Deployment")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= \
        deployment["spec"]["template"]["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [{
        "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
        "ports": [{"protocol": "TCP", "port": 9090}]}]
    closed = one(render("--set-json", "networkPolicy.metricsNamespaces=[]"), "NetworkPolicy")
    assert closed["spec"]["ingress"] == []  # no namespace may scrape: nothing comes in


def test_trainer_images_and_aggregated_roles_follow_the_values() -> None:
    docs = render("--set", "trainerImage.repository=reg.example/t,trainerImage.tag=1.2,rbac.aggregateToDefaultRoles=false")
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--trainer-image-cpu=reg.example/t:1.2" in args and "--trainer-image-gpu=reg.example/t:1.2-cuda" in args
    assert [d["metadata"]["name"] for d in docs if d["kind"] == "ClusterRole"] == ["bench-gpt2bench-framework"]
    gpu = render("--set", "trainerImage.gpuTag=cu130")
    assert "--trainer-image-gpu=ghcr.io/gpt2bench/gpt2bench:cu130" in \
        one(gpu, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]


def test_namespaced_scenario_uses_a_role_in_the_watched_namespace(rendered) -> None:
    docs = rendered["namespaced-values.yaml"]
    deployment = one(docs, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:2] == ["operator", "--namespace=ml-benchmarks"]
    assert container["args"][-1] == "--verbose"
    assert container["image"] == "registry.example.com/ml/gpt2bench:0.1.0-rc1"
    assert container["imagePullPolicy"] == "Always"
    role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "bench-operator")
    assert role["metadata"]["namespace"] == "ml-benchmarks"
    assert any("gpt2benchmarks" in r["resources"] for r in role["rules"])
    binding = next(d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["name"] == "bench-operator")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "bench-operator"}
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpt2bench-operator", "namespace": "gpt2bench-system"}]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "gpt2bench-operator"
    # kopf still needs its cluster-wide framework rules (CRDs, namespaces).
    framework = one(docs, "ClusterRole", "framework")
    assert any("customresourcedefinitions" in r["resources"] for r in framework["rules"])
    assert not any("gpt2benchmarks" in r["resources"] for r in framework["rules"])


def test_rbac_rules_are_labelled_framework_or_application() -> None:
    source = (CHART / "templates" / "rbac.yaml").read_text()
    rules = source.count("- apiGroups:")
    labelled = len(re.findall(r"# (Framework|Application): [^\n]*\n\s*- apiGroups:", source))
    assert rules == labelled, "every RBAC rule is preceded by a '# Framework:' or '# Application:' comment"


@pytest.mark.parametrize("bad, field", [
    (["--set", "image.pullPolicy=Sometimes"], "pullPolicy"),
    (["--set", "trainerImage.registry=x"], "registry"),
    (["--set", "rbac.aggregateToDefaultRoles=yes"], "aggregateToDefaultRoles"),
    (["--set", "operator.replicas=-1"], "replicas"),
    (["--set", "service.type=External"], "type"),
    (["--set", "unknownKey=1"], "unknownKey"),
    (["--set", "prometheusRule.disabled.NoSuchAlert=true"], "NoSuchAlert"),
    (["--set", "serviceMonitor.interval=soon"], "interval"),
    (["--set-string", "operator.metricsPort=http"], "metricsPort"),
    (["--set", "image.digest=sha256:abc"], "digest"),
    (["--set", "trainerImage.gpuDigest=md5:" + "0" * 64], "gpuDigest"),
    (["--set", "networkPolicy.metricsNamespaces[0]=Monitoring"], "metricsNamespaces"),
])
def test_values_schema_rejects_bad_values(bad: list[str], field: str) -> None:
    proc = helm("template", "bench", str(CHART), *bad, check=False)
    assert proc.returncode != 0, f"helm accepted {bad}"
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert field in proc.stderr, proc.stderr


def test_schema_knows_exactly_the_generated_alerts() -> None:
    from monitoring import rules
    from monitoring.config import CONFIG

    schema = json.loads((CHART / "values.schema.json").read_text())
    disabled = schema["properties"]["prometheusRule"]["properties"]["disabled"]["properties"]
    assert set(disabled) == {alert.name for alert in rules.alerts(CONFIG)}


def test_service_monitor_selects_the_operator_service(rendered) -> None:
    docs = rendered["monitoring-values.yaml"]
    monitor, service, deployment = one(docs, "ServiceMonitor"), one(docs, "Service"), one(docs, "Deployment")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["honorLabels"] is True  # keeps the counters' benchmark namespace
    from monitoring.config import CONFIG

    assert endpoint["relabelings"] == [{"action": "replace", "targetLabel": "job", "replacement": CONFIG.operator_job}]


def test_pod_monitor_selects_the_trainer_pods_the_operator_renders(rendered) -> None:
    from gpt2bench.plan import plan_runs
    from gpt2bench.render import render_job
    from gpt2bench.specification.validation import load_benchmark_file

    docs = rendered["monitoring-values.yaml"]
    monitor = one(docs, "PodMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector == {"app.kubernetes.io/name": "gpt2bench", "app.kubernetes.io/component": "run"}
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["ml-benchmarks"]}
    port = monitor["spec"]["podMetricsEndpoints"][0]["port"]
    operator_selector = one(docs, "Deployment")["spec"]["selector"]["matchLabels"]

    benchmark = load_benchmark_file(str(ROOT / "manifests" / "examples" / "cpu-sweep.yaml"))
    scraped = 0
    for run in plan_runs(benchmark):
        job = render_job(benchmark, run)
        replicas = job["spec"].get("pytorchReplicaSpecs") or job["spec"]["mpiReplicaSpecs"]
        for replica in replicas.values():
            pod = replica["template"]
            labels = pod["metadata"]["labels"]
            assert not operator_selector.items() <= labels.items(), "the operator's selector must not match trainers"
            ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
            if port in ports:
                assert selector.items() <= labels.items(), f"{run.name}: trainer pod not selected by the PodMonitor"
                scraped += 1
    assert scraped >= len(plan_runs(benchmark)), "every run has at least one scraped pod"


def test_prometheus_rule_equals_the_generated_rules_and_alerts_can_be_disabled() -> None:
    source = yaml.safe_load((ROOT / "monitoring" / "prometheus_rules.yaml").read_text())
    rule = one(render(*all_monitoring()), "PrometheusRule")
    assert rule["spec"] == source  # {{ $labels.x }} survives Helm's own templating

    alerts = lambda doc: [r["alert"] for g in doc["spec"]["groups"] for r in g["rules"] if "alert" in r]
    disabled = one(render(*all_monitoring("--set", "prometheusRule.disabled.GPT2BenchmarkRunStalled=true")),
                   "PrometheusRule")
    assert alerts(disabled) == [a for a in alerts(rule) if a != "GPT2BenchmarkRunStalled"]
    # "Operator down" needs the ServiceMonitor's target: without it the alert would always fire.
    no_monitor = one(render("--set", "prometheusRule.enabled=true"), "PrometheusRule")
    assert "GPT2BenchmarkOperatorDown" in alerts(rule)
    assert "GPT2BenchmarkOperatorDown" not in alerts(no_monitor)


def test_rendered_prometheus_rule_passes_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (apt-get install prometheus)")
    rule = one(render(*all_monitoring()), "PrometheusRule")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    proc = subprocess.run([promtool, "check", "rules", str(path)], check=False, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dashboard_configmaps_equal_the_generated_dashboards(rendered) -> None:
    maps = [d for d in rendered["monitoring-values.yaml"] if d["kind"] == "ConfigMap"]
    sources = {p.name: json.loads(p.read_text()) for p in (ROOT / "monitoring" / "dashboards").glob("*.json")}
    assert sources and len(maps) == len(sources)
    for config_map in maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["namespace"] == "monitoring"
        assert config_map["metadata"]["annotations"] == {"grafana_folder": "gpt2bench"}
        ((name, text),) = config_map["data"].items()
        assert json.loads(text) == sources[name]  # {{run}} legends survive Helm's own templating


def render_notes(install_args: list[str], tmp_path: Path, source: Path = CHART) -> str:
    """The NOTES `helm install` would print, through helm's own template engine (`helm template` leaves NOTES
    out): the chart (`source`, named by its path in `install_args`) copied with NOTES.txt moved into a
    ConfigMap that `tpl` renders."""
    chart = Path(tempfile.mkdtemp(dir=tmp_path)) / "gpt2bench"
    shutil.copytree(source, chart, ignore=shutil.ignore_patterns("crds"))
    (chart / "notes.txt").write_text((chart / "templates" / "NOTES.txt").read_text())
    (chart / "templates" / "NOTES.txt").unlink()
    (chart / "templates" / "notes-check.yaml").write_text(
        'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n  notes: |\n'
        '{{ tpl (.Files.Get "notes.txt") . | indent 4 }}\n')
    args = [str(chart) if arg == str(source) else arg for arg in install_args]
    proc = subprocess.run([str(HELM), "template", *args, "--show-only", "templates/notes-check.yaml"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)["data"]["notes"]


def test_notes_render_next_steps(tmp_path: Path) -> None:
    """NOTES.txt through the same template engine (helm template does not print NOTES)."""
    def notes(*args: str) -> str:
        return render_notes(["bench", str(CHART), "-n", "ops", *args], tmp_path)

    default = notes()
    assert "kubectl -n ops rollout status deployment/bench-gpt2bench" in default
    assert "namespace ops only" in default and "Monitoring is off" in default
    assert "every namespace" in notes("-f", str(CHART / "ci" / "all-namespaces-values.yaml"))
    assert "helm upgrade" in default and "never updates it" in default  # the CRD caveat
    monitored = notes("-f", str(CHART / "ci" / "monitoring-values.yaml"))
    assert "PodMonitor bench-gpt2bench-trainer" in monitored and "Monitoring is off" not in monitored
    assert "namespace ml-benchmarks only" in notes("-f", str(CHART / "ci" / "namespaced-values.yaml"))


def test_notes_say_loudly_when_the_runtimes_were_skipped_for_want_of_trainer_v2(tmp_path: Path) -> None:
    """Installed before Trainer v2, the chart (trainerRuntimes.install=auto) silently left the runtimes out, and
    every TrainJob run failed later. Its notes now say so, with the upgrade that installs them."""
    def notes(*args: str) -> str:
        return render_notes(["bench", str(CHART), "-n", "ops", *args], tmp_path)

    skipped = notes()
    assert "runtimes were NOT installed" in skipped
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    assert (f"helm upgrade bench oci://ghcr.io/gpt2bench/charts/gpt2bench --version {version} -n ops --reuse-values "
            "--set trainerRuntimes.install=true") in skipped
    for args in (("--api-versions", "trainer.kubeflow.org/v1alpha1/ClusterTrainingRuntime"),
                 ("--set", "trainerRuntimes.install=true"), ("--set", "trainerRuntimes.install=false")):
        assert "NOT installed" not in notes(*args), args


def test_chart_crd_equals_manifests_crd() -> None:
    chart_crds = sorted((CHART / "crds").glob("*.yaml")) if (CHART / "crds").is_dir() else []
    manifest = ROOT / "manifests" / "crd.yaml"
    if not chart_crds or not manifest.exists():
        pytest.skip("CRD files not generated yet (python -m gpt2bench.specification.crd --write)")
    assert [p.name for p in chart_crds] == ["gpt2benchmarks.gpt2bench.io.yaml"]
    assert yaml.safe_load(chart_crds[0].read_text()) == yaml.safe_load(manifest.read_text())


def test_chart_version_and_trainer_images_match_the_package() -> None:
    """The chart's default trainer images are the ones GPT2Benchmarks default to, at the package's version,
    so gpu-papers.yaml (no image) gets the CUDA image with the chart's defaults as without an operator flag."""
    import gpt2bench
    from gpt2bench.specification.model import DEFAULT_GPU_IMAGE, DEFAULT_IMAGE

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == gpt2bench.__version__
    args = one(render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--trainer-image-cpu={DEFAULT_IMAGE}" in args and f"--trainer-image-gpu={DEFAULT_GPU_IMAGE}" in args


def test_the_runtimes_run_the_trainer_image_the_values_name() -> None:
    """The MPI runtime's sshd pods run the runtime's image: with trainerImage pointing elsewhere (a user's own
    registry, kind's loaded image), the runtimes name that image, not the release's."""
    runtimes = [d for d in render("--set", "trainerRuntimes.install=true,trainerImage.repository=reg.example/t",
                                  "--set-string", "trainerImage.tag=7") if d["kind"] == "ClusterTrainingRuntime"]
    def images(runtime: dict) -> set[str]:
        return {c["image"] for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]
                for c in job["template"]["spec"]["template"]["spec"]["containers"]}

    by_name = {r["metadata"]["name"]: images(r) for r in runtimes}
    assert by_name == {"gpt2bench-torch": {"reg.example/t:7"}, "gpt2bench-mpi": {"reg.example/t:7"},
                       "gpt2bench-mpi-cuda": {"reg.example/t:7-cuda"}, "gpt2bench-mpi-one-node": {"reg.example/t:7"}}


@pytest.mark.parametrize(("flags", "installed"), [
    ([], False),  # auto, and helm knows no trainer.kubeflow.org: a cluster without Trainer v2
    (["--api-versions", "trainer.kubeflow.org/v1alpha1/ClusterTrainingRuntime"], True),  # auto, Trainer v2 served
    (["--set", "trainerRuntimes.install=true"], True),
    (["--set", "trainerRuntimes.install=false", "--api-versions", "trainer.kubeflow.org/v1alpha1/ClusterTrainingRuntime"],
     False),
])
def test_trainer_runtimes_install_where_trainer_v2_is_and_are_valid_for_it(flags: list[str], installed: bool) -> None:
    from kubeflow_crds import validate_job

    from gpt2bench.render.runtimes import project_runtimes

    runtimes = [d for d in render(*flags) if d["kind"] == "ClusterTrainingRuntime"]
    if not installed:
        assert runtimes == []
        return
    assert {r["metadata"]["name"]: r for r in runtimes} == project_runtimes()  # what the TrainJobs point at
    for runtime in runtimes:
        validate_job(runtime)  # the upstream ClusterTrainingRuntime CRD's schema


@pytest.mark.parametrize(("gang", "policy"), [
    ("", None),
    ("coscheduling", {"coscheduling": {"scheduleTimeoutSeconds": 90}}),
    ("volcano", {"volcano": {}}),
])
def test_trainer_runtimes_run_the_charts_trainer_images_and_gang_schedule_on_request(gang, policy) -> None:
    """The MPI runtimes' sshd pods, where Horovod's ranks run, cannot take a TrainJob's image: the chart gives
    them the images the operator gives runs (trainerImage), CPU or CUDA; and its podGroupPolicy, if any."""
    from kubeflow_crds import validate_job

    from gpt2bench.plan import plan_runs
    from gpt2bench.render.pods import run_pods
    from gpt2bench.render.runtimes import project_runtimes, runtime_problems
    from gpt2bench.render.trainjob import render_trainjob
    from gpt2bench.specification.validation import load_benchmark

    docs = render("--set", "trainerRuntimes.install=true", "--set", "trainerImage.repository=registry.example/g2b",
                  "--set", "trainerImage.tag=v7", "--set", f"trainerRuntimes.podGroupPolicy={gang}",
                  "--set", "trainerRuntimes.scheduleTimeoutSeconds=90")
    runtimes = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterTrainingRuntime"}
    expected = project_runtimes("registry.example/g2b:v7", "registry.example/g2b:v7-cuda", policy)
    assert runtimes == expected
    deployment = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    gpu_image = next(a.split("=", 1)[1] for a in deployment if a.startswith("--trainer-image-gpu="))
    # a multi-node GPU Horovod run with the operator's default image works on the chart's runtime
    bench = load_benchmark({"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark", "metadata": {"name": "h"},
                            "spec": {"backend": "trainjob", "images": {"gpu": gpu_image},
                                     "scheduling": {"gang": True},
                                     "sweep": {"strategies": [{"name": "horovod"}],
                                               "scales": [{"nodes": 2, "devicesPerNode": 4}]}}})
    (run,) = plan_runs(bench)
    job = render_trainjob(run_pods(bench, run))
    problems = runtime_problems(job, runtimes[job["spec"]["runtimeRef"]["name"]])
    assert problems == ([] if policy else [problems[0]]) and (policy or "podGroupPolicy" in problems[0])
    for runtime in runtimes.values():
        validate_job(runtime)
