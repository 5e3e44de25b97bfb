"""results.md: the recommendation first, then the scaling efficiencies, the papers' findings, the runs, the
plots. Reads a `ResultsDocument` whose `analysis` is set (`analysis.analyze`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpt2bench.plan import seed_for
from gpt2bench.report import verdicts
from gpt2bench.report.measures import (
    BREAKDOWN_PARTS,
    Prices,
    configurations,
    hardware,
    noise_model,
    result,
    tokens_per_second,
    unsteady,
)
from gpt2bench.report.noise import ALPHA
from gpt2bench.report.table import (
    MIB,
    NO_VALUE,
    configurations_markdown,
    fmt,
    fmt_stat,
    markdown_table,
    repeated,
    results_table_markdown,
)
from gpt2bench.status import OBJECTIVES, Analysis, Recommendation, ResultsDocument
from gpt2bench.status import fabric_warnings as run_fabric_warnings

OBJECTIVE_ORDER = tuple(OBJECTIVES)
VERDICTS = {"holds": "holds", "does-not-hold": "does not hold",
            "inconclusive": "inconclusive (the interval crosses the claim's threshold)",
            "needs-repeats": "not decided: needs 3 measurements or more", "not-measurable": "not measurable with this sweep"}
NEEDS_REPEATS = "not decided: a comparison needs 3 rounds or more (fewer cannot tell its noise)"


def value_text(value: float | None, unit: str | None) -> str:
    if value is None:
        return NO_VALUE
    if unit == "bytes":
        return f"{fmt(value, ',.1f', 1 / MIB)} MiB"
    if unit == "tokens/s":
        return f"{fmt(value, ',.0f')} tokens/s"
    if unit == "ratio":
        return f"{fmt(value, '.2f')} efficiency"
    return f"{value:.4g} {unit or ''}".rstrip()


def level_text(confidence: float) -> str:
    """`95%`, `97.5%`, `98.33%`: a confidence level with the digits it needs, two at most."""
    for digits in range(0, 2):
        text = f"{confidence:.{digits}%}"
        if abs(float(text.rstrip("%")) / 100 - confidence) < 5e-7:
            return text
    return f"{confidence:.2%}"


def margin_text(rec: Recommendation) -> str:
    """`+7.2 % [+1.1 %, +13.6 %] (99 %, valid at any stop)`: the top-ranked's margin over the runner-up and its
    interval, labelled with its own coverage (a race's: at its bar, whichever round it stopped; the point margin
    after an early stop is biased away from zero, the interval is not)."""
    if rec.margin is None:
        return NO_VALUE
    if rec.margin_low is None or rec.margin_high is None:
        return f"{rec.margin:+.1%}"
    label = (f"{level_text(rec.interval_coverage)}, valid at any stop" if rec.interval_coverage is not None
             else level_text(rec.confidence))
    return f"{rec.margin:+.1%} [{rec.margin_low:+.1%}, {rec.margin_high:+.1%}] ({label})"


def decision_text(rec: Recommendation) -> str:
    """The verdict (verdicts.py), and for a race what it dropped, when and behind what."""
    text = rec.verdict or rec.decision
    dropped = verdicts.dropped(rec)
    return f"{text}; dropped: {dropped}" if dropped else text


def headline(analysis: Analysis) -> str:
    """The answer for using every device measured: the fastest at the largest scale, in one sentence."""
    rec = analysis.recommended
    if rec is None:
        return "No recommendation: no run succeeded."
    value = f", {value_text(rec.value, rec.unit)}" if rec.decision in ("clear", "equivalent", "only-candidate") else ""
    return f"**At the largest scale measured ({rec.scale}): {rec.verdict}**{value}."


def race_cells(analysis: Analysis) -> dict[str, str]:
    """Where each configuration stands in its scale's race: the configurations table's `race` column."""
    cells: dict[str, str] = {}
    for rec in analysis.recommendations:
        if rec.objective != "fastest":
            continue
        for dropped in rec.dropped or []:
            cells[dropped.configuration] = (f"dropped after round {dropped.round} ({verdicts.short(dropped.behind)} "
                                            f"{dropped.ratio - 1:+.0%})")
        if rec.decision == "clear" and rec.winner:
            cells[rec.winner] = f"the fastest (round {rec.decided_in})" if rec.decided_in else "the fastest"
        elif rec.decision == "equivalent":
            cells[rec.run] = "the pick: fastest or within sweep.minEffect"
            for name in rec.candidates or []:
                cells.setdefault(name, "within sweep.minEffect of the pick or behind it")
        elif rec.decision == "no-clear-winner":
            for name in rec.candidates or []:
                cells[name] = "among the fastest"
        for unstable in rec.unstable or []:
            cells[unstable.configuration] = (f"unstable, not ranked: {unstable.fast_runs} runs near "
                                             f"{verdicts.near(unstable.fast)}, {unstable.slow_runs} near "
                                             f"{verdicts.near(unstable.slow)}")
    return cells


def _ordered(recs: list[Recommendation]) -> list[Recommendation]:
    scale_order = list(dict.fromkeys(r.scale for r in recs if r.scale is not None)) + [None]
    return sorted(recs, key=lambda r: (scale_order.index(r.scale), OBJECTIVE_ORDER.index(r.objective)))


def scale_text(rec: Recommendation) -> str:
    return (rec.scale or "all scales") + (f" ({rec.per_rank})" if rec.per_rank else "")


def recommendations_markdown(analysis: Analysis) -> str:
    rows = [[scale_text(rec), rec.objective, decision_text(rec), rec.run or NO_VALUE,
             value_text(rec.value, rec.unit),
             f"{rec.runner_up} ({value_text(rec.runner_up_value, rec.unit)})" if rec.runner_up else NO_VALUE,
             margin_text(rec)]
            for rec in _ordered(analysis.recommendations)]
    headers = ["scale", "objective", "verdict", "top-ranked", "value", "runner-up", "margin [interval]"]
    lines = [markdown_table(headers, rows, {"scale", "objective", "verdict", "top-ranked", "runner-up"})]
    excluded = {rec.scale or "all scales": rec.excluded for rec in analysis.recommendations if rec.excluded}
    lines += [f"Not compared at {scale} (did not succeed): {', '.join(names)}.\n" for scale, names in excluded.items()]
    apart = {rec.scale: rec.ranked_apart for rec in analysis.recommendations if rec.ranked_apart}
    lines += [f"Ranked apart at {scale}, their ranks had other CPU resources (runs compare only at equal threads "
              f"and cores per rank): {', '.join(names)}.\n" for scale, names in apart.items()]
    notes = dict.fromkeys(rec.note for rec in analysis.recommendations
                          if rec.note and rec.decision != "not-measurable" and not rec.note.startswith("ranked"))
    lines += [f"Note: {note}.\n" for note in notes]
    return "\n".join(lines)


def recommendation_lines(analysis: Analysis) -> list[str]:
    """The terminal's short form: the headline, then one line per recommendation."""
    lines = [headline(analysis).replace("**", "")]
    for rec in _ordered(analysis.recommendations):
        value = f", {value_text(rec.value, rec.unit)}" if rec.decision in ("clear", "equivalent") else ""
        lines.append(f"  {scale_text(rec)} {rec.objective}: {rec.verdict}{value}")
        if dropped := verdicts.dropped(rec):
            lines.append(f"    dropped: {dropped}")
    lines.append(verdicts.explained(analysis.alpha or ALPHA))
    return lines


