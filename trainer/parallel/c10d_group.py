"""Shared base of the strategies whose every process is a worker in one c10d group (ddp, fsdp)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .base import Parallelism


class CollectiveParallelism(Parallelism):
    """All job processes train; worker rank = job rank; reductions are c10d collectives."""

    def __init__(self, config, env):
        super().__init__(config, env)
        self.rank, self.world_size = env.rank, env.world_size

    def setup(self) -> None:
        self.init_process_group()

    def collectives_backend(self):
        from ..collective_probe import c10d_backend

        return c10d_backend(self.device)

    def mean_over_workers(self, value: torch.Tensor) -> torch.Tensor:
        value = value.detach().to(self.device, torch.float32).clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        return value / self.world_size

    def gather_to_reporter(self, payload: dict[str, Any]) -> list[dict[str, Any]] | None:
        gathered: list[Any] | None = [None] * dist.get_world_size() if self.is_reporter else None
        dist.gather_object(payload, gathered, dst=0)
        return gathered
