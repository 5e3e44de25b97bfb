"""The recommendation per objective and scale, with its margin and whether the noise allows a winner; the
scaling efficiencies; the papers' findings (`findings.py`). Pure functions: the operator calls `analyze`
for the CR status, the report for results.json. Definitions: docs/analysis.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpt2bench.report import findings
from gpt2bench.report.measures import (
    Configuration,
    Efficiency,
    Metric,
    Prices,
    Scale,
    Stat,
    configurations,
    efficiencies,
    energy_per_million_tokens,
    noise,
    peak_memory,
    scales,
    tokens_per_second,
    tokens_per_second_per_device,
)
from gpt2bench.report.noise import Interval, Noise, product_of_means, ratio_interval
from gpt2bench.status import Analysis, FigureNoise, Recommendation, RunStatus, ScalingEfficiency

# Step records (steps.jsonl) by run name, where a local run kept them; the operator has none.
Curves = dict[str, list[dict[str, Any]]]


@dataclass(frozen=True)
class Objective:
    name: str
    higher_is_better: bool
    unit: str


FASTEST = Objective("fastest", True, "tokens/s")
LEANEST = Objective("leanest", False, "bytes")
SCALABLE = Objective("scalable", True, "ratio")
EFFICIENT = Objective("efficient", False, "J per 1M tokens")


@dataclass(frozen=True)
class Candidate:
    """A configuration's figure as a product of configurations' means over another's: a plain figure is its own
    repeats over nothing; a scaling efficiency is its tokens/s per device over its baseline's."""

    config: Configuration
    over: list[list[float]]  # numerator groups (each: one configuration's repeat values)
    under: list[list[float]] = field(default_factory=list)  # denominator groups

    @property
    def value(self) -> float:
        return product_of_means(self.over) / product_of_means(self.under)

    def against(self, other: Candidate, sweep_noise: Noise) -> Interval | None:
        """The interval of self ÷ other."""
        return ratio_interval([*self.over, *other.under], [*self.under, *other.over], sweep_noise)


def decide(objective: Objective, scale: str | None, candidates: list[Candidate], noise: Noise,
           excluded: list[str], note: str | None = None) -> Recommendation:
    """Rank the candidates by their mean figure; name a winner only beyond the noise:
    - clear: the interval of the top-ranked's margin over the runner-up lies wholly on the better side of 0;
    - no-clear-winner: it contains 0; `candidates` lists every configuration the noise cannot tell from the
      top-ranked (its own interval against the top-ranked contains 0), top-ranked first;
    - needs-repeats: no configuration of the sweep was measured twice, so the noise is unknown: not decided;
    - only-candidate: nothing to compare with; not-measurable: no candidate at all (`note` says why).
    The margin is relative to the runner-up and positive when the top-ranked is better (docs/analysis.md)."""
    common = {"objective": objective.name, "scale": scale, "excluded": excluded or None}
    if not candidates:
        return Recommendation(decision="not-measurable", note=note or "no succeeded run has this figure", **common)
    sign = -1 if objective.higher_is_better else 1
    ranked = sorted(candidates, key=lambda c: sign * c.value)  # stable: plan order breaks exact ties
    top, runner = ranked[0], ranked[1] if len(ranked) > 1 else None
    stat = Stat.of(top.over[0]) if not top.under else None  # repeats' spread of a plain figure
    common |= {"run": top.config.name, "strategy": top.config.strategy, "precision": top.config.precision,
               "value": top.value, "unit": objective.unit, "spread": stat.spread if stat else None,
               "measurements": len(top.over[0]), "note": note,
               "noise": noise.cv if noise.known else None, "noise_df": noise.df}
    if runner is None:
        return Recommendation(decision="only-candidate", winner=top.config.name, **common)
    common |= {"runner_up": runner.config.name, "runner_up_value": runner.value,
               "margin": _advantage(top.value / runner.value, objective) if runner.value > 0 else None}
    interval = top.against(runner, noise)
    if interval is None:
        return Recommendation(decision="needs-repeats", candidates=[c.config.name for c in ranked], **common)
    low, high = sorted((_advantage(interval.low, objective), _advantage(interval.high, objective)))
    common |= {"margin_low": low, "margin_high": high, "confidence": interval.confidence}
    if low > 0:
        return Recommendation(decision="clear", winner=top.config.name, **common)
    tied = [c.config.name for c in ranked if c is top or top.against(c, noise).side(1.0) == "across"]
    return Recommendation(decision="no-clear-winner", candidates=tied, **common)


