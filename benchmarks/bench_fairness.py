"""Do horovod and ps compare with ddp at equal resources? horovod ÷ ddp and ps ÷ ddp on the CPU example.

Runs the CPU example's ddp, horovod and ps configurations in fp32 through `gpt2bench run`'s own sweep (the
same rendered jobs, launchers and per-rank CPU budget as the benchmark), `--repeats` rounds (every configuration
once per round, in a shuffled order; no breakdown hooks), then prints each ratio of tokens/s (geometric means)
with its 95 % interval from the sweep's own noise (docs/analysis.md, Noise and intervals) and the threads and
cores each rank had.

The claim: at equal threads per rank, horovod/ddp and ps/ddp lie within the measured noise of what
the strategies cost, not of a thread-count difference (before: horovod's ranks had 2 threads, ddp's 1).

    python benchmarks/bench_fairness.py --repeats 4 [--steps 20] [--output DIR]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import yaml
from rounds import fixed_rounds

from gpt2bench.local import sweep as local_sweep
from gpt2bench.plan import Run, plan_runs
from gpt2bench.report import noise
from gpt2bench.report.measures import Configuration, configurations, noise_model, tokens_per_second
from gpt2bench.report.noise import Interval
from gpt2bench.specification.model import Benchmark
from gpt2bench.specification.validation import load_benchmark

EXAMPLE = Path(__file__).resolve().parents[1] / "manifests" / "examples" / "cpu-sweep.yaml"
BASELINE, RIVALS = "ddp", ("horovod", "ps")


def ratio(rival: Configuration, baseline: Configuration, configs: list[Configuration]) -> Interval | None:
    """rival ÷ baseline tokens/s with the interval the report would give it."""
    contrast = noise.ratio([rival.sample(tokens_per_second)], [baseline.sample(tokens_per_second)],
                     noise_model(configs, tokens_per_second))
    return contrast.interval() if contrast else None


def planned_runs(repeats: int, steps: int | None = None) -> tuple[Benchmark, list[Run]]:
    """The example's ddp, horovod and ps fp32 runs, `repeats` rounds, as the plan orders them (no breakdown: its
    hooks would time a different loop)."""
    document = yaml.safe_load(EXAMPLE.read_text())
    fixed_rounds(document["spec"]["sweep"], repeats)
    if steps:
        document["spec"]["training"] |= {"steps": steps, "warmupSteps": min(document["spec"]["training"]
                                                                            .get("warmupSteps", 0), steps // 2)}
    benchmark = load_benchmark(document)
    runs = local_sweep.select_runs(plan_runs(benchmark), rf"-({'|'.join((BASELINE, *RIVALS))})-fp32-")
    return benchmark, runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--steps", type=int, default=None, help="override the example's steps")
    parser.add_argument("--output", type=Path, default=None, help="results folder (default: a temporary one)")
    args = parser.parse_args()

    benchmark, runs = planned_runs(args.repeats, args.steps)
    output = args.output or Path(tempfile.mkdtemp(prefix="bench-fairness-"))
    doc = local_sweep.run_sweep(benchmark, runs, output, live=False).doc
    configs = {c.strategy: c for c in configurations(doc.runs)}
    print(f"\n{len(runs)} runs, {args.repeats} rounds, each in a shuffled order; results in {output}")
    for config in configs.values():
        first = config.succeeded[0].results if config.succeeded else None
        if first:
            print(f"  {config.name}: {config.stat(tokens_per_second).mean:,.0f} tokens/s over "
                  f"{len(config.succeeded)} runs; {first.threads_per_rank} thread(s), "
                  f"{first.cores_per_rank:.3g} core(s) per rank")
    for pool in noise_model(list(configs.values()), tokens_per_second).pools:
        if pool.variance:
            print(f"  noise: ±{pool.variance.cv:.1%} per run (pooled over {', '.join(pool.members)}, df "
                  f"{pool.variance.df:g}); far noisier, on their own: {', '.join(pool.noisier) or 'none'}")
    for rival in RIVALS:
        if rival not in configs or BASELINE not in configs:
            print(f"  {rival} / {BASELINE}: not measured")
            continue
        interval = ratio(configs[rival], configs[BASELINE], list(configs.values()))
        if interval is None:
            print(f"  {rival} / {BASELINE}: needs repeats >= 2")
            continue
        verdict = {"across": "within the noise", "above": "faster, beyond the noise",
                   "below": "slower, beyond the noise"}[interval.side(1.0)]
        print(f"  {rival} / {BASELINE} = {interval.estimate:.2f} [{interval.low:.2f}, {interval.high:.2f}] "
              f"(95 %): {verdict}")


if __name__ == "__main__":
    main()
