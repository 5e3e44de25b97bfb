"""The selection race: which configuration of a group is the fastest, decided after every round, dropping
every configuration that a surviving one beats so that it does not run again. Definitions and the guarantee:
docs/analysis.md, The selection race.

A group is the configurations that compete for "fastest": one scale's, or one resource group of it (CPU ranks
with other threads or cores each are ranked apart). Each comparison of two of them rests on their within-round
log differences over the rounds both ran (each round's shared drift cancels; each pair has its own variance, so
unequal noise is handled exactly), tested one-sided with the sequential boundary of `boundary.py`.

After each look (a round from `Design.first_look` on, or the last round only for a sweep of fixed rounds):
- every configuration that some survivor beats is **dropped** (the round and by whom are recorded);
- one survivor left: it **is the fastest** (`clear`);
- with sweep.minEffect δ: a survivor X whose every surviving rival is shown less than δ ahead of it is **the
  fastest or within δ of it** (`equivalent`; Hsu's multiple comparisons with the best);
- a configuration whose runs fall into two speeds (`modes.py`) is **set aside as unstable**: it is not ranked,
  named or picked, the drops it made are undone, and it runs no more; a race left with one configuration or none
  that beat nobody ends **unstable**;
- otherwise the race goes on; when the rounds or the budget run out, **the fastest is among** the survivors.

A group's k entrants are the configurations with a figure. Each ordered comparison is tested at level
α / max(k − 1, 2): under normal noise, a fastest configuration is dropped, or a configuration wrongly called
the fastest or within δ of it, with probability at most α (docs/analysis.md, The guarantee).

The core (`race`) runs many races at once (numpy arrays over independent draws): the same code replays one sweep
for its report, simulates the rounds a decision still needs (`rounds_needed`), and drives the calibration tests.
Pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from gpt2bench.report import modes
from gpt2bench.report.boundary import FIRST_LOOK, MAX_CAP, critical_t
from gpt2bench.report.noise import ALPHA

RACING, CLEAR, EQUIVALENT, UNSTABLE = 0, 1, 2, 3
DEFAULT_MIN_EFFECT = 0.05  # sweep.minEffect when the spec does not say (0 turns it off)
PROBABILITY = 0.8  # "rounds needed": the chance at which that many rounds would decide
DRAWS = 400  # simulated continuations behind one "rounds needed"


@dataclass(frozen=True)
class Design:
    """What a race may do: its group's size (`entrants`, k), the last round it may look at (`cap`: sweep.maxRepeats,
    or the fixed rounds), its first look, whether it looks once only (a sweep of fixed rounds), its error rate
    and the smallest difference that matters (sweep.minEffect)."""

    entrants: int
    cap: int
    first_look: int = FIRST_LOOK
    single: bool = False
    alpha: float = ALPHA
    min_effect: float | None = None

    @property
    def level(self) -> float:
        """One ordered comparison's level: α / max(k − 1, 2). A fastest configuration has k − 1 rivals, each of
        which drops it wrongly with at most this chance; with two entrants each direction gets α / 2, so that an
        exact tie is wrongly called either way with at most α (docs/analysis.md, The guarantee)."""
        return self.alpha / max(self.entrants - 1, 2)

    def criticals(self) -> np.ndarray:
        """The critical t by the number of rounds a comparison rests on, 0..cap (inf below FIRST_LOOK)."""
        return _criticals(self.level, self.cap, self.single)

    def looks_at(self, round_: int, last: int) -> bool:
        """Whether the race looks after `round_` (the sweep's rounds so far end at `last`)."""
        if self.single:
            return round_ == last == self.cap
        return self.first_look <= round_ <= self.cap


@dataclass
class State:
    """Many races at once (axis 0: draws; then configurations i, j): the within-round log differences i − j
    summed over the rounds both ran (`sums`, `squares`, `counts`), who is still racing, and what happened; each
    configuration's own figures by round (`history`, NaN: not run) and which were set aside as unstable."""

    sums: np.ndarray
    squares: np.ndarray
    counts: np.ndarray
    alive: np.ndarray
    dropped_in: np.ndarray  # the round a configuration was dropped in (0: not dropped)
    dropped_by: np.ndarray  # the survivor that beat it most clearly (-1: not dropped)
    outcome: np.ndarray  # RACING, CLEAR or EQUIVALENT
    decided_in: np.ndarray  # the round the race was decided in (0: not decided)
    pick: np.ndarray  # the winner, or the equivalent pick (-1: none)
    history: np.ndarray  # draws × rounds so far × configurations: ln figures (NaN: not run)
    unstable: np.ndarray  # set aside: its runs fall into two speeds

    @classmethod
    def start(cls, draws: int, entrants: int) -> State:
        pairs = (draws, entrants, entrants)
        return cls(np.zeros(pairs), np.zeros(pairs), np.zeros(pairs, dtype=int), np.ones((draws, entrants), bool),
                   np.zeros((draws, entrants), int), np.full((draws, entrants), -1), np.zeros(draws, int),
                   np.zeros(draws, int), np.full(draws, -1), np.full((draws, 0, entrants), np.nan),
                   np.zeros((draws, entrants), bool))

    def copy(self, draws: int | None = None) -> State:
        """An independent copy; with `draws`, the first race repeated that many times (continuations of it)."""
        if draws is None:
            return State(*(np.array(part) for part in vars(self).values()))
        return State(*(np.repeat(part[:1], draws, axis=0) for part in vars(self).values()))

    def statistics(self, shift: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per pair: the mean difference i − j, its standard error and t = (mean + shift) / se (±inf when se is 0
        and the numerator is not, 0 when both are)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            n = np.maximum(self.counts, 1)
            mean = self.sums / n
            variance = np.maximum(self.squares - n * mean**2, 0.0) / np.maximum(self.counts - 1, 1)
            se = np.sqrt(variance / n)
            top = mean + shift
            t = np.where(se > 0, top / np.where(se > 0, se, 1.0), np.sign(top) * np.inf)
            t = np.where((se == 0) & (top == 0), 0.0, t)
        return mean, se, t


def race(values: np.ndarray, design: Design, rounds: Sequence[int], state: State | None = None) -> State:
    """Run races over `values` (draws × rounds × configurations: ln of each run's figure, NaN where it did not
    run or failed) whose rounds are numbered `rounds`; `state`: where earlier rounds left them (a continuation).
    A configuration's values after it was dropped, and a decided race's later rounds, are ignored: in the sweep
    they do not exist (nothing runs for them)."""
    draws, _, entrants = values.shape
    state = state.copy() if state is not None else State.start(draws, entrants)
    critical = design.criticals()
    others = ~np.eye(entrants, dtype=bool)
    effect = math.log1p(design.min_effect) if design.min_effect else None
    last = rounds[-1] if len(rounds) else 0
    for index, round_ in enumerate(rounds):
        open_ = state.outcome == RACING
        present = ~np.isnan(values[:, index]) & state.alive & open_[:, None]
        row = np.where(present, values[:, index], 0.0)
        both = present[:, :, None] & present[:, None, :]
        difference = row[:, :, None] - row[:, None, :]
        state.sums += np.where(both, difference, 0.0)
        state.squares += np.where(both, difference**2, 0.0)
        state.counts += both
        state.history = np.concatenate([state.history, np.where(present, values[:, index], np.nan)[:, None]], axis=1)
        if not design.looks_at(round_, last):
            continue
        _set_aside_unstable(state, open_)
        _, _, t = state.statistics()
        bar = critical[np.minimum(state.counts, design.cap)]
        alive_pair = state.alive[:, :, None] & state.alive[:, None, :] & others & (state.counts >= FIRST_LOOK)
        beats = alive_pair & (t >= bar) & open_[:, None, None]  # [d, i, j]: i beats j
        beaten = beats.any(axis=1)
        if beaten.any():
            strongest = np.where(beats, t, -np.inf).argmax(axis=1)
            state.dropped_in = np.where(beaten, round_, state.dropped_in)
            state.dropped_by = np.where(beaten, strongest, state.dropped_by)
            state.alive &= ~beaten
        survivors, beat_one = state.alive.sum(axis=1), (state.dropped_in > 0).any(axis=1)
        set_aside = state.unstable.any(axis=1)
        one = open_ & (survivors == 1) & (beat_one | ~set_aside)
        state.outcome = np.where(one, CLEAR, state.outcome)
        state.pick = np.where(one, state.alive.argmax(axis=1), state.pick)
        state.decided_in = np.where(one, round_, state.decided_in)
        nothing_ranked = open_ & set_aside & (survivors <= 1) & ~one  # the rest beat nobody: no ranking to give
        state.outcome = np.where(nothing_ranked, UNSTABLE, state.outcome)
        state.decided_in = np.where(nothing_ranked, round_, state.decided_in)
        if effect is not None:
            _equivalent(state, critical, design.cap, effect, round_, open_ & ~one & ~nothing_ranked, others)
    return state


def _set_aside_unstable(state: State, open_: np.ndarray) -> None:
    """Configurations still racing whose runs now fall into two speeds leave the race (not ranked, named or
    picked); the configurations they dropped come back (they run again from the next round)."""
    runs = (~np.isnan(state.history)).sum(axis=1)
    candidates = state.alive & open_[:, None] & (runs >= modes.MIN_RUNS)
    rows = candidates.any(axis=1)  # each draw is tested on its own history: the others need not be
    if not rows.any():
        return
    newly = np.zeros_like(candidates)
    newly[rows] = modes.unstable(state.history[rows]) & candidates[rows]
    if not newly.any():
        return
    state.unstable |= newly
    state.alive &= ~newly
    by = np.take_along_axis(newly, np.maximum(state.dropped_by, 0), axis=1) & (state.dropped_by >= 0)
    back = by & (state.dropped_in > 0) & open_[:, None]
    state.alive |= back
    state.dropped_in = np.where(back, 0, state.dropped_in)
    state.dropped_by = np.where(back, -1, state.dropped_by)


def _equivalent(state: State, critical: np.ndarray, cap: int, effect: float, round_: int, open_: np.ndarray,
                others: np.ndarray) -> None:
    """A survivor whose every surviving rival is shown less than `effect` (ln(1 + δ)) ahead of it: (mean(X − j) +
    effect) / se ≥ the bar. Of several, the one with the best mean difference against the others."""
    mean, _, within = state.statistics(effect)
    bar = critical[np.minimum(state.counts, cap)]
    rival = state.alive[:, None, :] & others
    shown = np.where(rival, (within >= bar) & (state.counts >= FIRST_LOOK), True).all(axis=2) & state.alive
    found = open_ & shown.any(axis=1)
    if not found.any():
        return
    score = np.where(shown, np.where(rival, mean, 0.0).sum(axis=2), -np.inf)
    state.outcome = np.where(found, EQUIVALENT, state.outcome)
    state.pick = np.where(found, score.argmax(axis=1), state.pick)
    state.decided_in = np.where(found, round_, state.decided_in)


# ------------------------------------------------------------------ one sweep's race, as the report tells it
@dataclass(frozen=True)
class Dropped:
    """A configuration out of the race: after `round`, `behind` beat it by `ratio` (its figure over ours, paired)
    with at least `low` (the bound at the race's level)."""

    name: str
    round: int
    behind: str
    ratio: float
    low: float


@dataclass(frozen=True)
class TwoSpeeds:
    """An unstable configuration: its runs at the fast speed (how many, their geometric mean) and at the slow one."""

    name: str
    fast_runs: int
    fast: float
    slow_runs: int
    slow: float


@dataclass
class Outcome:
    """One group's race: `decision` clear / equivalent / open (racing, or out of rounds) / needs-rounds (no
    comparison has FIRST_LOOK rounds yet) / unstable (the configurations set aside leave nothing ranked);
    `unstable`: the configurations set aside; `survivors` ranked by geometric mean; `pick`: the winner or the
    equivalent pick; `behind_at_most`: how far the pick can be behind the fastest (equivalent); per survivor
    against the top-ranked, `versus`: (ratio, low, high, rounds) at the race's level."""

    decision: str
    survivors: list[str]
    dropped: list[Dropped] = field(default_factory=list)
    pick: str | None = None
    decided_in: int | None = None
    behind_at_most: float | None = None
    versus: dict[str, tuple[float, float, float, int]] = field(default_factory=dict)
    unstable: list[TwoSpeeds] = field(default_factory=list)
    level: float = 0.0
    looks: int = 0
    state: State | None = field(default=None, repr=False)
    order: list[str] = field(default_factory=list, repr=False)
    design: Design | None = field(default=None, repr=False)

    def between(self, a: str, b: str) -> tuple[float, float, float, int] | None:
        """a ÷ b within the rounds both ran: (estimate, low, high, rounds), the bounds at the race's level for a
        comparison of that many rounds (infinite below FIRST_LOOK). None when either is not in the race."""
        if self.state is None or self.design is None or a not in self.order or b not in self.order:
            return None
        i, j = self.order.index(a), self.order.index(b)
        mean, se, _ = self.state.statistics()
        n = int(self.state.counts[0, i, j])
        if not n:
            return None
        bar, error = self.design.criticals()[min(n, self.design.cap)], float(se[0, i, j])
        spread = 0.0 if error == 0 else bar * error if math.isfinite(bar) else math.inf
        return (_exp(mean[0, i, j]), _exp(mean[0, i, j] - spread), _exp(mean[0, i, j] + spread), n)


def replay(samples: Mapping[str, Mapping[int, float]], design: Design, rounds: Sequence[int]) -> Outcome:
    """One sweep's race from its runs: `samples` maps each configuration (in plan order) to its figure by round
    (succeeded runs only; figures > 0); `rounds`: the decision rounds that have finished, in order."""
    names = list(samples)
    values = np.full((1, len(rounds), len(names)), np.nan)
    for j, name in enumerate(names):
        for i, round_ in enumerate(rounds):
            if round_ in samples[name]:
                values[0, i, j] = math.log(samples[name][round_])
    state = race(values, design, list(rounds))
    return _outcome(state, names, samples, design, list(rounds))


def geometric_means(samples: Mapping[str, Mapping[int, float]]) -> dict[str, float]:
    return {name: math.exp(sum(math.log(v) for v in found.values()) / len(found))
            for name, found in samples.items() if found}


def _outcome(state: State, names: list[str], samples: Mapping[str, Mapping[int, float]], design: Design,
             rounds: list[int]) -> Outcome:
    means = geometric_means(samples)
    alive = [name for j, name in enumerate(names) if state.alive[0, j]]
    survivors = sorted(alive, key=lambda name: -means.get(name, 0.0))
    outcome = {CLEAR: "clear", EQUIVALENT: "equivalent", UNSTABLE: "unstable"}.get(int(state.outcome[0]), "open")
    looks = sum(design.looks_at(r, rounds[-1]) for r in rounds) if rounds else 0
    if outcome == "open" and not (state.counts[0] >= FIRST_LOOK).any() and len(names) > 1:
        outcome = "needs-rounds"
    found = Outcome(outcome, survivors, level=design.level, looks=looks, state=state, order=names, design=design,
                    unstable=[_two_speeds(state, j, name) for j, name in enumerate(names) if state.unstable[0, j]])
    for j, name in enumerate(names):
        if state.dropped_in[0, j]:
            by = names[int(state.dropped_by[0, j])]
            ratio, low, _, _ = found.between(by, name)
            found.dropped.append(Dropped(name, int(state.dropped_in[0, j]), by, ratio, low))
    found.dropped.sort(key=lambda d: (d.round, names.index(d.name)))
    top = survivors[0] if survivors else None
    if outcome in ("clear", "equivalent") and state.pick[0] >= 0:
        top = names[int(state.pick[0])]
        found.pick = top
    if state.decided_in[0]:
        found.decided_in = int(state.decided_in[0])
    found.versus = {name: versus for name in survivors
                    if top and name != top and (versus := found.between(top, name)) is not None}
    if outcome == "equivalent" and found.versus:
        # Hsu's upper bound on how far the pick can be behind the fastest: the largest high end of rival ÷ pick
        found.behind_at_most = max(1 / low for _, low, _, _ in found.versus.values()) - 1
    if top in survivors:  # the pick (or the top-ranked) heads the list of survivors
        found.survivors = [top, *(name for name in survivors if name != top)]
    return found


def _two_speeds(state: State, j: int, name: str) -> TwoSpeeds:
    residual = modes.residuals(state.history[0])[:, j]
    _, threshold = modes.split(residual)
    if np.isnan(threshold):  # its rivals' later rounds moved the drift estimate: split at the middle instead
        threshold = np.nanmedian(residual)
    figures = state.history[0][:, j]
    fast, slow = figures[residual > threshold], figures[residual <= threshold]
    return TwoSpeeds(name, len(fast), _exp(float(fast.mean())), len(slow), _exp(float(slow.mean())))


def _exp(x: float) -> float:
    """exp that saturates (an unbounded end, a ratio of extreme figures) instead of raising OverflowError."""
    return math.exp(x) if x < 700 else math.inf


@lru_cache(maxsize=256)
def _criticals(level: float, cap: int, single: bool) -> np.ndarray:
    found = np.array([critical_t(n, level, cap, single) for n in range(cap + 1)])
    found.flags.writeable = False
    return found


# ------------------------------------------------------------------ the rounds a decision still needs
def rounds_needed(outcome: Outcome, design: Design, done: int, probability: float = PROBABILITY,
                  draws: int = DRAWS, seed: int = 0) -> int | None:
    """The rounds in all (a sweep with sweep.maxRepeats at that, at least its own) at which this open race,
    continued under the boundary of that cap, would decide with `probability`, by simulation through `race`
    itself: each draw takes
    the survivors' differences from what their paired comparisons allow (the estimate plus its t-distributed
    error), each survivor's own noise from the pairs' variances, and runs the rounds on. None: not within
    MAX_CAP rounds (near a tie, or noise too large for the difference)."""
    state, names = outcome.state, outcome.order
    if state is None or outcome.decision in ("clear", "equivalent") or len(outcome.survivors) < 2:
        return None
    alive = [names.index(name) for name in outcome.survivors]
    leader = alive[0]
    mean, se, _ = state.statistics()
    counts = state.counts[0]
    if any(counts[leader, j] < FIRST_LOOK for j in alive[1:]):
        return None
    rng = np.random.default_rng(seed)
    shift = np.zeros((draws, len(names)))
    for j in alive[1:]:
        n = int(counts[j, leader])
        shift[:, j] = mean[0, j, leader] + se[0, j, leader] * rng.standard_t(n - 1, draws)
    noise = _own_noise(state, alive)

    def decided(cap: int) -> float:
        future = list(range(done + 1, cap + 1))
        values = np.full((draws, len(future), len(names)), np.nan)
        for j in alive:
            values[:, :, j] = shift[:, j, None] + rng_for(cap).normal(0.0, noise[j], (draws, len(future)))
        ahead = race(values, _with_cap(design, cap), future, state.copy(draws))
        return float((ahead.outcome != RACING).mean())

    def rng_for(cap: int) -> np.random.Generator:  # the same noise for a cap whoever asks (monotone search)
        return np.random.default_rng([seed, cap])

    low, high = max(done + 1, design.cap) - 1, MAX_CAP  # a sweep that reached its cap needs a larger one
    if high <= low or decided(high) < probability:
        return None
    while high - low > 1:  # the chance grows with the cap: bisect for the smallest that reaches it
        middle = (low + high) // 2
        if decided(middle) >= probability:
            high = middle
        else:
            low = middle
    return high


def _with_cap(design: Design, cap: int) -> Design:
    return Design(design.entrants, cap, design.first_look, False, design.alpha, design.min_effect)


def _own_noise(state: State, alive: list[int]) -> dict[int, float]:
    """Each survivor's own noise (sd of ln x) from the pairs' variances, var(i − j) = σ_i² + σ_j², by least
    squares; two survivors share their pair's equally."""
    mean, se, _ = state.statistics()
    counts = state.counts[0]
    pairs = [(i, j) for a, i in enumerate(alive) for j in alive[a + 1:] if counts[i, j] >= 2]
    variance = {pair: float(se[0][pair] ** 2 * counts[pair]) for pair in pairs}
    if len(alive) == 2 or not pairs:
        shared = sum(variance.values()) / max(len(variance), 1) / 2
        return {j: math.sqrt(max(shared, 1e-12)) for j in alive}
    rows = np.zeros((len(pairs), len(alive)))
    for row, (i, j) in enumerate(pairs):
        rows[row, alive.index(i)] = rows[row, alive.index(j)] = 1.0
    solved, *_ = np.linalg.lstsq(rows, np.array([variance[p] for p in pairs]), rcond=None)
    floor = 0.05 * max(variance.values()) / 2  # a negative or tiny solution: a small share, not zero noise
    return {j: math.sqrt(max(float(v), floor, 1e-12)) for j, v in zip(alive, solved)}
