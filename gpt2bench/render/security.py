"""Pod Security "restricted" for the pods of TrainJobs and of the project's training runtimes.

The rules (PSA v0.36.2, notes §12): every container sets allowPrivilegeEscalation: false and drops ALL
capabilities; the pod runs as non-root with a RuntimeDefault seccomp profile. The image's user is
gpt2bench (uid/gid 1000, Dockerfile), whose home holds the non-root sshd's config; fsGroup 1000 lets
it read the MPI plugin's SSH key files (mode 0640/0400, owned by root, group fsGroup).

These are meant to be the same helpers every rendered pod uses: when render/pods.py gains its shared
securityContext (the operator rework of issue 10), these two functions are replaced by its.
"""

from __future__ import annotations

from typing import Any

IMAGE_UID = 1000  # `useradd --uid 1000 ... gpt2bench` in the Dockerfile


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": IMAGE_UID,
        "runAsGroup": IMAGE_UID,
        "fsGroup": IMAGE_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
