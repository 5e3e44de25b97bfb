"""Idle time between runs: one job's end → the next job's creation, against the API emulator.

The real `gpt2bench operator` process (its default --poll-interval, 30 s: the timer is only a safety net)
runs the CPU example's sweep (manifests/examples/cpu-sweep.yaml, 14 runs, one at a time); the script
plays the Kubeflow operators: it starts each job, writes its result pod, then its terminal condition, and
measures from just before that status write to the emulator's creation of the next job. Before the
operator watched its jobs (a 10 s timer only) this gap was 10.2 s at the median.

    python benchmarks/bench_run_gap.py [--sweeps 3] [--poll-interval 30] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from kube import EmulatedCluster  # noqa: E402
from kube.fixtures import Benchmarks, api_client, install_crds, wait_for  # noqa: E402
from kube.training import TrainingOperator, trainer_summary  # noqa: E402

EXAMPLE = REPO / "manifests" / "examples" / "cpu-sweep.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def created_at(cluster: EmulatedCluster, job: dict) -> float:
    name = job["metadata"]["name"]
    return cluster.call(lambda e: next(when for (res, _, n), when in e.created_at.items()
                                       if n == name and res.plural in ("pytorchjobs", "mpijobs")))


def sweep(cluster: EmulatedCluster, benchmarks: Benchmarks, trainer: TrainingOperator, name: str) -> list[float]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["name"] = name
    benchmarks.create(doc)
    total = wait_for(lambda: benchmarks.status(name).get("runsTotal"), 30, what="runsTotal")
    gaps, done, ended = [], set(), 0.0
    for i in range(total):
        job = wait_for(lambda: next((j for j in trainer.jobs(name) if j["metadata"]["name"] not in done), None), 120,
                       interval=0.02, what=f"job {i} of {name}")
        if i:
            gaps.append(created_at(cluster, job) - ended)
        trainer.start(job)
        summary = json.dumps(trainer_summary(job["metadata"]["name"], 1000.0 + i))
        trainer._result_pod(job, summary, 0, "")  # the pod first, as the Kubeflow operators' order has it
        ended = time.time()
        trainer._condition(job, ("Created", "True", "Created"), ("Succeeded", "True", "Succeeded"))
        done.add(job["metadata"]["name"])
    wait_for(lambda: benchmarks.status(name).get("phase") == "Succeeded", 60, what=f"{name} Succeeded")
    return gaps


def run(sweeps: int, poll: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp, EmulatedCluster(Path(tmp)) as cluster:
        install_crds(cluster)
        health = free_port()
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "OMP_NUM_THREADS": "1"}
        log = open(Path(tmp) / "operator.log", "w")
        operator = subprocess.Popen(
            [sys.executable, "-m", "gpt2bench", "operator", "--all-namespaces", "--poll-interval", str(poll),
             "--metrics-port", "0", "--liveness", f"http://127.0.0.1:{health}/healthz"],
            env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            def healthy() -> bool:
                try:
                    return urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=1).status == 200
                except OSError:
                    return False

            wait_for(healthy, 60, what="the operator's /healthz")
            client = api_client(cluster)
            benchmarks, trainer = Benchmarks(client), TrainingOperator(client)
            gaps: list[float] = []
            for i in range(sweeps):
                gaps += sweep(cluster, benchmarks, trainer, f"gap-{i}")
        finally:
            operator.send_signal(signal.SIGTERM)
            operator.wait(30)
            log.close()
    return {
        "gaps": len(gaps),
        "gap_p50_s": round(statistics.median(gaps), 3),
        "gap_p95_s": round(percentile(gaps, 95), 3),
        "gap_max_s": round(max(gaps), 3),
        "poll_interval_s": poll,
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def table(result: dict) -> str:
    rows = [
        ("run ends → next job created, p50", f"{result['gap_p50_s']:.3f} s", "target < 1 s: "
         + ("met" if result["gap_p50_s"] < 1 else "MISSED")),
        ("run ends → next job created, p95", f"{result['gap_p95_s']:.3f} s", ""),
        ("run ends → next job created, max", f"{result['gap_max_s']:.3f} s", ""),
        ("gaps measured", f"{result['gaps']}", "13 per CPU-example sweep"),
        ("operator --poll-interval", f"{result['poll_interval_s']:g} s", "safety net only"),
        ("machine", f"{result['cpus']} CPUs, load {result['load_avg_1m']}", ""),
    ]
    return "\n".join(["| measure | value | |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sweeps", type=int, default=3, help="CPU-example sweeps, one after the other (default 3)")
    parser.add_argument("--poll-interval", type=float, default=30.0, help="operator safety-net interval (default 30)")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.sweeps < 1:
        parser.error("--sweeps must be >= 1")
    result = run(args.sweeps, args.poll_interval)
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if result["gap_p50_s"] < 1 else 1


if __name__ == "__main__":
    sys.exit(main())
