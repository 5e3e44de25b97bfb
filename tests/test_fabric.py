"""Where a run really ran (trainer/fabric.py): which transport NCCL used, read from its INFO log, and on which
nodes the ranks ran, from the downward API. The NCCL lines below are real ones, published in issue threads
(each quoted with its source); no GPU ran here, so the parser is tested on them and the trainer's NCCL path
is unmeasured."""

from __future__ import annotations

import pytest
from conftest import free_port, torchrun_prefix

from gpt2bench.trainer.fabric import (
    ask_nccl_for_its_log,
    fabric_summary,
    net_family,
    node_name,
    parse_nccl_log,
    rank_payload,
)

# NVIDIA/nccl-tests#185 (2 x DGX H100, NCCL 2.19.3, RoCE through NCCL's own verbs transport)
IB_INIT = """\
dgxh100-4:460770:460770 [0] NCCL INFO Bootstrap : Using enp220s0np0:11.1.128.136<0>
dgxh100-4:460770:460770 [0] NCCL INFO NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: No such file or directory No plugin found (libnccl-net.so), using internal implementation
dgxh100-4:460770:460842 [0] NCCL INFO NET/IB : Using [0]mlx5_10:1/RoCE [1]mlx5_11:1/RoCE [RO]; OOB enp220s0np0:11.1.128.136<0>
dgxh100-4:460770:460842 [0] NCCL INFO Using non-device net plugin version 0
dgxh100-4:460770:460842 [0] NCCL INFO Using network IB
"""
# NVIDIA/nccl#1814 (8 GPUs per node, HPC-X's IBext plugin): channels to other nodes
IBEXT_CHANNELS = """\
hostname-test:982:1255 [2] NCCL INFO Channel 00/0 : 18[2] -> 34[2] [receive] via NET/IBext_v8/0
hostname-test:987:1260 [7] NCCL INFO Channel 00/0 : 39[7] -> 55[7] [send] via NET/IBext_v8/2
"""
# NVIDIA/nccl#1053 (NCCL_SOCKET_IFNAME=lo, IB disabled)
SOCKET_INIT = """\
axa:3048391:3048566 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.
axa:3048391:3048566 [0] NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0>
axa:3048391:3048566 [0] NCCL INFO Using network Socket
"""
# NVIDIA/nccl#1597 (2 x 8 H200 on EFA, aws-ofi-nccl) and aws/aws-ofi-nccl#24 (an older plugin's channel lines)
OFI_INIT = """\
8h200-2:6831:6840 [0] NCCL INFO NET/OFI Creating one domain per process
8h200-2:6831:6840 [0] NCCL INFO Using network Libfabric
8h200-3:6310:6318 [0] NCCL INFO NET/OFI Selected Provider is efa (found 16 nics)
"""
OFI_CHANNELS = """\
[1,26]<stdout>:ip-172-32-36-209:8716:9558 [2] NCCL INFO Ring 00 : 26[2] -> 30[6] via P2P/IPC
[1,7]<stdout>:ip-172-32-38-1:21471:22316 [7] NCCL INFO Ring 00 : 7 -> 8 [send] via NET/AWS Libfabric/0
"""
# NVIDIA/nccl#302 (intra-node ring) and NVIDIA/nccl#1358 (one node, PCIe)
INTRA_NODE = """\
[155] crow-ib-new-nccl-256-info-19:5330:5499 [3] NCCL INFO Ring 00 : 155[3d000] -> 157[b2000] via P2P/IPC
LIUCC13-AC-01:106:121 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/direct pointer
"""
# NCCL's own wording for a GPUDirect RDMA channel (src/transport/net.cc: "via NET/%s/%d%s%s", "/GDRDMA")
GDR_CHANNEL = "n1:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA\n"


