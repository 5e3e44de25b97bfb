"""`gpt2bench run FILE.yaml`: the whole sweep on this machine, no cluster, with a report.

The same path as the operator: the file is validated by `gpt2bench.spec`, planned by `plan_runs`,
each run rendered by `render_job` into the PyTorchJob/MPIJob a cluster would get, and that job is
executed by `gpt2bench.executor` (its replicas as local processes, with the Kubeflow operators' env).
Each finished run becomes a results entry through `gpt2bench.collect`, exactly as the operator does
with the result pod's termination message.

Runs go one at a time: `spec.concurrency` is not honoured locally, because runs sharing one machine
would disturb each other's timings. DIR/results.json is rewritten atomically after every run, so an
interrupted sweep (Ctrl-C, SIGTERM) leaves a consistent folder: finished runs kept, the run in flight
`Interrupted`, the rest `Skipped`. Exit code: 0 when at least one run succeeded (failed runs are in the
table with their reasons), 1 when every run failed, 2 for a bad file or option, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import sysconfig
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Self

import yaml

from gpt2bench import collect, report
from gpt2bench.files import write_atomic
from gpt2bench.executor import JobSpecError, Replica, execute_job
from gpt2bench.plan import Run, plan_runs
from gpt2bench.render import render_job
from gpt2bench.spec import Benchmark, SpecError, load_benchmark_file, validate_spec

INTERRUPTED, SKIPPED = "Interrupted", "Skipped"  # local-only phases (a cluster sweep is never Ctrl-C'd)
EXIT_INTERRUPTED = 130


def rfc3339(moment: datetime | None = None) -> str:
    return (moment or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------- loading


def with_steps(benchmark: Benchmark, steps: int) -> Benchmark:
    """The benchmark with `training.steps` overridden (quick tries); warm-up shrinks to half when it
    would not fit. Re-validated, so the override obeys the same rules as the file."""
    spec = benchmark.spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    spec["training"]["steps"] = steps
    if spec["training"].get("warmupSteps", 0) >= steps:
        spec["training"]["warmupSteps"] = steps // 2
    return benchmark.model_copy(update={"spec": validate_spec(spec)})


def select_runs(runs: list[Run], only: str | None) -> list[Run]:
    if not only:
        return runs
    pattern = re.compile(only)
    return [run for run in runs if pattern.search(run.name)]


# ---------------------------------------------------------------- progress


class StepsTail:
    """Reads a growing steps.jsonl: only complete lines, from where it stopped last time."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self.offset = 0
        self.last: dict[str, Any] | None = None

    def poll(self, replicas_dir: Path) -> dict[str, Any] | None:
        if self.path is None:
            found = sorted(replicas_dir.glob("*/steps.jsonl"))
            if not found:
                return self.last
            self.path = found[0]
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return self.last
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.splitlines():
            record = report.read_steps_line(line)
            if record is not None:
                self.last = record
        return self.last


class Display:
    """rich progress: the sweep (run i of N) and the current run (step, tokens/s, loss)."""

    def __init__(self, console: Any, total_runs: int, steps: int, live: bool):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console, self.steps, self.live = console, steps, live
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
            disable=not live,
        )
        self.sweep = self.progress.add_task("sweep", total=total_runs, stats="")
        self.current = None
        self.tail = StepsTail()

    def __enter__(self) -> Self:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def start_run(self, index: int, total: int, run: Run) -> None:
        self.tail = StepsTail()
        label = f"run {index + 1}/{total} {run.name}"
        if self.live:
            if self.current is not None:
                self.progress.remove_task(self.current)
            self.current = self.progress.add_task(label, total=self.steps, stats="starting")
        else:
            self.console.print(f"{label}: starting ({run.job_kind}, {run.nodes}x{run.procs_per_node})")

    def tick(self, replicas_dir: Path) -> None:
        record = self.tail.poll(replicas_dir)
        if record is None or self.current is None:
            return
        tokens, loss = record.get("tokens_per_second"), record.get("loss")
        stats = (
            f"step {record.get('step')}  "
            f"{f'{tokens:,.0f}' if isinstance(tokens, (int, float)) else '?'} tok/s  "
            f"loss {f'{loss:.4f}' if isinstance(loss, (int, float)) else '?'}"
        )
        self.progress.update(self.current, completed=record.get("step") or 0, stats=stats)

    def end_run(self, entry: dict[str, Any]) -> None:
        self.progress.advance(self.sweep)
        line = f"{entry['name']}: {report.status_label(entry)}"
        tokens = (entry.get("results") or {}).get("tokensPerSecond")
        if tokens is not None:
            line += f" ({tokens:,.0f} tokens/s)"
        self.console.print(line, style="green" if entry["phase"] == "Succeeded" else "red", highlight=False)


