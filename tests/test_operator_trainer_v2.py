"""The real kopf operator (KopfRunner) on a cluster with Kubeflow Trainer v2 only (issue 10, phase 2).

The emulated API serves our CRD, the Trainer v2 and JobSet CRDs and no kubeflow.org group; the project's
runtimes come from manifests/runtimes.yaml, as a user installs them. The test plays Trainer v2, JobSet and
the Job controller (tests/kube/trainer_v2.py) for every TrainJob the operator creates.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest
from fault_figures import FIGURES, seconds_since
from kube import EmulatedCluster
from kube.admission import restricted_volumes
from kube.fixtures import (
    CRD,
    REPO,
    benchmark,
    install_trainer_v2,
    kopf_operator,
    kubectl_table,
    operator_calls,
    run_entry,
    wait_for,
)
from kube.trainer_v2 import TRAINER, TrainerV2
from kube.training import trainer_summary
from kubeflow_crds import TRAINER_V2_CRD_FILES, crd_dir

pytestmark = pytest.mark.timeout(180)
SCALES = [{"nodes": 1, "devicesPerNode": 0, "processesPerNode": 2}, {"nodes": 2, "devicesPerNode": 0, "processesPerNode": 1}]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with EmulatedCluster(tmp_path_factory.mktemp("trainer-v2")) as emulated:
        emulated.kubectl("apply", "-f", str(CRD))
        install_trainer_v2(emulated)
        emulated.kubectl("apply", "-f", str(REPO / "manifests" / "runtimes.yaml"))
        # Pod Security "restricted" on the namespace, for the volumes a pod brings (a hostPath is refused)
        emulated.call(lambda e: e.faults.append(restricted_volumes))
        yield emulated


@pytest.fixture(scope="module")
def operator(cluster):
    with kopf_operator(cluster, poll_seconds=0.3) as runner:
        yield runner


@pytest.fixture
def trainer(client):
    return TrainerV2(client)


def trainjobs(client, benchmark_name: str) -> list[dict]:
    import kubernetes

    listed = kubernetes.client.CustomObjectsApi(client).list_namespaced_custom_object(
        *TRAINER, "default", "trainjobs", label_selector=f"gpt2bench.io/benchmark={benchmark_name}")
    return listed["items"]


def finished(trainjob: dict) -> bool:
    return any(c["type"] in ("Complete", "Failed") and c["status"] == "True"
               for c in (trainjob.get("status") or {}).get("conditions") or [])


def play(client, trainer: TrainerV2, name: str, total: int, outcome) -> list[dict]:
    """Reconcile and finish every TrainJob of a sweep as the operator creates them, one at a time."""
    played: list[dict] = []
    while len(played) < total:
        (trainjob,) = wait_for(lambda: [t for t in trainjobs(client, name) if not finished(t)], 20,
                               what=f"the next TrainJob of {name} (done: {len(played)})")
        job_name = trainjob["metadata"]["name"]
        assert trainer.reconcile(job_name) is not None, f"{job_name}: Trainer v2 could not build it"
        outcome(trainer, trainjob)
        played.append(trainjob)
    return played


def test_auto_sweeps_as_trainjobs_with_a_failure_and_horovod_every_result_in_status(cluster, client, benchmarks,
                                                                                   trainer):
    strategies = [{"name": "single"}, {"name": "ddp"}, {"name": "horovod"}]
    benchmarks.create(benchmark("tv2", strategies, sweep={"strategies": strategies, "precisions": ["fp32"],
                                                            "scales": SCALES}))
    total = wait_for(lambda: benchmarks.status("tv2").get("runsTotal"), what="runsTotal")
    assert benchmarks.status("tv2")["backend"] == "trainjob", "auto: only Trainer v2 is served here"

    def outcome(t: TrainerV2, trainjob: dict) -> None:
        run = trainjob["metadata"]["labels"]["gpt2bench.io/run"]
        if run.startswith("tv2-ddp-fp32-2x1"):  # the trainer's own failure, with its summary
            t.finish(trainjob["metadata"]["name"], succeeded=False,
                     message=json.dumps({"status": "failed", "reason": "loss is NaN at step 3"}))
        else:
            t.finish(trainjob["metadata"]["name"], succeeded=True, message=json.dumps(trainer_summary(run, 50.0)))

    played = play(client, trainer, "tv2", total, outcome)
    status = wait_for(lambda: (s := benchmarks.status("tv2")).get("phase") == "PartiallySucceeded" and s,
                      what="PartiallySucceeded")
    # horovod on 1 node runs in its launcher alone, on 2 in the CPU image's sshd pods
    assert {t["spec"]["runtimeRef"]["name"] for t in played} == {"gpt2bench-torch", "gpt2bench-mpi-one-node",
                                                                 "gpt2bench-mpi"}
    by_run = {r["name"]: r for r in status["runs"]}
    assert len(by_run) == total and {r["jobKind"] for r in by_run.values()} == {"TrainJob"}
    assert sorted(r["jobName"] for r in by_run.values()) == sorted(t["metadata"]["name"] for t in played)
    failed = by_run["tv2-ddp-fp32-2x1"]
    assert (failed["phase"], failed["reason"]) == ("Failed", "loss is NaN at step 3")
    succeeded = [r for r in by_run.values() if r["phase"] == "Succeeded"]
    assert len(succeeded) == total - 1 and all(r["results"]["tokensPerSecond"] == 50.0 for r in succeeded)
    assert {r["strategy"] for r in succeeded} >= {"horovod"}, "read from the MPI launcher's termination message"
    (row,) = kubectl_table(cluster.kubectl("get", "gpt2benchmarks", "tv2", "-o", "wide").stdout)
    assert row["BACKEND"] == "trainjob"


def test_a_trainjob_failing_without_a_summary_keeps_the_containers_and_jobsets_reasons(client, benchmarks, trainer):
    benchmarks.create(benchmark("tv2oom", [{"name": "single"}]))
    play(client, trainer, "tv2oom", 1,
         lambda t, tj: t.finish(tj["metadata"]["name"], succeeded=False, message=None, exit_code=137))
    status = wait_for(lambda: (s := benchmarks.status("tv2oom")).get("phase") == "Failed" and s, what="Failed")
    (run,) = status["runs"]
    assert re.fullmatch(rf"pod {run['jobName']}-node-0-0-\w{{5}} \(container node\) OOMKilled \(exit code 137\); "
                        rf"FailedJobs: jobset failed due to one or more job failures \(first failed job: "
                        rf"{run['jobName']}-node-0\)", run["reason"]), run["reason"]


def test_a_queued_trainjob_queues_its_run_until_admitted(client, benchmarks, trainer):
    """Kueue's webhook suspends a TrainJob it queues (spec.suspend); the run is Queued until resumed."""
    import kubernetes

    custom = kubernetes.client.CustomObjectsApi(client)
    benchmarks.create(benchmark("tv2q", [{"name": "single"}]))
    (trainjob,) = wait_for(lambda: trainjobs(client, "tv2q"), what="the TrainJob")
    name = trainjob["metadata"]["name"]
    custom.patch_namespaced_custom_object(*TRAINER, "default", "trainjobs", name, {"spec": {"suspend": True}})
    trainer.reconcile(name)
    run = wait_for(lambda: (r := run_entry(benchmarks.status("tv2q"), 0)).get("phase") == "Queued" and r,
                   what="Queued")
    assert run["jobName"] == name
    custom.patch_namespaced_custom_object(*TRAINER, "default", "trainjobs", name, {"spec": {"suspend": False}})
    trainer.resume(name)
    wait_for(lambda: run_entry(benchmarks.status("tv2q"), 0).get("phase") == "Running", what="Running")
    trainer.finish(name, succeeded=True, message=json.dumps(trainer_summary(run["name"], 9.0)))
    wait_for(lambda: benchmarks.status("tv2q").get("phase") == "Succeeded", what="Succeeded")


