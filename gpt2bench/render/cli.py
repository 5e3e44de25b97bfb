"""`gpt2bench render FILE.yaml`: print the Kubeflow jobs a GPT2Benchmark becomes (dry run, GitOps)."""

from __future__ import annotations

import argparse
import sys

from gpt2bench.render import dump_jobs, render_all
from gpt2bench.spec import SpecError, load_benchmark_file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpt2bench render", description="Print the Kubeflow jobs a GPT2Benchmark YAML becomes.")
    parser.add_argument("file", help="GPT2Benchmark YAML")
    parser.add_argument("-n", "--namespace", help="namespace of the jobs (default: the resource's, else default)")
    args = parser.parse_args(argv)
    try:
        benchmark = load_benchmark_file(args.file)
    except OSError as exc:
        print(f"gpt2bench render: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except SpecError as exc:
        for path, message in exc.errors:
            print(f"gpt2bench render: {args.file}: {path}: {message}", file=sys.stderr)
        return 2
    if args.namespace:
        benchmark = benchmark.model_copy(update={"namespace": args.namespace})
    sys.stdout.write(dump_jobs(render_all(benchmark)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
