"""API-server semantics kmock 0.8 lacks, as pure functions: patches, selectors, CRD schemas.

The emulator (`tests/kube/emulator.py`) calls these; they know nothing about HTTP.

Custom resources are checked as k8s.io/apiextensions-apiserver does, in its order: unknown fields pruned
(or refused under `fieldValidation=Strict`), nulls of non-nullable fields pruned or defaulted, then the
OpenAPI schema, `x-kubernetes-list-type` set/map uniqueness and the CEL rules of
`x-kubernetes-validations` (evaluated with cel-python, a CEL implementation from the spec's authors'
conformance tests). Not emulated: defaulting of absent fields (rules must not rely on it), CEL cost
limits, transition rules (`oldSelf`), and CEL rules on an object whose schema check already failed.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import celpy
import jsonpatch
import jsonschema

# celpy logs every evaluation at DEBUG with a repr of the whole object validated. Under kopf's --verbose (the root
# logger at DEBUG, as the operator tests run) those records were 95% of what a test logged, and formatting them
# slowed the in-process emulator that the operator and the test's controllers share.
logging.getLogger("celpy").setLevel(logging.INFO)


class ApiError(Exception):
    """An error the emulator answers as a Kubernetes `Status` with this code and reason."""

    def __init__(self, code: int, reason: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message
        self.headers = headers or {}  # e.g. Retry-After with a 429


# --- patches ------------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (what `application/merge-patch+json` means)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def apply_patch(obj: dict, patch: Any, content_type: str) -> dict:
    """Apply a PATCH body by its content type, as the API server does for custom resources."""
    kind = content_type.split(";")[0].strip()
    if kind == "application/json-patch+json":
        if not isinstance(patch, list):
            raise ApiError(400, "BadRequest", "a JSON patch must be a list of operations")
        try:
            return jsonpatch.apply_patch(obj, patch, in_place=False)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            # the API server answers a failed `test` op with 422, which kopf relies on
            raise ApiError(422, "Invalid", f"the JSON patch cannot be applied: {exc}") from None
    if kind in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
        # strategic merge is only defined for built-in kinds; for our few built-ins a merge is close enough
        if not isinstance(patch, dict):
            raise ApiError(400, "BadRequest", "a merge patch must be an object")
        return merge_patch(obj, patch)
    raise ApiError(415, "UnsupportedMediaType", f"the patch content type {kind!r} is not supported")


# --- label and field selectors --------------------------------------------------------------------

_SET_RE = re.compile(r"^\s*([\w./-]+)\s+(in|notin)\s+\((.*)\)\s*$")


def _split_selector(selector: str) -> list[str]:
    """Split on commas that are not inside `in (a,b)` parentheses."""
    parts, depth, current = [], 0, ""
    for char in selector:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def matches_labels(labels: dict[str, str], selector: str | None) -> bool:
    """Kubernetes label selector: `a=b`, `a==b`, `a!=b`, `a`, `!a`, `a in (x,y)`, `a notin (x)`."""
    for term in _split_selector(selector or ""):
        set_match = _SET_RE.match(term)
        if set_match:
            key, op, values = set_match.groups()
            wanted = {v.strip() for v in values.split(",") if v.strip()}
            if (op == "in") != (labels.get(key) in wanted):
                return False
        elif "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


def matches_fields(obj: dict, selector: str | None) -> bool:
    """Field selectors on `metadata.name` / `metadata.namespace` (what clients use them for)."""
    for term in _split_selector(selector or ""):
        negate = "!=" in term
        key, value = (s.strip() for s in term.replace("!=", "=").replace("==", "=").split("=", 1))
        current: Any = obj
        for part in key.split("."):
            current = current.get(part) if isinstance(current, dict) else None
        if (str(current) == value) == negate:
            return False
    return True


# --- object metadata ------------------------------------------------------------------------------

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_NAME = _LABEL_VALUE
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_VALUE_RULE = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
                     "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  "
                     "or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')")


def label_errors(labels: dict[str, Any]) -> list[str]:
    """ObjectMeta label validation, which the API server applies to every object, custom ones included
    (apimachinery validation.IsQualifiedName / IsValidLabelValue)."""
    errors = []
    for key, value in (labels or {}).items():
        prefix, _, name = key.rpartition("/")
        if (prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix))) or not name or len(name) > 63 \
                or not _LABEL_NAME.fullmatch(name):
            errors.append(f'metadata.labels: Invalid value: "{key}": name part must consist of alphanumeric '
                          f"characters, '-', '_' or '.', and must start and end with an alphanumeric character")
        if not isinstance(value, str):
            errors.append(f'metadata.labels.{key}: Invalid value: {value!r}: must be a string')
        elif len(value) > 63:
            errors.append(f'metadata.labels: Invalid value: "{value}": must be no more than 63 characters')
        elif not _LABEL_VALUE.fullmatch(value):
            errors.append(f'metadata.labels: Invalid value: "{value}": {_LABEL_VALUE_RULE}')
    return errors


def validate_metadata(obj: dict) -> None:
    """Raise ApiError(422) as the API server does for an object whose metadata is invalid."""
    errors = label_errors((obj.get("metadata") or {}).get("labels") or {})
    if errors:
        name = (obj.get("metadata") or {}).get("name")
        raise ApiError(422, "Invalid", f'{obj.get("kind")} "{name}" is invalid: ' + ", ".join(errors))


# --- CRD schemas --------------------------------------------------------------------------------


def _prune(value: Any, schema: dict, path: str, unknown: list[str]) -> Any:
    """Drop fields the structural schema does not declare, recording their paths."""
    if not isinstance(schema, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return value
    if isinstance(value, dict) and (schema.get("type") == "object" or "properties" in schema):
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        result = {}
        for key, item in value.items():
            if properties is not None and key in properties:
                result[key] = _prune(item, properties[key], f"{path}.{key}", unknown)
            elif isinstance(extra, dict):
                result[key] = _prune(item, extra, f"{path}.{key}", unknown)
            elif properties is None and extra is None:
                result[key] = item  # a bare `type: object`
            else:
                unknown.append(f"{path}.{key}")
        return result
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_prune(item, schema["items"], f"{path}[{i}]", unknown) for i, item in enumerate(value)]
    return value


def _to_jsonschema(schema: Any) -> Any:
    """OpenAPI v3 → JSON Schema: `nullable` and int-or-string need translating, the rest carries over."""
    if isinstance(schema, list):
        return [_to_jsonschema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _to_jsonschema(v) for k, v in schema.items() if not k.startswith("x-kubernetes")}
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    for bound, limit in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(bound), bool):  # OpenAPI 3.0's boolean form → JSON Schema's number form
            if out.pop(bound) and limit in out:
                out[bound] = out.pop(limit)
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    if isinstance(out.get("pattern"), str):
        out["pattern"] = go_pattern(out["pattern"])
    return out


def go_pattern(pattern: str) -> str:
    """A schema pattern for Python's `re` as Go reads it: a final `$` is the end of the text (`\\Z`), where
    Python's `$` also matches before a final newline and would let "name\\n" through."""
    return pattern[:-1] + r"\Z" if re.search(r"(?<!\\)\$$", pattern) else pattern


