"""What a step reads, before it decides anything: the stored status with its pinned spec and plan, the jobs that
exist, what each finished job left (its result pod, the trainer's termination message, the first pod that
failed) and what each starting run's pods and their Events say. Reads only: the decisions are `decide.step`'s,
the writes `sweep`'s.
"""

from __future__ import annotations

from typing import Any

from gpt2bench import jobkinds as kinds
from gpt2bench.status import RUNNING

from . import decide, kube, pinning, pods
from .decide import Observed, Result


def observe_step(fresh: dict[str, Any], now: str, overwritten: str | None) -> Observed:
    status, benchmark, runs, renamed = pinning.read_pinned(fresh)
    entries = list(status.runs or [])
    listed, missing = kube.list_jobs(benchmark.namespace, benchmark.name, {r.job_kind for r in runs})
    owned = decide.owned_jobs(listed, benchmark.uid)
    held = {entry.job_name for entry in entries}
    jobs = {name: job for name, job in owned.items() if name in held}
    seen = decide.observe(entries, jobs)  # which runs finished or start: what there is to read of them
    job_names = {entry.name: entry.job_name for entry in entries}
    results = {finished.name: _result(jobs[job_names[finished.name]], finished, now) for finished in seen.finished}
    done, started = {f.name for f in seen.finished}, set(seen.started)
    starts = {entry.name: pods.observe_start(entry, jobs[entry.job_name]) for entry in entries
              if entry.job_name in jobs and entry.name not in done and entry.name not in seen.queued
              and (entry.name in started or entry.phase == RUNNING)}
    return Observed(
        status=status, benchmark=benchmark, runs=runs, jobs=jobs,
        strays={name: job for name, job in owned.items() if name not in held},
        missing=missing, results=results, starts=starts, renamed=renamed, overwritten=overwritten,
        resumed=decide.RESUME_ANNOTATION in (fresh["metadata"].get("annotations") or {}),
        generation=fresh["metadata"].get("generation") or 0)


def _result(job: dict[str, Any], finished: decide.Finished, now: str) -> Result:
    pod = pods.result_pod(job)
    message = pods.termination_message(pod, container=kinds.result_container(job))
    if finished.job_succeeded:
        return Result(pod, message)
    cause, why = pods.failure(job, finished.job_message, now)  # the first pod that failed, then the controller's word
    return Result(pod, message, cause, why)
