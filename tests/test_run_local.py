"""`gpt2bench run FILE.yaml`: every strategy end to end with real processes (torchrun, mpirun), a failing run
followed by a good one, Ctrl-C mid-sweep, two scales, and bad input.

Budget (2 shared cores): every run trains the tiny model for 3 steps; about 2 minutes in all.
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.image
import pytest
import yaml
from conftest import narrowed, runner_environment

from gpt2bench.local import cli as run_local
from gpt2bench.local import sweep as local_sweep
from gpt2bench.local.replicas import free_port
from gpt2bench.plan import plan_runs
from gpt2bench.render import render_job
from gpt2bench.report.steps import read_steps
from gpt2bench.report.table import results_table_markdown
from gpt2bench.specification.model import STRATEGIES
from gpt2bench.specification.validation import load_benchmark_file
from gpt2bench.status import ResultsDocument

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "manifests" / "examples" / "cpu-sweep.yaml"
PNGS = ("throughput.png", "peak_memory.png", "train_time.png", "grad_norm.png", "loss.png", "loss_time.png",
        "grad_norm_steps.png")


@pytest.fixture
def example(tmp_path) -> Path:
    """The default example, with a metrics port nobody else on this machine uses, each configuration once (the
    runner is under test here; the repeats and their noise rules have their own tests)."""
    document = narrowed(yaml.safe_load(EXAMPLE.read_text()))
    document["spec"].setdefault("metrics", {})["port"] = free_port()
    document["spec"]["sweep"]["repeats"] = 1
    for key in ("maxRepeats", "minEffect", "budget"):  # one round, none added until decided
        document["spec"]["sweep"].pop(key, None)
    document["spec"]["training"]["allowEmulatedPrecision"] = True  # bf16 trains whatever units this CPU has
    path = tmp_path / "cpu-sweep.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


@pytest.fixture
def child_env(tmp_path, monkeypatch, fork_server, sweeps_forked) -> dict[str, str]:
    """The environment of a sweep run here or by the CLI, whose fork server this worker's forks (conftest)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    # torchrun and torch.compile leave folders in TMPDIR; one thread per process on 2 shared cores
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return runner_environment(fork_server)


def gpt2bench(*args: str, env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpt2bench", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        check=False,
    )


