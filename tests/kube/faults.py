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

Placed faults, for one transition at a time (tests/test_operator_states.py):

- `FailCalls`: the operator's next N calls that match (method, path) answered with one error code (a 503 on
  discovery, a 403 on a status write, a 404 on a list from an API server whose CRDs have not synced...);
- `Hang`: the operator's calls that match are never answered (the connection stays open, as behind a half-open
  connection) or, with `trickle`, answered with a body that never ends, until released;
- `WatchError`: the operator's next N watches that match answered 200 with one ERROR event other than 410, as a
  real API server streams it (504 "Too large resource version" from a watch cache behind its etcd, 500 from an
  aggregated or restarting server), then the stream ends;
- `WatchGap`: the operator's next resumed watches that match answered `410 Gone` after a pause (the events in the
  pause are lost to it: it must list again), or every one for a while (a 410 storm).

Each fault is a plain function on the emulator's `faults`/`watch_faults` hooks (tests/kube/emulator.py),
which run before the store is touched: an injected error changes nothing.
"""

from __future__ import annotations

import asyncio
import random
import re
import threading
import time
from collections import Counter
from typing import Any

import kmock

from .cluster import EmulatedCluster
from .fixtures import OPERATOR_AGENTS
from .semantics import ApiError

ERRORS = {
    403: ("Forbidden", "gpt2benchmarks.gpt2bench.io is forbidden: User \"system:serviceaccount:gpt2bench:operator\" "
                       "cannot do this (injected)"),
    404: ("NotFound", "the server could not find the requested resource"),
    409: ("Conflict", "Operation cannot be fulfilled: the object has been modified; please apply your changes "
                      "to the latest version and try again"),
    429: ("TooManyRequests", "the server has received too many requests and has asked us to try again later"),
    500: ("InternalError", "an error on the server (\"injected\") has prevented the request from succeeding"),
    503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
}
WRITES = {"PATCH", "PUT"}
OWN_CLIENT = ("gpt2bench-operator/",)  # the operator's `kubernetes` client, not kopf


def is_operator(request: kmock.Request, agents: tuple[str, ...] = OPERATOR_AGENTS) -> bool:
    return request.headers.get("User-Agent", "").startswith(agents)


def request_method(request: kmock.Request) -> str:
    """The request's HTTP method, upper-case ("POST"), whichever form kmock gives it in."""
    return request.method.name if hasattr(request.method, "name") else str(request.method).upper()


class Placed:
    """A fault for the operator's calls of one method whose path matches a regular expression (`None`: any),
    installed on a cluster for a `with` block. `agents`: whose calls (kopf's and the operator's client by
    default; OWN_CLIENT for the client's only). `hits` counts the calls it answered; `calls` keeps
    (time.monotonic(), answered by the fault) of every matching call."""

    def __init__(self, method: str | None = None, path: str | None = None,
                 agents: tuple[str, ...] = OPERATOR_AGENTS):
        self.method, self.path, self.agents = method, re.compile(path) if path else None, agents
        self.hits = 0
        self.calls: list[tuple[float, bool]] = []
        self.cluster: EmulatedCluster | None = None

    def matches(self, request: kmock.Request) -> bool:
        return (is_operator(request, self.agents) and (self.method is None or request_method(request) == self.method)
                and (self.path is None or self.path.search(request.url.path) is not None))

    def install(self, cluster: EmulatedCluster) -> Placed:
        self.cluster = cluster
        cluster.call(lambda emulator: emulator.faults.append(self))
        return self

    def uninstall(self) -> None:
        if self.cluster is not None:
            self.cluster.call(lambda emulator: self in emulator.faults and emulator.faults.remove(self))

    def __enter__(self) -> Placed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()


