"""The analysis (docs/analysis.md) on crafted results, where every expected figure is worked out by hand:
repeats in spec and plan, scale, mean and spread, cost, scaling efficiency, the recommendation's margin and
noise rule, and each paper's finding with each verdict."""

from __future__ import annotations

import math
import random
import re

import pytest

from gpt2bench.plan import MAX_NAME_LENGTH, plan_runs
from gpt2bench.report import findings
from gpt2bench.report.analysis import FASTEST, Candidate, analyze, decide
from gpt2bench.report.measures import (
    Prices,
    Stat,
    configurations,
    efficiencies,
    run_efficiency,
    scale_of,
)
from gpt2bench.report.noise import (
    Sample,
    between_sweeps,
    estimate,
    family_confidence,
    holm,
    logs,
    ratio,
)
from gpt2bench.specification.model import Benchmark
from gpt2bench.specification.validation import SpecError, validate_spec
from gpt2bench.status import Recommendation, RunStatus

GIB = 2**30


def run(name: str, strategy: str, precision: str = "fp32", *, nodes: int = 1, gpus: int = 0, devices: int | None = None,
        procs: int | None = None, phase: str = "Succeeded", repeat: int | None = None, **figures) -> RunStatus:
    """A results entry; `figures` are RunResults fields (snake_case). devices: GPUs, else worker processes."""
    devices = devices or (nodes * gpus if gpus else nodes)
    return RunStatus(name=name, strategy=strategy, precision=precision, nodes=nodes, devices_per_node=gpus,
                     processes_per_node=procs or max(devices // nodes, 1), job_kind="PyTorchJob", job_name=name,
                     devices=devices, repeat=repeat, phase=phase,
                     reason="boom" if phase == "Failed" else None,
                     results=figures if phase == "Succeeded" else None)


def repeats(name: str, strategy: str, precision: str, values: list[float], rounds: bool = True,
            **kwargs) -> list[RunStatus]:
    """One run per value of tokens/s, named <name>-r<k> as the plan names rounds; `rounds=False`: runs that say
    nothing of their rounds (an older results document), so only unpaired comparisons are possible."""
    if not rounds:
        return [run(name, strategy, precision, tokens_per_second=v, **kwargs) for v in values]
    return [run(f"{name}-r{k}", strategy, precision, repeat=k, tokens_per_second=v, **kwargs)
            for k, v in enumerate(values, start=1)]


def by(recs, objective, scale):
    return next(r for r in recs if r.objective == objective and r.scale == scale)


# ---------------------------------------------------------------- spec and plan
def test_spec_names_the_field_of_a_bad_repeat_or_price():
    good = validate_spec({"sweep": {"strategies": [{"name": "ddp"}], "repeats": 3},
                          "cost": {"gpuHour": 2.5, "currency": "EUR"}})
    assert good.sweep.repeats == 3 and good.cost.gpu_hour == 2.5 and good.cost.node_hour is None
    for spec, field in [({"sweep": {"strategies": [{"name": "ddp"}], "repeats": 0}}, "spec.sweep.repeats"),
                        ({"sweep": {"strategies": [{"name": "ddp"}]}, "cost": {}}, "spec.cost.gpuHour"),
                        ({"sweep": {"strategies": [{"name": "ddp"}]}, "cost": {"nodeHour": -1}}, "spec.cost.nodeHour")]:
        with pytest.raises(SpecError) as error:
            validate_spec(spec)
        assert [path for path, _ in error.value.errors] == [field]


def test_repeats_are_rounds_over_every_scale_and_named_with_a_whole_suffix():
    spec = validate_spec({"sweep": {"strategies": [{"name": "single"}, {"name": "ddp"}], "repeats": 2,
                                    "breakdown": "inline", "scales": [{"processesPerNode": 1}, {"processesPerNode": 2}]}})
    name = "a-benchmark-name-long-enough-to-be-shortened-x"
    runs = plan_runs(Benchmark(name=name, spec=spec))
    configs = {("single", 1), ("ddp", 1), ("ddp", 2)}  # single is the same run at both scales: planned once
    assert [r.repeat for r in runs] == [1, 1, 1, 2, 2, 2]  # every configuration of every scale, then again
    assert {(r.strategy.name, r.world_size) for r in runs[:3]} == {(r.strategy.name, r.world_size) for r in runs[3:]}
    assert {(r.strategy.name, r.world_size) for r in runs} == configs
    names = [r.name for r in runs]
    assert len(set(names)) == len(names)
    assert all(len(n) <= MAX_NAME_LENGTH and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", n) for n in names)
    assert all(n.endswith(f"-r{r.repeat}") for n, r in zip(names, runs))
    assert {n[:-3] for n in names[:3]} == {n[:-3] for n in names[3:]}  # a configuration's repeats share the name


def test_one_repeat_keeps_the_plain_names():
    spec = validate_spec({"sweep": {"strategies": [{"name": "ddp"}]}})
    (only,) = plan_runs(Benchmark(name="b", spec=spec))
    assert only.name == "b-ddp-fp32-1x1" and only.repeat is None


# ---------------------------------------------------------------- measures
def test_spread_is_the_sample_standard_deviation():
    assert Stat.of([10, 12, 14]) == Stat(12.0, 2.0, 3)  # sqrt(((-2)^2 + 0 + 2^2) / (3 - 1)) = 2
    assert Stat.of([7.0, None]) == Stat(7.0, None, 1)  # one measurement: spread unknown
    assert Stat.of([None]) is None


def test_scale_counts_devices_not_parameter_servers():
    ps = run("b-ps-fp32-1x2", "ps", procs=3, devices=2)  # 2 workers + 1 server in the pod
    ddp = run("b-ddp-fp32-1x2", "ddp", devices=2)
    dp = run("b-dataparallel-fp32-1x4g", "dataparallel", gpus=4, procs=1)  # one process, 4 GPUs
    assert scale_of(ps) == scale_of(ddp) and scale_of(ps).label == "1×2 CPU"
    assert scale_of(dp).label == "1×4 GPU" and scale_of(dp).devices == 4
    assert [c.name for c in configurations([ps, ddp, dp])] == [ps.name, ddp.name, dp.name]


def test_cost_per_million_tokens_prices_every_gpu_and_pod():
    prices = Prices(gpu_hour=2.0, node_hour=10.0, currency="EUR")
    big = run("b-ddp-fp32-2x4g", "ddp", nodes=2, gpus=4, tokens_per_second=10_000.0)
    assert prices.hourly(big) == 2.0 * 8 + 10.0 * 2  # 8 GPUs, 2 pods
    assert prices.per_million_tokens(big) == pytest.approx(36 / (10_000 * 3600) * 1e6)  # = 1.0 EUR
    single = run("b-single-fp32-1x1g", "single", gpus=1, tokens_per_second=3_600.0)
    assert prices.per_million_tokens(single) == pytest.approx(12 / (3_600 * 3600) * 1e6)
    cpu = run("b-ddp-fp32-1x2", "ddp", devices=2, tokens_per_second=500.0)
    assert Prices(gpu_hour=2.0).per_million_tokens(cpu) is None  # GPU prices do not cover a CPU run
    assert Prices.from_spec({"cost": {"nodeHour": 0.5}}) == Prices(0.0, 0.5, "USD")
    assert Prices.from_spec({}) is None


def test_scaling_efficiency_is_per_device_throughput_over_the_smallest_scale():
    runs = [*repeats("b-ddp-fp32-1x1", "ddp", "fp32", [1000.0, 1100.0], tokens_per_second_per_device=None),
            *repeats("b-ddp-fp32-1x2", "ddp", "fp32", [1800.0, 2000.0], devices=2)]
    for r in runs:  # per device: 1000, 1100 at 1 device; 900, 1000 at 2
        r.results.tokens_per_second_per_device = r.results.tokens_per_second / r.devices
    configs = configurations(runs)
    (eff,) = efficiencies(configs)
    assert eff.baseline is configs[0] and eff.config is configs[1]
    here, there = math.sqrt(900 * 1000), math.sqrt(1000 * 1100)  # geometric means
    assert eff.stat.mean == pytest.approx(here / there)
    cv = Stat.of([900, 1000]).spread / 950 + Stat.of([1000, 1100]).spread / 1050
    assert eff.stat.spread == pytest.approx(here / there * cv)
    assert run_efficiency(runs[2], configs) == pytest.approx(900 / there)
    assert run_efficiency(runs[0], configs) is None  # the baseline itself
    assert analyze(runs).scaling[1].efficiency == pytest.approx(here / there)


# ---------------------------------------------------------------- noise and intervals
# Quantiles from tables: the tests must not compute them the way the code does. t(0.975, df); F(0.95; d1, d2).
T975 = {2: 4.302653, 4: 2.776445, 6: 2.446912}
F95 = {(2, 8): 4.458970, (2, 10): 4.102821}


def squares(values):
    """Σ (ln x − mean ln x)², worked out directly."""
    mean = sum(math.log(v) for v in values) / len(values)
    return sum((math.log(v) - mean) ** 2 for v in values)


def test_noise_is_pooled_per_scale_on_the_log_scale():
    model = estimate([Sample("a", "1×2", (90.0, 110.0)), Sample("b", "1×2", (198.0, 202.0)),
                      Sample("c", "2×2", (50.0, 55.0)), Sample("d", "2×2", (7.0,))])
    # 1×2: (ln 110/90)² / 2 + (ln 202/198)² / 2 over df 2; 2×2: (ln 55/50)² / 2 over df 1
    first = ((math.log(110 / 90) ** 2 + math.log(202 / 198) ** 2) / 2) / 2
    assert model.of("a").value == pytest.approx(first) and model.of("a").df == 2 and model.of("b") == model.of("a")
    assert model.of("c").value == pytest.approx(math.log(55 / 50) ** 2 / 2) and model.of("c").df == 1
    assert model.of("d") == model.of("c")  # measured once: its scale's noise
    assert estimate([Sample("e", "1×1", (7.0,))]).of("e") is None  # nothing measured twice: unknown


def test_a_far_noisier_configuration_keeps_its_own_noise_and_leaves_the_pool():
    quiet = [Sample(f"q{i}", "s", (99.0, 100.0, 101.0)) for i in range(4)]
    twice = Sample("twice", "s", (98.0, 100.0, 102.0))  # about 4x the quiet variance: below F(0.95; 2, 8) = 4.46
    model = estimate([*quiet, twice])
    ratio_ = (squares(twice.values) / 2) / (squares(quiet[0].values) / 2)
    assert 3.9 < ratio_ < F95[(2, 8)] and not model.of("twice").own  # not far noisier: pooled with the rest
    noisy = Sample("noisy", "s", (97.0, 100.0, 103.0))  # about 9x: beyond it
    model = estimate([*quiet, noisy])
    assert (squares(noisy.values) / 2) / (squares(quiet[0].values) / 2) > F95[(2, 8)]
    assert model.of("noisy").own and model.of("noisy").value == pytest.approx(squares(noisy.values) / 2)
    assert model.of("noisy").df == 2
    assert model.of("q0").value == pytest.approx(squares(quiet[0].values) / 2) and model.of("q0").df == 8
    (pool,) = model.pools
    assert pool.noisier == ("noisy",) and pool.members == ("q0", "q1", "q2", "q3")


def test_values_at_or_below_zero_are_refused_by_every_ratio_and_noise_function():
    with pytest.raises(ValueError, match="0 is not a measurement"):
        logs([1.0, 0.0])
    with pytest.raises(ValueError, match="must|not a measurement"):
        Sample("a", "s", (5.0, -1.0)).log_squares()
    runs = [run(f"e-r{k}", "ddp", devices=2, repeat=k, tokens_per_second=100.0, energy_joules_per_million_tokens=j)
            for k, j in enumerate([0.0, 50.0, 52.0], start=1)]
    (config,) = configurations(runs)
    from gpt2bench.report.measures import energy_per_million_tokens
    assert config.sample(energy_per_million_tokens).values == (50.0, 52.0)  # the 0 is no measurement
    analysis = analyze(runs)  # no ZeroDivisionError, no AttributeError
    assert by(analysis.recommendations, "efficient", "1×2 CPU").measurements == 2


def test_a_ratio_is_paired_within_the_rounds_its_configurations_share():
    """Three rounds in common: the mean of the per-round log ratios, its standard error from their spread, n − 1
    degrees of freedom, whatever else either configuration ran (each round's drift cancels)."""
    a = Sample("a", "s", (120.0, 132.0, 118.0, 500.0), (1, 2, 3, 4))  # round 4 has no partner: left out
    b = Sample("b", "s", (100.0, 110.0, 100.0), (1, 2, 3))
    contrast = ratio([a], [b])
    z = [math.log(1.2), math.log(1.2), math.log(1.18)]
    mean = sum(z) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in z) / 2)
    assert contrast.paired and contrast.df == 2
    assert contrast.center == pytest.approx(mean) and contrast.se == pytest.approx(sd / math.sqrt(3))
    interval = contrast.interval(0.95)
    assert interval.low == pytest.approx(math.exp(mean - T975[2] * sd / math.sqrt(3)), rel=1e-6)


