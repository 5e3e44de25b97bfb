"""The training loop: strategy-agnostic, every difference lives in the `Parallelism` hooks.

One step: for each micro-step, take the prefetched batch, forward + loss under the precision recipe's
autocast, backward, and prefetch the next batch while the device computes; then the strategy's `step`
(synchronise gradients, unscale, norm, clip, update). Between two marks on the device's timeline
(`MetricsProcessor.start_step` / `end_step`) nothing waits for the device: losses and norms stay tensors
until a log step, where `flush` reads every pending step at once, outside the timed steps. With
`--breakdown` the loop also marks where each phase ends (`phases.mark`), and the strategy's `instrument` hooks
time its communication (docs/metrics.md, Step breakdown).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import torch

from .config import TrainConfig
from .data import BatchLoader, ShardedBatches, load_tokens
from .devices import allow_tf32, device_name, math_precision, peak_flops_per_device
from .energy import energy_meter
from .exporter import PrometheusExporter
from .faults import injected
from .loss import cross_entropy
from .metrics import CompileWatch, MetricsProcessor
from .model import build_model, count_params, flops_per_token, vocab_sizes
from .parallel.base import Parallelism

log = logging.getLogger("gpt2bench.trainer")


class TrainingFailed(RuntimeError):
    """Every worker stops at the same step (non-finite mean loss); the message is the summary's reason."""


def compile_enabled(config: TrainConfig, device: torch.device) -> bool:
    """`training.compile`, or by default: on for GPUs, off on CPU (docs/performance.md says why)."""
    choice = config.training.compile
    return device.type == "cuda" if choice is None else choice