def noise_markdown(analysis: Analysis) -> str:
    """Each figure's noise per scale, the far noisier configurations with their own, or why there is none."""
    if not analysis.noise:
        return ("Unknown: no configuration was measured twice, so nothing is decided (set spec.sweep.repeats to 2 "
                "or more).\n")
    rows = [[n.figure, n.scale or NO_VALUE, f"±{n.cv:.1%}" if n.configurations else NO_VALUE, f"{n.df:g}",
             str(n.configurations), "; ".join(n.noisier or []) or NO_VALUE,
             NO_VALUE if n.paired_cv is None else f"±{n.paired_cv:.1%} ({n.paired_df:g})",
             NO_VALUE if n.round_share is None else f"{max(n.round_share, 0):.0%}"] for n in analysis.noise]
    text = markdown_table(["figure", "scale", "noise of one run (pooled)", "degrees of freedom",
                           "configurations pooled", "far noisier: their own noise",
                           "after the rounds' effect (df)", "spread the rounds explain"], rows,
                          {"figure", "scale", "far noisier: their own noise"})
    effects = next((n.round_effects for n in analysis.noise if n.figure == "tokensPerSecond" and n.round_effects), None)
    if effects:
        text += ("\nRound effect on tokens/s (what every run of a round shared, against the sweep's mean): "
                 + ", ".join(f"round {k} {e:+.1%}" for k, e in enumerate(effects, start=1)) + ". Paired comparisons "
                 "(within a round) are free of it; a configuration that missed a round is compared unpaired.\n")
    return text


