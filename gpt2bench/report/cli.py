"""`gpt2bench report`: rebuild a results folder's report, or build one from a cluster's GPT2Benchmark.

    gpt2bench report DIR                                     # results.json -> analysis, .csv, .md, PNGs
    gpt2bench report --cluster NAME [-n NS] [--output DIR]   # the same from a GPT2Benchmark's status

Per-step curves (loss, grad norm) come from the runs' steps.jsonl: a local run keeps the trainer's file; on a
cluster the operator keeps each run's curves in a ConfigMap `<run>-steps`, which `--cluster` writes to
DIR/steps/<run>.jsonl (a run without one gets the bar charts only, and the report says why).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpt2bench.files import DiskFull, describe_disk, disk_full
from gpt2bench.status import RESULTS_JSON, ResultsDocument, interrupted_note, settle_abandoned

EXIT_DISK_FULL = 3  # as `gpt2bench run`'s (docs/local.md)


class DocumentError(ValueError):
    """A results folder that cannot be read; the message is one line naming the file and what is wrong."""


def load_folder(directory: Path) -> ResultsDocument:
    """DIR/results.json as a ResultsDocument, or DocumentError saying why not."""
    import pydantic

    path = directory / RESULTS_JSON
    try:  # a sweep left Running by a killed `gpt2bench run` reads as interrupted
        return settle_abandoned(ResultsDocument.load(directory), directory)
    except FileNotFoundError:
        raise DocumentError(f"{path} does not exist") from None
    except OSError as exc:
        raise DocumentError(f"cannot read {path}: {exc.strerror or exc}") from None
    except pydantic.ValidationError as exc:  # before ValueError: it is one
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"]) or "(document)"
        raise DocumentError(f"{path} is not a results document: {where}: {error['msg']}") from None
    except ValueError as exc:
        raise DocumentError(f"{path} is not valid JSON: {exc}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpt2bench report",
        description="Rebuild the analysis, results.csv, results.md and the PNG plots from DIR/results.json, or "
        "from a GPT2Benchmark's status in a cluster (--cluster NAME).",
    )
    parser.add_argument("dir", nargs="?", help="a folder written by `gpt2bench run` (holds results.json)")
    parser.add_argument("--cluster", metavar="NAME", help="read the GPT2Benchmark NAME from the cluster instead")
    parser.add_argument("-n", "--namespace", help="namespace of --cluster NAME (default: kubeconfig's, else default)")
    parser.add_argument("--context", help="kubeconfig context for --cluster")
    parser.add_argument("--output", "-o", help="where --cluster writes the report (default: results/NAME-cluster)")
    parser.add_argument("--quiet", "-q", action="store_true", help="do not print the table")
    return parser


def main(argv: list[str] | None = None) -> int:
    from gpt2bench.report import print_table, write_report
    from gpt2bench.report.cluster import ClusterReadError, fetch_cluster_doc, write_cluster_steps

    parser = build_parser()
    args = parser.parse_args(argv)
    if bool(args.dir) == bool(args.cluster):
        parser.print_usage(sys.stderr)
        print("gpt2bench report: give either DIR or --cluster NAME (not both)", file=sys.stderr)
        return 2
    if args.cluster:
        try:
            doc, steps = fetch_cluster_doc(args.cluster, args.namespace, args.context)
        except ClusterReadError as exc:
            print(f"gpt2bench report: --cluster: {exc}", file=sys.stderr)
            return 1
        directory = Path(args.output or Path("results") / f"{args.cluster}-cluster")
        write_cluster_steps(doc, steps, directory)
    else:
        if args.output:
            print("gpt2bench report: --output applies to --cluster only (DIR is rebuilt in place)", file=sys.stderr)
            return 2
        directory = Path(args.dir)
        try:
            doc = load_folder(directory)
        except DocumentError as exc:
            print(f"gpt2bench report: DIR: {exc}", file=sys.stderr)
            return 2
    try:
        written = write_report(doc, directory)
    except OSError as exc:
        if not disk_full(exc):
            raise
        words = str(exc) if isinstance(exc, DiskFull) else \
            f"{exc.strerror or exc} writing in {directory}: {describe_disk(directory)} is full"
        print(f"gpt2bench report: {words}; the report is incomplete ({directory / RESULTS_JSON} is whole: it is "
              f"written whole or not at all). Free space on that disk and run gpt2bench report again",
              file=sys.stderr)
        return EXIT_DISK_FULL
    if not args.quiet:
        print_table(doc)
    print("wrote " + ", ".join(str(p) for p in written))
    note = None if args.cluster else interrupted_note(doc, directory)
    if note:
        print(f"gpt2bench report: {note}", file=sys.stderr)
    return 0
