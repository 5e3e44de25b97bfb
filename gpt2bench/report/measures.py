"""What the analysis compares: scales, configurations (a run and its repeats), their figures with a mean and a
spread, cost per 1 M tokens and scaling efficiency. Pure functions of the results entries; every definition
is in docs/analysis.md.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gpt2bench.plan import PROFILE_SUFFIX
from gpt2bench.report.noise import Contrast, NoiseModel, Sample, estimate, ratio
from gpt2bench.status import SUCCEEDED, RunStatus

Metric = Callable[[RunStatus], "float | None"]


@dataclass(frozen=True, order=True)
class Scale:
    """Where a run trains: its devices (GPUs, or worker processes on CPU; parameter servers are not devices)
    and its nodes (pods). Runs at one scale train on the same global batch. Ordered smallest first."""

    devices: int
    nodes: int
    gpu: bool

    @property
    def label(self) -> str:
        """`2×4 GPU`: nodes × devices per node."""
        return f"{self.nodes}×{self.devices // max(self.nodes, 1)} {'GPU' if self.gpu else 'CPU'}"


def run_devices(run: RunStatus) -> int:
    """The entry's `devices`; for documents written before it existed: GPUs, else the workers of its results."""
    if run.devices:
        return run.devices
    if run.devices_per_node:
        return run.nodes * run.devices_per_node
    if run.results and run.results.world_size:
        return run.results.world_size
    return run.nodes * run.processes_per_node


def scale_of(run: RunStatus) -> Scale:
    return Scale(run_devices(run), run.nodes, bool(run.devices_per_node))


@dataclass(frozen=True)
class Stat:
    """A figure over a configuration's succeeded repeats: the mean, and the sample standard deviation as its
    spread (None below 2 measurements: the spread is unknown)."""

    mean: float
    spread: float | None
    n: int

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Stat | None:
        known = [float(v) for v in values if v is not None]
        if not known:
            return None
        return cls(statistics.fmean(known), statistics.stdev(known) if len(known) >= 2 else None, len(known))


def configuration_name(run: RunStatus) -> str:
    """The name a configuration's runs share: the run name without its `-r<k>` or `-prof` (plan.run_name keeps
    the suffix whole)."""
    for suffix in (f"-r{run.repeat}" if run.repeat else None, PROFILE_SUFFIX if run.profile else None):
        if suffix and run.name.endswith(suffix):
            return run.name[: -len(suffix)]
    return run.name


def _succeeded(runs: Iterable[RunStatus]) -> list[RunStatus]:
    return [run for run in runs if run.phase == SUCCEEDED and run.results is not None]


@dataclass
class Configuration:
    """One strategy × precision × scale, with every run of it: its repeats (the decision runs) and its
    breakdown run(s) (`profile`: timed with the step breakdown's hooks, never used in a decision)."""

    name: str
    strategy: str
    precision: str
    scale: Scale
    runs: list[RunStatus] = field(default_factory=list)
    profile_runs: list[RunStatus] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.strategy}-{self.precision}"

    @property
    def succeeded(self) -> list[RunStatus]:
        return _succeeded(self.runs)

    @property
    def not_succeeded(self) -> list[RunStatus]:
        return [run for run in self.runs if run not in self.succeeded]

    def values(self, metric: Metric) -> list[float]:
        """The figure of every succeeded repeat that has it."""
        return [float(v) for run in self.succeeded if (v := metric(run)) is not None]

    def stat(self, metric: Metric) -> Stat | None:
        return Stat.of(self.values(metric))

    def sample(self, metric: Metric) -> Sample:
        """The repeats' figure for ratios and noise, with the round of each: values ≤ 0 are not measurements and
        are left out (an energy counter that did not advance), pooled with the rest of its scale."""
        found = [(float(v), run.repeat) for run in self.succeeded if (v := metric(run)) is not None and v > 0]
        return Sample(self.name, self.scale.label, tuple(v for v, _ in found), tuple(r for _, r in found))

    @property
    def breakdown_runs(self) -> list[RunStatus]:
        """Where its step breakdown comes from: the breakdown round's runs, else (breakdown inline) its repeats."""
        return _succeeded(self.profile_runs) or self.succeeded

    def breakdown_stat(self, metric: Metric) -> Stat | None:
        return Stat.of(metric(run) for run in self.breakdown_runs)

    @property
    def per_rank(self) -> str | None:
        """CPU runs: `1 thread, 1 core per rank` (the repeats' most common), None on GPUs or when unknown.
        Runs compare only where these match (docs/metrics.md)."""
        if self.scale.gpu:
            return None
        found = [per_rank_label(run) for run in self.succeeded]
        known = [label for label in found if label]
        return max(dict.fromkeys(known), key=known.count) if known else None


