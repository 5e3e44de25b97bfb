"""The benchmark scripts' own arithmetic and command lines (their figures: docs/performance.md)."""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import sys
from pathlib import Path

import pytest

from gpt2bench.trainer.config import TrainConfig

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str):
    if str(BENCHMARKS) not in sys.path:  # as when run as a script: its folder first, for sibling imports
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_round_ratio_is_the_median_of_each_rounds_own_ratio():
    """The machine slows down over the run: each round's ratio is 0.5, 0.95, 0.9 of the reference's speed.
    The median of those is 0.9; comparing each loop's best block instead would give 1.0 / 2.0 = 0.5."""
    bench = load("bench_trainer")
    reference = [(9.0, 1.0), (9.0, 2.0), (9.0, 3.0)]  # (wall, CPU) seconds of rounds 1..3
    loop = [(9.0, 2.0), (9.0, 2.0 / 0.95), (9.0, 3.0 / 0.9)]
    assert bench.round_ratio(reference, loop, clock=1) == pytest.approx(0.9)
    assert bench.round_ratio(reference, loop, clock=0) == pytest.approx(1.0)  # the wall column
    with pytest.raises(ValueError):  # a round without both blocks is a broken run, not a shorter median
        bench.round_ratio(reference, loop[:2], clock=1)


def test_ps_ratio_is_best_over_best():
    assert load("bench_ps").best_ratio({"single": [600.0, 700.0], "ps": [560.0, 420.0]}) == pytest.approx(0.8)


def test_ps_and_single_jobs_differ_in_the_strategy_alone(tmp_path):
    bench = load("bench_ps")
    args = argparse.Namespace(precision="bf16", model="tiny", max_documents=40, seq_len=128, micro_batch_size=4,
                              warmup=3, steps=10, device="cpu")
    single, ps = (bench.trainer_argv(job, args, tmp_path / job) for job in ("single", "ps"))
    assert ps[ps.index("--nproc-per-node") + 1] == "2" and "--" in ps  # torchrun: 1 server + 1 worker
    configs = {job: TrainConfig.from_argv(argv[argv.index("train") + 1:]) for job, argv in
               (("single", single), ("ps", ps))}
    assert configs["single"].strategy.name == "single"
    assert (configs["ps"].strategy.name, configs["ps"].strategy.servers, configs["ps"].strategy.ps_mode) == \
        ("ps", 1, "sync")
    assert configs["ps"].training.steps == 13 and configs["ps"].training.warmup_steps == 3
    assert configs["ps"].process.log_every == 10 and configs["ps"].precision == "bf16"
    drop = {"strategy": True, "process": {"output"}}
    assert configs["single"].model_dump(exclude=drop) == configs["ps"].model_dump(exclude=drop)


def test_the_fairness_benchmark_interleaves_ddp_horovod_and_ps_of_the_cpu_example():
    benchmark, runs = load("bench_fairness").planned_runs(repeats=3, steps=8)
    assert [r.repeat for r in runs] == [1] * 3 + [2] * 3 + [3] * 3  # rounds
    for k in (1, 2, 3):  # every configuration once per round
        assert sorted(r.strategy.name for r in runs if r.repeat == k) == ["ddp", "horovod", "ps"]
    assert not any(r.breakdown or r.profile for r in runs)  # throughput without the breakdown's hooks
    assert {(r.precision, r.world_size) for r in runs} == {("fp32", 2)}  # the same scale and precision
    assert benchmark.spec.training.steps == 8 and benchmark.spec.resources.requests["cpu"] == "2"


def test_breakdown_overhead_is_a_paired_geometric_mean_with_a_t_interval_and_a_verdict():
    """Rounds whose on/off ratios are 0.95 and 0.96: the estimate is their geometric mean; the interval is
    mean(ln r) ± t(0.975, 1) · s / √2 with t = 12.7062 (tabled), exponentiated."""
    bench = load("bench_breakdown_overhead")
    on = [(5.0, 1.0), (5.0, 2.0)]  # (wall, CPU) seconds per round
    off = [(5.0, 0.95), (5.0, 1.92)]
    ratio = bench.paired_ratio(on, off, clock=1)
    logs = [math.log(0.95), math.log(0.96)]
    half = 12.7062 * statistics.stdev(logs) / math.sqrt(2)
    assert ratio.estimate == pytest.approx(math.sqrt(0.95 * 0.96))
    assert (ratio.low, ratio.high) == pytest.approx((math.exp(statistics.fmean(logs) - half),
                                                     math.exp(statistics.fmean(logs) + half)), rel=1e-4)
    assert bench.verdict(ratio) == "inconclusive"  # 0.955 with an interval across 0.99
    assert bench.paired_ratio(on, on, clock=1).estimate == 1.0 and bench.verdict(bench.paired_ratio(on, on, 1)) == "met"
    slower = [(5.0, 0.95), (5.0, 1.9)]  # 0.95 in both rounds: no spread, below the claim
    assert bench.verdict(bench.paired_ratio(on, slower, clock=1)) == "missed"
    assert bench.paired_ratio(on, off, clock=0).estimate == 1.0  # the wall column
    assert bench.paired_ratio(on[:1], off[:1], clock=1) is None and bench.verdict(None) == "inconclusive"
    with pytest.raises(ValueError):  # a round without both blocks is a broken run
        bench.paired_ratio(on, off[:1], clock=1)


def test_the_recorders_direct_cost_is_measured_over_real_marks_and_transfers():
    bench = load("bench_breakdown_overhead")
    seconds = bench.recorder_seconds_per_step(buckets=3, iterations=50)
    assert 0 < seconds < 0.01  # microseconds of host work per step, not milliseconds
