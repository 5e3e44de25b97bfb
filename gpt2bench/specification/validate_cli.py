"""`gpt2bench validate FILE.yaml [--name NAME]`: check a file as `kubectl apply` and the operator would, run nothing.

The file is read as the API server reads YAML (gpt2bench.specification.documents) and each GPT2Benchmark in it (documents
separated by `---`) is validated as the operator validates it (gpt2bench.specification.validation). One line per benchmark
on stdout when all are valid; one line per problem on stderr otherwise, naming the file, the document (when
there are several), the field and the problem. Exit code: 0 valid, 2 not (or unreadable).
"""

from __future__ import annotations

import argparse
import sys

from gpt2bench.specification.validation import SpecError, load_benchmarks_file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpt2bench validate",
                                     description="Check a GPT2Benchmark YAML (every document of it) without running it.")
    parser.add_argument("file", help="GPT2Benchmark YAML: one or several documents separated by ---")
    parser.add_argument("--name", help="check only the GPT2Benchmark of this metadata.name")
    args = parser.parse_args(argv)
    try:
        benchmarks = load_benchmarks_file(args.file, args.name)
    except OSError as exc:
        print(f"gpt2bench validate: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except SpecError as exc:
        for line in exc.lines():
            print(f"gpt2bench validate: {line}", file=sys.stderr)
        return 2
    for benchmark in benchmarks:
        sweep = benchmark.spec.sweep
        print(f"{args.file}: {benchmark.name}: valid, {sweep.size} runs as written ({len(sweep.strategies)} strategies "
              f"x {len(sweep.precisions)} precisions x {len(sweep.scales)} scales x {sweep.rounds} rounds)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