def test_a_missing_runtime_fails_its_runs_saying_what_to_install(cluster, client, benchmarks):
    cluster.kubectl("delete", "clustertrainingruntime", "gpt2bench-mpi-one-node")
    try:
        benchmarks.create(benchmark("tv2nort", [{"name": "horovod"}]))
        status = wait_for(lambda: (s := benchmarks.status("tv2nort")).get("phase") == "Failed" and s, what="Failed")
        assert status["runs"][0]["reason"].startswith("ClusterTrainingRuntime gpt2bench-mpi-one-node is not "
                                                      "installed")
        assert "manifests/runtimes.yaml" in status["runs"][0]["reason"]
        assert trainjobs(client, "tv2nort") == []
    finally:
        cluster.kubectl("apply", "-f", str(REPO / "manifests" / "runtimes.yaml"))


def test_gang_scheduling_needs_a_runtime_that_gang_schedules(cluster, client, benchmarks, trainer):
    """`gang: true` on a TrainJob is the runtime's podGroupPolicy: on runtimes without one every run fails
    saying so, and no TrainJob starts pod by pod; on runtimes with one the run goes, marked for it."""
    strategies = [{"name": "ddp"}, {"name": "horovod"}]
    benchmarks.create(benchmark("tv2gang", strategies, scheduling={"gang": True},
                                sweep={"strategies": strategies, "scales": [{"nodes": 2}]}))
    status = wait_for(lambda: (s := benchmarks.status("tv2gang")).get("phase") == "Failed" and s, what="Failed")
    for run in status["runs"]:
        assert run["reason"].startswith("spec.scheduling.gang: runtime gpt2bench-"), run
        assert "has no podGroupPolicy" in run["reason"] and "trainerRuntimes.podGroupPolicy" in run["reason"]
    assert trainjobs(client, "tv2gang") == []
    from gpt2bench.render.runtimes import project_runtimes

    gang = project_runtimes(pod_group_policy={"coscheduling": {"scheduleTimeoutSeconds": 60}})
    for runtime in ("gpt2bench-torch", "gpt2bench-mpi"):  # a podGroupPolicy and the gang's schedulerName
        policy = json.dumps({"spec": {"podGroupPolicy": gang[runtime]["spec"]["podGroupPolicy"],
                                      "template": gang[runtime]["spec"]["template"]}})
        cluster.kubectl("patch", "clustertrainingruntime", runtime, "--type", "merge", "-p", policy)
    try:
        benchmarks.create(benchmark("tv2gang2", [{"name": "ddp"}], scheduling={"gang": True},
                                    sweep={"strategies": [{"name": "ddp"}], "scales": [{"nodes": 2}]}))
        (trainjob,) = wait_for(lambda: trainjobs(client, "tv2gang2"), what="the TrainJob")
        assert trainjob["metadata"]["annotations"]["gpt2bench.io/gang-scheduling"] == "required"
        trainer.reconcile(trainjob["metadata"]["name"])
        trainer.finish(trainjob["metadata"]["name"], succeeded=True,
                       message=json.dumps(trainer_summary(trainjob["metadata"]["labels"]["gpt2bench.io/run"], 5.0)))
        wait_for(lambda: benchmarks.status("tv2gang2").get("phase") == "Succeeded", what="Succeeded")
    finally:
        cluster.kubectl("apply", "-f", str(REPO / "manifests" / "runtimes.yaml"))


