"""The step breakdown (trainer/breakdown.py and the strategies' `instrument` hooks): parts that add up to the step,
exposed communication where the step waits, exact bytes. Real collectives (gloo), real torchrun runs."""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from typing import Any

import pytest
import torch
import torch.distributed as dist
from conftest import gpt2bench_executable, held_params

from gpt2bench.trainer.breakdown import (
    PHASES,
    SUM_TOLERANCE,
    SUM_TOLERANCE_SECONDS,
    BreakdownTotals,
    CommTimer,
    StepComm,
    bus_factor,
    resolve,
    union_length,
)


class HostClock:
    """Marks are plain seconds (the CPU clock's shape)."""

    def __init__(self):
        self.now = 0.0

    def mark(self):
        return self.now

    def seconds(self, start, end):
        return end - start


def parts_sum(record: dict[str, Any]) -> float:
    """data + forward + backward + optimizer + other + exposed communication: the step time, within
    SUM_TOLERANCE (what docs/metrics.md promises; checked below)."""
    return sum(record[f"{name}_seconds"] for name in PHASES) + (record.get("comm_exposed_seconds") or 0.0)


def summarize_breakdown(records: list[dict[str, Any]]) -> dict[str, Any]:
    """`BreakdownTotals.figures()` of a list of records."""
    totals = BreakdownTotals()
    for record in records:
        totals.add(record)
    return totals.figures()


def test_union_length_merges_and_clips():
    assert union_length([(0.0, 1.0), (0.5, 2.0), (3.0, 4.0)]) == 3.0
    assert union_length([(0.0, 1.0), (0.5, 2.0)], 0.8, 1.5) == pytest.approx(0.7)
    assert union_length([(0.5, 0.6)], 0.0, 0.1) == 0.0  # outside the window counts nothing (never negative)


def test_bus_factors_are_nccl_tests():
    assert bus_factor("allreduce", 4) == 1.5 and bus_factor("allgather", 4) == 0.75
    assert bus_factor("reduce_scatter", 2) == 0.5 and bus_factor("push", 2) == 1.0
    assert bus_factor("allreduce", 1) == 0.0


def test_exposed_time_leaves_its_phase_and_parts_add_up():
    marks = [("data", 0.1), ("forward", 0.3), ("backward", 0.6), ("data", 0.61), ("optimizer", 0.9)]
    clock = HostClock()
    comm = StepComm(waits=[(0.5, 0.6), (0.95, 1.4)])  # the second sticks out of the step: clipped at 1.0
    record = resolve(clock, 0.0, 1.0, marks, comm)
    assert record["backward_seconds"] == pytest.approx(0.2)  # 0.3 s segment minus 0.1 s waiting
    assert record["other_seconds"] == pytest.approx(0.05)
    assert record["comm_exposed_seconds"] == pytest.approx(0.15)
    assert parts_sum(record) == pytest.approx(1.0)


def test_a_window_is_exposed_from_its_last_launch_to_its_last_completion():
    clock = HostClock()
    timer = CommTimer(clock)
    for start, end in ((0.2, 0.5), (0.3, 0.7)):
        clock.now = start
        transfer = timer.launch("allreduce", 100, 2)
        clock.now = end
        timer.complete(transfer)
    timer.close_window()
    record = resolve(clock, 0.0, 1.0, [("forward", 0.1), ("backward", 0.8)], timer.take())
    assert record["comm_exposed_seconds"] == pytest.approx(0.7 - 0.3)
    assert record["comm_seconds"] == pytest.approx(0.5)  # union of [0.2, 0.5] and [0.3, 0.7]
    assert record["comm_bytes"] == {"allreduce": 200}
    assert record["comm_bus_bandwidth"]["allreduce"] == pytest.approx(200 / 0.5 * 1.0)
    assert timer.take().transfers == []  # the next step starts empty


def test_summary_means_and_hidden_ratio():
    records = [{"warmup": True, **dict.fromkeys((f"{p}_seconds" for p in PHASES), 9.0), "comm_seconds": 9.0,
                "comm_exposed_seconds": 9.0, "comm_bytes": {}, "comm_kind_seconds": {}, "comm_bus_bandwidth": {}}]
    for exposed in (0.1, 0.3):
        records.append({"warmup": False, **dict.fromkeys((f"{p}_seconds" for p in PHASES), 1.0),
                        "comm_seconds": 0.8, "comm_exposed_seconds": exposed, "comm_bytes": {"allreduce": 1000},
                        "comm_kind_seconds": {"allreduce": 0.8}, "comm_bus_bandwidth": {"allreduce": 1000 / 0.8}})
    summary = summarize_breakdown(records)
    assert summary["forward_seconds_mean"] == 1.0 and summary["comm_exposed_seconds_mean"] == pytest.approx(0.2)
    assert summary["comm_hidden_ratio"] == pytest.approx(0.75)
    assert summary["comm_bytes_per_step"] == {"allreduce": 1000}
    assert summary["comm_bus_bandwidth"]["allreduce"] == pytest.approx(1250.0)


