"""The safety net: every --poll-interval seconds, each benchmark that is Pending (a start to try again) or Running
(a sweep to follow) is advanced, whatever events were lost.

One task for the operator, fed by a kopf index of those benchmarks, not a kopf timer per benchmark: kopf holds a
finalizer on every object with a timer (to stop it cleanly), so a benchmark could not be deleted while no
operator ran (`operator.replicas: 0`, a crash loop, after `helm uninstall`): `kubectl delete` hung, its jobs kept
their GPUs, its namespace stayed Terminating. The index keeps no finalizer; the benchmark's children are owned by
it, so the API server's garbage collector deletes them with it (docs/operator.md, "Restart, spec changes,
deletion").

Each benchmark's advance runs in kopf's thread pool, one at a time per benchmark (a poll still running is not
started again); an error is counted and tried again at the next poll, or after the API server's Retry-After. The
first error of a streak (or a new one) is logged against the benchmark as a warning (a Warning Event, as kopf's
handler errors are); the same error again is not: an Event per poll said nothing new while the status stayed
stale. What the API server fails (this sweep's steps, or a watch: watchguard.py) and since when is said on the
benchmark instead, once it lasts `LASTING_SECONDS`: the condition `ApiFailing` (True, reason `RequestsFailing`
or `WatchFailing`; False, `ApiAnswering`, once it answers again).

`wake()` runs the poll at once: after a watch gap (a job event lost in it is found by the step), and when a
watch's failure has lasted long enough to be said.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import kopf

from gpt2bench.clock import SYSTEM_CLOCK, Clock
from gpt2bench.status import BenchmarkStatus

from . import apiclient, kube, metrics, sweepstatus, watchguard

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace, name)

API_FAILING = "ApiFailing"  # the condition: the API server fails this sweep's steps or a watch it needs
LASTING_SECONDS = 10.0  # a failure said on the benchmark once it has lasted this long (a blip is not)
BENCHMARK_KIND = "GPT2Benchmark"


def reference(body: kopf.Body) -> dict[str, Any]:
    """What the poll keeps of a benchmark: enough to name it in logs and Events (kopf.ObjectLogger), the job kinds
    its runs use, and whether its status says the API is failing."""
    metadata = body.get("metadata") or {}
    status = body.get("status") or {}
    said = next((c for c in status.get("conditions") or [] if isinstance(c, dict) and c.get("type") == API_FAILING),
                {})
    return {"apiVersion": body.get("apiVersion"), "kind": body.get("kind"),
            "metadata": {"name": metadata.get("name"), "namespace": metadata.get("namespace"),
                         "uid": metadata.get("uid")},
            "jobKinds": sorted({r.get("jobKind") for r in status.get("runs") or []
                                if isinstance(r, dict) and r.get("jobKind")}),
            "apiFailing": said.get("status")}


@dataclass
class Streak:
    """This benchmark's steps failing since `since` (RFC 3339; `started`: monotonic), the last error."""

    since: str
    started: float
    error: str


def api_condition(streak: Streak | None, watches: list[watchguard.Failure], interval: float, now: float,
                  job_kinds: list[str]) -> tuple[str, str, str] | None:
    """(status, reason, message) of `ApiFailing` for a benchmark, or None when nothing has failed long enough.
    The message names what fails, since when and the last error, and no count: it changes only when that does
    (the condition is not written again at every poll)."""
    if streak is not None and now - streak.started >= LASTING_SECONDS:
        return ("True", "RequestsFailing",
                f"since {streak.since} the API server fails this sweep's steps (last: {streak.error}); tried again "
                f"at every job event and every {interval:g} s")
    relevant = [f for f in watches if now - f.started >= LASTING_SECONDS
                and (f.what == BENCHMARK_KIND or not job_kinds or f.what in job_kinds)]
    if relevant:
        first = min(relevant, key=lambda f: f.started)
        kinds = ", ".join(sorted({f.what for f in relevant}))
        return ("True", "WatchFailing",
                f"since {first.since} the API server fails the operator's watch of {kinds} (last: {first.error}); "
                f"retried with a backoff of up to {watchguard.MAX_BACKOFF:g} s; job events may come late: the "
                f"operator steps this sweep every {interval:g} s meanwhile")
    return None


