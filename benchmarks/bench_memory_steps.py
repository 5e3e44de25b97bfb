"""A worker's memory at N and 10 N steps: does it grow with the number of steps?

Each count runs in a fresh Python process that drives the trainer's real `MetricsProcessor` as the loop does
(marks, the loss and grad-norm tensors left pending, a flush every 10 steps writing steps.jsonl), then builds what
worker 0 sends to the reporter at the end (its figures and curves' line, pickled as `gather_object` would) and
reports its resident set: VmRSS at the end and VmHWM (the peak; the step-peak reset that the trainer does through
/proc/self/clear_refs is left out here so that the peak covers the whole process). No model is trained: the
clock gives fixed step times, so a million steps take minutes, not days; what is measured is what the trainer
keeps per step, which does not depend on the model.

    python benchmarks/bench_memory_steps.py [--steps 20000] [--source DIR] [--json out.json]

`--source DIR` runs another version of the trainer: DIR holds a `gpt2bench` package with its `trainer` inside,
e.g. `git archive b0e9278 gpt2bench trainer | tar -x -C DIR && mv DIR/trainer DIR/gpt2bench/trainer` (the commit
before the records were streamed). Figures of both: docs/performance.md, Memory per step.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r'''
import json, pickle, sys, tempfile
import torch
import gpt2bench.trainer.metrics as metrics_module
from gpt2bench.trainer.config import TrainConfig
from gpt2bench.trainer.metrics import MetricsProcessor

steps, out = int(sys.argv[1]), sys.argv[2]

class Clock:  # marks 0.25 s apart
    now = 0.0
    def mark(self):
        self.now += 0.25
        return self.now
    def seconds(self, start, end):
        return end - start

class Memory:  # fixed peaks: no /proc/self/clear_refs write, so VmHWM stays the process's own peak
    host_since_start = False
    def reset(self):
        pass
    def read(self):
        return {"device_bytes": None, "device_reserved_bytes": None, "host_bytes": 1 << 30}

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

config = TrainConfig(process={"output": out}, training={"warmup_steps": 10, "steps": max(steps, 11)})
processor = MetricsProcessor(config=config, rank=0, tokens_per_step=4096, devices=2, device=torch.device("cpu"),
                             flops_per_token=1e6, peak_flops=None)
processor.clock, processor.memory = Clock(), Memory()
start_rss = status("VmRSS")
loss, norm = torch.tensor(3.0), torch.tensor(1.0)
for step in range(1, steps + 1):
    start = processor.start_step()
    processor.end_step(step, start, loss, norm, False, 3e-4, 0.001)
    if step % 10 == 0 or step == steps:
        processor.flush(lambda losses: losses)
if hasattr(processor, "finish"):  # folded as they come
    payload = processor.finish(devices=2)
else:  # every record kept, summarised at the end (the trainer before it folded them into running totals)
    from gpt2bench.trainer.summary import steps_line, summarize
    payload = {"records": processor.records, "figures": summarize(processor.records, 2),
               "line": steps_line(processor.records)}
sent = len(pickle.dumps(payload))
processor.close()
print(json.dumps({"steps": steps, "rss_start": start_rss, "rss_end": status("VmRSS"), "hwm": status("VmHWM"),
                  "payload_bytes": sent, "trainer": metrics_module.__file__}))
'''


def measure(steps: int, source: str | None) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if source:
        env["PYTHONPATH"] = source
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as folder:
        done = subprocess.run([sys.executable, "-c", CHILD, str(steps), folder], env=env, cwd=folder,
                              capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def mib(value: float) -> str:
    return f"{value / 2**20:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20_000, help="N: the first count (the second is 10 N)")
    parser.add_argument("--source", help="folder holding another version's gpt2bench package (see the docstring)")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args(argv)
    small, large = measure(args.steps, args.source), measure(10 * args.steps, args.source)
    print(f"trainer: {small['trainer']}")
    print(f"{'':<34}{'N = ' + format(small['steps'], ','):>16}{'10 N = ' + format(large['steps'], ','):>18}"
          f"{'10 N / N':>10}")
    for label, key in (("VmRSS at the end (MiB)", "rss_end"), ("VmHWM, the peak (MiB)", "hwm")):
        print(f"{label:<34}{mib(small[key]):>16}{mib(large[key]):>18}{large[key] / small[key]:>10.2f}")
    grown = [(r[key] - r["rss_start"]) for r in (small, large) for key in ("hwm",)]
    print(f"{'peak above the start (MiB)':<34}{mib(grown[0]):>16}{mib(grown[1]):>18}")
    print(f"{'bytes per step, N to 10 N':<34}{(large['hwm'] - small['hwm']) / (large['steps'] - small['steps']):>34.1f}")
    print(f"{'payload to the reporter (bytes)':<34}{small['payload_bytes']:>16,}{large['payload_bytes']:>18,}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"n": small, "10n": large}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
