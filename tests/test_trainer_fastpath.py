"""In-process checks of the fast path and of the figures that must mean the same everywhere (issues 7 and 8):
the padded vocabulary, the chunked loss, the GPU peak table, lazy per-step figures, the data pipeline, the
precision recipe's pieces, and the summary's derived figures."""

from __future__ import annotations

import resource
import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_trainer_units import FakeClock

from gpt2bench.trainer.config import TrainConfig
from gpt2bench.trainer.data import BatchLoader, ShardedBatches, token_file
from gpt2bench.trainer.devices import PEAK_TABLE, PeakMemory, StepClock, math_precision, peak_flops
from gpt2bench.trainer.loss import cross_entropy
from gpt2bench.trainer.metrics import MetricsProcessor
from gpt2bench.trainer.model import VOCAB_SIZE, build_model, count_params, flops_per_token, vocab_sizes

TINY = {"model": {"preset": "custom", "n_layer": 1, "n_head": 2, "n_embd": 32}, "training": {"seq_len": 16}}


# ----------------------------------------------------------------------------- the model's fast path
def test_padded_model_computes_what_the_unpadded_one_computes():
    """Same seed, same weights; the padded rows are zeros, never in the softmax, and get no gradient."""
    from transformers import GPT2LMHeadModel

    from gpt2bench.trainer.model import gpt2_config

    config = TrainConfig(**TINY)
    padded = build_model(config)
    torch.manual_seed(config.training.seed)
    plain = GPT2LMHeadModel(gpt2_config(config)).float().train()
    assert vocab_sizes(padded) == (VOCAB_SIZE, 50304) and plain.config.vocab_size == VOCAB_SIZE
    assert padded.lm_head.weight is padded.transformer.wte.weight  # still tied
    assert padded.config._attn_implementation == "sdpa"
    assert padded.config.activation_function == "gelu_pytorch_tanh"  # gelu_new's function in one kernel
    assert torch.equal(padded.transformer.wte.weight[:VOCAB_SIZE], plain.transformer.wte.weight)
    assert not padded.transformer.wte.weight[VOCAB_SIZE:].any()
    tokens = torch.randint(0, VOCAB_SIZE, (2, 17))
    ours = cross_entropy(padded(input_ids=tokens[:, :-1]).logits, tokens[:, 1:], VOCAB_SIZE)
    theirs = F.cross_entropy(plain(input_ids=tokens[:, :-1]).logits.flatten(0, 1), tokens[:, 1:].flatten())
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6)
    ours.backward()
    theirs.backward()
    grad = padded.transformer.wte.weight.grad
    assert not grad[VOCAB_SIZE:].any()
    assert torch.allclose(grad[:VOCAB_SIZE], plain.transformer.wte.weight.grad, atol=1e-7)
    # the counted parameters and FLOPs are the real model's: padding rows compute nothing useful
    assert count_params(padded) == sum(p.numel() for p in plain.parameters())  # parameters() lists a tied one once


def test_gpt2_counts_124m_parameters_and_its_flops_per_token():
    model = build_model(TrainConfig(model={"preset": "gpt2"}))
    assert count_params(model) == 124_439_808
    assert flops_per_token(model.config, 1024, 124_439_808) == 6 * (124_439_808 - 1024 * 768) + 12 * 12 * 768 * 1024


def test_a_pretrained_checkpoint_is_padded_and_gets_the_one_kernel_gelu_on_load(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    saved = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=64))  # gelu_new, 50257 rows
    saved.save_pretrained(tmp_path / "ckpt")
    model = build_model(TrainConfig(model={"pretrained": str(tmp_path / "ckpt")}, training={"seq_len": 32}))
    assert vocab_sizes(model) == (50257, 50304) and model.config.activation_function == "gelu_pytorch_tanh"
    assert torch.equal(model.transformer.wte.weight[:50257], saved.transformer.wte.weight)
    assert model.config.resid_pdrop == model.config.attn_pdrop == 0.0  # no dropout: ranks stay comparable
    tokens = torch.randint(0, VOCAB_SIZE, (1, 9))
    saved.eval()  # its own dropout off
    with torch.no_grad():  # the same function: gelu_new and gelu_pytorch_tanh agree to rounding
        ours = model(input_ids=tokens).logits[..., :VOCAB_SIZE]
        theirs = saved(input_ids=tokens).logits
    assert torch.allclose(ours, theirs, atol=1e-5)


