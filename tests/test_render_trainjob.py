"""Rendering for Trainer v2: every run as a TrainJob, and the project's runtimes, valid against the upstream
CRDs (strictly), their CEL rules and webhooks; the pods they become satisfy Pod Security "restricted"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import test_render
import yaml
from hypothesis import HealthCheck, assume, given, settings
from kube.trainer_v2 import build_jobset
from kubeflow_crds import assert_each_mutation_rejected, job_problems, validate_job
from trainer_v2_rules import jobset_spec_problems, restricted_problems

from gpt2bench.conventions import OUTPUT_DIR
from gpt2bench.plan import plan_runs
from gpt2bench.render import render_all, render_job
from gpt2bench.render.cli import main
from gpt2bench.render.pods import output_size_limit
from gpt2bench.render.runtimes import (
    IMAGE_LABEL,
    MPI_GPU_RUNTIME,
    MPI_ONE_NODE_RUNTIME,
    MPI_RUNTIME,
    TORCH_RUNTIME,
    mpi_runtime,
    project_runtimes,
    runtime_problems,
)
from gpt2bench.render.trainjob import pod_patch, trainjob_caveats
from gpt2bench.specification.model import DEFAULT_GPU_IMAGE, DEFAULT_IMAGE
from gpt2bench.specification.validation import SpecError, load_benchmark, load_benchmark_file
from gpt2bench.trainer.config import TrainConfig

EXAMPLES = Path(__file__).resolve().parents[1] / "manifests" / "examples"
UPSTREAM_RUNTIMES = Path(__file__).resolve().parent / "data" / "kubeflow-crds" / "trainer-v2" / "runtimes"
RUNTIMES = project_runtimes()


def benchmark(spec: dict, name: str = "bench"):
    return load_benchmark({"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark",
                           "metadata": {"name": name, "namespace": "perf"}, "spec": {**spec, "backend": "trainjob"}})


def patched(job: dict, rjob: str) -> dict:
    (patch,) = job["spec"]["runtimePatches"]
    jobs = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    return next(j for j in jobs if j["name"] == rjob)["template"]["spec"]["template"]


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def effective_pods(job: dict) -> dict[str, dict]:
    """The pod spec of each replicated job of the JobSet the Trainer builds (tests/kube/trainer_v2.py)."""
    job = {**job, "metadata": {**job["metadata"], "uid": "uid"}}
    jobset = build_jobset(job, RUNTIMES[job["spec"]["runtimeRef"]["name"]])
    assert jobset_spec_problems(jobset["spec"], jobset["metadata"]["name"]) == []
    return {rjob["name"]: rjob["template"]["spec"]["template"] for rjob in jobset["spec"]["replicatedJobs"]}


# -- the validator catches what Trainer v2 rejects ----------------------------------------------------------


def test_validator_rejects_broken_trainjobs():
    job = render_all(benchmark({"sweep": {"strategies": [{"name": "ddp"}], "scales": [{"nodes": 2}]}}))[0]
    validate_job(job)
    node = lambda j: patched(j, "node")["spec"]["containers"][0]  # noqa: E731
    assert_each_mutation_rejected(job, [
        (lambda j: j["spec"]["trainer"].update(numProcPerNode="auto"), "numProcPerNode"),  # int32 since v2.2
        (lambda j: j["spec"]["trainer"].update(nprocPerNode=2), "nprocPerNode"),  # unknown field
        (lambda j: j["spec"].update(podTemplateOverrides=[]), "podTemplateOverrides"),  # v2.1, gone in v2.3
        (lambda j: j["spec"]["trainer"]["env"].append({"name": "PET_NNODES", "value": "9"}), "reserved envs"),
        (lambda j: node(j).update(env=[{"name": "X", "value": "1"}]), "must not have envs"),
        (lambda j: node(j).update(name="trainer"), "doesn't exist in the runtime job node"),
        (lambda j: node(j).update(ports=[{"containerPort": 1}]), "ports"),  # ContainerPatch has no ports
        (lambda j: j["spec"]["runtimePatches"][0].update(manager="gpt2bench"), "domain-prefixed path"),
        (lambda j: patched(j, "node").update(foo=1), "foo"),
        (lambda j: j["spec"]["runtimeRef"].update(name="torch-distributed"), "must be created before"),
        (lambda j: j["spec"]["runtimeRef"].update(kind="Runtime"), "unsupported runtime"),
        (lambda j: j["metadata"].update(name="x" * 49), "longer than 63"),  # the JobSet's pod names
        (lambda j: j["metadata"].update(name="Bench"), "RFC 1035"),
    ])


def test_validator_rejects_broken_runtimes_and_accepts_upstreams():
    for path in sorted(UPSTREAM_RUNTIMES.glob("*.yaml")):
        assert job_problems(yaml.safe_load(path.read_text())) == [], path.name
    assert_each_mutation_rejected(mpi_runtime(), [
        (lambda r: r["spec"]["mlPolicy"].update(torch={}), "only one of the policy"),
        (lambda r: r["spec"]["template"]["spec"]["replicatedJobs"][1].update(replicas=2), "always must be 1"),
        (lambda r: r["spec"]["template"]["spec"]["replicatedJobs"].reverse(), "cannot depend on"),
        (lambda r: r["spec"]["mlPolicy"]["mpi"].update(mpiImplementation="Intel"), "mpiImplementation"),
        (lambda r: r["spec"]["mlPolicy"]["mpi"].update(numProcPerNode="2"), "numProcPerNode"),
    ])


# -- the project's runtimes -------------------------------------------------------------------------------


def test_runtimes_are_valid_restricted_and_shaped_like_upstreams():
    assert set(RUNTIMES) == {TORCH_RUNTIME, MPI_RUNTIME, MPI_GPU_RUNTIME, MPI_ONE_NODE_RUNTIME}
    for runtime in RUNTIMES.values():
        validate_job(runtime)
        for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
            pod = rjob["template"]["spec"]["template"]["spec"]
            assert restricted_problems(pod) == [], (runtime["metadata"]["name"], rjob["name"])
            assert pod["restartPolicy"] == "Never" and rjob["template"]["spec"]["backoffLimit"] == 0
            (container,) = pod["containers"]
            assert container["name"] == "node" and container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    mpi = RUNTIMES[MPI_RUNTIME]["spec"]
    assert mpi["mlPolicy"]["mpi"] == {"numProcPerNode": 1, "mpiImplementation": "OpenMPI",
                                      "sshAuthMountPath": "/home/gpt2bench/.ssh", "runLauncherAsNode": True}
    node, launcher = mpi["template"]["spec"]["replicatedJobs"]
    assert (node["name"], launcher["name"]) == ("node", "launcher")
    assert launcher["dependsOn"] == [{"name": "node", "status": "Ready"}]
    assert launcher["template"]["metadata"]["labels"] == {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    sshd = node["template"]["spec"]["template"]["spec"]["containers"][0]
    assert sshd["command"] + sshd["args"] == ["/usr/sbin/sshd", "-De", "-f", "/home/gpt2bench/.sshd_config",
                                              "-o", "SetEnv=GPT2BENCH_NODE_NAME=$(GPT2BENCH_NODE_NAME)"]
    assert sshd["readinessProbe"]["tcpSocket"]["port"] == 2222
    assert mpi["template"]["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["launcher"]}
    # the same on GPUs, with the CUDA image in the sshd pods (where the ranks run)
    cuda = RUNTIMES[MPI_GPU_RUNTIME]
    assert cuda["spec"]["mlPolicy"] == RUNTIMES[MPI_RUNTIME]["spec"]["mlPolicy"]
    cuda_sshd = cuda["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert cuda_sshd["containers"][0]["image"] == DEFAULT_GPU_IMAGE and sshd["image"] == DEFAULT_IMAGE
    assert (cuda["metadata"]["labels"][IMAGE_LABEL], RUNTIMES[MPI_RUNTIME]["metadata"]["labels"][IMAGE_LABEL]) == (
        "gpu", "cpu")
    # one node: the launcher alone, which trains (runLauncherAsNode), no sshd pod holding GPUs
    one = RUNTIMES[MPI_ONE_NODE_RUNTIME]["spec"]
    (launcher,) = one["template"]["spec"]["replicatedJobs"]
    assert launcher["name"] == "launcher" and "dependsOn" not in launcher
    assert launcher["template"]["metadata"]["labels"] == {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    assert one["mlPolicy"] == mpi["mlPolicy"]
    assert all("podGroupPolicy" not in runtime["spec"] for runtime in RUNTIMES.values())
    gang = project_runtimes(pod_group_policy={"coscheduling": {"scheduleTimeoutSeconds": 120}})
    for runtime in gang.values():
        validate_job(runtime)
        assert runtime["spec"]["podGroupPolicy"] == {"coscheduling": {"scheduleTimeoutSeconds": 120}}


def test_runtime_problems_names_a_foreign_sshd_image_and_missing_jobs():
    spec = {"sweep": {"strategies": [{"name": "horovod"}], "scales": [{"nodes": 2}]}, "image": "registry/mine:1"}
    job = render_all(benchmark(spec))[0]
    (problem,) = runtime_problems(job, RUNTIMES[MPI_RUNTIME])
    assert "'node' pods (where the ranks run)" in problem and "registry/mine:1" in problem
    assert runtime_problems(job, mpi_runtime(image="registry/mine:1")) == []
    one_node = render_all(benchmark({**spec, "sweep": {"strategies": [{"name": "horovod"}]}}))[0]
    assert one_node["spec"]["runtimeRef"]["name"] == MPI_ONE_NODE_RUNTIME
    assert runtime_problems(one_node, RUNTIMES[MPI_ONE_NODE_RUNTIME]) == []  # the launcher runs the TrainJob's image
    torch_job = render_all(benchmark({"sweep": {"strategies": [{"name": "ddp"}]}}))[0]
    upstream = yaml.safe_load((UPSTREAM_RUNTIMES / "torch_distributed.yaml").read_text())
    upstream["metadata"]["name"] = TORCH_RUNTIME
    upstream["spec"]["template"]["spec"]["replicatedJobs"][0]["name"] = "trainer"
    assert runtime_problems(torch_job, upstream) == ["runtime gpt2bench-torch has no replicated job 'node'"]


# -- TrainJobs ----------------------------------------------------------------------------------------------


def test_torch_trainjob_points_at_the_torch_runtime_and_calls_torchrun():
    spec = {"sweep": {"strategies": [{"name": "ddp"}], "scales": [{"nodes": 3, "processesPerNode": 2}]},
            "resources": {"requests": {"cpu": "2"}}, "runPolicy": {"activeDeadlineSeconds": 600}}
    (job,) = render_all(benchmark(spec))
    validate_job(job)
    assert (job["apiVersion"], job["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert job["metadata"]["name"] == "bench-ddp-fp32-3x2" and job["metadata"]["namespace"] == "perf"
    assert job["metadata"]["annotations"] == {"gpt2bench.io/result-replicated-job": "node"}
    assert job["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                                         "name": "gpt2bench-torch"}
    trainer = job["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (3, 2)
    assert trainer["command"][:5] == ["torchrun", "--no-python", "--", "gpt2bench", "train"]
    assert "--nnodes" not in trainer["command"]  # torchrun reads the PET_* the torch plugin injects
    assert flag(trainer["command"], "--output") == "$(GPT2BENCH_OUTPUT_DIR)"
    assert {"name": "GPT2BENCH_OUTPUT_DIR", "value": OUTPUT_DIR} in trainer["env"]
    assert not [e for e in trainer["env"] if e["name"].startswith("PET_")]
    # 2 processes per pod at the CPU default of 4 GiB each (render/pods.py, docs/security.md)
    assert trainer["resourcesPerNode"] == {"requests": {"cpu": "2"}, "limits": {"memory": "8Gi"}}
    assert job["spec"]["activeDeadlineSeconds"] == 600
    pod = patched(job, "node")
    assert pod["metadata"]["labels"]["gpt2bench.io/run"] == "bench-ddp-fp32-3x2"
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "9400"
    assert {"name": "output", "emptyDir": {"sizeLimit": output_size_limit(int(flag(trainer["command"], "--steps")))}} \
        in pod["spec"]["volumes"]
    assert pod["spec"]["containers"][0]["volumeMounts"][0] == {"name": "output", "mountPath": OUTPUT_DIR}
    assert {"name": "tmp", "mountPath": "/tmp"} in pod["spec"]["containers"][0]["volumeMounts"]  # read-only root
    effective = effective_pods(job)["node"]["spec"]
    assert restricted_problems(effective) == []
    assert effective["containers"][0]["command"] == trainer["command"]


def test_horovod_trainjob_runs_mpirun_on_the_mpi_runtime_with_gpus_on_every_host():
    spec = {"sweep": {"strategies": [{"name": "horovod"}], "precisions": ["fp16"],
                      "scales": [{"nodes": 2, "devicesPerNode": 4}]}}
    (job,) = render_all(benchmark(spec))
    validate_job(job)
    assert job["spec"]["runtimeRef"]["name"] == "gpt2bench-mpi-cuda"  # the sshd pods run the CUDA image
    assert job["metadata"]["annotations"] == {"gpt2bench.io/result-replicated-job": "launcher"}
    trainer = job["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 4)  # hosts x slots = 8 ranks
    command = trainer["command"]
    assert command[:6] == ["gpt2bench", "launch", "--wait-seconds", "2400", "--", "mpirun"] and flag(command, "-np") == "8"
    assert flag(command, "plm_rsh_args") == "-p 2222 -o ConnectionAttempts=10"  # the non-root sshd's port
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 4
    pods = effective_pods(job)
    assert set(pods) == {"node", "launcher"}
    for rjob, pod in pods.items():
        assert restricted_problems(pod["spec"]) == [], rjob
        (container,) = pod["spec"]["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 4, rjob  # runLauncherAsNode: both hosts
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert pods["launcher"]["spec"]["containers"][0]["command"] == command
    assert pods["node"]["spec"]["containers"][0]["command"] == ["/usr/sbin/sshd"]


def test_placement_and_kueue_go_where_trainer_v2_reads_them():
    spec = {"sweep": {"strategies": [{"name": "fsdp"}, {"name": "horovod"}], "scales": [{"nodes": 2}]},
            "nodeSelector": {"pool": "gpu"}, "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "scheduling": {"kueueQueue": "team-a"}, "metrics": {"podLabels": {"team": "ml"}}}  # fmt: skip
    for job in render_all(benchmark(spec)):
        validate_job(job)
        assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"  # Kueue reads the TrainJob's
        for rjob, pod in effective_pods(job).items():
            assert pod["spec"]["nodeSelector"] == {"pool": "gpu"}, rjob
            assert pod["spec"]["tolerations"] == spec["tolerations"]
            assert pod["metadata"]["labels"]["team"] == "ml"
            assert "kueue.x-k8s.io/queue-name" not in pod["metadata"]["labels"]


def test_pod_patch_carries_every_pod_template_field_but_what_the_spec_refuses_for_trainjobs():
    """What RunPods.template (render/pods.py) gives every rendered pod reaches TrainJob pods, except
    priorityClassName and hostNetwork, which a runtimePatch cannot hold: the spec refuses them with backend
    trainjob (and the operator, once `auto` resolved to it), naming the field."""
    spec = {"sweep": {"strategies": [{"name": "ddp"}], "scales": [{"nodes": 2, "devicesPerNode": 2}]},
            "nodeSelector": {"a": "b"}, "tolerations": [{"operator": "Exists"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]}}},
            "pods": {"imagePullSecrets": ["regcred"], "serviceAccountName": "bench", "capabilities": ["IPC_LOCK"],
                     "volumes": [{"name": "data", "mountPath": "/data", "persistentVolumeClaim": {"claimName": "c"}}]},
            "resources": {"limits": {"memory": "1Gi"}}}
    bench = test_render.benchmark({**spec, "scheduling": {"priorityClassName": "high"}, "pods": {
        **spec["pods"], "hostNetwork": True}})
    (run,) = plan_runs(bench)
    template = render_job(bench, run, backend="pytorchjob")["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
    patch, dropped = pod_patch(template)
    assert sorted(dropped) == ["pod.dnsPolicy", "pod.hostNetwork", "pod.priorityClassName"]
    for field in ("serviceAccountName", "imagePullSecrets", "affinity", "volumes", "nodeSelector", "tolerations"):
        assert patch["spec"][field] == template["spec"][field], field
    assert patch["spec"]["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    for refused, field in (({"scheduling": {"priorityClassName": "high"}}, "spec.scheduling.priorityClassName"),
                           ({"pods": {"hostNetwork": True}}, "spec.pods.hostNetwork")):
        with pytest.raises(SpecError) as error:
            benchmark({**spec, **refused})
        assert [path for path, _ in error.value.errors] == [field]
        assert "TrainJob" in error.value.errors[0][1]


def test_caveats_name_what_a_trainjob_cannot_apply():
    assert trainjob_caveats(benchmark({"sweep": {"strategies": [{"name": "ddp"}]}})) == []
    spec = {"sweep": {"strategies": [{"name": "horovod"}], "scales": [{"nodes": 2}]}, "image": "mine:1",
            "imagePullPolicy": "Always", "runPolicy": {"backoffLimit": 2, "ttlSecondsAfterFinished": 60},
            "metrics": {"port": 9500}, "scheduling": {"gang": True}}
    fields = [caveat.split(":")[0].split(" ")[0] for caveat in trainjob_caveats(benchmark(spec))]
    assert fields == ["spec.runPolicy.backoffLimit", "spec.runPolicy.ttlSecondsAfterFinished",
                      "spec.scheduling.gang/queue", "spec.metrics.port", "spec.imagePullPolicy", "spec.image"]
    # on one node horovod runs in the launcher, whose image is the TrainJob's: no image caveat
    one_node = {**spec, "sweep": {"strategies": [{"name": "horovod"}]}}
    assert not [caveat for caveat in trainjob_caveats(benchmark(one_node)) if caveat.startswith("spec.image:")]


@pytest.mark.parametrize("name", ["cpu-sweep.yaml", "gpu-papers.yaml"])
def test_examples_render_valid_trainjobs(name):
    jobs = render_all(load_benchmark_file(str(EXAMPLES / name)), "trainjob")
    for job in jobs:
        validate_job(job)
        for pod in effective_pods(job).values():
            assert restricted_problems(pod["spec"]) == []
    assert len({j["metadata"]["name"] for j in jobs}) == len(jobs)


# -- the CLI -----------------------------------------------------------------------------------------------


def test_render_cli_backend_flag_and_first_line(capsys):
    example = str(EXAMPLES / "cpu-sweep.yaml")
    assert main([example, "--backend", "trainjob"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("# backend: trainjob (--backend)\n")
    jobs = list(yaml.safe_load_all(out.out))
    sweep = yaml.safe_load((EXAMPLES / "cpu-sweep.yaml").read_text())["spec"]["sweep"]
    first_rounds = len(sweep["strategies"]) * len(sweep["precisions"]) * len(sweep["scales"]) * (1 + sweep["repeats"])
    # the breakdown round and the `repeats` rounds (rounds added until decided are rendered when added), a policy each
    assert len(jobs) == 2 * first_rounds and {j["kind"] for j in jobs} == {"TrainJob", "NetworkPolicy"}
    assert out.err == ""  # nothing in the CPU example that a TrainJob cannot apply
    assert main([example]) == 0  # spec.backend auto, rendered offline
    out = capsys.readouterr().out
    assert out.startswith("# backend: pytorchjob (spec.backend is auto") and "--backend" in out.splitlines()[0]
    assert {j["kind"] for j in yaml.safe_load_all(out)} == {"PyTorchJob", "MPIJob", "NetworkPolicy"}


def test_render_cli_follows_spec_backend_and_prints_caveats(tmp_path):
    document = yaml.safe_load((EXAMPLES / "gpu-papers.yaml").read_text())
    document["spec"]["backend"] = "trainjob"
    document["spec"]["scheduling"]["gang"] = True
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(document))
    done = subprocess.run([sys.executable, "-m", "gpt2bench", "render", str(path)], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("# backend: trainjob (spec.backend)")
    assert "note: spec.scheduling.gang/queue: a TrainJob is gang-scheduled by its runtime's podGroupPolicy" in done.stderr
    assert "note: spec.runPolicy.ttlSecondsAfterFinished is not applied" in done.stderr


# -- property: any valid spec renders only valid TrainJobs -----------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(spec=test_render.valid_specs, name=test_render.benchmark_names)
def test_any_valid_spec_renders_only_valid_restricted_trainjobs(spec, name):
    try:
        bench = benchmark(spec, name=name)
    except SpecError:
        assume(False)
    runs = plan_runs(bench)
    jobs = [render_job(bench, run) for run in runs]
    assert len({job["metadata"]["name"] for job in jobs}) == len(jobs)
    for run, job in zip(runs, jobs, strict=True):
        validate_job(job)
        assert job["metadata"]["name"] == run.job_name
        for pod in effective_pods(job).values():
            assert restricted_problems(pod["spec"]) == []
        assert TrainConfig.from_argv(run.trainer_args()) == run.train_config()
        trainer = job["spec"]["trainer"]
        if run.strategy.name == "horovod":
            assert trainer["numNodes"] * trainer["numProcPerNode"] == run.world_size
        else:
            assert trainer["numNodes"] * trainer["numProcPerNode"] == run.world_size + run.ps_servers


def test_render_cli_prints_the_runtimes_to_install(capsys):
    assert main(["--runtimes", "--image", "registry.example/gpt2bench:2",
                 "--gpu-image", "registry.example/gpt2bench:2-cuda"]) == 0
    runtimes = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [r["metadata"]["name"] for r in runtimes] == ["gpt2bench-torch", "gpt2bench-mpi", "gpt2bench-mpi-cuda",
                                                         "gpt2bench-mpi-one-node"]
    for runtime in runtimes:
        validate_job(runtime)
    assert runtimes == list(project_runtimes("registry.example/gpt2bench:2",
                                             "registry.example/gpt2bench:2-cuda").values())
    with pytest.raises(SystemExit):
        main([])  # neither a file nor --runtimes
