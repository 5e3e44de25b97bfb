"""The analysis (docs/analysis.md) on crafted results, where every expected figure is worked out by hand:
repeats in spec and plan, scale, mean and spread, cost, scaling efficiency, the recommendation's margin and
noise rule, and each paper's finding with each verdict."""

from __future__ import annotations

import re

import pytest

from gpt2bench.plan import MAX_NAME_LENGTH, plan_runs
from gpt2bench.report import findings
from gpt2bench.report.analysis import analyze, decide
from gpt2bench.report.measures import Prices, Stat, configurations, efficiencies, run_efficiency, scale_of
from gpt2bench.spec import Benchmark, SpecError, validate_spec
from gpt2bench.status import RunStatus

GIB = 2**30


def run(name: str, strategy: str, precision: str = "fp32", *, nodes: int = 1, gpus: int = 0, devices: int | None = None,
        procs: int | None = None, phase: str = "Succeeded", repeat: int | None = None, **figures) -> RunStatus:
    """A results entry; `figures` are RunResults fields (snake_case). devices: GPUs, else worker processes."""
    devices = devices or (nodes * gpus if gpus else nodes)
    return RunStatus(name=name, strategy=strategy, precision=precision, nodes=nodes, devices_per_node=gpus,
                     processes_per_node=procs or max(devices // nodes, 1), job_kind="PyTorchJob", job_name=name,
                     devices=devices, repeat=repeat, phase=phase,
                     reason="boom" if phase == "Failed" else None,
                     results=figures if phase == "Succeeded" else None)


def repeats(name: str, strategy: str, precision: str, values: list[float], **kwargs) -> list[RunStatus]:
    """One run per value of tokens/s, named <name>-r<k> as the plan names repeats."""
    return [run(f"{name}-r{k}", strategy, precision, repeat=k, tokens_per_second=v, **kwargs)
            for k, v in enumerate(values, start=1)]


def by(recs, objective, scale):
    return next(r for r in recs if r.objective == objective and r.scale == scale)


# ---------------------------------------------------------------- spec and plan
def test_spec_names_the_field_of_a_bad_repeat_or_price():
    good = validate_spec({"sweep": {"strategies": [{"name": "ddp"}], "repeats": 3},
                          "cost": {"gpuHour": 2.5, "currency": "EUR"}})
    assert good.sweep.repeats == 3 and good.cost.gpu_hour == 2.5 and good.cost.node_hour is None
    for spec, field in [({"sweep": {"strategies": [{"name": "ddp"}], "repeats": 0}}, "spec.sweep.repeats"),
                        ({"sweep": {"strategies": [{"name": "ddp"}]}, "cost": {}}, "spec.cost.gpuHour"),
                        ({"sweep": {"strategies": [{"name": "ddp"}]}, "cost": {"nodeHour": -1}}, "spec.cost.nodeHour")]:
        with pytest.raises(SpecError) as error:
            validate_spec(spec)
        assert [path for path, _ in error.value.errors] == [field]


def test_repeats_are_interleaved_within_a_scale_and_named_with_a_whole_suffix():
    spec = validate_spec({"sweep": {"strategies": [{"name": "single"}, {"name": "ddp"}], "repeats": 2,
                                    "scales": [{"processesPerNode": 1}, {"processesPerNode": 2}]}})
    name = "a-benchmark-name-long-enough-to-be-shortened-x"
    runs = plan_runs(Benchmark(name=name, spec=spec))
    assert [(r.strategy.name, r.world_size, r.repeat) for r in runs] == [
        ("single", 1, 1), ("ddp", 1, 1), ("single", 1, 2), ("ddp", 1, 2),  # scale 1: every config, then again
        ("ddp", 2, 1), ("ddp", 2, 2),  # scale 2 (single is the same run at both scales: planned once)
    ]
    names = [r.name for r in runs]
    assert len(set(names)) == len(names)
    assert all(len(n) <= MAX_NAME_LENGTH and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", n) for n in names)
    assert all(n.endswith(f"-r{r.repeat}") for n, r in zip(names, runs))
    assert names[0][:-3] == names[2][:-3] != names[1][:-3]  # repeats share their configuration's name


def test_one_repeat_keeps_the_plain_names():
    spec = validate_spec({"sweep": {"strategies": [{"name": "ddp"}]}})
    (only,) = plan_runs(Benchmark(name="b", spec=spec))
    assert only.name == "b-ddp-fp32-1x1" and only.repeat is None


# ---------------------------------------------------------------- measures
def test_spread_is_the_sample_standard_deviation():
    assert Stat.of([10, 12, 14]) == Stat(12.0, 2.0, 3)  # sqrt(((-2)^2 + 0 + 2^2) / (3 - 1)) = 2
    assert Stat.of([7.0, None]) == Stat(7.0, None, 1)  # one measurement: spread unknown
    assert Stat.of([None]) is None


def test_scale_counts_devices_not_parameter_servers():
    ps = run("b-ps-fp32-1x2", "ps", procs=3, devices=2)  # 2 workers + 1 server in the pod
    ddp = run("b-ddp-fp32-1x2", "ddp", devices=2)
    dp = run("b-dataparallel-fp32-1x4g", "dataparallel", gpus=4, procs=1)  # one process, 4 GPUs
    assert scale_of(ps) == scale_of(ddp) and scale_of(ps).label == "1×2 CPU"
    assert scale_of(dp).label == "1×4 GPU" and scale_of(dp).devices == 4
    assert [c.name for c in configurations([ps, ddp, dp])] == [ps.name, ddp.name, dp.name]


def test_cost_per_million_tokens_prices_every_gpu_and_pod():
    prices = Prices(gpu_hour=2.0, node_hour=10.0, currency="EUR")
    big = run("b-ddp-fp32-2x4g", "ddp", nodes=2, gpus=4, tokens_per_second=10_000.0)
    assert prices.hourly(big) == 2.0 * 8 + 10.0 * 2  # 8 GPUs, 2 pods
    assert prices.per_million_tokens(big) == pytest.approx(36 / (10_000 * 3600) * 1e6)  # = 1.0 EUR
    single = run("b-single-fp32-1x1g", "single", gpus=1, tokens_per_second=3_600.0)
    assert prices.per_million_tokens(single) == pytest.approx(12 / (3_600 * 3600) * 1e6)
    cpu = run("b-ddp-fp32-1x2", "ddp", devices=2, tokens_per_second=500.0)
    assert Prices(gpu_hour=2.0).per_million_tokens(cpu) is None  # GPU prices do not cover a CPU run
    assert Prices.from_spec({"cost": {"nodeHour": 0.5}}) == Prices(0.0, 0.5, "USD")
    assert Prices.from_spec({}) is None


def test_scaling_efficiency_is_per_device_throughput_over_the_smallest_scale():
    runs = [*repeats("b-ddp-fp32-1x1", "ddp", "fp32", [1000.0, 1100.0], tokens_per_second_per_device=None),
            *repeats("b-ddp-fp32-1x2", "ddp", "fp32", [1800.0, 2000.0], devices=2)]
    for r in runs:  # per device: 1000, 1100 at 1 device; 900, 1000 at 2
        r.results.tokens_per_second_per_device = r.results.tokens_per_second / r.devices
    configs = configurations(runs)
    (eff,) = efficiencies(configs)
    assert eff.baseline is configs[0] and eff.config is configs[1]
    assert eff.stat.mean == pytest.approx(950 / 1050)
    cv = Stat.of([900, 1000]).spread / 950 + Stat.of([1000, 1100]).spread / 1050
    assert eff.stat.spread == pytest.approx(950 / 1050 * cv)
    assert run_efficiency(runs[2], configs) == pytest.approx(900 / 1050)
    assert run_efficiency(runs[0], configs) is None  # the baseline itself
    assert analyze(runs).scaling[1].efficiency == pytest.approx(950 / 1050)


# ---------------------------------------------------------------- recommendation and noise
def test_a_margin_inside_the_noise_is_no_clear_winner_and_names_the_tied_runs():
    runs = [*repeats("b-ddp-bf16-1x2", "ddp", "bf16", [95.0, 105.0, 100.0], devices=2),   # mean 100, sd 5
            *repeats("b-fsdp-bf16-1x2", "fsdp", "bf16", [99.0, 104.0, 106.0], devices=2),  # mean 103, sd 3.61
            *repeats("b-ps-bf16-1x2", "ps", "bf16", [50.0, 51.0, 52.0], devices=2)]
    rec = by(analyze(runs).recommendations, "fastest", "1×2 CPU")
    assert rec.decision == "no-clear-winner"
    assert rec.run == "b-fsdp-bf16-1x2" and rec.value == pytest.approx(103.0)
    assert rec.runner_up == "b-ddp-bf16-1x2" and rec.margin == pytest.approx(0.03)
    assert rec.combined_spread == pytest.approx((5.0 + Stat.of([99, 104, 106]).spread) / 100)
    assert rec.tied == ["b-fsdp-bf16-1x2", "b-ddp-bf16-1x2"]  # ps is 50 % behind: not tied
    assert rec.measurements == 3 and rec.spread == pytest.approx(Stat.of([99, 104, 106]).spread)


def test_a_margin_beyond_the_noise_is_a_clear_winner():
    runs = [*repeats("b-ddp-bf16-1x2", "ddp", "bf16", [198.0, 200.0, 202.0], devices=2),
            *repeats("b-fsdp-bf16-1x2", "fsdp", "bf16", [99.0, 100.0, 101.0], devices=2)]
    rec = by(analyze(runs).recommendations, "fastest", "1×2 CPU")
    assert (rec.decision, rec.run, rec.margin, rec.tied) == ("clear", "b-ddp-bf16-1x2", pytest.approx(1.0), None)
    assert rec.combined_spread == pytest.approx(3.0 / 100)


def test_single_measurements_name_a_winner_but_say_the_spread_is_unknown():
    runs = [run("b-ddp-fp32-1x2", "ddp", devices=2, tokens_per_second=110.0, peak_memory_bytes=3 * GIB),
            run("b-fsdp-fp32-1x2", "fsdp", devices=2, tokens_per_second=100.0, peak_memory_bytes=2 * GIB)]
    recs = analyze(runs).recommendations
    fastest, leanest = by(recs, "fastest", "1×2 CPU"), by(recs, "leanest", "1×2 CPU")
    assert (fastest.decision, fastest.run, fastest.margin) == ("spread-unknown", "b-ddp-fp32-1x2", pytest.approx(0.1))
    assert (leanest.decision, leanest.run) == ("spread-unknown", "b-fsdp-fp32-1x2")  # less memory wins
    assert leanest.margin == pytest.approx(1 / 3) and leanest.unit == "bytes"


def test_failed_runs_are_left_out_and_named_per_scale():
    runs = [run("b-ddp-fp32-1x2", "ddp", devices=2, tokens_per_second=10.0),
            run("b-fsdp-fp32-1x2", "fsdp", devices=2, phase="Failed"),
            run("b-single-fp32-1x1", "single", phase="Failed")]
    analysis = analyze(runs)
    rec = by(analysis.recommendations, "fastest", "1×2 CPU")
    assert (rec.decision, rec.run, rec.excluded) == ("only-candidate", "b-ddp-fp32-1x2", ["b-fsdp-fp32-1x2 (Failed)"])
    empty = by(analysis.recommendations, "fastest", "1×1 CPU")
    assert (empty.decision, empty.run, empty.excluded) == ("not-measurable", None, ["b-single-fp32-1x1 (Failed)"])
    assert analysis.recommended.run == "b-ddp-fp32-1x2"


def test_headline_is_the_fastest_at_the_largest_scale_and_every_objective_is_answered():
    runs = [run("b-ddp-fp32-1x1g", "ddp", gpus=1, tokens_per_second=100.0, tokens_per_second_per_device=100.0,
                peak_memory_bytes=GIB),
            run("b-ddp-fp32-1x2g", "ddp", gpus=2, tokens_per_second=180.0, tokens_per_second_per_device=90.0,
                peak_memory_bytes=GIB),
            run("b-fsdp-fp32-1x1g", "fsdp", gpus=1, tokens_per_second=90.0, tokens_per_second_per_device=90.0,
                peak_memory_bytes=GIB),
            run("b-fsdp-fp32-1x2g", "fsdp", gpus=2, tokens_per_second=171.0, tokens_per_second_per_device=85.5,
                peak_memory_bytes=GIB // 2)]
    analysis = analyze(runs, {"cost": {"gpuHour": 3.6}})
    assert analysis.recommended.run == "b-ddp-fp32-1x2g" and analysis.recommended.scale == "1×2 GPU"
    scalable = by(analysis.recommendations, "scalable", "1×2 GPU")
    assert (scalable.run, scalable.value, scalable.runner_up_value) == ("b-fsdp-fp32-1x2g", 0.95, 0.9)
    cheapest_overall = by(analysis.recommendations, "cheapest", None)
    # 3.6 per GPU-hour: 1 GPU at 100 tokens/s = 10 per 1M tokens; 2 GPUs at 180 tokens/s = 11.1
    assert cheapest_overall.run == "b-ddp-fp32-1x1g" and cheapest_overall.value == pytest.approx(10.0)
    assert by(analysis.recommendations, "cheapest", "1×2 GPU").run == "b-ddp-fp32-1x2g"  # ranks as fastest
    assert by(analysis.recommendations, "leanest", "1×2 GPU").run == "b-fsdp-fp32-1x2g"
    assert {(r.objective, r.scale) for r in analysis.recommendations} == {
        (o, s) for o in ("fastest", "leanest", "cheapest") for s in ("1×1 GPU", "1×2 GPU")
    } | {("cheapest", None), ("scalable", "1×2 GPU")}


def test_objectives_without_data_say_why():
    recs = analyze([run("b-ddp-fp32-1x2", "ddp", devices=2, tokens_per_second=1.0)]).recommendations
    assert by(recs, "cheapest", None).decision == "not-measurable" and "spec.cost" in by(recs, "cheapest", None).note
    assert "one scale" in by(recs, "scalable", None).note
    no_gpu_price = analyze([run("b-ddp-fp32-1x2", "ddp", devices=2, tokens_per_second=1.0)], {"cost": {"gpuHour": 1}})
    assert "nodeHour" in by(no_gpu_price.recommendations, "cheapest", None).note


def test_decide_breaks_an_exact_tie_by_plan_order_and_handles_a_zero_runner_up():
    configs = configurations([run("a", "ddp"), run("b", "fsdp")])
    from gpt2bench.report.analysis import FASTEST

    tie = decide(FASTEST, "s", [(configs[0], Stat(5.0, None, 1)), (configs[1], Stat(5.0, None, 1))], [])
    assert (tie.run, tie.margin) == ("a", 0.0)
    zero = decide(FASTEST, "s", [(configs[0], Stat(5.0, 1.0, 2)), (configs[1], Stat(0.0, 1.0, 2))], [])
    assert zero.decision == "clear" and zero.margin is None


# ---------------------------------------------------------------- the papers' findings
def finding(analysis, id_):
    return next(f for f in analysis.findings if f.id == id_)


def test_every_finding_is_not_measurable_without_its_comparison():
    analysis = analyze([run("b-single-fp32-1x1", "single", tokens_per_second=1.0, final_loss=5.0)])
    assert [f.verdict for f in analysis.findings] == ["not-measurable"] * 6
    assert all(f.measured.startswith("needs ") for f in analysis.findings)
    assert {f.id for f in analysis.findings} == {
        "fsdp-memory-below-ddp", "mixed-precision-faster", "ddp-mixed-precision-fastest-on-one-node",
        "horovod-most-robust-across-nodes", "synchronous-strategies-converge-alike", "ddp-scales-near-linearly"}


def test_fsdp_memory_uses_peak_memory_on_gpus_and_model_state_on_cpu():
    gpu = analyze([run("g-ddp", "ddp", gpus=4, peak_memory_bytes=20 * GIB),
                   run("g-fsdp", "fsdp", gpus=4, peak_memory_bytes=12 * GIB)])
    f = finding(gpu, "fsdp-memory-below-ddp")
    assert f.verdict == "holds" and "fsdp 12,288.0 MiB vs ddp 20,480.0 MiB peak memory" in f.measured
    assert "-40.0%" in f.measured
    cpu = analyze([run("c-ddp", "ddp", devices=2, peak_memory_bytes=GIB, state_bytes=100 * 2**20),
                   run("c-fsdp", "fsdp", devices=2, peak_memory_bytes=2 * GIB, state_bytes=50 * 2**20)])
    f = finding(cpu, "fsdp-memory-below-ddp")
    assert f.verdict == "holds" and "model state" in f.measured  # peak RSS (2 GiB vs 1 GiB) is not the measure


def test_mixed_precision_must_be_faster_for_every_strategy():
    base = [run("ddp32", "ddp", "fp32", gpus=2, tokens_per_second=100.0),
            run("ddp16", "ddp", "bf16", gpus=2, tokens_per_second=180.0)]
    assert finding(analyze(base), "mixed-precision-faster").verdict == "holds"
    slower = base + [run("fsdp32", "fsdp", "fp32", gpus=2, tokens_per_second=100.0),
                     run("fsdp16", "fsdp", "bf16", gpus=2, tokens_per_second=90.0)]
    f = finding(analyze(slower), "mixed-precision-faster")
    assert f.verdict == "does-not-hold" and "fsdp 1×2 GPU: bf16 90 vs fp32 100 tokens/s (-10.0%)" in f.measured


def test_a_difference_within_the_spread_makes_a_finding_inconclusive():
    runs = [*repeats("ddp32", "ddp", "fp32", [100.0, 110.0], gpus=2),
            *repeats("ddp16", "ddp", "bf16", [104.0, 112.0], gpus=2)]
    assert finding(analyze(runs), "mixed-precision-faster").verdict == "inconclusive"


def test_ddp_with_mixed_precision_fastest_on_one_node():
    runs = [run("ddp16", "ddp", "fp16", gpus=4, tokens_per_second=400.0),
            run("hvd16", "horovod", "fp16", gpus=4, tokens_per_second=380.0),
            run("ddp32", "ddp", "fp32", gpus=4, tokens_per_second=200.0)]
    f = finding(analyze(runs), "ddp-mixed-precision-fastest-on-one-node")
    assert f.verdict == "holds" and "horovod-fp16" in f.measured
    runs[1].results.tokens_per_second = 500.0
    assert finding(analyze(runs), "ddp-mixed-precision-fastest-on-one-node").verdict == "does-not-hold"


def test_horovod_robustness_compares_scaling_efficiency_across_nodes():
    def pair(strategy, per_device_1, per_device_2):
        return [run(f"{strategy}-1x4g", strategy, gpus=4, tokens_per_second_per_device=per_device_1,
                    tokens_per_second=4 * per_device_1),
                run(f"{strategy}-2x4g", strategy, nodes=2, gpus=4, tokens_per_second_per_device=per_device_2,
                    tokens_per_second=8 * per_device_2)]
    runs = pair("horovod", 100.0, 90.0) + pair("ddp", 120.0, 84.0)  # 0.90 vs 0.70
    f = finding(analyze(runs), "horovod-most-robust-across-nodes")
    assert f.verdict == "holds" and "horovod 0.90 vs the best other, ddp, 0.70" in f.measured
    assert finding(analyze(pair("horovod", 100.0, 90.0)), "horovod-most-robust-across-nodes").verdict == (
        "not-measurable")  # no other strategy to compare with


def steps(losses):
    return [{"step": i, "loss": loss, "step_seconds": 0.1} for i, loss in enumerate(losses, start=1)]


def test_synchronous_strategies_agree_on_the_loss_curve_within_one_percent():
    runs = [run("ddp", "ddp", devices=2, final_loss=9.0), run("fsdp", "fsdp", devices=2, final_loss=9.0),
            run("ps", "ps", devices=2, final_loss=7.0)]
    curves = {"ddp": steps([10.0, 9.5, 9.0]), "fsdp": steps([10.0, 9.52, 9.0]), "ps": steps([10.0, 8.0, 7.0])}
    spec = {"sweep": {"strategies": [{"name": "ddp"}, {"name": "fsdp"}, {"name": "ps", "psMode": "async"}]}}
    f = finding(analyze(runs, spec, curves), "synchronous-strategies-converge-alike")
    assert f.verdict == "holds"  # 0.02 / 9.51 = 0.21 % at step 2; async ps is left out
    assert "ddp, fsdp: largest loss gap 0.210% (loss per step, 3 steps)" in f.measured and "async" in f.measured
    curves["fsdp"] = steps([10.0, 9.0, 8.5])
    assert finding(analyze(runs, spec, curves), "synchronous-strategies-converge-alike").verdict == "does-not-hold"
    f = finding(analyze(runs, spec), "synchronous-strategies-converge-alike")  # the operator: no curves
    assert f.verdict == "holds" and "final loss" in f.measured


def test_ddp_near_linear_scaling_means_efficiency_at_least_0_9():
    def ddp(per_device_2):
        return [run("d1", "ddp", gpus=1, tokens_per_second_per_device=100.0, tokens_per_second=100.0),
                run("d2", "ddp", gpus=2, tokens_per_second_per_device=per_device_2,
                    tokens_per_second=2 * per_device_2)]
    assert finding(analyze(ddp(95.0)), "ddp-scales-near-linearly").verdict == "holds"
    assert finding(analyze(ddp(90.0)), "ddp-scales-near-linearly").verdict == "holds"  # at least 0.9
    f = finding(analyze(ddp(60.0)), "ddp-scales-near-linearly")
    assert f.verdict == "does-not-hold" and "1×1 GPU → 1×2 GPU: scaling efficiency 0.60" in f.measured
    assert findings.NEAR_LINEAR == 0.9
