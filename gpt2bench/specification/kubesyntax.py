"""What a Kubernetes API server accepts as a name, a label, an annotation or a resource quantity.

The rules (and regular expressions) are those of k8s.io/apimachinery `pkg/util/validation` and
`pkg/api/resource` and of the pod validation in k8s.io/kubernetes `pkg/apis/core/validation`:
`kubernetes-validate` checks built-in objects against their OpenAPI schemas, which leave these as free
strings, so the few syntax rules are restated here, each checked by a test. Quantities are parsed by
the `kubernetes` client's `parse_quantity` after the grammar check (it alone accepts `NaN`, `1_000`, ...).

Every check returns a problem (a sentence, without the field's name) or None.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity

Location = tuple[Any, ...]  # a field's place: ("metadata", "labels", "team")

DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
QUALIFIED_NAME_MAX = 63
LABEL_VALUE_MAX = 63
ANNOTATIONS_MAX_BYTES = 256 * 1024  # TotalAnnotationSizeLimitB: keys and values of one object together

DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS1123_SUBDOMAIN = rf"{DNS1123_LABEL}(\.{DNS1123_LABEL})*"
_QUALIFIED_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
# Anchored patterns, also used as OpenAPI `pattern`s in the CRD (the syntax RE2, ECMA 262 and Python share).
LABEL_VALUE_PATTERN = rf"^({_QUALIFIED_NAME})?$"
DNS1123_LABEL_PATTERN = rf"^{DNS1123_LABEL}$"
DNS1123_SUBDOMAIN_PATTERN = rf"^{DNS1123_SUBDOMAIN}$"
# resource.Quantity's grammar without the minus sign: requests and limits must not be negative.
QUANTITY_PATTERN = (
    r"^(\+)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
# Container image references: the pod validation refuses leading or trailing whitespace.
IMAGE_PATTERN = r"^\S(.*\S)?$"
# An image's content digest (OCI: algorithm sha256, 64 lower-case hex digits), as pinned references use it.
DIGEST_PATTERN = r"^sha256:[a-f0-9]{64}$"
# An environment variable's name as pods take it everywhere (validation.IsEnvVarName before the relaxed rule of
# Kubernetes 1.32+): letters, digits, '_', '-' and '.', not starting with a digit.
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
# A ConfigMap or Secret key (validation.IsConfigMapKey).
CONFIG_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
# A Linux capability as a container's securityContext names it (CAP_ prefix optional).
CAPABILITY_PATTERN = r"^[A-Z][A-Z0-9_]*$"
# An absolute path in a container without ':' (the pod validation refuses ':' in mount paths on Windows nodes
# and a relative path would depend on the image's working directory).
ABSOLUTE_PATH_PATTERN = r"^/[^:]*$"

# What each pattern means, for messages (pydantic would only say "should match pattern ...").
PATTERN_MEANINGS = {
    LABEL_VALUE_PATTERN: "a label value (letters, digits, '-', '_' and '.', starting and ending with a letter "
    "or digit)",
    DNS1123_LABEL_PATTERN: "a DNS-1123 label (lower-case letters, digits and '-', starting and ending with a letter "
    "or digit)",
    DNS1123_SUBDOMAIN_PATTERN: "a DNS-1123 subdomain (lower-case letters, digits, '-' and '.')",
    QUANTITY_PATTERN: "a non-negative quantity (e.g. 4, 500m, 16Gi, 1.5e3)",
    IMAGE_PATTERN: "an image reference without leading or trailing whitespace",
    DIGEST_PATTERN: "an image digest: sha256: followed by 64 lower-case hexadecimal digits",
    ENV_NAME_PATTERN: "an environment variable name (letters, digits, '_', '-' and '.', not starting with a digit)",
    CONFIG_KEY_PATTERN: "a ConfigMap or Secret key (letters, digits, '-', '_' and '.')",
    CAPABILITY_PATTERN: "a Linux capability name in capitals (IPC_LOCK, SYS_RESOURCE, ...)",
    ABSOLUTE_PATH_PATTERN: "an absolute path without ':'",
}


def pinned_image(reference: str, digest: str | None) -> str:
    """`reference` pinned to `digest` (`repo@sha256:...`): the digest replaces its tag and any digest it had.
    Without a digest, the reference as it is."""
    if not digest:
        return reference
    repository = reference.split("@", 1)[0]
    last = repository.rsplit("/", 1)[-1]
    if ":" in last:  # a tag (a ':' before the last '/' is a registry's port)
        repository = repository[: len(repository) - len(last)] + last.split(":", 1)[0]
    return f"{repository}@{digest}"

_LABEL_VALUE_RE = re.compile(LABEL_VALUE_PATTERN)
_DNS1123_LABEL_RE = re.compile(DNS1123_LABEL_PATTERN)
_DNS1123_SUBDOMAIN_RE = re.compile(DNS1123_SUBDOMAIN_PATTERN)
_QUALIFIED_NAME_RE = re.compile(rf"^{_QUALIFIED_NAME}$")
_QUANTITY_RE = re.compile(QUANTITY_PATTERN)
# Container resources without a domain prefix that pods accept (IsStandardContainerResourceName).
STANDARD_CONTAINER_RESOURCES = ("cpu", "memory", "ephemeral-storage")
HUGEPAGES_PREFIX = "hugepages-"


def dns1123_label_problem(name: str) -> str | None:
    if len(name) > DNS1123_LABEL_MAX:
        return f"must be at most {DNS1123_LABEL_MAX} characters, got {len(name)}"
    if not _DNS1123_LABEL_RE.fullmatch(name):
        return f"{shown(name)} is not {PATTERN_MEANINGS[DNS1123_LABEL_PATTERN]}"
    return None


def dns1123_subdomain_problem(name: str) -> str | None:
    if len(name) > DNS1123_SUBDOMAIN_MAX:
        return f"must be at most {DNS1123_SUBDOMAIN_MAX} characters, got {len(name)}"
    if not _DNS1123_SUBDOMAIN_RE.fullmatch(name):
        return f"{shown(name)} is not {PATTERN_MEANINGS[DNS1123_SUBDOMAIN_PATTERN]}"
    return None


def qualified_name_problem(key: str) -> str | None:
    """Label and annotation keys: `[prefix/]name`, prefix a DNS subdomain, name <= 63 characters."""
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or "/" in prefix):
        return f"{shown(key)} is not a qualified name: at most one '/', with a DNS subdomain before it"
    if slash and dns1123_subdomain_problem(prefix):
        return f"the prefix of {shown(key)} is not a DNS subdomain (lower-case letters, digits, '-' and '.')"
    if len(name) > QUALIFIED_NAME_MAX:
        return f"the name part of {shown(key)} must be at most {QUALIFIED_NAME_MAX} characters, got {len(name)}"
    if not _QUALIFIED_NAME_RE.fullmatch(name):
        return (f"{shown(key)} is not a qualified name: letters, digits, '-', '_' and '.', starting and ending with a "
                "letter or digit, optionally after a DNS subdomain and '/'")
    return None


def label_value_problem(value: str) -> str | None:
    if len(value) > LABEL_VALUE_MAX:
        return f"a label value must be at most {LABEL_VALUE_MAX} characters, got {len(value)}"
    if not _LABEL_VALUE_RE.fullmatch(value):
        return f"{shown(value)} is not {PATTERN_MEANINGS[LABEL_VALUE_PATTERN]}"
    return None


def annotations_size(annotations: Mapping[str, str]) -> int:
    """What the API server counts against its 256 KiB: the bytes of every key and value."""
    return sum(len(str(k).encode()) + len(str(v).encode()) for k, v in annotations.items())


def label_errors(labels: Any, loc: Location) -> Iterator[tuple[Location, str]]:
    """(location, problem) for a labels mapping (object labels, pod labels, a node selector)."""
    if not isinstance(labels, Mapping):
        yield loc, f"must be a mapping of strings, got {shown(labels)}"
        return
    for key, value in labels.items():
        problem = qualified_name_problem(key) if isinstance(key, str) else f"keys must be strings, got {shown(key)}"
        if problem:
            yield (*loc, key), problem
        if not isinstance(value, str):
            yield (*loc, key), f"must be a string, got {shown(value)}"
        elif problem := label_value_problem(value):
            yield (*loc, key), problem


def annotation_errors(annotations: Any, loc: Location) -> Iterator[tuple[Location, str]]:
    """(location, problem) for an annotations mapping: qualified-name keys, string values, 256 KiB."""
    if not isinstance(annotations, Mapping):
        yield loc, f"must be a mapping of strings, got {shown(annotations)}"
        return
    for key, value in annotations.items():
        # the API server lower-cases annotation keys before checking them
        problem = qualified_name_problem(key.lower()) if isinstance(key, str) else \
            f"keys must be strings, got {shown(key)}"
        if problem:
            yield (*loc, key), problem
        if not isinstance(value, str):
            yield (*loc, key), f"must be a string, got {shown(value)}"
    size = annotations_size(annotations)
    if size > ANNOTATIONS_MAX_BYTES:
        yield loc, f"keys and values take {size} bytes, more than the API server's {ANNOTATIONS_MAX_BYTES}"


# ObjectMeta's fields (a client may send any; kubectl's strict field validation refuses others).
OBJECT_META_FIELDS = (
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation", "creationTimestamp",
    "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations", "ownerReferences", "finalizers",
    "managedFields",
)  # fmt: skip


def object_meta_errors(metadata: Any, loc: Location = ("metadata",)) -> list[tuple[Location, str]]:
    """(location, problem) for an object's metadata as the API server checks a named, namespaced object."""
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, Mapping):
        return [(loc, f"must be a mapping, got {shown(metadata)}")]
    errors = [((*loc, key), "unknown field") for key in metadata if key not in OBJECT_META_FIELDS]
    name = metadata.get("name")
    if name is None:
        errors.append(((*loc, "name"), "is required"))
    elif not isinstance(name, str):
        errors.append(((*loc, "name"), f"must be a string, got {shown(name)}"))
    elif problem := dns1123_subdomain_problem(name):
        errors.append(((*loc, "name"), problem))
    for field, check in (("namespace", dns1123_label_problem), ("uid", None)):
        value = metadata.get(field)
        if value is not None and not isinstance(value, str):
            errors.append(((*loc, field), f"must be a string, got {shown(value)}"))
        elif value and check and (problem := check(value)):
            errors.append(((*loc, field), problem))
    if metadata.get("labels") is not None:
        errors += label_errors(metadata["labels"], (*loc, "labels"))
    if metadata.get("annotations") is not None:
        errors += annotation_errors(metadata["annotations"], (*loc, "annotations"))
    return errors


