"""The run's summary: every process's payload gathered on the reporter, summarised, published.

`summary.json` (atomic), the compact copy (<= 4 KB) in the container's termination message, and the last
stdout line `GPT2BENCH_SUMMARY {json}`: where the operator, `gpt2bench launch` and the local runner read a
run's result. Definitions: docs/metrics.md (Summary).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from gpt2bench.conventions import MAX_STEPS_LINE, MAX_TERMINATION_MESSAGE, SUMMARY_FILE, SUMMARY_PREFIX
from gpt2bench.files import termination_log_path, write_atomic, write_termination_message

from .aggregates import ThinnedSteps, finite, fold
from .fabric import fabric_summary

COMPACT_LIMIT_BYTES = MAX_TERMINATION_MESSAGE


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(records: list[dict[str, Any]], devices: int) -> dict[str, Any]:
    """Summary figures over the measured (non-warm-up) steps of a list of records (`StepTotals.figures`)."""
    totals = fold(records)
    try:
        return totals.figures(devices)
    finally:
        totals.close()


def compact(summary: dict[str, Any]) -> str:
    """The summary as one JSON line ≤ 4 KB: long strings are cut, then bulky fields dropped."""
    small = {k: v for k, v in summary.items() if k != "config"}
    for key in ("reason", "note"):
        if isinstance(small.get(key), str) and len(small[key]) > 1000:
            small[key] = small[key][:997] + "..."
    text = json.dumps(small, separators=(",", ":"), allow_nan=False, default=str)
    for bulky in ("memory_per_rank", "energy_joules_per_device", "breakdown_method", "param_checksums", "state_bytes_per_rank", "peak_memory_bytes_per_rank",
                  "worker_tokens_per_second", "steps_when_first_worker_done", "node_names", "note"):
        if len(text.encode()) <= COMPACT_LIMIT_BYTES:
            break
        small.pop(bulky, None)
        text = json.dumps(small, separators=(",", ":"), allow_nan=False, default=str)
    return text


def publish_summary(summary: dict[str, Any], output: str) -> str:
    """summary.json (atomic), the termination message, then the stdout line. Returns the compact text."""
    summary = finite(summary)
    write_atomic(Path(output) / SUMMARY_FILE, json.dumps(summary, indent=2, allow_nan=False, default=str) + "\n")
    text = compact(summary)
    target = termination_log_path()
    if target is not None:
        try:
            write_termination_message(target, text)
        except OSError as exc:
            print(f"gpt2bench train: cannot write termination log {target}: {exc}", file=sys.stderr)
    print(SUMMARY_PREFIX + text, flush=True)
    return text


def steps_line(records: Iterable[dict[str, Any]], limit: int = MAX_STEPS_LINE) -> str | None:
    """`GPT2BENCH_STEPS <base64 gzip JSON columns>` of the curves' columns, at most `limit` characters: every
    k-th step (k a power of two, doubling until it fits) plus the last one, values to 6 significant digits
    (`ThinnedSteps`; a worker folds its records into one as they come). The operator keeps it (a pod's log does
    not outlive the pod), so the cluster report draws the same curves."""
    thinned = ThinnedSteps()
    for record in records:
        thinned.add(record)
    return thinned.line(limit)


def publish_steps(payloads: list[dict[str, Any]]) -> None:
    """Print worker 0's curves (`steps_line` of its payload) as the GPT2BENCH_STEPS line (before the summary line)."""
    lead = next((p for p in sorted(payloads, key=lambda p: p.get("worker_rank", 0))
                 if p.get("is_worker") and p.get("steps_line")), None)
    if lead:
        print(lead["steps_line"], flush=True)


def versions() -> dict[str, str]:
    import transformers

    import gpt2bench

    return {"torch": torch.__version__, "transformers": transformers.__version__, "gpt2bench": gpt2bench.__version__,
            "python": sys.version.split()[0]}


def _max(values) -> int | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def memory_summary(payloads: list[dict[str, Any]], on_gpu: bool) -> dict[str, Any]:
    """Peaks by kind (device / host) and phase (set-up / steps), per rank and role, and the headline figure."""
    per_rank = [{"job_rank": p.get("job_rank"), "role": p.get("role", "worker"),
                 "device_peak_bytes": p.get("device_peak_bytes"), "host_peak_bytes": p.get("host_peak_bytes"),
                 "setup_device_peak_bytes": p.get("setup_device_peak_bytes"),
                 "setup_host_peak_bytes": p.get("setup_host_peak_bytes"),
                 "host_peak_since_start": p.get("host_peak_since_start")} for p in payloads]
    headline = "device_peak_bytes" if on_gpu else "host_peak_bytes"
    return {
        "peak_memory_bytes": _max(r[headline] for r in per_rank),
        "peak_memory_reserved_bytes": _max(p.get("device_reserved_peak_bytes" if on_gpu else "host_peak_bytes")
                                           for p in payloads),
        "peak_memory_kind": "cuda_max_allocated" if on_gpu else "cpu_peak_rss",
        "peak_memory_bytes_per_rank": [r[headline] for r in per_rank],
        "peak_device_memory_bytes": _max(r["device_peak_bytes"] for r in per_rank),
        "peak_host_memory_bytes": _max(r["host_peak_bytes"] for r in per_rank),
        "setup_peak_device_memory_bytes": _max(r["setup_device_peak_bytes"] for r in per_rank),
        "setup_peak_host_memory_bytes": _max(r["setup_host_peak_bytes"] for r in per_rank),
        "memory_per_rank": per_rank,
    }


