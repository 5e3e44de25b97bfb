"""kopf handlers for GPT2Benchmarks: thin, each hands over to `sweep` (wiring) and `reconcile` (decisions).

- startup: all settings in one place;
- create/resume: validate → plan → status.runs (all Pending) → start the first run(s);
- timer: follow the jobs, record results, start the next runs, finish the sweep;
- update of spec: a started sweep keeps its spec (warning Event + condition); an Invalid one restarts.
Jobs are deleted with their GPT2Benchmark through ownerReferences (kopf.adopt); kopf's finalizer only
lets the timer stop cleanly.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import kopf

from gpt2bench.spec import API_GROUP, API_VERSION, PLURAL

from . import kube, metrics, sweep
from . import reconcile as rc

# How often a running sweep looks at its jobs. Read at import: kopf fixes timer intervals then.
POLL_SECONDS = float(os.environ.get("GPT2BENCH_OPERATOR_POLL_SECONDS", "10"))
RESOURCE = (API_GROUP, API_VERSION, PLURAL)


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
    kube.configure(pool_size=workers)
    port = os.environ.get("GPT2BENCH_OPERATOR_METRICS_PORT", "")
    if port and port != "0":
        logger.info("metrics on :%d/metrics", metrics.serve(int(port)))
    logger.info("gpt2bench operator: poll every %.1f s", POLL_SECONDS)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    # The service account in a pod, else $KUBECONFIG read now (the `kubernetes` client reads it at import).
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.cleanup()
def stop_metrics(**_: Any) -> None:
    metrics.stop()


@kopf.on.resume(*RESOURCE)
@kopf.on.create(*RESOURCE, retries=10, backoff=5)
def start_sweep(body: kopf.Body, patch: kopf.Patch, logger: logging.Logger, **_: Any) -> None:
    with metrics.counting_errors(body.metadata.namespace):
        sweep.start(body, patch, logger)


# initial_delay: the create handler has just started the first run; nothing to look at before a tick.
@kopf.timer(*RESOURCE, interval=POLL_SECONDS, initial_delay=POLL_SECONDS, when=_running, retries=20,
            backoff=POLL_SECONDS)
def follow_jobs(body: kopf.Body, patch: kopf.Patch, logger: logging.Logger, **_: Any) -> None:
    with metrics.counting_errors(body.metadata.namespace):
        sweep.step(body, patch, logger)


@kopf.on.event(*RESOURCE)
def forget_deleted(type: str, body: kopf.Body, **_: Any) -> None:  # `type`: kopf's name for the event type
    if type == "DELETED":  # its recommendation series go with it
        metrics.export_recommendations(body.metadata.namespace or "", body.metadata.name, None)


@kopf.on.update(*RESOURCE, field="spec")
def spec_changed(body: kopf.Body, patch: kopf.Patch, logger: logging.Logger, **_: Any) -> None:
    with metrics.counting_errors(body.metadata.namespace):
        sweep.spec_changed(body, patch, logger)