# ----------------------------------------------------------------------------- the chunked loss
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_cross_entropy_is_the_fp32_cross_entropy_of_the_real_vocabulary(dtype, monkeypatch):
    import gpt2bench.trainer.loss as loss

    monkeypatch.setattr(loss, "CHUNK_ELEMENTS", 7 * 1000)  # 7 rows a chunk: several chunks and a ragged end
    logits = torch.randn(50, 1024, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, 1000, (50,))
    ours = cross_entropy(logits, targets, 1000)
    (ours * 3).backward()  # a gradient into the loss that is not 1
    mine, logits.grad = logits.grad, None
    reference = F.cross_entropy(logits[:, :1000].float(), targets)
    (reference * 3).backward()
    assert ours.dtype == torch.float32 and ours.item() == pytest.approx(reference.item(), rel=1e-6)
    assert mine.dtype == dtype and not mine[:, 1000:].any()
    assert torch.allclose(mine.float(), logits.grad.float(), atol=1e-8 if dtype == torch.float32 else 1e-4)


def test_the_loss_keeps_no_full_vocabulary_fp32_copy_of_the_logits():
    """What autograd saves for backward: the bf16 logits and one float per token, never fp32 logits."""
    logits = torch.randn(64, 1024, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, 1000, (64,))
    saved = []

    def pack(tensor):
        saved.append((tensor.dtype, tensor.numel()))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        ours = cross_entropy(logits, targets, 1000)
    assert (torch.float32, 64 * 1024) not in saved and (torch.float32, 64 * 1000) not in saved
    assert max(n for dtype, n in saved if dtype == torch.float32) == 64  # the log-sum-exp per token
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        F.cross_entropy(logits[:, :1000].float(), targets)  # what the loop did before
    assert (torch.float32, 64 * 1000) in saved
    ours.backward()


# ----------------------------------------------------------------------------- the GPU peak table
T = 1e12
DEVICE_PEAKS = [  # torch.cuda.get_device_name() as the GPUs report it -> (fp32, tf32, bf16, fp16), dense
    ("NVIDIA H100 80GB HBM3", (67 * T, 494.5 * T, 989.5 * T, 989.5 * T)),
    ("NVIDIA H100 PCIe", (51.2 * T, 378 * T, 756 * T, 756 * T)),
    ("NVIDIA H100 NVL", (60 * T, 417.5 * T, 835.5 * T, 835.5 * T)),
    ("NVIDIA H200", (67 * T, 494.5 * T, 989.5 * T, 989.5 * T)),
    ("NVIDIA H200 NVL", (60 * T, 417.5 * T, 835.5 * T, 835.5 * T)),
    ("NVIDIA GH200 480GB", (67 * T, 494.5 * T, 989.5 * T, 989.5 * T)),
    ("NVIDIA A100-SXM4-80GB", (19.5 * T, 156 * T, 312 * T, 312 * T)),
    ("NVIDIA A100 80GB PCIe", (19.5 * T, 156 * T, 312 * T, 312 * T)),
    ("NVIDIA A10", (31.2 * T, 62.5 * T, 125 * T, 125 * T)),
    ("NVIDIA A10G", (31.2 * T, 35 * T, 70 * T, 70 * T)),
    ("NVIDIA L4", (30.3 * T, 60 * T, 121 * T, 121 * T)),
    ("NVIDIA L40", (90.5 * T, 90.5 * T, 181 * T, 181 * T)),
    ("NVIDIA L40S", (91.6 * T, 183 * T, 362 * T, 362 * T)),
    ("Tesla V100-SXM2-32GB", (15.7 * T, None, None, 125 * T)),
    ("Tesla V100-PCIE-16GB", (14 * T, None, None, 112 * T)),
    ("Tesla V100S-PCIE-32GB", (16.4 * T, None, None, 130 * T)),
    ("Tesla T4", (8.1 * T, None, None, 65 * T)),
    ("NVIDIA A30", (10.3 * T, 82 * T, 165 * T, 165 * T)),
    ("NVIDIA GeForce RTX 4090", (None, None, None, None)),  # not in the table: no MFU rather than a wrong one
]


