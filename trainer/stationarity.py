"""Is a run's step time steady? Its measured steps' first half against their second half.

A run that is still warming up (caches, allocator, the machine's clock, another tenant leaving) has a slower
first half: its tokens/s then understates the steady state, and the report says so for that run
(docs/analysis.md, Steady state). The figure is the ratio of the halves' geometric mean step times, second ÷
first, with a 95 % Welch interval on the log scale (steps are treated as independent; neighbouring steps are
not quite, so the interval is a first-order guide). Pure: used by the trainer's summary.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.special import stdtrit  # Student t quantile

CONFIDENCE = 0.95
MIN_STEPS = 4  # two steps per half at least


def halves_ratio(step_seconds: Any) -> dict[str, float | None]:
    """`step_time_halves_ratio` (second half ÷ first half, geometric means) with its interval's `_low`/`_high`;
    None for all three below MIN_STEPS measured steps or a step time ≤ 0. An odd middle step is left out.
    `step_seconds`: the measured steps' times in order, as a list or as the trainer's spilled `StepTimes` (read
    back a chunk at a time: memory does not grow with the steps)."""
    none = {"step_time_halves_ratio": None, "step_time_halves_low": None, "step_time_halves_high": None}
    if step_seconds is None:
        return none
    if isinstance(step_seconds, list):
        count, chunks = len(step_seconds), [np.asarray(step_seconds, dtype=float)]
    else:  # aggregates.StepTimes
        count, chunks = step_seconds.count, step_seconds.values()
    if count < MIN_STEPS:
        return none
    half = count // 2
    sums = {"first": [0.0, 0.0], "second": [0.0, 0.0]}  # Σ ln t, Σ (ln t)²
    position = 0
    for chunk in chunks:
        if chunk.size and chunk.min() <= 0:
            return none
        logs = np.log(chunk)
        index = np.arange(position, position + chunk.size)
        for name, mask in (("first", index < half), ("second", index >= count - half)):
            sums[name][0] += float(logs[mask].sum())
            sums[name][1] += float((logs[mask] ** 2).sum())
        position += chunk.size
    means = {name: total / half for name, (total, _) in sums.items()}
    variances = {name: max(squares - half * means[name] ** 2, 0.0) / (half - 1)
                 for name, (_, squares) in sums.items()}
    center = means["second"] - means["first"]
    var_first, var_second = variances["first"] / half, variances["second"] / half
    se2 = var_first + var_second
    if se2 == 0:
        low = high = center
    else:
        df = se2**2 / ((var_first**2 + var_second**2) / (half - 1))
        spread = float(stdtrit(df, 1 - (1 - CONFIDENCE) / 2)) * math.sqrt(se2)
        low, high = center - spread, center + spread
    return {"step_time_halves_ratio": math.exp(center), "step_time_halves_low": math.exp(low),
            "step_time_halves_high": math.exp(high)}
