"""What the handlers do, between kopf and the pure decisions: read jobs and pods, create jobs, write status.

`reconcile` decides; `kube` talks to the API; this module wires one to the other and posts Events.
Everything here is idempotent: kopf may run a step again after a crash or a retry.

Two handlers advance a sweep: kopf's create/resume handler starts it (status through kopf's patch), and
`follow` moves it on whenever one of its jobs changes (a watch event) or the safety-net timer ticks. Both
take the benchmark's lock, and `follow` reads the benchmark fresh and writes its status itself, so a job
event and a timer tick never decide on the same state twice.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any

import kopf

from gpt2bench import collect
from gpt2bench import jobkinds as kinds
from gpt2bench.plan import Run, plan_runs
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
from gpt2bench.status import BenchmarkStatus, RunStatus

from . import kube, metrics, pods
from . import reconcile as rc

# The spec a sweep started with: later spec edits do not change a running sweep (docs/operator.md).
SWEEP_SPEC_ANNOTATION = f"{API_GROUP}/sweep-spec"
# The per-step records of a run: the GPT2BENCH_STEPS line near the end of the result pod's log.
STEPS_LOG_LINES = 200
STEPS_LOG_BYTES = 4 * MAX_STEPS_LINE + 200 * 400

_locks: dict[tuple[str, str], threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock(namespace: str, name: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault((namespace, name), threading.Lock())


def forget(namespace: str, name: str) -> None:
    """A deleted benchmark's lock goes with it."""
    with _locks_guard:
        _locks.pop((namespace, name), None)


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


def reject(body: kopf.Body, patch: kopf.Patch, error: SpecError) -> None:
    """Invalid spec: say which fields in status and in an Event, create nothing, never retry."""
    status = rc.invalid_status(error.errors, body.metadata.get("generation"), rc.now_rfc3339())
    patch.status.update(status.dump())
    _event(body, "Warning", "InvalidSpec", status.message)
    raise kopf.PermanentError(status.message)


def start(body: kopf.Body, patch: kopf.Patch, logger: logging.Logger, last_try: bool = False) -> None:
    """Validate, plan, record every run as Pending, start the first run(s). On the last try, an unexpected
    error still leaves a phase: Failed, with the error as the message."""
    if body.status.get("phase"):
        if body.status.get("phase") in rc.FINISHED_PHASES:  # a restarted operator serves its metric again
            _export(body, BenchmarkStatus.read(dict(body.status)))
        return  # resumed or retried: a started sweep is follow's, an Invalid one waits for a new spec
    try:
        _start(body, patch, logger)
    except (kopf.PermanentError, kopf.TemporaryError):
        raise
    except Exception as exc:
        if not last_try:
            raise
        status = rc.failed_to_start_status(f"{type(exc).__name__}: {exc}", body.metadata.get("generation"),
                                           rc.now_rfc3339())
        patch.status.update(status.dump())
        _event(body, "Warning", "SweepFailed", status.message)
        raise kopf.PermanentError(status.message) from exc


def _start(body: kopf.Body, patch: kopf.Patch, logger: logging.Logger) -> None:
    spec = with_default_images(dict(body.spec))
    try:
        benchmark = benchmark_of(body, spec)
    except SpecError as error:
        reject(body, patch, error)
    spec = with_resolved_backend(spec)  # after validation: an invalid spec asks the API nothing
    benchmark = benchmark_of(body, spec)
    runs = plan_runs(benchmark)
    now = rc.now_rfc3339()
    status = rc.initial_status(runs, body.metadata.get("generation"), now)
    patch.metadata.annotations[SWEEP_SPEC_ANNOTATION] = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    _event(body, "Normal", "SweepPlanned", f"{len(runs)} runs as {status.backend} jobs: {', '.join(r.name for r in runs)}")
    logger.info("planned %d runs for %s/%s", len(runs), benchmark.namespace, benchmark.name)
    with _lock(benchmark.namespace, benchmark.name):
        # No job listing here: a job left by a crashed attempt answers 409 and is adopted when it is ours.
        new_runs = _start_runs(body, benchmark, runs, status.runs, {}, now, logger)
    if any(r.phase == rc.RUNNING for r in new_runs):  # a job was created (not only refused)
        metrics.observe_first_job(body.metadata.get("creationTimestamp"))
    summary = rc.summarize(status, new_runs, now, benchmark.spec)
    _export(body, summary)
    _post_transitions(body, status.runs, new_runs, summary, rc.PENDING)
    patch.status.update({**status.dump(), **summary.dump()})


def follow(namespace: str, name: str, logger: logging.Logger, owner_uid: str | None = None) -> None:
    """Move a running sweep on: record finished runs, start the next ones, finish the sweep."""
    with _lock(namespace, name):
        fresh = kube.get_benchmark(namespace, name)
        if fresh is None or (fresh.get("status") or {}).get("phase") != rc.RUNNING:
            return  # deleted, not started yet, or already finished
        if owner_uid is not None and fresh["metadata"].get("uid") != owner_uid:
            return  # the job belongs to a deleted namesake
        finished = _step(fresh, logger)
    for run, job, pod in finished:  # the curves: after the status, off the path to the next run
        _keep_steps(fresh, run, job, pod, logger)


