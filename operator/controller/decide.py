"""Pure decisions of the operator: no cluster, no kopf. The handlers feed them what they read.

A sweep is level-triggered: every reconcile step looks at `status.runs` and the jobs that exist,
and decides (1) which runs changed phase, (2) which Pending runs start now, (3) the status patch.
Because the decision depends only on status + existing jobs, a restarted operator resumes where the
last one stopped, and because job names are the run names, it never creates a job twice.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass, field
from typing import Any

from gpt2bench import collect, diagnosis, sweepcore
from gpt2bench import jobkinds as kinds
from gpt2bench.diagnosis import holds
from gpt2bench.plan import Run, seed_for
from gpt2bench.specification.model import GPT2BenchmarkSpec
from gpt2bench.status import (  # noqa: F401 (the phases are part of this module's vocabulary)
    COMPLETE,
    FAILED,
    FAILED_CONDITION,
    FINISHED_CONDITION,
    FINISHED_PHASES,
    INVALID,
    PARTIALLY_SUCCEEDED,
    PENDING,
    QUEUED,
    QUEUED_CONDITION,
    READY,
    RUNNING,
    SKIPPED,
    SPEC_CHANGE_IGNORED,
    SPEC_UNREADABLE,
    SUCCEEDED,
    TERMINAL_RUN_PHASES,
    BenchmarkStatus,
    Condition,
    RunStatus,
    best_run,
    overall_phase,
)

# A run entry's reason in status is at most this long (the Event carries the same text): with the largest
# sweep allowed, every run failing with the longest reason still leaves status far below etcd's limit
# (tests/test_operator_status_size.py).
STATUS_REASON_LIMIT = 512
STATUS_DIGITS = 6


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


# --- job conditions -------------------------------------------------------------------------------


# What a job's status says for its run, for every kind (the shared table's mapping): Pending, Queued
# (suspended: a Suspended condition, or the spec flag Kueue's webhook sets), Running, Succeeded, Failed.
JobState = kinds.JobState
job_state = kinds.job_state


def job_event_matters(event_type: str | None, job: dict[str, Any]) -> bool:
    """Whether a job's watch event can change its sweep. Not the initial listing (resume and the timer pick
    sweeps up), nor the ADDED event of a job just created, with nothing said about it yet: the operator
    created it and recorded that already (a burst of 100 new sweeps would otherwise read each twice)."""
    if event_type is None:
        return False
    if event_type == "ADDED":
        return bool((job.get("status") or {}).get("conditions")) or kinds.suspended_in_spec(job)
    return True


def controller_uid(obj: dict[str, Any]) -> str | None:
    """The uid of the object's controller (the ownerReference with controller: true), if any."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref.get("uid")
    return None


def owned_jobs(jobs: dict[str, dict], owner_uid: str | None) -> dict[str, dict]:
    """Only the jobs this benchmark (this uid) controls: a job of a deleted namesake is not ours."""
    return {name: job for name, job in jobs.items() if owner_uid is None or controller_uid(job) == owner_uid}


def owner_description(job: dict[str, Any]) -> str:
    """`GPT2Benchmark x (uid ...)`, or `no owner`: who a job we did not create belongs to."""
    refs = (job.get("metadata") or {}).get("ownerReferences") or []
    ref = next((r for r in refs if r.get("controller")), refs[0] if refs else None)
    return f"{ref.get('kind')} {ref.get('name')} (uid {ref.get('uid')})" if ref else "no owner"


# --- status -------------------------------------------------------------------------------------


def initial_status(runs: list[Run], generation: int | None, now: str) -> BenchmarkStatus:
    """The status a new sweep starts with: every run Pending, nothing started (and, in rounds, the rounds
    planned: a sweep that repeats until decided adds more)."""
    rounds = max((run.repeat or 0 for run in runs), default=0) or None
    status = BenchmarkStatus(
        rounds_planned=rounds,
        order_seed=seed_for(runs[0].benchmark, runs[0].spec.sweep.order_seed) if rounds and runs[0].spec else None,
        phase=RUNNING,
        message=f"{len(runs)} runs planned",
        observed_generation=generation,
        runs_total=len(runs),
        runs_done=0,
        runs_succeeded=0,
        runs_failed=0,
        start_time=now,
        backend=runs[0].backend if runs else None,
        runs=[collect.run_entry(run, phase=PENDING) for run in runs],
        conditions=[],
    )
    status.conditions = sweep_conditions([], RUNNING, status.message, status.runs, generation, now)
    return status


