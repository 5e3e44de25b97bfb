"""The selection race's error rates, power and cost, measured by simulation through the shipped race
(gpt2bench.report.race): the table docs/analysis.md quotes (The selection race, Calibration).

Synthetic sweeps (benchmarks/race_scenarios.py): configurations whose runs measure their true tokens/s times
log-normal noise, quiet (3 %) and noisy (8 %) ones alternating, plus a 5 % drift every run of a round shares.
Each row is `--sweeps` seeded sweeps raced to the cap (sweep.maxRepeats); rates carry their 95 % binomial interval
(Wilson). Every row runs with sweep.minEffect's default (5 %) unless it says "off". With `--baseline REF` the race
of git revision REF (its level, boundary and rules) runs on the very same values, in a worktree of REF.

    python benchmarks/bench_race.py [--sweeps 4000] [--baseline REF] [--output docs/results/bench-race]
"""

from __future__ import annotations

import argparse
import json
import math
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from race_scenarios import Scenario, equal, mixed, one_ahead, run_races, runs_used, two_speeds  # noqa: E402

from gpt2bench.report import race  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def wilson(hits: int, n: int) -> tuple[float, float]:
    """The 95 % Wilson interval of a proportion."""
    if n == 0:
        return 0.0, 1.0
    z = 1.959964
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def rate(hits: int, n: int) -> str:
    low, high = wilson(hits, n)
    return f"{hits / n:.2%} [{low:.2%}, {high:.2%}]"


EFFECT = race.DEFAULT_MIN_EFFECT  # sweep.minEffect's default: a pick within 5 % of the fastest decides too

# (name, kind, scenario, cap, minEffect). kinds: null (no configuration is faster: a strict "X is the fastest" is
# wrong), tie (two exactly as fast at the top, the rest 10 % behind: a strict claim is wrong), dropped (the
# fastest barely ahead), power (one 10 % faster), two-speeds (configuration 0 runs at full speed or 30 % slower).
ROWS: list[tuple[str, str, Scenario, int, float | None]] = [
    *((f"{k} equal", "null", equal(k), cap, EFFECT) for k in (2, 4, 6, 12) for cap in (6, 10, 20)),
    *((f"{k}: two tied at the top, the rest 10 % behind", "tie",
       Scenario("tie", (1.1, 1.1) + (1.0,) * (k - 2), mixed(k)), cap, EFFECT) for k in (3, 6) for cap in (10, 20)),
    ("6, a noisy one 1 % ahead", "dropped", one_ahead(6, 0.01, noisy=True), 20, EFFECT),
    ("6, a noisy one 12 % ahead", "power", one_ahead(6, 0.12, noisy=True), 20, EFFECT),
    *((f"{k}, a {kind} one 10 % faster", "power", one_ahead(k, 0.10, noisy), cap, EFFECT)
      for k in (2, 4, 6) for kind, noisy in (("quiet", False), ("noisy", True)) for cap in (6, 10, 20)),
    *((f"{k}, a {kind} one 10 % faster, minEffect off", "power", one_ahead(k, 0.10, noisy), 10, None)
      for k in (2, 6) for kind, noisy in (("quiet", False), ("noisy", True))),
    *((f"{k}, one 10 % faster, all at 3 % noise", "power", Scenario("quiet", (1.1,) + (1.0,) * (k - 1), (0.03,) * k),
       cap, EFFECT) for k in (6,) for cap in (6, 10, 20)),
    *((f"{k}, one in two speeds, the rest tied with its {tie} speed", "two-speeds", two_speeds(k, tie), cap, EFFECT)
      for k in (2, 3, 6) for tie in ("mean", "fast") for cap in (10, 20)),
]


def measure(scenario: Scenario, cap: int, min_effect: float | None, sweeps: int, seed: int,
            run: Callable[..., race.State] = run_races) -> dict:
    """What `sweeps` races of `scenario` did. `selected`: decided with a pick within minEffect of the fastest (the
    fastest itself when minEffect is off); `wrong`: a strict claim naming a configuration some other is faster
    than, or a pick more than minEffect behind the fastest."""
    state = run(scenario, cap, sweeps, seed, min_effect)
    clear = state.outcome == race.CLEAR
    decided = (state.outcome == race.CLEAR) | (state.outcome == race.EQUIVALENT)
    speed = scenario.mean_speed()
    top = speed.max()
    pick = np.maximum(state.pick, 0)
    behind = top - speed[pick]  # ln: how far the pick is behind the fastest (on its mean speed)
    strictly_wrong = clear & (behind > 1e-12) | clear & (np.isclose(speed, top).sum() > 1)  # a tie: no strict fastest
    within = math.log1p(min_effect) if min_effect else 1e-12
    found = {
        "sweeps": sweeps,
        "claims": int(clear.sum()),
        "decided": int(decided.sum()),
        "selected": int((decided & (behind <= within)).sum()),
        "wrong": int((strictly_wrong | decided & ~clear & (behind > within)).sum()),
        "rounds": float(np.where(state.outcome != race.RACING, state.decided_in, cap).mean()),
        "runs": float(runs_used(state, cap).mean()),
        "every_round": scenario.entrants * cap,
    }
    fastest = np.flatnonzero(np.isclose(speed, top))
    stable = [j for j in range(scenario.entrants) if scenario.slow_share is None or not scenario.slow_share[j]]
    tops = [j for j in fastest if j in stable]  # each fastest (stable) configuration: the bound is for each
    found |= {"fastest_dropped": int((state.dropped_in[:, tops] > 0).sum()), "fastest": len(tops) * sweeps}
    if scenario.slow_share is not None:  # configuration 0 in two speeds: flagged, and the bounds once flagged
        flagged = state.unstable[:, 0]
        rivals = state.dropped_in[:, 1:] > 0
        found |= {"flagged": int(flagged.sum()), "claims_flagged": int((clear & flagged).sum()),
                  "rival_drops": int(rivals.sum()), "rival_drops_flagged": int(rivals[flagged].sum()),
                  "rivals": scenario.entrants - 1}
    return found


