"""What the operator's start-up no longer loads: the kubernetes client's CoreV1Api and NetworkingV1Api.

The operator reads pods, events and pod logs and creates ConfigMaps and NetworkPolicies by path
(`controller/kube.py`, `request`), on the same client, instead of through those two generated classes: loading
them (every method a pydantic `validate_call`) costs about a second of CPU in each operator process. This script
measures it side by side, in fresh processes taken in turn: the operator's modules alone, and the same with the
two classes loaded as the operator loaded them before.

    python benchmarks/bench_operator_imports.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

OPERATOR = "import gpt2bench.controller.main"
BEFORE = OPERATOR + "; import kubernetes.client as c; c.CoreV1Api; c.NetworkingV1Api"


def cpu_seconds(code: str) -> float:
    """User + system CPU of a fresh interpreter running `code`."""
    measure = ("import os; exec(compile(%r, '<bench>', 'exec')); t = os.times(); "
               "print(t.user + t.system)") % code
    done = subprocess.run([sys.executable, "-c", measure], capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    now, before = [], []
    for _ in range(args.repeats):  # in turn, so that the machine's drift touches both alike
        now.append(cpu_seconds(OPERATOR))
        before.append(cpu_seconds(BEFORE))
    for name, values in (("operator modules (now)", now), ("+ CoreV1Api, NetworkingV1Api (before)", before)):
        print(f"{name:40s} CPU s: min {min(values):.2f}  median {statistics.median(values):.2f}  "
              f"max {max(values):.2f}")
    print(f"saved per operator process: {statistics.median(before) - statistics.median(now):.2f} s of CPU "
          f"(median before / median now: {statistics.median(before) / statistics.median(now):.2f})")


if __name__ == "__main__":
    main()
