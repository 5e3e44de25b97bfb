"""The operator's own Prometheus metrics (docs/design.md, Prometheus metrics).

Counters are labelled by namespace only (low cardinality: never by benchmark or run name).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import kopf
import prometheus_client

from gpt2bench.clock import parse_rfc3339
from gpt2bench.status import Analysis

REGISTRY = prometheus_client.CollectorRegistry(auto_describe=True)

RUNS_STARTED = prometheus_client.Counter(
    "gpt2bench_operator_runs_started", "Runs whose job the operator created.", ["namespace"], registry=REGISTRY
)
RUNS_SUCCEEDED = prometheus_client.Counter(
    "gpt2bench_operator_runs_succeeded", "Runs that finished with results.", ["namespace"], registry=REGISTRY
)
RUNS_FAILED = prometheus_client.Counter(
    "gpt2bench_operator_runs_failed", "Runs that finished without results (the reason is in status).",
    ["namespace"], registry=REGISTRY,
)
RECONCILE_ERRORS = prometheus_client.Counter(
    "gpt2bench_operator_reconcile_errors", "Reconcile steps that raised (kopf retries them).",
    ["namespace"], registry=REGISTRY,
)
JOB_CREATION_LATENCY = prometheus_client.Histogram(
    "gpt2bench_operator_job_creation_latency_seconds",
    "From a GPT2Benchmark's creationTimestamp to its first job created.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
    registry=REGISTRY,
)

# One series per recommendation of a finished benchmark (labels below), value 1, for a Grafana table. Unlike
# the counters it names benchmarks and runs: bounded by the benchmarks that exist, removed with them.
RECOMMENDATION_INFO = prometheus_client.Gauge(
    "gpt2bench_operator_recommendation_info",
    "A finished GPT2Benchmark's recommendation per objective and scale (docs/analysis.md): the winner (empty "
    "unless the decision is clear or only-candidate), the top-ranked run and the decision; value 1.",
    ["namespace", "benchmark", "objective", "scale", "winner", "run", "strategy", "precision", "decision"],
    registry=REGISTRY,
)
# One series per paper finding of a finished benchmark, value 1: its verdict under the same rules as results.md.
FINDING_INFO = prometheus_client.Gauge(
    "gpt2bench_operator_finding_info",
    "A finished GPT2Benchmark's verdict on each paper claim (holds, does-not-hold, inconclusive, needs-repeats, "
    "not-measurable; docs/analysis.md); value 1.",
    ["namespace", "benchmark", "finding", "verdict"],
    registry=REGISTRY,
)
_exported: dict[tuple[str, str], list[tuple[Any, tuple[str, ...]]]] = {}
_exported_lock = threading.Lock()


def export_recommendations(namespace: str, benchmark: str, analysis: Analysis | None) -> None:
    """Replace the benchmark's recommendation and finding series with `analysis`'s (None: remove them)."""
    with _exported_lock:
        for gauge, labels in _exported.pop((namespace, benchmark), []):
            gauge.remove(*labels)
        series = []
        for rec in analysis.recommendations if analysis else []:
            if rec.run is None:  # not measurable: nothing to name
                continue
            series.append((RECOMMENDATION_INFO, (namespace, benchmark, rec.objective, rec.scale or "all scales",
                                                 rec.winner or "", rec.run, rec.strategy or "", rec.precision or "",
                                                 rec.decision)))
        for finding in analysis.findings if analysis else []:
            series.append((FINDING_INFO, (namespace, benchmark, finding.id, finding.verdict)))
        for gauge, labels in series:
            gauge.labels(*labels).set(1)
        if series:
            _exported[(namespace, benchmark)] = series


def observe_first_job(creation_timestamp: str | None, now: str) -> float | None:
    """Record CR → first job latency; the timestamps have 1 s resolution, so sub-second values round down."""
    created, at = parse_rfc3339(creation_timestamp), parse_rfc3339(now)
    if created is None or at is None:
        return None
    latency = max((at - created).total_seconds(), 0.0)
    JOB_CREATION_LATENCY.observe(latency)
    return latency


_server: Any = None


def serve(port: int, addr: str = "0.0.0.0") -> int:
    """Expose /metrics on its own port (a thread), separate from kopf's /healthz. Returns the port."""
    global _server
    stop()
    _server, _ = prometheus_client.start_http_server(port, addr=addr, registry=REGISTRY)
    return _server.server_port


def stop() -> None:
    global _server
    if _server is not None:
        _server.shutdown()
        _server.server_close()
        _server = None


@contextlib.contextmanager
def counting_errors(namespace: str | None) -> Iterator[None]:
    """Count a handler's unexpected errors; a bad spec (PermanentError) is the user's, not ours."""
    try:
        yield
    except kopf.PermanentError:
        raise
    except Exception:
        RECONCILE_ERRORS.labels(namespace or "").inc()
        raise
