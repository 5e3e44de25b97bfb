"""How much one run's figure varies, and the confidence interval of every ratio a decision rests on.
Definitions: docs/analysis.md, "Noise and intervals".

Model: a run measures its configuration's true value times a noise factor, exp(ε) with ε ~ N(0, σ_c²) (each
configuration its own σ_c), plus a drift that every run of a round shares. Every ratio is taken on the log scale:
a configuration's figure is summarised by the mean of its logs (its geometric mean) and its noise by the
standard deviation of its logs (≈ the coefficient of variation).

A ratio of configurations (`ratio`) is compared **within rounds** wherever its configurations share at least
MIN_ROUNDS rounds: the mean of the per-round log ratios, in which each round's drift cancels, with the standard
error of those per-round values (n − 1 degrees of freedom; each comparison its own variance, so unequal noise is
handled exactly). Otherwise it is **unpaired**: each configuration's own variance (at least MIN_ROUNDS runs each,
drift included) and Welch–Satterthwaite's degrees of freedom. Fewer measurements decide nothing: a variance with
one degree of freedom is not trusted. Every value must be > 0: a ratio of a 0 (an energy counter that never
advanced) is not a measurement, and `ValueError` says so.

`estimate` describes the sweep's noise for the report (per scale, per configuration, and how much the rounds
explain); no decision rests on its pooled figures. Pure functions; scipy gives the t and F distributions.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from scipy.special import fdtrc, stdtr, stdtrit  # F survival, Student t cdf and quantile (fast ufuncs)

ALPHA = 0.05  # the error rate of every race and every family of decisions: the one place it is set (docs/analysis.md)
CONFIDENCE = 1 - ALPHA
FAR_NOISIER = 0.05  # one-sided level of the F test that lists a configuration as far noisier (descriptive only)
MIN_ROUNDS = 3  # measurements a variance needs (2 degrees of freedom) before anything is decided on it


def logs(values: Iterable[float], what: str = "a figure") -> list[float]:
    """ln of every value; a value ≤ 0 is refused (ValueError naming it): no ratio or noise is defined there."""
    found = []
    for value in values:
        if not value > 0:
            raise ValueError(f"{what} is {value}: ratios and noise need values > 0 (0 is not a measurement)")
        found.append(math.log(value))
    return found


def geometric_mean(values: Sequence[float]) -> float:
    """exp(mean ln x); values all alike give that value exactly (no rounding through exp and log)."""
    if values and all(v == values[0] for v in values) and values[0] > 0:
        return float(values[0])
    return math.exp(statistics.fmean(logs(values)))


@dataclass(frozen=True)
class Sample:
    """One configuration's repeats of one figure: `name`, the `pool` it belongs to (its scale), its values and
    the round each was measured in (`rounds`, aligned with `values`; empty when unknown)."""

    name: str
    pool: str
    values: tuple[float, ...]
    rounds: tuple[int | None, ...] = ()

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def log_mean(self) -> float:
        return statistics.fmean(logs(self.values, self.name))

    @property
    def geometric_mean(self) -> float:
        return geometric_mean(self.values)

    def log_squares(self) -> float:
        """Σ (ln x − mean ln x)²."""
        found = logs(self.values, self.name)
        mean = statistics.fmean(found)
        return sum((y - mean) ** 2 for y in found)

    def by_round(self) -> dict[int, float]:
        """ln x per round (rounds without a number left out)."""
        return {r: y for r, y in zip(self.rounds, logs(self.values, self.name)) if r is not None}


@dataclass(frozen=True)
class Variance:
    """The variance of one run's log figure and its degrees of freedom. `source` names the estimate: two
    configurations of one pool share the same estimate (it is counted once in Welch–Satterthwaite)."""

    value: float
    df: float
    source: str
    own: bool = False  # a far-noisier configuration's own estimate

    @property
    def cv(self) -> float:
        """Standard deviation of ln x: the relative noise of one run (≈ its coefficient of variation)."""
        return math.sqrt(self.value)


@dataclass(frozen=True)
class Pool:
    """A scale's pooled noise: `variance` over `members` (configurations measured twice or more), and the far
    noisier configurations that keep their own."""

    name: str
    variance: Variance | None  # None: no configuration of this pool was measured twice
    members: tuple[str, ...]
    noisier: tuple[str, ...] = ()
    round_share: float | None = None  # share of the configurations' spread the rounds explain (paired only)


Part = tuple[str, float, float]  # (pool, Σ squares, degrees of freedom) of one configuration


@dataclass
class NoiseModel:
    """Per configuration name, the variance its comparisons use (None: unknown); per pool, its estimate.
    `paired`: the same after each round's shared effect is taken out (the rounds as blocks), for the
    configurations that ran in every round (`complete`); `round_effects`: each round's effect (ln)."""

    variances: dict[str, Variance | None] = field(default_factory=dict)
    pools: list[Pool] = field(default_factory=list)
    paired: NoiseModel | None = None
    complete: frozenset[str] = frozenset()
    round_effects: dict[int, float] = field(default_factory=dict)
    parts: dict[str, Part] = field(default_factory=dict)  # each configuration's own (pool, Σ squares, df)

    def of(self, name: str) -> Variance | None:
        return self.variances.get(name)

    def own_cv(self, name: str) -> float | None:
        """A configuration's own noise (its Σ squares over its degrees of freedom), whatever its comparisons use."""
        part = self.parts.get(name)
        return math.sqrt(part[1] / part[2]) if part and part[2] > 0 else None


