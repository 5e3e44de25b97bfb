"""One worker's step records folded as they come: the summary's figures in memory that does not grow with steps.

A record (about 1.7 KiB as a dict) is written to `steps.jsonl`, exported, folded here and dropped. What the summary
needs is kept as running totals (`StepTotals`), except two things that need more than a total:

- the percentiles of the measured steps' times are exact (docs/metrics.md: linear interpolation, as numpy), so the
  times go to an unlinked temporary file, 8 bytes each, and `StepTimes.percentile` selects the order statistics
  from it by radix selection (four passes of a 65,536-bucket histogram per value): the same floats `sorted()`
  would give, in a fixed amount of memory;
- the GPT2BENCH_STEPS line (the curves, thinned evenly to fit 16,000 characters): `ThinnedSteps` keeps every k-th
  step's curve columns, k a power of two that doubles whenever more than `CAPACITY` rows would be kept.

The only per-step state left is async ps's step end times (`MetricsProcessor(keep_end_times=True)`, 8 bytes a
step): `steps_when_first_worker_done` counts each worker's steps before a moment only the reporter learns.
"""

from __future__ import annotations

import base64
import gzip
import json
import math
import tempfile
from array import array
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from gpt2bench.conventions import MAX_STEPS_LINE, STEPS_COLUMNS, STEPS_PREFIX

from .breakdown import BreakdownTotals
from .stationarity import halves_ratio

_SIGN = np.uint64(1 << 63)
_DIGIT_BITS = 16
_BUCKETS = 1 << _DIGIT_BITS


def finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; the reason field says what happened
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------- exact percentiles
def _ordered_keys(values: np.ndarray) -> np.ndarray:
    """float64 -> uint64 keys in the floats' order: positives get the sign bit set, negatives every bit flipped."""
    bits = values.view(np.uint64)
    return np.where(bits & _SIGN, ~bits, bits | _SIGN)


def _float_of(key: int) -> float:
    bits = key ^ (1 << 63) if key & (1 << 63) else ~key & ((1 << 64) - 1)
    return float(np.array([bits], dtype=np.uint64).view(np.float64)[0])


class StepTimes:
    """Floats appended one by one to an unlinked temporary file; exact percentiles of all of them at the end."""

    BUFFER = 4096  # values held before they go to the file
    CHUNK = 1 << 14  # values read at a time when selecting (128 KiB)

    def __init__(self, directory: str | Path | None = None):
        self._file = tempfile.TemporaryFile(dir=directory)  # noqa: SIM115 (open for the run; unlinked already)
        self._buffer = array("d")
        self.count = 0

    def add(self, value: float) -> None:
        self._buffer.append(value)
        self.count += 1
        if len(self._buffer) >= self.BUFFER:
            self._spill()

    def _spill(self) -> None:
        self._file.seek(0, 2)
        self._file.write(self._buffer.tobytes())
        self._buffer = array("d")

    def _chunks(self) -> Iterator[np.ndarray]:
        self._spill()
        self._file.seek(0)
        while data := self._file.read(self.CHUNK * 8):
            yield _ordered_keys(np.frombuffer(data, dtype=np.float64))

    def kth(self, k: int) -> float:
        """The k-th smallest value (0-based), found 16 bits of its key at a time."""
        prefix, mask = 0, 0
        for shift in range(64 - _DIGIT_BITS, -1, -_DIGIT_BITS):
            counts = np.zeros(_BUCKETS, dtype=np.int64)
            for keys in self._chunks():
                keys = keys[(keys & np.uint64(mask)) == np.uint64(prefix)]
                counts += np.bincount(((keys >> np.uint64(shift)) & np.uint64(_BUCKETS - 1)).astype(np.int64),
                                      minlength=_BUCKETS)
            below = np.cumsum(counts)
            digit = int(np.searchsorted(below, k, side="right"))
            k -= int(below[digit - 1]) if digit else 0
            prefix |= digit << shift
            mask |= (_BUCKETS - 1) << shift
        return _float_of(prefix)

    def values(self) -> Iterator[np.ndarray]:
        """Every value in the order added, a chunk at a time."""
        self._spill()
        self._file.seek(0)
        while data := self._file.read(self.CHUNK * 8):
            yield np.frombuffer(data, dtype=np.float64)

    def percentile(self, q: float) -> float | None:
        """Linear-interpolated percentile (numpy's default), q in [0, 100], as `summary.percentile` of the values."""
        if not self.count:
            return None
        position = (self.count - 1) * q / 100
        low, high = math.floor(position), math.ceil(position)
        lower = self.kth(low)
        upper = lower if high == low else self.kth(high)
        return lower + (upper - lower) * (position - low)

    def close(self) -> None:
        self._file.close()


# ---------------------------------------------------------------------------------------- the curves' line
def _six_digits(value: Any) -> Any:
    return float(f"{value:.6g}") if isinstance(value, float) else value


