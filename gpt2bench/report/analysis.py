"""The recommendation per objective and scale, with its margin and whether the noise allows a winner; the
scaling efficiencies; the papers' findings (`findings.py`). Pure functions: the operator calls `analyze`
for the CR status, the report for results.json. Definitions: docs/analysis.md.

The fastest configuration of each scale (and of each resource group of a CPU scale) is decided by a selection
race (`race.py`): one error rate α per race, kept across its looks and its rivals. Every other decision
(leanest, cheapest across scales, scalable, efficient, and the papers' findings) belongs to a family of its own
whose decisions are stated with p-values and then decided together (Holm), so that the chance that any decision
of a family is wrong stays at most α, however many it takes.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from pydantic.alias_generators import to_camel

from gpt2bench.objectives import Objective, objective, per_scale
from gpt2bench.report import findings, race, verdicts
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
    result,
    scales,
    tokens_per_second,
    tokens_per_second_per_device,
)
from gpt2bench.report.noise import ALPHA, CONFIDENCE, Contrast, Pending, Sample, holm, ratio
from gpt2bench.status import (
    TERMINAL_RUN_PHASES,
    Analysis,
    DroppedConfiguration,
    FigureNoise,
    Recommendation,
    RunStatus,
    ScalingEfficiency,
    UnstableConfiguration,
)

# Step records (steps.jsonl) by run name, where a local run kept them; the operator has none.
Curves = dict[str, list[dict[str, Any]]]
APART = "ranked apart"  # the note of a recommendation over a scale's configurations with other CPU resources


# The objectives with a decision of their own here (gpt2bench.objectives: their `ranking`); the table's `per scale`
# ones are ranked by `ranked_per_scale`.
FASTEST, CHEAPEST, SCALABLE, EFFICIENT = (objective(name) for name in ("fastest", "cheapest", "scalable", "efficient"))


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

    def against(self, other: Candidate) -> Contrast | None:
        """self ÷ other, on the log scale with its standard error (None: too few measurements)."""
        return ratio([*self.over, *other.under], [*self.under, *other.over])


def decide(objective: Objective, scale: str | None, candidates: list[Candidate], excluded: list[str],
           note: str | None = None, **extra: Any) -> Pending:
    """Rank the candidates by their geometric mean; name a winner only beyond the noise, against every rival
    (the objectives other than `fastest`, which races: `fastest_by_race`):
    - clear: the interval of the top-ranked's ratio over each rival lies wholly on the better side of 1;
    - no-clear-winner: some rival is not beaten; `candidates` lists the top-ranked and every rival it does not beat;
    - needs-repeats: too few measurements to know a comparison's noise: not decided;
    - only-candidate: nothing to compare with; not-measurable: no candidate at all (`note` says why).
    The p-value is the largest over the rivals (every one must be beaten), two-sided. The margin is over the
    runner-up, relative to it, positive when the top-ranked is better (docs/analysis.md)."""
    common = {"objective": objective.name, "scale": scale, "excluded": excluded or None, **extra}
    if not candidates:
        result = Recommendation(decision="not-measurable", note=note or "no succeeded run has this figure", **common)
        return Pending(None, lambda _confidence: result)
    sign = -1 if objective.higher_is_better else 1
    ranked = sorted(candidates, key=lambda c: sign * c.log_value)  # stable: plan order breaks exact ties
    top, rivals = ranked[0], ranked[1:]
    common |= {"run": top.config.name, "strategy": top.config.strategy, "precision": top.config.precision,
               "value": top.value, "unit": objective.unit, "measurements": top.over[0].n, "note": note,
               "spread": _log_spread(top.over[0]) if not top.under else None}
    if not rivals:
        result = Recommendation(decision="only-candidate", winner=top.config.name, **common)
        return Pending(None, lambda _confidence: result)
    runner = rivals[0]
    common |= {"runner_up": runner.config.name, "runner_up_value": runner.value,
               "margin": _advantage(top.value / runner.value, objective)}
    contrasts = [top.against(rival) for rival in rivals]
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
        tied = [r for r, i in zip(rivals, intervals) if i.side(1.0) != better]
        if not tied:
            return Recommendation(decision="clear", winner=top.config.name, **found)
        return Recommendation(decision="no-clear-winner", candidates=[top.config.name, *(r.config.name for r in tied)],
                              **found)

    return Pending(max(c.p_value() for c in contrasts), conclude)


def _log_spread(sample: Sample) -> float | None:
    """The sample standard deviation of ln x over a configuration's runs (≈ its coefficient of variation)."""
    return math.sqrt(sample.log_squares() / (sample.n - 1)) if sample.n >= 2 else None


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


