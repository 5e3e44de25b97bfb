"""Why is Horovod slower than DDP on CPU at equal threads? Its two candidate settings, apart and together.

Measured before: at 1 thread per rank on 2 cores, horovod/ddp was 0.77 (idle) and 0.40 (busy); a first try
with `OMPI_MCA_mpi_yield_when_idle=1 HOROVOD_CYCLE_TIME=5` gave 0.97 and 1.22. This script separates them:
every round runs the CPU example's ddp (the reference) and horovod four times (as shipped, each setting alone,
both), shuffled per round, and prints each variant's horovod ÷ ddp from the within-round ratios with its 95 %
interval (docs/analysis.md, Rounds as blocks):
- `OMPI_MCA_mpi_yield_when_idle=1`: Open MPI's ranks yield the CPU while they wait instead of busy-polling
  (a busy-polling rank takes the core its neighbour computes on);
- `HOROVOD_CYCLE_TIME=5` (ms; Horovod's default 1): Horovod's background thread wakes less often to look for
  tensors to reduce (a thread beside a 1-thread rank competes with it for the core).
The settings reach every rank as a Horovod user would set them (the launcher's environment, `mpirun -x`).
Whichever setting closes the gap is the cause. Measured on a quiet machine (docs/performance.md): yielding
alone closes it, so CPU runs' mpirun now gets `-mca mpi_yield_when_idle 1` (gpt2bench/render/mpijob.py,
CPU_MCA); every variant here starts from Open MPI's default (busy-polling), so that the script still measures
the gap the fix closes. GPU runs keep the default: unmeasured there.

    python benchmarks/bench_horovod_cpu.py --rounds 6 [--steps 30] [--output DIR]
"""

from __future__ import annotations

import argparse
import copy
import tempfile
from pathlib import Path

from rounds import example, geometric_mean_tps, paired_ratio, rendered, run_rounds, unsteady_share, with_env

from gpt2bench.render.mpijob import CPU_MCA

SETTINGS = {
    "shipped": {},  # Open MPI's default (busy-polling): what was shipped before this script's finding
    "yield": {"OMPI_MCA_mpi_yield_when_idle": "1"},
    "cycle": {"HOROVOD_CYCLE_TIME": "5"},
    "both": {"OMPI_MCA_mpi_yield_when_idle": "1", "HOROVOD_CYCLE_TIME": "5"},
}


def variants(steps: int | None) -> dict[str, list]:
    """ddp once and horovod once per setting, each a configuration of its own."""
    benchmark, runs = example(("ddp", "horovod"), steps)
    by_strategy = {run.strategy.name: rendered(benchmark, run) for run in runs}
    found = {"ddp": [by_strategy["ddp"]]}
    bench, run, job = by_strategy["horovod"]
    job = busy_polling(job)  # every variant starts from Open MPI's default, as measured before the fix
    for label, env in SETTINGS.items():
        found[f"hvd-{label}"] = [(bench, run, with_env(job, env) if env else job)]
    return found


def busy_polling(job: dict) -> dict:
    """The MPIJob without the rendered CPU `-mca mpi_yield_when_idle 1` (the fix this script measured): Open
    MPI's default, in which a waiting rank busy-polls."""
    job = copy.deepcopy(job)
    for spec in job["spec"]["mpiReplicaSpecs"].values():
        for container in spec["template"]["spec"]["containers"]:
            command = container.get("command") or []
            for at in range(len(command) - 2):
                if command[at:at + 3] == list(CPU_MCA):
                    container["command"] = command[:at] + command[at + 3:]
                    break
    return job


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=None, help="override the example's steps")
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument("--output", type=Path, default=None, help="results folder (default: a temporary one)")
    args = parser.parse_args()
    output = args.output or Path(tempfile.mkdtemp(prefix="bench-horovod-cpu-"))
    found = run_rounds(variants(args.steps), args.rounds, args.seed, output)
    print(f"\n{args.rounds} rounds, results in {output}")
    print("| variant | settings | tokens/s (geometric mean) | unsteady runs | horovod ÷ ddp [95 % interval, paired] |")
    print("|---|---|---:|---:|---|")
    for label, entries in found.items():
        settings = " ".join(f"{k}={v}" for k, v in SETTINGS.get(label.removeprefix("hvd-"), {}).items())
        tps = geometric_mean_tps(entries)
        ratio = paired_ratio(entries, found["ddp"]) if label != "ddp" else None
        shown = f"{ratio.estimate:.2f} [{ratio.low:.2f}, {ratio.high:.2f}]" if ratio else "—"
        print(f"| {label} | {settings or '—'} | {tps or 0:,.0f} | {unsteady_share(entries)} | {shown} |")


if __name__ == "__main__":
    main()
