"""The strategies a sweep compares: one row each, with the traits the rest of the project reads.

The spec's enum and its per-strategy rules (gpt2bench.specification.model), the processes and devices a run
uses (gpt2bench.plan), the job kind, runtime and replicated jobs it becomes (gpt2bench.jobkinds,
gpt2bench.render) and the trainer's class (gpt2bench.trainer.parallel) all come from this table: code asks a
strategy's traits (`traits(name).launcher == "mpirun"`), never its name. What is said about a strategy by name is
what a paper claims of it (gpt2bench.report.findings). Adding one: docs/design.md, Adding a strategy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# How a run's processes are started: torchrun (a PyTorchJob; the Trainer's torch runtime, `node` pods only), or
# mpirun (an MPIJob; the Trainer's MPI runtimes: a `launcher` pod running mpirun over sshd `node` pods).
Launcher = Literal["torchrun", "mpirun"]
# What a run uses of its scale: `scale` every node, process and device of it; `node` one process driving every
# device of one node (a scale of several nodes is refused); `device` one process on one device at most, planned
# on one node whatever the scale (the baseline a sweep's other scales are compared with).
Footprint = Literal["scale", "node", "device"]


@dataclass(frozen=True)
class Strategy:
    name: str  # as in the spec (`spec.sweep.strategies[].name`) and on the trainer's command line
    trainer: str  # its trainer class, "module:Class" under gpt2bench.trainer.parallel
    launcher: Launcher = "torchrun"
    footprint: Footprint = "scale"
    # Parameter-server processes it adds when psServers is not given (0: a strategy without servers), and the
    # fewest psServers may ask for.
    servers: int = 0
    min_servers: int = 1
    # The spec's options (StrategySpec fields, snake_case) only this strategy and the others naming them may set.
    options: tuple[str, ...] = ()
    # What the docs say of it: the README's and docs/strategies.md's strategy tables are written from these
    # (scripts/docs_tables.py, `make generate`; a test diffs them).
    paper: str = field(default="", kw_only=True)  # the papers' name for it
    runs: str = field(default="", kw_only=True)  # what runs, in a line
    processes: str = field(default="", kw_only=True)
    holds: str = field(default="", kw_only=True)  # who holds which state
    exchange: str = field(default="", kw_only=True)  # how gradients (or parameters) travel

    @property
    def one_process(self) -> bool:
        """One training process per run, whatever the scale's processesPerNode."""
        return self.footprint != "scale"


STRATEGY_TABLE: tuple[Strategy, ...] = (
    Strategy("single", "base:Parallelism", footprint="device",
             paper='Bai 2022 "Single GPU"; Patwardhan 2024 "single"', runs="one process, one device",
             processes="1", holds="everything", exchange="none"),
    Strategy("dataparallel", "dataparallel:DataParallelism", footprint="node",
             paper='Bai 2022 "single parameter server"',
             runs="`torch.nn.DataParallel` over a node's GPUs, one process", processes="1 per node, all its GPUs",
             holds="GPU 0 holds the master copy; the model is replicated to every GPU each step",
             exchange="scatter inputs, gather outputs, reduce gradients onto GPU 0 (in one process)"),
    Strategy("ddp", "ddp:DDPParallelism", options=("bucket_cap_mb", "static_graph", "gradient_as_bucket_view"),
             paper='Bai 2022 "distributed parameter server"; Patwardhan 2024 "DDP"; Li 2020',
             runs="`DistributedDataParallel` (bucket size, `no_sync` accumulation, static graph, grads as bucket "
                  "views)",
             processes="1 per device", holds="every rank a full replica and optimizer",
             exchange="bucketed all-reduce overlapped with backward"),
    Strategy("fsdp", "fsdp:FSDPParallelism", options=("reshard_after_forward",),
             paper='Patwardhan 2024 "FSDP"',
             runs="FSDP2 `fully_shard` per transformer block + root, `MixedPrecisionPolicy`",
             processes="1 per device", holds="1/N of every parameter, gradient and optimizer state",
             exchange="all-gather parameters per block, reduce-scatter gradients"),
    Strategy("horovod", "horovod:HorovodParallelism", launcher="mpirun",
             paper='Bai 2022 "Horovod"', runs="Horovod `DistributedOptimizer` under `mpirun` (an MPIJob)",
             processes="1 per device (horovodrun / mpirun)", holds="every rank a full replica and optimizer",
             exchange="Horovod ring all-reduce from backward hooks"),
    Strategy("ps", "ps:ParameterServerParallelism", servers=1, options=("ps_servers", "ps_mode", "ps_server_device"),
             paper="(a literal parameter server)",
             runs="servers own the parameters and AdamW; workers push gradients, pull parameters; sync or async",
             processes="1 server + N workers",
             holds="the server: parameters + AdamW; workers: a replica to compute gradients",
             exchange="workers push gradients, pull parameters"),
    Strategy("ps-sharded", "ps:ShardedParameterServerParallelism", servers=2, min_servers=2,
             options=("ps_servers", "ps_mode", "ps_server_device"),
             paper="(the same, sharded)", runs="`ps` with the flat parameter vector split over S servers",
             processes="S servers + N workers", holds="each server 1/S of the flat parameter vector + its AdamW state",
             exchange="push/pull per shard"),
)

STRATEGIES: tuple[str, ...] = tuple(strategy.name for strategy in STRATEGY_TABLE)
_BY_NAME = {strategy.name: strategy for strategy in STRATEGY_TABLE}


def traits(name: str) -> Strategy:
    """The row of a strategy; KeyError naming the known ones for any other name."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}") from None


def with_servers() -> tuple[Strategy, ...]:
    """The strategies that run parameter servers, in table order."""
    return tuple(strategy for strategy in STRATEGY_TABLE if strategy.servers)


def option_owners() -> dict[str, tuple[str, ...]]:
    """Each strategy option (snake_case) -> the strategies that may set it, in table order."""
    owners: dict[str, tuple[str, ...]] = {}
    for strategy in STRATEGY_TABLE:
        for option in strategy.options:
            owners[option] = (*owners.get(option, ()), strategy.name)
    return owners
