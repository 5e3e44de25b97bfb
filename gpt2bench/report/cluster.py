"""Read a GPT2Benchmark from a cluster through the kubernetes client, as a results document."""

from __future__ import annotations

import os

from gpt2bench.status import ResultsDocument


class ClusterReadError(RuntimeError):
    """The GPT2Benchmark could not be read; the message says which one and why."""


def fetch_cluster_doc(name: str, namespace: str | None, context: str | None = None) -> ResultsDocument:
    """Read a GPT2Benchmark (kubeconfig, else the in-cluster config); its status becomes the runs."""
    import urllib3
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException

    from gpt2bench.spec import API_GROUP, API_VERSION, PLURAL

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
    return ResultsDocument.from_resource(resource)
