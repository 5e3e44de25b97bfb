"""What a run expects of its fabric, checked by the trainer (trainer/memlock.py, trainer/fabric.py, docs/clusters.md):
the memory RDMA may pin, read from the process itself and failing at once where a fabric was asked for; NCCL's
fall-back to sockets caught after the first step and stopping every rank together; the node's NCCL settings
sourced; parameter servers' gloo/TCP recorded. Unit tests, then real trainer processes on this CPU: one under the
credentials the rendered pods run with (uid 1000, IPC_LOCK only in the bounding and inheritable sets), one reading
an NCCL log as NCCL writes it (the --nccl-log test hook)."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess

import pytest

from gpt2bench.trainer.fabric import (
    FabricPolicy,
    apply_nccl_env_script,
    fabric_summary,
    fallback_reason,
    loaded_nccl_library,
    parse_nccl_log,
    transport_problems,
)
from gpt2bench.trainer.memlock import (
    CAP_IPC_LOCK,
    PinnedMemory,
    effective_capabilities,
    rdma_devices,
    read_pinned_memory,
)

# Lines as NCCL 2.2x prints them (the formats tests/test_fabric.py takes from NCCL's issue trackers).
SOCKET_LOG = """\
nodeA:1:1 [0] NCCL INFO Using network Socket
nodeA:1:1 [0] NCCL INFO Channel 00/0 : 7[7] -> 0[0] [receive] via NET/Socket/0
nodeA:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC
"""
IB_LOG = """\
nodeA:1:1 [0] NCCL INFO Using network IB
nodeA:1:1 [0] NCCL INFO Channel 00/0 : 7[7] -> 0[0] [receive] via NET/IB/0/GDRDMA
"""
IB_NO_GDR_LOG = """\
nodeA:1:1 [0] NCCL INFO Using network IB
nodeA:1:1 [0] NCCL INFO Channel 00/0 : 7[7] -> 0[0] [receive] via NET/IB/0
"""
INSIDE_A_NODE = "nodeA:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC\n"
# What NCCL 2.21 logs at init on a node whose pod got no verbs device (the lines as NCCL's issue trackers show them).
NO_IB_DEVICE_LOG = """\
nodeA:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4
nodeA:1:1 [0] NCCL INFO NET/IB : No device found.
"""


# -- pinned memory -----------------------------------------------------------------------------------


def test_capeff_is_read_from_proc_status_and_ipc_lock_is_bit_14():
    status = "Name:\tpython\nCapInh:\t0000000000004000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n"
    assert effective_capabilities(status) == 0  # the reproduction of kubernetes#56374: inheritable only
    assert effective_capabilities("CapEff:\t0000000000004000\n") >> CAP_IPC_LOCK & 1 == 1


def test_rdma_devices_are_the_verbs_nodes_by_their_device_name(tmp_path):
    dev, sysfs = tmp_path / "dev", tmp_path / "sys"
    dev.mkdir()
    for index, name in ((0, "mlx5_0"), (1, "mlx5_1")):
        (dev / f"uverbs{index}").touch()
        (sysfs / f"uverbs{index}").mkdir(parents=True)
        (sysfs / f"uverbs{index}" / "ibdev").write_text(name + "\n")
    (dev / "uverbs2").touch()  # no sysfs entry: its node name
    assert rdma_devices(dev, sysfs) == ["mlx5_0", "mlx5_1", "uverbs2"]
    assert rdma_devices(tmp_path / "none", sysfs) == []


@pytest.mark.parametrize("memlock, ipc_lock, devices, problems", [
    (8 * 2**20, False, ["mlx5_0"], ["may lock only RLIMIT_MEMLOCK 8 MiB, CAP_IPC_LOCK not effective"]),
    (8 * 2**20, True, ["mlx5_0"], []),   # the capability lifts the limit (a root process with IPC_LOCK)
    (None, False, ["mlx5_0"], []),       # unlimited: the node's runtime was fixed
    (16 * 2**30, False, ["efa_0"], []),  # AWS's threshold
    (None, False, [], ["no RDMA device"]),
    (65536, False, [], ["64 KiB", "no RDMA device"]),
])  # fmt: skip
def test_what_blocks_rdma_is_named_with_its_node_level_fix(memlock, ipc_lock, devices, problems):
    found = PinnedMemory(memlock, ipc_lock, devices).problems()
    assert len(found) == len(problems)
    for text, expected in zip(found, problems):
        assert expected.replace("64 KiB", "0.0625 MiB") in text
        if "lock only" in text:
            assert "LimitMEMLOCK=infinity" in text and "default_ulimits" in text and "#56374" in text


def test_this_process_reads_its_own_limits():
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    pinned = read_pinned_memory()
    assert pinned.memlock_bytes == (None if soft == resource.RLIM_INFINITY else soft)
    assert pinned.ipc_lock == bool(effective_capabilities(open("/proc/self/status").read()) >> CAP_IPC_LOCK & 1)


def test_the_run_records_its_lowest_limit_and_whether_every_rank_can_lock_enough():
    ranks = [{"job_rank": 0, "memlock_bytes": None, "ipc_lock": False, "rdma_devices": ["mlx5_0"]},
             {"job_rank": 1, "memlock_bytes": 8 * 2**20, "ipc_lock": False, "rdma_devices": ["mlx5_1"]}]
    summary, notes = fabric_summary(ranks, nodes_asked=2, on_gpu=True)
    assert summary["memlock_bytes"] == 8 * 2**20 and summary["can_lock_memory"] is False
    assert summary["rdma_devices"] == ["mlx5_0", "mlx5_1"]
    assert any("may lock only 8 MiB" in note and "Pinned memory" in note for note in notes)
    fine, notes = fabric_summary([{**ranks[0], "job_rank": r} for r in (0, 1)], nodes_asked=2, on_gpu=True)
    assert fine["memlock_bytes"] is None and fine["can_lock_memory"] is True and not notes


# -- the policy, the node's NCCL script ----------------------------------------------------------------


def test_the_policy_comes_from_the_pods_env_and_a_bad_value_is_refused():
    assert FabricPolicy.from_env({}) == FabricPolicy("auto", False, None)
    assert FabricPolicy.from_env({"GPT2BENCH_FABRIC": "rdma", "GPT2BENCH_GPUDIRECT_RDMA": "1",
                                  "GPT2BENCH_NCCL_ENV_SCRIPT": "/x.sh"}) == FabricPolicy("rdma", True, "/x.sh")
    with pytest.raises(RuntimeError, match="GPT2BENCH_FABRIC='ib'"):
        FabricPolicy.from_env({"GPT2BENCH_FABRIC": "ib"})
    assert not FabricPolicy("auto").checks_transport(1) and FabricPolicy("auto").checks_transport(2)
    assert not FabricPolicy("none").checks_transport(2)


def test_the_nodes_nccl_script_is_sourced_and_the_specs_own_values_win(tmp_path):
    script = tmp_path / "set_nccl_env.sh"
    script.write_text("export NCCL_NET=gIB\nexport NCCL_CROSS_NIC=0\nexport NCCL_IB_QPS_PER_CONNECTION=4\n"
                      "export PATH=/elsewhere\necho sourced\n")
    environ = {"PATH": os.environ["PATH"], "NCCL_CROSS_NIC": "1"}  # the spec's pods.env set this one
    applied = apply_nccl_env_script(str(script), environ)
    assert applied == ["NCCL_IB_QPS_PER_CONNECTION", "NCCL_NET"]
    assert environ["NCCL_NET"] == "gIB" and environ["NCCL_CROSS_NIC"] == "1" and environ["PATH"] != "/elsewhere"
    with pytest.raises(RuntimeError, match=r"ncclEnvScript: sourcing /nonexistent/set_nccl_env.sh failed"):
        apply_nccl_env_script("/nonexistent/set_nccl_env.sh", dict(environ))


# -- the first step's transport ---------------------------------------------------------------------------


@pytest.mark.parametrize("log, policy, flags", [
    (SOCKET_LOG, FabricPolicy("auto"), [1.0, 0.0]),
    (IB_LOG, FabricPolicy("auto"), [0.0, 0.0]),
    (IB_NO_GDR_LOG, FabricPolicy("auto"), [0.0, 0.0]),
    (IB_NO_GDR_LOG, FabricPolicy("rdma", gpudirect_rdma=True), [0.0, 1.0]),
    (IB_LOG, FabricPolicy("rdma", gpudirect_rdma=True), [0.0, 0.0]),
    (INSIDE_A_NODE, FabricPolicy("rdma", gpudirect_rdma=True), [0.0, 0.0]),  # this rank has no peer on another node
])  # fmt: skip
def test_each_rank_flags_what_its_own_log_shows(log, policy, flags):
    assert transport_problems(parse_nccl_log(log), policy) == flags


def test_the_workers_mean_flags_become_one_reason_or_none():
    reason = fallback_reason([2 / 16, 0.0], 16, FabricPolicy("auto"))
    assert reason.startswith("NCCL reached the other nodes over sockets (NET/Socket) on 2 of 16 ranks")
    assert "stopped at start, after the warm-up collective" in reason and "`none` runs a socket baseline" in reason
    assert "GPUDirect" in fallback_reason([0.0, 0.25], 8, FabricPolicy("rdma", gpudirect_rdma=True))
    assert fallback_reason([0.0, 0.0], 16, FabricPolicy("auto")) is None


def test_parameter_servers_across_nodes_record_gloo_over_tcp_and_warn_on_gpus():
    ranks = [{"job_rank": r, "node_name": f"n{r}"} for r in range(2)]
    summary, notes = fabric_summary(ranks, nodes_asked=2, on_gpu=True, between_nodes="gloo/TCP")
    assert summary["transport"] == "gloo/TCP" and any("gloo (TCP)" in note for note in notes)
    summary, notes = fabric_summary(ranks, nodes_asked=2, on_gpu=False, between_nodes="gloo/TCP")
    assert summary["transport"] == "gloo/TCP" and notes == []
    one_node, _ = fabric_summary(ranks[:1], nodes_asked=1, on_gpu=True, between_nodes="gloo/TCP")
    assert one_node["transport"] is None


# -- real trainer processes ---------------------------------------------------------------------------


def open_folder(path):
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o777)
    return path


AS_THE_POD = ["setpriv", "--reuid=1000", "--regid=1000", "--clear-groups", "--inh-caps=-all,+ipc_lock",
              "--bounding-set=-all,+ipc_lock", "--no-new-privs"]
# Where uid 1000 cannot reach this machine's Python (a home folder of mode 0700): root without CAP_IPC_LOCK in
# any set, which the kernel's memlock check treats alike (the limit applies to any process without the capability).
WITHOUT_IPC_LOCK = ["setpriv", "--inh-caps=-all", "--bounding-set=-ipc_lock", "--no-new-privs"]


def credentials_of_the_pod(program: list[str]) -> list[str]:
    probe = subprocess.run([*AS_THE_POD, *program, "--help"], capture_output=True, check=False, timeout=60)
    return AS_THE_POD if probe.returncode == 0 else WITHOUT_IPC_LOCK


@pytest.mark.slow  # real trainer processes (make test-fast skips the multi-process tests)
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv to start "
                    "the trainer with the rendered pods' credentials")
def test_a_trainer_started_as_the_pods_are_fails_at_once_where_rdma_was_asked_for(run_trainer, tmp_path):
    """As a container runtime starts the rendered pod's process: uid 1000, IPC_LOCK in the bounding and
    inheritable sets only, no new privileges (allowPrivilegeEscalation: false), and the 8 MiB memlock limit
    containerd hands containers by default. CAP_IPC_LOCK is not in effect; with spec.fabric.require rdma the
    trainer stops before any process group, saying why and how to fix it where the operator reads a run's
    reason."""
    from conftest import gpt2bench_executable

    program = ["prlimit", "--memlock=8388608:8388608", "--", gpt2bench_executable()]
    launcher = [*credentials_of_the_pod(program), *program, "train"]
    home, output = open_folder(tmp_path / "home"), open_folder(tmp_path / "out")
    run = run_trainer(["--strategy", "single", "--steps", "3", "--output", str(output)], launcher=launcher,
                      env={"GPT2BENCH_FABRIC": "rdma", "HOME": str(home), "TMPDIR": str(home),
                           "GPT2BENCH_TERMINATION_LOG": str(home / "termination-log")}, expect_rc=1)
    assert run.summary is not None, run.describe()
    reason = run.summary["reason"]
    assert reason.startswith("spec.fabric.require rdma, but this process may lock only RLIMIT_MEMLOCK 8 MiB, "
                             "CAP_IPC_LOCK not effective"), reason
    assert "LimitMEMLOCK=infinity" in reason and "no RDMA device" in reason
    assert run.summary["can_lock_memory"] is False and run.summary["memlock_bytes"] == 8 * 2**20
    assert run.steps == []  # no step ran
    assert "spec.fabric.require rdma" in (home / "termination-log").read_text()


def two_nodes(start_trainer, fork_server: str | None, args: list[str], env: dict[str, str], per_node: int = 1):
    """Two torchrun "nodes" of `per_node` processes each (each its own torchrun, as two pods are), forked from the
    session's fork server where one serves."""
    from conftest import free_port, torchrun_prefix

    port = free_port()

    def node(rank: int):
        launcher = torchrun_prefix(per_node, port, forked=bool(fork_server), nodes=2, node_rank=rank)
        return start_trainer(args, launcher=launcher, env=env, expect_rc=None)

    first, second = node(0), node(1)
    second.wait()
    return first.wait()