_VALIDATORS: dict[int, tuple[dict, jsonschema.Draft7Validator]] = {}


def _validator(schema: dict) -> jsonschema.Draft7Validator:
    """One validator per schema: building one for the 600 KB Kubeflow CRDs takes most of a second."""
    cached = _VALIDATORS.get(id(schema))
    if cached is None or cached[0] is not schema:
        body_schema = {**schema, "properties": {
            k: v for k, v in (schema.get("properties") or {}).items() if k not in ("apiVersion", "kind", "metadata")
        }}
        cached = _VALIDATORS[id(schema)] = (schema, jsonschema.Draft7Validator(_to_jsonschema(body_schema)))
    return cached[1]


def prune_nulls(value: Any, schema: Any) -> None:
    """Drop a null whose schema is not nullable, or put the default in its place (in place), as the API
    server's PruneNonNullableNullsWithoutDefaults and defaulting do before validating."""
    if isinstance(value, dict) and isinstance(schema, dict):
        extra = schema.get("additionalProperties") if isinstance(schema.get("additionalProperties"), dict) else None
        for key in list(value):
            sub = (schema.get("properties") or {}).get(key, extra)
            if value[key] is None and isinstance(sub, dict) and not sub.get("nullable"):
                if sub.get("default") is not None:
                    value[key] = copy.deepcopy(sub["default"])
                else:
                    del value[key]
            else:
                prune_nulls(value[key], sub)
    elif isinstance(value, list) and isinstance(schema, dict):
        for item in value:
            prune_nulls(item, schema.get("items"))


def _nodes(value: Any, schema: Any, path: str) -> Iterator[tuple[Any, dict, str]]:
    """Every (value, its schema, its path) of an object, as the API server names paths (`a.b[0][key]`)."""
    if not isinstance(schema, dict):
        return
    yield value, schema, path
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if key in properties:
                yield from _nodes(item, properties[key], f"{path}.{key}" if path else key)
            elif isinstance(extra, dict):
                yield from _nodes(item, extra, f"{path}[{key}]")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _nodes(item, schema.get("items"), f"{path}[{i}]")


