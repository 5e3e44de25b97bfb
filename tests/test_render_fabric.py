"""What a real GPU cluster needs of the rendered pods: the fabric's env, capabilities and volumes, the
registry's and the cluster's identity, the job objects' labels, the user OpenShift assigns, runs spread over
nodes, and GPUs held only by pods that train. Every field reaches every job kind: PyTorchJob and MPIJob as
written, TrainJob through its trainer and runtimePatch as Trainer v2.3 applies them (tests/kube/trainer_v2.py)."""

from __future__ import annotations

import copy

import pytest
from kube.trainer_v2 import build_jobset, pod_counts
from kubeflow_crds import validate_job
from pod_security import pod_templates, violations
from trainer_v2_rules import restricted_problems

from gpt2bench.plan import plan_runs
from gpt2bench.render import render_all, render_job
from gpt2bench.render.runtimes import project_runtimes
from gpt2bench.specification.validation import SpecError, load_benchmark

RUNTIMES = project_runtimes()
FABRIC = {
    "env": [{"name": "NCCL_SOCKET_IFNAME", "value": "eth0"},
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
    "volumes": [{"name": "corpus", "mountPath": "/data", "readOnly": True,
                 "persistentVolumeClaim": {"claimName": "corpus", "readOnly": True}}],
    "capabilities": ["IPC_LOCK"],
    "annotations": {"k8s.v1.cni.cncf.io/networks": "ib-sriov"},
    "labels": {"team": "ml"},
    "imagePullSecrets": ["regcred"],
    "serviceAccountName": "bench-runner",
}


def benchmark(spec: dict, backend: str = "pytorchjob"):
    document = {"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark",
                "metadata": {"name": "fab", "namespace": "perf"}, "spec": {**spec, "backend": backend}}
    return load_benchmark(document)


def every_kind(extra: dict, scales=({"nodes": 2, "devicesPerNode": 2},)) -> list[dict]:
    """A torch run and a horovod run at each scale, for both backends: PyTorchJob, MPIJob, TrainJob."""
    spec = {"sweep": {"strategies": [{"name": "ddp"}, {"name": "horovod"}], "scales": list(scales)}, **extra}
    return render_all(benchmark(spec)) + render_all(benchmark(spec, "trainjob"))


def pods_of(job: dict) -> dict[str, dict]:
    """Replica (v1 kinds) or replicated job (TrainJob, as the Trainer builds it) -> its pod template."""
    if job["kind"] != "TrainJob":
        return pod_templates(job)
    named = {**job, "metadata": {**job["metadata"], "uid": "uid"}}
    jobset = build_jobset(named, RUNTIMES[job["spec"]["runtimeRef"]["name"]])
    return {rjob["name"]: rjob["template"]["spec"]["template"] for rjob in jobset["spec"]["replicatedJobs"]}


def trains(job: dict, role: str) -> bool:
    return not (job["kind"] == "MPIJob" and role == "Launcher")


def env_of(container: dict) -> dict[str, dict]:
    return {item["name"]: item for item in container.get("env", [])}


# -- 1. the fabric: env, capabilities, volumes, networks --------------------------------------------------------


def test_every_training_container_gets_the_fabrics_env_volumes_capabilities_and_networks():
    jobs = every_kind({"pods": FABRIC})
    assert {job["kind"] for job in jobs} == {"PyTorchJob", "MPIJob", "TrainJob"}
    for job in jobs:
        validate_job(job)
        for role, pod in pods_of(job).items():
            where = f"{job['metadata']['name']} {role}"
            (container,) = pod["spec"]["containers"]
            env = env_of(container)
            assert env["NCCL_SOCKET_IFNAME"]["value"] == "eth0", where
            assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}, where
            assert env["GPT2BENCH_NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}, where
            assert {"name": "corpus", "mountPath": "/data", "readOnly": True} in container["volumeMounts"], where
            assert {"name": "corpus", "persistentVolumeClaim": {"claimName": "corpus", "readOnly": True}} in \
                pod["spec"]["volumes"], where
            assert pod["metadata"]["labels"]["team"] == "ml", where
            assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}], where
            assert pod["spec"]["serviceAccountName"] == "bench-runner", where
            assert pod["spec"]["automountServiceAccountToken"] is False, where  # identity, still no API token
            if not trains(job, role):  # an MPIJob's launcher: mpirun over the pod network, no fabric of its own
                assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}, where
                assert "k8s.v1.cni.cncf.io/networks" not in pod["metadata"].get("annotations", {}), where
                assert violations(pod) == [], where
                continue
            assert container["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}, where
            assert pod["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "ib-sriov", where
            # IPC_LOCK is outside "restricted": the opt-in the docs describe, and the only violation
            assert [v.split(":")[0] for v in violations(pod)] == ["capabilities"], where


def test_mpirun_forwards_the_users_env_to_every_rank_but_not_the_launchers_node():
    for job in every_kind({"pods": FABRIC}):
        if job["kind"] == "MPIJob":
            command = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]
        elif job["kind"] == "TrainJob" and job["spec"]["runtimeRef"]["name"].startswith("gpt2bench-mpi"):
            command = job["spec"]["trainer"]["command"]
        else:
            continue
        forwarded = [command[i + 1] for i, word in enumerate(command) if word == "-x"]
        assert {"NCCL_SOCKET_IFNAME", "HF_TOKEN", "PATH", "GPT2BENCH_OUTPUT_DIR"} <= set(forwarded)
        assert len(forwarded) == len(set(forwarded))
        assert "GPT2BENCH_NODE_NAME" not in forwarded  # each rank's own node comes from its pod's sshd


def test_remote_mpi_ranks_learn_their_own_node_from_their_pods_sshd():
    for job in every_kind({}):
        for role, pod in pods_of(job).items():
            (container,) = pod["spec"]["containers"]
            words = container.get("command", []) + container.get("args", [])
            if words[:1] == ["/usr/sbin/sshd"]:  # MPIJob workers, the MPI runtimes' `node` pods
                assert "SetEnv=GPT2BENCH_NODE_NAME=$(GPT2BENCH_NODE_NAME)" in words
                # the kubelet expands $(VAR) from the container's env: the variable must be there
                assert "GPT2BENCH_NODE_NAME" in env_of(container), (job["metadata"]["name"], role)


def test_a_users_variable_cannot_replace_what_the_pods_set():
    for name in ("GPT2BENCH_OUTPUT_DIR", "PET_NNODES", "MASTER_ADDR", "OMPI_MCA_plm_rsh_args", "NCCL_DEBUG_FILE"):
        with pytest.raises(SpecError) as error:
            benchmark({"sweep": {"strategies": [{"name": "ddp"}]}, "pods": {"env": [{"name": name, "value": "x"}]}})
        assert error.value.errors[0][0] == "spec.pods.env[0].name", name


def test_host_network_is_opt_in_with_cluster_dns_and_leaves_the_restricted_profile():
    for job in render_all(benchmark({"sweep": {"strategies": [{"name": "ddp"}, {"name": "horovod"}],
                                               "scales": [{"nodes": 2}]}, "pods": {"hostNetwork": True}})):
        validate_job(job)
        for pod in pod_templates(job).values():
            assert pod["spec"]["hostNetwork"] is True
            assert pod["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"  # rendezvous Services still resolve
            assert any(v.startswith("hostNamespaces") for v in violations(pod))
    for job in every_kind({}):  # the default: none of it
        for pod in pods_of(job).values():
            assert "hostNetwork" not in pod["spec"] and violations(pod) == []


# -- 2. placement: one node per training pod, user affinity passed through --------------------------------------


def _matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(key) == value for key, value in selector.get("matchLabels", {}).items())


def may_share_a_node(a: dict, b: dict) -> bool:
    """The scheduler's rule for required pod anti-affinity on kubernetes.io/hostname, both ways (what each pod's
    terms select among the other's labels); the pods' labels are the templates' plus what the Kubeflow
    controllers add (never a term's key)."""
    for pod, other in ((a, b), (b, a)):
        terms = (((pod["spec"].get("affinity") or {}).get("podAntiAffinity") or {})
                 .get("requiredDuringSchedulingIgnoredDuringExecution") or [])
        for term in terms:
            if term["topologyKey"] == "kubernetes.io/hostname" and _matches(term["labelSelector"],
                                                                             other["metadata"]["labels"]):
                return False
    return True


def test_a_multi_node_runs_training_pods_may_not_share_a_node_and_a_launcher_may():
    jobs = every_kind({}, scales=({"nodes": 2, "devicesPerNode": 4}, {"nodes": 1, "devicesPerNode": 4}))
    for job in jobs:
        pods = pods_of(job)
        training = [pod for role, pod in pods.items() if trains(job, role)]
        multi_node = len(plan_runs_of(job)) > 1
        name = job["metadata"]["name"]
        if not multi_node:
            assert all("affinity" not in pod["spec"] for pod in pods.values()), name
            continue
        # two replicas of the same template are two pods: each repels the other
        for a in training:
            for b in training:
                assert not may_share_a_node(a, copy.deepcopy(b)), name
        if job["kind"] == "MPIJob":
            assert may_share_a_node(pods["Launcher"], pods["Worker"])  # mpirun's pod trains nothing


def plan_runs_of(job: dict) -> list[int]:
    """The nodes a job's run has, as pod indices (from its name: ...-<nodes>x<per node>[g])."""
    size = job["metadata"]["labels"]["gpt2bench.io/run"].rsplit("-", 1)[-1]
    return list(range(int(size.split("x")[0])))


def test_spreading_can_be_turned_off_and_user_affinity_is_kept_beside_it():
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "node.kubernetes.io/instance-type", "operator": "In",
                                           "values": ["p5.48xlarge"]}]}]}},
                "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 10, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "other"}},
                                                       "topologyKey": "kubernetes.io/hostname"}}]}}
    for job in every_kind({"affinity": affinity}):
        for role, pod in pods_of(job).items():
            rendered = pod["spec"]["affinity"]
            # the node affinity picks GPU nodes: an MPIJob's launcher, which trains nothing, does not take it
            assert rendered.get("nodeAffinity") == (affinity["nodeAffinity"] if trains(job, role) else None)
            anti = rendered["podAntiAffinity"]
            assert anti["preferredDuringSchedulingIgnoredDuringExecution"] == \
                affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
            assert len(anti.get("requiredDuringSchedulingIgnoredDuringExecution", [])) == int(trains(job, role))
    for job in every_kind({"scheduling": {"spreadAcrossNodes": False}}):
        for pod in pods_of(job).values():
            assert "affinity" not in pod["spec"]