def invalid_status(errors: list[tuple[str, str]], generation: int | None, now: str) -> BenchmarkStatus:
    message = collect.clean_reason("invalid spec: " + "; ".join(f"{path}: {msg}" for path, msg in errors))
    return BenchmarkStatus(
        phase=INVALID,
        message=message,
        observed_generation=generation,
        runs_total=0,
        runs_done=0,
        runs=[],
        conditions=sweep_conditions([], INVALID, message, [], generation, now),
    )


def sweep_started(status: dict[str, Any]) -> bool:
    """A sweep has started once its status lists its runs (Running, then finished): its spec is pinned and
    later edits are ignored. Before that (no phase yet, Pending, Invalid, or an earlier version's Failed
    without runs) nothing ran, and the operator starts it from the current spec."""
    return bool(status.get("runs"))


def pending_status(reason: str, generation: int | None, now: str, retry_seconds: float) -> BenchmarkStatus:
    """The sweep could not be started yet (the API server failed a call, a permission is missing...): it
    stays Pending, says why, and is tried again; nothing ran, so nothing is lost by waiting."""
    message = collect.clean_reason(f"not started yet: {reason}; the operator tries again every "
                                   f"{retry_seconds:g} s")
    return BenchmarkStatus(phase=PENDING, message=message, observed_generation=generation, runs_total=0,
                           runs_done=0, runs=[], conditions=sweep_conditions([], PENDING, message, [], generation, now))


def replacing(stored: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """A merge patch that makes `stored` equal `new`: keys `new` lacks are removed (null), nothing stale stays."""
    return {**{key: None for key in stored if key not in new}, **new}


def spec_unreadable_condition(reason: str, now: str, generation: int | None) -> Condition:
    return condition(SPEC_UNREADABLE, "True", "PinnedSpecUnreadable", reason, now, generation)


def spec_readable_condition(version: str, now: str, generation: int | None) -> Condition:
    return condition(SPEC_UNREADABLE, "False", "PinnedSpecRead", f"operator {version} reads the pinned spec",
                     now, generation)


def unreadable_reason(version: str, pinned_by: str | None, what: str) -> str:
    """Why an operator holds a sweep whose pinned state it cannot read, and what the user can do."""
    by = f"operator {pinned_by}" if pinned_by else "an earlier operator version"
    return collect.clean_reason(
        f"held: this operator ({version}) cannot read the sweep's pinned state (pinned by {by}): {what}. Nothing "
        f"is created or collected until an operator that reads it runs again ({by}); jobs already running go on. "
        f"Or delete the GPT2Benchmark and create it again to run it with this version")


def condition(type_: str, status: str, reason: str, message: str, now: str,
              generation: int | None = None) -> Condition:
    return Condition(type=type_, status=status, reason=reason, message=message, last_transition_time=now,
                     observed_generation=generation)


def set_condition(conditions: list[Condition], new: Condition) -> list[Condition]:
    """Replace the condition of the same type, keeping lastTransitionTime when the status is unchanged
    (`meta.SetStatusCondition`'s rule); the list keeps its order, new types are appended."""
    result, replaced = [], False
    for old in conditions or []:
        if old.type == new.type:
            if old.status == new.status:
                new = new.model_copy(update={"last_transition_time": old.last_transition_time})
            result.append(new)
            replaced = True
        else:
            result.append(old)
    return result if replaced else result + [new]


def sweep_conditions(existing: list[Condition], phase: str, message: str, runs: list[RunStatus],
                     generation: int | None, now: str) -> list[Condition]:
    """Ready, Complete, Failed, Finished and Queued for this phase, as batch Jobs have them.

    - Ready: True once there are results to read (Succeeded or PartiallySucceeded), reason the phase;
    - Complete: True when every run finished and at least one has results;
    - Failed: True when no run succeeded, or the spec is invalid (reason NoRunSucceeded / InvalidSpec);
    - Finished: True once the sweep ended, whichever way (Succeeded, PartiallySucceeded, Failed, Invalid; reason
      the phase): `kubectl wait --for=condition=Finished` comes back either way, where waiting for Complete
      would hang until its timeout on a failed sweep;
    - Queued: True while a run's job is suspended (Kueue has not admitted it yet).
    """
    results = phase in (SUCCEEDED, PARTIALLY_SUCCEEDED)
    failed = phase in (FAILED, INVALID)
    why = "InvalidSpec" if phase == INVALID else phase
    queued = [r.name for r in runs if r.phase == QUEUED]
    queued_message = (f"job suspended, waiting for its queue: {', '.join(queued)}" if queued
                      else "no run is waiting for its queue")
    wanted = [
        (READY, results, why),
        (COMPLETE, results, why),
        (FAILED_CONDITION, failed, "NoRunSucceeded" if phase == FAILED else why),
        (FINISHED_CONDITION, phase in FINISHED_PHASES, phase),
        (QUEUED_CONDITION, bool(queued), "JobSuspended" if queued else "NotQueued"),
    ]
    conditions = list(existing or [])
    for type_, true, reason, in wanted:
        text = queued_message if type_ == QUEUED_CONDITION else message
        conditions = set_condition(conditions, condition(type_, "True" if true else "False", reason, text, now,
                                                         generation))
    return conditions


# --- one reconcile step -------------------------------------------------------------------------


@dataclass(frozen=True)
class Finished:
    """A run whose job reached a terminal condition: the caller reads its pod and collects it."""

    name: str
    job_succeeded: bool
    job_message: str  # the condition's message, else (set by the caller) the pod's or condition's reason


@dataclass
class Observation:
    started: list[str] = field(default_factory=list)  # job exists, not suspended: now Running
    queued: list[str] = field(default_factory=list)  # job exists, suspended: now Queued
    finished: list[Finished] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)  # Running/Queued in status, job gone


