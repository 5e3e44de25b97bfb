"""What does the step breakdown (`--breakdown`, on by default) cost? The trainer's real loop with it on and off.

In one process: two `Trainer`s over the same configuration, one with `--breakdown`, one with `--no-breakdown`
(for `ddp`, both wrapped over the same one-process gloo group, so the timed all-reduce hook runs against the
reducer's built-in all-reduce). Blocks of `--steps` steps of each alternate `--repeats` times, the first of
each round rotating. Each round gives one paired ratio (off seconds / on seconds: throughput with the breakdown
over without), so drift of a shared machine hurts both alike; the estimate is their geometric mean with a
95 % Student-t interval on the log scale over rounds (the report's rule, docs/analysis.md). On CPU it compares
process CPU time (one thread: the work done), on GPU wall time after a synchronize.

Claim: on/off throughput >= 0.99 (<= 1 % overhead). The verdict is "met" when the whole interval
lies above 0.99, "missed" when it lies below, else "inconclusive" with the interval.

A whole-loop ratio on a shared CPU is rarely tight enough to decide 1 %, so the script also measures the
recorders' own work directly: one step's phase marks, `--buckets` timed transfers (launch, complete, window)
and the resolution into seconds, repeated many times on the host clock, as a share of the measured step.
That bounds the direct cost precisely; the indirect one (a Python comm hook instead of DDP's built-in
all-reduce) shows only in the whole-loop ratio. Short by default:

    OMP_NUM_THREADS=1 python benchmarks/bench_breakdown_overhead.py [--strategy ddp] [--steps 8] [--repeats 4]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time

import torch
from bench_trainer import timed  # benchmarks/ is the script's folder, first on sys.path

from gpt2bench.report.noise import Contrast, Interval, mean_contrast

CLAIM = 0.99  # on/off throughput: at most 1 % overhead


def paired_ratio(on: list[tuple[float, float]], off: list[tuple[float, float]], clock: int) -> Interval | None:
    """Throughput with the breakdown over without: the geometric mean over rounds of off seconds / on seconds,
    with the 95 % t interval of the mean log ratio (None below 2 rounds)."""
    logs = [math.log(o[clock] / n[clock]) for n, o in zip(on, off, strict=True)]
    mean = mean_contrast(logs)
    if mean is None:
        return None
    return Contrast(mean.center, mean.se, mean.df).interval()  # the mean log ratio, shown as a ratio


def verdict(interval: Interval | None, claim: float = CLAIM) -> str:
    """"met" (the interval lies above the claim), "missed" (below) or "inconclusive" (across it, or no
    interval)."""
    side = interval.side(claim) if interval is not None else "across"
    return {"above": "met", "below": "missed"}.get(side, "inconclusive")


def recorder_seconds_per_step(buckets: int, iterations: int = 2000) -> float:
    """Host seconds the breakdown's recorders spend on one step: the loop's phase marks, `buckets` timed
    all-reduces (launch, complete, one window) and `resolve` into seconds, on the CPU clock."""
    from gpt2bench.trainer.breakdown import CommTimer, StepPhases, resolve
    from gpt2bench.trainer.devices import StepClock

    clock = StepClock(torch.device("cpu"))
    phases, comm = StepPhases(clock), CommTimer(clock)
    began = time.perf_counter()
    for _ in range(iterations):
        start = clock.mark()
        for name in ("data", "forward"):
            phases.mark(name)
        for _bucket in range(buckets):
            comm.complete(comm.launch("allreduce", 1 << 20, 2))
        comm.close_window()
        phases.mark("backward")
        phases.mark("optimizer")
        resolve(clock, start, clock.mark(), phases.take(), comm.take())
    return (time.perf_counter() - began) / iterations


def build(strategy: str, breakdown: bool, args, output: str):
    from gpt2bench.trainer.config import TrainConfig
    from gpt2bench.trainer.env import detect_env
    from gpt2bench.trainer.loop import Trainer
    from gpt2bench.trainer.parallel import strategy_class

    config = TrainConfig(
        strategy={"name": strategy}, model={"preset": args.model}, data={"max_documents": args.max_documents},
        training={"seq_len": args.seq_len, "micro_batch_size": args.micro_batch_size,
                  "steps": 3 + args.repeats * args.steps, "warmup_steps": 3},
        process={"device": args.device, "output": output, "log_every": args.log_every, "breakdown": breakdown},
    )
    parallel = strategy_class(strategy)(config, detect_env({}))
    parallel.setup()  # ddp: a one-process gloo group, created once and shared by both trainers
    return Trainer(config, parallel)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategy", default="single", choices=["single", "ddp"])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=4, help="alternated blocks of each setting")
    parser.add_argument("--log-every", type=int, default=8)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--max-documents", type=int, default=12)
    parser.add_argument("--buckets", type=int, default=25,
                        help="timed transfers per step in the direct measure (GPT-2 small at DDP's 25 MB buckets: ~20)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as on_dir, tempfile.TemporaryDirectory() as off_dir:
        trainers = {"on": build(args.strategy, True, args, on_dir), "off": build(args.strategy, False, args, off_dir)}
        for trainer in trainers.values():
            trainer.train(range(1, 4))  # warm-up
        device = trainers["on"].parallel.device
        blocks: dict[str, list[tuple[float, float]]] = {"on": [], "off": []}
        for repeat in range(args.repeats):
            steps = range(4 + repeat * args.steps, 4 + (repeat + 1) * args.steps)
            order = ["on", "off"] if repeat % 2 == 0 else ["off", "on"]
            for name in order:
                blocks[name].append(timed(lambda name=name: trainers[name].train(steps), device))
        for trainer in trainers.values():
            trainer.metrics.close()
        trainers["on"].parallel.teardown()

    clock = 0 if device.type == "cuda" else 1
    clock_name = "wall" if clock == 0 else "CPU"
    ratio = paired_ratio(blocks["on"], blocks["off"], clock)
    print(f"device {device} | strategy {args.strategy} | model {args.model} | batch {args.micro_batch_size}x"
          f"{args.seq_len} | {args.repeats} alternated blocks of {args.steps} steps | torch {torch.__version__} | "
          f"load average {os.getloadavg()[0]:.2f} | compared on {clock_name} time")
    print(f"| breakdown | {clock_name} s/step (median block) | wall s/step |\n|---|---|---|")
    for name in ("off", "on"):
        per_step = statistics.median(b[clock] for b in blocks[name]) / args.steps
        wall = statistics.median(b[0] for b in blocks[name]) / args.steps
        print(f"| {name} | {per_step:.4f} | {wall:.4f} |")
    shown = "n/a (needs 2 rounds)" if ratio is None else f"{ratio.estimate:.4f} [{ratio.low:.4f}, {ratio.high:.4f}]"
    print(f"whole loop: throughput on/off {shown} (95 % interval over {args.repeats} rounds): "
          f"claim >= {CLAIM}: {verdict(ratio)}")
    step = statistics.median(b[clock] for b in blocks["off"]) / args.steps
    direct = recorder_seconds_per_step(args.buckets)
    share = direct / step
    print(f"direct: the recorders' work for one step with {args.buckets} timed transfers: {direct * 1e6:.1f} us "
          f"= {share:.3%} of the {step * 1e3:.1f} ms step: claim <= {1 - CLAIM:.0%}: "
          f"{'met' if share <= 1 - CLAIM else 'missed'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