class Poll:
    """`run()`: every `interval` s, `advance(namespace, name, logger)` for each benchmark in `index` (kopf's
    Index: (namespace, name) -> the benchmark's `reference`)."""

    def __init__(self, index: Any, interval: float, advance: Callable[[str, str, Any], None],
                 settings: kopf.OperatorSettings, clock: Clock = SYSTEM_CLOCK):
        self.index, self.interval, self.advance, self.settings = index, interval, advance, settings
        self.clock = clock
        self.busy: dict[Key, concurrent.futures.Future | asyncio.Future] = {}
        self.not_before: dict[Key, float] = {}  # the API server's Retry-After
        self.context: contextvars.Context | None = None
        self.streaks: dict[Key, Streak] = {}  # the benchmarks whose steps fail
        self.said: dict[Key, tuple[str, str, str]] = {}  # the ApiFailing condition this operator last wrote
        self.refs: dict[Key, dict[str, Any]] = {}  # the reference of each benchmark it wrote it on
        self._wake: asyncio.Event | None = None
        self.stopped = False  # the operator stops: a poll still in a worker thread says nothing (kopf's loop is gone)

    def wake(self) -> None:
        """Poll now (on the event loop): after a watch gap, or a watch failure that now lasts."""
        if self._wake is not None:
            self._wake.set()

    def relisted(self, _key: str = "") -> None:
        """A watch listed again after a gap, or works again (on the event loop): step every sweep now, and once more
        when a failing watch that listed counts as working again (watchguard.QUICK_GAP), to say so."""
        self.wake()
        if any(f.listed_at is not None for f in watchguard.WATCHES.failing()):
            asyncio.get_running_loop().call_later(watchguard.QUICK_GAP + 0.5, self.wake)

    def watch_failed(self, _key: str = "") -> None:
        """A watch failed again: once a failure lasts, poll now, so that it is said without waiting a poll."""
        now = time.monotonic()
        if any(now - f.started >= LASTING_SECONDS for f in watchguard.WATCHES.failing()):
            self.wake()

    def keep_context(self) -> None:
        """Called from a kopf handler of a benchmark: keep its context (kopf's queue of Events lives there, set
        for each object's handlers; it is one queue for the operator), which every poll then runs in, so that
        what the poll posts (kopf.event) is posted as the handlers' Events are."""
        if self.context is None:
            self.context = contextvars.copy_context()

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            self.stopped = True

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.interval)
            except TimeoutError:
                pass
            self._wake.clear()
            now = time.monotonic()
            keys = list(self.index)
            for key in [k for k in self.busy if k not in keys]:
                self.busy.pop(key, None)  # finished or deleted: forgotten once its poll is done
            if self.context is None:
                continue  # no handler has run yet: nothing indexed either
            for key in [k for k in self.said if k not in keys]:  # finished (by a job event) or deleted
                said, ref = self.said.pop(key), self.refs.pop(key, None)
                self.streaks.pop(key, None)
                if said[0] == "True" and ref is not None:  # its last word on the API is not left saying failing
                    loop.run_in_executor(self.settings.execution.executor, self.context.copy().run, self.say, key,
                                         ref, kopf.ObjectLogger(body=kopf.Body(ref), settings=self.settings), True)
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
            if self.stopped:  # the API server went with the operator: nothing to post, nobody to tell
                return
            wait = apiclient.retry_after_of(exc) or 0.0
            self.not_before[key] = time.monotonic() + wait
            error = error_text(exc)
            old = self.streaks.get(key)
            # a Warning Event for the first error of a streak and for a new one; the same again only in the log
            level = logging.INFO if old is not None and old.error == error else logging.WARNING
            logger.log(level, "poll failed, tried again in %g s: %s", max(wait, self.interval), error)
            self.streaks[key] = Streak(old.since, old.started, error) if old else Streak(self.clock.stamp(), time.monotonic(),
                                                                                       error)
        else:
            self.not_before.pop(key, None)
            self.streaks.pop(key, None)
        self.say(key, ref, logger)

    def say(self, key: Key, ref: dict[str, Any], logger: Any, final: bool = False) -> None:
        """Write `ApiFailing` on the benchmark when what it says changes (read fresh, written conditional on the
        version read: a step's write is never undone). A write that fails is tried at the next poll."""
        wanted = None if final else api_condition(self.streaks.get(key), watchguard.WATCHES.failing(),
                                                  self.interval, time.monotonic(), ref.get("jobKinds") or [])
        said = self.said.get(key)
        if wanted is None:
            if not final and not (said and said[0] == "True") and ref.get("apiFailing") != "True":
                return
            wanted = ("False", "ApiAnswering", f"the API server answers this sweep's steps and watches again "
                                                f"(since {self.clock.stamp()})")
            if said and said[:2] == wanted[:2]:
                return
        elif said == wanted:
            return
        namespace, name = key
        try:
            fresh = kube.get_benchmark(namespace, name)
            if fresh is None or not (fresh.get("status") or {}).get("runs"):
                return  # deleted, or not started: its message says why it waits
            stored = fresh["status"]
            old = next((c for c in stored.get("conditions") or [] if c.get("type") == API_FAILING), None)
            told = None if old is None else (old.get("status"), old.get("reason"), old.get("message"))
            if told == wanted or (wanted[0] == "False" and (told is None or told[:2] == wanted[:2])):
                self.said[key], self.refs[key] = wanted, ref
                return
            conditions = BenchmarkStatus.read({"conditions": stored.get("conditions") or []}).conditions or []
            new = sweepstatus.condition(API_FAILING, wanted[0], wanted[1], wanted[2], self.clock.stamp(),
                               (fresh.get("metadata") or {}).get("generation"))
            kube.patch_status(namespace, name, {"conditions": [c.dump() for c in sweepstatus.set_condition(conditions, new)]},
                              (fresh.get("metadata") or {}).get("resourceVersion"))
            self.said[key], self.refs[key] = wanted, ref
            if wanted[0] == "True":
                logger.warning("%s", wanted[2])
        except Exception as exc:  # the API is failing, after all: the next poll tries again
            log.debug("condition %s of %s/%s not written: %s", API_FAILING, namespace, name, exc)


def error_text(exc: BaseException) -> str:
    """An API error as its status line and message (`500 Internal Server Error: ...`), else the exception."""
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    if status and reason:
        body = str(getattr(exc, "body", "") or "")
        try:
            body = json.loads(body).get("message") or body
        except (ValueError, AttributeError):
            pass
        return f"{status} {reason}: {body}"[:500] if body else f"{status} {reason}"
    return f"{type(exc).__name__}: {exc}"[:500]
