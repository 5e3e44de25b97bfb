"""Horovod's Open MPI, as the MPI launchers run it: its transport pinned as AWS's reference MPIJob
pins it (the ob1 PML over TCP, never UCX or libfabric's), its interfaces kept to the pod network on pods with a
fabric's extra interfaces (GKE's ten), and MPI_Init bounded like Horovod's other waits."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
from test_clusters import cluster_benchmark
from test_render_fabric import pods_of

from gpt2bench.render import render_all
from gpt2bench.specification.validation import load_benchmark


def mca(command: list[str]) -> dict[str, str]:
    return {command[i + 1]: command[i + 2] for i, word in enumerate(command) if word == "-mca"}


def launcher_commands(bench) -> list[tuple[dict, list[str]]]:
    found = []
    for job in render_all(bench):
        if job["kind"] == "MPIJob":
            found.append((job, pods_of(job)["Launcher"]["spec"]["containers"][0]["command"]))
        elif job["kind"] == "TrainJob" and job["spec"]["runtimeRef"]["name"].startswith("gpt2bench-mpi"):
            found.append((job, job["spec"]["trainer"]["command"]))
    return found


def horovod(devices: int, backend: str = "pytorchjob", **pods):
    return load_benchmark({"apiVersion": "gpt2bench.io/v1alpha1", "kind": "GPT2Benchmark", "metadata": {"name": "h"},
                           "spec": {"backend": backend, "pods": pods, "sweep": {"strategies": [{"name": "horovod"}],
                                    "scales": [{"nodes": 2, **({"devicesPerNode": devices} if devices else
                                                               {"processesPerNode": 1})}]}}})


@pytest.mark.parametrize("backend", ["pytorchjob", "trainjob"])
def test_open_mpi_runs_ob1_over_tcp_never_ucx(backend):
    for devices, btl in ((4, "tcp,self"), (0, "self,vader,tcp")):
        commands = launcher_commands(horovod(devices, backend))
        assert commands
        for _job, command in commands:
            pinned = mca(command)
            assert pinned["pml"] == "ob1" and pinned["btl"] == btl, command
            assert command.index("btl") < command.index("train")  # mpirun's options, not the trainer's


@pytest.mark.skipif(shutil.which("ompi_info") is None, reason="needs Open MPI's ompi_info")
def test_every_pinned_component_is_one_open_mpi_has():
    """The names are Open MPI's own (Debian's 4.1 here, Ubuntu's in the CUDA image): a typo would make mpirun
    refuse every run."""
    listed = subprocess.run(["ompi_info"], capture_output=True, text=True, check=True, timeout=60).stdout
    for command in (c for devices in (0, 4) for _job, c in launcher_commands(horovod(devices))):
        pinned = mca(command)
        assert f"MCA pml: {pinned['pml']} " in listed
        for component in pinned["btl"].split(","):
            assert f"MCA btl: {component} " in listed, component


def test_gke_multi_interface_pods_keep_open_mpi_on_their_default_interface():
    """GKE A3 Ultra's pods have eth0..eth9 (gvnic-1 and the rdma-0..7 networks); the fragment sets no
    NCCL_SOCKET_IFNAME (gIB's script does, for NCCL), so Open MPI follows the pod's default-interface annotation:
    without it mpirun tries the RDMA NICs, which the launcher's pod does not have."""
    for _job, command in launcher_commands(cluster_benchmark("gke-a3-ultra", "pytorchjob")):
        pinned = mca(command)
        assert pinned["btl_tcp_if_include"] == pinned["oob_tcp_if_include"] == "eth0", command
    multus = horovod(4, annotations={"k8s.v1.cni.cncf.io/networks": "rdma-net-ipam"})
    for _job, command in launcher_commands(multus):
        assert mca(command)["oob_tcp_if_include"] == "eth0"
    for _job, command in launcher_commands(horovod(4)):  # one interface: nothing to choose
        assert "btl_tcp_if_include" not in mca(command)


FAKE_HOROVOD = textwrap.dedent("""
    import sys, time, types
    torch_module = types.ModuleType("horovod.torch")
    torch_module.init = lambda: time.sleep(120)  # MPI_Init waiting for a rank that never joins
    torch_module.is_initialized = lambda: False
    sys.modules["horovod"] = types.ModuleType("horovod")
    sys.modules["horovod.torch"] = torch_module
    from gpt2bench.trainer.config import parse_config
    from gpt2bench.trainer.env import detect_env
    from gpt2bench.trainer.parallel.horovod import HorovodParallelism
    config = parse_config(["--strategy", "horovod", "--timeout-seconds", "2", "--output", sys.argv[1]])
    HorovodParallelism(config, detect_env({})).setup()
    print("setup returned")
""")


def test_mpi_init_that_never_completes_ends_the_rank_within_the_timeout(tmp_path):
    started = subprocess.run([sys.executable, "-c", FAKE_HOROVOD, str(tmp_path)], capture_output=True, text=True,
                             timeout=60, check=False)
    assert started.returncode == 1, started.stderr
    assert "setup returned" not in started.stdout
    assert "horovod: MPI_Init (hvd.init) waited more than 2 s (--timeout-seconds)" in started.stderr


# One write per line (print's pieces are separate writes unbuffered, and two ranks' output interleaved mid-line)
HOROVOD_ALLREDUCE = ("import horovod.torch as hvd, torch, sys; hvd.init(); "
                     "sys.stdout.write(f'allreduce {hvd.rank()} {hvd.allreduce(torch.ones(2) * (hvd.rank() + 1)).tolist()}\\n')")


@pytest.mark.slow  # two real MPI ranks per transport
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="needs Open MPI's mpirun")
@pytest.mark.parametrize("devices", [0, 4])
def test_the_pinned_transport_runs_horovod_over_real_open_mpi(devices, tmp_path):
    """The rendered mpirun's own options, as the launcher passes them, start two Horovod ranks that init and
    all-reduce over Open MPI (its MPI controller), with the GPU runs' btl (tcp,self) and the CPU runs' alike."""
    horovod_torch = pytest.importorskip("horovod.torch")
    if not horovod_torch.mpi_built():
        pytest.skip("Horovod built without MPI")
    from gpt2bench.plan import plan_runs
    from gpt2bench.render.mpijob import mpirun_command

    (run,) = plan_runs(horovod(devices))
    command = mpirun_command(run)
    options = command[command.index("mpirun") + 1:command.index("gpt2bench", 1)]
    options[options.index("-np") + 1] = "2"
    local = ["--oversubscribe", *(["--allow-run-as-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else [])]
    done = subprocess.run(["mpirun", *local, *options, sys.executable, "-c", HOROVOD_ALLREDUCE], capture_output=True,
                          text=True, timeout=240, check=False, cwd=tmp_path, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    # the two ranks' lines may interleave on mpirun's stdout
    assert sorted(re.findall(r"allreduce \d \[[\d., ]+\]", done.stdout)) == [
        "allreduce 0 [1.5, 1.5]", "allreduce 1 [1.5, 1.5]"], done.stdout