@pytest.mark.parametrize("name, peaks", DEVICE_PEAKS)
def test_peak_flops_by_device_name(name, peaks):
    fp32, tf32, bf16, fp16 = peaks
    assert peak_flops(name, "fp32", tf32=False) == fp32
    assert peak_flops(name, "fp32", tf32=True) == tf32
    assert peak_flops(name, "bf16", tf32=False) == bf16  # None: no bf16 units
    assert peak_flops(name, "fp16", tf32=True) == fp16


def test_every_table_row_is_reachable_and_the_math_precision_is_named():
    import re

    for pattern, _ in PEAK_TABLE:
        assert any(re.search(pattern, name, re.IGNORECASE) for name, _ in DEVICE_PEAKS), pattern
    assert [math_precision(p, t) for p, t in [("fp32", False), ("fp32", True), ("bf16", True), ("fp16", False)]] == \
        ["fp32", "tf32", "bf16", "fp16"]


# ----------------------------------------------------------------------------- lazy, exact per-step figures
def test_figures_read_at_a_log_step_are_each_steps_own(tmp_path):
    """Three steps left pending, then one flush: one reduction for all of them, each record its own figures."""
    config = TrainConfig(process={"output": str(tmp_path)}, training={"warmup_steps": 1, "steps": 3})
    processor = MetricsProcessor(config=config, rank=0, tokens_per_step=600, devices=3, device=torch.device("cpu"),
                                 flops_per_token=1e6, peak_flops=None)
    processor.clock = FakeClock([10.0, 10.5, 11.0, 12.0, 12.5, 12.75])  # start/end of 3 steps, gaps between
    reductions = []

    def reduce(losses):
        reductions.append(losses.clone())
        return losses / 2  # e.g. a mean over two workers whose other half is 0

    for step, (loss, norm, skipped) in enumerate([(4.0, 1.0, False), (3.0, 2.0, torch.tensor(True)), (2.0, 3.0, False)], 1):
        start = processor.start_step()
        processor.end_step(step, start, torch.tensor(loss), torch.tensor(norm), skipped, 0.1, 0.01 * step)
    assert processor.totals.steps == 0 and not (tmp_path / "steps.jsonl").read_text()  # nothing read yet
    records = processor.flush(reduce)
    assert len(reductions) == 1 and reductions[0].tolist() == [4.0, 3.0, 2.0]
    assert [r["step_seconds"] for r in records] == [0.5, 1.0, 0.25]  # between each step's own marks
    assert [r["loss"] for r in records] == [2.0, 1.5, 1.0] and [r["grad_norm"] for r in records] == [1.0, 2.0, 3.0]
    assert [r["skipped"] for r in records] == [False, True, False]
    assert [r["tokens_per_second"] for r in records] == [1200, 600, 2400]
    assert [r["data_loading_seconds"] for r in records] == [0.01, 0.02, 0.03]
    assert [r["warmup"] for r in records] == [True, False, False]
    assert len((tmp_path / "steps.jsonl").read_text().splitlines()) == 3
    assert processor.flush(reduce) == [] and len(reductions) == 1  # nothing pending: no collective


def test_step_clock_and_peak_memory_on_cpu():
    clock = StepClock(torch.device("cpu"))
    start = clock.mark()
    end = clock.mark()
    assert 0 <= clock.seconds(start, end) < 0.1
    memory = PeakMemory(torch.device("cpu"))
    big = np.ones(40_000_000)  # 320 MB resident
    del big
    before = memory.read()
    memory.reset()  # the high-water mark restarts from what is resident now
    after = memory.read()
    assert before["device_bytes"] is None and after["device_bytes"] is None
    assert before["host_bytes"] > after["host_bytes"] + 250e6 or memory.host_since_start


# ----------------------------------------------------------------------------- the data pipeline
def test_prefetched_batches_are_the_batches_in_order():
    tokens = np.arange(9 * 300, dtype=np.uint16)
    shards = ShardedBatches(tokens, 8, 2, 3, 0, 1, seed=5)
    loader = BatchLoader(shards, torch.device("cpu"))
    for step in range(3):
        for micro in range(3):
            batch = loader.get(step, micro)
            assert batch.dtype == torch.int64 and torch.equal(batch, shards.micro_batch(step, micro))
            loader.prefetch_after(step, micro)
            assert loader._ahead[0] == ((step, micro + 1) if micro < 2 else (step + 1, 0))
    assert loader.seconds > 0


