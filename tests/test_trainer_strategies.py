"""The real trainer, as real processes (torchrun, 2 workers, gloo, CPU), on the real corpus.

Tolerances: at equal global batch and seed, single, ddp (with no_sync gradient accumulation) and fsdp
see the same blocks each step, so their fp32 loss curves agree to 1e-4 relative and grad norms to
1e-3 relative (only the order of floating-point reductions differs).
"""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow

LOSS_RTOL, NORM_RTOL = 1e-4, 1e-3


def check_common(run, *, strategy: str, precision: str, devices: int):
    """What every successful run must satisfy."""
    summary = run.summary
    assert summary["status"] == "succeeded" and summary["reason"] is None
    assert (summary["strategy"], summary["precision"], summary["devices"]) == (strategy, precision, devices)
    assert summary["world_size"] == devices and summary["nodes"] == 1 and summary["devices_per_node"] == 0
    for key in ("tokens_per_second", "step_time_p50_seconds", "step_time_p95_seconds", "peak_memory_bytes",
                "train_seconds", "startup_seconds", "final_loss", "grad_norm", "config_hash"):
        assert summary[key], key
    assert summary["mfu"] is None  # CPU: peak FLOP/s unknown
    assert set(summary["versions"]) >= {"torch", "transformers", "gpt2bench"}
    # global tokens/s = per device x devices; warm-up left out
    assert summary["tokens_per_second"] == pytest.approx(summary["tokens_per_second_per_device"] * devices)
    assert summary["measured_steps"] == summary["steps"] - summary["warmup_steps"] == len(run.steps) - 2 > 0
    measured = [s for s in run.steps if not s["warmup"]]
    # a step's tokens are global (every device's sequences), not one device's: catches tokens/s off by devices
    training = summary["config"]["training"]
    per_device = training["micro_batch_size"] * training["seq_len"] * training["grad_accum"]
    assert {s["tokens"] for s in run.steps} == {per_device * devices}
    assert summary["tokens_per_second"] == pytest.approx(
        sum(s["tokens"] for s in measured) / sum(s["step_seconds"] for s in measured))
    # peak memory is the largest of every process's own peak
    assert len(summary["peak_memory_bytes_per_rank"]) == summary["processes"]
    assert summary["peak_memory_bytes"] == max(summary["peak_memory_bytes_per_rank"]) > 0
    # the compact copies: termination log and the last stdout line, identical and <= 4 KB
    text = run.termination_log.read_text()
    assert len(text.encode()) <= 4096
    assert json.loads(text) == run.line_summary
    assert run.stdout.strip().splitlines()[-1].startswith("GPT2BENCH_SUMMARY ")
    assert run.line_summary["tokens_per_second"] == summary["tokens_per_second"]
    # it learns: loss falls over a few steps
    assert run.losses[-1] < run.losses[0] - 0.05, run.losses


def test_single_ddp_fsdp_same_curve_at_equal_global_batch(run_trainer, single_reference):
    """Global batch 4 sequences: single 1x4, ddp 2 workers x 1 x grad-accum 2 (no_sync), fsdp 2 x 2."""
    single = single_reference("fp32")
    ddp = run_trainer(["--strategy", "ddp", "--micro-batch-size", "1", "--grad-accum", "2",
                       "--bucket-cap-mb", "1", "--gradient-as-bucket-view"], nproc=2)
    fsdp = run_trainer(["--strategy", "fsdp", "--micro-batch-size", "2"], nproc=2)
    check_common(single, strategy="single", precision="fp32", devices=1)
    check_common(ddp, strategy="ddp", precision="fp32", devices=2)
    check_common(fsdp, strategy="fsdp", precision="fp32", devices=2)
    for other in (ddp, fsdp):
        assert other.losses == pytest.approx(single.losses, rel=LOSS_RTOL)
        assert other.grad_norms == pytest.approx(single.grad_norms, rel=NORM_RTOL)
    # DDP replicas hold identical parameters after training (checksum of |params| per rank)
    checksums = ddp.summary["param_checksums"]
    assert len(checksums) == 2 and checksums[0] == checksums[1]
    assert checksums[0] == pytest.approx(single.summary["param_checksums"][0], rel=1e-6)
    # the summary line and log carry the same figures
    assert ddp.line_summary["final_loss"] == ddp.summary["final_loss"] == ddp.losses[-1]