# ------------------------------------------------------------------ resources
def quantity_problem(value: Any) -> str | None:
    """A non-negative resource.Quantity: a whole number, or a string in its grammar."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        return f"must be a quantity (a whole number or a string such as 500m or 16Gi), got {shown(value)}"
    if isinstance(value, int):
        return None if value >= 0 else f"must not be negative, got {value}"
    if not _QUANTITY_RE.fullmatch(value):
        if value.startswith("-") and _QUANTITY_RE.fullmatch(value[1:]):
            return f"must not be negative, got {shown(value)}"
        return f"{shown(value)} is not {PATTERN_MEANINGS[QUANTITY_PATTERN]}"
    try:
        parse_quantity(value)
    except ValueError:
        return f"{shown(value)} is too large to be a quantity"
    return None


def quantity_value(value: int | str) -> Decimal:
    """The number a valid quantity stands for (`500m` → 0.5, `1Ki` → 1024)."""
    return parse_quantity(value)


def is_extended_resource(name: str) -> bool:
    """A resource a device plugin provides (`nvidia.com/gpu`): domain-prefixed, not kubernetes.io's."""
    domain = name.split("/", 1)[0] if "/" in name else ""
    return bool(domain) and domain != "kubernetes.io" and not domain.endswith(".kubernetes.io")


