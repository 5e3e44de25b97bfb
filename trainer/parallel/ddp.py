"""`ddp`: DistributedDataParallel, one process per device (Bai et al.'s "distributed parameter server").

Gradients are all-reduced in buckets during backward (`--bucket-cap-mb`); with `--grad-accum` the
micro-steps before the last run under `no_sync()`, so the all-reduce happens once per optimizer step.
gloo on CPU, nccl on GPU.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from gpt2bench.trainer.parallel.collective import CollectiveParallelism


class DDPParallelism(CollectiveParallelism):
    name = "ddp"

    def __init__(self, config, env):
        super().__init__(config, env)
        # torch's reducer breaks on no_sync() under static_graph (first backward asserts; later steps
        # silently skip the all-reduce: pytorch#143580, #187732), so such runs sync every micro-step.
        self.accumulate_locally = not (bool(config.strategy.static_graph) and config.training.grad_accum > 1)
        if not self.accumulate_locally:
            self.notes.append("static_graph with grad_accum: no_sync() off (pytorch#143580), "
                              "gradients all-reduced every micro-step")

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        options: dict[str, Any] = {
            "static_graph": bool(self.config.strategy.static_graph),
            "gradient_as_bucket_view": bool(self.config.strategy.gradient_as_bucket_view),
        }
        if self.config.strategy.bucket_cap_mb is not None:
            options["bucket_cap_mb"] = self.config.strategy.bucket_cap_mb
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        # DDP broadcasts rank 0's parameters at construction, so replicas start identical.
        return DistributedDataParallel(model.to(self.device), device_ids=device_ids, **options)

    def no_sync(self, model: torch.nn.Module, last_micro_step: bool) -> contextlib.AbstractContextManager:
        if last_micro_step or not self.accumulate_locally:
            return contextlib.nullcontext()
        return model.no_sync()

    def model_checksum(self, model: torch.nn.Module) -> float:
        return super().model_checksum(model.module)