@pytest.mark.slow  # real trainer processes (make test-fast skips the multi-process tests)
def test_a_multi_node_run_whose_nccl_fell_back_to_sockets_stops_before_its_first_step(start_trainer, fork_server,
                                                                                        tmp_path):
    """Each rank reads a log as NCCL writes it (the --nccl-log test hook; on CPU the warm-up collective and the one
    that settles it are gloo's): a channel over NET/Socket to the other node, and NCCL saying why. The ranks agree
    right after the process group, before any step (no model compiled, no step recorded), quoting NCCL's cause;
    with spec.fabric.require none the same run goes on and says which transport it measured."""
    (tmp_path / "socket.log").write_text(NO_IB_DEVICE_LOG + SOCKET_LOG)
    args = ["--strategy", "ddp", "--steps", "6", "--warmup-steps", "2", "--no-breakdown",
            "--nccl-log", str(tmp_path / "socket.log")]
    run = two_nodes(start_trainer, fork_server, args, {})
    assert run.returncode == 1 and run.summary["status"] == "failed", run.describe()
    reason = run.summary["reason"]
    assert reason.startswith("NCCL reached the other nodes over sockets (NET/Socket) on 2 of 2 ranks")
    assert "(NCCL said: 'NET/IB : No device found.')" in reason and "stopped at start" in reason
    assert run.steps == [] and run.summary["compile_seconds"] == 0.0  # no step ran, nothing was compiled
    assert run.summary["transport"] == "NET/Socket" and run.summary["can_lock_memory"] is not None
    assert run.summary["nccl_versions"] == ["2.21.5+cuda12.4"] * 2
    assert run.summary["nccl_causes"] == ["NET/IB : No device found."]
    baseline = two_nodes(start_trainer, fork_server, args, {"GPT2BENCH_FABRIC": "none", "GPT2BENCH_POD_CPUS": "2"})
    assert baseline.returncode == 0 and baseline.summary["status"] == "succeeded", baseline.describe()
    assert baseline.summary["transport"] == "NET/Socket" and "over sockets (NET/Socket)" in baseline.summary["note"]
    from gpt2bench.trainer.cores import available_cpus

    assert baseline.summary["compile_threads"] == min(2, available_cpus())  # one rank per "node": its whole budget


