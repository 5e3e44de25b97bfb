"""The local runner's fork server (gpt2bench/local/forkserver.py) and its stand-in (forkclient.py), as real processes.

One real server per module (its real imports: torch and transformers' GPT-2), and a probe program that reports what
it started with. Each property is checked against the same probe run as a fresh process: a forked child must see
what a fresh one sees (descriptors, environment, signals, umask, working directory, module search path, standard
streams, threads), and its parent must see what it would have seen (exit codes, deaths by signal, signals passed
on, nothing left behind when the stand-in or the runner is killed outright).
"""

from __future__ import annotations

import contextlib
import getpass
import json
import mmap
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from conftest import alive, narrowed, runner_environment

from gpt2bench.conventions import FORKSERVER_ENV, FORKSERVER_SWITCH_ENV
from gpt2bench.local import forkclient, forkserver

PROBE = """#!{python}
import json, os, signal, sys, tempfile, time

mode, out, fd = sys.argv[1], sys.argv[2], int(sys.argv[3])


def disposition(signum):
    handler = signal.getsignal(signum)
    return {{signal.SIG_IGN: "ignored", signal.SIG_DFL: "default", signal.default_int_handler: "KeyboardInterrupt"}}.get(
        handler, "other")


seen = {{
    "pid": os.getpid(), "argv": sys.argv, "cwd": os.getcwd(), "umask": os.umask(0o022), "env": dict(os.environ),
    "path": sys.path, "fds": sorted(int(f) for f in os.listdir("/proc/self/fd")
                                    if os.path.exists(f"/proc/self/fd/{{f}}")),
    "fd": os.read(fd, 100).decode(), "threads": len(os.listdir("/proc/self/task")),
    "signals": {{s.name: disposition(s) for s in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE,
                                                 signal.SIGUSR1, signal.SIGXFSZ)}},
    "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
    "comm": open("/proc/self/comm").read().strip(), "tempdir": tempfile.gettempdir(),
    "stdout": [sys.stdout.line_buffering, sys.stdout.write_through], "stderr": sys.stderr.line_buffering,
    "affinity": sorted(os.sched_getaffinity(0)), "group_leader": os.getpgid(0) == os.getpid(),
    "session_leader": os.getsid(0) == os.getpid(), "main": __name__, "file": __file__,
    "launcher": __import__("gpt2bench.trainer.env", fromlist=["launcher_pid"]).launcher_pid(),
}}
with open(out, "w") as f:
    json.dump(seen, f)
if mode == "exit7":
    sys.exit(7)
if mode == "raise":
    raise RuntimeError("boom from the probe")
if mode == "usr1":
    os.kill(os.getpid(), signal.SIGUSR1)
if mode == "term":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])
if mode == "print":
    print("line one", flush=False)
    sys.stdout.write("no newline, never flushed by hand")
    sys.exit(0)
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode in ("term", "sleep", "stubborn"):
    sleeper = __import__("subprocess").Popen(["sleep", "300"])
    with open(out + ".pids", "w") as f:
        json.dump([os.getpid(), sleeper.pid], f)
    time.sleep(300)
"""


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("probe") / "probe"
    path.write_text(PROBE.format(python=sys.executable))
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real fork server (the runner's `serving`), its environment and its log."""
    folder = tmp_path_factory.mktemp("server")
    base = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    base.pop(FORKSERVER_SWITCH_ENV, None)
    # set in this process by any earlier test that imported transformers (it asks inductor for its cache folder,
    # which sets the variable): a runner's environment does not have it, and the test below checks it is set anew
    base.pop("TORCHINDUCTOR_CACHE_DIR", None)
    # under a TMPDIR past sun_path's 108 bytes, as pytest's own is under xdist (test_a_tmpdir_deeper_...)
    deep = folder / ("d" * 100) / ("e" * 60)
    deep.mkdir(parents=True)
    log = folder / "forkserver.log"
    with forkserver.serving({**base, "TMPDIR": str(deep)}, log) as env:
        assert FORKSERVER_ENV in env, log.read_text()
        yield env, log


def launch(probe: Path, mode: str, out: Path, env: dict[str, str], forked: bool,
           ignore_hup: bool = True) -> subprocess.Popen:
    """The probe as the executor starts a replica (new session, restored signals), fresh or through the stand-in;
    a pipe with a word in it on an extra descriptor, SIGHUP ignored and SIGUSR2 blocked by its starter."""
    read, write = os.pipe()
    os.write(write, b"hello")
    os.close(write)

    def starter() -> None:
        if ignore_hup:
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])

    argv = [str(probe), mode, str(out), str(read)]
    if forked:
        argv = [sys.executable, "-m", forkclient.__name__, *argv]
    try:
        return subprocess.Popen(argv, env=env, cwd=out.parent, pass_fds=(read,), umask=0o027, start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=starter)
    finally:
        os.close(read)