def test_a_nine_billion_token_store_is_mapped_not_copied(tmp_path):
    """18 GB of uint16 tokens (a sparse file): batches come from the map; the process stays small."""
    store = tmp_path / "tokens.bin"
    with open(store, "wb") as f:
        f.truncate(2 * 9_000_000_000)
    tokens = token_file(store)
    assert len(tokens) == 9_000_000_000
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    shards = ShardedBatches(tokens, 1024, 16, 1, 0, 1, seed=1)
    batch = shards.micro_batch(0, 0)
    assert batch.shape == (16, 1025) and batch.dtype == torch.int64
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
    assert grown < 500e6, grown  # the block order (8.8 M int64 = 70 MB), not 72 GB of int64 tokens


# ----------------------------------------------------------------------------- the precision recipe's pieces
def test_a_replica_thread_runs_the_runs_autocast_dtype():
    """DataParallel re-enters autocast in its replica threads with no dtype (fp16 on CUDA): the wrapped
    module sets the run's own dtype. Here a thread opens autocast with fp16 as DataParallel's would."""
    from gpt2bench.trainer.parallel.dataparallel import AutocastForward

    layer = torch.nn.Linear(4, 4)
    wrapped = AutocastForward(layer, lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    seen = {}

    def replica(module, key):
        with torch.autocast("cpu", dtype=torch.float16):  # what the thread would otherwise run in
            seen[key] = module(torch.randn(2, 4)).dtype

    for module, key in ((layer, "bare"), (wrapped, "wrapped")):
        thread = threading.Thread(target=replica, args=(module, key))
        thread.start()
        thread.join()
    assert seen == {"bare": torch.float16, "wrapped": torch.bfloat16}


def test_dataparallel_wraps_the_model_in_the_autocast_forward_with_two_gpus(monkeypatch):
    from gpt2bench.trainer.env import detect_env
    from gpt2bench.trainer.parallel.dataparallel import AutocastForward, DataParallelism

    strategy = DataParallelism(TrainConfig(strategy={"name": "dataparallel"}, precision="bf16"), detect_env({}))
    strategy.devices_per_worker = 2  # as with 2 GPUs (DataParallel itself is inert without CUDA)
    wrapped = strategy.wrap(torch.nn.Linear(2, 2))
    assert isinstance(wrapped, torch.nn.DataParallel) and isinstance(wrapped.module, AutocastForward)
    assert strategy.compile(build_model(TrainConfig(**TINY))) is False and "torch.compile" in strategy.notes[-1]


def test_the_scaler_reports_a_skipped_step_lazily():
    from gpt2bench.trainer.parallel.base import update_scaler

    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    results = []
    for poison in (False, True, False):
        scaler.scale(weight.sum()).backward()
        if poison:
            weight.grad[0] = float("inf")
        scaler.step(optimizer)
        skipped = update_scaler(scaler)
        results.append(bool(skipped))
        optimizer.zero_grad()
    assert results == [False, True, False] and scaler.get_scale() == 512.0
    assert update_scaler(torch.amp.GradScaler("cpu", enabled=False)) is False


def test_more_workers_than_gpus_on_a_node_is_an_error_naming_the_scale(monkeypatch):
    from gpt2bench.trainer.env import detect_env
    from gpt2bench.trainer.parallel import strategy_class

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    env = detect_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                      "MASTER_ADDR": "x", "MASTER_PORT": "1"})
    with pytest.raises(RuntimeError, match=r"scale 1x2 .*2 workers on this node but 1 GPU"):
        strategy_class("ddp")(TrainConfig(strategy={"name": "ddp"}, process={"device": "cuda"}), env)
    # parameter servers share the node's GPUs: 1 server + 1 worker on one GPU is fine
    ps = strategy_class("ps")(TrainConfig(strategy={"name": "ps"}, process={"device": "cuda"}), env)
    assert ps.is_worker and ps.device == torch.device("cuda", 0)
    server_env = detect_env({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                             "MASTER_ADDR": "x", "MASTER_PORT": "1"})
    server = strategy_class("ps")(TrainConfig(strategy={"name": "ps"}, process={"device": "cuda"}), server_env)
    assert not server.is_worker and server.device == torch.device("cuda", 0)
    cpu_server = strategy_class("ps")(TrainConfig(strategy={"name": "ps", "ps_server_device": "cpu"},
                                                  process={"device": "cuda"}), server_env)
    assert cpu_server.device == torch.device("cpu")
    three = detect_env({"RANK": "2", "WORLD_SIZE": "3", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "3",
                        "MASTER_ADDR": "x", "MASTER_PORT": "1"})
    with pytest.raises(RuntimeError, match="2 workers on this node but 1 GPU"):
        strategy_class("ps")(TrainConfig(strategy={"name": "ps"}, process={"device": "cuda"}), three)


