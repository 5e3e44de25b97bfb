"""What a process trains on: the device's name and peak FLOP/s, time on its timeline, its peak memory, its cores.

Each part has a CUDA path and a CPU path with the same structure, so the CPU runs here exercise the code
the GPU runs: `StepClock` marks steps with CUDA events (read back lazily, no synchronise per step) or the
host clock; `PeakMemory` reads the CUDA allocator's peaks and the host's RSS high-water mark, both reset
between phases (set-up, each step).
"""

from __future__ import annotations

import math
import os
import platform
import re
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from gpt2bench.conventions import POD_CPUS_ENV

from .cores import available_cpus
from .cpuflags import cpu_emulation_reason


def device_name(device: torch.device) -> str:
    """What the figures were measured on: the GPU's name, else the CPU's model name (Linux), else 'cpu'."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


# ------------------------------------------------------------------------------------------ peak FLOP/s
@dataclass(frozen=True)
class Peaks:
    """Dense (no sparsity) datasheet peaks of one GPU, FLOP/s; None where the GPU has no such unit."""

    fp32: float  # CUDA cores
    tf32: float | None  # tensor cores, fp32 inputs rounded to TF32 (Ampere and later)
    bf16: float | None  # tensor cores (Ampere and later)
    fp16: float  # tensor cores (Volta and later)
    sms: int | None = None  # streaming multiprocessors of the whole GPU: a MIG slice has its share of the peak


T = 1e12
# (pattern on the CUDA device name, peaks). First match wins, so the more specific names come first; \b keeps
# "L4" from matching "L40" and "A10" from matching "A100". Sources: NVIDIA datasheets (sparse figures halved).
PEAK_TABLE: list[tuple[str, Peaks]] = [
    (r"\bH100\b.*\bNVL\b", Peaks(60 * T, 417.5 * T, 835.5 * T, 835.5 * T, 132)),
    (r"\bH100\b.*\bPCIe\b", Peaks(51.2 * T, 378 * T, 756 * T, 756 * T, 114)),
    (r"\bH200\b.*\bNVL\b", Peaks(60 * T, 417.5 * T, 835.5 * T, 835.5 * T, 132)),
    (r"\b(GH200|H200|H100|H800)\b", Peaks(67 * T, 494.5 * T, 989.5 * T, 989.5 * T, 132)),  # SXM
    (r"\b(A100|A800)\b", Peaks(19.5 * T, 156 * T, 312 * T, 312 * T, 108)),
    (r"\bA30\b", Peaks(10.3 * T, 82 * T, 165 * T, 165 * T, 56)),
    (r"\bA10G\b", Peaks(31.2 * T, 35 * T, 70 * T, 70 * T)),  # AWS's figures: no NVIDIA datasheet
    (r"\bA10\b", Peaks(31.2 * T, 62.5 * T, 125 * T, 125 * T)),
    (r"\bL40S\b", Peaks(91.6 * T, 183 * T, 362 * T, 362 * T)),
    (r"\bL40\b", Peaks(90.5 * T, 90.5 * T, 181 * T, 181 * T)),
    (r"\bL4\b", Peaks(30.3 * T, 60 * T, 121 * T, 121 * T)),
    (r"\bV100S\b", Peaks(16.4 * T, None, None, 130 * T)),
    (r"\bV100\b.*\bPCIe\b", Peaks(14 * T, None, None, 112 * T)),
    (r"\bV100\b", Peaks(15.7 * T, None, None, 125 * T)),  # SXM2
    (r"\bT4\b", Peaks(8.1 * T, None, None, 65 * T)),
]


def peaks_for(name: str) -> Peaks | None:
    """The peaks of the GPU `name` as torch reports it (case-insensitive: "V100-PCIE" and "H100 PCIe" both occur)."""
    for pattern, peaks in PEAK_TABLE:
        if re.search(pattern, name, re.IGNORECASE):
            return peaks
    return None


def math_precision(precision: str, tf32: bool) -> str:
    """The precision the run's matmuls use, hence which peak MFU is against: bf16, fp16, tf32 or fp32."""
    if precision == "fp32":
        return "tf32" if tf32 else "fp32"
    return precision


def peak_flops(name: str, precision: str, tf32: bool) -> float | None:
    """Peak FLOP/s of the GPU `name` for a run's matmuls; None when unknown or when the GPU has no such unit
    (bf16 on a V100 or T4 is emulated, not a tensor-core peak)."""
    peaks = peaks_for(name)
    return None if peaks is None else getattr(peaks, math_precision(precision, tf32))


def mig_share(name: str, sms: int) -> float | None:
    """The share of its GPU's peak a MIG slice has: its SMs over the whole GPU's (a slice's clock is the GPU's),
    e.g. 14 / 108 for an A100's 1g.5gb. None for a whole GPU, or a GPU whose SM count the table lacks."""
    if not re.search(r"\bMIG\b", name):
        return None
    peaks = peaks_for(name)
    if peaks is None or not peaks.sms or not 0 < sms <= peaks.sms:
        return None
    return sms / peaks.sms


def peak_flops_per_device(device: torch.device, precision: str, tf32: bool, override: float | None) -> float | None:
    """`--peak-flops` when given, else the table's peak for this GPU, a MIG slice's share of it by its SMs;
    None on CPU (no meaningful peak), and on a MIG slice of a GPU whose SM count is unknown."""
    if override:
        return override
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    peak = peak_flops(name, precision, tf32)
    if peak is not None and re.search(r"\bMIG\b", name):
        share = mig_share(name, torch.cuda.get_device_properties(device).multi_processor_count)
        return peak * share if share is not None else None
    return peak


