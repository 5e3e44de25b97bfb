"""Variants of the CPU example's runs, measured in interleaved rounds through `gpt2bench run`'s own sweep.

Each round runs every variant's runs once, in an order shuffled per round (seeded), so that a drift of the
machine hits every variant alike; variants are compared by their within-round ratios (paired: what a round
shares cancels), with a t interval over rounds (docs/analysis.md, Rounds as blocks). Shared by
bench_horovod_cpu.py and bench_run_length.py.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from gpt2bench.local import sweep as local_sweep
from gpt2bench.plan import Run, plan_runs
from gpt2bench.render import render_job
from gpt2bench.report.measures import tokens_per_second, unsteady
from gpt2bench.report.noise import Interval, mean_contrast
from gpt2bench.specification.model import Benchmark
from gpt2bench.specification.validation import load_benchmark
from gpt2bench.status import SUCCEEDED, RunStatus

EXAMPLE = Path(__file__).resolve().parents[1] / "manifests" / "examples" / "cpu-sweep.yaml"
Variant = tuple[Benchmark, Run, dict[str, Any]]  # a planned run and its rendered job


def fixed_rounds(sweep: dict[str, Any], repeats: int) -> None:
    """The example's sweep (as YAML) set to exactly `repeats` rounds with no breakdown round: its
    repeat-until-decided fields, which would add rounds of their own, dropped."""
    sweep |= {"repeats": repeats, "breakdown": "off"}
    for key in ("maxRepeats", "minEffect", "budget"):
        sweep.pop(key, None)


def example(strategies: tuple[str, ...], steps: int | None = None, warmup: int | None = None) -> tuple[Benchmark,
                                                                                                        list[Run]]:
    """The CPU example's fp32 runs of `strategies`, one round, no breakdown hooks (they would time another
    loop), `steps` and `warmup` overridden where given."""
    document = yaml.safe_load(EXAMPLE.read_text())
    document["spec"]["sweep"] |= {"precisions": ["fp32"], "strategies": [
        s for s in document["spec"]["sweep"]["strategies"] if s["name"] in strategies]}
    fixed_rounds(document["spec"]["sweep"], 1)  # this script adds the rounds, not the sweep's own rule
    training = document["spec"]["training"]
    if steps:
        training["steps"] = steps
    if warmup is not None:
        training["warmupSteps"] = warmup
    training["warmupSteps"] = min(training.get("warmupSteps", 0), training["steps"] - 1)
    benchmark = load_benchmark(document)
    return benchmark, plan_runs(benchmark)


def renamed(variant: Variant, suffix: str) -> Variant:
    """The run and its job under `<run>-<suffix>` (every run of a round needs its own name and folder)."""
    benchmark, run, job = variant
    name = f"{run.name}-{suffix}"
    job = copy.deepcopy(job)
    job["metadata"]["name"] = name
    return benchmark, dataclasses.replace(run, name=name), job


def with_env(job: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """An MPIJob whose launcher (hence mpirun, hence every rank: `-x NAME`) has `env` set."""
    job = copy.deepcopy(job)
    for spec in job["spec"]["mpiReplicaSpecs"].values():
        for container in spec["template"]["spec"]["containers"]:
            container.setdefault("env", []).extend({"name": k, "value": v} for k, v in env.items())
            command = container.get("command") or []
            if "mpirun" in command:
                at = command.index("mpirun") + 1
                container["command"] = command[:at] + [a for k in env for a in ("-x", k)] + command[at:]
    return job


def rendered(benchmark: Benchmark, run: Run) -> Variant:
    return benchmark, run, render_job(benchmark, run)


def run_rounds(variants: dict[str, list[Variant]], rounds: int, seed: int, directory: Path,
               log: Callable[[str], None] = print) -> dict[str, dict[int, RunStatus]]:
    """Every variant's runs once per round, shuffled per round with random.Random(seed + round); returns
    label -> round -> the run's entry (one run per variant and round: a variant is one configuration)."""
    found: dict[str, dict[int, RunStatus]] = {label: {} for label in variants}
    for round_ in range(1, rounds + 1):
        items = [(label, renamed(v, f"{label}-r{round_}")) for label, runs in variants.items() for v in runs]
        random.Random(seed + round_).shuffle(items)
        log(f"round {round_}/{rounds}: " + ", ".join(label for label, _ in items))
        benchmark = items[0][1][0]
        doc = local_sweep.run_sweep(benchmark, [run for _, (_, run, _) in items], directory / f"round-{round_}",
                                    jobs=[job for _, (_, _, job) in items], live=False).doc
        for (label, _), entry in zip(items, doc.runs):
            found[label][round_] = entry
    return found


def paired_ratio(a: dict[int, RunStatus], b: dict[int, RunStatus]) -> Interval | None:
    """a ÷ b tokens/s: the geometric mean of the within-round ratios over the rounds where both succeeded, with
    the 95 % t interval of the mean log ratio (None below 2 such rounds)."""
    logs = [math.log(tokens_per_second(a[k]) / tokens_per_second(b[k])) for k in sorted(set(a) & set(b))
            if _ok(a[k]) and _ok(b[k])]
    contrast = mean_contrast(logs)
    return dataclasses.replace(contrast, log=True).interval() if contrast else None


def _ok(entry: RunStatus) -> bool:
    return entry.phase == SUCCEEDED and bool(tokens_per_second(entry))


def unsteady_share(entries: dict[int, RunStatus]) -> str:
    flagged = sum(bool(unsteady(e)) for e in entries.values() if _ok(e))
    return f"{flagged}/{sum(_ok(e) for e in entries.values())}"


def geometric_mean_tps(entries: dict[int, RunStatus]) -> float | None:
    values = [tokens_per_second(e) for e in entries.values() if _ok(e)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None
