"""Memory bounded in the number of steps: a worker folds each step's record into running totals
and drops it. The figures stay those docs/metrics.md defines: each is compared with the computation over the
whole list of records that the trainer did before (kept here, as it was, as the reference)."""

from __future__ import annotations

import gc
import math
import random
import struct
import tracemalloc

import pytest
import torch
from test_trainer_breakdown import summarize_breakdown
from test_trainer_units import FakeClock

from gpt2bench.conventions import MAX_STEPS_LINE
from gpt2bench.trainer import aggregates
from gpt2bench.trainer.aggregates import StepTimes, ThinnedSteps, fold
from gpt2bench.trainer.breakdown import PHASES
from gpt2bench.trainer.config import TrainConfig
from gpt2bench.trainer.metrics import MetricsProcessor
from gpt2bench.trainer.stationarity import halves_ratio
from gpt2bench.trainer.summary import percentile, steps_line

KINDS = ("allgather", "allreduce", "reduce_scatter")


# ------------------------------------------------------------------ the computation over every record, as it was
def old_summarize(records, devices):
    measured = [r for r in records if not r["warmup"]]
    times = [r["step_seconds"] for r in measured]
    seconds = sum(r["step_seconds"] for r in measured)
    tps = sum(r["tokens"] for r in measured) / seconds if measured and seconds > 0 else None
    last = records[-1] if records else {}
    return {
        "steps": len(records), "measured_steps": len(measured), "tokens_per_second": tps,
        "tokens_per_second_per_device": tps / devices if tps is not None else None,
        "step_time_p50_seconds": percentile(times, 50), "step_time_p95_seconds": percentile(times, 95),
        "data_loading_seconds_mean": sum(r["data_loading_seconds"] for r in measured) / len(measured) if measured else None,
        "final_loss": last.get("loss"), "first_loss": records[0]["loss"] if records else None,
        "grad_norm": last.get("grad_norm"), "skipped_steps": sum(bool(r.get("skipped")) for r in records),
        "skipped_measured_steps": sum(bool(r.get("skipped")) for r in measured),
        "compile_seconds_in_measured_steps": sum(r.get("compile_seconds") or 0.0 for r in measured),
        **halves_ratio(times),  # computed over the whole list; the trainer reads its spill file a chunk at a time
    }


