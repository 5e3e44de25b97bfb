"""Read a GPT2Benchmark from a cluster through the kubernetes client, as a results document.

Per-step curves (loss, grad norm) outlive the pods: the operator keeps each run's steps.jsonl in a
ConfigMap `<run>-steps` owned by the benchmark; `write_cluster_steps` puts them in DIR/steps/<run>.jsonl.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gpt2bench.conventions import BENCHMARK_LABEL, COMPONENT_LABEL, RUN_LABEL, STEPS_COMPONENT, STEPS_CONFIGMAP_KEY
from gpt2bench.status import ResultsDocument


class ClusterReadError(RuntimeError):
    """The GPT2Benchmark could not be read; the message says which one and why."""


def fetch_cluster_doc(name: str, namespace: str | None,
                      context: str | None = None) -> tuple[ResultsDocument, dict[str, str]]:
    """Read a GPT2Benchmark (kubeconfig, else the in-cluster config); its status becomes the runs. Also
    returns run name -> steps.jsonl text, from the ConfigMaps the operator kept."""
    import urllib3
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException

    from gpt2bench.specification.model import API_GROUP, API_VERSION, PLURAL

    kubeconfig = os.environ.get("KUBECONFIG")  # the client reads it at import time; read it now, as kubectl does
    try:
        config.load_kube_config(config_file=kubeconfig, context=context)
        if namespace is None:
            _, active = config.list_kube_config_contexts(config_file=kubeconfig)
            namespace = ((active or {}).get("context") or {}).get("namespace")
    except (ConfigException, FileNotFoundError, TypeError) as exc:
        try:
            config.load_incluster_config()
        except ConfigException:
            raise ClusterReadError(f"no kubeconfig ({exc}) and not running in a cluster") from None
    namespace = namespace or "default"
    try:
        resource = client.CustomObjectsApi().get_namespaced_custom_object(
            API_GROUP, API_VERSION, namespace, PLURAL, name
        )
    except ApiException as exc:
        detail = "not found" if exc.status == 404 else f"API error {exc.status} {exc.reason}"
        raise ClusterReadError(f"GPT2Benchmark {namespace}/{name}: {detail}") from None
    except (OSError, urllib3.exceptions.HTTPError) as exc:  # connection refused, TLS, DNS ...
        raise ClusterReadError(f"cannot reach the cluster: {exc}") from None
    return ResultsDocument.from_resource(resource), fetch_cluster_steps(client.CoreV1Api(), resource)


def fetch_cluster_steps(core: Any, resource: dict[str, Any]) -> dict[str, str]:
    """Run name -> steps.jsonl text, from the benchmark's own steps ConfigMaps (owned by its uid, so a
    re-created benchmark of the same name never shows an older one's curves). Nothing when they cannot be
    read: the report then says the curves are missing."""
    import urllib3
    from kubernetes.client.exceptions import ApiException

    from gpt2bench.render import label_value

    metadata = resource.get("metadata") or {}
    selector = f"{BENCHMARK_LABEL}={label_value(metadata.get('name', ''))},{COMPONENT_LABEL}={STEPS_COMPONENT}"
    try:
        listed = core.list_namespaced_config_map(metadata.get("namespace") or "default", label_selector=selector,
                                                 _preload_content=False)
    except (ApiException, OSError, urllib3.exceptions.HTTPError):
        return {}
    found = {}
    for item in json.loads(listed.data).get("items", []):
        owners = (item.get("metadata") or {}).get("ownerReferences") or []
        run = ((item.get("metadata") or {}).get("labels") or {}).get(RUN_LABEL)
        if run and any(o.get("uid") == metadata.get("uid") for o in owners):
            found[run] = (item.get("data") or {}).get(STEPS_CONFIGMAP_KEY) or ""
    return found


def write_cluster_steps(doc: ResultsDocument, texts: dict[str, str], directory: Path) -> None:
    """DIR/steps/<run>.jsonl for the runs whose curves the cluster kept; their entries name the file."""
    for run in doc.runs:
        if texts.get(run.name):
            path = Path("steps") / f"{run.name}.jsonl"
            (directory / path).parent.mkdir(parents=True, exist_ok=True)
            (directory / path).write_text(texts[run.name], encoding="utf-8")
            run.steps_file = str(path)
