"""The papers' claims, checked on this sweep: each claim compares configurations that differ in the compared
thing alone (same precision and scale unless the claim is about them, and on CPU the same threads and cores per
rank), and says which figures it rests on.

Each comparison is a ratio (or a mean) with its standard error (noise.py), checked against the claim's
threshold: the claim holds for it when the whole interval lies on the claim's side, fails when the whole
interval lies on the other side, and is undecided when the interval crosses the threshold. A claim's
comparisons are Bonferroni-corrected among themselves, and the claim is one decision among the report's (Holm,
analysis.py). Verdicts: does-not-hold (some comparison fails), needs-repeats (no interval, not decided),
inconclusive (some interval crosses), holds (every comparison holds), not-measurable (the sweep has no such
comparison: `measured` says what is missing). Definitions: docs/analysis.md.
"""

from __future__ import annotations

import math
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
    scales,
    tokens_per_second,
    tokens_per_second_per_device,
)
from gpt2bench.report.noise import (
    Contrast,
    Interval,
    Pending,
    Sample,
    family_confidence,
    mean_contrast,
    ratio,
)
from gpt2bench.status import Finding, RunStatus

NEAR_LINEAR = 0.9  # scaling efficiency that counts as near-linear (Li 2020's DDP stays above it)
MOSTLY_HIDDEN = 0.5  # share of DDP's all-reduce time hidden behind backward that counts as "most" (Li 2020)
LOSS_TOLERANCE = 0.05  # largest loss gap, as a share of the loss decrease, that counts as the same curve
MIXED = ("fp16", "bf16")
MAX_MEASURED = 900  # characters of figures per finding: the CR status stays small

BAI = "Bai et al. 2022 (arXiv 2206.06356)"
PATWARDHAN = "Patwardhan et al. 2024 (arXiv 2405.15628)"
LI = "Li et al. 2020 (arXiv 2006.15704)"
Curves = dict[str, list[dict[str, Any]]]


@dataclass
class Check:
    """One comparison of a claim: a ratio (or a mean) with its standard error (`contrast`, None: measured once),
    held against `threshold`; the claim wants it `above` (or below) the threshold."""

    label: str  # what is compared: "ddp 1×2 CPU: bf16 vs fp32 tokens/s"
    contrast: Contrast | None
    estimate: float  # the point estimate, shown when there is no interval
    threshold: float = 1.0
    above: bool = True
    show: Callable[[float], str] = field(default=lambda ratio: f"{ratio - 1:+.1%}")
    basis: str | None = None  # what the figure rests on, appended in brackets

    def interval(self, confidence: float) -> Interval | None:
        return self.contrast.interval(confidence) if self.contrast else None

    def outcome(self, interval: Interval | None) -> str:
        """holds, fails, across (the interval crosses the threshold) or unknown (no interval)."""
        if interval is None:
            return "unknown"
        side = interval.side(self.threshold)
        if side == "across":
            return "across"
        return "holds" if (side == "above") == self.above else "fails"

    def leaning(self) -> int:
        """+1 when the estimate lies on the claim's side of the threshold, −1 on the other, 0 on it."""
        side = self.contrast.side(self.threshold) if self.contrast else 0
        return side if self.above else -side

    def text(self, interval: Interval | None) -> str:
        basis = f" ({self.basis})" if self.basis else ""
        if interval is None:
            return f"{self.label}: {self.show(self.estimate)} (single measurement{', ' + self.basis if basis else ''})"
        shown = f"{self.show(interval.estimate)} [{self.show(interval.low)}, {self.show(interval.high)}]"
        return f"{self.label}: {shown}{basis}"


def ratio_check(label: str, numerator: list[Sample], denominator: list[Sample], threshold: float = 1.0,
                above: bool = True, show: Callable[[float], str] | None = None) -> Check:
    """A claim about Π geometric means(numerator) ÷ Π geometric means(denominator)."""
    estimate = math.exp(sum(s.log_mean for s in numerator) - sum(s.log_mean for s in denominator))
    check = Check(label, ratio(numerator, denominator), estimate, threshold, above)
    if show is not None:
        check.show = show
    return check


def claim_p_value(checks: list[Check]) -> float | None:
    """The smallest α at which the claim is decided (holds or does not hold), each of its m comparisons at
    α / m: holds needs every comparison on the claim's side (m × the largest p), does-not-hold one on the other
    side (m × the smallest p there). None: nothing can be decided (a comparison without an interval, and none
    that could fail)."""
    m = len(checks)
    known = [c for c in checks if c.contrast is not None]
    p_fails = [c.contrast.p_value(c.threshold) for c in known if c.leaning() < 0]
    candidates = [m * min(p_fails)] if p_fails else []
    if len(known) == m and all(c.leaning() > 0 for c in checks):
        candidates.append(m * max(c.contrast.p_value(c.threshold) for c in checks))
    return min(1.0, min(candidates)) if candidates else None


