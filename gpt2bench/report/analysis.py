"""The recommendation per objective and scale, with its margin and whether the noise allows a winner; the
scaling efficiencies; the papers' findings (`findings.py`). Pure functions: the operator calls `analyze`
for the CR status, the report for results.json. Definitions: docs/analysis.md.

Every decision of a report (each recommendation and each finding that has an interval) is first stated with
its p-value, then all of them are decided together (Holm), so that the chance that any of the report's
decisions is wrong stays at most 5 %, however many it makes.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from datetime import datetime
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
    noise_model,
    peak_memory,
    scales,
    tokens_per_second,
    tokens_per_second_per_device,
)
from gpt2bench.report.noise import CONFIDENCE, Contrast, NoiseModel, Pending, Sample, holm, looks, ratio
from gpt2bench.status import Analysis, FigureNoise, Recommendation, RunStatus, ScalingEfficiency

# Step records (steps.jsonl) by run name, where a local run kept them; the operator has none.
Curves = dict[str, list[dict[str, Any]]]
APART = "ranked apart"  # the note of a recommendation over a scale's configurations with other CPU resources


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
class Rules:
    """What a decision needs beyond its data: the smallest difference that matters (sweep.minEffect: a rival
    within it of the top-ranked is equivalent), and what one more round costs (for "rounds needed")."""

    min_effect: float | None = None
    round_seconds: float | None = None
    round_cost: float | None = None


@dataclass(frozen=True)
class Candidate:
    """A configuration's figure as a product of configurations' geometric means over others': a plain figure is
    its own repeats over nothing; a scaling efficiency is its tokens/s per device over its baseline's."""

    config: Configuration
    over: list[Sample]  # numerator samples
    under: list[Sample] = field(default_factory=list)  # denominator samples

    @property
    def log_value(self) -> float:
        return sum(s.log_mean for s in self.over) - sum(s.log_mean for s in self.under)

    @property
    def value(self) -> float:
        return math.prod(s.geometric_mean for s in self.over) / math.prod(s.geometric_mean for s in self.under)

    def against(self, other: Candidate, model: NoiseModel) -> Contrast | None:
        """self ÷ other, on the log scale with its standard error (None: a noise is unknown)."""
        return ratio([*self.over, *other.under], [*self.under, *other.over], model)


