"""A run's NetworkPolicy in a namespace whose default denies egress, and scraped by the Prometheus a cluster has:
the policy lets the run's pods reach each other and DNS (and a hub where the spec reads from one),
evaluated here as a network plugin evaluates NetworkPolicies (networking.k8s.io/v1 semantics: a pod selected
for Egress by any policy may connect only where one of them allows)."""

from __future__ import annotations

import pytest

from gpt2bench.plan import plan_runs
from gpt2bench.render import render_objects
from gpt2bench.render.netpol import NAMESPACE_NAME_LABEL
from gpt2bench.specification.validation import SpecError, load_benchmark

NAMESPACE = "bench"
# The namespace's own policy, as the Kubernetes docs' "default deny all egress traffic" example writes it.
DEFAULT_DENY_EGRESS = {"podSelector": {}, "policyTypes": ["Egress"]}


def benchmark(network_policy=None, **spec):
    return load_benchmark({"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark",
                           "metadata": {"name": "np", "namespace": NAMESPACE},
                           "spec": {"backend": "pytorchjob", "networkPolicy": network_policy or {},
                                    "sweep": {"strategies": [{"name": "ddp"}],
                                              "scales": [{"nodes": 2, "processesPerNode": 1}]}, **spec}})


def selects(selector: dict, labels: dict) -> bool:
    return selector.get("matchLabels", {}).items() <= labels.items() and not selector.get("matchExpressions")


def peer_matches(peer: dict, pod: dict | None, ip: str | None) -> bool:
    """One `to`/`from` entry against a destination: a pod (labels, namespace labels) or an address outside pods."""
    if "ipBlock" in peer:
        import ipaddress

        return ip is not None and ipaddress.ip_address(ip) in ipaddress.ip_network(peer["ipBlock"]["cidr"])
    if pod is None:
        return False
    namespace_ok = (selects(peer["namespaceSelector"], pod["namespace_labels"]) if "namespaceSelector" in peer
                    else pod["namespace"] == NAMESPACE)
    return namespace_ok and ("podSelector" not in peer or selects(peer["podSelector"], pod["labels"]))


def port_matches(ports: list[dict] | None, protocol: str, port: int) -> bool:
    return not ports or any(p.get("protocol", "TCP") == protocol and p.get("port") in (None, port) for p in ports)


def egress_allowed(policies: list[dict], source_labels: dict, *, pod: dict | None = None, ip: str | None = None,
                   protocol: str = "TCP", port: int) -> bool:
    selecting = [p for p in policies if "Egress" in p.get("policyTypes", []) and selects(p["podSelector"], source_labels)]
    if not selecting:
        return True
    return any(port_matches(rule.get("ports"), protocol, port)
               and (not rule.get("to") or any(peer_matches(peer, pod, ip) for peer in rule["to"]))
               for policy in selecting for rule in policy.get("egress", []))


def ingress_allowed(policy: dict, source_namespace: str, port: int) -> bool:
    source = {"namespace": source_namespace, "namespace_labels": {NAMESPACE_NAME_LABEL: source_namespace},
              "labels": {"app": "prometheus"}}
    return any(port_matches(rule.get("ports"), "TCP", port) and any(peer_matches(peer, source, None)
                                                                   for peer in rule.get("from", []))
               for rule in policy["ingress"])


def rendered(bench):
    objects = render_objects(bench)
    policy = next(o for o in objects if o["kind"] == "NetworkPolicy")
    job = next(o for o in objects if o["kind"] == "PyTorchJob")
    labels = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]["labels"]
    return policy, labels


def run_pod(labels):
    return {"namespace": NAMESPACE, "namespace_labels": {NAMESPACE_NAME_LABEL: NAMESPACE}, "labels": labels}


DNS_POD = {"namespace": "kube-system", "namespace_labels": {NAMESPACE_NAME_LABEL: "kube-system"},
           "labels": {"k8s-app": "kube-dns"}}


def test_in_a_default_deny_egress_namespace_the_run_reaches_its_pods_and_dns_and_nothing_else():
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    policy, labels = rendered(benchmark())
    kubernetes_validate.validate(policy, "1.30.0", strict=True)
    policies = [DEFAULT_DENY_EGRESS, policy["spec"]]
    assert egress_allowed(policies, labels, pod=run_pod(labels), port=23456)  # torch's rendezvous
    assert egress_allowed(policies, labels, pod=run_pod(labels), port=41234)  # NCCL/gloo's ephemeral ports
    assert egress_allowed(policies, labels, pod=DNS_POD, protocol="UDP", port=53)
    assert egress_allowed(policies, labels, ip="169.254.20.10", protocol="UDP", port=53)  # NodeLocal DNSCache
    assert egress_allowed(policies, labels, pod=DNS_POD, protocol="UDP", port=5353)  # OpenShift's DNS pods
    assert not egress_allowed(policies, labels, ip="203.0.113.7", port=443)  # no hub asked for: none
    other = {**run_pod({"app": "else"})}
    assert not egress_allowed(policies, labels, pod=other, port=8080)
    # without the run's egress (the ingress-only policy of before) nothing gets out
    ingress_only = {**policy["spec"], "policyTypes": ["Ingress"]}
    assert not egress_allowed([DEFAULT_DENY_EGRESS, ingress_only], labels, pod=run_pod(labels), port=23456)


def test_a_hub_or_the_users_ranges_are_reachable_where_the_spec_needs_them():
    policy, labels = rendered(benchmark(data={"source": "hf:wikitext"}))
    assert egress_allowed([DEFAULT_DENY_EGRESS, policy["spec"]], labels, ip="203.0.113.7", port=443)
    policy, labels = rendered(benchmark({"egressCidrs": ["10.20.0.0/16"]}))
    assert egress_allowed([policy["spec"]], labels, ip="10.20.3.4", port=3128)  # a proxy
    assert not egress_allowed([policy["spec"]], labels, ip="10.21.3.4", port=3128)
    open_policy, _ = rendered(benchmark({"egress": "open"}))
    assert open_policy["spec"]["policyTypes"] == ["Ingress"] and "egress" not in open_policy["spec"]
    with pytest.raises(SpecError) as refused:
        benchmark({"egressCidrs": ["10.0.0.300/8"]})
    assert refused.value.errors[0][0] == "spec.networkPolicy.egressCidrs[0]"


@pytest.mark.parametrize("network_policy, allowed, refused", [
    ({}, ["monitoring"], ["gmp-system", "openshift-user-workload-monitoring"]),
    ({"metricsNamespaces": ["gmp-system"]}, ["gmp-system"], ["monitoring"]),  # GKE Managed Prometheus
    ({"metricsNamespaces": ["openshift-user-workload-monitoring"]}, ["openshift-user-workload-monitoring"],
     ["monitoring"]),
    ({"metricsFromAllNamespaces": True}, ["monitoring", "gmp-system", "any"], []),  # a cluster-wide Prometheus
])  # fmt: skip
def test_scraping_is_allowed_from_the_prometheus_the_cluster_has(network_policy, allowed, refused):
    bench = benchmark(network_policy)
    policy, _ = rendered(bench)
    port = bench.spec.metrics.port
    for namespace in allowed:
        assert ingress_allowed(policy["spec"], namespace, port), namespace
        assert not ingress_allowed(policy["spec"], namespace, port + 1000)  # the metrics ports only
    for namespace in refused:
        assert not ingress_allowed(policy["spec"], namespace, port), namespace
    assert plan_runs(bench)
