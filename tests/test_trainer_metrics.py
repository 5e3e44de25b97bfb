"""The Prometheus endpoint of a live 2-rank run: one port per pod, every rank labelled, valid exposition."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpt2bench.local.replicas import free_port

pytestmark = pytest.mark.slow


def scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return response.read().decode()
    except OSError:
        return None


def test_live_metrics_endpoint_serves_every_rank(start_trainer):
    port = free_port()
    trainer = start_trainer(["--strategy", "ddp", "--steps", "40", "--metrics-port", str(port),
                             "--benchmark", "bench-a", "--run", "run-b", "--micro-batch-size", "1"], nproc=2)
    text, deadline = None, time.monotonic() + 240
    while time.monotonic() < deadline and trainer.proc.poll() is None:
        text = scrape(port)
        if text and text.count("gpt2bench_train_loss{") == 2:
            break
        time.sleep(0.5)
    run = trainer.wait()
    assert text and text.count("gpt2bench_train_loss{") == 2, text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    expected_labels = {"benchmark": "bench-a", "run": "run-b", "strategy": "ddp", "precision": "fp32"}
    for name in ("gpt2bench_train_loss", "gpt2bench_train_grad_norm", "gpt2bench_train_step_duration_seconds",
                 "gpt2bench_train_tokens_per_second", "gpt2bench_train_memory_peak_bytes", "gpt2bench_train_steps",
                 "gpt2bench_train_tokens"):
        samples = [s for s in families[name].samples if not s.name.endswith("_created")]
        assert {s.labels["rank"] for s in samples} == {"0", "1"}, name
        assert all(s.labels.items() >= expected_labels.items() for s in samples), name
        assert families[name].documentation, name
    assert families["gpt2bench_train_steps"].type == "counter"
    loss = [s.value for s in families["gpt2bench_train_loss"].samples]
    assert loss[0] == loss[1] and 0 < loss[0] < 12  # mean over workers: same on both ranks
    assert "gpt2bench_train_mfu_ratio{" not in text  # unknown peak on CPU: absent, not 0
    if shutil.which("promtool"):
        lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, check=False)
        assert lint.returncode == 0, lint.stdout + lint.stderr
    assert run.summary["status"] == "succeeded"
    # what a step adds to the output folder, which the rendered emptyDir's sizeLimit is made of (render/pods.py)
    from gpt2bench.render.pods import STEP_RECORD_BYTES

    records = [len(line.encode()) + 1 for line in (run.output / "steps.jsonl").read_text().splitlines()]
    assert len(records) == 40 and max(records) <= STEP_RECORD_BYTES / 1.5, max(records)  # room for a GPU's fields