def test_a_run_off_its_fabric_is_recorded_and_warned_about(client, benchmarks, trainer):
    """What the trainer says it ran on reaches the status, and a 2-node run that ran on one node over sockets
    gets a Warning Event for each, as the report lists them."""
    benchmarks.create(benchmark("tv2fabric", [{"name": "ddp"}], sweep={"strategies": [{"name": "ddp"}],
                                                                       "scales": [{"nodes": 2}]}))

    def outcome(t: TrainerV2, trainjob: dict) -> None:
        run = trainjob["metadata"]["labels"]["gpt2bench.io/run"]
        summary = trainer_summary(run, 7.0, transport="NET/Socket", nodes_used=1, node_names=["n1", "n1"])
        t.finish(trainjob["metadata"]["name"], succeeded=True, message=json.dumps(summary))

    play(client, trainer, "tv2fabric", 1, outcome)
    status = wait_for(lambda: (s := benchmarks.status("tv2fabric")).get("phase") == "Succeeded" and s,
                      what="Succeeded")
    (run,) = status["runs"]
    assert (run["results"]["transport"], run["results"]["nodesUsed"]) == ("NET/Socket", 1)
    warnings = wait_for(lambda: (e := [e["message"] for e in benchmarks.events("tv2fabric")
                                       if e["reason"] == "RunOffItsFabric"]) and len(e) == 2 and e,
                        what="two RunOffItsFabric Events")
    assert any("a 2-node run that ran on 1 node(s)" in w for w in warnings)
    assert any("went over sockets (NET/Socket)" in w for w in warnings)


