"""Shared fixtures: run the real trainer as real processes and read back what it wrote.

`run_trainer(args, nproc=2)` launches `torchrun --nproc-per-node 2 --no-python gpt2bench train ...`
(or one plain `gpt2bench train` process when nproc == 1, or any launcher prefix you pass, e.g.
horovodrun/mpirun), with a test-owned TMPDIR, one thread per process, a session-wide token cache,
and a termination-log file; it checks the exit code and returns a `TrainerRun`.
"""

from __future__ import annotations

import fcntl
import getpass
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpt2bench.conventions import FORKSERVER_ENV
from gpt2bench.local import forkclient, forkserver
from gpt2bench.local.replicas import free_port

# A tiny, fast, real run: tiny GPT-2 narrowed to 32 wide on the first State of the Union addresses. The width is
# most of a CPU step's cost (the 50,304-row embedding, LM head and its Adam state scale with it): 32 instead of the
# preset's 128 halves a 6-step fp32 run's CPU and divides an emulated bf16 one's by three.
TINY_N_EMBD = 32
TINY_ARGS = ["--model", "tiny", "--n-embd", str(TINY_N_EMBD), "--seq-len", "32", "--max-documents", "12",
             "--steps", "6", "--warmup-steps", "2", "--micro-batch-size", "2", "--lr", "1e-3"]
# fp16 and bf16 are emulated on CPUs without half-precision units (10-15x slower than fp32 on this machine, the LM
# head's matmul most of it, linear in tokens): tiny runs in them use 8-token sequences, a single bf16 step in 0.38 s
# (16 tokens: 0.68 s; what they test does not depend on it).
HALF_PRECISION_ARGS = ["--seq-len", "8", "--allow-emulated-precision"]


def held_params(summary: dict[str, Any], width: int = TINY_N_EMBD) -> int:
    """Elements a rank's full replica holds: every distinct parameter (summary's n_params) plus the vocabulary's
    zero padding rows, which n_params leaves out (`width` wide: the model's n_embd)."""
    from gpt2bench.trainer.model import VOCAB_SIZE

    return summary["n_params"] + (summary["padded_vocab_size"] - VOCAB_SIZE) * width


def narrowed(document: dict[str, Any]) -> dict[str, Any]:
    """A GPT2Benchmark document whose tiny model is TINY_N_EMBD wide, as TINY_ARGS' runs: for the local sweeps
    whose subject is not the model's size."""
    document["spec"].setdefault("model", {})["nEmbd"] = TINY_N_EMBD
    return document


def gpt2bench_executable() -> str:
    found = shutil.which("gpt2bench")
    if found is None:
        pytest.fail("the gpt2bench console script is not on PATH: run `pip install -e .`")
    return found


@pytest.fixture(scope="session")
def horovod_import_error(tmp_path_factory) -> str | None:
    """Why `import horovod.torch` fails here, or None; asked once per session (each asking costs a torch import):
    the first worker to ask probes, under a lock the others wait at, and keeps the answer where they read it.
    Imported in a child: a broken build must not kill pytest."""
    def probe() -> str:
        imported = subprocess.run([sys.executable, "-c", "import horovod.torch"], capture_output=True, text=True,
                                  check=False)
        return json.dumps(f"horovod.torch does not import: {imported.stderr.strip().splitlines()[-1:]}"
                          if imported.returncode else None)

    return json.loads(once_per_session(shared_dir(tmp_path_factory, "probes") / "horovod.json", probe))


