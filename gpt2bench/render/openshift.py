"""What OpenShift must grant a benchmark's pods (`gpt2bench render --openshift FILE`): a SecurityContextConstraints
the pods validate against, and the binding that lets their service account use it (docs/clusters.md, OpenShift).

OpenShift admits a pod only under an SCC its service account may use; a Pod Security namespace label is not
enough. Which one the pods need:
- nothing to grant (`restricted-v2`, what every authenticated user may use) when the platform assigns the user
  (spec.pods.runAsUser: null) and no field asks for more;
- `nonroot-v2` when the pods run as the image's user 1000 (the default, and what Horovod's sshd needs: a user in
  /etc/passwd; restricted-v2 only admits the namespace's uid range): the built-in ClusterRole
  `system:openshift:scc:nonroot-v2` bound to the service account;
- an SCC of the benchmark's own, nonroot-v2's rules plus exactly what spec.pods adds (a fabric's capability such
  as IPC_LOCK, hostPath volumes, the host network), with a ClusterRole to `use` it, when a field asks for more.

The SCC's fields are OpenShift's (openshift/api security/v1; the defaults quoted from openshift/cluster-kube-
apiserver-operator bindata/bootkube/scc-manifests); tests validate it against the CRD and admit the rendered pods.
"""

from __future__ import annotations

from typing import Any

from gpt2bench.render.pods import label_value
from gpt2bench.specification.model import Benchmark

SCC_API = "security.openshift.io/v1"
NONROOT_V2 = "nonroot-v2"
BUILTIN_ROLE = "system:openshift:scc:{}"  # the ClusterRole OpenShift ships for each default SCC
# nonroot-v2's volume types (what a pod may mount under it), plus hostPath where a volume needs it
NONROOT_V2_VOLUMES = ["configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"]


def service_account(benchmark: Benchmark) -> str:
    return benchmark.spec.pods.service_account_name or "default"


def needs_more_than_nonroot(benchmark: Benchmark) -> bool:
    """Whether spec.pods asks for what nonroot-v2 refuses: a capability beyond NET_BIND_SERVICE, a hostPath, the
    host network."""
    pods = benchmark.spec.pods
    return (any(cap != "NET_BIND_SERVICE" for cap in pods.capabilities) or pods.host_network
            or any(volume.host_path is not None for volume in pods.volumes))


def scc_name(benchmark: Benchmark) -> str:
    return label_value(f"gpt2bench-{benchmark.namespace}-{benchmark.name}")


def fabric_scc(benchmark: Benchmark) -> dict[str, Any]:
    """nonroot-v2's rules plus what spec.pods adds: its capabilities, hostPath volumes, the host network."""
    pods = benchmark.spec.pods
    host_path = any(volume.host_path is not None for volume in pods.volumes)
    return {
        "apiVersion": SCC_API,
        "kind": "SecurityContextConstraints",
        "metadata": {"name": scc_name(benchmark), "labels": {"app.kubernetes.io/name": "gpt2bench"},
                     "annotations": {"kubernetes.io/description": (
                         f"gpt2bench: the training pods of GPT2Benchmark {benchmark.namespace}/{benchmark.name}: "
                         "nonroot-v2 plus what its spec.pods asks for (a fabric's capabilities, hostPath volumes, "
                         "the host network)")}},
        "allowHostDirVolumePlugin": host_path,
        "allowHostIPC": False,
        "allowHostNetwork": pods.host_network,
        "allowHostPID": False,
        "allowHostPorts": pods.host_network,  # a host-network pod's ports are the host's
        "allowPrivilegeEscalation": False,
        "allowPrivilegedContainer": False,
        "allowedCapabilities": sorted({"NET_BIND_SERVICE", *pods.capabilities}),
        "defaultAddCapabilities": None,
        "requiredDropCapabilities": ["ALL"],
        "fsGroup": {"type": "RunAsAny"},
        "supplementalGroups": {"type": "RunAsAny"},
        "runAsUser": {"type": "MustRunAsNonRoot"},
        "seLinuxContext": {"type": "MustRunAs"},
        "seccompProfiles": ["runtime/default"],
        "readOnlyRootFilesystem": False,
        "priority": None,
        "users": [],
        "groups": [],
        "volumes": NONROOT_V2_VOLUMES + (["hostPath"] if host_path else []),
    }


def use_role(name: str, scc: str) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "gpt2bench"}},
            "rules": [{"apiGroups": ["security.openshift.io"], "resources": ["securitycontextconstraints"],
                       "resourceNames": [scc], "verbs": ["use"]}]}


def binding(benchmark: Benchmark, role: str) -> dict[str, Any]:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": label_value(f"gpt2bench-{benchmark.name}-scc"), "namespace": benchmark.namespace,
                         "labels": {"app.kubernetes.io/name": "gpt2bench"}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": service_account(benchmark),
                          "namespace": benchmark.namespace}]}


def openshift_objects(benchmark: Benchmark) -> list[dict[str, Any]]:
    """What to apply (as a cluster admin) before the benchmark on OpenShift; empty when restricted-v2 admits its
    pods."""
    if needs_more_than_nonroot(benchmark):
        scc = fabric_scc(benchmark)
        role = scc["metadata"]["name"]
        return [scc, use_role(role, role), binding(benchmark, role)]
    pods = benchmark.spec.pods
    if pods.run_as_user is not None or pods.fs_group is not None:  # restricted-v2 admits the namespace's ids only
        return [binding(benchmark, BUILTIN_ROLE.format(NONROOT_V2))]
    return []
