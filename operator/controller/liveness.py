"""Whether the operator still makes progress: what its liveness endpoint (`/healthz`) reports.

kopf serves `/healthz` (`--liveness`) from its event loop and runs the `@kopf.on.probe` handlers for it
(handlers.py). Every API request of the operator's client and every round of a benchmark's advance
(sweep.advance: one start or step) is registered here while it lasts, with the longest it may take
(`limit`): a request is bounded by its timeouts and retries (apiclient.Timeouts.call_limit), a round by
STEP_LIMIT. One that has outlived its limit means the operator is stuck (an answer that never ends, a
deadlock, a loop): the probe then fails, and the kubelet restarts the pod after the Deployment's
`failureThreshold` probes. An event loop that is blocked does not answer `/healthz` at all, which fails the
probe too.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

# The longest one round (a sweep's start or step: reading its jobs and pods, creating the next jobs, writing
# its status) may take before the operator counts as stuck. A step makes at most a few dozen bounded requests;
# this leaves room for a slow API server without restarting the operator for it.
STEP_LIMIT = 15 * 60.0


@dataclass(frozen=True)
class Activity:
    what: str
    started: float  # time.monotonic()
    limit: float  # seconds

    def overdue(self, now: float) -> float:
        """Seconds past its limit (≤ 0 while within it)."""
        return now - self.started - self.limit


_in_flight: dict[int, Activity] = {}
_guard = threading.Lock()
_tokens = itertools.count()


@contextlib.contextmanager
def activity(what: str, limit: float) -> Iterator[None]:
    """Register `what` as in flight for the `with` block; it may take `limit` seconds."""
    token = next(_tokens)
    with _guard:
        _in_flight[token] = Activity(what, time.monotonic(), limit)
    try:
        yield
    finally:
        with _guard:
            _in_flight.pop(token, None)


def stalled(now: float | None = None) -> list[Activity]:
    """What has outlived its limit, most overdue first."""
    now = time.monotonic() if now is None else now
    with _guard:
        late = [a for a in _in_flight.values() if a.overdue(now) > 0]
    return sorted(late, key=lambda a: -a.overdue(now))


def report(now: float | None = None) -> dict[str, float | int]:
    """The probe's answer while healthy: how much is in flight and the oldest's age."""
    now = time.monotonic() if now is None else now
    with _guard:
        ages = [now - a.started for a in _in_flight.values()]
    return {"inFlight": len(ages), "oldestSeconds": round(max(ages, default=0.0), 1)}


class Stalled(Exception):
    """Something has outlived its limit: the operator makes no progress."""


def check() -> dict[str, float | int]:
    """The probe: what is in flight, or Stalled naming what has outlived its limit (most overdue first)."""
    now = time.monotonic()
    late = stalled(now)
    if late:
        raise Stalled(describe(late, now))
    return report(now)


def describe(late: list[Activity], now: float | None = None) -> str:
    now = time.monotonic() if now is None else now
    shown = "; ".join(f"{a.what} running for {now - a.started:.0f} s (limit {a.limit:.0f} s)" for a in late[:3])
    more = f" and {len(late) - 3} more" if len(late) > 3 else ""
    return f"no progress: {shown}{more}"
