"""The spec model: malformed GPT2Benchmarks are rejected, and every error names its field."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from gpt2bench.specification.model import STRATEGIES
from gpt2bench.specification.validation import SpecError, load_benchmark, load_benchmark_file, validate_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "manifests" / "examples"


def base_spec() -> dict:
    return {"sweep": {"strategies": [{"name": "ddp"}], "precisions": ["fp32"], "scales": [{"nodes": 1}]}}


def spec_with(**changes) -> dict:
    """base_spec() with dotted paths set (`training__steps=0` sets spec.training.steps)."""
    spec = base_spec()
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = spec
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return spec


def sweep(strategies=None, precisions=None, scales=None) -> dict:
    spec = base_spec()
    if strategies is not None:
        spec["sweep"]["strategies"] = strategies
    if precisions is not None:
        spec["sweep"]["precisions"] = precisions
    if scales is not None:
        spec["sweep"]["scales"] = scales
    return spec


# (id, spec, expected field path named in the error)
MALFORMED = [
    ("no-sweep", {"model": {"preset": "tiny"}}, "spec.sweep"),
    ("no-strategies", {"sweep": {"precisions": ["fp32"]}}, "spec.sweep.strategies"),
    ("empty-strategies", sweep(strategies=[]), "spec.sweep.strategies"),
    ("unknown-strategy", sweep(strategies=[{"name": "zero3"}]), "spec.sweep.strategies[0].name"),
    ("strategy-without-name", sweep(strategies=[{"bucketCapMb": 25}]), "spec.sweep.strategies[0].name"),
    ("unknown-precision", sweep(precisions=["fp8"]), "spec.sweep.precisions[0]"),
    ("duplicate-precision", sweep(precisions=["fp32", "bf16", "fp32"]), "spec.sweep.precisions[2]"),
    ("zero-nodes", sweep(scales=[{"nodes": 0}]), "spec.sweep.scales[0].nodes"),
    ("negative-devices", sweep(scales=[{"devicesPerNode": -1}]), "spec.sweep.scales[0].devicesPerNode"),
    ("nodes-not-int", sweep(scales=[{"nodes": "two"}]), "spec.sweep.scales[0].nodes"),
    ("unknown-scale-field", sweep(scales=[{"gpus": 4}]), "spec.sweep.scales[0].gpus"),
    (
        "processes-differ-from-gpus",
        sweep(scales=[{"devicesPerNode": 4, "processesPerNode": 2}]),
        "spec.sweep.scales[0].processesPerNode",
    ),
    ("unknown-top-level-field", spec_with(replicas=3), "spec.replicas"),
    ("zero-steps", spec_with(training__steps=0), "spec.training.steps"),
    ("warmup-not-below-steps", spec_with(training__steps=10, training__warmupSteps=10), "spec.training.warmupSteps"),
    ("seq-len-too-short", spec_with(training__seqLen=4), "spec.training.seqLen"),
    ("lr-zero", spec_with(training__lr=0), "spec.training.lr"),
    ("lr-not-number", spec_with(training__lr="fast"), "spec.training.lr"),
    ("unknown-preset", spec_with(model__preset="gpt3"), "spec.model.preset"),
    ("custom-without-sizes", spec_with(model__preset="custom", model__nHead=4, model__nEmbd=64), "spec.model.nLayer"),
    ("embd-not-divisible", spec_with(model__nEmbd=100, model__nHead=3), "spec.model.nEmbd"),
    ("empty-data-source", spec_with(data__source=""), "spec.data.source"),
    ("metrics-port-privileged", spec_with(metrics__port=80), "spec.metrics.port"),
    ("pull-policy", spec_with(imagePullPolicy="Sometimes"), "spec.imagePullPolicy"),
    ("concurrency-zero", spec_with(concurrency=0), "spec.concurrency"),
    ("backoff-negative", spec_with(runPolicy__backoffLimit=-1), "spec.runPolicy.backoffLimit"),
    ("toleration-effect", spec_with(tolerations=[{"key": "a", "effect": "Sometimes"}]), "spec.tolerations[0].effect"),
    ("node-selector-not-string", spec_with(nodeSelector={"zone": ["a"]}), "spec.nodeSelector.zone"),
    ("resource-quantity-list", spec_with(resources={"requests": {"cpu": [1]}}), "spec.resources.requests.cpu"),
    ("pod-labels-not-string", spec_with(metrics__podLabels={"team": 1}), "spec.metrics.podLabels.team"),
    # options that belong to another strategy
    (
        "ddp-option-on-fsdp",
        sweep(strategies=[{"name": "fsdp", "bucketCapMb": 25}]),
        "spec.sweep.strategies[0].bucketCapMb",
    ),
    ("ps-option-on-ddp", sweep(strategies=[{"name": "ddp", "psServers": 2}]), "spec.sweep.strategies[0].psServers"),
    ("ps-mode-unknown", sweep(strategies=[{"name": "ps", "psMode": "lazy"}]), "spec.sweep.strategies[0].psMode"),
    ("bucket-cap-zero", sweep(strategies=[{"name": "ddp", "bucketCapMb": 0}]), "spec.sweep.strategies[0].bucketCapMb"),
    # cross-field rules
    (
        "ps-sharded-one-server",
        sweep(strategies=[{"name": "ps-sharded", "psServers": 1}]),
        "spec.sweep.strategies[0].psServers",
    ),
    (
        "dataparallel-on-two-nodes",
        sweep(strategies=[{"name": "ddp"}, {"name": "dataparallel"}], scales=[{"nodes": 1}, {"nodes": 2}]),
        "spec.sweep.scales[1].nodes",
    ),
    (
        "ps-servers-not-spread-evenly",
        sweep(strategies=[{"name": "ps", "psServers": 3}], scales=[{"nodes": 2}]),
        "spec.sweep.strategies[0].psServers",
    ),
    ("strategy-listed-twice", sweep(strategies=[{"name": "ddp"}, {"name": "ddp"}]), "spec.sweep.strategies[1].name"),
    ("seq-len-beyond-positions", spec_with(model__nPositions=64, training__seqLen=128), "spec.training.seqLen"),
]


@pytest.mark.parametrize("spec, path", [pytest.param(s, p, id=i) for i, s, p in MALFORMED])
def test_malformed_spec_is_rejected_naming_the_field(spec, path):
    with pytest.raises(SpecError) as caught:
        validate_spec(spec)
    paths = [p for p, _ in caught.value.errors]
    assert path in paths, f"expected an error at {path}, got {caught.value.errors}"
    assert path in str(caught.value)
    assert all(message for _, message in caught.value.errors)


@pytest.mark.parametrize("spec, path", [case[1:] for case in MALFORMED], ids=[case[0] for case in MALFORMED])
def test_each_case_breaks_only_the_field_it_names(spec, path):
    validate_spec(base_spec())  # the base is valid, so each case fails for its own change ...
    with pytest.raises(SpecError) as caught:
        validate_spec(spec)
    assert {p for p, _ in caught.value.errors} == {path}  # ... and for nothing else


@pytest.mark.parametrize(
    "document, path",
    [
        ({"kind": "GPT2Benchmark", "metadata": {"name": "a"}, "spec": base_spec()}, "apiVersion"),
        (
            {
                "apiVersion": "gpt2bench.io/v1alpha1",
                "kind": "PyTorchJob",
                "metadata": {"name": "a"},
                "spec": base_spec(),
            },
            "kind",
        ),
        ({"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark", "spec": base_spec()}, "metadata.name"),
        (
            {
                "apiVersion": "gpt2bench.io/v1alpha1",
                "kind": "GPT2Benchmark",
                "metadata": {"name": "My Bench"},
                "spec": base_spec(),
            },
            "metadata.name",
        ),
        ({"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark", "metadata": {"name": "a"}}, "spec"),
        (
            {"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark", "metadata": {"name": "a"}, "spec": [1]},
            "spec",
        ),
        (
            {"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark", "metadata": "a", "spec": base_spec()},
            "metadata",
        ),
    ],
)
def test_malformed_resource_is_rejected_naming_the_field(document, path):
    with pytest.raises(SpecError) as caught:
        load_benchmark(document)
    assert path in [p for p, _ in caught.value.errors], caught.value.errors


def test_several_errors_are_all_reported():
    spec = spec_with(training__steps=0, concurrency=0, model__preset="gpt3")
    with pytest.raises(SpecError) as caught:
        validate_spec(spec)
    paths = {p for p, _ in caught.value.errors}
    assert {"spec.training.steps", "spec.concurrency", "spec.model.preset"} <= paths


def test_defaults_fill_a_minimal_spec():
    spec = validate_spec(base_spec())
    assert spec.training.steps == 50 and spec.training.warmup_steps == 5
    assert spec.model.preset == "tiny" and spec.data.source == "sotu"
    assert spec.metrics.port == 9400 and spec.concurrency == 1
    assert spec.sweep.scales[0].procs_per_node == 1


def test_ps_servers_default_per_strategy():
    spec = validate_spec(sweep(strategies=[{"name": "ps"}, {"name": "ps-sharded"}, {"name": "ddp"}]))
    assert [s.servers for s in spec.sweep.strategies] == [1, 2, 0]


@pytest.mark.parametrize("name", ["cpu-sweep.yaml", "gpu-papers.yaml"])
def test_examples_load(name):
    benchmark = load_benchmark_file(str(EXAMPLES / name))
    assert benchmark.name == name.removesuffix(".yaml")


def test_cpu_example_covers_the_strategies_distinct_on_cpu_in_fp32_and_bf16_repeated():
    """The five strategies that differ on CPU x 2 precisions, 3 rounds and a race keep the default within minutes
    on 2 cores; ps-sharded is in the GPU example and dataparallel (on CPU a twin of single that no race can
    separate) in the one-node GPU example, so together they cover every strategy."""
    benchmark = load_benchmark_file(str(EXAMPLES / "cpu-sweep.yaml"))
    spec = benchmark.spec
    assert "cpu" in benchmark.name
    assert {s.name for s in spec.sweep.strategies} == {"single", "ddp", "fsdp", "horovod", "ps"}
    gpus = [load_benchmark_file(str(EXAMPLES / name)).spec for name in ("gpu-papers.yaml", "gpu-one-node.yaml")]
    covered = {s.name for example in (spec, *gpus) for s in example.sweep.strategies}
    assert covered == set(STRATEGIES)
    assert all(e.sweep.repeats >= 3 for e in (spec, *gpus))  # a comparison needs 3 rounds to know its noise
    assert spec.sweep.precisions == ["fp32", "bf16"]
    assert all(scale.devices_per_node == 0 for scale in spec.sweep.scales)
    assert spec.model.preset == "tiny" and spec.training.steps <= 20


def test_gpu_example_is_the_papers_setting():
    spec = load_benchmark_file(str(EXAMPLES / "gpu-papers.yaml")).spec
    assert spec.model.preset == "gpt2" and spec.training.seq_len == 1024
    assert [(s.nodes, s.devices_per_node) for s in spec.sweep.scales] == [(1, 4), (2, 4)]
    assert spec.sweep.precisions == ["fp32", "fp16", "bf16"]


def test_bad_yaml_file_names_the_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("spec: [unclosed\n")
    with pytest.raises(SpecError, match=r"bad.yaml: not valid YAML: line 2, column 1: "):
        load_benchmark_file(str(path))


def test_validate_does_not_mutate_its_input():
    spec = sweep(strategies=[{"name": "ps"}])
    before = copy.deepcopy(spec)
    validate_spec(spec)
    assert spec == before
    assert yaml.safe_dump(spec) == yaml.safe_dump(before)


@pytest.mark.parametrize("name", ["cpu-sweep.yaml", "gpu-papers.yaml"])
def test_a_spec_as_results_json_holds_it_validates_again(name):
    """results.json keeps the spec dumped by alias: it validates back to the same spec, and a changed one is
    refused naming its field."""
    spec = load_benchmark_file(str(EXAMPLES / name)).spec
    dumped = spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert validate_spec(dumped) == spec
    with pytest.raises(SpecError, match=r"spec\.training\.steps: Input should be a valid integer, got true"):
        validate_spec({**dumped, "training": {"steps": True}})


def test_python_builds_models_by_field_name_documents_use_camel_case():
    from gpt2bench.specification.model import ScaleSpec, TrainingSpec

    assert TrainingSpec(micro_batch_size=8).micro_batch_size == 8
    assert ScaleSpec(devices_per_node=2).procs_per_node == 2
    with pytest.raises(SpecError, match="unknown field; did you mean microBatchSize"):
        validate_spec(spec_with(training__micro_batch_size=8))


@pytest.mark.parametrize("value, shown", [(True, "true"), ("5", '"5"'), (float("inf"), ".inf"), (None, None)])
def test_json_types_are_not_coerced_and_null_means_absent(value, shown):
    if shown is None:
        assert validate_spec(spec_with(training__steps=value)).training.steps == 50  # the default, as the API server
        return
    with pytest.raises(SpecError) as caught:
        validate_spec(spec_with(training__steps=value))
    assert caught.value.errors[0][0] == "spec.training.steps" and f"got {shown}" in caught.value.errors[0][1]
    assert validate_spec(spec_with(training__steps=8.0)).training.steps == 8  # JSON's 8.0 is the integer 8