def list_type_errors(value: Any, schema: dict) -> list[str]:
    """Duplicates in `x-kubernetes-list-type: set` lists and `map` lists (by their map keys)."""
    causes = []
    for node, node_schema, path in _nodes(value, schema, ""):
        list_type = node_schema.get("x-kubernetes-list-type")
        if not isinstance(node, list) or list_type not in ("set", "map"):
            continue
        keys = node_schema.get("x-kubernetes-list-map-keys") or []
        seen: list[Any] = []
        for i, item in enumerate(node):
            key = item if list_type == "set" else [item.get(k) for k in keys] if isinstance(item, dict) else item
            if key in seen:
                causes.append(f"{path}[{i}]: Duplicate value: {json.dumps(item, sort_keys=True)}")
            seen.append(key)
    return causes


@functools.cache
def _cel_program(rule: str) -> celpy.Runner:
    environment = celpy.Environment()
    return environment.program(environment.compile(rule))


def cel_errors(value: Any, schema: dict) -> list[str]:
    """Every failed `x-kubernetes-validations` rule, as the API server reports it:
    `spec.training: Invalid value: "object": warmupSteps must be less than steps`."""
    causes = []
    for node, node_schema, path in _nodes(value, schema, ""):
        for validation in node_schema.get("x-kubernetes-validations") or []:
            if "oldSelf" in validation["rule"]:
                continue  # a transition rule: the API server checks it on update only (a gap here, see above)
            kind = node_schema.get("type") or type(node).__name__
            holds, evaluation_error = _cel_outcome(validation["rule"], json.dumps(node, sort_keys=True))
            if evaluation_error is not None:
                causes.append(f"{path}: Invalid value: \"{kind}\": rule evaluation failed: {evaluation_error}")
            elif not holds:
                message = validation.get("message") or f"failed rule: {validation['rule']}"
                causes.append(f"{path}: Invalid value: \"{kind}\": {message}")
    return causes


@functools.lru_cache(maxsize=8192)
def _cel_outcome(rule: str, node_json: str) -> tuple[bool, str | None]:
    """Whether `rule` holds for the node, given as JSON, and why its evaluation failed (None: it did not). A
    rule's result depends on the node's value alone, so a spec's rules are evaluated once, not again at every
    status write: celpy interprets each rule's parse tree, and that was most of the emulator's time."""
    try:
        result = _cel_program(rule).evaluate({"self": celpy.json_to_cel(json.loads(node_json))})
    except celpy.CELEvalError as exc:
        return False, exc.args[0]
    return result is True or result == celpy.celtypes.BoolType(True), None


def _short(error: jsonschema.ValidationError) -> str:
    """jsonschema's message without a long value in it (`[{...}, ...] is too long` → `<value> is too long`)."""
    shown = repr(error.instance)
    return error.message.replace(shown, "<value>") if len(shown) > 80 else error.message


def validate_custom_resource(obj: dict, crd_version: dict, strict: bool) -> dict:
    """Prune (or, with `fieldValidation=Strict`, reject) unknown fields, prune nulls, then check the schema,
    list types and CEL rules.

    Returns the object as it would be stored. Raises ApiError(422) naming the bad fields, as the API
    server does (`spec.sweep.concurrency: Invalid value: ...`).
    """
    schema = ((crd_version.get("schema") or {}).get("openAPIV3Schema")) or {}
    unknown: list[str] = []
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    pruned = _prune(body, schema, "", unknown)
    if unknown and strict:
        fields = ", ".join(f"unknown field \"{u.lstrip('.')}\"" for u in unknown)
        raise ApiError(422, "Invalid", f"strict decoding error: {fields}")
    prune_nulls(pruned, schema)
    stored = {**{k: obj[k] for k in ("apiVersion", "kind", "metadata") if k in obj}, **pruned}
    checked = {k: v for k, v in stored.items() if k not in ("apiVersion", "kind", "metadata")}
    errors = sorted(_validator(schema).iter_errors(checked), key=lambda e: list(e.absolute_path))
    causes = [f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: Invalid value: {_short(e)}" for e in errors]
    if not causes:
        body_schema = {**schema, "properties": {k: v for k, v in (schema.get("properties") or {}).items()
                                                if k not in ("apiVersion", "kind", "metadata")}}
        # a root rule sees metadata.name and generateName only (apiextensions-apiserver's CEL root object)
        metadata = {k: v for k, v in (obj.get("metadata") or {}).items() if k in ("name", "generateName")}
        causes = list_type_errors(checked, body_schema) + cel_errors({**checked, "metadata": metadata}, body_schema)
    if causes:
        raise ApiError(422, "Invalid", f"{obj.get('kind')} {obj.get('metadata', {}).get('name')!r} is invalid: "
                       + "; ".join(causes))
    return stored
