"""The job-kind table: backends, names, the result pod, and what each kind's conditions mean for a run.

Jobs and pods here are shaped as upstream's controllers leave them (tests/kube/trainer_v2.py plays them
end to end over HTTP in test_trainer_v2_emulator.py).
"""

from __future__ import annotations

import pytest

from gpt2bench import jobkinds
from gpt2bench.controller import decide
from gpt2bench.jobkinds import (
    JobState,
    job_kind_for,
    job_state,
    max_job_name_length,
    resolve_backend,
    result_pod,
    result_pod_selector,
    served_job_kinds,
)
from gpt2bench.plan import plan_runs
from gpt2bench.render import render_job
from gpt2bench.specification.validation import load_benchmark

COMPLETION = "batch.kubernetes.io/job-completion-index"


def benchmark(spec: dict, name: str = "bench"):
    return load_benchmark({"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark",
                           "metadata": {"name": name}, "spec": spec})


SWEEP = {"sweep": {"strategies": [{"name": "ddp"}, {"name": "horovod"}], "scales": [{"nodes": 2}]}}


# -- backends --------------------------------------------------------------------------------------------


def test_each_backend_gives_its_job_kinds():
    assert [job_kind_for(s, "pytorchjob") for s in ("ddp", "horovod", "ps")] == ["PyTorchJob", "MPIJob", "PyTorchJob"]
    assert {job_kind_for(s, "trainjob") for s in ("single", "ddp", "fsdp", "horovod", "ps")} == {"TrainJob"}
    with pytest.raises(ValueError, match="not resolved"):
        job_kind_for("ddp", "auto")


@pytest.mark.parametrize(("requested", "served", "resolved"), [
    ("auto", {"TrainJob", "PyTorchJob", "MPIJob"}, "trainjob"),  # TrainJob preferred
    ("auto", {"TrainJob"}, "trainjob"),
    ("auto", {"PyTorchJob", "MPIJob"}, "pytorchjob"),
    ("auto", {"MPIJob"}, "pytorchjob"),
    ("auto", set(), "trainjob"),  # nothing served: the runs will say to install Trainer v2
    ("auto", None, "pytorchjob"),  # no API to ask: jobkinds.OFFLINE_BACKEND
    ("pytorchjob", {"TrainJob"}, "pytorchjob"),  # asked for: kept, its runs fail saying what is missing
    ("trainjob", set(), "trainjob"),
])  # fmt: skip
def test_resolve_backend(requested, served, resolved):
    assert resolve_backend(requested, served) == resolved


def test_served_job_kinds_reads_discovery():
    discovery = {
        "trainer.kubeflow.org/v1alpha1": ["trainjobs", "trainjobs/status", "trainingruntimes", "clustertrainingruntimes"],
        "jobset.x-k8s.io/v1alpha2": ["jobsets"],
        "kubeflow.org/v1": ["pytorchjobs", "mpijobs"],  # training-operator's own MPIJob v1 is not mpi-operator's
    }
    assert served_job_kinds(discovery) == {"TrainJob", "PyTorchJob"}
    assert served_job_kinds({"kubeflow.org/v2beta1": ["mpijobs"]}) == {"MPIJob"}
    assert served_job_kinds({}) == set()


def test_plan_follows_the_spec_or_the_callers_backend():
    auto = benchmark(SWEEP)
    assert [r.job_kind for r in plan_runs(auto)] == ["PyTorchJob", "MPIJob"]  # unresolved auto: v1 jobs
    assert [r.job_kind for r in plan_runs(auto, "trainjob")] == ["TrainJob", "TrainJob"]
    chosen = benchmark({**SWEEP, "backend": "trainjob"})
    assert [(r.job_kind, r.backend) for r in plan_runs(chosen)] == [("TrainJob", "trainjob")] * 2
    assert [r.job_kind for r in plan_runs(chosen, "pytorchjob")] == ["PyTorchJob", "MPIJob"]
    run = plan_runs(auto)[1]
    assert run.for_backend("trainjob").job_kind == "TrainJob" and run.job_kind == "MPIJob"
    assert render_job(auto, run, backend="trainjob")["kind"] == "TrainJob"


# -- names -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("strategy", "nodes", "limit"), [
    ("ddp", 1, 48), ("ddp", 10, 48), ("ddp", 11, 47), ("ddp", 1024, 45),  # <tj>-node-0-<N-1>-abcde
    ("horovod", 1, 44), ("horovod", 2, 44), ("horovod", 12, 44),  # <tj>-launcher-0-0-abcde
])  # fmt: skip
def test_trainjob_names_leave_room_for_jobset_pod_names(strategy, nodes, limit):
    assert max_job_name_length("TrainJob", strategy, nodes) == limit
    assert max_job_name_length("PyTorchJob", strategy, nodes) == 63


