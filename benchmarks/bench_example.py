"""The README's default example end to end: its wall time, its start-up share and what it decided.

The target for `gpt2bench run manifests/examples/cpu-sweep.yaml` on a 2-core machine: at most 8 min of
wall time, and every scale decided: a winner, a pick within minEffect of the fastest, the only configuration
measured, or an unstable flag with its cause (docs/analysis.md). This script runs the
example as a user does (`gpt2bench run FILE --output DIR`, the fork server on unless GPT2BENCH_FORKSERVER=off) and
reads its results.json:

- wall time: the command's, start to exit (monotonic clock);
- start-up share: the runs' start-up per run summed over their job time summed (`overheadSeconds` over
  `jobSeconds`, docs/local.md), and the median start-up per run;
- the race: rounds run, configurations dropped, why it stopped, and each scale's decision with its verdict.

    python benchmarks/bench_example.py [--example FILE] [--output DIR]
    python benchmarks/bench_example.py --report DIR       # the table again, from DIR/results.json and DIR/wall.json

The measurement the docs quote: docs/results/cpu-sweep (results.json, wall.json, and this output as output.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpt2bench.report.markdown import scale_text
from gpt2bench.status import ResultsDocument

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "manifests" / "examples" / "cpu-sweep.yaml"
TARGET_WALL_SECONDS = 8 * 60
# a winner, the fastest-or-within-minEffect pick, the only one measured, or nothing to rank: two speeds flagged
DECIDED = ("clear", "equivalent", "only-candidate", "unstable")


def measure(example: Path, output: Path) -> dict:
    """Run the example; its wall time and the machine's load around it (also saved as OUTPUT/wall.json)."""
    gpt2bench = Path(sys.executable).parent / "gpt2bench"
    load = [os.getloadavg()[0]]
    started = time.monotonic()
    done = subprocess.run([str(gpt2bench), "run", str(example), "--output", str(output), "--overwrite"],
                          stdin=subprocess.DEVNULL, check=False)
    wall = {"seconds": time.monotonic() - started, "exit_code": done.returncode, "example": str(example),
            "load": [*load, os.getloadavg()[0]], "ended": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "forkserver": os.environ.get("GPT2BENCH_FORKSERVER", "on")}
    (output / "wall.json").write_text(json.dumps(wall, indent=1))
    return wall


def summary(document: ResultsDocument, wall: dict) -> dict:
    """The figures the table shows (a test checks them on a made-up results document)."""
    timed = [r for r in document.runs if r.job_seconds is not None and r.overhead_seconds is not None]
    fastest = [r for r in (document.analysis.recommendations if document.analysis else [])
               if r.objective == "fastest" and r.scale]
    return {
        "wall_seconds": wall["seconds"],
        "runs": len(document.runs),
        "succeeded": sum(r.phase == "Succeeded" for r in document.runs),
        "rounds_done": document.rounds_done,
        "stop_reason": document.stop_reason,
        "dropped": len(document.dropped or []),
        "startup_share": sum(r.overhead_seconds for r in timed) / sum(r.job_seconds for r in timed) if timed else None,
        "startup_median_seconds": statistics.median(r.overhead_seconds for r in timed) if timed else None,
        "scales": [{"scale": scale_text(r), "decision": r.decision, "verdict": r.verdict} for r in fastest],
        "decided_scales": sum(r.decision in DECIDED for r in fastest),
    }


def report(figures: dict, wall: dict) -> list[str]:
    minutes, seconds = divmod(round(figures["wall_seconds"]), 60)
    share, median = figures["startup_share"], figures["startup_median_seconds"]
    wall_ok = "ok" if figures["wall_seconds"] <= TARGET_WALL_SECONDS else "MISSED"
    decided_ok = "ok" if figures["scales"] and figures["decided_scales"] == len(figures["scales"]) else "MISSED"
    lines = [
        f"{wall['example']} (fork server {wall['forkserver']}), ended {wall['ended']}; load average "
        f"{wall['load'][0]:.2f} at the start, {wall['load'][1]:.2f} at the end; exit code {wall['exit_code']}",
        "",
        "| wall time | runs (succeeded) | rounds | dropped | stopped because | start-up share | start-up per run "
        "(median) |",
        "|---:|---:|---:|---:|---|---:|---:|",
        f"| {minutes} min {seconds:02d} s | {figures['runs']} ({figures['succeeded']}) | {figures['rounds_done']} | "
        f"{figures['dropped']} | {figures['stop_reason'] or '—'} | "
        f"{'—' if share is None else f'{share * 100:.0f} %'} | {'—' if median is None else f'{median:.2f} s'} |",
        "",
        "| scale | decision | verdict |",
        "|---|---|---|",
        *(f"| {row['scale']} | {row['decision']} | {row['verdict'] or '—'} |" for row in figures["scales"]),
        "",
        f"wall time <= {TARGET_WALL_SECONDS // 60} min: {wall_ok}; scales decided: {figures['decided_scales']} of "
        f"{len(figures['scales'])} (every one: {decided_ok})",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", type=Path, default=EXAMPLE)
    parser.add_argument("--output", type=Path, default=None, help="the sweep's results folder")
    parser.add_argument("--report", type=Path, default=None, help="print the table of a measured folder again")
    args = parser.parse_args()
    if args.report:
        folder, wall = args.report, json.loads((args.report / "wall.json").read_text())
    else:
        folder = args.output or Path(tempfile.mkdtemp(prefix="bench-example-"))
        folder.mkdir(parents=True, exist_ok=True)
        wall = measure(args.example, folder)
    document = ResultsDocument.model_validate_json((folder / "results.json").read_text())
    print("\n".join(report(summary(document, wall), wall)))


if __name__ == "__main__":
    main()
