"""Kubernetes syntax rules (gpt2bench.specification.kubesyntax) against cases from apimachinery's own tests and the upstream
Kubeflow CRD's resource.Quantity pattern."""

from __future__ import annotations

import functools
import re
from decimal import Decimal

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from kubeflow_crds import crd_dir

from gpt2bench.specification import kubesyntax as k


@functools.cache
def upstream_quantity_pattern() -> str:
    """The pattern controller-gen wrote for resource.Quantity into the PyTorchJob CRD."""
    document = yaml.safe_load((crd_dir() / "kubeflow.org_pytorchjobs.yaml").read_text())
    container = document["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "pytorchReplicaSpecs"]["additionalProperties"]["properties"]["template"]["properties"]["spec"][
        "properties"]["containers"]["items"]
    return container["properties"]["resources"]["properties"]["limits"]["additionalProperties"]["pattern"]


@pytest.mark.parametrize("value, number", [
    (4, Decimal(4)), ("4", Decimal(4)), ("500m", Decimal("0.5")), ("1Ki", Decimal(1024)), ("16Gi", Decimal(16 * 2**30)),
    ("1.5e3", Decimal(1500)), ("1E3", Decimal(1000)), (".5", Decimal("0.5")), ("5.", Decimal(5)), ("+1", Decimal(1)),
    ("100n", Decimal("1E-7")), ("2M", Decimal(2_000_000)), ("0", Decimal(0)),
])
def test_quantities_parse_to_their_value(value, number):
    assert k.quantity_problem(value) is None
    assert k.quantity_value(value) == number


@pytest.mark.parametrize("value, said", [pytest.param(v, s, id=str(v)[:12]) for v, s in [
    ("lots", "is not a non-negative quantity"), ("1ki", "is not"), ("1 Gi", "is not"), ("NaN", "is not"),
    ("1_000", "is not"), ("1\n", "is not"), ("1e", "is not"), ("1Gi5", "is not"), ("", "is not"), ("-1", "must not be negative"),
    (-1, "must not be negative"), ("-500m", "must not be negative"), (True, "must be a quantity"),
    (0.5, "must be a quantity"), ([1], "must be a quantity"), ("9" * 1_000_000 + "Ei", "is too large"),
]])
def test_what_is_not_a_quantity(value, said):
    assert said in (k.quantity_problem(value) or ""), k.quantity_problem(value)


@settings(max_examples=300, deadline=None)  # the first example reads the upstream CRD
@given(st.from_regex(r"^[+\-]?[0-9.]{0,4}([eE][+\-]?[0-9.]{0,3}|[KMGTPE]i|[numkMGTPEi]{0,2})?$", fullmatch=True))
def test_the_grammar_is_upstreams_without_the_minus_sign(text):
    upstream = re.fullmatch(upstream_quantity_pattern().strip("^$"), text) is not None
    ours = re.fullmatch(k.QUANTITY_PATTERN.strip("^$"), text) is not None
    assert ours == (upstream and not text.startswith("-")), text


@pytest.mark.parametrize("key, ok", [
    ("app", True), ("app.kubernetes.io/name", True), ("a/b", True), ("A_b.c-D", True), ("x" * 63, True),
    ("x" * 64, False), ("a" * 253 + "/b", True), ("a" * 254 + "/b", False), ("/a", False), ("a/", False),
    ("a/b/c", False), ("-a", False), ("a-", False), ("a b", False), ("Upper.Case/x", False), ("", False),
    ("a\n", False), ("a.b\n/c", False),
])
def test_qualified_names_as_apimachinery_checks_them(key, ok):
    assert (k.qualified_name_problem(key) is None) == ok


@pytest.mark.parametrize("value, ok", [
    ("", True), ("a", True), ("a-b_c.d", True), ("x" * 63, True), ("x" * 64, False), ("-a", False),
    ("a b", False), ("a/b", False), ("a\n", False),
])
def test_label_values(value, ok):
    assert (k.label_value_problem(value) is None) == ok


@pytest.mark.parametrize("name, ok", [
    ("cpu", True), ("memory", True), ("ephemeral-storage", True), ("hugepages-2Mi", True), ("nvidia.com/gpu", True),
    ("gpu", False), ("hugepages-lots", False), ("CPU", False), ("nvidia.com/", False),
])
def test_container_resource_names(name, ok):
    assert (k.resource_name_problem(name) is None) == ok


def test_extended_resources_are_domain_prefixed_outside_kubernetes_io():
    assert k.is_extended_resource("nvidia.com/gpu") and not k.is_extended_resource("cpu")
    assert not k.is_extended_resource("kubernetes.io/batch") and not k.is_extended_resource("x.kubernetes.io/y")


def test_annotations_are_limited_to_256_kib_in_all():
    assert list(k.annotation_errors({"a": "x" * (256 * 1024 - 1)}, ("metadata", "annotations"))) == []
    ((loc, problem),) = k.annotation_errors({"a": "x" * (256 * 1024)}, ("metadata", "annotations"))
    assert loc == ("metadata", "annotations") and "262145 bytes" in problem
    assert [loc for loc, _ in k.annotation_errors({"Upper/Case": "ok"}, ("m",))] == []  # keys are lower-cased first


def test_object_metadata_as_the_api_server_checks_it():
    errors = dict(k.object_meta_errors({"name": "ok", "namespace": "Team_A", "labels": {"a": 1}, "uid": 5,
                                        "nmae": "x"}))
    assert set(errors) == {("metadata", "namespace"), ("metadata", "labels", "a"), ("metadata", "uid"),
                           ("metadata", "nmae")}
    assert errors[("metadata", "labels", "a")] == "must be a string, got 1"
    assert dict(k.object_meta_errors({"name": 2024})) == {("metadata", "name"): "must be a string, got 2024"}
    assert dict(k.object_meta_errors(None)) == {("metadata", "name"): "is required"}
    assert ("metadata", "name") in dict(k.object_meta_errors({"name": "sweep\n"}))  # the API server's `$` ends the text
