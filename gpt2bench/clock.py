"""Time as the project reads and writes it, defined once: Kubernetes' `metav1.Time` form (RFC 3339 in UTC, to
the second), and the clock a driver reads `now` from.

A driver takes its clock as a parameter (`Clock`), so that a test can run a sweep at whatever time it likes;
the rules below the drivers receive `now` from their caller and never read the time themselves.
"""

from __future__ import annotations

import datetime


def rfc3339(moment: datetime.datetime) -> str:
    """`2026-11-29T04:05:06Z`: the form the API server writes timestamps in, and the status and results keep."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str | None) -> datetime.datetime | None:
    """The moment an RFC 3339 text names (`Z` or an offset; fractions of a second kept), or None for no text or a
    text that is not a time. A time without an offset is read as UTC."""
    if not text:
        return None
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)


class Clock:
    """The wall clock, in UTC. A test passes one whose `now` it sets."""

    def now(self) -> datetime.datetime:
        return datetime.datetime.now(datetime.UTC)

    def stamp(self) -> str:
        """Now, as `rfc3339` writes it."""
        return rfc3339(self.now())


SYSTEM_CLOCK = Clock()
