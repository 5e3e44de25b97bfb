"""Write a results folder's report: results.json (with its analysis), results.csv, results.md and the PNGs."""

from __future__ import annotations

import os
from pathlib import Path

from gpt2bench.files import write_atomic
from gpt2bench.report.analysis import analyze
from gpt2bench.report.export import write_csv
from gpt2bench.report.markdown import results_markdown
from gpt2bench.report.plots import ALL_PLOTS, write_plots
from gpt2bench.report.steps import load_curves
from gpt2bench.status import RESULTS_JSON, ResultsDocument

RESULTS_MD = "results.md"


def write_report(doc: ResultsDocument, directory: str | os.PathLike) -> list[Path]:
    """Analyse `doc` (setting `doc.analysis`, with the loss curves of its steps files where it has them) and
    write every report file into `directory`; return the paths written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    curves = load_curves(doc, directory)
    doc.analysis = analyze(doc.runs, doc.spec, curves)
    doc.save(directory)
    csv_path = write_csv(doc, directory)
    plots, notes = write_plots(doc, curves, directory)
    for stale in set(ALL_PLOTS) - set(plots):  # from an earlier report of this folder
        (directory / stale).unlink(missing_ok=True)
    write_atomic(directory / RESULTS_MD, results_markdown(doc, plots, notes))
    return [directory / RESULTS_JSON, csv_path, directory / RESULTS_MD] + [directory / p for p in plots]