@pytest.mark.parametrize("log, transport, network, crossed, gdr", [
    (IB_INIT + GDR_CHANNEL, "NET/IB", "IB", True, True),
    (IB_INIT + INTRA_NODE, "P2P", "IB", False, None),  # one node: IB loaded, never used
    ("x:1:2 [0] NCCL INFO Using network IBext\n" + IBEXT_CHANNELS, "NET/IB", "IBext", True, False),
    (SOCKET_INIT + "x:1:2 [0] NCCL INFO Channel 01/0 : 1[0] -> 0[0] [receive] via NET/Socket/0\n",
     "NET/Socket", "Socket", True, False),
    (OFI_INIT + OFI_CHANNELS, "NET/OFI", "Libfabric", True, False),
    ("", None, None, False, None),
])
def test_the_transport_is_read_from_real_nccl_lines(log, transport, network, crossed, gdr):
    found = parse_nccl_log(log).payload()
    assert (found["transport"], found["nccl_network"], found["crossed_nodes"], found["gpudirect_rdma"]) == (
        transport, network, crossed, gdr)


def test_plugin_names_map_to_their_family():
    assert [net_family(n) for n in ("IB", "IBext_v8", "Socket", "AWS Libfabric", "Libfabric", "GPUDirectTCPX")] == [
        "NET/IB", "NET/IB", "NET/Socket", "NET/OFI", "NET/OFI", "NET/GPUDirectTCPX"]
    assert parse_nccl_log(OFI_INIT).provider == "efa"


def test_nccl_is_asked_for_its_log_unless_the_user_chose_a_quieter_level(tmp_path):
    environ: dict[str, str] = {}
    path = ask_nccl_for_its_log(str(tmp_path), 3, environ)
    assert environ == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET", "NCCL_DEBUG_FILE": str(path)}
    assert path == tmp_path / "nccl" / "rank3.log" and path.parent.is_dir()
    kept = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "ALL"}
    ask_nccl_for_its_log(str(tmp_path), 0, kept)
    assert kept["NCCL_DEBUG_SUBSYS"] == "ALL"
    quiet = {"NCCL_DEBUG": "WARN"}
    assert ask_nccl_for_its_log(str(tmp_path), 0, quiet) is None and "NCCL_DEBUG_FILE" not in quiet


def test_a_rank_reports_its_node_and_its_log(tmp_path, monkeypatch):
    monkeypatch.setenv("GPT2BENCH_NODE_NAME", "gpu-node-7")
    log = tmp_path / "rank0.log"
    log.write_text(IB_INIT + GDR_CHANNEL)
    payload = rank_payload(log, uses_nccl=True)
    assert payload == {"node_name": "gpu-node-7", "transport": "NET/IB", "nccl_network": "IB", "crossed_nodes": True,
                       "gpudirect_rdma": True, "ofi_provider": None, "nccl_version": payload["nccl_version"],
                       "nccl_causes": payload["nccl_causes"], "dmabuf": False,
                       "nccl_library": None,  # this test process loaded no NCCL
                       "peermem": payload["peermem"]}  # this machine's /sys/module
    assert payload["nccl_causes"] == [line.split("NCCL INFO ")[1] for line in IB_INIT.splitlines()
                                      if "No plugin found" in line]  # NCCL's words that its net plugin did not load
    assert rank_payload(None, uses_nccl=False) == {"node_name": "gpu-node-7"}  # gloo: nothing to read
    assert "no NCCL log" in rank_payload(tmp_path / "missing.log", uses_nccl=True)["transport_reason"]
    monkeypatch.setenv("GPT2BENCH_NODE_NAME", "$(GPT2BENCH_NODE_NAME)")  # a runtime that did not set it
    assert node_name() is None


def payloads(*ranks: tuple[str | None, str | None]) -> list[dict]:
    return [{"job_rank": i, "node_name": node, **({"transport": t, "crossed_nodes": t.startswith("NET/")} if t else {})}
            for i, (node, t) in enumerate(ranks)]


