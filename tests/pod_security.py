"""The Pod Security Standards' "restricted" profile as a checker of pod templates, for tests.

Each check follows one file of kubernetes/pod-security-admission at tag v0.36.2 (`policy/check_*.go`, the
rule in that file's header comment; the restricted level is every baseline check plus the restricted ones,
`policy/registry.go`). Enforcement rejects Pods, so a Kubeflow job whose template breaks a rule is accepted
and its pods are then refused one by one: the checks run on the templates we render, before any cluster.

`violations(pod_template)` returns one line per broken rule, naming the check and the field.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpt2bench import jobkinds as kinds

# check_capabilities_baseline.go (capabilities_allowed_1_0); restricted narrows it to NET_BIND_SERVICE.
RESTRICTED_ADD_CAPABILITIES = {"NET_BIND_SERVICE"}
# check_restrictedVolumes.go: the only inline volume sources allowed.
RESTRICTED_VOLUMES = {"configMap", "downwardAPI", "emptyDir", "projected", "secret", "csi", "persistentVolumeClaim",
                      "ephemeral", "image"}
# check_sysctls.go: the "safe" sysctls.
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start", "net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem",
}  # fmt: skip
SECCOMP_ALLOWED = {"RuntimeDefault", "Localhost"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t"}
APPARMOR_TYPES = {"RuntimeDefault", "Localhost"}


def _containers(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for i, container in enumerate(spec.get(field) or []):
            yield f"spec.{field}[{i}]({container.get('name')})", container


def violations(template: dict[str, Any]) -> list[str]:
    """Every restricted-profile rule `template` (a pod or a pod template: metadata + spec) breaks."""
    spec = template.get("spec") or {}
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    pod_sc = spec.get("securityContext") or {}
    found: list[str] = []

    # --- baseline -------------------------------------------------------------------------------
    for field in ("hostNetwork", "hostPID", "hostIPC"):  # check_hostNamespaces.go
        if spec.get(field):
            found.append(f"hostNamespaces: spec.{field} must be false or unset")
    for volume in spec.get("volumes") or []:  # check_hostPathVolumes.go
        if "hostPath" in volume:
            found.append(f"hostPathVolumes: volume {volume.get('name')} is a hostPath")
    for key, value in annotations.items():  # check_appArmorProfile.go (annotation form)
        if key.startswith("container.apparmor.security.beta.kubernetes.io/") and not (
                value in ("", "runtime/default") or value.startswith("localhost/")):
            found.append(f"appArmorProfile: annotation {key}={value}")
    for sysctl in pod_sc.get("sysctls") or []:  # check_sysctls.go
        if sysctl.get("name") not in SAFE_SYSCTLS:
            found.append(f"sysctls: spec.securityContext.sysctls {sysctl.get('name')} is not a safe sysctl")
    if (spec.get("securityContext") or {}).get("windowsOptions", {}).get("hostProcess"):  # check_windowsHostProcess.go
        found.append("windowsHostProcess: spec.securityContext.windowsOptions.hostProcess must not be true")
    found += _selinux("spec.securityContext", pod_sc)
    found += _apparmor("spec.securityContext", pod_sc)

    # --- restricted, pod level --------------------------------------------------------------------
    for volume in spec.get("volumes") or []:  # check_restrictedVolumes.go
        sources = set(volume) - {"name"}
        if not sources <= RESTRICTED_VOLUMES:
            found.append(f"restrictedVolumes: volume {volume.get('name')} uses {sorted(sources - RESTRICTED_VOLUMES)}")
    if pod_sc.get("runAsUser") == 0:  # check_runAsUser.go
        found.append("runAsUser: spec.securityContext.runAsUser must not be 0")
    if pod_sc.get("runAsNonRoot") is False:  # check_runAsNonRoot.go: an explicit false anywhere fails
        found.append("runAsNonRoot: spec.securityContext.runAsNonRoot must not be false")
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    if pod_seccomp is not None and pod_seccomp not in SECCOMP_ALLOWED:  # check_seccompProfile_restricted.go
        found.append(f"seccompProfile: spec.securityContext.seccompProfile.type {pod_seccomp}")

    # --- per container ------------------------------------------------------------------------------
    for where, container in _containers(spec):
        sc = container.get("securityContext") or {}
        if sc.get("privileged"):  # check_privileged.go
            found.append(f"privileged: {where}.securityContext.privileged must be false")
        for port in container.get("ports") or []:  # check_hostPorts.go
            if port.get("hostPort"):
                found.append(f"hostPorts: {where} port {port.get('name')} sets hostPort")
        if sc.get("procMount") not in (None, "Default"):  # check_procMount_baseline.go / _restricted.go
            found.append(f"procMount: {where}.securityContext.procMount {sc.get('procMount')}")
        found += _selinux(f"{where}.securityContext", sc)
        found += _apparmor(f"{where}.securityContext", sc)
        found += _probe_hosts(where, container)  # check_hostProbesAndhostLifecycle.go
        if sc.get("allowPrivilegeEscalation") is not False:  # check_allowPrivilegeEscalation.go: explicit false
            found.append(f"allowPrivilegeEscalation: {where}.securityContext.allowPrivilegeEscalation must be false")
        caps = sc.get("capabilities") or {}  # check_capabilities_restricted.go
        if "ALL" not in (caps.get("drop") or []):
            found.append(f"capabilities: {where}.securityContext.capabilities.drop must include ALL")
        if set(caps.get("add") or []) - RESTRICTED_ADD_CAPABILITIES:
            found.append(f"capabilities: {where} adds {sorted(set(caps['add']) - RESTRICTED_ADD_CAPABILITIES)}")
        if sc.get("runAsUser") == 0:  # check_runAsUser.go
            found.append(f"runAsUser: {where}.securityContext.runAsUser must not be 0")
        # check_runAsNonRoot.go: true at the pod, or true in every container; false anywhere fails
        if sc.get("runAsNonRoot") is False or (sc.get("runAsNonRoot") is not True and pod_sc.get("runAsNonRoot") is not True):
            found.append(f"runAsNonRoot: {where} may run as root (runAsNonRoot not true here or at the pod)")
        # check_seccompProfile_restricted.go: set at the pod, or in every container, to an allowed type
        seccomp = (sc.get("seccompProfile") or {}).get("type")
        if seccomp is not None and seccomp not in SECCOMP_ALLOWED:
            found.append(f"seccompProfile: {where}.securityContext.seccompProfile.type {seccomp}")
        elif seccomp is None and pod_seccomp is None:
            found.append(f"seccompProfile: {where} has no seccomp profile (none at the pod either)")
    return found


def _selinux(where: str, sc: dict[str, Any]) -> list[str]:  # check_seLinuxOptions.go
    options = sc.get("seLinuxOptions") or {}
    found = []
    if options.get("type", "") not in SELINUX_TYPES:
        found.append(f"seLinuxOptions: {where}.seLinuxOptions.type {options['type']}")
    for field in ("user", "role"):
        if options.get(field):
            found.append(f"seLinuxOptions: {where}.seLinuxOptions.{field} must be empty")
    return found


def _apparmor(where: str, sc: dict[str, Any]) -> list[str]:  # check_appArmorProfile.go (field form)
    kind = (sc.get("appArmorProfile") or {}).get("type")
    return [] if kind is None or kind in APPARMOR_TYPES else [f"appArmorProfile: {where}.appArmorProfile.type {kind}"]


def _probe_hosts(where: str, container: dict[str, Any]) -> list[str]:
    found = []
    handlers = {probe: container.get(probe) or {} for probe in ("livenessProbe", "readinessProbe", "startupProbe")}
    handlers |= {f"lifecycle.{hook}": (container.get("lifecycle") or {}).get(hook) or {}
                 for hook in ("postStart", "preStop")}
    for name, handler in handlers.items():
        for action in ("httpGet", "tcpSocket"):
            if (handler.get(action) or {}).get("host"):
                found.append(f"hostProbesAndhostLifecycle: {where}.{name}.{action}.host must be empty")
    return found


def pod_templates(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Replica type -> pod template of a rendered PyTorchJob or MPIJob (none for a TrainJob), read through the
    job kinds' table as the local runner reads them."""
    return {role: spec["template"] for role, spec in kinds.replica_specs(job).items()}
