"""Does the trainer's loop cost anything over a bare loop, and what do its metrics cost?

In one process and one run, over the same model, batch size and precision:
  A. a bare hand-written loop (forward, cross-entropy, backward, clip, AdamW step; nanoGPT style) over
     batches prepared beforehand, with torch's `F.cross_entropy` on fp32 logits (what such a loop writes);
  A'. the same bare loop with the trainer's chunked cross-entropy (`trainer/loss.py`): B against A' is the
     loop's own cost, B against A also counts the faster loss;
  B. the trainer's real loop, `Trainer.train(steps)` - what `gpt2bench train` runs: data loading with
     prefetch, the strategy hooks, the per-step marks, and a log-step flush (read-back, steps.jsonl line,
     Prometheus update) every `--log-every` steps.
Blocks of A, A' and B alternate `--repeats` times in rotating order. A ratio is the median over the rounds of
the ratio within a round (blocks run back to back), so that drift of the machine's speed during the run (on a
shared VM, steps of one loop vary by +-20 % over a minute) hurts both sides alike; the table shows each
loop's median block. On CPU both are compared on process CPU time (one thread: the work done), and wall time
is shown too. Target: B/A throughput >= 0.97. The metrics' own work (a step's
marks and memory peaks, and a flush) is also timed alone over many calls.

    OMP_NUM_THREADS=1 python benchmarks/bench_trainer.py [--model tiny] [--steps 10] [--repeats 6]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

from gpt2bench.local.replicas import free_port


def plain_cross_entropy(logits, targets, vocab_size: int):
    return F.cross_entropy(logits[..., :vocab_size].flatten(0, 1).float(), targets.flatten())


def bare_loop(model, optimizer, batches, precision: str, max_grad_norm: float, vocab_size: int,
              loss_fn=plain_cross_entropy) -> None:
    """The reference: nothing but the maths of a training step."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    device = batches[0].device
    autocast = torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    for batch in batches:
        with autocast:
            logits = model(input_ids=batch[:, :-1], use_cache=False).logits
            loss = loss_fn(logits, batch[:, 1:], vocab_size)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm, foreach=True)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)


