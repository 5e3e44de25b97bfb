"""The local runner's processes and folder, piece by piece: children die with their parent, a
trainer stops when its runner is gone, a results folder has one writer and says what happened to a sweep whose
runner was killed, `--resume` / `--overwrite` / a refusal decide what an existing folder becomes, the trainer's
metrics bind loopback locally and its Prometheus folder goes. The whole thing with real sweeps, SIGHUP and SIGKILL:
tests/test_faults_local.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from conftest import alive, narrowed

from gpt2bench.conventions import METRICS_ADDRESS_ENV, RUNNER_PID_ENV
from gpt2bench.files import FolderBusy, held, holding
from gpt2bench.local.replicas import free_port
from gpt2bench.local.sweep import FolderRefused, prepare_folder, spec_document
from gpt2bench.plan import plan_runs
from gpt2bench.specification.validation import load_benchmark
from gpt2bench.status import ABANDONED, LocalRun, ResultsDocument, settle_abandoned

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = yaml.safe_load((ROOT / "manifests" / "examples" / "cpu-sweep.yaml").read_text())


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {what}")


# ------------------------------------------------------------------ children die with their parent
PARENT = textwrap.dedent("""
    import subprocess, sys, time
    from gpt2bench.local.processes import die_with_parent
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True,
                             preexec_fn=die_with_parent())
    print(child.pid, flush=True)
    time.sleep(120)
""")


def test_a_replica_gets_sigterm_when_the_runner_is_killed_outright():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert alive(child)
        parent.kill()  # SIGKILL: the runner can do nothing about it
        parent.wait()
        wait_until(lambda: not alive(child), 5, "the child to end with its parent")
    finally:
        parent.kill()


WATCHED = textwrap.dedent("""
    import time
    from gpt2bench.trainer.lifeline import watch_runner
    assert watch_runner(poll_seconds=0.1) is not None
    print("watching", flush=True)
    time.sleep(120)
""")


@pytest.mark.parametrize("reaped", [True, False], ids=["runner gone", "runner a zombie"])
def test_a_trainer_anywhere_below_the_runner_stops_when_the_runner_is_gone(reaped):
    """The trainer is no child of the runner here (as under torchrun or mpirun): it watches the pid it was given."""
    runner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    trainer = subprocess.Popen([sys.executable, "-c", WATCHED], env={**os.environ, RUNNER_PID_ENV: str(runner.pid)},
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert trainer.stdout.readline() == "watching\n"
        time.sleep(0.3)
        assert trainer.poll() is None, "the runner is alive: the trainer goes on"
        runner.kill()
        if reaped:
            runner.wait()
        start = time.monotonic()
        assert trainer.wait(timeout=5) == -signal.SIGTERM
        assert time.monotonic() - start < 2
        assert f"(pid {runner.pid}) is gone: stopping" in trainer.stderr.read()
    finally:
        runner.kill()
        runner.wait()
        trainer.kill()


def test_no_runner_in_the_environment_nothing_is_watched():
    from gpt2bench.trainer.lifeline import watch_runner

    assert watch_runner({}) is None and watch_runner({RUNNER_PID_ENV: "not a pid"}) is None


# ------------------------------------------------------------------ metrics on loopback, the Prometheus folder removed
EXPORTER = textwrap.dedent("""
    import json, os, socket, sys, urllib.request
    from gpt2bench.trainer.config import TrainConfig
    from gpt2bench.trainer.exporter import PrometheusExporter
    port = int(sys.argv[1])
    config = TrainConfig(process={"metrics_port": port})
    exporter = PrometheusExporter(config, rank=0, strategy="single", local_rank=0, workers=1)
    address = exporter.server.server_address[0]
    existed = exporter.folder.is_dir()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as scrape:
        served = scrape.status, "gpt2bench_train_steps_total" in scrape.read().decode()
    exporter.close()
    again = socket.socket()
    again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the next run's server: past the scrape's TIME_WAIT,
    again.bind((address, port))  # not past a listener (Linux): the server is closed, its port free for the next run
    again.listen()
    print(json.dumps({"address": address, "folder": str(exporter.folder), "existed": existed,
                      "left": exporter.folder.exists(), "served": served}))
