"""The building blocks of the spec's models (gpt2bench/specification/model.py): the base model, value types, CEL rules.

- `SpecModel`: camelCase fields, unknown fields refused, JSON types without coercion, finite numbers, and
  null taken for "not given", as the API server prunes it;
- integers as the API server reads JSON (5.0 is 5, `true` is no integer);
- value types as the API server types them: `Quantity` (resource.Quantity, not negative), label values,
  and maps whose null values are dropped;
- `cel(...)`: a model's `x-kubernetes-validations`, which the CRD generator copies into the schema.
"""

from __future__ import annotations

import functools
import json
import re
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainValidator, WithJsonSchema, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from gpt2bench.specification import kubesyntax
from gpt2bench.specification.kubesyntax import LABEL_VALUE_PATTERN, QUANTITY_PATTERN


def whole_number(value: Any) -> Any:
    """JSON has one number type: the API server takes 5.0 for an integer field, so 5.0 is 5 here too."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def quantity(value: Any) -> int | str:
    value = whole_number(value)
    problem = kubesyntax.quantity_problem(value)
    if problem:
        raise PydanticCustomError("quantity", "{problem}", {"problem": problem})
    return value


def without_nulls(value: Any) -> Any:
    """Null map values are dropped, as the API server prunes them."""
    return {k: v for k, v in value.items() if v is not None} if isinstance(value, dict) else value


# resource.Quantity in a CRD (controller-gen's form): int-or-string, strings in its grammar without a minus
# sign, and a CEL rule for negative integers (OpenAPI's `minimum` is for number fields, not int-or-string).
Quantity = Annotated[int | str, PlainValidator(quantity), WithJsonSchema({
    "description": "A quantity, as in a pod's resources: an integer, or a string such as 500m or 2Gi.",
    "anyOf": [{"type": "integer"}, {"type": "string", "pattern": QUANTITY_PATTERN}],
    "x-kubernetes-validations": [{"rule": "type(self) == string || self >= 0", "message": "must not be negative"}],
})]
ResourceList = Annotated[dict[str, Quantity], BeforeValidator(without_nulls)]
LabelValue = Annotated[str, Field(max_length=kubesyntax.LABEL_VALUE_MAX, pattern=LABEL_VALUE_PATTERN,
                                  description="A label value: at most 63 characters, alphanumerics, '-', '_' and '.'.")]
Labels = Annotated[dict[str, LabelValue], BeforeValidator(without_nulls)]
Annotations = Annotated[dict[str, Annotated[str, Field(description="An annotation value.")]],
                        BeforeValidator(without_nulls)]


def cel(*rules: tuple[str, str]) -> Callable[[dict[str, Any], type[BaseModel]], None]:
    """`x-kubernetes-validations` for a model's CRD schema: (CEL rule, message) pairs. `$field` in a rule
    is the field's value, or its default where it is absent: a real API server has filled the default in,
    other evaluators (kubectl's dry runs, tests' emulator) have not, and the rule means the same to all."""

    def extra(schema: dict[str, Any], model: type[BaseModel]) -> None:
        fields = {(info.alias or name): info for name, info in model.model_fields.items()}

        def value_or_default(match: re.Match) -> str:
            default = fields[match.group(1)].default
            return f"(has(self.{match.group(1)}) ? self.{match.group(1)} : {json.dumps(default)})"

        schema["x-kubernetes-validations"] = [
            {"rule": re.sub(r"\$(\w+)", value_or_default, rule), "message": message} for rule, message in rules]

    return extra


class SpecModel(BaseModel):
    """camelCase in YAML, snake_case in Python; unknown fields are errors, not silently dropped; JSON types
    are not coerced (`true` is no integer, `"5"` no number); numbers are finite."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", strict=True,
                              allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _as_the_api_server_reads_json(cls, data: Any) -> Any:
        """Null is "not given" (unless it means something); 5.0 is the integer 5."""
        if not isinstance(data, dict):
            return data
        keep, integers = meaningful_nulls(cls), integer_fields(cls)
        return {key: whole_number(value) if key in integers else value
                for key, value in data.items() if value is not None or key in keep}


def _names(model: type[BaseModel], wanted: Callable[[Any], bool]) -> frozenset[str]:
    """Names and aliases of the fields `wanted(field info)` picks."""
    return frozenset(n for name, info in model.model_fields.items() if wanted(info) for n in (name, info.alias or name))


def _types(annotation: Any) -> tuple[Any, ...]:
    """The types an annotation admits: `int | None` → (int, NoneType); `Annotated[int, ...]` → (int,)."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _types(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return tuple(t for arg in typing.get_args(annotation) for t in _types(arg))
    return (annotation,)


@functools.cache
def meaningful_nulls(model: type[BaseModel]) -> frozenset[str]:
    """Fields whose null differs from their absence: nullable, with a default that is not null."""
    return _names(model, lambda info: info.default is not None and not info.is_required()
                  and type(None) in _types(info.annotation))


@functools.cache
def integer_fields(model: type[BaseModel]) -> frozenset[str]:
    """Fields that hold integers (JSON writes 5 and 5.0 alike; the API server takes both for an integer)."""
    return _names(model, lambda info: int in _types(info.annotation))