def test_a_ratio_of_configurations_without_three_rounds_in_common_is_welch_on_their_own_variances():
    c = Sample("c", "s", (150.0, 100.0, 125.0))
    a = Sample("a", "s", (100.0, 104.0, 96.0, 100.0))
    contrast = ratio([c], [a])
    vc, va = squares(c.values) / 2, squares(a.values) / 3
    se2 = vc / 3 + va / 4
    assert not contrast.paired and contrast.se == pytest.approx(math.sqrt(se2))
    assert contrast.df == pytest.approx(se2**2 / ((vc / 3) ** 2 / 2 + (va / 4) ** 2 / 3))
    assert contrast.estimate == pytest.approx((150 * 100 * 125) ** (1 / 3) / (100 * 104 * 96 * 100) ** (1 / 4))
    # two measurements are one degree of freedom: no variance is trusted on it, nothing is decided
    assert ratio([Sample("a", "s", (120.0, 121.0))], [Sample("x", "s", (100.0, 101.0, 99.0))]) is None
    assert ratio([Sample("a", "s", (120.0,))], [Sample("x", "s", (100.0,))]) is None
    # a figure measured alike in every run of both (model state bytes) is exact
    exact = ratio([Sample("a", "s", (3.0, 3.0))], [Sample("b", "s", (2.0, 2.0))])
    assert exact.se == 0 and exact.estimate == pytest.approx(1.5) and exact.interval().low == pytest.approx(1.5)