def job_env(server_env: dict[str, str], tmp: Path) -> dict[str, str]:
    """What the executor gives a replica: the server's environment, a TMPDIR of the job's own, and variables the
    runner, the Kubeflow operators and launchers set per process."""
    tmp.mkdir(exist_ok=True)
    return {**server_env, "TMPDIR": str(tmp), "PYTHONUNBUFFERED": "1", "RANK": "0", "MASTER_PORT": "29511",
            "GPT2BENCH_OUTPUT_DIR": str(tmp)}


def wait_file(path: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.stat().st_size:
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.05)


# ---------------------------------------------------------------- what the child starts with
def test_a_forked_child_starts_as_a_fresh_process_would(server, probe, tmp_path):
    env, log = server
    env = job_env(env, tmp_path / "tmp")
    seen = {}
    for forked in (False, True):
        out = tmp_path / f"seen-{forked}.json"
        process = launch(probe, "plain", out, env, forked)
        assert process.wait(timeout=120) == 0, process.stderr.read()
        seen[forked] = json.loads(out.read_text())
        seen[forked]["client"] = process.pid
    fresh, child = seen[False], seen[True]
    assert fresh["pid"] == fresh["client"] and child["pid"] != child["client"]  # really forked, by the server
    assert "forked" in log.read_text()
    # the server's imports set torch's compile-cache folder; a fresh trainer's imports set it the same way
    cache = child["env"].pop("TORCHINDUCTOR_CACHE_DIR")
    assert cache == os.path.join(env["TMPDIR"], f"torchinductor_{getpass.getuser()}")
    for key in ("pid", "client"):
        del fresh[key], child[key]
    assert child["argv"].pop(2) == str(tmp_path / "seen-True.json")  # where each writes: the one difference asked
    assert fresh["argv"].pop(2) == str(tmp_path / "seen-False.json")
    assert child == fresh
    assert fresh["fd"] == "hello" and fresh["umask"] == 0o027 and fresh["threads"] == 1
    assert fresh["signals"] == {"SIGHUP": "ignored", "SIGINT": "KeyboardInterrupt", "SIGTERM": "default",
                                "SIGPIPE": "ignored", "SIGUSR1": "default", "SIGXFSZ": "ignored"}
    assert fresh["blocked"] == [signal.SIGUSR2] and fresh["session_leader"] and fresh["comm"] == "probe"
    assert fresh["stdout"] == [False, True] and fresh["tempdir"] == env["TMPDIR"] and fresh["main"] == "__main__"
    assert fresh["launcher"] == os.getpid()  # and the child's too (its parent is the server's relay)


def test_output_left_in_buffers_is_written_as_a_fresh_interpreter_would(server, probe, tmp_path):
    env = {**job_env(server[0], tmp_path / "tmp")}
    env.pop("PYTHONUNBUFFERED")  # buffered: what the program leaves unflushed goes out at its end
    printed = {}
    for forked in (False, True):
        process = launch(probe, "print", tmp_path / f"seen-{forked}.json", env, forked)
        out, _ = process.communicate(timeout=120)
        printed[forked] = (process.returncode, out)
    assert printed[True] == printed[False] == (0, b"line one\nno newline, never flushed by hand")