# ---------------------------------------------------------------- the sweep


class Sweep:
    """The results document of a local sweep, rewritten atomically at every change."""

    def __init__(self, benchmark: Benchmark, runs: list[Run], directory: Path):
        self.benchmark, self.runs, self.directory = benchmark, runs, directory
        self.interrupted = False
        self.doc: dict[str, Any] = {
            "benchmark": benchmark.name,
            "namespace": benchmark.namespace,
            "spec": benchmark.spec.model_dump(by_alias=True, exclude_none=True, mode="json"),
            "runs": [collect.run_entry(run, phase="Pending") for run in runs],
            "phase": "Running",
            "best": None,
            "startTime": rfc3339(),
            "completionTime": None,
        }

    def save(self) -> None:
        report.write_results_json(self.doc, self.directory)

    def set_entry(self, index: int, entry: dict[str, Any]) -> None:
        self.doc["runs"][index] = entry
        self.save()

    def finish(self) -> None:
        # the operator's own rules for `best` and the overall phase
        from gpt2bench.controller.reconcile import best_run, overall_phase

        runs = self.doc["runs"]
        self.doc["best"] = best_run(runs)
        self.doc["phase"] = INTERRUPTED if self.interrupted else overall_phase(runs)
        self.doc["completionTime"] = rfc3339()
        self.save()


def run_directory(directory: Path, run: Run) -> Path:
    return directory / "runs" / run.name


def execute_run(sweep: Sweep, index: int, job: dict[str, Any], display: Display, base_env: dict[str, str]) -> None:
    run = sweep.runs[index]
    run_dir = run_directory(sweep.directory, run)
    shutil.rmtree(run_dir, ignore_errors=True)  # a previous sweep's files must not pass for this one's
    run_dir.mkdir(parents=True)
    write_atomic(run_dir / "job.yaml", yaml.safe_dump(job, sort_keys=False))
    started = rfc3339()
    sweep.set_entry(
        index,
        {
            **collect.run_entry(run, phase="Running", start_time=started),
            "runDir": str(run_dir.relative_to(sweep.directory)),
        },
    )

    def on_tick(_primary: Replica, _elapsed: float) -> None:
        display.tick(run_dir)

    try:
        outcome = execute_job(job, run_dir, base_env=base_env, on_tick=on_tick)
    except JobSpecError as exc:
        entry = collect.run_entry(
            run, phase="Failed", reason=f"cannot run locally: {exc}", start_time=started, completion_time=rfc3339()
        )
    except KeyboardInterrupt:
        entry = collect.run_entry(run, phase="Pending", start_time=started, completion_time=rfc3339())
        entry.update(phase=INTERRUPTED, reason="stopped by Ctrl-C / SIGTERM; its processes were killed")
        sweep.set_entry(index, _with_files(entry, sweep.directory, run_dir))
        raise
    else:
        entry = collect.collect_run(
            run,
            job_succeeded=outcome.phase == "Succeeded",
            termination_message=outcome.termination_message,
            job_reason=outcome.reason,
            start_time=started,
            completion_time=rfc3339(outcome.completion_time),
        )
    sweep.set_entry(index, _with_files(entry, sweep.directory, run_dir))


