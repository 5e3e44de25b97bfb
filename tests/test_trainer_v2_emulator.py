"""TrainJobs on an emulated cluster that has only Kubeflow Trainer v2 and JobSet (no kubeflow.org group).

The rendered TrainJobs and the project's runtimes go in with the real kubectl (validated server-side
against the upstream CRDs); the test plays the Trainer v2 controller, JobSet and the Job controller as
upstream behaves (tests/kube/trainer_v2.py); the pure functions the operator will use
(gpt2bench.jobkinds: result pod, job state; gpt2bench.collect) turn what they produced into run results.
"""

from __future__ import annotations

import copy
import json

import kubernetes
import pytest
import yaml
from kube import EmulatedCluster
from kube.fixtures import api_client, install_trainer_v2
from kube.trainer_v2 import TRAINER, TrainerV2
from kube.training import trainer_summary
from trainer_v2_rules import restricted_problems

from gpt2bench import collect
from gpt2bench.controller.pods import termination_message
from gpt2bench.jobkinds import (
    expected_pods,
    job_state,
    resolve_backend,
    result_container,
    result_pod,
    result_pod_selector,
    served_job_kinds,
)
from gpt2bench.plan import plan_runs
from gpt2bench.render import dump_jobs, render_job
from gpt2bench.render.runtimes import project_runtimes
from gpt2bench.specification.validation import load_benchmark

SPEC = {
    "model": {"preset": "tiny"},
    "training": {"steps": 4, "warmupSteps": 1, "seqLen": 32},
    "sweep": {
        "strategies": [{"name": "single"}, {"name": "ddp"}, {"name": "fsdp"}, {"name": "horovod"},
                       {"name": "ps", "psServers": 3}],
        "scales": [{"nodes": 1, "processesPerNode": 2}, {"nodes": 3, "processesPerNode": 1}],
    },
    "nodeSelector": {"pool": "cpu"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "bench", "effect": "NoSchedule"}],
    "scheduling": {"kueueQueue": "team-a"},
    "backend": "trainjob",
}  # fmt: skip


def benchmark(spec: dict | None = None, name: str = "tj"):
    return load_benchmark({"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark",
                           "metadata": {"name": name, "namespace": "default"}, "spec": spec or SPEC})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Only the Trainer v2 and JobSet CRDs, and the project's runtimes (with the real kubectl)."""
    with EmulatedCluster(tmp_path_factory.mktemp("trainer-v2")) as emulated:
        install_trainer_v2(emulated)
        emulated.kubectl("create", "-f", "-", input=dump_jobs(list(project_runtimes().values())))
        yield emulated


@pytest.fixture(scope="module")
def client(cluster):
    return api_client(cluster)


def discovery(client) -> dict[str, list[str]]:
    """groupVersion -> plurals, as the operator will read /apis."""
    apis = kubernetes.client.ApisApi(client).get_api_versions()
    found = {}
    for group in apis.groups:
        for version in group.versions:
            group_name, version_name = version.group_version.split("/")
            resources = kubernetes.client.CustomObjectsApi(client).get_api_resources(group_name, version_name)
            found[version.group_version] = [r.name for r in resources.resources]
    return found


def test_only_trainer_v2_is_served_and_auto_resolves_to_trainjob(client):
    served = discovery(client)
    assert "trainer.kubeflow.org/v1alpha1" in served and "jobset.x-k8s.io/v1alpha2" in served
    assert not [gv for gv in served if gv.startswith("kubeflow.org/")]
    assert served_job_kinds(served) == {"TrainJob"}
    assert resolve_backend("auto", served_job_kinds(served)) == "trainjob"
    assert resolve_backend("pytorchjob", served_job_kinds(served)) == "pytorchjob"  # as asked: its runs fail


def test_the_emulator_rejects_what_the_trainjob_crd_rejects(cluster):
    job = render_job(benchmark(), plan_runs(benchmark())[0])
    job["metadata"]["name"] = "strict-check"
    job["spec"]["trainer"]["numProcPerNode"] = "auto"  # int32 since Trainer v2.2
    done = cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(job), check=False)
    assert done.returncode != 0 and "numProcPerNode" in done.stderr
    job["spec"]["trainer"]["numProcPerNode"] = 1
    job["spec"]["trainer"]["nprocPerNode"] = 1
    done = cluster.kubectl("create", "-f", "-", input=yaml.safe_dump(job), check=False)
    assert done.returncode != 0 and "nprocPerNode" in done.stderr


