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
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from gpt2bench.trainer.parallel.collective import CollectiveParallelism


class FSDPParallelism(CollectiveParallelism):
    name = "fsdp"

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