def test_what_a_trainjob_cannot_carry_makes_an_auto_benchmark_invalid_on_a_trainer_v2_cluster(benchmarks):
    """`auto` resolves to TrainJob here; hostNetwork cannot be patched onto a TrainJob's pods: the benchmark is
    Invalid, naming the field and why, and nothing is created."""
    benchmarks.create(benchmark("tv2hostnet", [{"name": "ddp"}], pods={"hostNetwork": True}))
    status = wait_for(lambda: (s := benchmarks.status("tv2hostnet")).get("phase") == "Invalid" and s, what="Invalid")
    assert "spec.pods.hostNetwork: a TrainJob cannot put its pods on the host network" in status["message"]
    assert "spec.backend auto resolved to trainjob" in status["message"]


def test_per_step_curves_of_trainjob_runs_outlive_the_pods_and_the_cluster_report_draws_them(
        cluster, client, benchmarks, tmp_path):
    """The steps line is read from the result pod's container `node` (torch rank 0; MPI's launcher)."""
    from gpt2bench.trainer.summary import steps_line

    trainer = TrainerV2(client, cluster=cluster)
    benchmarks.create(benchmark("tv2curves", [{"name": "single"}, {"name": "horovod"}]))

    def outcome(t: TrainerV2, trainjob: dict) -> None:
        run = trainjob["metadata"]["labels"]["gpt2bench.io/run"]
        records = [{"step": s, "warmup": s <= 1, "loss": 10.0 - s / 10, "grad_norm": 2.0 - s / 100, "lr": 3e-4,
                    "step_seconds": 0.2, "tokens_per_second": 1000.0} for s in range(1, 41)]
        log = "".join(f"rank0 INFO step {s} loss 9.0\n" for s in range(1, 41)) + steps_line(records) + "\n"
        mpi = trainjob["spec"]["runtimeRef"]["name"].startswith("gpt2bench-mpi")  # mpirun tags its ranks' lines
        t.finish(trainjob["metadata"]["name"], succeeded=True, message=json.dumps(trainer_summary(run, 10.0)),
                 log=("[1,0]<stdout>:" if mpi else "") + log)

    play(client, trainer, "tv2curves", 2, outcome)
    status = wait_for(lambda: (s := benchmarks.status("tv2curves")).get("phase") == "Succeeded" and s,
                      what="Succeeded")
    uid = benchmarks.get("tv2curves")["metadata"]["uid"]
    for run in status["runs"]:
        cm = wait_for(lambda run=run: benchmarks.config_map(f"{run['name']}-steps"), what="the steps ConfigMap")
        assert [o["uid"] for o in cm["metadata"]["ownerReferences"]] == [uid], "deleted with its benchmark"
        lines = [json.loads(line) for line in cm["data"]["steps.jsonl"].splitlines()]
        assert [r["step"] for r in lines] == list(range(1, 41)) and lines[0]["warmup"] is True
    for run in status["runs"]:  # the pods (and their logs) go; the curves stay
        for pod in trainer.pods(f"jobset.sigs.k8s.io/jobset-name={run['jobName']}"):
            benchmarks.core.delete_namespaced_pod(pod["metadata"]["name"], "default")
    out = tmp_path / "report"
    report = subprocess.run([sys.executable, "-m", "gpt2bench", "report", "--cluster", "tv2curves", "-n", "default",
                             "--output", str(out), "--quiet"], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)})
    assert report.returncode == 0, report.stderr
    assert (out / "loss.png").stat().st_size > 1000



