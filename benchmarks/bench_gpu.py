"""Is the trainer's loop as fast as a hand-tuned one on a GPU, and do ddp and fsdp on one GPU cost anything?

In one process and one run, over the same model (GPT-2 on the trainer's fast path: SDPA attention, one-kernel
GELU, vocabulary padded to 50,304), batch and precision:
  hand-tuned  the project's own minimal loop: the whole model and the loss in one `torch.compile`, fused
              AdamW, autocast, batches already on the GPU, no host sync until the block ends (nanoGPT's
              bench.py recipe on this model);
  single      the trainer's real loop (`Trainer.train(steps)`, what `gpt2bench train --strategy single` runs);
  ddp, fsdp   the same loop under DistributedDataParallel and FSDP2 on a one-process group (one GPU: nothing
              to synchronise, so any difference is the wrapper's own cost).
Blocks of `--steps` steps alternate `--repeats` times in rotating order after a warm-up that covers
compilation; each loop's fastest block is kept. Targets (H100, GPT-2 124M, bf16, 16 x 1024): single >= 40 %
MFU (>= 460,000 tokens/s) and >= the hand-tuned loop; ddp and fsdp >= 0.95x single.

    python benchmarks/bench_gpu.py [--model gpt2] [--precision bf16] [--micro-batch-size 16] [--seq-len 1024]
    python benchmarks/bench_gpu.py --device cpu --model tiny --seq-len 64 --micro-batch-size 4   # the same code on CPU
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import tempfile
import time

import torch
import torch.nn.functional as F


class HandTuned:
    """The reference loop: no strategy, no metrics, everything known to be fast."""

    def __init__(self, config, device: torch.device, batches: list[torch.Tensor]):
        from gpt2bench.trainer.devices import allow_tf32
        from gpt2bench.trainer.model import build_model, vocab_sizes

        allow_tf32(device, config.training.tf32)
        model = build_model(config).to(device)
        vocab, _ = vocab_sizes(model)
        self.model, self.batches = model, batches
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(config.precision)
        self.autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype else contextlib.nullcontext
        fused = device.type == "cuda"
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=config.training.lr, weight_decay=0.0, fused=fused,
                                           foreach=not fused)
        self.scaler = torch.amp.GradScaler(device.type, enabled=config.precision == "fp16")
        self.max_grad_norm = config.training.max_grad_norm

        def loss_of(batch):
            logits = model(input_ids=batch[:, :-1], use_cache=False).logits
            return F.cross_entropy(logits[..., :vocab].flatten(0, 1).float(), batch[:, 1:].flatten())

        self.loss_of = torch.compile(loss_of) if config.training.compile else loss_of

    def train(self, steps: range) -> None:
        for step in steps:
            batch = self.batches[step % len(self.batches)]
            with self.autocast():
                loss = self.loss_of(batch)
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm, foreach=True)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--micro-batch-size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=5, help="alternated blocks of each loop")
    parser.add_argument("--warmup", type=int, default=5, help="steps of each loop before timing (compilation)")
    parser.add_argument("--loops", default="hand-tuned,single,ddp,fsdp")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="torch.compile (default: the trainer's default, on for GPUs)")
    parser.add_argument("--tf32", action="store_true")
    parser.add_argument("--max-documents", type=int, default=None)
    args = parser.parse_args(argv)

    from gpt2bench.trainer.config import TrainConfig
    from gpt2bench.trainer.devices import device_name, peak_flops_per_device
    from gpt2bench.trainer.env import DistEnv
    from gpt2bench.trainer.loop import Trainer, compile_enabled
    from gpt2bench.trainer.parallel import strategy_class

    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    names = args.loops.split(",")
    total = args.warmup + args.repeats * args.steps
    env = DistEnv("torchrun", 0, 1, 0, 1, "127.0.0.1", str(_free_port()))  # a one-process group for ddp/fsdp
    with tempfile.TemporaryDirectory() as output:
        def config_for(strategy: str) -> TrainConfig:
            return TrainConfig(
                strategy={"name": strategy}, precision=args.precision, model={"preset": args.model},
                data={"max_documents": args.max_documents},
                training={"seq_len": args.seq_len, "micro_batch_size": args.micro_batch_size, "steps": total,
                          "warmup_steps": args.warmup, "compile": args.compile, "tf32": args.tf32},
                process={"device": device.type, "output": os.path.join(output, strategy), "log_every": args.steps},
            )

        loops: dict[str, object] = {}
        trainers: dict[str, Trainer] = {}
        for name in names:
            if name == "hand-tuned":
                continue
            parallel = strategy_class(name)(config_for(name), env)
            parallel.setup()
            trainers[name] = loops[name] = Trainer(config_for(name), parallel)
        reference = next(iter(trainers.values()))
        if "hand-tuned" in names:
            config = config_for("single")
            config = config.model_copy(update={"training": config.training.model_copy(
                update={"compile": compile_enabled(config, device)})})
            shards = reference.batches.batches
            batches = [shards.micro_batch(i, 0).to(device) for i in range(8)]
            loops["hand-tuned"] = HandTuned(config, device, batches)
        for loop in loops.values():  # warm-up: compilation, allocator, optimizer state
            loop.train(range(1, args.warmup + 1))
        best: dict[str, float] = {name: float("inf") for name in loops}
        peaks: dict[str, int] = {}
        order = list(loops)
        next_step = args.warmup + 1
        for repeat in range(args.repeats):
            block = range(next_step, next_step + args.steps)
            next_step += args.steps
            for name in order[repeat % len(order):] + order[:repeat % len(order)]:
                seconds, peak = _timed(lambda name=name, block=block: loops[name].train(block), device)
                best[name] = min(best[name], seconds)
                peaks[name] = max(peaks.get(name, 0), peak)
        for trainer in trainers.values():
            trainer.metrics.close()
        compiled = reference.compiled
        flops = reference.metrics.flops_per_token
        peak = peak_flops_per_device(device, args.precision, args.tf32, None)
        n_params = reference.n_params
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()

    tokens = args.micro_batch_size * args.seq_len * args.steps
    rate = {name: tokens / seconds for name, seconds in best.items()}
    print(f"device {device_name(device)} | model {args.model} ({n_params / 1e6:.2f} M params) | precision "
          f"{args.precision}{' (tf32)' if args.tf32 else ''} | batch {args.micro_batch_size}x{args.seq_len} | "
          f"compile {'on' if compiled else 'off'} | best of {args.repeats} alternated blocks of {args.steps} steps "
          f"after {args.warmup} warm-up | torch {torch.__version__} | load average {os.getloadavg()[0]:.2f}")
    print("| loop | tokens/s | MFU | peak memory (GiB) | vs hand-tuned | vs single |\n|---|---|---|---|---|---|")
    for name in loops:
        mfu = f"{flops * rate[name] / peak * 100:.1f} %" if peak else "n/a"
        memory = f"{peaks[name] / 2**30:.2f}" if device.type == "cuda" else "n/a"
        versus = lambda other: f"{rate[name] / rate[other]:.3f}x" if other in rate else "-"  # noqa: E731
        print(f"| {name} | {rate[name]:,.0f} | {mfu} | {memory} | {versus('hand-tuned')} | {versus('single')} |")
    verdict = lambda ok: "ok" if ok else "MISSED"  # noqa: E731
    if "single" in rate and peak:
        mfu = flops * rate["single"] / peak
        print(f"single MFU: {mfu * 100:.1f} % (target >= 40 % on an H100, bf16, GPT-2 124M, 16x1024: "
              f"{verdict(mfu >= 0.40)})")
    if "single" in rate and "hand-tuned" in rate:
        ratio = rate["single"] / rate["hand-tuned"]
        print(f"single / hand-tuned: {ratio:.3f}x (target >= 0.97: {verdict(ratio >= 0.97)})")
    for name in ("ddp", "fsdp"):
        if name in rate and "single" in rate:
            ratio = rate[name] / rate["single"]
            print(f"{name} on one device / single: {ratio:.3f}x (target >= 0.95: {verdict(ratio >= 0.95)})")
    return 0


def _timed(fn, device: torch.device) -> tuple[float, int]:
    """(wall seconds, peak CUDA memory allocated) of fn(), the device's queued work included."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started, torch.cuda.max_memory_allocated() if device.type == "cuda" else 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
