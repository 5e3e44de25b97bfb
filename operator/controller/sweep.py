"""What the handlers do, between kopf and the pure decisions: read jobs and pods, create jobs, write status.

`reconcile` decides; `kube` talks to the API; this module wires one to the other and posts Events.
Everything here is idempotent: kopf may run a step again after a crash or a retry.

One entry point, `advance`, moves a sweep on from whatever state it is in (docs/operator.md, "States and
transitions"): not started (no phase, Pending) → start it; Running → one step (record finished runs, start
the next ones, finish the sweep); Invalid and finished → nothing. Every trigger calls it: kopf's create and
resume handlers, the safety-net timer (Pending and Running), a job's watch event, and a spec edit
(`spec_changed`). It reads the benchmark fresh and writes status itself, one thread per benchmark at a
time (`_Gate`): a trigger that finds the benchmark busy leaves a note and returns, and the thread at work
goes round once more, so no worker thread waits on another's API calls and no trigger is lost.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from gpt2bench import __version__, collect, sweepcore
from gpt2bench import jobkinds as kinds
from gpt2bench.diagnosis import holds
from gpt2bench.plan import Run, configuration_of, plan_runs, stopped_configurations
from gpt2bench.protocol import (
    BENCHMARK_LABEL,
    COMPONENT_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    MAX_STEPS_LINE,
    RUN_LABEL,
    STEPS_COMPONENT,
    STEPS_CONFIGMAP_KEY,
    STEPS_CONFIGMAP_SUFFIX,
    TRAINER_IMAGE_CPU_ENV,
    TRAINER_IMAGE_GPU_ENV,
)
from gpt2bench.render import label_value, render_run
from gpt2bench.spec.model import API_GROUP, KIND, Benchmark
from gpt2bench.spec.validation import SpecError, validate_spec
from gpt2bench.status import BenchmarkStatus, RunStatus, fabric_warnings

from . import kube, liveness, metrics, pods
from . import reconcile as rc

# The spec a sweep started with: later spec edits do not change a running sweep (docs/operator.md).
SWEEP_SPEC_ANNOTATION = f"{API_GROUP}/sweep-spec"
# The operator version that pinned it: a version that cannot read a pinned spec names the one that can.
SWEEP_SPEC_VERSION_ANNOTATION = f"{API_GROUP}/sweep-spec-version"
# The user says a held cause is fixed (docs/operator.md, One cause, one stop): any value; the operator removes it.
RESUME_ANNOTATION = f"{API_GROUP}/resume"
# How often a sweep that could not start is tried again (handlers.py sets it from --poll-interval).
RETRY_SECONDS = 30.0
# Status writes are conditional on the resourceVersion read (kube.patch_status): a write that another writer
# came before (409) runs the step again on what is stored now, this many times in a row before the error is the
# handler's (kopf retries it; the poll tries again).
MAX_CONFLICTS = 5
# The per-step records of a run: the GPT2BENCH_STEPS line near the end of the result pod's log.
STEPS_LOG_LINES = 200
STEPS_LOG_BYTES = 4 * MAX_STEPS_LINE + 200 * 400


@dataclass
class _Gate:
    """One benchmark's turn: one thread advances it at a time. `wanted`: a trigger came while it was busy
    (the holder goes round once more); `edited`: one of them was a spec edit."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    wanted: bool = False
    edited: bool = False


_gates: dict[tuple[str, str], _Gate] = {}
_gates_guard = threading.Lock()


def _gate(namespace: str, name: str) -> _Gate:
    with _gates_guard:
        return _gates.setdefault((namespace, name), _Gate())


def forget(namespace: str, name: str) -> None:
    """A deleted benchmark's gate goes with it."""
    with _gates_guard:
        _gates.pop((namespace, name), None)


def sweep_spec(obj: dict[str, Any]) -> dict[str, Any]:
    pinned = (obj.get("metadata", {}).get("annotations") or {}).get(SWEEP_SPEC_ANNOTATION)
    return json.loads(pinned) if pinned else dict(obj.get("spec") or {})


def with_default_images(spec: dict[str, Any]) -> dict[str, Any]:
    """The operator's trainer images (--trainer-image-cpu/-gpu) for the device types the spec leaves open.
    Pinned with the spec at start, so a sweep keeps its images whatever the operator is later told."""
    if spec.get("image"):
        return spec
    images = dict(spec.get("images") or {})
    for device, env in (("cpu", TRAINER_IMAGE_CPU_ENV), ("gpu", TRAINER_IMAGE_GPU_ENV)):
        if not images.get(device) and os.environ.get(env):
            images[device] = os.environ[env]
    return {**spec, "images": images} if images else spec


def with_resolved_backend(spec: dict[str, Any]) -> dict[str, Any]:
    """`backend: auto` (or none) resolved by asking the API server which job kinds it serves (TrainJob
    preferred, gpt2bench.jobkinds.resolve_backend); pinned with the spec at start, so a sweep keeps its
    backend whatever is installed later. A spec that names a backend keeps it."""
    requested = spec.get("backend") or kinds.AUTO
    if requested != kinds.AUTO:
        return spec
    return {**spec, "backend": kinds.resolve_backend(requested, kube.served_job_kinds())}