def test_fsdp_holds_half_the_state_of_ddp(run_trainer):
    """Parameter-heavy config (n_embd 256: 14.7 M params, nearly all of the tensors' memory is model state). fp32:
    every precision keeps fp32 master weights, gradients and AdamW moments (docs/strategies.md), so the state is
    the same in bf16, which this CPU only emulates (15x slower)."""
    from conftest import held_params

    width = 256
    heavy = ["--n-embd", str(width), "--n-head", "8", "--micro-batch-size", "1", "--steps", "4"]
    ddp = run_trainer(["--strategy", "ddp", *heavy], nproc=2)
    fsdp = run_trainer(["--strategy", "fsdp", *heavy, "--no-reshard-after-forward"], nproc=2)
    check_common(ddp, strategy="ddp", precision="fp32", devices=2)
    check_common(fsdp, strategy="fsdp", precision="fp32", devices=2)
    assert ddp.summary["n_params"] == fsdp.summary["n_params"] > 14_000_000
    # params + grads + AdamW state resident per rank: FSDP shards it over the 2 ranks
    ddp_state, fsdp_state = ddp.summary["state_bytes_per_rank"], fsdp.summary["state_bytes_per_rank"]
    assert ddp_state[0] == ddp_state[1]
    # fp32 param, grad, 2 AdamW moments per element held, the vocabulary's 47 zero padding rows included
    held = held_params(ddp.summary, width=width)
    assert ddp_state[0] == pytest.approx(held * 4 * 4, rel=1e-5)
    assert max(fsdp_state) == pytest.approx(ddp_state[0] / 2, rel=0.01)
    # Not compared: the step's peak RSS. On CPU it is a process-wide high-water mark; the gathered root (the
    # embedding) and the full-size gradients before the reduce-scatter take back most of what sharding saves,
    # and the rest is within the run-to-run spread (docs/strategies.md; a CI run had fsdp 0.6 MB above ddp).
    assert fsdp.losses == pytest.approx(ddp.losses, rel=LOSS_RTOL)


@pytest.mark.parametrize(
    "strategy, precision, nproc, extra",
    [
        ("single", "fp16", 1, []),  # single bf16: the session's reference (test_bf16_curves_agree_...)
        ("dataparallel", "fp32", 1, []),
        ("dataparallel", "bf16", 1, []),
        ("ddp", "fp16", 2, ["--static-graph", "--grad-accum", "2", "--micro-batch-size", "1"]),
        ("fsdp", "fp16", 2, []),
    ],
)
def test_strategy_precision(run_trainer, strategy, precision, nproc, extra):
    run = run_trainer(["--strategy", strategy, "--precision", precision, *extra], nproc=nproc)
    check_common(run, strategy=strategy, precision=precision, devices=nproc)
    if strategy == "dataparallel":
        assert "trained as single" in run.summary["note"]
    if strategy == "ddp":
        assert run.summary["param_checksums"][0] == run.summary["param_checksums"][1]
        assert "no_sync() off" in run.summary["note"]


def test_nan_loss_stops_every_rank_with_a_failed_summary(run_trainer):
    # losses are read back at log steps (2, 4, 6): step 3's NaN is seen at step 4, where every rank stops
    run = run_trainer(["--strategy", "ddp", "--nan-at-step", "3", "--log-every", "2"], nproc=2, expect_rc=1)
    assert [s["step"] for s in run.steps] == [1, 2, 3, 4]
    assert run.steps[2]["loss"] is None and run.steps[1]["loss"] > 0  # NaN is written as null (strict JSON)
    summary = json.loads(run.termination_log.read_text())
    assert summary["status"] == "failed" and "non-finite loss" in summary["reason"]
    assert "at step 3 (read at step 4)" in summary["reason"]
    assert run.summary["status"] == "failed" and run.line_summary["status"] == "failed"
    assert len(summary["param_checksums"]) == 2  # both ranks stopped together and reported


def test_crashed_rank_fails_the_job(run_trainer):
    run = run_trainer(["--strategy", "ddp", "--fail-at-step", "2", "--timeout-seconds", "20"], nproc=2,
                      expect_rc=None, timeout=120)
    assert run.returncode != 0
    assert run.summary["status"] == "failed" and "failure injected at step 2" in run.summary["reason"]
    assert json.loads(run.termination_log.read_text())["status"] == "failed"


def test_pretrained_weights_are_loaded(run_trainer, tmp_path):
    """--pretrained PATH: the saved model (not the preset) is what trains."""
    from transformers import GPT2Config, GPT2LMHeadModel

    saved = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=64, n_positions=64))
    saved.save_pretrained(tmp_path / "saved")
    n_params = sum(p.numel() for p in {id(p): p for p in saved.parameters()}.values())
    run = run_trainer(["--pretrained", str(tmp_path / "saved"), "--steps", "3", "--warmup-steps", "1"])
    assert run.summary["n_params"] == n_params != 6_960_768  # not the tiny preset's
    assert run.summary["status"] == "succeeded"


def test_bf16_curves_agree_across_strategies_as_fp32_ones_do(run_trainer, single_reference):
    """One precision recipe for every strategy (fp32 master weights, autocast): at equal global batch and seed,
    bf16 single, ddp and fsdp (with gradient accumulation) give one loss curve, as tightly as in fp32. FSDP no
    longer runs LayerNorm and the residual stream in bf16 (its old MixedPrecisionPolicy recipe did)."""
    single = single_reference("bf16")
    ddp = run_trainer(["--strategy", "ddp", "--micro-batch-size", "2", "--precision", "bf16"], nproc=2)
    fsdp = run_trainer(["--strategy", "fsdp", "--micro-batch-size", "1", "--grad-accum", "2", "--precision", "bf16"],
                       nproc=2)
    check_common(single, strategy="single", precision="bf16", devices=1)
    for other in (ddp, fsdp):
        check_common(other, strategy=other.summary["strategy"], precision="bf16", devices=2)
        assert other.losses == pytest.approx(single.losses, rel=LOSS_RTOL)
        assert other.grad_norms == pytest.approx(single.grad_norms, rel=NORM_RTOL)