def _group_extra(groups: list[list[Configuration]], index: int, scale: str) -> tuple[dict[str, Any], str | None]:
    """The fields and note that say which resource group a recommendation ranks (CPU scales with several)."""
    if len(groups) == 1:
        return {}, None
    group = groups[index]
    extra: dict[str, Any] = {"per_rank": group[0].per_rank}
    if index == 0:
        extra["ranked_apart"] = [f"{c.name} ({c.per_rank})" for g in groups[1:] for c in g]
        return extra, None
    return extra, f"{APART} from the rest of {scale}: its ranks had {group[0].per_rank}, the others {groups[0][0].per_rank}"


def _by_metric(objective: Objective, configs: list[Configuration], metric: Metric, scale: str | None,
               note: str | None = None, grouped: bool = False) -> list[Pending]:
    groups = resource_groups(configs) if grouped else [configs]
    found = []
    for index, group in enumerate(groups):
        candidates = [Candidate(c, [sample]) for c in group if (sample := c.sample(metric)).n]
        extra, apart = _group_extra(groups, index, scale or "")
        found.append(decide(objective, scale, candidates, _excluded(group), apart or note, **extra))
    return found


# ------------------------------------------------------------------ fastest: the selection race
def min_effect(sweep: dict[str, Any]) -> float | None:
    """sweep.minEffect: 5 % where the spec does not say; 0 turns it off (None)."""
    effect = sweep.get("minEffect", race.DEFAULT_MIN_EFFECT)
    return float(effect) if effect else None


def design(sweep: dict[str, Any], entrants: int, rounds: list[int]) -> race.Design:
    """The race a sweep runs: looking after every round from the third to sweep.maxRepeats (rounds planned
    before the first look are looked at as they would have been: none of the boundary's error rate is left
    unspent), or, with fixed rounds (no maxRepeats), once at the end (its last round: sweep.repeats, or the
    rounds the runs hold where the spec does not say)."""
    repeats = int(sweep.get("repeats") or 1)
    effect = min_effect(sweep)
    if sweep.get("maxRepeats"):
        return race.Design(entrants, int(sweep["maxRepeats"]), race.FIRST_LOOK, False, ALPHA, effect)
    last = max(repeats, rounds[-1] if rounds else 1)
    return race.Design(entrants, last, last, True, ALPHA, effect)


def finished_rounds(runs: list[RunStatus]) -> list[int]:
    """Decision rounds whose every run has finished, in order (a round still running is not looked at)."""
    rounds: dict[int, bool] = {}
    for run in runs:
        if run.repeat:
            rounds[run.repeat] = rounds.get(run.repeat, True) and run.phase in TERMINAL_RUN_PHASES
    return sorted(k for k, done in rounds.items() if done)


@dataclass
class Race:
    """One group's race as the report tells it: its configurations, its design and its outcome."""

    scale: Scale
    group: list[Configuration]
    design: race.Design
    outcome: race.Outcome
    rounds: list[int]


Raced = tuple[Race, int, list[list[Configuration]]]


