"""Per-step figures, `steps.jsonl`, `summary.json`, the termination message and Prometheus.

Definitions of every number: docs/metrics.md. In short (torchtitan's conventions):
- step time: wall time of one optimizer step on worker 0 (grad-accum micro-steps, sync, update),
  measured after a device synchronise; tokens/s global = tokens of all workers in the step / step time;
  per device = global / devices;
- loss: mean over workers of each worker's mean micro-step loss; grad norm: global L2 after sync,
  before clipping; peak memory per rank: CUDA max allocated/reserved (reset every step), else peak RSS;
- MFU = flops_per_token × tokens/s per device / peak FLOP/s, only where the peak is known.
Warm-up steps are recorded in steps.jsonl (`warmup: true`) and left out of every summary figure.

The one `.item()` per step (a device sync) happens in `MetricsProcessor.record`, after the step.
"""

from __future__ import annotations

import json
import logging
import math
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

import torch

from gpt2bench.protocol import SUMMARY_PREFIX
from gpt2bench.files import termination_log_path, write_atomic, write_termination_message

log = logging.getLogger("gpt2bench.trainer")

COMPACT_LIMIT_BYTES = 4096


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


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
            out = Path(config.output)
            out.mkdir(parents=True, exist_ok=True)
            self._steps_file = open(out / "steps.jsonl", "w", buffering=1)  # noqa: SIM115 (open all run)

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
            "warmup": step <= self.config.warmup_steps,
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
            self._steps_file.write(json.dumps(_finite(record), allow_nan=False) + "\n")
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


# --------------------------------------------------------------------------- summary
def summarize(records: list[dict[str, Any]], devices: int) -> dict[str, Any]:
    """Summary figures over the measured (non-warm-up) steps of worker 0's records."""
    measured = [r for r in records if not r["warmup"]]
    times = [r["step_seconds"] for r in measured]
    tokens = sum(r["tokens"] for r in measured)
    tps = tokens / sum(times) if times and sum(times) > 0 else None
    mfus = [r["mfu"] for r in measured if r["mfu"] is not None]
    last = records[-1] if records else {}
    mfu = sum(mfus) / len(mfus) if mfus and len(mfus) == len(measured) else None
    return {
        "steps": len(records),
        "measured_steps": len(measured),
        "tokens_per_second": tps,
        "tokens_per_second_per_device": tps / devices if tps is not None else None,
        "step_time_p50_seconds": percentile(times, 50),
        "step_time_p95_seconds": percentile(times, 95),
        "data_loading_seconds_mean": sum(r["data_loading_seconds"] for r in measured) / len(measured) if measured else None,
        "final_loss": last.get("loss"),
        "first_loss": records[0]["loss"] if records else None,
        "grad_norm": last.get("grad_norm"),
        "mfu": mfu,
    }


def compact(summary: dict[str, Any]) -> str:
    """The summary as one JSON line ≤ 4 KB: long strings are cut, then bulky fields dropped."""
    small = {k: v for k, v in summary.items() if k != "config"}
    for key in ("reason", "note"):
        if isinstance(small.get(key), str) and len(small[key]) > 1000:
            small[key] = small[key][:997] + "..."
    text = json.dumps(small, separators=(",", ":"), allow_nan=False, default=str)
    for bulky in ("param_checksums", "state_bytes_per_rank", "peak_memory_bytes_per_rank", "note"):
        if len(text.encode()) <= COMPACT_LIMIT_BYTES:
            break
        small.pop(bulky, None)
        text = json.dumps(small, separators=(",", ":"), allow_nan=False, default=str)
    return text


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; the reason field says what happened
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def publish_summary(summary: dict[str, Any], output: str) -> str:
    """summary.json (atomic), the termination message, then the stdout line. Returns the compact text."""
    summary = _finite(summary)
    write_atomic(Path(output) / "summary.json", json.dumps(summary, indent=2, allow_nan=False, default=str) + "\n")
    text = compact(summary)
    target = termination_log_path()
    if target is not None:
        try:
            write_termination_message(target, text)
        except OSError as exc:
            print(f"gpt2bench train: cannot write termination log {target}: {exc}", file=sys.stderr)
    print(SUMMARY_PREFIX + text, flush=True)
    return text