def finding(id_: str, claim: str, source: str, checks: list[Check], missing: str,
            extra: list[str] | None = None) -> Pending:
    """The claim as a pending decision (analysis.Pending): its p-value, and its verdict at the confidence the
    report's correction gives it, each comparison at the Bonferroni-corrected level within the claim."""
    base = {"id": id_, "claim": claim, "source": source}
    if not checks:
        result = Finding(verdict="not-measurable", measured="; ".join([missing, *(extra or [])]), **base)
        return Pending(None, lambda _confidence: result)

    def conclude(report_confidence: float) -> Finding:
        confidence = family_confidence(len(checks), report_confidence)
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
                       low=interval.low, high=interval.high, threshold=chosen.threshold, confidence=confidence,
                       **base)

    return Pending(claim_p_value(checks), conclude)


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


def fsdp_memory(configs: list[Configuration]) -> Any:
    """On GPUs the measured peak per rank (CUDA max allocated). On CPU there is no per-rank measurement apart from
    the libraries (peak RSS is a process-wide high-water mark): the tensors' sizes summed are shown as
    accounting, and decide nothing."""
    checks, accounting = [], []
    for fsdp in (c for c in configs if c.strategy == "fsdp" and c.scale.devices >= 2):
        ddp = _find(configs, "ddp", fsdp.precision, fsdp.scale)
        a, b = fsdp.sample(_rank_memory), ddp.sample(_rank_memory) if ddp else Sample("", "", ())
        if not a.n or not b.n:
            continue
        kind = memory_per_rank(fsdp.succeeded[0])[1]
        label = (f"{fsdp.precision} {fsdp.scale.label}: fsdp {_mib(statistics.fmean(a.values))} vs ddp "
                 f"{_mib(statistics.fmean(b.values))} {kind} per rank")
        if kind == "model state":
            share = statistics.fmean(a.values) / statistics.fmean(b.values) - 1
            accounting.append(f"{label} ({share:+.1%}; accounting: tensor sizes summed, not a measurement)")
            continue
        checks.append(ratio_check(label, [a], [b], above=False))
    missing = "needs fsdp and ddp succeeded at the same precision and scale with 2 or more GPUs"
    if accounting and not checks:
        missing = ("not measurable on CPU: a process's memory there is the libraries' as much as the model's, so "
                   "per-rank memory is not measured; " + missing)
    return finding("fsdp-memory-below-ddp", "FSDP's per-rank memory is below DDP's", PATWARDHAN, checks, missing,
                   accounting)


def mixed_precision_faster(configs: list[Configuration]) -> Any:
    checks = []
    for mixed in (c for c in configs if c.precision in MIXED):
        fp32 = _find(configs, mixed.strategy, "fp32", mixed.scale)
        a, b = mixed.sample(tokens_per_second), fp32.sample(tokens_per_second) if fp32 else Sample("", "", ())
        if not a.n or not b.n:
            continue
        label = (f"{mixed.strategy} {mixed.scale.label}: {mixed.precision} {_tps(statistics.fmean(a.values))} vs fp32 "
                 f"{_tps(statistics.fmean(b.values))} tokens/s")
        checks.append(ratio_check(label, [a], [b]))
    return finding("mixed-precision-faster", "Mixed precision (fp16/bf16) trains faster than fp32, for every "
                   "strategy", f"{BAI}, with Apex", checks,
                   "needs a strategy succeeded in fp32 and in fp16 or bf16 at the same scale")


def _fastest(configs: list[Configuration]) -> Configuration | None:
    measured = [c for c in configs if c.sample(tokens_per_second).n]
    return max(measured, key=lambda c: c.sample(tokens_per_second).log_mean, default=None)