# -- 3. GPUs held only by pods that train -------------------------------------------------------------------


@pytest.mark.parametrize("nodes, gpus", [(1, 4), (2, 4), (3, 8)])
def test_a_runs_pods_hold_exactly_nodes_times_gpus_per_node_whatever_the_job_kind(nodes, gpus):
    """1 x 4 Horovod as a TrainJob held 8 GPUs (an sshd pod beside a launcher that trained nothing); an
    MPIJob's launcher holds none."""
    for job in every_kind({}, scales=({"nodes": nodes, "devicesPerNode": gpus},)):
        held = 0
        if job["kind"] == "TrainJob":
            named = {**job, "metadata": {**job["metadata"], "uid": "uid"}}
            runtime = RUNTIMES[job["spec"]["runtimeRef"]["name"]]
            counts = pod_counts(named, runtime)
            jobset = build_jobset(named, runtime)
            for rjob in jobset["spec"]["replicatedJobs"]:
                limits = rjob["template"]["spec"]["template"]["spec"]["containers"][0].get("resources", {})
                held += counts[rjob["name"]] * limits.get("limits", {}).get("nvidia.com/gpu", 0)
        else:
            for spec in job["spec"].get("pytorchReplicaSpecs", job["spec"].get("mpiReplicaSpecs")).values():
                limits = spec["template"]["spec"]["containers"][0]["resources"]["limits"]
                held += spec["replicas"] * limits.get("nvidia.com/gpu", 0)
        assert held == nodes * gpus, (job["metadata"]["name"], held)


