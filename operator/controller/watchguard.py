"""kopf's watches kept alive through the API server's errors, and what the poll needs to know of them.

kopf (1.45) ends the whole operator when one of its watches meets an error it does not expect: an ERROR event
other than 410 in the stream (`WatchingError`: a watch cache's 504 "Too large resource version", a 500), or an
API error on the list or watch of a kind (a 404 from an API server whose CRD informer has not synced, a CRD being
re-applied or removed; a 5xx that outlived kopf's own retries). The process exited 1 about 5 s later: repeated,
a CrashLoopBackOff, and nothing said on any benchmark. kopf's `infinite_watch` already re-lists whenever its
`continuous_watch` returns (after a 410), so `install()` wraps `continuous_watch`: an error ends that stream
instead, after a backoff (0.5 s doubling to 30 s, reset by a listing that works), and kopf lists again.

A watch gap (a 410, an error) loses the events in it: a job that finished then is seen by the poll only, up to
--poll-interval later. So a listing after a gap calls `on_relisted` (the poll steps every unfinished sweep at
once), and a run of gaps (a 410 storm: hundreds of re-lists in seconds) is slowed by the same kind of backoff.
`failing()` says which watches fail, since when and how: the poll writes it on the benchmarks when it lasts
(condition `ApiFailing`, poll.py).

This reaches into kopf's internals (`kopf._cogs.clients.watching`), which have kept these names since 1.30; if
they change, `install()` logs an error and the operator runs as kopf made it (the tests fail:
tests/test_faults_watch.py).
"""

from __future__ import annotations

import ast
import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from gpt2bench.clock import SYSTEM_CLOCK

log = logging.getLogger(__name__)

FIRST_BACKOFF = 0.5  # s before the first retry of a failed watch; doubled at each failure in a row
MAX_BACKOFF = 30.0
GAP_BACKOFF = 0.1  # after a 410 that came soon after the last one; doubled at each, at most MAX_GAP_BACKOFF
MAX_GAP_BACKOFF = 5.0
QUICK_GAP = 10.0  # a stream that ended sooner than this after its listing was a quick gap (a 410 storm)


@dataclass
class Failure:
    """A watch failing since `since` (UTC, RFC 3339; `started`: monotonic), `count` times in a row."""

    what: str  # the kind, e.g. "PyTorchJob"
    since: str
    started: float
    count: int
    error: str
    backoff: float
    listed_at: float | None = None  # monotonic: a listing came through since


