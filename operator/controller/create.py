"""Acting on a step's decisions: the jobs of the runs to start are created (with their NetworkPolicy, and a
TrainJob with resource claims after its benchmark's own TrainingRuntime), a run held by a refused creation is
tried again, stray jobs deleted, finished runs' per-step records kept in a ConfigMap. Idempotent: a job that
exists already is adopted, not created twice."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from gpt2bench import collect
from gpt2bench import jobkinds as kinds
from gpt2bench.conventions import (
    BENCHMARK_LABEL,
    COMPONENT_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    MAX_STEPS_LINE,
    RUN_LABEL,
    STEPS_COMPONENT,
    STEPS_CONFIGMAP_KEY,
    STEPS_CONFIGMAP_SUFFIX,
)
from gpt2bench.diagnosis import holds
from gpt2bench.plan import Run
from gpt2bench.render import label_value, render_run
from gpt2bench.specification.model import API_GROUP, KIND, Benchmark
from gpt2bench.status import PENDING, RunStatus

from . import decide, kube, metrics, pods

# The per-step records of a run: the GPT2BENCH_STEPS line near the end of the result pod's log.
STEPS_LOG_LINES = 200


STEPS_LOG_BYTES = 4 * MAX_STEPS_LINE + 200 * 400


def owner_of(job: dict[str, Any]) -> dict[str, Any] | None:
    """The GPT2Benchmark controlling a job (its ownerReference), if any."""
    for ref in (job.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == KIND and str(ref.get("apiVersion", "")).startswith(
                f"{API_GROUP}/"):
            return ref
    return None


def start_runs(owner: dict[str, Any], benchmark: Benchmark, runs: list[Run], entries: list[RunStatus],
               jobs: dict[str, dict], now: str, logger: logging.Logger) -> list[RunStatus]:
    """Create the jobs of the runs that may start now. A job the cluster refuses (or cannot serve, or whose
    name another owner holds) fails its run at once, and the next run takes its place in the same step; a
    transient error leaves the run Pending for the next step. Nothing is created for a benchmark deleted
    since the step read it (its jobs vanish with it: a step that reads them gone would start the next run)."""
    by_name = {run.name: run for run in runs}
    current = {entry.name: entry for entry in entries}
    present = dict(jobs)  # jobs, plus the ones created here: they hold their concurrency slots
    tried: set[str] = set()
    while chosen := to_start(current, present, benchmark.spec.concurrency, tried):
        if not tried and deleted_since(owner):
            return entries
        for name in chosen:
            tried.add(name)
            run, entry = by_name[name], current[name]
            *before, job = render_run(benchmark, run)
            try:
                outcome = create_run(owner, benchmark, before, job)
            except Exception as exc:
                if not kube.transient(exc):
                    raise
                metrics.RECONCILE_ERRORS.labels(benchmark.namespace).inc()
                logger.warning("creating %s %s failed, retrying at the next step: %s", run.job_kind, name, exc)
                continue
            if isinstance(outcome, kube.Refused) and (holds.held(entry) or holds.refusal_cause(outcome.reason)):
                if not holds.held(entry):  # one cause: the runs it would refuse too wait with this one
                    cause = holds.refusal_cause(outcome.reason)
                    current = entries_by_name(holds.hold(list(current.values()), cause, name, RETRY_WORDS))
                continue
            if isinstance(outcome, kube.Refused):
                current[name] = decide.failed_entry(run, entry, outcome.reason, now)
                if outcome.kind_missing:  # every run of that kind would meet the same answer
                    for other, pending in current.items():
                        if pending.job_kind == run.job_kind and pending.phase == PENDING:
                            current[other] = decide.failed_entry(by_name[other], pending, outcome.reason, now)
                continue
            if outcome.new:
                metrics.RUNS_STARTED.labels(benchmark.namespace).inc()
            present[entry.job_name] = job
            if holds.held(entry):  # created again: the runs held by the same refusal go on
                current = entries_by_name(holds.release(list(current.values()), reason=entry.reason))
                entry = current[name]
            current[name] = decide.mark_running(entry, now)
    return [current[entry.name] for entry in entries]


# How a run held by a refused creation goes on (gpt2bench.diagnosis.holds: FORBIDDEN)
RETRY_WORDS = "its creation is tried again at every step; the others wait until it works"


def entries_by_name(entries: list[RunStatus]) -> dict[str, RunStatus]:
    return {entry.name: entry for entry in entries}


def to_start(current: dict[str, RunStatus], present: dict[str, dict], concurrency: int, tried: set[str]) -> list[str]:
    """The runs to create now: those that may start (plan order, concurrency), else, with a slot free, the first
    run held by a refused creation, to try it again."""
    chosen = [name for name in decide.runs_to_start(list(current.values()), present, concurrency) if name not in tried]
    retry = holds.retry_candidate(current.values())
    if chosen or retry is None or retry.name in tried:
        return chosen
    again = holds.release(list(current.values()), reason=retry.reason)
    return [retry.name] if retry.name in decide.runs_to_start(again, present, concurrency) else []


def deleted_since(owner: dict[str, Any]) -> bool:
    """Whether the benchmark read at the step's start is gone or being deleted now (one read, just before the
    first job a step creates; a real API server's garbage collector would delete a job created in the
    remaining moment, its owner being gone)."""
    metadata = owner["metadata"]
    now = kube.get_benchmark(metadata.get("namespace") or "default", metadata["name"])
    return now is None or bool(now["metadata"].get("deletionTimestamp")) or now["metadata"].get("uid") != metadata.get("uid")


# What render_run puts before a run's job, and how each is created (idempotent, refusing another owner's namesake).
CREATE_BEFORE_JOB = {"NetworkPolicy": kube.create_network_policy, "TrainingRuntime": kube.create_training_runtime}


def create_run(owner: dict[str, Any], benchmark: Benchmark, before: list[dict[str, Any]],
               job: dict[str, Any]) -> kube.Created | kube.Refused:
    """A run's NetworkPolicy (when the spec has one) and its own TrainingRuntime (a TrainJob with resource
    claims), then its job, all owned by the benchmark (the API server's garbage collector deletes them with it):
    the job's pods never run without their policy, and a TrainJob never names a runtime that is not there."""
    for child in (*before, job):
        kopf.adopt(child, owner=owner, strict=True)  # render labels them; ownership is the operator's
    for child in before:
        outcome = CREATE_BEFORE_JOB[child["kind"]](child, benchmark.uid)
        if isinstance(outcome, kube.Refused):
            return outcome
    return kube.create_job(job, benchmark.uid)


def keep_steps(owner: dict[str, Any], run: Run, job: dict[str, Any], pod: dict[str, Any],
               logger: logging.Logger) -> None:
    """The run's per-step records, from its result pod's log into a ConfigMap owned by the benchmark:
    the cluster report draws its curves after the pods are gone. Best effort: never fails the run."""
    metadata = pod.get("metadata") or {}
    try:
        log = pods.pod_log_tail(metadata.get("namespace") or owner["metadata"]["namespace"], metadata["name"],
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
