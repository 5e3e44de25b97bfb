"""`gpt2bench launch`: the MPIJob launcher's wrapper, run as a real process around real commands."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fault_figures import FIGURES

from gpt2bench import files, launch
from gpt2bench.collect import parse_termination_message

SUMMARY = {"status": "ok", "tokens_per_second": 42.5, "world_size": 2}


def launch_process(args: list[str], tmp_path: Path, **kwargs) -> subprocess.Popen:
    env = {
        **os.environ,
        "GPT2BENCH_TERMINATION_LOG": str(tmp_path / "termination-log"),
        "OMP_NUM_THREADS": "1",
        "TMPDIR": str(tmp_path),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "gpt2bench", "launch", "--", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def run_launch(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    process = launch_process(args, tmp_path)
    out, err = process.communicate(timeout=60)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "rank.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


RANK_SCRIPT = f"""
    import json, os, sys
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
    print(f"rank {{rank}} step 1", flush=True)
    if rank == 0:
        print("GPT2BENCH_SUMMARY " + json.dumps({json.dumps(SUMMARY)}), flush=True)
"""


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed")
@pytest.mark.parametrize("tag_output", [False, True])
def test_mpirun_summary_reaches_the_termination_log(tmp_path, tag_output):
    mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "-bind-to", "none", "-map-by", "slot"]
    if tag_output:  # "[1,0]<stdout>:GPT2BENCH_SUMMARY ..." must still be found
        mpirun.append("--tag-output")
    done = run_launch([*mpirun, sys.executable, script(tmp_path, RANK_SCRIPT)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "rank 0 step 1" in done.stdout and "rank 1 step 1" in done.stdout  # output streamed through
    message = (tmp_path / "termination-log").read_text()
    assert json.loads(message) == SUMMARY
    assert parse_termination_message(message)["tokens_per_second"] == 42.5


def test_exit_code_is_the_commands(tmp_path):
    done = run_launch(["sh", "-c", f"echo 'GPT2BENCH_SUMMARY {json.dumps(SUMMARY)}'; exit 7"], tmp_path)
    assert done.returncode == 7
    assert json.loads((tmp_path / "termination-log").read_text()) == SUMMARY


def test_last_summary_line_wins(tmp_path):
    done = run_launch(
        [
            "sh",
            "-c",
            'echo \'GPT2BENCH_SUMMARY {"status":"ok","n":1}\'; echo \'GPT2BENCH_SUMMARY {"status":"ok","n":2}\'',
        ],
        tmp_path,
    )
    assert done.returncode == 0
    assert json.loads((tmp_path / "termination-log").read_text())["n"] == 2


def test_no_summary_writes_a_failure_with_the_output_tail(tmp_path):
    done = run_launch(
        ["sh", "-c", "echo starting; echo 'ORTE was unable to reach daemon on node worker-1' >&2; exit 1"], tmp_path
    )
    assert done.returncode == 1
    summary = parse_termination_message((tmp_path / "termination-log").read_text())
    assert summary["status"] == "failed"
    assert summary["reason"] == ("sh exited with code 1 without a GPT2BENCH_SUMMARY line: ORTE was unable to reach "
                                 "daemon on node worker-1")


@pytest.mark.parametrize("tag", ["[1,1]<stderr>:", "[1]<stderr>:", ""], ids=["mpirun", "horovodrun", "header"])
def test_a_ranks_reason_comes_first_when_the_launcher_ends_without_a_summary(tmp_path, tag):
    """Before the fix: rank 1 gave up (rank 0, the reporter, printed no summary); the reason led with
    "mpirun exited with code 1 without a GPT2BENCH_SUMMARY line". The rank's words come first now, whichever
    launcher tagged them (or only the trainer's log header names the rank)."""
    said = "horovod: the all-reduce of the gradients waited more than 4 s (--timeout-seconds) for the other ranks"
    done = run_launch(["sh", "-c", f"echo '{tag}2026-11-26 10:00:09,000 rank1 ERROR {said}'; "
                                   "echo 'Primary job  terminated normally, but 1 process returned a non-zero exit "
                                   "code.'; exit 1"], tmp_path)
    assert done.returncode == 1
    summary = parse_termination_message((tmp_path / "termination-log").read_text())
    assert summary["reason"] == f"rank 1: {said} (sh exited with code 1 without a GPT2BENCH_SUMMARY line)"


@pytest.mark.faults
def test_a_launcher_killed_before_the_summary_says_so_without_dumping_the_config(tmp_path):
    """mpirun killed (the launcher pod deleted, a node drained): the reason says by what, and the last line
    that means something, not the trainer's config JSON that happened to be the last line printed."""
    config = '[1,0]<stderr>:2026-11-26 10:00:00,000 rank0 INFO config {"data": {"source": "sotu"}, "model": {}}'
    done = run_launch(["sh", "-c", f"echo 'rank0 WARNING slow start'; echo '{config}'; kill -TERM $$"], tmp_path)
    assert done.returncode == 143
    summary = parse_termination_message((tmp_path / "termination-log").read_text())
    assert summary["reason"] == ("sh was killed by SIGTERM (exit code 143) without a GPT2BENCH_SUMMARY line: "
                                 "rank0 WARNING slow start")
    FIGURES["launcher-killed-before-summary"] = {"injected": 1, "exit_code": done.returncode, "runs_lost": 0,
                                                 "reason": summary["reason"]}


def test_missing_command_exits_127_with_a_reason(tmp_path):
    done = run_launch(["no-such-mpirun-here"], tmp_path)
    assert done.returncode == 127
    assert "cannot run 'no-such-mpirun-here'" in done.stderr
    # runc's words for a container's own command (and the local runner's): the same fault reads the same
    assert json.loads((tmp_path / "termination-log").read_text())["reason"] == \
        'exec: "no-such-mpirun-here": executable file not found in $PATH'


def test_sigterm_is_forwarded_and_reported(tmp_path):
    process = launch_process(
        [sys.executable, "-u", "-c", "import time; print('ready', flush=True); time.sleep(60)"], tmp_path
    )
    assert process.stdout.readline().strip() == "ready"
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=20)
    assert time.monotonic() - started < 15
    assert process.returncode == 128 + signal.SIGTERM
    assert "was killed by SIGTERM (exit code 143)" in json.loads((tmp_path / "termination-log").read_text())["reason"]