# ---------------------------------------------------------------- what its parent sees
@pytest.mark.parametrize("mode, code, said", [
    ("exit7", 7, None),
    ("usr1", -signal.SIGUSR1, None),
    ("raise", 1, 'RuntimeError: boom from the probe'),
])
def test_the_stand_in_ends_as_the_child_ended(server, probe, tmp_path, mode, code, said):
    env = job_env(server[0], tmp_path / "tmp")
    ends = {}
    for forked in (False, True):
        process = launch(probe, mode, tmp_path / f"seen-{forked}.json", env, forked)
        _, err = process.communicate(timeout=120)
        ends[forked] = (process.returncode, err.decode())
    assert ends[True][0] == ends[False][0] == code
    if said:  # the traceback starts at the script's own frame, as a fresh interpreter prints it
        assert ends[True][1] == ends[False][1] and said in ends[True][1]
        assert "runpy" not in ends[True][1] and "forkserver" not in ends[True][1]


def forked_probe(server, probe: Path, tmp_path: Path, mode: str) -> tuple[subprocess.Popen, int, int]:
    """The probe forked in `mode`, once it has started its sleeper: the stand-in, the child's pid, the sleeper's."""
    out = tmp_path / "seen.json"
    process = launch(probe, mode, out, job_env(server[0], tmp_path / "tmp"), forked=True)
    wait_file(Path(f"{out}.pids"))
    child, sleeper = json.loads(Path(f"{out}.pids").read_text())
    return process, child, sleeper


