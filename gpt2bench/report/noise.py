"""The sweep's own noise, and the confidence interval of every ratio a decision rests on.

Model (docs/analysis.md, "Noise and intervals"): for one figure (tokens/s, peak memory, cost per token, ...)
a run measures its configuration's true value times a noise factor whose relative size is the same for every
configuration of the sweep: they ran on the same machine, model and steps. That relative size is estimated
from the repeats, pooled over configurations: the **pooled coefficient of variation**

    cv² = Σ_c Σ_i (x_ci / x̄_c − 1)² / df,    df = Σ_c (n_c − 1)

(one-way ANOVA's mean square error, on relative deviations). A configuration measured once adds nothing to
it; with no configuration measured twice df = 0 and there is no interval: "not decided: needs repeats ≥ 2".

The interval of a ratio of two configurations' means x̄_a / x̄_b is t-based on the log scale (first order, the
delta method): ln(x̄_a / x̄_b) ± t(1 − α/2, df) · cv · √(1/n_a + 1/n_b). Products and quotients of more means
(an efficiency over another) add their 1/n terms. Pure functions; scipy gives the t quantiles.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from scipy.stats import t as student_t

CONFIDENCE = 0.95  # of every interval a decision uses


@dataclass(frozen=True)
class Noise:
    """The pooled coefficient of variation of one figure over a sweep's configurations, and its degrees of
    freedom (0: no configuration was measured twice, so the noise is unknown)."""

    cv: float
    df: int

    @classmethod
    def pooled(cls, groups: Iterable[Sequence[float]]) -> Noise:
        squares, df = 0.0, 0
        for values in groups:
            if len(values) < 2:
                continue
            mean = statistics.fmean(values)
            squares += sum((x / mean - 1) ** 2 for x in values)
            df += len(values) - 1
        return cls(math.sqrt(squares / df) if df else 0.0, df)

    @property
    def known(self) -> bool:
        return self.df > 0



@dataclass(frozen=True)
class Interval:
    """A ratio of means with its confidence interval: `estimate` in [`low`, `high`] at `confidence`."""

    estimate: float
    low: float
    high: float
    confidence: float

    def side(self, threshold: float) -> str:
        """Where the interval lies against `threshold`: "above", "below", or "across" it (the noise allows
        either side; an interval touching the threshold counts as across)."""
        if self.low > threshold:
            return "above"
        if self.high < threshold:
            return "below"
        return "across"

    def as_change(self) -> str:
        """`+7.2 % [+1.1 %, +13.6 %]`: the ratio as a relative change, with its interval."""
        return f"{self.estimate - 1:+.1%} [{self.low - 1:+.1%}, {self.high - 1:+.1%}]"


def t_quantile(confidence: float, df: int) -> float:
    """Two-sided Student t quantile: t(1 − α/2, df) for α = 1 − confidence."""
    return float(student_t.ppf(1 - (1 - confidence) / 2, df))


def ratio_interval(numerator: Sequence[Sequence[float]], denominator: Sequence[Sequence[float]], noise: Noise,
                   confidence: float = CONFIDENCE) -> Interval | None:
    """Interval of Π mean(numerator groups) ÷ Π mean(denominator groups) (each group: one configuration's
    repeats), or None when the noise is unknown. One group on each side is the plain ratio x̄_a / x̄_b."""
    groups = [*numerator, *denominator]
    if not noise.known or any(not values or min(values) <= 0 for values in groups):
        return None
    log_ratio = math.log(product_of_means(numerator)) - math.log(product_of_means(denominator))
    half_width = t_quantile(confidence, noise.df) * noise.cv * math.sqrt(sum(1 / len(v) for v in groups))
    return Interval(math.exp(log_ratio), math.exp(log_ratio - half_width), math.exp(log_ratio + half_width),
                    confidence)


def between_sweeps(a: Sequence[float], a_noise: Noise, b: Sequence[float], b_noise: Noise,
                   confidence: float = CONFIDENCE) -> Interval | None:
    """Interval of mean(b) ÷ mean(a) for one configuration measured in two sweeps (two machines, two clusters),
    each with its own noise: se² = cv_a²/n_a + cv_b²/n_b on the log scale, with Welch–Satterthwaite's degrees
    of freedom. None when either sweep's noise is unknown."""
    if not (a_noise.known and b_noise.known) or not a or not b or min(*a, *b) <= 0:
        return None
    var_a, var_b = a_noise.cv**2 / len(a), b_noise.cv**2 / len(b)
    if var_a + var_b == 0:
        ratio = statistics.fmean(b) / statistics.fmean(a)
        return Interval(ratio, ratio, ratio, confidence)
    df = (var_a + var_b) ** 2 / (var_a**2 / a_noise.df + var_b**2 / b_noise.df)
    half_width = float(student_t.ppf(1 - (1 - confidence) / 2, df)) * math.sqrt(var_a + var_b)
    log_ratio = math.log(statistics.fmean(b) / statistics.fmean(a))
    return Interval(math.exp(log_ratio), math.exp(log_ratio - half_width), math.exp(log_ratio + half_width),
                    confidence)


def product_of_means(groups: Sequence[Sequence[float]]) -> float:
    """Π mean(group): the point estimate `ratio_interval` puts an interval around (numerator over denominator)."""
    return math.prod(statistics.fmean(values) for values in groups)


def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval | None:
    """Interval of the mean of one sample on the linear scale (x̄ ± t · s / √n), for figures that are not
    ratios (the loss gap); None below 2 values."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    half_width = t_quantile(confidence, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return Interval(mean, mean - half_width, mean + half_width, confidence)


def family_confidence(comparisons: int, confidence: float = CONFIDENCE) -> float:
    """Bonferroni: each of m comparisons at 1 − α/m, so that a claim checked m times (once per strategy, say)
    is wrongly decided with probability at most α, not m · α."""
    return 1 - (1 - confidence) / max(1, comparisons)