def test_without_a_termination_log_nothing_is_written(tmp_path, monkeypatch, capsysbinary):
    monkeypatch.delenv("GPT2BENCH_TERMINATION_LOG", raising=False)
    monkeypatch.setattr(files, "DEFAULT_TERMINATION_LOG", tmp_path / "absent")
    assert launch.termination_log_path() is None
    assert launch.main(["--", "sh", "-c", "echo hello"]) == 0
    assert b"hello" in capsysbinary.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_default_termination_log_is_used_when_it_exists(tmp_path, monkeypatch):
    monkeypatch.delenv("GPT2BENCH_TERMINATION_LOG", raising=False)
    default = tmp_path / "termination-log"
    default.write_text("")
    monkeypatch.setattr(files, "DEFAULT_TERMINATION_LOG", default)
    assert launch.main(["--", "sh", "-c", f"echo 'GPT2BENCH_SUMMARY {json.dumps(SUMMARY)}'"]) == 0
    assert json.loads(default.read_text()) == SUMMARY


def test_usage_error_without_a_command(capsys):
    with pytest.raises(SystemExit) as caught:
        launch.main(["--"])
    assert caught.value.code == 2
    assert "give the command to run" in capsys.readouterr().err


def test_the_rendered_launcher_command_runs_through_the_console_script(tmp_path):
    """The MPIJob launcher's command starts `gpt2bench launch -- mpirun ...`: the installed console script must
    dispatch it, and a command that prints no summary still leaves a failed summary saying so."""
    from gpt2bench.plan import plan_runs
    from gpt2bench.render.mpijob import mpirun_command
    from gpt2bench.specification.validation import load_benchmark

    run = plan_runs(load_benchmark({"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark",
                                    "metadata": {"name": "b"},
                                    "spec": {"sweep": {"strategies": [{"name": "horovod"}]}}}))[0]
    launcher = mpirun_command(run)[: mpirun_command(run).index("--") + 1]
    assert launcher[0] == "gpt2bench"
    log = tmp_path / "termination-log"
    result = subprocess.run([shutil.which("gpt2bench"), *launcher[1:], "true"], capture_output=True, text=True,
                            env={**os.environ, "GPT2BENCH_TERMINATION_LOG": str(log)}, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    written = json.loads(log.read_text())
    assert written["status"] == "failed" and "true exited with code 0 without a GPT2BENCH_SUMMARY line" in written["reason"]


# -- waiting for the workers' sshd (the launcher is created with them: tests/test_gang.py) ------------------------


def waiting_launch(tmp_path: Path, hostfile: str, seconds: float, port: int) -> subprocess.Popen:
    (tmp_path / "hostfile").write_text(hostfile)
    env = {**os.environ, "GPT2BENCH_TERMINATION_LOG": str(tmp_path / "termination-log"),
           "OMPI_MCA_orte_default_hostfile": str(tmp_path / "hostfile")}
    command = [sys.executable, "-c", f"print('GPT2BENCH_SUMMARY ' + {json.dumps(SUMMARY)!r})"]
    return subprocess.Popen([sys.executable, "-m", "gpt2bench", "launch", "--wait-seconds", str(seconds),
                             "--ssh-port", str(port), "--", *command], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_the_launcher_waits_for_a_workers_sshd_that_starts_late_then_runs_mpirun(tmp_path):
    """0.0.0.0 stands for a worker's address (Linux connects it to this machine): its "sshd" listens 1.5 s late."""
    import socket
    import threading

    from gpt2bench.local.replicas import free_port

    port = free_port()
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def start_late():
        time.sleep(1.5)
        server.bind(("0.0.0.0", port))
        server.listen()

    threading.Thread(target=start_late, daemon=True).start()
    started = time.monotonic()
    process = waiting_launch(tmp_path, f"0.0.0.0 slots=4\nlocalhost slots=4\n{socket.gethostname()} slots=4\n",
                             30, port)
    out, err = process.communicate(timeout=60)
    server.close()
    assert process.returncode == 0, err
    assert time.monotonic() - started >= 1.5  # it waited for the late worker (and only for it)
    assert parse_termination_message((tmp_path / "termination-log").read_text()) == SUMMARY


def test_a_worker_that_never_answers_ends_the_launcher_with_a_failed_summary_naming_it(tmp_path):
    from gpt2bench.local.replicas import free_port

    port = free_port()  # nothing listens there
    process = waiting_launch(tmp_path, "0.0.0.0 slots=4\n", 2, port)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 1 and "GPT2BENCH_SUMMARY" not in out  # the command never ran
    written = json.loads((tmp_path / "termination-log").read_text())
    assert written["status"] == "failed"
    assert written["reason"].startswith(f"the workers' sshd did not answer within 2 s: 0.0.0.0:{port} (")


def test_only_other_hosts_are_waited_for():
    import socket

    assert launch.is_this_pod("localhost") and launch.is_this_pod("127.0.1.1")
    assert launch.is_this_pod(f"{socket.gethostname().split('.')[0]}.bench.default.svc")
    assert not launch.is_this_pod("bench-worker-0.bench.default.svc")
    seen, clock = [], iter(range(100))
    missing = launch.wait_for_workers(["a", "b"], 2222, 3, check=lambda host, port: seen.append(host) or (
        None if host == "a" else "Name or service not known"), clock=lambda: float(next(clock)), sleep=lambda s: None,
                                      say=lambda text: None)
    assert missing == {"b": "Name or service not known"} and seen.count("a") == 1  # a answered once, b kept trying
