"""A decision in words a platform engineer reads in one pass: the same sentence in the terminal, results.md, the
CR status (`recommendations[].verdict`) and `kubectl get`. Short labels (`horovod bf16`: the scale is the line's
context), one error rate for everything (5 %, explained once where the report starts), no double negatives.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gpt2bench.objectives import OBJECTIVE_TABLE
from gpt2bench.report.noise import ALPHA, CONFIDENCE
from gpt2bench.specification.model import PRECISIONS, STRATEGIES
from gpt2bench.status import OBJECTIVES as WHAT
from gpt2bench.status import Recommendation

SIZE = re.compile(r"\d+x\d+g?")  # a run name's scale: nodes x devices (or processes) per node, g for GPUs
NEEDS = 3  # rounds a comparison needs (boundary.FIRST_LOOK)


def short(name: str | None, labels: Mapping[str, str] | None = None) -> str:
    """`horovod bf16` for a configuration's name (`<benchmark>-<strategy>-<precision>-<size>`, plan.run_name):
    from `labels` where given, else read from the name's last words; the name itself where it was shortened with
    a hash and cannot be read."""
    if name is None:
        return "?"
    if labels and name in labels:
        return labels[name]
    head, _, size = name.rpartition("-")
    head, _, precision = head.rpartition("-")
    if precision in PRECISIONS and SIZE.fullmatch(size):
        for strategy in sorted(STRATEGIES, key=len, reverse=True):  # ps-sharded before ps
            if head == strategy or head.endswith(f"-{strategy}"):
                return f"{strategy} {precision}"
    return name


def percent(share: float) -> str:
    """`5 %`, `2.5 %`: a share with the digits it needs, one at most."""
    text = f"{share:.1%}".replace(".0%", "%")
    return text.replace("%", " %")


def level(confidence: float | None) -> str:
    """`error rate ≤ 5 %`: what a decision's 95 % means, said as the chance of being wrong."""
    return f"error rate ≤ {percent(1 - (confidence or CONFIDENCE))}"


def near(value: float) -> str:
    """`1,300`, `790`: a figure to two significant digits, as "near" promises no more."""
    return f"{float(f'{value:.2g}'):,.0f}"


def duration(seconds: float) -> str:
    """`about 4 min`, `about 1 h 10 min`, `about 40 s`."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


def verdict(rec: Recommendation, labels: Mapping[str, str] | None = None, rounds: int | None = None,
            min_effect: float | None = None) -> str:
    """The decision in one line: `horovod bf16 is the fastest (error rate ≤ 5 %)`; a race's unstable
    configurations follow it."""
    return _decision(rec, labels, rounds, min_effect) + unstable(rec, labels)


def _decision(rec: Recommendation, labels: Mapping[str, str] | None, rounds: int | None,
              min_effect: float | None) -> str:
    what = WHAT.get(rec.objective, rec.objective)
    name = short(rec.run, labels) if rec.run else None
    of = " of the stable configurations" if rec.unstable else ""
    if rec.decision == "clear":
        return f"{name} is {what}{of} ({level(rec.confidence)})"
    if rec.decision == "equivalent":
        within = f"within {percent(min_effect)} of it" if min_effect else "within the smallest difference that matters"
        return f"{name} is {what}{of} or {within} ({level(rec.confidence)})"
    if rec.decision == "unstable":
        return f"no ranking: the runs of {_names(rec, labels)} fall into two speeds"
    if rec.decision == "only-candidate":
        return f"{name} is the only configuration measured"
    if rec.decision == "not-measurable":
        return f"not measurable: {rec.note or 'no succeeded run has this figure'}"
    if rec.decision == "needs-repeats":
        return f"not decided: a comparison needs {NEEDS} rounds or more (has {rec.measurements or 0})"
    among = ", ".join(short(c, labels) for c in rec.candidates or [])
    after = f"after {rounds} round{'s' if rounds != 1 else ''}" if rounds else "yet"
    text = f"not separated {after}: {what}{of} is among {among} ({level(rec.confidence)})"
    if rec.objective == "fastest" and rounds:
        text += f"; {more_rounds(rec, rounds)}"
    return text


def _names(rec: Recommendation, labels: Mapping[str, str] | None) -> str:
    return " and ".join(short(u.configuration, labels) for u in rec.unstable or [])


def unstable(rec: Recommendation, labels: Mapping[str, str] | None = None) -> str:
    """`; unstable, not ranked: horovod fp32 (6 runs near 1,100 tokens/s, 4 near 790: ...)`, or nothing."""
    if not rec.unstable:
        return ""
    each = "; ".join(f"{short(u.configuration, labels)} ({u.fast_runs} runs near {near(u.fast)} {rec.unit or ''}, "
                     f"{u.slow_runs} near {near(u.slow)})".replace(" ,", ",") for u in rec.unstable)
    return f"; unstable, not ranked: {each}; {WHERE_TO_LOOK}"


# Where the cause of two speeds usually is (docs/analysis.md, Unstable configurations).
WHERE_TO_LOOK = ("look at each run's step times and its ranks' CPU placement (results.md, Step breakdown; "
                 "docs/analysis.md, Unstable configurations)")


def more_rounds(rec: Recommendation, rounds: int) -> str:
    """`about 6 more rounds (≈ 3 min) would decide (sweep.maxRepeats: 12)`, or why that cannot be said."""
    if rec.rounds_needed is None:
        return "no number of rounds up to 50 would likely decide it (too close, or too noisy)"
    more = max(rec.rounds_needed - rounds, 1)
    costs = [f"≈ {duration(more * rec.round_seconds)}"] if rec.round_seconds else []
    costs += [f"{more * rec.round_cost:,.2f}"] if rec.round_cost else []
    cost = f" ({', '.join(costs)})" if costs else ""
    return (f"about {more} more round{'s' if more != 1 else ''}{cost} would decide (80 % chance, with "
            f"sweep.maxRepeats {rec.rounds_needed})")


def dropped(rec: Recommendation, labels: Mapping[str, str] | None = None) -> str | None:
    """`fsdp fp32 after round 3 (horovod bf16 +22 %), ...`: what the race dropped, when and behind what."""
    if not rec.dropped:
        return None
    return ", ".join(f"{short(d.configuration, labels)} after round {d.round} ({short(d.behind, labels)} "
                     f"{d.ratio - 1:+.0%})" for d in rec.dropped)


def explained(alpha: float = ALPHA) -> str:
    """The error rate, said once: what "(error rate ≤ 5 %)" means for every decision of a report, and what it
    assumes."""
    return (f"\"(error rate ≤ {percent(alpha)})\": each scale's race names a configuration the fastest (or within "
            f"sweep.minEffect of it) wrongly, or drops the fastest, in at most {percent(alpha)} of sweeps, however "
            "many rounds it looks at and rivals it compares, assuming each configuration's runs vary normally "
            "around one speed (a configuration whose runs fall into two speeds is flagged unstable and not ranked; "
            "two scales are two races, each with its own error rate). The other decisions (the objectives "
            f"{_others()}, and the papers' findings) are each a family whose decisions are all right "
            f"with probability at least {1 - alpha:.0%}. Intervals are labelled with their own coverage "
            "(docs/analysis.md).")


def _others() -> str:
    """The objectives the race does not decide, in the objectives' table order ("leanest, cheapest across scales,
    scalable and efficient")."""
    names = [f"{row.name} across scales" if row.ranking == "cost" else row.name  # per scale, cost is the race's
             for row in OBJECTIVE_TABLE if row.ranking != "race"]
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else "".join(names)