def _pooled(parts: Sequence[Part], source: str) -> Variance | None:
    df = sum(part[2] for part in parts)
    if not df:
        return None
    return Variance(sum(part[1] for part in parts) / df, df, source)


def far_noisier(own: Variance, others: Variance | None, level: float = FAR_NOISIER) -> bool:
    """Whether `own` exceeds the others' pooled variance beyond chance: F = own / others above the F(own.df,
    others.df) distribution's 1 − level quantile (one-sided)."""
    if others is None or own.df <= 0:
        return False
    if others.value == 0:
        return own.value > 0
    return float(fdtrc(own.df, others.df, own.value / others.value)) < level


def _pools(parts: dict[str, Part], names: dict[str, str], level: float, prefix: str = "") -> NoiseModel:
    """Each pool's variance over its configurations' parts, and a configuration's own where it is far noisier
    than the rest of its pool (tested against the pool of the others, leaving itself out). `names`: every
    configuration and its pool (those without a part take their pool's)."""
    model = NoiseModel(parts=dict(parts))
    for pool in dict.fromkeys(names.values()):
        members = {name: part for name, part in parts.items() if part[0] == pool and part[2] > 0}
        noisier = []
        for name, part in members.items():
            own = Variance(part[1] / part[2], part[2], f"{prefix}own:{name}", own=True)
            others = _pooled([p for n, p in members.items() if n != name], pool)
            if far_noisier(own, others, level):
                noisier.append(name)
                model.variances[name] = own
        kept = [p for n, p in members.items() if n not in noisier]
        pooled = _pooled(kept, f"{prefix}pool:{pool}")
        for name, its_pool in names.items():
            if its_pool == pool:
                model.variances.setdefault(name, pooled)
        model.pools.append(Pool(pool, pooled, tuple(n for n in members if n not in noisier), tuple(noisier)))
    return model


def estimate(samples: Iterable[Sample], level: float = FAR_NOISIER) -> NoiseModel:
    """The noise of every configuration (unpaired: the spread of its own repeats) and, where the sweep ran in
    rounds, the paired model: the same after each round's effect, shared by every configuration, is taken out."""
    samples = list(samples)
    names = {s.name: s.pool for s in samples}
    raw = {s.name: (s.pool, s.log_squares(), s.n - 1) for s in samples if s.n >= 2}
    model = _pools(raw, names, level)
    paired = _rounds_model(samples, names, level)
    if paired is not None:
        model.paired, model.complete, model.round_effects = paired
    return model


def _rounds_model(samples: list[Sample], names: dict[str, str],
                  level: float) -> tuple[NoiseModel, frozenset[str], dict[int, float]] | None:
    """Two-way model ln x_cr = μ_c + ρ_r + ε_cr over the configurations measured in every round (complete):
    ρ_r = the mean over them of (ln x_cr − their mean); residuals e_cr = ln x_cr − mean_c − ρ_r. A configuration's
    residual variance has (R − 1)(K − 1) / K degrees of freedom (K complete configurations, R rounds: one-way
    ANOVA's (R − 1)(K − 1) shared out). None below 2 rounds or 2 complete configurations."""
    rounds = sorted({r for s in samples for r in s.by_round()})
    complete = [s for s in samples if len(s.by_round()) == len(rounds) == s.n]
    if len(rounds) < 2 or len(complete) < 2:
        return None
    logs_ = {s.name: s.by_round() for s in complete}
    means = {name: statistics.fmean(values.values()) for name, values in logs_.items()}
    effects = {r: statistics.fmean(logs_[name][r] - means[name] for name in logs_) for r in rounds}
    df = (len(rounds) - 1) * (len(complete) - 1) / len(complete)
    residual = {s.name: (s.pool, sum((logs_[s.name][r] - means[s.name] - effects[r]) ** 2 for r in rounds), df)
                for s in complete}
    paired = _pools(residual, {s.name: s.pool for s in complete}, level, prefix="paired:")
    within = {s.name: s.log_squares() for s in complete}
    paired.pools = [Pool(p.name, p.variance, p.members, p.noisier, _share(p.name, residual, within))
                    for p in paired.pools]
    return paired, frozenset(logs_), effects