def per_rank_label(run: RunStatus) -> str | None:
    figures = run.results
    if figures is None or figures.threads_per_rank is None or figures.cores_per_rank is None:
        return None
    threads, cores = figures.threads_per_rank, figures.cores_per_rank
    return f"{threads} thread{'s' if threads != 1 else ''}, {cores:.3g} core{'' if cores == 1 else 's'} per rank"


def noise_model(configs: Iterable[Configuration], metric: Metric) -> NoiseModel:
    """One figure's noise: per scale, pooled over its configurations' repeats, and a far noisier
    configuration's own (noise.estimate)."""
    return estimate(c.sample(metric) for c in configs)


def configurations(runs: Iterable[RunStatus]) -> list[Configuration]:
    """Runs grouped by (strategy, precision, scale), in the order their first run appears (plan order)."""
    grouped: dict[tuple[str, str, Scale], Configuration] = {}
    for run in runs:
        key = (run.strategy, run.precision, scale_of(run))
        if key not in grouped:
            grouped[key] = Configuration(configuration_name(run), run.strategy, run.precision, key[2])
        (grouped[key].profile_runs if run.profile else grouped[key].runs).append(run)
    return list(grouped.values())


def scales(configs: Iterable[Configuration]) -> list[Scale]:
    return sorted({c.scale for c in configs})


# ------------------------------------------------------------------ figures of one run
def result(name: str) -> Metric:
    """A figure of the run's `results` (docs/metrics.md)."""
    return lambda run: getattr(run.results, name, None) if run.results else None


tokens_per_second = result("tokens_per_second")
peak_memory = result("peak_memory_bytes")
train_seconds = result("train_seconds")
grad_norm = result("grad_norm")
final_loss = result("final_loss")
energy_per_million_tokens = result("energy_joules_per_million_tokens")
comm_hidden_ratio = result("comm_hidden_ratio")
# The step breakdown's parts (docs/metrics.md, Step breakdown): they add up to the step time.
BREAKDOWN_PARTS = (("data", "data_seconds_mean"), ("forward", "forward_seconds_mean"),
                   ("backward", "backward_seconds_mean"), ("optimizer", "optimizer_seconds_mean"),
                   ("other", "other_seconds_mean"), ("exposed communication", "comm_exposed_seconds_mean"))


# A run's measured steps whose second half is this much faster (or slower) than their first, beyond the steps'
# own noise (the interval excludes 1), are not steady: its tokens/s is of a machine still changing.
STEADY_TOLERANCE = 0.05


def unsteady(run: RunStatus) -> str | None:
    """Why a run's step time was not steady over its measured steps (docs/analysis.md, Steady state), or None:
    the second half's step time differs from the first half's by STEADY_TOLERANCE or more, beyond the noise."""
    figures = run.results
    if figures is None or None in (figures.step_time_halves_ratio, figures.step_time_halves_low,
                                   figures.step_time_halves_high):
        return None
    ratio_, low, high = figures.step_time_halves_ratio, figures.step_time_halves_low, figures.step_time_halves_high
    if abs(ratio_ - 1) < STEADY_TOLERANCE or low <= 1 <= high:
        return None
    how = "still warming up: its steps got faster" if ratio_ < 1 else "slowing down: its steps got slower"
    return (f"{how}, second half of the measured steps {ratio_ - 1:+.0%} [{low - 1:+.0%}, {high - 1:+.0%}] "
            "against the first")


def tokens_per_second_per_device(run: RunStatus) -> float | None:
    figures = run.results
    if figures is None:
        return None
    if figures.tokens_per_second_per_device is not None:
        return figures.tokens_per_second_per_device
    return figures.tokens_per_second / run_devices(run) if figures.tokens_per_second is not None else None


def memory_per_rank(run: RunStatus) -> tuple[float | None, str]:
    """The per-rank memory the FSDP claim is about: CUDA peak allocated on GPUs; on CPU the model state per
    rank, because a CPU's peak RSS is a process-wide high-water mark dominated by the libraries."""
    if run.devices_per_node:
        return peak_memory(run), "peak memory"
    figures = run.results
    if figures is not None and figures.state_bytes is not None:
        return figures.state_bytes, "model state"
    return peak_memory(run), "peak RSS"


