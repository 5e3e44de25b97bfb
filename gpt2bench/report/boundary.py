"""When one paired comparison of the selection race may decide: the critical t value at each look, such that
looking after every round does not raise the chance of a wrong decision above its level.

A comparison of configurations A and B rests on their within-round differences D_r = ln x_A,r − ln x_B,r (one
per round both ran; every round's shared drift cancels). After n such rounds, T_n = mean(D) / (sd(D) / √n) with
n − 1 degrees of freedom. The race looks after every round from FIRST_LOOK (2 degrees of freedom: the fewest
with which a variance can be trusted) up to the sweep's last possible round, its `cap` (sweep.maxRepeats), and
decides "A is faster than B" at the first look where the one-sided p-value P(t(n − 1) ≥ T_n) falls to
π·(n − 2)^SHAPE: early looks, whose variance rests on few rounds, get a small share of the level, later ones more.

π is set so that, when A and B are equal, the chance that ANY look decides is exactly `level`. Where the D_r are
independent and normal, the joint law of T_3, T_4, ... does not depend on their mean-free scale (T is pivotal),
so π is a function of (level, cap) alone: a simulation of SIMULATED_PATHS such sequences, stored in
boundary.json (`python -m gpt2bench.report.boundary --write`, minutes; tests/test_boundary.py checks the table
against its parameters and that each stored boundary keeps its level on fresh simulated sequences). A comparison
that misses looks (a failed run) only loses chances to decide, so its level still holds. Where A is truly slower
than B, every T_n is smaller, so deciding "A faster" is rarer still. Docs: docs/analysis.md, The selection race.
"""

from __future__ import annotations

import argparse
import json
import math
from functools import lru_cache
from pathlib import Path

import numpy as np
from scipy.special import stdtr, stdtrit  # Student t cdf and quantile (fast ufuncs)

FIRST_LOOK = 3  # rounds: a paired comparison's first look has 2 degrees of freedom
SHAPE = 4.0  # the nominal level at look n grows as (n - 2)^SHAPE: spent late (chosen by benchmarks/bench_race.py)
MAX_CAP = 50  # the latest round a table entry covers (sweep.maxRepeats is at most this)
LEVELS = tuple(float(x) for x in np.geomspace(1e-4, 0.05, 28))  # per-comparison levels tabulated
SIMULATED_PATHS = 2_000_000
SEED = 20261127
TABLE = Path(__file__).with_name("boundary.json")
_CHUNK = 50_000
_BINS = np.linspace(-40.0, 0.0, 40_001)  # ln(p / (n - 2)^SHAPE): bins of 0.001 (0.1 % of π)


def weight(look: int) -> float:
    """The share of π the look at `look` rounds gets: (n − 2)^SHAPE."""
    return float(look - FIRST_LOOK + 1) ** SHAPE


@lru_cache(maxsize=1)
def _table() -> dict:
    return json.loads(TABLE.read_text())


def nominal(level: float, cap: int) -> float:
    """π: the per-look nominal level (before its weight) of a race that looks after rounds FIRST_LOOK..cap, so
    that equal configurations are wrongly told apart at some look with probability `level`."""
    if not 0 < level < 1:
        raise ValueError(f"a level must lie in (0, 1), not {level}")
    cap = max(int(cap), FIRST_LOOK)
    if cap == FIRST_LOOK:
        return level  # one look: its own level
    table = _table()
    levels, caps = table["levels"], table["caps"]
    if cap > caps[-1] or level < levels[0] or level > levels[-1]:
        # outside the table: Bonferroni across the looks (the chance of any is at most the sum of each's)
        return level / sum(weight(n) for n in range(FIRST_LOOK, cap + 1))
    logs = table["log_nominal"][caps.index(cap)]
    return float(math.exp(np.interp(math.log(level), np.log(levels), logs)))


def critical_t(look: int, level: float, cap: int, single: bool = False) -> float:
    """The t value a comparison of `look` rounds (look − 1 degrees of freedom) must reach to decide at one-sided
    `level`: in a race looking after rounds FIRST_LOOK..cap, or, with `single`, at one look only (a sweep of fixed
    rounds, decided once at its end). Infinite below 2 degrees of freedom (nothing is decided there)."""
    if look < FIRST_LOOK:
        return math.inf
    at = level if single else min(nominal(level, cap) * weight(look), 0.5)
    return float(stdtrit(look - 1, 1 - at))


# ------------------------------------------------------------------ generation (offline)
def simulate(paths: int = SIMULATED_PATHS, seed: int = SEED, cap: int = MAX_CAP) -> np.ndarray:
    """Counts, per cap (FIRST_LOOK..cap) and per bin of _BINS, of simulated equal-mean comparisons whose smallest
    weighted p-value over the looks up to that cap falls in the bin."""
    rng = np.random.default_rng(seed)
    looks = np.arange(1, cap + 1, dtype=float)
    weights = np.array([weight(n) for n in range(FIRST_LOOK, cap + 1)])
    counts = np.zeros((cap - FIRST_LOOK + 1, len(_BINS) - 1), dtype=np.int64)
    for start in range(0, paths, _CHUNK):
        draws = rng.standard_normal((min(_CHUNK, paths - start), cap))
        sums, squares = np.cumsum(draws, axis=1), np.cumsum(draws * draws, axis=1)
        means = sums / looks
        variances = (squares - looks * means**2) / np.maximum(looks - 1, 1)
        t = (means / np.sqrt(variances / looks))[:, FIRST_LOOK - 1:]
        p = stdtr(looks[FIRST_LOOK - 1:] - 1, -t)
        smallest = np.minimum.accumulate(np.log(np.maximum(p, 1e-300)) - np.log(weights), axis=1)
        for index in range(smallest.shape[1]):
            counts[index] += np.histogram(np.clip(smallest[:, index], _BINS[0], _BINS[-1]), _BINS)[0]
    return counts


def tabulate(counts: np.ndarray, paths: int) -> dict:
    """ln π per cap and level: the level-quantile of the smallest weighted p-value (linear within a bin)."""
    rows = []
    for per_cap in counts:
        cumulative = np.cumsum(per_cap) / paths
        row = []
        for level in LEVELS:
            index = int(np.searchsorted(cumulative, level))
            below = cumulative[index - 1] if index else 0.0
            share = (level - below) / max(cumulative[index] - below, 1e-300)
            row.append(round(float(_BINS[index] + share * (_BINS[index + 1] - _BINS[index])), 5))
        rows.append(row)
    return {"first_look": FIRST_LOOK, "shape": SHAPE, "paths": paths, "seed": SEED, "levels": list(LEVELS),
            "caps": list(range(FIRST_LOOK, FIRST_LOOK + len(rows))), "log_nominal": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write {TABLE.name} (minutes)")
    parser.add_argument("--paths", type=int, default=SIMULATED_PATHS)
    args = parser.parse_args(argv)
    table = tabulate(simulate(args.paths), args.paths)
    text = json.dumps(table, separators=(",", ":")) + "\n"
    if args.write:
        TABLE.write_text(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