def ddp_mixed_precision_best_on_one_node(configs: list[Configuration]) -> Any:
    """Per one-node scale: the fastest ddp in fp16/bf16 against every other configuration whose ranks had the
    same CPU resources (each a comparison: the claim holds only if it beats them all)."""
    checks = []
    for scale in (s for s in scales(configs) if s.nodes == 1 and s.devices >= 2):
        here = [c for c in configs if c.scale == scale]
        ddp = _fastest([c for c in here if c.strategy == "ddp" and c.precision in MIXED])
        if ddp is None:
            continue
        rivals = [c for c in here if not (c.strategy == "ddp" and c.precision in MIXED)
                  and c.sample(tokens_per_second).n and c.per_rank == ddp.per_rank]
        a = ddp.sample(tokens_per_second)
        for other in rivals:
            b = other.sample(tokens_per_second)
            label = (f"{scale.label}: {ddp.label} {_tps(statistics.fmean(a.values))} vs {other.label} "
                     f"{_tps(statistics.fmean(b.values))} tokens/s")
            checks.append(ratio_check(label, [a], [b]))
    return finding("ddp-mixed-precision-fastest-on-one-node", "On one node, DDP with mixed precision is the fastest "
                   "configuration", BAI, checks,
                   "needs ddp in fp16 or bf16 and another configuration succeeded on one node with 2 or more devices")


def _refusals(effs: list[Efficiency]) -> list[str]:
    return list(dict.fromkeys(e.refused for e in effs if e.refused))


def horovod_most_robust_across_nodes(configs: list[Configuration], effs: list[Efficiency]) -> Any:
    """Per scale of 2+ nodes and precision: horovod's scaling efficiency against every other strategy's from the
    same one-node baseline scale."""
    usable = [e for e in effs if e.refused is None]
    checks = []
    for hvd in (e for e in usable if e.config.strategy == "horovod" and e.config.scale.nodes >= 2
                and e.baseline.scale.nodes == 1):
        rivals = [e for e in usable if e.config.strategy != "horovod" and e.config.scale == hvd.config.scale
                  and e.config.precision == hvd.config.precision and e.baseline.scale == hvd.baseline.scale]
        for rival in rivals:
            label = (f"{hvd.config.precision} {hvd.baseline.scale.label} → {hvd.config.scale.label}: scaling "
                     f"efficiency horovod {hvd.stat.mean:.2f} vs {rival.config.strategy} {rival.stat.mean:.2f}")
            over = [c.sample(tokens_per_second_per_device) for c in (hvd.config, rival.baseline)]
            under = [c.sample(tokens_per_second_per_device) for c in (hvd.baseline, rival.config)]
            checks.append(ratio_check(label, over, under))
    return finding("horovod-most-robust-across-nodes", "Across nodes, Horovod keeps the highest scaling efficiency",
                   BAI, checks, "needs horovod and another strategy succeeded at the same precision on one node and "
                   "at the same scale of 2 or more nodes", _refusals(effs) if not checks else None)


def _loss_curve(run: RunStatus, curves: Curves | None) -> dict[int, float] | None:
    records = (curves or {}).get(run.name)
    if not records:
        return None
    curve = {r["step"]: float(r["loss"]) for r in records
             if isinstance(r.get("step"), int) and isinstance(r.get("loss"), (int, float))}
    return curve or None


def _run_gap(run: RunStatus, reference: RunStatus, curves: Curves | None) -> tuple[float | None, bool]:
    """Largest loss gap between two runs over their common steps (else of their final losses) as a share of
    the reference's loss decrease over the run (first step's loss − last step's); None when the reference's
    loss did not decrease. True when per-step curves were compared."""
    mine, theirs = _loss_curve(run, curves), _loss_curve(reference, curves)
    steps = sorted(set(mine) & set(theirs)) if mine and theirs else []
    if steps:
        gap, decrease = max(abs(mine[s] - theirs[s]) for s in steps), theirs[steps[0]] - theirs[steps[-1]]
    else:
        mine_last, ref_last = run.results.final_loss, reference.results.final_loss
        ref_first = reference.results.first_loss
        if ref_first is None:
            return None, False
        gap, decrease = abs(mine_last - ref_last), ref_first - ref_last
    return (gap / decrease if decrease > 0 else None), bool(steps)


def _gap_check(config: Configuration, reference: Configuration, curves: Curves | None) -> Check | None:
    """Each repeat against the reference's repeat of the same round (the same data and seed: the seed varies
    from round to round, plan.Run.seed)."""
    theirs = {run.repeat: run for run in reference.succeeded if run.results.final_loss is not None}
    pairs = [_run_gap(run, theirs[run.repeat], curves) for run in config.succeeded
             if run.repeat in theirs and run.results.final_loss is not None]
    pairs = [(gap, per_step) for gap, per_step in pairs if gap is not None]
    if not pairs:
        return None
    gaps = [gap for gap, _ in pairs]
    basis = "loss per step" if all(per_step for _, per_step in pairs) else "final loss: no per-step records"
    label = f"{config.label} vs {reference.label} {config.scale.label}: largest loss gap ÷ loss decrease"
    repeats = f"{len(gaps)} rounds, one seed each" if len(gaps) > 1 else "1 measurement"
    return Check(label, mean_contrast(gaps), statistics.fmean(gaps), threshold=LOSS_TOLERANCE, above=False,
                 show=lambda gap: f"{gap:.2%}", basis=f"{basis}, {repeats}")


