"""Per-step figures of one worker: the step record, `steps.jsonl`, Prometheus, read back lazily.

Definitions of every number: docs/metrics.md. In short (torchtitan's conventions):
- step time: the time between two marks on the device's timeline (`devices.StepClock`: CUDA events, or the
  host clock on CPU) around one optimizer step; tokens/s global = tokens of all workers in the step / step
  time; per device = global / devices; MFU = flops_per_token x tokens/s per device / peak FLOP/s;
- loss: mean over workers of each worker's mean micro-step loss; grad norm: global L2 after sync, before
  clipping; skipped: the fp16 loss scaler skipped the update;
- memory: peaks of the step (device: CUDA allocator; host: RSS high-water mark), reset at each step start;
- breakdown (`breakdown.py`): the step's phases and its communication, from marks on the same timeline;
- energy (`energy.py`): joules of each interval between log steps, spread evenly over its steps.

Nothing here waits for the device during a step. A step leaves its marks and its loss / grad-norm tensors
pending; `flush()` (at log steps, outside the timed steps) reads the times of every pending step, reduces
their losses over workers in one collective and brings losses and norms to the host in one transfer. Each
figure is still the exact figure of its own step.

Memory does not grow with the number of steps: a flushed record is written to steps.jsonl, exported, folded
into the running totals (`aggregates.StepTotals`) and dropped; only the steps pending since the last log
step are held.
"""

from __future__ import annotations

import json
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gpt2bench.conventions import STEPS_FILE

from .aggregates import StepTotals, finite
from .breakdown import CommTimer, StepComm, StepPhases, resolve
from .devices import PeakMemory, StepClock
from .energy import EnergyLog, EnergyMeter, Unavailable
from .exporter import PrometheusExporter

BREAKDOWN_FIELDS = ("data_seconds", "forward_seconds", "backward_seconds", "optimizer_seconds", "other_seconds",
                    "comm_seconds", "comm_exposed_seconds", "comm_bytes", "comm_kind_seconds", "comm_bus_bandwidth")


