"""The ways to a first benchmark on a cluster, followed here step by step against the API emulator.

Two paths install the chart and then run the CPU example: the kind end to end (scripts/e2e-kind.sh, what CI
runs) and a user reading the chart's NOTES after `helm install`. Each test renders the chart with the real helm
exactly as that path installs it, starts the real operator as the rendered Deployment starts it (the operator
image's ENTRYPOINT, then the container's own args and env; only the two ports moved to free ones on this shared
machine, and a kubeconfig in place of the pod's service account), then follows the path's own steps with the
real kubectl: the script's `example` step, or the commands the rendered NOTES print. The Kubeflow job
controllers are played as upstream behaves (tests/kube), in whatever namespace the benchmark lands. Each path
must end with the benchmark `Complete`: an operator that does not watch the namespace the path puts the
benchmark in (the chart's default watches only its own) leaves it without a status, and the path fails.

What only a real cluster shows (the images, the Deployment's pod, Pod Security admission, the real Kubeflow
controllers) is the kind end to end's to prove (docs/ci.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml
from kube import EmulatedCluster
from kube.fixtures import GROUP, PLURAL, VERSION, api_client, install_crds, install_trainer_v2, wait_for
from kube.tools import path_with_kubectl
from kube.trainer_v2 import TrainerV2
from kube.training import TrainingOperator, trainer_summary
from test_helm import render_notes

from gpt2bench.local.replicas import free_port

ROOT = Path(__file__).resolve().parent.parent
HELM = ROOT / ".tools" / "bin" / "helm"
CHART = ROOT / "helm" / "gpt2bench"
SCRIPT = ROOT / "scripts" / "e2e-kind.sh"
EXAMPLE = ROOT / "manifests" / "examples" / "cpu-sweep.yaml"  # what the e2e script and the notes apply

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420),
              pytest.mark.skipif(not HELM.exists(), reason=f"helm not installed at {HELM} (run scripts/install.sh --test)")]


# ------------------------------------------------------------------------------ the chart, as installed

def helm_template(install_args: list[str]) -> list[dict[str, Any]]:
    """`helm template` with the arguments a `helm install` gets (release, chart, flags): the same objects."""
    proc = subprocess.run([str(HELM), "template", *install_args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def operator_entrypoint() -> list[str]:
    """The operator image's ENTRYPOINT (the Dockerfile's `operator` stage)."""
    stage = re.search(r"^FROM \S+ AS operator$(.*?)(?=^FROM |\Z)", (ROOT / "Dockerfile").read_text(), re.M | re.S)
    assert stage, "the Dockerfile has an operator stage"
    return json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", stage.group(1), re.M).group(1))


@contextlib.contextmanager
def chart_operator(cluster: EmulatedCluster, objects: list[dict[str, Any]], log: Path) -> Iterator[list[str]]:
    """The real operator, started as the rendered Deployment's container starts: its image's ENTRYPOINT with
    the container's args and env. Its liveness and metrics ports move to free ones (the rendered 8080 and 9090
    may be taken on this machine); it reaches the emulator through a kubeconfig. Yields the argv."""
    (deployment,) = [d for d in objects if d["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    command = container.get("command") or operator_entrypoint()
    health, metrics = free_port(), free_port()
    moved = {"--liveness": f"http://127.0.0.1:{health}/healthz", "--metrics-port": str(metrics)}
    args = []
    for arg in container.get("args", []):
        flag = arg.split("=", 1)[0]
        args.append(f"{flag}={moved.pop(flag)}" if flag in moved else arg)
    assert not moved, f"the Deployment no longer passes {sorted(moved)}: update this test's port moves"
    executable = shutil.which(command[0])
    assert executable, f"{command[0]} (the image's ENTRYPOINT) is not on PATH: pip install -e ."
    env = {key: value for key, value in os.environ.items() if not key.startswith("GPT2BENCH_")}
    env["KUBECONFIG"] = str(cluster.kubeconfig)
    for variable in container.get("env", []):
        assert "value" in variable, f"env {variable['name']}: only plain values can be replayed here"
        env[variable["name"]] = variable["value"]
    argv = [executable, *command[1:], *args]
    with log.open("a") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        def healthy() -> bool:
            assert proc.poll() is None, f"the operator exited {proc.returncode}:\n{log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=2):
                    return True
            except OSError:
                return False

        wait_for(healthy, 60, what=f"the operator's /healthz ({log})")
        yield argv
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


# ------------------------------------------------------------------- the Kubeflow controllers, played

def finished(obj: dict[str, Any]) -> bool:
    return any(c["type"] in ("Succeeded", "Failed", "Complete") and c["status"] == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


class Controllers(threading.Thread):
    """Plays the backend's job controllers for every GPT2Benchmark's jobs, in every namespace one is in: each
    job (PyTorchJob, MPIJob; or TrainJob, with its JobSet, Jobs and pods) starts and succeeds with a trainer
    summary, as upstream reports it (tests/kube/training.py, tests/kube/trainer_v2.py)."""

    def __init__(self, cluster: EmulatedCluster, backend: str):
        super().__init__(name=f"play-{backend}", daemon=True)
        self.cluster, self.backend = cluster, backend
        self.client = api_client(cluster)
        self.custom = kubernetes.client.CustomObjectsApi(self.client)
        self.done = threading.Event()
        self.played: list[str] = []
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.done.is_set():
            try:
                for namespace in self.namespaces():
                    self.play(namespace)
            except kubernetes.client.ApiException as exc:  # a race with the operator: next round
                self.errors.append(f"{exc.status} {exc.reason}")
            self.done.wait(0.2)

    def namespaces(self) -> set[str]:
        listed = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        return {item["metadata"]["namespace"] for item in listed["items"]}

    def play(self, namespace: str) -> None:
        if self.backend == "trainjob":
            trainer = TrainerV2(self.client, namespace=namespace, cluster=self.cluster)
            for trainjob in self.custom.list_namespaced_custom_object(
                    "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs")["items"]:
                name = trainjob["metadata"]["name"]
                if not finished(trainjob) and name not in self.played:
                    assert trainer.reconcile(name) is not None, f"{name}: Trainer v2 could not build it"
                    run = trainjob["metadata"]["labels"]["gpt2bench.io/run"]
                    trainer.finish(name, succeeded=True, message=json.dumps(trainer_summary(run, 1000.0)))
                    self.played.append(name)
            return
        training = TrainingOperator(self.client, namespace=namespace, cluster=self.cluster)
        for job in training.jobs():
            if not finished(job):
                training.start(job)
                training.succeed(job, 1000.0 + len(self.played))
                self.played.append(job["metadata"]["name"])

    def __enter__(self) -> Controllers:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.join(10)


def backend_cluster(cluster: EmulatedCluster, backend: str, objects: list[dict[str, Any]]) -> None:
    """What the backend's Kubeflow install serves, as scripts/e2e-kind.sh sets each cluster up (pytorchjob:
    PyTorchJob and MPIJob v2beta1; trainjob: Trainer v2 and JobSet only), and the chart's cluster-scoped objects
    that runs need: our CRD (from the chart's crds/, as `helm install` applies it) and, where rendered, its
    ClusterTrainingRuntimes."""
    if backend == "pytorchjob":
        install_crds(cluster)
    else:
        cluster.kubectl("apply", "-f", str(CHART / "crds"))
        install_trainer_v2(cluster)
    runtimes = [d for d in objects if d["kind"] == "ClusterTrainingRuntime"]
    assert bool(runtimes) == (backend == "trainjob"), "the chart installs the runtimes where Trainer v2 is"
    if runtimes:
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(runtimes))


def create_namespace(cluster: EmulatedCluster, name: str) -> None:
    """`kubectl create namespace`, as the emulator knows namespaces (by what is in them; kubectl would send a
    Namespace as protobuf, which it cannot read): the ConfigMap kube-root-ca.crt that Kubernetes puts in every
    new namespace. Created before the operator starts, as the install paths create theirs before the chart."""
    kubernetes.client.CoreV1Api(api_client(cluster)).create_namespaced_config_map(name, {
        "metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": "(the cluster's CA)"}})


def benchmarks_everywhere(cluster: EmulatedCluster) -> list[dict[str, Any]]:
    api = kubernetes.client.CustomObjectsApi(api_client(cluster))
    return api.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]


def condition(benchmark: dict[str, Any], type_: str) -> str | None:
    return next((c["status"] for c in (benchmark.get("status") or {}).get("conditions") or [] if c["type"] == type_),
                None)


# ------------------------------------------------------------------------------- the kind end to end

def configurations(sweep: dict[str, Any]) -> int:
    """Strategies × precisions × scales: one round's runs."""
    return len(sweep["strategies"]) * len(sweep["precisions"]) * len(sweep["scales"])


def bench_namespace() -> str:
    """The namespace the script creates and applies the example in."""
    return re.search(r"^BENCH_NAMESPACE=(\S+)$", SCRIPT.read_text(), re.M).group(1)


def script(*args: str) -> str:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, check=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin"}).stdout


@pytest.mark.parametrize("backend", ["pytorchjob", "trainjob"])
def test_the_kind_e2e_example_completes_with_the_operator_its_helm_install_makes(backend: str, tmp_path: Path) -> None:
    """The script's own `helm install` arguments render the operator; its `example` step (apply, wait for
    Complete, the cluster report) then runs against that operator. Today's bug: the chart installed with its
    defaults watched gpt2bench-system while the example went into `bench`, so both CI jobs waited 2,700 s."""
    install = script("helm-args", backend).splitlines()
    assert install[:2] == ["gpt2bench", str(CHART)], install
    objects = helm_template(install)
    values = dict(arg.split("=", 1) for flag, arg in zip(install, install[1:]) if flag == "--set")
    trainer_image = f"{values['trainerImage.repository']}:{values['trainerImage.tag']}"
    runtimes = [d for d in objects if d["kind"] == "ClusterTrainingRuntime"]
    # the CPU runtimes (label gpt2bench.io/trainer-image: cpu) run the loaded trainer image (the MPI runtime's sshd pods); the CUDA MPI runtime names the
    # GPU tag, which the CPU example never uses
    cpu_images = set(re.findall(r"^\s*(?:- )?image: (\S+)", yaml.safe_dump_all(
        [d for d in runtimes if d["metadata"].get("labels", {}).get("gpt2bench.io/trainer-image") != "gpu"]),
        re.M))
    assert cpu_images == ({trainer_image} if backend == "trainjob" else set()), \
        "with Trainer v2 the chart's CPU runtimes run the loaded trainer image (the MPI runtime's sshd pods)"
    with EmulatedCluster(tmp_path / "kube") as cluster:
        backend_cluster(cluster, backend, objects)
        create_namespace(cluster, bench_namespace())  # the script's `up` creates it, then installs the chart
        work = tmp_path / "e2e"
        work.mkdir()
        shutil.copy(cluster.kubeconfig, work / "kubeconfig")  # where the script's steps find the cluster
        env = {"PATH": path_with_kubectl(), "HOME": str(tmp_path), "TMPDIR": str(tmp_path), "E2E_WORKDIR": str(work),
               "PYTHON": sys.executable, "E2E_TIMEOUT_S": "240", "E2E_PICKUP_S": "60"}
        with chart_operator(cluster, objects, tmp_path / "operator.log"), Controllers(cluster, backend) as played:
            proc = subprocess.run(["bash", str(SCRIPT), "example"], env=env, capture_output=True, text=True,
                                  timeout=360)
        assert proc.returncode == 0, (f"{proc.stderr[-4000:]}\noperator log:\n"
                                      f"{(tmp_path / 'operator.log').read_text()[-3000:]}\nplayer: {played.errors[-5:]}")
        (benchmark,) = benchmarks_everywhere(cluster)
    status = benchmark["status"]
    assert condition(benchmark, "Complete") == "True"
    sweep = yaml.safe_load(EXAMPLE.read_text())["spec"]["sweep"]
    assert status["runsSucceeded"] == status["runsTotal"] == len(played.played) == configurations(sweep), \
        "one round: every configuration once"
    assert status["backend"] == backend, "spec.backend auto resolves to what the cluster serves"
    report = (work / "report" / "results.md").read_text()
    assert "cpu-sweep" in report and report.strip() in proc.stdout, "the script writes and prints the cluster report"


def test_the_e2e_installs_the_chart_watching_the_namespace_its_example_goes_into() -> None:
    """Both backends' `helm install` make an operator that watches the example's namespace (the rendered args),
    and differ only where the backend needs it (with Trainer v2, the chart installs its runtimes)."""
    torch, trainer = script("helm-args", "pytorchjob").splitlines(), script("helm-args", "trainjob").splitlines()
    assert trainer == [*torch, "--set", "trainerRuntimes.install=true"]
    (deployment,) = [d for d in helm_template(torch) if d["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--all-namespaces" in args or f"--namespace={bench_namespace()}" in args, args


# ----------------------------------------------------------------------- the cluster quick start

QUICK_START = ROOT / "docs" / "quickstart.md"  # the README links it
RELEASE_CHART = "oci://ghcr.io/gpt2bench/charts/gpt2bench"  # no registry here: the checkout's chart stands in
STEPS = ["0. The Kubeflow job operators", "1. Images and the operator", "2. A benchmark", "3. Grafana (optional)"]


def quick_start() -> str:
    """The page's steps, 0 to 3, with what it says around them: everything before the GPU example's section."""
    text = QUICK_START.read_text()
    assert re.findall(r"^## (\d\. .*)$", text, re.M) == STEPS, "the steps these tests follow"
    return text.split("\n## The GPU example: what it holds\n")[0]


def test_the_readme_links_the_quick_start() -> None:
    assert "](docs/quickstart.md)" in (ROOT / "README.md").read_text()


def shell_lines(block: str) -> list[str]:
    """A bash block's commands: continuations joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    lines = [re.sub(r"(^|\s+)#\s.*$", "", line).strip() for line in joined.splitlines()]
    return [line for line in lines if line]


def quick_start_blocks() -> list[list[str]]:
    return [shell_lines(block) for block in re.findall(r"^```bash\n(.*?)^```", quick_start(), re.M | re.S)]


def step_2() -> list[str]:
    """The block that applies the example."""
    (lines,) = [lines for lines in quick_start_blocks() if any("-f manifests/examples/" in line for line in lines)]
    return lines


def assigned(lines: list[str]) -> dict[str, str]:
    """`A=x B=y` lines: the variables a block sets for the blocks after it."""
    found = {}
    for line in lines:
        if re.fullmatch(r"(\w+=\S+)(\s+\w+=\S+)*", line):
            found.update(pair.split("=", 1) for pair in line.split())
    return found


def expanded(line: str, variables: dict[str, str]) -> list[str]:
    """shlex's words with $VAR and "$VAR" replaced, as bash would (the quick start's values have no spaces)."""
    return [re.sub(r"\$(\w+)", lambda m: variables[m.group(1)], word) for word in shlex.split(line)]


def helm_installs() -> list[tuple[dict[str, str], list[str]]]:
    """Each step-1 block's variables and its `helm install` arguments (release, chart, flags)."""
    found = []
    for lines in quick_start_blocks():
        variables = assigned(lines)
        for line in lines:
            if line.startswith("helm install gpt2bench "):
                found.append((variables, expanded(line, variables)[2:]))
    return found


def as_rendered(install: list[str]) -> list[str]:
    """`helm template` arguments for a quick-start install: the release's chart is the checkout's at its version;
    a chart folder is the checkout's."""
    args = list(install)
    if args[1] == RELEASE_CHART:
        version = args[args.index("--version") + 1]
        assert version == yaml.safe_load((CHART / "Chart.yaml").read_text())["version"], version
        args[1] = str(CHART)
    elif args[1] == "./helm/gpt2bench":
        args[1] = str(CHART)
    return args


def watched(objects: list[dict[str, Any]]) -> list[str]:
    (deployment,) = [d for d in objects if d["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return ["*"] if "--all-namespaces" in args else [a.split("=", 1)[1] for a in args if a.startswith("--namespace=")]


def test_every_quick_start_helm_install_makes_an_operator_watching_the_namespace_step_2_applies_into() -> None:
    """Each path of step 1 sets NS for step 2 and installs the chart: the operator it makes must watch NS.
    Today's bug: the kind shortcut's operator watched `bench` while step 2 applied into gpt2bench-system."""
    installs = helm_installs()
    assert [variables["CHART"] for variables, _ in installs] == [RELEASE_CHART, "./helm/gpt2bench", "./helm/gpt2bench"]
    for variables, install in installs:
        args = as_rendered(install)
        assert args[args.index("-n") + 1] == variables["NS"]
        assert watched(helm_template(args)) == [variables["NS"]], install
    step2 = step_2()
    assert all('-n "$NS"' in line for line in step2 if line.startswith("kubectl ")), step2
    # the kind shortcut: `up` installs with helm-args; `env` gives step 2 its KUBECONFIG and NS
    shortcut = dict(line.removeprefix("export ").split("=", 1) for line in script("env", "pytorchjob").splitlines())
    assert 'eval "$(scripts/e2e-kind.sh env pytorchjob)"' in quick_start()
    assert watched(helm_template(script("helm-args", "pytorchjob").splitlines())) == [shortcut["NS"]]
    assert shortcut["KUBECONFIG"].endswith("/gpt2bench-e2e-pytorchjob/kubeconfig")


def chart_readme_blocks() -> list[list[str]]:
    return [shell_lines(block) for block in re.findall(r"^```bash\n(.*?)^```", (CHART / "README.md").read_text(),
                                                        re.M | re.S)]


def chart_readme_applies() -> list[str]:
    """The kubectl lines of the chart README's block that installs the chart and applies the example (the
    release path's install, from the chart folder: run after the quick start's step 2)."""
    (lines,) = [lines for lines in chart_readme_blocks()
                if lines[0].startswith("helm install") and any(line.startswith("kubectl apply") for line in lines)]
    assert lines[0] == "helm install gpt2bench ./helm/gpt2bench --namespace gpt2bench-system --create-namespace"
    return [line for line in lines if line.startswith("kubectl ")]


def test_the_chart_readmes_installs_render_and_its_example_goes_where_the_operator_watches() -> None:
    """The chart's README: each `helm install` renders with real helm (its values files included), and the
    block that applies the example applies it into the namespace that install's operator watches (that block's
    kubectl lines run in the quick-start-then-NOTES walk below)."""
    blocks = chart_readme_blocks()
    installs = [(lines, line) for lines in blocks for line in lines if line.startswith("helm install gpt2bench ")]
    assert len(installs) == 3, installs
    for lines, line in installs:
        objects = helm_template([str(CHART) if w == "./helm/gpt2bench" else str(ROOT / w) if w.endswith(".yaml")
                                 else w for w in shlex.split(line)[2:]])
        for apply in (a for a in lines if a.startswith("kubectl apply ")):
            namespace = re.search(r" -n (\S+)", apply).group(1)
            assert watched(objects) in ([namespace], ["*"]), (line, apply)


def test_every_quick_start_helm_upgrade_pastes_with_the_chart_step_1_set() -> None:
    """`helm upgrade gpt2bench <chart> …` broke when pasted. Each upgrade the quick start shows (another
    watched namespace, the monitoring) renders with real helm from the release path's CHART, over its install."""
    (variables, install), *_ = helm_installs()
    upgrades = re.findall(r"`(helm upgrade gpt2bench [^`]+)`", re.sub(r"\s+", " ", quick_start()))
    upgrades += [line for lines in quick_start_blocks() for line in lines if line.startswith("helm upgrade ")]
    assert len(upgrades) == 2, upgrades
    rendered = []
    for upgrade in upgrades:
        words = expanded(upgrade, variables)
        assert words[3] == install[1] and "--reuse-values" in words and "--version" in words, words
        sets = [w for flag, w in zip(words, words[1:]) if flag == "--set"]
        rendered.append(helm_template([*as_rendered(install), *(x for s in sets for x in ("--set", s))]))
    assert watched(rendered[0]) == ["team-a"]
    assert {"ServiceMonitor", "PodMonitor", "PrometheusRule"} <= {d["kind"] for d in rendered[1]}


def seconds(timeout: str) -> float:
    value, unit = re.fullmatch(r"(\d+)([smh])", timeout).groups()
    return int(value) * {"s": 1, "m": 60, "h": 3600}[unit]


def test_the_waits_end_either_way_and_their_timeouts_cover_the_examples_planned_runs(tmp_path: Path) -> None:
    """`kubectl wait --for=condition=Complete --timeout=1h` hung the full hour when the sweep failed, and the
    example's runs take longer than an hour on a kind node. Quick start and NOTES now wait for Finished, as long as the
    example can take at the e2e's allowance a run: its planned runs (the breakdown round and the first rounds),
    then rounds only while they fit its budget (sweep.budget.wallSeconds; each a round of at most every
    configuration), or every round up to maxRepeats where it has no budget."""
    from gpt2bench.plan import plan_runs
    from gpt2bench.specification.validation import load_benchmarks_file

    (example,) = load_benchmarks_file(str(EXAMPLE))
    per_run = int(re.search(r"\$\{E2E_SECONDS_PER_RUN:-(\d+)\}", SCRIPT.read_text()).group(1))
    planned = len(plan_runs(example)) * per_run
    budget = example.spec.sweep.budget.wall_seconds if example.spec.sweep.budget else None
    configurations = len({(r.strategy.name, r.precision) for r in plan_runs(example)})
    if budget:
        most = max(planned, budget) + configurations * per_run  # the round it last added may end past the budget
    else:
        most = len(plan_runs(example, rounds=example.spec.sweep.max_repeats)) * per_run
    notes = render_notes(["gpt2bench", str(CHART), "-n", "gpt2bench-system"], tmp_path)
    waits = [line for line in [*quick_start().splitlines(), *notes.splitlines()] if "kubectl wait" in line
             and "gpt2benchmark/" in line]
    assert len(waits) == 2, waits
    for wait in waits:
        assert "--for=condition=Finished" in wait, wait
        assert seconds(re.search(r"--timeout=(\S+)", wait).group(1)) >= most, (wait, most)


# -------------------------------------------------------------------------------------- the NOTES

RELEASE_EXAMPLE = re.compile(r"https://raw\.githubusercontent\.com/gpt2bench/gpt2bench/v([^/]+)/(manifests/\S+)")


def notes_commands(notes: str) -> list[str]:
    """The commands the notes tell the user to run (indented `kubectl …` lines), trailing comments dropped,
    up to the upgrade note (a later step)."""
    steps = notes.split("\nNote:")[0]
    return [re.sub(r"\s+#\s.*$", "", line.strip()) for line in steps.splitlines() if line.strip().startswith("kubectl ")]


def serve_deployments(emulator: Any) -> None:
    import kmock
    from kube.trainer_v2 import VERBS

    emulator.resources[kmock.resource("apps/v1/deployments")] = kmock.ResourceInfo(
        kind="Deployment", singular="deployment", namespaced=True, subresources={"status"}, verbs=VERBS)


def deployment_rolled_out(cluster: EmulatedCluster, objects: list[dict[str, Any]]) -> None:
    """The Deployment, as the Deployment controller reports it once its pod is available (the operator process
    above is that pod: it answers /healthz)."""
    (deployment,) = [d for d in objects if d["kind"] == "Deployment"]
    apps = kubernetes.client.AppsV1Api(api_client(cluster))
    namespace, name = deployment["metadata"]["namespace"], deployment["metadata"]["name"]
    created = json.loads(apps.create_namespaced_deployment(namespace, deployment, _preload_content=False).data)
    replicas = deployment["spec"]["replicas"]
    apps.patch_namespaced_deployment_status(name, namespace, {"status": {
        "observedGeneration": created["metadata"]["generation"], "replicas": replicas, "updatedReplicas": replicas,
        "readyReplicas": replicas, "availableReplicas": replicas, "conditions": [
            {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
            {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]}})


def local_copy(command: str) -> str:
    """The notes name the release's files on GitHub (no network here): the checkout's own, at this version."""
    import gpt2bench

    def local(match: re.Match) -> str:
        assert match.group(1) == gpt2bench.__version__, f"the notes name v{match.group(1)}, not this version"
        assert (ROOT / match.group(2)).is_file(), match.group(2)
        return str(ROOT / match.group(2))

    return RELEASE_EXAMPLE.sub(local, command)


def run_in_order(commands: list[str], env: dict[str, str], cwd: Path, log: Path) -> dict[str, str]:
    """Each command with bash, in order, as a user pastes them; `-w` ones (which run until stopped) kept running
    beside the next and stopped at the end. Every other one must come back, successfully. Their outputs."""
    outputs, watchers = {}, []
    for command in commands:
        if " -w" in f"{command} ":
            watchers.append((command, subprocess.Popen(["bash", "-c", command], env=env, cwd=cwd, text=True,
                                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)))
            continue
        try:
            proc = subprocess.run(["bash", "-c", command], env=env, cwd=cwd, capture_output=True, text=True,
                                  timeout=240)
        except subprocess.TimeoutExpired:
            pytest.fail(f"`{command}` never came back\noperator log:\n{log.read_text()[-3000:]}")
        assert proc.returncode == 0, f"`{command}` failed:\n{proc.stdout}\n{proc.stderr}"
        outputs[command] = proc.stdout
    for command, watcher in watchers:
        watcher.terminate()
        outputs[command] = watcher.communicate(timeout=30)[0]
    return outputs


def test_the_quick_start_then_the_notes_take_a_user_from_helm_install_to_a_finished_benchmark(tmp_path: Path) -> None:
    """The quick start's step 2, as pasted after its release path (NS, CHART as that block sets them; the files as
    a checkout has them), the chart README's apply and follow, then every command the rendered NOTES print, in
    order, with the real kubectl, against the operator that install makes. Step 2's apply starts the sweep; the NOTES' is the same object again,
    so their waits must come back too (one that applied elsewhere would wait for ever). Earlier bugs: the notes
    applied the example without `-n`, into a namespace the operator does not watch; both waited for
    Complete, which never comes for a failed sweep."""
    (variables, install), *_ = helm_installs()
    chart_args = as_rendered(install)
    notes = render_notes(chart_args, tmp_path)
    commands = notes_commands(notes)
    assert any(c.startswith("kubectl apply") for c in commands) and any(" wait " in c for c in commands), notes
    step2 = step_2()
    checkout = tmp_path / "checkout"  # the quick start's relative paths, without writing into this one
    checkout.mkdir()
    (checkout / "manifests").symlink_to(ROOT / "manifests")
    (checkout / ".venv").symlink_to(Path(sys.executable).parent.parent)
    objects = helm_template(chart_args)
    log = tmp_path / "operator.log"
    with EmulatedCluster(tmp_path / "kube") as cluster:
        install_crds(cluster)
        cluster.call(serve_deployments)
        create_namespace(cluster, variables["NS"])  # `--create-namespace`, before helm's objects
        env = {"PATH": path_with_kubectl(), "HOME": str(tmp_path), "KUBECONFIG": str(cluster.kubeconfig), **variables}
        with chart_operator(cluster, objects, log), Controllers(cluster, "pytorchjob"):
            deployment_rolled_out(cluster, objects)
            pasted = run_in_order(step2, env, checkout, log)
            run_in_order(chart_readme_applies(), env, checkout, log)  # the chart README's: the same install
            outputs = run_in_order([local_copy(c) for c in commands], env, checkout, log)
        (benchmark,) = benchmarks_everywhere(cluster)
    assert condition(benchmark, "Finished") == condition(benchmark, "Complete") == "True"
    assert "job kinds served: MPIJob, PyTorchJob; spec.backend auto resolves to pytorchjob" in log.read_text(), \
        "the operator says at start what the cluster serves"
    assert (checkout / "results" / "cpu-sweep-cluster" / "results.md").is_file(), "step 2's cluster report"
    waited = next(out for command, out in pasted.items() if " wait " in command)
    assert "condition met" in waited
    rollout = next(out for command, out in outputs.items() if " rollout status " in command)
    assert "successfully rolled out" in rollout, rollout
    assert any(re.search(r"^pytorchjobs\s", out, re.M) for out in outputs.values()), "the served kinds are listed"
    watched_rows = next(out for command, out in pasted.items() if " -w" in f"{command} ")
    # the emulator prints a watch's later rows without the printer columns; the benchmark's row is what counts
    assert re.search(r"^NAME\s+PHASE\s+DONE\s+RUNS\s", watched_rows) and re.search(r"^cpu-sweep\s", watched_rows, re.M)
    as_yaml = next(out for command, out in outputs.items() if command.endswith("-o yaml"))
    sweep, runs = yaml.safe_load(EXAMPLE.read_text())["spec"]["sweep"], yaml.safe_load(as_yaml)["status"]["runs"]
    # the breakdown round and the first `repeats` rounds run every configuration; each race round after them runs
    # the configurations still racing, up to `maxRepeats` rounds in all
    per_round = Counter("breakdown" if run.get("profile") else run.get("repeat") for run in runs)
    everyone = configurations(sweep)
    assert [per_round.pop(r, 0) for r in ["breakdown", *range(1, sweep["repeats"] + 1)]] == \
        [everyone] * (1 + sweep["repeats"]), per_round
    assert set(per_round) <= set(range(sweep["repeats"] + 1, sweep["maxRepeats"] + 1)), per_round
    assert all(0 < n <= everyone for n in per_round.values()), per_round
    everywhere = next(out for command, out in outputs.items() if "--all-namespaces" in command)
    assert re.search(r"^gpt2bench-system\s+cpu-sweep\s+Succeeded\s", everywhere, re.M), everywhere


def test_kubectl_get_gpt2bench_lists_the_benchmarks_of_every_namespace_through_the_crds_category(tmp_path: Path) -> None:
    """The CRD's category: `kubectl get gpt2bench -A` (real kubectl, resolved through discovery) lists every
    GPT2Benchmark, watched or not, with its printer columns."""
    with EmulatedCluster(tmp_path / "kube") as cluster:
        install_crds(cluster)
        for namespace in ("default", "team-a"):
            cluster.kubectl("apply", "-n", namespace, "-f", str(ROOT / "manifests" / "examples" / "cpu-sweep.yaml"))
        listed = cluster.kubectl("get", "gpt2bench", "-A").stdout
    assert re.search(r"^NAMESPACE\s+NAME\s+PHASE\s+DONE\s+RUNS\s", listed), listed
    assert {line.split()[0] for line in listed.splitlines()[1:]} == {"default", "team-a"}, listed
