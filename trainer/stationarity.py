"""Is a run's step time steady? Its measured steps' first half against their second half.

A run that is still warming up (caches, allocator, the machine's clock, another tenant leaving) has a slower
first half: its tokens/s then understates the steady state, and the report says so for that run
(docs/analysis.md, Steady state). The figure is the ratio of the halves' geometric mean step times, second ÷
first, with a 95 % Welch interval on the log scale (steps are treated as independent; neighbouring steps are
not quite, so the interval is a first-order guide). Pure: used by the trainer's summary.
"""

from __future__ import annotations

import math
import statistics

from scipy.special import stdtrit  # Student t quantile

CONFIDENCE = 0.95
MIN_STEPS = 4  # two steps per half at least


def halves_ratio(step_seconds: list[float]) -> dict[str, float | None]:
    """`step_time_halves_ratio` (second half ÷ first half, geometric means) with its interval's `_low`/`_high`;
    None for all three below MIN_STEPS measured steps or a step time ≤ 0. An odd middle step is left out."""
    none = {"step_time_halves_ratio": None, "step_time_halves_low": None, "step_time_halves_high": None}
    if len(step_seconds) < MIN_STEPS or min(step_seconds) <= 0:
        return none
    half = len(step_seconds) // 2
    first = [math.log(s) for s in step_seconds[:half]]
    second = [math.log(s) for s in step_seconds[-half:]]
    center = statistics.fmean(second) - statistics.fmean(first)
    var_first, var_second = statistics.variance(first) / half, statistics.variance(second) / half
    se2 = var_first + var_second
    if se2 == 0:
        low = high = center
    else:
        df = se2**2 / ((var_first**2 + var_second**2) / (half - 1))
        spread = float(stdtrit(df, 1 - (1 - CONFIDENCE) / 2)) * math.sqrt(se2)
        low, high = center - spread, center + spread
    return {"step_time_halves_ratio": math.exp(center), "step_time_halves_low": math.exp(low),
            "step_time_halves_high": math.exp(high)}
