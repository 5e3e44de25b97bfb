"""Faults of the laptop user's `gpt2bench run`, injected into real sweeps: the terminal closed
under it (SIGHUP from a real pseudo-terminal hanging up) and the runner killed outright (SIGKILL) mid-run, under
torchrun and under mpirun. Afterwards no trainer, launcher or rank of the sweep runs, the results say what
happened, the temporary folders are gone, and `--resume` finishes only what was not finished.

Markers as tests/test_faults.py (slow, faults); its figures go to docs/reliability.md's table, printed with -s.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml
from conftest import narrowed
from fault_figures import FIGURES

from gpt2bench.conventions import RUNNER_PID_ENV
from gpt2bench.local.replicas import free_port
from gpt2bench.status import ABANDONED

pytestmark = [pytest.mark.slow, pytest.mark.faults, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "manifests" / "examples" / "cpu-sweep.yaml"
STEPS = "20"  # long enough to be caught training: the first records come at step 2 (end of warm-up)


def sweep_file(tmp_path: Path, strategies: list[str]) -> Path:
    doc = narrowed(yaml.safe_load(EXAMPLE.read_text()))
    doc["spec"]["sweep"].update(strategies=[{"name": s} for s in strategies], precisions=["fp32"], repeats=1)
    for key in ("maxRepeats", "minEffect", "budget"):  # one round, none added until decided
        doc["spec"]["sweep"].pop(key, None)
    doc["spec"]["training"].update(microBatchSize=1, seqLen=32)  # the processes are under test, not the model
    doc["spec"].setdefault("metrics", {})["port"] = free_port()
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    return {**os.environ, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1"}


def runner_processes(runner: int) -> list[psutil.Process]:
    """Every live process started under the runner `runner`, however deep (they all carry its pid)."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get(RUNNER_PID_ENV) == str(runner) and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def is_trainer(process: psutil.Process) -> bool:
    """`gpt2bench train` itself (python .../gpt2bench train ...), not a launcher whose command line names it."""
    command = process.cmdline()
    return len(command) > 2 and Path(command[1]).name == "gpt2bench" and command[2] == "train"


