"""kopf handlers for GPT2Benchmarks and their jobs: thin, each hands over to `sweep` (wiring) and
`reconcile` (decisions).

- startup: all settings in one place;
- create/resume: validate → plan → status.runs (all Pending) → start the first run(s);
- job events: a job of ours (PyTorchJob, MPIJob or TrainJob) changed (finished, suspended, deleted...) → move its sweep on at
  once, so the next run starts within a second of the previous one ending;
- timer: the same step every --poll-interval seconds, as a safety net (an operator restart, a lost event);
- update of spec: a started sweep keeps its spec (warning Event + condition); an Invalid one restarts.
Jobs are deleted with their GPT2Benchmark through ownerReferences (kopf.adopt); kopf's finalizer only
lets the timer stop cleanly.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import kopf

from gpt2bench.protocol import MANAGED_BY, MANAGED_BY_LABEL
from gpt2bench.spec.model import API_GROUP, API_VERSION, PLURAL

from . import kube, metrics, sweep
from . import reconcile as rc
from .jobkinds import JOB_KINDS

# How often a running sweep is looked at without a job event. Read at import: kopf fixes timer intervals then.
POLL_SECONDS = float(os.environ.get("GPT2BENCH_OPERATOR_POLL_SECONDS", "30"))
RESOURCE = (API_GROUP, API_VERSION, PLURAL)
START_RETRIES = 10


def _running(status: kopf.Status, **_: Any) -> bool:
    return status.get("phase") == rc.RUNNING


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, logger: logging.Logger, **_: Any) -> None:
    settings.persistence.finalizer = f"{API_GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=API_GROUP, key="last-handled-configuration"
    )
    settings.posting.loggers = True  # log lines about an object become its Events ...
    settings.posting.level = logging.WARNING  # ... warnings and errors only (handler failures, retries)
    settings.posting.reporting_component = "gpt2bench-operator"
    settings.posting.event_name_prefix = "gpt2bench-"
    workers = int(os.environ.get("GPT2BENCH_OPERATOR_WORKERS", "16"))
    settings.execution.max_workers = workers
    settings.execution.default_backoff = 5
    settings.networking.request_timeout = 60
    # A deleted benchmark keeps kopf's finalizer until its timer has stopped; a poll still running then is
    # re-checked every this-many seconds (kopf's default, 60, held `kubectl delete` that long).
    settings.background.cancellation_polling = 1
    kube.configure(pool_size=workers)
    port = os.environ.get("GPT2BENCH_OPERATOR_METRICS_PORT", "")
    if port and port != "0":
        logger.info("metrics on :%d/metrics", metrics.serve(int(port)))
    logger.info("gpt2bench operator: jobs watched; safety-net poll every %.1f s", POLL_SECONDS)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    # The service account in a pod, else $KUBECONFIG read now (the `kubernetes` client reads it at import).
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.cleanup()
def stop_metrics(**_: Any) -> None:
    metrics.stop()


@kopf.on.resume(*RESOURCE, retries=START_RETRIES, backoff=5)
@kopf.on.create(*RESOURCE, retries=START_RETRIES, backoff=5)
def start_sweep(body: kopf.Body, patch: kopf.Patch, logger: logging.Logger, retry: int, **_: Any) -> None:
    with metrics.counting_errors(body.metadata.namespace):
        sweep.start(body, patch, logger, last_try=retry + 1 >= START_RETRIES)


# initial_delay: the create handler has just started the first run; job events do the rest.
@kopf.timer(*RESOURCE, interval=POLL_SECONDS, initial_delay=POLL_SECONDS, when=_running, retries=20,
            backoff=POLL_SECONDS)
def follow_jobs(body: kopf.Body, logger: logging.Logger, **_: Any) -> None:
    with metrics.counting_errors(body.metadata.namespace):
        sweep.follow(body.metadata.namespace or "default", body.metadata.name, logger)


def _job_event_matters(type: str | None, body: kopf.Body, **_: Any) -> bool:
    return rc.job_event_matters(type, body)


def job_changed(body: kopf.Body, logger: logging.Logger, **_: Any) -> None:
    owner = sweep.owner_of(body)
    if owner is not None:
        with metrics.counting_errors(body.metadata.namespace):
            sweep.follow(body.metadata.namespace or "default", owner["name"], logger, owner_uid=owner.get("uid"))


# Every job kind the operator creates, watched alike (a kind whose CRD is missing is served once it appears).
for _kind in JOB_KINDS.values():
    kopf.on.event(*_kind.resource, labels={MANAGED_BY_LABEL: MANAGED_BY}, when=_job_event_matters)(job_changed)


@kopf.on.update(*RESOURCE, field="spec")
def spec_changed(body: kopf.Body, patch: kopf.Patch, logger: logging.Logger, **_: Any) -> None:
    with metrics.counting_errors(body.metadata.namespace):
        sweep.spec_changed(body, patch, logger)


@kopf.on.event(*RESOURCE)
def forget_deleted(type: str | None, body: kopf.Body, **_: Any) -> None:
    if type == "DELETED":  # its lock and its recommendation series go with it
        sweep.forget(body.metadata.namespace or "default", body.metadata.name)
        metrics.export_recommendations(body.metadata.namespace or "", body.metadata.name, None)
