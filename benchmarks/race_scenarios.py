"""Synthetic sweeps for the selection race: rounds of configurations whose runs measure their true tokens/s times
noise, plus a drift every run of a round shares, as the sweeps on a shared machine do (docs/analysis.md, Rounds as
blocks). Drives the shipped race (gpt2bench.report.race) in tests/test_race.py and benchmarks/bench_race.py, and the
whole report (analyze, next_round) through `runs`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import numpy as np

from gpt2bench.report import race
from gpt2bench.status import RunStatus

QUIET, NOISY = 0.03, 0.08  # noise of one run (sd of ln tokens/s): a quiet configuration, a noisy one
DRIFT = 0.05  # sd of the shared effect of a round
SLOW = 0.7  # an unstable configuration's slow speed: 30 % below its full speed


@dataclass(frozen=True)
class Scenario:
    """`ratios`: each configuration's true tokens/s relative to the others (1.1: 10 % faster); `noise`: each one's
    sd of ln tokens/s; `drift`: the sd of a round's shared effect; `slow_share`: per configuration, the chance that
    a run falls to the slow speed, `slow` times its full speed (two speeds: 0.7 is 30 % slower). A configuration's
    ratio is its full speed."""

    name: str
    ratios: tuple[float, ...]
    noise: tuple[float, ...]
    drift: float = DRIFT
    slow_share: tuple[float, ...] | None = None
    slow: float = SLOW

    @property
    def entrants(self) -> int:
        return len(self.ratios)

    @property
    def fastest(self) -> int | None:
        """The strictly fastest configuration (None: a tie at the top)."""
        top = max(self.ratios)
        return self.ratios.index(top) if self.ratios.count(top) == 1 else None

    def values(self, rounds: int, draws: int, seed: int) -> np.ndarray:
        """draws × rounds × configurations of ln tokens/s."""
        rng = np.random.default_rng(seed)
        drift = rng.normal(0.0, self.drift, (draws, rounds, 1))
        noise = rng.standard_normal((draws, rounds, self.entrants)) * np.array(self.noise)
        values = np.log(1000.0 * np.array(self.ratios)) + drift + noise
        if self.slow_share is not None:
            values += np.where(rng.random((draws, rounds, self.entrants)) < np.array(self.slow_share),
                               math.log(self.slow), 0.0)
        return values

    def mean_speed(self) -> np.ndarray:
        """Each configuration's mean ln speed (an unstable one's over both speeds)."""
        share = np.array(self.slow_share) if self.slow_share is not None else 0.0
        return np.log(np.array(self.ratios)) + share * math.log(self.slow)


def mixed(entrants: int) -> tuple[float, ...]:
    """Unequal noise: quiet and noisy configurations alternating."""
    return tuple(QUIET if i % 2 == 0 else NOISY for i in range(entrants))


def equal(entrants: int) -> Scenario:
    return Scenario(f"{entrants} equal, 3 %/8 % noise", (1.0,) * entrants, mixed(entrants))


def one_ahead(entrants: int, lead: float, noisy: bool = False) -> Scenario:
    """One configuration `lead` faster than the rest (the noisy one when `noisy`)."""
    index = 1 if noisy else 0
    ratios = tuple(1 + lead if i == index else 1.0 for i in range(entrants))
    kind = "noisy" if noisy else "quiet"
    return Scenario(f"{entrants}, a {kind} one {lead:.0%} faster", ratios, mixed(entrants))


def two_speeds(entrants: int, tie: str = "mean") -> Scenario:
    """Configuration 0 runs at full speed or 30 % slower, half the time each, 3 % noise inside a speed; the others
    are stable (alternately 3 % and 8 % noise) and tied with its mean speed (`tie="mean"`) or with its full speed
    (`tie="fast"`)."""
    level = math.sqrt(SLOW) if tie == "mean" else 1.0  # geometric mean of 1 and 0.7
    ratios = (1.0, *(level for _ in range(entrants - 1)))
    noise = (QUIET, *mixed(entrants)[1:])
    share = (0.5, *(0.0 for _ in range(entrants - 1)))
    return Scenario(f"{entrants}, one in two speeds, the rest tied with its {tie} speed", ratios, noise,
                    slow_share=share)


def run_races(scenario: Scenario, cap: int, draws: int, seed: int, min_effect: float | None = None,
              first_look: int = race.FIRST_LOOK) -> race.State:
    """`draws` sweeps of `scenario` raced to `cap` rounds (sweep.maxRepeats) by the shipped race."""
    design = race.Design(scenario.entrants, cap, first_look, min_effect=min_effect)
    return race.race(scenario.values(cap, draws, seed), design, list(range(1, cap + 1)))


def runs_used(state: race.State, cap: int) -> np.ndarray:
    """Runs each sweep ran: a configuration runs every round until it is dropped or its race is decided."""
    last = np.where(state.dropped_in > 0, state.dropped_in, np.where(state.decided_in[:, None] > 0,
                                                                     state.decided_in[:, None], cap))
    return last.sum(axis=1)


def runs(scenario: Scenario, values: np.ndarray, name: str = "sim",
         start: datetime = datetime(2026, 11, 1, tzinfo=timezone.utc)) -> list[RunStatus]:
    """One sweep's rounds (rounds × configurations of ln tokens/s; NaN: not run) as the status entries a sweep
    writes: configuration c is strategy `ddp`, precision `fp32`, scale 1×2 CPU, named `<name>-c<c>-...`."""
    found, clock = [], start
    for k, row in enumerate(values, start=1):
        for c, value in enumerate(row):
            if math.isnan(value):
                continue
            begin, end = clock, clock + timedelta(seconds=10)
            found.append(RunStatus(
                name=f"{name}-c{c}-fp32-1x2-r{k}", strategy=f"c{c}", precision="fp32", nodes=1, devices_per_node=0,
                processes_per_node=2, job_kind="PyTorchJob", job_name=f"{name}-c{c}-r{k}", devices=2, repeat=k,
                phase="Succeeded", start_time=begin.strftime("%Y-%m-%dT%H:%M:%SZ"),
                completion_time=end.strftime("%Y-%m-%dT%H:%M:%SZ"), results={"tokens_per_second": math.exp(value)}))
            clock = end
    return found
