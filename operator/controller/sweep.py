"""What the handlers do, between kopf and the pure decisions: one benchmark moved on from whatever state it is in.

One entry point, `advance`, moves a sweep on (docs/operator.md, "States and transitions"): not started (no
phase, Pending) → start it; Running → one step; Invalid and finished → nothing. Every trigger calls it: kopf's
create and resume handlers, the poll (Pending and Running), a job's watch event, and a spec edit
(`spec_changed`). It reads the benchmark fresh and writes status itself, one thread per benchmark at a time
(`state.Turn`): a trigger that finds the benchmark busy leaves a note and returns, and the thread at work goes
round once more, so no worker thread waits on another's API calls and no trigger is lost.

A Running sweep's step is observe → decide → act: `observe.observe_step` reads, `decide.step` decides on what
was read and the clock's `now` (pure), and `_step` acts: deletes the jobs the plan names, creates the runs that
may start (`create`), writes the status (`sweepstatus.after_step`), posts the Events (`events`), and asks for
one more step when the plan says so. Everything here is idempotent: kopf may run a step again after a crash or
a retry.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpt2bench import __version__
from gpt2bench.plan import Run, plan_runs
from gpt2bench.specification.model import Benchmark
from gpt2bench.specification.validation import SpecError
from gpt2bench.status import FINISHED_PHASES, INVALID, PENDING, RUNNING, BenchmarkStatus

from . import create, decide, events, kube, liveness, metrics, observe, pinning, sweepstatus
from .state import OperatorState

# Status writes are conditional on the resourceVersion read (kube.patch_status): a write that another writer
# came before (409) runs the step again on what is stored now, this many times in a row before the error is the
# handler's (kopf retries it; the poll tries again).
MAX_CONFLICTS = 5


def advance(state: OperatorState, namespace: str, name: str, logger: logging.Logger, edited: bool = False) -> None:
    """Move the benchmark on from its current state (module docstring); `edited`: a spec edit triggered it.
    Errors go to the caller's handler (kopf retries it, or the timer tries again)."""
    gate = state.turn(namespace, name)
    with state.guard:
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
            with state.guard:
                if not gate.wanted:
                    return
                gate.wanted, was_edited, gate.edited = False, gate.edited, False
            try:
                with liveness.activity(f"step {namespace}/{name}", liveness.STEP_LIMIT):  # each round its own
                    finished = _advance_once(state, namespace, name, logger, was_edited)
            except Exception as exc:
                with state.guard:
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
            create.keep_steps(owner, run, job, pod, logger)
        with state.guard:
            if not gate.wanted:
                return


def spec_changed(state: OperatorState, namespace: str, name: str, logger: logging.Logger) -> None:
    """A spec edit: a sweep that has not started starts with the new spec; a started one keeps its own."""
    advance(state, namespace, name, logger, edited=True)


def _advance_once(state: OperatorState, namespace: str, name: str, logger: logging.Logger,
                  edited: bool) -> list[tuple[dict, Run, dict, dict]]:
    fresh = kube.get_benchmark(namespace, name)
    now = state.clock.stamp()  # one moment for the whole step
    if fresh is None or (fresh.get("metadata") or {}).get("deletionTimestamp"):
        return []  # deleted or being deleted: the garbage collector takes its jobs
    stored = fresh.get("status") or {}
    phase = stored.get("phase")
    if not sweepstatus.sweep_started(stored):
        if phase != INVALID or edited:  # an Invalid spec waits for an edit
            _start_or_wait(state, fresh, now, logger)
        return []
    overwritten = decide.foreign_phase(stored)  # another writer's phase: the runs say the sweep still runs
    if phase == RUNNING or overwritten:
        try:
            finished = [(fresh, *done) for done in _step(state, fresh, now, logger, overwritten)]
        except pinning.Unreadable as unreadable:
            pinning.hold_unreadable(fresh, str(unreadable), now, logger)
            finished = []
        if edited:  # said once the step's write is done: a step run again after a 409 does not say it twice
            pinning.ignore_edit(fresh, now)
        return finished
    if edited:
        pinning.ignore_edit(fresh, now)
    if phase in FINISHED_PHASES:  # a restarted operator serves its metric again
        try:
            _export(fresh, BenchmarkStatus.read(stored))
        except ValueError as exc:  # written by a later version: nothing to serve
            logger.debug("status not read: %s", exc)
    return []


