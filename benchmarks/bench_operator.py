"""Operator benchmark: N GPT2Benchmarks created at once against the API emulator.

Measures, for the real `gpt2bench operator` process:
- CR-to-first-job latency: the emulator's clock at the GPT2Benchmark's creation → at its first job's
  creation (sub-millisecond, unlike creationTimestamp's whole seconds); p50/p95/max; target p95 < 1 s;
- the operator's peak RSS (VmHWM from /proc, the kernel's high-water mark); target < 150 MB.

    python benchmarks/bench_operator.py [--count 100] [--json out.json]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from kube import EmulatedCluster
from kube.fixtures import Benchmarks, api_client, benchmark, install_crds, wait_for

from gpt2bench.local.replicas import free_port


def peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc status")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def first_job_latencies(cluster: EmulatedCluster) -> dict[str, float]:
    def read(emulator):
        created: dict[str, float] = {}
        first_job: dict[str, float] = {}
        for (resource, _, name), when in emulator.created_at.items():
            if resource.plural == "gpt2benchmarks":
                created[name] = when
            elif resource.plural in ("pytorchjobs", "mpijobs"):
                owner = emulator.objects[resource, "default", name].raw["metadata"]["labels"]["gpt2bench.io/benchmark"]
                first_job[owner] = min(when, first_job.get(owner, when))
        return {name: first_job[name] - created[name] for name in created if name in first_job}

    return cluster.call(read)


def run(count: int, poll: float, settle: float, log_path: Path | None = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp, EmulatedCluster(Path(tmp)) as cluster:
        install_crds(cluster)
        metrics_port, health_port = free_port(), free_port()
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "OMP_NUM_THREADS": "1"}
        log = open(log_path or Path(tmp) / "operator.log", "w")
        operator = subprocess.Popen(
            [sys.executable, *os.environ.get("BENCH_PYTHON_ARGS", "").split(), "-m", "gpt2bench", "operator",
             "--all-namespaces", "--poll-interval", str(poll),
             "--metrics-port", str(metrics_port), "--liveness", f"http://127.0.0.1:{health_port}/healthz"],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            import urllib.request

            def healthy() -> bool:
                try:
                    return urllib.request.urlopen(f"http://127.0.0.1:{health_port}/healthz", timeout=1).status == 200
                except OSError:
                    return False

            wait_for(healthy, 60, what="the operator's /healthz")
            rss_idle = peak_rss_bytes(operator.pid)
            cpu_before = cpu_seconds(operator.pid)
            emulator_cpu_before = cluster.call(lambda _: time.thread_time())
            benchmarks = Benchmarks(api_client(cluster))
            names = [f"bench-{i:03d}" for i in range(count)]
            started = time.monotonic()
            with concurrent.futures.ThreadPoolExecutor(16) as pool:  # "at once": 16 clients in parallel
                list(pool.map(lambda n: benchmarks.create(benchmark(n, [{"name": "single"}, {"name": "ddp"}])), names))
            create_seconds = time.monotonic() - started
            wait_for(lambda: len(first_job_latencies(cluster)) == count, 180, interval=0.5,
                     what=f"a first job for each of the {count} benchmarks")
            all_jobs_seconds = time.monotonic() - started
            operator_cpu = cpu_seconds(operator.pid) - cpu_before
            emulator_cpu = cluster.call(lambda _: time.thread_time()) - emulator_cpu_before
            time.sleep(settle)  # let a few timer ticks run over all of them, for the RSS peak
            latencies = list(first_job_latencies(cluster).values())
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
            started_total = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                                if line.startswith("gpt2bench_operator_runs_started_total"))
            return {
                "count": count,
                "create_seconds": round(create_seconds, 3),
                "all_first_jobs_seconds": round(all_jobs_seconds, 3),
                "latency_p50_s": round(statistics.median(latencies), 3),
                "latency_p95_s": round(percentile(latencies, 95), 3),
                "latency_max_s": round(max(latencies), 3),
                "operator_rss_idle_mb": round(rss_idle / 2**20, 1),
                "operator_peak_rss_mb": round(peak_rss_bytes(operator.pid) / 2**20, 1),
                "runs_started_metric": started_total,
                "operator_cpu_ms_per_benchmark": round(1000 * operator_cpu / count, 1),
                "emulator_cpu_ms_per_benchmark": round(1000 * emulator_cpu / count, 1),
                "cpus": os.cpu_count(),
                "load_avg_1m": round(os.getloadavg()[0], 2),
            }
        finally:
            operator.send_signal(signal.SIGTERM)
            operator.wait(30)
            log.close()


def table(result: dict) -> str:
    rows = [
        ("GPT2Benchmarks created at once", f"{result['count']}", ""),
        ("time to create them (16 clients)", f"{result['create_seconds']:.2f} s", ""),
        ("time until every one has a job", f"{result['all_first_jobs_seconds']:.2f} s", ""),
        ("CR → first job, p50", f"{result['latency_p50_s']:.3f} s", ""),
        ("CR → first job, p95", f"{result['latency_p95_s']:.3f} s", "target < 1 s: "
         + ("met" if result["latency_p95_s"] < 1 else "MISSED")),
        ("CR → first job, max", f"{result['latency_max_s']:.3f} s", ""),
        ("operator RSS before the burst", f"{result['operator_rss_idle_mb']:.1f} MB", ""),
        ("operator peak RSS (VmHWM)", f"{result['operator_peak_rss_mb']:.1f} MB", "target < 150 MB: "
         + ("met" if result["operator_peak_rss_mb"] < 150 else "MISSED")),
        ("runs_started_total (operator metric)", f"{result['runs_started_metric']:.0f}", ""),
        ("operator CPU per benchmark (burst)", f"{result['operator_cpu_ms_per_benchmark']:.1f} ms", "all threads"),
        ("API emulator CPU per benchmark", f"{result['emulator_cpu_ms_per_benchmark']:.1f} ms", "same 2 CPUs"),
        ("machine", f"{result['cpus']} CPUs, load {result['load_avg_1m']}", ""),
    ]
    lines = ["| measure | value | |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100, help="GPT2Benchmarks to create at once (default 100)")
    parser.add_argument("--poll-interval", type=float, default=10.0, help="operator timer interval (default 10)")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds to keep running after the burst")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    parser.add_argument("--log", type=Path, help="keep the operator's log here")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error("--count must be >= 1")
    result = run(args.count, args.poll_interval, args.settle, args.log)
    print(table(result))
    if args.json:
        tmp = args.json.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=2))
        os.replace(tmp, args.json)
    return 0 if result["latency_p95_s"] < 1 and result["operator_peak_rss_mb"] < 150 else 1


if __name__ == "__main__":
    sys.exit(main())