def results(out: Path) -> dict:
    try:
        return json.loads((out / "results.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def wait_training(out: Path, index: int, runner: subprocess.Popen, timeout: float = 150) -> dict:
    """Until run `index` is Running and its trainer has written a step record."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and runner.poll() is None:
        runs = results(out).get("runs") or []
        if len(runs) > index and runs[index]["phase"] == "Running" and runs[index].get("runDir"):
            if any(path.stat().st_size for path in (out / runs[index]["runDir"]).glob("*/steps.jsonl")):
                return runs[index]
        time.sleep(0.1)
    raise AssertionError(f"run {index} never trained (runner exit code {runner.poll()})")


def leftovers(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith(("gpt2bench-", "torchelastic_")))


def gpt2bench(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpt2bench", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_a_closed_terminal_stops_the_sweep_like_ctrl_c_and_says_so(tmp_path, env):
    """`gpt2bench run` on a real pseudo-terminal as its controlling terminal; the terminal hangs up (its master side
    closes) while torchrun's two trainers train: the kernel's SIGHUP. The runner stops the run's processes, writes
    the results (its terminal gone, it writes nothing there) and exits 130."""
    out = tmp_path / "out"
    master, slave = pty.openpty()
    runner = subprocess.Popen(
        [sys.executable, "-m", "gpt2bench", "run", str(sweep_file(tmp_path, ["ddp", "single"])), "--steps", STEPS,
         "--output", str(out)],
        stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT, start_new_session=True,
        preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))  # the pty becomes its controlling terminal
    os.close(slave)
    screen, reading = bytearray(), threading.Event()
    reading.set()

    def drain() -> None:  # what a terminal does: read what the program writes
        while reading.is_set():
            if select.select([master], [], [], 0.1)[0]:
                try:
                    screen.extend(os.read(master, 65536))
                except OSError:
                    return

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        wait_training(out, 0, runner)
        trainers = [p for p in runner_processes(runner.pid) if is_trainer(p)]
        assert len(trainers) == 2, [p.cmdline() for p in trainers]
        reading.clear()
        reader.join()
        hung_up = time.monotonic()
        os.close(master)  # the terminal closes
        assert runner.wait(timeout=60) == 130, screen.decode(errors="replace")[-3000:]
        stopped_in = time.monotonic() - hung_up
    finally:
        runner.kill()
    assert runner_processes(runner.pid) == [] and not any(p.is_running() for p in trainers)
    doc = results(out)
    ddp, single = doc["runs"]
    assert (ddp["phase"], ddp["reason"]) == (
        "Interrupted", "stopped by SIGHUP (its terminal or SSH session closed); its processes were killed")
    assert (single["phase"], single["reason"]) == ("Skipped", "not started: the sweep was interrupted")
    assert doc["phase"] == "Interrupted" and doc["completionTime"] and (out / "results.md").exists()
    assert leftovers(Path(env["TMPDIR"])) == [] and not list(out.glob(".*.tmp"))
    print(f"\nSIGHUP: runner exited 130 {stopped_in:.1f} s after the hang-up; {len(trainers)} trainers stopped")
    FIGURES["terminal-closed-local"] = {"injected": 1, "runner_exit_code": 130, "exited_after_s": round(stopped_in, 1),
                                        "trainers_stopped": len(trainers), "runs_lost": 0,
                                        "in_flight_reason": ddp["reason"], "not_started_reason": single["reason"]}


def test_a_killed_runner_takes_its_ranks_along_and_resume_finishes_only_the_rest(tmp_path, env, capsys):
    """SIGKILL while Horovod trains under `gpt2bench launch -- mpirun`: the launcher, mpirun and both ranks end on
    their own (the parent-death signal, and each trainer watching the runner); results.json still says Running,
    and reads as Interrupted on the next look (`gpt2bench report`); a plain re-run refuses the folder; `--resume`
    keeps the finished run untouched and runs the other one."""
    from gpt2bench.local.cli import main as run
    from gpt2bench.report.cli import main as report

    out, sweep = tmp_path / "out", sweep_file(tmp_path, ["single", "horovod"])
    with open(tmp_path / "first.log", "wb") as log:
        runner = subprocess.Popen([sys.executable, "-m", "gpt2bench", "run", str(sweep), "--steps", STEPS,
                                   "--output", str(out)], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    try:
        horovod = wait_training(out, 1, runner)
        started = runner_processes(runner.pid)
        names = {" ".join(p.cmdline()[:3]) for p in started}
        assert any("mpirun" in n for n in names) and sum(map(is_trainer, started)) == 2, names
        metrics = {c.laddr for p in started for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
        port = yaml.safe_load(sweep.read_text())["spec"]["metrics"]["port"]
        assert {a.ip for a in metrics if a.port == port} == {"127.0.0.1"}, metrics  # loopback, not 0.0.0.0
        runner.kill()
        killed = time.monotonic()
        runner.wait()
    finally:
        runner.kill()
    deadline = time.monotonic() + 30
    while runner_processes(runner.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    gone_in = time.monotonic() - killed
    assert runner_processes(runner.pid) == [], [p.cmdline() for p in runner_processes(runner.pid)]
    left = results(out)
    assert left["phase"] == "Running" and [r["phase"] for r in left["runs"]] == ["Succeeded", "Running"]
    first = left["runs"][0]
    first_steps = out / first["stepsFile"]
    first_mtime = first_steps.stat().st_mtime_ns

    capsys.readouterr()
    assert report([str(out), "--quiet"]) == 0  # the next look: it says so, and how to finish the sweep
    assert f"the sweep in {out} was interrupted with 1 of 2 runs finished: `gpt2bench run FILE --resume --output " \
           f"{out}`" in capsys.readouterr().err
    looked = results(out)
    assert looked["phase"] == "Interrupted" and (looked["runs"][1]["phase"], looked["runs"][1]["reason"]) == (
        "Interrupted", ABANDONED)

    capsys.readouterr()
    assert run([str(sweep), "--steps", STEPS, "--output", str(out)]) == 2
    assert "was interrupted with 1 of 2 runs finished: `gpt2bench run FILE --resume" in capsys.readouterr().err
    assert results(out) == looked  # refused: nothing touched

    resumed = gpt2bench("run", str(sweep), "--steps", STEPS, "--output", str(out), "--resume", env=env)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"{first['name']}: kept from the earlier sweep: Succeeded" in resumed.stdout
    assert "2 of 2 runs, 1 kept from the earlier sweep" in resumed.stdout
    final = results(out)
    assert final["runs"][0] == first and first_steps.stat().st_mtime_ns == first_mtime  # kept as it was
    assert [r["phase"] for r in final["runs"]] == ["Succeeded"] * 2 and final["phase"] == "Succeeded"
    assert final["runs"][1]["name"] == horovod["name"] and final["startTime"] == left["startTime"]
    assert leftovers(Path(env["TMPDIR"])) == [] and not list(out.glob(".*.tmp"))
    print(f"\nSIGKILL: {len(started)} processes of the sweep gone {gone_in:.1f} s after the kill; "
          f"resume ran 1 of 2 runs")
    FIGURES["runner-killed-local"] = {"injected": 1, "processes": len(started), "gone_after_s": round(gone_in, 1),
                                      "runs_lost": 0, "runs_run_again_by_resume": 1, "reason_on_next_look": ABANDONED}