def test_the_tied_embedding_is_broadcast_once():
    from gpt2bench.trainer.parallel.base import distinct_tensors

    model = build_model(TrainConfig(**TINY))
    names = [name for name, _ in distinct_tensors(model)]
    assert len(model.state_dict()) == len(names) + 1  # state_dict lists wte and lm_head
    assert len({id(t) for _, t in distinct_tensors(model)}) == len(names)
    assert "lm_head.weight" not in names


# ----------------------------------------------------------------------------- the summary's derived figures
class _Strategy:
    world_size, devices_per_worker, notes, extra_summary = 2, 1, [], {}
    transport_between_nodes = None  # one node: nothing crosses a network

    def __init__(self, independent=False):
        self.independent_steps = independent
        self.device = torch.device("cpu")


def _payload(rank, rate, records=None, **extra):
    from gpt2bench.trainer.summary import summarize

    figures = summarize(records, 2) if records is not None else None  # as worker 0's MetricsProcessor.finish
    return {"is_worker": True, "worker_rank": rank, "job_rank": rank, "step_figures": figures, "devices": 2,
            "own_tokens_per_second": rate, "flops_per_token": 1e6, "peak_flops": 1e11, "device_type": "cpu",
            "step_end_times": extra.pop("ends", None), "host_peak_bytes": 100 + rank,
            "setup_host_peak_bytes": 50 + rank, **extra}


def _records(seconds, tokens=400, skipped=(), compile_at=()):
    return [{"step": i, "warmup": i == 1, "loss": 1.0, "grad_norm": 1.0, "step_seconds": s, "data_loading_seconds": 0,
             "tokens": tokens, "skipped": i in skipped, "compile_seconds": 5.0 if i in compile_at else 0.0}
            for i, s in enumerate(seconds, 1)]


def test_summary_mfu_is_derived_from_its_tokens_per_second_and_flags_skips_and_compilation():
    from gpt2bench.trainer.env import detect_env
    from gpt2bench.trainer.summary import build_summary

    records = _records([9.0, 1.0, 3.0], skipped=(1, 3), compile_at=(1, 2))
    summary = build_summary(TrainConfig(), detect_env({}), _Strategy(), [_payload(0, None, records), _payload(1, None)])
    assert summary["tokens_per_second"] == 800 / 4.0 and summary["tokens_per_second_per_device"] == 100
    assert summary["mfu"] == pytest.approx(1e6 * 100 / 1e11)  # not the mean of per-step ratios
    assert summary["skipped_steps"] == 2 and summary["skipped_measured_steps"] == 1
    assert "skipped by the fp16 loss scaler" in summary["note"]
    assert summary["compile_seconds_in_measured_steps"] == 5.0 and "raise warmupSteps" in summary["note"]
    # memory by kind and phase, per rank and role
    assert summary["peak_memory_kind"] == "cpu_peak_rss" and summary["peak_memory_bytes"] == 101
    assert summary["peak_host_memory_bytes"] == 101 and summary["setup_peak_host_memory_bytes"] == 51
    assert summary["peak_device_memory_bytes"] is None
    assert [r["role"] for r in summary["memory_per_rank"]] == ["worker", "worker"]


def test_async_tokens_per_second_is_the_sum_of_the_workers_own_rates():
    from gpt2bench.trainer.env import detect_env
    from gpt2bench.trainer.summary import build_summary

    fast, slow = _records([1.0, 1.0, 1.0, 1.0]), _records([2.0, 2.0])
    payloads = [_payload(0, 400.0, fast, ends=[1, 2, 3, 4]), _payload(1, 200.0, slow, ends=[2.5, 4.5])]
    summary = build_summary(TrainConfig(), detect_env({}), _Strategy(independent=True), payloads)
    assert summary["tokens_per_second"] == 600.0 and summary["worker_tokens_per_second"] == [400.0, 200.0]
    assert summary["tokens_per_second_per_device"] == 300.0
    assert summary["steps_when_first_worker_done"] == [4, 1]
