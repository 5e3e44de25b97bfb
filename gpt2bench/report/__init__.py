"""The report: from a results document (a local folder's results.json, or a GPT2Benchmark's status) to the
answer of "which strategy, precision and scale?" and the papers' figures.

| module | job |
|---|---|
| `measures` | scales, configurations (a run and its repeats), mean and spread, cost, scaling efficiency |
| `analysis` | the recommendation per objective and scale (pure; the operator calls it for the CR status) |
| `findings` | the papers' claims checked on the measurements (pure) |
| `noise` | noise per scale and per far-noisier configuration, paired within rounds, intervals, Holm (pure) |
| `sequential` | repeat until decided: whether to add a round, or why the sweep stops (pure) |
| `table`, `markdown` | the runs table (terminal and results.md) and results.md |
| `plots` | the PNGs (matplotlib) |
| `export` | results.csv |
| `steps` | reading a local run's steps.jsonl |
| `build` | `write_report`: every file of a results folder |
| `cluster` | reading a GPT2Benchmark through the kubernetes client |
| `cli`, `compare` | `gpt2bench report`, `gpt2bench compare` |

Definitions of every figure: docs/metrics.md (the trainer's) and docs/analysis.md (the report's).
"""

from gpt2bench.report.build import RESULTS_MD, write_report
from gpt2bench.report.terminal import print_table

__all__ = ["RESULTS_MD", "print_table", "write_report"]
