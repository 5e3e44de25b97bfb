"""`ps` and `ps-sharded`: a real parameter server over c10d point-to-point messages (gloo, CPU tensors).

Roles. `--ps-servers N` processes serve (ps: default 1; ps-sharded: default 2, at least 2), the rest
are workers. Servers are the first N/nodes local ranks of every node when N divides evenly over the
nodes (on one node: job ranks 0..N-1), so job rank 0 is always a server and reports. Servers own the
parameters (fp32) and the AdamW optimizer, on the node's GPU when the job has GPUs (server i of a node on
GPU i mod GPUs, shared with the workers; `--ps-server-device cpu` keeps them on the CPU, where they use
every core the process may use); workers hold a replica only to compute gradients, one per GPU.
With N > 1 the flattened parameter vector is cut into N contiguous, equal ranges (balanced to the
element, as ZeRO's flat parameter; GPT-2's token embedding alone is ~92% of `tiny`, so a per-tensor
split could not balance).

One step, per server s and its range [lo, hi):
  worker -> s  push header (float64 PUSH_*), then grad[lo:hi] (float32, loss-scaled for fp16)
  s -> worker  reply header (float64 REPLY_*), then param[lo:hi] (float32, after the update)
Between a worker and a server of the same node the ranges do not travel in messages: s reads the worker's
gradient and writes its parameters through shared memory (`ps_memory`: CUDA IPC on GPUs, /dev/shm on CPU),
and only the headers are sent. sync (default): s waits for every worker's push, averages, steps, answers
everyone; so sync ps at equal global batch computes what ddp/single compute. async: s applies each push
as it arrives (any-source receive) and answers that worker alone; workers never wait for each other (no
collective among them, not even for the logged loss), and the job's tokens/s is the sum of their rates.

fp16: workers scale the loss with their GradScaler; the scale travels in the push header; the server
owns the authoritative GradScaler (a ShardedGradScaler across servers in sync ps-sharded, so an inf in
any shard skips the step on every server), unscales, checks for inf, clips, steps, and sends its new
scale back, which every worker adopts: all parties skip and back off together.

Grad norm: of the averaged gradient, on the server(s), before clipping; sync ps-sharded all-reduces
the shards' squared norms among the servers. Async ps-sharded has no place where a whole gradient
lives, so the worker sends the norm of its own (unscaled) gradient and the servers clip with it.

Breakdown (`instrument`): a worker's step waits for its push (the sends of its gradient ranges, completed when
every server has received them) and then for its pull (the servers' replies, which come after the update:
the pull's time includes the servers' averaging and AdamW step, which the worker cannot tell apart). Both are
exposed: nothing computes meanwhile. Bytes are the gradient / parameter ranges, whether they travel in
messages or through shared memory (headers left out).

Failure: every receive is bounded by --timeout-seconds; a dead peer closes its gloo connections and
the receive raises at once ("Connection closed by peer"), so the job ends instead of hanging.
"""

from __future__ import annotations

import datetime
import itertools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from ..breakdown import CommTimer
from ..devices import PeakMemory, device_sync
from ..fabric import GLOO_TCP
from .base import Parallelism, adamw, state_bytes
from .ps_memory import SharedBuffer, open_shared, shm_room

# Message tags (one stream per kind, so an any-source receive only ever matches a push header).
TAG_PUSH_HEADER, TAG_PUSH_GRAD, TAG_REPLY_HEADER, TAG_REPLY_PARAM = 11, 12, 13, 14
# Push header fields (float64). KIND: GRADIENT, or DONE (worker finished; FINGERPRINT holds its params').
PUSH_KIND, PUSH_SCALE, PUSH_LR, PUSH_NORM, PUSH_FINGERPRINT = range(5)
GRADIENT, DONE = 0.0, 1.0
# Reply header fields (float64). STATUS: APPLIED or SKIPPED (fp16 overflow).
REPLY_STATUS, REPLY_NORM, REPLY_SCALE, REPLY_VERSION = range(4)
APPLIED, SKIPPED = 0.0, 1.0
HEADER_LEN = 5
FINGERPRINT_MOD = 1 << 52  # exact in a float64 header slot