# --- TrainJobs whose pods never start: JobSet's Jobs' pods, played by the scheduler and the kubelet ---------

# runPolicy.startupSeconds here (the operator polls every 0.3 s): the clock starts when the TrainJob is created,
# and building its JobSet, Jobs and pods takes the emulated Trainer a second or two on a quiet machine, over five
# on a loaded one (the suite's other workers, kopf at --verbose): the test must see the wait before the limit ends it
STARTUP = 10
TWO_NODES = [{"nodes": 2, "devicesPerNode": 0, "processesPerNode": 1}]


def starting(benchmarks, name: str, strategies: list[str]) -> None:
    benchmarks.create(benchmark(name, [{"name": s} for s in strategies], runPolicy={"startupSeconds": STARTUP},
                                sweep={"strategies": [{"name": s} for s in strategies], "precisions": ["fp32"],
                                       "scales": TWO_NODES}))


def first_run(benchmarks, name: str) -> dict:
    return (benchmarks.status(name).get("runs") or [{}])[0]


@pytest.mark.faults
def test_a_trainjob_whose_worker_cannot_pull_its_image_fails_at_the_startup_limit_and_the_sweep_goes_on(
        cluster, client, benchmarks):
    """JobSet's Job creates both `node` pods; node 1's image cannot be pulled (the kubelet's ImagePullBackOff).
    The run says so while it waits, fails at startupSeconds naming that pod, its TrainJob goes (its JobSet,
    Jobs and pods with it), and the next run starts and succeeds."""
    name = "tv2pull"
    trainer = TrainerV2(client, cluster=cluster, start_pods=False)
    starting(benchmarks, name, ["ddp", "fsdp"])
    (trainjob,) = wait_for(lambda: trainjobs(client, name), what="the first TrainJob")
    seen = time.monotonic()
    job_name = trainjob["metadata"]["name"]
    assert trainer.reconcile(job_name) is not None
    node0, node1 = trainer.pod_names(job_name)
    trainer.running(node0)
    image = trainjob["spec"]["trainer"]["image"]
    injected = time.monotonic()
    trainer.waiting(node1, "ImagePullBackOff", f'Back-off pulling image "{image}"')
    said = f'pod {node1} (container node) ImagePullBackOff: Back-off pulling image "{image}"'
    wait_for(lambda: first_run(benchmarks, name).get("waiting") == said, 10, what=said)
    shown = seconds_since(injected)
    assert said in cluster.kubectl("get", "gpt2benchmark", name).stdout, "kubectl get's Waiting column"
    failed = wait_for(lambda: (r := first_run(benchmarks, name)).get("phase") == "Failed" and r, 20, what="Failed")
    failed_after = seconds_since(seen)
    assert failed["reason"] == f"not started within runPolicy.startupSeconds ({STARTUP} s): {said}"
    wait_for(lambda: any(e["reason"] == "RunFailed" and said in e["message"] for e in benchmarks.events(name)), 10,
             what="its RunFailed Event")  # kopf posts Events from a queue of its own
    wait_for(lambda: job_name not in [t["metadata"]["name"] for t in trainjobs(client, name)], 10,
             what="its TrainJob deleted")
    assert trainer.pods(f"jobset.sigs.k8s.io/jobset-name={job_name}") == [], "its pods went with it"
    (second,) = wait_for(lambda: trainjobs(client, name), 10, what="the next run's TrainJob")  # the sweep went on
    trainer.start_pods = True
    trainer.reconcile(second["metadata"]["name"])
    run = second["metadata"]["labels"]["gpt2bench.io/run"]
    wait_for(lambda: benchmarks.status(name)["runs"][1].get("podsStartedTime"), 10, what="its pods started")
    trainer.finish(second["metadata"]["name"], succeeded=True, message=json.dumps(trainer_summary(run, 12.0)))
    status = wait_for(lambda: (s := benchmarks.status(name)).get("phase") not in (None, "Running") and s,
                      what="the end")
    assert status["phase"] == "PartiallySucceeded" and not status.get("waiting")
    FIGURES["trainjob-image-pull-backoff"] = {
        "injected": 1, "startupSeconds": STARTUP, "waiting_shown_after_s": shown, "failed_after_trainjob_seen_s":
        failed_after, "trainjob_deleted": True, "next_run": status["runs"][1]["phase"], "runs_lost": 0,
        "reason": failed["reason"]}