def test_a_known_size_allreduce_reports_its_bytes_exactly(tmp_path):
    """The real DDP reducer and our timing hook over a real gloo group of one: Linear(10, 7) = 77 fp32 values."""
    from gpt2bench.trainer.parallel.ddp import TimedAllReduce, timed_allreduce_hook

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(10, 7))
        comm = CommTimer(HostClock())
        model.register_comm_hook(TimedAllReduce(comm, dist.group.WORLD, 1), timed_allreduce_hook)
        model(torch.randn(3, 10)).sum().backward()
        step = comm.take()
    finally:
        dist.destroy_process_group()
    assert [(t.kind, t.bytes) for t in step.transfers] == [("allreduce", 77 * 4)]
    assert step.transfers[0].end is not None and len(step.windows) == 1


GROUP_TEARDOWN = """
import os, sys, tempfile
import torch, torch.distributed as dist
from gpt2bench.trainer.breakdown import CommTimer
from gpt2bench.trainer.parallel.ddp import TimedAllReduce, timed_allreduce_hook
clock = type("Clock", (), {"mark": staticmethod(lambda: 0.0)})()
for _ in range(int(sys.argv[1])):
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(tempfile.mkdtemp(), "s"), 1), rank=0,
                            world_size=1)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(10, 7))
    model.register_comm_hook(TimedAllReduce(CommTimer(clock), dist.group.WORLD, 1), timed_allreduce_hook)
    model(torch.randn(3, 10)).sum().backward()
    dist.destroy_process_group()
    del model
"""


