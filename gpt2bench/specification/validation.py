"""The one validation of a GPT2Benchmark, shared by `gpt2bench render`, `run`, `report` and the operator.

- `load_benchmarks_file(path, name)`: every GPT2Benchmark of a file (`---` between them, or the items of a
  `kind: List`), as `run` and `validate` read it, or the one named; `load_benchmark_file(path)`: the one GPT2Benchmark of a file, as
  `render` reads it (how a file is read, and its limits: gpt2bench.specification.documents);
- `load_benchmark(document)`: a whole resource as `kubectl apply` sends it: apiVersion, kind, metadata
  (names, labels, annotations as the API server checks them), spec, and its size;
- `validate_spec(spec)`: the spec alone, as the operator gets it from the API server.

Each raises `SpecError` listing every problem as (field path as written, message). The models and their
rules are in gpt2bench.specification.model, which re-exports these names. Rules and where each is enforced:
docs/validation.md.
"""

from __future__ import annotations

import json
import re
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from gpt2bench.specification import documents, kubesyntax
from gpt2bench.specification.fielderrors import field_errors, field_path
from gpt2bench.specification.kubesyntax import shown
from gpt2bench.specification.model import API_GROUP, API_VERSION, KIND, Benchmark, GPT2BenchmarkSpec
from gpt2bench.specification.values import SpecModel

# A GPT2Benchmark without its status, as compact JSON. `kubectl apply` copies the object into an annotation
# and the operator keeps two more copies of its spec in annotations; the API server allows 256 KiB of
# annotations per object, so three copies of 64 KiB leave room for the user's own.
MAX_OBJECT_BYTES = 64 * 1024


class SpecError(ValueError):
    """A GPT2Benchmark that cannot run: `errors` is a list of (field path, message), `source` the file, and
    `documents` names, for each error, the document of a file of several it is in (or None)."""

    def __init__(self, errors: list[tuple[str, str]], source: str | None = None, document: str | None = None):
        self.errors = errors
        self.source = source
        self.documents: list[str | None] = [document] * len(errors)
        super().__init__("; ".join(self.lines()))

    @classmethod
    def joined(cls, failures: list[SpecError], source: str | None) -> SpecError:
        """The errors of several documents of one file, each still naming its document."""
        joined = cls([error for failure in failures for error in failure.errors], source)
        joined.documents = [document for failure in failures for document in failure.documents]
        joined.args = ("; ".join(joined.lines()),)
        return joined

    def lines(self) -> list[str]:
        """One line per error: `FILE: document 2 (name, line 9): field: message` (without the parts not known)."""
        return [": ".join(part for part in (self.source, document, path, message) if part)
                for (path, message), document in zip(self.errors, self.documents, strict=True)]


def _json_size(value: Any) -> int | None:
    """Bytes of `value` as compact JSON (as the API server stores it); None when it is no JSON data."""
    try:
        return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str).encode())
    except (ValueError, TypeError, RecursionError):
        return None


def _too_large(value: Any, what: str) -> str | None:
    size = _json_size(value)
    if size is None:
        return "is not JSON data (a cyclic or too deeply nested structure)"
    if size > MAX_OBJECT_BYTES:
        return (f"{what} takes {size} bytes as JSON, more than {MAX_OBJECT_BYTES}: kubectl apply and the operator "
                "keep copies of it in annotations, which the API server limits to 256 KiB; split the sweep into "
                "several GPT2Benchmarks")
    return None


def validate_spec(spec: Any) -> GPT2BenchmarkSpec:
    """Validate a resource's `spec` mapping; raise SpecError naming every bad field."""
    if not isinstance(spec, dict):
        raise SpecError([("spec", f"must be a mapping, got {shown(spec)}")])
    if problem := _too_large(spec, "the spec"):
        raise SpecError([("spec", problem)])
    placeholders = placeholder_errors(spec, ("spec",))
    try:
        validated = GPT2BenchmarkSpec.model_validate(spec, by_alias=True, by_name=False)
    except ValidationError as exc:
        raise SpecError(placeholders + field_errors(exc, ("spec",), _FIELD_NAMES)) from None
    if placeholders:
        raise SpecError(placeholders)
    return validated