@pytest.mark.faults
def test_a_horovod_trainjob_waits_for_its_launcher_pod_not_only_the_pods_that_exist(cluster, client, benchmarks):
    """The MPI runtime's launcher Job dependsOn its sshd `node` pods being Ready (JobSet). An sshd that never
    gets Ready means no launcher pod at all: the pods that exist have all started, but the run has not; it
    counts the TrainJob's pods (numNodes on the project's runtime: 1 sshd + the launcher), says what it waits
    for and fails at the startup limit instead of running until its deadline."""
    name = "tv2sshd"
    trainer = TrainerV2(client, cluster=cluster, start_pods=False)
    starting(benchmarks, name, ["horovod"])
    (trainjob,) = wait_for(lambda: trainjobs(client, name), what="the TrainJob")
    seen = time.monotonic()
    job_name = trainjob["metadata"]["name"]
    trainer.reconcile(job_name)
    (sshd,) = trainer.pod_names(job_name)
    trainer.running(sshd, ready=False)  # its readiness probe (sshd's port) never passes
    assert trainer.pod_names(job_name, "launcher") == [], "JobSet creates no launcher Job yet"
    said = (f"1 of 2 pods created; pod {sshd} is not Ready (ContainersNotReady: containers with unready status: "
            f"[node]), and the job's controller may create the others only once it is")
    wait_for(lambda: first_run(benchmarks, name).get("waiting") == said, 10, what=said)
    failed = wait_for(lambda: (r := first_run(benchmarks, name)).get("phase") == "Failed" and r, 20, what="Failed")
    failed_after = seconds_since(seen)
    assert failed["reason"] == f"not started within runPolicy.startupSeconds ({STARTUP} s): {said}"
    assert not failed.get("podsStartedTime")
    wait_for(lambda: trainjobs(client, name) == [], 10, what="its TrainJob deleted")
    FIGURES["trainjob-launcher-never-created"] = {
        "injected": 1, "startupSeconds": STARTUP, "failed_after_trainjob_seen_s": failed_after,
        "trainjob_deleted": True, "runs_lost": 0, "reason": failed["reason"]}


@pytest.mark.faults
def test_a_trainjob_whose_image_lacks_its_command_fails_naming_the_pod_in_runcs_words(cluster, client, benchmarks):
    """containerd cannot start `node`'s command (StartError); under the runtime's restartPolicy Never the pod
    fails, its Job at once (backoffLimit 0), the JobSet and the TrainJob with it. The run names the pod and the
    command in the words the PyTorchJob path and the local runner use (tests/test_operator_pods.py)."""
    name = "tv2nocmd"
    trainer = TrainerV2(client, cluster=cluster, start_pods=False)
    benchmarks.create(benchmark(name, [{"name": "single"}]))
    (trainjob,) = wait_for(lambda: trainjobs(client, name), what="the TrainJob")
    job_name = trainjob["metadata"]["name"]
    trainer.reconcile(job_name)
    (pod,) = trainer.pod_names(job_name)
    injected = time.monotonic()
    trainer.start_error(pod)
    assert trainer.trainjob(job_name)["status"]["conditions"][-1]["reason"] == "FailedJobs"
    failed = wait_for(lambda: (r := first_run(benchmarks, name)).get("phase") == "Failed" and r, 20, what="Failed")
    program = trainjob["spec"]["trainer"]["command"][0]
    assert failed["reason"] == (f'pod {pod} (container node) StartError: exec: "{program}": executable file not found '
                                f"in $PATH; FailedJobs: jobset failed due to one or more job failures (first failed "
                                f"job: {job_name}-node-0)")
    FIGURES["trainjob-command-missing"] = {"injected": 1, "failed_after_injection_s": seconds_since(injected),
                                           "runs_lost": 0, "reason": failed["reason"]}


HOST_PATH = {"name": "datasets", "mountPath": "/datasets", "hostPath": {"path": "/mnt/datasets"}}


