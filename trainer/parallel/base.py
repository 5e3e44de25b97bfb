"""The interface every data-parallel strategy implements.

The training loop (`gpt2bench.trainer.loop.Trainer`) is strategy-agnostic: it only calls the
hooks below, in this order, so that a strategy is one class in one module and the loop has no
`if strategy == ...` branches.

    p = StrategyClass(config, env)          # no side effects yet
    p.setup()                               # process groups, device selection
    if p.is_worker:                         # trainer.Trainer:
        model = build_model(config)
        p.compile(model)                    #   torch.compile per block, when training.compile is on
        model = p.wrap(model)               #   DDP / FSDP / DataParallel / broadcast from rank 0 ...
        opt = p.build_optimizer(model, lr); scaler = p.build_scaler()
        p.instrument(model, opt, comm)      #   --breakdown: time the strategy's communication (breakdown.py)
        for step in 1..steps:
            for micro in range(grad_accum):
                with p.no_sync(model, last_micro_step=micro == grad_accum - 1), p.autocast():
                    loss = cross_entropy(model(x).logits, y)
                    scaler.scale(loss / grad_accum).backward()
            grad_norm, skipped = p.step(model, opt, scaler, max_grad_norm)  # sync, unscale, norm, clip, update
            every log_every steps, outside the timed steps:
                losses = p.mean_over_workers(pending local mean losses)    # collective over workers, tensors
                (stop on every worker at once if a loss is not finite)
        payload = {... per-process figures, p.state_bytes(model, opt), p.model_checksum(model) ...}
    else:
        payload = {... , **(p.serve(model_factory) or {})}     # e.g. parameter servers
    payloads = p.gather_to_reporter(payload)  # every process calls it; a list on job rank 0, else None
    if p.is_reporter: write summary.json, the termination message, the stdout summary line
    p.teardown()                              # always, also after a failure

Workers take their data shard from (`p.rank`, `p.world_size`) and build identical models from the
seed. Data loading, the loss, timing and metrics are the loop's; strategies never see them.

Vocabulary:
- *job rank*: the process's rank among ALL processes of the job (`env.rank`, servers included).
- *worker*: a process that trains (computes gradients). `rank`/`world_size` below count workers only;
  they select the data shard and scale tokens/s.
- *reporter*: the one process that writes `summary.json`, the termination message and the stdout
  summary line. It MUST be job rank 0, because the operator reads the master pod's termination
  message (PyTorchJob Master = job rank 0; for ps, job rank 0 is a server, so workers' figures must
  reach it through `gather_to_reporter`).

Implementing a strategy: subclass `Parallelism`, override what differs, and register the class in
`gpt2bench.trainer.parallel.STRATEGIES` (lazy import path). The defaults below are those of a single
process training alone (the `single` strategy is this class with no overrides).
"""

from __future__ import annotations

import contextlib
import datetime
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # only for annotations; avoids an import cycle
    from ..breakdown import CommTimer
    from ..collective_probe import Backend
    from ..config import TrainConfig
    from ..env import DistEnv


