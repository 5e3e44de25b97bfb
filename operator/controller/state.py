"""What the operator keeps while it runs, in one object that kopf hands every handler (`memo.operator`, set at
start-up): the clock every step reads `now` from, each benchmark's turn (one thread advances a benchmark at a
time), the benchmarks whose lost Events were already looked for, and the poll. Nothing here outlives the
process: a restarted operator rebuilds it all from the cluster (docs/reliability.md).

What stays module-level is the process's plumbing, one per process whatever runs in it: the API client pool
(`kube`), the Prometheus registry and its server (`metrics`), the requests in flight that the liveness probe
reads (`liveness`: every API call registers itself, far below any handler), and kopf's watch functions as
`watchguard` wraps them.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

from gpt2bench.clock import SYSTEM_CLOCK, Clock

# How often a sweep that could not start is tried again, by default (the poll's interval: --poll-interval).
RETRY_SECONDS = 30.0


@dataclass
class Turn:
    """One benchmark's turn: one thread advances it at a time. `wanted`: a trigger came while it was busy (the
    holder goes round once more); `edited`: one of them was a spec edit."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    wanted: bool = False
    edited: bool = False


@dataclass
class OperatorState:
    clock: Clock = SYSTEM_CLOCK
    retry_seconds: float = RETRY_SECONDS
    turns: dict[tuple[str, str], Turn] = field(default_factory=dict)
    guard: threading.Lock = field(default_factory=threading.Lock)  # over `turns` and every Turn's flags
    recovered: set[tuple[str, str | None]] = field(default_factory=set)  # (namespace, uid): Events looked for
    poll: Any = None  # poll.Poll, once started
    poll_task: asyncio.Task | None = None

    def turn(self, namespace: str, name: str) -> Turn:
        with self.guard:
            return self.turns.setdefault((namespace, name), Turn())

    def forget(self, namespace: str, name: str) -> None:
        """A deleted benchmark's turn goes with it."""
        with self.guard:
            self.turns.pop((namespace, name), None)

    def again(self, namespace: str, name: str) -> None:
        """Have the thread advancing this benchmark go round once more when its step is done (as a trigger that
        finds it busy does)."""
        turn = self.turn(namespace, name)
        with self.guard:
            turn.wanted = True
