"""Collect: trainer summaries (from termination messages or stdout) become `results` entries."""

from __future__ import annotations

import json

import jsonschema
import pytest
from kubeflow_crds import strict

from gpt2bench.collect import (
    CollectError,
    collect_run,
    entry_from_summary,
    find_summary_line,
    parse_termination_message,
    run_entry,
    summary_results,
)
from gpt2bench.conventions import SUMMARY_PREFIX
from gpt2bench.plan import plan_runs
from gpt2bench.specification import crd
from gpt2bench.specification.validation import load_benchmark
from gpt2bench.status import RunResults


def _wire(function):
    """The entry as the status and results.json hold it (collect returns the model)."""
    return lambda *args, **kwargs: function(*args, **kwargs).dump()


_summary_results, _entry_from_summary = _wire(summary_results), _wire(entry_from_summary)
_collect_run, _run_entry = _wire(collect_run), _wire(run_entry)
RESULT_FIELDS = {field.alias for field in RunResults.model_fields.values()}

SUMMARY = {
    "status": "ok",
    "world_size": 2,
    "tokens_per_second": 1234.5,
    "tokens_per_second_per_device": 617.25,
    "step_time_p50_seconds": 0.21,
    "step_time_p95_seconds": 0.3,
    "peak_memory_bytes": 123456789.0,
    "train_seconds": 4.2,
    "startup_seconds": 3.1,
    "final_loss": 7.5,
    "first_loss": 10.9,
    "grad_norm": 1.25,
    "mfu": 0.01,
    "device_name": "NVIDIA H100 80GB HBM3",
    "peak_flops_precision": "bf16",
    "compile_seconds": 41.5,
    "skipped_steps": 0,
    "peak_device_memory_bytes": 123456789,
    "peak_host_memory_bytes": 2345678901,
    "setup_peak_device_memory_bytes": 600000000,
    "setup_peak_host_memory_bytes": 2000000000,
    "threads_per_rank": 1,
    "cores_per_rank": 0.5,
    "transport": "NET/IB",
    "nodes_used": 2,
    "can_lock_memory": False, "memlock_bytes": 8388608, "compile_threads": 2,  # a boolean kept as one
    "node_names": ["gpu-a", "gpu-b"],  # in the summary, not the status (a list per rank)
    "data_seconds_mean": 0.001, "forward_seconds_mean": 0.05, "backward_seconds_mean": 0.1,
    "optimizer_seconds_mean": 0.02, "other_seconds_mean": 0.001, "comm_seconds_mean": 0.04,
    "comm_exposed_seconds_mean": 0.01, "comm_hidden_ratio": 0.75,
    "comm_bytes_per_step": {"allreduce": 27867136, "broadcast": 8},  # per kind: the entry keeps the total
    "comm_bus_bandwidth": {"allreduce": 3.0e9}, "probe_bus_bandwidth": {"allreduce": 4.0e9},  # per kind: not results
    "bus_kind": "allreduce", "bus_bandwidth_achieved": 3.0e9, "bus_bandwidth_probed": 4.0e9, "bus_bandwidth_share": 0.75,
    "energy_joules_per_million_tokens": 900.0, "energy_source": "nvml", "energy_unavailable_reason": "n/a",
    "state_bytes": 83_886_080,
    "step_time_halves_ratio": 0.9, "step_time_halves_low": 0.85, "step_time_halves_high": 0.95,
    "losses": [9.0, 8.0],  # extra keys are not results
}
TIMES = {"start_time": "2026-11-22T00:00:00Z", "completion_time": "2026-11-22T00:01:00Z"}


@pytest.fixture(scope="module")
def runs():
    spec = {
        "sweep": {
            "strategies": [{"name": "ddp"}, {"name": "horovod"}, {"name": "ps"}],
            "scales": [{"processesPerNode": 2}],
        }
    }
    document = {
        "apiVersion": "gpt2bench.io/v1alpha1",
        "kind": "GPT2Benchmark",
        "metadata": {"name": "cpu-sweep"},
        "spec": spec,
    }
    return plan_runs(load_benchmark(document))


@pytest.fixture(scope="module")
def run_schema():
    schema = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return jsonschema.Draft4Validator(strict(schema["properties"]["status"]["properties"]["runs"]["items"]))


def test_results_are_camel_case_and_complete():
    results = _summary_results(SUMMARY)
    assert set(results) == set(RESULT_FIELDS)
    assert results["tokensPerSecond"] == 1234.5 and results["worldSize"] == 2
    assert results["peakMemoryBytes"] == 123456789 and isinstance(results["peakMemoryBytes"], int)
    assert results["commBytesPerStep"] == 27867136 + 8
    assert results["busKind"] == "allreduce" and results["busBandwidthShare"] == 0.75
    assert (results["transport"], results["nodesUsed"]) == ("NET/IB", 2) and "nodeNames" not in results
    assert results["canLockMemory"] is False and results["memlockBytes"] == 8388608
    assert "commBusBandwidth" not in results and "probeBusBandwidth" not in results
    camel = {"tokensPerSecond": 10.0, "finalLoss": 2.0}
    assert _summary_results(camel) == camel  # camelCase summaries work too