def pods_of(trainer: TrainerV2, name: str) -> list[dict]:
    return trainer.pods(f"jobset.sigs.k8s.io/jobset-name={name}")


def test_a_sweep_of_trainjobs_runs_to_results_with_a_failure_and_horovod(cluster, client):
    bench = benchmark()
    runs = plan_runs(bench)
    jobs = [render_job(bench, run) for run in runs]
    assert {job["kind"] for job in jobs} == {"TrainJob"} and len(jobs) == 9
    cluster.kubectl("apply", "-f", "-", input=dump_jobs(jobs))  # what `gpt2bench render | kubectl apply` does
    trainer = TrainerV2(client)
    failing = next(run for run in runs if run.strategy.name == "fsdp" and run.nodes == 3)
    entries = {}
    for run, job in zip(runs, jobs, strict=True):
        name = job["metadata"]["name"]
        jobset = trainer.reconcile(name)
        assert jobset is not None, cluster.kubectl("get", "events", "-o", "yaml").stdout
        assert job_state(trainer.trainjob(name)).phase == "Running"
        pods = pods_of(trainer, name)
        # a pod per node, whatever the runtime: torch's `node`s; MPI on 2+ nodes nodes - 1 sshd pods and the
        # launcher (runLauncherAsNode), on one node the launcher alone
        assert len(pods) == run.nodes
        # what the operator waits for before a run has started: every pod the runtime makes of the TrainJob
        assert expected_pods(trainer.trainjob(name)) == len(pods)
        for pod in pods:
            assert restricted_problems(pod["spec"]) == [], pod["metadata"]["name"]
            assert pod["spec"]["nodeSelector"] == {"pool": "cpu"}
            assert pod["spec"]["tolerations"] == SPEC["tolerations"]
            assert pod["metadata"]["labels"]["gpt2bench.io/run"] == run.name
            assert len(pod["metadata"]["name"]) <= 63
        if run is failing:
            summary = {"status": "failed", "reason": "loss is NaN at step 3"}
            trainer.finish(name, succeeded=False, message=json.dumps(summary))
        else:
            trainer.finish(name, succeeded=True, message=json.dumps(trainer_summary(run.name, 100.0 + run.index)))
        # what the operator does with a finished job, through the pure functions
        trainjob = trainer.trainjob(name)
        state = job_state(trainjob)
        pod = result_pod(trainjob, trainer.pods(result_pod_selector(trainjob)))
        entries[run.name] = collect.collect_run(
            run, job_succeeded=state.phase == "Succeeded", job_reason=state.describe(),
            termination_message=termination_message(pod, result_container(trainjob)),
        )
    for run in runs:
        entry = entries[run.name]
        assert entry.job_kind == "TrainJob" and entry.job_name == run.job_name
        if run is failing:
            assert (entry.phase, entry.reason) == ("Failed", "loss is NaN at step 3")
        else:
            assert entry.phase == "Succeeded", entry
            assert entry.results.tokens_per_second == 100.0 + run.index
    assert sum(run.strategy.name == "horovod" for run in runs) == 2
    # every TrainJob is finished with upstream's conditions
    listed = kubernetes.client.CustomObjectsApi(client).list_namespaced_custom_object(*TRAINER, "default", "trainjobs")
    finished = {tj["metadata"]["name"]: [c["type"] for c in tj["status"]["conditions"]] for tj in listed["items"]
                if tj["metadata"]["labels"].get("gpt2bench.io/benchmark") == "tj"}
    assert sorted(finished.values()) == sorted([["Failed"]] + [["Complete"]] * 8)