@pytest.mark.faults
def test_a_trainjob_whose_pods_pod_security_refuses_fails_within_seconds_in_the_job_controllers_words(
        cluster, client, benchmarks):
    """The namespace enforces Pod Security "restricted" and the benchmark mounts a hostPath: the API server refuses
    the TrainJob's pods, and the Job controller says so on JobSet's Job, not on the TrainJob. The run fails at the
    next step quoting it (before: `no pod yet (its controller has created none ...` at runPolicy.startupSeconds, 600 s
    here), its TrainJob goes, and the other TrainJob run, which would meet the same refusal, is held (admission)."""
    name = "tv2psa"
    trainer = TrainerV2(client, cluster=cluster)
    strategies = [{"name": "ddp"}, {"name": "fsdp"}]
    benchmarks.create(benchmark(name, strategies, runPolicy={"startupSeconds": 600}, pods={"volumes": [HOST_PATH]},
                                sweep={"strategies": strategies, "precisions": ["fp32"], "scales": TWO_NODES}))
    (trainjob,) = wait_for(lambda: trainjobs(client, name), what="the first TrainJob")
    job_name = trainjob["metadata"]["name"]
    injected = time.monotonic()
    assert trainer.reconcile(job_name) is not None
    assert trainer.pod_names(job_name) == [], "the API server created none of its pods"
    (refusal,) = [e for e in benchmarks.core.list_namespaced_event("default").items
                  if e.involved_object.name == f"{job_name}-node-0" and e.reason == "FailedCreate"]
    assert (refusal.involved_object.kind, refusal.source.component) == ("Job", "job-controller")
    failed = wait_for(lambda: (r := first_run(benchmarks, name)).get("phase") == "Failed" and r, 60, what="Failed")
    failed_after = seconds_since(injected)
    assert failed_after < 60, "the start limit is 600 s (about 1 s here; a loaded 2-core machine takes longer)"
    assert failed["reason"] == f"its pods were refused: job-controller FailedCreate: {refusal.message}"
    assert re.fullmatch(rf'Error creating: pods "{job_name}-node-0-0-\w{{5}}" is forbidden: violates PodSecurity '
                        r'"restricted:latest": restricted volume types \(volume "datasets" uses restricted volume '
                        r'type "hostPath"\)', refusal.message), refusal.message
    wait_for(lambda: trainjobs(client, name) == [], 30, what="its TrainJob deleted")
    status = wait_for(lambda: (s := benchmarks.status(name)) and (s["runs"][1].get("reason") or "").startswith(
        "held") and s, 30, what="the other run held")
    assert status["runs"][1]["phase"] == "Pending"
    assert status["runs"][1]["reason"].startswith(f"held (admission): {failed['name']} failed for a cause every "
                                                  "TrainJob run shares (")
    assert trainjobs(client, name) == [], "no TrainJob for a held run"
    FIGURES["trainjob-pod-security-refuses-its-pods"] = {
        "injected": 1, "startupSeconds": 600, "failed_after_refusal_s": failed_after, "trainjob_deleted": True,
        "runs_held": 1, "runs_lost": 0, "reason": failed["reason"]}
    benchmarks.delete(name)  # held for good: nothing fixes this test's namespace