def rounds_markdown(doc: ResultsDocument) -> str:
    """Each configuration's own noise on tokens/s, over its rounds, beside what is left once the rounds' shared
    effect is taken out (docs/analysis.md, Rounds as blocks)."""
    configs = configurations(doc.runs)
    model = noise_model(configs, tokens_per_second)
    rows = []
    for config in configs:
        own = model.own_cv(config.name)
        if own is None:
            continue
        after = model.paired.own_cv(config.name) if model.paired else None
        rows.append([config.name, config.scale.label, str(config.sample(tokens_per_second).n), f"±{own:.1%}",
                     NO_VALUE if after is None else f"±{after:.1%}"])
    if not rows:
        return "No configuration ran in two rounds.\n"
    return markdown_table(["configuration", "scale", "rounds", "own noise (tokens/s)", "after the rounds' effect"],
                          rows, {"configuration", "scale"})


def rounds_line(doc: ResultsDocument) -> str:
    """How many rounds ran and why no more did (a sweep that repeats until decided)."""
    rounds = doc.rounds_done or max((run.repeat or 0 for run in doc.runs), default=0)
    if not rounds:
        return "One round: nothing repeated, so nothing is compared within rounds."
    text = (f"{rounds} round{'s' if rounds != 1 else ''} run, each in a shuffled order: every configuration in the "
            "first rounds, then only those still racing.")
    if doc.stop_reason:
        text += f" Stopped: {doc.stop_reason}."
    return text


def decisions_text(analysis: Analysis) -> str:
    """What the level of every decision means, said once."""
    return verdicts.explained(analysis.alpha or ALPHA) + "\n"


def steadiness_markdown(doc: ResultsDocument) -> str:
    """Runs whose step time was still changing over their measured steps (docs/analysis.md, Steady state)."""
    found = [(run.name, why) for run in doc.runs if (why := unsteady(run))]
    measured = sum(1 for run in doc.runs if run.results and run.results.step_time_halves_ratio is not None)
    if not measured:
        return "No run reports its step time's halves (a trainer before this check, or under 4 measured steps).\n"
    if not found:
        return (f"Every one of the {measured} runs that report it was steady: its measured steps' second half was "
                "within 5 % of its first, or within their noise.\n")
    rows = [[name, why] for name, why in found]
    return (f"{len(found)} of {measured} runs were not steady: their tokens/s is of a machine still changing "
            "(raise training.steps or warmupSteps until none is listed).\n\n"
            + markdown_table(["run", "what changed"], rows, {"run", "what changed"}))


