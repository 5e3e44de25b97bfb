"""Expand a GPT2Benchmark's sweep into runs: strategies x precisions x scales.

Order (deterministic, and the order runs start in when concurrency is 1): scales outer, then
strategies, then precisions, each in the order the spec lists them. Scales outer means that all runs
of the first (usually smallest) scale finish before a larger scale starts, so a comparison table of
one scale is complete early in a long sweep.

Effective scale: `single` always runs 1 node x 1 process (1 GPU when the scale has GPUs);
`dataparallel` runs 1 node x 1 process owning all of the node's GPUs (on CPU it trains as `single`).
Runs equal in (strategy, precision, effective scale) are planned once, at their first place.

Repeats (`sweep.repeats` > 1): within each scale the whole set of configurations runs once, then again,
so that a slow drift of the machine (other tenants, heat) spreads over every configuration instead of
biasing the one that happened to run last. Repeated runs are named `<name>-r<k>` (k from 1).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass, field

from gpt2bench.jobkinds import JOB_KINDS, job_kind_for, max_job_name_length, resolve_backend
from gpt2bench.protocol import OUTPUT_ENV
from gpt2bench.spec.expansion import escape
from gpt2bench.spec.model import Benchmark, GPT2BenchmarkSpec, ScaleSpec, StrategySpec
from gpt2bench.trainer.config import ProcessOptions, TrainConfig

# Job names must be DNS-1035 labels (<= 63). The Kubeflow operators derive pod and Service names from
# them (`<job>-worker-<i>`, `<job>-launcher`), so run names keep room for those suffixes.
MAX_NAME_LENGTH = 52
_HASH_LENGTH = 8



@dataclass(frozen=True)
class Run:
    """One job of the sweep. See docs/design.md (Runs)."""

    name: str
    index: int
    strategy: StrategySpec
    precision: str
    scale: ScaleSpec
    job_kind: str  # "PyTorchJob" | "MPIJob" | "TrainJob" (gpt2bench.jobkinds)
    nodes: int  # pods doing training
    procs_per_node: int  # processes per pod, parameter servers included
    world_size: int  # training workers, servers excluded
    devices_per_node: int  # GPUs per pod (0 = CPU)
    ps_servers: int
    benchmark: str = ""
    spec: GPT2BenchmarkSpec | None = field(default=None, repr=False, compare=False)
    repeat: int | None = None  # 1-based repetition of its configuration; None when sweep.repeats is 1

    @property
    def backend(self) -> str:
        return JOB_KINDS[self.job_kind].backend

    @property
    def job_name(self) -> str:
        """The job's name: the run's, shortened (with a hash) where the job kind's pod names need room."""
        return fit_name(self.name, max_job_name_length(self.job_kind, self.strategy.name, self.nodes))

    def for_backend(self, backend: str) -> Run:
        """This run as the job kind a resolved backend gives it."""
        return dataclasses.replace(self, job_kind=job_kind_for(self.strategy.name, backend))

    @property
    def total_processes(self) -> int:
        return self.nodes * self.procs_per_node

    @property
    def gpus_held(self) -> int:
        """GPUs the run's pods hold while it runs, whatever its job kind: its nodes' (an MPI launcher that
        trains nothing holds none; tests/test_render_fabric.py checks every kind)."""
        return self.nodes * self.devices_per_node

    @property
    def workers_per_node(self) -> int:
        """Training processes per pod (parameter servers left out)."""
        return self.procs_per_node - self.ps_servers // self.nodes

    def train_config(self, output: str = f"$({OUTPUT_ENV})") -> TrainConfig:
        """What this run's trainer is told: the spec's sections as they are, plus its labels and device."""
        if self.spec is None:
            raise ValueError(f"run {self.name!r} was planned without its spec")
        spec = self.spec
        return TrainConfig(
            strategy=self.strategy,
            precision=self.precision,
            model=spec.model,
            data=spec.data,
            training=spec.training,
            process=ProcessOptions(output=output, metrics_port=spec.metrics.port, benchmark=self.benchmark,
                                   run=self.name, device="cuda" if self.devices_per_node else "cpu"),
        )

    def trainer_args(self, output: str = f"$({OUTPUT_ENV})") -> list[str]:
        """The exact `gpt2bench train` options of this run (docs/design.md, Trainer), as a container's args:
        every word escaped for the kubelet's `$(VAR)` expansion (a data source or pretrained path reaches the
        trainer as the spec wrote it, `$(X)` and `$$` included), except `output`, the reference the kubelet
        (or the local runner) fills in."""
        argv = [escape(word) for word in self.train_config(output).to_argv()]
        argv[argv.index("--output") + 1] = output
        return argv


