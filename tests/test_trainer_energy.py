"""Energy counters (trainer/energy.py): RAPL read from a fake powercap tree, NVML from a fake pynvml module (the
layers below the real readers), spread over steps by the metrics, summed per run by the summary."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from gpt2bench.trainer.config import ProcessOptions, TrainConfig
from gpt2bench.trainer.energy import EnergyLog, RaplMeter, Unavailable, energy_meter, nvml_meter, rapl_meter
from gpt2bench.trainer.metrics import MetricsProcessor
from gpt2bench.trainer.summary import energy_summary


def domain(root: Path, name: str, energy_uj: int, max_range: int = 262143328850, label: str = "package-0") -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "energy_uj").write_text(f"{energy_uj}\n")
    (folder / "max_energy_range_uj").write_text(f"{max_range}\n")
    (folder / "name").write_text(label + "\n")
    return folder


def set_energy(folder: Path, energy_uj: int) -> None:
    (folder / "energy_uj").write_text(f"{energy_uj}\n")


def test_rapl_sums_packages_not_their_subdomains_and_handles_wraparound(tmp_path):
    pkg0 = domain(tmp_path, "intel-rapl:0", 1_000_000, max_range=10_000_000)
    pkg1 = domain(tmp_path, "intel-rapl:1", 5_000_000, label="package-1")
    core = domain(tmp_path, "intel-rapl:0:0", 123, label="core")  # inside package 0: never added again
    meter = rapl_meter(tmp_path)
    assert isinstance(meter, RaplMeter) and meter.source == "rapl" and meter.scope == "node"
    assert meter.devices == ["package-0", "package-1"]
    assert meter.read() == 0.0
    set_energy(pkg0, 3_000_000)
    set_energy(pkg1, 5_500_000)
    set_energy(core, 9_999_999)
    assert meter.read() == pytest.approx(2.5)  # 2 J + 0.5 J
    set_energy(pkg0, 500_000)  # wrapped: 10 J range, from 3 J to 0.5 J = 7.5 J
    assert meter.read() == pytest.approx(2.5 + 7.5)


@pytest.mark.parametrize("layout, says", [
    ("missing", "no RAPL package domain"),
    ("empty", "no RAPL package domain"),
    ("unreadable", "not readable"),
])
def test_rapl_not_measurable_says_why(tmp_path, layout, says):
    root = tmp_path / "powercap"
    if layout != "missing":
        root.mkdir()
    if layout == "unreadable":
        folder = domain(root, "intel-rapl:0", 1)
        (folder / "energy_uj").unlink()
        (folder / "energy_uj").mkdir()  # reading it raises an OSError, as a root-only file does for users
    meter = rapl_meter(root)
    assert isinstance(meter, Unavailable) and meter.read() is None
    assert meter.reason.startswith("not measurable: ") and says in meter.reason


def test_only_the_nodes_first_worker_reads_the_cpu_package(tmp_path):
    domain(tmp_path, "intel-rapl:0", 1)
    cpu = torch.device("cpu")
    assert isinstance(energy_meter(cpu, 1, reads_node=True, powercap=tmp_path), RaplMeter)
    other = energy_meter(cpu, 1, reads_node=False, powercap=tmp_path)
    assert other.reads is False and other.read() is None


class FakeNvml:
    """pynvml's calls the meter makes, over counters in millijoules."""

    class NVMLError_NotSupported(Exception):
        pass

    def __init__(self, supported: bool = True):
        self.millijoules = {0: 1_000, 1: 50_000}
        self.supported = supported
        self.initialised = False

    def nvmlInit(self):
        self.initialised = True

    def nvmlDeviceGetHandleByIndex(self, index):
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid):  # pragma: no cover - only with CUDA
        raise AssertionError("no CUDA here: handles come by index")

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        assert self.initialised
        if not self.supported:
            raise self.NVMLError_NotSupported("Not Supported")
        return self.millijoules[handle]


def test_nvml_meter_sums_its_gpus_counters_in_joules():
    nvml = FakeNvml()
    meter = nvml_meter([0, 1], nvml=nvml)
    assert meter.source == "nvml" and meter.scope == "device" and meter.devices == ["cuda:0", "cuda:1"]
    assert meter.read() == pytest.approx(51.0)
    nvml.millijoules[0] += 2_500
    assert meter.read() == pytest.approx(53.5)


