"""`gpt2bench compare A B`: two results folders side by side (two clusters, two GPU types, before and after a
driver upgrade). Configurations are matched by strategy, precision and scale (run names carry the benchmark's
name, so they differ); B ÷ A says how B compares, with its confidence interval from both sweeps' own noise, and
whether the tokens/s difference is beyond that noise (the interval excludes 1: docs/analysis.md). Those verdicts
are decided together (Holm over the matched configurations), so that naming one wrongly stays under 5 %.

    gpt2bench compare results/a100 results/h100 [--output compare.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from gpt2bench.files import write_atomic
from gpt2bench.report.analysis import analyze
from gpt2bench.report.cli import DocumentError, load_folder
from gpt2bench.report.markdown import NEEDS_REPEATS, VERDICTS, value_text
from gpt2bench.report.measures import (
    Configuration,
    Metric,
    configurations,
    hardware,
    peak_memory,
    tokens_per_second,
    tokens_per_second_per_device,
)
from gpt2bench.report.noise import CONFIDENCE, Contrast, Interval, between_sweeps, holm
from gpt2bench.report.table import MIB, NO_VALUE, fmt_stat, markdown_table
from gpt2bench.status import Analysis, Recommendation, ResultsDocument

# header, figure, format, scale
FIGURES: list[tuple[str, Metric, str, float]] = [
    ("tokens/s", tokens_per_second, ",.0f", 1.0),
    ("per device", tokens_per_second_per_device, ",.0f", 1.0),
    ("peak mem (MiB)", peak_memory, ",.1f", 1 / MIB),
]


def beyond_noise(interval: Interval | None) -> str:
    """The report's rule: B differs from A when the interval of B ÷ A lies wholly on one side of 1."""
    if interval is None:
        return NEEDS_REPEATS
    side = interval.side(1.0)
    level = "" if interval.confidence == CONFIDENCE else f" (at {interval.confidence:.2%}, Holm)"
    if side == "across":
        return f"no (within the noise){level}"
    return f"yes: B {'higher' if side == 'above' else 'lower'}{level}"


def _key(config: Configuration) -> tuple[str, str, str]:
    return config.strategy, config.precision, config.scale.label


def contrast(mine: Configuration, other: Configuration, metric: Metric) -> Contrast | None:
    """B ÷ A of one configuration's figure, each side with its own noise in its own sweep (3 runs or more each)."""
    return between_sweeps(mine.sample(metric), other.sample(metric))


def figures_markdown(a: list[Configuration], b: list[Configuration]) -> str:
    theirs = {_key(c): c for c in b}
    matched = [(mine, theirs[_key(mine)]) for mine in a if _key(mine) in theirs]
    throughput = [contrast(mine, other, tokens_per_second) for mine, other in matched]
    tested = [i for i, c in enumerate(throughput) if c is not None]
    levels = dict(zip(tested, holm([throughput[i].p_value() for i in tested])))
    headers = ["configuration", "scale"]
    for header, *_ in FIGURES:
        headers += [f"{header} A", f"{header} B", "B ÷ A [95 % interval]"]
    headers.append("tokens/s beyond noise")
    rows = []
    for index, (mine, other) in enumerate(matched):
        row = [mine.label, mine.scale.label]
        for header, metric, spec, scale in FIGURES:
            found = contrast(mine, other, metric)
            row += [fmt_stat(mine.stat(metric), spec, scale), fmt_stat(other.stat(metric), spec, scale),
                    _ratio_text(mine.values(metric), other.values(metric), found.interval() if found else None)]
        measured = mine.values(tokens_per_second) and other.values(tokens_per_second)
        decided = throughput[index].interval(levels[index]) if index in levels else None
        row.append(beyond_noise(decided) if measured else NO_VALUE)
        rows.append(row)
    text = markdown_table(headers, rows, {"configuration", "scale", "tokens/s beyond noise"})
    for side, configs, others in (("A", a, {_key(c) for c in b}), ("B", b, {_key(c) for c in a})):
        alone = [f"{c.label} {c.scale.label}" for c in configs if _key(c) not in others]
        if alone:
            text += f"\nOnly in {side}: {', '.join(alone)}.\n"
    return text


