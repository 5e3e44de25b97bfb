"""How much does the trainer cost over a bare loop, and what do its metrics cost?

In one process and one run, over the same model and batch size:
  A. a bare hand-written loop (forward, cross-entropy, backward, clip, AdamW step; nanoGPT style);
  B. the trainer's step loop with metrics OFF (`Trainer.run_steps(with_metrics=False)`);
  C. the trainer's step loop with metrics ON (per-step record: device sync, one .item(), steps.jsonl
     line, Prometheus update, loss mean over workers) - what `gpt2bench train` runs.
Blocks of A, B, C are interleaved `--repeats` times in rotating order and the fastest block of each
is kept, so that other load on the machine hurts all three alike. Targets: A/C throughput ratio >= 0.97 (trainer vs
bare), (C - B) / B <= 1 % (metrics cost).

    python benchmarks/bench_trainer.py [--model tiny] [--steps 20] [--repeats 5] [--device auto]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time

import torch
import torch.nn.functional as F


def bare_loop(model, optimizer, batch, steps: int, precision: str, max_grad_norm: float) -> None:
    """The reference: nothing but the maths of a training step."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    autocast = torch.autocast(batch.device.type, dtype=dtype) if dtype else contextlib.nullcontext()
    scaler = torch.amp.GradScaler(batch.device.type, enabled=precision == "fp16")
    sync = torch.cuda.synchronize if batch.device.type == "cuda" else (lambda: None)
    sync()
    for _ in range(steps):
        with autocast:
            logits = model(input_ids=batch[:, :-1], use_cache=False).logits
            loss = F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm, foreach=True)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    sync()


def timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of fn()."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - wall, time.process_time() - cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=6, help="interleaved blocks of each loop")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--max-documents", type=int, default=40)
    args = parser.parse_args(argv)

    from gpt2bench.trainer.config import TrainConfig
    from gpt2bench.trainer.env import detect_env
    from gpt2bench.trainer.exporter import PrometheusExporter
    from gpt2bench.trainer.parallel import strategy_class
    from gpt2bench.trainer.trainer import Trainer

    with tempfile.TemporaryDirectory() as output:
        port = _free_port()
        config = TrainConfig(
            precision=args.precision,
            model={"preset": args.model},
            data={"max_documents": args.max_documents},
            training={"seq_len": args.seq_len, "micro_batch_size": args.micro_batch_size, "steps": args.steps + 1,
                      "warmup_steps": 1},
            process={"device": args.device, "output": output, "metrics_port": port},
        )
        parallel = strategy_class("single")(config, detect_env({}))
        parallel.setup()
        exporter = PrometheusExporter(config, rank=0, strategy="single", local_rank=0, workers=1)
        trainer = Trainer(config, parallel, exporter=exporter)
        batch = trainer.batches.micro_batch(0, 0).to(parallel.device)
        # warm-up: allocator, autotuning, first-touch of the optimizer state
        bare_loop(trainer.model, trainer.optimizer, batch, 3, args.precision, config.training.max_grad_norm)
        trainer.run_steps(3, with_metrics=True)
        loops = {
            "bare": lambda: bare_loop(trainer.model, trainer.optimizer, batch, args.steps, args.precision,
                                      config.training.max_grad_norm),
            "off": lambda: trainer.run_steps(args.steps, with_metrics=False),
            "on": lambda: trainer.run_steps(args.steps, with_metrics=True),
        }
        best = {name: [float("inf"), float("inf")] for name in loops}
        names = list(loops)
        for repeat in range(args.repeats):
            # rotate the order every repeat: whichever loop runs first after another tends to be slower
            for name in names[repeat % 3:] + names[: repeat % 3]:
                best[name] = [min(old, new) for old, new in zip(best[name], timed(loops[name]))]
        # the metrics' own work, timed alone (immune to load noise): what `record` adds to a step
        loss, norm = torch.tensor(3.0, device=parallel.device), torch.tensor(1.0, device=parallel.device)
        calls = 2000
        started = time.perf_counter()
        for i in range(calls):
            trainer.metrics.record(i + 1, parallel.mean_over_workers(loss), norm, 1e-3, time.perf_counter(), 0.0)
        record_seconds = (time.perf_counter() - started) / calls
        trainer.metrics.close()
        exporter.close()

    # On a CPU shared with other jobs wall time is noisy; with one thread, CPU time is the work done.
    clock = 0 if parallel.device.type == "cuda" else 1
    clock_name = "wall" if clock == 0 else "CPU"
    per_step = {k: v[clock] / args.steps for k, v in best.items()}
    wall = {k: v[0] / args.steps for k, v in best.items()}
    ratio = per_step["bare"] / per_step["on"]
    cost = (per_step["on"] - per_step["off"]) / per_step["off"]
    tokens = args.micro_batch_size * args.seq_len
    print(f"device {parallel.device} | model {args.model} ({trainer.n_params / 1e6:.2f} M params) | "
          f"precision {args.precision} | batch {args.micro_batch_size}x{args.seq_len} | "
          f"best of {args.repeats} interleaved blocks of {args.steps} steps | torch {torch.__version__} | "
          f"threads {torch.get_num_threads()} | compared on {clock_name} time")
    print(f"| loop | {clock_name} s/step | tokens/s | wall s/step | vs bare |\n|---|---|---|---|---|")
    for name, label in (("bare", "bare hand-written loop"), ("off", "trainer, metrics off"),
                        ("on", "trainer, metrics on (gpt2bench train)")):
        print(f"| {label} | {per_step[name]:.4f} | {tokens / per_step[name]:.0f} | {wall[name]:.4f} | "
              f"{per_step['bare'] / per_step[name]:.3f}x |")
    verdict = lambda ok: "ok" if ok else "MISSED"
    print(f"trainer/bare throughput: {ratio:.3f}x (target >= 0.97: {verdict(ratio >= 0.97)})")
    print(f"metrics cost, on vs off loops: {cost * 100:+.2f}% (target <= 1%: {verdict(cost <= 0.01)})")
    direct = record_seconds / wall["bare"]
    print(f"metrics cost, measured directly: {record_seconds * 1e6:.0f} us per step = {direct * 100:.3f}% of a "
          f"bare step (target <= 1%: {verdict(direct <= 0.01)})")
    return 0


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