def old_breakdown(records):
    measured = [r for r in records if not r["warmup"] and r.get("forward_seconds") is not None]
    if not measured:
        return {}
    out = {f"{name}_seconds_mean": sum(r[f"{name}_seconds"] for r in measured) / len(measured) for name in PHASES}
    comm = [r for r in measured if r.get("comm_seconds") is not None]
    total, exposed = sum(r["comm_seconds"] for r in comm), sum(r["comm_exposed_seconds"] for r in comm)
    out.update(comm_seconds_mean=total / len(comm), comm_exposed_seconds_mean=exposed / len(comm),
               comm_hidden_ratio=max(0.0, 1 - exposed / total) if total > 0 else None)
    kinds = sorted({k for r in comm for k in r["comm_bytes"]})
    out["comm_bytes_per_step"] = {k: sum(r["comm_bytes"].get(k, 0) for r in comm) // len(comm) for k in kinds}
    out["comm_bus_bandwidth"] = {}
    for kind in kinds:
        seconds = sum(r["comm_kind_seconds"].get(kind, 0.0) for r in comm)
        moved = sum(r["comm_bus_bandwidth"].get(kind, 0.0) * r["comm_kind_seconds"].get(kind, 0.0) for r in comm)
        if seconds > 0:
            out["comm_bus_bandwidth"][kind] = moved / seconds
    return out


def old_memory_and_energy(records):
    def most(key):
        values = [r[key] for r in records if r.get(key) is not None]
        return max(values) if values else None

    measured = [r.get("energy_joules") for r in records if not r["warmup"]]
    known = bool(measured) and all(j is not None for j in measured)
    return ({key: most(key) for key in ("peak_memory_bytes", "peak_memory_reserved_bytes", "host_peak_memory_bytes")},
            (sum(measured) if known else None, len(measured)))


def record(rng: random.Random, step: int, warmup: int, *, energy=True, comm=True) -> dict:
    """A step record with the trainer's fields; step times on a coarse grid, so that ties are common."""
    kinds = rng.sample(KINDS, rng.randint(1, 2))
    kind_seconds = {k: rng.choice([0.0, rng.uniform(0.01, 0.2)]) for k in kinds}
    return {
        "step": step, "warmup": step <= warmup, "loss": rng.uniform(2, 11), "grad_norm": rng.uniform(0.1, 3),
        "skipped": rng.random() < 0.1, "lr": 3e-4, "step_seconds": rng.randint(1, 40) / 64,
        "data_loading_seconds": rng.uniform(0, 0.01), "compile_seconds": rng.choice([0.0, 0.0, rng.uniform(0, 2)]),
        "tokens": 4096, "peak_memory_bytes": rng.randint(1, 10**9), "peak_memory_reserved_bytes": rng.randint(1, 10**9),
        "host_peak_memory_bytes": rng.randint(1, 10**9),
        "energy_joules": rng.uniform(1, 5) if energy or rng.random() < 0.5 else None,
        **{f"{name}_seconds": rng.uniform(0, 0.1) for name in PHASES},
        "comm_seconds": rng.uniform(0.01, 0.3) if comm else None, "comm_exposed_seconds": rng.uniform(0, 0.01),
        "comm_bytes": {k: rng.randint(1, 10**8) for k in kinds}, "comm_kind_seconds": kind_seconds,
        "comm_bus_bandwidth": {k: rng.uniform(1e8, 1e10) for k in kinds if kind_seconds[k] > 0},
    }


def assert_close(new, old, where="") -> None:
    """Equal structure; floats equal to 1e-12 relative (running sums add in the list's order)."""
    if isinstance(old, dict):
        assert isinstance(new, dict) and new.keys() == old.keys(), where
        for key in old:
            assert_close(new[key], old[key], f"{where}.{key}")
    elif isinstance(old, float):
        assert new == pytest.approx(old, rel=1e-12, abs=0), where
    else:
        assert new == old, where


def bits(value: float | None) -> bytes | None:
    return None if value is None else struct.pack("<d", value)


@pytest.mark.parametrize("steps, warmup", [(0, 0), (1, 0), (1, 1), (2, 1), (3, 0), (17, 2), (4100, 3), (9001, 10)])
def test_folded_figures_are_the_ones_computed_over_the_whole_list(steps, warmup):
    rng = random.Random(steps)
    records = [record(rng, i, warmup, energy=steps != 17, comm=i % 5 != 0) for i in range(1, steps + 1)]
    totals = fold(records)
    try:
        new, old = totals.figures(devices=3), old_summarize(records, 3)
        assert new.keys() == old.keys()
        for key in ("step_time_p50_seconds", "step_time_p95_seconds", "final_loss", "first_loss", "grad_norm"):
            assert bits(new[key]) == bits(old[key]), key  # order statistics and copied values: the same floats
        for key in ("steps", "measured_steps", "skipped_steps", "skipped_measured_steps"):
            assert new[key] == old[key], key
        for key in ("tokens_per_second", "tokens_per_second_per_device", "data_loading_seconds_mean",
                    "compile_seconds_in_measured_steps", "step_time_halves_ratio", "step_time_halves_low",
                    "step_time_halves_high"):  # sums in the same order (3.12's sum() compensates)
            assert new[key] == (None if old[key] is None else pytest.approx(old[key], rel=1e-12, abs=0)), key
        assert_close(totals.breakdown.figures(), old_breakdown(records))
        peaks, energy = old_memory_and_energy(records)
        assert totals.memory_peaks() == peaks
        joules, counted = totals.energy()
        assert counted == energy[1] and (joules == energy[0] or joules == pytest.approx(energy[0], rel=1e-12))
    finally:
        totals.close()
    assert summarize_breakdown(records) == totals.breakdown.figures()


@pytest.mark.parametrize("values", [
    [], [0.5], [2.0, 1.0], [3.0, 3.0, 3.0], [0.0, 5e-324, 1e300, -2.5, 7.0, -1e-300],
    [random.Random(1).choice([0.25, 0.5, 0.75, 1.0]) for _ in range(5000)],
    [random.Random(2).lognormvariate(-2, 1) for _ in range(12345)],
])
def test_percentiles_from_the_spill_file_are_the_exact_order_statistics(values, monkeypatch):
    monkeypatch.setattr(StepTimes, "BUFFER", 1000)  # several writes ...
    monkeypatch.setattr(StepTimes, "CHUNK", 777)  # ... read back in several chunks
    times = StepTimes()
    for value in values:
        times.add(value)
    try:
        for q in (0, 1, 50, 95, 99.9, 100):
            assert bits(times.percentile(q)) == bits(percentile(values, q)), q
    finally:
        times.close()


def old_steps_line(records, limit=MAX_STEPS_LINE):
    """The line as it was computed from the whole list (stride N // 4096, doubling)."""
    import base64
    import gzip
    import json

    from gpt2bench.conventions import STEPS_COLUMNS, STEPS_PREFIX
    from gpt2bench.trainer.aggregates import finite

    stride = max(1, len(records) // 4096)
    while True:
        picked = records[::stride]
        if picked[-1] is not records[-1]:
            picked = [*picked, records[-1]]
        columns = {name: [aggregates._six_digits(finite(r.get(name))) for r in picked] for name in STEPS_COLUMNS}
        line = STEPS_PREFIX + base64.b64encode(gzip.compress(json.dumps(columns, separators=(",", ":")).encode(),
                                                             mtime=0)).decode()
        if len(line) <= limit or len(picked) <= 2:
            return line if len(line) <= limit else None
        stride *= 2


@pytest.mark.parametrize("steps", [1, 2, 3, 200, 4095, 4096, 4097, 9000])
def test_the_curves_line_is_the_one_the_whole_list_gave(steps):
    rng = random.Random(steps)
    records = [record(rng, i, 2) for i in range(1, steps + 1)]
    assert steps_line(records) == old_steps_line(records)


def test_the_curves_keep_at_most_capacity_rows_evenly_spaced_with_the_last(monkeypatch):
    monkeypatch.setattr(ThinnedSteps, "CAPACITY", 100)
    thinned = ThinnedSteps()
    for step in range(1, 100_001):
        thinned.add({"step": step, "warmup": False, "loss": 1.0})
        assert len(thinned.rows) <= 100
    indexes = [index for index, _ in thinned.rows]
    assert indexes[0] == 0 and len({b - a for a, b in zip(indexes, indexes[1:])}) == 1
    assert thinned.last[0] == 99_999 and len(thinned.line()) <= MAX_STEPS_LINE


class FixedMemory:
    host_since_start = False

    def reset(self):
        pass

    def read(self):
        return {"device_bytes": None, "device_reserved_bytes": None, "host_bytes": 1 << 30}


def drive(processor: MetricsProcessor, first: int, last: int, log_every: int = 10) -> None:
    """Steps `first`..`last` as the loop runs them: marks, pending tensors, a flush every `log_every` steps."""
    processor.clock = FakeClock(float(x) for s in range(first, last + 1) for x in (s, s + 0.25 + (s % 7) / 64))
    for step in range(first, last + 1):
        start = processor.start_step()
        processor.end_step(step, start, torch.tensor(2.0 + 1 / step), torch.tensor(1.0), False, 3e-4, 0.001)
        if step % log_every == 0:
            processor.flush(lambda losses: losses)


def test_a_worker_holds_the_same_memory_after_ten_times_the_steps(tmp_path, monkeypatch):
    """Python allocations still held after 1,000 and after 10,000 steps (tracemalloc: what is retained, not RSS),
    the step times' buffer spilled twice between them. The trainer used to keep every record, ~1.7 KiB each: 15 MB
    more at the second count."""
    monkeypatch.setattr(ThinnedSteps, "CAPACITY", 64)  # full well before the first count
    config = TrainConfig(process={"output": str(tmp_path), "breakdown": False}, training={"warmup_steps": 5})
    processor = MetricsProcessor(config=config, rank=0, tokens_per_step=4096, devices=2, device=torch.device("cpu"),
                                 flops_per_token=1e6, peak_flops=None)
    processor.memory = FixedMemory()
    tracemalloc.start()
    try:
        drive(processor, 1, 1_000)
        gc.collect()
        held_at_n = tracemalloc.get_traced_memory()[0]
        drive(processor, 1_001, 10_000)
        gc.collect()
        held_at_10n = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held_at_10n - held_at_n < 64 * 1024, f"{held_at_10n - held_at_n} bytes more after 9,000 more steps"
    totals = processor.totals
    assert len(totals.curves.rows) <= 64 and processor.step_end_times is None and not processor._pending
    assert totals.times.count == 10_000 - 5 and len(totals.times._buffer) < StepTimes.BUFFER
    payload = processor.finish(devices=2)
    processor.close()
    assert payload["step_figures"]["measured_steps"] == 10_000 - 5
    assert payload["step_figures"]["step_time_p50_seconds"] == pytest.approx(0.25 + 3 / 64)  # (s % 7) / 64: median 3
    assert math.isclose(payload["own_tokens_per_second"], payload["step_figures"]["tokens_per_second"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["steps.jsonl"]  # the step-time file left nothing behind
    assert len((tmp_path / "steps.jsonl").read_text().splitlines()) == 10_000  # every record is on disk


def test_only_async_ps_keeps_step_end_times_and_only_worker_0_its_step_times(tmp_path):
    config = TrainConfig(process={"output": str(tmp_path), "breakdown": False}, training={"warmup_steps": 0})

    def processor(rank, keep):
        made = MetricsProcessor(config=config, rank=rank, tokens_per_step=10, devices=1, device=torch.device("cpu"),
                                flops_per_token=1.0, peak_flops=None, keep_end_times=keep)
        made.memory = FixedMemory()
        drive(made, 1, 20)
        return made

    independent, worker_1 = processor(0, True), processor(1, False)
    assert len(independent.step_end_times) == 20 and list(independent.step_end_times) == \
        sorted(independent.step_end_times)
    assert worker_1.step_end_times is None and worker_1.totals.times is None
    payload = worker_1.finish(devices=1)
    assert payload["step_figures"] is None and payload["steps_line"] is None and payload["own_tokens_per_second"] > 0


def test_the_memory_benchmark_drives_this_trainer_and_reads_its_resident_set():
    """benchmarks/bench_memory_steps.py's child process, at a small count (its figures: docs/performance.md)."""
    import importlib.util
    from pathlib import Path

    import gpt2bench.trainer.metrics

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_memory_steps.py"
    spec = importlib.util.spec_from_file_location("bench_memory_steps", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    seen = bench.measure(50, None)
    assert seen["steps"] == 50 and seen["trainer"] == gpt2bench.trainer.metrics.__file__
    assert 0 < seen["rss_start"] <= seen["hwm"] and 0 < seen["rss_end"] <= seen["hwm"]
    assert seen["payload_bytes"] > 0
