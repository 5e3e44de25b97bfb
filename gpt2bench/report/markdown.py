"""results.md: the recommendation first, then the scaling efficiencies, the papers' findings, the runs, the
plots. Reads a `ResultsDocument` whose `analysis` is set (`analysis.analyze`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpt2bench.report.measures import BREAKDOWN_PARTS, Prices, configurations, hardware, result
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
from gpt2bench.status import Analysis, Recommendation, ResultsDocument
from gpt2bench.status import fabric_warnings as run_fabric_warnings

OBJECTIVE_ORDER = ("fastest", "leanest", "cheapest", "scalable", "efficient")
VERDICTS = {"holds": "holds", "does-not-hold": "does not hold",
            "inconclusive": "inconclusive (the interval crosses the claim's threshold)",
            "needs-repeats": "not decided: needs repeats ≥ 2", "not-measurable": "not measurable with this sweep"}
NEEDS_REPEATS = "not decided: needs repeats ≥ 2 (a single measurement per configuration has no noise estimate)"


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


def margin_text(rec: Recommendation) -> str:
    """`+7.2 % [+1.1 %, +13.6 %] (95 %)`: the top-ranked's margin over the runner-up and its interval."""
    if rec.margin is None:
        return NO_VALUE
    if rec.margin_low is None or rec.margin_high is None:
        return f"{rec.margin:+.1%}"
    return f"{rec.margin:+.1%} [{rec.margin_low:+.1%}, {rec.margin_high:+.1%}] ({rec.confidence:.0%})"


def decision_text(rec: Recommendation) -> str:
    if rec.decision == "clear":
        return f"clear: margin over {rec.runner_up} {margin_text(rec)}, beyond the noise"
    if rec.decision == "no-clear-winner":
        return (f"no clear winner: margin {margin_text(rec)} includes 0; within the noise: "
                f"{', '.join(rec.candidates or [])}")
    if rec.decision == "needs-repeats":
        return NEEDS_REPEATS
    if rec.decision == "only-candidate":
        return "only candidate"
    return f"not measurable: {rec.note}"


def headline(analysis: Analysis) -> str:
    rec = analysis.recommended
    if rec is None:
        return "No recommendation: no run succeeded."
    where = f"at the largest scale measured ({rec.scale})"
    if rec.winner:
        ahead = f", {rec.runner_up} {rec.runner_up_value:,.0f} tokens/s" if rec.runner_up else ""
        return (f"**Recommended {where}: {rec.winner}** ({rec.strategy}, {rec.precision}): fastest, "
                f"{value_text(rec.value, rec.unit)}{ahead}; {decision_text(rec)}.")
    if rec.decision == "no-clear-winner":
        return (f"**No clear winner {where}**: {', '.join(rec.candidates or [])} are within the noise of each other "
                f"(fastest mean {rec.run}, {value_text(rec.value, rec.unit)}; margin over {rec.runner_up} "
                f"{margin_text(rec)}).")
    return (f"**Not decided {where}**: every configuration was measured once, so the noise is unknown. Highest "
            f"single measurement: {rec.run}, {value_text(rec.value, rec.unit)}. Set spec.sweep.repeats to 2 or more.")


def _ordered(recs: list[Recommendation]) -> list[Recommendation]:
    scale_order = list(dict.fromkeys(r.scale for r in recs if r.scale is not None)) + [None]
    return sorted(recs, key=lambda r: (scale_order.index(r.scale), OBJECTIVE_ORDER.index(r.objective)))


def recommendations_markdown(analysis: Analysis) -> str:
    rows = [[rec.scale or "all scales", rec.objective, rec.winner or NO_VALUE, rec.run or NO_VALUE,
             value_text(rec.value, rec.unit),
             f"{rec.runner_up} ({value_text(rec.runner_up_value, rec.unit)})" if rec.runner_up else NO_VALUE,
             margin_text(rec), decision_text(rec)]
            for rec in _ordered(analysis.recommendations)]
    headers = ["scale", "objective", "recommended", "top-ranked", "value", "runner-up", "margin [interval]",
               "decision"]
    lines = [markdown_table(headers, rows, {"scale", "objective", "recommended", "top-ranked", "runner-up",
                                            "decision"})]
    excluded = {rec.scale or "all scales": rec.excluded for rec in analysis.recommendations if rec.excluded}
    lines += [f"Not compared at {scale} (did not succeed): {', '.join(names)}.\n" for scale, names in excluded.items()]
    return "\n".join(lines)


def recommendation_lines(analysis: Analysis) -> list[str]:
    """The terminal's short form: the headline, then one line per recommendation."""
    lines = [headline(analysis).replace("**", "")]
    for rec in _ordered(analysis.recommendations):
        pick = rec.winner or (f"top-ranked {rec.run}" if rec.run else NO_VALUE)
        lines.append(f"  {rec.scale or 'all scales'} {rec.objective}: {pick} "
                     f"{value_text(rec.value, rec.unit)} ({decision_text(rec)})")
    return lines


