"""`dataparallel`: torch.nn.DataParallel over all GPUs of the node in one process.

Bai et al.'s "single parameter server": the process scatters each batch over the GPUs, replicates the
model every step and reduces gradients onto GPU 0. A worker here drives every GPU of the node, so the
loop feeds it `micro_batch_size × GPUs` sequences (micro_batch_size stays per device). Without GPUs
it trains exactly as `single` and says so in the summary's `note`.

Precision: DataParallel runs each replica's forward in a worker thread and re-enters autocast there as
`autocast(device_type, enabled=...)` with no dtype, i.e. float16 on CUDA, whatever the caller's dtype: a
bf16 run would train in fp16 without a loss scaler. The replicated module therefore sets the run's
autocast itself (`AutocastForward`), so every replica runs the recipe the other strategies run.

torch.compile: DataParallel copies the module into every replica each step, and a compiled module's call
is bound to the original module, so with 2+ GPUs the blocks are not compiled (the summary says so).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from .base import Parallelism


class AutocastForward(torch.nn.Module):
    """Runs `module` under the given autocast in whatever thread calls it (DataParallel's replica threads)."""

    def __init__(self, module: torch.nn.Module, autocast: Callable[[], contextlib.AbstractContextManager]):
        super().__init__()
        self.module = module
        self._autocast = autocast

    def forward(self, *args, **kwargs):
        with self._autocast():
            return self.module(*args, **kwargs)


class DataParallelism(Parallelism):
    name = "dataparallel"
    breakdown_method = ("dataparallel: scatter, replication and gather run inside forward and the gradient "
                        "reduction inside backward, on GPUs: not timed apart (null with 2+ GPUs)")

    @property
    def comm_measurable(self) -> bool:
        return self.devices_per_worker < 2

    def __init__(self, config, env):
        super().__init__(config, env)
        if env.world_size != 1:
            raise RuntimeError(f"dataparallel runs as one process per node; the launcher started {env.world_size}")
        gpus = torch.cuda.device_count() if self.device.type == "cuda" else 0
        if gpus >= 1:
            self.device = torch.device("cuda", 0)
            self.devices_per_worker = gpus
        if gpus < 2:
            self.notes.append(f"dataparallel with {gpus} GPU(s) trained as single (nothing to split over)")
        self.extra_summary["dataparallel_devices"] = gpus

    def compile(self, model: torch.nn.Module) -> bool:
        if self.devices_per_worker < 2:
            return super().compile(model)
        self.notes.append("torch.compile not applied: nn.DataParallel replicates the module every step, and a "
                          "compiled module's call stays bound to the original (no DataParallel support in torch)")
        return False

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        model = model.to(self.device)
        if self.devices_per_worker < 2:
            return model
        return torch.nn.DataParallel(AutocastForward(model, self.autocast),
                                     device_ids=list(range(self.devices_per_worker)))

    def model_checksum(self, model: torch.nn.Module) -> float:
        while hasattr(model, "module"):  # DataParallel(AutocastForward(model))
            model = model.module
        return super().model_checksum(model)
