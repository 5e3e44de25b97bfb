"""The selection race's error rates, power and cost, measured by simulation through the shipped race
(gpt2bench.report.race): the table docs/analysis.md quotes (The selection race, Calibration).

Synthetic sweeps (benchmarks/race_scenarios.py): configurations whose runs measure their true tokens/s times
log-normal noise, quiet (3 %) and noisy (8 %) ones alternating, plus a 5 % drift every run of a round shares.
Each row is `--sweeps` seeded sweeps raced to the cap (sweep.maxRepeats); rates carry their 95 % binomial interval
(Wilson). With `--baseline REF` the rule of git revision REF (the analysis before the race: every configuration
every round, decided by analyze() after each round) is run on the very same values, in a worktree of REF.

    python benchmarks/bench_race.py [--sweeps 4000] [--baseline 6c58d3a] [--output docs/results/bench-race]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from race_scenarios import Scenario, equal, mixed, one_ahead, run_races, runs_used  # noqa: E402

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


ROWS: list[tuple[str, Scenario, int, float | None]] = [
    *((f"false 'fastest' claims: {k} equal", equal(k), cap, None) for k in (2, 4, 6, 12) for cap in (6, 10, 20)),
    ("fastest dropped: 6, a noisy one 1 % ahead", one_ahead(6, 0.01, noisy=True), 20, None),
    ("wrong 'within 5 %' claims: 6, a noisy one 12 % ahead", one_ahead(6, 0.12, noisy=True), 20, 0.05),
    *((f"power: {k}, a {kind} one 10 % faster", one_ahead(k, 0.10, noisy), cap, None)
      for k in (2, 4, 6) for kind, noisy in (("quiet", False), ("noisy", True)) for cap in (6, 10, 20)),
    *((f"power: {k}, one 10 % faster, all at 3 % noise", Scenario("quiet", (1.1,) + (1.0,) * (k - 1), (0.03,) * k),
       cap, None) for k in (6,) for cap in (6, 10, 20)),
]


def measure(scenario: Scenario, cap: int, min_effect: float | None, sweeps: int, seed: int) -> dict:
    state = run_races(scenario, cap, sweeps, seed, min_effect)
    fastest = scenario.fastest
    clear = state.outcome == race.CLEAR
    decided = state.outcome != race.RACING
    found = {
        "sweeps": sweeps,
        "claims": int(clear.sum()),
        "decided": int(decided.sum()),
        "rounds": float(np.where(decided, state.decided_in, cap).mean()),
        "runs": float(runs_used(state, cap).mean()),
        "every_round": scenario.entrants * cap,
    }
    if fastest is not None:
        found["named"] = int((clear & (state.pick == fastest)).sum())
        found["fastest_dropped"] = int((state.dropped_in[:, fastest] > 0).sum())
        found["wrong_pick"] = int((decided & (state.pick != fastest)).sum())
    return found


BASELINE_SCRIPT = r'''
import json, math, sys
from datetime import datetime, timezone
import numpy as np
from gpt2bench.report.analysis import analyze
from gpt2bench.status import RunStatus

values = np.load(sys.argv[1])  # sweeps x rounds x configurations of ln tokens/s
cap, fastest = int(sys.argv[2]), int(sys.argv[3])
spec = {"sweep": {"repeats": 2, "maxRepeats": cap}}
named = claims = 0
for sweep in values:
    for k in range(2, cap + 1):  # the old rule: every configuration every round, a look after each round
        runs = [RunStatus(name=f"b-c{c}-fp32-1x2-r{r}", strategy=f"c{c}", precision="fp32", nodes=1,
                          devices_per_node=0, processes_per_node=2, job_kind="PyTorchJob", job_name="x", devices=2,
                          repeat=r, phase="Succeeded", results={"tokens_per_second": math.exp(sweep[r - 1, c])})
                for r in range(1, k + 1) for c in range(sweep.shape[1])]
        try:
            rec = next(r for r in analyze(runs, spec).recommendations if r.objective == "fastest")
        except OverflowError:  # the old rule's crash (issue 35): counted as no decision
            break
        if rec.decision == "clear":
            claims += 1
            named += rec.winner == f"b-c{fastest}-fp32-1x2"
            break
        if rec.decision == "equivalent":
            break
print(json.dumps({"claims": claims, "named": named}))
'''


def baseline(ref: str, scenario: Scenario, cap: int, sweeps: int, seed: int) -> dict:
    """The rule at git revision `ref` on the same values (a worktree of it, its own analysis on PYTHONPATH)."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), ref], check=True,
                       capture_output=True)
        try:
            values = Path(tmp) / "values.npy"
            np.save(values, scenario.values(cap, sweeps, seed))
            fastest = scenario.fastest if scenario.fastest is not None else -1
            out = subprocess.run([sys.executable, "-c", BASELINE_SCRIPT, str(values), str(cap), str(fastest)],
                                 check=True, capture_output=True, text=True, env={"PYTHONPATH": str(tree),
                                                                                 "PATH": "/usr/bin:/bin"})
            return json.loads(out.stdout)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=True)


