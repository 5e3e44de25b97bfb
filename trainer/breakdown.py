"""Where a step's time goes: data, forward, backward, optimizer, communication (total and exposed), and the
bytes and achieved bus bandwidth of each collective kind. Definitions and per-strategy methods: docs/metrics.md
(Step breakdown).

Two recorders, both writing marks of the device's timeline (`devices.StepClock`: CUDA events on the current
stream, or the host clock on CPU) and never waiting for the device during a step:

- `StepPhases`: the loop marks the end of each phase (`mark("forward")` ...). Consecutive marks cut the step
  into contiguous segments, so the segments add up to the step time by construction.
- `CommTimer`: each strategy's hooks record every collective or message (kind, bytes, launch and completion
  marks) and the intervals in which the step *waits* for communication with no computation to run (exposed
  communication). An exposed interval lies inside some phase's segment; it is taken out of that phase, so
  data + forward + backward + optimizer + other + exposed communication = step time.

Marks are resolved into seconds (`resolve`) at log steps, after the step's end mark has completed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

PHASES = ("data", "forward", "backward", "optimizer", "other")
KINDS = ("allreduce", "allgather", "reduce_scatter", "broadcast", "push", "pull")
SUM_TOLERANCE = 0.01  # parts add up to the step time within 1 % (docs/metrics.md); ±1 ms absolute on top
SUM_TOLERANCE_SECONDS = 0.001


def bus_factor(kind: str, ranks: int) -> float:
    """nccl-tests' busbw / algbw: the share of `bytes` each rank sends on a ring (docs/metrics.md)."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    if kind == "allreduce":
        return 2 * (ranks - 1) / ranks
    if kind in ("allgather", "reduce_scatter"):
        return (ranks - 1) / ranks
    return 1.0  # broadcast, and the parameter server's point-to-point push / pull


def union_length(intervals: list[tuple[float, float]], lo: float = float("-inf"), hi: float = float("inf")) -> float:
    """Length of the union of [a, b] intervals, clipped to [lo, hi]."""
    total, reach = 0.0, lo
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in intervals):
        a = max(a, reach)
        if b <= a:
            continue
        total += b - a
        reach = b
    return total


@dataclass
class Transfer:
    """One collective or message: `bytes` in nccl-tests' sense (the buffer of an all-reduce, the full
    gathered / scattered tensor of an all-gather / reduce-scatter, the payload of a push / pull)."""

    kind: str
    bytes: int
    ranks: int
    start: Any
    end: Any = None


@dataclass
class StepComm:
    """What one step's communication left behind, marks unresolved."""

    transfers: list[Transfer] = field(default_factory=list)
    waits: list[tuple[Any, Any]] = field(default_factory=list)
    windows: list[list[Transfer]] = field(default_factory=list)