def benchmark_of(obj: dict[str, Any], spec: dict[str, Any]) -> Benchmark:
    """Validate (raises SpecError naming the fields) and bundle what plan and render need."""
    metadata = obj["metadata"]
    return Benchmark(name=metadata["name"], namespace=metadata.get("namespace") or "default",
                     uid=metadata.get("uid"), spec=validate_spec(spec))


class Unreadable(Exception):
    """This operator version cannot read what a started sweep was pinned with (spec, status, plan)."""


def advance(namespace: str, name: str, logger: logging.Logger, edited: bool = False) -> None:
    """Move the benchmark on from its current state (module docstring); `edited`: a spec edit triggered it.
    Errors go to the caller's handler (kopf retries it, or the timer tries again)."""
    gate = _gate(namespace, name)
    with _gates_guard:
        gate.wanted = True
        gate.edited |= edited
    conflicts = 0
    while True:
        # busy: the thread at work goes round once more; an edit's own handler waits for its turn instead, as the
        # thread at work may be a job event's, which kopf does not retry when its write fails
        if not gate.lock.acquire(blocking=edited):
            return
        finished: list[tuple[dict, Run, dict, dict]] = []
        try:
            with _gates_guard:
                if not gate.wanted:
                    return
                gate.wanted, was_edited, gate.edited = False, gate.edited, False
            try:
                with liveness.activity(f"step {namespace}/{name}", liveness.STEP_LIMIT):  # each round its own
                    finished = _advance_once(namespace, name, logger, was_edited)
            except Exception as exc:
                with _gates_guard:
                    gate.edited |= was_edited  # the edit is still to be answered at the next try,
                    gate.wanted |= was_edited  # by the edit's handler if it is waiting (or when kopf retries it)
                    conflicts += kube.conflict(exc)
                    if kube.conflict(exc) and conflicts <= MAX_CONFLICTS:  # another writer came first: again,
                        gate.wanted = True  # on what is stored now
                        continue
                raise
        finally:
            gate.lock.release()
        for owner, run, job, pod in finished:  # the curves: after the status, off the path to the next run
            _keep_steps(owner, run, job, pod, logger)
        with _gates_guard:
            if not gate.wanted:
                return


def spec_changed(namespace: str, name: str, logger: logging.Logger) -> None:
    """A spec edit: a sweep that has not started starts with the new spec; a started one keeps its own."""
    advance(namespace, name, logger, edited=True)


def _advance_once(namespace: str, name: str, logger: logging.Logger,
                  edited: bool) -> list[tuple[dict, Run, dict, dict]]:
    fresh = kube.get_benchmark(namespace, name)
    if fresh is None or (fresh.get("metadata") or {}).get("deletionTimestamp"):
        return []  # deleted or being deleted: the garbage collector takes its jobs
    stored = fresh.get("status") or {}
    phase = stored.get("phase")
    if not rc.sweep_started(stored):
        if phase != rc.INVALID or edited:  # an Invalid spec waits for an edit
            _start_or_wait(fresh, logger)
        return []
    overwritten = rc.foreign_phase(stored)  # another writer's phase: the runs say the sweep still runs
    if phase == rc.RUNNING or overwritten:
        try:
            finished = [(fresh, *done) for done in _step(fresh, logger, overwritten)]
        except Unreadable as unreadable:
            _hold(fresh, str(unreadable), logger)
            finished = []
        if edited:  # said once the step's write is done: a step run again after a 409 does not say it twice
            _ignore_edit(fresh)
        return finished
    if edited:
        _ignore_edit(fresh)
    if phase in rc.FINISHED_PHASES:  # a restarted operator serves its metric again
        try:
            _export(fresh, BenchmarkStatus.read(stored))
        except ValueError as exc:  # written by a later version: nothing to serve
            logger.debug("status not read: %s", exc)
    return []


# --- not started: start, or wait saying why ---------------------------------------------------------


def _start_or_wait(fresh: dict[str, Any], logger: logging.Logger) -> None:
    """Start the sweep from the current spec. Until it has started (its runs in status), any error leaves it
    Pending, saying why, and the timer tries again (kopf retries the handler when not even that can be
    written); from then on it is Running, and an error creating the first jobs is a step's (tried again)."""
    try:
        started = _commit_start(fresh, logger)
    except Exception as exc:
        if kube.conflict(exc):  # another writer came first: the step runs again on what is stored now
            raise
        reason = _error_text(exc)
        metadata = fresh["metadata"]
        status = rc.pending_status(reason, metadata.get("generation"), rc.now_rfc3339(), RETRY_SECONDS)
        stored = fresh.get("status") or {}
        logger.info("sweep not started yet: %s", reason)
        metrics.RECONCILE_ERRORS.labels(metadata.get("namespace") or "").inc()  # not raised: counted here
        if stored.get("phase") == rc.PENDING and stored.get("message") == status.message:
            return  # said already: the timer tries again, no Event each time
        kube.patch_status(metadata.get("namespace") or "default", metadata["name"],  # raises: kopf retries
                          rc.replacing(stored, status.dump()), _version(fresh))
        _event(fresh, "Warning", "SweepNotStarted", status.message)
        return
    if started is not None:
        _start_first_runs(fresh, *started, logger)


