"""manifests/operator.yaml: the Helm chart's default render (scripts/generate_manifests.py), valid Kubernetes
objects, a command the CLI accepts, probes and ports that match it, least-privilege RBAC, a restricted pod.
(That its RBAC covers every call is checked against a real run in test_operator_kopf.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import kubernetes_validate
import pytest
import yaml
from pod_security import violations

from gpt2bench.controller import main
from gpt2bench.specification.model import DEFAULT_GPU_IMAGE, DEFAULT_IMAGE

REPO = Path(__file__).resolve().parents[1]
MANIFEST = REPO / "manifests" / "operator.yaml"
HELM = REPO / ".tools" / "bin" / "helm"


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]


def one(docs: list[dict], kind: str) -> dict:
    (found,) = [d for d in docs if d["kind"] == kind]
    return found


@pytest.mark.skipif(not HELM.exists(), reason=f"helm not installed at {HELM} (run scripts/install.sh)")
def test_the_manifest_is_the_charts_default_render():
    check = subprocess.run([sys.executable, str(REPO / "scripts" / "generate_manifests.py"), "--check"],
                           capture_output=True, text=True, timeout=120, check=False)
    assert check.returncode == 0, check.stderr


def test_every_object_is_valid_for_kubernetes_1_30(docs):
    # the chart's default: the operator watches its own namespace (a Role there), fenced by a NetworkPolicy
    assert sorted(d["kind"] for d in docs) == ["ClusterRole"] * 3 + ["ClusterRoleBinding", "Deployment", "Namespace",
                                               "NetworkPolicy", "Role", "Role", "RoleBinding", "RoleBinding",
                                               "Service", "ServiceAccount"]
    for obj in docs:
        kubernetes_validate.validate(obj, "1.30", strict=True)
    namespaced = [d for d in docs if d["kind"] in ("ServiceAccount", "Deployment", "Service", "Role", "RoleBinding",
                                                   "NetworkPolicy")]
    assert {d["metadata"]["namespace"] for d in namespaced} == {one(docs, "Namespace")["metadata"]["name"]}
    assert not any("helm.sh/chart" in (d["metadata"].get("labels") or {}) for d in docs), "not managed by Helm"


def test_the_deployment_runs_the_operator_cli_with_probe_ports_and_trainer_images_that_match(docs):
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"].startswith("ghcr.io/gpt2bench/gpt2bench-operator:")  # the no-torch target
    assert container["args"][0] == "operator"  # the image's entrypoint is `gpt2bench`
    args = main.parse_args(container["args"][1:])  # exits on a flag the CLI does not know
    assert args.namespace == [one(docs, "Namespace")["metadata"]["name"]] and not args.all_namespaces
    assert args.metrics_port == 9090
    assert (args.trainer_image_cpu, args.trainer_image_gpu) == (DEFAULT_IMAGE, DEFAULT_GPU_IMAGE)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert urlparse(args.liveness).port == ports["health"] and urlparse(args.liveness).path == "/healthz"
    # one active operator: the Lease it elects on is the one its Role lets it read and renew, where that Role is
    lease_role = next(d for d in docs if d["kind"] == "Role" and any("leases" in r["resources"] for r in d["rules"]))
    assert args.leader_elect and args.leader_election_namespace == lease_role["metadata"]["namespace"]
    assert [args.leader_election_id] == next(r["resourceNames"] for r in lease_role["rules"] if "update" in r["verbs"])
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert ports["metrics"] == args.metrics_port
    service = one(docs, "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]
    assert service["spec"]["selector"].items() <= one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"].items()


def test_the_operator_pod_is_restricted_with_a_writable_tmp(docs):
    template = one(docs, "Deployment")["spec"]["template"]
    assert violations(template) == []
    container = template["spec"]["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert template["spec"]["securityContext"]["runAsUser"] == 1000  # the image's user, as the chart's


def test_rbac_is_split_into_framework_and_application_rules_and_least_privilege(docs):
    text = MANIFEST.read_text()
    assert "# Framework:" in text and "# Application:" in text
    rules = operator_rules()
    assert allowed(rules, "gpt2bench.io", "gpt2benchmarks/finalizers", "update"), "blockOwnerDeletion needs it"
    for group, resource in (("kubeflow.org", "pytorchjobs"), ("kubeflow.org", "mpijobs"),
                            ("trainer.kubeflow.org", "trainjobs")):
        # deleted when its pods never start (runPolicy.startupSeconds/queueSeconds), never changed
        assert allowed(rules, group, resource, "watch") and allowed(rules, group, resource, "delete")
        assert not any(allowed(rules, group, resource, verb) for verb in ("patch", "update", "deletecollection"))
    # the runtimes are read, never written; JobSets, Jobs are the Trainer's: the Jobs are only listed (their Events
    # say which pods the API server refused), the JobSets never touched
    assert allowed(rules, "trainer.kubeflow.org", "clustertrainingruntimes", "get")
    assert not any(allowed(rules, "trainer.kubeflow.org", "clustertrainingruntimes", verb)
                   for verb in ("create", "patch", "update", "delete", "list"))
    assert not any("jobset.x-k8s.io" in r["apiGroups"] for r in rules)
    assert allowed(rules, "batch", "jobs", "list")
    assert not any(allowed(rules, "batch", "jobs", verb)
                   for verb in ("get", "watch", "create", "patch", "update", "delete", "deletecollection"))
    assert not any("*" in r["verbs"] or "*" in r["resources"] for r in rules)
    assert not allowed(rules, "", "secrets", "get") and not allowed(rules, "", "pods", "create")
    # pods, their logs and ConfigMaps are read in the watched namespace only (a Role), never cluster-wide
    cluster_wide = [r for d in yaml.safe_load_all(MANIFEST.read_text()) if d and d["kind"] == "ClusterRole"
                    and not d["metadata"]["labels"].get("rbac.authorization.k8s.io/aggregate-to-view")
                    and not d["metadata"]["labels"].get("rbac.authorization.k8s.io/aggregate-to-edit")
                    for r in d["rules"]]
    assert cluster_wide and not any(allowed(cluster_wide, "", resource, verb) for resource, verb in
                                    (("pods", "list"), ("pods/log", "get"), ("configmaps", "get")))
    assert allowed(rules, "networking.k8s.io", "networkpolicies", "create")  # each run's, before its job
    # a benchmark's own TrainingRuntime (a TrainJob with resource claims names it): created before its first TrainJob
    # and read back (whose namesake, what it runs), never changed nor deleted (the benchmark's garbage collection does)
    assert allowed(rules, "trainer.kubeflow.org", "trainingruntimes", "create")
    assert allowed(rules, "trainer.kubeflow.org", "trainingruntimes", "get")
    assert not any(allowed(rules, "trainer.kubeflow.org", "trainingruntimes", verb)
                   for verb in ("list", "watch", "patch", "update", "delete", "deletecollection"))


def test_tenants_get_gpt2benchmarks_through_the_default_roles(docs):
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterRole"}
    edit = next(r for r in roles.values() if r["metadata"]["labels"].get("rbac.authorization.k8s.io/aggregate-to-edit"))
    view = next(r for r in roles.values() if r["metadata"]["labels"].get("rbac.authorization.k8s.io/aggregate-to-view"))
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert allowed(edit["rules"], "gpt2bench.io", "gpt2benchmarks", "create")
    assert allowed(edit["rules"], "gpt2bench.io", "gpt2benchmarks", "delete")
    assert allowed(view["rules"], "gpt2bench.io", "gpt2benchmarks", "list")
    assert not allowed(view["rules"], "gpt2bench.io", "gpt2benchmarks", "create")
    bound = {d["roleRef"]["name"] for d in docs if d["kind"] == "ClusterRoleBinding"}
    assert edit["metadata"]["name"] not in bound and view["metadata"]["name"] not in bound, "aggregated, not bound"


def test_the_runtimes_manifest_holds_the_projects_runtimes_valid_for_trainer_v2():
    from kubeflow_crds import validate_job

    from gpt2bench.render.runtimes import project_runtimes

    runtimes = [d for d in yaml.safe_load_all((REPO / "manifests" / "runtimes.yaml").read_text()) if d]
    assert {r["metadata"]["name"]: r for r in runtimes} == project_runtimes()
    for runtime in runtimes:
        validate_job(runtime)


def allowed(rules: list[dict], group: str, resource: str, verb: str) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules)


def operator_rules() -> list[dict]:
    """Every rule of the (Cluster)Roles bound to the operator's ServiceAccount (the namespaced ones hold in
    the watched namespace, where the operator's calls go)."""
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    account = next(d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount")
    bound = {(d["roleRef"]["kind"], d["roleRef"]["name"]) for d in docs
             if d["kind"] in ("ClusterRoleBinding", "RoleBinding")
             and any(s["kind"] == "ServiceAccount" and s["name"] == account for s in d["subjects"])}
    return [rule for d in docs if d["kind"] in ("ClusterRole", "Role") and (d["kind"], d["metadata"]["name"]) in bound
            for rule in d["rules"]]


# the name test_operator_kopf.py imports
cluster_role_rules = operator_rules
