"""`gpt2bench operator`: run the kopf operator (the Helm chart's Deployment runs the same command).

    gpt2bench operator --all-namespaces --liveness http://0.0.0.0:8080/healthz --metrics-port 9090
    gpt2bench operator --namespace team-a --namespace team-b
    gpt2bench operator --trainer-image-gpu registry.example.com/gpt2bench:0.1.0-cuda
    gpt2bench operator --leader-elect --leader-election-namespace gpt2bench   # one active, the others stand by

Equivalent: `kopf run -m gpt2bench.controller.handlers --all-namespaces` (metrics then come from
$GPT2BENCH_OPERATOR_METRICS_PORT, the API timeout from $GPT2BENCH_OPERATOR_API_TIMEOUT).
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import importlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import kopf

from gpt2bench.conventions import TRAINER_IMAGE_CPU_ENV, TRAINER_IMAGE_GPU_ENV
from gpt2bench.specification.model import DEFAULT_GPU_IMAGE, DEFAULT_IMAGE, MIN_TTL_SECONDS

from .apiclient import DEFAULT_API_TIMEOUT, MAX_CONNECT_SECONDS
from .leader import DEFAULT_LEASE_SECONDS, MIN_LEASE_SECONDS

DEFAULT_POLL_SECONDS = 30
MAX_API_TIMEOUT = 300.0  # the liveness probe's limit on one call grows with it (apiclient.Timeouts.call_limit)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpt2bench operator", description=__doc__.split("\n\n")[0])
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", action="append", default=[], metavar="NS",
                       help="serve GPT2Benchmarks in this namespace (repeatable; globs allowed)")
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="serve the whole cluster (default)")
    parser.add_argument("--liveness", metavar="URL", default=None,
                        help="kopf's liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    parser.add_argument("--metrics-port", type=int, default=9090, metavar="PORT",
                        help="Prometheus /metrics port (0 = off; default 9090)")
    parser.add_argument("--poll-interval", type=float, default=None, metavar="SECONDS",
                        help=f"safety net: how often a running sweep is looked at without a job event "
                             f"(default {DEFAULT_POLL_SECONDS}, at most {MIN_TTL_SECONDS})")
    parser.add_argument("--api-timeout", type=float, default=None, metavar="SECONDS",
                        help=f"each Kubernetes API request's read timeout (connect: the same, at most "
                             f"{MAX_CONNECT_SECONDS:g}); the liveness probe's limits follow from it "
                             f"(default {DEFAULT_API_TIMEOUT:g})")
    parser.add_argument("--trainer-image-cpu", metavar="IMAGE", default=None,
                        help=f"trainer image of CPU runs whose GPT2Benchmark names none (default {DEFAULT_IMAGE})")
    parser.add_argument("--trainer-image-gpu", metavar="IMAGE", default=None,
                        help=f"trainer image of GPU runs whose GPT2Benchmark names none (default {DEFAULT_GPU_IMAGE})")
    parser.add_argument("--leader-elect", action="store_true",
                        help="run only while holding a Lease (coordination.k8s.io/v1): of several operators, one "
                             "is active and the others stand by (the Helm chart turns it on)")
    parser.add_argument("--leader-election-namespace", metavar="NS", default=None,
                        help="the Lease's namespace (default: $POD_NAMESPACE, else the pod's service account "
                             "namespace, else default)")
    parser.add_argument("--leader-election-id", metavar="NAME", default="gpt2bench-operator",
                        help="the Lease's name (default gpt2bench-operator)")
    parser.add_argument("--lease-seconds", type=float, default=DEFAULT_LEASE_SECONDS, metavar="SECONDS",
                        help=f"how long a Lease not renewed stays its holder's (default {DEFAULT_LEASE_SECONDS}, at "
                             f"least {MIN_LEASE_SECONDS}); the holder renews every 2/15 of it and gives up after 2/3")
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    args = parser.parse_args(argv)
    if args.metrics_port < 0 or args.metrics_port > 65535:
        parser.error(f"--metrics-port must be 0..65535, got {args.metrics_port}")
    if args.poll_interval is not None and not 0 < args.poll_interval <= MIN_TTL_SECONDS:
        parser.error(f"--poll-interval must be > 0 and at most {MIN_TTL_SECONDS} (the shortest "
                     f"runPolicy.ttlSecondsAfterFinished allowed: a finished job may be deleted that soon), "
                     f"got {args.poll_interval}")
    if args.api_timeout is not None and not 0 < args.api_timeout <= MAX_API_TIMEOUT:
        parser.error(f"--api-timeout must be > 0 and at most {MAX_API_TIMEOUT:g} s, got {args.api_timeout}")
    if args.lease_seconds < MIN_LEASE_SECONDS:
        parser.error(f"--lease-seconds must be at least {MIN_LEASE_SECONDS}, got {args.lease_seconds:g}")
    for flag, image in (("--trainer-image-cpu", args.trainer_image_cpu), ("--trainer-image-gpu", args.trainer_image_gpu)):
        if image is not None and (not image.strip() or any(c.isspace() for c in image)):
            parser.error(f"{flag} must be an image reference, got {image!r}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # The handlers read these when imported/started: kopf fixes timer intervals at registration.
    os.environ["GPT2BENCH_OPERATOR_METRICS_PORT"] = str(args.metrics_port)
    if args.poll_interval is not None:
        os.environ["GPT2BENCH_OPERATOR_POLL_SECONDS"] = str(args.poll_interval)
    if args.api_timeout is not None:
        os.environ["GPT2BENCH_OPERATOR_API_TIMEOUT"] = str(args.api_timeout)
    if args.trainer_image_cpu:
        os.environ[TRAINER_IMAGE_CPU_ENV] = args.trainer_image_cpu
    if args.trainer_image_gpu:
        os.environ[TRAINER_IMAGE_GPU_ENV] = args.trainer_image_gpu
    importlib.import_module("gpt2bench.controller.handlers")
    kopf.configure(verbose=args.verbose)
    elector = _lead(args) if args.leader_elect else None
    try:
        kopf.run(
            standalone=True,  # kopf's peering pauses every operator of equal priority: the Lease chooses one
            clusterwide=not args.namespace,
            namespaces=args.namespace,
            liveness_endpoint=args.liveness,
        )
    finally:
        if elector is not None:
            elector.release()
    return 0


def _lead(args: argparse.Namespace):
    """Wait until this operator holds the Lease (answering the liveness probe meanwhile: standing by is
    healthy), then keep renewing it; losing it ends the process."""
    from . import apiclient, kube, leader

    api_timeout = float(os.environ.get("GPT2BENCH_OPERATOR_API_TIMEOUT", DEFAULT_API_TIMEOUT))
    kube.configure(timeouts=apiclient.Timeouts.of(api_timeout))
    elector = leader.Elector(kube.leases(), _lease_namespace(args.leader_election_namespace),
                             args.leader_election_id, leader.identity(), leader.Timing.of(args.lease_seconds))
    with standby_health(args.liveness):
        elector.acquire()
    elector.keep(lost=leader.exit_now)
    return elector


SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def _lease_namespace(flag: str | None) -> str:
    if flag:
        return flag
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


@contextlib.contextmanager
def standby_health(url: str | None) -> Iterator[None]:
    """While standing by, the liveness URL answers 200 `{"standby": true}` (kopf serves it once leading)."""
    if not url:
        yield
        return
    where = urlsplit(url)

    class Standby(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = b'{"standby": true}' if self.path.split("?")[0] == (where.path or "/") else b""
            self.send_response(200 if body else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer((where.hostname or "0.0.0.0", where.port or 80), Standby)
    thread = threading.Thread(target=server.serve_forever, name="standby-health", daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
