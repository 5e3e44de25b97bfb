"""The objectives' table (gpt2bench.objectives) is the one place an objective is defined: the status's enum, the
decisions and the docs agree with it, and an objective ranked per scale is decided by its row alone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic.alias_generators import to_camel

from gpt2bench.objectives import OBJECTIVE_NAMES, OBJECTIVE_TABLE, Objective, objective, per_scale
from gpt2bench.report.analysis import analyze, conclude_family, ranked_per_scale
from gpt2bench.report.measures import configurations
from gpt2bench.status import OBJECTIVES, Recommendation, RunResults, RunStatus

REPO = Path(__file__).resolve().parents[1]
COUNTS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}


def documented() -> tuple[str, list[list[str]]]:
    """docs/analysis.md's `## The <count> objectives`: its count word and its table's rows (cells stripped)."""
    text = (REPO / "docs" / "analysis.md").read_text(encoding="utf-8")
    found = re.search(r"^## The (\w+) objectives\n\n((?:\|.*\n)+)", text, re.MULTILINE)
    assert found, "docs/analysis.md has no `## The <count> objectives` section with its table"
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in found.group(2).splitlines()[2:]]
    return found.group(1), rows


def test_every_objective_has_its_docs_row_and_the_heading_counts_them():
    count, rows = documented()
    assert [row[0] for row in rows] == list(OBJECTIVE_NAMES), "docs/analysis.md's objectives are not the table's"
    assert COUNTS.get(count) == len(OBJECTIVE_TABLE), f"the heading says {count} objectives, the table has " \
                                                      f"{len(OBJECTIVE_TABLE)}"
    for (name, figure, better, unit), row in zip(rows, OBJECTIVE_TABLE, strict=True):
        said = f"`{to_camel(row.figure)}`" if row.figure in RunResults.model_fields else row.figure
        assert figure.startswith(said), f"{name}: the docs' figure {figure!r} is not {said}"
        assert better == ("higher" if row.higher_is_better else "lower"), name
        assert unit.strip("`").endswith(row.unit), f"{name}: the docs' unit {unit!r} is not {row.unit!r}"


def test_an_objective_ranked_per_scale_ranks_by_a_run_result():
    for row in per_scale():
        assert row.figure in RunResults.model_fields, f"{row.name} ranks by {row.figure}: no run result of that name"


def test_the_status_and_the_verdicts_take_the_objectives_from_the_table():
    assert OBJECTIVES == {row.name: row.wording for row in OBJECTIVE_TABLE}
    Recommendation(objective="leanest", decision="not-measurable")
    with pytest.raises(ValueError, match="objective"):
        Recommendation(objective="quickest", decision="not-measurable")
    with pytest.raises(KeyError, match="unknown objective 'quickest'; known: fastest, leanest"):
        objective("quickest")


def run(name: str, strategy: str, repeat: int, **figures) -> RunStatus:
    return RunStatus(name=f"{name}-r{repeat}", strategy=strategy, precision="fp32", nodes=1, devices_per_node=0,
                     processes_per_node=2, job_kind="PyTorchJob", job_name=name, devices=2, repeat=repeat,
                     phase="Succeeded", results=figures)


def test_a_per_scale_objective_ranks_by_the_figure_and_direction_its_row_names():
    """ddp is leaner, ps finishes sooner: a row ranking train_seconds picks ps where leanest picks ddp."""
    runs = [*(run("c-ddp-fp32-1x2", "ddp", k, peak_memory_bytes=1000 + k, train_seconds=90.0 + k) for k in (1, 2, 3)),
            *(run("c-ps-fp32-1x2", "ps", k, peak_memory_bytes=2000 + k, train_seconds=30.0 + k) for k in (1, 2, 3))]
    configs = configurations(runs)
    soonest = Objective("leanest", "train_seconds", False, "s", "the soonest done")
    (by_time,) = conclude_family(ranked_per_scale(soonest, configs))
    (by_memory,) = conclude_family(ranked_per_scale(objective("leanest"), configs))
    assert (by_time.run, by_time.unit, by_time.decision) == ("c-ps-fp32-1x2", "s", "clear")
    assert (by_memory.run, by_memory.unit) == ("c-ddp-fp32-1x2", "bytes")
    longest = Objective("leanest", "train_seconds", True, "s", "the longest")
    assert conclude_family(ranked_per_scale(longest, configs))[0].run == "c-ddp-fp32-1x2"
    leanest = [r for r in analyze(runs).recommendations if r.objective == "leanest"]
    assert [(r.run, r.verdict) for r in leanest] == [
        ("c-ddp-fp32-1x2", f"ddp fp32 is {objective('leanest').wording} (error rate ≤ 5 %)")]


def test_the_error_rate_sentence_names_every_objective_the_race_does_not_decide(monkeypatch):
    """What "(error rate ≤ 5 %)" covers is said from the table: a new objective is named there by its row alone."""
    from gpt2bench.report import verdicts

    assert "(the objectives leanest, cheapest across scales, scalable and efficient, and the papers' findings)" in \
        verdicts.explained()
    row = Objective("quietest", "step_time_p95_seconds", False, "s", "the quietest")
    monkeypatch.setattr(verdicts, "OBJECTIVE_TABLE", (*OBJECTIVE_TABLE, row))
    assert "scalable, efficient and quietest, and the papers' findings" in verdicts.explained()
    assert "fastest" not in verdicts.explained().split("The other decisions")[1]
