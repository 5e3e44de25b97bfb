"""The sweep's size is bounded (MAX_RUNS per GPT2Benchmark), and the largest allowed sweep fits the API server.

The status holds one entry per run, and etcd keeps the whole object (spec, the copies kubectl and the
operator keep in annotations, status) in at most 1.5 MiB: the largest allowed sweep, every run at its
largest status entry, must leave a wide margin.
"""

from __future__ import annotations

import json

import pytest
from kubeflow_crds import validate_job

from gpt2bench.collect import MAX_REASON
from gpt2bench.controller.sweepstatus import initial_status
from gpt2bench.plan import plan_runs
from gpt2bench.render import render_all
from gpt2bench.specification.kubesyntax import ANNOTATIONS_MAX_BYTES
from gpt2bench.specification.model import MAX_RUNS
from gpt2bench.specification.validation import MAX_OBJECT_BYTES, SpecError, load_benchmark
from gpt2bench.status import BenchmarkStatus, BestRun, RunResults, RunStatus

ETCD_MAX_OBJECT_BYTES = 1536 * 1024  # etcd's default --max-request-bytes
NAME = "b" * 253  # the longest name a GPT2Benchmark may have


def json_size(value) -> int:
    return len(json.dumps(value, separators=(",", ":")).encode())


def largest_sweep(scales: int = MAX_RUNS, precisions: tuple[str, ...] = ("fp32",), **sweep) -> dict:
    """ddp at `scales` node counts (distinct runs), the spec (with `sweep`'s other fields) padded to the object
    size limit."""
    document = {"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark",
                "metadata": {"name": NAME, "namespace": "default", "labels": {"team": "perf"}},
                "spec": {"sweep": {"strategies": [{"name": "ddp"}], "precisions": list(precisions),
                                   "scales": [{"nodes": n} for n in range(1, scales + 1)], **sweep},
                         "metrics": {"podAnnotations": {"note": ""}}}}
    room = MAX_OBJECT_BYTES - json_size(document) - 16
    document["spec"]["metrics"]["podAnnotations"]["note"] = "x" * room
    return document


def worst_status(runs) -> dict:
    """Every run at its largest entry: failed with the longest reason, and every figure set."""
    status = initial_status(runs, 1, "2026-11-22T00:00:00Z")
    results = RunResults(world_size=2**20, tokens_per_second=1.2345678901234567e9, tokens_per_second_per_device=1e9,
                         step_time_p50_seconds=0.123456789, step_time_p95_seconds=0.123456789,
                         peak_memory_bytes=2**45, train_seconds=12345.6789, startup_seconds=123.456789,
                         final_loss=10.123456789, grad_norm=1.23456789, mfu=0.123456789,
                         device_name="NVIDIA H100 80GB HBM3 " + "x" * 40)
    entries = [RunStatus(**{**entry.model_dump(), "phase": "Failed", "reason": "r" * MAX_REASON,
                            "start_time": "2026-11-22T00:00:00Z", "completion_time": "2026-11-22T01:00:00Z",
                            "results": results}) for entry in status.runs]
    best = BestRun(run=runs[0].name, strategy="ddp", precision="fp32", tokens_per_second=1e9)
    running = ", ".join(run.name for run in runs[:64])  # concurrency <= 64 runs named in the message
    return BenchmarkStatus(**{**status.model_dump(), "runs": entries, "best": best,
                              "message": f"0/{len(runs)} runs done; running {running}"}).dump()


def test_the_largest_allowed_sweep_plans_renders_and_fits_etcd():
    document = largest_sweep()
    benchmark = load_benchmark(document)
    runs = plan_runs(benchmark)
    assert len(runs) == MAX_RUNS
    jobs = render_all(benchmark)
    assert len({job["metadata"]["name"] for job in jobs}) == MAX_RUNS
    for job in jobs[:3] + jobs[-3:]:
        validate_job(job)

    spec = json.dumps(document["spec"], separators=(",", ":"))
    annotations = {
        "kubectl.kubernetes.io/last-applied-configuration": json.dumps(document, separators=(",", ":")),
        # kopf's diff base: spec, labels and annotations (without kubectl's copy), and the pinned sweep spec
        "gpt2bench.io/last-handled-configuration": json.dumps(
            {"spec": document["spec"], "metadata": {"labels": document["metadata"]["labels"]}},
            separators=(",", ":")),
        "gpt2bench.io/sweep-spec": spec,
    }
    assert sum(len(k) + len(v) for k, v in annotations.items()) < ANNOTATIONS_MAX_BYTES
    stored = {**document, "metadata": {**document["metadata"], "annotations": annotations,
                                       "finalizers": ["gpt2bench.io/finalizer"], "uid": "u" * 36,
                                       "resourceVersion": "123456789", "generation": 1,
                                       "creationTimestamp": "2026-11-22T00:00:00Z"},
              "status": worst_status(runs)}
    size = json_size(stored)
    assert size < ETCD_MAX_OBJECT_BYTES * 2 / 3, f"{size} bytes: too close to etcd's {ETCD_MAX_OBJECT_BYTES}"


def test_one_run_more_is_refused_with_how_to_split():
    document = largest_sweep(MAX_RUNS // 2 + 1, ("fp32", "bf16"))  # 2 x 129 runs as written
    with pytest.raises(SpecError) as refused:
        load_benchmark(document)
    ((path, message),) = [e for e in refused.value.errors if e[0] == "spec.sweep"]
    assert f"= {MAX_RUNS + 2} runs, more than {MAX_RUNS} per GPT2Benchmark" in message
    assert "split the sweep into several GPT2Benchmarks" in message


def test_a_sweep_of_1000_scales_is_refused_before_anything_is_planned():
    document = largest_sweep(1000)
    document["spec"]["metrics"] = {}
    with pytest.raises(SpecError) as refused:
        load_benchmark(document)
    assert "spec.sweep.scales" in [path for path, _ in refused.value.errors]


def test_repeats_and_the_breakdown_round_count_towards_the_bound():
    document = largest_sweep(MAX_RUNS // 5 + 1, repeats=4)  # 52 scales x (4 repeats + the breakdown round) = 260
    with pytest.raises(SpecError) as refused:
        load_benchmark(document)
    ((path, message),) = [e for e in refused.value.errors if e[0] == "spec.sweep"]
    assert f"x 4 repeats (+1 breakdown round) = {5 * (MAX_RUNS // 5 + 1)} runs" in message
    document["spec"]["sweep"]["scales"] = document["spec"]["sweep"]["scales"][:MAX_RUNS // 5]
    assert len(plan_runs(load_benchmark(document))) == 5 * (MAX_RUNS // 5)
    document = largest_sweep(MAX_RUNS // 4, repeats=4, breakdown="inline")  # no breakdown round: 64 x 4 = 256
    assert len(plan_runs(load_benchmark(document))) == MAX_RUNS