# ------------------------------------------------------------------------ prometheus
class PrometheusExporter:
    """Per-rank metrics; every local process writes, local rank 0 serves them on --metrics-port.

    Processes of one pod share a prometheus-client multiprocess folder, so one port (the pod's
    scrape annotation) exposes every rank, told apart by the `rank` label.
    """

    GAUGES: ClassVar[dict[str, tuple[str, str]]] = {
        "step": ("gpt2bench_train_step", ("Last completed optimizer step (1-based, warm-up included).")),
        "loss": ("gpt2bench_train_loss", ("Training loss of the last step: mean over workers of each worker's mean "
                 "micro-step cross-entropy (nats/token).")),
        "grad_norm": ("gpt2bench_train_grad_norm", ("Global L2 norm of all gradients after cross-worker sync, "
                      "before clipping, last step.")),
        "lr": ("gpt2bench_train_learning_rate", ("Learning rate of the last step.")),
        "step_seconds": ("gpt2bench_train_step_duration_seconds", ("Wall time of the last optimizer step on this "
                         "rank, after a device synchronise.")),
        "data_loading_seconds": ("gpt2bench_train_data_loading_seconds", ("Time the last step waited for its "
                                 "batches (indexing + host-to-device copy).")),
        "tokens_per_second": ("gpt2bench_train_tokens_per_second", ("Global tokens per second of the last step: "
                              "tokens of all workers / step duration (torchtitan tps x devices).")),
        "tokens_per_second_per_device": ("gpt2bench_train_tokens_per_second_per_device", ("Tokens per second per "
                                         "device of the last step (torchtitan's tps).")),
        "mfu": ("gpt2bench_train_mfu_ratio", ("Model FLOPs utilisation of the last step, 0-1: flops_per_token x "
                "tokens/s per device / device peak FLOP/s. Absent when the peak is unknown (CPU).")),
        "peak_memory_bytes": ("gpt2bench_train_memory_peak_bytes", ("Peak memory of this rank during the last step: "
                              "CUDA max allocated, or peak RSS (high-water mark) on CPU.")),
        "peak_memory_reserved_bytes": ("gpt2bench_train_memory_peak_reserved_bytes", ("Peak CUDA memory reserved by "
                                       "the caching allocator during the last step (peak RSS on CPU).")),
    }

    def __init__(self, config, *, rank: int, strategy: str, local_rank: int, workers: int):
        self.workers = max(1, workers)
        self.folder = Path(tempfile.gettempdir()) / f"gpt2bench-prometheus-{os.getppid()}-{config.metrics_port}"
        self.folder.mkdir(parents=True, exist_ok=True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(self.folder)
        from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server, values
        from prometheus_client.multiprocess import MultiProcessCollector

        values.ValueClass = values.MultiProcessValue()  # in case prometheus_client was imported before
        labels = {"benchmark": config.benchmark, "run": config.run, "strategy": strategy,
                  "precision": config.precision, "rank": str(rank)}
        names = list(labels)
        self._gauges = {
            key: Gauge(name, doc, names, registry=None, multiprocess_mode="mostrecent").labels(**labels)
            for key, (name, doc) in self.GAUGES.items()
        }
        self._steps = Counter("gpt2bench_train_steps", "Optimizer steps completed by this rank.",
                              names, registry=None).labels(**labels)
        self._tokens = Counter("gpt2bench_train_tokens", "Tokens this worker trained on (its share of each "
                               "global step); sum over ranks for the global count.",
                               names, registry=None).labels(**labels)
        self._seconds = Counter("gpt2bench_train_step_seconds", "Total wall time spent in optimizer steps on this "
                                "rank; rate(tokens_total)/rate(step_seconds_total) gives mean tokens/s.",
                                names, registry=None).labels(**labels)
        self.server = None
        if local_rank == 0:
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=str(self.folder))
            try:
                self.server, _thread = start_http_server(config.metrics_port, registry=registry)
            except OSError as exc:  # e.g. several "pods" of a local run share one network: train on anyway
                log.warning("metrics port %d unavailable (%s): this process group's metrics are not served",
                            config.metrics_port, exc)

    def observe(self, record: dict[str, Any]) -> None:
        for key, gauge in self._gauges.items():
            if record.get(key) is not None:
                gauge.set(float(record[key]))
        self._steps.inc()
        self._tokens.inc(record["tokens"] / self.workers)
        self._seconds.inc(record["step_seconds"])

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()