def test_an_interval_of_an_extreme_ratio_saturates_instead_of_overflowing():
    from gpt2bench.report.noise import Contrast

    wide = Contrast(5.0, 400.0, 2)  # the old rule raised OverflowError here (math.exp of a huge bound)
    assert wide.interval(0.9999).high == math.inf and wide.interval(0.9999).low == 0.0


def test_a_rival_within_the_smallest_difference_that_matters_makes_the_decision_equivalent():
    runs = [*repeats("q-ddp-fp32-1x2", "ddp", "fp32", [100.0, 101.0, 100.5], devices=2),
            *repeats("q-fsdp-fp32-1x2", "fsdp", "fp32", [100.5, 100.4, 100.6], devices=2),
            *repeats("q-ps-fp32-1x2", "ps", "fp32", [50.0, 50.5, 50.2], devices=2)]
    plain = by(analyze(runs, {"sweep": {"repeats": 3, "minEffect": 0}}).recommendations, "fastest", "1×2 CPU")
    assert plain.decision == "no-clear-winner" and plain.candidates == ["q-fsdp-fp32-1x2", "q-ddp-fp32-1x2"]
    assert [d.configuration for d in plain.dropped] == ["q-ps-fp32-1x2"]  # 50 % behind: beaten by both
    within = by(analyze(runs, {"sweep": {"repeats": 3, "minEffect": 0.05}}).recommendations, "fastest", "1×2 CPU")
    assert within.decision == "equivalent" and set(within.candidates) == {"q-fsdp-fp32-1x2", "q-ddp-fp32-1x2"}
    assert within.winner is None and 0 <= within.behind_at_most < 0.05  # no more than 5 % behind the fastest
    assert within.verdict.endswith("is the fastest or within 5 % of it (error rate ≤ 5 %)")


def test_bonferroni_splits_the_error_over_a_claims_comparisons():
    assert family_confidence(1) == pytest.approx(0.95) and family_confidence(4) == pytest.approx(0.9875)


def test_holm_tests_the_smallest_p_value_at_alpha_over_m_and_stops_at_the_first_it_cannot_reject():
    # sorted 0.005, 0.01, 0.03, 0.04: 0.005 <= 0.05/4, 0.01 <= 0.05/3, 0.03 > 0.05/2: stop; 0.04 keeps 0.05/2
    levels = [1 - c for c in holm([0.01, 0.04, 0.03, 0.005])]
    assert levels == pytest.approx([0.05 / 3, 0.05 / 2, 0.05 / 2, 0.05 / 4])
    assert [1 - c for c in holm([0.2])] == pytest.approx([0.05])


def test_two_sweeps_compare_each_configuration_on_its_own_variance_with_welchs_degrees_of_freedom():
    a = Sample("x", "s", (100.0, 102.0, 98.0))
    b = Sample("x", "s", (110.0, 112.2, 107.8))
    contrast = between_sweeps(a, b)
    va, vb = squares(a.values) / 2, squares(b.values) / 2
    se2 = va / 3 + vb / 3
    assert contrast.df == pytest.approx(se2**2 / ((va / 3) ** 2 / 2 + (vb / 3) ** 2 / 2))
    assert contrast.se == pytest.approx(math.sqrt(se2))
    assert between_sweeps(Sample("x", "s", (100.0, 101.0)), b) is None  # 1 degree of freedom: unknown


# ---------------------------------------------------------------- the recommendation's rules
def own_t_interval(a, b, confidence):
    """a ÷ b of two unpaired configurations, Welch on their own variances, worked out directly (t from the table
    where the degrees of freedom are whole, else scipy as an independent check)."""
    from scipy.stats import t as student

    va, vb = squares(a) / (len(a) - 1), squares(b) / (len(b) - 1)
    se2 = va / len(a) + vb / len(b)
    df = se2**2 / ((va / len(a)) ** 2 / (len(a) - 1) + (vb / len(b)) ** 2 / (len(b) - 1))
    center = sum(map(math.log, a)) / len(a) - sum(map(math.log, b)) / len(b)
    half = student.ppf(1 - (1 - confidence) / 2, df) * math.sqrt(se2)
    return math.exp(center), math.exp(center - half), math.exp(center + half), df


def test_runs_without_rounds_are_compared_unpaired_and_a_margin_beyond_the_noise_names_a_winner():
    """An older results document (no round per run): the fastest is decided as the other objectives are, each
    configuration on its own variance (Welch), two-sided at 95 %."""
    runs = [*repeats("b-ddp-fp32-1x2", "ddp", "fp32", [198.0, 200.0, 202.0], False, devices=2),
            *repeats("b-fsdp-fp32-1x2", "fsdp", "fp32", [99.0, 100.0, 101.0], False, devices=2)]
    rec = by(analyze(runs).recommendations, "fastest", "1×2 CPU")
    estimate, low, high, df = own_t_interval([198.0, 200.0, 202.0], [99.0, 100.0, 101.0], 0.95)
    assert (rec.decision, rec.winner, rec.run, rec.candidates) == ("clear", "b-ddp-fp32-1x2", "b-ddp-fp32-1x2", None)
    assert rec.margin == pytest.approx(estimate - 1) and rec.noise_df == pytest.approx(df)
    assert rec.margin_low == pytest.approx(low - 1, rel=1e-6) and rec.margin_high == pytest.approx(high - 1, rel=1e-6)
    assert rec.confidence == 0.95 and rec.verdict == "ddp fp32 is the fastest (error rate ≤ 5 %)"


def test_a_winner_must_beat_every_rival_not_only_the_runner_up():
    runs = [*repeats("c-ddp-fp32-1x2", "ddp", "fp32", [200.0, 201.0, 202.0], False, devices=2),
            *repeats("c-fsdp-fp32-1x2", "fsdp", "fp32", [150.0, 151.0, 152.0], False, devices=2),
            *repeats("c-ps-fp32-1x2", "ps", "fp32", [100.0, 150.0, 220.0], False, devices=2)]  # far noisier
    rec = by(analyze(runs).recommendations, "fastest", "1×2 CPU")
    assert rec.runner_up == "c-fsdp-fp32-1x2" and rec.margin_low > 0  # beyond the noise over the runner-up
    assert rec.decision == "no-clear-winner" and rec.candidates == ["c-ddp-fp32-1x2", "c-ps-fp32-1x2"]
    assert rec.verdict == "not separated yet: the fastest is among ddp fp32, ps fp32 (error rate ≤ 5 %)"