def scaling_markdown(analysis: Analysis) -> str:
    if not analysis.scaling:
        return "Not measurable: every strategy and precision ran at one scale only.\n"
    rows = []
    for row in analysis.scaling:
        baseline = row.scale == row.baseline_scale
        efficiency = "1 (baseline)" if baseline else fmt(row.efficiency, ".2f") + (
            "" if row.low is None else f" [{row.low:.2f}, {row.high:.2f}]")
        if row.refused:
            efficiency += f" ({row.refused})"
        rows.append([row.strategy, row.precision, row.scale, str(row.devices),
                     fmt(row.tokens_per_second_per_device, ",.0f"), efficiency])
    headers = ["strategy", "precision", "scale", "devices", "tokens/s per device", "efficiency [95 % interval]"]
    return markdown_table(headers, rows, {"strategy", "precision", "scale"})


def findings_markdown(analysis: Analysis) -> str:
    rows = [[f.claim, f.source, f.measured, f"**{VERDICTS[f.verdict]}**"] for f in analysis.findings]
    text = markdown_table(["claim", "source", "measured here", "verdict"], rows,
                          {"claim", "source", "measured here", "verdict"})
    for check in analysis.checks:
        text += f"\nCheck: {check.claim}: **{VERDICTS[check.verdict]}** ({check.measured}).\n"
    return text


def _spec_line(spec: dict[str, Any], name: str = "") -> str:
    model = spec.get("model") or {}
    training = spec.get("training") or {}
    parts = [f"model `{model.get('preset', 'tiny')}`"]
    for key, label in (("seqLen", "seq"), ("microBatchSize", "micro-batch"), ("gradAccum", "grad-accum"),
                       ("steps", "steps"), ("warmupSteps", "warm-up steps")):
        if key in training:
            parts.append(f"{label} {training[key]}")
    sweep = spec.get("sweep") or {}
    parts.append(f"repeats {sweep.get('repeats', 1)}")
    if sweep.get("repeats", 1) > 1:
        parts.append(f"rounds over every scale, each in an order shuffled with seed {seed_for(name, sweep.get('orderSeed'))}"
                     f" + its number, round k with training seed {training.get('seed', 1234)} + k − 1")
        parts.append(f"breakdown {sweep.get('breakdown', 'separate')}")
    cost = spec.get("cost") or {}
    prices = [f"{cost[key]} {cost.get('currency', 'USD')}/{label}" for key, label in
              (("gpuHour", "GPU-hour"), ("nodeHour", "node-hour")) if cost.get(key) is not None]
    if prices:
        parts.append("prices " + ", ".join(prices))
    return ", ".join(parts)


def breakdown_markdown(doc: ResultsDocument) -> str:
    """Where each configuration's mean step goes (docs/metrics.md, Step breakdown), its communication and
    its energy; configurations without a breakdown are left out."""
    rows = []
    for config in configurations(doc.runs):  # from the breakdown round's runs (else the repeats, breakdown inline)
        stats = [config.breakdown_stat(result(field)) for _, field in BREAKDOWN_PARTS]
        if any(stat is None for stat in stats):
            continue
        comm, hidden, sent, energy = (config.breakdown_stat(result(f)) for f in (
            "comm_seconds_mean", "comm_hidden_ratio", "comm_bytes_per_step", "energy_joules_per_million_tokens"))
        rows.append([config.name, config.scale.label, *(fmt_stat(stat, ".1f", 1e3) for stat in stats),
                     fmt_stat(comm, ".1f", 1e3), fmt_stat(hidden, ".0%"), fmt_stat(sent, ",.1f", 1 / MIB),
                     fmt_stat(energy, ",.0f")])
    if not rows:
        return "No run has a step breakdown (sweep.breakdown).\n"
    headers = ["configuration", "scale", *(f"{part} (ms)" for part, _ in BREAKDOWN_PARTS), "comm total (ms)",
               "comm hidden", "sent per step (MiB)", "J per 1M tokens"]
    return markdown_table(headers, rows, {"configuration", "scale"})


GB = 1e9