def races(configs: list[Configuration], sweep: dict[str, Any], rounds: list[int]) -> list[Raced]:
    """Every group's race: per scale, per resource group (the largest first), with the group's index among its
    scale's groups and those groups. The entrants are the configurations with a figure in the finished rounds:
    one that never produced one (skipped, or every run failed) neither counts in the race's k nor joins a group
    by resources it never showed; it stays listed among the scale's excluded runs."""
    found = []
    for scale in scales(configs):
        at_scale = [c for c in configs if c.scale == scale]
        samples = {c.name: _by_round(c, rounds) for c in at_scale}
        groups = resource_groups([c for c in at_scale if samples[c.name]]) if any(samples.values()) else [at_scale]
        for index, group in enumerate(groups):
            entered = {c.name: samples[c.name] for c in group if samples[c.name]}
            plan = design(sweep, len(entered), rounds)
            outcome = race.replay(entered, plan, rounds) if entered else race.Outcome("not-measurable", [])
            if index == 0:  # the scale's configurations without a figure are shown (excluded) with its main group
                group = [*group, *(c for c in at_scale if not samples[c.name] and c not in group)]
            found.append((Race(scale, group, plan, outcome, rounds), index, groups))
    return found


def _by_round(config: Configuration, rounds: list[int]) -> dict[int, float]:
    """tokens/s by round over the finished rounds (succeeded runs with a figure > 0)."""
    return {run.repeat: float(v) for run in config.succeeded
            if run.repeat in rounds and (v := tokens_per_second(run)) is not None and v > 0}


def fastest_by_race(entry: Race, index: int, groups: list[list[Configuration]], prices: Prices | None,
                    needed: bool = True) -> Recommendation:
    """The `fastest` recommendation of one group from its race (docs/analysis.md, The selection race)."""
    group, outcome = entry.group, entry.outcome
    names = {c.name: c for c in group}
    scale = entry.scale.label
    extra, apart = _group_extra(groups, index, scale)
    common: dict[str, Any] = {"objective": FASTEST.name, "scale": scale, "excluded": _excluded(group) or None,
                              "note": apart, "confidence": CONFIDENCE, **extra}
    set_aside = {u.name for u in outcome.unstable}
    if set_aside:
        common["unstable"] = [UnstableConfiguration(configuration=u.name, fast_runs=u.fast_runs, fast=u.fast,
                                                    slow_runs=u.slow_runs, slow=u.slow) for u in outcome.unstable]
        common["unit"] = FASTEST.unit
    ranked = sorted((c for c in group if c.sample(tokens_per_second).n and c.name not in set_aside),
                    key=lambda c: -c.sample(tokens_per_second).log_mean)
    if outcome.decision == "unstable" or (set_aside and not ranked):
        return Recommendation(decision="unstable", candidates=list(outcome.survivors) or None,
                              decided_in=outcome.decided_in, **common)
    if not ranked:
        result = Recommendation(decision="not-measurable", **{**common, "note": apart or
                                                              "no succeeded run has this figure"})
        return result
    top = names[outcome.pick or (outcome.survivors[0] if outcome.survivors else ranked[0].name)]
    sample = top.sample(tokens_per_second)
    common |= {"run": top.name, "strategy": top.strategy, "precision": top.precision, "value": sample.geometric_mean,
               "unit": FASTEST.unit, "measurements": sample.n, "spread": _log_spread(sample)}
    if len(ranked) == 1:
        result = Recommendation(decision="only-candidate", winner=top.name, **common)
        return result
    runner = next(c for c in ranked if c is not top)
    versus = outcome.between(top.name, runner.name) if outcome.state is not None else None
    common |= {"runner_up": runner.name, "runner_up_value": runner.sample(tokens_per_second).geometric_mean}
    if versus is not None:
        estimate, low, high, n = versus
        common |= {"margin": estimate - 1, "margin_low": low - 1 if n >= race.FIRST_LOOK else None,
                   "margin_high": high - 1 if n >= race.FIRST_LOOK else None, "paired": True,
                   "noise_df": n - 1 if n >= race.FIRST_LOOK else 0,
                   "interval_coverage": 1 - 2 * outcome.level if n >= race.FIRST_LOOK else None}
    dropped = [DroppedConfiguration(configuration=d.name, round=d.round, behind=d.behind, ratio=d.ratio, low=d.low)
               for d in outcome.dropped] or None
    decision = {"clear": "clear", "equivalent": "equivalent", "needs-rounds": "needs-repeats"}.get(
        outcome.decision, "no-clear-winner")
    result = Recommendation(decision=decision, dropped=dropped, decided_in=outcome.decided_in, **common)
    if decision == "clear":
        result.winner = top.name
    elif decision == "equivalent":
        result.candidates = list(outcome.survivors)
        result.behind_at_most = outcome.behind_at_most
    elif decision == "needs-repeats":
        result.candidates = [c.name for c in ranked]
    else:
        result.candidates = list(outcome.survivors)
        done = entry.rounds[-1] if entry.rounds else 0
        result.rounds_needed = race.rounds_needed(outcome, entry.design, done) if needed else None
        result.round_seconds, result.round_cost = round_cost([names[n] for n in outcome.survivors], prices)
    return result