class Watches:
    """The state of kopf's watches, shared by the event loop (the watchers) and the poll's threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failing: dict[str, Failure] = {}
        self._listed: set[str] = set()
        self._gaps: dict[str, tuple[int, float]] = {}  # key -> (quick gaps in a row, when the last stream began)
        self.on_relisted: Callable[[str], None] | None = None  # on the event loop: a listing after a gap
        self.on_failing: Callable[[str], None] | None = None  # on the event loop: a watch failed again

    def reset(self) -> None:
        """A new operator in this process (tests run several): nothing failing, nothing listed yet."""
        with self._lock:
            self._failing.clear()
            self._listed.clear()
            self._gaps.clear()

    def failing(self) -> list[Failure]:
        """The watches failing now (one that listed QUICK_GAP s ago and has not failed since works again)."""
        now = time.monotonic()
        with self._lock:
            over = [k for k, f in self._failing.items() if f.listed_at is not None and now - f.listed_at >= QUICK_GAP]
            for key in over:
                self._failing.pop(key)
            return list(self._failing.values())

    def failed(self, key: str, what: str, error: str) -> float:
        """A watch failed: the backoff to wait before it is tried again. A failure soon after a listing that worked
        (no event yet, under QUICK_GAP s: a watch cache still behind) continues the streak, so its backoff grows."""
        now = time.monotonic()
        with self._lock:
            old = self._failing.get(key)
            if old is not None and old.listed_at is not None and now - old.listed_at >= QUICK_GAP:
                old = None  # it worked for a while: a new streak
            backoff = FIRST_BACKOFF if old is None else min(MAX_BACKOFF, old.backoff * 2)
            self._failing[key] = Failure(what, old.since if old else SYSTEM_CLOCK.stamp(), old.started if old else now,
                                         (old.count if old else 0) + 1, error, backoff)
        level = logging.WARNING if old is None else logging.INFO  # one warning a streak: no Event per retry
        log.log(level, "the %s watch failed (%d in a row since %s): %s; listed and watched again in %g s", what,
                self._failing[key].count, self._failing[key].since, error, backoff)
        if self.on_failing is not None:
            self.on_failing(key)
        return backoff

    def stopped(self, key: str) -> None:
        """kopf no longer watches it: nothing to say of it."""
        with self._lock:
            self._failing.pop(key, None)
            self._listed.discard(key)

    def listed(self, key: str, what: str) -> None:
        """A listing came through. After a gap, `on_relisted`. A failing watch is over once an event comes
        (`working`) or QUICK_GAP s pass without another failure (`failing`)."""
        now = time.monotonic()
        with self._lock:
            old = self._failing.get(key)
            if old is not None:
                old.listed_at = now
            gap = key in self._listed
            self._listed.add(key)
            quick, _ = self._gaps.get(key, (0, 0.0))
            self._gaps[key] = (quick, now)
        if gap and self.on_relisted is not None:
            self.on_relisted(key)

    def working(self, key: str) -> None:
        """An event came through the watch: it works."""
        with self._lock:
            old = self._failing.pop(key, None)
        if old is not None:
            log.warning("the %s watch works again, after %d failures since %s (last: %s)", old.what, old.count,
                        old.since, old.error)
            if self.on_relisted is not None:
                self.on_relisted(key)

    def ended(self, key: str) -> float:
        """A stream ended for a new listing (a 410): the pause before it, growing while such gaps come quickly."""
        with self._lock:
            quick, began = self._gaps.get(key, (0, 0.0))
            quick = quick + 1 if time.monotonic() - began < QUICK_GAP else 0
            self._gaps[key] = (quick, began)
        return 0.0 if quick <= 1 else min(MAX_GAP_BACKOFF, GAP_BACKOFF * 2 ** (quick - 2))


WATCHES = Watches()
_installed = False




def describe(exc: BaseException) -> str:
    """An error in the API server's words: `504 Timeout: Too large resource version ...`, `404 the server ...`."""
    text = str(exc).removeprefix("Error in the watch-stream: ")
    try:  # kopf's WatchingError carries the ERROR event's Status as a dict's repr
        status = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        status = None
    if isinstance(status, dict):
        return f"{status.get('code')} {status.get('reason')}: {status.get('message')}"[:500]
    code = getattr(exc, "status", None)
    text = getattr(exc, "message", None) or (str(exc.args[0]) if exc.args else "") or type(exc).__name__
    return (f"{code} {text}" if code else text)[:500]


def install(watches: Watches = WATCHES) -> bool:
    """Wrap kopf's `continuous_watch` (once per process). False, logged, if kopf no longer has it."""
    global _installed
    if _installed:
        return True
    try:
        from kopf._cogs.clients import errors as kopf_errors
        from kopf._cogs.clients import watching
        original = watching.continuous_watch
        listed_mark = watching.Bookmark.LISTED
        watching_error = watching.WatchingError
        api_error, unauthorized = kopf_errors.APIError, kopf_errors.APIUnauthorizedError
    except (ImportError, AttributeError) as exc:
        log.error("kopf's watch internals moved (%s): a watch error will end the operator", exc)
        return False

    async def continuous_watch(*, settings: Any, resource: Any, namespace: Any,
                               operator_pause_waiter: Any) -> AsyncIterator[Any]:
        key = f"{resource.plural}.{resource.version}.{resource.group}@{namespace or ''}"
        what = getattr(resource, "kind", None) or resource.plural
        stream = original(settings=settings, resource=resource, namespace=namespace,
                          operator_pause_waiter=operator_pause_waiter)
        try:
            listed = False
            async for event in stream:
                if event is listed_mark:
                    watches.listed(key, what)
                    listed = True
                elif listed and isinstance(event, dict) and event.get("type") is not None:
                    watches.working(key)  # cheap when nothing fails
                    listed = False
                yield event
        except unauthorized:
            raise  # kopf's login handles it
        except (asyncio.CancelledError, GeneratorExit):
            watches.stopped(key)  # kopf stopped watching the kind (its CRD removed), or the operator stops
            raise
        except (watching_error, api_error) as exc:
            await asyncio.sleep(watches.failed(key, what, describe(exc)))
            return  # kopf lists and watches again
        if not operator_pause_waiter.done():
            pause = watches.ended(key)
            if pause:
                log.debug("the %s watch lost its place again within %g s: listed again in %g s", what, QUICK_GAP,
                          pause)
                await asyncio.sleep(pause)

    watching.continuous_watch = continuous_watch
    _installed = True
    return True
