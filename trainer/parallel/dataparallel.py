"""`dataparallel`: torch.nn.DataParallel over all GPUs of the node in one process.

Bai et al.'s "single parameter server": the process scatters each batch over the GPUs, replicates the
model every step and reduces gradients onto GPU 0. A worker here drives every GPU of the node, so the
loop feeds it `micro_batch_size × GPUs` sequences (micro_batch_size stays per device). Without GPUs
it trains exactly as `single` and says so in the summary's `note`.
"""

from __future__ import annotations

import torch

from gpt2bench.trainer.parallel.base import Parallelism


class DataParallelism(Parallelism):
    name = "dataparallel"

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

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        model = model.to(self.device)
        if self.devices_per_worker < 2:
            return model
        return torch.nn.DataParallel(model, device_ids=list(range(self.devices_per_worker)))

    def model_checksum(self, model: torch.nn.Module) -> float:
        return super().model_checksum(getattr(model, "module", model))
