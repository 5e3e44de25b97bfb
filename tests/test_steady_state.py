"""Steady state (docs/analysis.md): each run's measured steps, second half against first, in the trainer's
summary and in the report; worked out by hand."""

from __future__ import annotations

import math

import pytest

from gpt2bench.report import write_report
from gpt2bench.report.measures import unsteady
from gpt2bench.status import ResultsDocument, RunStatus
from gpt2bench.trainer.stationarity import halves_ratio
from gpt2bench.trainer.summary import summarize

T975_2 = 4.302653  # t(0.975, 2), from tables


def test_the_halves_ratio_is_of_geometric_means_with_a_welch_interval():
    # halves (1.0, 1.2) and (1.1, 1.32): the second is 1.1 x the first, with the same spread (ln 1.2 apart)
    found = halves_ratio([1.0, 1.2, 1.1, 1.32])
    variance = math.log(1.2) ** 2 / 2  # sample variance of two logs d apart: d² / 2
    se = math.sqrt(variance / 2 + variance / 2)  # equal variances and halves of 2: Welch's df = 2
    assert found["step_time_halves_ratio"] == pytest.approx(1.1)
    assert found["step_time_halves_low"] == pytest.approx(1.1 * math.exp(-T975_2 * se), rel=1e-6)
    assert found["step_time_halves_high"] == pytest.approx(1.1 * math.exp(T975_2 * se), rel=1e-6)
    odd = halves_ratio([2.0, 2.0, 9.0, 1.0, 1.0])  # the middle step is left out
    assert odd["step_time_halves_ratio"] == pytest.approx(0.5) and odd["step_time_halves_low"] == pytest.approx(0.5)
    assert halves_ratio([1.0, 1.0, 1.0])["step_time_halves_ratio"] is None  # too few steps to halve


def test_the_trainers_summary_carries_it_over_the_measured_steps_only():
    records = [{"step": s, "warmup": s <= 2, "step_seconds": t, "tokens": 100, "data_loading_seconds": 0.0,
                "loss": 10.0 - s / 10} for s, t in enumerate([9.0, 9.0, 1.2, 1.2, 1.0, 1.0], start=1)]
    summary = summarize(records, devices=1)
    assert summary["step_time_halves_ratio"] == pytest.approx(1.0 / 1.2)  # warm-up's 9 s steps left out
    assert summary["first_loss"] == pytest.approx(9.9)


def _run(name: str, ratio: float, low: float, high: float) -> RunStatus:
    return RunStatus(name=name, strategy="ddp", precision="fp32", nodes=1, devices_per_node=0, processes_per_node=2,
                     job_kind="PyTorchJob", job_name=name, devices=2, phase="Succeeded",
                     results={"tokens_per_second": 100.0, "step_time_halves_ratio": ratio,
                              "step_time_halves_low": low, "step_time_halves_high": high})


def test_a_run_still_getting_faster_beyond_its_noise_is_flagged_and_listed_in_the_report(tmp_path):
    warming = _run("w-ddp-fp32-1x2", 0.80, 0.70, 0.90)  # 20 % faster in its second half, beyond the noise
    assert unsteady(warming).startswith("still warming up") and "-20%" in unsteady(warming)
    assert unsteady(_run("a", 0.97, 0.93, 0.99)) is None  # beyond the noise but under 5 %: steady enough
    assert unsteady(_run("b", 0.80, 0.60, 1.05)) is None  # within its own noise
    assert unsteady(_run("c", 1.10, 1.05, 1.15)).startswith("slowing down")
    doc = ResultsDocument(benchmark="w", runs=[warming.model_dump(), _run("s-fsdp-fp32-1x2", 1.0, 0.98, 1.02)
                                               .model_dump() | {"strategy": "fsdp"}], phase="Succeeded")
    write_report(doc, tmp_path)
    markdown = (tmp_path / "results.md").read_text()
    assert "1 of 2 runs were not steady" in markdown and "| w-ddp-fp32-1x2 | still warming up" in markdown
    assert "s-fsdp-fp32-1x2 | still" not in markdown
