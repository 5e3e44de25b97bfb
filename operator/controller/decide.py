"""Pure decisions of the operator: no cluster, no kopf, no clock. A step is observe -> decide -> act:
`observe.observe_step` reads (`Observed`), `step` here decides (`Plan`: the entries, the jobs to delete, what to
say, whether to step again), and `sweep` acts (deletes, creates the runs that may start, writes the status,
posts the Events).

A sweep is level-triggered: every step looks at `status.runs` and the jobs that exist, and decides which runs
changed phase, which Pending runs may start, and the status. Because the decision depends only on status +
existing jobs, a restarted operator resumes where the last one stopped, and because job names are the run
names, it never creates a job twice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from gpt2bench import collect, diagnosis, sweepcore
from gpt2bench import jobkinds as kinds
from gpt2bench.clock import parse_rfc3339
from gpt2bench.diagnosis import holds
from gpt2bench.plan import Run
from gpt2bench.specification.model import API_GROUP, Benchmark
from gpt2bench.status import (
    FAILED,
    FINISHED_PHASES,
    INVALID,
    PENDING,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    TERMINAL_RUN_PHASES,
    BenchmarkStatus,
    RunStatus,
)

from . import starting

# A run entry's reason in status is at most this long (the Event carries the same text): with the largest
# sweep allowed, every run failing with the longest reason still leaves status far below etcd's limit
# (tests/test_operator_status_size.py).
STATUS_REASON_LIMIT = 512
STATUS_DIGITS = 6


# The user says a held cause is fixed (docs/operator.md, One cause, one stop): any value; the operator removes it.
RESUME_ANNOTATION = f"{API_GROUP}/resume"


def resume_words(benchmark: Benchmark) -> str:
    """How the user resumes runs held by a cause they share, once it is fixed."""
    return (f"once fixed: kubectl annotate gpt2benchmark {benchmark.name} -n {benchmark.namespace} "
            f"{RESUME_ANNOTATION}=1 --overwrite")


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


# --- another writer --------------------------------------------------------------------------


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


# A preempted run measured nothing: it runs once more, and its record says so.
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


def transitions(old_runs: list[RunStatus], new_runs: list[RunStatus]) -> list[tuple[RunStatus, str]]:
    """(entry, previous phase) for every run whose phase changed: the Events to post."""
    before = {r.name: r.phase for r in old_runs}
    return [(r, before.get(r.name, PENDING)) for r in new_runs if before.get(r.name) != r.phase]


# --- one step: what was read in, what to do out ---------------------------------------------------


@dataclass(frozen=True)
class Result:
    """What a finished run's job left: its result pod, the trainer's termination message, and, when it failed,
    the first pod that failed (`cause`) and the reason in words (`why`)."""

    pod: dict[str, Any] | None
    message: str | None
    cause: str | None = None
    why: str | None = None


@dataclass
class Observed:
    """Everything a step reads before it decides (`observe.observe_step`)."""

    status: BenchmarkStatus
    benchmark: Benchmark
    runs: list[Run]
    jobs: dict[str, dict]  # the benchmark's jobs that a run in status holds, by name
    strays: dict[str, dict]  # its jobs that no run holds (a status write failed after their creation)
    missing: dict[str, str]  # the job kinds the cluster does not serve: why
    results: dict[str, Result]  # run name -> what its finished job left
    starts: dict[str, starting.StartView]  # run name -> what was read of its starting job
    renamed: list[str] = field(default_factory=list)  # runs another writer renamed (their names restored)
    overwritten: str | None = None  # a finished phase another writer wrote over unfinished runs
    resumed: bool = False  # the resume annotation is set
    generation: int = 0


@dataclass
class Plan:
    """What a step does, in order: delete `delete` (strays first), start the runs that may start (unless a round
    was `added`: its entries are written first), write `entries`/`rounds`, say `foreign`, keep the step records
    of `collected`, and step once more (`again`) when a run is to run anew or a round was added."""

    entries: list[RunStatus]
    runs: list[Run]
    rounds: sweepcore.Rounds
    added: str | None
    delete: list[dict[str, Any]] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    collected: list[tuple[Run, dict, dict]] = field(default_factory=list)
    again: bool = False


def step(seen: Observed, now: str) -> Plan:
    """One step's decisions, from what it read (module docstring)."""
    benchmark, status, jobs = seen.benchmark, seen.status, seen.jobs
    by_name = {run.name: run for run in seen.runs}
    old_runs = list(status.runs or [])
    delete = list(seen.strays.values())
    foreign = [*([seen.overwritten] if seen.overwritten else []),
               *(f"run {name} was renamed in status.runs: its planned name is restored" for name in seen.renamed)]
    for entry in old_runs:  # a run marked finished while its job runs: the mark is kept, the job deleted
        job = jobs.get(entry.job_name)
        if job is not None and finished_by_hand(entry, job):
            delete.append(job)
            foreign.append(f"run {entry.name} was marked {entry.phase} while its job {entry.job_name} was still "
                           "running: the mark is kept and the job deleted, so that one job runs at a time")
    entries: dict[str, RunStatus] = {entry.name: entry for entry in old_runs}
    for entry in old_runs:  # a kind the cluster does not serve: its runs fail now, the others go on
        if entry.phase not in TERMINAL_RUN_PHASES and entry.job_kind in seen.missing:
            entries[entry.name] = failed_entry(by_name[entry.name], entry, seen.missing[entry.job_kind], now)
    looked = observe([entries[e.name] for e in old_runs], jobs)
    for name in looked.started:
        entries[name] = mark_running(entries[name], now)
    for name in looked.queued:
        entries[name] = mark_queued(entries[name], now)
    plan = Plan([], seen.runs, sweepcore.Rounds(status.rounds_planned, status.rounds_done, status.stop_reason,
                                                status.racing, status.dropped), None, delete, foreign)
    for finished in looked.finished:
        run, entry, result = by_name[finished.name], entries[finished.name], seen.results[finished.name]
        if not finished.job_succeeded:
            finished = Finished(finished.name, False, result.why or "job failed")
        entries[finished.name] = after_preemption(run, entry, finish_entry(run, entry, finished, result.message,
                                                                           now, result.cause))
        if entries[finished.name].phase == PENDING:  # preempted: measured nothing, run again once, anew
            plan.delete.append(jobs[entry.job_name])
            plan.again = True
        elif result.pod:
            plan.collected.append((run, jobs[entry.job_name], result.pod))
    for name in looked.vanished:
        entries[name] = vanished_entry(by_name[name], entries[name], now,
                                       benchmark.spec.run_policy.ttl_seconds_after_finished)
    done = {finished.name for finished in looked.finished}
    for entry in list(entries.values()):  # queued or starting: what it waits for, and for how long
        if entry.phase in (RUNNING, QUEUED) and entry.job_name in jobs and entry.name not in done:
            followed = starting.follow(entry, jobs[entry.job_name], seen.starts.get(entry.name, starting.StartView()),
                                       benchmark.spec, now)
            entries[entry.name] = followed.entry
            if followed.failed:  # its job is deleted, its pods with it
                plan.delete.append(jobs[entry.job_name])
                entries[entry.name] = failed_entry(by_name[entry.name], entry, followed.failed, now)
    current = [entries[entry.name] for entry in old_runs]
    if seen.resumed:  # the user says the causes are fixed: the held runs go on (the annotation goes once written)
        current = holds.release(current)
    current, _ = holds.apply(old_runs, current, resume_words(benchmark))  # one cause, one stop
    added = sweepcore.add_round(benchmark, current, plan.rounds, status.start_time, parse_rfc3339(now))
    if added is not None:  # a new round's runs are recorded first; the next step creates their jobs
        current, plan.runs, plan.rounds, plan.added = (current + added.entries, seen.runs + added.runs, added.rounds,
                                                       added.added)
        plan.again = True
    plan.entries = current
    return plan