def processes_using(directory: Path) -> list[int]:
    """Live processes whose environment points into `directory` (every replica's does)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            uses = str(directory).encode() in (entry / "environ").read_bytes()
            if uses and (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def assert_png(path: Path) -> None:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    assert matplotlib.image.imread(path).ndim == 3


# ---------------------------------------------------------------- fast: bad input


def test_bad_yaml_fails_naming_the_field_and_runs_nothing(tmp_path, capsys):
    document = yaml.safe_load(EXAMPLE.read_text())
    document["spec"]["sweep"]["strategies"][2]["name"] = "allreduce-magic"
    document["spec"]["training"]["seqLen"] = 4
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(document))
    out = tmp_path / "out"
    assert run_local.main([str(bad), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "spec.sweep.strategies[2].name" in err
    assert "spec.training.seqLen" in err
    assert "nothing was run" in err
    assert not out.exists()


def test_bad_options_are_named(tmp_path, capsys, example):
    assert run_local.main([str(example), "--only", "no-such-run", "--output", str(tmp_path / "o")]) == 2
    assert "--only 'no-such-run' matches none of the" in capsys.readouterr().err
    assert run_local.main([str(example), "--only", "(", "--output", str(tmp_path / "o")]) == 2
    assert "--only: invalid regular expression" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        run_local.main([str(example), "--steps", "0"])
    assert exit_info.value.code == 2
    assert "--steps: must be at least 1" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_steps_override_is_validated_like_the_file():
    benchmark = local_sweep.with_steps(load_benchmark_file(str(EXAMPLE)), 3)
    assert benchmark.spec.training.steps == 3
    assert benchmark.spec.training.warmup_steps == 2  # the example's 2 still fits below 3
    assert local_sweep.with_steps(benchmark, 2).spec.training.warmup_steps == 1  # halved when it would not


# ---------------------------------------------------------------- slow: real sweeps


@pytest.mark.slow
def test_a_failing_run_is_reported_and_the_next_one_runs(tmp_path, example, child_env):
    """Failure injected into the rendered job's trainer args (--fail-at-step), as a user's bad run would. fp32 runs:
    an emulated bf16 one (the example's 256 tokens a step) would take most of the test's time."""
    benchmark = local_sweep.with_steps(load_benchmark_file(str(example)), 3)
    runs = local_sweep.select_runs(plan_runs(benchmark), r"(single|ddp)-fp32")
    jobs = [render_job(benchmark, run) for run in runs]
    container = jobs[0]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    container["command"] += ["--fail-at-step", "1"]
    sweep = local_sweep.run_sweep(benchmark, runs, tmp_path / "out", jobs=jobs, live=False)
    doc = sweep.doc.dump()

    failed, succeeded = doc["runs"]
    assert failed["phase"] == "Failed" and "results" not in failed
    assert "failure injected at step 1" in failed["reason"]
    assert succeeded["phase"] == "Succeeded", succeeded
    assert doc["phase"] == "PartiallySucceeded"
    assert doc["best"]["run"] == succeeded["name"]
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert saved == doc
    table = (tmp_path / "out" / "results.md").read_text()
    assert "Failed: " in table and "failure injected at step 1" in table


def test_a_bf16_run_this_cpu_would_only_emulate_is_skipped_with_the_reason_and_not_started(
        tmp_path, example, monkeypatch):
    monkeypatch.setattr(local_sweep, "cpu_emulation_reason", lambda precision: f"{precision} emulated on this CPU")
    document = yaml.safe_load(example.read_text())
    document["spec"]["training"]["allowEmulatedPrecision"] = False
    example.write_text(yaml.safe_dump(document, sort_keys=False))
    benchmark = load_benchmark_file(str(example))
    runs = local_sweep.select_runs(plan_runs(benchmark), r"single-bf16")
    doc = local_sweep.run_sweep(benchmark, runs, tmp_path / "out", live=False).doc
    (skipped,) = doc.runs
    assert (skipped.phase, skipped.reason) == ("Skipped", "bf16 emulated on this CPU")
    assert not (tmp_path / "out" / "runs").exists()  # nothing was started
    assert not (tmp_path / "out" / local_sweep.FORKSERVER_LOG).exists()  # not even the fork server
    assert doc.phase == "Failed" and doc.analysis.recommended is None  # nothing measured, said so


@pytest.mark.slow
def test_ctrl_c_mid_sweep_leaves_a_consistent_folder(tmp_path, example, child_env):
    out = tmp_path / "results"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpt2bench",
            "run",
            str(example),
            "--steps",
            "12",  # the second run (single bf16) must outlast this test's reaction on a CPU with bf16 units too
            "--only",
            "single-|ddp-fp32",
            "--output",
            str(out),
        ],
        env=child_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    try:
        # wait until the first run finished and the second one's processes are training
        deadline = time.monotonic() + 180
        second_log = None
        while time.monotonic() < deadline and process.poll() is None:
            try:
                runs = json.loads((out / "results.json").read_text())["runs"]
            except (OSError, json.JSONDecodeError):
                runs = []
            if runs and runs[0]["phase"] == "Succeeded" and runs[1]["phase"] == "Running":
                second_log = out / runs[1]["runDir"] / "master-0.log"
                if second_log.exists() and processes_using(out / runs[1]["runDir"]):
                    break
            time.sleep(0.2)
        assert second_log is not None and process.poll() is None, "the sweep never reached its second run"
        process.send_signal(signal.SIGINT)  # at once: a second run of 12 steps takes 2 s on a fast machine
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, output

    doc = json.loads((out / "results.json").read_text())
    first, second, third = doc["runs"]
    assert first["phase"] == "Succeeded" and first["results"]["tokensPerSecond"] > 0  # kept
    assert second["phase"] == "Interrupted" and "results" not in second
    assert third["phase"] == "Skipped" and not (out / "runs" / third["name"]).exists()
    assert (out / first["stepsFile"]).exists()
    assert doc["phase"] == "Interrupted" and doc["completionTime"]
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    assert processes_using(out) == []  # every replica process was killed
    assert results_table_markdown(ResultsDocument.read(doc)) in (out / "results.md").read_text()
    assert "interrupted" in output


@pytest.mark.slow
def test_two_scale_sweep_recommends_per_scale_and_checks_the_papers(tmp_path, example, child_env):
    """1 and 2 processes, real trainers through run_sweep: ddp fp32 at both scales (scaling efficiency), ddp
    bf16 and fsdp fp32 at 2 (precision, FSDP memory, convergence): the analysis lands in results.json,
    results.md and results.csv, and every figure in it is the runs' own."""
    document = yaml.safe_load(example.read_text())
    document["spec"]["sweep"] = {
        "strategies": [{"name": "ddp"}, {"name": "fsdp"}], "precisions": ["fp32", "bf16"],
        "scales": [{"nodes": 1, "devicesPerNode": 0, "processesPerNode": 1},
                   {"nodes": 1, "devicesPerNode": 0, "processesPerNode": 2}],
    }  # fmt: skip
    # 32 tokens a step instead of the example's 256: bf16 is emulated on CPUs without half-precision units
    document["spec"]["training"] |= {"seqLen": 16, "microBatchSize": 2}
    document["spec"]["data"]["maxDocuments"] = 12
    document["spec"]["cost"] = {"nodeHour": 0.5, "currency": "EUR"}
    path = tmp_path / "two-scales.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    benchmark = local_sweep.with_steps(load_benchmark_file(str(path)), 3)
    runs = local_sweep.select_runs(plan_runs(benchmark), r"ddp-fp32-1x1$|ddp-(fp32|bf16)-1x2$|fsdp-fp32-1x2$")
    out = tmp_path / "out"
    sweep = local_sweep.run_sweep(benchmark, runs, out, live=False)

    doc = ResultsDocument.load(out)
    assert doc == sweep.doc and all(r.phase == "Succeeded" for r in doc.runs), [r.reason for r in doc.runs]
    by_name = {r.name.removeprefix("cpu-sweep-"): r.results for r in doc.runs}
    analysis = doc.analysis
    recs = {(r.objective, r.scale): r for r in analysis.recommendations}
    assert set(recs) == {(o, s) for o in ("fastest", "leanest", "cheapest") for s in ("1×1 CPU", "1×2 CPU")} | {
        ("cheapest", None), ("scalable", "1×2 CPU"), ("efficient", None)}  # no RAPL here: energy not measurable
    two = [by_name[n] for n in ("ddp-fp32-1x2", "ddp-bf16-1x2", "fsdp-fp32-1x2")]
    fastest = recs[("fastest", "1×2 CPU")]
    # one measurement per configuration: ranked, never decided
    assert fastest.value == max(r.tokens_per_second for r in two) and fastest.decision == "needs-repeats"
    assert fastest.winner is None
    assert recs[("leanest", "1×2 CPU")].value == min(r.peak_memory_bytes for r in two)
    assert recs[("fastest", "1×1 CPU")].decision == "only-candidate"
    assert analysis.recommended == fastest
    cost = recs[("cheapest", "1×1 CPU")]  # one pod at 0.5 EUR/h
    assert cost.value == pytest.approx(0.5 / (by_name["ddp-fp32-1x1"].tokens_per_second * 3600) * 1e6)
    assert cost.unit == "EUR per 1M tokens"

    one, ddp2 = by_name["ddp-fp32-1x1"], by_name["ddp-fp32-1x2"]
    efficiency = ddp2.tokens_per_second_per_device / one.tokens_per_second_per_device
    assert [(s.strategy, s.precision, s.scale, s.efficiency) for s in analysis.scaling] == [
        ("ddp", "fp32", "1×1 CPU", 1.0), ("ddp", "fp32", "1×2 CPU", pytest.approx(efficiency))]
    # 2 processes in the same 2-CPU pod as 1: each rank had half the cores, so no scaling verdict rests on it
    assert (one.cores_per_rank, ddp2.cores_per_rank) == (2, 1) and "by construction" in analysis.scaling[1].refused
    assert recs[("scalable", "1×2 CPU")].decision == "not-measurable"

    verdicts = {f.id: f.verdict for f in analysis.findings + analysis.checks}  # single measurements decide nothing
    assert by_name["fsdp-fp32-1x2"].state_bytes < 0.6 * ddp2.state_bytes
    assert {verdicts[f] for f in ("synchronous-strategies-converge-alike", "mixed-precision-faster")} == {
        "needs-repeats"}
    assert verdicts["fsdp-memory-below-ddp"] == "not-measurable"  # model state on CPU is accounting, not measured
    assert verdicts["ddp-scales-near-linearly"] == "not-measurable"  # refused: fewer cores per rank
    assert verdicts["horovod-most-robust-across-nodes"] == "not-measurable"

    markdown = (out / "results.md").read_text()
    assert ("**At the largest scale measured (1×2 CPU): not decided: a comparison needs 3 rounds or more (has 1)**"
            in markdown and fastest.run in markdown)
    assert (f"| ddp | fp32 | 1×2 CPU | 2 | {ddp2.tokens_per_second_per_device:,.0f} | {efficiency:.2f} (not a scaling "
            "measurement") in markdown
    assert "| FSDP's per-rank memory is below DDP's |" in markdown and "accounting" in markdown
    assert "**not decided: needs 3 measurements or more** |" in markdown
    with open(out / "results.csv", newline="") as f:
        rows = {row["name"]: row for row in csv.DictReader(f)}
    assert list(rows) == [r.name for r in doc.runs]
    assert float(rows["cpu-sweep-ddp-fp32-1x2"]["scalingEfficiency"]) == pytest.approx(efficiency)
    assert float(rows["cpu-sweep-ddp-fp32-1x2"]["tokensPerSecond"]) == ddp2.tokens_per_second
    for png in (*PNGS, "scaling.png"):
        assert_png(out / png)


@pytest.mark.slow
def test_every_strategy_runs_through_the_cli_with_its_share_of_the_cpus_and_is_reported(tmp_path, example,
                                                                                        horovod_import_error,
                                                                                        fork_server):
    """`gpt2bench run` of every strategy at 1×2 (one sweep for what two tests checked apart, each sweep's start-up
    being the suite's cost): torchrun with 1 and 2 processes, the MPIJob launcher's mpirun, DataParallel's one
    process, ps's servers. Each run's results and steps, the table printed and written, the plots, and `gpt2bench
    report DIR` rebuilding them from results.json; and each rank's intra-op threads, read back inside the rank, are
    its share of the pod's CPUs whatever launches it (torchrun would set OMP_NUM_THREADS=1, mpirun sets nothing)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    # the budget, not the environment, sets the threads
    env = {**{k: v for k, v in runner_environment(fork_server).items() if k != "OMP_NUM_THREADS"}, "TMPDIR": str(tmp)}
    document = yaml.safe_load(example.read_text())
    document["spec"]["training"] |= {"warmupSteps": 1, "seqLen": 32}
    document["spec"]["data"]["maxDocuments"] = 12
    document["spec"]["sweep"] = {
        "strategies": [{"name": s, **({"psServers": 2} if s == "ps-sharded" else {})} for s in STRATEGIES],
        "precisions": ["fp32"], "scales": [{"nodes": 1, "devicesPerNode": 0, "processesPerNode": 2}]}
    path = tmp_path / "every-strategy.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    out = tmp_path / "results"
    done = gpt2bench("run", str(path), "--steps", "3", "--output", str(out), env=env)
    assert done.returncode == 0, done.stdout + done.stderr

    doc = json.loads((out / "results.json").read_text())
    expected = [run.name for run in plan_runs(load_benchmark_file(str(path)))]
    assert [r["name"] for r in doc["runs"]] == expected and [r["strategy"] for r in doc["runs"]] == list(STRATEGIES)
    runs = {r["strategy"]: r for r in doc["runs"]}
    assert runs["horovod"]["jobKind"] == "MPIJob" and runs["ddp"]["jobKind"] == "PyTorchJob"
    if horovod_import_error:
        horovod = runs.pop("horovod")
        assert horovod["phase"] == "Failed"
        assert re.search(r"horovod", horovod["reason"], re.IGNORECASE), horovod["reason"]
        assert re.search(r"not installed|No module named|needs Horovod", horovod["reason"]), horovod["reason"]
    cores = min(2, len(os.sched_getaffinity(0)))  # the pod asks for 2 CPUs; one pod on this machine
    for strategy, run in runs.items():
        assert run["phase"] == "Succeeded", run
        assert run["results"]["tokensPerSecond"] > 0 and run["results"]["trainSeconds"] > 0
        assert [s["step"] for s in read_steps(out / run["stepsFile"])] == [1, 2, 3]
        (summary_file,) = (out / run["runDir"]).glob("*/summary.json")  # the reporting rank's summary
        summary = json.loads(summary_file.read_text())
        processes = summary["processes"]  # workers and parameter servers alike
        share = cores / processes
        assert summary["threads_by_rank"] == [max(1, int(share))] * processes, strategy
        assert run["results"]["threadsPerRank"] == max(1, int(share))
        assert run["results"]["coresPerRank"] == pytest.approx(share), strategy
    assert runs["ddp"]["results"]["worldSize"] == 2 and runs["single"]["results"]["worldSize"] == 1
    assert doc["phase"] in ("Succeeded", "PartiallySucceeded")
    assert doc["best"]["run"] in expected
    assert doc["spec"]["training"]["steps"] == 3 and doc["startTime"] and doc["completionTime"]

    markdown = (out / "results.md").read_text()
    assert results_table_markdown(ResultsDocument.read(doc)) in markdown
    for name in expected:
        assert name in done.stdout  # the table is printed at the end
    for png in PNGS:
        assert_png(out / png)

    # `gpt2bench report DIR` rebuilds the same report from results.json alone
    for path in [out / "results.md", *(out / png for png in PNGS)]:
        path.unlink()
    rebuilt = gpt2bench("report", str(out), "--quiet", env=env)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert (out / "results.md").read_text() == markdown
    for png in PNGS:
        assert_png(out / png)


def test_a_reason_with_brackets_is_printed_as_text_not_read_as_markup(example):
    """gloo's timeout reason holds `[/…/unbound_buffer.cc:78]`, which rich would read as a closing tag."""
    import io

    from rich.console import Console

    from gpt2bench.collect import run_entry
    from gpt2bench.local.progress import Display

    out = io.StringIO()
    run = plan_runs(load_benchmark_file(str(example)))[0]
    reason = "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out"
    with Display(Console(file=out, width=300), total_runs=1, steps=3, live=False) as display:
        display.start_run(0, 1, run)
        display.end_run(run_entry(run, phase="Failed", reason=reason))
    assert f"{run.name}: Failed: {reason}" in out.getvalue()