def alive(pid: int) -> bool:
    """Whether process `pid` is still running (not ended: a zombie, or dead, has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def once_per_session(answer: Path, make: Callable[[], str]) -> str:
    """What `make()` returns, made by the first worker to ask and kept in `answer` for the others, who wait at a lock
    meanwhile (a probe or a build each worker would otherwise repeat)."""
    with open(answer.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not answer.exists():
            answer.write_text(make())
        return answer.read_text()


def torchrun_prefix(nproc: int, port: int | None = None, forked: bool = False, nodes: int = 1,
                    node_rank: int = 0) -> list[str]:
    """argv that runs `gpt2bench train` under torchrun with nproc local processes (on node `node_rank` of `nodes`,
    each its own torchrun as pods are); `forked`: torchrun asks the fork server for itself (through forkclient, as
    the local runner starts it), else it starts fresh.

    The `--` matters: torchrun's argparse would otherwise read the trainer's `--run` as an ambiguous
    abbreviation of its own `--run-path` and exit 2.
    """
    return [*_torchrun(nproc, port, forked, nodes, node_rank), "--no-python", "--", gpt2bench_executable(), "train"]


def _torchrun(nproc: int, port: int | None, forked: bool, nodes: int = 1, node_rank: int = 0) -> list[str]:
    """torchrun and its options, up to the program it runs; `forked`: asking the fork server for itself."""
    torchrun = [sys.executable, "-m", forkclient.__name__, shutil.which("torchrun") or "torchrun"] if forked else \
        [sys.executable, "-m", "torch.distributed.run"]
    return [*torchrun, *(["--nnodes", str(nodes), "--node-rank", str(node_rank)] if nodes > 1 else []),
            "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port", str(port or free_port())]


def torchrun_script(script: Path, body: str, nproc: int, fork_server: str | None) -> list[str]:
    """argv that runs the Python `body`, saved as `script`, on `nproc` torchrun workers. With `fork_server` torchrun
    and each worker are forked from it: the script gets the `#!` line forkclient needs to run it as this interpreter
    would, and each worker asks for itself through forkclient (the server's environment:
    `trainer_environment(fork_server)`)."""
    script.write_text(f"#!{sys.executable}\n{body}")
    script.chmod(0o755)
    program = ["--no-python", "--", sys.executable, "-m", forkclient.__name__] if fork_server else []
    return [*_torchrun(nproc, None, bool(fork_server)), *program, str(script)]


@dataclass
class TrainerRun:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    output: Path
    termination_log: Path
    summary: dict[str, Any] | None = None  # summary.json
    line_summary: dict[str, Any] | None = None  # the GPT2BENCH_SUMMARY stdout line
    steps: list[dict[str, Any]] = field(default_factory=list)  # steps.jsonl

    @property
    def losses(self) -> list[float]:
        return [s["loss"] for s in self.steps]

    @property
    def grad_norms(self) -> list[float]:
        return [s["grad_norm"] for s in self.steps]

    def describe(self) -> str:
        return f"argv: {' '.join(self.argv)}\nexit {self.returncode}\nstdout:\n{self.stdout[-3000:]}\n" \
               f"stderr:\n{self.stderr[-6000:]}"


def program_pid(pid: int) -> int:
    """The process that runs the program process `pid` was started for: the child a fork-server stand-in
    (forkclient.stand_in) holds a pidfd of, else `pid` itself. A signal a test means for the trainer itself (SIGKILL,
    SIGSTOP: a stand-in can pass neither on) goes there."""
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:[pidfd]":
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as info:
                return next(int(line.split()[1]) for line in info if line.startswith("Pid:"))
        except (OSError, StopIteration):
            continue
    return pid


def _read_run(run: TrainerRun) -> TrainerRun:
    summary_file = run.output / "summary.json"
    if summary_file.exists():
        run.summary = json.loads(summary_file.read_text())
    lines = [line for line in run.stdout.splitlines() if line.startswith("GPT2BENCH_SUMMARY ")]
    if lines:
        run.line_summary = json.loads(lines[-1].split(" ", 1)[1])
    steps_file = run.output / "steps.jsonl"
    if steps_file.exists():
        run.steps = [json.loads(line) for line in steps_file.read_text().splitlines() if line.strip()]
    return run


def shared_dir(tmp_path_factory, name: str) -> Path:
    """A folder every pytest-xdist worker of this session shares (their base temps have one parent): caches
    whose writers are atomic (the token cache writes whole files; inductor's cache is multi-process safe)."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / name
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def token_cache(tmp_path_factory) -> Path:
    """One tokenized-corpus cache for the whole session: the corpus is tokenized once."""
    return shared_dir(tmp_path_factory, "token-cache")


@pytest.fixture(scope="session")
def inductor_cache(tmp_path_factory) -> Path:
    """One torch.compile (inductor) cache for the whole session: each run's TMPDIR would otherwise start cold."""
    return shared_dir(tmp_path_factory, "inductor-cache")


@pytest.fixture(scope="session")
def warm_compile_cache(tmp_path_factory, token_cache, inductor_cache, fork_server) -> None:
    """The tiny model compiled once in the session, by one process, before any compiled run (`--compile`): every
    strategy's compiled blocks at micro-batch 2 are the same kernels (DDP's, FSDP's, ps's, Horovod's found them all
    in the cache, 3.5-6 s of compiling instead of 30). Without it, each rank of the first compiled multi-process job
    compiled them all itself, at once (a kernel is cached only once built), and so did another worker's."""
    def compile_tiny() -> str:
        start = trainer_starter(tmp_path_factory.mktemp("warm-compile"), token_cache, inductor_cache, fork_server)
        assert start(["--strategy", "single", "--compile"]).wait(600).summary["compiled"] is True
        return "compiled"

    once_per_session(inductor_cache / "tiny-compiled", compile_tiny)


@pytest.fixture(autouse=True)
def restore_environment():
    """Each test leaves this worker's os.environ as it found it. A trainer run in this process sets variables for
    its own process (`apply_cpu_budget`: TORCHINDUCTOR_COMPILE_THREADS); left behind, every later trainer's
    environment differed from this worker's fork server's, which then refused them all: they started fresh, and
    one full run's test_trainer_ps took 610 s instead of 153 s."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


def trainer_environment(fork_server: str | None = None) -> dict[str, str]:
    """What every trainer a test starts inherits, less its own folders: a sweep's environment
    (`runner_environment`: none of pytest's per-test variables, this worker's fork server) with one thread per
    process."""
    return {**runner_environment(fork_server), "OMP_NUM_THREADS": "1"}


def runner_environment(fork_server: str | None, environ: dict[str, str] | None = None) -> dict[str, str]:
    """What a sweep a test runs (`gpt2bench run`, `run_sweep`) inherits: `environ` (default: this process's) less
    pytest's per-test variables (PYTEST_CURRENT_TEST changes with every test; the fork server would refuse it),
    unbuffered and without tokenizer threads, with the address of `fork_server` where one serves (the `fork_server`
    fixture). Its programs ask that server, and the sweep's own server is its forked child
    (`forkserver.server_command`) instead of a fresh process importing torch and transformers once more."""
    environ = os.environ if environ is None else environ
    return {**{k: v for k, v in environ.items() if k != "PYTEST_CURRENT_TEST"},
            "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false",
            **({FORKSERVER_ENV: fork_server} if fork_server else {})}


@pytest.fixture
def sweeps_forked(fork_server, monkeypatch) -> None:
    """Sweeps this test runs in its own process (`run_sweep`, the CLI's `main`) start their fork server as this
    worker's forked child (`runner_environment`): the runner's environment (`sweep.child_env`) as a sweep started
    with `runner_environment` has it. pytest's PYTEST_CURRENT_TEST, which changes with every test and which the
    server would refuse, is left out of it."""
    from gpt2bench.local import sweep

    environment = sweep.child_env
    monkeypatch.setattr(sweep, "child_env", lambda: runner_environment(fork_server, environment()))


@pytest.fixture(scope="session")
def fork_server(tmp_path_factory) -> str | None:
    """The local runner's fork server (gpt2bench/local/forkserver.py) for the trainers this worker's tests start:
    torch and transformers are imported once per worker instead of once per process, the suite's largest cost.
    Its address, or None when it is off (GPT2BENCH_FORKSERVER=off) or could not start (its log says why). The
    server serves only requests a fresh process would match (same interpreter, options, environment but for what
    is read at run time); anything else runs fresh as before."""
    log = tmp_path_factory.getbasetemp() / "forkserver.log"
    with forkserver.serving(trainer_environment(), log) as served:
        yield served.get(FORKSERVER_ENV)


class TrainerProcess:
    """A trainer started in the background (`start_trainer`); `wait()` gives the TrainerRun."""

    def __init__(self, argv, env, workdir, output, termination_log, expect_rc):
        self.argv, self.output, self.termination_log, self.expect_rc = argv, output, termination_log, expect_rc
        self.proc = subprocess.Popen(argv, env=env, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)

    def wait(self, timeout: float = 300) -> TrainerRun:
        try:
            stdout, stderr = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            stdout, stderr = self.proc.communicate()
            pytest.fail(f"trainer did not finish in {timeout} s: {' '.join(self.argv)}\n{stderr[-4000:]}")
        run = _read_run(TrainerRun(self.argv, self.proc.returncode, stdout, stderr, self.output,
                                   self.termination_log))
        if self.expect_rc is not None:
            assert run.returncode == self.expect_rc, run.describe()
        return run


@pytest.fixture
def start_trainer(tmp_path, token_cache, inductor_cache, fork_server) -> Callable[..., TrainerProcess]:
    return trainer_starter(tmp_path, token_cache, inductor_cache, fork_server)


def trainer_starter(base: Path, token_cache: Path, inductor_cache: Path,
                    fork_server: str | None = None) -> Callable[..., TrainerProcess]:
    """Start the real trainer in the background. Arguments:
    args: trainer flags (after `gpt2bench train`);
    nproc: 1 = one plain process, N > 1 = torchrun with N local processes;
    launcher: argv prefix replacing the default one; it must end with `gpt2bench train` (e.g.
      horovodrun/mpirun ... gpt2bench train);
    env: extra environment; expect_rc: exit code wait() asserts (None: any);
    tiny: prepend TINY_ARGS (a small, fast, real configuration; later flags override it), and
      HALF_PRECISION_ARGS to fp16 and bf16 runs.
    `gpt2bench train` and the default torchrun ask `fork_server` for their process (fresh without one).
    Every run gets its own folder under `base` (the test's tmp_path): output/ (unless --output is given), tmp/ (TMPDIR)
    and termination-log ($GPT2BENCH_TERMINATION_LOG); the token and torch.compile caches are shared by the
    session; each process gets one core's budget (GPT2BENCH_POD_CPUS=1) unless `env` says otherwise."""
    counter = iter(range(1000))

    def start(args: list[str] = (), *, nproc: int = 1, launcher: list[str] | None = None,
              env: dict[str, str] | None = None, expect_rc: int | None = 0, tiny: bool = True) -> TrainerProcess:
        workdir = base / f"run{next(counter)}"
        output, tmpdir = workdir / "output", workdir / "tmp"
        tmpdir.mkdir(parents=True)
        # inductor keeps its precompiled C++ headers (~150 MB, ~10 s to build) in $TMPDIR/torchinductor_<user>
        # whatever TORCHINDUCTOR_CACHE_DIR says: pointed at the session's cache, they are built once.
        (tmpdir / f"torchinductor_{getpass.getuser()}").symlink_to(inductor_cache, target_is_directory=True)
        if launcher is None:
            launcher = torchrun_prefix(nproc, forked=bool(fork_server)) if nproc > 1 else \
                [gpt2bench_executable(), "train"]
        args = list(args)
        half = tiny and any(a in ("fp16", "bf16") and b == "--precision" for b, a in zip(args, args[1:]))
        argv = [*launcher, *(TINY_ARGS if tiny else []), *(HALF_PRECISION_ARGS if half else []), *args]
        if "--output" in args:
            output = Path(args[args.index("--output") + 1])
        else:
            argv += ["--output", str(output)]
        termination_log = workdir / "termination-log"
        # one core per trainer process (the budget a pod of 1 CPU gives): the suite runs two tests at a time on
        # two cores, and a rank that took both would spin its second thread against the other test's
        full_env = {**trainer_environment(fork_server), "GPT2BENCH_POD_CPUS": "1", "TMPDIR": str(tmpdir),
                    "GPT2BENCH_CACHE_DIR": str(token_cache),
                    "GPT2BENCH_TERMINATION_LOG": str(termination_log), "TORCHINDUCTOR_CACHE_DIR": str(inductor_cache),
                    **(env or {})}
        return TrainerProcess(argv, full_env, workdir, output, termination_log, expect_rc)

    return start


@pytest.fixture
def run_trainer(start_trainer) -> Callable[..., TrainerRun]:
    """Run the real trainer to the end and return its TrainerRun (arguments: see start_trainer,
    plus timeout=300 seconds)."""

    def run(args: list[str] = (), *, timeout: float = 300, **options) -> TrainerRun:
        return start_trainer(args, **options).wait(timeout)

    return run


@pytest.fixture(scope="session")
def single_reference(tmp_path_factory, token_cache, inductor_cache, fork_server) -> Callable[[str], TrainerRun]:
    """`single_reference("bf16")`: the run other strategies are compared with at global batch 4 (`single`,
    micro-batch 4, TINY_ARGS), trained once per precision in a session: runs are deterministic, and each
    one costs ~10 s (fp32) to ~30 s (bf16, emulated on this CPU) of the suite."""
    start = trainer_starter(tmp_path_factory.mktemp("single-reference"), token_cache, inductor_cache, fork_server)
    runs: dict[str, TrainerRun] = {}

    def reference(precision: str = "fp32") -> TrainerRun:
        if precision not in runs:
            runs[precision] = start(["--strategy", "single", "--micro-batch-size", "4", "--precision",
                                     precision]).wait(300)
        return runs[precision]

    return reference


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """An emulated Kubernetes API over HTTP (tests/kube) with our CRD and the Kubeflow CRDs installed."""
    from kube import EmulatedCluster  # imported late: the kubernetes client reads $KUBECONFIG at import
    from kube.fixtures import install_crds

    with EmulatedCluster(tmp_path_factory.mktemp("kube")) as emulated:
        install_crds(emulated)
        yield emulated


# ---------------------------------------------------------------- the operator's emulator tests
# One emulated API server (`cluster`) and one real operator on it (`operator`) per module; a module that needs
# another set-up (an admission webhook, a slower poll) overrides the fixture. `trainer` plays the training
# operator's controller (Trainer v2 modules override it).
@pytest.fixture(scope="module")
def operator(cluster):
    """The real kopf operator (kopf.testing.KopfRunner: `kopf run` in a thread of this process) on the module's cluster
    (tests/kube/fixtures.kopf_operator); tests of the operator as a process of its own start `OperatorProcess`."""
    from kube.fixtures import kopf_operator

    with kopf_operator(cluster, poll_seconds=0.3) as runner:
        yield runner


@pytest.fixture
def trainer(cluster, client):
    """The Kubeflow training operator (v1), as its controller really behaves (tests/kube/training.py)."""
    from kube.training import TrainingOperator

    return TrainingOperator(client, cluster=cluster)


@pytest.fixture
def client(cluster, operator):
    """A kubernetes client of the module's cluster, with its operator running."""
    from kube.fixtures import api_client

    return api_client(cluster)


@pytest.fixture
def benchmarks(client):
    """GPT2Benchmark calls; what the test left unfinished is deleted after it (`Benchmarks.delete_unfinished`)."""
    from kube.fixtures import Benchmarks

    made = Benchmarks(client)
    yield made
    made.delete_unfinished()


def pytest_sessionfinish(session, exitstatus):
    """The fault suite's figures, whichever test files measured them (tests/fault_figures.py)."""
    import fault_figures

    fault_figures.write()


def pytest_collection_modifyitems(config, items):
    """The files with the most tests marked slow first, each file's tests in their own order: pytest-xdist's
    loadfile hands out whole files in collection order, so a long file collected last would run alone at the end
    while the other workers sit idle (docs/ci.md, Suite time)."""
    slow: dict[Path, int] = {}
    for item in items:
        slow[item.path] = slow.get(item.path, 0) + (item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: -slow[item.path])  # stable: files of equal weight keep their order
