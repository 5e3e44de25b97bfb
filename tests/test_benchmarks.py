"""The benchmark scripts' own arithmetic and command lines (their figures: docs/performance.md)."""

from __future__ import annotations

import argparse
import importlib.util
import math
import statistics
import subprocess
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
    # its default --repeats 4 equals the example's maxRepeats: exactly those rounds, none added until decided
    default, _ = load("bench_fairness").planned_runs(repeats=4)
    assert default.spec.sweep.repeats == 4 and default.spec.sweep.max_repeats is None


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


def _entry(name: str, tps: float | None, phase: str = "Succeeded"):
    from gpt2bench.status import RunStatus

    return RunStatus(name=name, strategy="ddp", precision="fp32", nodes=1, devices_per_node=0, processes_per_node=2,
                     job_kind="PyTorchJob", job_name=name, devices=2, phase=phase,
                     results={"tokens_per_second": tps} if phase == "Succeeded" else None)


def test_variants_compare_by_their_within_round_ratios():
    """Rounds where a and b ran 0.8, 0.9 and 1.0 of each other: the geometric mean of the ratios, with
    mean(ln r) ± t(0.975, 2) · s / √3 (t = 4.302653, tabled); a round where one failed is left out."""
    rounds = load("rounds")
    a = {1: _entry("a1", 80.0), 2: _entry("a2", 180.0), 3: _entry("a3", 50.0), 4: _entry("a4", None, "Failed")}
    b = {1: _entry("b1", 100.0), 2: _entry("b2", 200.0), 3: _entry("b3", 50.0), 4: _entry("b4", 70.0)}
    ratio = rounds.paired_ratio(a, b)
    logs = [math.log(0.8), math.log(0.9), math.log(1.0)]
    half = 4.302653 * statistics.stdev(logs) / math.sqrt(3)
    assert ratio.estimate == pytest.approx((0.8 * 0.9 * 1.0) ** (1 / 3))
    assert (ratio.low, ratio.high) == pytest.approx((math.exp(statistics.fmean(logs) - half),
                                                     math.exp(statistics.fmean(logs) + half)), rel=1e-5)
    assert rounds.paired_ratio({1: a[1]}, {1: b[1]}) is None  # one round: no interval


