"""A full disk under `gpt2bench run` and `gpt2bench report`.

The disk is real: a 64 MiB tmpfs mounted for the test (root can; elsewhere the test is skipped), filled by the test
while the sweep's second run starts, so that the runner, its replicas and the report meet a real ENOSPC from the
kernel. Before: a raw traceback (chained OSErrors), exit 1, results.json left saying the run in flight was Running
(so `--resume` could re-run a finished run), and `gpt2bench report` crashed too. Now: one line naming the disk and
the folder, exit code 3, results.json consistent (finished runs kept, the run in flight Interrupted, the rest not
run), `--resume` goes on from there once there is room, and `gpt2bench report` says the same of a full disk.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import narrowed
from fault_figures import FIGURES

from gpt2bench.files import DiskFull, describe_disk, disk_full, write_atomic
from gpt2bench.local.replicas import free_port

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.timeout(400)]

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "manifests" / "examples" / "cpu-sweep.yaml"


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(disk)], capture_output=True,
                             text=True, check=False)
    if mounted.returncode:
        pytest.skip(f"cannot mount a small tmpfs here (root needed): {mounted.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk: Path) -> None:
    """Every byte of the disk taken (what a sibling process writing a large file does)."""
    with open(disk / "filler", "ab") as filler:
        try:
            while True:
                filler.write(b"\0" * (1 << 20))
                filler.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def sweep_file(tmp_path: Path) -> Path:
    doc = narrowed(yaml.safe_load(EXAMPLE.read_text()))
    doc["spec"]["sweep"].update(strategies=[{"name": "single"}, {"name": "ddp"}], precisions=["fp32"], repeats=1)
    for key in ("maxRepeats", "minEffect", "budget"):
        doc["spec"]["sweep"].pop(key, None)
    doc["spec"]["training"].update(microBatchSize=1, seqLen=32)
    doc["spec"].setdefault("metrics", {})["port"] = free_port()
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def results(out: Path) -> dict:
    try:
        return json.loads((out / "results.json").read_text())
    except (OSError, ValueError):
        return {}


def gpt2bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpt2bench", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_a_disk_that_fills_mid_sweep_is_named_and_resume_goes_on_from_the_last_finished_run(tmp_path, small_disk):
    spec, out = sweep_file(tmp_path), small_disk / "out"
    runner = subprocess.Popen([sys.executable, "-m", "gpt2bench", "run", str(spec), "--steps", "5", "--output",
                               str(out)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        deadline = time.monotonic() + 240
        while runner.poll() is None and time.monotonic() < deadline:
            runs = results(out).get("runs") or []
            if runs and runs[0]["phase"] in ("Succeeded", "Failed"):
                break
            time.sleep(0.05)
        fill(small_disk)
        stdout, stderr = runner.communicate(timeout=240)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == 3, stdout[-2000:] + stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert f"the disk mounted at {small_disk} (tmpfs" in stderr and str(out) in stderr, stderr
    assert f"--resume --output {out}" in stderr, stderr
    doc = results(out)
    assert [run["phase"] for run in doc["runs"]] == ["Succeeded", "Interrupted"], doc["runs"]
    assert doc["phase"] == "Interrupted"
    assert "the disk filled up while it ran" in doc["runs"][1]["reason"]
    first = doc["runs"][0]

    fill(small_disk)  # what the runner freed to write results.json's last word, taken too
    still_full = gpt2bench("report", str(out), "--quiet")  # the disk full: named, not a traceback
    assert still_full.returncode == 3, still_full.stdout[-2000:] + still_full.stderr[-3000:]
    assert "Traceback" not in still_full.stderr and "is full" in still_full.stderr, still_full.stderr
    assert results(out)["runs"] == doc["runs"], "results.json stays whole"

    (small_disk / "filler").unlink()  # room again
    report = gpt2bench("report", str(out), "--quiet")
    assert report.returncode == 0, report.stderr[-3000:]
    assert (out / "results.md").exists()
    resumed = gpt2bench("run", str(spec), "--steps", "5", "--output", str(out), "--resume")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    doc = results(out)
    assert [run["phase"] for run in doc["runs"]] == ["Succeeded", "Succeeded"], doc["runs"]
    assert doc["runs"][0]["startTime"] == first["startTime"], "the finished run kept, not run again"
    assert not (out / ".gpt2bench-reserve").exists()
    FIGURES["full-disk-mid-sweep"] = {"exit_code": 3, "runs_kept": 1, "runs_interrupted": 1, "report_exit_code": 3,
                                      "resume_ran": 1, "runs_lost": 0}


def test_a_full_disk_at_the_report_step_exits_3_saying_so_with_every_run_kept(tmp_path, monkeypatch, capsys):
    """The sweep's runs all finished (results.json says so); writing the report meets ENOSPC (injected at the
    report's writes: the test does not fill a disk at that exact moment): one line naming the disk, exit 3,
    results.json as it was, and what to run once there is room."""
    from gpt2bench.local import cli as local_cli
    from gpt2bench.specification.validation import load_benchmarks_file

    spec = sweep_file(tmp_path)
    out = tmp_path / "out"
    finished = {"benchmark": "cpu-sweep", "namespace": "default", "spec": {}, "phase": "Succeeded", "runs": []}

    def run_sweep(benchmark, runs, directory, **_):
        write_atomic(directory / "results.json", json.dumps(finished))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(directory / "results.md"))

    monkeypatch.setattr(local_cli, "run_sweep", run_sweep)
    benchmark = load_benchmarks_file(str(spec), None)[0]
    code = local_cli._run_benchmark(benchmark, [], 2, out, [], local_cli.Resumed(), str(spec))
    err = capsys.readouterr().err
    assert code == 3
    assert f"writing in {out}" in " ".join(err.split()) and "is full" in err, err
    assert "Every run finished" in err and f"gpt2bench report {out}" in " ".join(err.split()), err
    assert json.loads((out / "results.json").read_text()) == finished
    assert not (out / ".gpt2bench-reserve").exists()


def test_a_write_that_meets_a_full_disk_names_the_file_and_the_disk_and_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    path.write_text("old")
    real_fsync = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(DiskFull) as raised:
        write_atomic(path, "new")
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert path.read_text() == "old" and not list(tmp_path.glob(".*.tmp"))
    assert str(raised.value).startswith(f"cannot write {path}: No space left on device: the disk ")
    assert raised.value.errno == errno.ENOSPC and disk_full(raised.value)
    assert "free of" in describe_disk(tmp_path / "not" / "yet")
