"""The API emulator the operator tests rely on: each gap of kmock 0.8 that tests/kube fills, checked
through the real `kubernetes` client and the real kubectl, as a cluster would answer."""

from __future__ import annotations

import json
import logging
import subprocess
import threading

import kubernetes
import pytest
from kube.fixtures import GROUP, PLURAL, VERSION, api_client, benchmark, kopf_operator, wait_for
from kube.tools import kubectl

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def api(cluster):
    return kubernetes.client.CustomObjectsApi(api_client(cluster))


@pytest.fixture(scope="module")
def core(cluster):
    return kubernetes.client.CoreV1Api(api_client(cluster))


def _create(api, name: str, **spec) -> dict:
    return api.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, benchmark(name, **spec))


def test_create_answers_201_with_server_fields(api):
    created = _create(api, "meta")  # the client returns None on 200: it needs the 201
    meta = created["metadata"]
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z") and meta["generation"] == 1
    assert int(meta["resourceVersion"]) > 0
    with pytest.raises(kubernetes.client.ApiException) as conflict:
        _create(api, "meta")
    assert conflict.value.status == 409


def test_generation_moves_on_spec_changes_only_and_status_goes_through_the_subresource(api):
    _create(api, "gen")
    patched = api.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "gen",
                                                 {"spec": {"concurrency": 2}, "status": {"phase": "Hacked"}})
    assert patched["metadata"]["generation"] == 2 and "status" not in patched
    with_status = api.patch_namespaced_custom_object_status(GROUP, VERSION, "default", PLURAL, "gen",
                                                            {"status": {"phase": "Running"}, "spec": {"concurrency": 9}})
    assert with_status["status"] == {"phase": "Running"} and with_status["spec"]["concurrency"] == 2
    assert with_status["metadata"]["generation"] == 2
    assert int(with_status["metadata"]["resourceVersion"]) > int(patched["metadata"]["resourceVersion"])


def test_json_patch_test_op_conflicts_with_422_and_put_checks_the_resource_version(api):
    body = _create(api, "cas")
    stale = body["metadata"]["resourceVersion"]
    api.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "cas", {"metadata": {"labels": {"a": "b"}}})
    with pytest.raises(kubernetes.client.ApiException) as failed:
        api.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "cas", [
            {"op": "test", "path": "/metadata/resourceVersion", "value": stale},
            {"op": "add", "path": "/metadata/finalizers", "value": ["x"]}], _content_type="application/json-patch+json")
    assert failed.value.status == 422  # kopf relies on this for its finalizer patches
    with pytest.raises(kubernetes.client.ApiException) as conflict:
        api.replace_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "cas", body)
    assert conflict.value.status == 409
    fresh = api.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "cas")
    fresh["spec"]["concurrency"] = 3
    replaced = api.replace_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "cas", fresh)
    assert replaced["spec"]["concurrency"] == 3


def test_label_selectors_filter_lists(api):
    for name, labels in (("sel-a", {"team": "a", "tier": "x"}), ("sel-b", {"team": "b"})):
        body = benchmark(name)
        body["metadata"]["labels"] = labels
        api.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)

    def names(selector: str) -> list[str]:
        listed = api.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, label_selector=selector)
        return sorted(i["metadata"]["name"] for i in listed["items"])

    assert names("team=a") == ["sel-a"]
    assert names("team in (a,b),!tier") == ["sel-b"]
    assert names("team!=a,team") == ["sel-b"]
    listed = api.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, label_selector="team")
    assert listed["kind"] == "GPT2BenchmarkList" and listed["metadata"]["resourceVersion"]


def test_schema_rejects_or_prunes_what_the_crd_does_not_allow(cluster, api):
    with pytest.raises(kubernetes.client.ApiException) as bad:
        _create(api, "typed", concurrency=0)  # minimum: 1
    assert bad.value.status == 422 and "concurrency" in json.loads(bad.value.body)["message"]
    body = benchmark("unknown")
    body["spec"]["bogus"] = 1
    result = cluster.kubectl("apply", "-f", "-", input=json.dumps(body), check=False)
    assert result.returncode != 0 and 'unknown field "spec.bogus"' in result.stderr  # kubectl: Strict
    created = api.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, body)
    assert "bogus" not in created["spec"]  # without fieldValidation=Strict: pruned


def test_finalizers_hold_deletion_and_owner_references_cascade(api, core):
    owner = _create(api, "owner")
    api.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "owner",
                                       {"metadata": {"finalizers": ["test/hold"]}})
    core.create_namespaced_pod("default", {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "child", "ownerReferences": [{"apiVersion": f"{GROUP}/{VERSION}", "kind": "GPT2Benchmark",
                                              "name": "owner", "uid": owner["metadata"]["uid"]}]},
        "spec": {"containers": [{"name": "c", "image": "i"}]}})
    api.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "owner")
    held = api.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "owner")
    assert held["metadata"]["deletionTimestamp"]
    api.patch_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "owner", {"metadata": {"finalizers": None}})
    with pytest.raises(kubernetes.client.ApiException) as gone:
        api.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "owner")
    assert gone.value.status == 404
    assert [p.metadata.name for p in core.list_namespaced_pod("default").items if p.metadata.name == "child"] == []


def test_watch_resumes_from_a_resource_version(api, cluster):
    listed = api.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)
    since = listed["metadata"]["resourceVersion"]
    _create(api, "watched")
    api.patch_namespaced_custom_object_status(GROUP, VERSION, "default", PLURAL, "watched", {"status": {"phase": "Pending"}})
    stream = kubernetes.watch.Watch().stream(api.list_namespaced_custom_object, GROUP, VERSION, "default", PLURAL,
                                             resource_version=since, timeout_seconds=1)
    events = [(e["type"], e["object"]["metadata"]["name"]) for e in stream]
    assert events == [("ADDED", "watched"), ("MODIFIED", "watched")]


def test_kubectl_get_wait_and_namespaces(cluster, api):
    _create(api, "waited")
    waiter = subprocess.Popen(
        [kubectl(), "wait", "gpt2benchmark/waited", "--for=jsonpath={.status.phase}=Succeeded", "--timeout=30s"],
        env={"KUBECONFIG": str(cluster.kubeconfig), "HOME": str(cluster.workdir)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    threading.Timer(1.0, lambda: cluster.kubectl(
        "patch", "g2b", "waited", "--subresource=status", "--type=merge", "-p", '{"status":{"phase":"Succeeded"}}')).start()
    out, err = waiter.communicate(timeout=40)
    assert waiter.returncode == 0, err
    assert "condition met" in out
    assert "default" in cluster.kubectl("get", "namespaces").stdout
    header, row = (line.split() for line in cluster.kubectl("get", "g2b", "waited").stdout.splitlines())
    assert header[:2] == ["NAME", "PHASE"] and row[:2] == ["waited", "Succeeded"]


def test_the_operator_under_test_logs_to_its_file_and_leaves_the_workers_logging_as_it_was(cluster, capfd):
    """`kopf run --verbose` in this process sets the root logger to DEBUG and logs to the stderr of its start: left
    so, every later record of the pytest worker was made and printed, some of it on the terminal between tests."""
    root, log = logging.getLogger(), cluster.workdir / "operator.log"
    level, handlers = root.level, list(root.handlers)
    with kopf_operator(cluster, poll_seconds=0.3):
        wait_for(lambda: log.exists() and "Starting Kopf" in log.read_text(), 20, what="kopf's first line in its file")
        assert root.level == logging.DEBUG
    assert (root.level, root.handlers) == (level, handlers)
    assert "Starting Kopf" not in capfd.readouterr().err