def decide(objective: Objective, scale: str | None, candidates: list[Candidate], model: NoiseModel,
           excluded: list[str], note: str | None = None, rules: Rules | None = None, **extra: Any) -> Pending:
    """Rank the candidates by their geometric mean; name a winner only beyond the noise, against every rival:
    - clear: the interval of the top-ranked's ratio over each rival lies wholly on the better side of 1;
    - equivalent (with rules.min_effect): each rival is beaten or lies within the min effect of the top-ranked
      (its interval inside 1 ± min effect); `candidates`: the top-ranked and the equivalent ones;
    - no-clear-winner: some rival is neither; `candidates` lists the top-ranked and every rival it does not beat,
      with the rounds that would resolve the hardest one (`rounds_needed`, and for the min effect);
    - needs-repeats: a noise is unknown (nothing at the scale measured twice): not decided;
    - only-candidate: nothing to compare with; not-measurable: no candidate at all (`note` says why).
    The p-value is the largest over the rivals of the smaller of (beaten, equivalent): every one must be
    resolved. The margin is over the runner-up, relative to it, positive when the top-ranked is better
    (docs/analysis.md)."""
    rules = rules or Rules()
    common = {"objective": objective.name, "scale": scale, "excluded": excluded or None, **extra}
    if not candidates:
        result = Recommendation(decision="not-measurable", note=note or "no succeeded run has this figure", **common)
        return Pending(None, lambda _confidence: result)
    sign = -1 if objective.higher_is_better else 1
    ranked = sorted(candidates, key=lambda c: sign * c.log_value)  # stable: plan order breaks exact ties
    top, rivals = ranked[0], ranked[1:]
    stat = Stat.of(top.over[0].values) if not top.under else None  # repeats' spread of a plain figure
    variance = model.of(top.config.name)
    common |= {"run": top.config.name, "strategy": top.config.strategy, "precision": top.config.precision,
               "value": top.value, "unit": objective.unit, "spread": stat.spread if stat else None,
               "measurements": top.over[0].n, "note": note, "noise": variance.cv if variance else None}
    if not rivals:
        result = Recommendation(decision="only-candidate", winner=top.config.name, **common)
        return Pending(None, lambda _confidence: result)
    runner = rivals[0]
    common |= {"runner_up": runner.config.name, "runner_up_value": runner.value,
               "margin": _advantage(top.value / runner.value, objective)}
    contrasts = [top.against(rival, model) for rival in rivals]
    if any(c is None for c in contrasts):
        result = Recommendation(decision="needs-repeats", candidates=[c.config.name for c in ranked], noise_df=0,
                                **common)
        return Pending(None, lambda _confidence: result)

    def conclude(confidence: float) -> Recommendation:
        intervals = [c.interval(confidence) for c in contrasts]
        better = "above" if objective.higher_is_better else "below"
        low, high = sorted((_advantage(intervals[0].low, objective), _advantage(intervals[0].high, objective)))
        found = {**common, "margin_low": low, "margin_high": high, "confidence": confidence,
                 "noise_df": contrasts[0].df if contrasts[0].se else None, "paired": contrasts[0].paired}
        if model.paired is not None and not all(c.paired for c in contrasts):
            missed = [c.config.name for c in ranked if c.config.name not in model.complete]
            found["note"] = "; ".join(filter(None, [found.get("note"), f"unpaired: {', '.join(missed)} did not run "
                                                                       "in every round"]))
        tied = [(r, c) for r, c, i in zip(rivals, contrasts, intervals) if i.side(1.0) != better]
        if not tied:
            return Recommendation(decision="clear", winner=top.config.name, **found)
        effect = rules.min_effect
        if effect and all(c.p_within(effect) <= 1 - confidence for _, c in tied):
            return Recommendation(decision="equivalent", candidates=[top.config.name, *(r.config.name for r, _ in tied)],
                                  **found)
        hardest = max(tied, key=lambda pair: pair[1].p_value())[1]  # the rival furthest from being resolved
        rounds = top.over[0].n
        needed = hardest.rounds_to_resolve(rounds, 1 - confidence, abs(hardest.center))
        needed_min = hardest.rounds_to_resolve(rounds, 1 - confidence, math.log(1 + effect)) if effect else None
        return Recommendation(decision="no-clear-winner", candidates=[top.config.name, *(r.config.name for r, _ in tied)],
                              rounds_needed=needed, rounds_needed_min_effect=needed_min,
                              round_seconds=rules.round_seconds, round_cost=rules.round_cost, **found)

    def resolved(contrast: Contrast) -> float:
        return min(contrast.p_value(), contrast.p_within(rules.min_effect)) if rules.min_effect else contrast.p_value()

    return Pending(max(resolved(c) for c in contrasts), conclude)


def _advantage(ratio_: float, objective: Objective) -> float:
    """A ratio top ÷ other as how much better top is: +10 % faster (1.1), or 10 % less memory (0.9 -> +0.1)."""
    return ratio_ - 1 if objective.higher_is_better else 1 - ratio_


def _excluded(configs: list[Configuration]) -> list[str]:
    return [f"{run.name} ({run.phase})" for c in configs for run in c.not_succeeded]


