"""`fsdp`: FSDP2 (`fully_shard`) on every GPT2Block, then on the root module.

Each rank holds 1/world_size of every parameter, gradient and optimizer state (DTensor shards).
Forward/backward all-gather a block's parameters just in time; `--reshard-after-forward` (default
on) frees them again after forward (ZeRO-3) instead of keeping them until backward (ZeRO-2-like).
Precision goes through `MixedPrecisionPolicy` (param_dtype fp16/bf16, gradients reduced in fp32),
not autocast. The grad norm is global: `clip_grad_norm_` over DTensors reduces the squared
shard norms across ranks (`full_tensor()` of the norm).
"""

from __future__ import annotations

import contextlib

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from gpt2bench.trainer.parallel.collective import CollectiveParallelism

_DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


class FSDPParallelism(CollectiveParallelism):
    name = "fsdp"

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        mesh = init_device_mesh(self.device.type, (self.world_size,))
        param_dtype = _DTYPES[self.config.precision]
        policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
        model = model.to(self.device)
        reshard = self.config.strategy.reshard_after_forward is not False  # on unless turned off
        options = {"mesh": mesh, "mp_policy": policy, "reshard_after_forward": reshard}
        for block in model.transformer.h:
            fully_shard(block, **options)
        fully_shard(model, **options)
        return model

    def autocast(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # MixedPrecisionPolicy casts parameters instead

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