def test_nvml_without_an_energy_counter_is_not_measurable_with_the_reason():
    meter = nvml_meter([0], nvml=FakeNvml(supported=False))
    assert isinstance(meter, Unavailable) and "NVMLError_NotSupported" in meter.reason


@pytest.mark.skipif(importlib.util.find_spec("pynvml") is not None, reason="nvidia-ml-py is installed here")
def test_nvml_missing_package_names_the_extra():
    assert "nvidia-ml-py" in nvml_meter([0]).reason


class StepMeter:
    """A counter that grows 3 J per read."""

    source, scope, reason, reads, devices = "rapl", "node", None, True, ["package-0"]

    def __init__(self):
        self.joules = 0.0

    def read(self):
        self.joules += 3.0
        return self.joules


def test_energy_log_spreads_an_interval_over_its_steps():
    log = EnergyLog(StepMeter())
    log.start()
    assert log.per_step(3) == pytest.approx(1.0)
    assert EnergyLog(Unavailable("x")).per_step(2) is None


def test_metrics_give_every_step_its_intervals_mean_and_the_payload_the_measured_sum(tmp_path):
    config = TrainConfig(process=ProcessOptions(output=str(tmp_path)), training={"warmup_steps": 1})
    metrics = MetricsProcessor(config=config, rank=0, tokens_per_step=64, devices=1, device=torch.device("cpu"),
                               flops_per_token=1.0, peak_flops=None, energy=StepMeter())
    records = []
    for step in (1, 2, 3):
        start = metrics.start_step()
        metrics.end_step(step, start, torch.tensor(1.0), torch.tensor(1.0), False, 1e-3, 0.0)
        if step in (1, 3):  # the loop flushes at the end of warm-up and at log steps
            records += metrics.flush(lambda losses: losses)
    assert [r["energy_joules"] for r in records] == [3.0, 1.5, 1.5]
    payload = metrics.energy_payload()
    assert payload["energy_joules"] == 3.0 and payload["energy_measured_steps"] == 2 and payload["energy_reads"]
    metrics.close()


def test_summary_sums_readers_per_step_and_per_million_tokens():
    workers = [{"energy_reads": True, "energy_joules": 40.0, "energy_source": "nvml", "energy_devices": ["GPU-a"],
                "job_rank": 0},
               {"energy_reads": True, "energy_joules": 60.0, "energy_source": "nvml", "energy_devices": ["GPU-b"],
                "job_rank": 1},
               {"energy_reads": False, "energy_joules": None}]
    summary = energy_summary(workers, measured_steps=10, tokens_per_step=5_000, independent=False)
    assert summary["energy_joules"] == 100.0 and summary["energy_joules_per_step"] == 10.0
    assert summary["energy_joules_per_million_tokens"] == pytest.approx(100.0 / 50_000 * 1e6)
    assert [d["joules"] for d in summary["energy_joules_per_device"]] == [40.0, 60.0]
    missing = energy_summary([{"energy_reads": True, "energy_joules": None, "energy_reason": "not measurable: x"}],
                             measured_steps=10, tokens_per_step=5_000, independent=False)
    assert missing["energy_joules"] is None and missing["energy_unavailable_reason"] == "not measurable: x"


def test_a_counter_that_never_advances_is_not_measured_with_the_reason_not_zero_joules(tmp_path):
    """A RAPL package whose energy_uj stays put (a VM's stub) read 0 J over the steps: that is no measurement,
    and the summary says so instead of "0 J per million tokens" (which also broke every ratio in the report)."""
    package = tmp_path / "intel-rapl:0"
    package.mkdir()
    (package / "name").write_text("package-0\n")
    (package / "energy_uj").write_text("123456\n")
    (package / "max_energy_range_uj").write_text("262143328850\n")
    meter = rapl_meter(tmp_path)
    meter.read(), meter.read()  # the steps ran; the counter did not move
    worker = {"energy_reads": True, "energy_joules": meter.read(), "energy_source": "rapl",
              "energy_devices": meter.devices}
    summary = energy_summary([worker], measured_steps=10, tokens_per_step=5_000, independent=False)
    assert summary["energy_joules_per_million_tokens"] is None and summary["energy_joules"] is None
    assert "did not advance" in summary["energy_unavailable_reason"]
    assert "package-0" in summary["energy_unavailable_reason"]
