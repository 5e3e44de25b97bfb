"""What the network gives: an nccl-tests-like sweep of all-reduce, all-gather and reduce-scatter, run by the same
launcher on the same nodes as a benchmark's jobs, so a run's achieved bus bandwidth (`comm_bus_bandwidth` in its
summary) can be read against it.

Every rank times `--iters` collectives of each size after `--warmup` untimed ones (a barrier before each timed
batch; on GPU a synchronize after it). Columns as nccl-tests: size = bytes of the all-reduce buffer, or of the
full gathered / scattered tensor; time = the slowest rank's mean; algbw = size / time; busbw = algbw x 2(n-1)/n
(all-reduce) or x (n-1)/n (all-gather, reduce-scatter): the bytes each rank sends on a ring per second, the
figure that compares across rank counts (docs/metrics.md, Step breakdown). gloo on CPU tensors, and NCCL on the
rank's GPU when CUDA is available (`--backends`). Small defaults, quick on CPU:

    torchrun --nproc-per-node 2 benchmarks/bench_collectives.py [--min-bytes 1K] [--max-bytes 4M] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

KINDS = ("allreduce", "allgather", "reduce_scatter")
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_bytes(text: str) -> int:
    """`64K`, `4M`, `1G` or a plain number of bytes."""
    text = text.strip().upper()
    factor = UNITS.get(text[-1:], 1)
    try:
        value = int(text[:-1] if text[-1:] in UNITS else text) * factor
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a byte size: {text!r} (e.g. 4096, 64K, 4M)") from None
    if value < 4:
        raise argparse.ArgumentTypeError(f"size {text!r}: at least 4 bytes (one float32)")
    return value


def sizes(low: int, high: int, factor: int) -> list[int]:
    out, size = [], low
    while size <= high:
        out.append(size)
        size *= factor
    return out


def bus_factor(kind: str, ranks: int) -> float:
    return 2 * (ranks - 1) / ranks if kind == "allreduce" else (ranks - 1) / ranks


def collective(kind: str, nbytes: int, ranks: int, device: torch.device):
    """A callable running one `kind` of `nbytes` (nccl-tests' size), float32, on `device`."""
    numel = max(ranks, nbytes // 4 // ranks * ranks)  # divisible by the ranks for the sharded kinds
    full = torch.ones(numel, device=device)
    shard = torch.ones(numel // ranks, device=device)
    if kind == "allreduce":
        return lambda: dist.all_reduce(full)
    if kind == "allgather":
        return lambda: dist.all_gather_into_tensor(full, shard)
    return lambda: dist.reduce_scatter_tensor(shard, full)


def measure(kind: str, nbytes: int, device: torch.device, warmup: int, iters: int) -> dict:
    ranks = dist.get_world_size()
    run = collective(kind, nbytes, ranks, device)
    for _ in range(warmup):
        run()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    dist.barrier()
    started = time.perf_counter()
    for _ in range(iters):
        run()
    sync()
    seconds = torch.tensor([(time.perf_counter() - started) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # the slowest rank's time, as nccl-tests reports
    size = max(ranks, nbytes // 4 // ranks * ranks) * 4
    algbw = size / float(seconds)
    return {"kind": kind, "bytes": size, "seconds": float(seconds), "algbw": algbw,
            "busbw": algbw * bus_factor(kind, ranks), "ranks": ranks}


def sweep(backend: str, args) -> list[dict]:
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    try:
        rows = [dict(measure(kind, n, device, args.warmup, args.iters), backend=backend)
                for kind in args.kinds for n in sizes(args.min_bytes, args.max_bytes, args.factor)]
    finally:
        dist.destroy_process_group()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--min-bytes", type=parse_bytes, default=parse_bytes("1K"))
    parser.add_argument("--max-bytes", type=parse_bytes, default=parse_bytes("4M"))
    parser.add_argument("--factor", type=int, default=4, help="size multiplier between rows")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--backends", nargs="+", choices=["gloo", "nccl"],
                        default=["gloo", "nccl"] if torch.cuda.is_available() else ["gloo"])
    parser.add_argument("--json", help="also write the rows here (rank 0)")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        parser.error("run it under torchrun (or mpirun with the env:// variables): torchrun --nproc-per-node 2 ...")
    rows = [row for backend in args.backends for row in sweep(backend, args)]
    if int(os.environ["RANK"]) == 0:
        print(f"{'backend':>7} {'kind':>14} {'ranks':>5} {'size (B)':>12} {'time (us)':>11} {'algbw (GB/s)':>12} "
              f"{'busbw (GB/s)':>12}")
        for r in rows:
            print(f"{r['backend']:>7} {r['kind']:>14} {r['ranks']:>5} {r['bytes']:>12} {r['seconds'] * 1e6:>11.1f} "
                  f"{r['algbw'] / 1e9:>12.3f} {r['busbw'] / 1e9:>12.3f}")
        if args.json:
            with open(args.json, "w", encoding="utf-8") as out:
                json.dump(rows, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
