"""What the network gives: an nccl-tests-like sweep of all-reduce, all-gather and reduce-scatter, run by the same
launcher on the same nodes as a benchmark's jobs, so a run's achieved bus bandwidth (`comm_bus_bandwidth` in its
summary) can be read against it over a range of sizes. (Every ddp, fsdp and horovod run also probes its own
message sizes after training with the same code: summary `probe_bus_bandwidth`, trainer/collective_probe.py.)

Every rank times `--iters` collectives of each size after `--warmup` untimed ones (a barrier before each timed
batch; on GPU a synchronize after it): `collectives.time_collective`. Columns as nccl-tests: size = bytes of
the all-reduce buffer, or of the full gathered / scattered tensor; time = the slowest rank's mean; algbw =
size / time; busbw = algbw x 2(n-1)/n (all-reduce) or x (n-1)/n (all-gather, reduce-scatter): the bytes each
rank sends on a ring per second, the figure that compares across rank counts (docs/metrics.md, Step breakdown). gloo on CPU tensors, and NCCL on the
rank's GPU when CUDA is available (`--backends`). Small defaults, quick on CPU:

    torchrun --nproc-per-node 2 benchmarks/bench_collectives.py [--min-bytes 1K] [--max-bytes 4M] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

from gpt2bench.trainer.collective_probe import PROBED as KINDS
from gpt2bench.trainer.collective_probe import c10d_backend, time_collective

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


def sweep(backend_name: str, args) -> list[dict]:
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if backend_name == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend_name)
    try:
        backend = c10d_backend(device)
        timings = [time_collective(backend, kind, n, warmup=args.warmup, iters=args.iters)
                   for kind in args.kinds for n in sizes(args.min_bytes, args.max_bytes, args.factor)]
    finally:
        dist.destroy_process_group()
    return [{"kind": t.kind, "bytes": t.bytes, "seconds": t.seconds, "algbw": t.algbw, "busbw": t.busbw,
             "ranks": t.ranks, "backend": backend_name} for t in timings]


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