def dns_label(text: str) -> str:
    """Lower-case, only [a-z0-9-], starting with a letter and ending alphanumeric."""
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower())
    label = re.sub(r"-{2,}", "-", label).strip("-")
    if not label or not label[0].isalpha():
        label = "g2b-" + label
    return label.rstrip("-")


def fit_name(name: str, limit: int = MAX_NAME_LENGTH) -> str:
    """`name` when it fits, else a truncated prefix plus a hash of the whole, so names stay unique."""
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:_HASH_LENGTH]
    return f"{name[: limit - _HASH_LENGTH - 1].rstrip('-')}-{digest}"


def run_name(benchmark: str, strategy: str, precision: str, nodes: int, per_node: int, gpus: bool,
             repeat: int | None = None) -> str:
    """`<benchmark>-<strategy>-<precision>-<size>`, plus `-r<k>` for a repeat: the suffix is kept whole
    (the rest is shortened for it), so that the repeats of one configuration share everything before it."""
    size = f"{nodes}x{per_node}{'g' if gpus else ''}"
    base = dns_label(f"{benchmark}-{strategy}-{precision}-{size}")
    if repeat is None:
        return fit_name(base)
    suffix = f"-r{repeat}"
    return fit_name(base, MAX_NAME_LENGTH - len(suffix)) + suffix


def _effective(strategy: StrategySpec, scale: ScaleSpec) -> tuple[int, int, int]:
    """(nodes, worker processes per node, GPUs per node) the strategy really uses at this scale."""
    if strategy.name == "single":
        return 1, 1, min(scale.devices_per_node, 1)
    if strategy.name == "dataparallel":
        return 1, 1, scale.devices_per_node
    return scale.nodes, scale.procs_per_node, scale.devices_per_node


def resolved_backend(benchmark: Benchmark, backend: str | None = None) -> str:
    """`backend` (resolved by the caller, e.g. from the API's discovery) or the spec's own; an `auto` that
    nobody resolved becomes jobkinds.OFFLINE_BACKEND."""
    return resolve_backend(backend or benchmark.spec.backend)


def plan_runs(benchmark: Benchmark, backend: str | None = None) -> list[Run]:
    """All runs of the sweep, in start order, with unique DNS-safe names, as jobs of `backend`
    (see resolved_backend)."""
    spec = benchmark.spec
    backend = resolved_backend(benchmark, backend)
    runs: list[Run] = []
    seen: set[tuple] = set()
    repeats = [None] if spec.sweep.repeats == 1 else list(range(1, spec.sweep.repeats + 1))
    for scale in spec.sweep.scales:
        for repeat, strategy in ((r, s) for r in repeats for s in spec.sweep.strategies):
            nodes, workers, gpus = _effective(strategy, scale)
            for precision in spec.sweep.precisions:
                key = (strategy.name, precision, nodes, workers, gpus, repeat)
                if key in seen:
                    continue
                seen.add(key)
                servers = strategy.servers
                runs.append(
                    Run(
                        name=run_name(benchmark.name, strategy.name, precision, nodes, gpus or workers, gpus > 0,
                                      repeat),
                        index=len(runs),
                        strategy=strategy,
                        precision=precision,
                        scale=scale,
                        job_kind=job_kind_for(strategy.name, backend),
                        nodes=nodes,
                        procs_per_node=workers + servers // nodes,
                        world_size=nodes * workers,
                        devices_per_node=gpus,
                        ps_servers=servers,
                        benchmark=benchmark.name,
                        spec=spec,
                        repeat=repeat,
                    )
                )
    names = [run.name for run in runs]
    if len(set(names)) != len(names):  # cannot happen with the keys above; guard the contract anyway
        raise ValueError(f"run names collide: {names}")
    return runs


def gpu_hours(runs: list[Run], seconds_per_run: float) -> float:
    """GPU-hours a sweep holds when each run holds its GPUs `seconds_per_run` (one after another or not: the
    sum is the same); with the run's activeDeadlineSeconds, the most it can hold (docs/clusters.md, README)."""
    return sum(run.gpus_held for run in runs) * seconds_per_run / 3600