# A value wholly in angle brackets is one of the docs' placeholders (docs/clusters.md: "Values in angle brackets
# are yours"), copied as it is: `NCCL_IB_TC: "<106>"` would reach NCCL, which reads it as 0 (a lossy class).
PLACEHOLDER = re.compile(r"\s*<[^<>]+>\s*")


def placeholder_errors(value: Any, loc: tuple[Any, ...]) -> list[tuple[str, str]]:
    """(field path, message) for every string of `value` that is a placeholder left as the docs write it."""
    if isinstance(value, dict):
        return [error for key, item in value.items() for error in placeholder_errors(item, (*loc, key))]
    if isinstance(value, list):
        return [error for index, item in enumerate(value) for error in placeholder_errors(item, (*loc, index))]
    if isinstance(value, str) and PLACEHOLDER.fullmatch(value):
        return [(field_path(loc), f"{value!r} is a placeholder (a value in angle brackets, as docs/clusters.md "
                                  "marks what is yours to fill in): put your cluster's own value there")]
    return []


def _field_names(model: type[BaseModel]) -> set[str]:
    """Every camelCase field name of the spec's models (for "did you mean" hints)."""
    names: set[str] = set()
    for info in model.model_fields.values():
        names.add(info.alias or "")
        for inner in typing.get_args(info.annotation) + (info.annotation,):
            for candidate in (inner, *typing.get_args(inner)):
                if isinstance(candidate, type) and issubclass(candidate, SpecModel) and candidate is not model:
                    names |= _field_names(candidate)
    return names


_FIELD_NAMES = _field_names(GPT2BenchmarkSpec)
_TOP_LEVEL = ("apiVersion", "kind", "metadata", "spec", "status")


def load_benchmark(document: Any) -> Benchmark:
    """Validate a full resource (apiVersion, kind, metadata, spec) as the API server and the operator would."""
    if not isinstance(document, dict):
        raise SpecError([("", f"a GPT2Benchmark must be a YAML mapping, got {shown(document)}")])
    if problem := _too_large({k: v for k, v in document.items() if k != "status"}, "the GPT2Benchmark"):
        raise SpecError([("", problem)])
    errors = [(field_path((key,)), "unknown field") for key in document if key not in _TOP_LEVEL]
    if document.get("apiVersion") != f"{API_GROUP}/{API_VERSION}":
        errors.append(("apiVersion", f"must be {API_GROUP}/{API_VERSION}, got {shown(document.get('apiVersion'))}"))
    if document.get("kind") != KIND:
        errors.append(("kind", f"must be {KIND}, got {shown(document.get('kind'))}"))
    metadata = document.get("metadata")
    errors += [(field_path(loc), problem) for loc, problem in kubesyntax.object_meta_errors(metadata)]
    metadata = metadata if isinstance(metadata, dict) else {}
    spec = None
    if document.get("spec") is None:
        errors.append(("spec", "is required"))
    else:
        try:
            spec = validate_spec(document["spec"])
        except SpecError as exc:
            errors += exc.errors
    if errors or spec is None:
        raise SpecError(errors)
    return Benchmark(name=metadata["name"], namespace=metadata.get("namespace") or "default",
                     uid=metadata.get("uid"), spec=spec)


EMPTY_FILE = "empty file: expected one GPT2Benchmark (apiVersion, kind, metadata, spec)"


