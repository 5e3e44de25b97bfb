"""Does pairing within rounds help on real sweeps? Paired and unpaired intervals of the same comparisons.

For a results folder of a sweep run in rounds (`gpt2bench run manifests/examples/cpu-sweep.yaml`, or any other),
every configuration's tokens/s against its scale's top-ranked: the ratio with its 95 % interval paired (within
rounds, docs/analysis.md: Rounds as blocks) and unpaired (each configuration's own spread, the rounds' drift
included), the ratio of the two widths, and the share of the spread the rounds explain. On a machine whose
drift between rounds exceeds the runs' own noise, the paired intervals are narrower; with little drift they are
about as wide (pairing then only costs degrees of freedom).

    python benchmarks/bench_paired.py results/cpu-sweep [more folders...]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from pathlib import Path

from gpt2bench.report.measures import configurations, scales, tokens_per_second
from gpt2bench.report.noise import Contrast, estimate, ratio
from gpt2bench.status import ResultsDocument


def width(contrast: Contrast | None) -> float | None:
    """The 95 % interval's width on the log scale (its high ÷ low, logged)."""
    if contrast is None:
        return None
    interval = contrast.interval()
    return math.log(interval.high / interval.low)


def compare(doc: ResultsDocument) -> list[tuple[str, str, Contrast | None, Contrast | None, float | None]]:
    """(scale, configuration, paired, unpaired, share explained by rounds) against each scale's top-ranked."""
    configs = configurations(doc.runs)
    samples = {c.name: c.sample(tokens_per_second) for c in configs}
    paired_model = estimate(samples.values())
    shares = {p.name: p.round_share for p in (paired_model.paired.pools if paired_model.paired else [])}
    found = []
    for scale in scales(configs):
        here = [c for c in configs if c.scale == scale and samples[c.name].n]
        if len(here) < 2:
            continue
        top = max(here, key=lambda c: samples[c.name].log_mean)
        for config in here:
            if config is top:
                continue
            pair = ([samples[config.name]], [samples[top.name]])
            found.append((scale.label, config.name, ratio(*pair),
                          ratio([dataclasses.replace(samples[config.name], rounds=())],
                                [dataclasses.replace(samples[top.name], rounds=())]),
                          shares.get(scale.label)))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, help="results folders (each holds results.json)")
    args = parser.parse_args()
    print("| sweep | scale | configuration ÷ top-ranked | paired [95 %] | unpaired [95 %] | width paired ÷ unpaired |"
          " rounds explain |")
    print("|---|---|---|---|---|---:|---:|")
    for folder in args.folders:
        doc = ResultsDocument.load(folder)
        for scale, name, paired, unpaired, share in compare(doc):
            def shown(c: Contrast | None) -> str:
                if c is None:
                    return "—"
                i = c.interval()
                return f"{i.estimate:.3f} [{i.low:.3f}, {i.high:.3f}]" + ("" if c.paired else " (unpaired)")
            ratio_ = (width(paired) / width(unpaired)) if width(paired) and width(unpaired) else None
            print(f"| {folder.name} | {scale} | {name} | {shown(paired)} | {shown(unpaired)} | "
                  f"{'—' if ratio_ is None else f'{ratio_:.2f}'} | {'—' if share is None else f'{max(share, 0):.0%}'} |")


if __name__ == "__main__":
    main()
