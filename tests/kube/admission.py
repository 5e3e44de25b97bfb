"""The API server's Pod Security admission, played on pod creation where a test enforces it, in upstream's words
(kubernetes/pod-security-admission, `policy/check_restrictedVolumes.go`; the API server's Forbidden status,
apiserver `admission.NewForbidden`).

Only the restricted level's volume check is played: a pod with a volume of a type outside restricted's list (a
`hostPath`, what `spec.pods.volumes` can add) is refused with `pods "<name>" is forbidden: violates PodSecurity
"restricted:latest": restricted volume types (volume "<v>" uses restricted volume type "hostPath")`. At the
restricted level this check replaces the baseline `hostPath volumes` one (its OverrideCheckIDs), so that is the
whole answer for a pod that passes the other checks, as the project's do. The name is the generated one: Pod
Security validates after the API server has generated it (a Job controller's pod has only a `generateName`).

Install with `cluster.call(lambda e: e.faults.append(restricted_volumes))`: one of the emulator's `faults`
(consulted before it stores anything), not a kmock reaction, whose matching would cost every later request of
the module a scan of all the requests before it (tests/kube/emulator.py, `_direct`).
"""

from __future__ import annotations

import random
from typing import Any

import kmock

from .faults import request_method
from .semantics import ApiError

# check_restrictedVolumes.go: the only volume sources restricted admits
RESTRICTED_ALLOWED = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
                      "secret", "image"}
# apimachinery util/rand: the alphabet and length of a generated name's suffix (names.SimpleNameGenerator)
_ALPHANUMS, _SUFFIX = "bcdfghjklmnpqrstvwxz2456789", 5


def _join_quote(words: list[str]) -> str:
    return ", ".join(f'"{word}"' for word in words)


def restricted_volume_types(spec: dict[str, Any]) -> str | None:
    """Pod Security "restricted"'s answer for a pod spec's volumes, or None when they pass."""
    bad = [(v["name"], next(k for k in v if k != "name")) for v in spec.get("volumes") or []
           if not set(v) - {"name"} <= RESTRICTED_ALLOWED]
    if not bad:
        return None
    names, types = [name for name, _ in bad], sorted({kind for _, kind in bad})
    one = len(names) == 1
    detail = (f"{'volume' if one else 'volumes'} {_join_quote(names)} {'uses' if one else 'use'} restricted volume "
              f"{'type' if len(types) == 1 else 'types'} {_join_quote(types)}")
    return f'violates PodSecurity "restricted:latest": restricted volume types ({detail})'


def restricted_volumes(request: kmock.Request) -> ApiError | None:
    """On pod creation, 403 Forbidden for a pod restricted's volume check refuses; None (the emulator's own
    handling) for any other request."""
    if (request_method(request) != "POST" or request.resource is None or request.resource.plural != "pods"
            or request.subresource):
        return None
    pod = request.data or {}
    answer = restricted_volume_types(pod.get("spec") or {})
    if answer is None:
        return None
    metadata = pod.get("metadata") or {}
    name = metadata.get("name") or metadata.get("generateName", "") + "".join(
        random.choices(_ALPHANUMS, k=_SUFFIX))
    return ApiError(403, "Forbidden", f'pods "{name}" is forbidden: {answer}')