def load_benchmarks_file(path: str, name: str | None = None) -> list[Benchmark]:
    """The GPT2Benchmarks of a YAML file, in order (`kubectl apply -f` takes every document, and every item
    of a `kind: List`; empty ones are skipped), or only the one whose metadata.name is `name`. Every document
    is validated; each error names its document when the file holds several, and its List item
    (`items[1].spec...`). Raises OSError (unreadable) or SpecError naming the file."""
    try:
        found = documents.read_documents(path)
    except documents.DocumentError as exc:
        raise SpecError([("", str(exc))], source=path) from None
    if not found:
        raise SpecError([("", EMPTY_FILE)], source=path)
    benchmarks: list[Benchmark] = []
    failures: list[SpecError] = []
    first_of: dict[tuple[str, str], str] = {}
    objects = 0
    for document in found:
        label = document_label(document, len(found))
        try:
            items = list_items(document.value)
        except SpecError as exc:
            failures.append(SpecError(exc.errors, document=label))
            continue
        for prefix, value in items:
            objects += 1
            try:
                benchmark = load_benchmark(value)
            except SpecError as exc:
                failures.append(SpecError([(_under(prefix, where), why) for where, why in exc.errors], document=label))
                continue
            key = (benchmark.namespace, benchmark.name)
            if key in first_of:
                failures.append(SpecError([(_under(prefix, "metadata.name"),
                                            f"{benchmark.name!r} is also the name of {first_of[key]}: "
                                            "kubectl apply would replace one with the other")], document=label))
            first_of.setdefault(key, ", ".join(filter(None, [label, prefix])))
            benchmarks.append(benchmark)
    if failures:
        raise SpecError.joined(failures, path)
    if not objects:
        raise SpecError([("", EMPTY_FILE)], source=path)
    if name is None:
        return benchmarks
    chosen = [benchmark for benchmark in benchmarks if benchmark.name == name]
    if not chosen:
        names = ", ".join(benchmark.name for benchmark in benchmarks)
        raise SpecError([("", f"--name {name}: no GPT2Benchmark of that name here (it holds {names})")], source=path)
    return chosen


def list_items(value: Any) -> list[tuple[str, Any]]:
    """(path, object) for each object a document holds, as kubectl reads a file: the document itself, or
    the items of a `kind: List` (apiVersion v1, what `kubectl get -o yaml` writes for several objects), each
    named by its path (`items[1]`). An empty List holds nothing. Raises SpecError when `items` is not a
    list, or holds a List (kubectl refuses it: "is not a list")."""
    if not _is_list(value):
        return [("", value)]
    items = value.get("items")
    if items is None:
        return []
    if not isinstance(items, list):
        raise SpecError([("items", f"must be a list of objects, got {shown(items)}")])
    nested = [(f"items[{i}]", "a List inside a List: kubectl does not take it; list the objects in the outer "
                              "List's items") for i, item in enumerate(items) if _is_list(item)]
    if nested:
        raise SpecError(nested)
    return [(f"items[{i}]", item) for i, item in enumerate(items)]


def _is_list(value: Any) -> bool:
    return isinstance(value, dict) and value.get("kind") == "List" and value.get("apiVersion") == "v1"


def _under(prefix: str, path: str) -> str:
    """`path` inside the List item at `prefix`: `items[1].spec.sweep`."""
    return ".".join(filter(None, [prefix, path]))


def load_benchmark_file(path: str, name: str | None = None) -> Benchmark:
    """The one GPT2Benchmark of a YAML file (or the one named `name` among several). Raises OSError
    (unreadable) or SpecError naming the file, and naming the benchmarks when it holds several."""
    benchmarks = load_benchmarks_file(path, name)
    if len(benchmarks) > 1:
        names = ", ".join(benchmark.name for benchmark in benchmarks)
        raise SpecError([("", f"holds {len(benchmarks)} GPT2Benchmarks ({names}): pick one with --name NAME")],
                        source=path)
    return benchmarks[0]


def document_label(document: documents.Document, count: int) -> str | None:
    """How an error names a document of a file of several: `document 2 (cpu-b, line 14)`; None for one."""
    if count == 1:
        return None
    metadata = document.value.get("metadata") if isinstance(document.value, dict) else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    named = f"{name}, " if isinstance(name, str) and name else ""
    return f"document {document.number} ({named}line {document.line})"
