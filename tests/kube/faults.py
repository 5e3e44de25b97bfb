"""Fault injection into the emulated API server, seeded, counted (tests/test_faults.py, docs/reliability.md).

    plan = ApiFaults(seed=20, share=0.1)
    plan.install(cluster)     # the operator's calls now fail now and then: 409, 429 (Retry-After), 500, 503
    ...
    plan.uninstall(cluster); plan.injected  # {"409": n, "429": n, ...}

Only the operator's own requests (kopf's and its client's User-Agent) are hit: the test, playing the Kubeflow
operators and the user, talks to a healthy API server. What is injected, as a real API server answers it:

- 409 Conflict on writes (PATCH/PUT): optimistic concurrency lost to another writer;
- 429 TooManyRequests with `Retry-After: 1` (API priority and fairness);
- 500 InternalError, 503 ServiceUnavailable (an API server restarting, etcd leader election);
- watches cut after a short while (a load balancer's idle timeout), and a share of resumed watches
  answered 410 Gone (`resourceVersion` compacted away): the client must list again.

Each fault is a plain function on the emulator's `faults`/`watch_faults` hooks (tests/kube/emulator.py),
which run before the store is touched: an injected error changes nothing.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any

import kmock

from .cluster import EmulatedCluster
from .fixtures import OPERATOR_AGENTS
from .semantics import ApiError

ERRORS = {
    409: ("Conflict", "Operation cannot be fulfilled: the object has been modified; please apply your changes "
                      "to the latest version and try again"),
    429: ("TooManyRequests", "the server has received too many requests and has asked us to try again later"),
    500: ("InternalError", "an error on the server (\"injected\") has prevented the request from succeeding"),
    503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
}
WRITES = {"PATCH", "PUT"}


def is_operator(request: kmock.Request) -> bool:
    return request.headers.get("User-Agent", "").startswith(OPERATOR_AGENTS)


class ApiFaults:
    """A seeded share of the operator's calls answered with an error; its watches cut and 410'd. Each error
    code is also given to the first operator call it fits, and the first resumed watch gets 410, so that every
    fault is met whatever the timing.

    `injected` counts what was answered ("409", "429", "500", "503", "watch-cut", "410"); `failures`
    and `successes` keep (time, method, resource) of the operator's calls, for the longest gap between
    a failed call and the next success of the same kind (the backoff actually waited)."""

    def __init__(self, seed: int, share: float = 0.1, watch_seconds: float = 2.0, gone_share: float = 0.5):
        self.rng = random.Random(seed)
        self.share, self.watch_seconds, self.gone_share = share, watch_seconds, gone_share
        self.injected: Counter[str] = Counter()
        self.first = [409, 429, 500, 503]
        self.first_resume_gone = True
        self.calls: list[tuple[float, str, str, bool]] = []  # (time, method, resource, failed)
        self._lock = threading.Lock()

    def _error(self, request: kmock.Request) -> ApiError | None:
        if not is_operator(request) or request.resource is None or request.resource.plural is None:
            return None
        if request.action == kmock.action.WATCH:
            return None  # watches: see _watch
        kind = f"{request.resource.plural}/{request.subresource}" if request.subresource else request.resource.plural
        with self._lock:
            method = request.method.name if hasattr(request.method, "name") else str(request.method)
            # each code at least once, whatever the timing: the first calls it fits get it
            code = next((c for c in self.first if c != 409 or method in WRITES), 0)
            if code:
                self.first.remove(code)
            elif self.rng.random() >= self.share:
                code = 0
            elif method in WRITES and self.rng.random() < 0.5:  # a write's most likely error: a lost race
                code = 409
            else:
                code = self.rng.choice([429, 500, 503])
            failed = bool(code)
            self.calls.append((time.monotonic(), method, kind, failed))
            if not failed:
                return None
            self.injected[str(code)] += 1
        reason, message = ERRORS[code]
        return ApiError(code, reason, message, headers={"Retry-After": "1"} if code == 429 else None)

    def _watch(self, request: kmock.Request) -> Any:
        if not is_operator(request):
            return None
        with self._lock:
            since = request.params.get("resourceVersion")
            if since not in (None, "", "0") and (self.first_resume_gone or self.rng.random() < self.gone_share):
                self.first_resume_gone = False
                self.injected["410"] += 1
                return "gone"
            self.injected["watch-cut"] += 1
            return self.rng.uniform(0.5, self.watch_seconds)

    def install(self, cluster: EmulatedCluster) -> None:
        """From now on; the watches already open are cut, so that the resumed ones meet the faults too."""
        cluster.call(lambda emulator: (emulator.faults.append(self._error), emulator.watch_faults.append(self._watch)))
        cluster.call(lambda emulator: emulator.cut_watches())
        self.injected["watch-cut"] += 1

    def uninstall(self, cluster: EmulatedCluster) -> None:
        cluster.call(lambda emulator: (emulator.faults.remove(self._error), emulator.watch_faults.remove(self._watch)))

    def longest_recovery(self) -> float:
        """The longest time from an injected failure to the next successful call of the same method and
        resource: how long the operator's retries (kopf's backoff, the next step) kept it waiting."""
        longest, pending = 0.0, {}
        for at, method, kind, failed in self.calls:
            if failed:
                pending.setdefault((method, kind), at)
            elif (method, kind) in pending:
                longest = max(longest, at - pending.pop((method, kind)))
        return longest


def pod_evicted(message: str = "The node was low on resource: memory. Threshold quantity: 100Mi, available: "
                               "51200Ki.") -> dict[str, Any]:
    """A pod's status after the kubelet evicted it (node-pressure eviction): phase Failed, reason Evicted,
    its container killed (exit code 137)."""
    return {"phase": "Failed", "reason": "Evicted", "message": message}
