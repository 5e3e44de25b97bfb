"""Repeat until decided (docs/analysis.md): spec, the sequential rule's error rate, and the local runner adding
whole rounds until the fastest decision is resolved, the rounds run out, or the budget is spent."""

from __future__ import annotations

import json
import math
import random
import sys
from datetime import datetime, timezone

import pytest

from gpt2bench.conventions import FORKSERVER_SWITCH_ENV, SUMMARY_PREFIX, TERMINATION_LOG_ENV
from gpt2bench.local import sweep as local_sweep
from gpt2bench.plan import order_seed, plan_runs
from gpt2bench.render import render_job
from gpt2bench.report.sequential import next_round
from gpt2bench.specification.validation import SpecError, load_benchmark
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
    spec = {"sweep": {"repeats": 2, "maxRepeats": 4, "minEffect": 0}}  # the strict race: a tie races on
    start = "2026-11-01T00:00:00Z"
    now = datetime(2026, 11, 1, 0, 10, tzinfo=timezone.utc)
    close = {"ddp": [100.0, 103.0], "fsdp": [101.0, 99.0]}  # no look before 3 rounds
    step = next_round(_rounds(close), spec, start, now)
    assert step.add and step.racing == ["u-ddp-fp32-1x2", "u-fsdp-fp32-1x2"]
    assert step.reason.startswith("round 3 added for the 2 configurations still racing at 1×2 CPU (")
    far = {"ddp": [200.0, 203.0, 201.0], "fsdp": [100.0, 99.0, 101.0]}
    step = next_round(_rounds(far), spec, start, now)
    assert not step.add and step.reason == "decided after 3 rounds (1×2 CPU: ddp fp32 is the fastest (error rate ≤ 5 %))"
    assert [(d.configuration, d.round, d.behind) for d in step.dropped] == [("u-fsdp-fp32-1x2", 3, "u-ddp-fp32-1x2")]
    step = next_round(_rounds({"ddp": [100.0, 103.0, 98.0, 101.0], "fsdp": [101.0, 99.0, 100.0, 102.0]}), spec, start,
                      now)
    assert not step.add and step.reason.startswith("max rounds: 4 rounds run, still racing at 1×2 CPU (")
    budget = {"sweep": {**spec["sweep"], "budget": {"wallSeconds": 200}}}  # each run 30 s: the next round 60 s
    assert next_round(_rounds(close), budget, start, datetime(2026, 11, 1, 0, 2, tzinfo=timezone.utc)).add
    step = next_round(_rounds(close), budget, start, datetime(2026, 11, 1, 0, 3, tzinfo=timezone.utc))
    assert not step.add and step.reason.startswith("budget spent: 180 s of 200 s used, the next round would take "
                                                   "about 60 s")
    within = {"sweep": {**spec["sweep"], "minEffect": 0.1}}  # 10 %: the rival shown within it
    step = next_round(_rounds({"ddp": [100.0, 101.0, 100.5], "fsdp": [100.5, 100.4, 100.6]}), within, start, now)
    assert not step.add and "is the fastest or within 10 % of it (error rate ≤ 5 %)" in step.reason


def test_the_next_round_runs_only_the_configurations_still_racing_and_costs_only_theirs():
    """Three configurations, one far behind: after round 3 it is dropped, round 4 is the other two's, and the budget
    reckons with their runs only."""
    spec = {"sweep": {"repeats": 2, "maxRepeats": 6, "budget": {"wallSeconds": 10_000}}}
    values = {"ddp": [200.0, 203.0, 201.0], "horovod": [201.0, 200.0, 202.0], "fsdp": [100.0, 99.0, 101.0]}
    step = next_round(_rounds(values), spec, "2026-11-01T00:00:00Z", datetime(2026, 11, 1, 0, 5, tzinfo=timezone.utc))
    assert step.add and sorted(step.racing) == ["u-ddp-fp32-1x2", "u-horovod-fp32-1x2"]
    assert [d.configuration for d in step.dropped] == ["u-fsdp-fp32-1x2"]


