"""The status of the largest sweep fits etcd's object limit (1.5 MiB), with room to spare for metadata.

STATUS_RUNS_BUDGET (gpt2bench.status) is the sweep size the status is sized for; the spec's bound on runs
per benchmark (MAX_RUNS) must not exceed it. Two checks: every entry at its largest at the budget (pure),
and the largest sweep the spec allows run by the real operator against the emulator, every run failing at
once (no Kubeflow CRDs there).
"""

from __future__ import annotations

import json
import time

import pytest
from kube import EmulatedCluster
from kube.fixtures import CRD, Benchmarks, api_client, kopf_operator, wait_for

from gpt2bench import collect
from gpt2bench.controller import decide, sweepstatus
from gpt2bench.plan import plan_runs
from gpt2bench.specification import model as spec
from gpt2bench.specification.model import Benchmark
from gpt2bench.specification.validation import validate_spec
from gpt2bench.status import STATUS_BYTES_BUDGET, STATUS_RUNS_BUDGET, BenchmarkStatus, RunResults

pytestmark = pytest.mark.timeout(300)
NOW = "2026-11-22T00:00:00Z"
STRATEGIES = ("ddp", "fsdp", "horovod")


def largest_sweep(runs: int) -> dict:
    """Nearly `runs` distinct runs: 3 strategies x 3 precisions per scale, one scale per node count."""
    per_scale = len(STRATEGIES) * 3
    scales = [{"nodes": n, "processesPerNode": 1} for n in range(1, runs // per_scale + 1)]
    return {"sweep": {"strategies": [{"name": s} for s in STRATEGIES], "precisions": ["fp32", "fp16", "bf16"],
                      "scales": scales}}


def compact_size(status: BenchmarkStatus) -> int:
    return len(json.dumps(status.dump(), separators=(",", ":")))  # as the API server stores it


def test_the_spec_bound_on_runs_is_within_the_status_budget():
    bound = getattr(spec, "MAX_RUNS", None)  # the spec's bound on runs per benchmark, where it has one
    assert bound is None or bound <= STATUS_RUNS_BUDGET


def test_every_entry_at_its_largest_still_fits_the_budget(monkeypatch):
    # the status is sized for more runs than the spec allows: lift the spec's bound to plan that many
    monkeypatch.setattr(spec, "MAX_RUNS", STATUS_RUNS_BUDGET)
    runs = plan_runs(Benchmark(name="b" * 253, spec=validate_spec(largest_sweep(STATUS_RUNS_BUDGET))))
    assert STATUS_RUNS_BUDGET - 12 < len(runs) <= STATUS_RUNS_BUDGET
    start = sweepstatus.initial_status(runs, 1, NOW)
    failed = [decide.failed_entry(r, e, "x" * 10_000, NOW) for r, e in zip(runs, start.runs, strict=True)]
    figures = RunResults(world_size=1024, tokens_per_second=123456789.123456789, tokens_per_second_per_device=1.0 / 3,
                         step_time_p50_seconds=2.0 / 3, step_time_p95_seconds=0.123456789123, peak_memory_bytes=2**40,
                         train_seconds=12345.678901234, startup_seconds=123.456789012, final_loss=3.14159265358979,
                         grad_norm=1.41421356237, mfu=0.456789123456, device_name="N" * 200,
                         transport="T" * 200, nodes_used=1024)  # the collector cuts strings at 200
    succeeded = [decide.compact(collect.run_entry(r, phase="Succeeded", results=figures, start_time=NOW,
                                              completion_time=NOW)) for r in runs]
    for entries in (failed, succeeded):
        status = BenchmarkStatus.read({**start.dump(), **sweepstatus.summarize(start, entries, NOW).dump()})
        assert compact_size(status) <= STATUS_BYTES_BUDGET, compact_size(status)
    assert {len(e.reason) for e in failed} == {decide.STATUS_REASON_LIMIT}
    assert succeeded[0].results.tokens_per_second == 123457000.0, "figures kept to 6 significant digits"


@pytest.mark.slow
def test_the_largest_sweep_through_the_operator_stays_within_the_budget(tmp_path):
    """Every run of the largest sweep fails at once (this cluster serves no Kubeflow kind): its whole status
    is written, validated against the CRD's schema by the emulator, and read back."""
    with EmulatedCluster(tmp_path / "kube") as cluster:
        cluster.kubectl("apply", "-f", str(CRD))
        with kopf_operator(cluster, poll_seconds=1, timeout=120, verbose=False):
            benchmarks = Benchmarks(api_client(cluster))
            benchmarks.create({"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark",
                               "metadata": {"name": "largest"},
                               "spec": {**largest_sweep(spec.MAX_RUNS), "backend": "pytorchjob"}})
            status = wait_for(lambda: (s := benchmarks.status("largest")).get("phase") == "Failed" and s, 120,
                              interval=1, what="every run Failed")
            def run_failed_events() -> list[dict]:
                return [e for e in benchmarks.events("largest") if e["reason"] == "RunFailed"]

            # the two Events may be posted after the status: wait for both, then give a third time to show up
            wait_for(lambda: len(run_failed_events()) >= 2, what="a RunFailed Event per reason")
            time.sleep(1.0)
            events = run_failed_events()
        stored = cluster.call(lambda e: json.dumps(next(o.raw for (res, _, name), o in e.objects.items()
                                                        if res.plural == "gpt2benchmarks" and name == "largest"),
                                                   separators=(",", ":")))
    assert status["runsTotal"] == status["runsFailed"] == len(status["runs"]) > spec.MAX_RUNS - 9
    assert all("is not served by this cluster" in r["reason"] for r in status["runs"])
    assert len(json.dumps(status, separators=(",", ":"))) <= STATUS_BYTES_BUDGET
    assert len(stored) <= 1.5 * 2**20, "the whole object, metadata and annotations included"
    assert len(events) == 2, "one Event per reason (PyTorchJob, MPIJob), not one per run"
    assert f"{status['runsTotal'] - len([r for r in status['runs'] if r['jobKind'] == 'MPIJob'])} runs" in \
        next(e["message"] for e in events if "pytorchjobs" in e["message"])