def _version(obj: dict[str, Any]) -> str | None:
    """The resourceVersion a write is conditional on: the benchmark as this step read (or last wrote) it."""
    return (obj.get("metadata") or {}).get("resourceVersion")


def _commit_start(fresh: dict[str, Any], logger: logging.Logger) -> tuple[Benchmark, list[Run],
                                                                            BenchmarkStatus, dict] | None:
    """Validate (None: Invalid, written), plan, pin the spec and write every run as Pending: from here on
    the sweep has started. No job exists before its run is in status. Returns the benchmark as written too."""
    metadata = fresh["metadata"]
    namespace, name = metadata.get("namespace") or "default", metadata["name"]
    spec = with_default_images(dict(fresh.get("spec") or {}))
    try:
        benchmark_of(fresh, spec)
    except SpecError as error:
        _reject(fresh, error)
        return None
    spec = with_resolved_backend(spec)  # after validation: an invalid spec asks the API nothing
    try:
        benchmark = benchmark_of(fresh, spec)
    except SpecError as error:  # what the backend `auto` resolved to cannot run (a TrainJob has no hostNetwork)
        _reject(fresh, SpecError([(path, f"{message} (spec.backend auto resolved to {spec['backend']} on this "
                                         "cluster)") for path, message in error.errors]))
        return None
    runs = plan_runs(benchmark)
    status = rc.initial_status(runs, metadata.get("generation"), rc.now_rfc3339())
    pinned = kube.annotate_benchmark(namespace, name, {
        SWEEP_SPEC_ANNOTATION: json.dumps(spec, sort_keys=True, separators=(",", ":")),
        SWEEP_SPEC_VERSION_ANNOTATION: __version__}, _version(fresh))
    written = kube.patch_status(namespace, name, rc.replacing(fresh.get("status") or {}, status.dump()),
                                _version(pinned))
    _event(fresh, "Normal", "SweepPlanned", f"{len(runs)} runs as {status.backend} jobs: "
                                            f"{', '.join(r.name for r in runs)}")
    logger.info("planned %d runs for %s/%s", len(runs), namespace, name)
    return benchmark, runs, status, written


def _start_first_runs(fresh: dict[str, Any], benchmark: Benchmark, runs: list[Run], status: BenchmarkStatus,
                      started: dict[str, Any], logger: logging.Logger) -> None:
    now = rc.now_rfc3339()
    # No job listing: none of ours can exist yet; a namesake's answers 409 and is refused (not ours).
    new_runs = _start_runs(fresh, benchmark, runs, status.runs or [], {}, now, logger)
    if any(r.phase == rc.RUNNING for r in new_runs):  # a job was created (not only refused)
        metrics.observe_first_job(fresh["metadata"].get("creationTimestamp"))
    summary = rc.summarize(status, new_runs, now, benchmark.spec)
    _export(fresh, summary)
    written = status.dump()
    changed = {key: value for key, value in summary.dump().items() if written.get(key) != value}
    if changed:
        kube.patch_status(benchmark.namespace, benchmark.name, changed, _version(started))
    _post_transitions(fresh, status.runs or [], new_runs, summary, rc.PENDING)


def _reject(fresh: dict[str, Any], error: SpecError) -> None:
    """Invalid spec: say which fields in status and in an Event, create nothing; an edit starts it again."""
    metadata, stored = fresh["metadata"], fresh.get("status") or {}
    status = rc.invalid_status(error.errors, metadata.get("generation"), rc.now_rfc3339())
    if stored.get("phase") == rc.INVALID and stored.get("message") == status.message and \
            stored.get("observedGeneration") == status.observed_generation:
        return  # said already (a retry, a restart)
    kube.patch_status(metadata.get("namespace") or "default", metadata["name"], rc.replacing(stored, status.dump()),
                      _version(fresh))
    _event(fresh, "Warning", "InvalidSpec", status.message)


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        reason, message = kube.api_message(exc)
        return f"the API server answered {exc.status} {reason}: {message}"
    return f"{type(exc).__name__}: {exc}"


# --- started: edits ignored, unreadable pinned state held ------------------------------------------


def _ignore_edit(fresh: dict[str, Any]) -> None:
    """A started sweep keeps the spec it started with: a Warning Event, and the condition (written by the
    step while Running, here once the sweep is finished)."""
    metadata, stored = fresh["metadata"], fresh.get("status") or {}
    condition = rc.spec_ignored_condition(metadata.get("generation") or 0, stored.get("observedGeneration"),
                                          rc.now_rfc3339())
    if stored.get("phase") != rc.RUNNING:
        conditions = BenchmarkStatus.read({"conditions": stored.get("conditions") or []}).conditions
        kube.patch_status(metadata.get("namespace") or "default", metadata["name"],
                          {"conditions": [c.dump() for c in rc.set_condition(conditions or [], condition)]},
                          _version(fresh))
    _event(fresh, "Warning", "SpecChangeIgnored", condition.message)


