"""The papers' claims, checked on this sweep: each claim compares configurations that differ in the compared
thing alone (same precision and scale unless the claim is about them), and says which figures it rests on.

Verdicts: holds; does-not-hold (at least one comparison contradicts it beyond the noise); inconclusive (none
contradicts it, but some difference is within the spread of the repeats); not-measurable (the sweep has no
such comparison: `measured` says what is missing). Definitions: docs/analysis.md.
"""

from __future__ import annotations

from typing import Any

from gpt2bench.report.measures import (
    Configuration,
    Efficiency,
    Stat,
    final_loss,
    memory_per_rank,
    scales,
    tokens_per_second,
)
from gpt2bench.status import Finding, RunStatus

NEAR_LINEAR = 0.9  # scaling efficiency that counts as near-linear (Li 2020's DDP stays above it)
LOSS_TOLERANCE = 0.01  # largest relative loss gap between synchronous strategies that counts as agreeing
MIXED = ("fp16", "bf16")
MAX_MEASURED = 900  # characters of figures per finding: the CR status stays small

BAI = "Bai et al. 2022 (arXiv 2206.06356)"
PATWARDHAN = "Patwardhan et al. 2024 (arXiv 2405.15628)"
LI = "Li et al. 2020 (arXiv 2006.15704)"
Curves = dict[str, list[dict[str, Any]]]


def beats(a: Stat, b: Stat, higher_is_better: bool) -> str:
    """Does `a` beat `b`? "holds", "fails", or "noise" when both spreads are known and the difference is
    within their sum (the same rule as a recommendation's no-clear-winner)."""
    difference = a.mean - b.mean if higher_is_better else b.mean - a.mean
    if a.spread is not None and b.spread is not None and abs(difference) <= a.spread + b.spread:
        return "noise"
    return "holds" if difference > 0 else "fails"


def verdict(outcomes: list[str]) -> str:
    if not outcomes:
        return "not-measurable"
    if "fails" in outcomes:
        return "does-not-hold"
    return "inconclusive" if "noise" in outcomes else "holds"


def finding(id_: str, claim: str, source: str, outcomes: list[str], parts: list[str], missing: str,
            single: bool = False) -> Finding:
    measured = "; ".join(parts) if parts else missing
    if parts and single:
        measured += " (some single measurements: spread unknown)"
    if len(measured) > MAX_MEASURED:
        measured = measured[: MAX_MEASURED - 3] + "..."
    return Finding(id=id_, claim=claim, source=source, verdict=verdict(outcomes), measured=measured)


def _find(configs: list[Configuration], strategy: str, precision: str, scale: Any) -> Configuration | None:
    return next((c for c in configs if (c.strategy, c.precision, c.scale) == (strategy, precision, scale)), None)


def _single(*stats: Stat) -> bool:
    return any(s.spread is None for s in stats)


def _pct(ratio: float) -> str:
    return f"{ratio - 1:+.1%}"


def _mib(value: float) -> str:
    return f"{value / 2**20:,.1f} MiB"


def _tps(value: float) -> str:
    return f"{value:,.0f}"


# ------------------------------------------------------------------ the claims
def fsdp_memory(configs: list[Configuration]) -> Finding:
    outcomes, parts, single = [], [], False

    def metric(run: RunStatus) -> float | None:
        return memory_per_rank(run)[0]

    for fsdp in (c for c in configs if c.strategy == "fsdp" and c.scale.devices >= 2):
        ddp = _find(configs, "ddp", fsdp.precision, fsdp.scale)
        a, b = fsdp.stat(metric), ddp.stat(metric) if ddp else None
        if a is None or b is None:
            continue
        kind = memory_per_rank(fsdp.succeeded[0])[1]
        outcomes.append(beats(a, b, higher_is_better=False))
        parts.append(f"{fsdp.precision} {fsdp.scale.label}: fsdp {_mib(a.mean)} vs ddp {_mib(b.mean)} {kind} per "
                     f"rank ({_pct(a.mean / b.mean)})")
        single |= _single(a, b)
    return finding("fsdp-memory-below-ddp", "FSDP's per-rank memory is below DDP's", PATWARDHAN, outcomes, parts,
                   "needs fsdp and ddp succeeded at the same precision and scale with 2 or more devices", single)


