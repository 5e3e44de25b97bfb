"""What does the step breakdown (`--breakdown`, on by default) cost? The trainer's real loop with it on and off.

In one process: two `Trainer`s over the same configuration, one with `--breakdown`, one with `--no-breakdown`
(for `ddp`, both wrapped over the same one-process gloo group, so the timed all-reduce hook runs against the
reducer's built-in all-reduce). Blocks of `--steps` steps of each alternate `--repeats` times, the first of
each round rotating; the ratio is the median over rounds of (off seconds / on seconds) within the round, so
drift of a shared machine hurts both alike. On CPU it compares process CPU time (one thread: the work done),
on GPU wall time after a synchronize. Claim: on/off throughput >= 0.99 (<= 1 % overhead). Short by default:

    OMP_NUM_THREADS=1 python benchmarks/bench_breakdown_overhead.py [--strategy ddp] [--steps 8] [--repeats 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

import torch
from bench_trainer import timed  # benchmarks/ is the script's folder, first on sys.path


def round_ratio(on: list[tuple[float, float]], off: list[tuple[float, float]], clock: int) -> float:
    """Throughput with the breakdown over without: median over rounds of off seconds / on seconds."""
    return statistics.median(o[clock] / n[clock] for n, o in zip(on, off, strict=True))


def build(strategy: str, breakdown: bool, args, output: str):
    from gpt2bench.trainer.config import TrainConfig
    from gpt2bench.trainer.env import detect_env
    from gpt2bench.trainer.parallel import strategy_class
    from gpt2bench.trainer.trainer import Trainer

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
    ratio = round_ratio(blocks["on"], blocks["off"], clock)
    print(f"device {device} | strategy {args.strategy} | model {args.model} | batch {args.micro_batch_size}x"
          f"{args.seq_len} | {args.repeats} alternated blocks of {args.steps} steps | torch {torch.__version__} | "
          f"load average {os.getloadavg()[0]:.2f} | compared on {clock_name} time")
    print(f"| breakdown | {clock_name} s/step (median block) | wall s/step |\n|---|---|---|")
    for name in ("off", "on"):
        per_step = statistics.median(b[clock] for b in blocks[name]) / args.steps
        wall = statistics.median(b[0] for b in blocks[name]) / args.steps
        print(f"| {name} | {per_step:.4f} | {wall:.4f} |")
    verdict = "ok" if ratio >= 0.99 else "MISSED"
    print(f"throughput on/off: {ratio:.4f}x, overhead {(1 - ratio) * 100:+.2f}% (claim <= 1%: {verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