def _pinned(fresh: dict[str, Any]) -> tuple[BenchmarkStatus, Benchmark, list[Run]]:
    """A started sweep's status, pinned spec and plan, as this version reads them (`_read_pinned`)."""
    status, benchmark, runs, _ = _read_pinned(fresh)
    return status, benchmark, runs


def _read_pinned(fresh: dict[str, Any]) -> tuple[BenchmarkStatus, Benchmark, list[Run], list[str]]:
    """A started sweep's status, pinned spec and plan, as this version reads them, and what another writer changed
    that the plan restores (runs renamed in status: `rc.renamed_back`); Unreadable when it cannot (a later
    version's spec field or status value, a version that plans other runs)."""
    annotations = fresh["metadata"].get("annotations") or {}
    pinned_by = annotations.get(SWEEP_SPEC_VERSION_ANNOTATION)
    try:
        status = BenchmarkStatus.read(fresh["status"])
        benchmark = benchmark_of(fresh, sweep_spec(fresh))
    except SpecError as error:
        what = "; ".join(f"{path}: {message}" for path, message in error.errors)
        raise Unreadable(rc.unreadable_reason(__version__, pinned_by, what)) from error
    except ValueError as error:  # the status (pydantic) or the annotation (JSON)
        raise Unreadable(rc.unreadable_reason(__version__, pinned_by, " ".join(str(error).split()))) from error
    # with the rounds a sweep added until decided, for the configurations that were still racing
    runs = plan_runs(benchmark, rounds=status.rounds_planned,
                     stopped=stopped_configurations(status.runs or [], status.rounds_planned or 0))
    planned, recorded = [r.name for r in runs], [r.name for r in status.runs or []]
    restored, renamed = rc.renamed_back(runs, status.runs or [])
    if renamed and pinned_by == __version__:  # this version planned them: another writer renamed them
        status = status.model_copy(update={"runs": restored})
        return status, benchmark, runs, renamed
    if planned != recorded:
        missing = sorted(set(recorded) - set(planned)) or sorted(set(planned) - set(recorded)) or recorded
        what = f"it plans other runs than the sweep's ({', '.join(missing[:3])} ...)"
        raise Unreadable(rc.unreadable_reason(__version__, pinned_by, what))
    return status, benchmark, runs, []


def _hold(fresh: dict[str, Any], reason: str, logger: logging.Logger) -> None:
    """Hold a sweep this version cannot read: the condition and one Warning Event say why and what to do;
    nothing is created or collected, and no handler error repeats it every poll."""
    metadata, stored = fresh["metadata"], fresh.get("status") or {}
    conditions = [c for c in stored.get("conditions") or [] if isinstance(c, dict)]
    held = next((c for c in conditions if c.get("type") == rc.SPEC_UNREADABLE), None)
    if held and held.get("status") == "True" and held.get("message") == reason:
        return
    condition = rc.spec_unreadable_condition(reason, rc.now_rfc3339(), metadata.get("generation"))
    kube.patch_status(metadata.get("namespace") or "default", metadata["name"],
                      {"message": reason, "conditions": [c for c in conditions if c.get("type") != rc.SPEC_UNREADABLE]
                       + [condition.dump()]}, _version(fresh))
    _event(fresh, "Warning", "SpecUnreadable", reason)
    logger.info("%s", reason)


# --- Running: one step --------------------------------------------------------------------------------


