"""Recording rules and alerts, built from `MonitoringConfig`.

Recording rules follow `level:metric:operations` (`namespace_benchmark_run:gpt2bench_train_tokens:rate5m`); alerts
are `GPT2Benchmark…`, each with `severity`, `for`, a static `summary`, a templated `description` and a
`runbook_url` into docs/runbooks.md. Every rule has a promtool test in monitoring/tests/.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from monitoring.config import MonitoringConfig

RUN_REF = "{{ $labels.namespace }}/{{ $labels.benchmark }} run {{ $labels.run }}"


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    for_: str
    severity: str
    summary: str
    description: str
    # Helm value that must be true for the alert to make sense (its target is only scraped then).
    helm_condition: str | None = None

    def to_rule(self, config: MonitoringConfig) -> dict[str, Any]:
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity},
            "annotations": {
                "summary": self.summary,
                "description": self.description,
                "runbook_url": f"{config.runbook_base_url}#{self.name.lower()}",
            },
        }


@dataclass(frozen=True)
class RuleGroups:
    recording: list[dict[str, Any]] = field(default_factory=list)
    alerts: list[Alert] = field(default_factory=list)

    def as_prometheus(self, config: MonitoringConfig) -> dict[str, Any]:
        """The Prometheus rule-file document (`groups:`), also the PrometheusRule's spec."""
        return {
            "groups": [
                {"name": "gpt2bench.rules", "rules": self.recording},
                {"name": "gpt2bench.alerts", "rules": [a.to_rule(config) for a in self.alerts]},
            ]
        }


def recording_rules(c: MonitoringConfig) -> list[dict[str, Any]]:
    t = c.trainer
    by_run = c.by_run()
    sel = c.trainer_sel()
    return [
        {
            # Global tokens/s of each run: every rank counts its own share, so the ranks are summed.
            "record": "namespace_benchmark_run:gpt2bench_train_tokens:rate5m",
            "expr": f"sum by ({by_run}) (rate({t.tokens}{sel}[5m]))",
        },
        {
            "record": "namespace_benchmark:gpt2bench_train_tokens:rate5m",
            "expr": "sum by (namespace, benchmark) (namespace_benchmark_run:gpt2bench_train_tokens:rate5m)",
        },
        {
            # Ranks step together: the fastest rank's rate is the run's step rate.
            "record": "namespace_benchmark_run:gpt2bench_train_steps:rate5m",
            "expr": f"max by ({by_run}) (rate({t.steps}{sel}[5m]))",
        },
        {
            # Mean seconds per step over 5m from the counters (the duration gauge only holds the last step).
            "record": "namespace_benchmark_run:gpt2bench_train_step_seconds:mean5m",
            "expr": f"max by ({by_run}) (\n  rate({t.step_seconds_total}{sel}[5m])\n  /\n  rate({t.steps}{sel}[5m])\n)",
        },
        {
            "record": "namespace_benchmark_run:gpt2bench_train_loss:avg",
            "expr": f"avg by ({by_run}) ({t.loss}{sel})",
        },
        {
            "record": "namespace_benchmark_run:gpt2bench_train_memory_peak_bytes:max",
            "expr": f"max by ({by_run}) ({t.peak_memory_bytes}{sel})",
        },
    ]


def alerts(c: MonitoringConfig) -> list[Alert]:
    t, o = c.trainer, c.operator
    by_run = c.by_run()
    last_loss = f"last_over_time({t.loss}{c.trainer_sel()}[5m])"
    tokens = "namespace_benchmark_run:gpt2bench_train_tokens:rate5m"
    return [
        Alert(
            name="GPT2BenchmarkRunStalled",
            expr=f"max by ({by_run}) (rate({t.steps}{c.trainer_sel()}[{c.stalled_after}])) == 0",
            for_=c.stalled_for,
            severity="warning",
            summary="A gpt2bench run has stopped making training steps.",
            description=(
                f"{RUN_REF} ({{{{ $labels.strategy }}}}, {{{{ $labels.precision }}}}) has finished no training "
                f"step for more than {c.stalled_after}; its pods are up but the step counter is flat."
            ),
        ),
        Alert(
            name="GPT2BenchmarkLossNotFinite",
            # x != x keeps only NaN; last_over_time keeps the last sample after the trainer exits on it.
            expr=(
                f"min by ({by_run}) (\n  ({last_loss} != {last_loss})\n  or\n  (abs({last_loss}) == +Inf)\n)"
            ),
            for_=c.loss_not_finite_for,
            severity="critical",
            summary="A gpt2bench run reports a loss that is NaN or infinite.",
            description=(
                f"{RUN_REF} ({{{{ $labels.strategy }}}}, {{{{ $labels.precision }}}}) reports a loss of "
                "{{ $value }}. The trainer stops on a non-finite loss, so the run fails."
            ),
        ),
        Alert(
            name="GPT2BenchmarkThroughputDropped",
            expr=(
                f"{tokens} > 0\nand\n{tokens}\n  < {c.throughput_drop_ratio} * "
                f"quantile_over_time(0.5, {tokens}[{c.throughput_median_window}])"
            ),
            for_=c.throughput_drop_for,
            severity="warning",
            summary="A gpt2bench run's throughput has dropped well below its own median.",
            description=(
                f"{RUN_REF} trains at {{{{ $value | humanize }}}} tokens/s, below {c.throughput_drop_ratio:g} "
                f"of its median over the last {c.throughput_median_window}. Its timings are no longer comparable."
            ),
        ),
        Alert(
            name="GPT2BenchmarkRunFailed",
            expr=f"sum by (job, namespace) (increase({o.runs_failed}{c.operator_sel()}[{c.run_failed_window}])) > 0",
            for_=c.run_failed_for,
            severity="warning",
            summary="The gpt2bench operator recorded a failed benchmark run.",
            description=(
                "The gpt2bench operator recorded {{ $value | printf \"%.0f\" }} failed run(s) in namespace "
                f"{{{{ $labels.namespace }}}} in the last {c.run_failed_window}; the sweep goes on. "
                "`kubectl get gpt2benchmarks -n {{ $labels.namespace }}` shows which, and each run's "
                "status.runs[].reason says why."
            ),
        ),
        Alert(
            name="GPT2BenchmarkOperatorReconcileErrors",
            expr=f"sum by (job, namespace) (increase({o.reconcile_errors}{c.operator_sel()}[5m])) > 0",
            for_=c.reconcile_errors_for,
            severity="warning",
            summary="The gpt2bench operator keeps failing to reconcile GPT2Benchmarks.",
            description=(
                "The gpt2bench operator has failed to reconcile GPT2Benchmarks in namespace {{ $labels.namespace }} "
                f"for more than {c.reconcile_errors_for} ({{{{ $value | printf \"%.0f\" }}}} in the last 5m)."
            ),
        ),
        Alert(
            name="GPT2BenchmarkOperatorDown",
            expr=f'absent(up{{job="{c.operator_job}"}} == 1)',
            for_=c.operator_down_for,
            severity="critical",
            summary="The gpt2bench operator is not being scraped: it is down or unreachable.",
            description=(
                f'No up{{job="{c.operator_job}"}} target has been up for {c.operator_down_for}: '
                "GPT2Benchmarks are not being reconciled."
            ),
            helm_condition="serviceMonitor.enabled",
        ),
    ]


def build(config: MonitoringConfig) -> RuleGroups:
    return RuleGroups(recording=recording_rules(config), alerts=alerts(config))