def test_a_two_node_run_on_one_machine_is_reported_as_such():
    summary, notes = fabric_summary(payloads(("gpu-a", "P2P"), ("gpu-a", "P2P")), nodes_asked=2, on_gpu=True)
    assert summary["nodes_used"] == 1 and summary["node_names"] == ["gpu-a", "gpu-a"]
    assert len(notes) == 1 and notes[0].startswith("ran on 1 node(s), not the 2 its scale asks for")
    spread, notes = fabric_summary(payloads(("gpu-a", "NET/IB"), ("gpu-b", "NET/IB")), nodes_asked=2, on_gpu=True)
    assert spread["nodes_used"] == 2 and spread["transport"] == "NET/IB" and notes == []


def test_a_multi_node_run_over_sockets_is_warned_about_and_one_node_is_not():
    summary, notes = fabric_summary(payloads(("a", "NET/Socket"), ("b", "NET/Socket")), nodes_asked=2, on_gpu=True)
    assert summary["transport"] == "NET/Socket"
    assert notes == [n for n in notes if "sockets (NET/Socket)" in n] and len(notes) == 1
    _, notes = fabric_summary(payloads(("a", "P2P"), ("a", "P2P")), nodes_asked=1, on_gpu=True)
    assert notes == []


def test_unknown_nodes_count_nothing():
    summary, notes = fabric_summary(payloads((None, None), ("a", None)), nodes_asked=2, on_gpu=False)
    assert summary["nodes_used"] is None and notes == []
    assert summary["transport"] is None and summary["transport_reason"] is None  # CPU: no NCCL to ask


@pytest.mark.slow  # real trainer processes (make test-fast skips the multi-process tests)
def test_the_real_trainer_records_the_node_of_each_rank(start_trainer, fork_server):
    """Two torchrun "nodes" (each its own torchrun, as two pods are) that the downward API puts on one machine:
    the summary lists each rank's node and says the run used 1 node of its 2."""
    port = free_port()

    def node(rank: int):
        launcher = torchrun_prefix(1, port, forked=bool(fork_server), nodes=2, node_rank=rank)
        return start_trainer(["--strategy", "ddp", "--steps", "3", "--warmup-steps", "1", "--no-breakdown"],
                             launcher=launcher, env={"GPT2BENCH_NODE_NAME": "worker-node-1"})

    first, second = node(0), node(1)
    second.wait()
    summary = first.wait().summary
    assert summary["node_names"] == ["worker-node-1", "worker-node-1"] and summary["nodes_used"] == 1
    assert "ran on 1 node(s), not the 2 its scale asks for" in summary["note"]
    assert summary["transport"] is None and summary["transport_reason"] is None  # gloo on CPU


# -- MFU on a MIG slice: its share of the GPU's peak -------------------------------------------------------------


@pytest.mark.parametrize("name, sms, share", [
    ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", 14, 14 / 108),
    ("NVIDIA A100-SXM4-80GB MIG 3g.40gb", 42, 42 / 108),
    ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", 16, 16 / 132),
    ("NVIDIA A100-SXM4-40GB", 108, None),  # a whole GPU
    ("NVIDIA Fancy MIG 1g.5gb", 10, None),  # unknown GPU: no share to give
])
def test_a_mig_slice_is_measured_against_its_share_of_the_peak(name, sms, share, monkeypatch):
    import torch

    from gpt2bench.trainer.devices import mig_share, peak_flops, peak_flops_per_device

    assert mig_share(name, sms) == share
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: type("Properties", (), {"multi_processor_count": sms})())
    peak = peak_flops_per_device(torch.device("cuda", 0), "bf16", False, None)
    whole = peak_flops(name, "bf16", False)
    if share is None and "MIG" in name:
        assert peak is None  # no MFU rather than one against the whole GPU
    elif share is None:
        assert peak == whole
    else:
        assert peak == pytest.approx(whole * share)
