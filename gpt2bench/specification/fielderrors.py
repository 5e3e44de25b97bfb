"""Validation errors as a user reads them: the field as written in YAML, and a one-line message.

pydantic reports a location tuple and its own wording; `field_errors` turns every error of a
`ValidationError` into `(path, message)`: `spec.sweep.scales[1].nodes`, map keys as `spec.nodeSelector.zone`
or `spec.resources.limits[nvidia.com/gpu]`, the value shown as YAML would show it (`got true`), the
meaning of a pattern instead of the pattern, and a hint for snake_case field names. Model validators
raise `RuleError` with their own locations (relative to the model, or absolute from `spec`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError
from pydantic.alias_generators import to_camel

from gpt2bench.specification.kubesyntax import PATTERN_MEANINGS, Location, shown

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PLAIN_KEY = re.compile(r"^[!-~]+$")  # printable ASCII, no spaces: shown as [key]
# pydantic's own location parts that are no fields: dict-key markers and validator frames.
_NOT_FIELDS = re.compile(r"^(\[key\]|function-(after|before|plain|wrap)\[.*\])$")
# Error types whose message gains the value that was given.
_TYPE_ERRORS = {"int_type", "int_parsing", "int_from_float", "float_type", "float_parsing", "finite_number",
                "bool_type", "bool_parsing", "string_type", "dict_type", "list_type", "model_type", "literal_error",
                "model_attributes_type", "enum", "greater_than", "greater_than_equal", "less_than",
                "less_than_equal"}


class RuleError(ValueError):
    """A model validator's broken rules: (location relative to the model, or from "spec", message)."""

    def __init__(self, errors: list[tuple[Location, str]]):
        self.errors = errors
        super().__init__("; ".join(f"{'.'.join(map(str, loc))}: {message}" for loc, message in errors))


def field_path(loc: Iterable[Any]) -> str:
    """`("spec", "sweep", "scales", 1, "nodes")` → `spec.sweep.scales[1].nodes`."""
    path = ""
    for part in loc:
        if isinstance(part, int) and not isinstance(part, bool):
            path += f"[{part}]"
        elif isinstance(part, str) and _NOT_FIELDS.fullmatch(part):
            continue
        elif isinstance(part, str) and _IDENTIFIER.fullmatch(part):
            path += f".{part}" if path else part
        elif isinstance(part, str) and _PLAIN_KEY.fullmatch(part):
            path += f"[{part}]"
        else:
            path += f"[{part!r}]"
    return path


def field_errors(exc: ValidationError, prefix: Location, known_fields: set[str]) -> list[tuple[str, str]]:
    """Every error of `exc` as (path, message); `prefix` is where the validated object is (`("spec",)`)."""
    errors: list[tuple[str, str]] = []
    for err in exc.errors():
        loc = (*prefix, *err["loc"])
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, RuleError):
            for rule_loc, message in cause.errors:
                absolute = tuple(rule_loc)[:1] == prefix[:1]
                errors.append((field_path(rule_loc if absolute else (*loc, *rule_loc)), message))
        else:
            errors.append((field_path(loc), _message(err, known_fields)))
    return errors


def _message(err: dict[str, Any], known_fields: set[str]) -> str:
    kind, message = err["type"], err["msg"].removeprefix("Value error, ")
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        name = err["loc"][-1] if err["loc"] else ""
        camel = to_camel(name) if isinstance(name, str) else name
        if camel != name and camel in known_fields:
            return f"unknown field; did you mean {camel}? (field names are camelCase)"
        return "unknown field"
    if kind == "string_pattern_mismatch":
        meaning = PATTERN_MEANINGS.get((err.get("ctx") or {}).get("pattern"))
        if meaning:
            return f"{shown(err['input'])} is not {meaning}"
    if kind == "recursion_loop":
        return "refers to itself (a cyclic structure)"
    if kind in _TYPE_ERRORS:
        return f"{message}, got {shown(err['input'])}"
    return message
