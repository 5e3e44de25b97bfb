"""How long must a run be for its answer not to move? The CPU example's ratios at 1x, 2x and 4x its steps.

Measured before: 10 measured steps after 2 warm-up steps gave horovod/ddp 0.77, and 60 steps by hand 1.18. Every
round runs the example's ddp, horovod, ps and single (fp32, no breakdown hooks) at each length, shuffled per
round; per length it prints each strategy's tokens/s ÷ ddp's from the within-round ratios with its 95 % interval
(docs/analysis.md, Rounds as blocks), and how many runs were not steady (still warming up: docs/analysis.md,
Steady state). The default length to ship is the shortest whose ratios stay inside their intervals when the
length doubles and whose runs are steady; this script measures, the choice is made from its output on a quiet
machine.

    python benchmarks/bench_run_length.py --rounds 4 --lengths 12 24 48 [--output DIR]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from rounds import example, geometric_mean_tps, paired_ratio, rendered, run_rounds, unsteady_share

STRATEGIES = ("ddp", "horovod", "ps", "single")


def variants(lengths: list[int], warmup: int) -> dict[str, list]:
    """One configuration per (strategy, length): `<strategy>-<steps>`."""
    found = {}
    for steps in lengths:
        benchmark, runs = example(STRATEGIES, steps, warmup)
        for run in runs:
            found[f"{run.strategy.name}-{steps}"] = [rendered(benchmark, run)]
    return found


def settled(ratios: dict[int, dict[str, object]], lengths: list[int]) -> int | None:
    """The shortest length whose every ratio's estimate at twice that length lies inside its interval."""
    for short, long in zip(lengths, lengths[1:]):
        if long != 2 * short:
            continue
        pairs = [(ratios[short].get(s), ratios[long].get(s)) for s in STRATEGIES if s != "ddp"]
        if pairs and all(a and b and a.low <= b.estimate <= a.high for a, b in pairs):
            return short
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--lengths", type=int, nargs="+", default=[12, 24, 48], help="training.steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="training.warmupSteps at every length")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--output", type=Path, default=None, help="results folder (default: a temporary one)")
    args = parser.parse_args()
    output = args.output or Path(tempfile.mkdtemp(prefix="bench-run-length-"))
    found = run_rounds(variants(args.lengths, args.warmup), args.rounds, args.seed, output)
    print(f"\n{args.rounds} rounds, results in {output}")
    print("| steps | strategy | tokens/s (geometric mean) | unsteady runs | ÷ ddp [95 % interval, paired] |")
    print("|---:|---|---:|---:|---|")
    ratios: dict[int, dict[str, object]] = {}
    for steps in args.lengths:
        ratios[steps] = {}
        for strategy in STRATEGIES:
            entries = found[f"{strategy}-{steps}"]
            ratio = paired_ratio(entries, found[f"ddp-{steps}"]) if strategy != "ddp" else None
            ratios[steps][strategy] = ratio
            shown = f"{ratio.estimate:.2f} [{ratio.low:.2f}, {ratio.high:.2f}]" if ratio else "—"
            print(f"| {steps} | {strategy} | {geometric_mean_tps(entries) or 0:,.0f} | {unsteady_share(entries)} | "
                  f"{shown} |")
    length = settled(ratios, args.lengths)
    print(f"shortest length whose ratios stay inside their intervals at twice the steps: {length or 'none measured'}")


if __name__ == "__main__":
    main()
