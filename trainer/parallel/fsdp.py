"""`fsdp`: FSDP2 (`fully_shard`) on every GPT2Block, then on the root module.

Each rank holds 1/world_size of every parameter, gradient and optimizer state (DTensor shards).
Forward/backward all-gather a block's parameters just in time; `--reshard-after-forward` (default
on) frees them again after forward (ZeRO-3) instead of keeping them until backward (ZeRO-2-like).

Precision: the recipe every strategy runs (docs/strategies.md). The sharded parameters are the fp32
master weights and are gathered in fp32 (`MixedPrecisionPolicy` with no `param_dtype`); the loop's
autocast runs the matmuls in bf16/fp16 and norms, softmax and reductions in fp32, exactly as for ddp or
single; gradients are reduce-scattered in fp32. (A `param_dtype=bf16` policy would instead run the whole
model, LayerNorm and residual stream included, in bf16: another recipe, not a strategy difference.)

Gradient accumulation: micro-steps before the last run with `set_requires_gradient_sync(False)`
(FSDP2's `no_sync`), so gradients accumulate unsharded and are reduce-scattered once per optimizer step,
as ddp all-reduces once. The grad norm is global: `clip_grad_norm_` over DTensors reduces the squared
shard norms across ranks (`full_tensor()` of the norm).

Breakdown (`instrument`): FSDP2's own all-gather and reduce-scatter, subclassed through its custom-comm API
(`set_custom_all_gather` / `set_custom_reduce_scatter`) to record each collective's bytes, launch and
completion. Exposed: on CPU (gloo) the collectives block the process, so their whole interval is exposed; on
GPU they run on FSDP's communication streams and the compute stream waits for them in `wait_for_unshard`
(all-gathers) and in the root's post-backward callback (reduce-scatters): those two are timed with events
on the compute stream (docs/metrics.md, Step breakdown).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

from ..breakdown import CommTimer
from .c10d_group import CollectiveParallelism


class FSDPParallelism(CollectiveParallelism):
    name = "fsdp"
    breakdown_method = ("fsdp2 custom all-gather/reduce-scatter: launch/completion; exposed = blocking collectives "
                        "(CPU) or the compute stream's waits for them (GPU)")

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        mesh = init_device_mesh(self.device.type, (self.world_size,))
        policy = MixedPrecisionPolicy(param_dtype=None, reduce_dtype=torch.float32)  # fp32 masters, autocast
        model = model.to(self.device)
        reshard = self.config.strategy.reshard_after_forward is not False  # on unless turned off
        options = {"mesh": mesh, "mp_policy": policy, "reshard_after_forward": reshard}
        for block in model.transformer.h:
            fully_shard(block, **options)
        fully_shard(model, **options)
        return model

    def instrument(self, model, optimizer, comm: CommTimer) -> None:
        blocking = self.device.type != "cuda"  # gloo: a collective call returns when it is done
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_custom_all_gather(TimedAllGather(comm, blocking))
                module.set_custom_reduce_scatter(TimedReduceScatter(comm, blocking))
                if not blocking:
                    for group in module._get_fsdp_state()._fsdp_param_groups:
                        group.wait_for_unshard = _waiting(comm, group.wait_for_unshard)
        if not blocking:
            root = model._get_fsdp_state()
            root._root_post_backward_final_callback = _waiting(comm, root._root_post_backward_final_callback)

    def no_sync(self, model: torch.nn.Module, last_micro_step: bool) -> contextlib.AbstractContextManager:
        return _gradient_sync(model, enabled=last_micro_step)

    def clip_grad_norm(self, model: torch.nn.Module, max_grad_norm: float) -> torch.Tensor:
        norm = super().clip_grad_norm(model, max_grad_norm)
        # over DTensor grads the norm is itself a DTensor (partial); full_tensor() reduces it over ranks
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def build_scaler(self) -> torch.amp.GradScaler:
        # shards see different gradients: an inf on one rank must skip the step on all of them
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(self.device.type, enabled=self.config.precision == "fp16")

    def model_checksum(self, model: torch.nn.Module) -> float:
        """Checksum of the FULL model (all-gathered); collective, same value on every rank."""
        with torch.no_grad():
            total = sum(p.detach().full_tensor().float().abs().sum() for p in model.parameters())
        return float(total)


@contextlib.contextmanager
def _gradient_sync(model, enabled: bool) -> Iterator[None]:
    """FSDP2's no_sync: without sync, backward accumulates unsharded gradients and reduce-scatters nothing."""
    if enabled:
        yield
        return
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


class TimedAllGather(DefaultAllGather):
    """FSDP2's default all-gather, recorded in `comm`: bytes = the gathered (full) tensor, as nccl-tests."""

    def __init__(self, comm: CommTimer, blocking: bool):
        self.comm, self.blocking = comm, blocking

    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        nbytes = output_tensor.numel() * output_tensor.element_size()
        return _timed(self.comm, "allgather", nbytes, group.size(), self.blocking, async_op,
                      lambda: super(TimedAllGather, self).__call__(output_tensor, input_tensor, group, async_op))


class TimedReduceScatter(DefaultReduceScatter):
    """FSDP2's default reduce-scatter, recorded in `comm`: bytes = the full (unsharded) input, as nccl-tests."""

    def __init__(self, comm: CommTimer, blocking: bool):
        self.comm, self.blocking = comm, blocking

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        nbytes = input_tensor.numel() * input_tensor.element_size()
        return _timed(self.comm, "reduce_scatter", nbytes, group.size(), self.blocking, async_op,
                      lambda: super(TimedReduceScatter, self).__call__(output_tensor, input_tensor, group, op,
                                                                       async_op))


def _timed(comm: CommTimer, kind: str, nbytes: int, ranks: int, blocking: bool, async_op: bool, call: Callable):
    """Run one collective between a launch and a completion mark. GPU: both marks are events on the current
    stream, FSDP's communication stream, where the collective runs, so the second completes with it. CPU: a
    blocking call is done when it returns, and the process waited for all of it (exposed); an asynchronous one
    completes when its future does."""
    transfer = comm.launch(kind, nbytes, ranks)
    work = call()
    if blocking and async_op and work is not None:
        work.get_future().then(lambda _: comm.complete(transfer))
        return work
    comm.complete(transfer)
    if blocking:
        comm.expose(transfer)
    return work


def _waiting(comm: CommTimer, method: Callable) -> Callable:
    """`method`, its call timed as a wait for communication (compute-stream events on GPU)."""

    @functools.wraps(method)
    def timed(*args, **kwargs):
        with comm.waiting():
            return method(*args, **kwargs)

    return timed