def synchronous_strategies_agree(configs: list[Configuration], spec: dict[str, Any],
                                 curves: Curves | None) -> Any:
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
                   f"equal global batch (gap within {LOSS_TOLERANCE:.0%} of the loss decrease)",
                   f"{PATWARDHAN}; {LI}", checks,
                   "needs two synchronous strategies succeeded at the same precision and scale", extra)


def ddp_scales_near_linearly(configs: list[Configuration], effs: list[Efficiency]) -> Any:
    checks = []
    for eff in (e for e in effs if e.config.strategy == "ddp" and e.refused is None):
        label = f"{eff.config.precision} {eff.baseline.scale.label} → {eff.config.scale.label}: scaling efficiency"
        checks.append(ratio_check(label, [eff.config.sample(tokens_per_second_per_device)],
                                  [eff.baseline.sample(tokens_per_second_per_device)], threshold=NEAR_LINEAR,
                                  show=lambda ratio: f"{ratio:.2f}"))
    refused = _refusals([e for e in effs if e.config.strategy == "ddp"])
    return finding("ddp-scales-near-linearly", f"DDP scales near-linearly (scaling efficiency ≥ {NEAR_LINEAR})", LI,
                   checks, "needs ddp succeeded at two scales of the same precision", refused)


def ddp_overlap_hides_communication(configs: list[Configuration], curves: Curves | None) -> Any:
    """Per ddp configuration with 2+ devices and a breakdown: the mean hidden share of its communication
    (1 − exposed ÷ total) against 1/2, with a t interval. Over its breakdown runs where there are 3 or more
    (sweep.breakdown inline: every round); else over the measured steps of its breakdown run (the breakdown round,
    from its step records: steps taken as independent, a first-order guide, as for the steady state)."""
    checks = []
    for config in (c for c in configs if c.strategy == "ddp" and c.scale.devices >= 2):
        runs = [float(v) for run in config.breakdown_runs if (v := comm_hidden_ratio(run)) is not None]
        steps = [share for run in config.breakdown_runs for share in _hidden_per_step(run, curves)]
        if len(runs) >= 3 or (runs and len(steps) < 3):
            values, basis = runs, f"{len(runs)} run{'s' if len(runs) != 1 else ''}"
        elif steps:
            values, basis = steps, f"{len(steps)} measured steps of the breakdown round, taken as independent"
        else:
            continue
        label = f"{config.precision} {config.scale.label}: share of all-reduce time hidden by backward"
        checks.append(Check(label, mean_contrast(values), statistics.fmean(values), threshold=MOSTLY_HIDDEN,
                            show=lambda share: f"{share:.0%}", basis=basis))
    return finding("ddp-overlap-hides-communication", "DDP's bucketed all-reduce overlaps the backward pass and "
                   f"hides most (over {MOSTLY_HIDDEN:.0%}) of its communication time", LI, checks,
                   "needs ddp succeeded with 2 or more devices and a step breakdown (sweep.breakdown)")


def _hidden_per_step(run: RunStatus, curves: Curves | None) -> list[float]:
    """1 − exposed ÷ total communication of each measured (not warm-up) step whose communication was timed."""
    found = []
    for record in (curves or {}).get(run.name) or []:
        total, exposed = record.get("comm_seconds"), record.get("comm_exposed_seconds")
        if record.get("warmup") or not isinstance(total, (int, float)) or not isinstance(exposed, (int, float)):
            continue
        if total > 0:
            found.append(1 - exposed / total)
    return found


@dataclass
class Claims:
    """The papers' findings (one family of decisions) and the checks (the convergence check: strategies that
    must compute the same thing, held to a tolerance; a check, not a finding: it takes no place in the family)."""

    findings: list[Any]
    checks: list[Any]


def check_all(configs: list[Configuration], effs: list[Efficiency], spec: dict[str, Any],
              curves: Curves | None) -> Claims:
    return Claims(findings=[
        fsdp_memory(configs),
        mixed_precision_faster(configs),
        ddp_mixed_precision_best_on_one_node(configs),
        horovod_most_robust_across_nodes(configs, effs),
        ddp_scales_near_linearly(configs, effs),
        ddp_overlap_hides_communication(configs, curves),
    ], checks=[synchronous_strategies_agree(configs, spec, curves)])
