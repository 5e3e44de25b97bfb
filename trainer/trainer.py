"""The training loop: strategy-agnostic, every difference lives in the `Parallelism` hooks."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import torch
import torch.nn.functional as F

from gpt2bench.trainer.config import TrainConfig
from gpt2bench.trainer.data import ShardedBatches, load_tokens
from gpt2bench.trainer.exporter import PrometheusExporter
from gpt2bench.trainer.metrics import MetricsProcessor
from gpt2bench.trainer.model import (
    build_model,
    count_params,
    device_name,
    flops_per_token,
    peak_flops_per_device,
)
from gpt2bench.trainer.parallel.base import Parallelism

log = logging.getLogger("gpt2bench.trainer")


class TrainingFailed(RuntimeError):
    """Every worker stops at the same step (non-finite mean loss); the message is the summary's reason."""


class InjectedFailure(RuntimeError):
    """--fail-at-step: the first worker crashes alone, as a real crash would (its peers are left waiting)."""


class Trainer:
    def __init__(self, config: TrainConfig, parallel: Parallelism, *, exporter: PrometheusExporter | None = None):
        self.config, self.parallel = config, parallel
        p = parallel
        base_model = build_model(config)
        self.n_params = count_params(base_model)
        self.model_config = base_model.config
        self.model = p.wrap(base_model)
        self.optimizer = p.build_optimizer(self.model, config.training.lr)
        self.scaler = p.build_scaler()
        batch = config.training.micro_batch_size * p.devices_per_worker
        tokens = load_tokens(config.data.source, config.data.max_documents)
        self.batches = ShardedBatches(tokens, config.training.seq_len, batch, config.training.grad_accum, p.rank, p.world_size,
                                      config.training.seed)
        self.devices = p.world_size * p.devices_per_worker
        self.metrics = MetricsProcessor(
            config=config, rank=p.rank, tokens_per_step=batch * config.training.grad_accum * config.training.seq_len * p.world_size,
            devices=self.devices, device=p.device,
            flops_per_token=flops_per_token(self.model_config, config.training.seq_len, self.n_params),
            peak_flops=peak_flops_per_device(p.device, config.precision, config.process.peak_flops), exporter=exporter,
        )

    # ------------------------------------------------------------------ one step
    def train_step(self, step: int) -> tuple[torch.Tensor, torch.Tensor, float]:
        """One optimizer step (0-based `step`). Returns (this worker's mean loss, grad norm, data seconds)."""
        p, config = self.parallel, self.config
        loss_sum = torch.zeros((), device=p.device)
        data_seconds = 0.0
        for micro in range(config.training.grad_accum):
            started = time.perf_counter()
            block = self.batches.micro_batch(step, micro).to(p.device, non_blocking=True)
            data_seconds += time.perf_counter() - started
            with p.no_sync(self.model, last_micro_step=micro == config.training.grad_accum - 1), p.autocast():
                logits = self.model(input_ids=block[:, :-1], use_cache=False).logits
                loss = F.cross_entropy(logits.flatten(0, 1).float(), block[:, 1:].flatten())
                if step + 1 == config.process.nan_at_step and p.rank == 0:
                    loss = loss * float("nan")  # failure injection: one worker's loss goes bad
                self.scaler.scale(loss / config.training.grad_accum).backward()
            loss_sum += loss.detach()
        grad_norm = p.step(self.model, self.optimizer, self.scaler, config.training.max_grad_norm)
        return loss_sum / config.training.grad_accum, grad_norm, data_seconds

    # ------------------------------------------------------------------ the loop
    def train(self, first_step_at: list[float] | None = None) -> None:
        """Run every step; raise TrainingFailed on a non-finite loss, InjectedFailure for --fail-at-step."""
        p, config = self.parallel, self.config
        lr = self.optimizer.param_groups[0]["lr"]
        for step in range(1, config.training.steps + 1):
            if step == config.process.fail_at_step and p.rank == 0:  # the first worker (job rank 0 is a server under ps)
                raise InjectedFailure(f"failure injected at step {step} (--fail-at-step)")
            started = time.perf_counter()
            if first_step_at is not None and step == 1:
                first_step_at.append(time.time())
            loss, grad_norm, data_seconds = self.train_step(step - 1)
            loss = p.mean_over_workers(loss)  # every worker gets the same value, so all stop together
            record = self.metrics.record(step, loss, grad_norm, lr, started, data_seconds)
            if p.rank == 0 and (step == 1 or step % 10 == 0 or step == config.training.steps):
                log.info("step %d loss %.4f grad_norm %.3f %.0f tok/s", step, record["loss"], record["grad_norm"],
                         record["tokens_per_second"])
            if not math.isfinite(record["loss"]):
                raise TrainingFailed(f"non-finite loss ({record['loss']}) at step {step}")

    def run_steps(self, steps: int, *, with_metrics: bool) -> float:
        """Benchmark helper: `steps` steps from step 0, with or without the per-step metrics; seconds."""
        self.parallel.device.type == "cuda" and torch.cuda.synchronize()
        started = time.perf_counter()
        lr = self.optimizer.param_groups[0]["lr"]
        for step in range(steps):
            step_started = time.perf_counter()
            loss, grad_norm, data_seconds = self.train_step(step)
            if with_metrics:
                loss = self.parallel.mean_over_workers(loss)
                self.metrics.record(step + 1, loss, grad_norm, lr, step_started, data_seconds)
        self.parallel.device.type == "cuda" and torch.cuda.synchronize()
        return time.perf_counter() - started

    def payload(self, status: str, reason: str | None) -> dict[str, Any]:
        """What this worker sends to the reporter at the end (see Parallelism.gather_to_reporter)."""
        p = self.parallel
        return {
            "job_rank": p.env.rank,
            "worker_rank": p.rank,
            "is_worker": True,
            "status": status,
            "reason": reason,
            "peak_memory_bytes": self.metrics.peak_memory_bytes,
            "peak_memory_reserved_bytes": self.metrics.peak_memory_reserved_bytes,
            "state_bytes": p.state_bytes(self.model, self.optimizer),
            "param_checksum": p.model_checksum(self.model),
            "records": self.metrics.records if p.rank == 0 else None,
            "n_params": self.n_params,
            "flops_per_token": self.metrics.flops_per_token,
            "peak_flops": self.metrics.peak_flops,
            "mfu_above_one": self.metrics.mfu_above_one,
            "devices": self.devices,
            "device_type": p.device.type,
            "device_name": device_name(p.device),
        }