def server_ranks(world_size: int, local_world_size: int, servers: int) -> list[int]:
    """Job ranks that serve: the first servers/nodes local ranks of each node, else the first ranks."""
    nodes = max(1, world_size // max(1, local_world_size))
    if nodes > 1 and servers % nodes == 0 and world_size % local_world_size == 0:
        per_node = servers // nodes
        return [node * local_world_size + i for node in range(nodes) for i in range(per_node)]
    return list(range(servers))


def shard_ranges(numel: int, servers: int) -> list[tuple[int, int]]:
    """[lo, hi) of each server's part of the flat parameter vector: contiguous, sizes differ by <= 1."""
    bounds = [numel * s // servers for s in range(servers + 1)]
    return list(itertools.pairwise(bounds))


def bit_sum(flat: torch.Tensor, chunk: int = 1 << 22) -> int:
    """Exact, order-independent digest of float32 values: the sum of their bit patterns (int64)."""
    bits = flat.detach().to("cpu", torch.float32).contiguous().view(torch.int32)
    return sum(int(bits[i:i + chunk].to(torch.int64).sum()) for i in range(0, bits.numel(), chunk))


def _segments(flat_shard: torch.Tensor, numels: list[int], lo: int, hi: int) -> list[torch.Tensor]:
    """Views of a shard [lo, hi) cut at the model's tensor boundaries (edge tensors cut by the shard)."""
    views, offset = [], 0
    for numel in numels:
        start, end = max(offset, lo), min(offset + numel, hi)
        if start < end:
            views.append(flat_shard[start - lo:end - lo])
        offset += numel
    return views


class _ServerSideOptimizer(torch.optim.Optimizer):
    """The workers' stand-in optimizer: holds the learning rate; the real AdamW lives on the servers."""

    def __init__(self, params, lr: float):
        super().__init__(params, {"lr": lr})

    def step(self, closure=None):  # pragma: no cover - a misuse guard
        raise RuntimeError("ps: parameters are updated on the parameter servers, not by workers")


class ParameterServerParallelism(Parallelism):
    name = "ps"
    sharded = False
    breakdown_method = "ps: push = the gradient sends, pull = the wait for the servers' replies; both exposed"
    transport_between_nodes = GLOO_TCP  # c10d point-to-point on gloo, CPU tensors, whatever the devices
    comm: CommTimer | None = None

    def __init__(self, config, env):
        # roles first: the device a process gets depends on them (base __init__ picks it)
        self.num_servers = config.strategy.servers
        self.mode = config.strategy.mode
        self.servers = server_ranks(env.world_size, env.local_world_size, self.num_servers)
        self.workers = [r for r in range(env.world_size) if r not in self.servers]
        super().__init__(config, env)
        self.is_worker = env.rank in self.workers
        self.world_size = len(self.workers)
        self.rank = self.workers.index(env.rank) if self.is_worker else 0
        self.independent_steps = self.mode == "async"
        self.extra_summary = {"ps_servers": self.num_servers, "ps_mode": self.mode,
                              "checksum_scope": "full model (workers); sum of shards (servers)"}
        if not self.sharded and self.num_servers > 1:
            self.notes.append(f"ps with {self.num_servers} servers partitions the parameters as ps-sharded does")
        self._done_sent = False

    # ----------------------------------------------------------------- lifecycle
    def setup(self) -> None:
        if self.sharded and self.num_servers < 2:
            raise ValueError(f"--ps-servers {self.num_servers}: ps-sharded needs at least 2 servers")
        if not self.workers:
            raise ValueError(f"--ps-servers {self.num_servers} leaves no worker among the job's "
                             f"{self.env.world_size} processes")
        # gloo everywhere: headers are CPU tensors, and so are payloads between nodes
        self.init_process_group("gloo")
        # new_group is collective: every process creates both groups, in the same order
        # (new_group's own default timeout is 30 min: pass the job's, so a hung peer fails these too)
        timeout = datetime.timedelta(seconds=self.config.training.timeout_seconds)
        self.servers_group = dist.new_group(self.servers, timeout=timeout)
        self.workers_group = dist.new_group(self.workers, timeout=timeout)

    def _node_ranks(self, rank: int) -> range:
        node = rank // max(1, self.env.local_world_size)
        return range(node * self.env.local_world_size, (node + 1) * self.env.local_world_size)

    def _pick_device(self) -> torch.device:
        """Workers: one GPU each (more workers than GPUs on a node is an error). Servers: the node's GPUs in
        turn, unless --ps-server-device cpu."""
        if not self._wants_cuda():
            return torch.device("cpu")
        node = self._node_ranks(self.env.rank)
        if self.env.rank in self.workers:
            local = [r for r in node if r in self.workers]
            return torch.device("cuda", self._local_device_index(local.index(self.env.rank), len(local)))
        if self.config.strategy.ps_server_device == "cpu":
            return torch.device("cpu")
        local = [r for r in node if r in self.servers]
        return torch.device("cuda", local.index(self.env.rank) % torch.cuda.device_count())

    def _shares_memory_with(self, server: int) -> bool:
        """A worker and a server of the same node, on the same kind of device, share buffers (ps_memory)."""
        same_node = server in self._node_ranks(self.env.rank)
        server_on_gpu = self.device.type == "cuda" and self.config.strategy.ps_server_device != "cpu"
        return same_node and server_on_gpu == (self.device.type == "cuda")

    # ------------------------------------------------------------------- worker
    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """Lay the replica's parameters and gradients over two flat buffers, pull the servers' values."""
        model = model.to(self.device)
        self.params = list(model.parameters())
        numel = sum(p.numel() for p in self.params)
        self.ranges = shard_ranges(numel, self.num_servers)
        local = [s for s in self.servers if self._shares_memory_with(s)]
        room, why = shm_room(2 * 4 * numel) if local and self.device.type == "cpu" else (True, "")
        self.shared_with = set(local) if room else set()
        if self.shared_with:
            self._buffers = [SharedBuffer(numel, self.device), SharedBuffer(numel, self.device)]
            self.flat_param, self.flat_grad = (b.tensor for b in self._buffers)
        else:
            self._buffers = []
            self.flat_param = torch.empty(numel, dtype=torch.float32, device=self.device)
            self.flat_grad = torch.zeros(numel, dtype=torch.float32, device=self.device)
        self.grad_views = []
        offset = 0
        with torch.no_grad():
            for p in self.params:
                view = self.flat_param[offset:offset + p.numel()].view_as(p)
                view.copy_(p)
                p.data = view  # same Parameter object, so tied weights (wte/lm_head) stay tied
                p.grad = self.flat_grad[offset:offset + p.numel()].view_as(p)  # backward adds in place
                self.grad_views.append(p.grad)
                offset += p.numel()
        on_cpu = self.device.type == "cpu"
        pin = torch.cuda.is_available() and not on_cpu
        self.wire_grad = self.flat_grad if on_cpu else torch.empty(numel, pin_memory=pin)
        self.wire_param = self.flat_param if on_cpu else torch.empty(numel, pin_memory=pin)
        self.reply_headers = [torch.zeros(HEADER_LEN, dtype=torch.float64) for _ in self.servers]
        for server in local:  # every server of the node learns how this worker's payload travels
            offer = [b.handle for b in self._buffers] if self.shared_with else [None, why]  # [param, grad]
            dist.send_object_list(offer, dst=server)
        self._receive_params()  # the servers' initial parameters: every replica starts from them
        for buffer in self._buffers:
            buffer.unlink()  # every server has mapped them (they answered): leave no name behind
        return model

    def build_optimizer(self, model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
        return _ServerSideOptimizer(model.parameters(), lr)

    def step(self, model, optimizer, scaler, max_grad_norm: float):
        """Push this worker's gradient to every server, pull the updated parameters, adopt the scale."""
        self._collect_stray_grads()
        scale = scaler.get_scale() if scaler.is_enabled() else 1.0
        header = torch.zeros(HEADER_LEN, dtype=torch.float64)
        header[PUSH_KIND], header[PUSH_SCALE] = GRADIENT, scale
        header[PUSH_LR] = optimizer.param_groups[0]["lr"]
        header[PUSH_NORM] = math.nan
        if self.mode == "async" and self.num_servers > 1:
            header[PUSH_NORM] = float(torch.linalg.vector_norm(self.flat_grad)) / scale
        device_sync(self.device)  # the gradient is complete before any server reads it
        remote = [i for i, s in enumerate(self.servers) if s not in self.shared_with]
        if remote and self.wire_grad is not self.flat_grad:
            self.wire_grad.copy_(self.flat_grad)
        # Post the replies' receives before waiting on the pushes: a gloo send completes only once its
        # receiver is ready, and in async ps-sharded server 0 may be answering this worker while
        # server 1 answers another; waiting on our sends first would close a cycle of waits.
        receives = self._post_receives()
        push = self.comm.launch("push", self.payload_bytes, 2) if self.comm else None
        sends = []
        for i, (server, (lo, hi)) in enumerate(zip(self.servers, self.ranges)):
            sends.append(dist.isend(header, server, tag=TAG_PUSH_HEADER))
            if i in remote:
                sends.append(dist.isend(self.wire_grad[lo:hi], server, tag=TAG_PUSH_GRAD))
        if push is None:
            self._finish_receives(receives + sends)
        else:
            self._timed_push_pull(push, sends, receives)
        self.flat_grad.zero_()
        if scaler.is_enabled():
            scaler.update(min(float(h[REPLY_SCALE]) for h in self.reply_headers))
        skipped = any(float(h[REPLY_STATUS]) == SKIPPED for h in self.reply_headers)
        return self.reply_headers[0][REPLY_NORM].to(torch.float32), skipped

    def instrument(self, model, optimizer, comm: CommTimer) -> None:
        self.comm = comm
        self.payload_bytes = 4 * sum(hi - lo for lo, hi in self.ranges)  # float32 ranges, to every server

    def first_worker_on_node(self) -> bool:
        return self.env.rank == min(r for r in self._node_ranks(self.env.rank) if r in self.workers)

    def _timed_push_pull(self, push, sends: list, receives: list) -> None:
        """Wait for the pushes, then for the replies (every receive was posted first), each timed."""
        comm = self.comm
        for work in sends:
            work.wait()
        comm.complete(push)
        pull = comm.launch("pull", self.payload_bytes, 2)
        self._finish_receives(receives)
        comm.complete(pull)
        comm.expose(push, until=pull)  # nothing computes from the first send to the last reply

    def _receive_params(self) -> None:
        self._finish_receives(self._post_receives())

    def _post_receives(self) -> list:
        works = []
        for server, (lo, hi), reply in zip(self.servers, self.ranges, self.reply_headers):
            works.append(dist.irecv(reply, server, tag=TAG_REPLY_HEADER))
            if server not in self.shared_with:
                works.append(dist.irecv(self.wire_param[lo:hi], server, tag=TAG_REPLY_PARAM))
        return works

    def _finish_receives(self, works: list) -> None:
        for work in works:
            work.wait()
        if self.wire_param is not self.flat_param:
            for server, (lo, hi) in zip(self.servers, self.ranges):
                if server not in self.shared_with:
                    self.flat_param[lo:hi].copy_(self.wire_param[lo:hi], non_blocking=False)

    def _collect_stray_grads(self) -> None:
        """Gradients someone reset to None or replaced go back into the flat buffer (cheap pointer check)."""
        for p, view in zip(self.params, self.grad_views):
            if p.grad is None:
                view.zero_()
            elif p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad)
            else:
                continue
            p.grad = view

    def _send_done(self) -> None:
        """Tell every server this worker is finished (once); carries the replica's parameter digest."""
        if self._done_sent or not self.is_worker or not hasattr(self, "flat_param"):
            return
        self._done_sent = True
        header = torch.zeros(HEADER_LEN, dtype=torch.float64)
        header[PUSH_KIND] = DONE
        header[PUSH_FINGERPRINT] = bit_sum(self.flat_param) % FINGERPRINT_MOD
        for work in [dist.isend(header, server, tag=TAG_PUSH_HEADER) for server in self.servers]:
            work.wait()

    def model_checksum(self, model: torch.nn.Module) -> float:
        return float(self.flat_param.double().abs().sum())

    # ------------------------------------------------------------------- server
    def serve(self, model_factory: Callable[[], torch.nn.Module]) -> dict[str, Any]:
        memory = PeakMemory(self.device)
        index = self.servers.index(self.env.rank)
        params = list(model_factory().parameters())
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        lo, hi = shard_ranges(flat.numel(), self.num_servers)[index]
        self.lo, self.hi = lo, hi
        self.param = torch.nn.Parameter(flat[lo:hi].to(self.device, copy=True))
        self.param.grad = torch.zeros_like(self.param)
        self.grad_segments = _segments(self.param.grad, [p.numel() for p in params], lo, hi)
        del flat, params
        holder = torch.nn.ParameterList([self.param])
        self.optimizer = adamw(holder.parameters(), self.config.training.lr, self.device)  # every strategy's AdamW
        enabled = self.config.precision == "fp16"
        kind = self.device.type
        if self.num_servers > 1 and self.mode == "sync":
            self.scaler = ShardedGradScaler(kind, enabled=enabled, process_group=self.servers_group)
        else:
            self.scaler = torch.amp.GradScaler(kind, enabled=enabled)
        self.scaler.scale(torch.ones((), device=self.device))  # initialises the scale (GradScaler does it lazily)
        self.version = 0
        self.worker_fingerprints: dict[int, int] = {}
        self._open_worker_buffers()
        self._reply(self.workers, APPLIED, math.nan)  # initial parameters
        setup = memory.read()
        memory.reset()
        (self._serve_sync if self.mode == "sync" else self._serve_async)()
        serving = memory.read()
        figures = self._final_figures(holder, index, lo, hi)  # counts the pairs sharing memory: before letting go
        self.shared_grads = self.shared_params = {}  # let go of the workers' memory before they exit
        return {"role": "server", "device_peak_bytes": serving["device_bytes"],
                "device_reserved_peak_bytes": serving["device_reserved_bytes"],
                "host_peak_bytes": serving["host_bytes"], "setup_device_peak_bytes": setup["device_bytes"],
                "setup_host_peak_bytes": setup["host_bytes"], "host_peak_since_start": memory.host_since_start,
                **figures}

    def _open_worker_buffers(self) -> None:
        """Map the gradient and parameter buffers of the node's workers that share them; the others send
        their payload in messages, received through host buffers (pinned when the server is on a GPU)."""
        self.shared_grads: dict[int, torch.Tensor] = {}
        self.shared_params: dict[int, torch.Tensor] = {}
        for worker in self.workers:
            if self.env.rank not in self._node_ranks(worker) or not self._worker_may_share(worker):
                continue
            offer: list[Any] = [None, None]
            dist.recv_object_list(offer, src=worker)
            if offer[0] is None:
                self.notes.append(f"ps: worker {worker} and the servers of its node exchange messages: {offer[1]}")
                continue
            # the worker's offer is [flat_param's handle, flat_grad's handle] (its `_buffers` order)
            self.shared_params[worker], self.shared_grads[worker] = (open_shared(h) for h in offer)
        on_gpu = self.device.type == "cuda"
        self.wire_grads = {w: torch.empty(self.hi - self.lo, pin_memory=on_gpu) if on_gpu else
                           torch.empty_like(self.param.grad) for w in self.workers if w not in self.shared_grads}
        self.wire_param = torch.empty(self.hi - self.lo, pin_memory=True) if on_gpu else self.param.detach()

    def _worker_may_share(self, worker: int) -> bool:
        worker_on_gpu = self._wants_cuda()  # every worker of the job trains on the same kind of device
        return worker_on_gpu == (self.device.type == "cuda")

    def _gradient(self, worker: int) -> torch.Tensor:
        """The gradient range `worker` pushed, on this server's device."""
        if worker in self.shared_grads:
            return self.shared_grads[worker][self.lo:self.hi].to(self.device)
        return self.wire_grads[worker].to(self.device, non_blocking=True)

    def _serve_sync(self) -> None:
        headers = {w: torch.zeros(HEADER_LEN, dtype=torch.float64) for w in self.workers}
        while True:
            for work in [dist.irecv(headers[w], w, tag=TAG_PUSH_HEADER) for w in self.workers]:
                work.wait()
            done = [w for w in self.workers if headers[w][PUSH_KIND] == DONE]
            if done:
                if len(done) != len(self.workers):
                    raise RuntimeError(f"ps sync: workers {done} finished while "
                                       f"{sorted(set(self.workers) - set(done))} pushed another gradient")
                self.worker_fingerprints = {w: int(headers[w][PUSH_FINGERPRINT]) for w in self.workers}
                return
            for work in [dist.irecv(buffer, w, tag=TAG_PUSH_GRAD) for w, buffer in self.wire_grads.items()]:
                work.wait()
            scales = {float(h[PUSH_SCALE]) for h in headers.values()}
            if len(scales) != 1:
                raise RuntimeError(f"ps sync: workers used different loss scales {sorted(scales)}")
            grad = self.param.grad
            grad.copy_(self._gradient(self.workers[0]))
            for worker in self.workers[1:]:  # a fixed order: every run sums alike
                grad.add_(self._gradient(worker))
            grad.div_(len(self.workers))
            first = headers[self.workers[0]]
            status, norm = self._apply(float(first[PUSH_SCALE]), float(first[PUSH_LR]), math.nan)
            self._reply(self.workers, status, norm)

    def _serve_async(self) -> None:
        header = torch.zeros(HEADER_LEN, dtype=torch.float64)
        while len(self.worker_fingerprints) < len(self.workers):
            source = dist.recv(header, src=None, tag=TAG_PUSH_HEADER)
            if header[PUSH_KIND] == DONE:
                self.worker_fingerprints[source] = int(header[PUSH_FINGERPRINT])
                continue
            if source in self.wire_grads:
                dist.recv(self.wire_grads[source], source, tag=TAG_PUSH_GRAD)
            self.param.grad.copy_(self._gradient(source))
            status, norm = self._apply(float(header[PUSH_SCALE]), float(header[PUSH_LR]), float(header[PUSH_NORM]))
            self._reply([source], status, norm)

    def _apply(self, scale_used: float, lr: float, worker_norm: float) -> tuple[float, float]:
        """Unscale, norm, clip, AdamW step on the gradient in self.param.grad; (status, norm)."""
        fp16 = self.scaler.is_enabled()
        scale = self.scaler.get_scale()
        if fp16 and not math.isfinite(worker_norm) and self.mode == "async" and self.num_servers > 1:
            # async ps-sharded: the worker's gradient overflowed, maybe in another server's range only
            self.scaler.update(scale * self.scaler.get_backoff_factor())
            return SKIPPED, worker_norm
        if fp16 and scale_used != scale:  # async: the worker used an older scale; both are powers of two
            self.param.grad.mul_(scale / scale_used)
        self.scaler.unscale_(self.optimizer)
        norm = self._grad_norm(worker_norm)
        if self.config.training.max_grad_norm > 0:
            torch.nn.utils.clip_grads_with_norm_([self.param], self.config.training.max_grad_norm, norm)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.scaler.step(self.optimizer)  # skipped when unscale_ found inf/NaN (fp16)
        self.scaler.update()  # ... and then the scale backs off
        skipped = fp16 and self.scaler.get_scale() < scale
        self.version += 0 if skipped else 1  # updates applied so far
        return (SKIPPED if skipped else APPLIED), float(norm)

    def _grad_norm(self, worker_norm: float) -> torch.Tensor:
        # per-tensor norms, then their norm: what clip_grad_norm_ computes for ddp/single, to the bit
        local = torch.nn.utils.get_total_norm(self.grad_segments, foreach=True)
        if self.num_servers == 1:
            return local
        if self.mode == "async":
            return torch.tensor(worker_norm, dtype=torch.float32)
        squared = local * local
        dist.all_reduce(squared, group=self.servers_group)
        return squared.sqrt()

    def _reply(self, workers: list[int], status: float, norm: float) -> None:
        """The new parameter range to each worker (in place where memory is shared), then its header."""
        header = torch.tensor([status, norm, self.scaler.get_scale(), float(self.version), 0.0], dtype=torch.float64)
        for worker in workers:
            if worker in self.shared_params:
                self.shared_params[worker][self.lo:self.hi].copy_(self.param.detach())
        if any(w not in self.shared_params for w in workers) and self.wire_param is not self.param:
            self.wire_param.copy_(self.param.detach())
        device_sync(self.device)  # the writes are complete before a worker hears of them
        works = []
        for worker in workers:
            works.append(dist.isend(header, worker, tag=TAG_REPLY_HEADER))
            if worker not in self.shared_params:
                works.append(dist.isend(self.wire_param, worker, tag=TAG_REPLY_PARAM))
        for work in works:
            work.wait()

    def _final_figures(self, holder, index: int, lo: int, hi: int) -> dict[str, Any]:
        """This server's payload; on the reporter, also the replica-vs-server parameter comparison."""
        totals = torch.tensor([bit_sum(self.param)], dtype=torch.int64)
        checksum = torch.tensor([float(self.param.detach().double().abs().sum())], dtype=torch.float64)
        pairs = torch.tensor([len(self.shared_params), len(self.wire_grads)], dtype=torch.int64)
        for tensor in (totals, checksum, pairs):
            dist.all_reduce(tensor, group=self.servers_group)
        if self.is_reporter:
            server_fp = int(totals) % FINGERPRINT_MOD
            workers_fp = [self.worker_fingerprints.get(w) for w in self.workers]
            self.extra_summary.update(
                ps_server_param_checksum=float(checksum),
                ps_param_fingerprints={"servers": server_fp, "workers": workers_fp},
                ps_replicas_match_servers=all(fp == server_fp for fp in workers_fp),
                ps_updates_applied=self.version,
                ps_server_device=self.device.type,
                ps_server_threads=torch.get_num_threads() if self.device.type == "cpu" else None,
                ps_pairs_sharing_memory=int(pairs[0]),
                ps_pairs_exchanging_messages=int(pairs[1]),
            )
        return {"state_bytes": state_bytes(holder, self.optimizer), "ps_shard": [index, lo, hi]}

    # --------------------------------------------------------------- reductions
    def mean_over_workers(self, value: torch.Tensor) -> torch.Tensor:
        if self.independent_steps:  # async: each worker logs its own loss; no collective ties them together
            return value
        total = value.detach().to("cpu", torch.float32).clone()
        dist.all_reduce(total, group=self.workers_group)
        return total / self.world_size

    def gather_to_reporter(self, payload: dict[str, Any]) -> list[dict[str, Any]] | None:
        self._send_done()
        gathered: list[Any] | None = [None] * self.env.world_size if self.is_reporter else None
        dist.gather_object(payload, gathered, dst=0)
        return gathered


class ShardedParameterServerParallelism(ParameterServerParallelism):
    name = "ps-sharded"
    sharded = True
