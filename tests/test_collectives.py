"""The collectives probe (trainer/collective_probe.py): nccl-tests' timing and busbw, sizes agreed over the ranks, the
slowest rank's time; its place in the summary and the report. Real gloo collectives in-process; the probe inside
real ddp / fsdp / horovod runs is checked in tests/test_trainer_breakdown.py."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from gpt2bench.trainer import collective_probe
from gpt2bench.trainer.breakdown import CommTimer
from gpt2bench.trainer.collective_probe import (
    Backend,
    Timing,
    c10d_backend,
    elements,
    probe,
    summary_fields,
    time_collective,
)
from gpt2bench.trainer.summary import network_summary


class FakeClock:
    """perf_counter that only moves when a collective runs: each call takes `per_call` seconds."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake_backend(clock: FakeClock, ranks: int, per_call: float, peer: list[float] | None = None) -> Backend:
    """`peer`: what another rank contributes to each agree_max, in the order they are made."""
    calls: list[tuple[str, int]] = []
    peers = list(peer or [])

    def call(kind: str, numel: int):
        calls.append((kind, numel))

        def run():
            clock.now += per_call
        return run

    def agree_max(values: list[float]) -> list[float]:
        other = peers.pop(0) if peers else None
        return [max(v, o) for v, o in zip(values, other)] if other is not None else values

    backend = Backend(ranks, call, agree_max, barrier=lambda: None)
    backend.calls = calls  # type: ignore[attr-defined]
    return backend


def test_time_collective_is_nccl_tests_busbw(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(collective_probe.time, "perf_counter", clock)
    timing = time_collective(fake_backend(clock, 4, 0.01), "allreduce", 4_000_000, warmup=2, iters=5)
    assert timing.bytes == 4_000_000 and timing.seconds == pytest.approx(0.01)
    assert timing.algbw == pytest.approx(4e8)
    assert timing.busbw == pytest.approx(4e8 * 2 * 3 / 4)  # all-reduce: 2(n-1)/n
    gather = time_collective(fake_backend(clock, 4, 0.02), "allgather", 4_000_000, warmup=0, iters=3)
    assert gather.busbw == pytest.approx(2e8 * 3 / 4)  # all-gather: (n-1)/n


def test_time_collective_rounds_to_a_shardable_buffer_and_reports_what_it_ran(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(collective_probe.time, "perf_counter", clock)
    backend = fake_backend(clock, 3, 0.001)
    timing = time_collective(backend, "reduce_scatter", 1000, warmup=1, iters=1)
    assert backend.calls == [("reduce_scatter", 249)]  # 250 floats rounded down to a multiple of 3 ranks
    assert timing.bytes == 249 * 4 == elements(1000, 3) * 4
    with pytest.raises(ValueError, match="cannot probe 'push'"):
        time_collective(backend, "push", 1000)


def test_probe_agrees_sizes_and_keeps_the_slowest_rank(monkeypatch):
    """Ranks that saw different sizes run the largest; the reported time is the slowest rank's."""
    clock = FakeClock()
    monkeypatch.setattr(collective_probe.time, "perf_counter", clock)
    # agree_max calls: the sizes (allreduce, allgather, reduce_scatter), then one per kind probed
    backend = fake_backend(clock, 2, 0.01, peer=[[1000.0, 0.0, 0.0], [0.5], [0.0]])
    timings = probe(backend, {"allreduce": 400, "allgather": 800, "push": 10}, warmup=0, iters=2)
    assert [(t.kind, t.bytes) for t in timings] == [("allreduce", 1000), ("allgather", 800)]
    assert timings[0].seconds == 0.5 and timings[1].seconds == pytest.approx(0.01)
    assert probe(fake_backend(clock, 1, 0.01), {"allreduce": 400}) == []  # one rank: no network to probe


def test_probe_runs_real_gloo_collectives_of_every_kind(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        import torch

        backend = c10d_backend(torch.device("cpu"))
        timings = [time_collective(backend, kind, 64 << 10, warmup=1, iters=2) for kind in collective_probe.PROBED]
        assert backend.agree_max([1.0, 3.0]) == [1.0, 3.0]
    finally:
        dist.destroy_process_group()
    assert [t.bytes for t in timings] == [64 << 10] * 3 and all(t.seconds > 0 for t in timings)
    assert all(t.busbw == 0 for t in timings)  # one rank sends nothing: bus factor 0


def test_comm_timer_mean_message_bytes():
    comm = CommTimer(clock=type("C", (), {"mark": staticmethod(lambda: 0.0)})())
    for nbytes in (100, 300):
        comm.launch("allreduce", nbytes, 2)
    comm.take()  # a step's records go; the run's message sizes stay
    comm.launch("allgather", 50, 2)
    assert comm.message_bytes() == {"allreduce": 200, "allgather": 50}


def test_network_summary_picks_the_kind_with_most_bytes_and_its_share():
    timings = [Timing("allgather", 1000, 2, 1e-3), Timing("reduce_scatter", 1000, 2, 1e-3)]
    lead = summary_fields(timings)
    assert lead == {"probe_bus_bandwidth": {"allgather": 5e5, "reduce_scatter": 5e5},
                    "probe_message_bytes": {"allgather": 1000, "reduce_scatter": 1000}}
    summary = {"comm_bytes_per_step": {"allgather": 2000, "reduce_scatter": 1000},
               "comm_bus_bandwidth": {"allgather": 1e5, "reduce_scatter": 4e5}}
    out = network_summary(summary, lead)
    assert out["bus_kind"] == "allgather"
    assert out["bus_bandwidth_achieved"] == 1e5 and out["bus_bandwidth_probed"] == 5e5
    assert out["bus_bandwidth_share"] == pytest.approx(0.2)
    ps = network_summary({"comm_bytes_per_step": {"push": 8, "pull": 8}, "comm_bus_bandwidth": {"push": 1, "pull": 2}},
                         summary_fields([]))
    assert ps["bus_kind"] == "pull" and ps["bus_bandwidth_achieved"] == 2  # a tie goes to the first name
    assert ps["bus_bandwidth_probed"] is None and ps["bus_bandwidth_share"] is None
    assert network_summary({"comm_bytes_per_step": None, "comm_bus_bandwidth": None}, {})["bus_kind"] is None