def test_long_run_names_get_shorter_unique_trainjob_names():
    bench = benchmark({**SWEEP, "backend": "trainjob", "sweep": {
        "strategies": [{"name": "ddp"}, {"name": "fsdp"}, {"name": "horovod"}], "scales": [{"nodes": 2}]}},
        name="a-rather-long-benchmark-name-for-the-gpu-cluster")  # fmt: skip
    runs = plan_runs(bench)
    names = [run.job_name for run in runs]
    assert all(len(run.name) == 52 for run in runs)  # the plan's own limit
    assert [len(n) for n in names] == [48, 48, 44] and len(set(names)) == 3
    assert all(render_job(bench, run)["metadata"]["name"] == run.job_name for run in runs)
    assert plan_runs(bench, "pytorchjob")[0].job_name == runs[0].name  # v1 names are the run names


# -- the result pod --------------------------------------------------------------------------------------


def pod(name: str, labels: dict, index: str | None = "0", created: str = "2026-01-01T00:00:00Z") -> dict:
    annotations = {COMPLETION: index} if index is not None else {}
    return {"metadata": {"name": name, "labels": labels, "annotations": annotations, "creationTimestamp": created}}


def js_labels(jobset: str, rjob: str, job_index: str = "0", attempt: str = "0") -> dict:
    return {"jobset.sigs.k8s.io/jobset-name": jobset, "jobset.sigs.k8s.io/replicatedjob-name": rjob,
            "jobset.sigs.k8s.io/job-index": job_index, "jobset.sigs.k8s.io/restart-attempt": attempt}


def test_trainjob_result_pod_is_index_0_of_node_or_the_launcher():
    bench = benchmark(SWEEP)
    ddp, horovod = (render_job(bench, run) for run in plan_runs(bench, "trainjob"))
    name = ddp["metadata"]["name"]
    assert result_pod_selector(ddp) == (f"jobset.sigs.k8s.io/jobset-name={name},"
                                        "jobset.sigs.k8s.io/replicatedjob-name=node,jobset.sigs.k8s.io/job-index=0")
    pods = [
        pod("rank1", js_labels(name, "node"), index="1"),
        pod("other-jobset", js_labels("someone-else", "node")),
        pod("no-index", js_labels(name, "node"), index=None),
        pod("rank0", js_labels(name, "node")),
        pod("rank0-before-restart", js_labels(name, "node", attempt="0"), created="2026-01-01T00:00:05Z"),
        pod("rank0-after-restart", js_labels(name, "node", attempt="1")),
    ]
    assert result_pod(ddp, pods)["metadata"]["name"] == "rank0-after-restart"
    assert result_pod(ddp, pods[:4])["metadata"]["name"] == "rank0"
    assert result_pod(ddp, pods[:3]) is None
    mpi = horovod["metadata"]["name"]
    assert "replicatedjob-name=launcher" in result_pod_selector(horovod)
    mpi_pods = [pod("sshd", js_labels(mpi, "node")), pod("launcher", js_labels(mpi, "launcher"))]
    assert result_pod(horovod, mpi_pods)["metadata"]["name"] == "launcher"
    assert jobkinds.result_container(horovod) == jobkinds.result_container(ddp) == "node"


def test_v1_result_pods_keep_the_training_operators_labels():
    auto = benchmark(SWEEP)
    pytorchjob, mpijob = (render_job(auto, run) for run in plan_runs(auto))
    assert result_pod_selector(pytorchjob).endswith("training.kubeflow.org/job-role=master")
    assert result_pod_selector(mpijob).endswith("training.kubeflow.org/job-role=launcher")
    launcher = pod("l", {"training.kubeflow.org/job-name": mpijob["metadata"]["name"],
                         "training.kubeflow.org/job-role": "launcher"}, index=None)
    assert result_pod(mpijob, [launcher]) is launcher
    assert (jobkinds.result_container(pytorchjob), jobkinds.result_container(mpijob)) == ("pytorch", "launcher")


# -- reading a rendered job (the local runner and the operator) -----------------------------------------


