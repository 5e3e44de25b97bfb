"""Faults a test injects into the training loop (--fail-at-step, --nan-at-step, --hang-at-step,
--slow-worker-seconds): one object the loop consults at a step's start, at each loss and at its end, and only when
some hook is set; a normal run has none (`injected` returns None) and its loop does nothing extra.
"""

from __future__ import annotations

import logging
import time

import torch

from .config import ProcessOptions

log = logging.getLogger("gpt2bench.trainer")


class InjectedFailure(RuntimeError):
    """--fail-at-step: the first worker crashes alone, as a real crash would (its peers are left waiting)."""


class InjectedFaults:
    """The hooks set for this worker (`rank` of `world_size`): each fires on the worker a real fault would hit."""

    def __init__(self, process: ProcessOptions, rank: int, world_size: int):
        self.process, self.first, self.last = process, rank == 0, rank == world_size - 1

    def before_step(self, step: int) -> None:
        """1-based `step`: the first worker crashes, or hangs alive (its peers wait in their collectives)."""
        if step == self.process.fail_at_step and self.first:  # the first worker (job rank 0 is a server under ps)
            raise InjectedFailure(f"failure injected at step {step} (--fail-at-step)")
        if step == self.process.hang_at_step and self.first:
            log.warning("hanging at step %d (--hang-at-step)", step)
            while True:
                time.sleep(3600)

    def loss(self, loss: torch.Tensor, step: int) -> torch.Tensor:
        """1-based `step`: the first worker's loss goes bad (NaN)."""
        return loss * float("nan") if step == self.process.nan_at_step and self.first else loss

    def after_step(self) -> None:
        """The last worker is slower, every step."""
        if self.process.slow_worker_seconds and self.last:
            time.sleep(self.process.slow_worker_seconds)


def injected(process: ProcessOptions, rank: int, world_size: int) -> InjectedFaults | None:
    """The worker's injected faults, or None when no hook is set."""
    hooks = (process.fail_at_step, process.nan_at_step, process.hang_at_step, process.slow_worker_seconds)
    return InjectedFaults(process, rank, world_size) if any(hook is not None for hook in hooks) else None