def timed(fn, device: torch.device) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of fn(), the device's queued work included."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    sync()
    return time.perf_counter() - wall, time.process_time() - cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=6, help="alternated blocks of each loop")
    parser.add_argument("--log-every", type=int, default=10, help="the trainer's --log-every")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--max-documents", type=int, default=40)
    args = parser.parse_args(argv)

    from gpt2bench.trainer.config import TrainConfig
    from gpt2bench.trainer.env import detect_env
    from gpt2bench.trainer.exporter import PrometheusExporter
    from gpt2bench.trainer.loop import Trainer
    from gpt2bench.trainer.loss import cross_entropy
    from gpt2bench.trainer.parallel import strategy_class

    warm, total = 3, 3 + args.repeats * args.steps
    with tempfile.TemporaryDirectory() as output:
        config = TrainConfig(
            precision=args.precision,
            model={"preset": args.model},
            data={"max_documents": args.max_documents},
            training={"seq_len": args.seq_len, "micro_batch_size": args.micro_batch_size, "steps": total,
                      "warmup_steps": warm},
            process={"device": args.device, "output": output, "metrics_port": free_port(),
                     "log_every": args.log_every},
        )
        parallel = strategy_class("single")(config, detect_env({}))
        parallel.setup()
        exporter = PrometheusExporter(config, rank=0, strategy="single", local_rank=0, workers=1)
        trainer = Trainer(config, parallel, exporter=exporter)
        device = parallel.device
        shards = trainer.batches.batches
        batches = [shards.micro_batch(i, 0).to(device) for i in range(args.steps)]
        def bare(loss_fn=plain_cross_entropy):
            bare_loop(trainer.model, trainer.optimizer, batches, args.precision, config.training.max_grad_norm,
                      trainer.vocab_size, loss_fn)

        bare()  # warm-up: allocator, first-touch of the optimizer state
        trainer.train(range(1, warm + 1))
        next_step = warm + 1
        blocks: dict[str, list[tuple[float, float]]] = {name: [] for name in ("bare", "bare-chunked", "trainer")}
        for repeat in range(args.repeats):
            block = range(next_step, next_step + args.steps)
            next_step += args.steps
            loops = [("bare", bare), ("bare-chunked", lambda: bare(cross_entropy)),
                     ("trainer", lambda block=block: trainer.train(block))]
            for name, fn in loops[repeat % 3:] + loops[:repeat % 3]:  # rotate which runs first
                blocks[name].append(timed(fn, device))
        per_call = _metrics_cost(trainer)
        trainer.metrics.close()
        exporter.close()

    clock = 0 if device.type == "cuda" else 1  # one CPU thread: CPU time is the work, unmoved by other load
    clock_name = "wall" if clock == 0 else "CPU"
    per_step = {k: statistics.median(b[clock] for b in v) / args.steps for k, v in blocks.items()}
    wall = {k: statistics.median(b[0] for b in v) / args.steps for k, v in blocks.items()}
    tokens = args.micro_batch_size * args.seq_len

    def ratio_to(reference: str, loop: str) -> float:
        return round_ratio(blocks[reference], blocks[loop], clock)

    ratio, loop_ratio = ratio_to("bare", "trainer"), ratio_to("bare-chunked", "trainer")
    print(f"device {device} | model {args.model} ({trainer.n_params / 1e6:.2f} M params) | precision "
          f"{args.precision} | batch {args.micro_batch_size}x{args.seq_len} | median of {args.repeats} alternated "
          f"blocks of {args.steps} steps | log every {args.log_every} | torch {torch.__version__} | threads "
          f"{torch.get_num_threads()} | load average {os.getloadavg()[0]:.2f} | compared on {clock_name} time")
    print(f"| loop | {clock_name} s/step | tokens/s | wall s/step | vs bare (median of rounds) |\n"
          "|---|---|---|---|---|")
    for name, label in (("bare", "bare hand-written loop (F.cross_entropy)"),
                        ("bare-chunked", "bare loop, the trainer's chunked loss"),
                        ("trainer", "trainer's loop (gpt2bench train)")):
        print(f"| {label} | {per_step[name]:.4f} | {tokens / per_step[name]:.0f} | {wall[name]:.4f} | "
              f"{ratio_to('bare', name):.3f}x |")
    verdict = lambda ok: "ok" if ok else "MISSED"  # noqa: E731
    print(f"trainer/bare throughput: {ratio:.3f}x (target >= 0.97: {verdict(ratio >= 0.97)})")
    print(f"trainer/bare with the same loss (the loop's own cost): {loop_ratio:.3f}x "
          f"(target >= 0.97: {verdict(loop_ratio >= 0.97)})")
    share = per_call / wall["bare"]
    print(f"metrics' own work, timed alone: {per_call * 1e6:.0f} us per step = {share * 100:.3f}% of a bare step "
          f"(target <= 1%: {verdict(share <= 0.01)})")
    return 0


def round_ratio(reference: list[tuple[float, ...]], loop: list[tuple[float, ...]], clock: int) -> float:
    """Throughput of a loop over a reference from their blocks' times (block i of each timed in round i,
    `clock` picks wall or CPU seconds): the median over the rounds of reference seconds / loop seconds."""
    return statistics.median(r[clock] / l[clock] for r, l in zip(reference, loop, strict=True))


def _metrics_cost(trainer, calls: int = 2000) -> float:
    """Seconds per step of the metrics' own work: marks, memory peaks, and a flush every log_every steps."""
    metrics, p = trainer.metrics, trainer.parallel
    loss, norm = torch.tensor(3.0, device=p.device), torch.tensor(1.0, device=p.device)
    every = trainer.config.process.log_every
    started = time.perf_counter()
    for i in range(calls):
        start = metrics.start_step()
        metrics.end_step(10_000 + i, start, loss, norm, False, 1e-3, 0.0)
        if (i + 1) % every == 0:
            metrics.flush(p.mean_over_workers)
    metrics.flush(p.mean_over_workers)
    return (time.perf_counter() - started) / calls


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
