"""The safety net: every --poll-interval seconds, each benchmark that is Pending (a start to try again) or Running
(a sweep to follow) is advanced, whatever events were lost.

One task for the operator, fed by a kopf index of those benchmarks, not a kopf timer per benchmark: kopf holds a
finalizer on every object with a timer (to stop it cleanly), so a benchmark could not be deleted while no
operator ran (`operator.replicas: 0`, a crash loop, after `helm uninstall`): `kubectl delete` hung, its jobs kept
their GPUs, its namespace stayed Terminating. The index keeps no finalizer; the benchmark's children are owned by
it, so the API server's garbage collector deletes them with it (docs/operator.md, "Restart, spec changes,
deletion").

Each benchmark's advance runs in kopf's thread pool, one at a time per benchmark (a poll still running is not
started again); an error is logged against the benchmark (a Warning Event, as kopf's handler errors are),
counted, and tried again at the next poll, or after the API server's Retry-After.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import time
from collections.abc import Callable
from typing import Any

import kopf

from . import apiclient, metrics

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)


def reference(body: kopf.Body) -> dict[str, Any]:
    """What the poll keeps of a benchmark: enough to name it in logs and Events (kopf.ObjectLogger)."""
    metadata = body.get("metadata") or {}
    return {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
            "metadata": {"name": metadata.get("name"), "namespace": metadata.get("namespace"),
                         "uid": metadata.get("uid")}}


class Poll:
    """`run()`: every `interval` s, `advance(namespace, name, logger)` for each benchmark in `index` (kopf's
    Index: (namespace, name) -> the benchmark's `reference`)."""

    def __init__(self, index: Any, interval: float, advance: Callable[[str, str, Any], None],
                 settings: kopf.OperatorSettings):
        self.index, self.interval, self.advance, self.settings = index, interval, advance, settings
        self.busy: dict[Key, concurrent.futures.Future | asyncio.Future] = {}
        self.not_before: dict[Key, float] = {}  # the API server's Retry-After
        self.context: contextvars.Context | None = None

    def keep_context(self) -> None:
        """Called from a kopf handler of a benchmark: keep its context (kopf's queue of Events lives there, set
        for each object's handlers; it is one queue for the operator), which every poll then runs in, so that
        what the poll posts (kopf.event) is posted as the handlers' Events are."""
        if self.context is None:
            self.context = contextvars.copy_context()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.interval)
            now = time.monotonic()
            keys = list(self.index)
            for key in [k for k in self.busy if k not in keys]:
                self.busy.pop(key, None)  # finished or deleted: forgotten once its poll is done
            if self.context is None:
                continue  # no handler has run yet: nothing indexed either
            for key in keys:
                if (key in self.busy and not self.busy[key].done()) or self.not_before.get(key, 0.0) > now:
                    continue
                refs = list(self.index.get(key, []))
                if not refs:
                    continue
                self.busy[key] = loop.run_in_executor(self.settings.execution.executor, self.context.copy().run,
                                                      self.poll_one, key, refs[0])

    def poll_one(self, key: Key, ref: dict[str, Any]) -> None:
        namespace, name = key
        logger = kopf.ObjectLogger(body=kopf.Body(ref), settings=self.settings)
        try:
            with metrics.counting_errors(namespace):
                self.advance(namespace, name, logger)
        except Exception as exc:  # tried again at the next poll (kopf's timer retried likewise)
            wait = apiclient.retry_after_of(exc) or 0.0
            self.not_before[key] = time.monotonic() + wait
            logger.warning("poll failed, tried again in %g s: %s: %s", max(wait, self.interval),
                           type(exc).__name__, exc)
        else:
            self.not_before.pop(key, None)