def _advantage(ratio: float, objective: Objective) -> float:
    """A ratio top ÷ other as how much better top is: +10 % faster (1.1), or 10 % less memory (0.9 -> +0.1)."""
    return ratio - 1 if objective.higher_is_better else 1 - ratio


def _excluded(configs: list[Configuration]) -> list[str]:
    return [f"{run.name} ({run.phase})" for c in configs for run in c.not_succeeded]


def _by_metric(objective: Objective, configs: list[Configuration], metric: Metric, sweep_noise: Noise,
               scale: str | None, note: str | None = None) -> Recommendation:
    candidates = [Candidate(c, [values]) for c in configs if (values := c.values(metric))]
    return decide(objective, scale, candidates, sweep_noise, _excluded(configs), note)


def cheapest(configs: list[Configuration], prices: Prices | None) -> list[Recommendation]:
    """Per scale (where it ranks like `fastest`: every run of a scale holds the same GPUs and pods), and across
    all scales, the one comparison where price adds something."""
    objective = Objective("cheapest", False, prices.unit if prices else "per 1M tokens")
    unknown = Noise(0.0, 0)
    if prices is None:
        return [decide(objective, None, [], unknown, [], "no prices: set spec.cost.gpuHour and/or spec.cost.nodeHour")]
    metric = prices.per_million_tokens
    if not any(c.values(metric) for c in configs):
        return [decide(objective, None, [], unknown, [], "the prices cover none of these runs' resources "
                                                         "(runs without GPUs need spec.cost.nodeHour)")]
    cost_noise = noise(configs, metric)
    found = [_by_metric(objective, [c for c in configs if c.scale == s], metric, cost_noise, s.label)
             for s in scales(configs)]
    across = _by_metric(objective, configs, metric, cost_noise, None,
                        "across scales; global batch grows with the scale, so equal cost per token is not "
                        "equal cost per unit of convergence")
    return [*found, across]


def scalable(configs: list[Configuration], effs: list[Efficiency]) -> list[Recommendation]:
    """Per scale above a strategy's smallest: the highest scaling efficiency."""
    if not effs:
        return [decide(SCALABLE, None, [], Noise(0.0, 0), [], "every strategy and precision ran at one scale only")]
    found = []
    per_device = noise(configs, tokens_per_second_per_device)
    for scale in sorted({e.config.scale for e in effs}):
        here = [c for c in configs if c.scale == scale]
        candidates = [Candidate(e.config, [e.config.values(tokens_per_second_per_device)],
                                [e.baseline.values(tokens_per_second_per_device)])
                      for e in effs if e.config.scale == scale]
        found.append(decide(SCALABLE, scale.label, candidates, per_device, _excluded(here)))
    return found


def efficient(configs: list[Configuration]) -> list[Recommendation]:
    """Per scale, the least energy per 1M tokens (NVML on GPUs, RAPL on CPUs); where no run could measure it,
    why not (the trainer's reason)."""
    if not any(c.values(energy_per_million_tokens) for c in configs):
        reasons = sorted({run.results.energy_unavailable_reason for c in configs for run in c.succeeded
                          if run.results.energy_unavailable_reason})
        why = "; ".join(r.removeprefix("not measurable: ") for r in reasons) or "no succeeded run reports energy"
        return [decide(EFFICIENT, None, [], Noise(0.0, 0), [], f"no energy figure: {why}")]
    energy = noise(configs, energy_per_million_tokens)
    return [_by_metric(EFFICIENT, [c for c in configs if c.scale == s], energy_per_million_tokens, energy, s.label)
            for s in scales(configs)]


