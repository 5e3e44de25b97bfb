"""Repeat until decided (docs/analysis.md): spec, the sequential rule's error rate, and the local runner adding
whole rounds until the fastest decision is resolved, the rounds run out, or the budget is spent."""

from __future__ import annotations

import json
import math
import random
import sys
from datetime import datetime, timezone

import pytest

from gpt2bench.local import sweep as local_sweep
from gpt2bench.plan import order_seed, plan_runs
from gpt2bench.protocol import SUMMARY_PREFIX, TERMINATION_LOG_ENV
from gpt2bench.render import render_job
from gpt2bench.report.analysis import analyze
from gpt2bench.report.sequential import next_round
from gpt2bench.spec.validation import SpecError, load_benchmark
from gpt2bench.status import RunStatus


def benchmark(sweep: dict, name: str = "until"):
    return load_benchmark({"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark", "metadata": {"name": name},
                           "spec": {"training": {"steps": 3, "warmupSteps": 1}, "sweep": sweep}})


def test_the_spec_takes_a_maximum_a_smallest_effect_and_a_budget_and_names_a_bad_one():
    good = benchmark({"strategies": [{"name": "ddp"}], "repeats": 2, "maxRepeats": 6, "minEffect": 0.05,
                      "budget": {"wallSeconds": 600, "gpuHours": 2.0}})
    assert (good.spec.sweep.max_repeats, good.spec.sweep.min_effect, good.spec.sweep.budget.wall_seconds) == (6, 0.05,
                                                                                                              600)
    for sweep, field in [({"repeats": 3, "maxRepeats": 3}, "spec.sweep.maxRepeats"),
                         ({"budget": {"wallSeconds": 60}}, "spec.sweep.budget"),
                         ({"maxRepeats": 4, "budget": {}}, "spec.sweep.budget.wallSeconds"),
                         ({"minEffect": 1.5}, "spec.sweep.minEffect")]:
        with pytest.raises(SpecError) as error:
            benchmark({"strategies": [{"name": "ddp"}], **sweep})
        assert field in [path for path, _ in error.value.errors]