class FailCalls(Placed):
    """The next `times` matching calls answered with `code` (as a real API server words it; 429 and 503 with
    `Retry-After` when `retry_after` is set), then the API server is healthy again."""

    def __init__(self, code: int, times: int = 1, retry_after: int | None = None, **match: Any):
        super().__init__(**match)
        self.code, self.times, self.retry_after = code, times, retry_after
        self._lock = threading.Lock()

    def __call__(self, request: kmock.Request) -> ApiError | None:
        if not self.matches(request):
            return None
        with self._lock:
            failed = self.hits < self.times
            self.calls.append((time.monotonic(), failed))
            if not failed:
                return None
            self.hits += 1
        reason, message = ERRORS[self.code]
        headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else None
        return ApiError(self.code, reason, message, headers=headers)


class Refuse(Placed):
    """Matching calls answered by `answer(request)`: an ApiError (an admission or RBAC refusal of some objects, by
    name or content, as the API server words it), or None for the emulator's own handling. A fault, not a kmock
    reaction: a reaction makes every later request of the cluster scan all the requests before it."""

    def __init__(self, answer: Any, **match: Any):
        super().__init__(**match)
        self.answer = answer

    def __call__(self, request: kmock.Request) -> ApiError | None:
        return self.answer(request) if self.matches(request) else None


class Hang(Placed):
    """Matching calls are never answered until `release()` (the API server accepted the connection and read
    the request: only the client's read timeout ends the wait), at most `times` of them (None: all). With
    `trickle`, they are answered at once with headers and then a body that never ends (a space every 0.2 s):
    each read gets data, so no read timeout ever fires; only a deadline on the whole call would end it."""

    def __init__(self, times: int | None = None, trickle: bool = False, **match: Any):
        super().__init__(**match)
        self.times, self.trickle = times, trickle
        self._released: asyncio.Event | None = None  # created on the emulator's loop, at install

    def install(self, cluster: EmulatedCluster) -> Hang:
        def create(emulator) -> None:
            self._released = asyncio.Event()
        cluster.call(create)
        return super().install(cluster)

    def release(self) -> None:
        """Answer the held calls (as the API server would have) and stop holding new ones."""
        if self.cluster is not None and self._released is not None:
            self.cluster.call(lambda emulator: self._released.set())
        self.uninstall()

    def uninstall(self) -> None:
        super().uninstall()
        if self.cluster is not None and self._released is not None:
            self.cluster.call(lambda emulator: self._released.set())

    def __call__(self, request: kmock.Request) -> Any:
        if not self.matches(request) or (self.times is not None and self.hits >= self.times):
            return None
        if self._released is None or self._released.is_set():
            return None
        self.hits += 1
        self.calls.append((time.monotonic(), True))
        if self.trickle:
            return kmock.Response(headers={"Content-Type": "application/json"}, payload=self._spaces())
        return self._released.wait()

    async def _spaces(self):
        yield b""  # the headers now
        while not self._released.is_set():
            yield b" "
            try:
                await asyncio.wait_for(self._released.wait(), 0.2)
            except TimeoutError:
                pass