def _step(fresh: dict[str, Any], logger: logging.Logger, overwritten: str | None = None) -> list[tuple[Run, dict, dict]]:
    stored = fresh["status"]
    status, benchmark, runs, renamed = _read_pinned(fresh)
    by_name = {run.name: run for run in runs}
    old_runs = list(status.runs or [])
    listed, missing = kube.list_jobs(benchmark.namespace, benchmark.name, {r.job_kind for r in runs})
    jobs = _without_strays(fresh, rc.owned_jobs(listed, benchmark.uid), old_runs, logger)
    now = rc.now_rfc3339()
    foreign = _foreign_writes(old_runs, jobs, overwritten, renamed)
    entries: dict[str, RunStatus] = {entry.name: entry for entry in old_runs}
    for entry in old_runs:  # a kind the cluster does not serve: its runs fail now, the others go on
        if entry.phase not in rc.TERMINAL_RUN_PHASES and entry.job_kind in missing:
            entries[entry.name] = rc.failed_entry(by_name[entry.name], entry, missing[entry.job_kind], now)
    seen = rc.observe([entries[e.name] for e in old_runs], jobs)
    for name in seen.started:
        entries[name] = rc.mark_running(entries[name], now)
    for name in seen.queued:
        entries[name] = rc.mark_queued(entries[name], now)
    collected: list[tuple[Run, dict, dict]] = []
    for finished in seen.finished:
        run, entry = by_name[finished.name], entries[finished.name]
        job = jobs[entry.job_name]
        pod = kube.result_pod(job)
        message = kube.termination_message(pod, container=kinds.result_container(job))
        cause = None
        if not finished.job_succeeded:  # the first pod that failed (OOMKilled ...), then the controller's word
            cause, why = pods.failure(job, finished.job_message, now)
            finished = rc.Finished(finished.name, False, why or "job failed")
        entries[finished.name] = rc.after_preemption(run, entry, rc.finish_entry(run, entry, finished, message, now,
                                                                                 cause))
        if entries[finished.name].phase == rc.PENDING:  # preempted: measured nothing, run again once, anew
            kube.delete_job(job)
            _again(benchmark.namespace, benchmark.name)
        elif pod:
            collected.append((run, job, pod))
    for name in seen.vanished:
        ttl = benchmark.spec.run_policy.ttl_seconds_after_finished
        entries[name] = rc.vanished_entry(by_name[name], entries[name], now, ttl)
    done = {finished.name for finished in seen.finished}
    for entry in list(entries.values()):  # queued or starting: what it waits for, and for how long
        if entry.phase in (rc.RUNNING, rc.QUEUED) and entry.job_name in jobs and entry.name not in done:
            entries[entry.name] = pods.follow_start(by_name[entry.name], entry, jobs[entry.job_name], benchmark.spec,
                                                    now)
    current = [entries[entry.name] for entry in old_runs]
    resumed = RESUME_ANNOTATION in (fresh["metadata"].get("annotations") or {})
    if resumed:  # the user says the causes are fixed: the held runs go on (the annotation goes once written)
        current = holds.release(current)
    current, _ = holds.apply(old_runs, current, resume_words(benchmark))  # one cause, one stop
    current, runs, rounds, added = _add_round(benchmark, status, current, runs, now)
    if added:  # a new round's runs are recorded first; the next step creates their jobs (as the start does)
        _again(benchmark.namespace, benchmark.name)
    else:
        current = _start_runs(fresh, benchmark, runs, current, jobs, now, logger)
    summary = rc.summarize(status, current, now, benchmark.spec)
    summary.rounds_planned, summary.rounds_done, summary.stop_reason, summary.racing, summary.dropped = rounds
    if summary.phase != rc.RUNNING:
        summary.racing = 0  # nothing runs on
    elif summary.racing is None:  # fixed rounds: every configuration runs every round
        summary.racing = len({configuration_of(entry) for entry in current})
    _export(fresh, summary)
    generation, observed = fresh["metadata"].get("generation") or 0, status.observed_generation or 0
    if generation > observed:  # written here, not by the update handler: one writer while Running
        ignored = rc.spec_ignored_condition(generation, observed, now)
        summary.conditions = rc.set_condition(summary.conditions or [], ignored)
    if any(c.type == rc.SPEC_UNREADABLE and c.status == "True" for c in summary.conditions or []):
        readable = rc.spec_readable_condition(__version__, now, generation)  # no longer held
        summary.conditions = rc.set_condition(summary.conditions or [], readable)
    changed = {key: value for key, value in summary.dump().items() if stored.get(key) != value}
    if changed:  # an idle step writes nothing (100 sweeps polling would otherwise patch every tick)
        kube.patch_status(benchmark.namespace, benchmark.name, changed, _version(fresh))
    if resumed:  # after the write that released them: a resume is never lost, at worst applied twice
        kube.annotate_benchmark(benchmark.namespace, benchmark.name, {RESUME_ANNOTATION: None})
    for words in foreign:  # after the write that repairs the record
        logger.warning("another writer changed the status: %s", words)
        _event(fresh, "Warning", "ForeignStatusWrite", words)
    _post_drops(fresh, status.dropped, summary.dropped)
    if added:
        _event(fresh, "Normal", "RoundAdded", added)
    _post_transitions(fresh, old_runs, current, summary, status.phase)
    logger.debug("step: %s", summary.message)
    return collected


def _foreign_writes(entries: list[RunStatus], jobs: dict[str, dict], overwritten: str | None,
                    renamed: list[str]) -> list[str]:
    """What another writer changed in the status (issue 50.2), each said in a ForeignStatusWrite Event once the
    step's write repairs it: a finished phase over unfinished runs (`overwritten`), runs renamed (`renamed`, their
    names restored), and a run marked finished while its job still runs, whose job is deleted here (one job at a
    time; it counts against concurrency until it is gone)."""
    said = [*([overwritten] if overwritten else []),
            *(f"run {name} was renamed in status.runs: its planned name is restored" for name in renamed)]
    for entry in entries:
        job = jobs.get(entry.job_name)
        if job is not None and rc.finished_by_hand(entry, job):
            kube.delete_job(job)
            said.append(f"run {entry.name} was marked {entry.phase} while its job {entry.job_name} was still "
                        "running: the mark is kept and the job deleted, so that one job runs at a time")
    return said


