"""The recommendation per objective and scale, with its margin and whether the noise allows a winner; the
scaling efficiencies; the papers' findings (`findings.py`). Pure functions: the operator calls `analyze`
for the CR status, the report for results.json. Definitions: docs/analysis.md.
"""

from __future__ import annotations

from dataclasses import dataclass
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
    peak_memory,
    scales,
    tokens_per_second,
    tokens_per_second_per_device,
)
from gpt2bench.status import Analysis, Recommendation, RunStatus, ScalingEfficiency

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


def decide(objective: Objective, scale: str | None, candidates: list[tuple[Configuration, Stat]],
           excluded: list[str], note: str | None = None) -> Recommendation:
    """Rank the candidates by mean; the winner's margin over the runner-up decides how sure the pick is:
    - clear: both measured at least twice and |difference| > the sum of their spreads;
    - no-clear-winner: |difference| <= that sum; `tied` lists every configuration whose mean is within the
      winner's spread plus its own (a configuration measured once counts with spread 0 there);
    - spread-unknown: the winner or the runner-up was measured once (repeats: 1), so no noise is known;
    - only-candidate: nothing to compare with; not-measurable: no candidate at all (`note` says why)."""
    common = {"objective": objective.name, "scale": scale, "excluded": excluded or None}
    if not candidates:
        return Recommendation(decision="not-measurable", note=note or "no succeeded run has this figure", **common)
    sign = -1 if objective.higher_is_better else 1
    ranked = sorted(candidates, key=lambda pair: sign * pair[1].mean)  # stable: plan order breaks exact ties
    winner, best = ranked[0]
    common |= {"run": winner.name, "strategy": winner.strategy, "precision": winner.precision, "value": best.mean,
               "unit": objective.unit, "spread": best.spread, "measurements": best.n, "note": note}
    if len(ranked) == 1:
        return Recommendation(decision="only-candidate", **common)
    runner, second = ranked[1]
    difference = abs(best.mean - second.mean)
    common |= {"runner_up": runner.name, "runner_up_value": second.mean,
               "margin": difference / abs(second.mean) if second.mean else None}
    if best.spread is None or second.spread is None:
        return Recommendation(decision="spread-unknown", **common)
    combined = best.spread + second.spread
    common["combined_spread"] = combined / abs(second.mean) if second.mean else None
    if difference > combined:
        return Recommendation(decision="clear", **common)
    tied = [c.name for c, s in ranked if abs(best.mean - s.mean) <= best.spread + (s.spread or 0.0)]
    return Recommendation(decision="no-clear-winner", tied=tied, **common)


def _excluded(configs: list[Configuration]) -> list[str]:
    return [f"{run.name} ({run.phase})" for c in configs for run in c.not_succeeded]


def _by_metric(objective: Objective, configs: list[Configuration], metric: Metric,
               scale: str | None, note: str | None = None) -> Recommendation:
    candidates = [(c, s) for c in configs if (s := c.stat(metric)) is not None]
    return decide(objective, scale, candidates, _excluded(configs), note)


def cheapest(configs: list[Configuration], prices: Prices | None) -> list[Recommendation]:
    """Per scale (where it ranks like `fastest`: every run of a scale holds the same GPUs and pods), and across
    all scales, the one comparison where price adds something."""
    objective = Objective("cheapest", False, prices.unit if prices else "per 1M tokens")
    if prices is None:
        return [decide(objective, None, [], [], "no prices: set spec.cost.gpuHour and/or spec.cost.nodeHour")]
    metric = prices.per_million_tokens
    if not any(c.stat(metric) for c in configs):
        return [decide(objective, None, [], [], "the prices cover none of these runs' resources "
                                                "(runs without GPUs need spec.cost.nodeHour)")]
    found = [_by_metric(objective, [c for c in configs if c.scale == s], metric, s.label) for s in scales(configs)]
    across = _by_metric(objective, configs, metric, None,
                        "across scales; global batch grows with the scale, so equal cost per token is not "
                        "equal cost per unit of convergence")
    return [*found, across]


def scalable(configs: list[Configuration], effs: list[Efficiency]) -> list[Recommendation]:
    """Per scale above a strategy's smallest: the highest scaling efficiency."""
    if not effs:
        return [decide(SCALABLE, None, [], [], "every strategy and precision ran at one scale only")]
    found = []
    for scale in sorted({e.config.scale for e in effs}):
        here = [c for c in configs if c.scale == scale]
        candidates = [(e.config, e.stat) for e in effs if e.config.scale == scale]
        found.append(decide(SCALABLE, scale.label, candidates, _excluded(here)))
    return found


def recommendations(configs: list[Configuration], prices: Prices | None,
                    effs: list[Efficiency]) -> list[Recommendation]:
    found = []
    for scale in scales(configs):
        here = [c for c in configs if c.scale == scale]
        found.append(_by_metric(FASTEST, here, tokens_per_second, scale.label))
        found.append(_by_metric(LEANEST, here, peak_memory, scale.label))
    return found + cheapest(configs, prices) + scalable(configs, effs)


def headline(found: list[Recommendation], configs: list[Configuration]) -> Recommendation | None:
    """The fastest configuration at the largest scale that has one: the answer for using every device measured."""
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
        rows[key].append(_scaling_row(eff.config, base, eff.config.stat(tokens_per_second_per_device).mean, eff.stat))
    return [row for group in rows.values() for row in sorted(group, key=lambda r: r.devices)]


def _scaling_row(config: Configuration, base: Configuration, tps: float, stat: Stat) -> ScalingEfficiency:
    return ScalingEfficiency(strategy=config.strategy, precision=config.precision, scale=config.scale.label,
                             devices=config.scale.devices, baseline_scale=base.scale.label,
                             baseline_devices=base.scale.devices, tokens_per_second_per_device=tps,
                             efficiency=stat.mean, spread=stat.spread)


def analyze(runs: list[RunStatus], spec: dict[str, Any] | None = None, curves: Curves | None = None) -> Analysis:
    """Everything the report concludes from `runs` (failed ones are left out and named). `spec` is the
    benchmark's spec (camelCase, as results.json keeps it): prices and ps modes come from it. `curves`: the
    runs' step records where they exist; without them the convergence finding compares final losses."""
    configs = configurations(runs)
    effs = efficiencies(configs)
    found = recommendations(configs, Prices.from_spec(spec), effs)
    return Analysis(recommended=headline(found, configs), recommendations=found, scaling=scaling_entries(effs),
                    findings=findings.check_all(configs, effs, spec or {}, curves))
