"""kopf handlers for GPT2Benchmarks and their jobs: thin, each hands over to `sweep` (wiring) and
`decide` (decisions); what the operator keeps between them is in kopf's memo (`state.OperatorState`).

- startup: all settings in one place (timeouts on every API request: kopf's and the client's), then
  what the cluster lacks for the runs, in the log (`prerequisites`);
- probe: /healthz fails when something has been in flight longer than it can take (`liveness`);
- create/resume, job events, the poll (`poll.py`: a sweep not yet started or Running, every --poll-interval
  seconds: a restart, a lost event, a start that met an error), spec edits: each one `sweep.advance`s the
  benchmark from whatever state it is in (docs/operator.md, "States and transitions"). A started sweep keeps
  its spec (warning Event + condition); one that has not started (Invalid, Pending) starts with the new one.
Jobs are deleted with their GPT2Benchmark through ownerReferences (kopf.adopt). No handler needs a finalizer
(the poll is one task fed by an index, not a kopf timer per benchmark), so a benchmark is deleted at once, an
operator running or not; kopf removes the finalizer an earlier version added.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
from collections.abc import Iterator
from typing import Any

import kopf

from gpt2bench.conventions import MANAGED_BY, MANAGED_BY_LABEL
from gpt2bench.specification.model import API_GROUP, API_VERSION, PLURAL
from gpt2bench.status import PENDING, RUNNING

from . import apiclient, create, decide, kube, liveness, metrics, poll, prerequisites, recovery, sweep, watchguard
from .followedkinds import JOB_KINDS
from .state import OperatorState

# How often a running sweep is looked at without a job event, and a sweep that could not start is tried again.
# Read at import: kopf fixes timer intervals then.
POLL_SECONDS = float(os.environ.get("GPT2BENCH_OPERATOR_POLL_SECONDS", "30"))
# Each API request's read timeout (--api-timeout); connect timeouts and the liveness limits follow from it.
API_TIMEOUT = float(os.environ.get("GPT2BENCH_OPERATOR_API_TIMEOUT", str(apiclient.DEFAULT_API_TIMEOUT)))
RESOURCE = (API_GROUP, API_VERSION, PLURAL)


def _not_finished(status: kopf.Status, **_: Any) -> bool:
    """Pending (a start to try again) or Running (a sweep to follow): the states the poll looks after."""
    return status.get("phase") in (PENDING, RUNNING)


@contextlib.contextmanager
def _handling(namespace: str) -> Iterator[None]:
    """A handler's run on a benchmark of `namespace`: its errors counted, and the API server's Retry-After
    given to kopf as the retry's delay. (The liveness probe knows each round of `sweep.advance` and each API
    request, not the handler: it may go round many times while its benchmark's jobs keep changing.)"""
    with metrics.counting_errors(namespace):
        try:
            yield
        except kopf.TemporaryError:
            raise
        except Exception as exc:
            wait = apiclient.retry_after_of(exc)
            if wait:
                raise kopf.TemporaryError(f"{exc}; the API server asked to retry after {wait:g} s", delay=wait) from exc
            raise


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    settings.persistence.finalizer = f"{API_GROUP}/finalizer"  # no handler adds it: kopf removes an earlier one
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
    timeouts = apiclient.Timeouts.of(API_TIMEOUT)
    # kopf's own requests (watches aside: its inactivity timeout restarts a silent one) and its posted Events
    settings.networking.connect_timeout = settings.watching.connect_timeout = timeouts.connect
    settings.networking.request_timeout = 2 * timeouts.read
    kube.configure(pool_size=workers, timeouts=timeouts)
    watchguard.install()  # a watch's error is retried, not the end of the operator
    memo.operator = OperatorState(retry_seconds=POLL_SECONDS)  # every handler's state (state.py), one clock
    port = os.environ.get("GPT2BENCH_OPERATOR_METRICS_PORT", "")
    if port and port != "0":
        logger.info("metrics on :%d/metrics", metrics.serve(int(port)))
    logger.info("gpt2bench operator: jobs watched; safety-net poll every %.1f s; API timeout %.1f s",
                POLL_SECONDS, timeouts.read)
    prerequisites.report(logger)  # what the cluster lacks (job kinds, runtimes), before any run fails for it