def steps_when_first_done(workers: list[dict[str, Any]]) -> list[int] | None:
    """Independent (async) workers: how many steps each had finished when the first one finished its last."""
    ends = [w.get("step_end_times") for w in workers]
    if not ends or any(not e for e in ends):
        return None
    first_done = min(e[-1] for e in ends)
    return [sum(t <= first_done for t in e) for e in ends]


def build_summary(config, env, parallel, payloads: list[dict[str, Any]], *, status: str = "succeeded",
                  reason: str | None = None) -> dict[str, Any]:
    """The run's summary from every process's payload (worker 0's carries its steps' figures)."""
    workers = sorted((p for p in payloads if p.get("is_worker")), key=lambda p: p.get("worker_rank", 0))
    lead = next((p for p in workers if p.get("step_figures") is not None), {})
    devices = lead.get("devices") or parallel.world_size * parallel.devices_per_worker
    for payload in payloads:  # a failure anywhere fails the run
        if payload.get("status") == "failed" and status != "failed":
            status, reason = "failed", payload.get("reason")
    # From the workers: under ps the reporter (job rank 0) is a server, maybe on the CPU while workers use GPUs.
    on_gpu = lead.get("device_type", parallel.device.type) == "cuda"
    figures = lead.get("step_figures") or summarize([], devices)
    notes = list(parallel.notes)
    if parallel.independent_steps and workers:  # async ps: every worker's step is its own; rates add up
        rates = [w.get("own_tokens_per_second") for w in workers]
        figures["tokens_per_second"] = sum(rates) if all(r is not None for r in rates) else None
        figures["tokens_per_second_per_device"] = (figures["tokens_per_second"] / devices
                                                   if figures["tokens_per_second"] is not None else None)
        figures["worker_tokens_per_second"] = rates
    flops, peak = lead.get("flops_per_token"), lead.get("peak_flops")
    tps_device = figures["tokens_per_second_per_device"]
    mfu = flops * tps_device / peak if flops and peak and tps_device else None
    if mfu is not None and mfu > 1 or lead.get("mfu_above_one"):
        mfu = None
        notes.append("mfu above 1 with this peak FLOP/s: mfu left out, check --peak-flops")
    if figures["skipped_measured_steps"]:
        notes.append(f"{figures['skipped_measured_steps']} measured step(s) skipped by the fp16 loss scaler: "
                     "their time counts, their update did not happen")
    fabric, fabric_notes = fabric_summary(payloads, env.nodes, on_gpu, parallel.transport_between_nodes)
    notes += fabric_notes
    compile_seconds = max((w.get("compile_seconds") or 0.0 for w in workers), default=0.0)
    if figures["compile_seconds_in_measured_steps"] > 0:
        notes.append(f"torch.compile compiled during measured steps ({figures['compile_seconds_in_measured_steps']:.1f}"
                     " s): raise warmupSteps so that compilation ends in warm-up")
    summary = {
        "status": status,
        "reason": reason,
        "benchmark": config.process.benchmark,
        "run": config.process.run,
        "strategy": config.strategy.name,
        "precision": config.precision,
        "model": config.model.preset,
        "world_size": parallel.world_size,
        "nodes": env.nodes,
        "devices_per_node": devices // max(1, env.nodes) if on_gpu else 0,  # workers' devices, servers excluded
        "devices": devices,
        "processes": env.world_size,
        "micro_batch_size": config.training.micro_batch_size,
        "grad_accum": config.training.grad_accum,
        "seq_len": config.training.seq_len,
        "global_batch_tokens": config.tokens_per_step_per_worker * devices,
        "warmup_steps": config.training.warmup_steps,
        **figures,
        "mfu": mfu,
        "peak_flops_precision": lead.get("peak_flops_precision"),
        "compiled": lead.get("compiled"),
        "compile_seconds": compile_seconds,
        **memory_summary(payloads, on_gpu),
        "device_name": lead.get("device_name"),
        "state_bytes": max((p.get("state_bytes") or 0 for p in payloads), default=None),
        "state_bytes_per_rank": [p.get("state_bytes") for p in payloads],
        # every process's intra-op threads, read inside it (servers included), and its share of its pod's cores
        "threads_by_rank": [p.get("threads") for p in sorted(payloads, key=lambda p: p.get("job_rank", 0))],
        "threads_per_rank": max((p.get("threads") or 0 for p in payloads), default=0) or None,
        "cores_per_rank": max((p.get("cores_per_rank") or 0 for p in payloads), default=0) or None,
        # torch.compile's worker processes per rank (inductor's compile threads), bounded by that share
        "compile_threads": max((p.get("compile_threads") or 0 for p in payloads), default=0) or None,
        "param_checksums": [p.get("param_checksum") for p in workers],
        "train_seconds": lead.get("train_seconds"),
        "startup_seconds": lead.get("startup_seconds"),
        "n_params": lead.get("n_params"),
        "padded_vocab_size": lead.get("padded_vocab_size"),
        "flops_per_token": flops,
        "peak_flops": peak,
        **fabric,
        "note": "; ".join(notes) or None,
        **parallel.extra_summary,
        "versions": versions(),
        "config_hash": config.config_hash(),
        "config": config.as_dict(),
    }
    summary.update(breakdown_summary(config, parallel, lead.get("breakdown_figures") or {}))
    summary.update(network_summary(summary, lead))
    summary.update(energy_summary(workers, figures["measured_steps"], config.tokens_per_step_per_worker * devices,
                                  parallel.independent_steps))
    if parallel.independent_steps:
        summary["steps_when_first_worker_done"] = steps_when_first_done(workers)
    return summary