def owner_of(job: dict[str, Any]) -> dict[str, Any] | None:
    """The GPT2Benchmark controlling a job (its ownerReference), if any."""
    for ref in (job.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == KIND and str(ref.get("apiVersion", "")).startswith(
                f"{API_GROUP}/"):
            return ref
    return None


def _event(body: dict[str, Any], type_: str, reason: str, message: str) -> None:
    # kopf.event, not kopf.info/warn: those obey settings.posting.level, which is for kopf's own logs
    kopf.event(body, type=type_, reason=reason, message=message)


def _export(obj: dict[str, Any], status: BenchmarkStatus) -> None:
    """The recommendations as the operator's info metric (for Grafana's table), once the sweep is done."""
    if status.phase in rc.FINISHED_PHASES:
        metadata = obj["metadata"]
        metrics.export_recommendations(metadata.get("namespace") or "", metadata["name"], status.analysis)


def _start_runs(owner: dict[str, Any], benchmark: Benchmark, runs: list[Run], entries: list[RunStatus],
                jobs: dict[str, dict], now: str, logger: logging.Logger) -> list[RunStatus]:
    """Create the jobs of the runs that may start now. A job the cluster refuses (or cannot serve, or whose
    name another owner holds) fails its run at once, and the next run takes its place in the same step; a
    transient error leaves the run Pending for the next step. Nothing is created for a benchmark deleted
    since the step read it (its jobs vanish with it: a step that reads them gone would start the next run)."""
    by_name = {run.name: run for run in runs}
    current = {entry.name: entry for entry in entries}
    present = dict(jobs)  # jobs, plus the ones created here: they hold their concurrency slots
    tried: set[str] = set()
    while chosen := _to_start(current, present, benchmark.spec.concurrency, tried):
        if not tried and _deleted_since(owner):
            return entries
        for name in chosen:
            tried.add(name)
            run, entry = by_name[name], current[name]
            *policy, job = render_run(benchmark, run)
            try:
                outcome = _create_run(owner, benchmark, policy, job)
            except Exception as exc:
                if not kube.transient(exc):
                    raise
                metrics.RECONCILE_ERRORS.labels(benchmark.namespace).inc()
                logger.warning("creating %s %s failed, retrying at the next step: %s", run.job_kind, name, exc)
                continue
            if isinstance(outcome, kube.Refused) and (holds.held(entry) or holds.refusal_cause(outcome.reason)):
                if not holds.held(entry):  # one cause: the runs it would refuse too wait with this one
                    cause = holds.refusal_cause(outcome.reason)
                    current = _by_name(holds.hold(list(current.values()), cause, name, RETRY_WORDS))
                continue
            if isinstance(outcome, kube.Refused):
                current[name] = rc.failed_entry(run, entry, outcome.reason, now)
                if outcome.kind_missing:  # every run of that kind would meet the same answer
                    for other, pending in current.items():
                        if pending.job_kind == run.job_kind and pending.phase == rc.PENDING:
                            current[other] = rc.failed_entry(by_name[other], pending, outcome.reason, now)
                continue
            if outcome.new:
                metrics.RUNS_STARTED.labels(benchmark.namespace).inc()
            present[entry.job_name] = job
            if holds.held(entry):  # created again: the runs held by the same refusal go on
                current = _by_name(holds.release(list(current.values()), reason=entry.reason))
                entry = current[name]
            current[name] = rc.mark_running(entry, now)
    return [current[entry.name] for entry in entries]


# How a run held by a refused creation goes on (gpt2bench.diagnosis.holds: FORBIDDEN)
RETRY_WORDS = "its creation is tried again at every step; the others wait until it works"


def resume_words(benchmark: Benchmark) -> str:
    """How the user resumes runs held by a cause they share, once it is fixed."""
    return (f"once fixed: kubectl annotate gpt2benchmark {benchmark.name} -n {benchmark.namespace} "
            f"{RESUME_ANNOTATION}=1 --overwrite")


def _by_name(entries: list[RunStatus]) -> dict[str, RunStatus]:
    return {entry.name: entry for entry in entries}


def _to_start(current: dict[str, RunStatus], present: dict[str, dict], concurrency: int, tried: set[str]) -> list[str]:
    """The runs to create now: those that may start (plan order, concurrency), else, with a slot free, the first
    run held by a refused creation, to try it again."""
    chosen = [name for name in rc.runs_to_start(list(current.values()), present, concurrency) if name not in tried]
    retry = holds.retry_candidate(current.values())
    if chosen or retry is None or retry.name in tried:
        return chosen
    again = holds.release(list(current.values()), reason=retry.reason)
    return [retry.name] if retry.name in rc.runs_to_start(again, present, concurrency) else []


def _add_round(benchmark: Benchmark, status: BenchmarkStatus, current: list[RunStatus],
               runs: list[Run], now: str) -> tuple[list[RunStatus], list[Run], tuple, str | None]:
    """Repeat until decided (sweep.maxRepeats), as sweepcore.add_round answers: one more round as Pending entries,
    or why the sweep stops. The rule reads only the stored runs and times, so a restarted operator continues it.
    Returns the entries, the runs planned, (rounds planned, rounds done, stop reason, configurations still racing,
    configurations the race dropped so far) and, when a round was added, why (its entries must be written before
    any of its jobs exists, and its Event posted after that write)."""
    before = sweepcore.Rounds(status.rounds_planned, status.rounds_done, status.stop_reason, status.racing,
                              status.dropped)
    step = sweepcore.add_round(benchmark, current, before, status.start_time, rc.parse_rfc3339(now))
    if step is None:
        return current, runs, _rounds(before), None
    return current + step.entries, runs + step.runs, _rounds(step.rounds), step.added


def _rounds(rounds: sweepcore.Rounds) -> tuple:
    return rounds.planned, rounds.done, rounds.stop_reason, rounds.racing, rounds.dropped


def _again(namespace: str, name: str) -> None:
    """Have the thread advancing this benchmark go round once more when its step is done (as a trigger that
    finds it busy does)."""
    gate = _gate(namespace, name)
    with _gates_guard:
        gate.wanted = True


def _without_strays(owner: dict[str, Any], jobs: dict[str, dict], entries: list[RunStatus],
                    logger: logging.Logger) -> dict[str, dict]:
    """The benchmark's jobs that a run in status holds; any other job it owns is deleted (a Warning Event says
    so). No step creates a job before its run is in status, so such a job escaped a write that failed (an
    earlier version created a new round's first job before recording the round), and would run on, listed
    nowhere, to its deadline."""
    held = {entry.job_name for entry in entries}
    for job_name, job in jobs.items():
        if job_name not in held:
            kube.delete_job(job)
            logger.warning("deleted job %s: it belongs to this benchmark but to none of its runs", job_name)
            _event(owner, "Warning", "StrayJobDeleted",
                   f"job {job_name} belongs to this GPT2Benchmark but to none of the runs in its status (a status "
                   f"write failed after it was created): deleted, with its pods")
    return {job_name: job for job_name, job in jobs.items() if job_name in held}


def _post_drops(owner: dict[str, Any], before: list[Any] | None, now: list[Any] | None) -> None:
    """One Event per configuration the race dropped since the status was last written: which, after which round,
    and why (posted after the write that records it, so a retried step does not post it twice)."""
    known = {d.configuration for d in before or []}
    for dropped in now or []:
        if dropped.configuration not in known:
            _event(owner, "Normal", "ConfigurationDropped",
                   f"{dropped.configuration} dropped after round {dropped.round}: {dropped.behind} is "
                   f"{dropped.ratio - 1:+.1%} faster (at least {dropped.low - 1:+.1%} at the race's level); it runs no "
                   "more rounds")


def _deleted_since(owner: dict[str, Any]) -> bool:
    """Whether the benchmark read at the step's start is gone or being deleted now (one read, just before the
    first job a step creates; a real API server's garbage collector would delete a job created in the
    remaining moment, its owner being gone)."""
    metadata = owner["metadata"]
    now = kube.get_benchmark(metadata.get("namespace") or "default", metadata["name"])
    return now is None or bool(now["metadata"].get("deletionTimestamp")) or now["metadata"].get("uid") != metadata.get("uid")


def _create_run(owner: dict[str, Any], benchmark: Benchmark, policy: list[dict[str, Any]],
                job: dict[str, Any]) -> kube.Created | kube.Refused:
    """A run's NetworkPolicy (when the spec has one), then its job, both owned by the benchmark (the API
    server's garbage collector deletes them with it): the job's pods never run without their policy."""
    for child in (*policy, job):
        kopf.adopt(child, owner=owner, strict=True)  # render labels them; ownership is the operator's
    for child in policy:
        outcome = kube.create_network_policy(child, benchmark.uid)
        if isinstance(outcome, kube.Refused):
            return outcome
    return kube.create_job(job, benchmark.uid)


def _keep_steps(owner: dict[str, Any], run: Run, job: dict[str, Any], pod: dict[str, Any],
                logger: logging.Logger) -> None:
    """The run's per-step records, from its result pod's log into a ConfigMap owned by the benchmark:
    the cluster report draws its curves after the pods are gone. Best effort: never fails the run."""
    metadata = pod.get("metadata") or {}
    try:
        log = kube.pod_log_tail(metadata.get("namespace") or owner["metadata"]["namespace"], metadata["name"],
                                kinds.result_container(job), STEPS_LOG_LINES, STEPS_LOG_BYTES)
        records = collect.find_steps(log or "")
        if not records:
            return
        config_map = steps_config_map(owner, run, records)
        kopf.adopt(config_map, owner=owner, strict=True)
        if not kube.save_configmap(config_map, owner["metadata"].get("uid")):
            logger.warning("ConfigMap %s belongs to another owner: %s's steps not kept",
                           config_map["metadata"]["name"], run.name)
    except Exception as exc:  # the curves are a bonus: a missing permission must not stop the sweep
        logger.warning("could not keep the per-step records of %s: %s", run.name, exc)


def steps_config_map(owner: dict[str, Any], run: Run, records: list[dict[str, Any]]) -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": "gpt2bench", COMPONENT_LABEL: STEPS_COMPONENT, MANAGED_BY_LABEL: MANAGED_BY,
              BENCHMARK_LABEL: label_value(owner["metadata"]["name"]), RUN_LABEL: run.name}
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": steps_config_map_name(run.name), "namespace": owner["metadata"]["namespace"],
                         "labels": labels},
            "data": {STEPS_CONFIGMAP_KEY: collect.steps_jsonl(records)}}