def test_rendered_jobs_are_read_through_the_table():
    """Each kind's replicas, their containers, its runtime and deadline, where the renderers put them."""
    spec = {**SWEEP, "runPolicy": {"activeDeadlineSeconds": 900}}
    pytorchjob, mpijob = (render_job(benchmark(spec), run) for run in plan_runs(benchmark(spec)))
    trainjob_ddp, trainjob_mpi = (render_job(benchmark(spec), run, "trainjob") for run in plan_runs(benchmark(spec)))
    assert [jobkinds.kind_of(job).kind for job in (pytorchjob, mpijob, trainjob_ddp)] == [
        "PyTorchJob", "MPIJob", "TrainJob"]
    assert jobkinds.kind_of({**pytorchjob, "apiVersion": "kubeflow.org/v2"}) is None  # a version not in the table
    assert jobkinds.kind_of({"apiVersion": "kubeflow.org/v1", "kind": "TFJob"}) is None
    specs = jobkinds.replica_specs(pytorchjob)
    assert list(specs) == list(jobkinds.replica_types(pytorchjob)) == ["Master", "Worker"]
    assert specs["Worker"]["replicas"] == 1
    for job in (pytorchjob, mpijob):
        for role, replica in jobkinds.replica_specs(job).items():
            (container,) = replica["template"]["spec"]["containers"]
            assert jobkinds.replica_container(job, role) == container["name"], (job["kind"], role)
    assert jobkinds.replica_types(mpijob) == ("Launcher", "Worker")
    assert jobkinds.replica_specs(trainjob_ddp) == {} and jobkinds.replica_types(trainjob_ddp) == ()
    assert jobkinds.runtime_ref(trainjob_ddp)["name"] == "gpt2bench-torch"
    assert jobkinds.runtime_ref(trainjob_mpi)["name"] == "gpt2bench-mpi"
    assert jobkinds.runtime_ref(pytorchjob) is None
    assert {jobkinds.active_deadline(job) for job in (pytorchjob, mpijob, trainjob_ddp)} == {900.0}
    unbounded = benchmark({**SWEEP, "runPolicy": {"activeDeadlineSeconds": None}})
    assert {jobkinds.active_deadline(render_job(unbounded, run, backend))
            for run in plan_runs(unbounded) for backend in ("pytorchjob", "trainjob")} == {None}


# -- conditions -> phases ----------------------------------------------------------------------------------


def trainjob(conditions=(), jobs_status=()) -> dict:
    return {"kind": "TrainJob", "status": {"conditions": list(conditions), "jobsStatus": list(jobs_status)}}


def cond(type_: str, status: str = "True", reason: str = "", message: str = "") -> dict:
    return {"type": type_, "status": status, "reason": reason, "message": message}


FAILED_JOBS = "jobset failed due to one or more job failures (first failed job: tj-node-0)"


@pytest.mark.parametrize(("job", "state"), [
    (trainjob(), JobState("Pending")),
    (trainjob(jobs_status=[{"name": "node", "ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 0}]),
     JobState("Pending")),
    (trainjob(jobs_status=[{"name": "node", "ready": 1, "succeeded": 0, "failed": 0, "active": 1, "suspended": 0}]),
     JobState("Running")),
    (trainjob([cond("Suspended", reason="Suspended", message="TrainJob is suspended")],
              [{"name": "node", "ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 1}]),
     JobState("Queued", "TrainJob is suspended", "Suspended")),
    (trainjob([cond("Suspended", "False", "Resumed", "TrainJob is resumed")],
              [{"name": "node", "ready": 1, "succeeded": 0, "failed": 0, "active": 1, "suspended": 0}]),
     JobState("Running")),
    (trainjob([cond("Complete", reason="AllJobsCompleted", message="jobset completed successfully")]),
     JobState("Succeeded", "jobset completed successfully", "AllJobsCompleted")),
    (trainjob([cond("Failed", reason="FailedJobs", message=FAILED_JOBS)]), JobState("Failed", FAILED_JOBS, "FailedJobs")),
    (trainjob([cond("Suspended", "False", "Resumed"),
               cond("Failed", reason="DeadlineExceeded", message="TrainJob exceeded its active deadline")]),
     JobState("Failed", "TrainJob exceeded its active deadline", "DeadlineExceeded")),
])  # fmt: skip
def test_trainjob_conditions_map_to_run_phases_keeping_reasons(job, state):
    assert job_state(job) == state


def test_a_failure_reason_reads_as_reason_then_message():
    assert JobState("Failed", FAILED_JOBS, "FailedJobs").describe() == f"FailedJobs: {FAILED_JOBS}"
    assert JobState("Failed", "", "DeadlineExceeded").describe() == "DeadlineExceeded"


V1_CONDITION_LISTS = [
    [],
    [cond("Created")],
    [cond("Created"), cond("Running", message="running")],
    [cond("Created"), cond("Running", "False"), cond("Succeeded", reason="PyTorchJobSucceeded", message="done")],
    [cond("Created"), cond("Running"), cond("Restarting", message="1 Worker replica(s) failed")],
    [cond("Created"), cond("Failed", reason="MPIJobFailed", message="launcher failed"), cond("Running")],
    [cond("Created"), cond("Suspended", reason="MPIJobSuspended"), cond("Running", "False", "MPIJobSuspended")],
]


@pytest.mark.parametrize("conditions", V1_CONDITION_LISTS)
def test_v1_jobs_map_as_the_operator_does(conditions):
    """Phase 2 moves the operator onto this table: the v1 mapping must be the operator's (decide.py)."""
    for kind in ("PyTorchJob", "MPIJob"):
        job = {"kind": kind, "status": {"conditions": conditions}}
        mine, operators = job_state(job), decide.job_state(job)
        assert (mine.phase, mine.message if mine.phase != "Pending" else "") == (
            operators.phase, operators.message if operators.phase != "Pending" else "")
