"""`gpt2bench run FILE.yaml`: the whole sweep on this machine, no cluster, with a report.

Validates the file exactly as the operator does (a bad field exits 2 and runs nothing), checks that the
data and pretrained weights it names are here (`gpt2bench.local.preflight`: exit 2 before any process
starts), plans it, and runs the sweep (`gpt2bench.local.sweep`). `spec.concurrency` is not honoured
locally: runs go one at a time. A file of several GPT2Benchmarks (`---` between them, as `kubectl apply -f`
takes it) runs each in turn, every one checked before the first starts, each in its own folder
(`results/<name>`, or `--output DIR/<name>`); `--name NAME` runs only that one. A folder that already holds
results is refused unless `--resume` (keep its finished runs, run the rest) or `--overwrite` says what to do.
Ctrl-C, SIGTERM and SIGHUP (a closed terminal or SSH session) stop the sweep the same way. Exit code: 0 when at
least one run of every benchmark succeeded (failed runs are in the table with their reasons), 1 when every run
of a benchmark failed, 2 for a bad file or option, 3 when the disk holding the results folder filled up (the
finished runs kept in results.json, the run in flight Interrupted: `--resume` goes on from there), 130 when
interrupted (later benchmarks are not started).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
from pathlib import Path
from typing import Any

from gpt2bench import report
from gpt2bench.files import DISK_FULL_ERRNOS, DiskFull, FolderBusy, describe_disk, disk_full, release, reserving
from gpt2bench.jobkinds import BACKENDS, OFFLINE_BACKEND
from gpt2bench.local.preflight import preflight
from gpt2bench.local.sweep import (
    FolderRefused,
    Resumed,
    Stopped,
    configuration_key,
    prepare_folder,
    run_sweep,
    select_runs,
    with_steps,
)
from gpt2bench.plan import plan_runs
from gpt2bench.report.export import RESULTS_CSV
from gpt2bench.specification.model import Benchmark
from gpt2bench.specification.validation import SpecError, load_benchmarks_file
from gpt2bench.status import (
    FAILED,
    INTERRUPTED,
    RESULTS_JSON,
    RUNNING,
    SKIPPED,
    SUCCEEDED,
    ResultsDocument,
    interrupt_runs,
)

EXIT_BAD_INPUT = 2
EXIT_DISK_FULL = 3
EXIT_INTERRUPTED = 130
DISK_FULL_WORDS = tuple(os.strerror(code) for code in DISK_FULL_ERRNOS)  # as a failed run's reason says them


STOP_SIGNALS = {  # what each signal the runner handles like Ctrl-C means, in the words results.json gives
    signal.SIGINT: "Ctrl-C (SIGINT)",
    signal.SIGTERM: "SIGTERM",
    signal.SIGHUP: "SIGHUP (its terminal or SSH session closed)",
}


class _Stop:
    """The first stop signal raises `Stopped`; later ones are ignored so that the cleanup (killing the replicas,
    writing the report) is not itself cut short. After SIGHUP the terminal is gone: what would be printed on it
    goes to /dev/null, so that writing there cannot fail the cleanup (a redirected output is left as it is)."""

    def __init__(self) -> None:
        self.signalled = False
        self.terminal = [fd for fd in (1, 2) if os.isatty(fd)]  # asked now: a hung-up terminal is no tty any more

    def __call__(self, signum: int, _frame: Any) -> None:
        if self.signalled:
            return
        self.signalled = True
        if signum == signal.SIGHUP:
            _silence(self.terminal)
        raise Stopped(STOP_SIGNALS.get(signum, signal.Signals(signum).name))


def _silence(descriptors: list[int]) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in descriptors:
            os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpt2bench run",
        description="Run a GPT2Benchmark YAML on this machine: the same jobs the operator creates, executed as "
        "local processes one at a time; results.json, results.md and PNG plots in --output.",
    )
    parser.add_argument("file", help="GPT2Benchmark YAML (the one you would `kubectl apply`): one or several "
                                     "documents separated by ---, run in turn")
    parser.add_argument("--name", help="run only the GPT2Benchmark of this metadata.name (of a file of several)")
    parser.add_argument("--output", "-o", help="results folder (default: results/<benchmark name>; for a file of "
                                               "several benchmarks, one subfolder per benchmark name in it)")
    parser.add_argument("--steps", type=_positive, help="override spec.training.steps (quick tries)")
    parser.add_argument("--only", metavar="REGEX", help="run only the runs whose name matches REGEX")
    existing = parser.add_mutually_exclusive_group()
    existing.add_argument("--resume", action="store_true",
                          help="the output folder holds an unfinished sweep of this file: keep its finished runs "
                               "(Succeeded, Failed) and run the others")
    existing.add_argument("--overwrite", action="store_true",
                          help="the output folder holds results: start again (its runs/ folder is removed)")
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
        benchmarks = load_benchmarks_file(args.file, args.name)
    except OSError as exc:
        return refuse([f"cannot read {args.file}: {exc.strerror or exc}"])
    except SpecError as exc:
        return refuse(exc.lines())
    if args.steps:
        try:
            benchmarks = [with_steps(benchmark, args.steps) for benchmark in benchmarks]
        except SpecError as exc:
            return refuse([f"--steps {args.steps} ({path}): {message}" for path, message in exc.errors])
    notes: dict[str, list[str]] = {}
    for benchmark in benchmarks:
        problems, notes[benchmark.name] = preflight(benchmark.spec)
        named = f"{benchmark.name}: " if len(benchmarks) > 1 else ""
        if problems:
            return refuse([f"{args.file}: {named}{path}: {message}" for path, message in problems])
    chosen: dict[str, tuple[list, int]] = {}  # name -> (the runs --only keeps, how many the sweep has)
    for benchmark in benchmarks:
        all_runs = plan_runs(benchmark, args.backend)
        try:
            chosen[benchmark.name] = (select_runs(all_runs, args.only), len(all_runs))
        except re.error as exc:
            err.print(f"gpt2bench run: --only: invalid regular expression: {exc}", highlight=False)
            return 2
    if not any(runs for runs, _ in chosen.values()):
        names = ", ".join(run.name for benchmark in benchmarks for run in plan_runs(benchmark, args.backend))
        total = sum(count for _, count in chosen.values())
        err.print(f"gpt2bench run: --only {args.only!r} matches none of the {total} runs: {names}",
                  highlight=False, markup=False)
        return 2
    prepared: dict[str, tuple[list, Resumed, Path]] = {}  # every folder decided before the first run starts
    for benchmark in benchmarks:
        runs, _ = chosen[benchmark.name]
        if not runs:
            continue
        directory = _output(args.output, benchmark.name, several=len(benchmarks) > 1)
        if not args.overwrite and (directory / RESULTS_JSON).exists():  # named by its first bad field, not dumped
            from gpt2bench.report.cli import DocumentError, load_folder

            try:
                load_folder(directory)
            except DocumentError as exc:
                return refuse([f"{exc}; --overwrite starts again, or give another --output"])
        try:
            prepared[benchmark.name] = (*prepare_folder(benchmark, plan_runs(benchmark, args.backend), runs,
                                                        directory, resume=args.resume, overwrite=args.overwrite),
                                        directory)
        except FolderRefused as exc:
            return refuse([str(exc)])
    codes = []
    for benchmark in benchmarks:
        runs, total = chosen[benchmark.name]
        if not runs:  # a file of several: --only picks runs of the others
            err.print(f"gpt2bench run: {benchmark.name}: --only {args.only!r} matches none of its {total} runs",
                      highlight=False, markup=False)
            continue
        runs, resumed, directory = prepared[benchmark.name]
        codes.append(_run_benchmark(benchmark, runs, total, directory, notes[benchmark.name], resumed, args.file))
        if codes[-1] in (EXIT_INTERRUPTED, EXIT_BAD_INPUT, EXIT_DISK_FULL):
            return codes[-1]
    return max(codes)


def _rounds_to_add(benchmark: Benchmark, runs: list) -> str:
    """With sweep.maxRepeats the planned runs are the first rounds; say how many more the sweep may add."""
    sweep = benchmark.spec.sweep
    if sweep.max_repeats is None or not runs:
        return ""
    rounds = sweep.max_repeats - sweep.repeats
    per_round = len({configuration_key(run) for run in runs})
    return (f", then up to {rounds} round{'s' * (rounds > 1)} of the configurations still racing (at most "
            f"{rounds * per_round} runs, fewer as the race drops the beaten; sweep.maxRepeats {sweep.max_repeats})")


def _disk_full(exc: OSError, directory: Path, file: str) -> int:
    """The disk holding `directory` filled up: results.json made consistent with the room kept back (the finished
    runs as they were, the run in flight and a run the full disk failed Interrupted, the rest Skipped: `--resume`
    runs them), one line saying which disk and what to do, and exit code 3."""
    from rich.console import Console

    err = Console(stderr=True)
    release(directory)
    words = str(exc) if isinstance(exc, DiskFull) else \
        f"{exc.strerror or exc} writing in {directory}: {describe_disk(directory)} is full"
    try:
        doc = ResultsDocument.load(directory)
    except (OSError, ValueError):
        doc = None
    if doc is not None and doc.phase == RUNNING:  # the runs stopped: say so in the results
        why = f"the disk filled up while it ran ({words})"
        runs = [run.model_copy(update={"phase": RUNNING}) if run.phase == FAILED and run.reason
                and any(w in run.reason for w in DISK_FULL_WORDS) else run for run in doc.runs]
        doc = doc.model_copy(update={"runs": interrupt_runs(runs, why, "not run: the disk filled up"),
                                     "phase": INTERRUPTED})
        try:
            doc.save(directory)
        except OSError as again:
            err.print(f"gpt2bench run: results.json could not be updated either: {again}", highlight=False,
                      markup=False, soft_wrap=True)
        finished = sum(run.phase in (SUCCEEDED, FAILED) for run in doc.runs)
        interrupted = [run.name for run in doc.runs if run.phase == INTERRUPTED]
        skipped = sum(run.phase == SKIPPED for run in doc.runs)
        err.print(f"gpt2bench run: {words}. The sweep stopped: {finished} of {len(doc.runs)} runs finished are kept "
                  f"in {directory / RESULTS_JSON}" + (f", {', '.join(interrupted)} interrupted" if interrupted else "")
                  + (f", {skipped} not run" if skipped else "")
                  + f". Free space on that disk, then: gpt2bench run {file} --resume --output {directory}",
                  highlight=False, markup=False, soft_wrap=True)
    else:  # every run finished: the report could not be written
        err.print(f"gpt2bench run: {words}. Every run finished and is in {directory / RESULTS_JSON}; the report is "
                  f"incomplete. Free space on that disk, then: gpt2bench report {directory}",
                  highlight=False, markup=False, soft_wrap=True)
    return EXIT_DISK_FULL


def _output(output: str | None, name: str, several: bool) -> Path:
    """results/<name> by default; --output itself for one benchmark, --output/<name> for each of several."""
    if output is None:
        return Path("results") / name
    return Path(output) / name if several else Path(output)


def _run_benchmark(benchmark: Benchmark, runs: list, total: int, directory: Path, notes: list[str],
                   resumed: Resumed, file: str = "FILE") -> int:
    """Run one benchmark's runs (of its `total`; `resumed`: those an earlier sweep finished, kept) into `directory`,
    print its table; 0, 1 (every run failed), 2 (another process took the folder), 3 (its disk filled up) or 130."""
    from rich.console import Console

    console = Console()
    for note in notes:
        console.print(f"note: {note}", highlight=False, markup=False)
    if benchmark.spec.concurrency > 1:
        console.print(
            f"note: spec.concurrency={benchmark.spec.concurrency} is for clusters; locally runs go "
            "one at a time so that they do not disturb each other's timings",
            highlight=False,
        )
    kept = f", {len(resumed.kept)} kept from the earlier sweep" if resumed.kept else ""
    console.print(f"{benchmark.name}: {len(runs)} of {total} runs{kept}{_rounds_to_add(benchmark, runs)} -> {directory}",
                  highlight=False)

    stop = _Stop()
    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with reserving(directory):  # room for results.json's last word if the disk fills (files.reserving)
            sweep = run_sweep(benchmark, runs, directory, console=console, resumed=resumed)
    except OSError as exc:
        if not disk_full(exc) or isinstance(exc, FolderBusy):
            raise
        return _disk_full(exc, directory, file)
    except FolderBusy as exc:  # another `gpt2bench run` took the folder since it was checked
        Console(stderr=True).print(f"gpt2bench run: {exc}; nothing was run", highlight=False, markup=False)
        return EXIT_BAD_INPUT
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
