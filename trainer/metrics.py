"""Per-step figures of one worker: the step record, `steps.jsonl`, and peak memory.

Definitions of every number: docs/metrics.md. In short (torchtitan's conventions):
- step time: wall time of one optimizer step on worker 0 (grad-accum micro-steps, sync, update),
  measured after a device synchronise; tokens/s global = tokens of all workers in the step / step time;
  per device = global / devices;
- loss: mean over workers of each worker's mean micro-step loss; grad norm: global L2 after sync,
  before clipping; peak memory per rank: CUDA max allocated/reserved (reset every step), else peak RSS;
- MFU = flops_per_token x tokens/s per device / peak FLOP/s, only where the peak is known.
Warm-up steps are recorded in steps.jsonl (`warmup: true`) and left out of every summary figure
(`gpt2bench.trainer.summary`). Prometheus export: `gpt2bench.trainer.exporter`.

The one `.item()` per step (a device sync) happens in `MetricsProcessor.record`, after the step.
"""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path
from typing import Any

import torch

from gpt2bench.protocol import STEPS_FILE
from gpt2bench.trainer.exporter import PrometheusExporter
from gpt2bench.trainer.summary import finite


class PeakMemory:
    """Peak memory of this process: CUDA allocator peaks (reset each read) or peak RSS on CPU."""

    def __init__(self, device: torch.device):
        self.device = device

    def read_and_reset(self) -> dict[str, int]:
        if self.device.type == "cuda":
            figures = {
                "peak_memory_bytes": int(torch.cuda.max_memory_allocated(self.device)),
                "peak_memory_reserved_bytes": int(torch.cuda.max_memory_reserved(self.device)),
            }
            torch.cuda.reset_peak_memory_stats(self.device)
            return figures
        # Linux reports ru_maxrss in KiB; it is a high-water mark, it cannot be reset
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return {"peak_memory_bytes": rss, "peak_memory_reserved_bytes": rss}

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


class MetricsProcessor:
    """Owns the per-step counters of one worker; worker 0 writes steps.jsonl.

    `tokens_per_step` is the GLOBAL token count of one optimizer step; `devices` the number of
    devices over which it is spread (workers × devices per worker).
    """

    def __init__(self, *, config, rank: int, tokens_per_step: int, devices: int, device: torch.device,
                 flops_per_token: float, peak_flops: float | None, exporter: PrometheusExporter | None = None):
        self.config, self.rank = config, rank
        self.tokens_per_step, self.devices = tokens_per_step, devices
        self.flops_per_token, self.peak_flops = flops_per_token, peak_flops
        self.memory = PeakMemory(device)
        self.exporter = exporter
        self.records: list[dict[str, Any]] = []
        self.mfu_above_one = False
        self.peak_memory_bytes = 0
        self.peak_memory_reserved_bytes = 0
        self._steps_file = None
        if rank == 0:
            out = Path(config.process.output)
            out.mkdir(parents=True, exist_ok=True)
            self._steps_file = open(out / STEPS_FILE, "w", buffering=1)  # noqa: SIM115 (open all run)

    def record(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor, lr: float,
               started: float, data_seconds: float) -> dict[str, Any]:
        """Close step `step` (1-based) that began at perf_counter `started`; returns its record."""
        self.memory.synchronize()  # honest timing: the device has finished the step
        step_seconds = time.perf_counter() - started
        # the one host sync of the step: both scalars in one transfer
        loss_value, norm_value = torch.stack([loss.detach().float().cpu(), grad_norm.detach().float().cpu()]).tolist()
        memory = self.memory.read_and_reset()
        self.peak_memory_bytes = max(self.peak_memory_bytes, memory["peak_memory_bytes"])
        self.peak_memory_reserved_bytes = max(self.peak_memory_reserved_bytes, memory["peak_memory_reserved_bytes"])
        tps = self.tokens_per_step / step_seconds
        record = {
            "step": step,
            "warmup": step <= self.config.training.warmup_steps,
            "loss": loss_value,
            "grad_norm": norm_value,
            "lr": lr,
            "step_seconds": step_seconds,
            "data_loading_seconds": data_seconds,
            "tokens": self.tokens_per_step,
            "tokens_per_second": tps,
            "tokens_per_second_per_device": tps / self.devices,
            "mfu": self._mfu(tps / self.devices),
            **memory,
        }
        self.records.append(record)
        if self._steps_file:
            self._steps_file.write(json.dumps(finite(record), allow_nan=False) + "\n")
        if self.exporter:
            self.exporter.observe(record)
        return record

    def _mfu(self, tokens_per_second_per_device: float) -> float | None:
        if not self.peak_flops:
            return None
        mfu = self.flops_per_token * tokens_per_second_per_device / self.peak_flops
        if mfu > 1:  # physically impossible: the peak (table or --peak-flops) is wrong for this device
            self.mfu_above_one = True
            return None
        return mfu

    def close(self) -> None:
        if self._steps_file:
            self._steps_file.close()
            self._steps_file = None