def _start_or_wait(state: OperatorState, fresh: dict[str, Any], now: str, logger: logging.Logger) -> None:
    """Start the sweep from the current spec. Until it has started (its runs in status), any error leaves it
    Pending, saying why, and the timer tries again (kopf retries the handler when not even that can be
    written); from then on it is Running, and an error creating the first jobs is a step's (tried again)."""
    try:
        started = _commit_start(fresh, now, logger)
    except Exception as exc:
        if kube.conflict(exc):  # another writer came first: the step runs again on what is stored now
            raise
        reason = _error_text(exc)
        metadata = fresh["metadata"]
        status = sweepstatus.pending_status(reason, metadata.get("generation"), now, state.retry_seconds)
        stored = fresh.get("status") or {}
        logger.info("sweep not started yet: %s", reason)
        metrics.RECONCILE_ERRORS.labels(metadata.get("namespace") or "").inc()  # not raised: counted here
        if stored.get("phase") == PENDING and stored.get("message") == status.message:
            return  # said already: the timer tries again, no Event each time
        kube.patch_status(metadata.get("namespace") or "default", metadata["name"],  # raises: kopf retries
                          sweepstatus.replacing(stored, status.dump()), pinning.version(fresh))
        events.post(fresh, "Warning", "SweepNotStarted", status.message)
        return
    if started is not None:
        _start_first_runs(fresh, *started, now, logger)


def _commit_start(fresh: dict[str, Any], now: str, logger: logging.Logger) -> tuple[Benchmark, list[Run],
                                                                            BenchmarkStatus, dict] | None:
    """Validate (None: Invalid, written), plan, pin the spec and write every run as Pending: from here on
    the sweep has started. No job exists before its run is in status. Returns the benchmark as written too."""
    metadata = fresh["metadata"]
    namespace, name = metadata.get("namespace") or "default", metadata["name"]
    spec = pinning.with_default_images(dict(fresh.get("spec") or {}))
    try:
        pinning.benchmark_of(fresh, spec)
    except SpecError as error:
        _reject(fresh, error, now)
        return None
    spec = pinning.with_resolved_backend(spec)  # after validation: an invalid spec asks the API nothing
    try:
        benchmark = pinning.benchmark_of(fresh, spec)
    except SpecError as error:  # what the backend `auto` resolved to cannot run (a TrainJob has no hostNetwork)
        _reject(fresh, now=now, error=SpecError([(path, f"{message} (spec.backend auto resolved to {spec['backend']} on this "
                                         "cluster)") for path, message in error.errors]))
        return None
    runs = plan_runs(benchmark)
    status = sweepstatus.initial_status(runs, metadata.get("generation"), now)
    pinned = kube.annotate_benchmark(namespace, name, {
        pinning.SWEEP_SPEC_ANNOTATION: json.dumps(spec, sort_keys=True, separators=(",", ":")),
        pinning.SWEEP_SPEC_VERSION_ANNOTATION: __version__}, pinning.version(fresh))
    written = kube.patch_status(namespace, name, sweepstatus.replacing(fresh.get("status") or {}, status.dump()),
                                pinning.version(pinned))
    events.post(fresh, "Normal", "SweepPlanned", f"{len(runs)} runs as {status.backend} jobs: "
                                            f"{', '.join(r.name for r in runs)}")
    logger.info("planned %d runs for %s/%s", len(runs), namespace, name)
    return benchmark, runs, status, written


def _start_first_runs(fresh: dict[str, Any], benchmark: Benchmark, runs: list[Run], status: BenchmarkStatus,
                      started: dict[str, Any], now: str, logger: logging.Logger) -> None:
    # No job listing: none of ours can exist yet; a namesake's answers 409 and is refused (not ours).
    new_runs = create.start_runs(fresh, benchmark, runs, status.runs or [], {}, now, logger)
    if any(r.phase == RUNNING for r in new_runs):  # a job was created (not only refused)
        metrics.observe_first_job(fresh["metadata"].get("creationTimestamp"), now)
    summary = sweepstatus.summarize(status, new_runs, now, benchmark.spec)
    _export(fresh, summary)
    written = status.dump()
    changed = {key: value for key, value in summary.dump().items() if written.get(key) != value}
    if changed:
        kube.patch_status(benchmark.namespace, benchmark.name, changed, pinning.version(started))
    events.post_transitions(fresh, status.runs or [], new_runs, summary, PENDING)


