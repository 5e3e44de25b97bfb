"""A decision in words a platform engineer reads in one pass: the same sentence in the terminal, results.md, the
CR status (`recommendations[].verdict`) and `kubectl get`. Short labels (`horovod bf16`: the scale is the line's
context), one level for everything (95 %, explained once where the report starts), no double negatives.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gpt2bench.spec.model import PRECISIONS, STRATEGIES
from gpt2bench.status import Recommendation

SIZE = re.compile(r"\d+x\d+g?")  # a run name's scale: nodes x devices (or processes) per node, g for GPUs
WHAT = {"fastest": "the fastest", "leanest": "the leanest (least peak memory)", "cheapest": "the cheapest per token",
        "scalable": "the best scaling", "efficient": "the most energy-efficient"}
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
    return percent(confidence or 0.95)


def duration(seconds: float) -> str:
    """`about 4 min`, `about 1 h 10 min`, `about 40 s`."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


def verdict(rec: Recommendation, labels: Mapping[str, str] | None = None, rounds: int | None = None,
            min_effect: float | None = None) -> str:
    """The decision in one line: `horovod bf16 is the fastest (95 %)`."""
    what = WHAT.get(rec.objective, rec.objective)
    name = short(rec.run, labels) if rec.run else None
    if rec.decision == "clear":
        return f"{name} is {what} ({level(rec.confidence)})"
    if rec.decision == "equivalent":
        within = f"within {percent(min_effect)} of it" if min_effect else "within the smallest difference that matters"
        return f"{name} is {what} or {within} ({level(rec.confidence)})"
    if rec.decision == "only-candidate":
        return f"{name} is the only configuration measured"
    if rec.decision == "not-measurable":
        return f"not measurable: {rec.note or 'no succeeded run has this figure'}"
    if rec.decision == "needs-repeats":
        return f"not decided: a comparison needs {NEEDS} rounds or more (has {rec.measurements or 0})"
    among = ", ".join(short(c, labels) for c in rec.candidates or [])
    after = f"after {rounds} round{'s' if rounds != 1 else ''}" if rounds else "yet"
    text = f"not separated {after}: {what} is among {among} ({level(rec.confidence)})"
    if rec.objective == "fastest" and rounds:
        text += f"; {more_rounds(rec, rounds)}"
    return text


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


def explained(alpha: float = 0.05) -> str:
    """The level, said once: what 95 % means for every decision of a report."""
    return (f"Every answer below holds with probability at least {1 - alpha:.0%}: a race names a configuration "
            f"the fastest (or within sweep.minEffect of it) wrongly, or drops the fastest, in at most {alpha:.0%} "
            "of sweeps, however many rounds it looks at and rivals it compares; the other decisions (leanest, "
            "cheapest across scales, scaling, energy, the papers' findings) are each a family whose decisions are "
            f"all right with probability at least {1 - alpha:.0%} (docs/analysis.md).")
