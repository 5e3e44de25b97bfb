"""The decision objectives a report recommends for: one row each, in the order every report shows them.

The status's enum (gpt2bench.status), the decisions (gpt2bench.report.analysis) and the verdicts' words
(gpt2bench.report.verdicts) come from this table; each objective is documented by its row in docs/analysis.md
(The N objectives). An objective ranked `per scale` needs nothing else: each scale's configurations are ranked
by the run figure it names, in a family of decisions of its own (docs/analysis.md, Families). Adding one:
docs/design.md, Adding an objective.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# How an objective is decided: `per scale` ranks each scale's configurations by `figure`; the others are procedures
# of their own in gpt2bench.report.analysis: `race` (fastest: the selection race), `cost` (cheapest: the race's
# answer in cost, and one decision across scales), `scaling` (scalable: efficiency over a baseline scale), `energy`
# (efficient: per scale, one not-measurable recommendation with the trainer's reason where no run has energy).
Ranking = Literal["per scale", "race", "cost", "scaling", "energy"]


@dataclass(frozen=True)
class Objective:
    name: str
    # The figure it ranks: a run's result (a RunResults field of gpt2bench.status, snake_case: `per scale` ranks by
    # it), or, for a procedure of its own, the figure it derives (docs/analysis.md's words for it).
    figure: str
    higher_is_better: bool
    unit: str  # of the recommendation's value (cheapest's is prefixed with the spec's currency)
    wording: str  # what a verdict calls the top-ranked: "ps fp32 is <wording>"
    ranking: Ranking = "per scale"
    # Rank only configurations whose ranks had equal threads and cores each (figures that depend on them).
    equal_resources: bool = False


OBJECTIVE_TABLE: tuple[Objective, ...] = (
    Objective("fastest", "tokens_per_second", True, "tokens/s", "the fastest", "race", equal_resources=True),
    Objective("leanest", "peak_memory_bytes", False, "bytes", "the leanest (least peak memory)"),
    Objective("cheapest", "cost per 1 M tokens", False, "per 1M tokens", "the cheapest per token", "cost",
              equal_resources=True),
    Objective("scalable", "scaling efficiency", True, "ratio", "the best scaling", "scaling"),
    Objective("efficient", "energy_joules_per_million_tokens", False, "J per 1M tokens", "the most energy-efficient",
              "energy", equal_resources=True),
)

OBJECTIVE_NAMES: tuple[str, ...] = tuple(objective.name for objective in OBJECTIVE_TABLE)
_BY_NAME = {objective.name: objective for objective in OBJECTIVE_TABLE}


def objective(name: str) -> Objective:
    """The row of an objective; KeyError naming the known ones for any other name."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown objective {name!r}; known: {', '.join(OBJECTIVE_NAMES)}") from None


def per_scale() -> tuple[Objective, ...]:
    """The objectives ranked per scale by their figure alone, in table order."""
    return tuple(o for o in OBJECTIVE_TABLE if o.ranking == "per scale")
