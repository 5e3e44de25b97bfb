"""Expand a GPT2Benchmark's sweep into runs: strategies x precisions x scales, once per round.

A configuration is a strategy x precision x effective scale: `single` always runs 1 node x 1 process (1 GPU
when the scale has GPUs); `dataparallel` runs 1 node x 1 process owning all of the node's GPUs (on CPU it trains
as `single`). Configurations equal in (strategy, precision, effective scale) are planned once, at their first
place.

Order (deterministic; the order runs start in, locally and on a cluster): with one repeat, scales outer, then
strategies, then precisions, as the spec lists them. With `sweep.repeats: k` > 1 the sweep runs in **rounds**:
every configuration of every scale runs once per round, in an order shuffled per round (round r with
`random.Random(order_seed + r)`; `sweep.orderSeed`, else a seed derived from the benchmark's name), so that a
drift of the machine between rounds hits every configuration and scale alike, and no configuration always runs
first or last. With `sweep.breakdown: separate` (the default) a breakdown round (round 0, runs named `-prof`)
runs first with the step breakdown's timing hooks; the decision rounds run without them. Repeats are named
`<name>-r<k>` (k = the round, from 1), and round k trains with seed `training.seed + k - 1` (every configuration
of a round with the same seed, so that the convergence claim compares like with like, and the rounds' loss gaps
differ as the seed does).
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpt2bench.conventions import OUTPUT_ENV
from gpt2bench.jobkinds import JOB_KINDS, job_kind_for, max_job_name_length, resolve_backend
from gpt2bench.specification.expansion import escape
from gpt2bench.specification.model import MAX_SEED, Benchmark, GPT2BenchmarkSpec, ScaleSpec, StrategySpec
from gpt2bench.strategies import traits
from gpt2bench.trainer.config import ProcessOptions, TrainConfig

# Job names must be DNS-1035 labels (<= 63). The Kubeflow operators derive pod and Service names from
# them (`<job>-worker-<i>`, `<job>-launcher`), so run names keep room for those suffixes.
MAX_NAME_LENGTH = 52
_HASH_LENGTH = 8
PROFILE_SUFFIX = "-prof"  # the breakdown round's runs


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
    repeat: int | None = None  # the round (from 1) it runs in; None when sweep.repeats is 1
    profile: bool = False  # the breakdown round: timed with the breakdown's hooks, used in no decision

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
    def gpus_held(self) -> int:
        """GPUs the run's pods hold while it runs, whatever its job kind: its nodes' (an MPI launcher that
        trains nothing holds none; tests/test_render_fabric.py checks every kind)."""
        return self.nodes * self.devices_per_node

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
            training=spec.training.model_copy(update={"seed": self.seed}),
            process=ProcessOptions(output=output, metrics_port=spec.metrics.port, benchmark=self.benchmark,
                                   run=self.name, device="cuda" if self.devices_per_node else "cpu",
                                   breakdown=self.breakdown),
        )

    @property
    def seed(self) -> int:
        """The training seed: `training.seed + round - 1` (the breakdown round and a single round: the seed)."""
        base = self.spec.training.seed if self.spec else 0
        return (base + (self.repeat or 1) - 1) % (MAX_SEED + 1)

    @property
    def breakdown(self) -> bool:
        """Whether the run times the step breakdown: `sweep.breakdown` inline, or this is the breakdown round
        (with one repeat, that round is the only one)."""
        mode = self.spec.sweep.breakdown if self.spec else "inline"
        return mode == "inline" or (mode == "separate" and (self.profile or self.repeat is None))

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
             repeat: int | None = None, profile: bool = False) -> str:
    """`<benchmark>-<strategy>-<precision>-<size>`, plus `-r<k>` for a repeat (`-prof` for the breakdown
    round): the suffix is kept whole (the rest is shortened for it), so that the runs of one configuration share
    everything before it."""
    size = f"{nodes}x{per_node}{'g' if gpus else ''}"
    base = dns_label(f"{benchmark}-{strategy}-{precision}-{size}")
    suffix = PROFILE_SUFFIX if profile else f"-r{repeat}" if repeat is not None else ""
    if not suffix:
        return fit_name(base)
    return fit_name(base, MAX_NAME_LENGTH - len(suffix)) + suffix


def _effective(strategy: StrategySpec, scale: ScaleSpec) -> tuple[int, int, int]:
    """(nodes, worker processes per node, GPUs per node) the strategy really uses at this scale."""
    footprint = traits(strategy.name).footprint
    if footprint == "device":
        return 1, 1, min(scale.devices_per_node, 1)
    if footprint == "node":
        return 1, 1, scale.devices_per_node
    return scale.nodes, scale.procs_per_node, scale.devices_per_node


def resolved_backend(benchmark: Benchmark, backend: str | None = None) -> str:
    """`backend` (resolved by the caller, e.g. from the API's discovery) or the spec's own; an `auto` that
    nobody resolved becomes jobkinds.OFFLINE_BACKEND."""
    return resolve_backend(backend or benchmark.spec.backend)


def order_seed(benchmark: Benchmark) -> int:
    """`sweep.orderSeed`, else one derived from the benchmark's name (the same name, the same orders)."""
    return seed_for(benchmark.name, benchmark.spec.sweep.order_seed)


def seed_for(name: str, order_seed_: int | None) -> int:
    if order_seed_ is not None:
        return order_seed_
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big")


@dataclass(frozen=True)
class _Configuration:
    strategy: StrategySpec
    precision: str
    scale: ScaleSpec
    nodes: int
    workers: int
    gpus: int


def _configurations(spec: GPT2BenchmarkSpec) -> list[_Configuration]:
    """Every configuration once, in the spec's order: scales, then strategies, then precisions."""
    found, seen = [], set()
    for scale in spec.sweep.scales:
        for strategy in spec.sweep.strategies:
            nodes, workers, gpus = _effective(strategy, scale)
            for precision in spec.sweep.precisions:
                key = (strategy.name, precision, nodes, workers, gpus)
                if key not in seen:
                    seen.add(key)
                    found.append(_Configuration(strategy, precision, scale, nodes, workers, gpus))
    return found


def round_order(configs: list, seed: int, round_: int) -> list:
    """The configurations in round `round_`'s order: shuffled with random.Random(seed + round_) (Python's
    Mersenne Twister: the same seed gives the same order on every machine and version)."""
    order = list(configs)
    random.Random(seed + round_).shuffle(order)
    return order


def rounds_of(spec: GPT2BenchmarkSpec, rounds: int | None = None) -> list[tuple[int | None, bool]]:
    """(round number, breakdown round?) in the order they run: the breakdown round first when there is one.
    `rounds`: the decision rounds planned so far (a sweep that repeats until decided adds them); default
    `sweep.repeats`."""
    rounds = rounds or spec.sweep.repeats
    if rounds == 1 and spec.sweep.max_repeats is None:
        return [(None, False)]
    first = [(0, True)] if spec.sweep.breakdown_round else []
    return first + [(k, False) for k in range(1, rounds + 1)]


def plan_runs(benchmark: Benchmark, backend: str | None = None, rounds: int | None = None,
              stopped: Mapping[str, int] | None = None) -> list[Run]:
    """All runs of the sweep, in start order, with unique DNS-safe names, as jobs of `backend`
    (see resolved_backend). `rounds`: the decision rounds planned so far (default `sweep.repeats`; a sweep that
    repeats until decided plans one more each time it adds one: the runs before it stay as they were).
    `stopped`: configurations (by `configuration_of`) that the selection race stopped, with the last round each
    runs in; they have no run in a later round (the others keep their places in its order)."""
    spec = benchmark.spec
    backend = resolved_backend(benchmark, backend)
    configs, seed = _configurations(spec), order_seed(benchmark)
    stopped = stopped or {}
    runs: list[Run] = []
    for round_, profile in rounds_of(spec, rounds):
        for c in configs if round_ is None else round_order(configs, seed, round_):
            if round_ and not profile and stopped.get(_key(c), round_) < round_:
                continue
            runs.append(
                Run(
                    name=run_name(benchmark.name, c.strategy.name, c.precision, c.nodes, c.gpus or c.workers,
                                  c.gpus > 0, None if profile else round_, profile),
                    index=len(runs),
                    strategy=c.strategy,
                    precision=c.precision,
                    scale=c.scale,
                    job_kind=job_kind_for(c.strategy.name, backend),
                    nodes=c.nodes,
                    procs_per_node=c.workers + c.strategy.servers // c.nodes,
                    world_size=c.nodes * c.workers,
                    devices_per_node=c.gpus,
                    ps_servers=c.strategy.servers,
                    benchmark=benchmark.name,
                    spec=spec,
                    repeat=None if profile else round_,
                    profile=profile,
                )
            )
    names = [run.name for run in runs]
    if len(set(names)) != len(names):  # cannot happen with the keys above; guard the contract anyway
        raise ValueError(f"run names collide: {names}")
    return runs


Key = tuple[str, str, int, int, int]  # strategy, precision, nodes, processes per node (servers included), GPUs/node


def _key(c: _Configuration) -> Key:
    return c.strategy.name, c.precision, c.nodes, c.workers + c.strategy.servers // c.nodes, c.gpus


def configuration_of(entry: Any) -> Key:
    """A run's configuration, from a planned Run or a status entry (RunStatus): what `stopped` is keyed by."""
    if isinstance(entry, Run):
        return entry.strategy.name, entry.precision, entry.nodes, entry.procs_per_node, entry.devices_per_node
    return entry.strategy, entry.precision, entry.nodes, entry.processes_per_node, entry.devices_per_node


def stopped_configurations(entries: Iterable[Any], rounds: int) -> dict[Key, int]:
    """From a sweep's runs (status entries or planned Runs): each configuration whose last decision round is
    before `rounds` (the rounds planned), with that last round: what `plan_runs(stopped=...)` needs to plan the
    same runs again."""
    last: dict[Key, int] = {}
    for entry in entries:
        if entry.repeat and not getattr(entry, "profile", False):
            key = configuration_of(entry)
            last[key] = max(last.get(key, 0), entry.repeat)
    return {key: round_ for key, round_ in last.items() if round_ < rounds}


def gpu_hours(runs: list[Run], seconds_per_run: float) -> float:
    """GPU-hours a sweep holds when each run holds its GPUs `seconds_per_run` (one after another or not: the
    sum is the same); with the run's activeDeadlineSeconds, the most it can hold (docs/clusters.md, README)."""
    return sum(run.gpus_held for run in runs) * seconds_per_run / 3600