def round_cost(configs: list[Configuration], prices: Prices | None) -> tuple[float | None, float | None]:
    """What one more round of these configurations takes: their runs' mean wall times (start to completion)
    summed (they run one at a time), and their mean prices summed (each run's hourly price × its duration)."""
    seconds, cost = [], []
    for config in configs:
        spans = [(run, wall) for run in config.runs if (wall := run.wall_seconds()) is not None]
        if spans:
            seconds.append(statistics.fmean(duration for _, duration in spans))
            if prices:
                cost.append(statistics.fmean((prices.hourly(run) or 0) * d / 3600 for run, d in spans))
    return (sum(seconds) if seconds else None), (sum(cost) if cost and any(cost) else None)


def racing(found: list[Raced]) -> list[str]:
    """The configurations still in an undecided race, in plan order: the next round runs these only."""
    return [c.name for entry, _, _ in found for c in entry.group
            if entry.outcome.decision in ("open", "needs-rounds") and c.name in entry.outcome.survivors]


# ------------------------------------------------------------------ the other objectives: families of Holm
def cheapest(configs: list[Configuration], prices: Prices | None, fastest: list[Recommendation]) -> tuple[
        list[Recommendation], list[Pending]]:
    """Per scale it ranks like `fastest` (every run of a scale holds the same GPUs and pods, so cost per token is
    price ÷ tokens/s): the race's answer, in cost. Across all scales, the one comparison where price adds something:
    a decision of its own (returned pending)."""
    objective = dataclasses.replace(CHEAPEST, unit=prices.unit) if prices else CHEAPEST
    if prices is None:
        return [], [decide(objective, None, [], [], "no prices: set spec.cost.gpuHour and/or spec.cost.nodeHour")]
    metric = prices.per_million_tokens
    if not any(c.values(metric) for c in configs):
        return [], [decide(objective, None, [], [], "the prices cover none of these runs' resources (runs without "
                                                    "GPUs need spec.cost.nodeHour)")]
    by_name = {c.name: c for c in configs}
    per_scale = []
    for rec in fastest:
        config = by_name.get(rec.run or "")
        cost = config.sample(metric) if config else None
        if not cost or not cost.n:
            continue
        runner = by_name.get(rec.runner_up or "")
        runner_cost = runner.sample(metric) if runner else None
        found = rec.model_copy(update={
            "objective": objective.name, "unit": objective.unit, "value": cost.geometric_mean,
            "runner_up_value": runner_cost.geometric_mean if runner_cost and runner_cost.n else None,
            "rounds_needed": None, "round_seconds": None, "round_cost": None, "dropped": None})
        per_scale.append(found)
    across = _by_metric(objective, configs, metric, None,
                        "across scales; global batch grows with the scale, so equal cost per token is not "
                        "equal cost per unit of convergence")
    return per_scale, across