def observe(runs: list[RunStatus], jobs: dict[str, dict]) -> Observation:
    """Compare `status.runs` with the jobs that exist (by job name)."""
    seen = Observation()
    for run in runs:
        if run.phase in TERMINAL_RUN_PHASES:
            continue
        job = jobs.get(run.job_name)
        if job is None:
            if run.phase in (RUNNING, QUEUED):
                seen.vanished.append(run.name)
            continue
        if run.phase == PENDING and (job.get("metadata") or {}).get("deletionTimestamp"):
            continue  # a run to run again: its last job is going (after_preemption)
        state = job_state(job)
        if state.phase in TERMINAL_RUN_PHASES:
            seen.finished.append(Finished(run.name, state.phase == SUCCEEDED, state.describe()))
        elif state.phase == QUEUED and run.phase != QUEUED:
            seen.queued.append(run.name)
        elif state.phase != QUEUED and run.phase != RUNNING:
            seen.started.append(run.name)
    return seen


def runs_to_start(runs: list[RunStatus], jobs: dict[str, dict], concurrency: int) -> list[str]:
    """Pending runs without a job, in plan order, while fewer than `concurrency` are active (a queued
    run holds its place: its job exists; so does a job still running under a run another writer marked
    finished, until it is gone). A held run waits (gpt2bench.diagnosis.holds)."""
    active = sum(1 for r in runs if r.job_name in jobs and (r.phase not in TERMINAL_RUN_PHASES
                                                            or finished_by_hand(r, jobs[r.job_name])))
    active += sum(1 for r in runs if r.phase in (RUNNING, QUEUED) and r.job_name not in jobs)  # being re-read
    chosen = []
    for run in runs:
        if active + len(chosen) >= concurrency:
            break
        if run.phase == PENDING and run.job_name not in jobs and not holds.held(run):
            chosen.append(run.name)
    return chosen


def mark_running(entry: RunStatus, now: str) -> RunStatus:
    return entry.model_copy(update={"phase": RUNNING, "start_time": entry.start_time or now})


def mark_queued(entry: RunStatus, now: str) -> RunStatus:
    return entry.model_copy(update={"phase": QUEUED, "start_time": entry.start_time or now})


def finish_entry(run: Run, entry: RunStatus, finished: Finished, termination_message: str | None,
                 now: str, cause: str | None = None) -> RunStatus:
    """The results entry of a finished run (collect decides Succeeded/Failed and the reason; `cause`: the first
    pod that failed, when one did)."""
    return compact(collect.collect_run(
        run,
        job_succeeded=finished.job_succeeded,
        termination_message=termination_message,
        job_reason=finished.job_message or ("job failed" if not finished.job_succeeded else None),
        cause=cause,
        start_time=entry.start_time or now,
        completion_time=now,
    ))


# --- another writer (issue 50.2) ------------------------------------------------------------------


def foreign_phase(status: dict[str, Any]) -> str | None:
    """A finished phase written over runs that have not finished: not the operator's (its phase is the runs'), so
    the sweep goes on; what to say about it, else None."""
    phase, runs = status.get("phase"), status.get("runs") or []
    open_runs = [r.get("name") for r in runs if isinstance(r, dict) and r.get("phase") not in TERMINAL_RUN_PHASES]
    if phase not in FINISHED_PHASES or phase == INVALID or not open_runs:
        return None
    return (f"status.phase {phase} was written while runs {', '.join(open_runs[:3])}"
            f"{' ...' if len(open_runs) > 3 else ''} had not finished: the sweep goes on (its phase is its runs')")