def table(rows: list[dict], with_baseline: bool) -> str:
    head = ["scenario", "cap", "sweeps", "false claims / wrong", "named the fastest", "rounds to decide",
            "runs (every config every round)"]
    if with_baseline:
        head += ["old rule: false claims", "old rule: named the fastest"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    for row in rows:
        m, n = row["measured"], row["measured"]["sweeps"]
        if row["kind"] == "null":
            wrong, named = rate(m["claims"], n), "—"
        elif row["kind"] == "dropped":
            wrong, named = rate(m["fastest_dropped"], n), rate(m["named"], n)
        elif row["kind"] == "within":
            wrong, named = rate(m["wrong_pick"], n), rate(m["named"], n)
        else:
            wrong, named = rate(m["claims"] - m["named"], n), rate(m["named"], n)
        cells = [row["name"], str(row["cap"]), f"{n:,}", wrong, named, f"{m['rounds']:.1f}",
                 f"{m['runs']:.1f} ({m['every_round']})"]
        if with_baseline:
            b = row.get("baseline")
            if b is None:
                cells += ["—", "—"]
            else:
                cells += [rate(b["claims"] - (b["named"] if row["kind"] != "null" else 0), b["sweeps"]),
                          rate(b["named"], b["sweeps"]) if row["kind"] != "null" else "—"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", type=int, default=4000)
    parser.add_argument("--baseline", metavar="REF", help="also run the rule of this git revision on the same values")
    parser.add_argument("--baseline-sweeps", type=int, default=400, help="sweeps per row for the old rule (slow)")
    parser.add_argument("--output", type=Path, help="write output.md and results.json to this folder")
    parser.add_argument("--reuse", type=Path, metavar="DIR", help="take the old rule's figures of a row from an "
                        "earlier results.json in DIR where that row was measured alike (same scenario, cap, seed, "
                        "revision and sweeps): the old rule is slow, its figures are deterministic")
    args = parser.parse_args(argv)
    started = time.time()
    earlier = {}
    if args.reuse and (args.reuse / "results.json").exists():
        before = json.loads((args.reuse / "results.json").read_text())
        if before.get("baseline") == args.baseline:
            earlier = {(r["name"], r["cap"], r.get("seed", 1000 + i)): r["baseline"]
                       for i, r in enumerate(before["rows"])
                       if "baseline" in r and r["baseline"]["sweeps"] == args.baseline_sweeps}
    rows = []
    for index, (name, scenario, cap, effect) in enumerate(ROWS):
        kind = ("null" if name.startswith("false") else "dropped" if name.startswith("fastest dropped")
                else "within" if name.startswith("wrong") else "power")
        seed = 1000 + index
        row = {"name": name, "kind": kind, "cap": cap, "seed": seed, "min_effect": effect,
               "noise": list(scenario.noise), "measured": measure(scenario, cap, effect, args.sweeps, seed=seed)}
        if args.baseline and kind in ("null", "power") and cap in (10, 20) and scenario.entrants == 6:
            found = earlier.get((name, cap, seed)) or {
                **baseline(args.baseline, scenario, cap, args.baseline_sweeps, seed=seed), "sweeps": args.baseline_sweeps}
            row["baseline"] = found
        rows.append(row)
        print(f"{name}, cap {cap}: {row['measured']}", file=sys.stderr, flush=True)
    text = (f"Selection race, {args.sweeps:,} seeded sweeps per row (α = {race.ALPHA:.0%}; noise {mixed(2)[0]:.0%} "
            f"and {mixed(2)[1]:.0%} alternating, 5 % drift per round; {time.time() - started:.0f} s)\n\n"
            + table(rows, bool(args.baseline)))
    print(text)
    if args.output:
        args.output.mkdir(parents=True, exist_ok=True)
        (args.output / "output.md").write_text(text)
        (args.output / "results.json").write_text(json.dumps({"sweeps": args.sweeps, "baseline": args.baseline,
                                                               "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