def noise_markdown(analysis: Analysis) -> str:
    """The sweep's own noise per figure, or why there is none."""
    if not analysis.noise:
        return ("Unknown: no configuration was measured twice, so nothing is decided (set spec.sweep.repeats to 2 "
                "or more).\n")
    rows = [[n.figure, f"±{n.cv:.1%}", str(n.df), str(n.configurations)] for n in analysis.noise]
    return markdown_table(["figure", "noise of one run (pooled CV)", "degrees of freedom", "configurations repeated"],
                          rows, {"figure"})


def scaling_markdown(analysis: Analysis) -> str:
    if not analysis.scaling:
        return "Not measurable: every strategy and precision ran at one scale only.\n"
    rows = []
    for row in analysis.scaling:
        baseline = row.scale == row.baseline_scale
        efficiency = "1 (baseline)" if baseline else fmt(row.efficiency, ".2f") + (
            "" if row.low is None else f" [{row.low:.2f}, {row.high:.2f}]")
        rows.append([row.strategy, row.precision, row.scale, str(row.devices),
                     fmt(row.tokens_per_second_per_device, ",.0f"), efficiency])
    headers = ["strategy", "precision", "scale", "devices", "tokens/s per device", "efficiency [95 % interval]"]
    return markdown_table(headers, rows, {"strategy", "precision", "scale"})


def findings_markdown(analysis: Analysis) -> str:
    rows = [[f.claim, f.source, f.measured, f"**{VERDICTS[f.verdict]}**"] for f in analysis.findings]
    return markdown_table(["claim", "source", "measured here", "verdict"], rows,
                          {"claim", "source", "measured here", "verdict"})


def _spec_line(spec: dict[str, Any]) -> str:
    model = spec.get("model") or {}
    training = spec.get("training") or {}
    parts = [f"model `{model.get('preset', 'tiny')}`"]
    for key, label in (("seqLen", "seq"), ("microBatchSize", "micro-batch"), ("gradAccum", "grad-accum"),
                       ("steps", "steps"), ("warmupSteps", "warm-up steps")):
        if key in training:
            parts.append(f"{label} {training[key]}")
    parts.append(f"repeats {(spec.get('sweep') or {}).get('repeats', 1)}")
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
    for config in configurations(doc.runs):
        stats = [config.stat(result(field)) for _, field in BREAKDOWN_PARTS]
        if any(stat is None for stat in stats):
            continue
        comm, hidden, sent, energy = (config.stat(result(f)) for f in (
            "comm_seconds_mean", "comm_hidden_ratio", "comm_bytes_per_step", "energy_joules_per_million_tokens"))
        rows.append([config.name, config.scale.label, *(fmt_stat(stat, ".1f", 1e3) for stat in stats),
                     fmt_stat(comm, ".1f", 1e3), fmt_stat(hidden, ".0%"), fmt_stat(sent, ",.1f", 1 / MIB),
                     fmt_stat(energy, ",.0f")])
    if not rows:
        return "No run has a step breakdown (trainer option --breakdown).\n"
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
    for config in configurations(doc.runs):
        achieved, probed, share = (config.stat(result(f)) for f in (
            "bus_bandwidth_achieved", "bus_bandwidth_probed", "bus_bandwidth_share"))
        transports = sorted({run.results.transport for run in config.succeeded if run.results.transport})
        if achieved is None and not transports:
            continue
        kinds = sorted({run.results.bus_kind for run in config.succeeded if run.results.bus_kind})
        used = sorted({run.results.nodes_used for run in config.succeeded if run.results.nodes_used})
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
        lines += [_spec_line(doc.spec) + ".", ""]
    if doc.analysis:
        lines += ["## Recommendation", "", headline(doc.analysis), "", recommendations_markdown(doc.analysis),
                  "## Noise", "", "What one run's figure varies by, measured by this sweep's own repeats "
                  "(docs/analysis.md): every margin and verdict above and below is decided against it.", "",
                  noise_markdown(doc.analysis),
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
        lines += ["Configurations: mean ± sample standard deviation over their succeeded repeats.", "",
                  configurations_markdown(configurations(doc.runs))]
    lines += [("Definitions: docs/metrics.md (tokens/s excludes warm-up steps; peak memory is the largest across "
               "ranks) and docs/analysis.md (scale, spread, margin, cost, scaling efficiency, verdicts)."), ""]
    if plots:
        lines += ["## Plots", ""] + [f"![{Path(plot).stem}]({plot})\n" for plot in plots]
    lines += [f"_{note}_\n" for note in notes]
    return "\n".join(lines).rstrip() + "\n"