class Trainer:
    def __init__(self, config: TrainConfig, parallel: Parallelism, *, exporter: PrometheusExporter | None = None):
        self.config, self.parallel = config, parallel
        p, training = parallel, config.training
        self.compile_watch = CompileWatch()
        self.faults = injected(config.process, parallel.rank, parallel.world_size)  # tests only: None in a real run
        allow_tf32(p.device, training.tf32)
        base_model = build_model(config)
        self.n_params = count_params(base_model)
        self.model_config = base_model.config
        self.vocab_size, self.padded_vocab_size = vocab_sizes(base_model)
        self.compiled = compile_enabled(config, p.device) and p.compile(base_model)
        self.model = p.wrap(base_model)
        self.loss_fn = torch.compile(cross_entropy) if self.compiled else cross_entropy
        self.optimizer = p.build_optimizer(self.model, training.lr)
        self.scaler = p.build_scaler()
        batch = training.micro_batch_size * p.devices_per_worker
        tokens = load_tokens(config.data.source, config.data.max_documents)
        shards = ShardedBatches(tokens, training.seq_len, batch, training.grad_accum, p.rank, p.world_size,
                                training.seed)
        self.batches = BatchLoader(shards, p.device)
        self.devices = p.world_size * p.devices_per_worker
        workers_per_step = 1 if p.independent_steps else p.world_size
        self.metrics = MetricsProcessor(
            config=config, rank=p.rank, tokens_per_step=batch * training.grad_accum * training.seq_len * workers_per_step,
            devices=self.devices if workers_per_step > 1 else p.devices_per_worker, device=p.device,
            flops_per_token=flops_per_token(self.model_config, training.seq_len, self.n_params),
            peak_flops=peak_flops_per_device(p.device, config.precision, training.tf32, config.process.peak_flops),
            exporter=exporter, compile_watch=self.compile_watch,
            energy=energy_meter(p.device, p.devices_per_worker, reads_node=p.first_worker_on_node()),
            measure_comm=p.comm_measurable, keep_end_times=p.independent_steps,
        )
        if config.process.breakdown:
            p.instrument(self.model, self.optimizer, self.metrics.comm)

    # ------------------------------------------------------------------ one step
    def train_step(self, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | bool]:
        """One optimizer step (0-based `step`): (this worker's mean loss, grad norm, skipped), all unread."""
        p, accum, phases = self.parallel, self.config.training.grad_accum, self.metrics.phases
        loss_sum = None
        for micro in range(accum):
            block = self.batches.get(step, micro)
            phases.mark("data")
            with p.no_sync(self.model, last_micro_step=micro == accum - 1), p.autocast():
                logits = self.model(input_ids=block[:, :-1], use_cache=False).logits
                loss = self.loss_fn(logits, block[:, 1:], self.vocab_size)
                if self.faults:
                    loss = self.faults.loss(loss, step + 1)
                phases.mark("forward")
                self.scaler.scale(loss / accum).backward()
            phases.mark("backward")
            loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
            self.batches.prefetch_after(step, micro)  # host work while the device runs the backward
            phases.mark("data")
        grad_norm, skipped = p.step(self.model, self.optimizer, self.scaler, self.config.training.max_grad_norm)
        phases.mark("optimizer")
        if self.faults:
            self.faults.after_step()
        return loss_sum / accum, grad_norm, skipped

    # ------------------------------------------------------------------ the loop
    def train(self, steps: range | None = None, first_step_at: list[float] | None = None) -> None:
        """Run `steps` (1-based; default all): raise TrainingFailed on a non-finite loss, read at log steps."""
        p, config = self.parallel, self.config
        steps = steps or range(1, config.training.steps + 1)
        lr = self.optimizer.param_groups[0]["lr"]
        for step in steps:
            if self.faults:
                self.faults.before_step(step)
            if first_step_at is not None and not first_step_at:
                first_step_at.append(time.time())
            self.batches.seconds = 0.0
            start = self.metrics.start_step()
            loss, grad_norm, skipped = self.train_step(step - 1)
            self.metrics.end_step(step, start, loss, grad_norm, skipped, lr, self.batches.seconds)
            # also at the end of warm-up: the energy counter is read at flushes, so warm-up's joules stay apart
            if step % config.process.log_every == 0 or step == steps[-1] or step == config.training.warmup_steps:
                self.report(self.metrics.flush(p.mean_over_workers))

    def report(self, records: list[dict[str, Any]]) -> None:
        """Log the last record; fail every worker alike on the first non-finite loss among them."""
        if not records:
            return
        last = records[-1]
        if self.parallel.rank == 0:
            log.info("step %d loss %.4f grad_norm %.3f %.0f tok/s", last["step"], last["loss"], last["grad_norm"],
                     last["tokens_per_second"])
        bad = next((r for r in records if not math.isfinite(r["loss"])), None)
        if bad is not None:
            seen = f" (read at step {last['step']})" if last["step"] != bad["step"] else ""
            raise TrainingFailed(f"non-finite loss ({bad['loss']}) at step {bad['step']}{seen}")

    def payload(self, status: str, reason: str | None) -> dict[str, Any]:
        """What this worker sends to the reporter at the end (see Parallelism.gather_to_reporter)."""
        p, metrics = self.parallel, self.metrics
        return {
            "job_rank": p.env.rank,
            "worker_rank": p.rank,
            "is_worker": True,
            "role": "worker",
            "status": status,
            "reason": reason,
            **metrics.memory_payload(),
            "state_bytes": p.state_bytes(self.model, self.optimizer),
            "param_checksum": p.model_checksum(self.model),
            **metrics.finish(self.devices),  # worker 0's figures, breakdown and curves; every worker's own rate
            "step_end_times": metrics.step_end_times,  # async ps only
            "n_params": self.n_params,
            "padded_vocab_size": self.padded_vocab_size,
            "flops_per_token": metrics.flops_per_token,
            "peak_flops": metrics.peak_flops,
            "peak_flops_precision": math_precision(self.config.precision, self.config.training.tf32),
            "mfu_above_one": metrics.mfu_above_one,
            "compiled": self.compiled,
            "compile_seconds": self.compile_watch.seconds,
            "devices": self.devices,
            "device_type": p.device.type,
            "device_name": device_name(p.device),
            **metrics.energy_payload(),
        }