def test_looking_after_every_round_keeps_the_false_winner_rate():
    """Two configurations of equal means (5 % noise) in sweeps that look after rounds 3..8 through the rule itself and
    stop at the first decision: a false winner in at most 5 % of seeded sweeps (the race's boundary counts every
    look; tests/test_race.py measures it at scale)."""
    rng = random.Random(5)
    spec = {"sweep": {"repeats": 2, "maxRepeats": 8, "minEffect": 0}}  # strict claims only: equal is never fastest
    start, now = "2026-11-01T00:00:00Z", datetime(2026, 11, 1, 5, tzinfo=timezone.utc)
    trials, false = 200, 0
    for _ in range(trials):
        values = {s: [100 * math.exp(rng.gauss(0, 0.05)) for _ in range(8)] for s in ("ddp", "fsdp")}
        for k in range(2, 9):
            step = next_round(_rounds({s: v[:k] for s, v in values.items()}), spec, start, now)
            if not step.add:
                false += step.reason.startswith("decided")
                break
    assert false / trials <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / trials)


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


@pytest.fixture
def no_fork_server(monkeypatch):
    """`_fake`'s jobs run `python -c`, which the fork server never serves: starting it (importing torch and
    transformers) was most of each sweep's time here."""
    monkeypatch.setenv(FORKSERVER_SWITCH_ENV, "off")


@pytest.mark.parametrize(("tps", "per_round", "reason"), [
    ({"ddp": 200.0, "fsdp": 100.0, "ps": 50.0}, [3, 3, 3], "decided after 3 rounds"),  # the first look decides
    ({"ddp": 100.0, "fsdp": 100.0, "ps": 50.0}, [3, 3, 3, 2], "max rounds: 4 rounds run"),  # a tie races on
])
def test_the_local_runner_adds_rounds_of_the_configurations_still_racing_and_says_why_it_stopped(
        tmp_path, tps, per_round, reason, no_fork_server):
    bench = benchmark({"strategies": [{"name": "ddp"}, {"name": "fsdp"}, {"name": "ps"}], "repeats": 2,
                       "maxRepeats": 4, "minEffect": 0, "breakdown": "off", "scales": [{"processesPerNode": 2}]})
    runs = plan_runs(bench)
    assert [r.repeat for r in runs] == [1, 1, 1, 2, 2, 2]
    doc = local_sweep.run_sweep(bench, runs, tmp_path / "out", live=False, render=_fake(tps)).doc
    rounds = len(per_round)
    assert [sum(r.repeat == k for r in doc.runs) for k in range(1, rounds + 1)] == per_round
    assert all(r.phase == "Succeeded" for r in doc.runs)
    assert doc.rounds_planned == doc.rounds_done == rounds and doc.stop_reason.startswith(reason)
    assert doc.order_seed == order_seed(bench)  # recorded: round k ran in random.Random(seed + k)'s order
    assert "until-ps-fp32-1x2" in {d.configuration for d in doc.dropped}  # half as fast: dropped after round 3
    assert not any(r.strategy == "ps" and r.repeat == 4 for r in doc.runs)  # and never run again
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved["roundsDone"] == rounds and saved["stopReason"] == doc.stop_reason and saved["racing"] == 0


def test_a_resumed_sweep_keeps_the_rounds_it_added_and_continues_the_same_rule(tmp_path, no_fork_server):
    """A sweep that added rounds 3 and 4, then was killed during round 4's last run: --resume keeps rounds 3 and 4
    (not only the spec's 2), runs the interrupted run again, and the rule ends it as before (max rounds)."""
    bench = benchmark({"strategies": [{"name": "ddp"}, {"name": "fsdp"}], "repeats": 2, "maxRepeats": 4,
                       "minEffect": 0, "breakdown": "off", "scales": [{"processesPerNode": 2}]})
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
    assert _rounds_to_add(bench, plan_runs(bench)) == (", then up to 3 rounds of the configurations still racing (at "
                                                       "most 6 runs, fewer as the race drops the beaten; "
                                                       "sweep.maxRepeats 5)")
    fixed = benchmark({"strategies": [{"name": "ddp"}], "repeats": 2, "scales": [{"processesPerNode": 2}]})
    assert _rounds_to_add(fixed, plan_runs(fixed)) == ""
