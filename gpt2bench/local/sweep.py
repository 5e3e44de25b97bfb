"""The local sweep: each planned run's rendered job executed here, one at a time, into `results.json`.

The same path as the operator: the benchmark is planned by `plan_runs`, each run rendered by
`render_job` into the job a cluster would get, that job executed by `executor` (its replicas as local
processes, with the Kubeflow operators' env), and each finished run collected by `collect.collect_run`
from the result replica's termination message, exactly as the operator does with the result pod's.

Runs go one at a time (runs sharing one machine would disturb each other's timings). DIR/results.json is
rewritten atomically after every change, so an interrupted sweep (Ctrl-C, SIGTERM, SIGHUP) leaves a consistent
folder: finished runs kept, the run in flight `Interrupted`, the rest `Skipped`. The sweep holds DIR while it
writes it (files.holding): a sweep killed outright (SIGKILL) is read as interrupted afterwards
(status.settle_abandoned), and `prepare_folder` decides what an existing DIR becomes: refused, resumed (its
finished runs kept, the others run) or overwritten.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpt2bench import collect, sweepcore
from gpt2bench.clock import SYSTEM_CLOCK, rfc3339
from gpt2bench.conventions import STEPS_FILE
from gpt2bench.diagnosis import holds
from gpt2bench.files import held, holding, write_atomic
from gpt2bench.local import forkserver
from gpt2bench.local.executor import JobSpecError, Replica, execute_job
from gpt2bench.local.progress import Display
from gpt2bench.local.trainjob import runtimes_for
from gpt2bench.plan import Run, order_seed, plan_runs, stopped_configurations
from gpt2bench.render import render_job
from gpt2bench.specification.model import Benchmark
from gpt2bench.specification.validation import validate_spec
from gpt2bench.status import (
    FAILED,
    INTERRUPTED,
    PENDING,
    RESULTS_JSON,
    RUNNING,
    SKIPPED,
    SUCCEEDED,
    LocalRun,
    ResultsDocument,
    RunStatus,
    interrupt_runs,
    interrupted_note,
    settle_abandoned,
)
from gpt2bench.trainer.cpuflags import cpu_emulation_reason


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


def local_entry(entry: RunStatus, **extra: Any) -> LocalRun:
    return LocalRun(**{**dict(entry), **extra})


class Stopped(KeyboardInterrupt):
    """The runner was told to stop (a signal it handles like Ctrl-C); `cause` says by what, in words."""

    def __init__(self, cause: str):
        super().__init__(cause)
        self.cause = cause


def stop_cause(exc: KeyboardInterrupt) -> str:
    return exc.cause if isinstance(exc, Stopped) else "Ctrl-C"


spec_document = sweepcore.spec_document


class Sweep:
    """The results document of a local sweep, saved atomically at every change. `kept`: entries of an earlier
    sweep of the same spec to keep as they are instead of running them (`--resume`), by run name."""

    def __init__(self, benchmark: Benchmark, runs: list[Run], directory: Path, kept: dict[str, LocalRun] | None = None,
                 start_time: str | None = None):
        self.benchmark, self.runs, self.directory = benchmark, list(runs), directory
        self.kept = kept or {}
        self.interrupted = False
        self.doc = ResultsDocument(
            benchmark=benchmark.name,
            namespace=benchmark.namespace,
            spec=spec_document(benchmark.spec),
            runs=[self.kept.get(run.name) or local_entry(collect.run_entry(run, phase=PENDING)) for run in runs],
            phase=RUNNING,
            start_time=start_time or SYSTEM_CLOCK.stamp(),
            rounds_planned=max((run.repeat or 0 for run in runs), default=0) or None,
        )
        if self.doc.rounds_planned:
            self.doc.order_seed = order_seed(benchmark)

    def save(self) -> None:
        self.doc.save(self.directory)

    def set_entry(self, index: int, entry: LocalRun) -> None:
        self.doc.runs[index] = entry
        self.save()

    def finish(self) -> None:
        """The operator's own rules for `best`, the overall phase and the rounds done (sweepcore.tally)."""
        tally = sweepcore.tally(self.doc.runs, rounds=bool(self.doc.rounds_planned))
        if self.doc.rounds_planned:
            self.doc.rounds_done = tally.rounds_done
        self.doc.best = tally.best
        self.doc.phase = INTERRUPTED if self.interrupted else tally.phase
        self.doc.completion_time = SYSTEM_CLOCK.stamp()
        self.save()