def _step(fresh: dict[str, Any], logger: logging.Logger) -> list[tuple[Run, dict, dict]]:
    stored = fresh["status"]
    status = BenchmarkStatus.read(stored)
    benchmark = benchmark_of(fresh, sweep_spec(fresh))
    runs = plan_runs(benchmark)
    by_name = {run.name: run for run in runs}
    old_runs = list(status.runs or [])
    listed, missing = kube.list_jobs(benchmark.namespace, benchmark.name, {r.job_kind for r in runs})
    jobs = rc.owned_jobs(listed, benchmark.uid)
    now = rc.now_rfc3339()
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
        entries[finished.name] = rc.finish_entry(run, entry, finished, message, now, cause)
        if pod:
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
    current = _start_runs(fresh, benchmark, runs, current, jobs, now, logger)
    summary = rc.summarize(status, current, now, benchmark.spec)
    _export(fresh, summary)
    generation, observed = fresh["metadata"].get("generation") or 0, status.observed_generation or 0
    if generation > observed:  # written here, not by the update handler: one writer while Running
        ignored = rc.spec_ignored_condition(generation, observed, now)
        summary.conditions = rc.set_condition(summary.conditions or [], ignored)
    changed = {key: value for key, value in summary.dump().items() if stored.get(key) != value}
    if changed:  # an idle step writes nothing (100 sweeps polling would otherwise patch every tick)
        kube.patch_status(benchmark.namespace, benchmark.name, changed)
    _post_transitions(fresh, old_runs, current, summary, status.phase)
    logger.debug("step: %s", summary.message)
    return collected


def spec_changed(body: kopf.Body, patch: kopf.Patch, logger: logging.Logger) -> None:
    """A started sweep keeps the spec it started with; an Invalid one starts over with the new spec."""
    if body.status.get("phase") in (None, rc.INVALID):
        patch.status.update({"runs": [], "phase": rc.PENDING})
        _start(_without_status(body), patch, logger)
        return
    condition = rc.spec_ignored_condition(body.metadata.get("generation") or 0,
                                          body.status.get("observedGeneration"), rc.now_rfc3339())
    if body.status.get("phase") != rc.RUNNING:  # while Running, follow writes the condition
        conditions = BenchmarkStatus.read({"conditions": body.status.get("conditions") or []}).conditions
        patch.status["conditions"] = [c.dump() for c in rc.set_condition(conditions or [], condition)]
    _event(body, "Warning", "SpecChangeIgnored", condition.message)


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


def _without_status(body: kopf.Body) -> kopf.Body:
    raw = {k: v for k, v in dict(body).items() if k != "status"}
    return kopf.Body(raw)


def _export(obj: dict[str, Any], status: BenchmarkStatus) -> None:
    """The recommendations as the operator's info metric (for Grafana's table), once the sweep is done."""
    if status.phase in rc.FINISHED_PHASES:
        metadata = obj["metadata"]
        metrics.export_recommendations(metadata.get("namespace") or "", metadata["name"], status.analysis)


def _start_runs(owner: dict[str, Any], benchmark: Benchmark, runs: list[Run], entries: list[RunStatus],
                jobs: dict[str, dict], now: str, logger: logging.Logger) -> list[RunStatus]:
    """Create the jobs of the runs that may start now. A job the cluster refuses (or cannot serve, or whose
    name another owner holds) fails its run at once, and the next run takes its place in the same step; a
    transient error leaves the run Pending for the next step."""
    by_name = {run.name: run for run in runs}
    current = {entry.name: entry for entry in entries}
    present = dict(jobs)  # jobs, plus the ones created here: they hold their concurrency slots
    tried: set[str] = set()
    while chosen := [n for n in rc.runs_to_start(list(current.values()), present, benchmark.spec.concurrency)
                     if n not in tried]:
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
            current[name] = rc.mark_running(entry, now)
    return [current[entry.name] for entry in entries]


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
        if entry.phase == rc.RUNNING and before == rc.QUEUED:
            _event(body, "Normal", "RunAdmitted", f"{entry.name}: job {entry.job_name} resumed")
        elif entry.phase == rc.RUNNING:
            _event(body, "Normal", "RunStarted", f"{entry.name}: job {entry.job_name} created")
        elif entry.phase == rc.QUEUED:
            _event(body, "Normal", "RunQueued", f"{entry.name}: job {entry.job_name} is suspended, waiting for "
                                                f"its queue")
        elif entry.phase == rc.SUCCEEDED:
            metrics.RUNS_SUCCEEDED.labels(namespace).inc()
            tps = entry.results.tokens_per_second if entry.results else None
            _event(body, "Normal", "RunSucceeded", f"{entry.name}: {tps} tokens/s")
        elif entry.phase == rc.FAILED:
            metrics.RUNS_FAILED.labels(namespace).inc()
            if len(failures[entry.reason or ""]) < GROUPED_EVENTS_FROM:
                _event(body, "Warning", "RunFailed", f"{entry.name}: {entry.reason}")
        elif entry.phase == rc.SKIPPED:  # the trainer chose not to train (e.g. emulated bf16): not a failure
            _event(body, "Normal", "RunSkipped", f"{entry.name}: {entry.reason}")
    if summary.phase != rc.RUNNING and phase_before in (rc.RUNNING, rc.PENDING):
        best = summary.best
        text = (f"{summary.message}; best: {best.run if best else None} "
                f"({best.tokens_per_second if best else None} tokens/s)")
        kind = "Normal" if summary.phase == rc.SUCCEEDED else "Warning"
        _event(body, kind, f"Sweep{summary.phase}", text)