def resource_groups(configs: list[Configuration]) -> list[list[Configuration]]:
    """A scale's configurations by their CPU resources per rank (threads, cores): runs compare only where these
    match (docs/metrics.md). The largest group first (ties: plan order); GPU runs and unknown ones join it."""
    groups: dict[str | None, list[Configuration]] = {}
    for config in configs:
        groups.setdefault(config.per_rank, []).append(config)
    known = {key: members for key, members in groups.items() if key is not None}
    if len(known) <= 1:
        return [configs]
    main = max(known, key=lambda key: len(known[key]))  # max keeps the first of equals: plan order
    first = [c for c in configs if c.per_rank in (main, None)]
    return [first, *(members for key, members in known.items() if key != main)]


def _by_metric(objective: Objective, configs: list[Configuration], metric: Metric, model: NoiseModel,
               scale: str | None, note: str | None = None, grouped: bool = False,
               rules: Rules | None = None) -> list[Pending]:
    groups = resource_groups(configs) if grouped else [configs]
    found = []
    for index, group in enumerate(groups):
        candidates = [Candidate(c, [sample]) for c in group if (sample := c.sample(metric)).n]
        extra: dict[str, Any] = {"per_rank": group[0].per_rank} if len(groups) > 1 else {}
        if len(groups) > 1 and index == 0:
            extra["ranked_apart"] = [f"{c.name} ({c.per_rank})" for g in groups[1:] for c in g]
        group_note = note
        if index > 0:
            group_note = (f"{APART} from the rest of {scale}: its ranks had {group[0].per_rank}, the others "
                          f"{groups[0][0].per_rank}")
        found.append(decide(objective, scale, candidates, model, _excluded(group), group_note, rules, **extra))
    return found


def cheapest(configs: list[Configuration], prices: Prices | None) -> list[Pending]:
    """Per scale (where it ranks like `fastest`: every run of a scale holds the same GPUs and pods), and across
    all scales, the one comparison where price adds something."""
    objective = Objective("cheapest", False, prices.unit if prices else "per 1M tokens")
    unknown = NoiseModel()
    if prices is None:
        return [decide(objective, None, [], unknown, [], "no prices: set spec.cost.gpuHour and/or spec.cost.nodeHour")]
    metric = prices.per_million_tokens
    if not any(c.values(metric) for c in configs):
        return [decide(objective, None, [], unknown, [], "the prices cover none of these runs' resources "
                                                         "(runs without GPUs need spec.cost.nodeHour)")]
    cost_noise = noise_model(configs, metric)
    found = [pending for s in scales(configs)
             for pending in _by_metric(objective, [c for c in configs if c.scale == s], metric, cost_noise, s.label,
                                       grouped=True)]
    across = _by_metric(objective, configs, metric, cost_noise, None,
                        "across scales; global batch grows with the scale, so equal cost per token is not "
                        "equal cost per unit of convergence")
    return [*found, *across]


def scalable(configs: list[Configuration], effs: list[Efficiency]) -> list[Pending]:
    """Per scale above a strategy's smallest: the highest scaling efficiency, among those that measure scaling
    (CPU runs whose ranks kept their cores each)."""
    if not effs:
        return [decide(SCALABLE, None, [], NoiseModel(), [], "every strategy and precision ran at one scale only")]
    found = []
    per_device = noise_model(configs, tokens_per_second_per_device)
    for scale in sorted({e.config.scale for e in effs}):
        here = [c for c in configs if c.scale == scale]
        measured = [e for e in effs if e.config.scale == scale]
        usable = [e for e in measured if e.refused is None]
        refused = [e.refused for e in measured if e.refused is not None]
        candidates = [Candidate(e.config, [e.config.sample(tokens_per_second_per_device)],
                                [e.baseline.sample(tokens_per_second_per_device)]) for e in usable]
        note = "; ".join(dict.fromkeys(refused)) or None
        found.append(decide(SCALABLE, scale.label, candidates, per_device, _excluded(here), note))
    return found