def allow_tf32(device: torch.device, enabled: bool) -> None:
    """fp32 matmuls on TF32 tensor cores (CUDA only; torch leaves them off by default). GPT-2 has no
    convolutions (its `Conv1D` is a matmul)."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.fp32_precision = "tf32" if enabled else "ieee"


# ------------------------------------------------------------------------------------------------- time
class StepClock:
    """Marks on the device's timeline; the seconds between two marks are read later, without a per-step sync.

    CUDA: a `torch.cuda.Event(enable_timing=True)` recorded on the current stream: it takes the GPU's time
    when the GPU reaches it, so the seconds between a step's two marks are the GPU's time for that step,
    host stalls that starve it included. `seconds` waits for the later event only (done at log steps, when the
    work is long finished). CPU: the host clock, which is the device's (CPU ops run synchronously).
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def seconds(self, start, end) -> float:
        if self.cuda:
            end.synchronize()
            return start.elapsed_time(end) / 1000.0
        return end - start


# ----------------------------------------------------------------------------------------------- memory
_STATUS, _CLEAR_REFS = Path("/proc/self/status"), Path("/proc/self/clear_refs")


class PeakMemory:
    """This process's memory peaks since the last `reset()`, by kind.

    device: CUDA `max_memory_allocated` / `max_memory_reserved` of the process's GPU (None on CPU);
    host: the resident set's high-water mark (Linux VmHWM), reset by writing 5 to /proc/self/clear_refs.
    Where that file cannot be written the host peak counts from the process start and `host_since_start`
    says so.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.host_since_start = False

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        if not self.host_since_start:
            try:
                _CLEAR_REFS.write_text("5")
            except OSError:
                self.host_since_start = True

    def read(self) -> dict[str, int | None]:
        on_gpu = self.device.type == "cuda"
        return {
            "device_bytes": int(torch.cuda.max_memory_allocated(self.device)) if on_gpu else None,
            "device_reserved_bytes": int(torch.cuda.max_memory_reserved(self.device)) if on_gpu else None,
            "host_bytes": host_peak_bytes(),
        }


def host_peak_bytes() -> int:
    try:
        return int(re.search(r"VmHWM:\s+(\d+)", _STATUS.read_text()).group(1)) * 1024
    except (OSError, AttributeError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


# --------------------------------------------------------------------------------- native half precision
def emulated_precision(precision: str, device_type: str, flags: set[str] | None = None) -> str | None:
    """Why `precision` would be emulated on this device, or None when it is native (fp32 always is)."""
    if precision == "fp32":
        return None
    if device_type == "cuda":
        if precision == "bf16" and not torch.cuda.is_bf16_supported(including_emulation=False):
            return f"{torch.cuda.get_device_name()} has no native bf16 (compute capability below 8.0)"
        return None
    return cpu_emulation_reason(precision, flags)


def device_sync(device: torch.device) -> None:
    """Wait for `device`'s queued work (no-op on CPU): outside measured steps only, e.g. before a peer reads a
    buffer (ps) or at the end of timed collectives (collective_probe.py)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ------------------------------------------------------------------------------------------------ cores
@dataclass(frozen=True)
class CpuBudget:
    """One rank's share of the cores its pod may use, and the intra-op threads that share gives it."""

    cores_per_rank: float
    threads: int


def cpu_budget(local_processes: int, environ: dict[str, str] | None = None) -> CpuBudget:
    """The pod's budget (GPT2BENCH_POD_CPUS, capped by what this process can see) divided by the processes the
    launcher started in it; at least one thread. The same rule for every strategy and launcher, so that runs
    compare strategies, not thread counts (torchrun would set 1 thread per rank, mpirun none, torch all cores)."""
    environ = os.environ if environ is None else environ
    cores: float = available_cpus()
    declared = environ.get(POD_CPUS_ENV)
    if declared:
        try:
            cores = min(cores, float(declared))
        except ValueError:
            raise RuntimeError(f"{POD_CPUS_ENV}={declared!r} is not a number of cores") from None
    share = cores / max(1, local_processes)
    return CpuBudget(cores_per_rank=share, threads=max(1, math.floor(share + 1e-9)))


def apply_cpu_budget(local_processes: int) -> CpuBudget:
    budget = cpu_budget(local_processes)
    torch.set_num_threads(budget.threads)
    bound_compile_threads(budget.threads)
    return budget


# torch.compile's inductor compiles kernels in min(32, the CPUs this process sees) worker processes per rank
# (torch._inductor.config.decide_compile_threads), counted on the node, not the pod: 8 ranks of a 16-CPU pod on a
# 192-CPU node started 8 x 32 compilers in a 64 Gi pod. Each rank gets its share of the pod's cores instead.
COMPILE_THREADS_ENV = "TORCHINDUCTOR_COMPILE_THREADS"


def bound_compile_threads(threads: int, environ: dict[str, str] | None = None) -> int:
    """Set inductor's compile workers to `threads` (this rank's share of its pod's cores) unless the pod's env
    sets them; also where inductor's config is already loaded (it reads the variable once). Returns the count."""
    environ = os.environ if environ is None else environ
    environ.setdefault(COMPILE_THREADS_ENV, str(threads))
    try:
        value = max(1, int(environ[COMPILE_THREADS_ENV]))
    except ValueError:
        raise RuntimeError(f"{COMPILE_THREADS_ENV}={environ[COMPILE_THREADS_ENV]!r} is not a number") from None
    inductor = sys.modules.get("torch._inductor.config")
    if inductor is not None:
        inductor.compile_threads = value
    return value


