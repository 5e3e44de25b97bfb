"""Gang scheduling of TrainJob runs is in force only where the runtimes' pods name the gang's scheduler: Trainer
v2.3 creates the PodGroup of a runtime's podGroupPolicy but leaves the pods' schedulerName alone, and the
default scheduler ignores PodGroups."""

from __future__ import annotations

import copy

import pytest
from kubeflow_crds import validate_job

from gpt2bench.plan import plan_runs
from gpt2bench.render.pods import run_pods
from gpt2bench.render.runtimes import project_runtimes, runtime_problems
from gpt2bench.render.trainjob import render_trainjob
from gpt2bench.specification.validation import load_benchmark

POLICIES = {"coscheduling": ({"coscheduling": {"scheduleTimeoutSeconds": 60}}, "scheduler-plugins-scheduler"),
            "volcano": ({"volcano": {}}, "volcano")}


def pod_specs(runtime):
    return [job["template"]["spec"]["template"]["spec"] for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]]


def gang_trainjob(strategy: str = "horovod"):
    bench = load_benchmark({"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark", "metadata": {"name": "g"},
                            "spec": {"backend": "trainjob", "scheduling": {"gang": True},
                                     "sweep": {"strategies": [{"name": strategy}],
                                               "scales": [{"nodes": 2, "devicesPerNode": 4}]}}})
    (run,) = plan_runs(bench)
    return render_trainjob(run_pods(bench, run))


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_pod_of_a_gang_runtime_names_the_policys_scheduler(name):
    policy, scheduler = POLICIES[name]
    for runtime in project_runtimes(pod_group_policy=policy).values():
        validate_job(runtime)
        assert {pod.get("schedulerName") for pod in pod_specs(runtime)} == {scheduler}, runtime["metadata"]["name"]
    for runtime in project_runtimes().values():  # no gang: the cluster's default scheduler
        assert all("schedulerName" not in pod for pod in pod_specs(runtime))


@pytest.mark.parametrize("strategy", ["horovod", "ddp"])
def test_a_gang_run_is_refused_on_a_runtime_whose_pods_the_default_scheduler_would_bind(strategy):
    """A runtime with a podGroupPolicy and no schedulerName (installed by an older chart, or by hand) does not
    gang-schedule: the run is refused saying so, instead of running under an annotation that claims a gang."""
    job = gang_trainjob(strategy)
    name = job["spec"]["runtimeRef"]["name"]
    runtime = project_runtimes(pod_group_policy=POLICIES["coscheduling"][0])[name]
    assert runtime_problems(job, runtime) == []
    unenforced = copy.deepcopy(runtime)
    for pod in pod_specs(unenforced):
        del pod["schedulerName"]
    (problem,) = runtime_problems(job, unenforced)
    assert problem.startswith(f"spec.scheduling.gang: runtime {name} has a podGroupPolicy (coscheduling) but its "
                              "pods name no gang scheduler")
    assert "scheduler-plugins-scheduler" in problem and "trainerRuntimes.schedulerName" in problem


def test_the_chart_names_the_policys_scheduler_or_the_one_its_values_say():
    from test_helm import HELM, render

    if not HELM.exists():
        pytest.skip(f"helm not installed at {HELM}")
    base = ["--set", "trainerRuntimes.install=true", "--set", "trainerRuntimes.podGroupPolicy=volcano"]
    for extra, scheduler in (([], "volcano"), (["--set", "trainerRuntimes.schedulerName=volcano-gpu"], "volcano-gpu")):
        runtimes = [d for d in render(*base, *extra) if d["kind"] == "ClusterTrainingRuntime"]
        assert len(runtimes) == 4
        assert {pod.get("schedulerName") for runtime in runtimes for pod in pod_specs(runtime)} == {scheduler}