def efficient(configs: list[Configuration]) -> list[Pending]:
    """Per scale, the least energy per 1M tokens (NVML on GPUs, RAPL on CPUs); where no run could measure it,
    why not (the trainer's reason)."""
    if not any(c.sample(energy_per_million_tokens).n for c in configs):
        reasons = sorted({run.results.energy_unavailable_reason for c in configs for run in c.succeeded
                          if run.results.energy_unavailable_reason})
        why = "; ".join(r.removeprefix("not measurable: ") for r in reasons) or "no succeeded run reports energy"
        return [decide(EFFICIENT, None, [], NoiseModel(), [], f"no energy figure: {why}")]
    energy = noise_model(configs, energy_per_million_tokens)
    rapl = any(run.results.energy_source == "rapl" for c in configs for run in c.succeeded)
    note = RAPL_NOTE if rapl else None
    return [pending for s in scales(configs)
            for pending in _by_metric(EFFICIENT, [c for c in configs if c.scale == s], energy_per_million_tokens,
                                      energy, s.label, note, grouped=True)]


RAPL_NOTE = ("RAPL counts the whole CPU package of each node: other processes on the node (other tenants, the "
             "operator, the runner) are included")


def recommendations(configs: list[Configuration], prices: Prices | None,
                    effs: list[Efficiency], rules: Rules | None = None) -> list[Pending]:
    found = []
    throughput, memory = noise_model(configs, tokens_per_second), noise_model(configs, peak_memory)
    for scale in scales(configs):
        here = [c for c in configs if c.scale == scale]
        found += _by_metric(FASTEST, here, tokens_per_second, throughput, scale.label, grouped=True, rules=rules)
        found += _by_metric(LEANEST, here, peak_memory, memory, scale.label)
    return found + cheapest(configs, prices) + scalable(configs, effs) + efficient(configs)


def headline(found: list[Recommendation], configs: list[Configuration]) -> Recommendation | None:
    """The fastest recommendation at the largest scale that has a candidate: the answer for using every device
    measured (its decision says whether it names a winner). A group ranked apart never heads the report."""
    measured: dict[str, Scale] = {c.scale.label: c.scale for c in configs}
    fastest = [r for r in found if r.objective == FASTEST.name and r.run and r.scale in measured
               and not (r.note or "").startswith(APART)]
    return max(fastest, key=lambda r: measured[r.scale], default=None)


def scaling_entries(effs: list[Efficiency], confidences: dict[int, float] | None = None) -> list[ScalingEfficiency]:
    """Every efficiency, with its baseline's row (efficiency 1 by definition) first, per strategy and precision."""
    rows: dict[tuple[str, str], list[ScalingEfficiency]] = {}
    for eff in effs:
        base = eff.baseline
        key = (base.strategy, base.precision)
        if key not in rows:
            base_tps = base.stat(tokens_per_second_per_device).mean
            rows[key] = [_scaling_row(base, base, base_tps, Stat(1.0, None, 1))]
        rows[key].append(_scaling_row(eff.config, base, eff.config.stat(tokens_per_second_per_device).mean, eff.stat,
                                      eff.contrast.interval() if eff.contrast else None, eff.refused))
    return [row for group in rows.values() for row in sorted(group, key=lambda r: r.devices)]


def _scaling_row(config: Configuration, base: Configuration, tps: float, stat: Stat, interval: Any = None,
                 refused: str | None = None) -> ScalingEfficiency:
    return ScalingEfficiency(strategy=config.strategy, precision=config.precision, scale=config.scale.label,
                             devices=config.scale.devices, baseline_scale=base.scale.label,
                             baseline_devices=base.scale.devices, tokens_per_second_per_device=tps,
                             efficiency=stat.mean, spread=stat.spread,
                             low=interval.low if interval else None, high=interval.high if interval else None,
                             refused=refused)


def conclude_all(pendings: list[Pending], alpha: float = 1 - CONFIDENCE) -> tuple[list[Any], int]:
    """Decide every pending decision together: Holm at `alpha` over those with a p-value; the others need no
    level."""
    deciding = [i for i, p in enumerate(pendings) if p.p_value is not None]
    levels = dict(zip(deciding, holm([pendings[i].p_value for i in deciding], alpha)))
    return [p.conclude(levels.get(i, 1 - alpha)) for i, p in enumerate(pendings)], len(deciding)