@pytest.mark.slow  # four trainer processes
def test_parameter_servers_across_two_nodes_report_gloo_over_tcp(start_trainer, fork_server):
    """ps's messages are gloo's whatever the devices: a run across two "nodes" (a server and a worker on each)
    records gloo/TCP as its transport, as NCCL runs record theirs."""
    run = two_nodes(start_trainer, fork_server, ["--strategy", "ps", "--ps-servers", "2", "--steps", "3",
                                                 "--warmup-steps", "1", "--no-breakdown"], {}, per_node=2)
    assert run.returncode == 0 and run.summary["status"] == "succeeded", run.describe()
    assert run.summary["transport"] == "gloo/TCP"


# -- NCCL's own words, and the NCCL each rank loaded ----------------------------------------------------------

PLUGIN_NOT_LOADED_LOG = """\
nodeA:1:1 [0] NCCL INFO NCCL version 2.23.4+cuda12.6
nodeA:1:1 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.
nodeA:1:1 [0] NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0' (no module)
nodeA:1:1 [0] NCCL INFO Using network IB
nodeA:1:1 [0] NCCL INFO Channel 00/0 : 7[7] -> 0[0] [receive] via NET/IB/0
"""


def test_nccls_own_cause_and_version_are_read_from_its_log():
    found = parse_nccl_log(NO_IB_DEVICE_LOG + SOCKET_LOG)
    assert found.version == "2.21.5+cuda12.4" and found.causes == ["NET/IB : No device found."]
    plugin = parse_nccl_log(PLUGIN_NOT_LOADED_LOG)
    assert plugin.causes == ["NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.",
                             "NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0' (no module)"]
    assert parse_nccl_log(IB_LOG).causes == []  # a healthy log quotes nothing
    policy = FabricPolicy("rdma", gpudirect_rdma=True)
    reason = fallback_reason(transport_problems(plugin, policy), 1, policy, plugin.causes)
    assert reason.startswith("NCCL's network channels moved no GPU memory directly (no GPUDirect RDMA) on 1 of 1")
    assert "NCCL said: " in reason and "GPU Direct RDMA Disabled for HCA 0 'mlx5_0' (no module)" in reason


