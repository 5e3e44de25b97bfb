"""One active operator: leader election on a Lease (coordination.k8s.io/v1), as client-go's controllers do it.

Two live operators (two replicas, an operator run by hand beside the chart's, a pod rescheduled from a node that
is unreachable but still running it) would each post every Event and count every run, and write status over each
other. With `--leader-elect`, an operator first waits to hold the Lease, then runs; it renews it every
`retry` seconds and exits at once (exit code 1: the kubelet restarts it, to stand by) when it could not renew
within `renew` seconds, before another may take it (`lease` seconds after the last renewal it saw). A clean stop
releases it, so a standby takes over within `retry` seconds rather than `lease`.

client-go's rules (tools/leaderelection/leaderelection.go): a candidate takes the Lease when it is free (no
holder), or when its record has not changed for `lease` seconds of the candidate's own clock (so no two clocks
are compared); every write is a replace carrying the resourceVersion read, so of two candidates one wins (409
for the other). kubernetes.leaderelection (the Python client's port) is not used: its renewal is not bounded by
the renew deadline (a request that hangs keeps renewing nothing while another takes the Lease), and it neither
releases the Lease nor reads a released one as free.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import kubernetes
from kubernetes.client.exceptions import ApiException

from gpt2bench.clock import SYSTEM_CLOCK

log = logging.getLogger(__name__)

DEFAULT_LEASE_SECONDS = 15  # client-go's defaults: lease 15 s, renew deadline 10 s, retry 2 s
MIN_LEASE_SECONDS = 3


@dataclass(frozen=True)
class Timing:
    lease: float
    renew: float
    retry: float

    @classmethod
    def of(cls, lease: float = DEFAULT_LEASE_SECONDS) -> Timing:
        """client-go's proportions: renew deadline 2/3 of the lease, retry 2/15 of it (at least 1 s)."""
        return cls(lease=lease, renew=lease * 2 / 3, retry=max(1.0, lease * 2 / 15))


def identity() -> str:
    """The pod's name (its hostname) and a random part: a restarted container is another candidate."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


class Elector:
    """Campaign for the Lease `namespace/name` as `holder`; `api`: a CoordinationV1Api."""

    def __init__(self, api: kubernetes.client.CoordinationV1Api, namespace: str, name: str, holder: str,
                 timing: Timing):
        self.api, self.namespace, self.name, self.holder, self.timing = api, namespace, name, holder, timing
        self.observed: tuple[str | None, str | None] | None = None  # (holder, renewTime) last seen
        self.observed_at = 0.0  # time.monotonic() when it changed
        self.renewed_at = 0.0  # time.monotonic() of the last successful write as holder
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _request_timeout(self) -> tuple[float, float]:
        return min(self.timing.renew, 10.0), self.timing.renew

    def try_acquire_or_renew(self) -> bool:
        """One attempt: True when this candidate holds the Lease now (written with its renewTime)."""
        now = SYSTEM_CLOCK.now()
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=self._request_timeout())
        except ApiException as exc:
            if exc.status != 404:
                log.info("reading lease %s/%s failed: %s", self.namespace, self.name, exc.reason)
                return False
            return self._create(now)
        spec = lease.spec or kubernetes.client.V1LeaseSpec()
        seen = (spec.holder_identity, str(spec.renew_time))
        if seen != self.observed:
            self.observed, self.observed_at = seen, time.monotonic()
        held_by_other = spec.holder_identity and spec.holder_identity != self.holder
        if held_by_other and time.monotonic() - self.observed_at < (spec.lease_duration_seconds or self.timing.lease):
            return False
        if spec.holder_identity != self.holder:
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        spec.holder_identity, spec.renew_time = self.holder, now
        spec.lease_duration_seconds = int(round(self.timing.lease))
        lease.spec = spec
        try:
            self.api.replace_namespaced_lease(self.name, self.namespace, lease, _request_timeout=self._request_timeout())
        except ApiException as exc:  # 409: another candidate wrote first
            log.info("writing lease %s/%s failed: %s", self.namespace, self.name, exc.reason)
            return False
        self.observed, self.observed_at = (self.holder, str(now)), time.monotonic()
        return True

    def _create(self, now: datetime.datetime) -> bool:
        lease = kubernetes.client.V1Lease(
            metadata=kubernetes.client.V1ObjectMeta(name=self.name, namespace=self.namespace),
            spec=kubernetes.client.V1LeaseSpec(holder_identity=self.holder, acquire_time=now, renew_time=now,
                                               lease_duration_seconds=int(round(self.timing.lease)),
                                               lease_transitions=0))
        try:
            self.api.create_namespaced_lease(self.namespace, lease, _request_timeout=self._request_timeout())
        except ApiException as exc:  # 409: another candidate created it first
            log.info("creating lease %s/%s failed: %s", self.namespace, self.name, exc.reason)
            return False
        return True

    def acquire(self) -> None:
        """Wait until this candidate holds the Lease."""
        log.info("waiting to lead: lease %s/%s, as %s", self.namespace, self.name, self.holder)
        while not self._attempt():
            time.sleep(self.timing.retry)
        self.renewed_at = time.monotonic()
        log.info("leading: lease %s/%s held by %s", self.namespace, self.name, self.holder)

    def _attempt(self) -> bool:
        try:
            return self.try_acquire_or_renew()
        except Exception as exc:  # the network, a timeout: another try later
            log.info("lease %s/%s: %s: %s", self.namespace, self.name, type(exc).__name__, exc)
            return False

    def keep(self, lost: Callable[[], None]) -> None:
        """Renew every `retry` s in a thread; call `lost` (which must end the process) once no renewal has
        succeeded for `renew` s. A second thread watches the time, so that a renewal that hangs cannot hold it."""

        def renew() -> None:
            while not self._stop.wait(self.timing.retry):
                if self._attempt():
                    self.renewed_at = time.monotonic()

        def watch() -> None:
            while not self._stop.wait(min(self.timing.retry, 1.0)):
                if time.monotonic() - self.renewed_at > self.timing.renew:
                    log.error("leader election lost: lease %s/%s not renewed for %.1f s", self.namespace,
                              self.name, time.monotonic() - self.renewed_at)
                    lost()
                    return

        self._threads = [threading.Thread(target=target, name=f"lease-{target.__name__}", daemon=True)
                         for target in (renew, watch)]
        for thread in self._threads:
            thread.start()

    def release(self) -> None:
        """A clean stop: stop renewing (a renewal in flight is waited for) and give the Lease up (no holder), if
        it is still ours."""
        self._stop.set()
        for thread in self._threads:
            thread.join(self.timing.renew)
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=self._request_timeout())
            if lease.spec is None or lease.spec.holder_identity != self.holder:
                return
            lease.spec.holder_identity, lease.spec.lease_duration_seconds = None, 1
            lease.spec.renew_time = lease.spec.acquire_time = SYSTEM_CLOCK.now()
            self.api.replace_namespaced_lease(self.name, self.namespace, lease, _request_timeout=self._request_timeout())
            log.info("released lease %s/%s", self.namespace, self.name)
        except Exception as exc:  # it expires by itself
            log.info("releasing lease %s/%s failed: %s", self.namespace, self.name, exc)


def exit_now() -> None:
    """Leadership lost: stop at once, as client-go's controllers do (another operator may hold it any moment)."""
    os._exit(1)