def finished_by_hand(entry: RunStatus, job: dict[str, Any]) -> bool:
    """A run finished in status while its job still runs (no terminal condition, not being deleted): no step
    writes that (a run ends with its job, or its job is deleted), so another writer did."""
    return (entry.phase in TERMINAL_RUN_PHASES and not (job.get("metadata") or {}).get("deletionTimestamp")
            and job_state(job).phase not in TERMINAL_RUN_PHASES)


def renamed_back(runs: list[Run], entries: list[RunStatus]) -> tuple[list[RunStatus], list[str]]:
    """Entries whose name differs from the plan's at the same place but whose configuration is that run's (another
    writer renamed them) get the plan's name and job back; returns the entries and the names found. Nothing is
    changed when anything else differs (another version's plan: the caller holds the sweep)."""
    if len(runs) != len(entries):
        return entries, []
    fixed, renamed = [], []
    for run, entry in zip(runs, entries):
        if entry.name == run.name:
            fixed.append(entry)
            continue
        same = (entry.strategy, entry.precision, entry.nodes, entry.devices_per_node, entry.processes_per_node,
                entry.job_kind, entry.repeat, bool(entry.profile)) == (
            run.strategy.name, run.precision, run.nodes, run.devices_per_node, run.procs_per_node, run.job_kind,
            run.repeat, bool(run.profile))
        if not same:
            return entries, []
        fixed.append(entry.model_copy(update={"name": run.name, "job_name": run.job_name}))
        renamed.append(entry.name)
    return fixed, renamed


# A preempted run measured nothing (issue 50.5): it runs once more, and its record says so.
RERUN = "preempted, to run again once: "
_PREEMPTED = re.compile(rf"^pod \S+ {diagnosis.PREEMPTED} \({diagnosis.PREEMPTED_BY}")


def after_preemption(run: Run, entry: RunStatus, done: RunStatus) -> RunStatus:
    """A finished run's entry (`done`; `entry`: before): a first attempt whose cause is a pod the scheduler preempted
    is Pending again (its job is deleted, the next step creates it anew), its reason saying so; the second attempt
    is final, its reason naming the first's preemption whichever way it ended."""
    first = entry.reason[len(RERUN):] if (entry.reason or "").startswith(RERUN) else None
    if first is None:
        if done.phase == FAILED and _PREEMPTED.match(done.reason or ""):
            again = collect.run_entry(run, phase=PENDING)  # (which keeps a reason only for Failed and Skipped)
            return compact(again.model_copy(update={"reason": RERUN + (done.reason or "")}))
        return done
    said = "ran again after a preemption" if done.phase == SUCCEEDED else f"{done.reason}; its first attempt was"
    return compact(done.model_copy(update={"reason": f"{said}: {first}"}))


def failed_entry(run: Run, entry: RunStatus, reason: str, now: str) -> RunStatus:
    """A run that failed without running: its job was refused, its kind is not served, its name is taken."""
    return compact(collect.run_entry(run, phase=FAILED, reason=reason, start_time=entry.start_time or now,
                                     completion_time=now))


def vanished_entry(run: Run, entry: RunStatus, now: str, ttl_seconds: int | None = None) -> RunStatus:
    reason = f"job {entry.job_name} was deleted before its results were read"
    if ttl_seconds is not None:
        reason += (f" (runPolicy.ttlSecondsAfterFinished is {ttl_seconds} s: if the operator was away longer "
                   f"than that, the finished job went before it could read it)")
    return failed_entry(run, entry, reason, now)


def refused_reason(job_name: str, kind: str, code: int, reason: str, message: str) -> str:
    return f"the API server refused {kind} {job_name}: {code} {reason}: {message}"


def foreign_reason(job_name: str, kind: str, namespace: str, owner: str, uid: str | None) -> str:
    return (f"a {kind} named {job_name} already exists in {namespace} and belongs to {owner}, not to this "
            f"GPT2Benchmark (uid {uid}): its results would not be this run's. Delete that job, or give this "
            f"benchmark another name")


def compact(entry: RunStatus) -> RunStatus:
    """A run entry as status keeps it: a reason of at most STATUS_REASON_LIMIT characters, figures to
    STATUS_DIGITS significant digits (a benchmark's noise is in the second or third)."""
    for text in ("reason", "waiting"):
        value = getattr(entry, text)
        if value and len(value) > STATUS_REASON_LIMIT:
            entry = entry.model_copy(update={text: value[: STATUS_REASON_LIMIT - 3] + "..."})
    if entry.results is not None:
        rounded = {name: float(f"{value:.{STATUS_DIGITS}g}")
                   for name, value in entry.results.model_dump().items() if isinstance(value, float)}
        entry = entry.model_copy(update={"results": entry.results.model_copy(update=rounded)})
    return entry