def network_markdown(doc: ResultsDocument) -> str:
    """Per configuration with communication: the bus bandwidth its steps achieved on its main collective kind
    beside what the collectives probe measured for the same messages on the same group, and the share; and
    what carried it (the transport NCCL used, the nodes the pods ran on: trainer/fabric.py), with a warning
    for each run that did not measure the fabric its scale asks for (fabric_warnings)."""
    rows = []
    for config in configurations(doc.runs):  # the probe runs with the breakdown: the breakdown round's runs
        achieved, probed, share = (config.breakdown_stat(result(f)) for f in (
            "bus_bandwidth_achieved", "bus_bandwidth_probed", "bus_bandwidth_share"))
        transports = sorted({run.results.transport for run in config.succeeded if run.results.transport})
        if achieved is None and not transports:
            continue
        kinds = sorted({run.results.bus_kind for run in config.breakdown_runs if run.results.bus_kind})
        used = sorted({run.results.nodes_used for run in config.breakdown_runs if run.results.nodes_used})
        rows.append([config.name, config.scale.label, ", ".join(kinds) or NO_VALUE, fmt_stat(achieved, ",.3f", 1 / GB),
                     fmt_stat(probed, ",.3f", 1 / GB), fmt_stat(share, ".0%"), ", ".join(transports) or NO_VALUE,
                     ", ".join(map(str, used)) or NO_VALUE])
    warnings = "".join(f"- **{warning}**\n" for warning in fabric_warnings(doc))
    if not rows:
        return ("No run measured its communication (a strategy with collectives, 2+ workers, --breakdown).\n"
                + (f"\n{warnings}" if warnings else ""))
    headers = ["configuration", "scale", "main kind", "achieved busbw (GB/s)", "probe busbw (GB/s)", "share",
               "transport", "nodes used"]
    table = markdown_table(headers, rows, {"configuration", "scale", "main kind", "transport", "nodes used"})
    return table + (f"\n{warnings}" if warnings else "")


def fabric_warnings(doc: ResultsDocument) -> list[str]:
    """Runs whose figures do not measure what their scale says (gpt2bench.status.fabric_warnings)."""
    return [warning for run in doc.runs for warning in run_fabric_warnings(run)]


JOULES_PER_WH = 3600.0


def cost_markdown(doc: ResultsDocument) -> str:
    """What a million tokens cost each configuration, in money (spec.cost, docs/analysis.md) and in energy
    (docs/metrics.md, Energy): mean ± spread over its succeeded repeats."""
    prices = Prices.from_spec(doc.spec)
    energy_metric = result("energy_joules_per_million_tokens")
    rows = []
    for config in configurations(doc.runs):
        hourly = config.stat(prices.hourly) if prices else None
        cost = config.stat(prices.per_million_tokens) if prices else None
        energy = config.stat(energy_metric)
        if hourly is None and cost is None and energy is None:
            continue
        sources = sorted({run.results.energy_source for run in config.succeeded if run.results.energy_source})
        rows.append([config.name, config.scale.label, fmt_stat(hourly, ",.2f"), fmt_stat(cost, ",.4f"),
                     fmt_stat(energy, ",.0f"), fmt_stat(energy, ",.2f", 1 / JOULES_PER_WH),
                     ", ".join(sources) or NO_VALUE])
    if not rows:
        reasons = sorted({run.results.energy_unavailable_reason for run in doc.runs
                          if run.results and run.results.energy_unavailable_reason})
        why = "; ".join(r.removeprefix("not measurable: ") for r in reasons) or "no run reports energy"
        return f"No prices (spec.cost) and no energy figure ({why}).\n"
    currency = prices.currency if prices else "USD"
    headers = ["configuration", "scale", f"{currency} per hour", f"{currency} per 1M tokens", "J per 1M tokens",
               "Wh per 1M tokens", "energy source"]
    return markdown_table(headers, rows, {"configuration", "scale", "energy source"})


