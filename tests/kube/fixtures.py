"""Helpers the operator tests share: a cluster with the CRDs, polling with deadlines, CR documents."""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import kubernetes

from .cluster import EmulatedCluster

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "manifests" / "crd.yaml"
GROUP, VERSION, PLURAL = "gpt2bench.io", "v1alpha1", "gpt2benchmarks"
T = TypeVar("T")


def install_crds(cluster: EmulatedCluster) -> None:
    """Our CRD with `kubectl apply`; the upstream Kubeflow CRDs with `kubectl create` (their
    last-applied annotation would exceed a real API server's 256 KiB limit)."""
    from kubeflow_crds import CRD_FILES, crd_dir  # tests/ is on sys.path; one place knows where they are

    cluster.kubectl("apply", "-f", str(CRD))
    for crd in sorted(CRD_FILES.values()):
        cluster.kubectl("create", "-f", str(crd_dir() / crd))


def install_trainer_v2(cluster: EmulatedCluster) -> None:
    """Kubeflow Trainer v2 and JobSet as a cluster serves them: their CRDs (`kubectl create`, as above) and the
    built-in kinds their controllers use (ConfigMaps, Secrets, Services, Jobs: tests/kube/trainer_v2.py)."""
    from kubeflow_crds import TRAINER_V2_CRD_FILES, crd_dir

    from .trainer_v2 import serve_builtins

    cluster.call(serve_builtins)
    for crd in TRAINER_V2_CRD_FILES.values():
        cluster.kubectl("create", "-f", str(crd_dir() / crd))


def api_client(cluster: EmulatedCluster) -> kubernetes.client.ApiClient:
    config = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=config)
    return kubernetes.client.ApiClient(config)


def operator_env(cluster: EmulatedCluster, poll_seconds: float = 0.3, metrics_port: int = 0) -> dict[str, str]:
    return {
        "KUBECONFIG": str(cluster.kubeconfig),
        "GPT2BENCH_OPERATOR_POLL_SECONDS": str(poll_seconds),
        "GPT2BENCH_OPERATOR_METRICS_PORT": str(metrics_port),
    }


@contextlib.contextmanager
def kopf_operator(cluster: EmulatedCluster, poll_seconds: float = 0.3, timeout: float = 60,
                  verbose: bool = True) -> Iterator[Any]:
    """The real operator (kopf's KopfRunner, in this process) against `cluster`; on exit it must have
    stopped cleanly, without an exception."""
    from unittest import mock

    from kopf.testing import KopfRunner

    args = ["run", "--standalone", "--all-namespaces", "-m", "gpt2bench.controller.handlers"]
    # `kopf run` puts a handler of its own on the root logger, on the stderr of the moment (pytest's and Click's
    # swap it around: between tests, the terminal), and `--verbose` sets the root logger to DEBUG. Its handler
    # writes to the cluster's operator.log instead, and both are undone at the end: left, every later record of
    # this worker (the clients' DEBUG lines, the emulator's access log) was made, formatted and printed.
    root, log = logging.getLogger(), cluster.workdir / "operator.log"
    level = root.level
    with mock.patch.dict(os.environ, operator_env(cluster, poll_seconds=poll_seconds)), open(log, "a") as stream:

        class ToLog(logging.StreamHandler):  # what kopf's configure() instantiates, and removes again by its class
            def __init__(self) -> None:
                super().__init__(stream)

        try:
            with mock.patch("kopf._core.actions.loggers._KopfStreamHandler", ToLog), \
                    KopfRunner(args + (["--verbose"] if verbose else []), timeout=timeout) as runner:
                yield runner
        finally:  # before the file closes: the emulator's threads still log
            root.handlers[:] = [h for h in root.handlers if not isinstance(h, ToLog)]
            root.setLevel(level)
    assert runner.exception is None, (runner.output + log.read_text())[-3000:]
    assert runner.exit_code == 0


