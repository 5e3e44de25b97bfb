"""Is the parameter server worth comparing? Sync `ps` with one worker against `single`, side by side.

In one run of this script, over the same model, batch, precision and steps, two real `gpt2bench train` jobs
alternate `--repeats` times in rotating order:
  single  one process (`--strategy single`);
  ps      one server and one worker (`torchrun --nproc-per-node 2 ... --strategy ps --ps-servers 1 --ps-mode
          sync`): the worker computes gradients and sends them, the server runs AdamW and sends parameters back.
Each job's tokens/s is its summary's (tokens of the measured steps over their time, warm-up left out); the
best of each is kept, so that other load on the machine hurts both alike. Target: ps / single
>= 0.8 on a GPU, where the server keeps parameters and AdamW on the GPU by default. On CPU the server runs
AdamW on its own core and the ratio says what the messages cost on that machine, not what a GPU sees.

    python benchmarks/bench_ps.py --device cuda --model gpt2 --precision bf16 --micro-batch-size 16 --seq-len 1024
    OMP_NUM_THREADS=1 python benchmarks/bench_ps.py --device cpu --model tiny --seq-len 128 --micro-batch-size 4
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from gpt2bench.local.replicas import free_port


def trainer_argv(job: str, args: argparse.Namespace, output: Path) -> list[str]:
    """The job's command line; its `gpt2bench train` flags come from TrainConfig, as a rendered job's do."""
    from gpt2bench.trainer.config import TrainConfig

    executable = shutil.which("gpt2bench") or sys.exit("bench_ps: the gpt2bench command is not on PATH")
    strategy = {"name": "single"} if job == "single" else {"name": "ps", "ps_servers": 1, "ps_mode": "sync"}
    flags = TrainConfig(
        strategy=strategy, precision=args.precision, model={"preset": args.model},
        data={"max_documents": args.max_documents},
        training={"seq_len": args.seq_len, "micro_batch_size": args.micro_batch_size,
                  "steps": args.warmup + args.steps, "warmup_steps": args.warmup},
        process={"device": args.device, "output": str(output), "log_every": args.steps},
    ).to_argv()
    if job == "single":
        return [executable, "train", *flags]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
            "--master-port", str(free_port()), "--no-python", "--", executable, "train", *flags]


def run_job(job: str, args: argparse.Namespace, workdir: Path) -> dict:
    output = workdir / job
    shutil.rmtree(output, ignore_errors=True)
    done = subprocess.run(trainer_argv(job, args, output), capture_output=True, text=True, timeout=args.timeout)
    summary_file = output / "summary.json"
    if done.returncode != 0 or not summary_file.exists():
        sys.exit(f"bench_ps: {job} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(summary_file.read_text())


def best_ratio(rates: dict[str, list[float]]) -> float:
    """ps over single from every job's tokens/s: the best of each (other load only ever slows a job)."""
    return max(rates["ps"]) / max(rates["single"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10, help="measured steps per job")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up steps per job (not measured)")
    parser.add_argument("--repeats", type=int, default=3, help="alternated jobs of each kind")
    parser.add_argument("--max-documents", type=int, default=40)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one job may take")
    args = parser.parse_args(argv)

    rates: dict[str, list[float]] = {"single": [], "ps": []}
    last: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as workdir:
        for repeat in range(args.repeats):
            for job in (["single", "ps"] if repeat % 2 == 0 else ["ps", "single"]):  # alternate who goes first
                last[job] = run_job(job, args, Path(workdir))
                rates[job].append(last[job]["tokens_per_second"])

    best = {job: max(values) for job, values in rates.items()}
    ratio = best_ratio(rates)
    single, ps = last["single"], last["ps"]
    print(f"device {single.get('device_name') or args.device} | model {args.model} ({single['n_params'] / 1e6:.2f} M "
          f"params) | precision {args.precision} | batch {args.micro_batch_size}x{args.seq_len} | best of "
          f"{args.repeats} alternated jobs of {args.steps} measured steps after {args.warmup} warm-up | torch "
          f"{single['versions']['torch']} | ps server on {ps.get('ps_server_device')} "
          f"(threads {ps.get('ps_server_threads')}) | load average {os.getloadavg()[0]:.2f}")
    print("| job | tokens/s (best) | every job | vs single |\n|---|---|---|---|")
    for job in ("single", "ps"):
        every = ", ".join(f"{value:,.0f}" for value in rates[job])
        print(f"| {job} | {best[job]:,.0f} | {every} | {best[job] / best['single']:.3f}x |")
    verdict = "ok" if ratio >= 0.8 else "MISSED"
    print(f"sync ps (1 server + 1 worker) / single: {ratio:.3f}x (target >= 0.8 on a GPU: {verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
