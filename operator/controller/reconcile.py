"""Pure decisions of the operator: no cluster, no kopf. The handlers feed them what they read.

A sweep is level-triggered: every reconcile step looks at `status.runs` and the jobs that exist,
and decides (1) which runs changed phase, (2) which Pending runs start now, (3) the status patch.
Because the decision depends only on status + existing jobs, a restarted operator resumes where the
last one stopped, and because job names are the run names, it never creates a job twice.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

from gpt2bench import collect
from gpt2bench.plan import Run
from gpt2bench.report.analysis import analyze
from gpt2bench.spec import GPT2BenchmarkSpec
from gpt2bench.status import (  # noqa: F401 (the phases are part of this module's vocabulary)
    FAILED,
    FINISHED_PHASES,
    INVALID,
    PARTIALLY_SUCCEEDED,
    PENDING,
    RUNNING,
    SUCCEEDED,
    TERMINAL_RUN_PHASES,
    BenchmarkStatus,
    Condition,
    RunStatus,
    best_run,
    overall_phase,
)


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- job conditions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobState:
    """What a Kubeflow job's conditions say: Pending (created, nothing yet), Running, Succeeded, Failed."""

    phase: str
    message: str = ""
    reason: str = ""


def job_state(job: dict[str, Any]) -> JobState:
    """Phase from `status.conditions` as the training and MPI operators set them.

    The terminal conditions win whatever their order; otherwise the newest True condition counts
    (Created → Pending, Running/Restarting → Running, Suspended → Pending).
    """
    conditions = [c for c in (job.get("status") or {}).get("conditions") or [] if str(c.get("status")) == "True"]
    by_type = {c.get("type"): c for c in conditions}
    for terminal in (FAILED, SUCCEEDED):
        if terminal in by_type:
            condition = by_type[terminal]
            return JobState(terminal, condition.get("message") or "", condition.get("reason") or "")
    if conditions and conditions[-1].get("type") in ("Running", "Restarting"):
        return JobState(RUNNING, conditions[-1].get("message") or "")
    return JobState(PENDING)


# --- status -------------------------------------------------------------------------------------


def initial_status(runs: list[Run], generation: int | None, now: str) -> BenchmarkStatus:
    """The status a new sweep starts with: every run Pending, nothing started."""
    return BenchmarkStatus(
        phase=RUNNING,
        message=f"{len(runs)} runs planned",
        observed_generation=generation,
        runs_total=len(runs),
        runs_done=0,
        runs_succeeded=0,
        runs_failed=0,
        start_time=now,
        runs=[collect.run_entry(run, phase=PENDING) for run in runs],
        conditions=[condition("Ready", "False", "Running", f"0/{len(runs)} runs done", now)],
    )


def invalid_status(errors: list[tuple[str, str]], generation: int | None, now: str) -> BenchmarkStatus:
    message = collect.clean_reason("invalid spec: " + "; ".join(f"{path}: {msg}" for path, msg in errors))
    return BenchmarkStatus(
        phase=INVALID,
        message=message,
        observed_generation=generation,
        runs_total=0,
        runs_done=0,
        runs=[],
        conditions=[condition("Ready", "False", "InvalidSpec", message, now)],
    )


def condition(type_: str, status: str, reason: str, message: str, now: str) -> Condition:
    return Condition(type=type_, status=status, reason=reason, message=message, last_transition_time=now)


def set_condition(conditions: list[Condition], new: Condition) -> list[Condition]:
    """Replace the condition of the same type, keeping lastTransitionTime when the status is unchanged."""
    result = []
    for old in conditions or []:
        if old.type == new.type:
            if old.status == new.status:
                new = new.model_copy(update={"last_transition_time": old.last_transition_time})
            continue
        result.append(old)
    return result + [new]


# --- one reconcile step -------------------------------------------------------------------------


@dataclass(frozen=True)
class Finished:
    """A run whose job reached a terminal condition: the caller reads its pod and collects it."""

    name: str
    job_succeeded: bool
    job_message: str  # the condition's message, else (set by the caller) the pod's or condition's reason


@dataclass
class Observation:
    started: list[str] = field(default_factory=list)  # Pending in status, job exists: now Running
    finished: list[Finished] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)  # Running in status, job gone
    unexplained: set[str] = field(default_factory=set)  # finished without a condition message


