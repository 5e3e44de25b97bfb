"""Unstable configurations: runs that fall into two speeds are found (gpt2bench.report.modes), set aside by the
shipped race instead of ranked, and said so wherever the verdict appears. Simulated sweeps through the shipped code
(benchmarks/race_scenarios.py), seeded; benchmarks/bench_race.py measures the same at scale (docs/analysis.md,
Unstable configurations)."""

from __future__ import annotations

import importlib.util
import math
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from gpt2bench.report import modes, race
from gpt2bench.report.analysis import analyze
from gpt2bench.report.sequential import next_round

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("race_scenarios", REPO / "benchmarks" / "race_scenarios.py")
scenarios = sys.modules.setdefault("race_scenarios", importlib.util.module_from_spec(spec))
spec.loader.exec_module(scenarios)
NOW = datetime(2026, 11, 1, 2, tzinfo=timezone.utc)


def test_two_speeds_are_found_and_normal_noise_is_not():
    """Ten rounds of six configurations (5 % drift per round): the one at full speed or 30 % slower is flagged in
    most sweeps, its stable rivals almost never, and a configuration with 8 % normal noise rarely."""
    draws = 4000
    flagged = modes.unstable(scenarios.two_speeds(6).values(10, draws, seed=1))
    assert flagged[:, 0].mean() >= 0.6
    assert flagged[:, 1:].mean() <= 0.002
    noisy = scenarios.Scenario("normal", (1.0,) * 6, (0.08,) * 6)
    assert modes.unstable(noisy.values(10, draws, seed=2)).mean() <= 0.003


def test_with_two_configurations_the_split_belongs_to_the_one_whose_figures_moved():
    """Two configurations: each one's residuals mirror the other's, so the split alone cannot say whose it is; the
    figures grouped by it can."""
    scenario = scenarios.Scenario("two", (1.0, 1.0), (0.03, 0.03), slow_share=(0.5, 0.0))
    flagged = modes.unstable(scenario.values(10, 4000, seed=3))
    assert flagged[:, 0].mean() >= 0.5 and flagged[:, 1].mean() <= 0.002


def test_a_configuration_without_enough_runs_on_either_side_is_not_split():
    one_slow = np.log(np.array([1000.0, 1010, 990, 1005, 700, 995, 1000]))
    assert not modes.split(one_slow)[0]  # one slow run is an outlier, not a second speed
    three_slow = np.log(np.array([1000.0, 1010, 700, 990, 705, 1005, 695]))
    found, threshold = modes.split(three_slow)
    assert found and math.log(705) < threshold < math.log(990)
    assert not modes.split(np.log(np.array([1000.0, 1010, 700, 990, 705, 1005, 695, 850])))[0]  # a run between


def split_by_its_definition(values: np.ndarray) -> tuple[bool, float]:
    """The rule of gpt2bench.report.modes read literally, on one configuration's runs: every split of the sorted
    runs with MIN_SIDE on each side, its gap and each side's sample standard deviation."""
    runs = np.sort(values[~np.isnan(values)])
    found, threshold, widest = False, math.nan, 0.0
    for k in range(modes.MIN_SIDE, len(runs) - modes.MIN_SIDE + 1):
        low, high = runs[:k], runs[k:]
        gap = runs[k] - runs[k - 1]
        spread = max(np.std(low, ddof=1), np.std(high, ddof=1))
        if gap >= modes.GAP and gap >= modes.RATIO * spread and gap > widest:
            found, threshold, widest = True, (runs[k] + runs[k - 1]) / 2, gap
    return found, threshold


def test_the_vectorized_split_keeps_the_rule_it_states_on_any_runs():
    """Random run sets of 1-30 runs, one or two speeds, spreads from 1 % to 20 %, runs missing (NaN) anywhere: the
    split the race uses agrees with the rule computed literally, run set by run set."""
    rng = np.random.default_rng(8)
    checked = split_runs = 0
    for _ in range(60):
        runs = rng.integers(1, 31)
        values = rng.normal(0.0, rng.choice([0.01, 0.05, 0.2]), (40, runs))
        values -= np.where(rng.random(values.shape) < 0.4, rng.choice([0.1, 0.3, 0.5]), 0.0)
        values[rng.random(values.shape) < rng.random() * 0.5] = np.nan
        found, threshold = modes.split(values)
        for row, flagged, between in zip(values, found, threshold, strict=True):
            expected, expected_threshold = split_by_its_definition(row)
            assert flagged == expected, row
            assert (math.isnan(between) and math.isnan(expected_threshold)) or math.isclose(between,
                                                                                          expected_threshold)
            checked, split_runs = checked + 1, split_runs + expected
    assert checked == 2400 and 200 < split_runs < 2200  # both answers were asked for often


def sweep_values() -> np.ndarray:
    """Rounds × configurations (ln tokens/s) of one sweep: c0 at 1,300 tokens/s in rounds 1-4 and 1,000 after (two
    speeds), c1 steady at 1,100 (3 % noise), c2 steady at 1,000 (little noise): after round 4 c0 beats c2, and
    nothing else is decided."""
    rng = np.random.default_rng(5)
    fast = [1300, 1300, 1300, 1300, 1000, 1000, 1000]
    rows = np.log(np.array([[fast[k], 1100, 1000] for k in range(7)], float))
    return rows + rng.normal(0, 1.0, (7, 3)) * np.array([0.002, 0.03, 0.002])


