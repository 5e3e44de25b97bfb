"""Random documents and random bytes against the validation: nothing but SpecError/DocumentError comes out,
every message is one line, nothing is slow; and what the local validation accepts, the CRD accepts too.

Three generators: arbitrary JSON-like values (any shape, any scalar: huge integers, NaN, booleans where
numbers belong), structure-aware specs (the models' own field names, values that are often valid, so the
cross-field rules and CEL rules are reached), and bytes / YAML-ish text for the file loader.
"""

from __future__ import annotations

import datetime
import os
import types
import typing

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from kube.semantics import ApiError, validate_custom_resource
from kubeflow_crds import validate_job
from pydantic import BaseModel

from gpt2bench.plan import plan_runs
from gpt2bench.render import render_job
from gpt2bench.specification import crd, documents
from gpt2bench.specification.model import GPT2BenchmarkSpec
from gpt2bench.specification.validation import SpecError, load_benchmark, validate_spec
from gpt2bench.specification.values import SpecModel

pytestmark = pytest.mark.timeout(300)  # a hang fails the test; `deadline` fails a slow example
# The same examples on every run, so that CI is reproducible; GPT2BENCH_FUZZ_EXAMPLES=5000 searches afresh
# (random seeds, more examples) and what it finds becomes an @example here.
_SEARCH = int(os.environ.get("GPT2BENCH_FUZZ_EXAMPLES", "0"))
FUZZ = settings(max_examples=_SEARCH or 150, derandomize=not _SEARCH, deadline=datetime.timedelta(seconds=3),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
VERSION = crd.build_crd()["spec"]["versions"][0]


def field_names(model: type[BaseModel]) -> set[str]:
    names = set()
    for name, info in model.model_fields.items():
        names |= {name, info.alias or name}
        for arg in (info.annotation, *typing.get_args(info.annotation)):
            for inner in (arg, *typing.get_args(arg)):
                if isinstance(inner, type) and issubclass(inner, SpecModel):
                    names |= field_names(inner)
    return names


KEYS = sorted(field_names(GPT2BenchmarkSpec)) + ["apiVersion", "kind", "metadata", "spec", "labels", "annotations"]
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["ddp", "ps", "fp32", "bf16", "tiny", "custom", "500m", "1Gi", "-1", "Exists", "NoExecute",
                     "nvidia.com/gpu", "a/b", "", " ", "x" * 70]),
)
KEY = st.one_of(st.sampled_from(KEYS), st.text(max_size=10), st.integers(-3, 3))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEY, inner, max_size=5),
                      max_leaves=25)


def one_line(error: SpecError) -> None:
    assert error.errors, "a SpecError lists at least one problem"
    for path, message in error.errors:
        assert isinstance(path, str) and isinstance(message, str) and message
    for line in error.lines():
        assert "\n" not in line and "\r" not in line, line


@FUZZ
@given(VALUES)
def test_any_value_as_a_spec_is_valid_or_a_spec_error(value):
    try:
        validate_spec(value)
    except SpecError as error:
        one_line(error)


@FUZZ
@given(st.dictionaries(KEY, VALUES, max_size=6), VALUES, VALUES)
@example(extra={"0\n": None}, metadata=None, spec=None)  # a key ending in a newline once printed two lines
@example(extra={}, metadata={"name": "sweep\n"}, spec=None)
def test_any_document_is_a_benchmark_or_a_spec_error(extra, metadata, spec):
    document = {**extra, "apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark", "metadata": metadata,
                "spec": spec}
    try:
        load_benchmark(document)
    except SpecError as error:
        one_line(error)


# ---------------------------------------------------------------- structure-aware specs
def plausible(annotation, noise: st.SearchStrategy) -> st.SearchStrategy:
    """Values a field of this type often takes, mostly valid; `noise` stands in at times at every level."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return plausible(args[0], noise)
    if origin in (typing.Union, types.UnionType):
        return st.one_of([plausible(arg, noise) for arg in args if arg is not type(None)])
    if origin is typing.Literal:
        return st.sampled_from(args)
    if isinstance(annotation, type) and issubclass(annotation, SpecModel):
        return model_dict(annotation, noise)
    if origin is list:
        return st.lists(plausible(args[0], noise), min_size=1, max_size=3)
    if origin is dict:
        return st.dictionaries(st.sampled_from(["cpu", "memory", "zone", "nvidia.com/gpu", "example.com/x", "a b"]),
                               st.one_of(st.sampled_from(["1", "2", "2Gi", "500m", "a"]), st.integers(0, 4)),
                               max_size=2)
    if annotation is bool:
        return st.booleans()
    if annotation is int:  # mostly small, at times a bound's edge
        return st.one_of(*[st.integers(1, 4)] * 3, st.sampled_from([0, 8, 64, 1024, 9400, 65535, 2**32]))
    if annotation is float:
        return st.one_of(*[st.floats(1e-3, 1.0)] * 3, st.just(0.0))
    if annotation is str:
        return st.sampled_from(["sotu", "img:1", "q", "gpu", "high"])
    return noise


def model_dict(model: type[BaseModel], noise: st.SearchStrategy) -> st.SearchStrategy:
    """A mapping of the model's own (camelCase) fields: required ones always there, the others at times."""
    fields = {info.alias or name: (info.is_required(), st.one_of(*[plausible(info.annotation, noise)] * 3, noise))
              for name, info in model.model_fields.items()}
    return st.fixed_dictionaries({k: v for k, (required, v) in fields.items() if required},
                                 optional={k: v for k, (required, v) in fields.items() if not required})


# Mostly valid specs (the agreement below needs accepted ones) and noisy ones (the rules' edges).
SPECS = st.one_of(model_dict(GPT2BenchmarkSpec, st.nothing()), model_dict(GPT2BenchmarkSpec, SCALARS))


@FUZZ
@given(SPECS)
def test_what_the_local_validation_accepts_the_crd_and_the_kubeflow_crds_accept(spec):
    document = {"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark", "metadata": {"name": "fuzz"},
                "spec": spec}
    try:
        benchmark = load_benchmark(document)
    except SpecError as error:
        one_line(error)
        return
    try:
        validate_custom_resource(document, VERSION, strict=True)
    except ApiError as refused:
        pytest.fail(f"accepted locally, refused by the CRD: {refused.message}")
    for run in plan_runs(benchmark)[:2]:  # and the jobs it becomes pass the upstream Kubeflow CRDs
        validate_job(render_job(benchmark, run))


# ---------------------------------------------------------------- the file loader
YAMLISH = st.lists(st.sampled_from(["a", ":", " ", "\n", "- ", "[", "]", "{", "}", ",", "&x ", "*x", "&y ", "*y",
                                    "!!str ", "!!int ", "!!python/name:os.system ", "<<: ", "'", '"', "#", "---\n",
                                    "? ", "\t", "1", "-1", "1e3", ".nan", "~", "\ufeff", "\x00", "é", "  "]),
                   max_size=60).map("".join)


@FUZZ
@given(st.one_of(st.binary(max_size=400), YAMLISH.map(str.encode)))
def test_any_bytes_are_a_document_or_a_document_error(data):
    try:
        value = documents.parse_document(data)
    except documents.DocumentError as error:
        assert "\n" not in str(error) and str(error)
        return
    try:
        load_benchmark(value)
    except SpecError as error:
        one_line(error)
