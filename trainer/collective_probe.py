"""What the network gives: time one collective kind at one message size, nccl-tests' way, on the group a run
trained with. Two users:

- the trainer's *collectives probe*: after the last step, every worker of a ddp, fsdp or horovod run times each
  collective kind the strategy used, at the strategy's own mean message size, on the same pods, process group
  and devices (summary `probe_bus_bandwidth`, next to the achieved `comm_bus_bandwidth`);
- `benchmarks/bench_collectives.py`: the same timing swept over sizes, as a standalone job.

Columns as nccl-tests: bytes = the all-reduce buffer, or the full gathered / scattered tensor; seconds = the
slowest rank's mean over `iters` calls after `warmup` untimed ones (a barrier before the timed calls, a device
synchronize after them: the probe runs outside the measured steps); algbw = bytes / seconds; busbw = algbw ×
bus factor (`breakdown.bus_factor`: 2(n-1)/n for all-reduce, (n-1)/n for all-gather and reduce-scatter).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .breakdown import bus_factor
from .devices import device_sync

PROBED = ("allreduce", "allgather", "reduce_scatter")  # push / pull / broadcast: not ring collectives
PROBE_WARMUP, PROBE_ITERS = 2, 5


@dataclass(frozen=True)
class Timing:
    kind: str
    bytes: int
    ranks: int
    seconds: float  # the slowest rank's mean per call

    @property
    def algbw(self) -> float:
        return self.bytes / self.seconds if self.seconds > 0 else float("inf")

    @property
    def busbw(self) -> float:
        return self.algbw * bus_factor(self.kind, self.ranks)


@dataclass
class Backend:
    """How one communication library runs the probe: `call(kind, numel)` builds a callable running one
    collective of `numel` float32 elements (the full buffer) and `agree_max` returns the element-wise maximum
    of a list of floats over the ranks (a collective itself)."""

    ranks: int
    call: Callable[[str, int], Callable[[], object]]
    agree_max: Callable[[list[float]], list[float]]
    barrier: Callable[[], object]
    sync: Callable[[], object] = lambda: None


def elements(nbytes: int, ranks: int) -> int:
    """float32 elements of a `nbytes` buffer, rounded down to a multiple of the ranks (the sharded kinds
    split it evenly), at least one per rank."""
    return max(ranks, nbytes // 4 // ranks * ranks)


def time_collective(backend: Backend, kind: str, nbytes: int, *, warmup: int = PROBE_WARMUP,
                    iters: int = PROBE_ITERS) -> Timing:
    if kind not in PROBED:
        raise ValueError(f"cannot probe {kind!r}: one of {', '.join(PROBED)}")
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    numel = elements(nbytes, backend.ranks)
    run = backend.call(kind, numel)
    for _ in range(warmup):
        run()
    backend.sync()
    backend.barrier()
    started = time.perf_counter()
    for _ in range(iters):
        run()
    backend.sync()
    (slowest,) = backend.agree_max([(time.perf_counter() - started) / iters])
    return Timing(kind, numel * 4, backend.ranks, slowest)


def probe(backend: Backend, message_bytes: dict[str, int], *, warmup: int = PROBE_WARMUP,
          iters: int = PROBE_ITERS) -> list[Timing]:
    """Time each probed kind at its message size. Every rank must call this with the same kinds; sizes are
    agreed first (the largest any rank saw), so that all ranks run the same collectives in the same order."""
    if backend.ranks < 2:
        return []
    agreed = backend.agree_max([float(message_bytes.get(kind, 0)) for kind in PROBED])
    return [time_collective(backend, kind, int(size), warmup=warmup, iters=iters)
            for kind, size in zip(PROBED, agreed) if size > 0]


def summary_fields(timings: Sequence[Timing]) -> dict[str, dict[str, float] | None]:
    """The summary's `probe_bus_bandwidth` and `probe_message_bytes`, per kind (None when nothing was probed)."""
    if not timings:
        return {"probe_bus_bandwidth": None, "probe_message_bytes": None}
    return {"probe_bus_bandwidth": {t.kind: t.busbw for t in timings},
            "probe_message_bytes": {t.kind: t.bytes for t in timings}}


# --------------------------------------------------------------------------- backends


def c10d_backend(device: torch.device) -> Backend:
    """torch.distributed's default group (gloo on CPU tensors, NCCL on the rank's GPU)."""
    import torch.distributed as dist

    ranks = dist.get_world_size()
    # torch 2.13 renamed the tensor forms (*_single); the GPU image's 2.11 has only the old names
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def call(kind: str, numel: int) -> Callable[[], object]:
        full = torch.ones(numel, device=device)
        shard = torch.ones(numel // ranks, device=device)
        if kind == "allreduce":
            return lambda: dist.all_reduce(full)
        if kind == "allgather":
            return lambda: all_gather(full, shard)
        return lambda: reduce_scatter(shard, full)

    def agree_max(values: list[float]) -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor.tolist()

    return Backend(ranks, call, agree_max, dist.barrier, functools.partial(device_sync, device))


def horovod_backend(device: torch.device) -> Backend:
    """Horovod's collectives, synchronous (the calls return when the result is ready)."""
    import horovod.torch as hvd

    ranks = hvd.size()

    def call(kind: str, numel: int) -> Callable[[], object]:
        full = torch.ones(numel, device=device)
        shard = torch.ones(numel // ranks, device=device)
        name = f"gpt2bench.probe.{kind}.{numel}"
        if kind == "allreduce":
            return lambda: hvd.allreduce(full, op=hvd.Sum, name=name)
        if kind == "allgather":
            return lambda: hvd.allgather(shard, name=name)
        return lambda: hvd.reducescatter(full, op=hvd.Sum, name=name)

    def agree_max(values: list[float]) -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64)
        return hvd.allreduce(tensor, op=hvd.Max, name=f"gpt2bench.probe.max.{len(values)}").tolist()

    return Backend(ranks, call, agree_max, hvd.barrier, functools.partial(device_sync, device))