def _with_files(entry: dict[str, Any], directory: Path, run_dir: Path) -> dict[str, Any]:
    """Local additions to the results entry: where the run's files are (paths relative to DIR)."""
    entry = {**entry, "runDir": str(run_dir.relative_to(directory))}
    steps = sorted(run_dir.glob("*/steps.jsonl"))  # master-0 / launcher-0 first; ps: the worker's pod
    if steps:
        entry["stepsFile"] = str(steps[0].relative_to(directory))
    return entry


def child_env() -> dict[str, str]:
    """The local 'image': this environment, with this Python's scripts (gpt2bench, torchrun) on PATH."""
    env = dict(os.environ)
    scripts = sysconfig.get_path("scripts")
    if scripts and scripts not in env.get("PATH", "").split(os.pathsep):
        env["PATH"] = scripts + os.pathsep + env.get("PATH", "")
    return env


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


def run_sweep(
    benchmark: Benchmark,
    runs: list[Run],
    directory: Path,
    *,
    jobs: list[dict] | None = None,
    console: Any = None,
    live: bool | None = None,
) -> Sweep:
    """Run `runs` (rendered as `jobs`, default: render_job) one at a time; results land in `directory`.
    A KeyboardInterrupt stops the sweep cleanly: `sweep.interrupted` is then True."""
    from rich.console import Console

    console = console or Console()
    jobs = jobs if jobs is not None else [render_job(benchmark, run) for run in runs]
    if len(jobs) != len(runs):
        raise ValueError(f"{len(runs)} runs but {len(jobs)} jobs")
    directory.mkdir(parents=True, exist_ok=True)
    sweep = Sweep(benchmark, runs, directory)
    sweep.save()
    base_env = child_env()
    live = console.is_terminal if live is None else live
    with Display(console, len(runs), benchmark.spec.training.steps, live) as display:
        try:
            for index, (run, job) in enumerate(zip(runs, jobs)):
                display.start_run(index, len(runs), run)
                execute_run(sweep, index, job, display, base_env)
                display.end_run(sweep.doc["runs"][index])
        except KeyboardInterrupt:
            sweep.interrupted = True
            for entry in sweep.doc["runs"]:
                if entry["phase"] == "Running":  # interrupted between the executor and the entry update
                    entry.update(phase=INTERRUPTED, reason="stopped by Ctrl-C / SIGTERM")
                elif entry["phase"] == "Pending":
                    entry.update(phase=SKIPPED, reason="not started: the sweep was interrupted")
    sweep.finish()
    report.write_report(sweep.doc, directory)
    return sweep


# ---------------------------------------------------------------- CLI


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
    try:
        benchmark = load_benchmark_file(args.file)
        if args.steps:
            benchmark = with_steps(benchmark, args.steps)
    except OSError as exc:
        err.print(f"gpt2bench run: cannot read {args.file}: {exc.strerror or exc}", highlight=False)
        return 2
    except SpecError as exc:
        for path, message in exc.errors:
            where = f"--steps ({path})" if args.steps and path.startswith("spec.training") else path
            err.print(f"gpt2bench run: {args.file}: {where or '(document)'}: {message}", highlight=False, markup=False)
        err.print("gpt2bench run: nothing was run", highlight=False)
        return 2
    all_runs = plan_runs(benchmark)
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
            f"interrupted while writing the report; {directory / report.RESULTS_JSON} is consistent",
            style="yellow",
            highlight=False,
        )
        return EXIT_INTERRUPTED
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    doc = sweep.doc
    report.print_table(doc, console)
    console.print(f"results: {directory / report.RESULTS_JSON}, {directory / report.RESULTS_MD}", highlight=False)
    if sweep.interrupted:
        console.print("interrupted: finished runs are kept in the results", style="yellow")
        return EXIT_INTERRUPTED
    succeeded = sum(entry["phase"] == "Succeeded" for entry in doc["runs"])
    return 0 if succeeded else 1