class Parallelism:
    """Base strategy: one process, one device. Subclasses override hooks.

    Attributes set by `__init__`/`setup()` that the loop reads:
      name: str                 strategy name as on the CLI (`ddp`, `ps-sharded`, ...)
      is_worker: bool           False on processes that do not train (parameter servers)
      rank: int                 this worker's index among workers (0..world_size-1); on non-workers
                                any value (not used for data)
      world_size: int           number of workers (servers excluded); sets data shards and tokens/s
      devices_per_worker: int   devices one worker drives (DataParallel: #GPUs; else 1). The summary's
                                per-device figures divide by world_size * devices_per_worker
      device: torch.device      where inputs are placed (`cuda:LOCAL_RANK`, `cpu`)
      is_reporter: bool         True on job rank 0 only (see module docstring)
      notes: list[str]          human-readable remarks copied to the summary's `note`
                                (e.g. "dataparallel without GPUs ran as single")
      extra_summary: dict       strategy-specific summary fields (e.g. {"ps_servers": 2})
      independent_steps: bool   True when a worker's step is its own update, not one of a global step
                                (async ps): no collective among workers, tokens/s is the sum of their rates
    """

    name = "single"
    # how `instrument` times this strategy's communication (the summary's `breakdown_method`; docs/metrics.md)
    breakdown_method = "no communication"
    # what its messages between nodes travel over where that is not NCCL's choice (the summary's `transport`)
    transport_between_nodes: str | None = None

    def __init__(self, config: TrainConfig, env: DistEnv):
        self.config = config
        self.env = env
        self.is_worker = True
        self.rank = 0
        self.world_size = 1
        self.devices_per_worker = 1
        self.independent_steps = False
        self.notes: list[str] = []
        self.extra_summary: dict[str, Any] = {}
        self.device = self._pick_device()

    # ----------------------------------------------------------------- lifecycle
    @property
    def is_reporter(self) -> bool:
        return self.env.rank == 0

    def setup(self) -> None:
        """Create process groups, pick the device. Called once before anything else.

        Distributed strategies call `self.init_process_group(backend)`, which honours
        `config.training.timeout_seconds` so that a crashed peer ends the job instead of hanging it.
        """

    def serve(self, model_factory: Callable[[], torch.nn.Module]) -> dict[str, Any] | None:
        """Non-workers only: serve until every worker has finished (or raise on failure).

        `model_factory()` builds the model (fp32, CPU) with the job's seed, identical on every process.
        May return a dict merged into this process's payload for `gather_to_reporter` (e.g.
        `{"state_bytes": ..., "peak_memory_bytes": ...}`; peak memory is filled in when absent).
        """
        raise NotImplementedError(f"{self.name} has no non-worker processes")

    def teardown(self) -> None:
        """Destroy process groups / shut down RPC. Must not raise on an already failed job."""
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            with contextlib.suppress(Exception):
                torch.distributed.destroy_process_group()

    # ------------------------------------------------------------------- model
    def compile(self, model: torch.nn.Module) -> bool:
        """torch.compile every transformer block in place (before `wrap`: FSDP shards compiled blocks, as
        torchtitan does). Lazy: compilation happens in the first (warm-up) step. True when compiled."""
        for block in model.transformer.h:
            block.compile()
        return True

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """Move the model to `self.device` and wrap it (DDP, FSDP, ...). Return what the loop calls."""
        return model.to(self.device)

    def instrument(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, comm: CommTimer) -> None:
        """--breakdown: hook `comm` (a `breakdown.CommTimer`) into this strategy's communication, after `wrap`
        and `build_optimizer`: record every collective's kind, bytes, launch and completion, and the intervals
        in which the step waits for it (exposed). No host sync inside a step. Default: nothing to time."""

    def collectives_backend(self) -> Backend | None:
        """The collectives probe's library on this strategy's group (`collectives.Backend`), after training;
        None where workers exchange no ring collectives (single, DataParallel, ps's point-to-point messages)."""
        return None

    @property
    def comm_measurable(self) -> bool:
        """False where communication runs inside forward/backward and cannot be timed apart (DataParallel)."""
        return True

    def first_worker_on_node(self) -> bool:
        """This worker reads the node's CPU package energy (RAPL): the node's first worker."""
        return self.env.local_rank == 0

    def build_optimizer(self, model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
        """AdamW over the wrapped model's parameters (Horovod wraps it in DistributedOptimizer): fused (one
        kernel for all parameters, and fp16 skips without a host sync) on CUDA, foreach on CPU."""
        return adamw(model.parameters(), lr, self.device)

    def no_sync(self, model: torch.nn.Module, last_micro_step: bool) -> contextlib.AbstractContextManager:
        """Context for one micro-step's forward+backward; DDP skips the all-reduce unless last."""
        return contextlib.nullcontext()

    def autocast(self) -> contextlib.AbstractContextManager:
        """The precision recipe, the same for every strategy (docs/strategies.md): fp32 master weights, and
        for fp16/bf16 autocast around forward and loss: matmuls in the low precision, norms, softmax and
        reductions in fp32. fp32: a null context."""
        dtype = low_precision(self.config.precision)
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def build_scaler(self) -> torch.amp.GradScaler:
        """Loss scaler: active for fp16 only (a no-op object otherwise, so the loop has no branch)."""
        return torch.amp.GradScaler(self.device.type, enabled=self.config.precision == "fp16")

    # -------------------------------------------------------------------- step
    def step(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler,
        max_grad_norm: float,
    ) -> tuple[torch.Tensor, torch.Tensor | bool]:
        """After the micro-steps' backward: make gradients global, update; return (grad norm, skipped).

        Order: (1) synchronise gradients if the strategy does it explicitly (DDP/FSDP already did
        during backward); (2) `scaler.unscale_(optimizer)`; (3) global L2 norm of all gradients
        AFTER sync and BEFORE clipping (across shards for FSDP, on the server(s) for PS);
        (4) clip to `max_grad_norm` when > 0; (5) `scaler.step(optimizer)`; `scaler.update()`;
        (6) `optimizer.zero_grad(set_to_none=True)`.
        Returns the norm as a 0-d float tensor on any device and `skipped` (the fp16 scaler skipped the
        update) as a 0-d bool tensor or a bool; do not call `.item()` here (the loop reads them later).
        A non-finite norm is returned as-is (the scaler skips the update for fp16; the loop decides).
        """
        scaler.unscale_(optimizer)
        norm = self.clip_grad_norm(model, max_grad_norm)
        scaler.step(optimizer)
        skipped = update_scaler(scaler)
        optimizer.zero_grad(set_to_none=True)
        return norm, skipped

    def clip_grad_norm(self, model: torch.nn.Module, max_grad_norm: float) -> torch.Tensor:
        """Global L2 grad norm of local (already synchronised) grads; clip when max_grad_norm > 0."""
        params = [p for p in model.parameters() if p.grad is not None]
        limit = max_grad_norm if max_grad_norm > 0 else math.inf
        return torch.nn.utils.clip_grad_norm_(params, limit, foreach=True)

    # -------------------------------------------------------------- reductions
    def mean_over_workers(self, value: torch.Tensor) -> torch.Tensor:
        """Element-wise mean over workers of a tensor (the pending steps' losses), called at log steps only.
        Collective over workers (none for independent workers); returns a tensor."""
        return value

    def gather_to_reporter(self, payload: dict[str, Any]) -> list[dict[str, Any]] | None:
        """Collect one JSON-able dict per job process on the reporter (job rank 0).

        Called once at the end by EVERY process (workers and servers). Returns the list (ordered by
        job rank) on the reporter, None elsewhere. Workers' payloads hold their step records.
        """
        return [payload]

    def model_checksum(self, model: torch.nn.Module) -> float:
        """Sum of |param| over the FULL model as this process sees it (replica-equality tests).

        For sharded strategies return the checksum of the full model (every process gets the same)
        or of the local shard; say which in `extra_summary['checksum_scope']`.
        """
        with torch.no_grad():
            return float(sum(p.detach().float().abs().sum().item() for p in model.parameters()))

    def state_bytes(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
        """Bytes of parameters + gradients + optimizer state resident in THIS process (local shards)."""
        return state_bytes(model, optimizer)

    # ------------------------------------------------------------------ helpers
    def _pick_device(self) -> torch.device:
        if not self._wants_cuda():
            return torch.device("cpu")
        return torch.device("cuda", self._local_device_index(self.env.local_rank, self.env.local_world_size))

    def _wants_cuda(self) -> bool:
        want = self.config.process.device
        if want == "cpu" or (want == "auto" and not torch.cuda.is_available()):
            return False
        if not torch.cuda.is_available() and torch.version.cuda is None:
            # the CPU image started for a GPU run (e.g. an MPI runtime's sshd pods on the CPU image)
            raise RuntimeError(f"--device cuda: torch {torch.__version__} in this image is a CPU-only build: a GPU run "
                               "needs the CUDA trainer image (spec.images.gpu; for Horovod TrainJobs the "
                               "gpt2bench-mpi-cuda runtime's image, the chart's trainerImage)")
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda: no CUDA device is visible to this process (the pod got no "
                               "nvidia.com/gpu, or the node's driver is older than the image's CUDA)")
        return True

    def _local_device_index(self, local_worker: int, workers_on_node: int) -> int:
        """One GPU per worker: more workers on a node than GPUs would share GPUs and halve per-device figures."""
        gpus = torch.cuda.device_count()
        if workers_on_node > gpus:
            raise RuntimeError(
                f"scale {self.env.nodes}x{workers_on_node} (nodes x workers per node): {workers_on_node} workers "
                f"on this node but {gpus} GPU(s) visible; one worker per GPU (processesPerNode = devicesPerNode)")
        return local_worker

    def backend(self) -> str:
        return "nccl" if self.device.type == "cuda" else "gloo"

    def init_process_group(self, backend: str | None = None, **kwargs: Any) -> None:
        """`init_process_group` from the env (env://) with the job's timeout; sets cuda device."""
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        if not torch.distributed.is_initialized():
            torch.distributed.init_process_group(
                backend=backend or self.backend(),
                rank=self.env.rank,
                world_size=self.env.world_size,
                init_method=self.env.init_method,
                timeout=datetime.timedelta(seconds=self.config.training.timeout_seconds),
                **kwargs,
            )


def low_precision(precision: str) -> torch.dtype | None:
    return {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)


def adamw(params, lr: float, device: torch.device) -> torch.optim.AdamW:
    """The one AdamW of every strategy (no weight decay): fused on CUDA, foreach elsewhere."""
    fused = device.type == "cuda"
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.0, fused=fused, foreach=not fused)


def update_scaler(scaler: torch.amp.GradScaler) -> torch.Tensor | bool:
    """`scaler.update()`; returns whether this step was skipped, as a device tensor read later (no sync).

    The scale backs off exactly when the step found an inf/NaN and was skipped (it only ever grows otherwise).
    """
    if not scaler.is_enabled() or scaler._scale is None:
        scaler.update()
        return False
    before = scaler._scale.clone()  # a device tensor: compared on the device, read at the next log step
    scaler.update()
    return scaler._scale < before


def distinct_tensors(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) of every parameter and buffer, each tensor once: `state_dict()` lists GPT-2's tied
    embedding twice (wte and lm_head), which would broadcast its 39 M parameters twice."""
    seen: set[int] = set()
    tensors = []
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            tensors.append((name, tensor))
    return tensors


def _tensor_bytes(t: Any) -> int:
    if isinstance(t, torch.Tensor):
        local = t.to_local() if hasattr(t, "to_local") else t
        return local.numel() * local.element_size()
    return 0


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of params + grads + optimizer state held locally (DTensor shards count locally).

    Gradients are counted as one tensor the size of each trainable parameter: they are freed
    (`set_to_none`) between steps but exist at every step's peak.
    """
    total = 0
    for p in {id(p): p for p in model.parameters()}.values():
        total += _tensor_bytes(p) * (2 if p.requires_grad else 1)
    for state in optimizer.state.values():
        total += sum(_tensor_bytes(v) for v in state.values())
    return total