def scalable(configs: list[Configuration], effs: list[Efficiency]) -> list[Pending]:
    """Per scale above a strategy's smallest: the highest scaling efficiency, among those that measure scaling
    (CPU runs whose ranks kept their cores each)."""
    if not effs:
        return [decide(SCALABLE, None, [], [], "every strategy and precision ran at one scale only")]
    found = []
    for scale in sorted({e.config.scale for e in effs}):
        here = [c for c in configs if c.scale == scale]
        measured = [e for e in effs if e.config.scale == scale]
        usable = [e for e in measured if e.refused is None]
        refused = [e.refused for e in measured if e.refused is not None]
        candidates = [Candidate(e.config, [e.config.sample(tokens_per_second_per_device)],
                                [e.baseline.sample(tokens_per_second_per_device)]) for e in usable]
        note = "; ".join(dict.fromkeys(refused)) or None
        found.append(decide(SCALABLE, scale.label, candidates, _excluded(here), note))
    return found


def efficient(configs: list[Configuration]) -> list[Pending]:
    """Per scale, the least energy per 1M tokens (NVML on GPUs, RAPL on CPUs); where no run could measure it,
    why not (the trainer's reason)."""
    if not any(c.sample(energy_per_million_tokens).n for c in configs):
        reasons = sorted({run.results.energy_unavailable_reason for c in configs for run in c.succeeded
                          if run.results.energy_unavailable_reason})
        why = "; ".join(r.removeprefix("not measurable: ") for r in reasons) or "no succeeded run reports energy"
        return [decide(EFFICIENT, None, [], [], f"no energy figure: {why}")]
    rapl = any(run.results.energy_source == "rapl" for c in configs for run in c.succeeded)
    note = RAPL_NOTE if rapl else None
    return [pending for s in scales(configs)
            for pending in _by_metric(EFFICIENT, [c for c in configs if c.scale == s], energy_per_million_tokens,
                                      s.label, note, grouped=EFFICIENT.equal_resources)]


RAPL_NOTE = ("RAPL counts the whole CPU package of each node: other processes on the node (other tenants, the "
             "operator, the runner) are included")


def ranked_per_scale(objective_: Objective, configs: list[Configuration]) -> list[Pending]:
    """An objective ranked `per scale` (gpt2bench.objectives; leanest): each scale's configurations by the run
    figure it names, resource groups apart where it asks for equal resources."""
    metric = result(objective_.figure)
    return [pending for s in scales(configs)
            for pending in _by_metric(objective_, [c for c in configs if c.scale == s], metric, s.label,
                                      grouped=objective_.equal_resources)]


def headline(found: list[Recommendation], configs: list[Configuration]) -> Recommendation | None:
    """The fastest recommendation at the largest scale that has a candidate: the answer for using every device
    measured (its decision says whether it names a winner). A group ranked apart never heads the report."""
    measured: dict[str, Scale] = {c.scale.label: c.scale for c in configs}
    fastest = [r for r in found if r.objective == FASTEST.name and r.run and r.scale in measured
               and not (r.note or "").startswith(APART)]
    return max(fastest, key=lambda r: measured[r.scale], default=None)


def scaling_entries(effs: list[Efficiency]) -> list[ScalingEfficiency]:
    """Every efficiency, with its baseline's row (efficiency 1 by definition) first, per strategy and precision."""
    rows: dict[tuple[str, str], list[ScalingEfficiency]] = {}
    for eff in effs:
        base = eff.baseline
        key = (base.strategy, base.precision)
        if key not in rows:
            base_tps = base.sample(tokens_per_second_per_device).geometric_mean
            rows[key] = [_scaling_row(base, base, base_tps, Stat(1.0, None, 1))]
        rows[key].append(_scaling_row(eff.config, base, eff.config.sample(tokens_per_second_per_device).geometric_mean,
                                      eff.stat, eff.contrast.interval() if eff.contrast else None, eff.refused))
    return [row for group in rows.values() for row in sorted(group, key=lambda r: r.devices)]


