"""`horovod`: real Horovod (built by scripts/install.sh) launched by horovodrun --gloo and by mpirun.

Stated tolerance for "horovod trains like single at equal global batch and seed": loss per step within
1e-4 absolute and grad norm within 1e-4 relative (seen: equal to 6 digits).
"""

from __future__ import annotations

import json
import math
import shutil
import time

import pytest
from conftest import gpt2bench_executable
from fault_figures import FIGURES

pytestmark = [pytest.mark.horovod, pytest.mark.slow]


@pytest.fixture(autouse=True)
def needs_horovod(horovod_import_error):
    """Skips a test where Horovod cannot run."""
    if shutil.which("horovodrun") is None:
        pytest.skip("horovodrun is not on PATH (scripts/install.sh builds Horovod 0.28.1)")
    if horovod_import_error:
        pytest.skip(horovod_import_error)


def horovodrun(np: int = 2) -> list[str]:
    return ["horovodrun", "--gloo", "-np", str(np), "-H", f"localhost:{np}", gpt2bench_executable(), "train"]


def mpirun(np: int = 2) -> list[str]:
    """As an MPIJob launcher runs it (Open MPI; -x forwards what the processes need)."""
    forwarded = ["OMP_NUM_THREADS", "TMPDIR", "GPT2BENCH_CACHE_DIR", "GPT2BENCH_TERMINATION_LOG", "PYTHONUNBUFFERED"]
    return ["mpirun", "--allow-run-as-root", "-np", str(np), "-H", f"localhost:{np}", "-bind-to", "none",
            "-map-by", "slot", *[x for name in forwarded for x in ("-x", name)], gpt2bench_executable(), "train"]


def assert_trained_in_lockstep(run, precision: str):
    summary = run.summary
    assert summary["status"] == "succeeded", run.describe()
    assert (summary["strategy"], summary["precision"], summary["world_size"]) == ("horovod", precision, 2)
    losses = run.losses
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0] - 0.05, losses
    checksums = summary["param_checksums"]
    assert len(checksums) == 2 and checksums[0] == checksums[1], checksums  # identical replicas
    # rank 0's summary line reaches the launcher's stdout (horovodrun prefixes it with "[0]<stdout>:")
    lines = [x.split("GPT2BENCH_SUMMARY ", 1)[1] for x in run.stdout.splitlines() if "GPT2BENCH_SUMMARY " in x]
    assert len(lines) == 1 and json.loads(lines[0])["strategy"] == "horovod", run.stdout[-2000:]


def test_horovodrun_fp32_trains_like_single(run_trainer, single_reference):
    single = single_reference("fp32")
    run = run_trainer(["--strategy", "horovod"], launcher=horovodrun())
    assert_trained_in_lockstep(run, "fp32")
    # the AdamW state broadcast must not shift AdamW's step count: same curve as one process
    for mine, ref in zip(run.steps, single.steps, strict=True):
        assert mine["loss"] == pytest.approx(ref["loss"], abs=1e-4), (run.losses, single.losses)
        assert mine["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4), (run.grad_norms, single.grad_norms)
    assert run.summary["param_checksums"][0] == pytest.approx(single.summary["param_checksums"][0], rel=1e-6)


def test_horovodrun_bf16_with_gradient_accumulation(run_trainer):
    run = run_trainer(["--strategy", "horovod", "--precision", "bf16", "--grad-accum", "2"], launcher=horovodrun())
    assert_trained_in_lockstep(run, "bf16")
    assert run.summary["grad_accum"] == 2


def test_mpirun_fp16_as_an_mpijob_launcher_runs_it(run_trainer):
    run = run_trainer(["--strategy", "horovod", "--precision", "fp16"], launcher=mpirun())
    assert_trained_in_lockstep(run, "fp16")
    assert run.termination_log.exists() and "horovod" in run.termination_log.read_text()


def test_horovodrun_bf16_trains_like_single_bf16_and_broadcasts_each_tensor_once(run_trainer, single_reference):
    """The precision recipe is the same under Horovod (autocast, fp32 masters): the bf16 curve agrees with
    single's within the tolerances of the fp32 equal-batch tests of ddp and fsdp (loss rel 1e-4, norm rel 1e-3;
    see test_trainer_ps's bf16 test for why not tighter). The tied embedding is one tensor and is broadcast
    once (state_dict() would list it twice)."""
    single = single_reference("bf16")
    run = run_trainer(["--strategy", "horovod", "--precision", "bf16"], launcher=horovodrun())
    assert_trained_in_lockstep(run, "bf16")
    assert run.losses == pytest.approx(single.losses, rel=1e-4)
    assert run.grad_norms == pytest.approx(single.grad_norms, rel=1e-3)
    tiny_tensors = 4 + 12 * 2  # wte (tied with lm_head), wpe, ln_f weight/bias; 12 per block (2 blocks)
    assert run.summary["horovod_broadcast_tensors"] == tiny_tensors


def test_compiled_horovod_trains_what_eager_horovod_trains(run_trainer, warm_compile_cache):
    eager = run_trainer(["--strategy", "horovod"], launcher=horovodrun())
    compiled = run_trainer(["--strategy", "horovod", "--compile"], launcher=horovodrun())
    assert_trained_in_lockstep(compiled, "fp32")
    assert compiled.summary["compiled"] is True and compiled.summary["compile_seconds"] > 0
    assert compiled.losses == pytest.approx(eager.losses, rel=1e-4)
    assert compiled.grad_norms == pytest.approx(eager.grad_norms, rel=1e-3)


@pytest.mark.faults
@pytest.mark.parametrize("launcher", ["horovodrun", "mpirun"])
def test_a_hung_rank_ends_a_horovod_job_within_its_timeout(run_trainer, launcher):
    """--timeout-seconds bounds Horovod's waits as it bounds the other strategies' process groups: rank 0 stops
    making progress at step 2 (alive, as a deadlocked rank is); rank 1, waiting for its gradients' all-reduce,
    gives up after the timeout and says why, and the launcher ends the job. Without the bound it ran until
    killed (docs/reliability.md)."""
    timeout = 4
    prefix = horovodrun() if launcher == "horovodrun" else mpirun()
    started = time.monotonic()
    run = run_trainer(["--strategy", "horovod", "--steps", "400", "--hang-at-step", "2",
                       "--timeout-seconds", str(timeout)], launcher=prefix, expect_rc=None, timeout=150)
    took = time.monotonic() - started
    assert run.returncode != 0, run.describe()
    said = "horovod: the all-reduce of the gradients waited more than 4 s (--timeout-seconds) for the other ranks"
    assert said in run.stdout + run.stderr, run.describe()
    assert len(run.steps) < 10, "it stopped where the rank hung"
    assert took < timeout + 60, f"{took:.1f} s (start-up included)"
    FIGURES[f"horovod-rank-hangs-{launcher}"] = {
        "injected": 1, "timeout_seconds": timeout, "job_ended_after_s": round(took, 1), "steps_recorded": len(run.steps),
        "exit_code": run.returncode, "reason": said}