def test_the_drops_an_unstable_configuration_made_are_undone():
    """c0 drops c2 after round 4; then c0 falls to its slow speed and, with three runs at each speed, is set aside
    after round 7: c2 races again from the next round, and the race of c1 and c2 goes on."""
    values = sweep_values()
    state = race.race(values[None, :4], race.Design(3, 10, min_effect=None), list(range(1, 5)))
    assert state.dropped_in[0, 2] == 4 and state.dropped_by[0, 2] == 0 and not state.unstable.any()
    ran = values[None].copy()
    ran[0, 4:, 2] = np.nan  # c2 did not run after its drop
    state = race.race(ran[:, 4:], race.Design(3, 10, min_effect=None), [5, 6, 7], state)
    assert state.unstable[0].tolist() == [True, False, False]
    assert state.alive[0].tolist() == [False, True, True] and state.dropped_in[0, 2] == 0
    assert state.outcome[0] == race.RACING


def test_an_unstable_configuration_is_flagged_in_the_verdict_and_runs_no_more():
    """The same sweep as the report and the rule that adds rounds see it: c0 is neither ranked nor run again, the
    verdict names its two speeds and where to look, and the next round runs c1 and c2 (c2 is back)."""
    ran = sweep_values()
    ran[4:, 2] = np.nan
    runs = scenarios.runs(scenarios.Scenario("s", (1.0,) * 3, (0.0,) * 3), ran)
    sweep = {"sweep": {"repeats": 3, "maxRepeats": 10, "minEffect": 0}}
    fastest = next(r for r in analyze(runs, sweep).recommendations if r.objective == "fastest")
    assert [u.configuration for u in fastest.unstable] == ["sim-c0-fp32-1x2"]
    assert (fastest.unstable[0].fast_runs, fastest.unstable[0].slow_runs) == (4, 3)
    assert fastest.decision == "no-clear-winner" and sorted(fastest.candidates) == ["sim-c1-fp32-1x2",
                                                                                    "sim-c2-fp32-1x2"]
    assert fastest.verdict.startswith("not separated after 7 rounds: the fastest of the stable configurations is "
                                      "among c1 fp32, c2 fp32 (error rate ≤ 5 %)")
    assert "unstable, not ranked: c0 fp32 (4 runs near 1,300 tokens/s, 3 near 1,000)" in fastest.verdict
    assert "docs/analysis.md, Unstable configurations" in fastest.verdict
    step = next_round(runs, sweep, "2026-11-01T00:00:00Z", NOW)
    assert step.add and sorted(step.racing) == ["sim-c1-fp32-1x2", "sim-c2-fp32-1x2"]


def test_a_race_left_with_one_stable_configuration_ends_unstable_without_rounds_needed():
    """Two configurations, one in two speeds: once it is set aside there is nothing to rank. The race ends
    (no rounds-needed for a race only it held open) and says why; nothing is called the fastest."""
    rows = [[1300, 1150], [1300, 1150], [1300, 1150], [1000, 1150], [1000, 1150], [1000, 1150]]
    values = np.log(np.array(rows, float)) + np.random.default_rng(6).normal(0, 0.002, (6, 2))
    runs = scenarios.runs(scenarios.Scenario("s", (1.0,) * 2, (0.0,) * 2), values)
    sweep = {"sweep": {"repeats": 3, "maxRepeats": 10}}
    fastest = next(r for r in analyze(runs, sweep).recommendations if r.objective == "fastest")
    assert fastest.decision == "unstable" and fastest.winner is None and fastest.rounds_needed is None
    assert fastest.verdict.startswith("no ranking: the runs of c0 fp32 fall into two speeds; unstable, not ranked")
    step = next_round(runs, sweep, "2026-11-01T00:00:00Z", NOW)
    assert not step.add and step.reason.startswith("decided after 6 rounds (1×2 CPU: no ranking")


def test_once_flagged_the_race_keeps_its_bounds():
    """Six configurations, one in two speeds, the others tied with its mean: in the sweeps where it was flagged,
    no strict claim is made and each stable rival stays dropped at most α (docs/analysis.md, The guarantee)."""
    draws = 1500
    state = scenarios.run_races(scenarios.two_speeds(6), 20, draws, seed=7, min_effect=0.05)
    flagged = state.unstable[:, 0]
    assert flagged.mean() >= 0.7
    assert not (state.outcome[flagged] == race.CLEAR).any()
    assert not np.isin(state.pick[flagged], [0]).any()
    assert (state.dropped_in[flagged][:, 1:] > 0).mean() <= race.ALPHA


def test_every_place_a_race_is_shown_flags_the_unstable_configuration(tmp_path):
    """Beyond the verdict: results.md's configurations table (its race column) and results.csv's fastestAtScale."""
    from gpt2bench.report import export
    from gpt2bench.report.markdown import race_cells

    ran = sweep_values()
    ran[4:, 2] = np.nan
    runs = scenarios.runs(scenarios.Scenario("s", (1.0,) * 3, (0.0,) * 3), ran)
    analysis = analyze(runs, {"sweep": {"repeats": 3, "maxRepeats": 10, "minEffect": 0}})
    assert race_cells(analysis)["sim-c0-fp32-1x2"] == "unstable, not ranked: 4 runs near 1,300, 3 near 1,000"
    fastest = next(r for r in analysis.recommendations if r.objective == "fastest")
    assert export.standing("sim-c0-fp32-1x2", fastest) == "unstable"
    assert export.standing("sim-c1-fp32-1x2", fastest) == "among-fastest"