def breakdown_summary(config, parallel, figures: dict[str, Any]) -> dict[str, Any]:
    """Worker 0's step breakdown over its measured steps (`BreakdownTotals.figures`; docs/metrics.md, Step
    breakdown)."""
    from .breakdown import PHASES

    keys = [f"{name}_seconds_mean" for name in PHASES] + [
        "comm_seconds_mean", "comm_exposed_seconds_mean", "comm_hidden_ratio", "comm_bytes_per_step",
        "comm_bus_bandwidth"]
    figures = figures if config.process.breakdown else {}
    return {"breakdown": bool(config.process.breakdown) and bool(figures),
            "breakdown_method": parallel.breakdown_method if figures else None,
            **{key: figures.get(key) for key in keys}}


def network_summary(summary: dict[str, Any], lead: dict[str, Any]) -> dict[str, Any]:
    """The collectives probe beside what the steps achieved (docs/metrics.md, Achieved and probed bus
    bandwidth): per kind, and for the kind that moves the most bytes per step (`bus_kind`) as scalars."""
    probed, achieved = lead.get("probe_bus_bandwidth") or {}, summary.get("comm_bus_bandwidth") or {}
    sent = summary.get("comm_bytes_per_step") or {}
    main = min((k for k in sent if k in achieved), key=lambda k: (-sent[k], k), default=None)  # a tie: first name
    share = achieved[main] / probed[main] if probed.get(main) else None
    return {"probe_bus_bandwidth": probed or None, "probe_message_bytes": lead.get("probe_message_bytes"),
            "bus_kind": main, "bus_bandwidth_achieved": achieved.get(main),
            "bus_bandwidth_probed": probed.get(main), "bus_bandwidth_share": share}


def energy_summary(workers: list[dict[str, Any]], measured_steps: int, tokens_per_step: int,
                   independent: bool) -> dict[str, Any]:
    """Joules over the measured steps, summed over the run's devices (GPUs) or nodes (CPU packages), per step
    and per 1 M tokens; null with the reason when a reading is missing (docs/metrics.md, Energy)."""
    readers = [w for w in workers if w.get("energy_reads")]
    joules = [w.get("energy_joules") for w in readers]
    reasons = sorted({w.get("energy_reason") for w in readers if w.get("energy_reason")})
    stuck = [w for w in readers if w.get("energy_joules") is not None and w["energy_joules"] <= 0]
    if stuck:  # a counter that did not advance while the devices trained is not a measurement of 0 J
        devices = ", ".join(d for w in stuck for d in w.get("energy_devices") or []) or "its counter"
        reasons.append(f"not measurable: the {stuck[0].get('energy_source') or 'energy'} counter ({devices}) did not "
                       f"advance over the measured steps ({sum(w['energy_joules'] for w in stuck):g} J): it is not "
                       "updated here (a virtual machine's or a container's stub), so no energy was measured")
    if not readers or any(j is None for j in joules) or stuck or not measured_steps:
        return {"energy_joules": None, "energy_joules_per_step": None, "energy_joules_per_million_tokens": None,
                "energy_joules_per_device": None, "energy_source": None,
                "energy_unavailable_reason": "; ".join(reasons) or "no measured step"}
    total = sum(joules)
    # async ps: workers' steps are their own; the job's tokens are every worker's measured tokens
    tokens = (sum(w.get("energy_measured_steps") or 0 for w in workers) * tokens_per_step // max(1, len(workers))
              if independent else measured_steps * tokens_per_step)
    return {"energy_joules": total, "energy_joules_per_step": total / measured_steps,
            "energy_joules_per_million_tokens": total / tokens * 1e6 if tokens else None,
            "energy_joules_per_device": [{"device": ", ".join(w.get("energy_devices") or []),
                                          "job_rank": w.get("job_rank"), "joules": w.get("energy_joules")}
                                         for w in readers],
            "energy_source": readers[0].get("energy_source"), "energy_unavailable_reason": None}