def observe(runs: list[RunStatus], jobs: dict[str, dict]) -> Observation:
    """Compare `status.runs` with the jobs that exist (by job name)."""
    seen = Observation()
    for run in runs:
        if run.phase in TERMINAL_RUN_PHASES:
            continue
        job = jobs.get(run.job_name)
        if job is None:
            if run.phase == RUNNING:
                seen.vanished.append(run.name)
            continue
        state = job_state(job)
        if state.phase in TERMINAL_RUN_PHASES:
            seen.finished.append(Finished(run.name, state.phase == SUCCEEDED, state.message or state.reason))
            if not state.message:
                seen.unexplained.add(run.name)
        elif run.phase == PENDING:
            seen.started.append(run.name)
    return seen


def runs_to_start(runs: list[RunStatus], jobs: dict[str, dict], concurrency: int) -> list[str]:
    """Pending runs without a job, in plan order, while fewer than `concurrency` are active."""
    active = sum(1 for r in runs if r.phase not in TERMINAL_RUN_PHASES and r.job_name in jobs)
    active += sum(1 for r in runs if r.phase == RUNNING and r.job_name not in jobs)  # being re-read
    chosen = []
    for run in runs:
        if active + len(chosen) >= concurrency:
            break
        if run.phase == PENDING and run.job_name not in jobs:
            chosen.append(run.name)
    return chosen


def mark_running(entry: RunStatus, now: str) -> RunStatus:
    return entry.model_copy(update={"phase": RUNNING, "start_time": entry.start_time or now})


def finish_entry(run: Run, entry: RunStatus, finished: Finished, termination_message: str | None,
                 now: str) -> RunStatus:
    """The results entry of a finished run (collect decides Succeeded/Failed and the reason)."""
    return collect.collect_run(
        run,
        job_succeeded=finished.job_succeeded,
        termination_message=termination_message,
        job_reason=finished.job_message or ("job failed" if not finished.job_succeeded else None),
        start_time=entry.start_time or now,
        completion_time=now,
    )


def vanished_entry(run: Run, entry: RunStatus, now: str) -> RunStatus:
    return collect.run_entry(run, phase=FAILED, reason=f"job {entry.job_name} was deleted before it finished",
                             start_time=entry.start_time, completion_time=now)


def summarize(status: BenchmarkStatus, runs: list[RunStatus], now: str,
              spec: GPT2BenchmarkSpec | None = None) -> BenchmarkStatus:
    """The status fields these runs decide: counts, best, overall phase, Ready condition, completionTime, and,
    once every run is done, the analysis (recommendations, scaling, findings; `spec` gives the prices)."""
    done = sum(r.phase in TERMINAL_RUN_PHASES for r in runs)
    succeeded = sum(r.phase == SUCCEEDED for r in runs)
    phase = overall_phase(runs)
    active = [r.name for r in runs if r.phase == RUNNING]
    if phase == RUNNING:
        message = f"{done}/{len(runs)} runs done" + (f"; running {', '.join(active)}" if active else "")
    else:
        message = f"{succeeded}/{len(runs)} runs succeeded"
    ready = condition("Ready", "True" if phase in FINISHED_PHASES else "False", phase, message, now)
    return BenchmarkStatus(
        phase=phase,
        message=message,
        runs=runs,
        runs_total=len(runs),
        runs_done=done,
        runs_succeeded=succeeded,
        runs_failed=done - succeeded,
        best=best_run(runs),
        analysis=None if phase == RUNNING else analyze(runs, _camel(spec)),
        conditions=set_condition(status.conditions or [], ready),
        completion_time=now if phase != RUNNING and not status.completion_time else None,
    )


def _camel(spec: GPT2BenchmarkSpec | None) -> dict[str, Any] | None:
    return spec.model_dump(by_alias=True, exclude_none=True, mode="json") if spec else None


def spec_ignored_condition(generation: int, observed: int | None, now: str) -> Condition:
    """A started sweep keeps the spec it started with: say so, and how to run the new one."""
    message = (f"spec changed (generation {generation}) after the sweep started; the sweep keeps running with "
               f"generation {observed}'s spec. Create a new GPT2Benchmark to run the changed one.")
    return condition("SpecChangeIgnored", "True", "SweepAlreadyStarted", message, now)


def transitions(old_runs: list[RunStatus], new_runs: list[RunStatus]) -> list[tuple[RunStatus, str]]:
    """(entry, previous phase) for every run whose phase changed: the Events to post."""
    before = {r.name: r.phase for r in old_runs}
    return [(r, before.get(r.name, PENDING)) for r in new_runs if before.get(r.name) != r.phase]
