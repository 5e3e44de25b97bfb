"""The operator's `kubernetes` client: every request bounded in time, the API server's `Retry-After` obeyed.

- **Timeouts.** Each request gets (connect, read) timeouts (`--api-timeout`): a connection the API server
  accepted but never answers ends after `read` seconds with an error (transient: the next step tries again),
  instead of holding a handler thread and its benchmark for ever. urllib3 applies the read timeout to each
  read, so an answer that keeps trickling in is not ended by it; the liveness probe catches that one.
- **Retries.** urllib3 retries a failed connection and a failed read once (a pooled connection the server
  closed while idle fails its first read); never a status.
- **Retry-After.** A 429, or a 5xx, that carries `Retry-After` (API Priority and Fairness, an API server
  shutting down) is retried after that many seconds, whatever the verb (the server did not process it), as
  client-go does (`rest.checkWait`): at most RETRY_AFTER_RETRIES times, waiting at most MAX_WAIT_SECONDS or the
  read timeout, whichever is shorter. After that the error goes to the caller; its headers keep Retry-After
  (`retry_after`), which the handlers pass on to kopf as the retry's delay.
- **Liveness.** Each request is registered with `liveness` for as long as it lasts, with the longest it can
  take (`Timeouts.call_limit`); the whole answer is read inside that window.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import kubernetes
import urllib3

from . import liveness

DEFAULT_API_TIMEOUT = 30.0
MAX_CONNECT_SECONDS = 10.0
RETRY_AFTER_RETRIES = 2
MAX_WAIT_SECONDS = 10.0
CONNECT_RETRIES = READ_RETRIES = 1


@dataclass(frozen=True)
class Timeouts:
    """What bounds one request: `read` is --api-timeout, `connect` the same capped at MAX_CONNECT_SECONDS."""

    connect: float
    read: float

    @classmethod
    def of(cls, api_timeout: float = DEFAULT_API_TIMEOUT) -> Timeouts:
        return cls(connect=min(MAX_CONNECT_SECONDS, api_timeout), read=api_timeout)

    @property
    def max_wait(self) -> float:
        """The longest a Retry-After is waited for."""
        return min(MAX_WAIT_SECONDS, self.read)

    @property
    def attempt_limit(self) -> float:
        """One attempt, urllib3's retries included: every connect and every read at its timeout."""
        return (1 + CONNECT_RETRIES) * self.connect + (1 + READ_RETRIES) * self.read

    @property
    def call_limit(self) -> float:
        """The longest one call can take while the timeouts work (every attempt and every wait at its
        bound, plus one read timeout of slack): beyond it, the liveness probe reports the call as stuck."""
        return (1 + RETRY_AFTER_RETRIES) * self.attempt_limit + RETRY_AFTER_RETRIES * self.max_wait + self.read

    def pool_retries(self) -> urllib3.Retry:
        return urllib3.Retry(total=None, connect=CONNECT_RETRIES, read=READ_RETRIES, redirect=0, status=0,
                             other=0, raise_on_status=False)


def retry_after(status: int | None, header: str | None) -> float | None:
    """Seconds the API server asked to wait before trying again: a 429 or 5xx with an integer `Retry-After`
    (client-go reads seconds only), else None."""
    if status is None or not (status == 429 or status >= 500) or header is None:
        return None
    try:
        seconds = int(str(header).strip())
    except ValueError:
        return None
    return float(max(seconds, 0))


class ApiClient(kubernetes.client.ApiClient):
    """`kubernetes.client.ApiClient` with the bounds above on every call (all generated API methods go
    through `call_api`)."""

    def __init__(self, configuration: kubernetes.client.Configuration, timeouts: Timeouts):
        configuration.retries = timeouts.pool_retries()
        super().__init__(configuration)
        self.timeouts = timeouts

    def call_api(self, method: str, url: str, header_params: Any = None, body: Any = None, post_params: Any = None,
                 _request_timeout: Any = None) -> Any:
        timeout = _request_timeout or (self.timeouts.connect, self.timeouts.read)
        with liveness.activity(f"API {method} {urlsplit(url).path}", self.timeouts.call_limit):
            for attempt in range(RETRY_AFTER_RETRIES + 1):
                response = super().call_api(method, url, header_params, body, post_params, _request_timeout=timeout)
                response.read()  # the whole answer inside the watch (the generated code would read it later)
                wait = retry_after(response.status, response.getheader("Retry-After"))
                if wait is None or attempt == RETRY_AFTER_RETRIES:
                    return response
                time.sleep(min(wait, self.timeouts.max_wait))
        return response


def retry_after_of(exc: BaseException) -> float | None:
    """The Retry-After of an API error (after the client's own retries), if the server sent one."""
    if not isinstance(exc, kubernetes.client.ApiException):
        return None
    headers = exc.headers or {}
    return retry_after(exc.status, headers.get("Retry-After") if hasattr(headers, "get") else None)
