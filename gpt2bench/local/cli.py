"""`gpt2bench run FILE.yaml`: the whole sweep on this machine, no cluster, with a report.

Validates the file exactly as the operator does (a bad field exits 2 and runs nothing), checks that the
data and pretrained weights it names are here (`gpt2bench.local.preflight`: exit 2 before any process
starts), plans it, and runs the sweep (`gpt2bench.local.sweep`). `spec.concurrency` is not honoured
locally: runs go one at a time. Exit code: 0 when at least one run succeeded (failed runs are in the
table with their reasons), 1 when every run failed, 2 for a bad file or option, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import re
import signal
from pathlib import Path
from typing import Any

from gpt2bench import report
from gpt2bench.jobkinds import BACKENDS, OFFLINE_BACKEND
from gpt2bench.local.preflight import preflight
from gpt2bench.local.sweep import run_sweep, select_runs, with_steps
from gpt2bench.plan import plan_runs
from gpt2bench.report.export import RESULTS_CSV
from gpt2bench.spec import SpecError, load_benchmark_file
from gpt2bench.status import RESULTS_JSON, SUCCEEDED

EXIT_INTERRUPTED = 130


class _Stop:
    """First SIGINT/SIGTERM raises KeyboardInterrupt; later ones are ignored so that the cleanup
    (killing the replicas, writing the report) is not itself cut short."""

    def __init__(self) -> None:
        self.signalled = False

    def __call__(self, signum: int, _frame: Any) -> None:
        if self.signalled:
            return
        self.signalled = True
        raise KeyboardInterrupt


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpt2bench run",
        description="Run a GPT2Benchmark YAML on this machine: the same jobs the operator creates, executed as "
        "local processes one at a time; results.json, results.md and PNG plots in --output.",
    )
    parser.add_argument("file", help="GPT2Benchmark YAML (the one you would `kubectl apply`)")
    parser.add_argument("--output", "-o", help="results folder (default: results/<benchmark name>)")
    parser.add_argument("--steps", type=_positive, help="override spec.training.steps (quick tries)")
    parser.add_argument("--only", metavar="REGEX", help="run only the runs whose name matches REGEX")
    parser.add_argument("--backend", choices=BACKENDS,
                        help="run the jobs of this backend instead of spec.backend's (auto runs "
                             f"{OFFLINE_BACKEND} here): trainjob (Trainer v2 TrainJobs) or pytorchjob (PyTorchJob, MPIJob)")
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    args = build_parser().parse_args(argv)
    err = Console(stderr=True)

    def refuse(lines: list[str]) -> int:
        for line in [*lines, "nothing was run"]:
            err.print(f"gpt2bench run: {line}", highlight=False, markup=False, soft_wrap=True)  # one line each
        return 2

    try:
        benchmark = load_benchmark_file(args.file)
    except OSError as exc:
        return refuse([f"cannot read {args.file}: {exc.strerror or exc}"])
    except SpecError as exc:
        return refuse(exc.lines())
    if args.steps:
        try:
            benchmark = with_steps(benchmark, args.steps)
        except SpecError as exc:
            return refuse([f"--steps {args.steps} ({path}): {message}" for path, message in exc.errors])
    problems, notes = preflight(benchmark.spec)
    if problems:
        return refuse([f"{args.file}: {path}: {message}" for path, message in problems])
    all_runs = plan_runs(benchmark, args.backend)
    try:
        runs = select_runs(all_runs, args.only)
    except re.error as exc:
        err.print(f"gpt2bench run: --only: invalid regular expression: {exc}", highlight=False)
        return 2
    if not runs:
        names = ", ".join(run.name for run in all_runs)
        err.print(
            f"gpt2bench run: --only {args.only!r} matches none of the {len(all_runs)} runs: {names}",
            highlight=False,
            markup=False,
        )
        return 2
    directory = Path(args.output or Path("results") / benchmark.name)
    console = Console()
    for note in notes:
        console.print(f"note: {note}", highlight=False, markup=False)
    if benchmark.spec.concurrency > 1:
        console.print(
            f"note: spec.concurrency={benchmark.spec.concurrency} is for clusters; locally runs go "
            "one at a time so that they do not disturb each other's timings",
            highlight=False,
        )
    console.print(f"{benchmark.name}: {len(runs)} of {len(all_runs)} runs -> {directory}", highlight=False)

    stop = _Stop()
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        sweep = run_sweep(benchmark, runs, directory, console=console)
    except KeyboardInterrupt:  # after the last run, while the report was being written
        console.print(
            f"interrupted while writing the report; {directory / RESULTS_JSON} is consistent",
            style="yellow",
            highlight=False,
        )
        return EXIT_INTERRUPTED
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    doc = sweep.doc
    report.print_table(doc, console)
    console.print(f"results: {directory / RESULTS_JSON}, {directory / report.RESULTS_MD}, "
                  f"{directory / RESULTS_CSV}", highlight=False)
    if sweep.interrupted:
        console.print("interrupted: finished runs are kept in the results", style="yellow")
        return EXIT_INTERRUPTED
    succeeded = sum(entry.phase == SUCCEEDED for entry in doc.runs)
    return 0 if succeeded else 1