def _rounds(values: dict[str, list[float]], start: datetime | None = None, seconds: float = 60.0):
    """Runs of fastest-decision configurations at 1×2 CPU, one per round, `seconds` apart."""
    start = start or datetime(2026, 11, 1, tzinfo=timezone.utc)
    found, clock = [], start.timestamp()
    for k in range(1, max(len(v) for v in values.values()) + 1):
        for strategy, tps in values.items():
            if k <= len(tps):
                stamp = [datetime.fromtimestamp(clock + i * seconds / 2, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
                         for i in (0, 1)]
                found.append(RunStatus(name=f"u-{strategy}-fp32-1x2-r{k}", strategy=strategy, precision="fp32", nodes=1,
                                       devices_per_node=0, processes_per_node=2, job_kind="PyTorchJob",
                                       job_name="x", devices=2, repeat=k, phase="Succeeded", start_time=stamp[0],
                                       completion_time=stamp[1], results={"tokens_per_second": tps[k - 1]}))
        clock += seconds
    return found


def test_the_rule_adds_a_round_while_undecided_and_stops_saying_why():
    spec = {"sweep": {"repeats": 2, "maxRepeats": 4}}
    start = "2026-11-01T00:00:00Z"
    now = datetime(2026, 11, 1, 0, 10, tzinfo=timezone.utc)
    close = {"ddp": [100.0, 103.0], "fsdp": [101.0, 99.0]}  # within the noise
    step = next_round(_rounds(close), spec, start, now)
    assert step.add and step.reason.startswith("round 3 added: undecided at 1×2 CPU (no-clear-winner)")
    far = {"ddp": [200.0, 203.0, 201.0], "fsdp": [100.0, 99.0, 101.0]}
    step = next_round(_rounds(far), spec, start, now)
    assert not step.add and step.reason.startswith("decided after 3 rounds (1×2 CPU clear)")
    step = next_round(_rounds({"ddp": [100.0, 103.0, 98.0, 101.0], "fsdp": [101.0, 99.0, 100.0, 102.0]}), spec, start,
                      now)
    assert not step.add and step.reason.startswith("max rounds: 4 rounds run, still undecided")
    budget = {"sweep": {**spec["sweep"], "budget": {"wallSeconds": 200}}}  # a round takes 30 s: at 120 s one fits
    assert next_round(_rounds(close), budget, start, datetime(2026, 11, 1, 0, 2, tzinfo=timezone.utc)).add
    step = next_round(_rounds(close), budget, start, datetime(2026, 11, 1, 0, 3, tzinfo=timezone.utc))
    assert not step.add and step.reason.startswith("budget spent: 180 s of 200 s used, a round takes about 30 s")
    within = {"sweep": {**spec["sweep"], "minEffect": 0.1}}  # 10 %: the rival's interval lies inside it
    step = next_round(_rounds({"ddp": [100.0, 101.0, 100.5], "fsdp": [100.5, 100.4, 100.6]}), within, start, now)
    assert not step.add and "1×2 CPU equivalent" in step.reason


def test_looking_after_every_round_keeps_the_false_winner_rate():
    """Two configurations of equal means (5 % noise) in a sweep that looks after rounds 2..8 and stops at the first
    clear winner: with each look at 5 % / 7 (Bonferroni across looks) a false winner is named in 2.75 % of seeded
    sweeps; deciding every look at 5 % (a test that forgets it looks 7 times) names one in 15.75 %."""
    rng = random.Random(5)
    spec = {"sweep": {"repeats": 2, "maxRepeats": 8}}
    trials, false = 400, {True: 0, False: 0}
    for _ in range(trials):
        values = {s: [100 * math.exp(rng.gauss(0, 0.05)) for _ in range(8)] for s in ("ddp", "fsdp")}
        for corrected in (True, False):
            for k in range(2, 9):
                runs = _rounds({s: v[:k] for s, v in values.items()})
                fastest = next(r for r in analyze(runs, spec if corrected else {}).recommendations
                               if r.objective == "fastest")
                if fastest.decision == "clear":
                    false[corrected] += 1
                    break
    assert false[True] / trials <= 0.05 < false[False] / trials


def _fake(tps: dict[str, float]):
    """A renderer whose jobs print a trainer summary with the strategy's tokens/s, each round a little apart."""
    def render(benchmark, run):
        job = render_job(benchmark, run)
        value = tps[run.strategy.name] * (1 + 0.01 * ((run.repeat or 0) % 3))
        summary = {"status": "ok", "tokens_per_second": value, "world_size": 2, "final_loss": 9.0}
        text = json.dumps(summary)
        script = (f"import os; open(os.environ[{TERMINATION_LOG_ENV!r}], 'w').write({text!r}); "
                  f"print({SUMMARY_PREFIX + text!r})")  # where the trainer writes its summary, as the trainer does
        master = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
        master["command"] = [sys.executable, "-c", script]
        job["spec"]["pytorchReplicaSpecs"].pop("Worker", None)
        return job
    return render


@pytest.mark.parametrize(("tps", "rounds", "reason"), [
    ({"ddp": 200.0, "fsdp": 100.0}, 2, "decided after 2 rounds"),  # decided at once: no round added
    ({"ddp": 100.0, "fsdp": 100.0}, 4, "max rounds: 4 rounds run"),  # never decided: up to maxRepeats
])
def test_the_local_runner_adds_whole_rounds_until_decided_and_says_why_it_stopped(tmp_path, tps, rounds, reason):
    bench = benchmark({"strategies": [{"name": "ddp"}, {"name": "fsdp"}], "repeats": 2, "maxRepeats": 4,
                       "breakdown": "off", "scales": [{"processesPerNode": 2}]})
    runs = plan_runs(bench)
    assert [r.repeat for r in runs] == [1, 1, 2, 2]
    doc = local_sweep.run_sweep(bench, runs, tmp_path / "out", live=False, render=_fake(tps)).doc
    assert [r.repeat for r in doc.runs] == [k for k in range(1, rounds + 1) for _ in (0, 1)]
    assert all(r.phase == "Succeeded" for r in doc.runs)
    assert doc.rounds_planned == doc.rounds_done == rounds and doc.stop_reason.startswith(reason)
    assert doc.order_seed == order_seed(bench)  # recorded: round k ran in random.Random(seed + k)'s order
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["roundsDone"] == rounds and saved["stopReason"] == doc.stop_reason
    assert doc.analysis.looks == 3  # rounds 2, 3 and 4 may decide: each at 5 % / 3


def test_a_resumed_sweep_keeps_the_rounds_it_added_and_continues_the_same_rule(tmp_path):
    """A sweep that added rounds 3 and 4, then was killed during round 4's last run: --resume keeps rounds 3 and 4
    (not only the spec's 2), runs the interrupted run again, and the rule ends it as before (max rounds)."""
    bench = benchmark({"strategies": [{"name": "ddp"}, {"name": "fsdp"}], "repeats": 2, "maxRepeats": 4,
                       "breakdown": "off", "scales": [{"processesPerNode": 2}]})
    render = _fake({"ddp": 100.0, "fsdp": 100.0})
    out = tmp_path / "out"
    first = local_sweep.run_sweep(bench, plan_runs(bench), out, live=False, render=render).doc
    assert [r.repeat for r in first.runs] == [1, 1, 2, 2, 3, 3, 4, 4]
    saved = json.loads((out / "results.json").read_text())
    saved["runs"][-1] |= {"phase": "Running"}  # killed while running it
    saved["runs"][-1].pop("results", None)
    saved.pop("stopReason")
    (out / "results.json").write_text(json.dumps(saved))
    runs, resumed = local_sweep.prepare_folder(bench, plan_runs(bench), plan_runs(bench), out, resume=True)
    assert [r.repeat for r in runs] == [1, 1, 2, 2, 3, 3, 4, 4] and len(resumed.kept) == 7
    doc = local_sweep.run_sweep(bench, runs, out, live=False, resumed=resumed, render=render).doc
    assert [r.phase for r in doc.runs] == ["Succeeded"] * 8 and doc.rounds_done == 4
    assert doc.stop_reason.startswith("max rounds: 4 rounds run")


def test_the_local_runner_says_how_many_runs_it_may_add_beyond_the_planned_ones():
    """`gpt2bench run`'s first line: the planned runs are the first rounds; with maxRepeats it says how many more may
    follow (the quiet-machine sweep printed '36 of 36 runs' and then ran 60)."""
    from gpt2bench.local.cli import _rounds_to_add

    bench = benchmark({"strategies": [{"name": "ddp"}, {"name": "fsdp"}], "repeats": 2, "maxRepeats": 5,
                       "breakdown": "off", "scales": [{"processesPerNode": 2}]})
    assert _rounds_to_add(bench, plan_runs(bench)) == ", then up to 6 more in 3 rounds while undecided (sweep.maxRepeats 5)"
    fixed = benchmark({"strategies": [{"name": "ddp"}], "repeats": 2, "scales": [{"processesPerNode": 2}]})
    assert _rounds_to_add(fixed, plan_runs(fixed)) == ""