def test_the_nccl_library_a_rank_mapped_is_read_from_its_memory_maps(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
                    "7f02-7f03 r-xp 00000000 08:01 2 /usr/local/gib/lib64/libnccl.so.2.23.4\n"
                    "7f04-7f05 r-xp 00000000 08:01 3 /opt/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2\n"
                    "7f06-7f07 rw-p 00000000 00:00 0 \n")
    assert loaded_nccl_library(maps) == "/usr/local/gib/lib64/libnccl.so.2.23.4"  # gIB's, first on LD_LIBRARY_PATH
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert loaded_nccl_library(maps) is None and loaded_nccl_library(tmp_path / "none") is None


def test_the_run_records_each_ranks_nccl_and_notes_ranks_that_loaded_different_ones():
    gib = {"nccl_version": "2.23.4+cuda12.6", "nccl_library": "/usr/local/gib/lib64/libnccl.so.2.23.4"}
    wheel = {"nccl_version": "2.21.5+cuda12.4", "nccl_library": "/opt/venv/nvidia/nccl/lib/libnccl.so.2"}
    summary, notes = fabric_summary([{"job_rank": 0, **gib}, {"job_rank": 1, **gib}], nodes_asked=2, on_gpu=True)
    assert summary["nccl_versions"] == ["2.23.4+cuda12.6"] * 2 and summary["nccl_libraries"][1] == gib["nccl_library"]
    assert not any("NCCL builds" in note for note in notes)
    summary, notes = fabric_summary([{"job_rank": 1, **wheel}, {"job_rank": 0, **gib}], nodes_asked=2, on_gpu=True)
    assert summary["nccl_versions"] == ["2.23.4+cuda12.6", "2.21.5+cuda12.4"]  # by job rank
    assert any(note.startswith("the ranks loaded different NCCL builds") for note in notes)
    cpu, _ = fabric_summary([{"job_rank": 0}], nodes_asked=1, on_gpu=False)
    assert cpu["nccl_versions"] is None and cpu["nccl_libraries"] is None


