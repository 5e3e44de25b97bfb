"""The results on a terminal: the runs table (rich, or the markdown rows where rich would squeeze them), the
configurations' means, and the recommendation's lines. It sits on top of table.py (cells) and markdown.py
(the recommendation's wording), so that neither of those imports the other.
"""

from __future__ import annotations

from typing import Any

from gpt2bench.report.markdown import recommendation_lines
from gpt2bench.report.measures import configuration_name, configurations
from gpt2bench.report.table import (
    COLUMNS,
    TEXT_COLUMNS,
    configurations_markdown,
    repeated,
    results_table_markdown,
    table_rows,
)
from gpt2bench.status import ResultsDocument


def print_table(doc: ResultsDocument, console: Any = None) -> None:
    """The runs table on the terminal (rich), same cells as results.md; plain markdown when not a terminal
    (logs, CI) or when the terminal is too narrow, where a rich table would squeeze every cell. Then the
    recommendation (and, with repeats, the configurations' means)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=f"GPT2Benchmark {doc.benchmark or '?'} ({doc.phase})")
    for header, _ in COLUMNS:
        if header == "status":
            table.add_column(header, overflow="fold", max_width=60)
        else:
            table.add_column(header, justify="left" if header in TEXT_COLUMNS else "right", no_wrap=True)
    # highlighted only when the noise allows a winner
    recommended = doc.analysis.recommended.winner if doc.analysis and doc.analysis.recommended else None
    rows = table_rows(doc)
    for entry, row in zip(doc.runs, rows):
        table.add_row(*row, style="bold green" if configuration_name(entry) == recommended else None)
    widths = [max([len(header)] + [len(row[i]) for row in rows]) for i, (header, _) in enumerate(COLUMNS)]
    widths[-1] = min(widths[-1], 60)  # long reasons fold inside the status column
    plain = {"markup": False, "highlight": False, "soft_wrap": True}
    if console.is_terminal and sum(widths) + 3 * len(widths) + 1 <= console.width:
        console.print(table)
    else:  # a log, or a terminal too narrow for every column: the markdown rows, unwrapped
        console.print(results_table_markdown(doc), end="", **plain)
    if repeated(doc):
        console.print("\n" + configurations_markdown(configurations(doc.runs)), end="", **plain)
    if doc.analysis:
        console.print("\n" + "\n".join(recommendation_lines(doc.analysis)), **plain)