FSDP_ACCUMULATION_PROBE = r'''
import json, sys, torch, torch.distributed as dist
from gpt2bench.trainer.config import TrainConfig
from gpt2bench.trainer.env import detect_env
from gpt2bench.trainer.parallel import strategy_class
from gpt2bench.trainer.loop import Trainer

calls = {"reduce_scatter": 0}
original = dist.reduce_scatter_single
def counted(*args, **kwargs):
    calls["reduce_scatter"] += 1
    return original(*args, **kwargs)
dist.reduce_scatter_single = counted  # FSDP2's reduce-scatter goes through it; counted, not replaced
config = TrainConfig.from_argv(sys.argv[1:])
p = strategy_class("fsdp")(config, detect_env())
p.setup()
trainer = Trainer(config, p)
trainer.train()
trainer.metrics.close()
if p.rank == 0:  # worker 0's records are in its steps.jsonl (the trainer keeps none in memory)
    with open(f"{config.process.output}/steps.jsonl") as steps:
        print("PROBE " + json.dumps({**calls, "losses": [json.loads(line)["loss"] for line in steps]}))
p.teardown()
sys.stdout.flush()
import os
os._exit(0)  # as `gpt2bench train` ends (train.EXIT_WITHOUT_DESTRUCTORS): c10d's C++ destructors can abort at exit
'''


def test_fsdp_reduce_scatters_once_per_step_under_gradient_accumulation(tmp_path, token_cache, fork_server):
    """grad-accum 4: the first three micro-steps run without gradient sync (FSDP2's no_sync), so each of the
    three FSDP groups (2 blocks + root) reduce-scatters once per optimizer step, not once per micro-step."""
    import subprocess

    from conftest import TINY_ARGS, torchrun_script, trainer_environment

    env = {**trainer_environment(fork_server), "TMPDIR": str(tmp_path), "GPT2BENCH_CACHE_DIR": str(token_cache)}
    steps = 2
    proc = subprocess.run([*torchrun_script(tmp_path / "probe.py", FSDP_ACCUMULATION_PROBE, 2, fork_server),
                           *TINY_ARGS, "--strategy", "fsdp", "--micro-batch-size", "1",
                           "--grad-accum", "4", "--steps", str(steps), "--warmup-steps", "1",
                           "--output", str(tmp_path / "out")],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("PROBE ")).split(" ", 1)[1])
    groups = 2 + 1  # tiny: 2 GPT2Blocks, each fully_shard'ed, and the root
    assert result["reduce_scatter"] == groups * steps, result
    assert len(result["losses"]) == steps


def test_compile_under_single_ddp_and_fsdp_trains_what_eager_trains(run_trainer, single_reference, warm_compile_cache):
    """torch.compile per block (and the loss): the same curve as eager to rounding; compilation happens in
    warm-up and is timed; a warm-up too short for it is flagged. Every compiled run has micro-batches of 2
    (single accumulates 2 of them), so the kernels `warm_compile_cache` built serve them all."""
    eager = single_reference("fp32")
    single = run_trainer(["--strategy", "single", "--micro-batch-size", "2", "--grad-accum", "2", "--compile",
                          "--warmup-steps", "0"])
    ddp = run_trainer(["--strategy", "ddp", "--micro-batch-size", "2", "--compile"], nproc=2)
    fsdp = run_trainer(["--strategy", "fsdp", "--micro-batch-size", "2", "--compile"], nproc=2)
    assert eager.summary["compiled"] is False and eager.summary["compile_seconds"] == 0
    for run in (single, ddp, fsdp):
        assert run.summary["status"] == "succeeded", run.describe()
        assert run.summary["compiled"] is True and run.summary["compile_seconds"] > 0
        assert run.losses == pytest.approx(eager.losses, rel=LOSS_RTOL)
        assert run.grad_norms == pytest.approx(eager.grad_norms, rel=NORM_RTOL)
        assert run.steps[0]["compile_seconds"] > 0  # compiled in the first step...
        assert all(s["compile_seconds"] == 0 for s in run.steps[2:])  # ...and never again
    # warm-up 0: the first (compiling) step is measured, and the summary says so
    assert single.summary["compile_seconds_in_measured_steps"] > 0 and "raise warmupSteps" in single.summary["note"]
    for run in (ddp, fsdp):  # warm-up 2 covers it
        assert run.summary["compile_seconds_in_measured_steps"] == 0
        assert "warmupSteps" not in (run.summary["note"] or "")
