"""What the rules and dashboards are built from: metric names, selectors and thresholds.

Like a monitoring mixin's config: change a selector or a threshold here, run
`python -m monitoring.generate --write`, and every expression, test target and Helm template follows.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TrainerMetrics:
    """Names the trainer serves on `--metrics-port` (trainer/metrics.py, docs/metrics.md), labelled
    benchmark, run, strategy, precision, rank; the scrape adds namespace and pod."""

    step: str = "gpt2bench_train_step"
    steps: str = "gpt2bench_train_steps_total"
    step_seconds_total: str = "gpt2bench_train_step_seconds_total"
    step_seconds: str = "gpt2bench_train_step_duration_seconds"
    tokens: str = "gpt2bench_train_tokens_total"
    tokens_per_second: str = "gpt2bench_train_tokens_per_second"
    tokens_per_second_per_device: str = "gpt2bench_train_tokens_per_second_per_device"
    loss: str = "gpt2bench_train_loss"
    grad_norm: str = "gpt2bench_train_grad_norm"
    learning_rate: str = "gpt2bench_train_learning_rate"
    data_loading_seconds: str = "gpt2bench_train_data_loading_seconds"
    peak_memory_bytes: str = "gpt2bench_train_memory_peak_bytes"
    peak_memory_reserved_bytes: str = "gpt2bench_train_memory_peak_reserved_bytes"
    mfu: str = "gpt2bench_train_mfu_ratio"
    # The step breakdown (docs/metrics.md, Step breakdown; trainer option --breakdown)
    phase_seconds: str = "gpt2bench_train_phase_seconds"  # labelled phase: data, forward, backward, optimizer, other
    comm_seconds: str = "gpt2bench_train_communication_seconds"
    comm_exposed_seconds: str = "gpt2bench_train_communication_exposed_seconds"
    comm_bytes: str = "gpt2bench_train_communication_bytes_total"  # labelled kind; absent without communication
    comm_bus_bandwidth: str = "gpt2bench_train_communication_bus_bandwidth_bytes_per_second"  # labelled kind
    step_energy_joules: str = "gpt2bench_train_step_energy_joules"
    energy_joules: str = "gpt2bench_train_energy_joules_total"


@dataclass(frozen=True)
class OperatorMetrics:
    """Names the operator serves (operator/controller/metrics.py), labelled by the GPT2Benchmark's `namespace` (the
    chart's ServiceMonitor keeps it with honorLabels)."""

    runs_started: str = "gpt2bench_operator_runs_started_total"
    runs_succeeded: str = "gpt2bench_operator_runs_succeeded_total"
    runs_failed: str = "gpt2bench_operator_runs_failed_total"
    reconcile_errors: str = "gpt2bench_operator_reconcile_errors_total"
    job_creation_latency: str = "gpt2bench_operator_job_creation_latency_seconds"
    # value 1 per recommendation of a finished benchmark, labelled namespace, benchmark, objective, scale, winner,
    # run (top-ranked), strategy, precision, decision (docs/analysis.md)
    recommendation_info: str = "gpt2bench_operator_recommendation_info"
    # value 1 per paper finding of a finished benchmark, labelled namespace, benchmark, finding, verdict
    finding_info: str = "gpt2bench_operator_finding_info"


@dataclass(frozen=True)
class MonitoringConfig:
    trainer: TrainerMetrics = field(default_factory=TrainerMetrics)
    operator: OperatorMetrics = field(default_factory=OperatorMetrics)

    # Label matchers added to every trainer / operator series. The metric names are unique to gpt2bench, so
    # the defaults select nothing more; narrow them when several installations share one Prometheus.
    trainer_selector: str = ""
    operator_selector: str = ""
    # The `job` label the chart's ServiceMonitor gives the operator's target (for the "operator down" alert).
    operator_job: str = "gpt2bench-operator"
    # DCGM exporter series carry the GPU's pod in this label (dcgm-exporter with Kubernetes mapping on).
    dcgm_pod_label: str = "pod"

    # A run's identity; `rank` is added for per-rank series.
    run_labels: tuple[str, ...] = ("namespace", "benchmark", "run", "strategy", "precision")

    # Thresholds (Prometheus durations and ratios).
    stalled_after: str = "10m"  # no step finished for this long ...
    stalled_for: str = "5m"  # ... and still so after this long: the run is stalled
    loss_not_finite_for: str = "1m"
    throughput_drop_ratio: float = 0.5  # tokens/s below this fraction of the run's median so far ...
    throughput_median_window: str = "1h"  # ... the median taken over this window ...
    throughput_drop_for: str = "10m"  # ... for this long
    reconcile_errors_for: str = "15m"
    run_failed_window: str = "15m"
    run_failed_for: str = "1m"
    operator_down_for: str = "10m"

    runbook_base_url: str = "https://github.com/gpt2bench/gpt2bench/blob/main/docs/runbooks.md"
    dashboard_tags: tuple[str, ...] = ("gpt2bench",)

    def trainer_sel(self, extra: str = "") -> str:
        """`{trainer_selector, extra}` (or nothing) for a trainer series."""
        return _braces(self.trainer_selector, extra)

    def operator_sel(self, extra: str = "") -> str:
        return _braces(self.operator_selector, extra)

    def by_run(self, *more: str) -> str:
        return ", ".join(self.run_labels + more)


def _braces(*matchers: str) -> str:
    inner = ", ".join(m for m in matchers if m)
    return "{" + inner + "}" if inner else ""


CONFIG = MonitoringConfig()
