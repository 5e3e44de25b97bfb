"""`ps` / `ps-sharded`: real parameter servers in real processes (torchrun, gloo), tiny GPT-2, real corpus.

Stated tolerances for "sync ps trains like single at equal global batch and seed":
- loss per step within 1e-4 absolute (seen: <= 3e-6 for ps and ps-sharded);
- grad norm within 1e-4 relative for ps (seen: equal to 6 digits; the server takes per-tensor norms,
  then their norm, as clip_grad_norm_ does) and 1e-3 for ps-sharded (seen: up to 1.7e-4 by step 6:
  the token embedding is cut between the two servers, and an fp32 norm of millions of elements is only
  good to ~1e-5 relative anyway; the slightly different clip factor then compounds through AdamW).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import signal
import subprocess
import time

import pytest
from conftest import free_port, gpt2bench_executable, held_params, torchrun_script, trainer_environment

from gpt2bench.trainer.parallel.ps import server_ranks, shard_ranges

LOSS_TOL = 1e-4
NORM_RTOL = {"ps": 1e-4, "ps-sharded": 1e-3}


# ------------------------------------------------------------------ pure layout rules
def test_servers_are_the_first_ranks_or_spread_over_nodes():
    assert server_ranks(world_size=3, local_world_size=3, servers=1) == [0]
    assert server_ranks(world_size=4, local_world_size=4, servers=2) == [0, 1]
    # two nodes of 3 processes, 2 servers: one per node, so each node keeps 2 workers for its devices
    assert server_ranks(world_size=6, local_world_size=3, servers=2) == [0, 3]
    assert server_ranks(world_size=6, local_world_size=3, servers=1) == [0]


def test_shards_cover_the_flat_vector_and_balance_to_the_element():
    for numel, servers in [(10, 3), (6_960_768, 2), (5, 5), (7, 4)]:
        ranges = shard_ranges(numel, servers)
        assert ranges[0][0] == 0 and ranges[-1][1] == numel
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        sizes = [hi - lo for lo, hi in ranges]
        assert max(sizes) - min(sizes) <= 1


# ------------------------------------------------------------------ helpers
def assert_loss_falls(run):
    losses = run.losses
    assert all(math.isfinite(x) for x in losses), losses
    assert losses[-1] < losses[0] - 0.05, f"loss did not fall: {losses}"


def assert_replicas_equal_servers(summary, workers: int):
    checksums = summary["param_checksums"]
    assert len(checksums) == workers and len(set(checksums)) == 1, checksums
    prints = summary["ps_param_fingerprints"]  # exact digests of the float32 bits
    assert prints["workers"] == [prints["servers"]] * workers, prints
    assert summary["ps_replicas_match_servers"] is True
    assert summary["ps_server_param_checksum"] == pytest.approx(checksums[0], rel=1e-9)


def assert_same_curve(run, reference):
    assert len(run.steps) == len(reference.steps)
    rtol = NORM_RTOL[run.summary["strategy"]]
    for mine, ref in zip(run.steps, reference.steps):
        assert mine["loss"] == pytest.approx(ref["loss"], abs=LOSS_TOL), (run.losses, reference.losses)
        assert mine["grad_norm"] == pytest.approx(ref["grad_norm"], rel=rtol), (run.grad_norms,
                                                                                      reference.grad_norms)


# ------------------------------------------------------------------ sync = single at equal global batch
@pytest.mark.slow
def test_sync_ps_and_ps_sharded_train_like_single(run_trainer, single_reference):
    single = single_reference("fp32")
    ps = run_trainer(["--strategy", "ps", "--ps-servers", "1"], nproc=3)
    sharded = run_trainer(["--strategy", "ps-sharded", "--ps-servers", "2"], nproc=4)
    for run, servers in ((ps, 1), (sharded, 2)):
        summary = run.summary
        assert summary["status"] == "succeeded", run.describe()
        # one node: servers read gradients and write parameters through shared memory, no payload messages
        assert summary["ps_pairs_sharing_memory"] == 2 * servers and summary["ps_pairs_exchanging_messages"] == 0
        assert summary["ps_server_device"] == "cpu" and summary["ps_server_threads"] >= 1
        assert [r["role"] for r in summary["memory_per_rank"]] == ["server"] * servers + ["worker"] * 2
        assert (summary["world_size"], summary["ps_servers"], summary["processes"]) == (2, servers, 2 + servers)
        assert summary["ps_mode"] == "sync" and summary["ps_updates_applied"] == 6
        assert summary["global_batch_tokens"] == single.summary["global_batch_tokens"]
        assert_loss_falls(run)
        assert_replicas_equal_servers(summary, workers=2)
        assert_same_curve(run, single)
        assert summary["param_checksums"][0] == pytest.approx(single.summary["param_checksums"][0], rel=1e-6)
        # the optimizer lives on the servers: each holds its shard's params, grads and 2 AdamW moments
        # (4 floats per element); a worker holds a replica and its gradient only (2 per element)
        per_rank = summary["state_bytes_per_rank"]
        n = held_params(summary)  # elements held: padding rows too
        assert per_rank[servers:] == [2 * 4 * n] * 2
        assert sum(per_rank[:servers]) == pytest.approx(4 * 4 * n, abs=64)  # + AdamW's step counters
    assert ps.line_summary["ps_servers"] == 1  # the compact line on job rank 0 (a server) has it too


@pytest.mark.slow
def test_ps_sharded_fp16(run_trainer):
    run = run_trainer(["--strategy", "ps-sharded", "--ps-servers", "2", "--precision", "fp16"], nproc=4)
    assert run.summary["status"] == "succeeded" and run.summary["precision"] == "fp16"
    assert_loss_falls(run)
    assert_replicas_equal_servers(run.summary, workers=2)


@pytest.mark.slow
def test_ps_bf16_trains_then_a_nan_fails_the_job_cleanly(run_trainer):
    """bf16 on one server; at step 5 worker 0's loss turns NaN; it is read at step 6 (the last, a log step):
    every party stops there, rank 0 says why."""
    run = run_trainer(["--strategy", "ps", "--precision", "bf16", "--nan-at-step", "5"], nproc=3, expect_rc=None)
    assert run.returncode != 0
    summary = run.summary
    assert summary["status"] == "failed" and "non-finite loss" in summary["reason"], summary
    assert "at step 5 (read at step 6)" in summary["reason"]
    assert summary["precision"] == "bf16" and len(run.steps) == 6
    finite = run.losses[:4]
    assert all(math.isfinite(x) for x in finite) and finite[-1] < finite[0] - 0.05, finite
    assert run.losses[4] is None or not math.isfinite(run.losses[4])  # JSON has no NaN: null
    # the workers still finished in step with the server: the NaN updates reached every replica
    assert summary["ps_updates_applied"] == 6
    assert summary["ps_param_fingerprints"]["workers"] == [summary["ps_param_fingerprints"]["servers"]] * 2


@pytest.mark.slow
def test_async_ps_sharded_applies_every_push(run_trainer):
    run = run_trainer(["--strategy", "ps-sharded", "--ps-servers", "2", "--ps-mode", "async",
                       "--precision", "bf16"], nproc=4)
    summary = run.summary
    assert summary["status"] == "succeeded" and summary["ps_mode"] == "async"
    assert summary["precision"] == "bf16"
    assert_loss_falls(run)
    # each worker's gradient is applied on arrival: 2 workers x 6 steps updates, not 6 averaged ones
    assert summary["ps_updates_applied"] == 12
    assert all(math.isfinite(g) and g > 0 for g in run.grad_norms)


# ------------------------------------------------------------------ fp16 overflow: every party skips
OVERFLOW_PROBE = r'''
import json, sys, torch
from gpt2bench.trainer.config import TrainConfig
from gpt2bench.trainer.env import detect_env
from gpt2bench.trainer.parallel import strategy_class

config = TrainConfig(strategy={"name": "ps-sharded", "ps_servers": 2}, precision="fp16",
                     training={"lr": 0.1, "timeout_seconds": 60})
def factory():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Linear(6, 3))
p = strategy_class("ps-sharded")(config, detect_env())
p.setup()
if not p.is_worker:
    payload = p.serve(factory)
else:
    model = p.wrap(factory()); opt = p.build_optimizer(model, config.training.lr); scaler = p.build_scaler()
    first_shard_end = p.ranges[0][1]
    records = []
    for step in range(3):
        torch.manual_seed(100 * step + p.rank)
        loss = model(torch.randn(4, 6)).pow(2).mean()
        scaler.scale(loss).backward()
        if step == 1 and p.rank == 0:  # overflow in ONE worker's gradient, inside server 0's shard only
            p.flat_grad[first_shard_end - 1] = float("inf")
        before = p.flat_param.clone()
        norm, skipped = p.step(model, opt, scaler, 1.0)
        moved = [bool((p.flat_param[lo:hi] != before[lo:hi]).any()) for lo, hi in p.ranges]
        records.append({"norm": float(norm), "skipped": bool(skipped), "scale": scaler.get_scale(), "moved": moved})
    payload = {"records": records, "params": p.flat_param.tolist()}
out = p.gather_to_reporter(payload)
if p.is_reporter:
    print("PROBE " + json.dumps({"payloads": out, "summary": p.extra_summary}))
p.teardown()
sys.stdout.flush()
import os
os._exit(0)  # as `gpt2bench train` ends (train.EXIT_WITHOUT_DESTRUCTORS): c10d's C++ destructors can abort at exit
'''


@pytest.mark.slow
def test_fp16_overflow_is_skipped_by_every_server_and_worker(tmp_path, fork_server):
    """One worker's inf, in one shard: both servers skip, both workers back off the same scale."""
    env = {**trainer_environment(fork_server), "TMPDIR": str(tmp_path)}
    proc = subprocess.run(torchrun_script(tmp_path / "probe.py", OVERFLOW_PROBE, 4, fork_server),
                          env=env, capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("PROBE "))
    result = json.loads(line.split(" ", 1)[1])
    workers = [w for w in result["payloads"] if "records" in w]
    assert len(workers) == 2
    for worker in workers:
        good, bad, after = worker["records"]
        assert good["moved"] == [True, True] and math.isfinite(good["norm"]) and not good["skipped"]
        assert bad["moved"] == [False, False], "a server stepped on an overflowed gradient"
        assert bad["skipped"] and not after["skipped"]  # what the step reports, for skipped_steps
        assert not math.isfinite(bad["norm"])
        assert bad["scale"] == good["scale"] / 2  # backed off together
        assert after["moved"] == [True, True] and after["scale"] == bad["scale"]
    assert workers[0]["params"] == workers[1]["params"]
    assert result["summary"]["ps_replicas_match_servers"] is True
    assert result["summary"]["ps_updates_applied"] == 2  # of 3 steps, one skipped