def steps_config_map_name(run_name: str) -> str:
    return f"{run_name}{STEPS_CONFIGMAP_SUFFIX}"


# More runs than this failing for the same reason in one step (a kind that is not served, a quota) get one
# Event between them, not one each: a 1000-run sweep must not post 1000 Events at once.
GROUPED_EVENTS_FROM = 4


def _post_transitions(body: dict[str, Any], old_runs: list[RunStatus], new_runs: list[RunStatus],
                      summary: BenchmarkStatus, phase_before: str | None) -> None:
    namespace = body["metadata"].get("namespace") or "default"
    changed = rc.transitions(old_runs, new_runs)
    failures: dict[str, list[str]] = {}
    for entry, _ in changed:
        if entry.phase == rc.FAILED:
            failures.setdefault(entry.reason or "", []).append(entry.name)
    for reason, names in failures.items():
        if len(names) >= GROUPED_EVENTS_FROM:
            listed = ", ".join(names[:3]) + f" and {len(names) - 3} more"
            _event(body, "Warning", "RunFailed", f"{len(names)} runs ({listed}): {reason}")
    for entry, before in changed:
        if entry.phase == rc.SUCCEEDED:
            metrics.RUNS_SUCCEEDED.labels(namespace).inc()
        elif entry.phase == rc.FAILED:
            metrics.RUNS_FAILED.labels(namespace).inc()
            if len(failures[entry.reason or ""]) >= GROUPED_EVENTS_FROM:
                continue  # said by the grouped Event
        for type_, reason, message in run_events(entry, before):
            _event(body, type_, reason, message)
    for type_, reason, message in held_events(old_runs, new_runs):
        _event(body, type_, reason, message)
    if summary.phase != rc.RUNNING and phase_before in (rc.RUNNING, rc.PENDING):
        _event(body, *sweep_event(summary))