def test_the_device_name_is_one_short_line():
    assert _summary_results({"device_name": "Tesla\nV100\x07"}) == {"deviceName": "Tesla V100"}
    assert _summary_results({"device_name": "x" * 500})["deviceName"] == "x" * 200
    assert _summary_results({"device_name": 3, "tokens_per_second": "fast"}) == {}


def test_non_finite_and_non_numeric_figures_are_dropped():
    results = _summary_results(
        {
            "tokens_per_second": float("nan"),
            "final_loss": float("inf"),
            "mfu": "high",
            "grad_norm": True,
            "train_seconds": 3,
        }
    )
    assert results == {"trainSeconds": 3}


def test_succeeded_entry_has_the_documented_shape(runs, run_schema):
    entry = _entry_from_summary(runs[0], SUMMARY, **TIMES)
    assert entry == {
        "name": "cpu-sweep-ddp-fp32-1x2", "strategy": "ddp", "precision": "fp32", "nodes": 1, "devicesPerNode": 0,
        "processesPerNode": 2, "jobKind": "PyTorchJob", "jobName": "cpu-sweep-ddp-fp32-1x2", "devices": 2,
        "phase": "Succeeded",
        "startTime": TIMES["start_time"], "completionTime": TIMES["completion_time"],
        "results": _summary_results(SUMMARY),
    }  # fmt: skip
    run_schema.validate(entry)
    json.dumps(entry, allow_nan=False)


def test_ps_and_mpijob_entries(runs, run_schema):
    horovod, ps = runs[1], runs[2]
    assert _entry_from_summary(horovod, SUMMARY)["jobKind"] == "MPIJob"
    assert _entry_from_summary(ps, SUMMARY)["processesPerNode"] == 3  # 2 workers + 1 server
    for run in runs:
        run_schema.validate(_entry_from_summary(run, SUMMARY))


def test_trainer_failure_is_a_failed_entry_with_its_reason(runs, run_schema):
    entry = _entry_from_summary(runs[0], {"status": "failed", "reason": "loss is NaN at step 3"})
    assert entry["phase"] == "Failed" and entry["reason"] == "loss is NaN at step 3" and "results" not in entry
    run_schema.validate(entry)
    assert _entry_from_summary(runs[0], {"status": "ok"})["reason"] == "trainer summary has no tokensPerSecond"


def test_termination_message_json_and_log_tail():
    compact = json.dumps(SUMMARY, separators=(",", ":"))
    assert parse_termination_message(compact) == SUMMARY
    assert parse_termination_message(f"\n{compact}\n") == SUMMARY
    first = 'GPT2BENCH_SUMMARY {"status":"ok","tokens_per_second":1}'
    logs = f"step 1 loss 9\n{first}\nstep 2\nGPT2BENCH_SUMMARY {compact}\nbye\n"
    assert parse_termination_message(logs) == SUMMARY  # the last line wins
    assert find_summary_line(logs)["tokens_per_second"] == 1234.5
    tagged = f"[1,0]<stdout>:GPT2BENCH_SUMMARY {compact}[1,0]<stdout>:\n[1,1]<stdout>:done"  # Open MPI --tag-output
    assert parse_termination_message(tagged) == SUMMARY
    stamped = f"2026-11-22T00:00:00.1Z GPT2BENCH_SUMMARY {compact}"  # kubectl logs --timestamps
    assert find_summary_line(stamped) == SUMMARY


@pytest.mark.parametrize(
    "message, reason",
    [
        (None, "termination message is empty"),
        ("   \n", "termination message is empty"),
        ("Traceback (most recent call last):\n  ...\nRuntimeError: NCCL error", "no GPT2BENCH_SUMMARY line"),
        ('{"status":"ok","tokens_per_second":12', "not valid JSON"),  # cut off at 4 KB
        ("GPT2BENCH_SUMMARY [1, 2]", "a list, not an object"),
        ("[1, 2]", "no GPT2BENCH_SUMMARY line"),
        ("GPT2BENCH_SUMMARY not json", "not valid JSON"),
        ("\x00\xff\x01garbage", "no GPT2BENCH_SUMMARY line"),
    ],
)
def test_garbage_gives_a_clear_reason(message, reason):
    with pytest.raises(CollectError, match=reason):
        parse_termination_message(message)