def round_timing(runs: list[RunStatus], prices: Prices | None) -> tuple[float | None, float | None]:
    """The mean wall time of a decision round (its first start to its last completion) and the mean price of
    its runs (each run's hourly price × its duration), over the rounds whose runs have both times."""
    spans: dict[int, list[tuple[datetime, datetime, RunStatus]]] = {}
    for run in runs:
        if run.repeat and run.start_time and run.completion_time:
            spans.setdefault(run.repeat, []).append((parse_time(run.start_time), parse_time(run.completion_time), run))
    if not spans:
        return None, None
    seconds = [(max(end for _, end, _ in found) - min(start for start, _, _ in found)).total_seconds()
               for found in spans.values()]
    costs = [sum((prices.hourly(run) or 0) * (end - start).total_seconds() / 3600 for start, end, run in found)
             for found in spans.values()] if prices else []
    return statistics.fmean(seconds), (statistics.fmean(costs) if costs and any(costs) else None)


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def analyze(runs: list[RunStatus], spec: dict[str, Any] | None = None, curves: Curves | None = None) -> Analysis:
    """Everything the report concludes from `runs` (failed ones are left out and named). `spec` is the
    benchmark's spec (camelCase, as results.json keeps it): prices and ps modes come from it. `curves`: the
    runs' step records where they exist; without them the convergence finding compares final losses."""
    configs = configurations(runs)
    effs = efficiencies(configs)
    prices = Prices.from_spec(spec)
    sweep = (spec or {}).get("sweep") or {}
    rules = Rules(sweep.get("minEffect"), *round_timing(runs, prices))
    recs = recommendations(configs, prices, effs, rules)
    claims = findings.check_all(configs, effs, spec or {}, curves)
    concluded, decisions = conclude_all([*recs, *claims], (1 - CONFIDENCE) / looks(sweep))
    found, verdicts = concluded[: len(recs)], concluded[len(recs):]
    return Analysis(recommended=headline(found, configs), decisions=decisions, looks=looks(sweep),
                    noise=noise_entries(configs, prices), recommendations=found, scaling=scaling_entries(effs),
                    findings=verdicts)


def noise_entries(configs: list[Configuration], prices: Prices | None) -> list[FigureNoise]:
    """Each figure's noise per scale, where some configuration of it was measured twice, and the far noisier
    configurations with their own."""
    figures: list[tuple[str, Metric]] = [("tokensPerSecond", tokens_per_second), ("peakMemoryBytes", peak_memory),
                                         ("energyJoulesPerMillionTokens", energy_per_million_tokens)]
    if prices is not None:
        figures.append(("costPer1MTokens", prices.per_million_tokens))
    found = []
    for name, metric in figures:
        model = noise_model(configs, metric)
        paired = {pool.name: pool for pool in (model.paired.pools if model.paired else [])}
        effects = [math.exp(model.round_effects[r]) - 1 for r in sorted(model.round_effects)] or None
        for pool in model.pools:
            if pool.variance is None and not pool.noisier:
                continue
            noisier = [f"{n} ±{model.of(n).cv:.1%} (df {model.of(n).df:g})" for n in pool.noisier]
            blocked = paired.get(pool.name)
            within = blocked.variance if blocked else None
            found.append(FigureNoise(figure=name, scale=pool.name, cv=pool.variance.cv if pool.variance else 0.0,
                                     df=pool.variance.df if pool.variance else 0, configurations=len(pool.members),
                                     noisier=noisier or None, paired_cv=within.cv if within else None,
                                     paired_df=within.df if within else None,
                                     round_share=blocked.round_share if blocked else None,
                                     round_effects=effects if blocked else None))
    return found