def results_markdown(doc: ResultsDocument, plots: list[str], notes: list[str]) -> str:
    devices = {bool(r.devices_per_node) for r in doc.runs}
    kind = "GPU figures" if devices == {True} else "CPU figures" if devices == {False} else "CPU and GPU figures"
    lines = [f"# GPT2Benchmark `{doc.benchmark or '?'}`: results ({kind}, {hardware(doc.runs)})", ""]
    meta = [f"phase **{doc.phase}**"]
    meta += [f"namespace `{doc.namespace}`"] if doc.namespace else []
    meta += [f"started {doc.start_time}"] if doc.start_time else []
    meta += [f"finished {doc.completion_time}"] if doc.completion_time else []
    lines += ["; ".join(meta) + ".", ""]
    if doc.spec:
        lines += [_spec_line(doc.spec, doc.benchmark or "") + ".", ""]
    if doc.analysis:
        lines += ["## Recommendation", "", headline(doc.analysis), "", decisions_text(doc.analysis),
                  recommendations_markdown(doc.analysis),
                  "## Noise", "", "What one run's figure varies by, measured by this sweep's own repeats, per "
                  "scale (descriptive: every decision compares configurations within rounds, each pair with its "
                  "own noise; docs/analysis.md).", "",
                  noise_markdown(doc.analysis),
                  "## Rounds", "", rounds_line(doc), "", rounds_markdown(doc),
                  "## Steady state", "",
                  "Each run's measured steps, second half against first (docs/analysis.md, Steady state).", "",
                  steadiness_markdown(doc),
                  "## Scaling efficiency", "",
                  "Tokens/s per device ÷ the same strategy and precision at its smallest scale.", "",
                  scaling_markdown(doc.analysis),
                  "## Where the step time goes", "",
                  "Worker 0's mean step per configuration (mean ± spread over repeats), split so that the parts "
                  "add up to the step: exposed communication is the time the step waited for communication no "
                  "computation hid; *comm hidden* = 1 − exposed ÷ total (docs/metrics.md, Step breakdown).", "",
                  breakdown_markdown(doc),
                  "## Communication against the network", "",
                  "The bus bandwidth (nccl-tests' busbw) the steps achieved on the kind that moves the most bytes, "
                  "beside the collectives probe: the same kind and message size timed alone on the same group "
                  "after training (docs/metrics.md, Achieved and probed bus bandwidth). A share well below 100 % "
                  "means bandwidth is lost inside the steps (how messages are launched and queued, or compute "
                  "competing for the same cores or links), not for want of network.", "",
                  network_markdown(doc),
                  "## Cost and energy", "",
                  "What a million tokens cost each configuration: the price of what its pods hold "
                  "(spec.cost, docs/analysis.md) and the energy its devices drew (docs/metrics.md, Energy).", "",
                  cost_markdown(doc),
                  "## The papers' findings on this hardware", "", findings_markdown(doc.analysis)]
    lines += ["## Runs", "", results_table_markdown(doc)]
    counts: dict[str, int] = {}
    for run in doc.runs:
        counts[run.phase] = counts.get(run.phase, 0) + 1
    lines += [", ".join(f"{n} {phase}" for phase, n in counts.items()) + f" of {len(doc.runs)} runs.", ""]
    if repeated(doc):
        lines += ["Configurations: geometric mean ± the noise of one run (standard deviation of ln x) over their "
                  "succeeded rounds, and where each stands in its scale's race.", "",
                  configurations_markdown(configurations(doc.runs), race_cells(doc.analysis) if doc.analysis else None)]
    lines += [("Definitions: docs/metrics.md (tokens/s excludes warm-up steps; peak memory is the largest across "
               "ranks) and docs/analysis.md (scale, spread, margin, cost, scaling efficiency, verdicts)."), ""]
    if plots:
        lines += ["## Plots", ""] + [f"![{Path(plot).stem}]({plot})\n" for plot in plots]
    lines += [f"_{note}_\n" for note in notes]
    return "\n".join(lines).rstrip() + "\n"