class ThinnedSteps:
    """The curve columns (conventions.STEPS_COLUMNS) of every k-th step and of the last one, at most CAPACITY + 1 rows."""

    CAPACITY = 4096  # more rows than a 16,000-character line can carry

    def __init__(self) -> None:
        self.stride = 1
        self.rows: list[tuple[int, tuple]] = []  # (0-based index, columns) of steps 0, k, 2k, ...
        self.last: tuple[int, tuple] | None = None

    def add(self, record: dict[str, Any]) -> None:
        index = self.last[0] + 1 if self.last else 0
        self.last = (index, tuple(_six_digits(finite(record.get(name))) for name in STEPS_COLUMNS))
        if index % self.stride == 0:
            self.rows.append(self.last)
            if len(self.rows) > self.CAPACITY:
                self.rows, self.stride = self.rows[::2], self.stride * 2

    def line(self, limit: int = MAX_STEPS_LINE) -> str | None:
        """`GPT2BENCH_STEPS <base64 gzip JSON columns>` of at most `limit` characters: the kept steps, thinned
        further (every 2nd, 4th, ...) until it fits, the last step always in."""
        if self.last is None:
            return None
        factor = 1
        while True:
            picked = self.rows[::factor]
            if picked[-1][0] != self.last[0]:
                picked = [*picked, self.last]
            columns = {name: [row[i] for _, row in picked] for i, name in enumerate(STEPS_COLUMNS)}
            packed = gzip.compress(json.dumps(columns, separators=(",", ":")).encode(), mtime=0)
            line = STEPS_PREFIX + base64.b64encode(packed).decode()
            if len(line) <= limit or len(picked) <= 2:
                return line if len(line) <= limit else None
            factor *= 2


# ---------------------------------------------------------------------------------------- running totals
class StepTotals:
    """Every figure of a worker's records the summary uses (docs/metrics.md), folded one record at a time.

    `figures(devices)` are worker 0's summary figures, `own_rate()` a worker's tokens/s, `memory_peaks()` its
    step peaks, `energy()` its measured joules. `times_dir`: where measured step times spill (None: not kept,
    percentiles are null; every worker but worker 0 needs no percentiles).
    """

    MEMORY_KEYS = ("peak_memory_bytes", "peak_memory_reserved_bytes", "host_peak_memory_bytes")

    def __init__(self, *, keep_times: bool = True, times_dir: str | Path | None = None):
        self.steps = self.measured = 0
        self.first_loss: float | None = None
        self.last: dict[str, Any] = {}  # loss and grad norm of the last step
        self.tokens = 0
        self.seconds = self.data_seconds = self.compile_seconds = 0.0
        self.skipped = self.skipped_measured = 0
        self.peaks: dict[str, int | None] = dict.fromkeys(self.MEMORY_KEYS)
        self.joules: float | None = 0.0  # None once a measured step's energy is unknown
        self.times = StepTimes(times_dir) if keep_times else None
        self.breakdown = BreakdownTotals()
        self.curves = ThinnedSteps()

    def add(self, record: dict[str, Any]) -> None:
        if self.steps == 0:
            self.first_loss = record["loss"]
        self.steps += 1
        self.last = {"loss": record.get("loss"), "grad_norm": record.get("grad_norm")}
        self.skipped += bool(record.get("skipped"))
        for key in self.MEMORY_KEYS:
            if record.get(key) is not None:
                self.peaks[key] = record[key] if self.peaks[key] is None else max(self.peaks[key], record[key])
        self.curves.add(record)
        self.breakdown.add(record)
        if record["warmup"]:
            return
        self.measured += 1
        self.tokens += record["tokens"]
        self.seconds += record["step_seconds"]
        self.data_seconds += record["data_loading_seconds"]
        self.compile_seconds += record.get("compile_seconds") or 0.0
        self.skipped_measured += bool(record.get("skipped"))
        joules = record.get("energy_joules")
        self.joules = None if joules is None or self.joules is None else self.joules + joules
        if self.times is not None:
            self.times.add(record["step_seconds"])

    def own_rate(self) -> float | None:
        """Tokens/s of the worker's records: Σ tokens / Σ step_seconds over its measured steps."""
        return self.tokens / self.seconds if self.measured and self.seconds > 0 else None

    def figures(self, devices: int) -> dict[str, Any]:
        """Summary figures over the measured (non-warm-up) steps (docs/metrics.md, Summary)."""
        tps = self.own_rate()
        percentile = self.times.percentile if self.times is not None else lambda _q: None
        return {
            "steps": self.steps,
            "measured_steps": self.measured,
            "tokens_per_second": tps,
            "tokens_per_second_per_device": tps / devices if tps is not None else None,
            "step_time_p50_seconds": percentile(50),
            "step_time_p95_seconds": percentile(95),
            "data_loading_seconds_mean": self.data_seconds / self.measured if self.measured else None,
            "final_loss": self.last.get("loss"),
            "first_loss": self.first_loss,
            "grad_norm": self.last.get("grad_norm"),
            "skipped_steps": self.skipped,
            "skipped_measured_steps": self.skipped_measured,
            "compile_seconds_in_measured_steps": self.compile_seconds,
            **halves_ratio(self.times),  # steady or still warming up (docs/analysis.md, Steady state)
        }

    def memory_peaks(self) -> dict[str, int | None]:
        return dict(self.peaks)

    def energy(self) -> tuple[float | None, int]:
        """Joules over the measured steps (None when none was measured or one is unknown) and how many there were."""
        return (self.joules if self.measured else None), self.measured

    def close(self) -> None:
        if self.times is not None:
            self.times.close()


def fold(records: Iterable[dict[str, Any]], *, keep_times: bool = True) -> StepTotals:
    """`records` folded into fresh totals (tests, and any caller that has a list)."""
    totals = StepTotals(keep_times=keep_times)
    for record in records:
        totals.add(record)
    return totals