def summarize(status: BenchmarkStatus, runs: list[RunStatus], now: str,
              spec: GPT2BenchmarkSpec | None = None) -> BenchmarkStatus:
    """The status fields these runs decide: counts, best, overall phase, conditions, completionTime, and,
    once every run is done, the analysis (recommendations, scaling, findings; `spec` gives the prices)."""
    tally = sweepcore.tally(runs, rounds=False)
    done, succeeded, phase = tally.done, tally.succeeded, tally.phase
    active = [r.name for r in runs if r.phase == RUNNING]
    queued = [r.name for r in runs if r.phase == QUEUED]
    if phase == RUNNING:
        message = f"{done}/{len(runs)} runs done" + (f"; running {', '.join(active)}" if active else "")
        message += f"; queued {', '.join(queued)} (job suspended)" if queued else ""
        held = sum(1 for r in runs if holds.held(r))
        message += f"; {held} held (condition {holds.RUNS_HELD})" if held else ""
    else:
        message = f"{succeeded}/{len(runs)} runs succeeded" + (f", {tally.skipped} skipped" if tally.skipped else "")
    generation = status.observed_generation
    return BenchmarkStatus(
        phase=phase,
        message=message,
        runs=runs,
        runs_total=tally.total,
        runs_done=done,
        runs_succeeded=succeeded,
        runs_failed=tally.failed,
        runs_skipped=tally.skipped,
        best=tally.best,
        waiting=waiting_message(runs),
        analysis=None if phase == RUNNING else _analyze(runs, spec),
        conditions=held_condition(sweep_conditions(status.conditions or [], phase, message, runs, generation, now),
                                  runs, generation, now),
        completion_time=now if phase != RUNNING and not status.completion_time else None,
    )


def held_condition(conditions: list[Condition], runs: list[RunStatus], generation: int | None,
                   now: str) -> list[Condition]:
    """RunsHeld: True while runs are held by a cause they share (its message: how many, why, how to go on);
    False once none is; absent from a sweep that never held one."""
    held = holds.summary(runs)
    if held is None and not any(c.type == holds.RUNS_HELD for c in conditions):
        return conditions
    why = "SharedCause" if held else "NoneHeld"
    return set_condition(conditions, condition(holds.RUNS_HELD, "True" if held else "False", why,
                                               held or "no run is held", now, generation))


def waiting_message(runs: list[RunStatus]) -> str:
    """What the active runs wait for, `run: what` each, after the held runs' cause ("" when none waits: a merge
    patch then clears it): `kubectl get`'s Waiting column."""
    held = holds.summary(runs)
    text = "; ".join([*([held] if held else []),
                      *(f"{r.name}: {r.waiting}" for r in runs if r.waiting and r.phase in (RUNNING, QUEUED))])
    return text if len(text) <= STATUS_REASON_LIMIT else text[: STATUS_REASON_LIMIT - 3] + "..."


def _analyze(runs: list[RunStatus], spec: GPT2BenchmarkSpec | None) -> Any:
    # Imported when a sweep finishes, not at start-up: the analysis pulls in scipy (~2 s here), and an
    # operator restarted after a crash should serve its sweeps again as soon as it can (docs/reliability.md).
    from gpt2bench.report.analysis import analyze

    return analyze(runs, camel(spec))


def camel(spec: GPT2BenchmarkSpec | None) -> dict[str, Any] | None:
    return spec.model_dump(by_alias=True, exclude_none=True, mode="json") if spec else None


def spec_ignored_condition(generation: int, observed: int | None, now: str) -> Condition:
    """A started sweep keeps the spec it started with: say so, and how to run the new one."""
    message = (f"spec changed (generation {generation}) after the sweep started; the sweep keeps running with "
               f"generation {observed}'s spec. Create a new GPT2Benchmark to run the changed one.")
    return condition(SPEC_CHANGE_IGNORED, "True", "SweepAlreadyStarted", message, now, generation)


def transitions(old_runs: list[RunStatus], new_runs: list[RunStatus]) -> list[tuple[RunStatus, str]]:
    """(entry, previous phase) for every run whose phase changed: the Events to post."""
    before = {r.name: r.phase for r in old_runs}
    return [(r, before.get(r.name, PENDING)) for r in new_runs if before.get(r.name) != r.phase]