FORKSERVER_LOG = "forkserver.log"  # what the fork server forked and refused, and why (gpt2bench/local/forkserver.py)


def run_directory(directory: Path, run: Run) -> Path:
    return directory / "runs" / run.name


def execute_run(sweep: Sweep, index: int, job: dict[str, Any], display: Display, base_env: dict[str, str]) -> None:
    run = sweep.runs[index]
    run_dir = run_directory(sweep.directory, run)
    shutil.rmtree(run_dir, ignore_errors=True)  # a previous sweep's files must not pass for this one's
    run_dir.mkdir(parents=True)
    write_atomic(run_dir / "job.yaml", yaml.safe_dump(job, sort_keys=False))
    started = SYSTEM_CLOCK.stamp()
    run_dir_name = str(run_dir.relative_to(sweep.directory))
    sweep.set_entry(index, local_entry(collect.run_entry(run, phase=RUNNING, start_time=started), run_dir=run_dir_name))

    def on_tick(_primary: Replica, _elapsed: float) -> None:
        display.tick(run_dir)

    timing: dict[str, float] = {}
    try:
        outcome = execute_job(job, run_dir, base_env=base_env, on_tick=on_tick,
                              runtimes=runtimes_for(sweep.benchmark, run))
    except JobSpecError as exc:
        entry = collect.run_entry(
            run, phase="Failed", reason=f"cannot run locally: {exc}", start_time=started, completion_time=SYSTEM_CLOCK.stamp()
        )
    except KeyboardInterrupt as exc:
        entry = collect.run_entry(run, phase=PENDING, start_time=started, completion_time=SYSTEM_CLOCK.stamp())
        stopped = local_entry(entry, phase=INTERRUPTED,
                              reason=f"stopped by {stop_cause(exc)}; its processes were killed")
        sweep.set_entry(index, _with_files(stopped, sweep.directory, run_dir))
        raise
    else:
        entry = collect.collect_run(
            run,
            job_succeeded=outcome.phase == "Succeeded",
            termination_message=outcome.termination_message,
            job_reason=outcome.reason,
            cause=outcome.cause,
            start_time=started,
            completion_time=rfc3339(outcome.completion_time),
        )
        timing = job_timing(outcome.seconds, entry)
    sweep.set_entry(index, _with_files(local_entry(entry, **timing), sweep.directory, run_dir))


def job_timing(job_seconds: float | None, entry: RunStatus) -> dict[str, float]:
    """The run's job time here and its start-up per run: what of it was not worker 0's training (docs/local.md)."""
    if job_seconds is None:
        return {}
    train = entry.results.train_seconds if entry.results else None
    return {"job_seconds": job_seconds, **({"overhead_seconds": job_seconds - train} if train is not None else {})}


def _with_files(entry: LocalRun, directory: Path, run_dir: Path) -> LocalRun:
    """Local additions to the results entry: where the run's files are (paths relative to DIR)."""
    steps = sorted(run_dir.glob(f"*/{STEPS_FILE}"))  # master-0 / launcher-0 first; ps: the worker's pod
    return entry.model_copy(update={
        "run_dir": str(run_dir.relative_to(directory)),
        "steps_file": str(steps[0].relative_to(directory)) if steps else None,
    })


def emulation_skip(benchmark: Benchmark, run: Run) -> str | None:
    """Why a CPU run in bf16/fp16 would only measure fp32 emulation on this machine (None: run it)."""
    if run.devices_per_node or benchmark.spec.training.allow_emulated_precision:
        return None
    return cpu_emulation_reason(run.precision)


