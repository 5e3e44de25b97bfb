"""manifests/operator.yaml: valid Kubernetes objects, a command the CLI accepts, probes and ports that
match it. (That its RBAC covers every call is checked against a real run in test_operator_kopf.py.)"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

import kubernetes_validate
import pytest
import yaml

from gpt2bench.controller import main

MANIFEST = Path(__file__).resolve().parents[1] / "manifests" / "operator.yaml"


@pytest.fixture(scope="module")
def objects() -> dict[str, dict]:
    docs = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    return {d["kind"]: d for d in docs}


def test_every_object_is_valid_for_kubernetes_1_30(objects):
    assert set(objects) == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment", "Service"}
    for obj in objects.values():
        kubernetes_validate.validate(obj, "1.30", strict=True)
        assert "namespace" not in obj["metadata"], "namespace-less: `kubectl apply -n` chooses it"


def test_the_deployment_runs_the_operator_cli_with_probe_and_ports_that_match(objects):
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"][:2] == ["gpt2bench", "operator"]
    args = main.parse_args(container["command"][2:])  # exits on a flag the CLI does not know
    assert args.all_namespaces and args.metrics_port == 9090
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert urlparse(args.liveness).port == ports["healthz"] and urlparse(args.liveness).path == "/healthz"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    assert ports["metrics"] == args.metrics_port
    assert objects["Service"]["spec"]["ports"][0]["targetPort"] == "metrics"
    assert pod["serviceAccountName"] == objects["ServiceAccount"]["metadata"]["name"]
    selector = objects["Deployment"]["spec"]["selector"]["matchLabels"]
    assert objects["Service"]["spec"]["selector"] == selector


def test_rbac_is_split_into_framework_and_application_rules(objects):
    text = MANIFEST.read_text()
    assert "# Framework:" in text and "# Application:" in text
    binding = objects["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == objects["ClusterRole"]["metadata"]["name"]
    assert binding["subjects"][0]["name"] == objects["ServiceAccount"]["metadata"]["name"]


def allowed(rules: list[dict], group: str, resource: str, verb: str) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules)


def cluster_role_rules() -> list[dict]:
    return next(d for d in yaml.safe_load_all(MANIFEST.read_text()) if d and d["kind"] == "ClusterRole")["rules"]
