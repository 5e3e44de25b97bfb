"""The sweep core on data alone: the rules both drivers ask (gpt2bench/sweepcore.py), with no process, file or
API server. tests/test_until_decided.py and the operator's tests check that each driver does what it answers."""

from __future__ import annotations

from datetime import datetime, timezone

from gpt2bench import collect, sweepcore
from gpt2bench.plan import plan_runs
from gpt2bench.specification.validation import load_benchmark
from gpt2bench.status import FAILED, PARTIALLY_SUCCEEDED, RUNNING, SUCCEEDED, RunResults

NOW = datetime(2026, 11, 1, 1, tzinfo=timezone.utc)
TPS = {"ddp": 1000.0, "fsdp": 1000.0, "ps": 500.0}


def benchmark(max_repeats: int = 5, repeats: int = 3):
    return load_benchmark({"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark", "metadata": {"name": "c"},
                           "spec": {"sweep": {"strategies": [{"name": s} for s in TPS], "repeats": repeats,
                                              "maxRepeats": max_repeats, "minEffect": 0, "breakdown": "off",
                                              "scales": [{"processesPerNode": 2}]}}})


def finished(runs, phase=SUCCEEDED):
    """Entries of `runs` finished with their strategy's tokens/s, a little apart by round (ddp and fsdp tied)."""
    found = []
    for run in runs:
        entry = collect.run_entry(run, phase=phase)
        value = TPS[run.strategy.name] * (1 + 0.01 * ((run.repeat * (3 if run.strategy.name == "ddp" else 5)) % 4))
        found.append(entry.model_copy(update={
            "results": RunResults(tokens_per_second=value), "start_time": "2026-11-01T00:00:00Z",
            "completion_time": "2026-11-01T00:00:10Z"}))
    return found


def test_a_round_is_added_for_the_configurations_still_racing_only():
    bench = benchmark()
    runs = plan_runs(bench)
    step = sweepcore.add_round(bench, finished(runs), sweepcore.Rounds(planned=3), "2026-11-01T00:00:00Z", NOW)
    assert step.added and step.added.startswith("round 4 added for the 2 configurations still racing")
    assert sorted(run.strategy.name for run in step.runs) == ["ddp", "fsdp"]  # ps, half as fast, was dropped
    assert [e.phase for e in step.entries] == ["Pending", "Pending"] and {e.repeat for e in step.entries} == {4}
    assert step.rounds.planned == 4 and step.rounds.racing == 2
    assert [d.configuration for d in step.rounds.dropped] == ["c-ps-fp32-1x2"]
    only_ddp = sweepcore.add_round(bench, finished(runs), sweepcore.Rounds(planned=3), None, NOW,
                                   chosen=lambda run: run.strategy.name == "ddp")
    assert [run.strategy.name for run in only_ddp.runs] == ["ddp"]  # a local sweep of some configurations


def test_no_round_while_a_run_is_unfinished_and_the_reason_once_the_rounds_run_out():
    bench = benchmark(max_repeats=3, repeats=2)
    runs = plan_runs(bench, rounds=3)  # the third round was added, and has run
    entries = finished(runs)
    running = [*entries[:-1], entries[-1].model_copy(update={"phase": RUNNING})]
    assert sweepcore.add_round(bench, running, sweepcore.Rounds(planned=3), None, NOW) is None
    step = sweepcore.add_round(bench, entries, sweepcore.Rounds(planned=3), None, NOW)
    assert step.added is None and step.runs == [] and step.entries == []
    assert step.rounds.stop_reason.startswith("max rounds: 3 rounds run, still racing at 1×2 CPU")
    assert (step.rounds.planned, step.rounds.done, step.rounds.racing) == (3, 3, 0)


def test_the_tally_of_a_sweep_and_the_drops_said_once():
    bench = benchmark()
    entries = finished(plan_runs(bench))
    entries[0] = entries[0].model_copy(update={"phase": FAILED, "results": None})
    found = sweepcore.tally(entries, rounds=True)
    assert (found.phase, found.total, found.done, found.succeeded, found.failed) == (PARTIALLY_SUCCEEDED, 9, 9, 8, 1)
    assert found.rounds_done == 3 and found.best.strategy in ("ddp", "fsdp")
    assert sweepcore.tally(entries[:1] + [entries[1].model_copy(update={"phase": RUNNING})], rounds=False).phase == (
        RUNNING)
    step = sweepcore.add_round(bench, finished(plan_runs(bench)), sweepcore.Rounds(planned=3), None, NOW)
    assert sweepcore.newly_dropped(None, step.rounds.dropped) == step.rounds.dropped
    assert sweepcore.newly_dropped(step.rounds.dropped, step.rounds.dropped) == []