def add_round(sweep: Sweep, render: Callable[[Benchmark, Run], dict], display: Display | None = None) -> list[dict]:
    """After the last planned run: the next round's runs (the configurations still racing that this sweep runs,
    in the round's own order) added to the sweep and its document, and their jobs; none when the rule stops the
    sweep (decided, budget spent, max rounds), whose reason the document keeps (the rule: sweepcore.add_round)."""
    doc, ours = sweep.doc, {configuration_key(run) for run in sweep.runs}  # `--only` chose some: the same ones
    before = sweepcore.Rounds(doc.rounds_planned, doc.rounds_done, doc.stop_reason, doc.racing, doc.dropped)
    step = sweepcore.add_round(sweep.benchmark, doc.runs, before, doc.start_time, SYSTEM_CLOCK.now(),
                               sweep.runs[0].backend, chosen=lambda run: configuration_key(run) in ours)
    if step is None:
        return []
    for dropped in sweepcore.newly_dropped(doc.dropped, step.rounds.dropped):
        if display:
            display.note(f"{dropped.configuration} dropped after round {dropped.round}: {dropped.behind} is "
                         f"{dropped.ratio - 1:+.1%} faster; it runs no more rounds")
    rounds = step.rounds
    doc.rounds_planned, doc.rounds_done, doc.stop_reason = rounds.planned, rounds.done, rounds.stop_reason
    doc.racing, doc.dropped = rounds.racing, rounds.dropped
    if step.added is None:
        if display:
            display.note(f"no more rounds: {rounds.stop_reason}")
        sweep.save()
        return []
    sweep.runs += step.runs
    doc.runs += [local_entry(entry) for entry in step.entries]
    sweep.save()
    if display:
        display.round_added(len(step.runs), step.added)
    return [render(sweep.benchmark, run) for run in step.runs]


def configuration_key(run: Run) -> tuple:
    return run.strategy.name, run.precision, run.nodes, run.world_size, run.devices_per_node


def child_env() -> dict[str, str]:
    """The local 'image': this environment, with this Python's scripts (gpt2bench, torchrun) on PATH."""
    env = dict(os.environ)
    scripts = sysconfig.get_path("scripts")
    if scripts and scripts not in env.get("PATH", "").split(os.pathsep):
        env["PATH"] = scripts + os.pathsep + env.get("PATH", "")
    return env


def run_sweep(
    benchmark: Benchmark,
    runs: list[Run],
    directory: Path,
    *,
    jobs: list[dict] | None = None,
    console: Any = None,
    live: bool | None = None,
    resumed: Resumed | None = None,
    render: Callable[[Benchmark, Run], dict] = render_job,
) -> Sweep:
    """Run `runs` (rendered as `jobs`, default: `render`) one at a time; results land in `directory`, which the
    sweep holds meanwhile (files.FolderBusy when another process does). `resumed`: an earlier sweep's finished
    runs, kept instead of run (`prepare_folder`). With sweep.maxRepeats, whole rounds are added (rendered by
    `render`) while a top decision is unresolved (report.sequential). A KeyboardInterrupt stops the sweep
    cleanly: `sweep.interrupted` is then True."""
    from rich.console import Console

    from gpt2bench import report

    console = console or Console()
    jobs = list(jobs) if jobs is not None else [render(benchmark, run) for run in runs]
    if len(jobs) != len(runs):
        raise ValueError(f"{len(runs)} runs but {len(jobs)} jobs")
    directory.mkdir(parents=True, exist_ok=True)
    with holding(directory):
        resumed = resumed or Resumed()
        if resumed.start_over:
            shutil.rmtree(directory / "runs", ignore_errors=True)
        for leftover in directory.glob(".*.tmp"):  # a write a killed sweep left half done (files.write_atomic)
            leftover.unlink(missing_ok=True)
        sweep = Sweep(benchmark, runs, directory, kept=resumed.kept, start_time=resumed.start_time)
        sweep.save()
        _run_all(sweep, jobs, console, live, render)
        sweep.finish()
        report.write_report(sweep.doc, directory)  # adds the analysis to sweep.doc and results.json
    return sweep


