"""The figures the docs quote come from committed results (docs/results/*): each generated section is what
scripts/docs_results.py writes from its folder, and every figure in it is in that folder's files."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("docs_results", REPO / "scripts" / "docs_results.py")
docs_results = importlib.util.module_from_spec(spec)
spec.loader.exec_module(docs_results)

SECTIONS = [(path, match) for path in docs_results.DOCS
            for match in docs_results.SECTION.finditer(path.read_text(encoding="utf-8"))]
NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?%?")


def figures(text: str) -> list[str]:
    """The figures of a text: numbers with two digits or more, a decimal point or a percent sign (a single digit
    is a count or a list marker: "2 repeats", "1×2")."""
    return [f for f in NUMBER.findall(text) if len(re.sub(r"\D", "", f)) >= 2 or "." in f or "%" in f]


def sections_of(name: str) -> list[tuple[str, str | None]]:
    return [(m["folder"], m["kind"]) for p, m in SECTIONS if p == REPO / name]


def test_the_readme_and_the_default_run_page_quote_the_default_sweep_from_committed_results():
    """The README quotes the decisions (an excerpt); docs/default-run.md, which it links, the whole summary."""
    assert sections_of("README.md") == [("docs/results/cpu-sweep", ":excerpt")]
    assert sections_of("docs/default-run.md") == [("docs/results/cpu-sweep", None)]
    assert "](docs/default-run.md)" in (REPO / "README.md").read_text(encoding="utf-8")
    folder = REPO / "docs" / "results" / "cpu-sweep"
    assert {"results.json", "results.md", "MACHINE.md"} <= {p.name for p in folder.iterdir()}


def test_the_readmes_excerpt_says_what_the_summary_decided():
    """The excerpt's headline and each scale's decision are the summary's own lines, word for word."""
    (excerpt,) = [m["body"] for p, m in SECTIONS if p.name == "README.md"]
    (summary,) = [m["body"] for p, m in SECTIONS if p.name == "default-run.md"]
    decisions = [line for line in excerpt.splitlines() if line.startswith(("**", "- "))]
    assert len(decisions) >= 2 and all(line in summary.splitlines() for line in decisions), decisions


@pytest.mark.parametrize(("path", "match"), SECTIONS, ids=[f"{p.name}:{m['folder']}{m['kind'] or ''}"
                                                           for p, m in SECTIONS])
def test_each_section_is_what_its_results_give_and_every_figure_is_in_them(path, match):
    head = match.group(0).split("\n", 1)[0]
    doc, machine = docs_results.load(REPO / match["folder"])
    assert match["body"] == docs_results.KINDS[match["kind"]](doc, machine), (
        f"{path.name}: {match['folder']} is stale: python scripts/docs_results.py --write")
    folder = REPO / match["folder"]
    held = "\n".join((folder / name).read_text(encoding="utf-8") for name in ("results.md", "MACHINE.md"))
    missing = [f for f in figures(match["body"]) if f not in held]
    assert not missing, f"{path.name} quotes figures {match['folder']} does not hold: {missing} ({head})"


def test_a_figure_that_is_not_in_the_results_is_caught(tmp_path):
    """The checker itself: a hand-edited number is not in the folder's files."""
    match = next(m for p, m in SECTIONS if p.name == "README.md")
    folder = REPO / match["folder"]
    held = (folder / "results.md").read_text(encoding="utf-8") + (folder / "MACHINE.md").read_text(encoding="utf-8")
    assert "12,345,678" not in held and figures("ran 12,345,678 tokens/s on 1×2 CPU, +3.5%") == ["12,345,678", "3.5%"]


PERFORMANCE = REPO / "docs" / "performance.md"
ANALYSIS = REPO / "docs" / "analysis.md"  # the selection race's calibration table
# A benchmark's table in performance.md or analysis.md: its section links the benchmark's printed output, committed
# beside its results (docs/results/NAME/output.md).
BENCHMARK_SECTION = re.compile(r"\]\(results/(?P<folder>[\w.-]+)/output\.md\)(?P<body>.*?)(?=^## |\Z)", re.S | re.M)


def table_figures(text: str) -> list[str]:
    return [f for line in text.splitlines() if line.startswith("|") for f in figures(line)]


@pytest.mark.parametrize("match", [m for doc in (PERFORMANCE, ANALYSIS)
                                   for m in BENCHMARK_SECTION.finditer(doc.read_text(encoding="utf-8"))],
                         ids=lambda m: m["folder"])
def test_every_figure_of_a_benchmark_table_is_in_its_committed_output(match):
    output = (REPO / "docs" / "results" / match["folder"] / "output.md").read_text(encoding="utf-8")
    quoted = table_figures(match["body"])
    assert quoted, "the section quotes a table"
    assert [f for f in quoted if f not in output] == []


def test_a_benchmark_figure_missing_from_its_output_is_caught():
    assert table_figures("| ddp | 1,805 | 0.73 [0.66, 0.81] |\n|---|---:|---|\nprose 9.99\n") == [
        "1,805", "0.73", "0.66", "0.81"]
    output = (REPO / "docs" / "results" / "bench-horovod-cpu" / "output.md").read_text(encoding="utf-8")
    assert "0.74" not in output  # a ratio it does not hold would be reported


RELIABILITY = REPO / "docs" / "reliability.md"
FAULTS = REPO / "docs" / "results" / "faults"


def test_every_figure_of_the_fault_tables_is_in_the_committed_fault_run():
    """docs/reliability.md's tables quote one run of the fault suite, committed beside them (figures.json, as
    tests/fault_figures.py writes it, and MACHINE.md): a figure edited by hand, or left from another run, fails."""
    held = (FAULTS / "figures.json").read_text(encoding="utf-8") + (FAULTS / "MACHINE.md").read_text(encoding="utf-8")
    text = RELIABILITY.read_text(encoding="utf-8")
    assert "](results/faults/figures.json)" in text, "the page links the run it quotes"
    quoted = table_figures(text)
    assert len(quoted) > 50, "the fault tables quote their figures"
    assert [f for f in quoted if f not in held] == []


def test_the_fault_run_holds_every_fault_row_and_a_measured_figure_missing_from_it_is_caught():
    import json

    figures = json.loads((FAULTS / "figures.json").read_text(encoding="utf-8"))
    assert {"list-404", "round-added-write-fails", "two-operators", "benchmark-deleted-no-operator",
            "worker-oomkilled-same-second", "local-replicas-same-poll", "same-words-horovod-rank-fails",
            "fifty-benchmarks", "sigkill", "api-errors"} <= set(figures)
    assert figures["fifty-benchmarks"]["operator_rss_peak_mib"] < figures["fifty-benchmarks"]["chart_limit_mib"]
    held = (FAULTS / "figures.json").read_text(encoding="utf-8")
    assert "179.6" not in held and table_figures("| 50 benchmarks | 179.6 MiB |") == ["50", "179.6"]
