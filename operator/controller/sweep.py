"""What the handlers do, between kopf and the pure decisions: read jobs and pods, create jobs, patch status.

`reconcile` decides; `kube` talks to the API; this module wires one to the other and posts Events.
Everything here is idempotent: kopf may run a step again after a crash or a retry.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import kopf

from gpt2bench.plan import Run, plan_runs
from gpt2bench.protocol import LAUNCHER_CONTAINER, PYTORCH_CONTAINER
from gpt2bench.render import render_job
from gpt2bench.spec import API_GROUP, Benchmark, SpecError, validate_spec
from gpt2bench.status import BenchmarkStatus, RunStatus

from . import kube, metrics
from . import reconcile as rc

MISSING_KIND_RETRY_SECONDS = 30
# The spec a sweep started with: later spec edits do not change a running sweep (docs/operator.md).
SWEEP_SPEC_ANNOTATION = f"{API_GROUP}/sweep-spec"


def sweep_spec(obj: dict[str, Any]) -> dict[str, Any]:
    pinned = (obj.get("metadata", {}).get("annotations") or {}).get(SWEEP_SPEC_ANNOTATION)
    return json.loads(pinned) if pinned else dict(obj.get("spec") or {})


def benchmark_of(body: kopf.Body, spec: dict[str, Any]) -> Benchmark:
    """Validate (raises SpecError naming the fields) and bundle what plan and render need."""
    return Benchmark(name=body.metadata.name, namespace=body.metadata.namespace or "default",
                     uid=body.metadata.uid, spec=validate_spec(spec))


def reject(body: kopf.Body, patch: kopf.Patch, error: SpecError) -> None:
    """Invalid spec: say which fields in status and in an Event, create nothing, never retry."""
    status = rc.invalid_status(error.errors, body.metadata.get("generation"), rc.now_rfc3339())
    patch.status.update(status.dump())
    _event(body, "Warning", "InvalidSpec", status.message)
    raise kopf.PermanentError(status.message)


def start(body: kopf.Body, patch: kopf.Patch, logger: logging.Logger) -> None:
    """Validate, plan, record every run as Pending, start the first run(s)."""
    if body.status.get("phase"):
        if body.status.get("phase") in rc.FINISHED_PHASES:  # a restarted operator serves its metric again
            _export(body, BenchmarkStatus.read(dict(body.status)))
        return  # resumed or retried: a started sweep is the timer's, an Invalid one waits for a new spec
    spec = dict(body.spec)
    try:
        benchmark = benchmark_of(body, spec)
    except SpecError as error:
        reject(body, patch, error)
    runs = plan_runs(benchmark)
    now = rc.now_rfc3339()
    status = rc.initial_status(runs, body.metadata.get("generation"), now)
    patch.metadata.annotations[SWEEP_SPEC_ANNOTATION] = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    _event(body, "Normal", "SweepPlanned", f"{len(runs)} runs: {', '.join(r.name for r in runs)}")
    logger.info("planned %d runs for %s/%s", len(runs), benchmark.namespace, benchmark.name)
    # No job listing here: a job left by a crashed attempt answers 409 and is adopted as ours.
    new_runs = _start_runs(body, benchmark, runs, status.runs, {}, now)
    if new_runs != status.runs:
        metrics.observe_first_job(body.metadata.get("creationTimestamp"))
    summary = rc.summarize(status, new_runs, now, benchmark.spec)
    _export(body, summary)
    _post_transitions(body, status.runs, new_runs, summary, rc.PENDING)
    patch.status.update({**status.dump(), **summary.dump()})


def step(body: kopf.Body, patch: kopf.Patch, logger: logging.Logger) -> None:
    """Follow the jobs: record finished runs, start the next ones, finish the sweep."""
    fresh = kube.get_benchmark(body.metadata.namespace or "default", body.metadata.name)
    if fresh is None or (fresh.get("status") or {}).get("phase") != rc.RUNNING:
        return  # deleted, or finished by a step whose patch this timer's body had not seen yet
    stored = fresh["status"]
    status = BenchmarkStatus.read(stored)
    benchmark = benchmark_of(body, sweep_spec(fresh))
    runs = plan_runs(benchmark)
    by_name = {run.name: run for run in runs}
    old_runs = list(status.runs or [])
    try:
        jobs = kube.list_jobs(benchmark.namespace, benchmark.name, {r.job_kind for r in runs})
    except kube.JobKindMissing as exc:
        raise kopf.TemporaryError(str(exc), delay=MISSING_KIND_RETRY_SECONDS) from None
    seen = rc.observe(old_runs, jobs)
    now = rc.now_rfc3339()
    entries: dict[str, RunStatus] = {entry.name: entry for entry in old_runs}
    for name in seen.started:
        entries[name] = rc.mark_running(entries[name], now)
    for finished in seen.finished:
        run, entry = by_name[finished.name], entries[finished.name]
        pod = kube.result_pod(benchmark.namespace, run.job_kind, entry.job_name)
        message = kube.termination_message(pod, container=_container(run))
        if not finished.job_succeeded and finished.name in seen.unexplained:
            why = kube.termination_reason(pod) or finished.job_message or "job failed"
            finished = rc.Finished(finished.name, False, why)
        entries[finished.name] = rc.finish_entry(run, entry, finished, message, now)
    for name in seen.vanished:
        entries[name] = rc.vanished_entry(by_name[name], entries[name], now)
    current = [entries[entry.name] for entry in old_runs]
    current = _start_runs(body, benchmark, runs, current, jobs, now)
    summary = rc.summarize(status, current, now, benchmark.spec)
    _export(body, summary)
    generation, observed = fresh["metadata"].get("generation") or 0, status.observed_generation or 0
    if generation > observed:  # written here, not by the update handler: one writer while Running
        ignored = rc.spec_ignored_condition(generation, observed, now)
        summary.conditions = rc.set_condition(summary.conditions or [], ignored)
    _post_transitions(body, old_runs, current, summary, status.phase)
    changed = {key: value for key, value in summary.dump().items() if stored.get(key) != value}
    if changed:  # an idle tick writes nothing (100 sweeps polling would otherwise patch every tick)
        patch.status.update(changed)
    logger.debug("step: %s", summary.message)


def spec_changed(body: kopf.Body, patch: kopf.Patch, logger: logging.Logger) -> None:
    """A started sweep keeps the spec it started with; an Invalid one starts over with the new spec."""
    if body.status.get("phase") in (None, rc.INVALID):
        patch.status.update({"runs": [], "phase": rc.PENDING})
        start(_without_status(body), patch, logger)
        return
    condition = rc.spec_ignored_condition(body.metadata.get("generation") or 0,
                                          body.status.get("observedGeneration"), rc.now_rfc3339())
    if body.status.get("phase") != rc.RUNNING:  # while Running, the timer writes the condition
        conditions = BenchmarkStatus.read({"conditions": body.status.get("conditions") or []}).conditions
        patch.status["conditions"] = [c.dump() for c in rc.set_condition(conditions or [], condition)]
    _event(body, "Warning", "SpecChangeIgnored", condition.message)


def _event(body: kopf.Body, type_: str, reason: str, message: str) -> None:
    # kopf.event, not kopf.info/warn: those obey settings.posting.level, which is for kopf's own logs
    kopf.event(body, type=type_, reason=reason, message=message)


def _without_status(body: kopf.Body) -> kopf.Body:
    raw = {k: v for k, v in dict(body).items() if k != "status"}
    return kopf.Body(raw)


def _export(body: kopf.Body, status: BenchmarkStatus) -> None:
    """The recommendations as the operator's info metric (for Grafana's table), once the sweep is done."""
    if status.phase in rc.FINISHED_PHASES:
        metrics.export_recommendations(body.metadata.namespace or "", body.metadata.name, status.analysis)


def _container(run: Run) -> str:
    return PYTORCH_CONTAINER if run.job_kind == "PyTorchJob" else LAUNCHER_CONTAINER


def _start_runs(body: kopf.Body, benchmark: Benchmark, runs: list[Run], entries: list[RunStatus],
                jobs: dict[str, dict], now: str) -> list[RunStatus]:
    """Create the jobs of the runs that may start now (409 = it exists: ours, from before a restart)."""
    by_name = {run.name: run for run in runs}
    chosen = set(rc.runs_to_start(entries, jobs, benchmark.spec.concurrency))
    result = []
    for entry in entries:
        if entry.name in chosen:
            job = render_job(benchmark, by_name[entry.name])
            kopf.adopt(job, owner=body, strict=True)  # render labels it; ownership is the operator's
            try:
                created = kube.create_job(job)
            except kube.JobKindMissing as exc:  # wait for it, without sleeping in the handler
                raise kopf.TemporaryError(str(exc), delay=MISSING_KIND_RETRY_SECONDS) from None
            if created:
                metrics.RUNS_STARTED.labels(benchmark.namespace).inc()
            entry = rc.mark_running(entry, now)
        result.append(entry)
    return result


def _post_transitions(body: kopf.Body, old_runs: list[RunStatus], new_runs: list[RunStatus],
                      summary: BenchmarkStatus, phase_before: str | None) -> None:
    namespace = body.metadata.namespace or "default"
    for entry, _before in rc.transitions(old_runs, new_runs):
        if entry.phase == rc.RUNNING:
            _event(body, "Normal", "RunStarted", f"{entry.name}: job {entry.job_name} created")
        elif entry.phase == rc.SUCCEEDED:
            metrics.RUNS_SUCCEEDED.labels(namespace).inc()
            tps = entry.results.tokens_per_second if entry.results else None
            _event(body, "Normal", "RunSucceeded", f"{entry.name}: {tps} tokens/s")
        elif entry.phase == rc.FAILED:
            metrics.RUNS_FAILED.labels(namespace).inc()
            _event(body, "Warning", "RunFailed", f"{entry.name}: {entry.reason}")
    if summary.phase != rc.RUNNING and phase_before == rc.RUNNING:
        best = summary.best
        text = (f"{summary.message}; best: {best.run if best else None} "
                f"({best.tokens_per_second if best else None} tokens/s)")
        kind = "Normal" if summary.phase == rc.SUCCEEDED else "Warning"
        _event(body, kind, f"Sweep{summary.phase}", text)