def _run_all(sweep: Sweep, jobs: list[dict], console: Any, live: bool | None,
             render: Callable[[Benchmark, Run], dict]) -> None:
    benchmark, runs = sweep.benchmark, sweep.runs
    live = console.is_terminal if live is None else live
    # the fork server serves CPU jobs only, and none that is skipped unstarted (a later round repeats a configuration)
    cpu_runs = any(not run.devices_per_node and not emulation_skip(benchmark, run) for run in runs)
    with forkserver.serving(child_env(), sweep.directory / FORKSERVER_LOG, wanted=cpu_runs) as base_env, \
            Display(console, len(runs), benchmark.spec.training.steps, live) as display:
        try:
            index = 0
            while index < len(runs):  # `runs` grows while rounds are added (add_round)
                run, job = runs[index], jobs[index]
                if run.name in sweep.kept:
                    display.end_run(sweep.doc.runs[index], kept=True)
                elif holds.held(sweep.doc.runs[index]):  # one cause, one stop: a run that shares it is not started
                    sweep.set_entry(index, sweep.doc.runs[index].model_copy(update={"phase": SKIPPED}))
                    display.end_run(sweep.doc.runs[index])
                else:
                    display.start_run(index, len(runs), run)
                    if reason := emulation_skip(benchmark, run):  # the trainer would skip it too, after start-up
                        entry = collect.run_entry(run, phase=SKIPPED, reason=reason, start_time=SYSTEM_CLOCK.stamp(),
                                                  completion_time=SYSTEM_CLOCK.stamp())
                        sweep.set_entry(index, local_entry(entry))
                    else:
                        execute_run(sweep, index, job, display, base_env)
                        hold_sharing(sweep, index, display)
                    display.end_run(sweep.doc.runs[index])
                index += 1
                if index == len(runs):  # repeat until decided: one more round, or why not
                    jobs += add_round(sweep, render, display)
        except KeyboardInterrupt as exc:  # a run Running here was interrupted between the executor and its entry
            sweep.interrupted = True
            sweep.doc.runs = interrupt_runs(sweep.doc.runs, f"stopped by {stop_cause(exc)}")


def hold_sharing(sweep: Sweep, index: int, display: Display) -> None:
    """After run `index` ended: when its failure's cause is the environment's (gpt2bench.diagnosis.holds, the
    operator's rule), the runs not started yet that share it are held, and skipped when their turn comes; `--resume`
    runs them once the cause is fixed."""
    before = [*sweep.doc.runs[:index], sweep.doc.runs[index].model_copy(update={"phase": RUNNING}),
              *sweep.doc.runs[index + 1:]]
    runs, new = holds.apply(before, list(sweep.doc.runs), resume_words(sweep))
    if new:
        sweep.doc.runs = runs
        sweep.save()
        for reason, names in holds.held_reasons(runs).items():
            if reason in new:
                display.note(f"{len(names)} run{'s' * (len(names) > 1)} {reason}")


def resume_words(sweep: Sweep) -> str:
    """How a user goes on with the runs a shared cause held, once it is fixed."""
    return (f"once fixed: gpt2bench run FILE --resume --output {sweep.directory}, FILE GPT2Benchmark "
            f"{sweep.benchmark.name}'s file")


# ---------------------------------------------------------------- an existing results folder
class FolderRefused(ValueError):
    """DIR cannot be used as asked; the message says why and what to do instead."""


@dataclass
class Resumed:
    """What an earlier sweep in DIR leaves to a resumed one: its finished entries by run name, and its start."""

    kept: dict[str, LocalRun] = field(default_factory=dict)
    start_time: str | None = None
    start_over: bool = False  # --overwrite: the earlier sweep's runs/ folder goes when this one starts


