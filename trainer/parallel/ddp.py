"""`ddp`: DistributedDataParallel, one process per device (Bai et al.'s "distributed parameter server").

Gradients are all-reduced in buckets during backward (`--bucket-cap-mb`); with `--grad-accum` the
micro-steps before the last run under `no_sync()`, so the all-reduce happens once per optimizer step.
gloo on CPU, nccl on GPU.

Breakdown (`instrument`): a communication hook that runs torch's own all-reduce hook per bucket and records its
launch (when the bucket is ready, on the compute stream) and its completion (in the future's callback, which
on CUDA runs on a stream that waits for the all-reduce); the reducer waits for every bucket at the end of
backward, so the exposed time is last launch -> last completion (docs/metrics.md, Step breakdown).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from ..breakdown import CommTimer
from .c10d_group import CollectiveParallelism


class DDPParallelism(CollectiveParallelism):
    name = "ddp"
    breakdown_method = "ddp communication hook: per-bucket all-reduce launch/completion; exposed = last launch to " \
                       "last completion"

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

    def instrument(self, model, optimizer, comm: CommTimer) -> None:
        model.register_comm_hook(TimedAllReduce(comm, dist.group.WORLD, self.world_size,
                                                self.config.process.comm_delay_seconds), timed_allreduce_hook)

    def no_sync(self, model: torch.nn.Module, last_micro_step: bool) -> contextlib.AbstractContextManager:
        if last_micro_step or not self.accumulate_locally:
            return contextlib.nullcontext()
        return model.no_sync()

    def model_checksum(self, model: torch.nn.Module) -> float:
        return super().model_checksum(model.module)


@dataclass
class TimedAllReduce:
    """State of `timed_allreduce_hook`: where to record, over which group; `delay` is the test hook that makes
    the last bucket's all-reduce complete later (--comm-delay-seconds)."""

    comm: CommTimer
    group: Any
    ranks: int
    delay: float | None = None


def timed_allreduce_hook(state, bucket):  # no annotations: DDP checks them as objects, this module has strings
    """torch's `allreduce_hook` (divide by the world size, all-reduce), timed. `state`: a TimedAllReduce;
    `bucket`: a dist.GradBucket; returns a Future of the reduced bucket."""
    buffer = bucket.buffer()
    last = bucket.is_last()
    transfer = state.comm.launch("allreduce", buffer.numel() * buffer.element_size(), state.ranks)
    if last:
        state.comm.close_window()  # the reducer waits for this window's buckets at the end of backward
    delay = state.delay if last else None
    # The callback runs on gloo's worker thread and must not hold `state` (which holds the process group): if its
    # reference were the group's last, the group would be destroyed on its own worker thread, which then joins
    # itself and aborts the process ("Resource deadlock avoided").
    comm = state.comm

    def done(future: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        if delay:
            time.sleep(delay)  # test hook: a slower network, seen only by this all-reduce's completion
        comm.complete(transfer)
        return future.value()

    return allreduce_hook(state.group, bucket).then(done)