# ------------------------------------------------------------------ a dead or hung worker ends the job
def _launch_job(tmp_path, args, nprocs, token_cache, per_node=None, fork_server=None):
    """Each process on its own, as pods of a multi-node job are: no torchrun agent kills the others.
    `per_node` processes per emulated node (default all on one). With `fork_server` each is forked from it; a signal
    sent to one then reaches its stand-in, which passes on neither SIGKILL nor SIGSTOP: `program_pid` finds the
    trainer."""
    port, procs = free_port(), []
    per_node = per_node or nprocs
    tmp_path.mkdir(parents=True, exist_ok=True)
    for rank in range(nprocs):
        env = {**trainer_environment(fork_server), "TMPDIR": str(tmp_path), "RANK": str(rank),
               "WORLD_SIZE": str(nprocs), "LOCAL_RANK": str(rank % per_node), "LOCAL_WORLD_SIZE": str(per_node),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GPT2BENCH_CACHE_DIR": str(token_cache)}
        with open(tmp_path / f"rank{rank}.log", "w") as log:  # the child keeps its own descriptor
            procs.append(subprocess.Popen([gpt2bench_executable(), "train", *args], env=env, stdout=log,
                                          stderr=subprocess.STDOUT))
    return procs


@pytest.mark.slow
@pytest.mark.parametrize("how", ["killed", "hung"])
def test_a_dead_or_hung_worker_ends_the_job(tmp_path, token_cache, fork_server, how):
    """The worker's own process is killed or stopped (forked ones through `program_pid`: their stand-ins pass
    neither signal on)."""
    from conftest import TINY_ARGS, program_pid

    output = tmp_path / "out"
    timeout = 10
    args = [*TINY_ARGS, "--strategy", "ps", "--steps", "500", "--output", str(output),
            "--timeout-seconds", str(timeout)]
    procs = _launch_job(tmp_path, args, 3, token_cache, fork_server=fork_server)
    victim = procs[2]  # job rank 2 = worker 1
    trainer = None
    try:
        deadline = time.monotonic() + 240
        steps = output / "steps.jsonl"
        while not (steps.exists() and len(steps.read_text().splitlines()) >= 3):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "no training started"
            time.sleep(0.5)
        trainer = program_pid(victim.pid)
        os.kill(trainer, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        stopped_at = time.monotonic()
        codes = [p.wait(timeout=timeout + 60) for p in procs[:2]]
        took = time.monotonic() - stopped_at
    finally:
        if trainer is not None:  # a stopped forked trainer outlives its relay when the server ends meanwhile
            with contextlib.suppress(ProcessLookupError):
                os.kill(trainer, signal.SIGKILL)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(code != 0 for code in codes), codes
    summary = json.loads((output / "summary.json").read_text())
    assert summary["status"] == "failed", summary
    # A killed peer's connections close (a receive from it fails at once; a send to it waits for the
    # timeout); a hung one is only caught by the --timeout-seconds bound. Whichever process fails
    # first, its peers then see its connections close or reset, so the reason names one of those.
    words = ("closed by peer", "reset by peer", "timed out")
    assert any(word in summary["reason"].lower() for word in words), summary["reason"]
    if how == "hung":
        assert took >= timeout - 1, f"ended after {took:.1f} s: something other than the timeout ended it"
    assert took < timeout + 50, took
    assert len(steps.read_text().splitlines()) < 500


@pytest.mark.slow
def test_sync_ps_in_bf16_trains_like_single_in_bf16(run_trainer, single_reference):
    """The precision recipe is the same on a ps worker (autocast) as in single: the curves agree within the
    tolerances every fp32 equal-batch test of ddp and fsdp uses (test_trainer_strategies: loss rel 1e-4, grad
    norm rel 1e-3). Tighter than ps's own fp32 check is not possible in bf16: a bf16 matmul over 2 sequences
    rounds differently from one over 4 (about 1e-5 of the loss here); a different recipe (bf16 LayerNorm and
    residual stream, as FSDP's param_dtype policy) moves it by more than 1e-4."""
    single = single_reference("bf16")
    for strategy, nproc in (("ps", 3), ("ps-sharded", 4)):
        run = run_trainer(["--strategy", strategy, "--precision", "bf16"], nproc=nproc)
        assert run.summary["status"] == "succeeded", run.describe()
        assert run.losses == pytest.approx(single.losses, rel=1e-4)
        assert run.grad_norms == pytest.approx(single.grad_norms, rel=1e-3)
        assert_replicas_equal_servers(run.summary, workers=2)


@pytest.mark.slow
def test_async_workers_do_not_wait_for_each_other(run_trainer):
    """Async ps: no collective among workers. The last worker sleeps 0.6 s a step: when the fast one has
    finished its 8 steps, the slow one has finished fewer; the job's tokens/s is the sum of their own rates."""
    run = run_trainer(["--strategy", "ps", "--ps-mode", "async", "--steps", "8", "--slow-worker-seconds", "0.6"],
                      nproc=3)
    summary = run.summary
    assert summary["status"] == "succeeded", run.describe()
    fast, slow = summary["steps_when_first_worker_done"]
    assert fast == 8 and slow < 8, summary["steps_when_first_worker_done"]
    rates = summary["worker_tokens_per_second"]
    assert rates[0] > rates[1] and summary["tokens_per_second"] == pytest.approx(sum(rates))
    assert summary["tokens_per_second_per_device"] == pytest.approx(sum(rates) / 2)
    assert summary["ps_updates_applied"] == 16  # every push applied on arrival
    # worker 0's steps.jsonl holds its own steps: its tokens are its own, not the two workers'
    assert {s["tokens"] for s in run.steps} == {2 * 32}


@pytest.mark.slow
def test_servers_on_other_nodes_get_the_payload_in_messages(tmp_path, token_cache, fork_server, single_reference):
    """Two emulated nodes of (1 server + 1 worker): each worker shares memory with its own node's server and
    exchanges messages with the other's; sync ps-sharded still trains exactly like single."""
    from conftest import TINY_ARGS

    output = tmp_path / "out"
    args = [*TINY_ARGS, "--strategy", "ps-sharded", "--ps-servers", "2", "--output", str(output)]
    procs = _launch_job(tmp_path, args, 4, token_cache, per_node=2, fork_server=fork_server)
    codes = [p.wait(timeout=300) for p in procs]
    assert codes == [0, 0, 0, 0], [(tmp_path / f"rank{r}.log").read_text()[-2000:] for r in range(4)]
    summary = json.loads((output / "summary.json").read_text())
    assert summary["nodes"] == 2 and summary["world_size"] == 2
    assert summary["ps_pairs_sharing_memory"] == 2 and summary["ps_pairs_exchanging_messages"] == 2
    steps = [json.loads(x) for x in (output / "steps.jsonl").read_text().splitlines()]
    reference = single_reference("fp32").steps  # single, micro-batch 4, TINY_ARGS
    for mine, ref in zip(steps, reference, strict=True):
        assert mine["loss"] == pytest.approx(ref["loss"], abs=LOSS_TOL)
        assert mine["grad_norm"] == pytest.approx(ref["grad_norm"], rel=NORM_RTOL["ps-sharded"])
    assert summary["ps_replicas_match_servers"] is True


@pytest.mark.slow
def test_compiled_ps_workers_train_what_eager_ones_train(run_trainer, warm_compile_cache):
    eager = run_trainer(["--strategy", "ps"], nproc=3)
    compiled = run_trainer(["--strategy", "ps", "--compile"], nproc=3)
    assert compiled.summary["compiled"] is True and compiled.summary["compile_seconds"] > 0
    assert_same_curve(compiled, eager)
    assert_replicas_equal_servers(compiled.summary, workers=2)