# -- GPUDirect RDMA where the fabric promises it -------------------------------------------------------------


def test_without_a_peer_memory_module_or_dma_buf_the_reason_says_what_to_load(tmp_path):
    from gpt2bench.trainer.fabric import gpudirect_hint, peermem_module

    (tmp_path / "nvidia_peermem").mkdir()
    assert peermem_module(tmp_path) == "nvidia_peermem" and peermem_module(tmp_path / "none") is None
    found = parse_nccl_log(IB_NO_GDR_LOG)
    hint = gpudirect_hint(found, None)
    assert hint.startswith("no peer-memory module on this node (nvidia_peermem or nv_peer_mem") and "modprobe" in hint
    assert gpudirect_hint(found, "nvidia_peermem") is None
    assert gpudirect_hint(parse_nccl_log("x NCCL INFO DMA-BUF is available on GPU device 0\n" + IB_NO_GDR_LOG),
                          None) is None
    policy = FabricPolicy("auto", gpudirect_rdma=True)
    reason = fallback_reason([0.0, 1.0], 2, policy, [], hint)
    assert "(no GPUDirect RDMA) on 2 of 2 ranks" in reason and f"({hint})" in reason


@pytest.mark.slow  # real trainer processes
def test_a_run_whose_fabric_promised_gpudirect_stops_at_start_without_it(start_trainer, fork_server, tmp_path):
    """NET/IB without /GDRDMA (nvidia-peermem not loaded): with GPUDirect expected (the env the AKS and EKS
    fragments render: GPT2BENCH_GPUDIRECT_RDMA=1) both ranks stop at start, and the run records the support each
    rank had."""
    (tmp_path / "ib.log").write_text(IB_NO_GDR_LOG)
    args = ["--strategy", "ddp", "--steps", "4", "--warmup-steps", "1", "--no-breakdown",
            "--nccl-log", str(tmp_path / "ib.log")]
    run = two_nodes(start_trainer, fork_server, args, {"GPT2BENCH_GPUDIRECT_RDMA": "1"})
    assert run.returncode == 1 and run.summary["status"] == "failed", run.describe()
    assert run.summary["reason"].startswith("NCCL's network channels moved no GPU memory directly (no GPUDirect RDMA) "
                                            "on 2 of 2 ranks")
    assert run.steps == [] and run.summary["gpudirect_rdma"] is False and run.summary["gpudirect_rdma_required"]
    assert [rank["dmabuf"] for rank in run.summary["gpudirect_support"]] == [False, False]