def test_the_timed_hook_never_makes_gloos_thread_destroy_its_own_group(tmp_path):
    """The hook's completion callback runs on gloo's worker thread. When it held the hook's state (and so the
    process group), the group could die there, and its thread joined itself: the process aborted ("Resource
    deadlock avoided"), within 100 such teardowns here; it took down a pytest worker once. 200 in a row now."""
    proc = subprocess.run([sys.executable, "-c", GROUP_TEARDOWN, "200"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-2000:]


# ------------------------------------------------------------------ real runs (torchrun, 2 ranks, gloo)
def assert_parts_add_up(run):
    measured = [s for s in run.steps if not s["warmup"]]
    assert measured
    for s in measured:
        tolerance = SUM_TOLERANCE * s["step_seconds"] + SUM_TOLERANCE_SECONDS
        assert parts_sum(s) == pytest.approx(s["step_seconds"], abs=tolerance), s
        assert all(s[f"{p}_seconds"] >= -SUM_TOLERANCE_SECONDS for p in PHASES), s
        assert s["comm_exposed_seconds"] <= s["comm_seconds"] + SUM_TOLERANCE_SECONDS, s
    summary = run.summary
    assert summary["breakdown"] is True and summary["breakdown_method"]
    return measured


def padded_param_bytes(summary) -> int:
    """fp32 bytes of every distinct parameter, the vocabulary's padding rows included (TINY_ARGS' width)."""
    return 4 * held_params(summary)


def mean(values):
    values = list(values)
    return sum(values) / len(values)


@pytest.mark.slow
def test_ddp_hook_delay_is_exposed_communication_not_backward(run_trainer):
    """A slower network (the last bucket's all-reduce completes 0.3 s later) must show up as exposed
    communication, and must not be booked as backward computation."""
    delay = 0.3
    args = ["--strategy", "ddp", "--steps", "5"]
    base = run_trainer(args, nproc=2)
    slow = run_trainer([*args, "--comm-delay-seconds", str(delay)], nproc=2)
    base_steps, slow_steps = assert_parts_add_up(base), assert_parts_add_up(slow)
    assert all(s["comm_exposed_seconds"] >= 0.9 * delay for s in slow_steps), slow_steps
    assert mean(s["backward_seconds"] for s in slow_steps) < mean(
        s["backward_seconds"] for s in base_steps) + 0.5 * delay
    # every gradient all-reduced once per step: the padded parameters, in fp32, exactly
    assert {s["comm_bytes"]["allreduce"] for s in base.steps} == {padded_param_bytes(base.summary)}
    assert base.summary["comm_bytes_per_step"] == {"allreduce": padded_param_bytes(base.summary)}
    assert base.summary["comm_bus_bandwidth"]["allreduce"] > 0
    assert 0 <= base.summary["comm_hidden_ratio"] <= 1
    # the collectives probe: the same kind, at the run's mean bucket size, timed alone on the same group; the
    # delay sits in the strategy's hook, not in the network, so it lowers the achieved share only
    for run in (base, slow):
        assert run.summary["bus_kind"] == "allreduce"
        assert 0 < run.summary["probe_message_bytes"]["allreduce"] <= padded_param_bytes(run.summary)
        assert run.summary["bus_bandwidth_probed"] == run.summary["probe_bus_bandwidth"]["allreduce"] > 0
    assert slow.summary["bus_bandwidth_share"] < base.summary["bus_bandwidth_share"] / 2


@pytest.mark.slow
@pytest.mark.parametrize("strategy, nproc, kinds", [
    ("single", 1, {}),
    ("fsdp", 2, {"allgather": 2, "reduce_scatter": 1}),  # gathered in forward and again in backward
    ("ps", 3, {"push": 1, "pull": 1}),
])
def test_every_strategy_adds_up_and_counts_its_bytes(run_trainer, strategy, nproc, kinds):
    run = run_trainer(["--strategy", strategy, "--steps", "4"], nproc=nproc)
    measured = assert_parts_add_up(run)
    expected = {kind: times * padded_param_bytes(run.summary) for kind, times in kinds.items()}
    assert all(s["comm_bytes"] == expected for s in measured), measured
    probed = {"fsdp": {"allgather", "reduce_scatter"}}.get(strategy)  # ring collectives only; ps: point to point
    assert set(run.summary["probe_bus_bandwidth"] or ()) == (probed or set())
    if probed:
        assert run.summary["bus_kind"] == "allgather" and run.summary["bus_bandwidth_share"] > 0
    if strategy == "single":
        assert all(s["comm_seconds"] == 0 for s in measured)
    else:  # on CPU these block the worker: all of their time is exposed
        assert all(s["comm_exposed_seconds"] == pytest.approx(s["comm_seconds"], rel=0.05, abs=1e-3)
                   for s in measured)


@pytest.mark.slow
@pytest.mark.horovod
def test_horovod_waits_in_synchronize(run_trainer):
    if shutil.which("horovodrun") is None:
        pytest.skip("horovodrun is not on PATH (scripts/install.sh builds Horovod 0.28.1)")
    launcher = ["horovodrun", "--gloo", "-np", "2", "-H", "localhost:2", gpt2bench_executable(), "train"]
    run = run_trainer(["--strategy", "horovod", "--steps", "4"], launcher=launcher)
    measured = assert_parts_add_up(run)
    assert all(s["comm_bytes"] == {"allreduce": padded_param_bytes(run.summary)} for s in measured)
    # Horovod all-reduces each gradient apart: its probe times one mean gradient, with Horovod's own allreduce
    assert 0 < run.summary["probe_message_bytes"]["allreduce"] < padded_param_bytes(run.summary)
    assert run.summary["bus_kind"] == "allreduce" and run.summary["bus_bandwidth_share"] > 0


@pytest.mark.slow
def test_breakdown_off_leaves_the_fields_null(run_trainer):
    run = run_trainer(["--no-breakdown", "--steps", "3"])
    assert all(s["forward_seconds"] is None and s["comm_bytes"] is None for s in run.steps)
    assert run.summary["breakdown"] is False and run.summary["forward_seconds_mean"] is None
    assert run.summary["probe_bus_bandwidth"] is None and run.summary["bus_kind"] is None
    assert run.summary["config"]["process"]["breakdown"] is False


def test_breakdown_option_round_trips():
    from gpt2bench.trainer.config import TrainConfig

    config = TrainConfig.from_argv(["--no-breakdown", "--comm-delay-seconds", "0.1"])
    assert config.process.breakdown is False and config.process.comm_delay_seconds == 0.1
    assert TrainConfig.from_argv(config.to_argv()) == config
    assert TrainConfig().process.breakdown is True


def test_collectives_benchmark_parses_sizes():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_collectives.py"
    spec = importlib.util.spec_from_file_location("bench_collectives", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.parse_bytes("4K") == 4096 and bench.parse_bytes("2M") == 2 << 20 and bench.parse_bytes("64") == 64
    assert bench.sizes(1024, 16384, 4) == [1024, 4096, 16384]
    with pytest.raises(argparse.ArgumentTypeError, match="at least 4 bytes"):
        bench.parse_bytes("2")
