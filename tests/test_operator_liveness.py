"""The operator's client bounds (operator/controller/apiclient.py) and its liveness probe (liveness.py), against
real sockets: a server that accepts connections and never answers, one that answers 429/503 with Retry-After.
The same faults against the whole operator process: tests/test_faults.py (section 8)."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Iterator

import kubernetes
import pytest
import urllib3

# not handlers: importing it fixes kopf's timer intervals for the process (KopfRunner tests)
from gpt2bench.controller import apiclient, liveness

pytestmark = pytest.mark.timeout(60)


def client(url: str, api_timeout: float) -> kubernetes.client.CustomObjectsApi:
    config = kubernetes.client.Configuration(host=url)
    return kubernetes.client.CustomObjectsApi(apiclient.ApiClient(config, apiclient.Timeouts.of(api_timeout)))


def get(api: kubernetes.client.CustomObjectsApi) -> object:
    return api.get_namespaced_custom_object("gpt2bench.io", "v1alpha1", "default", "gpt2benchmarks", "x")


@pytest.fixture
def silent_server() -> Iterator[tuple[str, list[socket.socket]]]:
    """Accepts connections and reads requests, never answers."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.recv(65536)
            accepted.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", accepted
    stop.set()
    thread.join(5)
    for conn in accepted:
        conn.close()
    listener.close()


def test_a_request_never_answered_ends_at_its_read_timeout_and_is_known_to_the_probe_meanwhile(silent_server):
    url, accepted = silent_server
    api, seen = client(url, api_timeout=0.5), []

    def watch() -> None:  # what the probe sees while the call waits
        while not accepted or len(seen) < 3:
            seen.append(liveness.report()["inFlight"])
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.monotonic()
    with pytest.raises(urllib3.exceptions.HTTPError):
        get(api)
    took = time.monotonic() - started
    watcher.join(5)
    timeouts = apiclient.Timeouts.of(0.5)
    # urllib3 reads once more on a new connection (a stale pooled one fails its first read), then gives up
    assert len(accepted) == 2 and 2 * 0.5 <= took < timeouts.attempt_limit + 0.5, took
    assert max(seen) >= 1 and liveness.report()["inFlight"] == 0


class Scripted(http.server.BaseHTTPRequestHandler):
    script: list[tuple[int, dict[str, str]]] = []
    seen: list[float] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        Scripted.seen.append(time.monotonic())
        code, headers = Scripted.script.pop(0) if Scripted.script else (200, {})
        body = b'{"kind": "GPT2Benchmark"}' if code == 200 else b'{"kind": "Status", "code": %d}' % code
        self.send_response(code)
        for key, value in {"Content-Type": "application/json", **headers}.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def scripted() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    Scripted.script, Scripted.seen = [], []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_429_with_retry_after_is_retried_after_that_long_and_succeeds(scripted):
    Scripted.script = [(429, {"Retry-After": "1"}), (503, {"Retry-After": "1"})]
    assert get(client(scripted, 30)) == {"kind": "GPT2Benchmark"}
    first, second, third = Scripted.seen
    assert second - first >= 1.0 and third - second >= 1.0


def test_retry_after_is_obeyed_a_bounded_number_of_times_then_given_to_the_caller(scripted):
    Scripted.script = [(429, {"Retry-After": "1"})] * (apiclient.RETRY_AFTER_RETRIES + 2)
    with pytest.raises(kubernetes.client.ApiException) as error:
        get(client(scripted, 30))
    assert len(Scripted.seen) == apiclient.RETRY_AFTER_RETRIES + 1
    assert apiclient.retry_after_of(error.value) == 1.0


@pytest.mark.parametrize(("code", "header"), [(503, None), (500, "soon"), (403, "1"), (409, "1")])
def test_without_a_usable_retry_after_an_error_goes_to_the_caller_at_once(scripted, code, header):
    Scripted.script = [(code, {"Retry-After": header} if header else {})]
    with pytest.raises(kubernetes.client.ApiException) as error:
        get(client(scripted, 30))
    assert error.value.status == code and len(Scripted.seen) == 1
    assert apiclient.retry_after_of(error.value) is None


def test_a_retry_after_longer_than_the_read_timeout_is_waited_only_that_long(scripted):
    """A call may not wait longer than it may read: the wait is capped (and the cap is in its bound)."""
    Scripted.script = [(429, {"Retry-After": "60"})]
    started = time.monotonic()
    get(client(scripted, 1))
    assert 1.0 <= time.monotonic() - started < 5


def test_a_calls_bound_covers_every_attempt_and_wait_at_its_timeout():
    timeouts = apiclient.Timeouts.of(30)
    assert (timeouts.connect, timeouts.read, timeouts.max_wait) == (10, 30, 10)
    attempts = apiclient.RETRY_AFTER_RETRIES + 1
    worst = attempts * ((1 + apiclient.CONNECT_RETRIES) * 10 + (1 + apiclient.READ_RETRIES) * 30) \
        + apiclient.RETRY_AFTER_RETRIES * 10
    assert worst < timeouts.call_limit <= worst + 30
    assert timeouts.call_limit == 290, "docs/operator.md quotes the default bound"


def test_the_probe_fails_naming_what_outlived_its_limit_and_passes_again_once_it_ends():
    with liveness.activity("API GET /slow", limit=0.05):
        time.sleep(0.1)
        with liveness.activity("poll default/x", limit=60):
            assert [a.what for a in liveness.stalled()] == ["API GET /slow"]
            with pytest.raises(liveness.Stalled, match=r"^no progress: API GET /slow running for 0 s \(limit 0 s\)$"):
                liveness.check()
            assert liveness.report()["inFlight"] == 2
    assert liveness.stalled() == [] and liveness.check() == {"inFlight": 0, "oldestSeconds": 0.0}