# -- 4. pod plumbing: identity, labels, user ------------------------------------------------------------------


def test_job_objects_carry_the_users_labels_and_annotations_and_the_pods_do_not():
    extra = {"jobMetadata": {"labels": {"kueue.x-k8s.io/priority-class": "batch-low", "cost-centre": "r-and-d"},
                             "annotations": {"policy.example.com/owner": "ml-platform"}}}
    for job in every_kind(extra):
        assert job["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "batch-low"
        assert job["metadata"]["labels"]["cost-centre"] == "r-and-d"
        assert job["metadata"]["labels"]["gpt2bench.io/run"]  # the project's own stay
        assert job["metadata"]["annotations"]["policy.example.com/owner"] == "ml-platform"
        for pod in pods_of(job).values():
            assert "cost-centre" not in pod["metadata"]["labels"]
    with pytest.raises(SpecError) as error:
        benchmark({"sweep": {"strategies": [{"name": "ddp"}]}, "jobMetadata": {"labels": {"gpt2bench.io/run": "x"}}})
    assert error.value.errors[0][0] == "spec.jobMetadata.labels[gpt2bench.io/run]"


def test_the_user_can_be_left_to_the_platform_as_openshifts_restricted_scc_assigns_it():
    unset = {"pods": {"runAsUser": None, "runAsGroup": None, "fsGroup": None}}
    for job in every_kind(unset):
        for pod in pods_of(job).values():
            context = pod["spec"]["securityContext"]
            assert {"runAsUser", "runAsGroup", "fsGroup"}.isdisjoint(context)
            assert context["runAsNonRoot"] is True  # the kubelet checks the image's numeric USER 1000
            assert restricted_problems(pod["spec"]) == [] and violations(pod) == []
    for job in every_kind({}):  # by default the image's user, numerically
        for pod in pods_of(job).values():
            assert pod["spec"]["securityContext"]["runAsUser"] == 1000


def test_a_volume_at_a_cache_path_replaces_the_pods_emptydir_to_share_compile_caches():
    shared = {"pods": {"volumes": [{"name": "node-cache", "mountPath": "/home/gpt2bench/.cache",
                                    "hostPath": {"path": "/var/cache/gpt2bench", "type": "DirectoryOrCreate"}}]}}
    (job,) = render_all(benchmark({"sweep": {"strategies": [{"name": "ddp"}]}, **shared}))
    pod = pod_templates(job)["Master"]
    mounts = {m["mountPath"]: m["name"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["/home/gpt2bench/.cache"] == "node-cache" and mounts["/home/gpt2bench/.triton"] == "triton"
    assert "cache" not in {v["name"] for v in pod["spec"]["volumes"]}
    assert env_of(pod["spec"]["containers"][0])["TORCHINDUCTOR_CACHE_DIR"]["value"].startswith(
        "/home/gpt2bench/.cache/")  # inductor's kernels land in the shared volume
    assert [v.split(":")[0] for v in violations(pod)] == ["hostPathVolumes", "restrictedVolumes"]


@pytest.mark.parametrize("volume, field", [
    ({"name": "output", "mountPath": "/x", "emptyDir": {}}, "spec.pods.volumes[0].name"),
    ({"name": "x", "mountPath": "/var/run/gpt2bench/output", "emptyDir": {}}, "spec.pods.volumes[0].mountPath"),
    ({"name": "x", "mountPath": "/x"}, "spec.pods.volumes[0]"),
    ({"name": "x", "mountPath": "/x", "emptyDir": {}, "secret": {"secretName": "s"}}, "spec.pods.volumes[0]"),
    ({"name": "x", "mountPath": "data", "emptyDir": {}}, "spec.pods.volumes[0].mountPath"),
    ({"name": "x", "mountPath": "/x", "subPath": "../etc", "emptyDir": {}}, "spec.pods.volumes[0].subPath"),
])
def test_a_volume_the_pods_cannot_take_is_refused_naming_the_field(volume, field):
    with pytest.raises(SpecError) as error:
        benchmark({"sweep": {"strategies": [{"name": "ddp"}]}, "pods": {"volumes": [volume]}})
    assert field in [path for path, _ in error.value.errors]


def test_every_fabric_setting_renders_a_valid_job_for_every_run_of_the_gpu_example():
    from pathlib import Path

    import yaml

    document = yaml.safe_load((Path(__file__).resolve().parents[1] / "manifests" / "examples" /
                               "gpu-papers.yaml").read_text())
    document["spec"]["pods"] = FABRIC
    for backend in ("pytorchjob", "trainjob"):
        bench = load_benchmark({**document, "spec": {**document["spec"], "backend": backend}})
        for run in plan_runs(bench):
            validate_job(render_job(bench, run))


@pytest.mark.parametrize("env, fabric, expected", [
    ({"NCCL_NET_GDR_LEVEL": "SYS"}, {"require": "rdma"}, True),       # AKS's fragment
    ({"FI_EFA_USE_DEVICE_RDMA": "1"}, {"require": "rdma"}, True),     # EKS's
    ({"NCCL_NET_GDR_LEVEL": "LOC"}, {}, False),                       # GPUDirect turned off
    ({"FI_EFA_USE_DEVICE_RDMA": "0"}, {}, False),
    ({"NCCL_NET_GDR_LEVEL": "SYS"}, {"gpuDirectRdma": False}, False),  # the spec's own word wins
    ({"NCCL_NET_GDR_LEVEL": "SYS"}, {"require": "none"}, False),      # a socket baseline checks nothing
    ({}, {"gpuDirectRdma": True}, True),
    ({}, {}, False),
])  # fmt: skip
def test_gpudirect_is_checked_where_the_pods_env_promises_it(env, fabric, expected):
    """The fragments ask NCCL/libfabric for GPUDirect RDMA (AKS NCCL_NET_GDR_LEVEL=SYS, EKS
    FI_EFA_USE_DEVICE_RDMA=1) but none asked the trainer to check it, so a run on NET/IB without /GDRDMA
    (nvidia-peermem not loaded) measured a degraded path."""
    from gpt2bench.render.pods import fabric_env
    from gpt2bench.specification.validation import load_benchmark

    bench = load_benchmark({"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark", "metadata": {"name": "g"},
                            "spec": {"fabric": fabric, "sweep": {"strategies": [{"name": "ddp"}]},
                                     "pods": {"env": [{"name": k, "value": v} for k, v in env.items()]}}})
    assert (fabric_env(bench).get("GPT2BENCH_GPUDIRECT_RDMA") == "1") is expected