def wait_for(check: Callable[[], T], timeout: float = 30, interval: float = 0.1, what: str = "") -> T:
    """Poll `check` until it returns something truthy; fail with the last value after `timeout` s."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what or check}: last value {last!r}")


def run_entry(status: dict[str, Any], index: int) -> dict[str, Any]:
    """Run `index` of a status, or {} while the status does not list it yet: `wait_for` predicates read a
    status the operator may not have written in full (a predicate that raises makes the suite flaky)."""
    runs = status.get("runs") or []
    return runs[index] if index < len(runs) else {}


def benchmark(name: str, strategies: list[dict] | None = None, **spec: Any) -> dict[str, Any]:
    """A small CPU GPT2Benchmark; `spec` keys override (camelCase, as in YAML)."""
    body = {
        "model": {"preset": "tiny"},
        "training": {"steps": 4, "warmupSteps": 1, "seqLen": 32},
        "sweep": {"strategies": strategies or [{"name": "single"}, {"name": "ddp"}],
                  "scales": [{"nodes": 1, "devicesPerNode": 0, "processesPerNode": 2}]},
    }
    body.update(copy.deepcopy(spec))
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "GPT2Benchmark", "metadata": {"name": name}, "spec": body}


class Benchmarks:
    """GPT2Benchmark calls through the real client."""

    def __init__(self, client: kubernetes.client.ApiClient, namespace: str = "default"):
        self.api = kubernetes.client.CustomObjectsApi(client)
        self.core = kubernetes.client.CoreV1Api(client)
        self.namespace = namespace
        self.created: list[str] = []

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        made = self.api.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)
        self.created.append(made["metadata"]["name"])
        return made

    def delete_unfinished(self) -> None:
        """Delete what this test created and left Pending or Running (a held run, a Trainer the test no longer
        plays): the module's operator would go on stepping it at every poll, slowing every later test."""
        for name in self.created:
            try:
                if self.status(name).get("phase") in (None, "Pending", "Running"):
                    self.delete(name)
            except kubernetes.client.ApiException as exc:
                if exc.status != 404:
                    raise

    def get(self, name: str) -> dict[str, Any]:
        return self.api.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)

    def status(self, name: str) -> dict[str, Any]:
        return self.get(name).get("status") or {}

    def patch_spec(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return self.api.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name, {"spec": spec})

    def delete(self, name: str) -> None:
        self.api.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)

    def exists(self, name: str) -> bool:
        try:
            self.get(name)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def events(self, name: str) -> list[dict[str, Any]]:
        listed = self.core.list_namespaced_event(self.namespace, _preload_content=False)
        items = json.loads(listed.data)["items"]
        return [e for e in items if e.get("involvedObject", {}).get("name") == name]

    def posted(self, name: str, reason: str, at_least: int = 1) -> list[dict[str, Any]]:
        """The Events of `reason` about `name`, once at least `at_least` are there: kopf posts Events from a queue
        of its own, after the status write a test has just seen, so a test that reads them at once can race."""
        return wait_for(lambda: len(found := [e for e in self.events(name) if e["reason"] == reason]) >= at_least
                        and found, what=f"{at_least} {reason} Event(s) about {name}")

    def config_map(self, name: str) -> dict[str, Any] | None:
        """The ConfigMap `name` in this namespace, or None while it does not exist."""
        try:
            response = self.core.read_namespaced_config_map(name, self.namespace, _preload_content=False)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return json.loads(response.data)


def env_for_subprocess(extra: dict[str, str]) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", **extra}


VERBS = {"LIST": "list", "WATCH": "watch", "FETCH": "get", "CREATE": "create", "UPDATE": "patch", "DELETE": "delete"}
OPERATOR_AGENTS = ("kopf/", "gpt2bench-operator/")


def operator_calls(cluster: EmulatedCluster) -> set[tuple[str, str, str]]:
    """(API group, resource[/subresource], verb) of every request kopf and the operator's client made, plus
    what a real API server would also check: creating an object whose ownerReference sets
    blockOwnerDeletion needs `update` on the owner's `finalizers` (OwnerReferencesPermissionEnforcement).
    Discovery is left out: a non-resource URL every authenticated user may read."""

    def calls(emulator):
        seen = set()
        for r in emulator._requests:  # kmock keeps every request it served
            if r.resource is None or r.resource.plural is None or not r.headers.get("User-Agent", "").startswith(
                    OPERATOR_AGENTS):
                continue
            verb = "update" if r.method == "PUT" else VERBS[r.action.name]
            plural = f"{r.resource.plural}/{r.subresource}" if r.subresource else r.resource.plural
            seen.add((r.resource.group, plural, verb))
            if verb == "create" and isinstance(r.data, dict):
                for ref in (r.data.get("metadata") or {}).get("ownerReferences") or []:
                    if ref.get("blockOwnerDeletion"):
                        group = ref["apiVersion"].rsplit("/", 1)[0] if "/" in ref["apiVersion"] else ""
                        owner = next(res.plural for res, info in emulator.resources.items()
                                     if info.kind == ref["kind"] and res.group == group)
                        seen.add((group, f"{owner}/finalizers", "update"))
        seen |= {(group, resource, verb) for agent, group, resource, verb in emulator.outside_requests
                 if agent.startswith(OPERATOR_AGENTS)}
        return seen

    return cluster.call(calls)


def kubectl_table(text: str) -> list[dict[str, str]]:
    """`kubectl get` output as one dict per row, cut where each header starts (a cell may hold spaces: the
    Verdict column)."""
    header, *rows = text.splitlines()
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    bounds = list(zip(starts, [*starts[1:], None]))
    return [{name: row[start:end].strip() for name, (start, end) in zip(header.split(), bounds)} for row in rows]