KEPT_PHASES = (SUCCEEDED, FAILED)  # a finished run: kept by --resume; every other one runs again


def prepare_folder(benchmark: Benchmark, plan: list[Run], chosen: list[Run], directory: Path, *,
                   resume: bool = False, overwrite: bool = False) -> tuple[list[Run], Resumed]:
    """What DIR holds decides what the sweep does (nothing is run or removed before the answer).

    - no results.json: the chosen runs, from scratch;
    - a sweep another live `gpt2bench run` is writing: refused;
    - an earlier sweep, plain: refused, naming --resume and --overwrite;
    - `overwrite`: the chosen runs from scratch; DIR/runs goes when the sweep starts;
    - `resume`: the earlier sweep's Succeeded and Failed runs are kept as they are (the spec must be the one it
      ran), and the chosen runs that are not among them run. The sweep's runs are the kept and the chosen ones,
      in plan order. A run left Running by a runner that was killed runs again.
    Returns the runs of the sweep and what it keeps.
    """
    if held(directory):
        raise FolderRefused(f"{directory} is being written by another gpt2bench run now")
    if overwrite:
        return chosen, Resumed(start_over=True)
    previous = _previous(directory)
    if previous is None:
        return chosen, Resumed()
    previous = settle_abandoned(previous, directory)
    finished = {entry.name: entry for entry in previous.runs if entry.phase in KEPT_PHASES}
    if not resume:
        note = interrupted_note(previous, directory)
        raise FolderRefused(
            f"{note}; --overwrite starts again, or give another --output" if note else
            f"{directory} already holds results of {previous.benchmark} ({previous.phase}: {len(finished)} of "
            f"{len(previous.runs)} runs finished): --resume keeps them and runs the rest, --overwrite starts "
            "again, or give another --output")
    if previous.benchmark != benchmark.name or previous.spec != spec_document(benchmark.spec):
        differences = "; ".join(_differences(previous.spec, spec_document(benchmark.spec))[:3]) or "metadata.name"
        raise FolderRefused(f"--resume: {directory} holds a sweep of another spec ({differences}); run the same "
                            "file with the same --steps, or --overwrite")
    if benchmark.spec.sweep.max_repeats and (previous.rounds_planned or 0) > benchmark.spec.sweep.repeats:
        # rounds the earlier sweep added until decided, for the configurations still racing: they are the sweep's
        # too (the same rule continues)
        plan = plan_runs(benchmark, plan[0].backend if plan else None, rounds=previous.rounds_planned,
                         stopped=stopped_configurations(previous.runs, previous.rounds_planned))
        configs = {configuration_key(run) for run in chosen}
        chosen = [*chosen, *(run for run in plan if (run.repeat or 0) > benchmark.spec.sweep.repeats
                             and configuration_key(run) in configs)]
    planned = {run.name: run for run in plan}
    kept = {name: entry for name, entry in finished.items()
            if name in planned and entry.job_kind == planned[name].job_kind}
    names = {run.name for run in chosen} | set(kept)
    return [run for run in plan if run.name in names], Resumed(kept, previous.start_time)


def _previous(directory: Path) -> ResultsDocument | None:
    import pydantic

    if not (directory / RESULTS_JSON).exists():
        return None
    try:
        return ResultsDocument.load(directory)
    except (OSError, ValueError, pydantic.ValidationError) as exc:
        raise FolderRefused(f"{directory / RESULTS_JSON} cannot be read ({exc}); --overwrite starts again") from None


def _differences(old: Any, new: Any, path: str = "spec") -> list[str]:
    """Where two spec documents differ, one line each: `spec.x.y: <earlier> in the results, <this one> now`."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for key in sorted(set(old) | set(new)) for d in _differences(old.get(key), new.get(key),
                                                                             f"{path}.{key}")]
    return [] if old == new else [f"{path}: {json.dumps(old)} in the results, {json.dumps(new)} now"]