def recommendations(configs: list[Configuration], prices: Prices | None,
                    effs: list[Efficiency]) -> list[Recommendation]:
    found = []
    throughput, memory = noise(configs, tokens_per_second), noise(configs, peak_memory)
    for scale in scales(configs):
        here = [c for c in configs if c.scale == scale]
        found.append(_by_metric(FASTEST, here, tokens_per_second, throughput, scale.label))
        found.append(_by_metric(LEANEST, here, peak_memory, memory, scale.label))
    return found + cheapest(configs, prices) + scalable(configs, effs) + efficient(configs)


def headline(found: list[Recommendation], configs: list[Configuration]) -> Recommendation | None:
    """The fastest recommendation at the largest scale that has a candidate: the answer for using every device
    measured (its decision says whether it names a winner)."""
    measured: dict[str, Scale] = {c.scale.label: c.scale for c in configs}
    fastest = [r for r in found if r.objective == FASTEST.name and r.run and r.scale in measured]
    return max(fastest, key=lambda r: measured[r.scale], default=None)


def scaling_entries(effs: list[Efficiency]) -> list[ScalingEfficiency]:
    """Every efficiency, with its baseline's row (efficiency 1 by definition) first, per strategy and precision."""
    rows: dict[tuple[str, str], list[ScalingEfficiency]] = {}
    for eff in effs:
        base = eff.baseline
        key = (base.strategy, base.precision)
        if key not in rows:
            base_tps = base.stat(tokens_per_second_per_device).mean
            rows[key] = [_scaling_row(base, base, base_tps, Stat(1.0, None, 1))]
        rows[key].append(_scaling_row(eff.config, base, eff.config.stat(tokens_per_second_per_device).mean, eff.stat,
                                      eff.interval))
    return [row for group in rows.values() for row in sorted(group, key=lambda r: r.devices)]


def _scaling_row(config: Configuration, base: Configuration, tps: float, stat: Stat,
                 interval: Interval | None = None) -> ScalingEfficiency:
    return ScalingEfficiency(strategy=config.strategy, precision=config.precision, scale=config.scale.label,
                             devices=config.scale.devices, baseline_scale=base.scale.label,
                             baseline_devices=base.scale.devices, tokens_per_second_per_device=tps,
                             efficiency=stat.mean, spread=stat.spread,
                             low=interval.low if interval else None, high=interval.high if interval else None)


def analyze(runs: list[RunStatus], spec: dict[str, Any] | None = None, curves: Curves | None = None) -> Analysis:
    """Everything the report concludes from `runs` (failed ones are left out and named). `spec` is the
    benchmark's spec (camelCase, as results.json keeps it): prices and ps modes come from it. `curves`: the
    runs' step records where they exist; without them the convergence finding compares final losses."""
    configs = configurations(runs)
    effs = efficiencies(configs)
    prices = Prices.from_spec(spec)
    found = recommendations(configs, prices, effs)
    return Analysis(recommended=headline(found, configs), noise=noise_entries(configs, prices),
                    recommendations=found, scaling=scaling_entries(effs),
                    findings=findings.check_all(configs, effs, spec or {}, curves))


def noise_entries(configs: list[Configuration], prices: Prices | None) -> list[FigureNoise]:
    """The sweep's noise of every figure a decision uses, where some configuration was measured twice."""
    figures: list[tuple[str, Metric]] = [("tokensPerSecond", tokens_per_second), ("peakMemoryBytes", peak_memory),
                                         ("energyJoulesPerMillionTokens", energy_per_million_tokens)]
    if prices is not None:
        figures.append(("costPer1MTokens", prices.per_million_tokens))
    found = []
    for name, metric in figures:
        pooled = noise(configs, metric)
        if pooled.known:
            repeated = sum(len(c.values(metric)) >= 2 for c in configs)
            found.append(FigureNoise(figure=name, cv=pooled.cv, df=pooled.df, configurations=repeated))
    return found