def mixed_precision_faster(configs: list[Configuration]) -> Finding:
    outcomes, parts, single = [], [], False
    for mixed in (c for c in configs if c.precision in MIXED):
        fp32 = _find(configs, mixed.strategy, "fp32", mixed.scale)
        a, b = mixed.stat(tokens_per_second), fp32.stat(tokens_per_second) if fp32 else None
        if a is None or b is None:
            continue
        outcomes.append(beats(a, b, higher_is_better=True))
        parts.append(f"{mixed.strategy} {mixed.scale.label}: {mixed.precision} {_tps(a.mean)} vs fp32 "
                     f"{_tps(b.mean)} tokens/s ({_pct(a.mean / b.mean)})")
        single |= _single(a, b)
    return finding("mixed-precision-faster", "Mixed precision (fp16/bf16) trains faster than fp32, for every "
                   "strategy", f"{BAI}, with Apex", outcomes, parts,
                   "needs a strategy succeeded in fp32 and in fp16 or bf16 at the same scale", single)


def _best(configs: list[Configuration]) -> tuple[Configuration, Stat] | None:
    measured = [(c, s) for c in configs if (s := c.stat(tokens_per_second)) is not None]
    return max(measured, key=lambda pair: pair[1].mean, default=None)


def ddp_mixed_precision_best_on_one_node(configs: list[Configuration]) -> Finding:
    outcomes, parts, single = [], [], False
    for scale in (s for s in scales(configs) if s.nodes == 1 and s.devices >= 2):
        here = [c for c in configs if c.scale == scale]
        ddp = _best([c for c in here if c.strategy == "ddp" and c.precision in MIXED])
        other = _best([c for c in here if not (c.strategy == "ddp" and c.precision in MIXED)])
        if ddp is None or other is None:
            continue
        outcomes.append(beats(ddp[1], other[1], higher_is_better=True))
        parts.append(f"{scale.label}: {ddp[0].label} {_tps(ddp[1].mean)} vs the fastest other, {other[0].label}, "
                     f"{_tps(other[1].mean)} tokens/s ({_pct(ddp[1].mean / other[1].mean)})")
        single |= _single(ddp[1], other[1])
    return finding("ddp-mixed-precision-fastest-on-one-node", "On one node, DDP with mixed precision is the fastest "
                   "configuration", BAI, outcomes, parts,
                   "needs ddp in fp16 or bf16 and another configuration succeeded on one node with 2 or more devices",
                   single)


def horovod_most_robust_across_nodes(effs: list[Efficiency]) -> Finding:
    outcomes, parts, single = [], [], False
    for hvd in (e for e in effs if e.config.strategy == "horovod" and e.config.scale.nodes >= 2
                and e.baseline.scale.nodes == 1):
        rivals = [e for e in effs if e.config.strategy != "horovod" and e.config.scale == hvd.config.scale
                  and e.config.precision == hvd.config.precision and e.baseline.scale == hvd.baseline.scale]
        if not rivals:
            continue
        rival = max(rivals, key=lambda e: e.stat.mean)
        outcomes.append(beats(hvd.stat, rival.stat, higher_is_better=True))
        parts.append(f"{hvd.config.precision} {hvd.baseline.scale.label} → {hvd.config.scale.label}: scaling "
                     f"efficiency horovod {hvd.stat.mean:.2f} vs the best other, {rival.config.strategy}, "
                     f"{rival.stat.mean:.2f}")
        single |= _single(hvd.stat, rival.stat)
    return finding("horovod-most-robust-across-nodes", "Across nodes, Horovod keeps the highest scaling efficiency",
                   BAI, outcomes, parts, "needs horovod and another strategy succeeded at the same precision on one "
                   "node and at the same scale of 2 or more nodes", single)