class CompileWatch:
    """Seconds torch.compile spends compiling (dynamo tracing, inductor, lazily compiled backward graphs),
    from torch's own compile start/end callbacks. `seconds` only grows."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started: float | None = None
        try:
            from torch._dynamo.callback import callback_handler
        except ImportError:  # a torch without dynamo: nothing is ever compiled
            return
        callback_handler.register_start_callback(self._start)
        callback_handler.register_end_callback(self._end)

    def _start(self, _args=None) -> None:
        self._started = time.perf_counter()

    def _end(self, _args=None) -> None:
        if self._started is not None:
            self.seconds += time.perf_counter() - self._started
            self._started = None


@dataclass
class _Pending:
    """A finished step whose figures are still on the device."""

    step: int
    start: Any
    end: Any
    loss: torch.Tensor
    grad_norm: torch.Tensor
    skipped: torch.Tensor | bool
    lr: float
    data_seconds: float
    compile_seconds: float
    memory: dict[str, int | None]
    marks: list[tuple[str, Any]]
    comm: StepComm | None


class MetricsProcessor:
    """Owns the per-step figures of one worker; worker 0 writes steps.jsonl.

    `tokens_per_step` is the token count of one optimizer step: GLOBAL (all workers) for synchronous
    strategies, this worker's own for async ps (each worker's step is its own update); `devices` the number
    of devices the step's tokens are spread over. `keep_end_times`: keep each step's wall-clock end (async ps,
    whose summary counts each worker's steps before the first one finished: 8 bytes a step).
    """

    def __init__(self, *, config, rank: int, tokens_per_step: int, devices: int, device: torch.device,
                 flops_per_token: float, peak_flops: float | None, exporter: PrometheusExporter | None = None,
                 compile_watch: CompileWatch | None = None, energy: EnergyMeter | None = None,
                 measure_comm: bool = True, keep_end_times: bool = False):
        self.config, self.rank = config, rank
        self.tokens_per_step, self.devices = tokens_per_step, devices
        self.flops_per_token, self.peak_flops = flops_per_token, peak_flops
        self.clock, self.memory = StepClock(device), PeakMemory(device)
        self.compile_watch = compile_watch
        # the breakdown: the loop marks phases, the strategy's hooks record communication (`comm`)
        self.breakdown = bool(config.process.breakdown)
        self.phases = StepPhases(self.clock, enabled=self.breakdown)
        self.comm = CommTimer(self.clock)
        self.measure_comm = measure_comm  # False where communication hides inside forward/backward (DataParallel)
        self.energy = EnergyLog(energy or Unavailable("not measured"))
        self.exporter = exporter
        self.step_end_times = array("d") if keep_end_times else None  # wall clock (time.time) at each step's end
        self._pending: list[_Pending] = []
        self._step_compile_start = 0.0
        self.setup_memory: dict[str, int | None] = {}
        self.mfu_above_one = False
        self._steps_file = None
        if rank == 0:
            out = Path(config.process.output)
            out.mkdir(parents=True, exist_ok=True)
            self._steps_file = open(out / STEPS_FILE, "w", buffering=1)  # noqa: SIM115 (open all run)
        # worker 0's figures are the summary's: only it needs the step-time percentiles (spilled next to steps.jsonl)
        self.totals = StepTotals(keep_times=rank == 0, times_dir=config.process.output if rank == 0 else None)

    # ------------------------------------------------------------------ during the steps (no device sync)
    def end_setup(self) -> None:
        """The set-up phase ends (model built, wrapped, data mapped): keep its memory peaks apart."""
        if not self.setup_memory:
            self.setup_memory = self.memory.read()

    def start_step(self):
        """Reset the memory peaks, mark the step's start; returns the mark for `end_step`."""
        self.end_setup()
        self.memory.reset()
        self._step_compile_start = self._compile_seconds()
        self.energy.start()
        self.phases.take()
        self.comm.take()  # communication outside steps (set-up, log-step reductions) is not the step's
        return self.clock.mark()

    def end_step(self, step: int, start, loss: torch.Tensor, grad_norm: torch.Tensor, skipped: torch.Tensor | bool,
                 lr: float, data_seconds: float) -> None:
        """Mark the end of step `step` (1-based) and keep its figures pending until the next flush."""
        end = self.clock.mark()
        if self.step_end_times is not None:
            self.step_end_times.append(time.time())
        self._pending.append(_Pending(step, start, end, loss.detach(), grad_norm.detach(), skipped, lr, data_seconds,
                                      self._compile_seconds() - self._step_compile_start, self.memory.read(),
                                      self.phases.take(), self.comm.take() if self.breakdown else None))

    def _compile_seconds(self) -> float:
        return self.compile_watch.seconds if self.compile_watch else 0.0

    # ------------------------------------------------------------------ at log steps
    def flush(self, reduce: Callable[[torch.Tensor], torch.Tensor]) -> list[dict[str, Any]]:
        """The pending steps' records, in order. `reduce` makes per-worker losses global (the strategy's
        `mean_over_workers`): one collective for all pending steps, on every worker at the same steps."""
        pending, self._pending = self._pending, []
        if not pending:
            return []
        device = pending[0].loss.device
        losses = reduce(torch.stack([p.loss.float().reshape(()).to(device) for p in pending]))
        norms = torch.stack([p.grad_norm.float().reshape(()).to(device) for p in pending])
        skipped = torch.stack([torch.as_tensor(p.skipped, dtype=torch.float32).reshape(()).to(device) for p in pending])
        losses, norms, skipped = torch.stack([losses.to(device), norms, skipped]).cpu().tolist()  # one transfer
        records = [self._record(p, loss, norm, bool(skip)) for p, loss, norm, skip in zip(pending, losses, norms, skipped)]
        joules = self.energy.per_step(len(pending))  # the device has finished these steps: read its counter
        for record in records:
            record["energy_joules"] = joules
        for record in records:
            if self._steps_file:
                self._steps_file.write(json.dumps(finite(record), allow_nan=False) + "\n")
            if self.exporter:
                self.exporter.observe(record)
            self.totals.add(record)
        return records

    def _record(self, pending: _Pending, loss: float, grad_norm: float, skipped: bool) -> dict[str, Any]:
        step_seconds = self.clock.seconds(pending.start, pending.end)
        tps = self.tokens_per_step / step_seconds
        memory = pending.memory
        on_device = memory["device_bytes"] is not None
        return {
            "step": pending.step,
            "warmup": pending.step <= self.config.training.warmup_steps,
            "loss": loss,
            "grad_norm": grad_norm,
            "skipped": skipped,
            "lr": pending.lr,
            "step_seconds": step_seconds,
            "data_loading_seconds": pending.data_seconds,
            "compile_seconds": pending.compile_seconds,
            "tokens": self.tokens_per_step,
            "tokens_per_second": tps,
            "tokens_per_second_per_device": tps / self.devices,
            "mfu": self.mfu(tps / self.devices),
            "peak_memory_bytes": memory["device_bytes"] if on_device else memory["host_bytes"],
            "peak_memory_reserved_bytes": memory["device_reserved_bytes"] if on_device else memory["host_bytes"],
            "host_peak_memory_bytes": memory["host_bytes"],
            **self._breakdown(pending),
        }

    def _breakdown(self, pending: _Pending) -> dict[str, Any]:
        if not self.breakdown:
            return dict.fromkeys(BREAKDOWN_FIELDS)
        return resolve(self.clock, pending.start, pending.end, pending.marks, pending.comm, self.measure_comm)

    def mfu(self, tokens_per_second_per_device: float | None) -> float | None:
        if not self.peak_flops or tokens_per_second_per_device is None:
            return None
        mfu = self.flops_per_token * tokens_per_second_per_device / self.peak_flops
        if mfu > 1:  # physically impossible: the peak (table or --peak-flops) is wrong for this device
            self.mfu_above_one = True
            return None
        return mfu

    # ------------------------------------------------------------------ at the end
    def memory_payload(self) -> dict[str, int | None]:
        """This worker's set-up peaks and the max of its step peaks, by kind (the payload's memory figures)."""
        most = self.totals.memory_peaks()
        on_device = self.setup_memory.get("device_bytes") is not None
        return {
            "device_peak_bytes": most["peak_memory_bytes"] if on_device else None,
            "device_reserved_peak_bytes": most["peak_memory_reserved_bytes"] if on_device else None,
            "host_peak_bytes": most["host_peak_memory_bytes"],
            "setup_device_peak_bytes": self.setup_memory.get("device_bytes"),
            "setup_host_peak_bytes": self.setup_memory.get("host_bytes"),
            "host_peak_since_start": self.memory.host_since_start,
        }

    def energy_payload(self) -> dict[str, Any]:
        """This worker's joules over its measured steps, and what they were read from (or why not)."""
        meter = self.energy.meter
        joules, measured = self.totals.energy()
        return {"energy_joules": joules, "energy_source": meter.source,
                "energy_scope": meter.scope, "energy_reads": meter.reads, "energy_devices": meter.devices, "energy_reason": meter.reason,
                "energy_measured_steps": measured}

    def finish(self, devices: int) -> dict[str, Any]:
        """What the summary takes from this worker's steps: worker 0's figures (`devices`: what its tokens/s is
        divided by), breakdown and curves' line, and every worker's own rate. Once, after the last flush: it
        removes the step-time file."""
        totals, lead = self.totals, self.rank == 0
        try:
            return {
                "step_figures": totals.figures(devices) if lead else None,
                "breakdown_figures": totals.breakdown.figures() if lead else None,
                "steps_line": totals.curves.line() if lead else None,
                "own_tokens_per_second": totals.own_rate(),
            }
        finally:
            totals.close()

    def close(self) -> None:
        if self._steps_file:
            self._steps_file.close()
            self._steps_file = None
