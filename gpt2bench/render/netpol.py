"""A run's NetworkPolicy (networking.k8s.io/v1), rendered with its job (docs/security.md).

The run's pods listen on the workers' sshd (2222, MPIJob and the MPI runtime), torch's rendezvous (23456,
PyTorchJob; the torch runtime's PET_MASTER_PORT), gloo/NCCL's ephemeral ports between ranks, and the
trainers' metrics ports (spec.metrics.port + local rank). The policy selects the run's pods by their
benchmark and run labels and lets in:
- every port, from the run's own pods (the ranks, the launcher, the servers talk to each other);
- the metrics ports, from the pods of `spec.networkPolicy.metricsNamespaces` (Prometheus: `monitoring`,
  GKE Managed Prometheus's `gmp-system`, OpenShift's `openshift-user-workload-monitoring`), or of every
  namespace (`metricsFromAllNamespaces`).
With `egress: run` (the default) it also says what the pods may reach, so that a namespace whose default denies
egress still lets a run work: the run's own pods (rendezvous, NCCL/gloo bootstrap, ssh, the MPI daemons), DNS
(port 53, and 5353 where OpenShift's DNS pods listen: a policy sees the pod's port after the Service), HTTPS
anywhere when the data or the weights come from a hub, and `egressCidrs`. The trainer never calls the API
server. `egress: open` leaves egress to the namespace. The kubelet's probes come from the node, which network
plugins let through. Off with `spec.networkPolicy.enabled: false`.
"""

from __future__ import annotations

from typing import Any

from gpt2bench.conventions import BENCHMARK_LABEL, RUN_LABEL
from gpt2bench.plan import Run
from gpt2bench.render.pods import job_labels, label_value
from gpt2bench.specification.model import Benchmark

NETWORK_POLICY_API = "networking.k8s.io/v1"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set by the API server on every namespace (1.21+)


def run_pod_selector(benchmark: Benchmark, run: Run) -> dict[str, str]:
    """The labels every pod of the run carries, whatever its job kind (render/pods.py's job_labels)."""
    return {BENCHMARK_LABEL: label_value(benchmark.name), RUN_LABEL: run.name}


def metrics_port_range(benchmark: Benchmark, run: Run) -> dict[str, Any]:
    """The run's metrics ports: local rank r of a pod serves on port + r."""
    port = benchmark.spec.metrics.port
    last = min(port + run.procs_per_node - 1, 65535)
    return {"protocol": "TCP", "port": port, **({"endPort": last} if last > port else {})}


def render_network_policy(benchmark: Benchmark, run: Run, job_name: str) -> dict[str, Any] | None:
    """The run's NetworkPolicy, named as its job (`job_name`); None when the spec turns it off."""
    spec = benchmark.spec.network_policy
    if not spec.enabled:
        return None
    own_pods = run_pod_selector(benchmark, run)
    ingress: list[dict[str, Any]] = [{"from": [{"podSelector": {"matchLabels": dict(own_pods)}}]}]
    if spec.metrics_from_all_namespaces:
        ingress.append({"from": [{"namespaceSelector": {}}], "ports": [metrics_port_range(benchmark, run)]})
    elif spec.metrics_namespaces:
        ingress.append({
            "from": [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: namespace}}}
                     for namespace in spec.metrics_namespaces],
            "ports": [metrics_port_range(benchmark, run)],
        })
    policy: dict[str, Any] = {"podSelector": {"matchLabels": own_pods}, "policyTypes": ["Ingress"], "ingress": ingress}
    if spec.egress == "run":
        policy["policyTypes"].append("Egress")
        policy["egress"] = run_egress(benchmark, own_pods)
    return {
        "apiVersion": NETWORK_POLICY_API,
        "kind": "NetworkPolicy",
        "metadata": {"name": job_name, "namespace": benchmark.namespace, "labels": job_labels(benchmark, run)},
        "spec": policy,
    }


DNS_PORTS = (53, 5353)  # the cluster's DNS; OpenShift's DNS pods listen on 5353 behind the Service's 53


def needs_a_hub(benchmark: Benchmark) -> bool:
    """The data (`hf:`) or the weights (a hub id, not a path) come from a hub over HTTPS."""
    spec = benchmark.spec
    pretrained = spec.model.pretrained
    return spec.data.source.startswith("hf:") or (pretrained is not None and not pretrained.startswith(("/", ".")))


def run_egress(benchmark: Benchmark, own_pods: dict[str, str]) -> list[dict[str, Any]]:
    """Where a run's pods may connect: each other, DNS, a hub when the spec reads from one, egressCidrs."""
    rules: list[dict[str, Any]] = [
        {"to": [{"podSelector": {"matchLabels": dict(own_pods)}}]},
        {"ports": [{"protocol": protocol, "port": port} for port in DNS_PORTS for protocol in ("UDP", "TCP")]},
    ]
    if needs_a_hub(benchmark):
        rules.append({"ports": [{"protocol": "TCP", "port": 443}]})
    if cidrs := benchmark.spec.network_policy.egress_cidrs:
        rules.append({"to": [{"ipBlock": {"cidr": cidr}} for cidr in cidrs]})
    return rules