# ------------------------------------------------------------------ cost
@dataclass(frozen=True)
class Prices:
    """`spec.cost`: what one GPU and one node (pod) cost per hour."""

    gpu_hour: float = 0.0
    node_hour: float = 0.0
    currency: str = "USD"

    @classmethod
    def from_spec(cls, spec: dict[str, Any] | None) -> Prices | None:
        cost = (spec or {}).get("cost")
        if not isinstance(cost, dict):
            return None
        return cls(float(cost.get("gpuHour") or 0), float(cost.get("nodeHour") or 0),
                   str(cost.get("currency") or "USD"))

    @property
    def unit(self) -> str:
        return f"{self.currency} per 1M tokens"

    def hourly(self, run: RunStatus) -> float | None:
        """Price per hour of what the run holds: every GPU of its pods and every pod (the MPIJob launcher, which
        trains nothing, is not counted). None when that is 0: the prices do not cover this run."""
        price = self.gpu_hour * run.nodes * run.devices_per_node + self.node_hour * run.nodes
        return price or None

    def per_million_tokens(self, run: RunStatus) -> float | None:
        """hourly price ÷ (tokens/s × 3600) × 10^6, at the measured (warm-up excluded) throughput."""
        price, tps = self.hourly(run), tokens_per_second(run)
        if price is None or not tps:
            return None
        return price / (tps * 3600) * 1e6


# ------------------------------------------------------------------ scaling efficiency
@dataclass(frozen=True)
class Efficiency:
    config: Configuration
    baseline: Configuration
    stat: Stat  # mean: the efficiency; spread: propagated from both configurations' spreads
    contrast: Contrast | None  # its log ratio with se and df from both scales' noise (None: noise unknown)
    refused: str | None = None  # why no scaling verdict may rest on it (CPU ranks with fewer cores each)


def baselines(configs: Iterable[Configuration]) -> dict[tuple[str, str], Configuration]:
    """Per (strategy, precision): its configuration at the smallest scale with a per-device throughput."""
    found: dict[tuple[str, str], Configuration] = {}
    for config in configs:
        if not config.sample(tokens_per_second_per_device).n:
            continue
        key = (config.strategy, config.precision)
        if key not in found or config.scale < found[key].scale:
            found[key] = config
    return found


def unequal_cores(config: Configuration, baseline: Configuration) -> str | None:
    """Why a CPU efficiency says nothing about scaling: its ranks had other resources than the baseline's. More
    processes in pods of a fixed CPU budget give each rank a smaller share (2 CPUs: 1 core per rank for 2
    ranks, 0.5 for 4), so per-device throughput falls about as 1/k by construction."""
    here, there = config.per_rank, baseline.per_rank
    if config.scale.gpu or here is None or there is None or here == there:
        return None
    return (f"not a scaling measurement: {config.label} {config.scale.label} ran at {here}, its baseline "
            f"{baseline.scale.label} at {there}; in pods of a fixed CPU budget more processes get fewer cores "
            "each, so per-device throughput falls by construction (give each pod cores in proportion to its "
            "processes)")


def efficiencies(configs: list[Configuration]) -> list[Efficiency]:
    """Scaling efficiency of every configuration whose strategy and precision also ran at a smaller scale:
    the geometric mean of its tokens/s per device ÷ the baseline's. Spread: efficiency × (the two coefficients of
    variation added), the first-order bound for a ratio; unknown when either side was measured once. Contrast:
    the same ratio on the log scale, within rounds where both ran in 3 or more (noise.ratio); `refused`
    where the CPU ranks had other cores each than the baseline's (unequal_cores)."""
    base = baselines(configs)
    found = []
    for config in configs:
        baseline = base.get((config.strategy, config.precision))
        if baseline is None or baseline is config:
            continue
        mine, theirs = config.sample(tokens_per_second_per_device), baseline.sample(tokens_per_second_per_device)
        if not mine.n or not theirs.n:
            continue
        here, there = config.stat(tokens_per_second_per_device), baseline.stat(tokens_per_second_per_device)
        value = mine.geometric_mean / theirs.geometric_mean
        spread = None
        if here.spread is not None and there.spread is not None:
            spread = value * (here.spread / here.mean + there.spread / there.mean)
        contrast = ratio([mine], [theirs])
        found.append(Efficiency(config, baseline, Stat(value, spread, here.n), contrast,
                                unequal_cores(config, baseline)))
    return found


def run_efficiency(run: RunStatus, configs: list[Configuration]) -> float | None:
    """One run's tokens/s per device ÷ its baseline configuration's geometric mean (the CSV's per-run figure;
    their geometric mean over a configuration's repeats is the configuration's efficiency)."""
    baseline = baselines(configs).get((run.strategy, run.precision))
    value = tokens_per_second_per_device(run)
    if baseline is None or baseline.scale == scale_of(run) or not value or value <= 0:
        return None
    theirs = baseline.sample(tokens_per_second_per_device)
    return value / theirs.geometric_mean if theirs.n else None


def hardware(runs: Iterable[RunStatus]) -> str:
    """What the succeeded runs trained on, from their `deviceName`: `NVIDIA H100 80GB HBM3`, `AMD EPYC (CPU)`."""
    names = dict.fromkeys(
        f"{run.results.device_name}{'' if run.devices_per_node else ' (CPU)'}"
        for run in runs if run.phase == SUCCEEDED and run.results and run.results.device_name
    )
    return " / ".join(names) or "device not reported"