def _share(pool: str, residual: dict[str, Part], within: dict[str, float]) -> float | None:
    """1 − Σ residual squares ÷ Σ squares about each configuration's mean, over the pool's complete
    configurations: the share of their spread that the rounds' shared effects explain."""
    total = sum(within[name] for name, part in residual.items() if part[0] == pool)
    left = sum(part[1] for part in residual.values() if part[0] == pool)
    return 1 - left / total if total > 0 else None


@dataclass(frozen=True)
class Interval:
    """A ratio (or a mean) with its confidence interval: `estimate` in [`low`, `high`] at `confidence`."""

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


def t_quantile(confidence: float, df: float) -> float:
    """Two-sided Student t quantile: t(1 − α/2, df) for α = 1 − confidence."""
    return float(stdtrit(df, 1 - (1 - confidence) / 2))


@dataclass(frozen=True)
class Contrast:
    """An estimate with its standard error and degrees of freedom: on the log scale (`log`: a ratio, shown as
    exp) or on the linear scale (a mean, such as a loss gap). se = 0 is an exact figure (no noise)."""

    center: float
    se: float
    df: float
    log: bool = True
    paired: bool = False  # from within-round ratios (the rounds' shared effects cancel)

    @property
    def estimate(self) -> float:
        return math.exp(self.center) if self.log else self.center

    def interval(self, confidence: float = CONFIDENCE) -> Interval:
        half = 0.0 if self.se == 0 else t_quantile(confidence, self.df) * self.se
        low, high = self.center - half, self.center + half
        if self.log:
            return Interval(safe_exp(self.center), safe_exp(low), safe_exp(high), confidence)
        return Interval(self.center, low, high, confidence)

    def p_value(self, threshold: float = 1.0) -> float:
        """Two-sided p-value of "the figure equals `threshold`": the α at which the 1 − α interval starts to
        exclude it (0 for an exact figure off the threshold, 1 on it)."""
        distance = abs(self.center - (math.log(threshold) if self.log else threshold))
        if self.se == 0:
            return 0.0 if distance > 0 else 1.0
        return float(2 * stdtr(self.df, -distance / self.se))

    def side(self, threshold: float = 1.0) -> int:
        """+1 when the estimate lies above the threshold, −1 below, 0 on it."""
        reference = math.log(threshold) if self.log else threshold
        return (self.center > reference) - (self.center < reference)


def satterthwaite(terms: Sequence[tuple[float, Variance]]) -> tuple[float, float]:
    """se² = Σ coefficient · V over distinct estimates, and its Welch–Satterthwaite degrees of freedom."""
    weights: dict[str, list] = {}
    for coefficient, variance in terms:
        entry = weights.setdefault(variance.source, [0.0, variance])
        entry[0] += coefficient
    parts = [(coefficient * variance.value, variance.df) for coefficient, variance in weights.values()]
    se2 = sum(part for part, _ in parts)
    if se2 == 0:
        return 0.0, math.inf
    return se2, se2**2 / sum(part**2 / df for part, df in parts if part > 0)