def _scaling_row(config: Configuration, base: Configuration, tps: float, stat: Stat, interval: Any = None,
                 refused: str | None = None) -> ScalingEfficiency:
    return ScalingEfficiency(strategy=config.strategy, precision=config.precision, scale=config.scale.label,
                             devices=config.scale.devices, baseline_scale=base.scale.label,
                             baseline_devices=base.scale.devices, tokens_per_second_per_device=tps,
                             efficiency=stat.mean, spread=stat.spread,
                             low=interval.low if interval else None, high=interval.high if interval else None,
                             refused=refused)


def conclude_family(pendings: list[Pending], alpha: float = ALPHA) -> list[Any]:
    """Decide one family's pending decisions together: Holm at `alpha` over those with a p-value; the others need
    no level."""
    deciding = [i for i, p in enumerate(pendings) if p.p_value is not None]
    levels = dict(zip(deciding, holm([pendings[i].p_value for i in deciding], alpha)))
    return [p.conclude(levels.get(i, 1 - alpha)) for i, p in enumerate(pendings)]


def analyze(runs: list[RunStatus], spec: dict[str, Any] | None = None, curves: Curves | None = None,
            rounds_needed: bool = True) -> Analysis:
    """Everything the report concludes from `runs` (failed ones are left out and named). `spec` is the
    benchmark's spec (camelCase, as results.json keeps it): the race's design, prices and ps modes come from it.
    `curves`: the runs' step records where they exist; without them the convergence check compares final losses.
    `rounds_needed`: simulate the rounds an undecided race still needs (a tenth of a second or so per race; the
    rule that adds rounds does not need it)."""
    configs = configurations(runs)
    effs = efficiencies(configs)
    prices = Prices.from_spec(spec)
    sweep = (spec or {}).get("sweep") or {}
    rounds = finished_rounds(runs)
    raced = races(configs, sweep, rounds) if rounds else []
    if rounds:
        fastest = [fastest_by_race(entry, index, groups, prices, rounds_needed) for entry, index, groups in raced]
    else:  # runs that say nothing of their rounds (one round, or an older results document): compared unpaired
        fastest = conclude_family([p for s in scales(configs) for p in _by_metric(
            FASTEST, [c for c in configs if c.scale == s], tokens_per_second, s.label,
            grouped=FASTEST.equal_resources)])
    per_scale_cost, across_cost = cheapest(configs, prices, fastest)
    ranked = [conclude_family(ranked_per_scale(o, configs)) for o in per_scale()]  # each a family of its own
    recs = _in_scale_order([fastest, *ranked], configs) + per_scale_cost + conclude_family(across_cost) \
        + conclude_family(scalable(configs, effs)) + conclude_family(efficient(configs))
    claims = findings.check_all(configs, effs, spec or {}, curves)
    labels = {c.name: f"{c.strategy} {c.precision}" for c in configs}
    for rec in recs:
        rec.verdict = verdicts.verdict(rec, labels, len(finished_rounds(runs)), min_effect(sweep))
    verdicts_ = conclude_family(claims.findings)
    checks = conclude_family(claims.checks)
    return Analysis(recommended=headline(recs, configs), alpha=ALPHA, racing=racing(raced) or None,
                    noise=noise_entries(configs, prices), recommendations=recs, scaling=scaling_entries(effs),
                    findings=verdicts_, checks=checks)


def _in_scale_order(families: list[list[Recommendation]], configs: list[Configuration]) -> list[Recommendation]:
    """Scale by scale, each family's recommendations there in turn; then theirs over no one scale."""
    ordered = []
    for scale in scales(configs):
        ordered += [r for family in families for r in family if r.scale == scale.label]
    return ordered + [r for family in families[1:] for r in family if r.scale is None]

def noise_entries(configs: list[Configuration], prices: Prices | None) -> list[FigureNoise]:
    """Each figure's noise per scale, where some configuration of it was measured twice, and the far noisier
    configurations with their own."""
    figures: list[tuple[str, Metric]] = [("tokensPerSecond", tokens_per_second),
                                         *((to_camel(o.figure), result(o.figure)) for o in per_scale()),
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
