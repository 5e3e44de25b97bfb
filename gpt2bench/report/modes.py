"""Two speeds: a configuration whose runs fall into two groups far apart (full speed, or about 30 % slower) breaks
the selection race's assumption of one normal noise per configuration. Such a configuration is **unstable**: the
race sets it aside instead of ranking it (docs/analysis.md, Unstable configurations). Pure numpy, vectorized over
any leading axes, so the same test runs inside the simulated races and in one sweep's report.

A configuration's runs are first freed of each round's shared drift: its ln figure minus its own mean, minus the
mean over the other configurations of that round of theirs (each centred on its own mean, so that a rival dropped
mid-race does not shift the reference). Sorted, these residuals split into a low and a high side at some gap; the
runs fall into two speeds where, for some split with at least MIN_SIDE runs on each side,

- the gap between the sides is at least GAP (ln 1.15: 15 %), and
- the gap is at least RATIO times the larger standard deviation inside a side.

Measured by tests/test_modes.py and benchmarks/bench_race.py: at 10 runs, a configuration at full speed or 30 %
slower (half the time, 3 % noise inside a speed) is flagged in most sweeps, and a normal one with 8 % noise in
well under 1 %.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

GAP = math.log(1.15)  # the smallest gap between the two speeds (ln of the ratio)
RATIO = 4.0  # the gap over the larger spread inside a side
MIN_SIDE = 3  # runs on each side
MIN_RUNS = 2 * MIN_SIDE


def _quiet() -> warnings.catch_warnings:
    """numpy warns on the mean or spread of an all-NaN slice (a configuration with no runs yet): expected here."""
    return warnings.catch_warnings(action="ignore", category=RuntimeWarning)


def residuals(history: np.ndarray) -> np.ndarray:
    """`history` (... × rounds × configurations, ln figures, NaN: not run): each run's residual after its
    configuration's own mean and the round's drift estimated from the other configurations of the round."""
    with np.errstate(invalid="ignore"), _quiet():
        centred = history - np.nanmean(history, axis=-2, keepdims=True)
    present = ~np.isnan(centred)
    filled = np.where(present, centred, 0.0)
    others = present.sum(axis=-1, keepdims=True) - present
    with np.errstate(invalid="ignore", divide="ignore"):
        drift = np.where(others > 0, (filled.sum(axis=-1, keepdims=True) - filled) / np.maximum(others, 1), 0.0)
    return np.where(present, centred - drift, np.nan)


def split(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Over the last axis (NaN: no run): whether the values fall into two speeds, and the threshold between them
    (the middle of the widest qualifying gap; NaN where none qualifies). Values above it are the fast side."""
    ordered = np.sort(values, axis=-1)  # NaN last
    count = (~np.isnan(values)).sum(axis=-1)
    shape = values.shape[:-1]
    found, threshold, widest = np.zeros(shape, bool), np.full(shape, np.nan), np.zeros(shape)
    # Each side's spread from running sums of the sorted values and their squares: O(1) per split, where a
    # spread per side and split was O(runs) (the race asks this of every draw of every round). The values are
    # residuals centred on 0, so the sums lose nothing that matters to the comparisons below.
    filled = np.nan_to_num(ordered)
    total, squares = np.cumsum(filled, axis=-1), np.cumsum(filled * filled, axis=-1)
    last = np.maximum(count - 1, 0)[..., None]
    all_sum, all_squares = np.take_along_axis(total, last, -1)[..., 0], np.take_along_axis(squares, last, -1)[..., 0]
    for k in range(MIN_SIDE, values.shape[-1] - MIN_SIDE + 1):  # the low side: the k smallest
        high_count = count - k
        valid = high_count >= MIN_SIDE
        if not valid.any():
            continue
        low_sum, low_squares = total[..., k - 1], squares[..., k - 1]
        high_sum, high_squares = all_sum - low_sum, all_squares - low_squares
        sides = np.maximum(high_count, 2)  # only valid splits are read: this keeps the others finite
        low_variance = (low_squares - low_sum * low_sum / k) / (k - 1)
        high_variance = (high_squares - high_sum * high_sum / sides) / (sides - 1)
        spread = np.sqrt(np.maximum(np.maximum(low_variance, high_variance), 0.0))
        gap = np.where(valid, np.nan_to_num(ordered[..., k] - ordered[..., k - 1]), 0.0)
        ok = valid & (gap >= GAP) & (gap >= RATIO * spread) & (gap > widest)
        found |= ok
        threshold = np.where(ok, (ordered[..., k] + ordered[..., k - 1]) / 2, threshold)
        widest = np.where(ok, gap, widest)
    return found, threshold


def unstable(history: np.ndarray) -> np.ndarray:
    """`history` (... × rounds × configurations): which configurations' runs fall into two speeds. The split is
    found on the residuals; it is the configuration's own where its own figures, grouped by it, are at least GAP
    apart on average (with two configurations each one's residuals mirror the other's: the split belongs to the
    one whose figures really moved)."""
    runs = np.moveaxis(history, -1, -2)  # ... × configurations × rounds
    residual = np.moveaxis(residuals(history), -1, -2)
    found, threshold = split(residual)
    fast = residual > threshold[..., None]
    slow = ~np.isnan(runs) & ~fast
    with np.errstate(invalid="ignore", divide="ignore"):
        apart = (np.where(fast, runs, 0.0).sum(-1) / fast.sum(-1)) - (np.where(slow, runs, 0.0).sum(-1) / slow.sum(-1))
    return found & (np.nan_to_num(apart) >= GAP)