""")


@pytest.mark.parametrize("address, expected", [(None, "0.0.0.0"), ("127.0.0.1", "127.0.0.1")],
                         ids=["in a pod: every address", "locally: loopback"])
def test_metrics_bind_where_they_are_told_and_the_prometheus_folder_goes(tmp_path, address, expected):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop(METRICS_ADDRESS_ENV, None)
    if address:
        env[METRICS_ADDRESS_ENV] = address
    done = subprocess.run([sys.executable, "-c", EXPORTER, str(free_port())], env=env, capture_output=True, text=True,
                          timeout=120, check=True)
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["address"] == expected
    assert seen["existed"] and not seen["left"] and Path(seen["folder"]).parent == tmp_path
    assert seen["served"] == [200, True]
    assert "GET /metrics" not in done.stderr  # a scrape every 15 s is not worth a log line


def test_the_local_runner_tells_every_replica_its_pid_and_loopback(tmp_path):
    from gpt2bench.local.executor import job_replicas
    from gpt2bench.render import render_job

    bench = benchmark(tmp_path, strategies=("single", "ddp", "horovod"))
    for backend in ("pytorchjob", "trainjob"):  # PyTorchJob, MPIJob, TrainJob (torch and MPI runtimes)
        for run in plan_runs(bench, backend):
            for replica in job_replicas(render_job(bench, run, backend), tmp_path / backend / run.name):
                assert replica.env[RUNNER_PID_ENV] == str(os.getpid())
                assert replica.env[METRICS_ADDRESS_ENV] == "127.0.0.1"


# ------------------------------------------------------------------ one writer per folder; a killed one's sweep
def test_a_folder_has_one_writer_and_is_free_once_it_is_gone(tmp_path):
    assert not held(tmp_path)
    with holding(tmp_path):
        assert held(tmp_path)
        with pytest.raises(FolderBusy), holding(tmp_path):
            pass
    assert not held(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from gpt2bench.files import holding
        with holding({str(tmp_path)!r}):
            print("held", flush=True)
            time.sleep(120)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n" and held(tmp_path)
        holder.kill()  # the kernel lets go, whatever the process could not do
        holder.wait()
        assert not held(tmp_path)
    finally:
        holder.kill()


def benchmark(tmp_path: Path, steps: int = 12, strategies=("single", "ddp", "fsdp")):
    doc = narrowed(json.loads(json.dumps(EXAMPLE)))
    doc["spec"]["training"]["steps"] = steps
    doc["spec"]["sweep"].update(strategies=[{"name": s} for s in strategies], precisions=["fp32"], repeats=1)
    for key in ("maxRepeats", "minEffect", "budget"):  # one round, none added until decided
        doc["spec"]["sweep"].pop(key, None)
    return load_benchmark(doc)


def entry(run, phase: str, **extra) -> LocalRun:
    from gpt2bench import collect

    return LocalRun(**{**dict(collect.run_entry(run, phase=phase)), **extra})


def earlier_sweep(tmp_path: Path, phases: list[str], bench=None) -> Path:
    """DIR/results.json as a runner killed mid-sweep leaves it (phase Running, nobody holding DIR)."""
    bench = bench or benchmark(tmp_path)
    runs = plan_runs(bench)
    directory = tmp_path / "out"
    directory.mkdir(exist_ok=True)
    doc = ResultsDocument(benchmark=bench.name, spec=spec_document(bench.spec), phase="Running",
                          start_time="2026-11-26T05:00:00Z",
                          runs=[entry(run, phase, reason="boom" if phase == "Failed" else None)
                                for run, phase in zip(runs, phases, strict=True)])
    doc.save(directory)
    (directory / ".results.json.x1y2.tmp").write_text("{half")  # a write the SIGKILL cut short
    return directory


def test_a_sweep_left_running_by_a_killed_runner_reads_as_interrupted_but_not_while_one_holds_it(tmp_path):
    directory = earlier_sweep(tmp_path, ["Succeeded", "Running", "Pending"])
    doc = ResultsDocument.load(directory)
    with holding(directory):  # a live runner: what it wrote stands
        assert settle_abandoned(doc, directory) is doc
    settled = settle_abandoned(doc, directory)
    assert settled.phase == "Interrupted"
    assert [(r.phase, r.reason) for r in settled.runs] == [
        ("Succeeded", None), ("Interrupted", ABANDONED), ("Skipped", "not started: the sweep was interrupted")]
    from gpt2bench.report.cli import main as report

    assert report([str(directory), "--quiet"]) == 0  # `gpt2bench report DIR` is a look too: it says so and keeps it
    assert ResultsDocument.load(directory).runs[1].phase == "Interrupted"


def test_an_existing_folder_is_refused_unless_resume_or_overwrite_says_what_to_do(tmp_path):
    bench = benchmark(tmp_path)
    plan = plan_runs(bench)
    directory = earlier_sweep(tmp_path, ["Succeeded", "Failed", "Running"], bench)
    with pytest.raises(FolderRefused, match=r"the sweep in .*out was interrupted with 2 of 3 runs finished: `gpt2bench "
                                            r"run FILE --resume --output .*out` \(FILE: GPT2Benchmark cpu-sweep's "
                                            r"file\) keeps them and runs the rest; --overwrite starts again"):
        prepare_folder(bench, plan, plan, directory)
    runs, resumed = prepare_folder(bench, plan, plan, directory, resume=True)
    assert [r.name for r in runs] == [r.name for r in plan]  # in plan order; the first two are kept, not run
    assert set(resumed.kept) == {plan[0].name, plan[1].name} and resumed.start_time == "2026-11-26T05:00:00Z"
    assert resumed.kept[plan[1].name].reason == "boom" and not resumed.start_over
    only_third = prepare_folder(bench, plan, plan[2:], directory, resume=True)[0]
    assert [r.name for r in only_third] == [r.name for r in plan]  # --only narrower than before: kept ones stay
    runs, resumed = prepare_folder(bench, plan, plan[:1], directory, overwrite=True)
    assert runs == plan[:1] and resumed.start_over and not resumed.kept
    with holding(directory), pytest.raises(FolderRefused, match="being written by another gpt2bench run now"):
        prepare_folder(bench, plan, plan, directory, resume=True)


def test_gpt2bench_report_of_an_interrupted_sweep_says_so_and_how_to_resume_it(tmp_path, capsys):
    """Before the fix: after a SIGKILL, results.json says Running until `report` or `run` reads it; they read it as
    interrupted, and now say so, with the command that finishes it."""
    from gpt2bench.report.cli import main

    directory = earlier_sweep(tmp_path, ["Succeeded", "Running", "Pending"], benchmark(tmp_path))
    assert main([str(directory), "--quiet"]) == 0
    said = capsys.readouterr().err
    assert f"the sweep in {directory} was interrupted with 1 of 3 runs finished: `gpt2bench run FILE --resume " \
           f"--output {directory}`" in said


def test_resume_refuses_another_spec_naming_what_differs(tmp_path):
    directory = earlier_sweep(tmp_path, ["Succeeded", "Running", "Pending"])
    other = benchmark(tmp_path, steps=20)
    with pytest.raises(FolderRefused, match=r"another spec \(spec.training.steps: 12 in the results, 20 now\)"):
        prepare_folder(other, plan_runs(other), plan_runs(other), directory, resume=True)


def test_an_unreadable_results_file_is_named_and_only_overwrite_goes_past_it(tmp_path):
    bench = benchmark(tmp_path)
    plan = plan_runs(bench)
    (tmp_path / "results.json").write_text("{not json")
    with pytest.raises(FolderRefused, match=r"results.json cannot be read .*--overwrite starts again"):
        prepare_folder(bench, plan, plan, tmp_path, resume=True)
    assert prepare_folder(bench, plan, plan, tmp_path, overwrite=True)[1].start_over


def test_a_resume_with_nothing_left_to_run_keeps_every_entry_and_clears_a_killed_writes_leftover(tmp_path):
    from gpt2bench.local.sweep import run_sweep

    bench = benchmark(tmp_path)
    plan = plan_runs(bench)
    directory = earlier_sweep(tmp_path, ["Succeeded", "Failed", "Failed"], bench)
    before = ResultsDocument.load(directory).runs
    runs, resumed = prepare_folder(bench, plan, plan, directory, resume=True)
    sweep = run_sweep(bench, runs, directory, live=False, resumed=resumed)
    assert sweep.doc.runs == before and sweep.doc.phase == "PartiallySucceeded" and not sweep.interrupted
    assert sweep.doc.start_time == "2026-11-26T05:00:00Z" and not (directory / "runs").exists()  # nothing ran
    assert not list(directory.glob(".*.tmp")) and not held(directory)
