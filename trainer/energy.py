"""Energy counters: NVML's total-energy counter per GPU, RAPL (Linux powercap) per CPU package.

A meter reads a monotonic counter of joules; the metrics read it at log steps (after the device has caught
up, outside the timed steps) and spread each interval's joules over its steps. Both readers are injectable
(`nvml=` a module with pynvml's functions, `powercap=` a folder laid out as /sys/class/powercap), so tests
feed them fake counters. Where nothing can be read the meter says why (`reason`), and the figures are null.
Definitions: docs/metrics.md (Energy).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

POWERCAP = Path("/sys/class/powercap")


class EnergyMeter:
    """`read()` -> joules consumed so far by the measured devices (monotonic), or None when unavailable."""

    source: str | None = None  # "nvml" | "rapl"
    scope: str = "device"  # "device": one GPU per reading; "node": a CPU package, shared by the node's processes
    reason: str | None = None
    reads = True  # False where another worker reads this meter's counter (the node's CPU package)
    devices: list[str]

    def read(self) -> float | None:  # pragma: no cover - interface
        raise NotImplementedError


class Unavailable(EnergyMeter):
    def __init__(self, reason: str, reads: bool = True):
        self.reason, self.devices, self.reads = reason, [], reads

    def read(self) -> None:
        return None


class NvmlMeter(EnergyMeter):
    """Sum of `nvmlDeviceGetTotalEnergyConsumption` (millijoules since the driver loaded, Volta and later)
    over this worker's GPUs."""

    source = "nvml"

    def __init__(self, nvml: Any, handles: list[Any], names: list[str]):
        self.nvml, self.handles, self.devices = nvml, handles, names

    def read(self) -> float:
        return sum(self.nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self.handles) / 1000.0


class RaplMeter(EnergyMeter):
    """Sum of the package domains' `energy_uj` (intel-rapl:N, also on AMD); a counter that wrapped since the
    last read adds `max_energy_range_uj`. Sub-domains (intel-rapl:N:M: core, uncore, dram) lie inside their
    package and are not added again."""

    source, scope = "rapl", "node"

    def __init__(self, domains: list[Path]):
        self.domains = domains
        self.devices = [(d / "name").read_text().strip() if (d / "name").exists() else d.name for d in domains]
        self.ranges = [int((d / "max_energy_range_uj").read_text()) for d in domains]
        self.last = [self._raw(d) for d in domains]
        self.total_uj = 0

    @staticmethod
    def _raw(domain: Path) -> int:
        return int((domain / "energy_uj").read_text())

    def read(self) -> float:
        for i, domain in enumerate(self.domains):
            raw = self._raw(domain)
            delta = raw - self.last[i]
            if delta < 0:  # wrapped around
                delta += self.ranges[i]
            self.total_uj += delta
            self.last[i] = raw
        return self.total_uj / 1e6


def rapl_meter(powercap: Path = POWERCAP) -> EnergyMeter:
    """The node's CPU packages from `powercap`, or Unavailable with the reason."""
    domains = sorted(d for d in powercap.glob("intel-rapl:*") if d.name.count(":") == 1) if powercap.is_dir() else []
    if not domains:
        return Unavailable(f"not measurable: no RAPL package domain under {powercap} (no powercap driver for this "
                           "CPU, or a virtual machine / container that does not expose it)")
    try:
        return RaplMeter(domains)
    except (OSError, ValueError) as exc:  # energy_uj is root-only since Linux 5.10 (CVE-2020-8694)
        return Unavailable(f"not measurable: {domains[0]}/energy_uj is not readable ({exc.__class__.__name__}: "
                           f"{exc}); RAPL counters are root-only on Linux >= 5.10")


def _import_nvml() -> Any:
    import pynvml  # nvidia-ml-py, the gpu extra

    return pynvml


def nvml_meter(indices: list[int], nvml: Any = None) -> EnergyMeter:
    """This worker's CUDA devices (`indices`), matched to NVML by UUID (CUDA_VISIBLE_DEVICES renumbers them)."""
    try:
        nvml = nvml or _import_nvml()
    except ImportError as exc:
        return Unavailable(f"not measurable: nvidia-ml-py is not installed (pip install 'gpt2bench[gpu]'): {exc}")
    try:
        nvml.nvmlInit()
        handles, names = [], []
        for index in indices:
            uuid = _cuda_uuid(index)
            handle = (nvml.nvmlDeviceGetHandleByUUID(uuid) if uuid else nvml.nvmlDeviceGetHandleByIndex(index))
            nvml.nvmlDeviceGetTotalEnergyConsumption(handle)  # raises NotSupported before Volta
            handles.append(handle)
            names.append(uuid or f"cuda:{index}")
        return NvmlMeter(nvml, handles, names)
    except Exception as exc:  # pynvml.NVMLError and its NotSupported / NoPermission subclasses
        return Unavailable(f"not measurable: NVML energy counter unavailable ({exc.__class__.__name__}: {exc})")


def _cuda_uuid(index: int) -> str | None:
    if not torch.cuda.is_available():
        return None
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    return f"GPU-{uuid}" if uuid is not None else None


def energy_meter(device: torch.device, devices_per_worker: int, *, reads_node: bool, nvml: Any = None,
                 powercap: Path = POWERCAP) -> EnergyMeter:
    """GPUs: NVML over this worker's GPUs. CPU: RAPL, read by one worker per node (`reads_node`), since the
    package is the node's; the node's other workers get Unavailable('read by ...')."""
    if device.type == "cuda":
        first = device.index or 0
        return nvml_meter(list(range(first, first + devices_per_worker)), nvml)
    if not reads_node:
        return Unavailable("CPU package energy is read by the node's first worker", reads=False)
    return rapl_meter(powercap)


class EnergyLog:
    """Readings at log steps; `spread(n)` gives the joules of the last `n` steps (the interval's mean each)."""

    def __init__(self, meter: EnergyMeter):
        self.meter = meter
        self.last: float | None = None

    def start(self) -> None:
        if self.last is None:
            self.last = self.meter.read()

    def per_step(self, steps: int) -> float | None:
        now = self.meter.read()
        if now is None or self.last is None or steps <= 0:
            return None
        joules, self.last = now - self.last, now
        return joules / steps