class CommTimer:
    """Records one worker's communication during the current step (thread-safe: completions may come from a
    communication thread). `None` marks stand for "not measured"."""

    def __init__(self, clock) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._step = StepComm()
        self._window: list[Transfer] = []
        self._seen: dict[str, list[int]] = {}  # kind -> [transfers, bytes] over the whole run

    def launch(self, kind: str, nbytes: int, ranks: int) -> Transfer:
        if kind not in KINDS:
            raise ValueError(f"unknown collective kind {kind!r}; known: {', '.join(KINDS)}")
        transfer = Transfer(kind, int(nbytes), ranks, self.clock.mark())
        with self._lock:
            self._step.transfers.append(transfer)
            self._window.append(transfer)
            seen = self._seen.setdefault(kind, [0, 0])
            seen[0] += 1
            seen[1] += transfer.bytes
        return transfer

    def message_bytes(self) -> dict[str, int]:
        """Mean bytes of one transfer of each kind over the run (what the collectives probe sizes its own by)."""
        with self._lock:
            return {kind: total // count for kind, (count, total) in self._seen.items() if count}

    def complete(self, transfer: Transfer) -> None:
        transfer.end = self.clock.mark()

    def close_window(self) -> None:
        """The transfers launched since the last window end here and the caller waits for all of them at
        once (DDP's reducer at the end of backward): exposed = last launch -> last completion."""
        with self._lock:
            if self._window:
                self._step.windows.append(self._window)
            self._window = []

    def expose(self, transfer: Transfer, until: Transfer | None = None) -> None:
        """The step waited from this transfer's launch to its completion (or to `until`'s completion)."""
        with self._lock:
            self._step.waits.append((transfer.start, (until or transfer).end))

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """The step waits for communication inside this block: the block's interval is exposed."""
        start = self.clock.mark()
        try:
            yield
        finally:
            end = self.clock.mark()
            with self._lock:
                self._step.waits.append((start, end))

    @contextmanager
    def transfer(self, kind: str, nbytes: int, ranks: int, *, exposed: bool) -> Iterator[None]:
        """A blocking transfer: launched at entry, complete at exit; `exposed` when the step waits for it."""
        record = self.launch(kind, nbytes, ranks)
        try:
            yield
        finally:
            self.complete(record)
            if exposed:
                self.expose(record)

    def take(self) -> StepComm:
        """This step's records; the next step starts empty."""
        with self._lock:
            step, self._step, self._window = self._step, StepComm(), []
        return step


class StepPhases:
    """The loop's phase marks for the current step (`mark(name)` ends the segment named `name`)."""

    def __init__(self, clock, enabled: bool = True) -> None:
        self.clock, self.enabled = clock, enabled
        self.marks: list[tuple[str, Any]] = []

    def mark(self, name: str) -> None:
        if self.enabled:
            self.marks.append((name, self.clock.mark()))

    def take(self) -> list[tuple[str, Any]]:
        marks, self.marks = self.marks, []
        return marks


def resolve(clock, start, end, marks: list[tuple[str, Any]], comm: StepComm | None,
            measure_comm: bool = True) -> dict[str, Any]:
    """Seconds of each phase, communication total and exposed, bytes and bus bandwidth per kind, of one step.

    `clock.seconds(start, m)` places every mark on the step's timeline (0 = start). Exposed intervals are
    clipped to the step and merged; each phase loses the exposed time inside its segments.
    """
    step = clock.seconds(start, end)
    at = lambda mark: clock.seconds(start, mark)  # noqa: E731 (local shorthand)
    segments, previous = [], 0.0
    for name, mark in marks:
        offset = min(max(at(mark), previous), step)
        segments.append((name, previous, offset))
        previous = offset
    segments.append(("other", previous, step))
    comm = comm or StepComm()
    exposed_intervals = [(at(a), at(b)) for a, b in comm.waits]
    for window in comm.windows:
        done = [t for t in window if t.end is not None]
        if done:
            exposed_intervals.append((max(at(t.start) for t in window), max(at(t.end) for t in done)))
    parts = dict.fromkeys(PHASES, 0.0)
    for name, a, b in segments:
        parts[name] += (b - a) - union_length(exposed_intervals, a, b)
    exposed = union_length(exposed_intervals, 0.0, step)
    record: dict[str, Any] = {f"{name}_seconds": seconds for name, seconds in parts.items()}
    record["comm_exposed_seconds"] = exposed if measure_comm else None
    spans: dict[str, list[tuple[float, float]]] = {}
    sizes: dict[str, int] = {}
    factors: dict[str, float] = {}
    for t in comm.transfers:
        if t.end is None:
            continue
        spans.setdefault(t.kind, []).append((at(t.start), at(t.end)))
        sizes[t.kind] = sizes.get(t.kind, 0) + t.bytes
        factors[t.kind] = bus_factor(t.kind, t.ranks)
    every = [span for kind_spans in spans.values() for span in kind_spans]
    record["comm_seconds"] = max(union_length(every, 0.0, step), exposed) if measure_comm else None
    record["comm_bytes"] = sizes if measure_comm else None
    record["comm_kind_seconds"] = {k: union_length(s, 0.0, step) for k, s in spans.items()} if measure_comm else None
    record["comm_bus_bandwidth"] = ({k: sizes[k] / record["comm_kind_seconds"][k] * factors[k]
                                     for k in spans if record["comm_kind_seconds"][k] > 0} if measure_comm else None)
    return record


class BreakdownTotals:
    """Running sums of the breakdown over measured steps, one record at a time (memory does not grow with steps)."""

    def __init__(self) -> None:
        self.steps = 0  # measured steps with a breakdown
        self.phases = dict.fromkeys(PHASES, 0.0)
        self.comm_steps = 0  # ... whose communication could be timed
        self.comm = self.exposed = 0.0
        self.bytes: dict[str, int] = {}
        self.kind_seconds: dict[str, float] = {}
        self.moved: dict[str, float] = {}  # Σ bus bandwidth × seconds, per kind

    def add(self, record: dict[str, Any]) -> None:
        if record["warmup"] or record.get("forward_seconds") is None:
            return
        self.steps += 1
        for name in PHASES:
            self.phases[name] += record[f"{name}_seconds"]
        if record.get("comm_seconds") is None:
            return
        self.comm_steps += 1
        self.comm += record["comm_seconds"]
        self.exposed += record["comm_exposed_seconds"]
        for kind, nbytes in record["comm_bytes"].items():
            self.bytes[kind] = self.bytes.get(kind, 0) + nbytes
            seconds = record["comm_kind_seconds"].get(kind, 0.0)
            self.kind_seconds[kind] = self.kind_seconds.get(kind, 0.0) + seconds
            self.moved[kind] = self.moved.get(kind, 0.0) + record["comm_bus_bandwidth"].get(kind, 0.0) * seconds

    def figures(self) -> dict[str, Any]:
        """Summary figures over measured steps: mean seconds per part, bytes per step and achieved bus bandwidth
        per kind (Σ bytes / Σ seconds × bus factor), the share of communication hidden behind computation."""
        if not self.steps:
            return {}
        out: dict[str, Any] = {f"{name}_seconds_mean": total / self.steps for name, total in self.phases.items()}
        if not self.comm_steps:
            out.update(comm_seconds_mean=None, comm_exposed_seconds_mean=None, comm_hidden_ratio=None,
                       comm_bytes_per_step=None, comm_bus_bandwidth=None)
            return out
        out["comm_seconds_mean"] = self.comm / self.comm_steps
        out["comm_exposed_seconds_mean"] = self.exposed / self.comm_steps
        out["comm_hidden_ratio"] = max(0.0, 1 - self.exposed / self.comm) if self.comm > 0 else None
        kinds = sorted(self.bytes)
        out["comm_bytes_per_step"] = {k: self.bytes[k] // self.comm_steps for k in kinds}
        # Σ bytes × bus factor / Σ seconds: each step's bus bandwidth weighted by its seconds
        out["comm_bus_bandwidth"] = {k: self.moved[k] / self.kind_seconds[k] for k in kinds if self.kind_seconds[k] > 0}
        return out
