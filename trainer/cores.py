"""Cores a process may use: its CPU affinity, capped by its container's CPU quota (cgroup v2, else v1).

Torch-free, so that the local runner (which splits this machine's cores between a run's pods) and the trainer
(which splits its pod's cores between its ranks) count cores the same way without importing torch.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_cpu_quota(root: Path = CGROUP_ROOT) -> float | None:
    """The container's CPU limit in cores (`cpu.max`, or v1's `cfs_quota_us / cfs_period_us`); None if unlimited."""
    try:
        limit, period = (root / "cpu.max").read_text().split()[:2]
        return None if limit == "max" else int(limit) / int(period)
    except (OSError, ValueError):
        pass
    try:
        limit = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if limit <= 0 else limit / period
    except (OSError, ValueError):
        return None


def available_cpus() -> int:
    """Whole cores this process may use: affinity, capped by the quota rounded up; at least one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroup_cpu_quota()
    return max(1, min(cores, math.ceil(quota))) if quota else max(1, cores)
