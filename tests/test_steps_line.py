"""The per-step curves' line (GPT2BENCH_STEPS): written by the trainer, read back by the operator from a pod's
log. Bounded in size, tolerant of garbage, the same records either way."""

from __future__ import annotations

import base64
import gzip
import json
import math

import pytest

from gpt2bench.collect import decode_steps, find_steps, steps_jsonl
from gpt2bench.conventions import MAX_STEPS_JSON, MAX_STEPS_LINE, STEPS_COLUMNS, STEPS_PREFIX
from gpt2bench.trainer.summary import publish_steps, steps_line


def records(n: int) -> list[dict]:
    return [{"step": i + 1, "warmup": i < 2, "loss": 10.0 / (i + 1) + 1 / 3, "grad_norm": 1.5 + i / 7, "lr": 3e-4,
             "step_seconds": 0.2 + i / 1e4, "tokens_per_second": 40960.123456 - i, "tokens": 8192, "mfu": None}
            for i in range(n)]


def test_the_line_round_trips_the_curves_columns_to_six_digits():
    original = records(200)
    line = steps_line(original)
    assert line.startswith(STEPS_PREFIX) and len(line) <= MAX_STEPS_LINE
    back = find_steps(f"rank0 INFO step 200\n[1,0]<stdout>:{line}\nGPT2BENCH_SUMMARY {{}}\n")
    assert [r["step"] for r in back] == list(range(1, 201))
    assert set(back[0]) == set(STEPS_COLUMNS)
    for a, b in zip(original, back, strict=True):
        assert b["warmup"] == a["warmup"]
        assert math.isclose(b["loss"], a["loss"], rel_tol=1e-5) and math.isclose(b["grad_norm"], a["grad_norm"],
                                                                                  rel_tol=1e-5)
    lines = steps_jsonl(back).splitlines()
    assert len(lines) == 200 and json.loads(lines[-1])["step"] == 200  # steps.jsonl, the report's format


def test_a_long_run_is_thinned_evenly_to_fit_keeping_the_last_step():
    line = steps_line(records(200_000))
    assert len(line) <= MAX_STEPS_LINE
    steps = [r["step"] for r in find_steps(line)]
    assert steps[0] == 1 and steps[-1] == 200_000 and len(steps) > 100
    gaps = {b - a for a, b in zip(steps[:-2], steps[1:-1])}
    assert len(gaps) == 1, "every k-th step"


def test_nan_losses_survive_as_null_and_nothing_is_printed_without_records(capsys):
    bad = records(3)
    bad[2]["loss"] = float("nan")
    assert find_steps(steps_line(bad))[2]["loss"] is None
    assert steps_line([]) is None
    publish_steps([{"is_worker": True, "worker_rank": 0, "steps_line": steps_line([])}, {"is_worker": False}])
    assert capsys.readouterr().out == ""
    publish_steps([{"is_worker": False}, {"is_worker": True, "worker_rank": 0, "steps_line": steps_line(records(2))}])
    assert len(find_steps(capsys.readouterr().out)) == 2


def test_garbage_gives_no_curves_rather_than_an_error():
    assert find_steps("no such line") is None
    assert find_steps(STEPS_PREFIX + "not base64!!") is None
    assert find_steps(STEPS_PREFIX + base64.b64encode(b"not gzip").decode()) is None
    bomb = gzip.compress(b'{"step": [' + b"1," * (MAX_STEPS_JSON // 2) + b"1]}")
    assert find_steps(STEPS_PREFIX + base64.b64encode(bomb).decode()) is None, "bounded once inflated"
    uneven = gzip.compress(json.dumps({"step": [1, 2], "loss": [1.0]}).encode())
    assert find_steps(STEPS_PREFIX + base64.b64encode(uneven).decode()) is None
    assert decode_steps(steps_line(records(1))[len(STEPS_PREFIX):])[0]["step"] == 1


@pytest.mark.slow
def test_the_real_trainer_prints_its_steps_jsonl_as_the_line_before_its_summary(run_trainer):
    run = run_trainer(["--steps", "6", "--warmup-steps", "2"])
    lines = run.stdout.splitlines()
    steps_at = next(i for i, line in enumerate(lines) if line.startswith(STEPS_PREFIX))
    assert lines[steps_at + 1].startswith("GPT2BENCH_SUMMARY "), "the summary line stays last"
    back = find_steps(run.stdout)
    assert [r["step"] for r in back] == [r["step"] for r in run.steps] == list(range(1, 7))
    for printed, written in zip(back, run.steps, strict=True):
        assert printed["warmup"] == written["warmup"]
        assert math.isclose(printed["loss"], written["loss"], rel_tol=1e-5)
        assert math.isclose(printed["grad_norm"], written["grad_norm"], rel_tol=1e-5)