def test_torch_pods_are_named_labelled_and_get_pet_env_as_upstream(cluster, client):
    bench = benchmark(name="torchpods")
    (run,) = [r for r in plan_runs(bench) if r.strategy.name == "ddp" and r.nodes == 3]
    job = render_job(bench, run)
    name = job["metadata"]["name"]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
    trainer = TrainerV2(client)
    jobset = trainer.reconcile(name)
    assert jobset["metadata"]["ownerReferences"][0]["kind"] == "TrainJob"
    assert jobset["metadata"]["labels"]["gpt2bench.io/run"] == run.name  # runtimePatch template metadata
    pods = sorted(pods_of(trainer, name), key=lambda p: p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"])
    assert [p["spec"]["hostname"] for p in pods] == [f"{name}-node-0-{i}" for i in range(3)]
    assert all(p["metadata"]["name"].startswith(f"{name}-node-0-{i}-") for i, p in enumerate(pods))
    assert {p["spec"]["subdomain"] for p in pods} == {name}
    (container,) = pods[0]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["PET_NNODES"]["value"] == "3" and env["PET_NPROC_PER_NODE"]["value"] == "1"
    assert env["PET_MASTER_ADDR"]["value"] == f"{name}-node-0-0.{name}"
    assert env["PET_NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert env["GPT2BENCH_OUTPUT_DIR"]["value"] == "/var/run/gpt2bench/output"
    assert container["command"][:3] == ["torchrun", "--no-python", "--"]  # the plugin does not wrap it
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    # the result pod is completion index 0 whatever order the API lists them in
    trainer.finish(name, succeeded=True, message=json.dumps(trainer_summary(run.name, 7.0)))
    trainjob = trainer.trainjob(name)
    chosen = result_pod(trainjob, list(reversed(trainer.pods(result_pod_selector(trainjob)))))
    assert chosen["spec"]["hostname"] == f"{name}-node-0-0"
    assert trainjob["status"]["conditions"][-1]["reason"] == "AllJobsCompleted"
    assert trainjob["status"]["jobsStatus"] == [
        {"name": "node", "ready": 0, "succeeded": 1, "failed": 0, "active": 0, "suspended": 0}]


def test_horovod_trainjob_gets_the_mpi_plugins_hostfile_ssh_and_launcher(cluster, client):
    bench = benchmark(name="mpipods")
    (run,) = [r for r in plan_runs(bench) if r.strategy.name == "horovod" and r.nodes == 3]
    job = render_job(bench, run)
    name = job["metadata"]["name"]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
    trainer = TrainerV2(client)
    assert trainer.reconcile(name) is not None
    core = kubernetes.client.CoreV1Api(client)
    hostfile = core.read_namespaced_config_map(f"{name}-mpi-hostfile", "default").data["hostfile"]
    assert hostfile.splitlines() == [f"{name}-node-0-0.{name} slots=1", f"{name}-node-0-1.{name} slots=1",
                                     f"{name}-launcher-0-0.{name} slots=1"]
    by_role = {}
    for pod in pods_of(trainer, name):
        by_role.setdefault(pod["metadata"]["labels"]["jobset.sigs.k8s.io/replicatedjob-name"], []).append(pod)
    assert (len(by_role["node"]), len(by_role["launcher"])) == (2, 1)
    (launcher,) = by_role["launcher"][0]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in launcher["env"]}
    assert env["OMPI_MCA_orte_default_hostfile"] == "/etc/mpi/hostfile"
    assert env["OMPI_MCA_orte_set_default_slots"] == "1"
    assert launcher["command"][:6] == ["gpt2bench", "launch", "--wait-seconds", "2400", "--", "mpirun"]
    assert {"name": "mpi-ssh-auth", "mountPath": "/home/gpt2bench/.ssh"} in launcher["volumeMounts"]
    (sshd,) = by_role["node"][0]["spec"]["containers"]
    assert sshd["command"] == ["/usr/sbin/sshd"] and "/home/gpt2bench/.sshd_config" in sshd["args"]
    assert {p["containerPort"] for p in sshd["ports"]} >= {2222}
    assert env.get("GPT2BENCH_OUTPUT_DIR") and {e["name"] for e in sshd["env"]} >= {"GPT2BENCH_OUTPUT_DIR"}
    # trainer.env reached the sshd pods (runLauncherAsNode), so the kubelet can expand the node's name into
    # sshd's SetEnv for the ranks it starts
    node_env = {e["name"]: e for e in sshd["env"]}
    assert node_env["GPT2BENCH_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert "SetEnv=GPT2BENCH_NODE_NAME=$(GPT2BENCH_NODE_NAME)" in sshd["args"]
    trainer.finish(name, succeeded=True, message=json.dumps(trainer_summary(run.name, 5.0)))
    trainjob = trainer.trainjob(name)
    assert result_pod(trainjob, trainer.pods(result_pod_selector(trainjob)))["spec"]["hostname"] == \
        f"{name}-launcher-0-0"
    # JobSet deleted the sshd Job when the launcher finished; the emulator's GC took its pods
    assert [j["metadata"]["name"] for j in trainer.jobs(name)] == [f"{name}-launcher-0"]


def test_suspended_resumed_and_deadline_map_to_phases_with_reasons(cluster, client):
    bench = benchmark(name="queued")
    run = plan_runs(bench)[0]
    job = render_job(bench, run)
    name = job["metadata"]["name"]
    job["spec"]["suspend"] = True  # what Kueue's webhook sets on a TrainJob with a queue label
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
    trainer = TrainerV2(client)
    trainer.reconcile(name)
    state = job_state(trainer.trainjob(name))
    assert (state.phase, state.reason, state.message) == ("Queued", "Suspended", "TrainJob is suspended")
    assert pods_of(trainer, name) == []
    cluster.kubectl("patch", "trainjob", name, "--type=merge", "-p", '{"spec": {"suspend": false}}')
    trainer.resume(name)
    assert job_state(trainer.trainjob(name)).phase == "Running"
    suspended = [c for c in trainer.trainjob(name)["status"]["conditions"] if c["type"] == "Suspended"]
    assert [(c["status"], c["reason"]) for c in suspended] == [("False", "Resumed")]
    assert len(pods_of(trainer, name)) == 1
    trainer.exceed_deadline(name)
    state = job_state(trainer.trainjob(name))
    assert state.phase == "Failed"
    assert state.describe() == "DeadlineExceeded: TrainJob exceeded its active deadline"
    entry = collect.collect_run(run, job_succeeded=False, job_reason=state.describe(), termination_message=None)
    assert entry.reason == "DeadlineExceeded: TrainJob exceeded its active deadline"


def test_a_failed_jobset_without_a_summary_keeps_jobsets_reason(cluster, client):
    bench = benchmark(name="crash")
    run = plan_runs(bench)[0]
    job = render_job(bench, run)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
    trainer = TrainerV2(client)
    trainer.reconcile(job["metadata"]["name"])
    trainer.finish(job["metadata"]["name"], succeeded=False, message=None, exit_code=137)
    trainjob = trainer.trainjob(job["metadata"]["name"])
    state = job_state(trainjob)
    assert state.reason == "FailedJobs"
    assert state.message == f"jobset failed due to one or more job failures (first failed job: {run.job_name}-node-0)"
    pod = result_pod(trainjob, trainer.pods(result_pod_selector(trainjob)))
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["reason"] == "OOMKilled"
    entry = collect.collect_run(run, job_succeeded=False, job_reason=state.describe(),
                                termination_message=termination_message(pod, result_container(trainjob)))
    assert entry.reason.startswith("FailedJobs: jobset failed due to one or more job failures")


def test_a_name_too_long_for_jobset_fails_reconciling_as_upstream(cluster, client):
    """Why TrainJob names are shortened: JobSet's webhook rejects pod names over 63 characters; the
    Trainer then records an Event and sets no condition, so the run would wait for ever."""
    bench = benchmark(name="a-benchmark-whose-name-is-long-enough-to-matter")
    run = next(r for r in plan_runs(bench) if r.strategy.name == "ddp" and r.nodes == 3)
    job = render_job(bench, run)
    assert len(run.name) > len(job["metadata"]["name"]) == run.job_name.__len__() <= 48
    too_long = copy.deepcopy(job)
    too_long["metadata"]["name"] = run.name  # 52 characters: a TrainJob the API accepts
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(too_long))
    trainer = TrainerV2(client)
    assert trainer.reconcile(run.name) is None
    events = json.loads(cluster.kubectl("get", "events", "-o", "json").stdout)["items"]
    (event,) = [e for e in events if e["involvedObject"]["name"] == run.name]
    assert event["reason"] == "TrainJobResourcesCreationFailed" and "exceed 63 characters" in event["message"]
    assert job_state(trainer.trainjob(run.name)).phase == "Pending"
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
    assert trainer.reconcile(job["metadata"]["name"]) is not None