def _reject(fresh: dict[str, Any], error: SpecError, now: str) -> None:
    """Invalid spec: say which fields in status and in an Event, create nothing; an edit starts it again."""
    metadata, stored = fresh["metadata"], fresh.get("status") or {}
    status = sweepstatus.invalid_status(error.errors, metadata.get("generation"), now)
    if stored.get("phase") == INVALID and stored.get("message") == status.message and \
            stored.get("observedGeneration") == status.observed_generation:
        return  # said already (a retry, a restart)
    kube.patch_status(metadata.get("namespace") or "default", metadata["name"], sweepstatus.replacing(stored, status.dump()),
                      pinning.version(fresh))
    events.post(fresh, "Warning", "InvalidSpec", status.message)


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        reason, message = kube.api_message(exc)
        return f"the API server answered {exc.status} {reason}: {message}"
    return f"{type(exc).__name__}: {exc}"


def _step(state: OperatorState, fresh: dict[str, Any], now: str, logger: logging.Logger,
          overwritten: str | None = None) -> list[tuple[Run, dict, dict]]:
    """Observe, decide, act (decide.py): the finished runs whose step records are to be kept."""
    seen = observe.observe_step(fresh, now, overwritten)
    plan = decide.step(seen, now)
    benchmark, status, old_runs = seen.benchmark, seen.status, list(seen.status.runs or [])
    for job in plan.delete:
        kube.delete_job(job)
        if job["metadata"]["name"] in seen.strays:
            _say_stray(fresh, job["metadata"]["name"], logger)
    current = plan.entries
    if plan.added is None:  # a new round's entries are written first; the next step creates their jobs
        current = create.start_runs(fresh, benchmark, plan.runs, current, seen.jobs, now, logger)
    summary = sweepstatus.after_step(status, current, plan.rounds, seen.generation, __version__, now, benchmark.spec)
    _export(fresh, summary)
    stored = fresh["status"]
    changed = {key: value for key, value in summary.dump().items() if stored.get(key) != value}
    if changed:  # an idle step writes nothing (100 sweeps polling would otherwise patch every tick)
        kube.patch_status(benchmark.namespace, benchmark.name, changed, pinning.version(fresh))
    if seen.resumed:  # after the write that released them: a resume is never lost, at worst applied twice
        kube.annotate_benchmark(benchmark.namespace, benchmark.name, {decide.RESUME_ANNOTATION: None})
    for words in plan.foreign:  # after the write that repairs the record
        logger.warning("another writer changed the status: %s", words)
        events.post(fresh, "Warning", "ForeignStatusWrite", words)
    events.post_drops(fresh, status.dropped, summary.dropped)
    if plan.added:
        events.post(fresh, "Normal", "RoundAdded", plan.added)
    events.post_transitions(fresh, old_runs, current, summary, status.phase)
    if plan.again:
        state.again(benchmark.namespace, benchmark.name)
    logger.debug("step: %s", summary.message)
    return plan.collected


def _say_stray(owner: dict[str, Any], job_name: str, logger: logging.Logger) -> None:
    """A job of this benchmark that no run in its status holds, deleted: no step creates a job before its run is
    in status, so it escaped a write that failed, and would have run on, listed nowhere, to its deadline."""
    logger.warning("deleted job %s: it belongs to this benchmark but to none of its runs", job_name)
    events.post(owner, "Warning", "StrayJobDeleted",
                f"job {job_name} belongs to this GPT2Benchmark but to none of the runs in its status (a status "
                f"write failed after it was created): deleted, with its pods")


def _export(obj: dict[str, Any], status: BenchmarkStatus) -> None:
    """The recommendations as the operator's info metric (for Grafana's table), once the sweep is done."""
    if status.phase in FINISHED_PHASES:
        metadata = obj["metadata"]
        metrics.export_recommendations(metadata.get("namespace") or "", metadata["name"], status.analysis)