WATCH_ERRORS = {
    # what kube-apiserver's watch cache streams for a resourceVersion newer than it has seen (a client that
    # listed from another apiserver or from etcd): k8s.io/apiserver storage/cacher, NewTooLargeResourceVersionError
    504: {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": 504, "reason": "Timeout",
          "message": "Timeout: Too large resource version: 1000000, current: 57",
          "details": {"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                      "retryAfterSeconds": 1}},
    500: {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": 500,
          "reason": "InternalError", "message": "an error on the server (\"injected\") has prevented the request "
                                                "from succeeding"},
}


class WatchError(Placed):
    """The next `times` matching watches (kopf's, by default) answered 200 with one ERROR event of `code`
    (WATCH_ERRORS) and then the end of the stream, as the API server ends a watch after its error."""

    def __init__(self, code: int, times: int = 1, agents: tuple[str, ...] = ("kopf/",), **match: Any):
        super().__init__(method="GET", agents=agents, **match)
        self.code, self.times = code, times
        self._lock = threading.Lock()

    def matches(self, request: kmock.Request) -> bool:
        return super().matches(request) and request.params.get("watch") == "true"

    def __call__(self, request: kmock.Request) -> Any:
        if not self.matches(request):
            return None
        with self._lock:
            failed = self.hits < self.times
            self.calls.append((time.monotonic(), failed))
            if not failed:
                return None
            self.hits += 1
        return kmock.Response(headers={"Content-Type": "application/json"}, payload=self._events())

    async def _events(self):
        yield b""
        yield {"type": "ERROR", "object": WATCH_ERRORS[self.code]}


class WatchGap(Placed):
    """The next `times` resumed watches that match (kopf's, `?resourceVersion=`) answered, after `delay` s, with
    410 Gone: what happens meanwhile reaches the operator only through its next listing. `times=None`: every
    one, until uninstalled (a 410 storm). `hits` counts the 410s."""

    def __init__(self, delay: float = 0.0, times: int | None = 1, agents: tuple[str, ...] = ("kopf/",),
                 **match: Any):
        super().__init__(method="GET", agents=agents, **match)
        self.delay, self.times = delay, times
        self._lock = threading.Lock()
        self._gone: set[int] = set()

    def matches(self, request: kmock.Request) -> bool:
        return (super().matches(request) and request.params.get("watch") == "true"
                and request.params.get("resourceVersion") not in (None, "", "0"))

    def __call__(self, request: kmock.Request) -> Any:  # on `faults`: the pause
        if not self.matches(request):
            return None
        with self._lock:
            if self.times is not None and self.hits >= self.times:
                return None
            self.hits += 1
            self.calls.append((time.monotonic(), True))
            self._gone.add(id(request))
        return float(self.delay) if self.delay else None

    def gone(self, request: kmock.Request) -> Any:  # on `watch_faults`: the 410
        with self._lock:
            if id(request) in self._gone:
                self._gone.discard(id(request))
                return "gone"
        return None

    def install(self, cluster: EmulatedCluster) -> WatchGap:
        super().install(cluster)
        cluster.call(lambda emulator: emulator.watch_faults.append(self.gone))
        return self

    def uninstall(self) -> None:
        super().uninstall()
        if self.cluster is not None:
            self.cluster.call(lambda emulator: self.gone in emulator.watch_faults
                              and emulator.watch_faults.remove(self.gone))


def remove_crd(cluster: EmulatedCluster, name: str, delay: float = 1.0) -> None:
    """Delete the CRD `name` (e.g. pytorchjobs.kubeflow.org) as an API server does, in the order that matters to
    a watcher: its objects go, its resources are no longer served (a list or watch of them is 404 from now on, and
    discovery no longer names them), the open watches end, and the CRD's DELETED event is sent (kopf's observer
    stops watching the kind on it) `delay` s later: a real API server removes the CRD object last, after its
    cleanup finalizer has deleted every object, so a watch that reconnects meets the 404 first. The emulator keeps
    a deleted CRD's resources served otherwise; the finalizer's own timing is not played."""
    async def remove(emulator) -> None:
        crd_resource = kmock.resource("apiextensions.k8s.io/v1/customresourcedefinitions")
        key = (crd_resource, None, name)
        crd = emulator.objects[key].raw
        plural, group = crd["spec"]["names"]["plural"], crd["spec"]["group"]
        async with emulator._lock:
            for other in [k for k, o in emulator.objects.items() if not o.deleted and k[0].plural == plural
                          and k[0].group == group]:
                await emulator._remove(other)
            for resource in [r for r in list(emulator.resources) if getattr(r, "plural", None) == plural
                             and getattr(r, "group", None) == group]:
                del emulator.resources[resource]
                emulator._crd_versions.pop(resource, None)
            for gone in [k for k in list(emulator._objects) if k[0].plural == plural and k[0].group == group]:
                del emulator._objects[gone]  # kmock's discovery names the resources of every object it holds
        await emulator.cut_watches()
        await asyncio.sleep(delay)
        async with emulator._lock:
            await emulator._remove(key)

    cluster.call(remove)


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
            method = request_method(request)
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