def test_the_race_drops_the_beaten_and_names_the_fastest_with_its_round():
    """Rounds of three configurations: fsdp is far behind, ddp ahead of horovod by 10 % with 1 % noise. Every
    comparison is paired; the race (fixed 4 rounds: one look) drops both rivals and names ddp."""
    runs = [*repeats("r-ddp-fp32-1x2", "ddp", "fp32", [110.0, 112.0, 109.0, 111.0], devices=2),
            *repeats("r-horovod-fp32-1x2", "horovod", "fp32", [100.0, 101.0, 99.5, 100.5], devices=2),
            *repeats("r-fsdp-fp32-1x2", "fsdp", "fp32", [60.0, 61.0, 59.0, 60.0], devices=2)]
    analysis = analyze(runs, {"sweep": {"repeats": 4}})
    rec = by(analysis.recommendations, "fastest", "1×2 CPU")
    assert (rec.decision, rec.winner, rec.decided_in, rec.paired) == ("clear", "r-ddp-fp32-1x2", 4, True)
    assert {(d.configuration, d.round, d.behind) for d in rec.dropped} == {
        ("r-horovod-fp32-1x2", 4, "r-ddp-fp32-1x2"), ("r-fsdp-fp32-1x2", 4, "r-ddp-fp32-1x2")}
    z = [math.log(a / b) for a, b in zip([110.0, 112.0, 109.0, 111.0], [100.0, 101.0, 99.5, 100.5])]
    assert rec.margin == pytest.approx(math.exp(sum(z) / 4) - 1) and rec.noise_df == 3
    assert rec.value == pytest.approx((110.0 * 112.0 * 109.0 * 111.0) ** 0.25)  # the geometric mean everywhere
    assert rec.verdict == "ddp fp32 is the fastest (error rate ≤ 5 %)" and analysis.racing is None
    assert analysis.recommended is rec or analysis.recommended == rec


def test_single_measurements_name_no_winner_and_say_rounds_are_needed():
    runs = [run("b-ddp-fp32-1x2", "ddp", devices=2, tokens_per_second=110.0, peak_memory_bytes=3 * GIB),
            run("b-fsdp-fp32-1x2", "fsdp", devices=2, tokens_per_second=100.0, peak_memory_bytes=2 * GIB)]
    analysis = analyze(runs)
    fastest, leanest = by(analysis.recommendations, "fastest", "1×2 CPU"), by(analysis.recommendations, "leanest",
                                                                               "1×2 CPU")
    assert (fastest.decision, fastest.winner, fastest.run) == ("needs-repeats", None, "b-ddp-fp32-1x2")
    assert fastest.margin == pytest.approx(0.1) and fastest.margin_low is None and fastest.spread is None
    assert (leanest.decision, leanest.run) == ("needs-repeats", "b-fsdp-fp32-1x2")  # less memory ranks first
    assert leanest.margin == pytest.approx(1 / 3) and leanest.unit == "bytes"
    assert analysis.recommended.winner is None and analysis.noise == []
    assert fastest.verdict == "not decided: a comparison needs 3 rounds or more (has 1)"


def test_two_rounds_decide_nothing_three_can():
    two = [*repeats("t-ddp-fp32-1x2", "ddp", "fp32", [200.0, 201.0], devices=2),
           *repeats("t-fsdp-fp32-1x2", "fsdp", "fp32", [100.0, 101.0], devices=2)]
    assert by(analyze(two).recommendations, "fastest", "1×2 CPU").decision == "needs-repeats"
    three = two + [run("t-ddp-fp32-1x2-r3", "ddp", devices=2, repeat=3, tokens_per_second=199.0),
                   run("t-fsdp-fp32-1x2-r3", "fsdp", devices=2, repeat=3, tokens_per_second=100.5)]
    assert by(analyze(three).recommendations, "fastest", "1×2 CPU").decision == "clear"


def test_memory_measured_alike_in_every_repeat_decides_exactly():
    runs = [*[run(f"b-ddp-fp32-1x2-r{k}", "ddp", devices=2, repeat=k, tokens_per_second=100.0 + k,
                  peak_memory_bytes=3 * GIB) for k in (1, 2)],
            *[run(f"b-fsdp-fp32-1x2-r{k}", "fsdp", devices=2, repeat=k, tokens_per_second=100.0 + k,
                  peak_memory_bytes=2 * GIB) for k in (1, 2)]]
    analysis = analyze(runs)
    leanest = by(analysis.recommendations, "leanest", "1×2 CPU")
    assert (leanest.decision, leanest.winner, leanest.spread) == ("clear", "b-fsdp-fp32-1x2", 0.0)
    assert leanest.margin_low == leanest.margin_high == pytest.approx(1 / 3)
    assert {n.figure for n in analysis.noise} == {"tokensPerSecond", "peakMemoryBytes"}


