"""Failures that must reach the operator as a reason, and conditions the trainer must survive."""

from __future__ import annotations

import socket


def test_a_strategy_whose_library_is_missing_fails_with_a_summary_naming_it(run_trainer, tmp_path):
    # A `horovod` package that cannot be imported, first on the path: as in an image built without Horovod.
    fake = tmp_path / "no-horovod" / "horovod"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named horovod.torch', name='horovod')\n")
    run = run_trainer(["--strategy", "horovod", "--steps", "3"], expect_rc=1,
                      env={"PYTHONPATH": str(fake.parent)})
    assert run.summary is not None and run.summary["status"] == "failed", run.describe()
    assert "horovod" in run.summary["reason"]
    # the same reason where the operator (termination message) and `gpt2bench launch` (stdout) look
    assert run.line_summary["reason"] == run.summary["reason"]
    assert "horovod" in run.termination_log.read_text()


def test_a_busy_metrics_port_does_not_stop_training(run_trainer):
    # Local runs put several "pods" on one network; the second one to bind the port must train anyway.
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        run = run_trainer(["--strategy", "single", "--steps", "3", "--metrics-port", str(port)])
    assert run.summary["status"] == "succeeded", run.describe()
    assert "metrics port" in run.stderr and "unavailable" in run.stderr


def test_a_gpu_run_started_in_the_cpu_image_says_so_where_the_operator_reads(run_trainer):
    """The CPU image started for a GPU run (an MPI runtime's sshd pods on the CPU image ran Horovod's GPU
    ranks): this machine's torch is the CPU build, as in that image; the reason names the image, not the node."""
    import torch

    assert torch.version.cuda is None, "this test needs the CPU build of torch"
    run = run_trainer(["--strategy", "single", "--steps", "3", "--device", "cuda"], expect_rc=1)
    assert run.summary["status"] == "failed"
    assert "is a CPU-only build: a GPU run needs the CUDA trainer image" in run.summary["reason"]
    assert "CPU-only build" in run.termination_log.read_text()