def ratio(numerator: Sequence[Sample], denominator: Sequence[Sample]) -> Contrast | None:
    """Π geometric means(numerator) ÷ Π geometric means(denominator) on the log scale; None when a sample is empty
    or there are too few measurements to know its noise.

    Paired where the samples share MIN_ROUNDS rounds or more: z_r = Σ ln(numerator) − Σ ln(denominator) in each
    round r they all ran, estimate mean(z), se = sd(z) / √n, n − 1 degrees of freedom (each round's drift cancels;
    its own variance, whatever the configurations' noise). Otherwise unpaired: each sample's own variance of ln x
    over its runs (MIN_ROUNDS each), se² = Σ V_g / n_g, Welch–Satterthwaite's degrees of freedom. A figure measured
    identically in every run of every sample (model state bytes) is exact: se 0."""
    samples = [*numerator, *denominator]
    if not samples or any(s.n == 0 for s in samples):
        return None
    signs = [1.0] * len(numerator) + [-1.0] * len(denominator)
    if all(s.n >= 2 and len(set(s.values)) == 1 for s in samples):
        return Contrast(sum(sign * s.log_mean for s, sign in zip(samples, signs)), 0.0, math.inf, paired=False)
    by_round = [s.by_round() for s in samples]
    common = sorted(set.intersection(*(set(found) for found in by_round)))
    if len(common) >= MIN_ROUNDS:
        z = [sum(sign * found[r] for found, sign in zip(by_round, signs)) for r in common]
        return Contrast(statistics.fmean(z), statistics.stdev(z) / math.sqrt(len(z)), len(z) - 1, paired=True)
    own = [own_variance(s) for s in samples]
    if any(v is None for v in own):
        return None
    center = sum(sign * s.log_mean for s, sign in zip(samples, signs))
    se2, df = satterthwaite([(1 / s.n, v) for s, v in zip(samples, own)])
    return Contrast(center, math.sqrt(se2), df)


def own_variance(sample: Sample) -> Variance | None:
    """A configuration's own variance of ln x over its runs (drift between rounds included), with n − 1 degrees of
    freedom; None below MIN_ROUNDS runs."""
    if sample.n < MIN_ROUNDS:
        return None
    return Variance(sample.log_squares() / (sample.n - 1), sample.n - 1, f"own:{sample.pool}:{sample.name}", own=True)


def safe_exp(x: float) -> float:
    """exp that saturates at inf (and 0) instead of raising OverflowError: an interval of a ratio whose log end is
    beyond ±700 is unbounded on that side."""
    return math.exp(x) if x < 700 else math.inf


def mean_contrast(values: Sequence[float]) -> Contrast | None:
    """The mean of one sample on the linear scale (x̄, s / √n, n − 1), for figures that are not ratios (a loss
    gap, a hidden share); None below 2 values."""
    if len(values) < 2:
        return None
    return Contrast(statistics.fmean(values), statistics.stdev(values) / math.sqrt(len(values)), len(values) - 1,
                    log=False)


def between_sweeps(a: Sample, b: Sample) -> Contrast | None:
    """mean(b) ÷ mean(a) for one configuration measured in two sweeps (two machines, two clusters), each with its
    own variance (MIN_ROUNDS runs each): Welch on the log scale. None when either has fewer runs."""
    a_noise, b_noise = own_variance(a), own_variance(b)
    if a_noise is None or b_noise is None:
        return None
    a_noise = Variance(a_noise.value, a_noise.df, f"a:{a_noise.source}")
    b_noise = Variance(b_noise.value, b_noise.df, f"b:{b_noise.source}")
    se2, df = satterthwaite([(1 / a.n, a_noise), (1 / b.n, b_noise)])
    return Contrast(b.log_mean - a.log_mean, math.sqrt(se2), df)


# ------------------------------------------------------------------ many decisions
def holm(p_values: Sequence[float], alpha: float = 1 - CONFIDENCE) -> list[float]:
    """Holm's step-down levels: the j-th smallest of m p-values is tested at α / (m − j + 1) while every
    smaller one was rejected; from the first that is not, every later one keeps that level (so its interval at
    that level still contains the threshold). Returns each hypothesis's confidence, 1 − its level. The chance
    that any of the m decisions is wrong stays at most α."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    levels = [0.0] * len(p_values)
    stopped: float | None = None
    for rank, index in enumerate(order):
        level = stopped if stopped is not None else alpha / (len(p_values) - rank)
        if stopped is None and p_values[index] > level:
            stopped = level
        levels[index] = level
    return [1 - level for level in levels]


def family_confidence(comparisons: int, confidence: float = CONFIDENCE) -> float:
    """Bonferroni: each of m comparisons at 1 − α/m, so that a claim checked m times (once per strategy, say)
    is wrongly decided with probability at most α, not m · α."""
    return 1 - (1 - confidence) / max(1, comparisons)


@dataclass
class Pending:
    """A decision stated but not yet taken: its p-value (None: nothing to decide, e.g. the noise is unknown) and
    how to conclude it at a given confidence (the level Holm gives it among the report's decisions)."""

    p_value: float | None
    conclude: Callable[[float], Any]