def _ratio_text(a: list[float], b: list[float], interval: Interval | None) -> str:
    if not a or not b:
        return NO_VALUE
    if interval is None:
        return f"{statistics.fmean(b) / statistics.fmean(a):.2f}"
    return f"{interval.estimate:.2f} [{interval.low:.2f}, {interval.high:.2f}]"


def _pick(rec: Recommendation | None) -> str:
    """One side's recommendation as the report decides it: a winner only when the decision is clear."""
    if rec is None:
        return NO_VALUE
    if rec.strategy is None:
        return f"not measurable: {rec.note}"
    if rec.decision in ("clear", "equivalent", "only-candidate"):
        return f"{rec.verdict}: {value_text(rec.value, rec.unit)}"
    if rec.decision == "no-clear-winner":
        return rec.verdict or f"the best is among {', '.join(rec.candidates or [])}"
    return f"{NEEDS_REPEATS}; top-ranked {rec.strategy}-{rec.precision} {value_text(rec.value, rec.unit)}"


def recommendations_markdown(a: Analysis, b: Analysis) -> str:
    keyed = [{(r.objective, r.scale, r.per_rank): r for r in side.recommendations} for side in (a, b)]
    keys = list(dict.fromkeys([*keyed[0], *keyed[1]]))
    rows = [[(scale or "all scales") + (f" ({per_rank})" if per_rank else ""), objective,
             _pick(keyed[0].get((objective, scale, per_rank))), _pick(keyed[1].get((objective, scale, per_rank)))]
            for objective, scale, per_rank in keys]
    return markdown_table(["scale", "objective", "A", "B"], rows, {"scale", "objective", "A", "B"})


def findings_markdown(a: Analysis, b: Analysis) -> str:
    theirs = {f.id: f for f in b.findings}
    rows = []
    for mine in a.findings:
        other = theirs.get(mine.id)
        rows.append([mine.claim, f"**{VERDICTS[mine.verdict]}**: {mine.measured}",
                     f"**{VERDICTS[other.verdict]}**: {other.measured}" if other else NO_VALUE])
    return markdown_table(["claim", "A", "B"], rows, {"claim", "A", "B"})


def compare_markdown(a: ResultsDocument, b: ResultsDocument, a_label: str, b_label: str) -> str:
    analyses = [doc.analysis or analyze(doc.runs, doc.spec) for doc in (a, b)]
    lines = [f"# Compare A `{a_label}` with B `{b_label}`", ""]
    for side, doc, label in (("A", a, a_label), ("B", b, b_label)):
        lines.append(f"- {side}: `{label}`: benchmark `{doc.benchmark or '?'}`, phase {doc.phase}, on "
                     f"{hardware(doc.runs)}" + (f", finished {doc.completion_time}" if doc.completion_time else ""))
    lines += ["", "## Figures (configurations in both; mean ± sample std over repeats)", "",
              figures_markdown(configurations(a.runs), configurations(b.runs)),
              "## Recommendations", "", recommendations_markdown(*analyses),
              "## The papers' findings", "", findings_markdown(*analyses)]
    return "\n".join(lines).rstrip() + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpt2bench compare",
        description="Put two benchmarks' results side by side: two results folders (from `gpt2bench run`, or "
        "`gpt2bench report --cluster NAME --output DIR`).")
    parser.add_argument("a", metavar="A", help="results folder A (holds results.json)")
    parser.add_argument("b", metavar="B", help="results folder B")
    parser.add_argument("--output", "-o", metavar="FILE", help="also write the comparison to FILE (markdown)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    docs = []
    for side, folder in (("A", args.a), ("B", args.b)):
        try:
            docs.append(load_folder(Path(folder)))
        except DocumentError as exc:
            print(f"gpt2bench compare: {side}: {exc}", file=sys.stderr)
            return 2
    text = compare_markdown(docs[0], docs[1], args.a, args.b)
    sys.stdout.write(text)
    if args.output:
        write_atomic(args.output, text)
    return 0