def run_before(tree: Path) -> Callable[..., race.State]:
    """The race of another checkout (a worktree of `--baseline`), run on the very same values."""

    def run(scenario: Scenario, cap: int, sweeps: int, seed: int, min_effect: float | None) -> race.State:
        script = (f"import sys, pickle; sys.path[:0] = [{str(tree)!r}, {str(tree / 'benchmarks')!r}]\n"
                  "import numpy as np; from gpt2bench.report import race\n"
                  "values, cap, k, effect = pickle.load(sys.stdin.buffer)\n"
                  "s = race.race(values, race.Design(k, cap, min_effect=effect), list(range(1, cap + 1)))\n"
                  "sys.stdout.buffer.write(pickle.dumps({n: getattr(s, n) for n in ('outcome', 'pick', 'decided_in',"
                  " 'dropped_in')}))")
        values = scenario.values(cap, sweeps, seed)
        out = subprocess.run([sys.executable, "-c", script], input=pickle.dumps((values, cap, scenario.entrants,
                                                                                  min_effect)),
                             capture_output=True, check=True, env={"PATH": "/usr/bin:/bin"})
        parts = pickle.loads(out.stdout)
        state = race.State.start(sweeps, scenario.entrants)
        for name, part in parts.items():
            setattr(state, name, part)
        return state

    return run


def table(rows: list[dict], with_baseline: bool) -> str:
    head = ["scenario", "cap", "minEffect", "sweeps", "wrong claims", "selected", "a fastest one dropped",
            "two speeds flagged", "once flagged: strict claims / a rival dropped", "rounds to decide",
            "runs (every config every round)"]
    if with_baseline:
        head += ["before: wrong claims", "before: selected"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * 3 + ["---:"] * (len(head) - 3)) + "|"]
    for row in rows:
        m, n = row["measured"], row["measured"]["sweeps"]
        flagged = rate(m["flagged"], n) if "flagged" in m else "—"
        once = (f"{rate(m['claims_flagged'], max(m['flagged'], 1))} / "
                f"{rate(m['rival_drops_flagged'], max(m['flagged'] * m['rivals'], 1))}") if "flagged" in m else "—"
        effect = f"{row['min_effect']:.0%}" if row["min_effect"] else "off"
        cells = [row["name"], str(row["cap"]), effect, f"{n:,}", rate(m["wrong"], n),
                 "—" if row["kind"] == "null" else rate(m["selected"], n), rate(m["fastest_dropped"], max(m["fastest"], 1)), flagged,
                 once, f"{m['rounds']:.1f}", f"{m['runs']:.1f} ({m['every_round']})"]
        if with_baseline:
            b = row.get("baseline")
            cells += ["—", "—"] if b is None else [rate(b["wrong"], b["sweeps"]), rate(b["selected"], b["sweeps"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", type=int, default=4000)
    parser.add_argument("--baseline", metavar="REF", help="also run the race of this git revision on the same values "
                        "(power and tie rows)")
    parser.add_argument("--output", type=Path, help="write output.md and results.json to this folder")
    args = parser.parse_args(argv)
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        before = None
        if args.baseline:
            tree = Path(tmp) / "tree"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), args.baseline],
                           check=True, capture_output=True)
            before = run_before(tree)
        try:
            rows = []
            for index, (name, kind, scenario, cap, effect) in enumerate(ROWS):
                seed = 1000 + index
                row = {"name": name, "kind": kind, "cap": cap, "seed": seed, "min_effect": effect,
                       "noise": list(scenario.noise), "measured": measure(scenario, cap, effect, args.sweeps, seed)}
                if before is not None and kind in ("power", "tie") and cap == 10:
                    row["baseline"] = measure(scenario, cap, effect, args.sweeps, seed, before)
                rows.append(row)
                print(f"{name}, cap {cap}: {row['measured']}", file=sys.stderr, flush=True)
        finally:
            if args.baseline:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(Path(tmp) / "tree")],
                               check=True)
    text = (f"Selection race, {args.sweeps:,} seeded sweeps per row (α = {race.ALPHA:.0%}; noise {mixed(2)[0]:.0%} "
            f"and {mixed(2)[1]:.0%} alternating, 5 % drift per round"
            + (f"; 'before': the race of {args.baseline} on the same values" if args.baseline else "")
            + f"; {time.time() - started:.0f} s)\n\n" + table(rows, bool(args.baseline)))
    print(text)
    if args.output:
        args.output.mkdir(parents=True, exist_ok=True)
        (args.output / "output.md").write_text(text)
        (args.output / "results.json").write_text(json.dumps({"sweeps": args.sweeps, "baseline": args.baseline,
                                                               "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
