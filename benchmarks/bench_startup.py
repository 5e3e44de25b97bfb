"""Start-up per run in `gpt2bench run`, with the fork server and without it, side by side.

Start-up per run (docs/local.md): a run's job time (its first process started to its last one's exit seen) minus
its worker 0's training time (first step to the end of the last): launchers, interpreters, imports, rendezvous,
data, model, and everything after the last step. Before the fork server, 4.9 s of a 9.0 s run at the median with fresh
processes; the target is 1.5 s.

Every round runs the CPU example's fp32 run of every strategy twice, through the executor `gpt2bench run` uses:
once with the fork server's socket in its environment (forked: what the sweep does by default) and once without
(fresh processes: GPT2BENCH_FORKSERVER=off), in an order shuffled per round; one server serves the whole script
and waits, idle, while the fresh runs run. Forked against fresh is paired within rounds (the geometric mean of the
within-round ratios with its 95 % t interval), for start-up, for tokens/s (training itself must not change) and for
the memory peak; the final loss must be the same number. Each round also runs benchmarks/bench_trainer.py (the
trainer's loop against a bare loop, in one process) once fresh and once forked: its trainer/bare ratio must not
change either. Last, the default example's start-up share: the runs' start-up over their job time, summed.

    python benchmarks/bench_startup.py [--rounds 5] [--steps 12] [--output DIR]
    python benchmarks/bench_startup.py --report DIR/runs.json     # the tables again, from the saved figures
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rounds import example

from gpt2bench import collect
from gpt2bench.conventions import FORKSERVER_ENV
from gpt2bench.local import forkclient, forkserver
from gpt2bench.local.executor import execute_job
from gpt2bench.local.sweep import child_env, job_timing
from gpt2bench.render import render_job

STRATEGIES = ("single", "dataparallel", "ddp", "fsdp", "horovod", "ps")
MODES = ("fresh", "forked")
TARGET_SECONDS = 1.5
BENCH_TRAINER = Path(__file__).resolve().parent / "bench_trainer.py"


def run_once(benchmark, run, env: dict[str, str], folder: Path) -> dict:
    """One run's job through the executor, collected as the sweep collects it: its figures."""
    job = render_job(benchmark, run)
    outcome = execute_job(job, folder, base_env=env)
    entry = collect.collect_run(run, job_succeeded=outcome.phase == "Succeeded",
                                termination_message=outcome.termination_message, job_reason=outcome.reason,
                                cause=outcome.cause)
    results = entry.results
    ok = entry.phase == "Succeeded" and results is not None
    return {"phase": entry.phase, "reason": entry.reason, **job_timing(outcome.seconds, entry),
            "worker_startup": results.startup_seconds if ok else None,
            "train": results.train_seconds if ok else None,
            "tokens_per_second": results.tokens_per_second if ok else None,
            "peak_memory": results.peak_memory_bytes if ok else None,
            "final_loss": results.final_loss if ok else None}


def trainer_ratio(shim: Path, env: dict[str, str], forked: bool) -> float | None:
    """benchmarks/bench_trainer.py's trainer/bare throughput, fresh or forked."""
    argv = [str(shim), "--repeats", "4"]
    if forked:
        argv = [sys.executable, "-m", forkclient.__name__, *argv]
    done = subprocess.run(argv, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=900,
                          check=False)
    found = re.search(r"trainer/bare throughput: ([\d.]+)x", done.stdout)
    return float(found.group(1)) if found else None


def shim_for(folder: Path) -> Path:
    """bench_trainer.py as an executable script of this interpreter (what the fork server runs)."""
    shim = folder / "bench_trainer"
    shim.write_text(f"#!{sys.executable}\nimport runpy, sys\nsys.argv[0] = {str(BENCH_TRAINER)!r}\n"
                    f"runpy.run_path({str(BENCH_TRAINER)!r}, run_name='__main__')\n")
    shim.chmod(0o755)
    return shim