def resource_name_problem(name: str) -> str | None:
    """A container's resource name: cpu, memory, ephemeral-storage, hugepages-<size>, or domain/name."""
    if "/" in name:
        problem = qualified_name_problem(name)
        return f"{problem} (a resource name)" if problem else None
    if name in STANDARD_CONTAINER_RESOURCES:
        return None
    if name.startswith(HUGEPAGES_PREFIX) and quantity_problem(name[len(HUGEPAGES_PREFIX):]) is None:
        return None
    return (f"{shown(name)} is not a container resource: {', '.join(STANDARD_CONTAINER_RESOURCES)}, hugepages-<size>, "
            "or a domain-prefixed extended resource such as nvidia.com/gpu")


def shown(value: Any) -> str:
    """A value as YAML shows it, short: 2024, true, null, .inf, "text", a list."""
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    if isinstance(value, bool | int | float | str) or value is None:
        try:
            text = json.dumps(value, ensure_ascii=False)
        except ValueError:  # an integer of more digits than Python converts
            return "an integer"
        return text if len(text) <= 60 else text[:57] + "..."
    return type_name(value)


def type_name(value: Any) -> str:
    """How a YAML user calls a value's type."""
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
             dict: "a mapping", type(None): "null", bytes: "binary data"}
    return next((name for kind, name in names.items() if type(value) is kind), type(value).__name__)
