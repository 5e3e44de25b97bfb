"""`gpt2bench train`: parse, set up the strategy, train (or serve), report, tear down.

Exit codes: 0 success; 1 the run failed (summary says why, when job rank 0 could still write it);
2 a bad option (the message names it).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import torch

from .config import ConfigError, parse_config
from .devices import apply_cpu_budget, bound_compile_threads, emulated_precision
from .env import detect_env, process_start_time
from .exporter import PrometheusExporter
from .fabric import (
    NO_GPUDIRECT,
    FabricPolicy,
    apply_nccl_env_script,
    ask_nccl_for_its_log,
    fallback_reason,
    gpudirect_hint,
    parse_nccl_log,
    peermem_module,
    rank_payload,
    transport_problems,
)
from .lifeline import watch_runner
from .memlock import PinnedMemory, read_pinned_memory
from .model import build_model
from .parallel import strategy_class
from .summary import build_summary, publish_steps, publish_summary

log = logging.getLogger("gpt2bench.trainer")


def main(argv: list[str] | None = None) -> int:
    started = process_start_time()
    watch_runner()  # started by a local `gpt2bench run`: stop when it is gone (lifeline.py)
    try:
        config = parse_config(list(sys.argv[1:] if argv is None else argv))
    except ConfigError as exc:
        print(f"gpt2bench train: error: {exc}", file=sys.stderr)
        return 2
    env = detect_env()
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s rank{env.rank} %(levelname)s %(message)s")
    try:
        budget = apply_cpu_budget(env.local_world_size)
    except RuntimeError as exc:
        print(f"gpt2bench train: error: {exc}", file=sys.stderr)
        return 2
    try:  # before any process group: NCCL reads its environment once, at its first communicator
        policy, pinned, nccl_env = prepare_fabric()
    except RuntimeError as exc:  # a script that cannot be sourced, memory RDMA cannot register: every rank alike
        return fail_at_start(config, env, str(exc), pinned_memory_fields(read_pinned_memory()))
    try:
        parallel = strategy_class(config.strategy.name)(config, env)
    except (ImportError, RuntimeError) as exc:  # e.g. horovod not installed, --device cuda without CUDA
        reason = f"--strategy {config.strategy.name} needs {exc.name}: {exc}" if isinstance(exc, ImportError) else str(exc)
        return fail_at_start(config, env, reason)
    emulated = None if config.training.allow_emulated_precision else emulated_precision(
        config.precision, config.process.device)
    if emulated:  # every rank sees the same device, so every rank stops here, before any rendezvous
        print(f"gpt2bench train: skipped: {emulated}", file=sys.stderr)
        if env.rank == 0:
            publish_summary({"status": "skipped", "reason": emulated, "strategy": config.strategy.name,
                             "precision": config.precision}, config.process.output)
        return 0
    # before any process group: NCCL reads its log settings once, at its first communicator (trainer/fabric.py)
    nccl_log = ask_nccl_for_its_log(config.process.output, env.rank) if parallel.device.type == "cuda" else None
    uses_nccl = parallel.device.type == "cuda" or config.process.nccl_log is not None
    if config.process.nccl_log is not None:  # test hook: a log as NCCL would have written it
        nccl_log = Path(config.process.nccl_log)
    # multi-node NCCL strategies only (parameter servers' messages are gloo's): nothing here for one node
    checks = uses_nccl and policy.checks_transport(env.nodes) and parallel.transport_between_nodes is None
    payload, exporter = {"job_rank": env.rank}, None
    try:
        parallel.setup()
        if checks and (reason := check_transport_at_start(parallel, nccl_log, policy)):
            log.error("%s", reason)
            payload.update(status="failed", reason=reason, **rank_payload(nccl_log, uses_nccl=True),
                           **pinned.payload(), nccl_env_applied=nccl_env)
            payloads = parallel.gather_to_reporter(payload)
            if parallel.is_reporter:
                publish_summary(build_summary(config, env, parallel, payloads, status="failed", reason=reason),
                                config.process.output)
            return 1
        if parallel.is_reporter:
            log.info("config %s", json.dumps(config.as_dict(), sort_keys=True))
        if config.process.metrics_port:
            exporter = PrometheusExporter(config, rank=env.rank, strategy=config.strategy.name,
                                          local_rank=env.local_rank,
                                          workers=1 if parallel.independent_steps else parallel.world_size)
        if parallel.is_worker:
            payload = train_worker(config, parallel, exporter, started)
        else:
            served = parallel.serve(lambda: build_model(config)) or {}
            payload = {"job_rank": env.rank, "is_worker": False, "role": "server", "status": "succeeded", **served}
        # read back here, at the end: what the rank really ran with, not what was asked, and where
        payload.update(threads=torch.get_num_threads(), cores_per_rank=budget.cores_per_rank,
                       compile_threads=bound_compile_threads(budget.threads))
        payload.update(rank_payload(nccl_log, uses_nccl=uses_nccl), **pinned.payload(), nccl_env_applied=nccl_env)
        payloads = parallel.gather_to_reporter(payload)
        if parallel.is_reporter:
            summary = build_summary(config, env, parallel, payloads)
            publish_steps(payloads)
            publish_summary(summary, config.process.output)
            return 0 if summary["status"] == "succeeded" else 1
        return 0 if payload.get("status") == "succeeded" else 1
    except Exception as exc:  # a crash on this process: say why where the operator looks, then exit 1
        log.exception("gpt2bench train failed")
        if parallel.is_reporter:
            reason = f"{type(exc).__name__}: {exc}"
            publish_summary(build_summary(config, env, parallel, [payload], status="failed", reason=reason),
                            config.process.output)
        return 1
    finally:
        if exporter is not None:
            exporter.close()
        parallel.teardown()


def fail_at_start(config, env, reason: str, extra: dict | None = None) -> int:
    """A rank that cannot start says why on stderr (its pod's log: the operator names the first pod that failed);
    rank 0 also writes a failed summary, where the operator and `gpt2bench launch` read a run's reason."""
    print(f"gpt2bench train: error: {reason}", file=sys.stderr)
    if env.rank == 0:
        publish_summary({"status": "failed", "reason": reason, "strategy": config.strategy.name,
                         "precision": config.precision, **(extra or {})}, config.process.output)
    return 1


def prepare_fabric() -> tuple[FabricPolicy, PinnedMemory, list[str]]:
    """spec.fabric in this process: the node's NCCL settings sourced (their names returned), what it may lock
    read; where RDMA was asked for (`require: rdma`) and cannot work here, RuntimeError with the node-level fix."""
    policy = FabricPolicy.from_env()
    applied = apply_nccl_env_script(policy.nccl_env_script) if policy.nccl_env_script else []
    pinned = read_pinned_memory()
    if policy.require == "rdma" and (problems := pinned.problems()):
        raise RuntimeError("spec.fabric.require rdma, but " + "; and ".join(problems))
    return policy, pinned, applied


def pinned_memory_fields(pinned: PinnedMemory) -> dict:
    """What a failed start records of the rank's memory limits (the summary's names)."""
    return {"memlock_bytes": pinned.memlock_bytes, "can_lock_memory": pinned.can_lock_enough,
            "rdma_devices": pinned.rdma_devices}


def check_transport_at_start(parallel, nccl_log: Path | None, policy: FabricPolicy) -> str | None:
    """Right after the process group: a warm-up collective makes NCCL connect every rank to its peers (and log
    how), then every rank reads its log and all agree in a second collective on whether the run is off its
    fabric; the reason (the same on every rank, quoting this rank's NCCL on the cause), or None. Before the model
    is built or compiled, so a run on the wrong network costs seconds, not its first compiled step."""
    parallel.mean_over_workers(torch.zeros(1))  # the warm-up: NCCL's communicator and its channels
    try:
        found = parse_nccl_log(nccl_log.read_text(encoding="utf-8", errors="replace")) if nccl_log else None
    except OSError:
        found = None  # no log to read: the summary says why (transport_reason); nothing to stop on
    flags = transport_problems(found, policy) if found is not None else [0.0, 0.0]
    mean = parallel.mean_over_workers(torch.tensor(flags)).tolist()
    hint = gpudirect_hint(found, peermem_module()) if flags[NO_GPUDIRECT] else None
    return fallback_reason(mean, parallel.world_size, policy, found.causes if found is not None else [], hint)


def train_worker(config, parallel, exporter, process_started: float) -> dict:
    """Build, train, and return this worker's payload; a non-finite loss fails it (all workers alike)."""
    from .loop import Trainer, TrainingFailed

    trainer = Trainer(config, parallel, exporter=exporter)
    first_step_at: list[float] = []
    status, reason = "succeeded", None
    try:
        trainer.train(first_step_at=first_step_at)
    except TrainingFailed as exc:
        status, reason = "failed", str(exc)
        log.error("%s", reason)
    finally:
        trainer.metrics.close()
    ended = time.time()
    payload = trainer.payload(status, reason)
    first = first_step_at[0] if first_step_at else ended
    payload.update(startup_seconds=first - process_started, train_seconds=ended - first)
    if status == "succeeded" and config.process.breakdown and config.process.probe_collectives:
        payload.update(probe_network(parallel, trainer.metrics.comm.message_bytes()))
    return payload


def probe_network(parallel, message_bytes: dict[str, int]) -> dict:
    """What the network gives the strategy's own messages, timed after training (collective_probe.py)."""
    from .collective_probe import probe, summary_fields

    backend = parallel.collectives_backend()
    return summary_fields(probe(backend, message_bytes) if backend is not None else [])


# The CLI ends this process with os._exit once main() has returned and output is flushed: C++ destructors
# of process groups can abort at interpreter exit after a finished run (seen with FSDP2 + bf16), which
# would turn a run that already published its summary into a SIGABRT.
EXIT_WITHOUT_DESTRUCTORS = True

if __name__ == "__main__":
    raise SystemExit(main())