# ---------------------------------------------------------------- figures
def paired(a: list[float | None], b: list[float | None]) -> tuple[float, float, float] | None:
    """a ÷ b over the rounds where both have a figure: the geometric mean of the within-round ratios and its 95 %
    t interval (None below 2 such rounds)."""
    from scipy.stats import t

    logs = [math.log(x / y) for x, y in zip(a, b, strict=True) if x and y]
    if len(logs) < 2:
        return None
    mean, half = statistics.fmean(logs), t.ppf(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def median(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def share(records: list[dict]) -> float | None:
    """Start-up over job time, summed over the runs that have both."""
    done = [r for r in records if r.get("overhead_seconds") is not None]
    return sum(r["overhead_seconds"] for r in done) / sum(r["job_seconds"] for r in done) if done else None


def shown(ratio: tuple[float, float, float] | None, digits: int = 2) -> str:
    return "—" if ratio is None else f"{ratio[0]:.{digits}f} [{ratio[1]:.{digits}f}, {ratio[2]:.{digits}f}]"


def seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def rest(records: list[dict]) -> list[float | None]:
    """Start-up per run less worker 0's own start-up: the launchers before worker 0 started, and the end."""
    return [r["overhead_seconds"] - r["worker_startup"] if r.get("worker_startup") is not None else None
            for r in records]


def report(records: dict[str, dict[str, list[dict]]], trainer: dict[str, list[float | None]]) -> list[str]:
    """The tables, as markdown lines."""
    lines = ["| strategy | start-up per run, fresh (s) | forked (s) | forked ÷ fresh [95 %, paired] | "
             "worker 0 to step 1, fresh (s) | forked (s) | launchers and end, fresh (s) | forked (s) | "
             "tokens/s forked ÷ fresh | peak memory forked ÷ fresh | same final loss |",
             "|---|---:|---:|---|---:|---:|---:|---:|---|---|---|"]
    for strategy, by_mode in records.items():
        fresh, forked = by_mode["fresh"], by_mode["forked"]

        def column(key: str, mode: list[dict]) -> list[float | None]:
            return [r.get(key) for r in mode]

        same = sum(1 for f, k in zip(fresh, forked, strict=True) if f["final_loss"] is not None
                   and f["final_loss"] == k["final_loss"])
        both = sum(1 for f, k in zip(fresh, forked, strict=True) if f["final_loss"] is not None
                   and k["final_loss"] is not None)
        lines.append(
            f"| {strategy} | {seconds(median(column('overhead_seconds', fresh)))} | "
            f"{seconds(median(column('overhead_seconds', forked)))} | "
            f"{shown(paired(column('overhead_seconds', forked), column('overhead_seconds', fresh)))} | "
            f"{seconds(median(column('worker_startup', fresh)))} | {seconds(median(column('worker_startup', forked)))} | "
            f"{seconds(median(rest(fresh)))} | {seconds(median(rest(forked)))} | "
            f"{shown(paired(column('tokens_per_second', forked), column('tokens_per_second', fresh)), 3)} | "
            f"{shown(paired(column('peak_memory', forked), column('peak_memory', fresh)), 3)} | {same}/{both} |")
    every = {mode: [r for by_mode in records.values() for r in by_mode[mode]] for mode in MODES}
    overall = {mode: median([r.get("overhead_seconds") for r in every[mode]]) for mode in MODES}
    failed = {mode: sum(r["phase"] != "Succeeded" for r in every[mode]) for mode in MODES}
    verdict = "ok" if overall["forked"] is not None and overall["forked"] <= TARGET_SECONDS else "MISSED"
    lines += [
        "",
        f"median start-up per run, every strategy: fresh {seconds(overall['fresh'])} s, forked "
        f"{seconds(overall['forked'])} s (target <= {TARGET_SECONDS} s: {verdict}); runs not succeeded: fresh "
        f"{failed['fresh']}, forked {failed['forked']}",
        "",
        "| the example's runs | start-up share of their job time | trainer/bare throughput (bench_trainer.py, median) |",
        "|---|---:|---:|",
    ]
    for mode in MODES:
        value = share(every[mode])
        lines.append(f"| {mode} | {'—' if value is None else f'{value * 100:.0f} %'} | "
                     f"{'—' if median(trainer[mode]) is None else f'{median(trainer[mode]):.3f}'} |")
    lines.append(f"trainer/bare forked ÷ fresh [95 %, paired]: {shown(paired(trainer['forked'], trainer['fresh']), 3)}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=12, help="training.steps of every run (the example's: 12)")
    parser.add_argument("--seed", type=int, default=35)
    parser.add_argument("--output", type=Path, default=None, help="folder for the runs and runs.json")
    parser.add_argument("--report", type=Path, default=None, help="print the tables of a saved runs.json")
    args = parser.parse_args()
    saved = json.loads(args.report.read_text()) if args.report else measure(args)
    meta = saved["meta"]
    print(f"{meta['rounds']} rounds of {len(saved['records'])} strategies x {{fresh, forked}}, {meta['steps']} steps "
          f"each (fp32, no breakdown), {meta['started']} to {meta['ended']}; load average {meta['load'][0]:.2f} at "
          f"the start, {meta['load'][1]:.2f} at the end")
    print("\n".join(report(saved["records"], saved["trainer"])))


def measure(args: argparse.Namespace) -> dict:
    """Run the rounds; the figures, also saved as OUTPUT/runs.json."""
    output = args.output or Path(tempfile.mkdtemp(prefix="bench-startup-"))
    output.mkdir(parents=True, exist_ok=True)
    benchmark, runs = example(STRATEGIES, args.steps)
    plain = {k: v for k, v in child_env().items() if k != FORKSERVER_ENV}
    records = {run.strategy.name: {mode: [] for mode in MODES} for run in runs}
    trainer: dict[str, list[float | None]] = {mode: [] for mode in MODES}
    shim = shim_for(output)
    meta = {"rounds": args.rounds, "steps": args.steps, "started": utc_now(), "load": [os.getloadavg()[0]]}
    with forkserver.serving(plain, output / "forkserver.log") as served:
        if FORKSERVER_ENV not in served:
            raise SystemExit(f"the fork server did not start: {output / 'forkserver.log'}")
        env = {"fresh": plain, "forked": served}
        for round_ in range(1, args.rounds + 1):
            items = [(run, mode) for run in runs for mode in MODES]
            random.Random(args.seed + round_).shuffle(items)
            for run, mode in items:
                folder = output / f"round-{round_}" / f"{run.strategy.name}-{mode}"
                record = run_once(benchmark, run, env[mode], folder)
                records[run.strategy.name][mode].append(record)
                print(f"round {round_} {run.strategy.name:<12} {mode:<6} {record['phase']:<9} start-up "
                      f"{seconds(record.get('overhead_seconds'))} s of {seconds(record.get('job_seconds'))} s",
                      file=sys.stderr, flush=True)
            for mode in MODES if round_ % 2 else MODES[::-1]:
                trainer[mode].append(trainer_ratio(shim, env[mode], mode == "forked"))
    meta.update(ended=utc_now(), load=[*meta["load"], os.getloadavg()[0]], output=str(output))
    saved = {"meta": meta, "records": records, "trainer": trainer}
    (output / "runs.json").write_text(json.dumps(saved, indent=1))
    return saved


def utc_now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


if __name__ == "__main__":
    main()