def test_collect_run_decisions(runs, run_schema):
    run = runs[0]
    good = json.dumps(SUMMARY)
    ok = _collect_run(run, job_succeeded=True, termination_message=good, **TIMES)
    assert ok["phase"] == "Succeeded" and ok["results"]["tokensPerSecond"] == 1234.5

    garbage = _collect_run(run, job_succeeded=True, termination_message="Segmentation fault\n\x07", **TIMES)
    assert garbage["phase"] == "Failed"
    assert garbage["reason"].startswith("job succeeded but termination message: no GPT2BENCH_SUMMARY line")
    assert "Segmentation fault" in garbage["reason"] and "\x07" not in garbage["reason"]

    failed_with_reason = _collect_run(
        run,
        job_succeeded=False,
        termination_message='{"status":"failed","reason":"injected failure at step 3"}',
        job_reason="BackoffLimitExceeded",
    )
    assert failed_with_reason["reason"] == "injected failure at step 3"  # the trainer knows best

    failed_no_message = _collect_run(run, job_succeeded=False, termination_message="", job_reason="DeadlineExceeded")
    assert failed_no_message["reason"] == "DeadlineExceeded"

    failed_after_ok_summary = _collect_run(run, job_succeeded=False, termination_message=good, job_reason="pod evicted")
    assert failed_after_ok_summary["phase"] == "Failed" and failed_after_ok_summary["reason"] == "pod evicted"
    for entry in (ok, garbage, failed_with_reason, failed_no_message, failed_after_ok_summary):
        run_schema.validate(entry)


def test_reasons_are_one_bounded_line(runs):
    entry = _run_entry(runs[0], phase="Failed", reason="line one\nline two\t" + "x" * 5000)
    assert "\n" not in entry["reason"] and len(entry["reason"]) <= 1000
    assert entry["reason"].startswith("line one line two x")
    assert _run_entry(runs[0], phase="Failed")["reason"] == "failed without a reason"


def test_pending_and_running_entries_have_no_results(runs, run_schema):
    for phase in ("Pending", "Running"):
        entry = _run_entry(runs[0], phase=phase)
        assert "results" not in entry and "reason" not in entry
        run_schema.validate(entry)
    with pytest.raises(ValueError, match="phase"):
        _run_entry(runs[0], phase="Done")


# A line `gpt2bench train` printed on this machine (tiny model, 12 steps), trimmed of per-rank lists.
REAL_LINE = (
    'GPT2BENCH_SUMMARY {"status":"succeeded","reason":null,"benchmark":"local","run":"local","strategy":"single",'
    '"precision":"fp32","world_size":1,"tokens_per_second":721.0797483981232,'
    '"tokens_per_second_per_device":721.0797483981232,"step_time_p50_seconds":0.323138113500022,'
    '"step_time_p95_seconds":0.5339662029999546,"final_loss":10.230137825012207,"grad_norm":1.54701828956604,'
    '"mfu":null,"peak_memory_bytes":883965952,"train_seconds":4.7925145626068115,"startup_seconds":7.282012462615967}'
)


def test_a_real_trainer_summary_line(runs, run_schema):
    logs = "2026-11-22 00:18:50,704 rank0 INFO step 12 loss 10.2301\n" + REAL_LINE + "\n"
    entry = _collect_run(runs[0], job_succeeded=True, termination_message=logs, **TIMES)
    assert entry["phase"] == "Succeeded"
    # null/absent figures left out: the line is older than deviceName and stateBytes, the device/host and
    # set-up memory split, compile seconds and skipped steps
    absent = {"mfu", "deviceName", "stateBytes", "peakFlopsPrecision", "compileSeconds", "skippedSteps",
              "peakDeviceMemoryBytes", "peakHostMemoryBytes", "setupPeakDeviceMemoryBytes", "setupPeakHostMemoryBytes",
              "threadsPerRank", "coresPerRank", "dataSecondsMean", "forwardSecondsMean", "backwardSecondsMean",
              "optimizerSecondsMean", "otherSecondsMean", "commSecondsMean", "commExposedSecondsMean",
              "commHiddenRatio", "commBytesPerStep", "energyJoulesPerMillionTokens", "energySource",
              "energyUnavailableReason", "busKind", "busBandwidthAchieved", "busBandwidthProbed",
              "busBandwidthShare", "transport", "nodesUsed", "firstLoss", "stepTimeHalvesRatio",
              "stepTimeHalvesLow", "stepTimeHalvesHigh", "canLockMemory", "memlockBytes", "compileThreads"}
    assert set(entry["results"]) == set(RESULT_FIELDS) - absent
    assert entry["results"]["tokensPerSecond"] == pytest.approx(721.08, abs=0.01)
    run_schema.validate(entry)


def test_a_skipped_run_is_skipped_with_the_trainers_reason_not_failed(runs, run_schema):
    line = SUMMARY_PREFIX + '{"status":"skipped","reason":"bf16 is not native on this CPU","precision":"bf16"}'
    entry = _collect_run(runs[0], job_succeeded=True, termination_message=line, **TIMES)
    assert (entry["phase"], entry["reason"]) == ("Skipped", "bf16 is not native on this CPU")
    assert "results" not in entry
    run_schema.validate(entry)


def test_devices_count_workers_not_parameter_servers(runs):
    ddp, _horovod, ps = (_run_entry(run, phase="Pending") for run in runs)
    assert ps["processesPerNode"] == 3 and ps["devices"] == 2  # one server beside the two workers
    assert ddp["devices"] == 2 and "repeat" not in ddp  # repeats: 1 plans no repeat index