def test_leanest_is_a_family_of_its_own_decided_with_holm_and_the_race_keeps_its_level():
    """Memory at two scales is one family (Holm across them); the fastest race is another and keeps 95 %."""
    def config(name, strategy, devices, figures):
        return [run(f"{name}-r{k}", strategy, devices=devices, repeat=k, tokens_per_second=t, peak_memory_bytes=m)
                for k, (t, m) in enumerate(figures, start=1)]
    small = [(200.0, 30), (204.0, 31), (196.0, 29)]
    runs = [*config("h-ddp-fp32-1x2", "ddp", 2, [(t, m * GIB // 10) for t, m in small]),
            *config("h-ps-fp32-1x2", "ps", 2, [(t / 2, m * GIB // 15) for t, m in small]),
            *config("h-ddp-fp32-1x4", "ddp", 4, [(t, m * GIB // 10) for t, m in small]),
            *config("h-ps-fp32-1x4", "ps", 4, [(t / 2, m * GIB // 12) for t, m in small])]
    analysis = analyze(runs)
    lean = [r for r in analysis.recommendations if r.objective == "leanest"]
    assert sorted(r.confidence for r in lean) == pytest.approx([0.95, 1 - 0.05 / 2])  # Holm over the family
    assert all(r.confidence == 0.95 for r in analysis.recommendations if r.objective == "fastest")
    assert analysis.alpha == 0.05


def test_failed_runs_are_left_out_and_named_per_scale():
    runs = [run("b-ddp-fp32-1x2", "ddp", devices=2, tokens_per_second=10.0),
            run("b-fsdp-fp32-1x2", "fsdp", devices=2, phase="Failed"),
            run("b-single-fp32-1x1", "single", phase="Failed")]
    analysis = analyze(runs)
    rec = by(analysis.recommendations, "fastest", "1×2 CPU")
    assert (rec.decision, rec.winner, rec.excluded) == ("only-candidate", "b-ddp-fp32-1x2", ["b-fsdp-fp32-1x2 (Failed)"])
    empty = by(analysis.recommendations, "fastest", "1×1 CPU")
    assert (empty.decision, empty.run, empty.excluded) == ("not-measurable", None, ["b-single-fp32-1x1 (Failed)"])
    assert analysis.recommended.winner == "b-ddp-fp32-1x2"


def test_headline_is_the_fastest_at_the_largest_scale_and_every_objective_is_answered():
    runs = [run("b-ddp-fp32-1x1g", "ddp", gpus=1, tokens_per_second=100.0, tokens_per_second_per_device=100.0,
                peak_memory_bytes=GIB),
            run("b-ddp-fp32-1x2g", "ddp", gpus=2, tokens_per_second=180.0, tokens_per_second_per_device=90.0,
                peak_memory_bytes=GIB),
            run("b-fsdp-fp32-1x1g", "fsdp", gpus=1, tokens_per_second=90.0, tokens_per_second_per_device=90.0,
                peak_memory_bytes=GIB),
            run("b-fsdp-fp32-1x2g", "fsdp", gpus=2, tokens_per_second=171.0, tokens_per_second_per_device=85.5,
                peak_memory_bytes=GIB // 2)]
    analysis = analyze(runs, {"cost": {"gpuHour": 3.6}})
    assert analysis.recommended.run == "b-ddp-fp32-1x2g" and analysis.recommended.scale == "1×2 GPU"
    scalable = by(analysis.recommendations, "scalable", "1×2 GPU")
    assert scalable.run == "b-fsdp-fp32-1x2g"
    assert (scalable.value, scalable.runner_up_value) == (pytest.approx(0.95), pytest.approx(0.9))
    cheapest_overall = by(analysis.recommendations, "cheapest", None)
    # 3.6 per GPU-hour: 1 GPU at 100 tokens/s = 10 per 1M tokens; 2 GPUs at 180 tokens/s = 11.1
    assert cheapest_overall.run == "b-ddp-fp32-1x1g" and cheapest_overall.value == pytest.approx(10.0)
    assert by(analysis.recommendations, "cheapest", "1×2 GPU").run == "b-ddp-fp32-1x2g"  # ranks as fastest
    assert by(analysis.recommendations, "leanest", "1×2 GPU").run == "b-fsdp-fp32-1x2g"
    assert {(r.objective, r.scale) for r in analysis.recommendations} == {
        (o, s) for o in ("fastest", "leanest", "cheapest") for s in ("1×1 GPU", "1×2 GPU")
    } | {("cheapest", None), ("scalable", "1×2 GPU"), ("efficient", None)}
    assert all(r.winner is None for r in analysis.recommendations)  # single measurements all


def test_scaling_efficiency_decides_with_its_baselines_noise_too():
    runs = [*repeats("b-ddp-fp32-1x1", "ddp", "fp32", [100.0, 100.0, 100.0]),
            *repeats("b-ddp-fp32-1x2", "ddp", "fp32", [190.0, 190.0, 190.0], devices=2),
            *repeats("b-fsdp-fp32-1x1", "fsdp", "fp32", [100.0, 100.0, 100.0]),
            *repeats("b-fsdp-fp32-1x2", "fsdp", "fp32", [150.0, 150.0, 150.0], devices=2)]
    for r in runs:
        r.results.tokens_per_second_per_device = r.results.tokens_per_second / r.devices
    rec = by(analyze(runs).recommendations, "scalable", "1×2 CPU")
    assert (rec.decision, rec.winner) == ("clear", "b-ddp-fp32-1x2")  # 0.95 vs 0.75, no noise at all
    runs[4].results.tokens_per_second_per_device = 60.0  # ddp 1x2's rounds now 95, 60, 95: noisy
    rec = by(analyze(runs).recommendations, "scalable", "1×2 CPU")
    assert rec.decision == "no-clear-winner" and set(rec.candidates) == {"b-ddp-fp32-1x2", "b-fsdp-fp32-1x2"}


def test_objectives_without_data_say_why():
    recs = analyze([run("b-ddp-fp32-1x2", "ddp", devices=2, tokens_per_second=1.0)]).recommendations
    assert by(recs, "cheapest", None).decision == "not-measurable" and "spec.cost" in by(recs, "cheapest", None).note
    assert "one scale" in by(recs, "scalable", None).note
    no_gpu_price = analyze([run("b-ddp-fp32-1x2", "ddp", devices=2, tokens_per_second=1.0)], {"cost": {"gpuHour": 1}})
    assert "nodeHour" in by(no_gpu_price.recommendations, "cheapest", None).note


def test_an_exact_tie_ranks_by_plan_order_and_names_no_winner():
    configs = configurations([run("a", "ddp"), run("b", "fsdp")])
    pending = decide(FASTEST, "s", [Candidate(configs[0], [Sample("a", "s", (5.0, 5.0))]),
                                    Candidate(configs[1], [Sample("b", "s", (5.0, 5.0))])], [])
    tie = pending.conclude(0.95)
    assert pending.p_value == 1.0
    assert (tie.run, tie.margin, tie.decision, tie.candidates) == ("a", 0.0, "no-clear-winner", ["a", "b"])


# ---------------------------------------------------------------- CPU resources per rank
def test_cpu_configurations_rank_only_with_equal_cores_per_rank_and_the_rest_apart():
    def cpu(name, strategy, values, threads, cores):
        return repeats(name, strategy, "fp32", values, devices=2, threads_per_rank=threads, cores_per_rank=cores)
    runs = [*cpu("r-ddp-fp32-1x2", "ddp", [100.0, 101.0], 1, 1.0),
            *cpu("r-fsdp-fp32-1x2", "fsdp", [90.0, 91.0], 1, 1.0),
            *cpu("r-ps-fp32-1x2", "ps", [300.0, 301.0], 1, 2 / 3)]  # its server shares the pod: 0.667 cores per rank
    analysis = analyze(runs)
    main, apart = [r for r in analysis.recommendations if r.objective == "fastest"]
    assert main.run == "r-ddp-fp32-1x2" and main.per_rank == "1 thread, 1 core per rank"
    assert main.ranked_apart == ["r-ps-fp32-1x2 (1 thread, 0.667 cores per rank)"]
    assert "r-ps-fp32-1x2" not in (main.candidates or []) and main.runner_up == "r-fsdp-fp32-1x2"
    assert apart.run == "r-ps-fp32-1x2" and apart.note.startswith("ranked apart") and apart.per_rank.endswith(
        "0.667 cores per rank")
    assert analysis.recommended.run == "r-ddp-fp32-1x2"  # the fastest of the comparable ones heads the report


def test_scaling_processes_inside_a_fixed_cpu_pod_is_refused_with_the_reason():
    def cpu(name, strategy, devices, values, cores):
        found = repeats(name, strategy, "fp32", values, devices=devices, threads_per_rank=1, cores_per_rank=cores)
        for r in found:
            r.results.tokens_per_second_per_device = r.results.tokens_per_second / devices
        return found
    runs = [*cpu("p-ddp-fp32-1x1", "ddp", 1, [100.0, 101.0], 2.0), *cpu("p-ddp-fp32-1x2", "ddp", 2, [102.0, 103.0], 1.0)]
    analysis = analyze(runs)
    (_, row) = analysis.scaling
    assert row.efficiency == pytest.approx(0.5, rel=0.02) and "not a scaling measurement" in row.refused
    rec = by(analysis.recommendations, "scalable", "1×2 CPU")
    assert rec.decision == "not-measurable" and "by construction" in rec.note
    f = finding(analysis, "ddp-scales-near-linearly")
    assert f.verdict == "not-measurable" and "by construction" in f.measured  # not "does not hold"


# ---------------------------------------------------------------- calibration: simulated sweeps
# The race's own calibration (false claims, power, rounds needed) is in tests/test_race.py.
def test_the_findings_are_a_family_whose_wrong_verdicts_stay_under_five_percent():
    """Six configurations of equal means (5 % noise, 3 rounds): the claims that compare them ("DDP with mixed
    precision is the fastest", "mixed precision is faster") hold or fail only wrongly here; against every rival,
    Bonferroni within a claim and Holm across the family keep that rare, and the race names no false winner."""
    rng = random.Random(8)
    configs = [("ddp", "bf16"), ("fsdp", "bf16"), ("horovod", "bf16"), ("ps", "bf16"), ("ddp", "fp32"), ("fsdp", "fp32")]
    trials, does_not_hold, any_wrong, false_fastest = 300, 0, 0, 0
    for _ in range(trials):
        runs = [run(f"m-{s}-{p}-1x2-r{k}", s, p, devices=2, repeat=k, tokens_per_second=100 * math.exp(rng.gauss(0, 0.05)))
                for s, p in configs for k in (1, 2, 3)]
        analysis = analyze(runs, rounds_needed=False)
        verdicts = {f.id: f.verdict for f in analysis.findings}
        does_not_hold += verdicts["ddp-mixed-precision-fastest-on-one-node"] == "does-not-hold"
        any_wrong += (verdicts["ddp-mixed-precision-fastest-on-one-node"] in ("holds", "does-not-hold")
                      or verdicts["mixed-precision-faster"] in ("holds", "does-not-hold"))
        false_fastest += any(r.decision == "clear" for r in analysis.recommendations if r.objective == "fastest")
    assert does_not_hold / trials <= 0.035 and any_wrong / trials <= 0.05 and false_fastest / trials <= 0.05


def _drifting(rng, means, rounds, paired):
    """Six configurations at 3 % noise in rounds that each shift every run alike by a drift of 10 % (another job, a
    throttled clock); `paired=False`: the same runs with their rounds unknown (an older results document)."""
    names = [("ddp", "fp32"), ("fsdp", "fp32"), ("horovod", "fp32"), ("ps", "fp32"), ("ps-sharded", "fp32"),
             ("single", "fp32")]
    effects = [rng.gauss(0, 0.10) for _ in range(rounds)]
    return [run(f"d-{s}-{p}-1x2" + (f"-r{k}" if paired else ""), s, p, devices=2, repeat=k if paired else None,
                tokens_per_second=mean * math.exp(effects[k - 1] + rng.gauss(0, 0.03)))
            for (s, p), mean in zip(names, means) for k in range(1, rounds + 1)]


def test_comparing_within_rounds_finds_a_true_lead_that_drift_hides_from_unpaired_comparisons():
    """Drift between rounds (10 %) larger than the runs' own noise (3 %), 8 rounds: one configuration truly 10 %
    faster is named by the race (within rounds) far more often than by unpaired comparisons, which see the drift
    as noise; neither names a false winner among equals."""
    rng = random.Random(31)
    trials = 150
    rates = {}
    for paired in (True, False):
        false = sum(by(analyze(_drifting(rng, [100.0] * 6, 8, paired), rounds_needed=False).recommendations,
                       "fastest", "1×2 CPU").winner is not None for _ in range(trials))
        found = sum(by(analyze(_drifting(rng, [110.0] + [100.0] * 5, 8, paired), rounds_needed=False).recommendations,
                       "fastest", "1×2 CPU").winner == "d-ddp-fp32-1x2" for _ in range(trials))
        rates[paired] = (false / trials, found / trials)
    assert rates[True][0] <= 0.05 and rates[False][0] <= 0.05
    assert rates[True][1] >= 0.5 and rates[False][1] <= 0.25


def test_the_round_effect_and_each_configurations_noise_after_it_are_reported():
    """Two rounds that shift every configuration by +5 % and −5 %: the rounds explain nearly all of the spread."""
    runs = [run(f"e-{s}-fp32-1x2-r{k}", s, devices=2, repeat=k, tokens_per_second=base * f * j)
            for s, base, jitter in (("ddp", 100.0, (1.0, 1.01)), ("fsdp", 80.0, (1.0, 0.99)), ("ps", 90.0, (1.0, 1.0)))
            for k, f, j in ((1, 1.05, jitter[0]), (2, 0.95, jitter[1]))]
    (noise_entry,) = [n for n in analyze(runs).noise if n.figure == "tokensPerSecond"]
    assert noise_entry.round_share > 0.95 and noise_entry.paired_cv < noise_entry.cv / 5
    assert [round(e, 3) for e in noise_entry.round_effects] == [pytest.approx(0.05, abs=0.01),
                                                               pytest.approx(-0.05, abs=0.01)]
    third = [run(f"e-{s}-fp32-1x2-r3", s, devices=2, repeat=3, tokens_per_second=base)
             for s, base in (("ddp", 100.0), ("fsdp", 80.0), ("ps", 90.0))]
    rec = by(analyze(runs + third).recommendations, "fastest", "1×2 CPU")
    assert rec.paired and rec.decision == "clear" and rec.winner == "e-ddp-fp32-1x2"


# ---------------------------------------------------------------- the papers' findings
def finding(analysis, id_):
    return next(f for f in analysis.findings if f.id == id_)


def check(analysis, id_):
    return next(f for f in analysis.checks if f.id == id_)


def test_every_finding_is_not_measurable_without_its_comparison():
    analysis = analyze([run("b-single-fp32-1x1", "single", tokens_per_second=1.0, final_loss=5.0)])
    assert [f.verdict for f in analysis.findings + analysis.checks] == ["not-measurable"] * 7
    assert all(f.measured.startswith("needs ") for f in analysis.findings + analysis.checks)
    assert {f.id for f in analysis.findings} == {
        "fsdp-memory-below-ddp", "mixed-precision-faster", "ddp-mixed-precision-fastest-on-one-node",
        "horovod-most-robust-across-nodes", "ddp-scales-near-linearly", "ddp-overlap-hides-communication"}
    # the convergence check compares strategies that must compute the same thing: a check, not a finding
    assert [c.id for c in analysis.checks] == ["synchronous-strategies-converge-alike"]


def test_a_single_measurement_decides_no_finding():
    base = [run("ddp32", "ddp", "fp32", gpus=2, tokens_per_second=100.0),
            run("ddp16", "ddp", "bf16", gpus=2, tokens_per_second=180.0)]
    f = finding(analyze(base), "mixed-precision-faster")
    assert f.verdict == "needs-repeats" and "(single measurement)" in f.measured and f.low is None


def test_fsdp_memory_uses_peak_memory_on_gpus_and_model_state_on_cpu():
    def twice(name, strategy, **figures):
        return [run(f"{name}-r{k}", strategy, repeat=k, tokens_per_second=1.0, **figures) for k in (1, 2)]
    gpu = analyze(twice("g-ddp", "ddp", gpus=4, peak_memory_bytes=20 * GIB)
                  + twice("g-fsdp", "fsdp", gpus=4, peak_memory_bytes=12 * GIB))
    f = finding(gpu, "fsdp-memory-below-ddp")
    assert f.verdict == "holds" and "fsdp 12,288.0 MiB vs ddp 20,480.0 MiB peak memory" in f.measured
    assert "-40.0%" in f.measured and f.estimate == pytest.approx(0.6) and f.threshold == 1.0
    cpu = analyze(twice("c-ddp", "ddp", devices=2, peak_memory_bytes=GIB, state_bytes=100 * 2**20)
                  + twice("c-fsdp", "fsdp", devices=2, peak_memory_bytes=2 * GIB, state_bytes=50 * 2**20))
    f = finding(cpu, "fsdp-memory-below-ddp")
    # on CPU the tensors' sizes summed are accounting, not a measurement: shown, deciding nothing (it cannot fail)
    assert f.verdict == "not-measurable" and "model state" in f.measured and "accounting" in f.measured
    assert "-50.0%" in f.measured and f.estimate is None


def test_mixed_precision_holds_only_when_every_strategy_is_faster_beyond_the_noise():
    base = [*repeats("ddp32", "ddp", "fp32", [100.0, 102.0, 101.0], gpus=2),
            *repeats("ddp16", "ddp", "bf16", [180.0, 184.0, 181.0], gpus=2)]
    analysis = analyze(base)
    f = finding(analysis, "mixed-precision-faster")
    assert f.verdict == "holds" and f.low > 1.0
    decided = sum(x.verdict in ("holds", "does-not-hold", "inconclusive") for x in analysis.findings)
    assert f.confidence in [pytest.approx(1 - 0.05 / k) for k in range(1, decided + 1)]  # Holm's, in its family
    slower = base + [*repeats("fsdp32", "fsdp", "fp32", [100.0, 102.0, 101.0], gpus=2),
                     *repeats("fsdp16", "fsdp", "bf16", [90.0, 91.8, 90.9], gpus=2)]
    f = finding(analyze(slower), "mixed-precision-faster")
    assert f.verdict == "does-not-hold" and f.high < 1.0 and f.deciding.startswith("fsdp 1×2 GPU: bf16 91 vs fp32")
    assert f.confidence > 0.975 - 1e-9  # Bonferroni over the claim's two comparisons, within Holm's level


def test_a_difference_within_the_noise_makes_a_finding_inconclusive_with_its_interval():
    runs = [*repeats("ddp32", "ddp", "fp32", [100.0, 110.0, 105.0], gpus=2),
            *repeats("ddp16", "ddp", "bf16", [104.0, 112.0, 100.0], gpus=2)]
    f = finding(analyze(runs), "mixed-precision-faster")
    assert f.verdict == "inconclusive" and f.low < 1.0 < f.high
    assert f.estimate == pytest.approx((104 * 112 * 100 / (100 * 110 * 105)) ** (1 / 3)) and "[" in f.measured


def test_ddp_with_mixed_precision_fastest_on_one_node():
    runs = [*repeats("ddp16", "ddp", "fp16", [400.0, 404.0, 402.0], gpus=4),
            *repeats("hvd16", "horovod", "fp16", [380.0, 384.0, 382.0], gpus=4),
            *repeats("ddp32", "ddp", "fp32", [200.0, 202.0, 201.0], gpus=4)]
    f = finding(analyze(runs), "ddp-mixed-precision-fastest-on-one-node")
    assert f.verdict == "holds" and "horovod-fp16" in f.measured
    for r, value in zip(runs[3:6], (500.0, 505.0, 502.0)):
        r.results.tokens_per_second = value
    assert finding(analyze(runs), "ddp-mixed-precision-fastest-on-one-node").verdict == "does-not-hold"


def test_horovod_robustness_compares_scaling_efficiency_across_nodes():
    def pair(strategy, per_device_1, per_device_2):
        return [run(f"{strategy}-{size}-r{k}", strategy, nodes=nodes, gpus=4, repeat=k,
                    tokens_per_second_per_device=per_device + k, tokens_per_second=4 * nodes * (per_device + k))
                for size, nodes, per_device in (("1x4g", 1, per_device_1), ("2x4g", 2, per_device_2)) for k in (1, 2, 3)]
    runs = pair("horovod", 100.0, 90.0) + pair("ddp", 120.0, 84.0)  # 0.90 vs 0.70
    f = finding(analyze(runs), "horovod-most-robust-across-nodes")
    assert f.verdict == "holds" and "horovod 0.90 vs ddp 0.70" in f.measured
    gm = {v: ((v + 1) * (v + 2) * (v + 3)) ** (1 / 3) for v in (90.0, 100.0, 84.0, 120.0)}  # the repeats' means
    assert f.estimate == pytest.approx((gm[90.0] / gm[100.0]) / (gm[84.0] / gm[120.0]))
    assert finding(analyze(pair("horovod", 100.0, 90.0)), "horovod-most-robust-across-nodes").verdict == (
        "not-measurable")  # no other strategy to compare with


def steps(losses):
    return [{"step": i, "loss": loss, "step_seconds": 0.1} for i, loss in enumerate(losses, start=1)]


def test_synchronous_strategies_agree_when_the_loss_gap_is_small_against_the_loss_decrease():
    runs = [run(f"{s}-r{k}", s, devices=2, repeat=k, final_loss=loss, first_loss=10.0)
            for s, loss in (("ddp", 9.0), ("fsdp", 9.0), ("ps", 7.0)) for k in (1, 2)]
    curves = {f"ddp-r{k}": steps([10.0, 9.5, 9.0]) for k in (1, 2)}
    curves |= {f"fsdp-r{k}": steps([10.0, 9.52, 9.0]) for k in (1, 2)}
    curves |= {f"ps-r{k}": steps([10.0, 8.0, 7.0]) for k in (1, 2)}
    spec = {"sweep": {"strategies": [{"name": "ddp"}, {"name": "fsdp"}, {"name": "ps", "psMode": "async"}]}}
    f = check(analyze(runs, spec, curves), "synchronous-strategies-converge-alike")
    # the largest gap, 0.02 at step 2, over ddp's decrease 10.0 - 9.0 = 1.0: 2 % of the decrease, below 5 %
    assert f.verdict == "holds" and f.threshold == 0.05
    assert ("fsdp-fp32 vs ddp-fp32 1×2 CPU: largest loss gap ÷ loss decrease: 2.00% [2.00%, 2.00%] (loss per step, "
            "2 rounds, one seed each)") in f.measured and "async" in f.measured
    curves |= {f"fsdp-r{k}": steps([10.0, 9.0, 8.5]) for k in (1, 2)}  # 0.5 of a 1.0 decrease
    assert check(analyze(runs, spec, curves), "synchronous-strategies-converge-alike").verdict == "does-not-hold"
    f = check(analyze(runs, spec), "synchronous-strategies-converge-alike")  # the operator: no curves
    assert f.verdict == "holds" and "final loss" in f.measured  # |9.0 - 9.0| over 10.0 - 9.0
    single = [r for r in runs if r.repeat == 1]
    assert check(analyze(single, spec), "synchronous-strategies-converge-alike").verdict == "needs-repeats"


def test_the_loss_gap_varies_with_the_rounds_seeds_so_its_interval_has_a_width():
    """Each round trains with its own seed (plan.Run.seed), so the rounds' gaps differ and the interval is a real
    one: 2 %, 3 % and 4 % of the decrease give the mean 3 % ± t(0.975, 2) · 1 % / √3 = [0.5 %, 5.5 %]."""
    runs = [run(f"{s}-r{k}", s, devices=2, repeat=k, final_loss=9.0, first_loss=10.0)
            for s in ("ddp", "fsdp") for k in (1, 2, 3)]
    curves = {f"ddp-r{k}": steps([10.0, 9.5, 9.0]) for k in (1, 2, 3)}
    curves |= {f"fsdp-r{k}": steps([10.0, 9.5 + gap, 9.0]) for k, gap in ((1, 0.02), (2, 0.03), (3, 0.04))}
    f = check(analyze(runs, {}, curves), "synchronous-strategies-converge-alike")
    half = T975[2] * 0.01 / math.sqrt(3)
    assert f.estimate == pytest.approx(0.03) and f.low == pytest.approx(0.03 - half, rel=1e-4)
    assert f.high == pytest.approx(0.03 + half, rel=1e-4) and f.verdict == "inconclusive"  # 5.5 % crosses 5 %
def test_ddp_near_linear_scaling_needs_the_whole_interval_at_or_above_0_9():
    def ddp(per_device_2):
        return [run(f"d{devices}-r{k}", "ddp", gpus=devices, repeat=k, tokens_per_second_per_device=value * (1 + k / 100),
                    tokens_per_second=devices * value * (1 + k / 100))
                for devices, value in ((1, 100.0), (2, per_device_2)) for k in (1, 2, 3)]
    assert finding(analyze(ddp(95.0)), "ddp-scales-near-linearly").verdict == "holds"
    assert finding(analyze(ddp(90.0)), "ddp-scales-near-linearly").verdict == "inconclusive"  # on the threshold
    f = finding(analyze(ddp(60.0)), "ddp-scales-near-linearly")
    # both scales ran 1 % faster in round 2 than in round 1: a drift shared by the round, which pairing cancels
    assert f.verdict == "does-not-hold" and "1×1 GPU → 1×2 GPU: scaling efficiency: 0.60 [0.60, 0.60]" in f.measured
    assert findings.NEAR_LINEAR == 0.9


def test_the_most_efficient_configuration_uses_the_least_energy_per_token_beyond_the_noise():
    def energy(name, strategy, joules):
        return [run(f"{name}-r{k}", strategy, gpus=2, repeat=k, tokens_per_second=100.0,
                    energy_joules_per_million_tokens=j, energy_source="nvml") for k, j in enumerate(joules, start=1)]
    runs = energy("e-ddp", "ddp", [900.0, 920.0, 910.0]) + energy("e-fsdp", "fsdp", [1200.0, 1180.0, 1190.0])
    rec = by(analyze(runs).recommendations, "efficient", "1×2 GPU")
    assert (rec.decision, rec.winner, rec.unit) == ("clear", "e-ddp", "J per 1M tokens")
    ddp, fsdp = (900 * 920 * 910) ** (1 / 3), (1200 * 1180 * 1190) ** (1 / 3)
    assert rec.value == pytest.approx(ddp) and rec.margin == pytest.approx(1 - ddp / fsdp)
    cpu = [run("c-ddp", "ddp", devices=2, tokens_per_second=1.0,
               energy_unavailable_reason="not measurable: no readable /sys/class/powercap/intel-rapl:* energy_uj")]
    rec = by(analyze(cpu).recommendations, "efficient", None)
    assert "not measurable: no readable" not in rec.note  # said once, by the decision
    assert rec.decision == "not-measurable" and "powercap" in rec.note and rec.note.startswith("no energy figure: ")


def test_li_2020s_overlap_claim_holds_when_most_of_ddps_communication_is_hidden_beyond_the_noise():
    def ddp(hidden):
        return [run(f"o-ddp-r{k}", "ddp", gpus=2, repeat=k, tokens_per_second=1.0, comm_hidden_ratio=h)
                for k, h in enumerate(hidden, start=1)]
    f = finding(analyze(ddp([0.80, 0.82])), "ddp-overlap-hides-communication")
    # mean 0.81, s = 0.01414: 0.81 ± 12.706 · 0.01414 / √2 = [0.68, 0.94], above 1/2 (t at 95 %: the finding is the
    # only one its family decides here)
    assert f.verdict == "holds" and f.low == pytest.approx(0.81 - 12.706205 * 0.0141421 / 2**0.5, rel=1e-4)
    assert finding(analyze(ddp([0.10, 0.12])), "ddp-overlap-hides-communication").verdict == "does-not-hold"
    assert finding(analyze(ddp([0.2, 0.8])), "ddp-overlap-hides-communication").verdict == "inconclusive"
    assert finding(analyze(ddp([0.8])), "ddp-overlap-hides-communication").verdict == "needs-repeats"


def test_the_objectives_table_is_the_one_list_of_objectives():
    """status.OBJECTIVES is where an objective is added (with its decision in analysis.py): the schema's enum, the
    report's order and the verdicts' words all come from it."""
    from gpt2bench.report import markdown, verdicts
    from gpt2bench.status import OBJECTIVES

    assert Recommendation.model_json_schema()["properties"]["objective"]["enum"] == list(OBJECTIVES)
    assert markdown.OBJECTIVE_ORDER == tuple(OBJECTIVES)
    assert verdicts.verdict(Recommendation(objective="leanest", decision="clear", run="x-ddp-fp32-1x2")) == (
        "ddp fp32 is the leanest (least peak memory) (error rate ≤ 5 %)")
