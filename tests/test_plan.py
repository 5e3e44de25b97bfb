"""Planning: the sweep becomes runs with the right topology, order and names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpt2bench.plan import MAX_NAME_LENGTH, dns_label, fit_name, order_seed, plan_runs, round_order
from gpt2bench.specification.validation import load_benchmark, load_benchmark_file
from gpt2bench.trainer.config import TrainConfig

EXAMPLES = Path(__file__).resolve().parents[1] / "manifests" / "examples"
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def benchmark(spec: dict, name: str = "bench"):
    return load_benchmark(
        {"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark", "metadata": {"name": name}, "spec": spec}
    )


def test_order_is_scales_then_strategies_then_precisions():
    runs = plan_runs(
        benchmark(
            {
                "sweep": {
                    "strategies": [{"name": "ddp"}, {"name": "fsdp"}],
                    "precisions": ["fp32", "bf16"],
                    "scales": [{"nodes": 1, "processesPerNode": 2}, {"nodes": 2, "processesPerNode": 2}],
                }
            }
        )
    )
    assert [r.name for r in runs] == [
        "bench-ddp-fp32-1x2", "bench-ddp-bf16-1x2", "bench-fsdp-fp32-1x2", "bench-fsdp-bf16-1x2",
        "bench-ddp-fp32-2x2", "bench-ddp-bf16-2x2", "bench-fsdp-fp32-2x2", "bench-fsdp-bf16-2x2",
    ]  # fmt: skip
    assert [r.index for r in runs] == list(range(8))
    assert [r.world_size for r in runs] == [2, 2, 2, 2, 4, 4, 4, 4]


def test_single_runs_once_per_precision_on_one_process_and_one_gpu():
    runs = plan_runs(
        benchmark(
            {
                "sweep": {
                    "strategies": [{"name": "single"}, {"name": "ddp"}],
                    "precisions": ["fp16", "bf16"],
                    "scales": [{"nodes": 1, "devicesPerNode": 4}, {"nodes": 2, "devicesPerNode": 4}],
                }
            }
        )
    )
    singles = [r for r in runs if r.strategy.name == "single"]
    assert [r.name for r in singles] == ["bench-single-fp16-1x1g", "bench-single-bf16-1x1g"]
    assert all((r.nodes, r.procs_per_node, r.world_size, r.devices_per_node) == (1, 1, 1, 1) for r in singles)
    assert len(runs) == 2 + 2 * 2


def test_dataparallel_is_one_process_owning_the_nodes_gpus():
    gpu, cpu = (
        plan_runs(benchmark({"sweep": {"strategies": [{"name": "dataparallel"}], "scales": [{"devicesPerNode": d}]}}))[
            0
        ]
        for d in (4, 0)
    )
    assert (gpu.nodes, gpu.procs_per_node, gpu.world_size, gpu.devices_per_node) == (1, 1, 1, 4)
    assert gpu.name == "bench-dataparallel-fp32-1x4g"
    assert (cpu.nodes, cpu.procs_per_node, cpu.world_size, cpu.devices_per_node) == (1, 1, 1, 0)
    assert cpu.name == "bench-dataparallel-fp32-1x1"


def test_dataparallel_on_cpu_is_planned_once_across_cpu_scales():
    runs = plan_runs(
        benchmark(
            {
                "sweep": {
                    "strategies": [{"name": "dataparallel"}, {"name": "ddp"}],
                    "scales": [{"processesPerNode": 2}, {"processesPerNode": 4}],
                }
            }
        )
    )
    assert [r.name for r in runs] == ["bench-dataparallel-fp32-1x1", "bench-ddp-fp32-1x2", "bench-ddp-fp32-1x4"]


@pytest.mark.parametrize(
    "strategy, nodes, per_node, procs, world",
    [
        ({"name": "ps"}, 1, 2, 3, 2),  # 1 server
        ({"name": "ps", "psServers": 2}, 2, 2, 3, 4),  # one server per node
        ({"name": "ps-sharded"}, 1, 2, 4, 2),  # 2 servers
        ({"name": "ps-sharded", "psServers": 4}, 2, 3, 5, 6),
    ],
)
def test_parameter_servers_are_added_to_the_processes_of_each_node(strategy, nodes, per_node, procs, world):
    (run,) = plan_runs(
        benchmark({"sweep": {"strategies": [strategy], "scales": [{"nodes": nodes, "processesPerNode": per_node}]}})
    )
    assert run.procs_per_node == procs
    assert run.world_size == world
    assert run.nodes * run.procs_per_node == world + run.ps_servers  # every process: workers and servers
    assert run.procs_per_node - run.ps_servers // run.nodes == per_node  # each pod keeps the workers asked for
    assert run.name.endswith(f"-{nodes}x{per_node}")  # the name shows the workers the user asked for


def test_horovod_is_an_mpijob_and_the_rest_pytorchjobs():
    runs = plan_runs(benchmark({"sweep": {"strategies": [{"name": n} for n in ("horovod", "ddp", "fsdp", "ps")]}}))
    assert [r.job_kind for r in runs] == ["MPIJob", "PyTorchJob", "PyTorchJob", "PyTorchJob"]


def test_long_names_are_truncated_with_a_hash_and_stay_unique():
    name = "a-very-long-benchmark-name-that-goes-on-and-on-and-on"
    runs = plan_runs(
        benchmark(
            {"sweep": {"strategies": [{"name": "ps-sharded"}, {"name": "ps"}], "precisions": ["fp32", "bf16", "fp16"]}},
            name=name,
        )
    )
    names = [r.name for r in runs]
    assert len(set(names)) == len(names) == 6
    assert all(len(n) <= MAX_NAME_LENGTH <= 63 and DNS_LABEL.fullmatch(n) for n in names), names
    assert all(re.search(r"-[0-9a-f]{8}$", n) for n in names)
    assert all(n.startswith("a-very-long-benchmark") for n in names)


def test_names_are_deterministic():
    spec = {"sweep": {"strategies": [{"name": "ddp"}], "precisions": ["bf16"]}}
    long = "x" * 60
    assert [r.name for r in plan_runs(benchmark(spec, long))] == [r.name for r in plan_runs(benchmark(spec, long))]


@pytest.mark.parametrize(
    "raw, label",
    [("Cpu.Sweep", "cpu-sweep"), ("1bench", "g2b-1bench"), ("a..b--c", "a-b-c"), ("--x--", "x"), ("", "g2b")],
)
def test_dns_label(raw, label):
    assert dns_label(raw) == label


def test_fit_name_keeps_short_names_and_hashes_long_ones():
    assert fit_name("short") == "short"
    long_a, long_b = "n" * 70 + "a", "n" * 70 + "b"
    assert fit_name(long_a) != fit_name(long_b)
    assert len(fit_name(long_a)) == MAX_NAME_LENGTH


def test_trainer_args_carry_every_option():
    run = plan_runs(
        benchmark(
            {
                "model": {"preset": "custom", "nLayer": 2, "nHead": 2, "nEmbd": 64, "nPositions": 128},
                "data": {"source": "hf:wikitext", "maxDocuments": 10},
                "training": {
                    "steps": 7,
                    "warmupSteps": 1,
                    "microBatchSize": 3,
                    "gradAccum": 2,
                    "seqLen": 32,
                    "lr": 0.001,
                    "seed": 7,
                    "maxGradNorm": 0.5,
                },
                "sweep": {
                    "strategies": [
                        {"name": "ddp", "bucketCapMb": 25, "staticGraph": True, "gradientAsBucketView": False}
                    ],
                    "precisions": ["bf16"],
                    "scales": [{"devicesPerNode": 2}],
                },
                "metrics": {"port": 9500},
            },
            name="b",
        )
    )[0]
    args = run.trainer_args()
    pairs = dict(zip(args, args[1:], strict=False))  # each flag -> the word after it
    expected = {
        "--strategy": "ddp", "--precision": "bf16", "--model": "custom", "--n-layer": "2", "--n-head": "2",
        "--n-embd": "64", "--n-positions": "128", "--steps": "7", "--warmup-steps": "1", "--micro-batch-size": "3",
        "--grad-accum": "2", "--seq-len": "32", "--lr": "0.001", "--seed": "7", "--max-grad-norm": "0.5",
        "--data": "hf:wikitext", "--max-documents": "10", "--device": "cuda", "--metrics-port": "9500",
        "--benchmark": "b", "--run": "b-ddp-bf16-1x2g", "--bucket-cap-mb": "25.0",
        "--output": "$(GPT2BENCH_OUTPUT_DIR)",
    }  # fmt: skip
    for flag, value in expected.items():
        assert pairs.get(flag) == value, (flag, args)
    assert "--static-graph" in args  # True -> bare flag
    assert "--no-gradient-as-bucket-view" in args  # an explicit False is passed on, not left to a default
    assert "--pretrained" not in args  # unset options are left out


def test_trainer_args_parse_with_the_trainers_own_parser():
    from gpt2bench.trainer.config import build_parser

    spec = {
        "model": {"preset": "custom", "nLayer": 2, "nHead": 2, "nEmbd": 64},
        "data": {"maxDocuments": 5},
        "sweep": {
            "strategies": [
                {"name": "ddp", "bucketCapMb": 25, "staticGraph": True, "gradientAsBucketView": True},
                {"name": "fsdp", "reshardAfterForward": False},
                {"name": "ps-sharded", "psServers": 2, "psMode": "async"},
                {"name": "horovod"},
            ],
            "precisions": ["bf16"],
            "scales": [{"processesPerNode": 2}],
        },
    }
    parser = build_parser()
    runs = plan_runs(benchmark(spec))
    for run in runs:
        parsed = vars(parser.parse_args(run.trainer_args(output="/tmp/out")))
        assert parsed["strategy"] == run.strategy.name and parsed["run"] == run.name
        assert parsed["output"] == "/tmp/out" and parsed["n_embd"] == 64 and parsed["max_documents"] == 5
    ddp, fsdp, ps, _ = (vars(parser.parse_args(r.trainer_args())) for r in runs)
    assert ddp["static_graph"] and ddp["gradient_as_bucket_view"] and ddp["bucket_cap_mb"] == 25
    assert fsdp["reshard_after_forward"] is False
    assert (ps["ps_servers"], ps["ps_mode"]) == (2, "async")


def test_trainer_args_for_fsdp_and_ps_options():
    runs = plan_runs(
        benchmark(
            {
                "sweep": {
                    "strategies": [{"name": "fsdp", "reshardAfterForward": False}, {"name": "ps", "psMode": "async"}],
                    "scales": [{"processesPerNode": 2}],
                }
            }
        )
    )
    fsdp, ps = (r.trainer_args() for r in runs)
    assert "--no-reshard-after-forward" in fsdp and "--ps-servers" not in fsdp
    assert "--ps-servers" not in ps and ps[ps.index("--ps-mode") + 1] == "async"
    assert TrainConfig.from_argv(ps).strategy.servers == 1  # the trainer resolves ps's default as the plan does
    assert ps[ps.index("--device") + 1] == "cpu"


def test_cpu_example_plans_a_breakdown_round_then_three_shuffled_rounds_with_two_workers():
    runs = plan_runs(load_benchmark_file(str(EXAMPLES / "cpu-sweep.yaml")))
    assert len(runs) == 40  # 5 strategies x 2 precisions x (the breakdown round + 3 repeats)
    assert [r.profile for r in runs] == [True] * 10 + [False] * 30
    assert [r.repeat for r in runs] == [None] * 10 + [1] * 10 + [2] * 10 + [3] * 10  # every configuration per round
    assert all(r.breakdown == r.profile for r in runs)  # no decision run is slowed by the breakdown's hooks
    by_strategy = {r.strategy.name: r for r in runs}
    assert set(by_strategy) == {"single", "ddp", "fsdp", "horovod", "ps"}
    assert by_strategy["ddp"].world_size == by_strategy["horovod"].world_size == 2
    assert (by_strategy["ps"].ps_servers, by_strategy["ps"].procs_per_node) == (1, 3)
    assert all("cpu" in r.name for r in runs)


def _configuration(run):
    return (run.strategy.name, run.precision, run.nodes, run.world_size)


def test_rounds_are_the_outer_loop_over_every_scale_each_shuffled_with_a_recorded_seed():
    spec = {"sweep": {"strategies": [{"name": "single"}, {"name": "ddp"}, {"name": "fsdp"}],
                      "precisions": ["fp32", "bf16"], "repeats": 3, "breakdown": "inline",
                      "scales": [{"processesPerNode": 1}, {"processesPerNode": 2}]}}
    runs = plan_runs(benchmark(spec))
    configs = 2 * 3 + 2 * 2  # scale 1: 3 strategies x 2 precisions; scale 2: ddp, fsdp (single planned once)
    assert len(runs) == 3 * configs and [r.index for r in runs] == list(range(len(runs)))
    rounds = [runs[k * configs:(k + 1) * configs] for k in range(3)]
    for k, round_ in enumerate(rounds, start=1):
        assert {r.repeat for r in round_} == {k}
        assert len({_configuration(r) for r in round_}) == configs  # every configuration of every scale once
        assert {r.world_size for r in round_} == {1, 2}  # both scales in each round
    orders = [[_configuration(r) for r in round_] for round_ in rounds]
    assert len({tuple(order) for order in orders}) == 3  # a new order in every round
    listed = [_configuration(r) for r in plan_runs(benchmark({"sweep": {**spec["sweep"], "repeats": 1}}))]
    assert orders[0] != listed and sorted(orders[0]) == sorted(listed)  # shuffled, not the spec's order
    # the order is a function of the seed alone: the same seed, the same order; another seed, another order
    again = [_configuration(r) for r in plan_runs(benchmark(spec))]
    assert again == [c for order in orders for c in order]
    reseeded = plan_runs(benchmark({"sweep": {**spec["sweep"], "orderSeed": 7}}))
    assert [_configuration(r) for r in reseeded[:configs]] == round_order(listed, 7, 1)
    assert order_seed(benchmark({"sweep": {**spec["sweep"], "orderSeed": 7}})) == 7


def test_each_round_trains_with_its_own_seed_and_every_configuration_of_a_round_with_the_same():
    spec = {"training": {"seed": 40}, "sweep": {"strategies": [{"name": "ddp"}, {"name": "fsdp"}], "repeats": 2}}
    runs = plan_runs(benchmark(spec))
    seeds = {(r.profile, r.repeat): set() for r in runs}
    for r in runs:
        args = r.trainer_args()
        seeds[(r.profile, r.repeat)].add(int(args[args.index("--seed") + 1]))
    assert seeds == {(True, None): {40}, (False, 1): {40}, (False, 2): {41}}
    (one,) = plan_runs(benchmark({"training": {"seed": 40}, "sweep": {"strategies": [{"name": "ddp"}]}}))
    assert one.seed == 40 and one.repeat is None and one.breakdown  # one round: it times the breakdown


def test_the_breakdown_hooks_run_where_sweep_breakdown_says():
    def flags(mode, repeats=2):
        spec = {"sweep": {"strategies": [{"name": "ddp"}], "repeats": repeats, "breakdown": mode}}
        return [(r.name.rsplit("-", 1)[-1], "--breakdown" in r.trainer_args()) for r in plan_runs(benchmark(spec))]
    assert flags("separate") == [("prof", True), ("r1", False), ("r2", False)]
    assert flags("inline") == [("r1", True), ("r2", True)]
    assert flags("off") == [("r1", False), ("r2", False)]
    assert flags("separate", repeats=1) == [("1x1", True)]  # nothing to decide: the one round times it
