"""The spec a sweep started with, pinned in an annotation so that later edits do not change a running sweep,
and the operator version that pinned it; read back at every step (an unreadable pinned spec holds the sweep
saying why)."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from gpt2bench import __version__
from gpt2bench import jobkinds as kinds
from gpt2bench.conventions import (
    TRAINER_IMAGE_CPU_ENV,
    TRAINER_IMAGE_GPU_ENV,
)
from gpt2bench.plan import Run, plan_runs, stopped_configurations
from gpt2bench.specification.model import API_GROUP, Benchmark
from gpt2bench.specification.validation import SpecError, validate_spec
from gpt2bench.status import RUNNING, SPEC_UNREADABLE, BenchmarkStatus

from . import decide, events, kube, sweepstatus

# The spec a sweep started with: later spec edits do not change a running sweep (docs/operator.md).
SWEEP_SPEC_ANNOTATION = f"{API_GROUP}/sweep-spec"


# The operator version that pinned it: a version that cannot read a pinned spec names the one that can.
SWEEP_SPEC_VERSION_ANNOTATION = f"{API_GROUP}/sweep-spec-version"


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


def version(obj: dict[str, Any]) -> str | None:
    """The resourceVersion a write is conditional on: the benchmark as this step read (or last wrote) it."""
    return (obj.get("metadata") or {}).get("resourceVersion")


def ignore_edit(fresh: dict[str, Any], now: str) -> None:
    """A started sweep keeps the spec it started with: a Warning Event, and the condition (written by the
    step while Running, here once the sweep is finished)."""
    metadata, stored = fresh["metadata"], fresh.get("status") or {}
    condition = sweepstatus.spec_ignored_condition(metadata.get("generation") or 0, stored.get("observedGeneration"),
                                                   now)
    if stored.get("phase") != RUNNING:
        conditions = BenchmarkStatus.read({"conditions": stored.get("conditions") or []}).conditions
        kube.patch_status(metadata.get("namespace") or "default", metadata["name"],
                          {"conditions": [c.dump() for c in sweepstatus.set_condition(conditions or [], condition)]},
                          version(fresh))
    events.post(fresh, "Warning", "SpecChangeIgnored", condition.message)


def pinned(fresh: dict[str, Any]) -> tuple[BenchmarkStatus, Benchmark, list[Run]]:
    """A started sweep's status, pinned spec and plan, as this version reads them (`read_pinned`)."""
    status, benchmark, runs, _ = read_pinned(fresh)
    return status, benchmark, runs


def read_pinned(fresh: dict[str, Any]) -> tuple[BenchmarkStatus, Benchmark, list[Run], list[str]]:
    """A started sweep's status, pinned spec and plan, as this version reads them, and what another writer changed
    that the plan restores (runs renamed in status: `decide.renamed_back`); Unreadable when it cannot (a later
    version's spec field or status value, a version that plans other runs)."""
    annotations = fresh["metadata"].get("annotations") or {}
    pinned_by = annotations.get(SWEEP_SPEC_VERSION_ANNOTATION)
    try:
        status = BenchmarkStatus.read(fresh["status"])
        benchmark = benchmark_of(fresh, sweep_spec(fresh))
    except SpecError as error:
        what = "; ".join(f"{path}: {message}" for path, message in error.errors)
        raise Unreadable(sweepstatus.unreadable_reason(__version__, pinned_by, what)) from error
    except ValueError as error:  # the status (pydantic) or the annotation (JSON)
        raise Unreadable(sweepstatus.unreadable_reason(__version__, pinned_by, " ".join(str(error).split()))) from error
    # with the rounds a sweep added until decided, for the configurations that were still racing
    runs = plan_runs(benchmark, rounds=status.rounds_planned,
                     stopped=stopped_configurations(status.runs or [], status.rounds_planned or 0))
    planned, recorded = [r.name for r in runs], [r.name for r in status.runs or []]
    restored, renamed = decide.renamed_back(runs, status.runs or [])
    if renamed and pinned_by == __version__:  # this version planned them: another writer renamed them
        status = status.model_copy(update={"runs": restored})
        return status, benchmark, runs, renamed
    if planned != recorded:
        missing = sorted(set(recorded) - set(planned)) or sorted(set(planned) - set(recorded)) or recorded
        what = f"it plans other runs than the sweep's ({', '.join(missing[:3])} ...)"
        raise Unreadable(sweepstatus.unreadable_reason(__version__, pinned_by, what))
    return status, benchmark, runs, []


def hold_unreadable(fresh: dict[str, Any], reason: str, now: str, logger: logging.Logger) -> None:
    """Hold a sweep this version cannot read: the condition and one Warning Event say why and what to do;
    nothing is created or collected, and no handler error repeats it every poll."""
    metadata, stored = fresh["metadata"], fresh.get("status") or {}
    conditions = [c for c in stored.get("conditions") or [] if isinstance(c, dict)]
    held = next((c for c in conditions if c.get("type") == SPEC_UNREADABLE), None)
    if held and held.get("status") == "True" and held.get("message") == reason:
        return
    condition = sweepstatus.spec_unreadable_condition(reason, now, metadata.get("generation"))
    kube.patch_status(metadata.get("namespace") or "default", metadata["name"],
                      {"message": reason, "conditions": [c for c in conditions if c.get("type") != SPEC_UNREADABLE]
                       + [condition.dump()]}, version(fresh))
    events.post(fresh, "Warning", "SpecUnreadable", reason)
    logger.info("%s", reason)