def test_the_horovod_settings_reach_every_rank_through_the_launchers_environment():
    bench = load("bench_horovod_cpu")
    variants = bench.variants(steps=4)
    assert list(variants) == ["ddp", "hvd-shipped", "hvd-yield", "hvd-cycle", "hvd-both"]
    (_, _, both), = variants["hvd-both"]
    launcher = both["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in launcher["env"]}
    assert env["OMPI_MCA_mpi_yield_when_idle"] == "1" and env["HOROVOD_CYCLE_TIME"] == "5"
    command = launcher["command"]
    at = command.index("mpirun")
    assert command[at + 1:at + 5] == ["-x", "OMPI_MCA_mpi_yield_when_idle", "-x", "HOROVOD_CYCLE_TIME"]
    (_, _, shipped), = variants["hvd-shipped"]
    assert "HOROVOD_CYCLE_TIME" not in str(shipped)
    # every variant starts from Open MPI's busy-polling default: the rendered CPU fix is taken out
    for label in ("hvd-shipped", "hvd-cycle"):
        (_, _, job), = variants[label]
        assert "mpi_yield_when_idle" not in str(job), label
    (_, run, _), = variants["ddp"]
    assert run.strategy.name == "ddp" and not run.breakdown


def test_the_run_length_settles_where_doubling_stays_inside_the_interval():
    bench = load("bench_run_length")
    from gpt2bench.report.noise import Interval

    def interval(estimate, half=0.05):
        return Interval(estimate, estimate - half, estimate + half, 0.95)
    ratios = {12: {"ddp": None, "horovod": interval(0.77), "ps": interval(1.0), "single": interval(0.9)},
              24: {"ddp": None, "horovod": interval(1.0), "ps": interval(1.0), "single": interval(0.9)},
              48: {"ddp": None, "horovod": interval(1.02), "ps": interval(0.98), "single": interval(0.92)}}
    assert bench.settled(ratios, [12, 24, 48]) == 24  # horovod moved from 0.77 to 1.0 between 12 and 24 steps
    ratios[48]["horovod"] = interval(1.2)
    assert bench.settled(ratios, [12, 24, 48]) is None


def test_the_round_benchmarks_run_exactly_their_own_rounds():
    """bench_horovod_cpu and bench_run_length add the rounds themselves: the example they start from must not add
    its own (the CPU example's maxRepeats did: runs of the base configurations appeared between the variants')."""
    from datetime import datetime, timezone

    from gpt2bench import sweepcore

    rounds = load("rounds")
    benchmark, runs = rounds.example(("ddp", "horovod"), steps=6)
    assert benchmark.spec.sweep.max_repeats is None and benchmark.spec.sweep.budget is None
    assert [r.strategy.name for r in runs] == ["ddp", "horovod"]  # one round
    assert sweepcore.add_round(benchmark, [], sweepcore.Rounds(planned=1), None, datetime.now(timezone.utc)) is None


def _startup_record(overhead: float, job: float, loss: float | None = 3.5, tps: float = 1000.0) -> dict:
    return {"phase": "Succeeded" if loss is not None else "Failed", "overhead_seconds": overhead, "job_seconds": job,
            "worker_startup": overhead / 2, "train": job - overhead, "tokens_per_second": tps,
            "peak_memory": 2**30, "final_loss": loss}


def test_start_up_per_run_is_compared_forked_against_fresh_within_rounds():
    """Rounds where forked took 0.2 and 0.25 of fresh's start-up: the geometric mean of the two, with
    mean(ln r) ± t(0.975, 1) · s / √2 (t = 12.7062, tabled); the share sums start-up over job time."""
    bench = load("bench_startup")
    estimate, low, high = bench.paired([1.0, 1.0], [5.0, 4.0])
    logs = [math.log(0.2), math.log(0.25)]
    half = 12.7062 * statistics.stdev(logs) / math.sqrt(2)
    assert estimate == pytest.approx(math.sqrt(0.2 * 0.25))
    assert (low, high) == pytest.approx((math.exp(statistics.fmean(logs) - half),
                                         math.exp(statistics.fmean(logs) + half)), rel=1e-4)
    assert bench.paired([1.0, None, 2.0], [5.0, 4.0, None]) is None  # one round where both have a figure
    assert bench.share([_startup_record(1.0, 4.0), _startup_record(3.0, 4.0), {"phase": "Failed"}]) == 0.5
    records = {"ddp": {"fresh": [_startup_record(5.0, 9.0), _startup_record(4.0, 8.0)],
                       "forked": [_startup_record(1.0, 5.0), _startup_record(1.0, 5.0, loss=3.25)]},
               "single": {"fresh": [_startup_record(3.0, 6.0), _startup_record(3.0, 6.0)],
                          "forked": [_startup_record(0.75, 3.75), _startup_record(1.25, 4.25)]}}
    lines = bench.report(records, {"fresh": [0.99, 1.01], "forked": [1.0, 1.0]})
    ddp = next(line for line in lines if line.startswith("| ddp |"))
    assert ddp.startswith("| ddp | 4.50 | 1.00 | 0.22 [") and ddp.endswith("| 1/2 |")  # the second loss differs
    assert "| 2.25 | 0.50 | 2.25 | 0.50 |" in ddp  # worker 0 (half of each, here), then the rest
    assert "| single | 3.00 | 1.00 | 0.32 [" in "\n".join(lines)  # √(0.75 / 3 × 1.25 / 3)
    # every strategy's runs together: fresh 3, 3, 4, 5 -> 3.50; forked 0.75, 1, 1, 1.25 -> 1.00
    assert "median start-up per run, every strategy: fresh 3.50 s, forked 1.00 s (target <= 1.5 s: ok)" in lines[-7]
    assert "| fresh | 52 % | 1.000 |" in lines and "| forked | 22 % | 1.000 |" in lines  # 15 / 29 and 4 / 18


def test_the_example_benchmark_reads_wall_time_start_up_share_and_decisions_from_results_json():
    """Start-up share = the runs' overheadSeconds summed over their jobSeconds summed (runs without both left out);
    a scale is decided when its fastest recommendation is clear, equivalent, the only candidate or unstable (two
    speeds flagged); both targets are checked: 8 minutes, and every scale decided."""
    from gpt2bench.status import Analysis, LocalRun, Recommendation, ResultsDocument

    bench = load("bench_example")

    def run(name: str, job: float | None, overhead: float | None, phase: str = "Succeeded") -> LocalRun:
        return LocalRun.model_construct(name=name, phase=phase, job_seconds=job, overhead_seconds=overhead)

    document = ResultsDocument(
        runs=[run("a", 10.0, 2.0), run("b", 6.0, 1.0), run("c", 4.0, 3.0), run("d", None, None, "Failed")],
        rounds_done=4, stop_reason="decided",
        analysis=Analysis(recommendations=[
            Recommendation(objective="fastest", scale="1x1", decision="clear", verdict="single bf16 is the fastest"),
            Recommendation(objective="fastest", scale="1x2", decision="no-clear-winner"),
            Recommendation(objective="fastest", scale="1x2", per_rank="1 thread", decision="only-candidate"),
            Recommendation(objective="leanest", scale="1x1", decision="clear")]))
    wall = {"seconds": 481.0, "exit_code": 0, "example": "x.yaml", "load": [1.0, 2.0], "ended": "now",
            "forkserver": "on"}
    figures = bench.summary(document, wall)
    assert figures["startup_share"] == pytest.approx(6.0 / 20.0) and figures["startup_median_seconds"] == 2.0
    assert (figures["runs"], figures["succeeded"], figures["decided_scales"]) == (4, 3, 2)
    # the fastest objective's, not leanest's; a resource group of its own keeps its row
    assert [row["scale"] for row in figures["scales"]] == ["1x1", "1x2", "1x2 (1 thread)"]
    lines = bench.report(figures, wall)
    assert "| 8 min 01 s | 4 (3) | 4 | 0 | decided | 30 % | 2.00 s |" in lines
    assert lines[-1] == "wall time <= 8 min: MISSED; scales decided: 2 of 3 (every one: MISSED)"
    document.analysis.recommendations[1].decision = "unstable"
    quick = {**wall, "seconds": 479.0}
    assert bench.report(bench.summary(document, quick), quick)[-1] == (
        "wall time <= 8 min: ok; scales decided: 3 of 3 (every one: ok)")


def test_the_operator_import_benchmark_loads_the_two_api_classes_in_its_before_case_only():
    """bench_operator_imports compares the operator's modules alone with the same plus CoreV1Api and
    NetworkingV1Api; the operator itself (controller/kube.py) reaches pods, events, ConfigMaps and NetworkPolicies
    by path and names neither class."""
    bench = load("bench_operator_imports")
    probe = "; import sys; print(sorted(m for m in sys.modules if m.endswith(('core_v1_api', 'networking_v1_api'))))"
    loaded = {case: subprocess.run([sys.executable, "-c", code + probe], capture_output=True, text=True,
                                   check=True).stdout.strip() for case, code in (("now", bench.OPERATOR),
                                                                                 ("before", bench.BEFORE))}
    assert loaded == {"now": "[]", "before": "['kubernetes.client.api.core_v1_api', "
                                             "'kubernetes.client.api.networking_v1_api']"}
    sources = " ".join(p.read_text() for p in (Path(__file__).resolve().parents[1] / "operator").rglob("*.py"))
    assert "CoreV1Api(" not in sources and "NetworkingV1Api(" not in sources  # neither class is instantiated
