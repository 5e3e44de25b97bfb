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
    n = values.shape[-1]
    index = np.arange(n)
    for k in range(MIN_SIDE, n - MIN_SIDE + 1):  # the low side: the k smallest
        valid = count - k >= MIN_SIDE
        if not valid.any():
            continue
        low = np.where(index < k, ordered, np.nan)
        high = np.where((index >= k) & (index < count[..., None]), ordered, np.nan)
        with np.errstate(invalid="ignore"), _quiet():
            spread = np.maximum(np.nanstd(low, axis=-1, ddof=1), np.nanstd(high, axis=-1, ddof=1))
        gap = np.where(valid, np.take(ordered, k, axis=-1) - np.take(ordered, k - 1, axis=-1), 0.0)
        gap = np.nan_to_num(gap)
        ok = valid & (gap >= GAP) & (gap >= RATIO * spread) & (gap > widest)
        middle = (np.take(ordered, k, axis=-1) + np.take(ordered, k - 1, axis=-1)) / 2
        found |= ok
        threshold = np.where(ok, middle, threshold)
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
