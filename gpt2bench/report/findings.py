"""The papers' claims, checked on this sweep: each claim compares configurations that differ in the compared
thing alone (same precision and scale unless the claim is about them), and says which figures it rests on.

Each comparison is a ratio with its confidence interval (noise.py), checked against the claim's threshold:
the claim holds for it when the whole interval lies on the claim's side, fails when the whole interval lies
on the other side, and is undecided when the interval crosses the threshold. The intervals of one claim are
Bonferroni-corrected over its comparisons. Verdicts: does-not-hold (some comparison fails), needs-repeats
(single measurements: no interval, not decided), inconclusive (some interval crosses), holds (every
comparison holds), not-measurable (the sweep has no such comparison: `measured` says what is missing).
Definitions: docs/analysis.md.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpt2bench.report.measures import (
    Configuration,
    Efficiency,
    comm_hidden_ratio,
    final_loss,
    memory_per_rank,
    noise,
    scales,
    tokens_per_second,
    tokens_per_second_per_device,
)
from gpt2bench.report.noise import (
    Interval,
    Noise,
    family_confidence,
    mean_interval,
    product_of_means,
    ratio_interval,
)
from gpt2bench.status import Finding, RunStatus

NEAR_LINEAR = 0.9  # scaling efficiency that counts as near-linear (Li 2020's DDP stays above it)
MOSTLY_HIDDEN = 0.5  # share of DDP's all-reduce time hidden behind backward that counts as "most" (Li 2020)
LOSS_TOLERANCE = 0.01  # largest relative loss gap between synchronous strategies that counts as agreeing
MIXED = ("fp16", "bf16")
MAX_MEASURED = 900  # characters of figures per finding: the CR status stays small

BAI = "Bai et al. 2022 (arXiv 2206.06356)"
PATWARDHAN = "Patwardhan et al. 2024 (arXiv 2405.15628)"
LI = "Li et al. 2020 (arXiv 2006.15704)"
Curves = dict[str, list[dict[str, Any]]]


@dataclass
class Check:
    """One comparison of a claim: a ratio (or a loss gap) whose interval at a given confidence is
    `interval(confidence)`, held against `threshold`; the claim wants it `above` (or below) the threshold."""

    label: str  # what is compared: "ddp 1×2 CPU: bf16 vs fp32 tokens/s"
    interval: Callable[[float], Interval | None]
    estimate: float  # the point estimate, shown when there is no interval
    threshold: float = 1.0
    above: bool = True
    show: Callable[[float], str] = field(default=lambda ratio: f"{ratio - 1:+.1%}")
    basis: str | None = None  # what the figure rests on, appended in brackets


    def outcome(self, interval: Interval | None) -> str:
        """holds, fails, across (the interval crosses the threshold) or unknown (no interval)."""
        if interval is None:
            return "unknown"
        side = interval.side(self.threshold)
        if side == "across":
            return "across"
        return "holds" if (side == "above") == self.above else "fails"

    def text(self, interval: Interval | None) -> str:
        basis = f" ({self.basis})" if self.basis else ""
        if interval is None:
            return f"{self.label}: {self.show(self.estimate)} (single measurement{', ' + self.basis if basis else ''})"
        shown = f"{self.show(interval.estimate)} [{self.show(interval.low)}, {self.show(interval.high)}]"
        return f"{self.label}: {shown}{basis}"


def ratio_check(label: str, numerator: list[list[float]], denominator: list[list[float]], sweep_noise: Noise,
                threshold: float = 1.0, above: bool = True, show: Callable[[float], str] | None = None) -> Check:
    """A claim about Π means(numerator) ÷ Π means(denominator) (each list: configurations' repeat values)."""
    estimate = product_of_means(numerator) / product_of_means(denominator)
    check = Check(label, lambda confidence: ratio_interval(numerator, denominator, sweep_noise, confidence),
                  estimate, threshold, above)
    if show is not None:
        check.show = show
    return check


def finding(id_: str, claim: str, source: str, checks: list[Check], missing: str,
            extra: list[str] | None = None) -> Finding:
    """The verdict of a claim from its comparisons, each at the Bonferroni-corrected confidence."""
    base = {"id": id_, "claim": claim, "source": source}
    if not checks:
        return Finding(verdict="not-measurable", measured=missing, **base)
    confidence = family_confidence(len(checks))
    intervals = [check.interval(confidence) for check in checks]
    outcomes = [check.outcome(interval) for check, interval in zip(checks, intervals)]
    if "fails" in outcomes:
        verdict, deciding = "does-not-hold", outcomes.index("fails")
    elif "unknown" in outcomes:
        verdict, deciding = "needs-repeats", None
    elif "across" in outcomes:
        verdict, deciding = "inconclusive", outcomes.index("across")
    else:
        verdict, deciding = "holds", min(range(len(checks)), key=lambda i: _slack(checks[i], intervals[i]))
    parts = [check.text(interval) for check, interval in zip(checks, intervals)] + (extra or [])
    measured = "; ".join(parts)
    if len(measured) > MAX_MEASURED:
        measured = measured[: MAX_MEASURED - 3] + "..."
    if deciding is None:
        return Finding(verdict=verdict, measured=measured, **base)
    chosen, interval = checks[deciding], intervals[deciding]
    return Finding(verdict=verdict, measured=measured, deciding=chosen.label, estimate=interval.estimate,
                   low=interval.low, high=interval.high, threshold=chosen.threshold, confidence=confidence, **base)


def _slack(check: Check, interval: Interval) -> float:
    """How far a holding comparison's interval stays from the threshold (smallest: the one that decides)."""
    return interval.low - check.threshold if check.above else check.threshold - interval.high


def _find(configs: list[Configuration], strategy: str, precision: str, scale: Any) -> Configuration | None:
    return next((c for c in configs if (c.strategy, c.precision, c.scale) == (strategy, precision, scale)), None)


def _mib(value: float) -> str:
    return f"{value / 2**20:,.1f} MiB"


def _tps(value: float) -> str:
    return f"{value:,.0f}"


# ------------------------------------------------------------------ the claims
def _rank_memory(run: RunStatus) -> float | None:
    return memory_per_rank(run)[0]


def fsdp_memory(configs: list[Configuration]) -> Finding:
    memory_noise = noise(configs, _rank_memory)
    checks = []
    for fsdp in (c for c in configs if c.strategy == "fsdp" and c.scale.devices >= 2):
        ddp = _find(configs, "ddp", fsdp.precision, fsdp.scale)
        a, b = fsdp.values(_rank_memory), ddp.values(_rank_memory) if ddp else []
        if not a or not b:
            continue
        kind = memory_per_rank(fsdp.succeeded[0])[1]
        label = (f"{fsdp.precision} {fsdp.scale.label}: fsdp {_mib(statistics.fmean(a))} vs ddp "
                 f"{_mib(statistics.fmean(b))} {kind} per rank")
        checks.append(ratio_check(label, [a], [b], memory_noise, above=False))
    return finding("fsdp-memory-below-ddp", "FSDP's per-rank memory is below DDP's", PATWARDHAN, checks,
                   "needs fsdp and ddp succeeded at the same precision and scale with 2 or more devices")


def mixed_precision_faster(configs: list[Configuration]) -> Finding:
    throughput = noise(configs, tokens_per_second)
    checks = []
    for mixed in (c for c in configs if c.precision in MIXED):
        fp32 = _find(configs, mixed.strategy, "fp32", mixed.scale)
        a, b = mixed.values(tokens_per_second), fp32.values(tokens_per_second) if fp32 else []
        if not a or not b:
            continue
        label = (f"{mixed.strategy} {mixed.scale.label}: {mixed.precision} {_tps(statistics.fmean(a))} vs fp32 "
                 f"{_tps(statistics.fmean(b))} tokens/s")
        checks.append(ratio_check(label, [a], [b], throughput))
    return finding("mixed-precision-faster", "Mixed precision (fp16/bf16) trains faster than fp32, for every "
                   "strategy", f"{BAI}, with Apex", checks,
                   "needs a strategy succeeded in fp32 and in fp16 or bf16 at the same scale")


def _fastest(configs: list[Configuration]) -> Configuration | None:
    measured = [c for c in configs if c.values(tokens_per_second)]
    return max(measured, key=lambda c: statistics.fmean(c.values(tokens_per_second)), default=None)


def ddp_mixed_precision_best_on_one_node(configs: list[Configuration]) -> Finding:
    throughput = noise(configs, tokens_per_second)
    checks = []
    for scale in (s for s in scales(configs) if s.nodes == 1 and s.devices >= 2):
        here = [c for c in configs if c.scale == scale]
        ddp = _fastest([c for c in here if c.strategy == "ddp" and c.precision in MIXED])
        other = _fastest([c for c in here if not (c.strategy == "ddp" and c.precision in MIXED)])
        if ddp is None or other is None:
            continue
        a, b = ddp.values(tokens_per_second), other.values(tokens_per_second)
        label = (f"{scale.label}: {ddp.label} {_tps(statistics.fmean(a))} vs the fastest other, {other.label}, "
                 f"{_tps(statistics.fmean(b))} tokens/s")
        checks.append(ratio_check(label, [a], [b], throughput))
    return finding("ddp-mixed-precision-fastest-on-one-node", "On one node, DDP with mixed precision is the fastest "
                   "configuration", BAI, checks,
                   "needs ddp in fp16 or bf16 and another configuration succeeded on one node with 2 or more devices")


def horovod_most_robust_across_nodes(configs: list[Configuration], effs: list[Efficiency]) -> Finding:
    per_device = noise(configs, tokens_per_second_per_device)
    checks = []
    for hvd in (e for e in effs if e.config.strategy == "horovod" and e.config.scale.nodes >= 2
                and e.baseline.scale.nodes == 1):
        rivals = [e for e in effs if e.config.strategy != "horovod" and e.config.scale == hvd.config.scale
                  and e.config.precision == hvd.config.precision and e.baseline.scale == hvd.baseline.scale]
        if not rivals:
            continue
        rival = max(rivals, key=lambda e: e.stat.mean)
        label = (f"{hvd.config.precision} {hvd.baseline.scale.label} → {hvd.config.scale.label}: scaling efficiency "
                 f"horovod {hvd.stat.mean:.2f} vs the best other, {rival.config.strategy}, {rival.stat.mean:.2f}")
        values = [e.values(tokens_per_second_per_device) for e in (hvd.config, rival.baseline)]
        against = [e.values(tokens_per_second_per_device) for e in (hvd.baseline, rival.config)]
        checks.append(ratio_check(label, values, against, per_device))
    return finding("horovod-most-robust-across-nodes", "Across nodes, Horovod keeps the highest scaling efficiency",
                   BAI, checks, "needs horovod and another strategy succeeded at the same precision on one node and "
                   "at the same scale of 2 or more nodes")


def _loss_curve(run: RunStatus, curves: Curves | None) -> dict[int, float] | None:
    records = (curves or {}).get(run.name)
    if not records:
        return None
    curve = {r["step"]: float(r["loss"]) for r in records
             if isinstance(r.get("step"), int) and isinstance(r.get("loss"), (int, float))}
    return curve or None


def _gap(a: float, b: float) -> float:
    return abs(a - b) / ((abs(a) + abs(b)) / 2) if a or b else 0.0


def _run_gap(run: RunStatus, reference: RunStatus, curves: Curves | None) -> tuple[float, bool]:
    """Largest relative loss gap between two runs over their common steps, else of their final losses;
    True when per-step curves were compared."""
    mine, theirs = _loss_curve(run, curves), _loss_curve(reference, curves)
    steps = set(mine) & set(theirs) if mine and theirs else set()
    if steps:
        return max(_gap(mine[s], theirs[s]) for s in steps), True
    return _gap(final_loss(run), final_loss(reference)), False


def _gap_check(config: Configuration, reference: Configuration, curves: Curves | None) -> Check | None:
    """Each repeat against the reference's repeat of the same number (the same data and seed)."""
    theirs = {run.repeat: run for run in reference.succeeded if final_loss(run) is not None}
    pairs = [_run_gap(run, theirs[run.repeat], curves) for run in config.succeeded
             if run.repeat in theirs and final_loss(run) is not None]
    if not pairs:
        return None
    gaps = [gap for gap, _ in pairs]
    basis = "loss per step" if all(per_step for _, per_step in pairs) else "final loss: no per-step records"
    label = f"{config.label} vs {reference.label} {config.scale.label}: largest loss gap"
    repeats = f"{len(gaps)} repeats" if len(gaps) > 1 else "1 measurement"
    return Check(label, lambda confidence: mean_interval(gaps, confidence), statistics.fmean(gaps),
                 threshold=LOSS_TOLERANCE, above=False, show=lambda gap: f"{gap:.3%}", basis=f"{basis}, {repeats}")


def synchronous_strategies_agree(configs: list[Configuration], spec: dict[str, Any],
                                 curves: Curves | None) -> Finding:
    asynchronous = {s.get("name") for s in (spec.get("sweep") or {}).get("strategies") or []
                    if s.get("psMode") == "async"}
    groups: dict[tuple, list[Configuration]] = {}
    for config in configs:
        if config.strategy not in asynchronous and config.values(final_loss):
            groups.setdefault((config.scale, config.precision), []).append(config)
    checks = []
    for group in groups.values():
        reference = group[0]  # one precision recipe for every strategy (docs/strategies.md)
        checks += [check for config in group[1:] if (check := _gap_check(config, reference, curves))]
    extra = [f"{', '.join(sorted(asynchronous))} in async mode left out: not synchronous"] if asynchronous else []
    return finding("synchronous-strategies-converge-alike", "Synchronous strategies follow the same loss curve at "
                   "equal global batch", f"{PATWARDHAN}; {LI}", checks,
                   "needs two synchronous strategies succeeded at the same precision and scale", extra)


def ddp_scales_near_linearly(configs: list[Configuration], effs: list[Efficiency]) -> Finding:
    per_device = noise(configs, tokens_per_second_per_device)
    checks = []
    for eff in (e for e in effs if e.config.strategy == "ddp"):
        label = f"{eff.config.precision} {eff.baseline.scale.label} → {eff.config.scale.label}: scaling efficiency"
        checks.append(ratio_check(label, [eff.config.values(tokens_per_second_per_device)],
                                  [eff.baseline.values(tokens_per_second_per_device)], per_device,
                                  threshold=NEAR_LINEAR, show=lambda ratio: f"{ratio:.2f}"))
    return finding("ddp-scales-near-linearly", f"DDP scales near-linearly (scaling efficiency ≥ {NEAR_LINEAR})", LI,
                   checks, "needs ddp succeeded at two scales of the same precision")


def ddp_overlap_hides_communication(configs: list[Configuration]) -> Finding:
    """Per ddp configuration with 2+ devices and a breakdown: the mean hidden share of its communication
    (1 − exposed ÷ total, per run) against 1/2, with the repeats' t interval."""
    checks = []
    for config in (c for c in configs if c.strategy == "ddp" and c.scale.devices >= 2):
        hidden = config.values(comm_hidden_ratio)
        if not hidden:
            continue
        label = f"{config.precision} {config.scale.label}: share of all-reduce time hidden by backward"
        checks.append(Check(label, lambda confidence, h=hidden: mean_interval(h, confidence), statistics.fmean(hidden),
                            threshold=MOSTLY_HIDDEN, show=lambda share: f"{share:.0%}"))
    return finding("ddp-overlap-hides-communication", "DDP's bucketed all-reduce overlaps the backward pass and "
                   f"hides most (over {MOSTLY_HIDDEN:.0%}) of its communication time", LI, checks,
                   "needs ddp succeeded with 2 or more devices and a step breakdown (trainer option --breakdown)")


def check_all(configs: list[Configuration], effs: list[Efficiency], spec: dict[str, Any],
              curves: Curves | None) -> list[Finding]:
    return [
        fsdp_memory(configs),
        mixed_precision_faster(configs),
        ddp_mixed_precision_best_on_one_node(configs),
        horovod_most_robust_across_nodes(configs, effs),
        synchronous_strategies_agree(configs, spec, curves),
        ddp_scales_near_linearly(configs, effs),
        ddp_overlap_hides_communication(configs),
    ]