def held_events(old_runs: list[RunStatus], new_runs: list[RunStatus]) -> list[tuple[str, str, str]]:
    """One Warning Event per cause that holds runs now and did not before, one Normal Event when held runs go on."""
    before, after = holds.held_reasons(old_runs), holds.held_reasons(new_runs)
    events = [("Warning", "RunsHeld", f"{len(names)} run{'s' * (len(names) > 1)} {reason}")
              for reason, names in after.items() if reason not in before]
    released = [name for names in before.values() for name in names
                if name not in {n for names in after.values() for n in names}]
    if released:
        events.append(("Normal", "RunsResumed", f"{len(released)} held run{'s' * (len(released) > 1)} go on: "
                                                f"{', '.join(released[:5])}{' ...' if len(released) > 5 else ''}"))
    return events


def run_events(entry: RunStatus, before: str | None) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the Events a run's new phase posts (`before`: its phase before)."""
    if entry.phase == rc.RUNNING and before == rc.QUEUED:
        return [("Normal", "RunAdmitted", f"{entry.name}: job {entry.job_name} resumed")]
    if entry.phase == rc.RUNNING:
        return [("Normal", "RunStarted", f"{entry.name}: job {entry.job_name} created")]
    if entry.phase == rc.QUEUED:
        return [("Normal", "RunQueued", f"{entry.name}: job {entry.job_name} is suspended, waiting for its queue")]
    if entry.phase == rc.SUCCEEDED:
        tps = entry.results.tokens_per_second if entry.results else None
        # a figure that is not what its scale says (docs/clusters.md)
        return [("Normal", "RunSucceeded", f"{entry.name}: {tps} tokens/s"),
                *(("Warning", "RunOffItsFabric", warning) for warning in fabric_warnings(entry))]
    if entry.phase == rc.FAILED:
        return [("Warning", "RunFailed", f"{entry.name}: {entry.reason}")]
    if entry.phase == rc.PENDING and (entry.reason or "").startswith(rc.RERUN):
        return [("Warning", "RunPreempted", f"{entry.name}: {entry.reason}")]
    if entry.phase == rc.SKIPPED:  # the trainer chose not to train (e.g. emulated bf16): not a failure
        return [("Normal", "RunSkipped", f"{entry.name}: {entry.reason}")]
    return []


def sweep_event(summary: BenchmarkStatus) -> tuple[str, str, str]:
    """(type, reason, message) of a finished sweep's Event."""
    best = summary.best
    text = f"{summary.message}; best: {best.run if best else None} ({best.tokens_per_second if best else None} tokens/s)"
    return "Normal" if summary.phase == rc.SUCCEEDED else "Warning", f"Sweep{summary.phase}", text