def _loss_curve(config: Configuration, curves: Curves | None) -> dict[int, float] | None:
    records = (curves or {}).get(config.succeeded[0].name) if config.succeeded else None
    if not records:
        return None
    curve = {r["step"]: float(r["loss"]) for r in records
             if isinstance(r.get("step"), int) and isinstance(r.get("loss"), (int, float))}
    return curve or None


def _gap(a: float, b: float) -> float:
    return abs(a - b) / ((abs(a) + abs(b)) / 2) if a or b else 0.0


def synchronous_strategies_agree(configs: list[Configuration], spec: dict[str, Any],
                                 curves: Curves | None) -> Finding:
    asynchronous = {s.get("name") for s in (spec.get("sweep") or {}).get("strategies") or []
                    if s.get("psMode") == "async"}
    outcomes, parts = [], []
    groups: dict[tuple, list[Configuration]] = {}
    for config in configs:
        if config.strategy not in asynchronous and config.stat(final_loss) is not None:
            groups.setdefault((config.scale, config.precision), []).append(config)
    for (scale, precision), group in groups.items():
        if len(group) < 2:
            continue
        reference = group[0]
        found = {c.name: _loss_curve(c, curves) for c in group}
        steps = set.intersection(*(set(curve) for curve in found.values())) if all(found.values()) else set()
        if steps:
            gap = max(_gap(found[c.name][s], found[reference.name][s]) for c in group[1:] for s in steps)
            basis = f"loss per step, {len(steps)} steps"
        else:
            ref = reference.stat(final_loss).mean
            gap = max(_gap(c.stat(final_loss).mean, ref) for c in group[1:])
            basis = "final loss: no per-step records"
        outcomes.append("holds" if gap <= LOSS_TOLERANCE else "fails")
        parts.append(f"{precision} {scale.label}: {', '.join(c.strategy for c in group)}: largest loss gap "
                     f"{gap:.3%} ({basis})")  # one precision recipe for every strategy (docs/strategies.md)
    if asynchronous:
        parts.append(f"{', '.join(sorted(asynchronous))} in async mode left out: not synchronous")
    return finding("synchronous-strategies-converge-alike", "Synchronous strategies follow the same loss curve at "
                   "equal global batch", f"{PATWARDHAN}; {LI}", outcomes, parts if outcomes else [],
                   "needs two synchronous strategies succeeded at the same precision and scale")


def ddp_scales_near_linearly(effs: list[Efficiency]) -> Finding:
    outcomes, parts, single = [], [], False
    for eff in (e for e in effs if e.config.strategy == "ddp"):
        value, spread = eff.stat.mean, eff.stat.spread
        within = spread is not None and abs(value - NEAR_LINEAR) <= spread
        outcomes.append("noise" if within else "holds" if value >= NEAR_LINEAR else "fails")
        parts.append(f"{eff.config.precision} {eff.baseline.scale.label} → {eff.config.scale.label}: scaling "
                     f"efficiency {eff.stat.mean:.2f}")
        single |= eff.stat.spread is None
    return finding("ddp-scales-near-linearly", f"DDP scales near-linearly (scaling efficiency ≥ {NEAR_LINEAR})", LI,
                   outcomes, parts, "needs ddp succeeded at two scales of the same precision", single)


def check_all(configs: list[Configuration], effs: list[Efficiency], spec: dict[str, Any],
              curves: Curves | None) -> list[Finding]:
    return [
        fsdp_memory(configs),
        mixed_precision_faster(configs),
        ddp_mixed_precision_best_on_one_node(configs),
        horovod_most_robust_across_nodes(effs),
        synchronous_strategies_agree(configs, spec, curves),
        ddp_scales_near_linearly(effs),
    ]