# ------------------------------------------------------------------------ the summary
def versions() -> dict[str, str]:
    import transformers

    import gpt2bench

    return {"torch": torch.__version__, "transformers": transformers.__version__, "gpt2bench": gpt2bench.__version__,
            "python": sys.version.split()[0]}


def build_summary(config, env, parallel, payloads: list[dict[str, Any]], *, status: str = "succeeded",
                  reason: str | None = None) -> dict[str, Any]:
    """The run's summary from every process's payload (worker 0's carries the step records)."""
    workers = sorted((p for p in payloads if p.get("is_worker")), key=lambda p: p.get("worker_rank", 0))
    lead = next((p for p in workers if p.get("records") is not None), {})
    devices = lead.get("devices") or parallel.world_size * parallel.devices_per_worker
    for payload in payloads:  # a failure anywhere fails the run
        if payload.get("status") == "failed" and status != "failed":
            status, reason = "failed", payload.get("reason")
    peaks = [p.get("peak_memory_bytes") or 0 for p in payloads]
    # From the workers: under ps the reporter (job rank 0) is a CPU server even when workers use GPUs.
    on_gpu = lead.get("device_type", parallel.device.type) == "cuda"
    summary = {
        "status": status,
        "reason": reason,
        "benchmark": config.benchmark,
        "run": config.run,
        "strategy": config.strategy,
        "precision": config.precision,
        "model": config.model,
        "world_size": parallel.world_size,
        "nodes": env.nodes,
        "devices_per_node": devices // max(1, env.nodes) if on_gpu else 0,  # workers' devices, servers excluded
        "devices": devices,
        "processes": env.world_size,
        "micro_batch_size": config.micro_batch_size,
        "grad_accum": config.grad_accum,
        "seq_len": config.seq_len,
        "global_batch_tokens": config.tokens_per_step_per_worker * devices,
        "warmup_steps": config.warmup_steps,
        **summarize(lead.get("records") or [], devices),
        "peak_memory_bytes": max(peaks) if peaks else None,
        "peak_memory_reserved_bytes": max((p.get("peak_memory_reserved_bytes") or 0 for p in payloads), default=None),
        "peak_memory_kind": "cuda_max_allocated" if on_gpu else "cpu_peak_rss",
        "device_name": lead.get("device_name"),
        "peak_memory_bytes_per_rank": peaks,
        "state_bytes": max((p.get("state_bytes") or 0 for p in payloads), default=None),
        "state_bytes_per_rank": [p.get("state_bytes") for p in payloads],
        "param_checksums": [p.get("param_checksum") for p in workers],
        "train_seconds": lead.get("train_seconds"),
        "startup_seconds": lead.get("startup_seconds"),
        "n_params": lead.get("n_params"),
        "flops_per_token": lead.get("flops_per_token"),
        "peak_flops": lead.get("peak_flops"),
        "note": "; ".join(parallel.notes + (["mfu above 1 with this peak FLOP/s: mfu left out, check --peak-flops"]
                                           if lead.get("mfu_above_one") else [])) or None,
        **parallel.extra_summary,
        "versions": versions(),
        "config_hash": config.config_hash(),
        "config": config.as_dict(),
    }
    return summary
