"""Prometheus export of the per-step figures (docs/metrics.md, Prometheus).

Every process of a pod writes into one prometheus-client multiprocess folder; local rank 0 serves them
all on `--metrics-port`, so the pod's one scrape annotation sees every rank (label `rank`), and removes the
folder when it closes. It listens on every address in a pod (Prometheus scrapes the pod's IP), on the one in
$GPT2BENCH_METRICS_ADDRESS where that is set: the local runner sets loopback.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import threading
from pathlib import Path
from typing import Any, ClassVar

from gpt2bench.conventions import DEFAULT_METRICS_ADDRESS, METRICS_ADDRESS_ENV

from .env import launcher_pid

log = logging.getLogger("gpt2bench.trainer")


class PrometheusExporter:
    """Per-rank metrics; every local process writes, local rank 0 serves them on --metrics-port.

    Processes of one pod share a prometheus-client multiprocess folder, so one port (the pod's
    scrape annotation) exposes every rank, told apart by the `rank` label.
    """

    GAUGES: ClassVar[dict[str, tuple[str, str]]] = {
        "step": ("gpt2bench_train_step", ("Last completed optimizer step (1-based, warm-up included).")),
        "loss": ("gpt2bench_train_loss", ("Training loss of the last step: mean over workers of each worker's mean "
                 "micro-step cross-entropy (nats/token).")),
        "grad_norm": ("gpt2bench_train_grad_norm", ("Global L2 norm of all gradients after cross-worker sync, "
                      "before clipping, last step.")),
        "lr": ("gpt2bench_train_learning_rate", ("Learning rate of the last step.")),
        "step_seconds": ("gpt2bench_train_step_duration_seconds", ("Wall time of the last optimizer step on this "
                         "rank, after a device synchronise.")),
        "data_loading_seconds": ("gpt2bench_train_data_loading_seconds", ("Time the last step waited for its "
                                 "batches (indexing + host-to-device copy).")),
        "tokens_per_second": ("gpt2bench_train_tokens_per_second", ("Global tokens per second of the last step: "
                              "tokens of all workers / step duration (torchtitan tps x devices).")),
        "tokens_per_second_per_device": ("gpt2bench_train_tokens_per_second_per_device", ("Tokens per second per "
                                         "device of the last step (torchtitan's tps).")),
        "mfu": ("gpt2bench_train_mfu_ratio", ("Model FLOPs utilisation of the last step, 0-1: flops_per_token x "
                "tokens/s per device / device peak FLOP/s. Absent when the peak is unknown (CPU).")),
        "peak_memory_bytes": ("gpt2bench_train_memory_peak_bytes", ("Peak memory of this rank during the last step: "
                              "CUDA max allocated, or peak RSS (high-water mark) on CPU.")),
        "peak_memory_reserved_bytes": ("gpt2bench_train_memory_peak_reserved_bytes", ("Peak CUDA memory reserved by "
                                       "the caching allocator during the last step (peak RSS on CPU).")),
        "comm_seconds": ("gpt2bench_train_communication_seconds", ("Time of the last step during which this rank "
                         "had communication in flight (union of its collectives' intervals; --breakdown).")),
        "comm_exposed_seconds": ("gpt2bench_train_communication_exposed_seconds", ("Time of the last step this rank "
                                 "waited for communication with no computation to overlap it (--breakdown).")),
        "energy_joules": ("gpt2bench_train_step_energy_joules", ("Energy of the last step on this rank's devices "
                          "(NVML per GPU; RAPL per CPU package, on the node's first worker): its log interval's "
                          "joules / its steps.")),
    }
    PHASES = ("data", "forward", "backward", "optimizer", "other")

    def __init__(self, config, *, rank: int, strategy: str, local_rank: int, workers: int):
        self.workers = max(1, workers)
        # one folder per launcher (a pod's torchrun or mpirun daemon) and port: the ranks it started share it
        port = config.process.metrics_port
        self.folder = Path(tempfile.gettempdir()) / f"gpt2bench-prometheus-{launcher_pid()}-{port}"
        self.folder.mkdir(parents=True, exist_ok=True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(self.folder)
        from prometheus_client import CollectorRegistry, Counter, Gauge, values
        from prometheus_client.multiprocess import MultiProcessCollector

        values.ValueClass = values.MultiProcessValue()  # in case prometheus_client was imported before
        labels = {"benchmark": config.process.benchmark, "run": config.process.run, "strategy": strategy,
                  "precision": config.precision, "rank": str(rank)}
        names = list(labels)
        self._gauges = {
            key: Gauge(name, doc, names, registry=None, multiprocess_mode="mostrecent").labels(**labels)
            for key, (name, doc) in self.GAUGES.items()
        }
        self._steps = Counter("gpt2bench_train_steps", "Optimizer steps completed by this rank.",
                              names, registry=None).labels(**labels)
        self._tokens = Counter("gpt2bench_train_tokens", "Tokens this worker trained on (its share of each "
                               "global step); sum over ranks for the global count.",
                               names, registry=None).labels(**labels)
        self._seconds = Counter("gpt2bench_train_step_seconds", "Total wall time spent in optimizer steps on this "
                                "rank; rate(tokens_total)/rate(step_seconds_total) gives mean tokens/s.",
                                names, registry=None).labels(**labels)
        self._phase = Gauge("gpt2bench_train_phase_seconds", "Time of the last step in one phase on this rank "
                            "(data, forward, backward, optimizer, other), exposed communication taken out; with "
                            "gpt2bench_train_communication_exposed_seconds they add up to the step duration "
                            "(--breakdown).", [*names, "phase"], registry=None, multiprocess_mode="mostrecent")
        self._labels = labels
        self._comm_bytes = Counter("gpt2bench_train_communication_bytes", "Bytes of this rank's collectives by kind "
                                   "(nccl-tests' size: the all-reduce buffer, the full all-gathered / reduce-scattered "
                                   "tensor, the ps push / pull payload; --breakdown).", [*names, "kind"],
                                   registry=None)
        self._busbw = Gauge("gpt2bench_train_communication_bus_bandwidth_bytes_per_second", "Achieved bus bandwidth "
                            "of the last step by collective kind (nccl-tests' busbw: bytes / time x 2(n-1)/n for "
                            "all-reduce, x (n-1)/n for all-gather and reduce-scatter; --breakdown).",
                            [*names, "kind"], registry=None, multiprocess_mode="mostrecent")
        self._energy = Counter("gpt2bench_train_energy_joules", "Energy of this rank's devices during its steps "
                               "(NVML per GPU; RAPL per CPU package, counted on the node's first worker).",
                               names, registry=None).labels(**labels)
        self.server = None
        self.owns_folder = local_rank == 0  # the rank that serves the folder removes it
        if local_rank == 0:
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=str(self.folder))
            address = os.environ.get(METRICS_ADDRESS_ENV) or DEFAULT_METRICS_ADDRESS
            try:
                self.server = serve(registry, address, config.process.metrics_port)
            except OSError as exc:  # e.g. several "pods" of a local run share one network: train on anyway
                log.warning("metrics port %s:%d unavailable (%s): this process group's metrics are not served",
                            address, config.process.metrics_port, exc)

    def observe(self, record: dict[str, Any]) -> None:
        for key, gauge in self._gauges.items():
            if record.get(key) is not None:
                gauge.set(float(record[key]))
        for phase in self.PHASES:
            if record.get(f"{phase}_seconds") is not None:
                self._phase.labels(**self._labels, phase=phase).set(float(record[f"{phase}_seconds"]))
        for kind, nbytes in (record.get("comm_bytes") or {}).items():
            self._comm_bytes.labels(**self._labels, kind=kind).inc(nbytes)
        for kind, bandwidth in (record.get("comm_bus_bandwidth") or {}).items():
            self._busbw.labels(**self._labels, kind=kind).set(bandwidth)
        if record.get("energy_joules") is not None:
            self._energy.inc(record["energy_joules"])
        self._steps.inc()
        self._tokens.inc(record["tokens"] / self.workers)
        self._seconds.inc(record["step_seconds"])

    def close(self) -> None:
        """Stop serving; local rank 0 removes the folder. It closes after the payloads were gathered, when no rank
        observes any more; a rank still running has its files open already, and keeps writing to them unlinked."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        if self.owns_folder:
            shutil.rmtree(self.folder, ignore_errors=True)


SHUTDOWN_POLL_SECONDS = 0.05


def serve(registry: Any, address: str, port: int) -> Any:
    """prometheus_client's start_http_server, whose serving loop notices a shutdown within 50 ms: the library's
    polls every 0.5 s, and each run's end waited for it (start-up per run, docs/local.md)."""
    from wsgiref.simple_server import make_server

    from prometheus_client import make_wsgi_app
    from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler  # a scrape is not worth a log line

    class Server(ThreadingWSGIServer):
        address_family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0][0]

    server = make_server(address, port, make_wsgi_app(registry), Server, handler_class=_SilentHandler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL_SECONDS}, daemon=True,
                     name="metrics").start()
    return server