def gone(pids: tuple[int, ...], seconds: float) -> bool:
    """Whether every process of `pids` has ended within `seconds`."""
    deadline = time.monotonic() + seconds
    while any(map(alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(map(alive, pids))


def test_a_signal_to_the_stand_in_reaches_the_child(server, probe, tmp_path):
    """What torchrun and mpirun do to stop a worker: SIGTERM to the process they started (here, the stand-in)."""
    process, child, sleeper = forked_probe(server, probe, tmp_path, "term")
    assert child != process.pid
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 3  # the child's handler ran and exited 3
    assert gone((child, sleeper), 15)  # and what it left in its process group goes, as with a pod


def test_a_stand_in_killed_outright_takes_the_child_and_its_tree_along(server, probe, tmp_path):
    process, child, sleeper = forked_probe(server, probe, tmp_path, "sleep")
    process.kill()
    process.wait()
    assert gone((child, sleeper), 20)  # SIGTERM, then SIGKILL after the relay's grace


@pytest.mark.parametrize("under", ["fresh", "under-another-server"])
def test_the_server_and_its_children_go_when_the_runner_is_killed(tmp_path, probe, server, under):
    """A runner killed outright (SIGKILL): its server gets the parent-death signal, each relay the server's, and
    each child its relay's: nothing of the sweep keeps running. A runner that itself runs under another server (the
    test suite's) has its server forked from that one, which imports nothing again; it goes all the same, and the
    server it came from stays."""
    upstream_env, upstream_log = server
    if under == "fresh":
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    else:  # the environment the upstream server was started with, and its address
        env = {k: v for k, v in upstream_env.items() if k != forkserver.RUNNER_PID_ENV}
    runner = tmp_path / "runner.py"
    runner.write_text(f"""
import json, os, subprocess, sys, time
from gpt2bench.local import forkserver
with forkserver.serving(json.loads(sys.argv[1]), __import__("pathlib").Path({str(tmp_path / 'log')!r})) as env:
    read, write = os.pipe()
    os.write(write, b"x")
    client = subprocess.Popen([sys.executable, "-m", "gpt2bench.local.forkclient", {str(probe)!r}, "sleep",
                               {str(tmp_path / 'seen.json')!r}, str(read)], env=env, pass_fds=(read,))
    print(json.dumps([os.getpid(), client.pid]), flush=True)
    time.sleep(300)
""")
    servers_forked_before = upstream_log.read_text().count("forkserver-main.py")
    process = subprocess.Popen([sys.executable, str(runner), json.dumps(env)], stdout=subprocess.PIPE, text=True,
                               env=env)
    try:
        _, client = json.loads(process.stdout.readline())
        wait_file(tmp_path / "seen.json.pids")
        child, sleeper = json.loads((tmp_path / "seen.json.pids").read_text())
        server_pid = [int(p) for p in re.findall(r"forkserver\[(\d+)\] forked", (tmp_path / "log").read_text())][0]
        servers_forked = upstream_log.read_text().count("forkserver-main.py") - servers_forked_before
    finally:
        process.kill()
        process.wait()
    assert servers_forked == (under != "fresh"), upstream_log.read_text()[-2000:]
    deadline = time.monotonic() + 20
    while any(map(alive, (server_pid, child, sleeper, client))) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = {n: psutil.Process(p).as_dict(["status", "ppid", "name", "cmdline"]) for n, p in
            zip(("server", "child", "sleeper", "client"), (server_pid, child, sleeper, client)) if alive(p)}
    assert not left, (left, (tmp_path / "log").read_text())  # the stand-in too: its relay is gone
    if under != "fresh":
        upstream = re.findall(r"forkserver\[(\d+)\] forked \['\S*forkserver-main", upstream_log.read_text())
        assert alive(int(upstream[-1]))


def test_a_relay_told_twice_to_stop_still_stops_its_child(server, probe, tmp_path):
    """A relay SIGTERMed (its server gone: the parent-death signal) stops its child's tree, SIGKILL after the grace
    for a child that ignores SIGTERM. A second SIGTERM while it waits (whoever stops the server's tree or group sends
    one too: a sweep's end, or the server that forked a sweep's server) must not cut that short: the child would
    outlive everything, and its stand-in would never learn how it ended."""
    env, _ = server
    out = tmp_path / "seen.json"
    process = launch(probe, "stubborn", out, job_env(env, tmp_path / "tmp"), forked=True)
    wait_file(tmp_path / "seen.json.pids")
    child, sleeper = json.loads((tmp_path / "seen.json.pids").read_text())
    try:
        relay = psutil.Process(child).ppid()
        os.kill(relay, signal.SIGTERM)
        time.sleep(0.5)  # within the relay's grace (STOP_GRACE_SECONDS) for its child
        os.kill(relay, signal.SIGTERM)
        assert process.wait(timeout=60) == -signal.SIGKILL  # the child's end, as it ended (not 1: a relay cut short)
        assert not alive(child) and not alive(sleeper)
    finally:  # what a relay cut short leaves (it holds the stand-in's pipes)
        for pid in (child, sleeper):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_a_sweeps_end_leaves_no_child_its_relay_was_still_stopping(probe, tmp_path):
    """Two stand-ins killed outright: each relay SIGTERMs its child and waits out the grace, one child ignoring SIGTERM,
    the other stopped (a debugger's, a shell's ^Z: it cannot even take it). The sweep ends meanwhile and stops its
    server's tree, relays included. The children, each in a session of its own below a relay in the server's group,
    go with it all the same, and no relay dies of the second SIGTERM (the log has no traceback). A fresh server, as a
    user's sweep has."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    log = tmp_path / "log"
    children: list[int] = []
    with forkserver.serving(env, log) as served:
        assert FORKSERVER_ENV in served, log.read_text()
        try:
            for name in ("ignoring", "stopped"):
                out = tmp_path / name / "seen.json"
                out.parent.mkdir()
                process = launch(probe, "stubborn", out, job_env(served, out.parent / "tmp"), forked=True)
                wait_file(Path(f"{out}.pids"))
                child, sleeper = json.loads(Path(f"{out}.pids").read_text())
                children += [child, sleeper]
                if name == "stopped":
                    os.kill(child, signal.SIGSTOP)
                process.kill()
                process.wait()
        except BaseException:
            for pid in children:
                os.kill(pid, signal.SIGKILL)
            raise
    try:
        assert gone(tuple(children), 10), {p: psutil.Process(p).as_dict(["status", "ppid"]) for p in children
                                           if alive(p)}
    finally:
        for pid in children:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


# ---------------------------------------------------------------- when it refuses
def test_a_variable_read_on_import_sends_the_program_to_a_fresh_process(server, probe, tmp_path):
    env, log = server
    env = {**job_env(env, tmp_path / "tmp"), "PYTHONHASHSEED": "7"}
    out = tmp_path / "seen.json"
    process = launch(probe, "plain", out, env, forked=True)
    assert process.wait(timeout=120) == 0, process.stderr.read()
    assert json.loads(out.read_text())["pid"] == process.pid  # it ran itself: the stand-in became the program
    assert "environment variable PYTHONHASHSEED differs from the server's (unset there)" in log.read_text()


def test_which_differences_the_server_accepts():
    server = {"PATH": "/bin", "OMP_NUM_THREADS": "2", "HOME": "/root"}
    launched = {**server, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1", "RANK": "1", "LOCAL_RANK": "1",
                "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "x", "OMPI_COMM_WORLD_RANK": "1",
                "PMIX_RANK": "1", "GPT2BENCH_OUTPUT_DIR": "/o", "PET_NNODES": "1", "TMPDIR": "/t",
                "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "TORCHINDUCTOR_CACHE_DIR": "/c",
                "NCCL_SOCKET_IFNAME": "lo",  # horovodrun sets it for its ranks
                "JOB_COMPLETION_INDEX": "1"}  # a TrainJob's node pods have it (an indexed Job's)
    assert forkserver.env_difference(server, launched) is None
    for name, value in (("PATH", "/usr/bin"), ("PYTHONPATH", "/x"), ("LD_PRELOAD", "x.so"), ("MKL_NUM_THREADS", "1"),
                        ("TRANSFORMERS_VERBOSITY", "info"), ("HOME", None)):
        wanted = {**server, name: value} if value is not None else {k: v for k, v in server.items() if k != name}
        assert forkserver.env_difference(server, wanted).startswith(f"environment variable {name} differs")
    assert forkserver.env_difference(server, {**server, "OMP_NUM_THREADS": "4,2"}) == \
        "OMP_NUM_THREADS='4,2' is not one number"


def test_a_server_whose_imports_started_a_thread_or_changed_the_environment_does_not_serve(monkeypatch):
    """The server's checks on itself after its imports: the BLAS pools it loaded first are the only threads allowed
    (a fork copies none, and only those libraries start theirs again in the child), and its environment is what the
    requests are compared with."""
    import threading

    pools = forkserver.blas_threads()
    environ = dict(os.environ)
    assert forkserver.unforkable(environ, pools) is None
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert forkserver.unforkable(environ, pools) == "1 threads started while importing: a fork would copy none of them"
    finally:
        stop.set()
        thread.join()
    monkeypatch.setenv("SOMETHING_AN_IMPORT_SET", "1")
    assert forkserver.unforkable(environ, pools) == \
        "the imports changed environment variables ['SOMETHING_AN_IMPORT_SET']"
    monkeypatch.delenv("SOMETHING_AN_IMPORT_SET")

    def no_pidfd(_pid: int) -> int:
        raise OSError(38, "Function not implemented")  # ENOSYS: a kernel before 5.3

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)  # a relay could not wait on its child: nothing is served
    assert forkserver.unforkable(environ, pools) == "no pidfd_open on this kernel (Linux 5.3 or later)"


def test_only_scripts_of_the_servers_interpreter_are_handed_over(tmp_path):
    script = tmp_path / "s"
    for first, expected in ((f"#!{sys.executable}\n", sys.executable), (f"#!{sys.executable} -E\n", None),
                            ("#!/bin/sh\n", None), ("print(1)\n", None)):
        script.write_text(first)
        assert forkclient.python_script(str(script)) == expected
    assert forkclient.python_script(str(tmp_path / "missing")) is None
    assert forkserver._same_interpreter(sys.executable, sys.executable)
    assert not forkserver._same_interpreter(sys.executable, os.path.realpath(sys.executable)) or \
        os.path.dirname(os.path.realpath(sys.executable)) == os.path.dirname(sys.executable)


def test_a_server_that_is_off_or_cannot_serve_leaves_every_process_fresh(tmp_path, monkeypatch):
    env = {"PATH": os.environ["PATH"], "TMPDIR": str(tmp_path)}
    with forkserver.serving({**env, FORKSERVER_SWITCH_ENV: "off"}, tmp_path / "log") as served:
        assert FORKSERVER_ENV not in served and list(tmp_path.iterdir()) == []
    monkeypatch.setattr(forkserver, "BOOTSTRAP", "import sys; print('cannot serve', file=sys.stderr); sys.exit(1)")
    with forkserver.serving(env, tmp_path / "log") as served:
        assert served == env
    assert (tmp_path / "log").read_text() == "cannot serve\n"
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith("gpt2bench-")]  # its folder gone with it


# ---------------------------------------------------------------- memory as a fresh process's
def rss(pid: int | str = "self") -> int:
    return int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1)) * 1024


def test_a_child_has_the_file_pages_its_server_read_in_its_resident_set(tmp_path):
    """A fork copies no page-table entry of a file mapping, so a child's resident set (what the memory peak reads)
    would miss the shared libraries its server's imports read; `populate` maps them in again."""
    data = tmp_path / "data"
    data.write_bytes(os.urandom(1024 * 1024) * 32)
    with open(data, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        sum(mapped[i] for i in range(0, len(mapped), mmap.PAGESIZE))  # read: in this process's page tables
        runs = forkserver.resident_file_pages()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            before = rss()
            forkserver.populate(runs)
            os.write(write, json.dumps([before, rss()]).encode())
            os._exit(0)
        os.waitpid(pid, 0)
        before, after = json.loads(os.read(read, 100))
        parent = rss()
        mapped.close()
    assert parent - before > 30 * 2**20  # the 32 MiB file, missing from the child's count
    assert abs(after - parent) < 4 * 2**20


# ---------------------------------------------------------------- start-up per run
def test_start_up_per_run_is_the_job_time_less_worker_0s_training():
    from gpt2bench.local.sweep import job_timing
    from gpt2bench.status import RunResults, RunStatus

    entry = RunStatus(name="r", strategy="ddp", precision="fp32", nodes=1, devices_per_node=0, processes_per_node=2,
                      job_kind="PyTorchJob", job_name="r", phase="Succeeded", results=RunResults(train_seconds=3.25))
    assert job_timing(4.5, entry) == {"job_seconds": 4.5, "overhead_seconds": 1.25}
    assert job_timing(4.5, entry.model_copy(update={"results": None})) == {"job_seconds": 4.5}  # a failed run
    assert job_timing(None, entry) == {}  # no process started (a job refused before it)


# ---------------------------------------------------------------- real sweeps
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_forked_runs_train_exactly_what_fresh_runs_train(tmp_path, tmp_path_factory, horovod_import_error,
                                                        fork_server):
    """Each way the CPU example starts processes (fp32, 4 steps) through `gpt2bench run`, with the fork server (the
    default) and without it (GPT2BENCH_FORKSERVER=off): torchrun, its workers, `gpt2bench launch` and mpirun's ranks
    and ps's servers are all forked, none refused, and every run's loss curve is the fresh run's, to the last bit.
    Each run's job time and start-up per run are in results.json. single, ddp and fsdp are left out: their processes
    start as ps's do (a PyTorchJob's torchrun and its workers; ps adds its server), and the conftest's fork server
    forks their other tests' runs. Each process of the fresh half imports torch and transformers (about 9 s of CPU
    here), so each strategy left in costs ~20-30 s."""
    from gpt2bench.local.replicas import free_port
    from gpt2bench.report.steps import read_steps

    document = narrowed(yaml.safe_load((Path(__file__).resolve().parents[1] / "manifests/examples/cpu-sweep.yaml")
                                       .read_text()))
    document["spec"]["sweep"].update(precisions=["fp32"], repeats=1, breakdown="off")
    document["spec"]["training"] |= {"seqLen": 32, "microBatchSize": 2}  # how processes start is under test
    document["spec"]["data"]["maxDocuments"] = 12
    document["spec"]["sweep"]["strategies"] = [s for s in document["spec"]["sweep"]["strategies"]
                                               if s["name"] in ("horovod", "ps")]
    for key in ("maxRepeats", "minEffect", "budget"):
        document["spec"]["sweep"].pop(key)
    document["spec"].setdefault("metrics", {})["port"] = free_port()
    example = tmp_path / "sweep.yaml"
    example.write_text(yaml.safe_dump(document))
    (tmp_path / "tmp").mkdir()
    # under this worker's server, as every test's sweep: the sweep's own is its forked child; with the server off,
    # the sweep's processes start fresh all the same
    env = {**runner_environment(fork_server), "TMPDIR": str(tmp_path / "tmp")}
    worker_log = tmp_path_factory.getbasetemp() / "forkserver.log"  # the conftest's `fork_server`
    docs, worker_forks = {}, {}
    for mode in ("on", "off"):
        out = tmp_path / mode
        before = worker_log.read_text() if worker_log.exists() else ""
        done = subprocess.run([sys.executable, "-m", "gpt2bench", "run", str(example), "--steps", "4", "--output",
                               str(out)], env={**env, FORKSERVER_SWITCH_ENV: mode}, capture_output=True, text=True,
                              timeout=900, check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        docs[mode] = json.loads((out / "results.json").read_text())
        worker_forks[mode] = re.findall(r"forked \['[^']*/([\w.-]+)'", worker_log.read_text()[len(before):]) \
            if fork_server else None
    if fork_server:
        assert worker_forks == {"on": ["forkserver-main.py"], "off": []}, worker_forks
    log = (tmp_path / "on" / "forkserver.log").read_text()
    assert not (tmp_path / "off" / "forkserver.log").exists()
    assert "refused" not in log and "not serving" not in log, log
    forks = re.findall(r"forked \['[^']*/([\w-]+)', '([\w-]+)'", log)
    strategies = [s["name"] for s in document["spec"]["sweep"]["strategies"]]
    assert forks.count(("torchrun", "--no-python")) == len(strategies) - 1  # every PyTorchJob's launcher
    assert forks.count(("gpt2bench", "launch")) == 1  # the MPIJob's
    trainers = {"single": 1, "dataparallel": 1, "ddp": 2, "fsdp": 2, "horovod": 2, "ps": 3}  # at 1x2, ps's server
    assert forks.count(("gpt2bench", "train")) == sum(trainers[name] for name in strategies)
    horovod = horovod_import_error is None
    for on, off in zip(docs["on"]["runs"], docs["off"]["runs"], strict=True):
        assert on["name"] == off["name"]
        if on["strategy"] == "horovod" and not horovod:
            continue
        assert on["phase"] == off["phase"] == "Succeeded", (on, off)
        curves = [[s["loss"] for s in read_steps(tmp_path / mode / run["stepsFile"])] for mode, run in
                  (("on", on), ("off", off))]
        assert curves[0] == curves[1] and len(curves[0]) == 4, on["name"]
        for run in (on, off):
            assert run["overheadSeconds"] == pytest.approx(run["jobSeconds"] - run["results"]["trainSeconds"])
            assert 0 < run["overheadSeconds"] < run["jobSeconds"]


def test_a_tmpdir_deeper_than_a_socket_path_can_be_still_gets_a_server(server, probe, tmp_path):
    """The server's socket is in Linux's abstract namespace, not a file under TMPDIR: a TMPDIR past sun_path's 108
    bytes (pytest's own, under xdist) kept the server from binding, and every process ran fresh. The module's
    server runs under one."""
    env, _ = server
    deep = Path(env["TMPDIR"])
    assert len(str(deep)) > 108 and env[FORKSERVER_ENV].startswith("@") and not list(deep.glob("*/socket"))
    out = tmp_path / "seen.json"
    process = launch(probe, "plain", out, job_env(env, deep / "job"), forked=True)
    assert process.wait(timeout=120) == 0, process.stderr.read()
    assert json.loads(out.read_text())["pid"] != process.pid  # the server's child ran it, not the stand-in
