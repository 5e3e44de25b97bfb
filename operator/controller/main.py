"""`gpt2bench operator`: run the kopf operator (the Helm chart's Deployment runs the same command).

    gpt2bench operator --all-namespaces --liveness http://0.0.0.0:8080/healthz --metrics-port 9090
    gpt2bench operator --namespace team-a --namespace team-b
    gpt2bench operator --trainer-image-gpu registry.example.com/gpt2bench:0.1.0-cuda

Equivalent: `kopf run -m gpt2bench.controller.handlers --all-namespaces` (metrics then come from
$GPT2BENCH_OPERATOR_METRICS_PORT, the API timeout from $GPT2BENCH_OPERATOR_API_TIMEOUT).
"""

from __future__ import annotations

import argparse
import importlib
import os

import kopf

from gpt2bench.protocol import TRAINER_IMAGE_CPU_ENV, TRAINER_IMAGE_GPU_ENV
from gpt2bench.spec.model import DEFAULT_GPU_IMAGE, DEFAULT_IMAGE, MIN_TTL_SECONDS

from .apiclient import DEFAULT_API_TIMEOUT, MAX_CONNECT_SECONDS

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
    kopf.run(
        standalone=True,  # one replica; no peering CRD needed
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness,
    )
    return 0
