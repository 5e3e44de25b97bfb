"""Which half precisions this CPU computes natively, from Linux's /proc/cpuinfo (no torch: the local sweep asks
before it starts a run's processes, the trainer asks again inside the pod).

A CPU without a unit for bf16 or fp16 runs them through oneDNN's fp32 emulation: correct, 10-15x slower than
fp32 here, and its timings say nothing about a GPU's. Such runs end Skipped unless the spec opts in
(spec.training.allowEmulatedPrecision).
"""

from __future__ import annotations

from pathlib import Path

# Flags (x86 `flags`, Arm `Features`) of units that compute the type natively; any one set suffices.
NATIVE_CPU_FLAGS = {
    "bf16": ({"avx512_bf16"}, {"amx_bf16"}, {"bf16"}),  # AVX-512 BF16 (Cooper Lake, Zen 4), AMX (Sapphire Rapids), Arm
    "fp16": ({"avx512_fp16"}, {"amx_fp16"}, {"fphp", "asimdhp"}),  # AVX512-FP16 (Sapphire Rapids), AMX-FP16, Arm
}


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The first processor's feature flags."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def cpu_emulation_reason(precision: str, flags: set[str] | None = None) -> str | None:
    """Why `precision` would be emulated on this CPU, or None when it is native (fp32 always is)."""
    if precision not in NATIVE_CPU_FLAGS:
        return None
    flags = cpu_flags() if flags is None else flags
    if any(needed <= flags for needed in NATIVE_CPU_FLAGS[precision]):
        return None
    wanted = "/".join("+".join(sorted(needed)) for needed in NATIVE_CPU_FLAGS[precision])
    # short enough for a status table's one line (160 characters): the opt-in must survive the cut
    return (f"{precision} not native on this CPU (no {wanted} flag): emulated timings tell nothing of a GPU; "
            "spec.training.allowEmulatedPrecision runs it")