@kopf.on.probe(id="progress")
async def progress(**_: Any) -> dict[str, float | int]:
    """On the event loop (not a worker thread): it answers even when every worker is stuck."""
    try:
        return liveness.check()
    except liveness.Stalled as stalled:
        raise kopf.PermanentError(str(stalled)) from None  # /healthz answers 500 (not retried)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    # The service account in a pod, else $KUBECONFIG read now (the `kubernetes` client reads it at import).
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.index(*RESOURCE, when=_not_finished)
async def unfinished(body: kopf.Body, memo: kopf.Memo, **_: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """The benchmarks the poll looks after, kept by kopf from its watch (no API call, no finalizer)."""
    state: OperatorState | None = getattr(memo, "operator", None)
    if state is not None and state.poll is not None:
        state.poll.keep_context()
    return {(body.metadata.namespace or "default", body.metadata.name): poll.reference(body)}


@kopf.on.startup()
async def start_poll(unfinished: kopf.Index, settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    state: OperatorState = memo.operator
    state.poll = poll.Poll(unfinished, POLL_SECONDS, functools.partial(sweep.advance, state), settings, state.clock)
    watchguard.WATCHES.reset()
    watchguard.WATCHES.on_relisted = state.poll.relisted  # a job event lost in a watch gap: step now
    watchguard.WATCHES.on_failing = state.poll.watch_failed
    state.poll_task = asyncio.get_running_loop().create_task(state.poll.run(), name="gpt2bench-poll")


@kopf.on.cleanup()
async def stop_poll(memo: kopf.Memo, **_: Any) -> None:
    state: OperatorState | None = getattr(memo, "operator", None)
    if state is not None and state.poll_task is not None:
        state.poll_task.cancel()


@kopf.on.cleanup()
def stop_metrics(**_: Any) -> None:
    metrics.stop()


# Retried without limit (kopf's default): a start that cannot even write why it waits must not stop trying.
@kopf.on.create(*RESOURCE)
def start_sweep(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    namespace, name = body.metadata.namespace or "default", body.metadata.name
    with _handling(namespace):
        sweep.advance(memo.operator, namespace, name, logger)


@kopf.on.resume(*RESOURCE)
def resume_sweep(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    """At the operator's start: first the Events the last one recorded in status and a crash lost, then on."""
    namespace, name = body.metadata.namespace or "default", body.metadata.name
    recovery.post_missing(memo.operator, namespace, name, logger)
    with _handling(namespace):
        sweep.advance(memo.operator, namespace, name, logger)


def _job_event_matters(type: str | None, body: kopf.Body, **_: Any) -> bool:
    return decide.job_event_matters(type, body)


def job_changed(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    owner = create.owner_of(body)
    if owner is not None:
        namespace = body.metadata.namespace or "default"
        with _handling(namespace):
            sweep.advance(memo.operator, namespace, owner["name"], logger)


# Every job kind the operator creates, watched alike (a kind whose CRD is missing is served once it appears).
for _kind in JOB_KINDS.values():
    kopf.on.event(*_kind.resource, labels={MANAGED_BY_LABEL: MANAGED_BY}, when=_job_event_matters)(job_changed)


@kopf.on.update(*RESOURCE, field="spec")
def spec_changed(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
    namespace, name = body.metadata.namespace or "default", body.metadata.name
    with _handling(namespace):
        sweep.spec_changed(memo.operator, namespace, name, logger)


@kopf.on.event(*RESOURCE)
def forget_deleted(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    if type == "DELETED":  # its turn and its recommendation series go with it
        memo.operator.forget(body.metadata.namespace or "default", body.metadata.name)
        metrics.export_recommendations(body.metadata.namespace or "", body.metadata.name, None)