def test_a_trainjob_with_resource_claims_runs_on_its_benchmarks_own_runtime_created_before_it(client, benchmarks,
                                                                                           trainer):
    """Claims (DRA) reach a TrainJob's pods through a TrainingRuntime the operator creates in the benchmark's
    namespace, owned by the benchmark, before the TrainJob naming it; the Trainer's pods (every pod of these
    runtimes runs ranks: the MPI launcher is a node) carry the claims, and the runs succeed."""
    import kubernetes

    custom = kubernetes.client.CustomObjectsApi(client)
    claims = [{"name": "efa", "resourceClaimTemplateName": "efa-all"}]
    strategies = [{"name": "ddp"}, {"name": "horovod"}]
    benchmarks.create(benchmark("tv2dra", strategies, pods={"resourceClaims": claims},
                                sweep={"strategies": strategies, "scales": [{"nodes": 2}]}))
    total = wait_for(lambda: benchmarks.status("tv2dra").get("runsTotal"), what="runsTotal")
    uid = benchmarks.get("tv2dra")["metadata"]["uid"]
    runtimes: dict[str, dict] = {}

    def outcome(t: TrainerV2, trainjob: dict) -> None:
        ref = trainjob["spec"]["runtimeRef"]
        assert ref["kind"] == "TrainingRuntime"
        runtime = custom.get_namespaced_custom_object(*TRAINER, "default", "trainingruntimes", ref["name"])
        runtimes[ref["name"]] = runtime
        assert int(runtime["metadata"]["resourceVersion"]) < int(trainjob["metadata"]["resourceVersion"])
        (owner,) = runtime["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"], owner["controller"]) == ("GPT2Benchmark", uid, True)
        name = trainjob["metadata"]["name"]
        pods = t.pods(f"jobset.sigs.k8s.io/jobset-name={name}")
        assert len(pods) == 2, [p["metadata"]["name"] for p in pods]
        for pod in pods:
            (container,) = pod["spec"]["containers"]
            assert pod["spec"]["resourceClaims"] == claims, pod["metadata"]["name"]
            assert container["resources"]["claims"] == [{"name": "efa"}], pod["metadata"]["name"]
        run = trainjob["metadata"]["labels"]["gpt2bench.io/run"]
        t.finish(name, succeeded=True, message=json.dumps(trainer_summary(run, 11.0)))

    played = play(client, trainer, "tv2dra", total, outcome)
    wait_for(lambda: benchmarks.status("tv2dra").get("phase") == "Succeeded", what="Succeeded")
    assert len(played) == total == 2 and len(runtimes) == 2  # ddp's torch runtime, horovod's MPI one


def test_without_the_trainingruntime_crd_a_trainjob_with_claims_fails_saying_so(cluster, client, benchmarks):
    """A cluster whose Trainer v2 lacks the TrainingRuntime kind: every run needing one fails at once, naming it,
    no TrainJob is created, and the benchmark ends (Failed) instead of waiting."""
    from kube.faults import remove_crd

    crd = crd_dir() / TRAINER_V2_CRD_FILES[("trainer.kubeflow.org/v1alpha1", "TrainingRuntime")]
    remove_crd(cluster, "trainingruntimes.trainer.kubeflow.org", delay=0.1)
    try:
        benchmarks.create(benchmark("tv2nocrd", [{"name": "single"}, {"name": "ddp"}],
                                    pods={"resourceClaims": [{"name": "efa", "resourceClaimName": "efa"}]}))
        status = wait_for(lambda: (s := benchmarks.status("tv2nocrd")).get("phase") == "Failed" and s, what="Failed")
        assert len(status["runs"]) == 2
        for run in status["runs"]:
            assert run["reason"].startswith("TrainingRuntime trainer.kubeflow.org/v1alpha1 is not served by this "
                                            "cluster"), run
            assert "spec.pods.resourceClaims" in run["reason"] and "backend pytorchjob" in run["reason"]
        assert trainjobs(client, "tv2nocrd") == []
    finally:
        cluster.kubectl("create", "-f", str(crd))


def test_rbac_covers_every_call_made_here(cluster, benchmarks):
    """The Trainer v2 paths checked against the roles bound to the operator in manifests/operator.yaml."""
    from test_operator_manifests import allowed, cluster_role_rules

    made = operator_calls(cluster)
    assert {("trainer.kubeflow.org", "trainjobs", "create"), ("trainer.kubeflow.org", "trainjobs", "watch"),
            ("trainer.kubeflow.org", "clustertrainingruntimes", "get"), ("", "configmaps", "create"),
            ("", "pods/log", "get"), ("batch", "jobs", "list"),
            ("trainer.kubeflow.org", "trainingruntimes", "create")} <= made
    assert not [call for call in made if call[0] == "jobset.x-k8s.io"], "the Trainer's, not ours"
    assert [call for call in made if call[0] == "batch"] == [("batch", "jobs", "list")], "listed for their Events only"
    assert [call for call in sorted(made) if not allowed(cluster_role_rules(), *call)] == []
