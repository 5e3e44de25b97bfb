"""`horovod`: Horovod's DistributedOptimizer (ring all-reduce of gradients, Bai et al.'s third strategy).

Launched by `horovodrun --gloo -np N -H host:N gpt2bench train ...` or, as an MPIJob launcher does,
`mpirun -np N ... gpt2bench train ...`. The recipe of Horovod's docs:
- `hvd.init()`; one process per device (`hvd.local_rank()` picks the GPU);
- `hvd.DistributedOptimizer(AdamW, named_parameters=...)`: backward hooks all-reduce (average) each
  gradient as it is ready; `backward_passes_per_step=--grad-accum` accumulates locally first;
- `broadcast_parameters` (each tensor once: the tied embedding is one tensor) and `broadcast_optimizer_state`
  from rank 0, so every replica starts alike;
- step: `optimizer.synchronize()` (wait for the all-reduces), `scaler.unscale_`, clip, then
  `scaler.step(optimizer)` inside `optimizer.skip_synchronize()` (Horovod's AMP recipe), so the grad
  norm is that of the averaged gradient and fp16 overflow is seen (and skipped) on every rank alike.

Breakdown (`instrument`): the optimizer's `_allreduce_grad_async` (called by its backward hooks) is wrapped to
record each gradient's all-reduce launch and bytes; `synchronize()` is the wait on the handles, so its interval
is the exposed communication. Horovod's handles have no completion callback: a handle already done when
`synchronize()` starts (`hvd.poll`) completes there, the others when it returns, so the total is an upper
bound (docs/metrics.md, Step breakdown).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

try:
    import horovod.torch as hvd
except ImportError as exc:  # the registry imports this module only for --strategy horovod
    raise ImportError(
        f"--strategy horovod needs Horovod built against this torch (scripts/install.sh builds it): {exc}"
    ) from exc

from ..breakdown import CommTimer
from ..summary import publish_summary
from .base import Parallelism, distinct_tensors, update_scaler

log = logging.getLogger("gpt2bench.trainer")


class HorovodParallelism(Parallelism):
    name = "horovod"
    breakdown_method = ("horovod: per-gradient all-reduce launch from the backward hooks; exposed = "
                        "optimizer.synchronize(); completion at synchronize (upper bound)")
    comm: CommTimer | None = None

    def setup(self) -> None:
        # MPI_Init (inside hvd.init) waits for every rank with no timeout of its own: a rank that never joins (an
        # Open MPI transport probing a device it cannot use, a worker's sshd gone) would hold the GPUs until
        # activeDeadlineSeconds. The watchdog bounds it as it bounds Horovod's other waits.
        self.watchdog = Watchdog(self.config.training.timeout_seconds, self._give_up)
        with self.watchdog.waiting("MPI_Init (hvd.init)"):
            hvd.init()
        self.rank, self.world_size = hvd.rank(), hvd.size()
        if (self.rank, self.world_size) != (self.env.rank, self.env.world_size):
            raise RuntimeError(
                f"Horovod sees rank {self.rank} of {self.world_size} but the {self.env.launcher} environment "
                f"says {self.env.rank} of {self.env.world_size}: launch with horovodrun or mpirun"
            )
        if self.device.type == "cuda":
            self.device = torch.device("cuda", hvd.local_rank())
            torch.cuda.set_device(self.device)

    def collectives_backend(self):
        from ..collective_probe import horovod_backend

        backend = horovod_backend(self.device)
        bound = self.watchdog.bounded  # the probe's collectives wait for every rank too
        return dataclasses.replace(
            backend, call=lambda kind, numel: bound(f"the probe's {kind}", backend.call(kind, numel)),
            agree_max=bound("the probe's agreement", backend.agree_max),
            barrier=bound("the probe's barrier", backend.barrier))

    def _give_up(self, reason: str) -> None:
        """The watchdog's last act on this rank: say why where the launcher and the operator look."""
        log.error("%s", reason)
        if self.is_reporter:
            publish_summary({"status": "failed", "reason": reason, "strategy": self.name,
                             "precision": self.config.precision}, self.config.process.output)

    def teardown(self) -> None:
        if hvd.is_initialized():
            hvd.shutdown()

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        model = model.to(self.device)
        tensors = distinct_tensors(model)
        with self.watchdog.waiting("the broadcast of the parameters"):
            hvd.broadcast_parameters(tensors, root_rank=0)
        self.extra_summary["horovod_broadcast_tensors"] = len(tensors)
        return model

    def build_optimizer(self, model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
        optimizer = hvd.DistributedOptimizer(
            super().build_optimizer(model, lr),
            named_parameters=model.named_parameters(),
            backward_passes_per_step=self.config.training.grad_accum,
            op=hvd.Average,
        )
        with self.watchdog.waiting("the broadcast of the optimizer state"):
            hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        # Broadcasting an empty AdamW state makes Horovod take one zero-gradient step to create it:
        # the parameters do not move, but AdamW's step counter would read 1 and change the bias
        # correction of every later step. Reset it, so runs compare step by step with ddp/single.
        for state in optimizer.state.values():
            if torch.is_tensor(state.get("step")):
                state["step"].zero_()
            elif "step" in state:
                state["step"] = 0
        optimizer.zero_grad()  # DistributedOptimizer.zero_grad() takes no set_to_none
        return optimizer

    def instrument(self, model, optimizer, comm: CommTimer) -> None:
        self.comm, self._in_flight = comm, {}
        launch = optimizer._allreduce_grad_async

        def timed_launch(p):
            grad = p.grad if p.grad is not None else p  # Horovod all-reduces zeros shaped like p when None
            transfer = comm.launch("allreduce", grad.numel() * grad.element_size(), self.world_size)
            handle, ctx = launch(p)
            self._in_flight[handle] = transfer
            return handle, ctx

        optimizer._allreduce_grad_async = timed_launch

    def _synchronize(self, optimizer) -> None:
        """`optimizer.synchronize()`, timed as the step's wait for its all-reduces when instrumented."""
        if self.comm is None:
            with self.watchdog.waiting("the all-reduce of the gradients"):
                optimizer.synchronize()
            return
        in_flight, self._in_flight = self._in_flight, {}
        with self.comm.waiting():
            for handle in [h for h in in_flight if _polled(h)]:
                self.comm.complete(in_flight.pop(handle))  # done before the wait began
            with self.watchdog.waiting("the all-reduce of the gradients"):
                optimizer.synchronize()
        for transfer in in_flight.values():
            self.comm.complete(transfer)

    def step(self, model, optimizer, scaler, max_grad_norm: float):
        self._synchronize(optimizer)  # the gradients are now averaged over every rank
        scaler.unscale_(optimizer)
        norm = self.clip_grad_norm(model, max_grad_norm)
        with optimizer.skip_synchronize():
            scaler.step(optimizer)
        skipped = update_scaler(scaler)
        optimizer.zero_grad()
        return norm, skipped

    def mean_over_workers(self, value: torch.Tensor) -> torch.Tensor:
        with self.watchdog.waiting("the all-reduce of the loss"):
            return hvd.allreduce(value.detach().float(), op=hvd.Average, name="gpt2bench.loss")

    def gather_to_reporter(self, payload: dict[str, Any]) -> list[dict[str, Any]] | None:
        with self.watchdog.waiting("the gathering of the ranks' results"):
            gathered = hvd.allgather_object(payload, name="gpt2bench.payloads")
        return gathered if self.is_reporter else None


class Watchdog:
    """Horovod's waits take no timeout: `--timeout-seconds` bounds them here, as it bounds the other strategies'
    process groups. A wait that lasts longer means a rank stopped making progress (or died without its peers
    noticing): this rank says so and exits 1, and the launcher (horovodrun, mpirun) then ends the others.

    Horovod's own stall inspector (HOROVOD_STALL_CHECK_TIME_SECONDS / HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, or
    horovodrun's --stall-check-* flags) did not end such a stall when tried here (0.28.1 under horovodrun --gloo:
    no warning, no shutdown, the job hung until killed), so a thread of ours watches instead;
    it looks four times per timeout, so a stall ends between 1 and 1.25 timeouts after it began."""

    def __init__(self, timeout_seconds: float, give_up: Callable[[str], None]):
        self.timeout, self.give_up = timeout_seconds, give_up
        self._since: float | None = None
        self._what = ""
        threading.Thread(target=self._watch, name="horovod-watchdog", daemon=True).start()

    @contextlib.contextmanager
    def waiting(self, what: str) -> Iterator[None]:
        self._what, self._since = what, time.monotonic()
        try:
            yield
        finally:
            self._since = None

    def bounded(self, what: str, call: Callable[..., Any]) -> Callable[..., Any]:
        """`call`, each of its waits watched."""
        def watched(*args: Any) -> Any:
            with self.waiting(what):
                return call(*args)
        return watched

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, self.timeout / 4))
            since = self._since
            if since is not None and time.monotonic() - since > self.timeout:
                self.give_up(f"horovod: {self._what} waited more than {self.timeout:g} s (--timeout-seconds) for "
                             f"the other ranks: a rank stopped making progress or is gone")
                sys.stderr.flush()
                os._exit(1)  # the main thread is blocked inside Horovod: nothing else can end it


def _polled(handle) -> bool:
    with contextlib.suppress(Exception):  # a handle Horovod no longer knows: not done before the wait
        return bool(hvd.poll(handle))
    return False
