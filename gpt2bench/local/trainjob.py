"""A rendered TrainJob (Kubeflow Trainer v2) as local processes, built the way the Trainer builds its pods.

A TrainJob alone does not say what its pods look like; its runtime does. The runtime named by
`spec.runtimeRef` is looked up among `runtimes` (default: the project's own, gpt2bench.render.runtimes; for a
sweep's run `runtimes_for`, which adds the benchmark's own TrainingRuntime rendered with it)
and combined as the Trainer combines them (TR plugins/jobset/builder.go, trainingruntime.go): the trainer
job's container `node` takes trainer.image/command/args, has trainer.env upserted into its env and
resourcesPerNode merged over its resources. Then what the ML-policy plugin injects:

- torch (TR torch.go): numNodes processes, one per `node` pod, each with PET_NNODES, PET_NPROC_PER_NODE
  (numProcPerNode), PET_NODE_RANK (the pod's completion index), PET_MASTER_ADDR/PET_MASTER_PORT (here
  127.0.0.1 and a free port; in a cluster `<trainjob>-node-0-0.<trainjob>` and 29500), plus the Job
  controller's JOB_COMPLETION_INDEX. The container's own command (torchrun) reads the PET_*.
- MPI (TR mpi.go): the launcher only, with OMPI_MCA_orte_default_hostfile pointing at a local hostfile
  `localhost slots=<hosts x slots>` (the plugin lists `<hosts>` pods with numProcPerNode slots each: the
  `node` pods, and the launcher with runLauncherAsNode; the one-node runtime has the launcher alone),
  OMPI_MCA_orte_keep_fqdn_hostnames, OMPI_MCA_orte_set_default_slots and OMPI_MCA_plm_rsh_args. mpirun
  then starts every rank here, so the sshd `node` pods are not started (as for an MPIJob).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpt2bench import jobkinds as kinds
from gpt2bench.conventions import TRAINJOB_CONTAINER
from gpt2bench.local.replicas import JobSpecError, Replica, free_port, make_replica, share_machine

ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"


def _project_runtimes() -> dict[str, dict[str, Any]]:
    from gpt2bench.render.runtimes import project_runtimes  # the runtimes the project's TrainJobs name

    return project_runtimes()


def runtimes_for(benchmark: Any, run: Any) -> dict[str, dict[str, Any]]:
    """The runtimes a run's TrainJob may name here: the project's, and the benchmark's own TrainingRuntime that
    render_run puts before a TrainJob with resource claims (gpt2bench.render.run_runtimes). Its claims are not
    honoured here (no device is allocated: preflight says so once), as a device plugin's resources are not; its
    container's resources (the run's GPUs) are."""
    from gpt2bench.render import run_runtimes

    return {**_project_runtimes(), **{r["metadata"]["name"]: r for r in run_runtimes(benchmark, run)}}


def _runtime(job: dict[str, Any], runtimes: dict[str, dict[str, Any]] | None) -> dict[str, Any]:
    ref = kinds.runtime_ref(job) or {}
    runtimes = _project_runtimes() if runtimes is None else runtimes
    runtime = runtimes.get(ref.get("name"))
    if runtime is None or runtime.get("kind") != ref.get("kind", "ClusterTrainingRuntime"):
        raise JobSpecError(
            f"TrainJob runtime {ref.get('kind', 'ClusterTrainingRuntime')} {ref.get('name')!r} is not known here "
            f"(a local run knows {', '.join(sorted(runtimes))}): its pods cannot be built"
        )
    return runtime


def _trainer_container(runtime: dict[str, Any], trainer: dict[str, Any]) -> dict[str, Any]:
    """The trainer job's `node` container after the Trainer applied the TrainJob's `trainer` to it."""
    for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        labels = ((rjob["template"].get("metadata") or {}).get("labels")) or {}
        if labels.get(ANCESTOR_LABEL) != "trainer":
            continue
        for base in rjob["template"]["spec"]["template"]["spec"]["containers"]:
            if base["name"] == TRAINJOB_CONTAINER:
                return apply_trainer(base, trainer)
    raise JobSpecError(f"runtime {runtime['metadata']['name']} has no trainer job with a container named node")


def apply_trainer(container: dict[str, Any], trainer: dict[str, Any]) -> dict[str, Any]:
    """Image, command and args replace the runtime's; env is upserted by name; resources merge key by key (limits and
    requests: what decides the GPUs here)."""
    merged = {**container, **{k: trainer[k] for k in ("image", "command", "args") if k in trainer}}
    env = {item["name"]: item for item in container.get("env") or []}
    env.update({item["name"]: item for item in trainer.get("env") or []})
    merged["env"] = list(env.values())
    # limits and requests only: claims (a TrainingRuntime of the benchmark's own) allocate nothing here
    resources = {key: dict(value) for key, value in (container.get("resources") or {}).items()
                 if key in ("limits", "requests")}
    for key, values in (trainer.get("resourcesPerNode") or {}).items():
        resources.setdefault(key, {}).update(values)
    if resources:
        merged["resources"] = resources
    return merged


def _gpus(container: dict[str, Any]) -> int:
    resources = container.get("resources") or {}
    return int((resources.get("limits") or resources.get("requests") or {}).get("nvidia.com/gpu", 0) or 0)


def trainjob_replicas(
    job: dict[str, Any], run_dir: Path, runtimes: dict[str, dict[str, Any]] | None = None
) -> list[Replica]:
    spec = job.get("spec") or {}
    runtime = _runtime(job, runtimes)
    policy = runtime["spec"].get("mlPolicy") or {}
    trainer = spec.get("trainer") or {}
    container = _trainer_container(runtime, trainer)
    nodes = int(trainer.get("numNodes", policy.get("numNodes", 1)))
    name = job["metadata"]["name"]
    if "torch" in policy:
        nproc = str(trainer.get("numProcPerNode", "auto"))
        port = str(free_port())
        replicas = []
        for rank in range(nodes):
            injected = {
                "PET_NNODES": str(nodes),
                "PET_NPROC_PER_NODE": nproc,
                "PET_NODE_RANK": str(rank),
                "PET_MASTER_ADDR": "127.0.0.1",
                "PET_MASTER_PORT": port,
                "JOB_COMPLETION_INDEX": str(rank),
            }
            replicas.append(make_replica("Node", rank, container, injected, run_dir, name, _gpus(container)))
        return share_machine(replicas)
    if "mpi" in policy:
        mpi = policy["mpi"]
        if mpi.get("mpiImplementation", "OpenMPI") != "OpenMPI":
            raise JobSpecError(f"MPI implementation {mpi['mpiImplementation']!r} is not supported locally")
        slots = int(trainer.get("numProcPerNode", mpi.get("numProcPerNode", 1)))
        # the hosts of the hostfile the plugin writes: the `node` pods (if the runtime has that job), and the
        # launcher with runLauncherAsNode (the one-node runtime has only the launcher)
        as_node = bool(mpi.get("runLauncherAsNode"))
        has_nodes = any(rjob["name"] == "node" for rjob in runtime["spec"]["template"]["spec"]["replicatedJobs"])
        hosts = ((max(nodes - 1, 1) if as_node else nodes) if has_nodes else 0) + as_node
        run_dir.mkdir(parents=True, exist_ok=True)
        hostfile = run_dir / "hostfile"
        hostfile.write_text(f"localhost slots={hosts * slots}\n", encoding="utf-8")
        injected = {
            "OMPI_MCA_orte_default_hostfile": str(hostfile),
            "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
            "OMPI_MCA_orte_set_default_slots": str(slots),
            "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
            # the image's ENV (Dockerfile), as for the MPIJob: mpirun refuses root otherwise
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        }
        # The ranks run here, under mpirun: they need the GPUs of the pods whose slots they fill.
        launcher = make_replica("Launcher", 0, container, injected, run_dir, name, _gpus(container) * nodes)
        return share_machine([launcher], pods_each=hosts)
    raise JobSpecError(f"runtime {runtime['metadata']['name']}: only torch and MPI runtimes run locally")
